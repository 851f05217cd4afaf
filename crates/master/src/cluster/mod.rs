//! The cluster's members as the master sees them: store nodes and their
//! DRAM segments (`node.rs`, with the replicas placed in them), each
//! segment's range allocator (`allocator.rs`) and the UCX routes nodes
//! publish (`ucx_routes.rs`).

pub mod allocator;
mod node;
pub mod ucx_routes;

pub use node::{NodeEntry, NodeIdentity, Replica, SegmentEntry};
