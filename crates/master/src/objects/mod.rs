//! The object table: key → object metadata, sharded so one hot key never
//! serialises the rest.

use crate::cluster::Replica;
use crate::lock_order::{Guard, Lock, OrderedMutex};
use crate::sync::Unsynced;
use parking_lot::MutexGuard;
use std::hash::BuildHasher;
use std::time::Instant;
use strata_common::{Error, Result};

mod retired;
mod shard;
mod views;
pub use retired::Retired;
pub use shard::Shard;

const SHARDS: usize = 64;

/// A copy of an object's bytes in an SSD owner's bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SsdReplica {
    pub owner_id: u64,
    pub bucket_id: u64,
    pub offset: u64,
    pub length: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjState {
    /// PutStart granted space; bytes are being written until `deadline`.
    Processing { put_id: u64, deadline: Instant },
    /// PutEnd made the object visible.
    Complete,
}

/// Where an object's only copy is, when it has exactly one (most objects):
/// kept inline, with no allocation.
enum Home {
    None,
    Dram(Replica),
    Ssd(SsdReplica),
}

/// What few objects need: several copies, or a put in progress.
#[derive(Default)]
struct Spill {
    replicas: Vec<Replica>,
    ssd: Vec<SsdReplica>,
    pending: Option<(u64, Instant)>,
    /// A bound put (`PutStartRequest.bind`): the generation its first
    /// replica was given at PutStart, which its token signs.
    bound: Option<u64>,
    /// What the nodes were told at PutStart (`Object::set_announced`).
    announced: Option<Announced>,
    /// The writer's BLAKE3 digest (`--integrity blake3`): kept here, not
    /// inline, so objects without one stay small.
    digest: Option<[u8; 32]>,
    /// While written: the attempt its client named (`PutStartRequest.
    /// attempt`; 0: none), so a repeated PutStart gets this put back, and
    /// how many copies it was given (fewer now: one was lost with its node).
    attempt: u64,
    placed: usize,
}

/// A put announced to its nodes at PutStart (its client declared the
/// checksum): the nodes keep it as pending and report it to a rebuilding
/// master if their bytes match, so PutEnd need only wait for these entries.
pub struct Announced {
    pub crc32c: u32,
    /// (segment id, the node's log sequence number of the pending entry).
    pub seqs: Vec<(u64, u64)>,
}

/// One object's metadata. The master holds one per cached object, so its
/// size is watched (`object_stays_small`): copies are reached through
/// methods because a lone copy is stored inline and several in `spill`.
pub struct Object {
    pub size: u64,
    pub lease_until_ms: u64,
    pub last_access_ms: u64,
    home: Home,
    spill: Option<Box<Spill>>,
    pub crc32c: u32,
    /// Offload tasks copying a DRAM replica right now: no eviction or free.
    pub pins: u16,
    /// Readers holding the lease that have not said they are done
    /// (`end_lease`): the lease ends with the last of them, or at
    /// `lease_until_ms` for readers that died. Saturated, it counts no
    /// more and the lease runs its time.
    readers: u16,
    /// Demand reads served while the object was in DRAM (`reads:N`),
    /// saturating.
    pub reads: u16,
    /// When the lease running now began, in unix seconds (0: the next one
    /// starts afresh): a lease is held without a break for at most
    /// `--max-lease` (`Object::lease`).
    lease_since_s: u32,
    /// `SOFT_PIN` … `ADOPTED`, packed so the object stays small.
    flags: u8,
}

/// Evicted only after every object without it.
const SOFT_PIN: u8 = 1;
/// Never evicted (still removable).
const HARD_PIN: u8 = 1 << 1;
/// Eviction queued it for offload (`on-evict`): its DRAM is freed once the
/// SSD copy exists, or the object is dropped if the copy fails.
const OFFLOAD_THEN_FREE: u8 = 1 << 2;
/// An offload task was handed out for it (or it came from an SSD
/// inventory): an SSD copy may exist, so its removal is tombstoned.
const OFFLOADED: u8 = 1 << 3;
/// Its copy to SSD failed for good: eviction drops it rather than making
/// writers wait for a copy that will not come.
const OFFLOAD_FAILED: u8 = 1 << 4;
/// Adopted from a store node's report by a rebuild, and not committed by
/// this term since: a newer version reported by another node may replace
/// it (one this term committed, never).
const ADOPTED: u8 = 1 << 5;

/// A getter and a setter per flag of `Object::flags`.
macro_rules! flags {
    ($($get:ident, $set:ident, $bit:ident;)*) => {
        impl Object {
            $(
                pub fn $get(&self) -> bool {
                    self.flags & $bit != 0
                }
                pub fn $set(&mut self, on: bool) {
                    if on {
                        self.flags |= $bit;
                    } else {
                        self.flags &= !$bit;
                    }
                }
            )*
        }
    };
}

flags! {
    soft_pin, set_soft_pin, SOFT_PIN;
    hard_pin, set_hard_pin, HARD_PIN;
    offload_then_free, set_offload_then_free, OFFLOAD_THEN_FREE;
    offloaded, set_offloaded, OFFLOADED;
    offload_failed, set_offload_failed, OFFLOAD_FAILED;
    adopted, set_adopted, ADOPTED;
}

impl Object {
    fn new(size: u64, crc32c: u32, now_ms: u64) -> Object {
        Object {
            size,
            lease_until_ms: 0,
            last_access_ms: now_ms,
            home: Home::None,
            spill: None,
            crc32c,
            pins: 0,
            readers: 0,
            reads: 0,
            lease_since_s: 0,
            flags: 0,
        }
    }

    /// An object being written: its space is granted, its bytes are not in.
    pub fn processing(
        size: u64,
        replicas: Vec<Replica>,
        put_id: u64,
        deadline: Instant,
        now_ms: u64,
    ) -> Object {
        let mut o = Object::new(size, 0, now_ms);
        o.place(replicas, Vec::new());
        o.spill.get_or_insert_with(Default::default).pending = Some((put_id, deadline));
        o
    }

    /// A committed object known only from an SSD owner's inventory.
    pub fn ssd_only(size: u64, crc32c: u32, r: SsdReplica) -> Object {
        let mut o = Object::committed(size, crc32c, Vec::new(), vec![r]);
        o.set_offloaded(true);
        o
    }

    /// A committed object rebuilt from what members hold (no pin, lease or
    /// history).
    pub fn committed(
        size: u64,
        crc32c: u32,
        replicas: Vec<Replica>,
        ssd: Vec<SsdReplica>,
    ) -> Object {
        let mut o = Object::new(size, crc32c, strata_common::time::unix_ms());
        o.place(replicas, ssd);
        o
    }

    pub fn state(&self) -> ObjState {
        match self.spill.as_ref().and_then(|s| s.pending) {
            Some((put_id, deadline)) => ObjState::Processing { put_id, deadline },
            None => ObjState::Complete,
        }
    }

    pub fn is_complete(&self) -> bool {
        self.spill.as_ref().is_none_or(|s| s.pending.is_none())
    }

    /// PutStart told the nodes of this put (before any PutEnd).
    pub fn set_announced(&mut self, a: Announced) {
        if let Some(s) = self.spill.as_mut() {
            s.announced = Some(a);
        }
    }

    /// Binds the put being written to its starter (`PutStartRequest.bind`):
    /// its end or revoke must bring the token of its first replica's
    /// generation.
    pub fn bind(&mut self) {
        let g = self.replicas().first().map(|r| r.generation);
        if let Some(s) = self.spill.as_mut() {
            s.bound = g;
        }
    }

    /// Names the client's attempt that started this put (0: none).
    pub fn set_attempt(&mut self, attempt: u64) {
        if attempt != 0 {
            let placed = self.replicas().len();
            let s = self.spill.get_or_insert_with(Default::default);
            s.attempt = attempt;
            s.placed = placed;
        }
    }

    /// Whether a put being written lost a copy since it started (with its
    /// node).
    pub fn lost_a_copy(&self) -> bool {
        self.spill
            .as_ref()
            .is_some_and(|s| s.attempt != 0 && self.replicas().len() < s.placed)
    }

    /// Whether it is a put still being written that `attempt` started.
    pub fn started_by(&self, attempt: u64) -> bool {
        attempt != 0
            && self
                .spill
                .as_ref()
                .is_some_and(|s| s.pending.is_some() && s.attempt == attempt)
    }

    /// While a bound put is written: the generation its token signs.
    pub fn bound_generation(&self) -> Option<u64> {
        self.spill
            .as_ref()
            .filter(|s| s.pending.is_some())
            .and_then(|s| s.bound)
    }

    /// Records the writer's BLAKE3 digest, which readers verify.
    pub fn set_digest(&mut self, d: [u8; 32]) {
        self.spill.get_or_insert_with(Default::default).digest = Some(d);
    }

    /// The writer's BLAKE3 digest, if it sent one.
    pub fn digest(&self) -> Option<[u8; 32]> {
        self.spill.as_ref().and_then(|s| s.digest)
    }

    pub fn announced(&self) -> Option<&Announced> {
        self.spill.as_ref().and_then(|s| s.announced.as_ref())
    }

    /// What PutStart told the nodes, taken (PutEnd).
    pub fn take_announced(&mut self) -> Option<Announced> {
        self.spill.as_mut().and_then(|s| s.announced.take())
    }

    /// PutEnd: the object becomes visible.
    pub fn complete(&mut self) {
        if let Some(s) = self.spill.as_mut() {
            s.pending = None;
            s.announced = None;
        }
        self.tidy();
    }

    /// DRAM replicas.
    pub fn replicas(&self) -> &[Replica] {
        match (&self.home, &self.spill) {
            (Home::Dram(r), _) => std::slice::from_ref(r),
            (_, Some(s)) => &s.replicas,
            _ => &[],
        }
    }

    /// SSD copies.
    pub fn ssd(&self) -> &[SsdReplica] {
        match (&self.home, &self.spill) {
            (Home::Ssd(r), _) => std::slice::from_ref(r),
            (_, Some(s)) => &s.ssd,
            _ => &[],
        }
    }

    pub fn ssd_mut(&mut self) -> &mut [SsdReplica] {
        match (&mut self.home, &mut self.spill) {
            (Home::Ssd(r), _) => std::slice::from_mut(r),
            (_, Some(s)) => &mut s.ssd,
            _ => &mut [],
        }
    }

    /// Moves every copy out (the object keeps none until `place`).
    fn locations(&mut self) -> (Vec<Replica>, Vec<SsdReplica>) {
        let (mut replicas, mut ssd) = match self.spill.as_mut() {
            Some(s) => (std::mem::take(&mut s.replicas), std::mem::take(&mut s.ssd)),
            None => (Vec::new(), Vec::new()),
        };
        match std::mem::replace(&mut self.home, Home::None) {
            Home::None => {}
            Home::Dram(r) => replicas.insert(0, r),
            Home::Ssd(r) => ssd.insert(0, r),
        }
        (replicas, ssd)
    }

    /// Stores copies taken out by `locations`: a lone one inline, several
    /// in the spill.
    fn place(&mut self, mut replicas: Vec<Replica>, mut ssd: Vec<SsdReplica>) {
        match (replicas.len(), ssd.len()) {
            (0, 0) => {}
            (1, 0) => self.home = replicas.pop().map_or(Home::None, Home::Dram),
            (0, 1) => self.home = ssd.pop().map_or(Home::None, Home::Ssd),
            _ => {
                let s = self.spill.get_or_insert_with(Default::default);
                s.replicas = replicas;
                s.ssd = ssd;
            }
        }
        self.tidy();
    }

    fn tidy(&mut self) {
        if self.spill.as_ref().is_some_and(|s| {
            s.replicas.is_empty() && s.ssd.is_empty() && s.pending.is_none() && s.digest.is_none()
        }) {
            self.spill = None;
        }
    }

    pub fn push_replica(&mut self, r: Replica) {
        let (mut replicas, ssd) = self.locations();
        replicas.push(r);
        self.place(replicas, ssd);
    }

    pub fn push_ssd(&mut self, r: SsdReplica) {
        let (replicas, mut ssd) = self.locations();
        ssd.push(r);
        self.place(replicas, ssd);
    }

    /// Keeps the DRAM replicas `keep` returns true for; returns how many
    /// went.
    pub fn retain_replicas(&mut self, mut keep: impl FnMut(&Replica) -> bool) -> usize {
        // Most objects: no spill, at most one copy inline (table-wide scans
        // run this for every object, so no allocation here).
        if self.spill.is_none() {
            return match &self.home {
                Home::Dram(r) if !keep(r) => {
                    self.home = Home::None;
                    1
                }
                _ => 0,
            };
        }
        let (mut replicas, ssd) = self.locations();
        let before = replicas.len();
        replicas.retain(keep);
        let gone = before - replicas.len();
        self.place(replicas, ssd);
        gone
    }

    /// Keeps the SSD copies `keep` returns true for; returns how many went.
    pub fn retain_ssd(&mut self, mut keep: impl FnMut(&SsdReplica) -> bool) -> usize {
        if self.spill.is_none() {
            return match &self.home {
                Home::Ssd(r) if !keep(r) => {
                    self.home = Home::None;
                    1
                }
                _ => 0,
            };
        }
        let (replicas, mut ssd) = self.locations();
        let before = ssd.len();
        ssd.retain(keep);
        let gone = before - ssd.len();
        self.place(replicas, ssd);
        gone
    }

    /// Replaces the DRAM replicas.
    pub fn set_replicas(&mut self, new: Vec<Replica>) -> Vec<Replica> {
        let (old, ssd) = self.locations();
        self.place(new, ssd);
        old
    }

    /// Moves the DRAM replicas out (to be released), keeping the object.
    pub fn take_memory(&mut self) -> Object {
        self.set_offload_then_free(false);
        let mut gone = Object::new(self.size, self.crc32c, 0);
        let replicas = self.set_replicas(Vec::new());
        gone.place(replicas, Vec::new());
        gone
    }

    /// Whether it is the version whose replica grants include `generation`
    /// (unique per allocation: how an overwrite names its version).
    pub fn is_version(&self, generation: u64) -> bool {
        self.replicas().iter().any(|r| r.generation == generation)
    }

    pub fn leased(&self, now_ms: u64) -> bool {
        self.lease_until_ms > now_ms
    }

    /// Leases it to one more reader for `ttl_ms`. A lease held without a
    /// break (no moment with every reader done, no TTL-long gap between
    /// lookups) ends `max_ms` after it began, whatever lookups come: a
    /// client that keeps looking objects up without ending its leases
    /// cannot keep them, and the DRAM under them, from eviction and
    /// removal. Returns whether the reader holds the lease (and counts).
    pub fn lease(&mut self, now_ms: u64, ttl_ms: u64, max_ms: u64) -> bool {
        if !self.leased(now_ms) {
            self.readers = 0; // those readers' leases ran out
                              // Afresh when every reader said it was done, or nobody looked
                              // it up for a TTL (`last_access_ms` is the last lookup's: the
                              // caller sets it after this).
                              // A capped lease gets no readers' ends to reset it: a TTL past
                              // its cap it starts afresh too, so a hot object is unleased
                              // for one TTL per `max_ms`, not for good.
            let cap = (u64::from(self.lease_since_s) * 1000).saturating_add(max_ms);
            if self.lease_since_s == 0
                || now_ms >= self.last_access_ms.saturating_add(ttl_ms)
                || now_ms >= cap.saturating_add(ttl_ms)
            {
                // Whole seconds, rounded up: the cap comes late, never
                // early (a lease shorter than asked for).
                self.lease_since_s = u32::try_from(now_ms.div_ceil(1000)).unwrap_or(u32::MAX);
            }
        }
        let cap = (u64::from(self.lease_since_s) * 1000).saturating_add(max_ms);
        let until = now_ms.saturating_add(ttl_ms).min(cap);
        self.lease_until_ms = self.lease_until_ms.max(until);
        if !self.leased(now_ms) {
            return false;
        }
        self.readers = self.readers.saturating_add(1);
        true
    }

    /// One reader is done: the lease ends at `now_ms` with the last one
    /// (and the next lease starts afresh). False when no lease of its was
    /// running (it ended already, by its TTL or with its readers, or the
    /// count saturated).
    pub fn end_lease(&mut self, now_ms: u64) -> bool {
        if !self.leased(now_ms) || self.readers == 0 || self.readers == u16::MAX {
            return false;
        }
        self.readers -= 1;
        if self.readers == 0 {
            self.lease_until_ms = now_ms;
            self.lease_since_s = 0;
        }
        true
    }

    /// Readers of a running lease that have not said they are done.
    pub fn readers(&self, now_ms: u64) -> u16 {
        if self.leased(now_ms) {
            self.readers
        } else {
            0
        }
    }
    /// Eviction may take its DRAM: committed, unleased, not hard-pinned,
    /// not being offloaded, and holding DRAM at all.
    pub fn evictable(&self, now_ms: u64) -> bool {
        self.is_complete()
            && !self.leased(now_ms)
            && !self.hard_pin()
            && self.pins == 0
            && !self.replicas().is_empty()
    }

    /// Frees every replica's space, telling nodes about the ranges they know
    /// of (committed objects, announced puts).
    pub fn release(self) -> u64 {
        self.release_unsynced().0
    }

    /// `release`, also returning the nodes' log entries for the frees (a
    /// removal waits for them: `commit_sync.rs`).
    pub fn release_unsynced(mut self) -> (u64, Unsynced) {
        // Nodes know of committed objects and of announced puts.
        let known_to_nodes = self.is_complete() || self.announced().is_some();
        let (mut freed, mut unsynced) = (0, Unsynced::default());
        for r in self.locations().0 {
            // Logged before the range goes back to the allocator: a new
            // allocation of it logs its own entries after this free, so the
            // node never applies an old free after a newer announcement.
            if known_to_nodes {
                let seq = r
                    .seg
                    .node
                    .log_free(r.seg.id, r.offset, r.alloc_len, r.generation);
                unsynced.push(r.seg.node.acks.clone(), seq);
            }
            r.seg.free(r.offset, r.alloc_len);
            freed += r.alloc_len;
        }
        (freed, unsynced)
    }
}

/// A locked shard.
pub type ShardGuard<'a> = Guard<MutexGuard<'a, Shard>>;

pub struct ObjectTable {
    shards: Box<[OrderedMutex<Shard>]>,
    hasher: std::collections::hash_map::RandomState,
}

impl Default for ObjectTable {
    fn default() -> Self {
        ObjectTable {
            shards: (0..SHARDS)
                .map(|_| OrderedMutex::new(Lock::Shard, Shard::default()))
                .collect(),
            hasher: Default::default(),
        }
    }
}

impl ObjectTable {
    /// The locked shard of `key` (a leaf but for the node log, tombstone
    /// map, owner registry and rebuild members: `master.rs`).
    pub fn shard(&self, key: &str) -> ShardGuard<'_> {
        let i = self.hasher.hash_one(key) as usize % self.shards.len();
        self.shards[i].lock()
    }

    pub(crate) fn shards(&self) -> impl Iterator<Item = &OrderedMutex<Shard>> {
        self.shards.iter()
    }

    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    /// Overwrites being written (new versions beside their committed key).
    pub fn overwrites_len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().overwrites_len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.shards.iter().all(|s| s.lock().is_empty())
    }
}

/// The longest key the master takes.
pub const MAX_KEY_LEN: usize = 4096;
/// The most replicas one put may ask for.
pub const MAX_REPLICAS: u32 = 16;

/// Refuses an empty key or one longer than [`MAX_KEY_LEN`].
pub fn validate_key(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(Error::invalid("key must not be empty"));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(Error::invalid(format!(
            "key of {} bytes is longer than the limit of {MAX_KEY_LEN}",
            key.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The master holds one `Object` per cached object: a field that grows
    /// it shows up as gigabytes at tens of millions of keys (the rebuild
    /// bench measures the whole cost per object).
    #[test]
    fn object_stays_small() {
        assert!(
            std::mem::size_of::<Object>() <= 88,
            "Object is {} bytes",
            std::mem::size_of::<Object>()
        );
        assert_eq!(
            std::mem::size_of::<Option<Object>>(),
            std::mem::size_of::<Object>()
        );
    }

    /// A lease held without a break ends `max` after it began, whatever
    /// lookups come; lookups that keep coming inside a TTL of its end get
    /// none; a TTL without lookups, or every reader done, starts afresh.
    #[test]
    fn a_lease_is_held_without_a_break_for_max_lease_at_most() {
        let (t0, ttl, max) = (1_000_000u64, 1000, 5000);
        // A lookup, as `reads::get_replicas` makes it.
        let look = |o: &mut Object, t: u64| {
            let held = o.lease(t, ttl, max);
            o.last_access_ms = t;
            held
        };
        let mut o = Object::new(1, 0, t0);
        // A reader that never ends its lease, looking up every 900 ms.
        let mut t = t0;
        while t < t0 + max {
            assert!(look(&mut o, t), "at +{}", t - t0);
            assert!(o.leased(t));
            t += 900;
        }
        assert_eq!(o.lease_until_ms, t0 + max, "capped");
        // Past the cap: no lease while it keeps looking, for a TTL.
        while t < t0 + max + ttl {
            assert!(!look(&mut o, t), "at +{}", t - t0);
            assert!(!o.leased(t));
            t += 300;
        }
        // Then afresh (a hot object is unleased one TTL per cap, not for
        // good), and so after a TTL without lookups.
        assert!(look(&mut o, t), "at +{}", t - t0);
        let mut o = Object::new(1, 0, t0);
        assert!(look(&mut o, t0));
        let t = t0 + 2 * ttl;
        assert!(look(&mut o, t), "a TTL without lookups");
        assert_eq!(o.lease_until_ms, t + ttl, "a fresh lease, its full TTL");
        // Readers that end their leases never meet the cap.
        let mut o = Object::new(1, 0, t0);
        let mut t = t0;
        while t < t0 + 3 * max {
            assert!(look(&mut o, t), "at +{}", t - t0);
            assert!(o.end_lease(t + 100));
            t += 200;
        }
    }

    fn ssd(owner_id: u64) -> SsdReplica {
        SsdReplica {
            owner_id,
            bucket_id: 1,
            offset: 0,
            length: 10,
        }
    }

    #[test]
    fn copies_move_between_inline_and_spill() {
        let mut o = Object::ssd_only(10, 1, ssd(1));
        assert!(o.spill.is_none(), "a lone copy is inline");
        o.push_ssd(ssd(2));
        assert_eq!(
            o.ssd().iter().map(|r| r.owner_id).collect::<Vec<_>>(),
            [1, 2]
        );
        o.ssd_mut()[1].bucket_id = 9;
        assert_eq!(o.retain_ssd(|r| r.owner_id == 2), 1);
        assert_eq!(
            o.ssd(),
            [SsdReplica {
                bucket_id: 9,
                ..ssd(2)
            }]
        );
        assert!(o.spill.is_none(), "back inline once alone");
        assert_eq!(o.retain_ssd(|_| false), 1);
        assert!(o.ssd().is_empty() && o.replicas().is_empty());
        assert!(o.is_complete());
    }

    #[test]
    fn a_pending_put_completes() {
        let deadline = Instant::now();
        let mut o = Object::processing(10, Vec::new(), 7, deadline, 1);
        assert_eq!(
            o.state(),
            ObjState::Processing {
                put_id: 7,
                deadline
            }
        );
        assert!(!o.is_complete());
        o.complete();
        assert_eq!(o.state(), ObjState::Complete);
        assert!(o.spill.is_none());
    }
}
