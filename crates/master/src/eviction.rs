//! Eviction: LRU over committed, unleased, not hard-pinned objects;
//! soft-pinned objects go only after every unpinned one.

use crate::master::Master;
use crate::objects::Object;
use std::collections::BinaryHeap;
use strata_common::time::unix_ms;

/// Victims gathered per scan. A scan keeps only the oldest this many, so its
/// memory stays bounded however many keys the master holds.
const SCAN_BATCH: usize = 4096;
/// Scans one eviction call may make before it gives up.
const MAX_SCANS: usize = 64;

/// What eviction does with one victim.
enum Fate {
    /// Free its DRAM now (it lives on in SSD, or is dropped).
    Free(Object, bool),
    /// `on-evict`: copy it to SSD first; DRAM is freed once persisted.
    Offload(u64),
    /// Already waiting for its SSD copy.
    Pending(u64),
    Skip,
}

impl Master {
    /// Evicts until at least `want` bytes are freed or nothing evictable is
    /// left, freeing at once (the path a put waiting for space takes: it
    /// never stalls on the SSD tier). Returns the bytes freed.
    pub fn evict(&self, want: u64) -> u64 {
        self.evict_with(want, false)
    }

    /// With `offload` (background eviction under `on-evict`), victims with
    /// no SSD copy are queued for offload and freed once persisted; their
    /// bytes count toward `want`. A victim no owner can take is dropped.
    fn evict_with(&self, want: u64, offload: bool) -> u64 {
        let mut freed = 0;
        let mut pending = 0;
        let mut evicted = 0u64;
        for _ in 0..MAX_SCANS {
            let now = unix_ms();
            let victims = self.oldest_evictable(SCAN_BATCH, now);
            if victims.is_empty() {
                break;
            }
            let mut progressed = false;
            for key in victims {
                if freed + pending >= want {
                    break;
                }
                // Re-check under the lock: a reader may have leased it meanwhile.
                // An object with an SSD copy keeps living there.
                let fate = {
                    let mut s = self.objects.shard(&key);
                    match s.get_mut(&key) {
                        Some(o) if o.evictable(now) && !o.ssd.is_empty() => {
                            Fate::Free(o.take_memory(), false)
                        }
                        Some(o) if o.evictable(now) && offload && o.offload_then_free => {
                            Fate::Pending(alloc_bytes(o))
                        }
                        Some(o) if o.evictable(now) && offload => {
                            o.offload_then_free = true;
                            Fate::Offload(o.size)
                        }
                        Some(o) if o.evictable(now) => match s.remove(&key) {
                            Some(o) => Fate::Free(o, true),
                            None => Fate::Skip,
                        },
                        _ => Fate::Skip,
                    }
                };
                match fate {
                    Fate::Free(o, gone) => {
                        self.admission.victim_undecided(&key, o.size);
                        freed += o.release();
                        evicted += 1;
                        progressed = true;
                        if gone {
                            self.metrics.keys.dec();
                        }
                    }
                    Fate::Offload(size) => {
                        // Kept out of the SSD (a loop larger than the tiers),
                        // or the SSD tier cannot take it: simply dropped.
                        if self.admission.admit(&key, size) && self.enqueue_offload(&key, size) {
                            pending += self.objects.shard(&key).get(&key).map_or(0, alloc_bytes);
                        } else {
                            freed += self.drop_victim(&key);
                            evicted += 1;
                        }
                        progressed = true;
                    }
                    Fate::Pending(bytes) => pending += bytes,
                    Fate::Skip => {}
                }
            }
            if freed + pending >= want || !progressed {
                break;
            }
        }
        if evicted > 0 {
            self.metrics.evictions.inc_by(evicted);
            tracing::debug!(evicted, freed, pending, "evicted objects");
        }
        freed
    }

    /// Drops an object outright if eviction may still take it (no SSD copy
    /// appeared, no reader leased it). Returns the DRAM bytes freed.
    pub(crate) fn drop_if_evictable(&self, key: &str) -> u64 {
        let now = unix_ms();
        let gone = {
            let mut s = self.objects.shard(key);
            match s.get(key) {
                Some(o) if o.evictable(now) && o.ssd.is_empty() => s.remove(key),
                _ => None,
            }
        };
        match gone {
            Some(o) => {
                self.metrics.keys.dec();
                o.release()
            }
            None => 0,
        }
    }

    /// A victim marked for offload that will not be offloaded after all: it
    /// is dropped, or, if a reader leased it meanwhile, unmarked so that a
    /// later pass decides again (rather than waiting for a copy forever).
    pub(crate) fn drop_victim(&self, key: &str) -> u64 {
        let freed = self.drop_if_evictable(key);
        if freed == 0 {
            if let Some(o) = self.objects.shard(key).get_mut(key) {
                if o.ssd.is_empty() {
                    o.offload_then_free = false;
                }
            }
        }
        freed
    }

    /// `on-evict`: the SSD copy of a victim exists, so its DRAM goes now
    /// (unless a reader holds it; the next pass frees it then).
    pub(crate) fn free_after_offload(&self, key: &str) {
        let now = unix_ms();
        let mem = {
            let mut s = self.objects.shard(key);
            match s.get_mut(key) {
                Some(o) if o.offload_then_free && o.evictable(now) && !o.ssd.is_empty() => {
                    Some(o.take_memory())
                }
                _ => None,
            }
        };
        if let Some(o) = mem {
            o.release();
            self.metrics.evictions.inc();
        }
    }

    /// The `n` evictable objects to go first: unpinned before soft-pinned,
    /// then least recently accessed. Oldest first.
    fn oldest_evictable(&self, n: usize, now: u64) -> Vec<String> {
        // Max-heap on (soft_pin, last_access): the top is the youngest kept.
        let mut heap: BinaryHeap<(bool, u64, String)> = BinaryHeap::with_capacity(n + 1);
        for shard in self.objects.shards() {
            let s = shard.lock();
            for (k, o) in s.iter().filter(|(_, o)| o.evictable(now)) {
                let rank = (o.soft_pin, o.last_access_ms);
                if heap.len() < n {
                    heap.push((rank.0, rank.1, k.clone()));
                } else if heap.peek().is_some_and(|t| rank < (t.0, t.1)) {
                    heap.pop();
                    heap.push((rank.0, rank.1, k.clone()));
                }
            }
        }
        heap.into_sorted_vec()
            .into_iter()
            .map(|(_, _, k)| k)
            .collect()
    }

    /// One background pass: above the high watermark, free
    /// `--eviction-ratio` of capacity below it.
    pub fn evict_to_watermark(&self) -> u64 {
        let cap = self.capacity_bytes() as f64;
        let allocated = self.allocated_bytes() as f64;
        let hw = self.cfg.high_watermark;
        if cap == 0.0 || allocated <= cap * hw {
            return 0;
        }
        let target = cap * (hw - self.cfg.eviction_ratio).max(0.0);
        if self.policy.on_evict() {
            let (capacity, used) = self.ssd_tier_usage();
            self.admission.observe_tier(capacity, used);
        }
        self.evict_with((allocated - target).max(0.0) as u64, self.policy.on_evict())
    }
}

fn alloc_bytes(o: &Object) -> u64 {
    o.replicas.iter().map(|r| r.alloc_len).sum()
}
