//! The cluster's members as the master sees them: store nodes and their
//! DRAM segments (`node.rs`, with the replicas placed in them), each
//! segment's range allocator (`allocator.rs`) and the UCX routes nodes
//! publish (`ucx_routes.rs`).

pub mod allocator;
mod node;
pub mod ucx_routes;

pub use node::{NodeEntry, NodeIdentity, Replica, SegmentEntry};

use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use strata_common::time::unix_ms;
use strata_transport::tcp::{TcpTransport, TcpTransportConfig};

/// The store nodes of one term, their segments, and the ids and
/// generations the master hands out to them.
pub struct Cluster {
    pub(crate) segments: RwLock<HashMap<u64, Arc<SegmentEntry>>>,
    pub(crate) nodes: RwLock<HashMap<String, Arc<NodeEntry>>>,
    pub(crate) next_segment_id: AtomicU64,
    pub(crate) next_incarnation: AtomicU64,
    /// Generation of the next allocation; grants carry it so a freed range's
    /// old grants die (`strata_transport::fence`). Seeded from the clock so
    /// it keeps increasing across restarts (65,536 allocations per
    /// millisecond of uptime would be needed to catch up with it).
    pub(crate) next_generation: AtomicU64,
    /// Nodes that left (HeartbeatRequest.leaving) since the last
    /// housekeeping: forgotten durably with the expired ones, so a later
    /// master does not wait for them.
    pub(crate) left_nodes: Mutex<Vec<String>>,
    /// Pings data-plane addresses (is an SSD owner's holder still alive?).
    pub(crate) pinger: TcpTransport,
}

impl Cluster {
    pub(crate) fn new() -> Cluster {
        Cluster {
            segments: RwLock::new(HashMap::new()),
            nodes: RwLock::new(HashMap::new()),
            next_segment_id: AtomicU64::new(1),
            next_incarnation: AtomicU64::new(1),
            next_generation: AtomicU64::new(unix_ms() << 16),
            left_nodes: Mutex::new(Vec::new()),
            pinger: TcpTransport::new(TcpTransportConfig {
                connect_timeout: std::time::Duration::from_secs(1),
                io_timeout: std::time::Duration::from_secs(1),
                max_idle_per_node: 0,
                ..Default::default()
            }),
        }
    }
}
