//! Code shared by every Strata crate: error codes, size and duration parsing,
//! data-plane grants, telemetry set-up and the admin HTTP server.

pub mod admin;
pub mod auth;
pub mod config;
pub mod error;
pub mod etcd;
pub mod files;
pub mod grant;
pub mod grpc;
pub mod leader;
pub mod limits;
pub mod metrics;
pub mod ports;
pub mod quick_client;
pub mod quick_wire;
pub mod service;
pub mod shutdown;
pub mod slices;
pub mod spin;
pub mod telemetry;
pub mod term;
#[cfg(feature = "testing")]
pub mod testing;
pub mod time;
pub mod units;

pub use error::{Code, Error, Result};
