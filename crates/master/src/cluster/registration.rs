//! Store nodes joining (`register`), beating (`heartbeat`) and going
//! (`drop_node`, `expire`): the membership half of `Cluster`. Dropping a
//! node drops its replicas from the object table, so these take the shared
//! model.

use super::{Cluster, NodeEntry, NodeIdentity, SegmentEntry};
use crate::grants::TermKeys;
use crate::model::Model;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_common::auth::ProofHash;
use strata_common::grant::{node_member, GrantKey};
use strata_common::time::unix_ms;
use strata_common::{Code, Error, Result};
use strata_proto as pb;
use tokio_util::sync::CancellationToken;

/// Segments one node may register, and the largest (256 TiB): the master
/// sums what nodes report, so each number is bounded before it is kept.
pub(crate) const MAX_SEGMENTS_PER_NODE: usize = 4096;
pub(crate) const MAX_SEGMENT_BYTES: u64 = 1 << 48;

/// Refuses a member's loopback `data_addr` when the member itself
/// connected from another host: others could not reach it there, and a
/// client that tried would reach whatever listens on its own loopback.
/// `local` is the master's own address on that connection: a member that
/// dialled one of this host's addresses (`strata up --listen 10.0.0.5:…`)
/// comes from that address and is on this host.
pub(crate) fn check_data_addr_reachable(
    data_addr: &str,
    peer: Option<std::net::IpAddr>,
    local: Option<std::net::IpAddr>,
) -> Result<()> {
    let (Ok(addr), Some(peer)) = (data_addr.parse::<std::net::SocketAddr>(), peer) else {
        return Ok(());
    };
    // `::ffff:127.0.0.1` (IPv4 through a dual-stack socket) is loopback too.
    let peer = peer.to_canonical();
    let same_host = peer.is_loopback() || local.map(|l| l.to_canonical()) == Some(peer);
    if addr.ip().to_canonical().is_loopback() && !same_host {
        return Err(Error::invalid(format!(
            "data_addr {data_addr} is a loopback address but this member connected from {peer}: \
             advertise an address other hosts reach (--advertise-addr)"
        )));
    }
    Ok(())
}

/// What a node's registration got.
pub(crate) struct Registered {
    pub(crate) segment_ids: Vec<u64>,
    pub(crate) grant_key: GrantKey,
    pub(crate) incarnation: u64,
    /// Whether the node is asked to report what it holds.
    pub(crate) report: bool,
}

impl Cluster {
    /// Mounts a registering node's segments. A node that registers again
    /// (restart, lost registration) starts clean: whatever the master knew
    /// of its old incarnation goes. (`check_node_takeover` refused first if
    /// another live process holds the id.)
    pub(crate) fn register(
        &self,
        m: Model,
        keys: &TermKeys,
        req: &pb::RegisterNodeRequest,
        rebuilding: bool,
    ) -> Result<Registered> {
        if req.node_id.is_empty() || req.node_id.len() > 256 {
            return Err(Error::invalid("node_id must be 1 to 256 bytes"));
        }
        if req.data_addr.parse::<std::net::SocketAddr>().is_err() {
            return Err(Error::invalid(format!(
                "data_addr {:?} is not HOST:PORT with a numeric host",
                req.data_addr
            )));
        }
        if req.segments.is_empty()
            || req
                .segments
                .iter()
                .any(|s| s.size < super::allocator::ALIGN)
        {
            return Err(Error::invalid(
                "a node must register at least one segment of at least 64 bytes",
            ));
        }
        // A node's own numbers: bounded, so every sum over segments fits.
        if req.segments.len() > MAX_SEGMENTS_PER_NODE
            || req.segments.iter().any(|s| s.size > MAX_SEGMENT_BYTES)
        {
            return Err(Error::invalid(format!(
                "a node registers at most {MAX_SEGMENTS_PER_NODE} segments of at most {MAX_SEGMENT_BYTES} bytes each"
            )));
        }
        let proof = ProofHash::of(&req.instance_proof)?;
        let worker: Arc<[u8]> = req.ucx_worker.as_slice().into();
        let process = super::ucx_routes::node_process(&worker, req.ucx_process.as_ref())?;
        let routes = req
            .segments
            .iter()
            .map(|s| super::ucx_routes::UcxRoute::of(&worker, process.as_ref(), s))
            .collect::<Result<Vec<_>>>()?;
        if self.nodes.read().contains_key(&req.node_id) {
            self.drop_node(m, &req.node_id, None, "re-registered");
        }
        // A node this term dropped after it reported, or with objects on
        // it (its TTL, a leave), is not asked again: what it still holds
        // may have been removed meanwhile. One whose registration never got
        // as far (a lost answer, a retry) still is.
        let report = rebuilding && !self.dropped_in_term.lock().contains(&req.node_id);
        let incarnation = self.next_incarnation.fetch_add(1, Ordering::Relaxed);
        let ids: Vec<u64> = req
            .segments
            .iter()
            .map(|_| self.next_segment_id.fetch_add(1, Ordering::Relaxed))
            .collect();
        let grant_key = keys.member_key(&node_member(&req.node_id), &proof);
        let node = Arc::new(
            NodeEntry::with_log_bound(
                NodeIdentity {
                    node_id: req.node_id.clone(),
                    data_addr: req.data_addr.clone(),
                    instance: req.instance.clone(),
                    proof,
                    grant_key: grant_key.clone(),
                },
                incarnation,
                ids.clone(),
                unix_ms(),
                m.cfg.max_node_log_bytes,
            )
            .with_overflow_counter(m.metrics.node_log_overflows.clone())
            .with_pending_records(req.records_pending)
            .with_commit_records(keys.commit_records())
            .with_report(report)
            .with_receipts(req.records_pending && req.records_receipts),
        );
        {
            let mut segs = self.segments.write();
            for ((id, spec), route) in ids.iter().zip(&req.segments).zip(routes) {
                segs.insert(
                    *id,
                    Arc::new(SegmentEntry::new(*id, node.clone(), spec.size).with_ucx(route)),
                );
            }
        }
        self.nodes.write().insert(req.node_id.clone(), node);
        tracing::info!(
            node = req.node_id,
            addr = req.data_addr,
            segments = ids.len(),
            ucx = !worker.is_empty(),
            "store node registered"
        );
        Ok(Registered {
            report,
            segment_ids: ids,
            grant_key,
            incarnation,
        })
    }

    /// A node's heartbeat: the log entries it has not applied yet, or
    /// `known: false` when its registration is gone (or it left).
    pub(crate) fn heartbeat(
        &self,
        m: Model,
        term: u64,
        req: &pb::HeartbeatRequest,
    ) -> Result<pb::HeartbeatResponse> {
        // Failpoint (tests): answer as a deposed leader would, from an older
        // term, telling the node to start over; its term fence must refuse.
        fail::fail_point!("master::deposed-heartbeat", |_| {
            Ok(pb::HeartbeatResponse {
                known: false,
                log: vec![],
                term: 1,
            })
        });
        let node = self.node(&req.node_id);
        let unknown = pb::HeartbeatResponse {
            known: false,
            log: vec![],
            term,
        };
        match node {
            Some(n) if !n.proof.matches(&req.instance_proof) => Err(Error::new(
                Code::PermissionDenied,
                format!(
                    "heartbeat for node {:?} does not come from the process that registered it",
                    req.node_id
                ),
            )),
            Some(n) if n.incarnation == req.incarnation && req.leaving => {
                // This registration only: a takeover that re-registered the
                // id meanwhile stays.
                self.drop_node(m, &req.node_id, Some(req.incarnation), "left the cluster");
                self.left_nodes.lock().push(req.node_id.clone());
                Ok(unknown)
            }
            Some(n) if n.incarnation == req.incarnation && n.log_overflowed() => {
                self.drop_node(
                    m,
                    &req.node_id,
                    Some(req.incarnation),
                    "its object log overflowed (it stopped applying it)",
                );
                Ok(unknown)
            }
            Some(n) if n.incarnation == req.incarnation => {
                let log = n.log_page(req.applied_seq)?;
                n.ack(req.applied_seq);
                n.last_heartbeat_ms.store(unix_ms(), Ordering::Relaxed);
                Ok(pb::HeartbeatResponse {
                    known: true,
                    log,
                    term,
                })
            }
            _ => Ok(unknown),
        }
    }

    /// A node heartbeat that, with nothing to deliver, waits up to
    /// `wait_ms` (capped by the heartbeat interval) for new log entries, or
    /// until `closing` (the term ends: answer now rather than hold the
    /// drain).
    pub(crate) async fn heartbeat_wait(
        &self,
        m: Model<'_>,
        term: u64,
        closing: &CancellationToken,
        req: &pb::HeartbeatRequest,
    ) -> Result<pb::HeartbeatResponse> {
        let cap = m.cfg.heartbeat_interval();
        let wait = Duration::from_millis(req.wait_ms).min(cap);
        let node = self.node(&req.node_id);
        let deadline = Instant::now() + wait;
        loop {
            let grew = node.as_ref().map(|n| n.log_grew.notified());
            let mut grew = grew.map(Box::pin);
            if let Some(g) = grew.as_mut() {
                g.as_mut().enable();
            }
            let resp = self.heartbeat(m, term, req)?;
            if !resp.log.is_empty() || !resp.known || Instant::now() >= deadline {
                return Ok(resp);
            }
            let Some(g) = grew else {
                return Ok(resp);
            };
            tokio::select! {
                _ = g => {}
                _ = tokio::time::sleep_until(deadline.into()) => return Ok(resp),
                _ = closing.cancelled() => return Ok(resp),
            }
        }
    }

    /// Forgets node `node_id` (the registration with `incarnation` only,
    /// when given): its segments are unmounted and every replica on them is
    /// dropped; objects left without replicas disappear.
    pub(crate) fn drop_node(&self, m: Model, node_id: &str, incarnation: Option<u64>, why: &str) {
        let Some(node) = self.remove_node(node_id, incarnation) else {
            return;
        };
        let (mut lost, mut gone) = (0u64, 0i64);
        for shard in m.objects.shards() {
            let mut s = shard.lock();
            s.retain(|_, o| {
                lost += o.retain_replicas(|r| r.seg.is_mounted()) as u64;
                if o.replicas().is_empty() && o.ssd().is_empty() {
                    gone += 1;
                    false
                } else {
                    true
                }
            });
            // Overwrites being written there (their PutEnd finds none).
            let dropped = s.retain_overwrites(|_, o| {
                lost += o.retain_replicas(|r| r.seg.is_mounted()) as u64;
                !o.replicas().is_empty()
            });
            gone += dropped.len() as i64;
        }
        if lost > 0 || node.reported.load(Ordering::Acquire) {
            // Bounded by the node ids that ever registered this term.
            self.dropped_in_term.lock().insert(node_id.to_string());
        }
        m.metrics.lost_replicas.inc_by(lost);
        m.metrics.keys.sub(gone);
        tracing::warn!(
            node = node_id,
            why,
            lost_replicas = lost,
            lost_objects = gone,
            "store node dropped"
        );
    }

    /// Drops nodes whose last heartbeat is older than `--node-ttl`; returns
    /// them and the nodes that left since the last call (both to forget).
    pub(crate) fn expire(&self, m: Model, now_ms: u64) -> Vec<String> {
        let ttl = m.cfg.node_ttl.as_millis() as u64;
        let stall = self.forgive_stall(ttl, now_ms);
        if stall > 0 {
            tracing::warn!(
                stall_ms = stall,
                "node expiry ran late (was this master paused?): the nodes' silence meanwhile \
                 is not counted against them"
            );
        }
        let dead = self.silent(ttl, now_ms);
        for (id, incarnation) in &dead {
            // That registration only: one that took the id over meanwhile
            // is alive.
            self.drop_node(m, id, Some(*incarnation), "missed --node-ttl");
        }
        let mut gone = self.take_left();
        gone.extend(dead.into_iter().map(|(id, _)| id));
        gone
    }
}
