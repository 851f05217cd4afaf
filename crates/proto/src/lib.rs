//! Generated gRPC types for Strata's control plane. The `.proto` files under
//! `proto/` are the wire contract; this crate only re-exports the generated code.

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod v1 {
    tonic::include_proto!("strata.v1");
}

pub use v1::*;
