//! A put is acknowledged once its commit is in the records of the store
//! nodes holding it, not only in the master's memory: a master that dies
//! (or is deposed) right after a PutEnd must not take an acknowledged object
//! with it, since a new master rebuilds from what the nodes report
//! (`rebuild.rs`). Nodes long-poll their heartbeats, so a commit reaches
//! them at once and their next heartbeat acknowledges it: about one extra
//! round trip per PutEnd (or per batch). A removal waits the same way for
//! its frees, and for SSD owners to drop their copies (`offload/removal.rs`),
//! so that no restart or failover brings a removed object back.
//!
//! A client that knows its object's checksum before writing declares it at
//! PutStart: the master announces the put to its nodes then (`announce`),
//! and they report it to a rebuilding master only if the bytes they hold
//! match. The round trip to the nodes then overlaps the write, and PutEnd
//! waits only for the announcement, which has usually been applied by then.

use crate::cluster::Replica;
use crate::master::Master;
use crate::objects::Announced;
use crate::sync::Unsynced;
use std::time::{Duration, Instant};
use strata_common::Result;
use strata_proto as pb;

/// Tells each replica's node (those that keep pending puts) of a put whose
/// checksum is known, before its bytes are written; with `receipts`, not
/// the nodes that record it from the client's write (`put_record`).
pub(crate) fn announce(
    key: &str,
    size: u64,
    crc32c: u32,
    replicas: &[Replica],
    receipts: bool,
) -> Announced {
    let seqs = replicas
        .iter()
        .filter(|r| r.seg.node.records_pending && !r.seg.node.records_from_write(receipts))
        .map(|r| {
            let seq = r.seg.node.log_object(
                pb::object_log_entry::Op::Pending,
                true,
                key,
                r.seg.id,
                r.offset,
                size,
                crc32c,
                r.generation,
            );
            (r.seg.id, seq)
        })
        .collect();
    Announced { crc32c, seqs }
}

/// What the node of replica `r` records of a put from its write: signed
/// by the master at PutStart (`Replica.record`), by the node in its receipt.
pub(crate) fn put_record<'a>(
    key: &'a str,
    r: &Replica,
    size: u64,
    crc32c: u32,
) -> strata_common::grant::PutRecord<'a> {
    strata_common::grant::PutRecord {
        key,
        segment_id: r.seg.id,
        offset: r.offset,
        length: size,
        generation: r.generation,
        crc32c,
    }
}

impl Master {
    /// Whether PutEnd brought the receipt of replica `r`'s node for these
    /// very bytes: the node holds the put in its records (a rebuilding
    /// master adopts it from there), so the commit need not be waited for.
    /// A receipt that does not verify (another checksum, a node that
    /// registered again since, a forgery) only loses that shortcut.
    pub(crate) fn receipted(
        &self,
        key: &str,
        r: &Replica,
        size: u64,
        crc32c: u32,
        receipts: &[pb::PutReceipt],
    ) -> bool {
        let Some(receipt) = receipts.iter().find(|x| x.segment_id == r.seg.id) else {
            return false;
        };
        let put = put_record(key, r, size, crc32c);
        let ok =
            r.seg.node.records_receipts && r.seg.node.grant_key.verify_receipt(&put, &receipt.mac);
        if ok {
            self.metrics.put_receipts_accepted.inc();
        } else {
            self.metrics.put_receipts_refused.inc();
            // Expected after a failover (the new term's keys are other
            // keys): the metric tells, not a line per put.
            tracing::debug!(
                key,
                segment = r.seg.id,
                "a put's receipt did not verify; waiting for its node instead"
            );
        }
        ok
    }

    /// Longest a PutEnd waits for its nodes: a node that does not answer
    /// within two heartbeat intervals is failing anyway (its objects go
    /// with it), and the put stays committed in this master.
    fn sync_wait(&self) -> Duration {
        (self.cfg.node_ttl / 2).min(Duration::from_secs(2))
    }

    /// Waits until every node acknowledged its commits. A node that does
    /// not within the bound, or a term that ends meanwhile, makes the
    /// answer a retryable error rather than an acknowledgement the next
    /// master might not honour: the client's retry finds the key (if a node
    /// has it) and checks it holds its bytes.
    pub(crate) async fn await_synced(&self, u: Unsynced, what: &str) -> Result<()> {
        let deadline = Instant::now() + self.sync_wait();
        u.wait(
            deadline,
            self.closing(),
            &self.metrics.unsynced_commits,
            what,
        )
        .await
    }

    /// `r`'s answer once its members applied what it logged (`await_synced`).
    pub(crate) async fn when_synced<T>(&self, r: Result<(T, Unsynced)>, what: &str) -> Result<T> {
        let (answer, u) = r?;
        self.await_synced(u, what).await.map(|()| answer)
    }

    /// A node heartbeat that, with nothing to deliver, waits up to
    /// `wait_ms` (capped by the heartbeat interval) for new log entries.
    pub async fn heartbeat_wait(
        &self,
        req: &pb::HeartbeatRequest,
    ) -> Result<pb::HeartbeatResponse> {
        let cap = self.heartbeat_interval();
        let wait = Duration::from_millis(req.wait_ms).min(cap);
        let node = self.cluster.nodes.read().get(&req.node_id).cloned();
        let deadline = Instant::now() + wait;
        loop {
            let grew = node.as_ref().map(|n| n.log_grew.notified());
            let mut grew = grew.map(Box::pin);
            if let Some(g) = grew.as_mut() {
                g.as_mut().enable();
            }
            let resp = self.heartbeat(req)?;
            if !resp.log.is_empty() || !resp.known || Instant::now() >= deadline {
                return Ok(resp);
            }
            let Some(g) = grew else {
                return Ok(resp);
            };
            tokio::select! {
                _ = g => {}
                _ = tokio::time::sleep_until(deadline.into()) => return Ok(resp),
                // The term ends: answer now rather than hold the drain.
                _ = self.closing().cancelled() => return Ok(resp),
            }
        }
    }

    pub(crate) fn heartbeat_interval(&self) -> Duration {
        Duration::from_millis((self.cfg.node_ttl.as_millis() as u64 / 4).clamp(20, 2000))
    }
}
