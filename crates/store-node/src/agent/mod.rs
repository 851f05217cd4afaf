//! The node's member duties towards the master: registering its segments
//! (`registration.rs`, with the report a rebuilding master asks for and
//! the leave at shutdown), heartbeating and applying the object log it
//! brings (`heartbeat.rs`, and the loop below).

mod heartbeat;
mod registration;

use crate::metrics::NodeMetrics;
use crate::records::ObjectRecords;
use crate::ucx::Ucx;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use strata_common::grpc::MasterChannel;
use strata_common::leader::LeaderChannel;
use strata_common::quick_client::QuickClient;
use strata_proto as pb;
use strata_proto::master_client::MasterClient;
use strata_transport::region::{Segment, SegmentTable};
use tokio_util::sync::CancellationToken;

/// Keeps the node registered with the master and applies its object log.
pub(crate) struct Agent {
    pub(crate) client: MasterClient<MasterChannel>,
    /// Heartbeats on a plain connection to the leader (`quick_wire`):
    /// a put waits for its node to apply an entry the heartbeat's long poll
    /// brings, and a gRPC round trip each way cost it ~0.1 ms.
    pub(crate) quick: Option<QuickClient>,
    /// Where both send their calls: a heartbeat that runs past its
    /// deadline makes it pick again (`leader::heartbeat_deadline`).
    pub(crate) route: LeaderChannel,
    pub(crate) node_id: String,
    /// Public id of this process (ping answer) and the secret it proves
    /// its registration with.
    pub(crate) instance: String,
    pub(crate) proof: Vec<u8>,
    pub(crate) advertise: String,
    pub(crate) sizes: Vec<u64>,
    pub(crate) segments: Vec<Arc<Segment>>,
    pub(crate) table: Arc<SegmentTable>,
    pub(crate) records: Arc<ObjectRecords>,
    pub(crate) registered: Arc<AtomicBool>,
    pub(crate) metrics: Arc<NodeMetrics>,
    /// The master's ids of our segments, by local index (last registration).
    pub(crate) segment_ids: Vec<u64>,
    /// Highest master term seen: answers from a deposed leader are refused.
    pub(crate) fence: Arc<strata_common::term::TermFence>,
    /// Segments exposed over UCX; dropped (unregistered) when the agent stops.
    pub(crate) ucx: Option<Ucx>,
    /// Tell the master at shutdown (`StoreNodeConfig::leave_on_shutdown`).
    pub(crate) leave_on_shutdown: bool,
}

impl Agent {
    /// The error of a heartbeat that ran past `deadline`: its master
    /// (`called`, the route's pick when it was sent; else the one it picked
    /// for it) is forgotten, so the next call goes to the next one (or the
    /// leader etcd names).
    fn hung_master(&self, deadline: Duration, called: Option<String>) -> strata_common::Error {
        let addr = called.or_else(|| self.route.current());
        if let Some(a) = &addr {
            self.route.forget(a);
        }
        strata_common::Error::unavailable(format!(
            "master {} did not answer a heartbeat within {deadline:?}; trying the next one",
            addr.as_deref().unwrap_or("(none picked)")
        ))
    }

    /// Registers, then heartbeats and applies the object log until
    /// shutdown (registering again whenever the master forgets this node).
    pub(crate) async fn run(mut self, shutdown: CancellationToken) {
        let mut backoff = Duration::from_millis(50);
        // The registration held when shutdown came, for a graceful leave.
        let mut held: Option<u64>;
        'outer: loop {
            held = None;
            let (incarnation, interval) = loop {
                match self.register().await {
                    Ok(v) => break v,
                    Err(e) => {
                        tracing::warn!(error = %e, retry_in = ?backoff, "cannot register with master");
                        tokio::select! {
                            _ = shutdown.cancelled() => break 'outer,
                            _ = tokio::time::sleep(backoff) => {}
                        }
                        backoff = (backoff * 2).min(Duration::from_secs(2));
                    }
                }
            };
            backoff = Duration::from_millis(50);
            held = Some(incarnation);
            loop {
                let req = pb::HeartbeatRequest {
                    node_id: self.node_id.clone(),
                    incarnation,
                    applied_seq: self.records.applied_seq(),
                    instance_proof: self.proof.clone(),
                    // Long poll: commits reach us (and PutEnds waiting for
                    // them go on) at once, not one interval later.
                    wait_ms: interval.as_millis() as u64,
                    leaving: false,
                };
                let t0 = tokio::time::Instant::now();
                let mut wait = interval;
                let deadline = strata_common::leader::heartbeat_deadline(interval);
                let called = self.route.current();
                let call = tokio::select! {
                    // The master may hold the call for an interval.
                    _ = shutdown.cancelled() => break 'outer,
                    r = tokio::time::timeout(deadline, self.heartbeat(req)) => r,
                };
                let call = call.unwrap_or_else(|_| Err(self.hung_master(deadline, called)));
                let answer = call.and_then(|r| self.fence.admit(r.term).map(|()| r));
                match answer {
                    Ok(r) => {
                        if !r.known {
                            // The master forgot us (TTL, restart): whatever it
                            // knew of our contents is gone, so start clean.
                            tracing::warn!(
                                node = self.node_id,
                                "master no longer knows this node; registering again"
                            );
                            self.registered.store(false, Ordering::Release);
                            self.table.clear();
                            continue 'outer;
                        }
                        let (full, delivered) = (r.log.len() >= 32_768, !r.log.is_empty());
                        // A free ends its fence under the records' lock: a
                        // write's record is kept only while its allocation's
                        // fence stands (`receipts.rs`).
                        self.records.apply_freeing(r.log, |f| {
                            self.table
                                .freed(f.segment_id, f.offset, f.length, f.generation)
                        });
                        self.metrics.objects.set(self.records.len() as i64);
                        self.metrics.object_bytes.set(self.records.bytes() as i64);
                        self.metrics
                            .pending_puts
                            .set(self.records.pending_len() as i64);
                        // Entries delivered: acknowledge them at once. Else
                        // the master held the call; keep the cadence.
                        if full || delivered {
                            wait = Duration::ZERO;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "heartbeat failed");
                        // Not the leader (the channel follows the one it
                        // named) or unreachable (the next one is tried):
                        // try again soon, so a new leader hears from us
                        // and stops waiting for our report.
                        if e.code == strata_common::Code::NotLeader || e.retryable() {
                            wait = wait.min(Duration::from_millis(50));
                        }
                    }
                }
                if !wait.is_zero() {
                    tokio::select! {
                        _ = shutdown.cancelled() => break 'outer,
                        _ = tokio::time::sleep_until(t0 + wait) => {}
                    }
                }
            }
        }
        self.registered.store(false, Ordering::Release);
        if let (true, Some(incarnation)) = (self.leave_on_shutdown, held) {
            self.leave(incarnation).await;
        }
    }
}
