//! The UCX data plane (feature `ucx`), built on Debian's UCX 1.13 through
//! `strata-ucx-sys`.
//!
//! This is the first slice: a safe layer over UCP ([`api`]), a worker on a
//! progress thread driven from async code ([`engine`]), and tests of
//! one-sided put and get between a registered region and a remote worker
//! over UCX's `tcp` and shared-memory transports. The `Transport`
//! implementation (rkeys published through the master's segment metadata,
//! grants, the store node and client wiring) builds on them.

pub mod api;
pub mod engine;

#[cfg(test)]
mod tests;
