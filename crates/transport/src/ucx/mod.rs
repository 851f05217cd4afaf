//! The UCX data plane (feature `ucx`), built on Debian's UCX 1.13 through
//! `strata-ucx-sys`: a safe layer over UCP ([`api`]), a worker on a progress
//! thread driven from async code ([`engine`]), a store node's segments
//! exposed through it ([`node`]) and the client [`client::UcxTransport`],
//! which reads and writes them one-sided and everything else over TCP
//! (co-located nodes by [`cross_memory`] attach where the kernel allows).

pub mod api;
pub mod client;
pub mod cross_memory;
pub mod engine;
pub mod node;

pub use client::{RouteSource, UcxClientConfig, UcxTransport};
pub use node::UcxNode;

#[cfg(test)]
mod tests;
