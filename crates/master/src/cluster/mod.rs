//! The cluster's members as the master sees them: store nodes and their
//! DRAM segments (`node.rs`, with the replicas placed in them), each
//! segment's range allocator (`allocator.rs`) and the UCX routes nodes
//! publish (`ucx_routes.rs`).

pub mod allocator;
mod node;
pub(crate) mod registration;
pub(crate) use registration::check_data_addr_reachable;
#[cfg(test)]
mod tests;
pub mod ucx_routes;

pub use node::{NodeEntry, NodeIdentity, Replica, SegmentEntry};

use crate::config::AllocStrategy;
use crate::lock_order::{Lock, OrderedRwLock};
use parking_lot::Mutex;
use rand::seq::SliceRandom;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use strata_common::time::unix_ms;
use strata_common::{Code, Error, Result};
use strata_proto as pb;
use strata_transport::tcp::{TcpTransport, TcpTransportConfig};

/// The store nodes of one term, their segments, and the ids and
/// generations the master hands out to them.
pub struct Cluster {
    segments: OrderedRwLock<HashMap<u64, Arc<SegmentEntry>>>,
    nodes: OrderedRwLock<HashMap<String, Arc<NodeEntry>>>,
    next_segment_id: AtomicU64,
    next_incarnation: AtomicU64,
    /// Generation of the next allocation; grants carry it so a freed range's
    /// old grants die (`strata_transport::fence`). Seeded from the clock so
    /// it keeps increasing across restarts (65,536 allocations per
    /// millisecond of uptime would be needed to catch up with it).
    next_generation: AtomicU64,
    /// Nodes that left (HeartbeatRequest.leaving) since the last
    /// housekeeping: forgotten durably with the expired ones, so a later
    /// master does not wait for them.
    left_nodes: Mutex<Vec<String>>,
    /// Node ids this term dropped after they reported or with replicas on
    /// them: not asked to report again (see `register`).
    dropped_in_term: Mutex<std::collections::HashSet<String>>,
    /// Pings data-plane addresses (is an SSD owner's holder still alive?).
    pinger: TcpTransport,
    /// When the last expiry sweep ran (unix ms; 0: none yet): a late one
    /// does not hold its lateness against the nodes (`forgive_stall`).
    last_sweep_ms: AtomicU64,
    /// The stall the last sweep forgave (0: it was on time), for the SSD
    /// owners' liveness, judged in the same housekeeping tick.
    last_stall_ms: AtomicU64,
}

impl Cluster {
    pub(crate) fn new() -> Cluster {
        Cluster {
            segments: OrderedRwLock::new(Lock::Segments, HashMap::new()),
            nodes: OrderedRwLock::new(Lock::Nodes, HashMap::new()),
            next_segment_id: AtomicU64::new(1),
            next_incarnation: AtomicU64::new(1),
            next_generation: AtomicU64::new(unix_ms() << 16),
            left_nodes: Mutex::new(Vec::new()),
            dropped_in_term: Mutex::new(Default::default()),
            last_sweep_ms: AtomicU64::new(0),
            last_stall_ms: AtomicU64::new(0),
            pinger: TcpTransport::new(TcpTransportConfig {
                connect_timeout: std::time::Duration::from_secs(1),
                io_timeout: std::time::Duration::from_secs(1),
                max_idle_per_node: 0,
                ..Default::default()
            }),
        }
    }

    /// The UCX routes of `segment_ids` (those that have one). The caller's
    /// rdma role was checked by the service.
    pub fn ucx_routes(&self, segment_ids: &[u64]) -> Vec<pb::UcxRoute> {
        let segs = self.segments.read();
        segment_ids
            .iter()
            .filter_map(|id| {
                let s = segs.get(id)?;
                let r = s.ucx.as_ref()?;
                Some(r.to_proto(s.id, &s.node.data_addr, s.capacity))
            })
            .collect()
    }

    pub fn capacity_bytes(&self) -> u64 {
        self.segments
            .read()
            .values()
            .filter(|s| s.is_mounted())
            .map(|s| s.capacity)
            .fold(0u64, u64::saturating_add)
    }

    pub fn allocated_bytes(&self) -> u64 {
        self.segments
            .read()
            .values()
            .filter(|s| s.is_mounted())
            .map(|s| s.allocated())
            .fold(0u64, u64::saturating_add)
    }

    /// How many distinct nodes could ever hold a copy of `len` bytes (a
    /// mounted segment at least that large): the most copies a put can get.
    pub(crate) fn nodes_for(&self, len: u64) -> usize {
        let segments = self.segments.read();
        let mut nodes: Vec<&Arc<NodeEntry>> = segments
            .values()
            .filter(|s| s.is_mounted() && s.capacity >= len)
            .map(|s| &s.node)
            .collect();
        nodes.sort_by_key(|n| Arc::as_ptr(n));
        nodes.dedup_by(|a, b| Arc::ptr_eq(a, b));
        nodes.len()
    }

    /// Places up to `n` replicas of `size` bytes (`len` with alignment) in
    /// mounted segments with room, `preferred` first, each on another node:
    /// a lost node takes every copy it holds, so two there are one. Nodes
    /// silent for over `quiet_ms` come last.
    pub(crate) fn try_place(
        &self,
        strategy: AllocStrategy,
        size: u64,
        len: u64,
        n: usize,
        preferred: Option<u64>,
        quiet_ms: u64,
    ) -> Vec<Replica> {
        let mut cands: Vec<Arc<SegmentEntry>> = self
            .segments
            .read()
            .values()
            // A node whose log overflowed is about to be dropped: a put
            // there could never be confirmed.
            .filter(|s| s.is_mounted() && s.free_bytes() >= len && !s.node.log_overflowed())
            .cloned()
            .collect();
        // Keys read once per candidate (`sort_by_cached_key`): they change
        // under concurrent puts and heartbeats, and a sort whose order
        // changes midway may panic.
        match strategy {
            AllocStrategy::Random => cands.shuffle(&mut rand::thread_rng()),
            AllocStrategy::MostFreeFirst => {
                cands.sort_by_cached_key(|s| std::cmp::Reverse(s.free_bytes()))
            }
        }
        if let Some(p) = preferred {
            if let Some(i) = cands.iter().position(|s| s.id == p) {
                let s = cands.remove(i);
                cands.insert(0, s);
            }
        }
        // Nodes not heard from for half the TTL last: one silent that long
        // is often about to be dropped (the sweep lags it by up to a tick,
        // and its first heartbeats after a partition heals wait out TCP's
        // retransmission backoff), taking a copy just acknowledged with it
        // (found by the HA nemesis). Used still when the others are short.
        let now = unix_ms();
        cands.sort_by_cached_key(|s| {
            s.node.last_heartbeat_ms.load(Ordering::Relaxed) + quiet_ms < now
        });
        let mut out: Vec<Replica> = Vec::with_capacity(n);
        for seg in cands {
            if out.len() == n {
                break;
            }
            if out.iter().any(|r| Arc::ptr_eq(&r.seg.node, &seg.node)) {
                continue;
            }
            if let Some((offset, alloc_len)) = seg.alloc(size) {
                out.push(Replica {
                    seg,
                    offset,
                    alloc_len,
                    generation: self.next_generation.fetch_add(1, Ordering::Relaxed),
                });
            }
        }
        out
    }

    /// Refuses to register `req.node_id` when another live process holds it:
    /// the registered process answers a ping with its instance id. A node
    /// restarting on the same address answers with its new id, so it
    /// replaces its dead predecessor; a process that proves it *is* the
    /// registered one (same instance proof) simply registers again.
    pub(crate) async fn check_node_takeover(
        &self,
        req: &pb::RegisterNodeRequest,
        ttl: u64,
    ) -> Result<()> {
        let holder = self.nodes.read().get(&req.node_id).cloned();
        let Some(h) = holder else { return Ok(()) };
        if h.proof.matches(&req.instance_proof) {
            return Ok(());
        }
        if h.last_heartbeat_ms.load(Ordering::Relaxed) + ttl < unix_ms() {
            return Ok(());
        }
        match self.pinger.ping(&h.data_addr).await {
            Ok(answer) if answer == h.instance.as_bytes() => Err(Error::new(
                Code::AlreadyExists,
                format!(
                    "node_id {:?} is held by a live process ({}) serving {}; stop it first \
                     or give this node another --node-id",
                    req.node_id, h.instance, h.data_addr
                ),
            )),
            // Another process answers at that address (the holder
            // restarted), or none does (it died). Known limit: a holder whose
            // port cannot be reached is taken to be gone (docs/security.md).
            _ => Ok(()),
        }
    }

    /// Removes node `node_id` (the registration with `incarnation` only,
    /// when given) and unmounts its segments; the caller drops the replicas
    /// they held. Locks: nodes, then segments, never together.
    fn remove_node(&self, node_id: &str, incarnation: Option<u64>) -> Option<Arc<NodeEntry>> {
        let node = {
            let mut nodes = self.nodes.write();
            match nodes.get(node_id) {
                Some(n) if incarnation.is_none_or(|i| n.incarnation == i) => nodes.remove(node_id),
                _ => None,
            }
        }?;
        {
            let mut segs = self.segments.write();
            for id in &node.segment_ids {
                if let Some(s) = segs.remove(id) {
                    s.unmount();
                }
            }
        }
        Some(node)
    }

    /// A sweep that comes late did not look at heartbeats meanwhile: this
    /// master was paused (SIGSTOP, a VM or GC stall) or starved, and the
    /// nodes' heartbeats may be waiting unread in its sockets. That time is
    /// not held against them: each node's last heartbeat moves forward by
    /// the stall, never past `now_ms`. (The HA nemesis saw a leader resumed
    /// from SIGSTOP drop every node, and the objects only they held, before
    /// its keeper noticed the lease had lapsed.) Sweeps run every quarter
    /// `ttl_ms` at most, so a gap over half of it is a stall. Returns the
    /// stall forgiven, in ms.
    fn forgive_stall(&self, ttl_ms: u64, now_ms: u64) -> u64 {
        let last = self.last_sweep_ms.swap(now_ms, Ordering::AcqRel);
        let gap = now_ms.saturating_sub(last);
        let stall = match last == 0 || gap <= ttl_ms / 2 {
            true => 0,
            false => gap - ttl_ms / 4,
        };
        self.last_stall_ms.store(stall, Ordering::Release);
        if stall == 0 {
            return 0;
        }
        for n in self.nodes.read().values() {
            let _ = n
                .last_heartbeat_ms
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                    Some(v.saturating_add(stall).min(now_ms).max(v))
                });
        }
        stall
    }

    /// The stall the last expiry sweep forgave, in ms (0: none).
    pub(crate) fn last_stall_ms(&self) -> u64 {
        self.last_stall_ms.load(Ordering::Acquire)
    }

    /// Registrations (id, incarnation) whose last heartbeat is more than
    /// `ttl_ms` before `now_ms`.
    fn silent(&self, ttl_ms: u64, now_ms: u64) -> Vec<(String, u64)> {
        self.nodes
            .read()
            .values()
            .filter(|n| n.last_heartbeat_ms.load(Ordering::Relaxed) + ttl_ms < now_ms)
            .map(|n| (n.node_id.clone(), n.incarnation))
            .collect()
    }

    /// The nodes that left since the last call.
    fn take_left(&self) -> Vec<String> {
        std::mem::take(&mut *self.left_nodes.lock())
    }

    /// The registration of `node_id`, if any.
    pub(crate) fn node(&self, node_id: &str) -> Option<Arc<NodeEntry>> {
        self.nodes.read().get(node_id).cloned()
    }

    pub(crate) fn node_count(&self) -> usize {
        self.nodes.read().len()
    }

    pub(crate) fn segment_count(&self) -> usize {
        self.segments.read().len()
    }

    /// Every mounted segment, at this moment.
    pub(crate) fn segments(&self) -> Vec<Arc<SegmentEntry>> {
        self.segments.read().values().cloned().collect()
    }

    /// Every mounted segment as `strata stat` shows it, by id.
    pub(crate) fn segment_infos(&self) -> Vec<pb::SegmentInfo> {
        let mut info: Vec<pb::SegmentInfo> = self
            .segments()
            .iter()
            .map(|s| pb::SegmentInfo {
                segment_id: s.id,
                node_id: s.node.node_id.clone(),
                data_addr: s.node.data_addr.clone(),
                capacity_bytes: s.capacity,
                allocated_bytes: s.allocated(),
                largest_free_bytes: s.largest_free(),
            })
            .collect();
        info.sort_by_key(|s| s.segment_id);
        info
    }

    /// `node`'s segments in its registration's order (`None` for one
    /// unmounted meanwhile).
    pub(crate) fn segments_of(&self, node: &NodeEntry) -> Vec<Option<Arc<SegmentEntry>>> {
        let segs = self.segments.read();
        node.segment_ids
            .iter()
            .map(|id| segs.get(id).cloned())
            .collect()
    }

    /// The capacity of the largest mounted segment (`None` before any).
    pub(crate) fn largest_capacity(&self) -> Option<u64> {
        self.segments
            .read()
            .values()
            .filter(|s| s.is_mounted())
            .map(|s| s.capacity)
            .max()
    }

    /// A fresh allocation generation.
    pub(crate) fn next_generation(&self) -> u64 {
        self.next_generation.fetch_add(1, Ordering::Relaxed)
    }

    /// The next generation to be handed out: every allocation made so far
    /// (and every copy adopted so far) has an older one.
    pub(crate) fn generation_watermark(&self) -> u64 {
        self.next_generation.load(Ordering::Relaxed)
    }

    /// Makes every later generation newer than `generation`.
    pub(crate) fn raise_generation(&self, generation: u64) {
        self.next_generation
            .fetch_max(generation.saturating_add(1), Ordering::Relaxed);
    }

    /// Pings a data-plane address (is an SSD owner's holder still alive?).
    pub(crate) async fn ping(&self, addr: &str) -> Result<Vec<u8>> {
        self.pinger.ping(addr).await
    }

    /// The nodes as the admin API shows them.
    pub(crate) fn describe_nodes(&self) -> serde_json::Value {
        let now = unix_ms();
        let nodes = self.nodes.read();
        let mut v: Vec<serde_json::Value> = nodes
            .values()
            .map(|n| {
                let last = n.last_heartbeat_ms.load(Ordering::Relaxed);
                serde_json::json!({
                    "node": n.node_id,
                    "data_addr": n.data_addr,
                    "incarnation": n.incarnation,
                    "segments": n.segment_ids,
                    "last_heartbeat_ms_ago": now.saturating_sub(last),
                    "object_log_backlog": n.log_backlog(),
                })
            })
            .collect();
        v.sort_by(|a, b| a["node"].as_str().cmp(&b["node"].as_str()));
        serde_json::json!({ "nodes": v })
    }
}
