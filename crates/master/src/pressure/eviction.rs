//! Eviction: LRU over committed, unleased, not hard-pinned objects;
//! soft-pinned objects go only after every unpinned one.

use super::Pressure;
use crate::cluster::Cluster;
use crate::metrics::MasterMetrics;
use crate::model::Model;
use crate::objects::Object;
use crate::offload::SsdTier;
use std::collections::BinaryHeap;
use strata_common::time::unix_ms;

/// Victims gathered per scan. A scan keeps only the oldest this many, so its
/// memory stays bounded however many keys the master holds.
const SCAN_BATCH: usize = 4096;
/// Scans one eviction call may make before it gives up.
const MAX_SCANS: usize = 64;

/// What eviction does with one victim.
enum Fate {
    /// Free its DRAM now: it lives on in SSD (`false`), or it is dropped
    /// for the reason given.
    Free(Object, Option<DropReason>),
    /// Copy it to SSD first; its DRAM is freed once persisted.
    Offload(u64),
    /// Already waiting for its SSD copy (bytes it will free).
    Pending(u64),
    Skip,
}

/// Why an object left the cache with no copy anywhere (metric label of
/// `strata_master_dropped_objects_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// The offload policy keeps it out of the SSD tier (`none`, `reads:N`
    /// not reached yet).
    Policy,
    /// `--ssd-admission auto` kept it out (a loop larger than the tiers).
    Admission,
    /// No live SSD owner has room for it.
    NoOwner,
    /// Its copy failed for good (retries used up, or the owner was full).
    OffloadFailed,
}

impl DropReason {
    pub fn label(self) -> &'static str {
        match self {
            DropReason::Policy => "policy",
            DropReason::Admission => "admission",
            DropReason::NoOwner => "no_owner",
            DropReason::OffloadFailed => "offload_failed",
        }
    }
}

/// What one eviction call did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Evicted {
    /// DRAM bytes freed now.
    pub freed: u64,
    /// DRAM bytes that free once copies to SSD land.
    pub pending: u64,
}

impl Pressure {
    /// Evicts until at least `want` bytes are freed or on their way, or
    /// nothing evictable is left. Objects the SSD tier can take are never
    /// dropped: they wait for their copy, and with `urgent` (a writer waits
    /// for the space) their copies go first. Returns the bytes freed.
    pub(crate) fn evict_with(&self, m: Model, ssd: &SsdTier, want: u64, urgent: bool) -> Evicted {
        self.evict_where(m, ssd, want, urgent, &|_| true)
    }

    /// [`Pressure::evict_with`] over the objects `which` picks only (a put
    /// short of copies evicts only what frees room on the nodes it still
    /// needs).
    pub(crate) fn evict_where(
        &self,
        m: Model,
        ssd: &SsdTier,
        want: u64,
        urgent: bool,
        which: &dyn Fn(&Object) -> bool,
    ) -> Evicted {
        let mut out = Evicted::default();
        let mut evicted = 0u64;
        let wants_ssd = ssd.policy().on_evict() || ssd.policy().on_put_end();
        for _ in 0..MAX_SCANS {
            let now = unix_ms();
            let victims = oldest_evictable(m, SCAN_BATCH, now, which);
            if victims.is_empty() {
                break;
            }
            let mut progressed = false;
            for key in victims {
                if out.freed + out.pending >= want {
                    break;
                }
                // Queued for its copy (eager, reads:N, or an earlier pass)?
                // Checked before the shard lock (never held with the queue's).
                let queued = ssd.urge(&key, urgent, m.metrics);
                // Re-check under the lock: a reader may have leased it meanwhile.
                let fate = {
                    let mut s = m.objects.shard(&key);
                    match s.get_mut(&key) {
                        Some(o) if !o.evictable(now) => Fate::Skip,
                        // An object with an SSD copy keeps living there.
                        Some(o) if !o.ssd().is_empty() => Fate::Free(o.take_memory(), None),
                        Some(o) if queued.is_some() || o.offload_then_free() => {
                            Fate::Pending(alloc_bytes(o))
                        }
                        Some(o) if wants_ssd && !o.offload_failed() => {
                            o.set_offload_then_free(true);
                            Fate::Offload(o.size)
                        }
                        Some(o) => {
                            let why = if o.offload_failed() {
                                DropReason::OffloadFailed
                            } else {
                                DropReason::Policy
                            };
                            match s.remove(&key) {
                                Some(o) => Fate::Free(o, Some(why)),
                                None => Fate::Skip,
                            }
                        }
                        None => Fate::Skip,
                    }
                };
                match fate {
                    Fate::Free(o, why) => {
                        ssd.admission().victim_undecided(&key, o.size);
                        out.freed += o.release();
                        evicted += 1;
                        progressed = true;
                        if let Some(why) = why {
                            m.metrics.keys.dec();
                            count_drop(m.metrics, why);
                        }
                    }
                    Fate::Offload(size) => {
                        let why = if !ssd.admission().admit(&key, size) {
                            Some(DropReason::Admission)
                        } else if !ssd.enqueue(m.metrics, &key, size) {
                            Some(DropReason::NoOwner)
                        } else {
                            None
                        };
                        match why {
                            None => {
                                if urgent {
                                    ssd.urge(&key, true, m.metrics);
                                }
                                out.pending +=
                                    m.objects.shard(&key).get(&key).map_or(0, alloc_bytes);
                            }
                            Some(why) => {
                                let freed = self.drop_victim(m, &key, why);
                                out.freed += freed;
                                evicted += u64::from(freed > 0);
                            }
                        }
                        progressed = true;
                    }
                    Fate::Pending(bytes) => out.pending += bytes,
                    Fate::Skip => {}
                }
            }
            if out.freed + out.pending >= want || !progressed {
                break;
            }
        }
        if evicted > 0 {
            m.metrics.evictions.inc_by(evicted);
            tracing::debug!(
                evicted,
                freed = out.freed,
                pending = out.pending,
                "evicted objects"
            );
        }
        out
    }

    /// Drops an object outright if eviction may still take it (no SSD copy
    /// appeared, no reader leased it). Returns the DRAM bytes freed.
    fn drop_if_evictable(&self, m: Model, key: &str, why: DropReason) -> u64 {
        let now = unix_ms();
        let gone = {
            let mut s = m.objects.shard(key);
            match s.get(key) {
                Some(o) if o.evictable(now) && o.ssd().is_empty() => s.remove(key),
                _ => None,
            }
        };
        match gone {
            Some(o) => {
                m.metrics.keys.dec();
                count_drop(m.metrics, why);
                o.release()
            }
            None => 0,
        }
    }

    /// A victim marked for offload that will not be offloaded after all: it
    /// is dropped, or, if a reader leased it meanwhile, unmarked so that a
    /// later pass decides again (rather than waiting for a copy forever).
    pub(crate) fn drop_victim(&self, m: Model, key: &str, why: DropReason) -> u64 {
        let freed = self.drop_if_evictable(m, key, why);
        if freed == 0 {
            if let Some(o) = m.objects.shard(key).get_mut(key) {
                if o.ssd().is_empty() {
                    o.set_offload_then_free(false);
                }
            }
        }
        freed
    }

    /// `on-evict`: the SSD copy of a victim exists, so its DRAM goes now
    /// (unless a reader holds it; the next pass frees it then).
    pub(crate) fn free_after_offload(&self, m: Model, key: &str) {
        let now = unix_ms();
        let mem = {
            let mut s = m.objects.shard(key);
            match s.get_mut(key) {
                Some(o) if o.offload_then_free() && o.evictable(now) && !o.ssd().is_empty() => {
                    Some(o.take_memory())
                }
                _ => None,
            }
        };
        if let Some(o) = mem {
            o.release();
            m.metrics.evictions.inc();
        }
    }

    /// One background pass: above the high watermark, free
    /// `--eviction-ratio` of capacity below it.
    pub(crate) fn evict_to_watermark(&self, m: Model, cluster: &Cluster, ssd: &SsdTier) -> u64 {
        let cap = cluster.capacity_bytes() as f64;
        let allocated = cluster.allocated_bytes() as f64;
        let hw = m.cfg.high_watermark;
        if cap == 0.0 || allocated <= cap * hw {
            return 0;
        }
        let target = cap * (hw - m.cfg.eviction_ratio).max(0.0);
        if ssd.policy().on_evict() {
            let (capacity, used) = ssd.tier_usage();
            ssd.admission().observe_tier(capacity, used);
        }
        self.evict_with(m, ssd, (allocated - target).max(0.0) as u64, false)
            .freed
    }
}

/// The `n` evictable objects to go first: unpinned before soft-pinned,
/// then least recently accessed. Oldest first.
fn oldest_evictable(m: Model, n: usize, now: u64, which: &dyn Fn(&Object) -> bool) -> Vec<String> {
    // Max-heap on (soft_pin, last_access): the top is the youngest kept.
    let mut heap: BinaryHeap<(bool, u64, String)> = BinaryHeap::with_capacity(n + 1);
    for shard in m.objects.shards() {
        let s = shard.lock();
        for (k, o) in s.iter().filter(|(_, o)| o.evictable(now) && which(o)) {
            let rank = (o.soft_pin(), o.last_access_ms);
            if heap.len() < n {
                heap.push((rank.0, rank.1, k.to_string()));
            } else if heap.peek().is_some_and(|t| rank < (t.0, t.1)) {
                heap.pop();
                heap.push((rank.0, rank.1, k.to_string()));
            }
        }
    }
    heap.into_sorted_vec()
        .into_iter()
        .map(|(_, _, k)| k)
        .collect()
}

/// Counts an object that left the cache with no copy anywhere.
pub(crate) fn count_drop(metrics: &MasterMetrics, why: DropReason) {
    metrics
        .dropped_objects
        .with_label_values(&[why.label()])
        .inc();
}

fn alloc_bytes(o: &Object) -> u64 {
    o.replicas().iter().map(|r| r.alloc_len).sum()
}
