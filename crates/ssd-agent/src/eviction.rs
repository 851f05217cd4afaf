//! Bucket eviction. Above the high watermark (or when a batch of offloads
//! needs room) the agent evicts whole buckets, sparse ones (mostly removed
//! objects) first, then the oldest written, down to the low watermark. The
//! order makes deletion safe against readers:
//! 1. the master forgets every replica in the buckets (no new reader is sent),
//! 2. the buckets refuse new reads (a reader holding an older grant gets a
//!    clean "not found"),
//! 3. each bucket is deleted once its in-flight reads finished.
//!
//! Objects read since their bucket was written get another chance: they are
//! rewritten into a new bucket (the master learns their new place first) with
//! one read credit less, so eviction works per object for what is in use
//! (CLOCK with counters up to `MAX_CREDIT`), per bucket for the rest.

use crate::store::{OwnerStore, MAX_CREDIT};
use prometheus::IntCounter;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_common::grpc::MasterChannel;
use strata_common::{Error, Result};
use strata_proto as pb;
use strata_proto::master_client::MasterClient;

/// How long one pass waits for readers of the buckets it evicts; buckets
/// still read after that are deleted by a later pass.
const READER_WAIT: Duration = Duration::from_secs(10);

#[derive(Clone)]
pub struct EvictionMetrics {
    pub buckets: IntCounter,
    /// Recently read objects rewritten out of evicted buckets.
    pub kept_objects: IntCounter,
    pub bytes: IntCounter,
    pub removed_objects: IntCounter,
    /// Buckets evicted by a pass's last round, which keeps nothing.
    pub forced_buckets: IntCounter,
}

pub struct Evictor {
    pub store: Arc<OwnerStore>,
    /// Bytes of recently read objects one pass may keep by rewriting them
    /// into a new bucket (a bucket's worth: disk use stays within the
    /// capacity plus one bucket).
    pub keep_budget: u64,
    pub high_watermark: f64,
    pub low_watermark: f64,
    pub sparse_below: f64,
    pub metrics: EvictionMetrics,
}

impl Evictor {
    /// Usage to evict down to so that `need` more bytes fit, or None when no
    /// room has to be made.
    fn target(&self, need: u64) -> Option<u64> {
        // The index's share of the disk is not the buckets' to use.
        let cap = self.store.bucket_capacity() as f64;
        // A batch larger than half the disk does not get to empty it: the
        // buckets that still do not fit are refused (no_space) instead.
        let need = need.min(self.store.bucket_capacity() / 2);
        let used = self.store.stats().used as f64;
        let want = used + need as f64;
        if want <= cap * self.high_watermark && want <= cap {
            return None;
        }
        Some((cap * self.low_watermark).min(cap - need as f64).max(0.0) as u64)
    }

    /// One pass: makes room for `need` bytes (0 = just keep below the high
    /// watermark) and drops sparse buckets. Returns the bytes freed.
    pub async fn pass(
        &self,
        master: &mut MasterClient<MasterChannel>,
        who: &crate::Registration,
        need: u64,
    ) -> Result<u64> {
        // Buckets a previous pass could not delete yet (still being read).
        let mut freed = self.delete_idle(self.store.evicting()).await;
        // Evict a bucket more than needed: the objects kept by rewriting
        // them take some of the room made.
        let target = self
            .target(need)
            .map_or(u64::MAX, |t| t.saturating_sub(self.keep_budget));
        // Victims go in groups whose kept objects fit one rewrite of at most
        // `keep_budget` bytes, each group kept, forgotten and deleted before
        // the next: disk use stays within capacity + one bucket however many
        // objects are kept. A round's victims are chosen at its start, so it
        // never evicts what its own keeps wrote; when the keeps left too
        // little room for `need`, another round goes on around the clock
        // (kept objects lost a credit, so it ends).
        // One wait for readers per pass, however many groups it evicts.
        let deadline = Instant::now() + READER_WAIT;
        for round in 0..=MAX_CREDIT {
            // Objects read all the time would keep their credit forever: the
            // last round keeps nothing, so room is always made.
            let budget = if round < MAX_CREDIT {
                self.keep_budget
            } else {
                0
            };
            let victims = self.store.eviction_candidates(target, self.sparse_below);
            if budget == 0 && !victims.is_empty() {
                self.metrics.forced_buckets.inc_by(victims.len() as u64);
                tracing::debug!(
                    buckets = victims.len(),
                    "evicting without keeping read objects: what is read does not fit"
                );
            }
            let mut rest = victims.as_slice();
            while !rest.is_empty() {
                let n = match budget {
                    0 => rest.len(),
                    b => self.store.keep_group(rest, b),
                };
                freed += self
                    .evict_group(master, who, &rest[..n], budget, deadline)
                    .await?;
                rest = &rest[n..];
            }
            let used = self.store.stats().used;
            if victims.is_empty() || need == 0 || used + need <= self.store.bucket_capacity() {
                break;
            }
        }
        Ok(freed)
    }

    /// Keeps the read objects of `victims`, has the master forget the
    /// buckets, then deletes each once its in-flight reads finished (waiting
    /// until `deadline` at most; later passes delete the rest).
    async fn evict_group(
        &self,
        master: &mut MasterClient<MasterChannel>,
        who: &crate::Registration,
        victims: &[u64],
        keep_budget: u64,
        deadline: Instant,
    ) -> Result<u64> {
        if keep_budget > 0 {
            self.keep_read_objects(master, who, victims, keep_budget)
                .await;
        }
        master
            .evict_buckets(pb::EvictBucketsRequest {
                owner_id: who.owner_id,
                epoch: who.epoch,
                bucket_ids: victims.to_vec(),
                instance_proof: who.proof.clone(),
            })
            .await
            .map_err(Error::from)?;
        self.store.begin_evict(victims);
        let mut left = victims.to_vec();
        let mut freed = 0;
        while !left.is_empty() {
            let (idle, busy): (Vec<u64>, Vec<u64>) =
                left.into_iter().partition(|b| self.store.readers(*b) == 0);
            freed += self.delete_idle(idle).await;
            left = busy;
            if left.is_empty() || Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if !left.is_empty() {
            tracing::info!(
                buckets = left.len(),
                "evicted buckets are still being read; deleting them later"
            );
        }
        Ok(freed)
    }

    /// Another chance: objects read since their bucket was written are
    /// rewritten into a new bucket, and the master learns their new place,
    /// before their old buckets are evicted. Best effort: on any failure they
    /// are simply evicted with their bucket.
    async fn keep_read_objects(
        &self,
        master: &mut MasterClient<MasterChannel>,
        who: &crate::Registration,
        victims: &[u64],
        budget: u64,
    ) {
        let keep = self.store.read_objects(victims, budget);
        if keep.is_empty() {
            return;
        }
        let store = self.store.clone();
        let slack = budget + (keep.len() as u64 + 1) * 4096;
        let credits: HashMap<String, u8> =
            keep.iter().map(|o| (o.key.clone(), o.credit - 1)).collect();
        let written = tokio::task::spawn_blocking(move || {
            let mut data = Vec::with_capacity(keep.len());
            let mut records = Vec::with_capacity(keep.len());
            for o in &keep {
                let bytes = store.read_piece(o.bucket_id, o.offset, o.length)?;
                if crc32c::crc32c(&bytes) == o.crc32c {
                    data.push((o.key.as_str(), bytes, o.crc32c));
                    // The copy moves with the master's record of it.
                    records.push(o.record.clone());
                }
            }
            let objs: Vec<(&str, &[u8], u32)> = data
                .iter()
                .map(|(k, v, c)| (*k, v.as_slice(), *c))
                .collect();
            store.write_bucket_with_slack(&objs, &records, slack)
        })
        .await
        .map_err(|e| Error::internal(e.to_string()))
        .and_then(|r| r);
        let rec = match written {
            Ok(rec) => rec,
            Err(e) => {
                tracing::debug!(error = %e, "could not keep read objects; evicting them");
                return;
            }
        };
        let left: Vec<(u64, u8)> = rec
            .objects
            .iter()
            .map(|e| (e.offset, credits.get(&e.key).copied().unwrap_or(0)))
            .collect();
        self.store.set_credit(rec.bucket_id, &left);
        let objects = rec
            .objects
            .iter()
            .map(|e| pb::SsdObject {
                key: e.key.clone(),
                bucket_id: rec.bucket_id,
                offset: e.offset,
                length: e.length,
                crc32c: e.crc32c,
                copy_record: e.record.clone(),
            })
            .collect();
        let kept = rec.objects.len() as u64;
        match master
            .report_inventory(pb::ReportInventoryRequest {
                owner_id: who.owner_id,
                epoch: who.epoch,
                objects,
                relocation: true,
                instance_proof: who.proof.clone(),
                more: false,
            })
            .await
        {
            Ok(_) => self.metrics.kept_objects.inc_by(kept),
            // The new copies stay unreferenced until their bucket goes.
            Err(e) => tracing::warn!(error = %Error::from(e), "could not report kept objects"),
        }
    }

    async fn delete_idle(&self, buckets: Vec<u64>) -> u64 {
        let mut freed = 0;
        for b in buckets {
            if self.store.readers(b) > 0 {
                continue;
            }
            let store = self.store.clone();
            match tokio::task::spawn_blocking(move || store.delete_bucket(b)).await {
                Ok(Ok(n)) => {
                    freed += n;
                    self.metrics.buckets.inc();
                    self.metrics.bytes.inc_by(n);
                    tracing::debug!(bucket = b, bytes = n, "bucket evicted");
                }
                Ok(Err(e)) => tracing::warn!(bucket = b, error = %e, "cannot delete bucket yet"),
                Err(e) => tracing::error!(bucket = b, error = %e, "bucket delete task failed"),
            }
        }
        freed
    }

    /// Forgets objects the master says were removed from Strata. False if
    /// the index could not record it (the master sends them again).
    pub async fn apply_drops(&self, drops: Vec<pb::SsdObject>) -> bool {
        if drops.is_empty() {
            return true;
        }
        let store = self.store.clone();
        let removed = tokio::task::spawn_blocking(move || {
            let items: Vec<(&str, u64, u64)> = drops
                .iter()
                .map(|d| (d.key.as_str(), d.bucket_id, d.offset))
                .collect();
            store.remove_objects(&items).map_err(|e| {
                tracing::warn!(error = %e, "cannot record removed SSD objects; the master sends them again");
            })
        })
        .await;
        match removed {
            Ok(Ok(n)) => {
                self.metrics.removed_objects.inc_by(n as u64);
                true
            }
            _ => false,
        }
    }
}
