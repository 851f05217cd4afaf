//! The Strata client library that inference engines (and the Python wheel)
//! embed. The `strata` CLI, `strata up` and the benchmarks live in
//! `strata-cli`, so this crate pulls in no server.
//!
//! ```no_run
//! # async fn demo() -> strata_common::Result<()> {
//! use strata_client::{Client, ClientConfig, PutOptions};
//! let c = Client::connect(ClientConfig::new("127.0.0.1:7400")).await?;
//! c.put("prefix/block-0", b"kv bytes", &PutOptions::default()).await?;
//! let v = c.get("prefix/block-0").await?;
//! # Ok(()) }
//! ```

mod client;
mod engine_calls;
mod lease_ends;
mod locations;
mod lookups;
mod master_calls;
mod placement;
pub mod put_steps;
mod retry;
mod status;
mod ucx;
pub mod up_token;

pub use client::{remote_range, Client, ClientConfig, PutOptions, Tier};
pub use master_calls::MasterCalls;
pub use retry::Backoff;
pub use strata_common::{Code, Error, Result};
pub use strata_transport::TransportKind;
