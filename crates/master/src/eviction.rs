//! Eviction: approximate LRU over committed, unleased, not hard-pinned
//! objects; soft-pinned objects go only after every unpinned one.

use crate::master::Master;
use crate::objects::Object;
use strata_common::time::unix_ms;

impl Master {
    /// Evicts until at least `want` bytes are freed or nothing evictable is
    /// left. Returns the bytes freed.
    pub fn evict(&self, want: u64) -> u64 {
        let now = unix_ms();
        // Candidates ordered by (soft-pinned, last access): oldest unpinned first.
        let mut cands: Vec<(bool, u64, String)> = Vec::new();
        for shard in self.objects.shards() {
            let s = shard.lock();
            cands.extend(
                s.iter()
                    .filter(|(_, o)| o.evictable(now))
                    .map(|(k, o)| (o.soft_pin, o.last_access_ms, k.clone())),
            );
        }
        cands.sort_unstable();
        let mut freed = 0;
        let mut evicted = 0u64;
        for (_, _, key) in cands {
            if freed >= want {
                break;
            }
            // Re-check under the lock: a reader may have leased it meanwhile.
            let victim: Option<Object> = {
                let mut s = self.objects.shard(&key);
                match s.get(&key) {
                    Some(o) if o.evictable(now) => s.remove(&key),
                    _ => None,
                }
            };
            if let Some(o) = victim {
                freed += o.release();
                evicted += 1;
            }
        }
        if evicted > 0 {
            self.metrics.evictions.inc_by(evicted);
            self.metrics.keys.sub(evicted as i64);
            tracing::debug!(evicted, freed, "evicted objects");
        }
        freed
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
