//! Keeping SSD owners in step with removals: a key removed from Strata (or a
//! stale copy an owner reported) is dropped from the owner's buckets, and an
//! owner evicting buckets first makes the master forget every replica in
//! them, so no reader is sent to a bucket being deleted.

use crate::master::Master;
use crate::objects::SsdReplica;
use std::collections::HashSet;
use strata_common::Result;
use strata_proto as pb;

/// Drops queued for one owner at most; beyond it the oldest are discarded
/// (their bytes are then reclaimed by bucket eviction instead).
const MAX_PENDING_DROPS: usize = 1 << 20;
/// Drops delivered per heartbeat.
const DROPS_PER_HEARTBEAT: usize = 10_000;

impl Master {
    /// Tells the owners of `ssd` to forget their copy of `key`.
    pub(crate) fn forget_ssd(&self, key: &str, ssd: &[SsdReplica]) {
        if ssd.is_empty() {
            return;
        }
        let mut drops = self.ssd_drops.lock();
        for r in ssd {
            let q = drops.entry(r.owner_id).or_default();
            if q.len() >= MAX_PENDING_DROPS {
                tracing::warn!(
                    owner = r.owner_id,
                    "too many SSD drops pending; discarding the oldest"
                );
                q.drain(..q.len() / 2);
            }
            q.push(pb::SsdObject {
                key: key.to_string(),
                bucket_id: r.bucket_id,
                offset: r.offset,
                length: r.length,
                crc32c: 0,
            });
        }
    }

    pub(crate) fn take_ssd_drops(&self, owner: u64) -> Vec<pb::SsdObject> {
        let mut drops = self.ssd_drops.lock();
        let Some(q) = drops.get_mut(&owner) else {
            return Vec::new();
        };
        let n = q.len().min(DROPS_PER_HEARTBEAT);
        let out: Vec<_> = q.drain(..n).collect();
        if q.is_empty() {
            drops.remove(&owner);
        }
        out
    }

    /// Forgets every SSD replica in `bucket_ids` of the owner (which deletes
    /// them next). Objects left with no replica at all disappear.
    pub fn evict_buckets(&self, req: &pb::EvictBucketsRequest) -> Result<pb::EvictBucketsResponse> {
        self.owners
            .check_epoch(req.owner_id, req.epoch, &req.instance_proof)?;
        let doomed: HashSet<u64> = req.bucket_ids.iter().copied().collect();
        let (mut dropped, mut gone) = (0u64, 0i64);
        for shard in self.objects.shards() {
            shard.lock().retain(|_, o| {
                dropped += o
                    .retain_ssd(|r| r.owner_id != req.owner_id || !doomed.contains(&r.bucket_id))
                    as u64;
                let keep = !o.replicas().is_empty() || !o.ssd().is_empty() || !o.is_complete();
                gone += i64::from(!keep);
                keep
            });
        }
        self.metrics.keys.sub(gone);
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
