//! Keeping SSD owners in step with removals: a key removed from Strata (or a
//! stale copy an owner reported) is dropped from the owner's buckets, and an
//! owner evicting buckets first makes the master forget every replica in
//! them, so no reader is sent to a bucket being deleted.
//!
//! Drops are numbered per owner and kept (and resent) until the owner
//! confirms it applied them, so a removal can wait for its SSD copies to be
//! gone as it waits for its DRAM frees (`commit_sync.rs`): otherwise a new
//! leader, which has not seen the removal, would adopt the copy from the
//! owner's inventory again.

use super::SsdTier;
use crate::model::Model;
use crate::objects::SsdReplica;
use crate::sync::{Acks, Unsynced};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use strata_common::Result;
use strata_proto as pb;

/// Drops queued for one owner at most; beyond it the oldest are discarded
/// (their bytes are then reclaimed by bucket eviction instead, and a removal
/// waiting for them gets a retryable error).
const MAX_PENDING_DROPS: usize = 1 << 20;
/// Drops delivered per heartbeat.
const DROPS_PER_HEARTBEAT: usize = 10_000;

/// The drops of one term, per SSD owner.
pub struct Drops {
    term: u64,
    owners: Mutex<HashMap<u64, OwnerDrops>>,
}

struct OwnerDrops {
    next_seq: u64,
    queue: VecDeque<(u64, pb::SsdObject)>,
    acks: Arc<Acks>,
}

impl Drops {
    pub fn new(term: u64) -> Drops {
        Drops {
            term,
            owners: Mutex::new(HashMap::new()),
        }
    }

    /// Queues drops of `key`'s copies; returns what confirms them.
    pub fn queue(&self, key: &str, ssd: &[SsdReplica]) -> Unsynced {
        let mut unsynced = Unsynced::default();
        let mut owners = self.owners.lock();
        for r in ssd {
            let q = owners.entry(r.owner_id).or_insert_with(|| OwnerDrops {
                next_seq: 1,
                queue: VecDeque::new(),
                acks: Arc::new(Acks::new(format!("SSD owner {}", r.owner_id))),
            });
            if q.queue.len() >= MAX_PENDING_DROPS {
                tracing::warn!(
                    owner = r.owner_id,
                    "too many SSD drops pending; discarding the oldest"
                );
                let n = q.queue.len() / 2;
                if let Some(&(last, _)) = q.queue.get(n.saturating_sub(1)) {
                    q.acks.lose(last);
                }
                q.queue.drain(..n);
            }
            let seq = q.next_seq;
            q.next_seq += 1;
            q.queue.push_back((
                seq,
                pb::SsdObject {
                    key: key.to_string(),
                    bucket_id: r.bucket_id,
                    offset: r.offset,
                    length: r.length,
                    crc32c: 0,
                    copy_record: Vec::new(),
                },
            ));
            unsynced.push(q.acks.clone(), seq);
        }
        unsynced
    }

    /// An owner's heartbeat: takes its confirmation, then returns the drops
    /// still to apply (a page) and the sequence number of the last one.
    pub fn take(&self, req: &pb::OwnerHeartbeatRequest) -> (Vec<pb::SsdObject>, u64) {
        let mut owners = self.owners.lock();
        let Some(q) = owners.get_mut(&req.owner_id) else {
            return (Vec::new(), 0);
        };
        if !req.acks_drops {
            // An older agent: each drop once, counted as done when sent.
            let n = q.queue.len().min(DROPS_PER_HEARTBEAT);
            let page: Vec<_> = q.queue.drain(..n).collect();
            let through = page.last().map_or(0, |(s, _)| *s);
            q.acks.ack(through);
            return (page.into_iter().map(|(_, d)| d).collect(), through);
        }
        // A confirmation from another term numbers other drops; one beyond
        // what was sent cannot be true.
        if req.drops_term == self.term && req.drops_applied < q.next_seq {
            while q
                .queue
                .front()
                .is_some_and(|(s, _)| *s <= req.drops_applied)
            {
                q.queue.pop_front();
            }
            q.acks.ack(req.drops_applied);
        }
        let n = q.queue.len().min(DROPS_PER_HEARTBEAT);
        let through = n.checked_sub(1).map_or(0, |last| q.queue[last].0);
        let page = q.queue.iter().take(n).map(|(_, d)| d.clone()).collect();
        (page, through)
    }
}

impl SsdTier {
    /// Tells the owners of `ssd` to forget their copy of `key`; returns
    /// what confirms they did.
    pub(crate) fn forget(&self, key: &str, ssd: &[SsdReplica]) -> Unsynced {
        if ssd.is_empty() {
            return Unsynced::default();
        }
        let unsynced = self.drops.queue(key, ssd);
        // A long-polling owner learns of it at once.
        self.owner_work.notify_waiters();
        unsynced
    }

    /// Forgets every SSD replica in `bucket_ids` of the owner (which deletes
    /// them next). Objects left with no replica at all disappear.
    pub(crate) fn evict_buckets(
        &self,
        m: Model,
        req: &pb::EvictBucketsRequest,
    ) -> Result<pb::EvictBucketsResponse> {
        self.owners
            .check_epoch(req.owner_id, req.epoch, &req.instance_proof)?;
        let doomed: HashSet<u64> = req.bucket_ids.iter().copied().collect();
        let (mut dropped, mut gone) = (0u64, 0i64);
        for shard in m.objects.shards() {
            shard.lock().retain(|_, o| {
                dropped += o
                    .retain_ssd(|r| r.owner_id != req.owner_id || !doomed.contains(&r.bucket_id))
                    as u64;
                let keep = !o.replicas().is_empty() || !o.ssd().is_empty() || !o.is_complete();
                gone += i64::from(!keep);
                keep
            });
        }
        m.metrics.keys.sub(gone);
        tracing::info!(
            owner = req.owner_id,
            buckets = doomed.len(),
            replicas = dropped,
            objects_gone = gone,
            "SSD buckets evicted"
        );
        Ok(pb::EvictBucketsResponse {
            replicas_dropped: dropped,
        })
    }
}
