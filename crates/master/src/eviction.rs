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

impl Master {
    /// Evicts until at least `want` bytes are freed or nothing evictable is
    /// left. Returns the bytes freed.
    pub fn evict(&self, want: u64) -> u64 {
        let mut freed = 0;
        let mut evicted = 0u64;
        for _ in 0..MAX_SCANS {
            let now = unix_ms();
            let victims = self.oldest_evictable(SCAN_BATCH, now);
            if victims.is_empty() {
                break;
            }
            for key in victims {
                if freed >= want {
                    break;
                }
                // Re-check under the lock: a reader may have leased it meanwhile.
                // An object with an SSD copy keeps living there.
                let victim: Option<(Object, bool)> = {
                    let mut s = self.objects.shard(&key);
                    match s.get_mut(&key) {
                        Some(o) if o.evictable(now) && !o.ssd.is_empty() => {
                            Some((o.take_memory(), false))
                        }
                        Some(o) if o.evictable(now) => s.remove(&key).map(|o| (o, true)),
                        _ => None,
                    }
                };
                if let Some((o, gone)) = victim {
                    freed += o.release();
                    evicted += 1;
                    if gone {
                        self.metrics.keys.dec();
                    }
                }
            }
            if freed >= want {
                break;
            }
        }
        if evicted > 0 {
            self.metrics.evictions.inc_by(evicted);
            tracing::debug!(evicted, freed, "evicted objects");
        }
        freed
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
        self.evict((allocated - target).max(0.0) as u64)
    }
}
