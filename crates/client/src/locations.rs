//! The client's location cache: where an object's DRAM replicas are, kept
//! for less than the read lease the master gave with them.
//!
//! Why it is safe: while a lease lasts the master neither evicts the object
//! nor lets an unforced remove take it, so the replicas stay where they were.
//! The master revokes early only by freeing the range (a forced remove, a
//! new leader): the node then refuses the old grant (generation fences, or
//! the new term's key), and any bytes that changed fail the object's
//! checksum. Either way the client forgets the entry and asks the master.
//! The lease is measured on the master's clock (`lease_ms`, time left when
//! it answered), from the moment the client *sent* its request, so no clock
//! needs to agree with another.
//!
//! Reads served from the cache are counted and reported (`ReportReads`) so
//! read-count admission and LRU age still see them.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};
use strata_proto as pb;

const SHARDS: usize = 16;
/// Keys per `ReportReads` request (well under the master's batch limit).
const REPORT_CHUNK: usize = 1024;

/// The cache. Sharded by key so concurrent readers rarely meet on a lock;
/// no lock is held across an await.
pub(crate) struct Locations {
    shards: Vec<Mutex<HashMap<String, Entry>>>,
    hasher: RandomState,
    per_shard: usize,
    /// Of the lease: the share the cache uses (the rest covers the trip to
    /// the node and clock rate differences).
    use_of_lease: f64,
    unreported: Mutex<HashMap<String, u32>>,
    hits: AtomicU64,
}

struct Entry {
    info: Arc<pb::GetReplicasResponse>,
    until: Instant,
}

impl Locations {
    /// Holds up to `capacity` keys.
    pub(crate) fn new(capacity: usize) -> Self {
        Locations {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::new(),
            per_shard: capacity.div_ceil(SHARDS).max(1),
            use_of_lease: 0.75,
            unreported: Mutex::default(),
            hits: AtomicU64::new(0),
        }
    }

    fn shard(&self, key: &str) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        let i = (self.hasher.hash_one(key) % SHARDS as u64) as usize;
        self.shards[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The replicas of `key` if a lease still covers them; counts the read.
    pub(crate) fn get(&self, key: &str) -> Option<Arc<pb::GetReplicasResponse>> {
        let now = Instant::now();
        let info = {
            let mut shard = self.shard(key);
            match shard.get(key) {
                Some(e) if e.until > now => e.info.clone(),
                Some(_) => {
                    shard.remove(key);
                    return None;
                }
                None => return None,
            }
        };
        self.hits.fetch_add(1, Ordering::Relaxed);
        *self
            .unreported
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(key.to_string())
            .or_default() += 1;
        Some(info)
    }

    /// Remembers an answer to a lookup sent at `asked`. Only objects read
    /// from DRAM replicas are kept: SSD reads go through the master, which
    /// decides on promotion.
    pub(crate) fn insert(&self, key: &str, info: &pb::GetReplicasResponse, asked: Instant) {
        let memory = pb::ReplicaKind::Memory as i32;
        if info.lease_ms == 0
            || info.replicas.is_empty()
            || info.replicas.iter().any(|r| r.kind != memory)
        {
            return;
        }
        let until = asked + Duration::from_millis(info.lease_ms).mul_f64(self.use_of_lease);
        let now = Instant::now();
        if until <= now {
            return;
        }
        let mut shard = self.shard(key);
        if shard.len() >= self.per_shard && !shard.contains_key(key) {
            shard.retain(|_, e| e.until > now);
            if shard.len() >= self.per_shard {
                return; // full of live entries: this one goes uncached
            }
        }
        shard.insert(
            key.to_string(),
            Entry {
                info: Arc::new(info.clone()),
                until,
            },
        );
    }

    /// Forgets `key` (its replicas failed, or it is being removed).
    pub(crate) fn forget(&self, key: &str) {
        self.shard(key).remove(key);
    }

    /// Reads it has served.
    pub(crate) fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// Forgets every key.
    pub(crate) fn clear(&self) {
        for s in &self.shards {
            s.lock().unwrap_or_else(PoisonError::into_inner).clear();
        }
    }

    /// Keys cached right now (expired ones included until touched).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).len())
            .sum()
    }

    fn take_unreported(&self) -> Vec<pb::KeyReads> {
        std::mem::take(
            &mut *self
                .unreported
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        )
        .into_iter()
        .map(|(key, count)| pb::KeyReads { key, count })
        .collect()
    }
}

/// Reports cached reads to the master every `every`, until the cache is
/// dropped (the last clone of its client). A report that fails is dropped:
/// the counts steer policies, they are not data.
pub(crate) fn spawn_reporter(
    cache: Weak<Locations>,
    master: strata_proto::master_client::MasterClient<strata_common::grpc::MasterChannel>,
    every: Duration,
) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            let Some(cache) = cache.upgrade() else {
                return;
            };
            let reads = cache.take_unreported();
            drop(cache);
            for chunk in reads.chunks(REPORT_CHUNK) {
                let req = pb::ReportReadsRequest {
                    reads: chunk.to_vec(),
                };
                let mut m = master.clone();
                let sent =
                    tokio::time::timeout(every.max(Duration::from_secs(1)), m.report_reads(req));
                match sent.await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => tracing::debug!(error = %e, "reporting cached reads failed"),
                    Err(_) => tracing::debug!("reporting cached reads timed out"),
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(lease_ms: u64, kinds: &[pb::ReplicaKind]) -> pb::GetReplicasResponse {
        pb::GetReplicasResponse {
            size: 1,
            crc32c: 7,
            replicas: kinds
                .iter()
                .map(|k| pb::Replica {
                    kind: *k as i32,
                    ..Default::default()
                })
                .collect(),
            lease_until_unix_ms: 0,
            lease_ms,
        }
    }

    #[test]
    fn an_entry_lives_inside_its_lease_and_counts_its_reads() {
        let c = Locations::new(100);
        let asked = Instant::now();
        c.insert("k", &answer(60_000, &[pb::ReplicaKind::Memory]), asked);
        assert_eq!(c.get("k").unwrap().crc32c, 7);
        assert_eq!(c.get("k").unwrap().crc32c, 7);
        let r = c.take_unreported();
        assert_eq!((r.len(), r[0].key.as_str(), r[0].count), (1, "k", 2));
        assert!(c.take_unreported().is_empty(), "reported once");
        c.forget("k");
        assert!(c.get("k").is_none());
    }

    #[test]
    fn a_lease_measured_from_the_request_ends_early_enough() {
        let c = Locations::new(100);
        // Asked 800 ms ago with a 1 s lease: 0.75 of it is already gone.
        let asked = Instant::now() - Duration::from_millis(800);
        c.insert("old", &answer(1000, &[pb::ReplicaKind::Memory]), asked);
        assert!(c.get("old").is_none());
        // Asked 700 ms ago: 50 ms of the usable part are left.
        let asked = Instant::now() - Duration::from_millis(700);
        c.insert("young", &answer(1000, &[pb::ReplicaKind::Memory]), asked);
        assert!(c.get("young").is_some());
        std::thread::sleep(Duration::from_millis(60));
        assert!(c.get("young").is_none(), "expired entries are not served");
    }

    #[test]
    fn only_leased_dram_answers_are_kept() {
        let c = Locations::new(100);
        let now = Instant::now();
        c.insert("none", &answer(0, &[pb::ReplicaKind::Memory]), now);
        c.insert("ssd", &answer(60_000, &[pb::ReplicaKind::Ssd]), now);
        c.insert(
            "mixed",
            &answer(60_000, &[pb::ReplicaKind::Memory, pb::ReplicaKind::Ssd]),
            now,
        );
        c.insert("empty", &answer(60_000, &[]), now);
        assert_eq!(c.len(), 0);
        c.insert("dram", &answer(60_000, &[pb::ReplicaKind::Memory]), now);
        assert_eq!(c.len(), 1);
        assert!(c.take_unreported().is_empty(), "inserts are not reads");
    }

    #[test]
    fn capacity_is_a_bound() {
        let c = Locations::new(SHARDS); // one key per shard
        let now = Instant::now();
        for i in 0..1000 {
            c.insert(
                &format!("k{i}"),
                &answer(60_000, &[pb::ReplicaKind::Memory]),
                now,
            );
        }
        assert_eq!(c.len(), SHARDS);
        // Expired entries make room.
        let c = Locations::new(SHARDS);
        let old = Instant::now() - Duration::from_millis(700);
        for i in 0..1000 {
            c.insert(
                &format!("k{i}"),
                &answer(1000, &[pb::ReplicaKind::Memory]),
                old,
            );
        }
        assert_eq!(c.len(), SHARDS);
        std::thread::sleep(Duration::from_millis(60));
        let now = Instant::now();
        for i in 0..1000 {
            c.insert(
                &format!("n{i}"),
                &answer(60_000, &[pb::ReplicaKind::Memory]),
                now,
            );
        }
        assert_eq!(c.len(), SHARDS);
        assert!((0..1000).filter_map(|i| c.get(&format!("n{i}"))).count() == SHARDS);
    }
}
