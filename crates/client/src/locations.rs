//! The client's location cache: where an object's DRAM replicas are, kept
//! for less than the read lease the master gave with them.
//!
//! Why it is safe: the lookup's lease ends with the read that made it
//! (`lease_ends.rs`), so a cached location is a hint, not a promise: the
//! master may evict or remove the object meanwhile. Its range is then
//! freed, and the node refuses the old grant once it applied the free (or
//! the range was reused under a newer generation, or a new leader's key),
//! and any bytes that changed fail the object's checksum. Either way the
//! client forgets the entry and asks the master. Until the node applied
//! the free, a cached read may still get the removed object's bytes, as a
//! reader holding a lease could.
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
    /// Reads served and not reported yet, sharded like the entries; at
    /// most `per_shard` keys a shard (beyond, counts are dropped: they
    /// steer policies, they are not data).
    unreported: Vec<Mutex<HashMap<String, u32>>>,
    hits: AtomicU64,
    /// Per shard, when a key of it was last forgotten (nanoseconds after
    /// `base`): an answer to a lookup sent before that is not kept, since
    /// it may name what the forget meant to drop (a lookup racing an
    /// overwrite or a remove of this client's).
    forgot: Vec<AtomicU64>,
    base: Instant,
    /// Whether reads of a replica are refused once its range is freed
    /// (`Transport::refuses_revoked`): a one-sided read no node sees is,
    /// only where the node publishes its revocations. Answers with a replica
    /// that is not are not kept.
    refuses: Refuses,
}

/// See [`Locations::refuses`].
pub(crate) type Refuses = Arc<dyn Fn(&pb::Replica) -> bool + Send + Sync>;

struct Entry {
    info: Arc<pb::GetReplicasResponse>,
    until: Instant,
}

impl Locations {
    /// Holds up to `capacity` keys of answers whose replicas all pass
    /// `refuses`.
    pub(crate) fn new(capacity: usize, refuses: Refuses) -> Self {
        Locations {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::new(),
            per_shard: capacity.div_ceil(SHARDS).max(1),
            use_of_lease: 0.75,
            unreported: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hits: AtomicU64::new(0),
            forgot: (0..SHARDS).map(|_| AtomicU64::new(0)).collect(),
            base: Instant::now(),
            refuses,
        }
    }

    fn index(&self, key: &str) -> usize {
        (self.hasher.hash_one(key) % SHARDS as u64) as usize
    }

    fn shard(&self, key: &str) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.shard_at(self.index(key))
    }

    fn shard_at(&self, i: usize) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.shards[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The replicas of `key` if a lease still covers them.
    pub(crate) fn get(&self, key: &str) -> Option<Arc<pb::GetReplicasResponse>> {
        let now = Instant::now();
        let mut shard = self.shard(key);
        match shard.get(key) {
            Some(e) if e.until > now => Some(e.info.clone()),
            Some(_) => {
                shard.remove(key);
                None
            }
            None => None,
        }
    }

    /// A read of `key` was served through its cached location.
    pub(crate) fn hit(&self, key: &str) {
        self.hits.fetch_add(1, Ordering::Relaxed);
        self.count(key.to_string(), 1);
    }

    fn count(&self, key: String, n: u32) {
        let mut u = self.unreported[self.index(&key)]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let len = u.len();
        match u.get_mut(&key) {
            Some(c) => *c = c.saturating_add(n),
            None if len < self.per_shard => {
                u.insert(key, n);
            }
            None => {}
        }
    }

    /// Remembers an answer to a lookup sent at `asked`. Only objects read
    /// from DRAM replicas are kept: SSD reads go through the master, which
    /// decides on promotion.
    pub(crate) fn insert(&self, key: &str, info: &Arc<pb::GetReplicasResponse>, asked: Instant) {
        let memory = pb::ReplicaKind::Memory as i32;
        if info.lease_ms == 0
            || info.replicas.is_empty()
            || info.replicas.iter().any(|r| r.kind != memory)
            || !info.replicas.iter().all(|r| (self.refuses)(r))
        {
            return;
        }
        // The master's number, bounded: a lease beyond the cap (a broken or
        // hostile master) is cached for the cap only, which is always safe.
        let lease = Duration::from_millis(info.lease_ms).min(MAX_CACHED_LEASE);
        let until = asked + lease.mul_f64(self.use_of_lease);
        let now = Instant::now();
        if until <= now {
            return;
        }
        let i = self.index(key);
        let mut shard = self.shard_at(i);
        // Checked under the shard's lock, which `forget` takes first.
        let forgot = self.forgot[i].load(Ordering::Acquire);
        if forgot > 0 && forgot >= self.since_base(asked) {
            return;
        }
        if shard.len() >= self.per_shard && !shard.contains_key(key) {
            shard.retain(|_, e| e.until > now);
            if shard.len() >= self.per_shard {
                return; // full of live entries: this one goes uncached
            }
        }
        shard.insert(
            key.to_string(),
            Entry {
                info: info.clone(),
                until,
            },
        );
    }

    /// Forgets `key` (its replicas failed, or it is being removed or
    /// replaced), and any answer to a lookup sent before now.
    pub(crate) fn forget(&self, key: &str) {
        let i = self.index(key);
        let mut shard = self.shard_at(i);
        let now = self.since_base(Instant::now()).max(1);
        self.forgot[i].fetch_max(now, Ordering::AcqRel);
        shard.remove(key);
    }

    fn since_base(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.base).as_nanos() as u64
    }

    /// Reads it has served.
    pub(crate) fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// Forgets every key.
    pub(crate) fn clear(&self) {
        let now = self.since_base(Instant::now()).max(1);
        for (s, f) in self.shards.iter().zip(&self.forgot) {
            let mut s = s.lock().unwrap_or_else(PoisonError::into_inner);
            f.fetch_max(now, Ordering::AcqRel);
            s.clear();
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
        let mut out = Vec::new();
        for u in &self.unreported {
            let taken = std::mem::take(&mut *u.lock().unwrap_or_else(PoisonError::into_inner));
            out.extend(
                taken
                    .into_iter()
                    .map(|(key, count)| pb::KeyReads { key, count }),
            );
        }
        out
    }

    /// Counts a report could not deliver, for the next one.
    fn unreport(&self, reads: Vec<pb::KeyReads>) {
        for r in reads {
            self.count(r.key, r.count);
        }
    }
}

/// Reports cached reads to the master every `every`, until the cache is
/// dropped (the last clone of its client). Counts a report could not
/// deliver wait for the next one (bounded like all unreported counts); what
/// is left when the client drops is lost: the counts steer policies, they
/// are not data.
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
            let Some(reads) = cache.upgrade().map(|c| c.take_unreported()) else {
                return;
            };
            for chunk in reads.chunks(REPORT_CHUNK) {
                let req = pb::ReportReadsRequest {
                    reads: chunk.to_vec(),
                    ended: Vec::new(),
                };
                let mut m = master.clone();
                let sent =
                    tokio::time::timeout(every.max(Duration::from_secs(1)), m.report_reads(req));
                let delivered = match sent.await {
                    Ok(Ok(_)) => true,
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "reporting cached reads failed; next time");
                        false
                    }
                    Err(_) => {
                        tracing::debug!("reporting cached reads timed out; next time");
                        false
                    }
                };
                if !delivered {
                    if let Some(c) = cache.upgrade() {
                        c.unreport(chunk.to_vec());
                    }
                }
            }
        }
    });
}

/// The longest lease a location is cached for, whatever a master says.
pub(crate) const MAX_CACHED_LEASE: Duration = Duration::from_secs(3600);

#[cfg(test)]
mod tests {
    use super::*;

    /// A lease from the master is believed up to a cap: a master saying
    /// "forever" gets a location cached for at most an hour.
    #[test]
    fn a_masters_lease_is_believed_up_to_a_cap() {
        let c = Locations::new(100, every());
        let asked = Instant::now();
        c.insert("k", &answer(u64::MAX, DRAM), asked);
        let until = c.shard("k").get("k").map(|e| e.until).expect("cached");
        assert!(until <= asked + MAX_CACHED_LEASE, "{:?}", until - asked);
        assert!(until > asked + MAX_CACHED_LEASE / 2, "{:?}", until - asked);
    }

    fn answer(lease_ms: u64, kinds: &[pb::ReplicaKind]) -> Arc<pb::GetReplicasResponse> {
        Arc::new(pb::GetReplicasResponse {
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
            blake3: Vec::new(),
        })
    }

    const DRAM: &[pb::ReplicaKind] = &[pb::ReplicaKind::Memory];

    /// Every replica's reads are refused once revoked (a TCP client).
    fn every() -> Refuses {
        Arc::new(|_: &pb::Replica| true)
    }

    #[test]
    fn an_entry_lives_inside_its_lease_and_counts_its_reads() {
        let c = Locations::new(100, every());
        let asked = Instant::now();
        c.insert("k", &answer(60_000, DRAM), asked);
        assert_eq!(c.get("k").unwrap().crc32c, 7);
        assert!(c.take_unreported().is_empty(), "a lookup is not a read");
        c.hit("k");
        c.hit("k");
        let r = c.take_unreported();
        assert_eq!((r.len(), r[0].key.as_str(), r[0].count), (1, "k", 2));
        assert!(c.take_unreported().is_empty(), "reported once");
        // A report that failed is kept for the next one.
        c.unreport(r);
        c.hit("k");
        assert_eq!(c.take_unreported()[0].count, 3);
        assert_eq!(c.hits(), 3);
        c.forget("k");
        assert!(c.get("k").is_none());
    }

    /// An answer to a lookup sent before the key was forgotten (an
    /// overwrite or remove of this client's raced it) is not kept: the
    /// next read asks the master, so a client reads its own write.
    #[test]
    fn an_answer_older_than_a_forget_is_not_kept() {
        let c = Locations::new(100, every());
        let asked = Instant::now();
        c.forget("k");
        c.insert("k", &answer(60_000, DRAM), asked);
        assert!(c.get("k").is_none(), "asked before the forget");
        c.insert("k", &answer(60_000, DRAM), Instant::now());
        assert!(c.get("k").is_some(), "asked after it");
        let asked = Instant::now();
        c.clear();
        c.insert("k", &answer(60_000, DRAM), asked);
        assert!(c.get("k").is_none(), "nor before a clear");
    }

    #[test]
    fn unreported_counts_are_bounded() {
        let c = Locations::new(SHARDS, every()); // one key per shard
        for i in 0..1000 {
            c.hit(&format!("k{i}"));
        }
        let r = c.take_unreported();
        assert!(!r.is_empty() && r.len() <= SHARDS, "{}", r.len());
    }

    #[test]
    fn a_lease_measured_from_the_request_ends_early_enough() {
        let c = Locations::new(100, every());
        // Asked 3.2 s ago with a 4 s lease: its usable 3 s are gone.
        let asked = Instant::now() - Duration::from_millis(3200);
        c.insert("old", &answer(4000, DRAM), asked);
        assert!(c.get("old").is_none());
        // Asked 2.6 s ago: 400 ms of the usable part are left...
        let asked = Instant::now() - Duration::from_millis(2600);
        c.insert("young", &answer(4000, DRAM), asked);
        assert!(c.get("young").is_some());
        // ...and then they are not.
        std::thread::sleep(Duration::from_millis(450));
        assert!(c.get("young").is_none(), "expired entries are not served");
    }

    #[test]
    fn only_leased_dram_answers_are_kept() {
        let c = Locations::new(100, every());
        let now = Instant::now();
        c.insert("none", &answer(0, DRAM), now);
        c.insert("ssd", &answer(60_000, &[pb::ReplicaKind::Ssd]), now);
        c.insert(
            "mixed",
            &answer(60_000, &[pb::ReplicaKind::Memory, pb::ReplicaKind::Ssd]),
            now,
        );
        c.insert("empty", &answer(60_000, &[]), now);
        assert_eq!(c.len(), 0);
        c.insert("dram", &answer(60_000, DRAM), now);
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn a_location_is_kept_only_where_a_revoked_read_is_refused() {
        let mut a = answer(60_000, DRAM);
        Arc::make_mut(&mut a).replicas[0].ucx_route = 42;
        let mut b = answer(60_000, &[pb::ReplicaKind::Memory; 2]);
        Arc::make_mut(&mut b).replicas[1].ucx_route = 42;
        let now = Instant::now();
        // As a one-sided transport without published revocations says.
        let ucx = Locations::new(100, Arc::new(|r: &pb::Replica| r.ucx_route == 0));
        ucx.insert("k", &a, now);
        ucx.insert("one-of-two", &b, now);
        assert_eq!(ucx.len(), 0, "no node would refuse a revoked one");
        ucx.insert("tcp-node", &answer(60_000, DRAM), now);
        assert_eq!(ucx.len(), 1, "a TCP-only node's replicas are fenced");
        let tcp = Locations::new(100, every());
        tcp.insert("k", &a, now);
        assert_eq!(tcp.len(), 1, "a TCP client reads it through the node");
    }

    #[test]
    fn capacity_is_a_bound() {
        let c = Locations::new(SHARDS, every()); // one key per shard
        let now = Instant::now();
        for i in 0..1000 {
            c.insert(&format!("k{i}"), &answer(60_000, DRAM), now);
        }
        assert_eq!(c.len(), SHARDS);
        // Expired entries make room.
        let c = Locations::new(SHARDS, every());
        let old = Instant::now() - Duration::from_millis(2600);
        for i in 0..1000 {
            c.insert(&format!("k{i}"), &answer(4000, DRAM), old);
        }
        assert_eq!(c.len(), SHARDS);
        std::thread::sleep(Duration::from_millis(450));
        let now = Instant::now();
        for i in 0..1000 {
            c.insert(&format!("n{i}"), &answer(60_000, DRAM), now);
        }
        assert_eq!(c.len(), SHARDS);
        assert!((0..1000).filter_map(|i| c.get(&format!("n{i}"))).count() == SHARDS);
    }
}
