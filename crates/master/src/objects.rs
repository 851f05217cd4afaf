//! The object table: key → object metadata, sharded so one hot key never
//! serialises the rest.

use crate::cluster::SegmentEntry;
use parking_lot::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::Instant;

const SHARDS: usize = 64;

/// One copy of an object's bytes in a DRAM segment.
#[derive(Clone)]
pub struct Replica {
    pub seg: Arc<SegmentEntry>,
    pub offset: u64,
    /// Bytes reserved in the allocator (the size rounded up).
    pub alloc_len: u64,
    /// The allocation's generation, carried in its grants.
    pub generation: u64,
}

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

pub struct Object {
    pub size: u64,
    pub crc32c: u32,
    /// DRAM replicas.
    pub replicas: Vec<Replica>,
    pub ssd: Vec<SsdReplica>,
    /// Offload tasks copying a DRAM replica right now: no eviction or free.
    pub pins: u32,
    pub state: ObjState,
    pub lease_until_ms: u64,
    pub last_access_ms: u64,
    pub soft_pin: bool,
    pub hard_pin: bool,
    /// Demand reads served while the object was in DRAM (`reads:N`).
    pub reads: u32,
    /// Eviction queued it for offload (`on-evict`): its DRAM is freed once
    /// the SSD copy exists, or the object is dropped if the copy fails.
    pub offload_then_free: bool,
    /// An offload task was handed out for it (or it came from an SSD
    /// inventory): an SSD copy may exist, so its removal is tombstoned.
    pub offloaded: bool,
    /// Its copy to SSD failed for good: eviction drops it rather than
    /// making writers wait for a copy that will not come.
    pub offload_failed: bool,
}

impl Object {
    pub fn is_complete(&self) -> bool {
        self.state == ObjState::Complete
    }

    /// A committed object known only from an SSD owner's inventory.
    pub fn ssd_only(size: u64, crc32c: u32, r: SsdReplica) -> Object {
        Object {
            offloaded: true,
            ..Object::committed(size, crc32c, Vec::new(), vec![r])
        }
    }

    /// A committed object rebuilt from what members hold (no pin, lease or
    /// history).
    pub fn committed(
        size: u64,
        crc32c: u32,
        replicas: Vec<Replica>,
        ssd: Vec<SsdReplica>,
    ) -> Object {
        Object {
            size,
            crc32c,
            replicas,
            ssd,
            pins: 0,
            state: ObjState::Complete,
            lease_until_ms: 0,
            last_access_ms: strata_common::time::unix_ms(),
            soft_pin: false,
            hard_pin: false,
            reads: 0,
            offload_then_free: false,
            offloaded: false,
            offload_failed: false,
        }
    }

    /// Moves the DRAM replicas out (to be released), keeping the object.
    pub fn take_memory(&mut self) -> Object {
        self.offload_then_free = false;
        Object {
            size: self.size,
            crc32c: self.crc32c,
            replicas: std::mem::take(&mut self.replicas),
            ssd: Vec::new(),
            pins: 0,
            state: self.state,
            lease_until_ms: 0,
            last_access_ms: 0,
            soft_pin: false,
            hard_pin: false,
            reads: 0,
            offload_then_free: false,
            offloaded: false,
            offload_failed: false,
        }
    }
    pub fn leased(&self, now_ms: u64) -> bool {
        self.lease_until_ms > now_ms
    }
    /// Eviction may take its DRAM: committed, unleased, not hard-pinned,
    /// not being offloaded, and holding DRAM at all.
    pub fn evictable(&self, now_ms: u64) -> bool {
        self.is_complete()
            && !self.leased(now_ms)
            && !self.hard_pin
            && self.pins == 0
            && !self.replicas.is_empty()
    }

    /// Frees every replica's space, telling nodes about committed ranges.
    pub fn release(self) -> u64 {
        let committed = self.is_complete();
        let mut freed = 0;
        for r in self.replicas {
            r.seg.free(r.offset, r.alloc_len);
            if committed {
                r.seg
                    .node
                    .log_free(r.seg.id, r.offset, r.alloc_len, r.generation);
            }
            freed += r.alloc_len;
        }
        freed
    }
}

pub type Shard = HashMap<String, Object>;

pub struct ObjectTable {
    shards: Box<[Mutex<Shard>]>,
    hasher: std::collections::hash_map::RandomState,
}

impl Default for ObjectTable {
    fn default() -> Self {
        ObjectTable {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: Default::default(),
        }
    }
}

impl ObjectTable {
    pub fn shard(&self, key: &str) -> MutexGuard<'_, Shard> {
        let i = self.hasher.hash_one(key) as usize % self.shards.len();
        self.shards[i].lock()
    }

    pub fn shards(&self) -> impl Iterator<Item = &Mutex<Shard>> {
        self.shards.iter()
    }

    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.shards.iter().all(|s| s.lock().is_empty())
    }
}
