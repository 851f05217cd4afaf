//! Scan-resistant SSD admission for `on-evict` (`--ssd-admission auto`).
//!
//! Admitting every DRAM victim is right for most workloads (recency wins),
//! and wrong for a working set larger than DRAM + SSD read in a loop: each
//! victim pushes out an older one that is read again later, so the SSD serves
//! nothing. Keeping what is on SSD and admitting only a trickle serves a fixed
//! share of such a loop instead, but costs hits everywhere else.
//!
//! Neither choice is made by hand. Two shadow caches (keys and sizes only)
//! model the SSD tier over a hash-sampled subset of keys, one admitting every
//! victim, one keeping what it has; every DRAM miss of a sampled key scores
//! whichever shadow would have served it and the other not, and the real tier
//! follows the better one (with hysteresis). This is set dueling (Qureshi et
//! al., ISCA 2007) over a miniature simulation (Waldspurger et al., ATC 2017).

use parking_lot::Mutex;
use prometheus::{IntCounterVec, IntGauge};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Keys a shadow holds at most (about): the sample rate follows from it.
const SHADOW_ENTRIES: u64 = 4096;
/// In keeping mode, one victim in this many is admitted anyway, so what is
/// kept still renews slowly (and the keeping shadow can learn a new loop).
pub const KEEP_ADMIT_EVERY: u64 = 32;
/// Score bounds and the hysteresis that flips the mode.
const SCORE_LIMIT: i64 = 64;
const FLIP_AT: i64 = 16;
/// Share of SSD capacity the keeping mode fills freely (below the agents'
/// default high watermark, so filling it does not evict anything).
const FREE_FILL: f64 = 0.9;

/// Whether `key` is in the 1-in-`sample` subset the shadows model.
fn sampled(key: &str, sample: u64) -> bool {
    sample != 0 && u64::from(crc32c::crc32c(key.as_bytes())) % sample == 0
}

/// The mode the real SSD tier follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    AdmitAll,
    Keep,
}

/// A cache model over keys and sizes: LRU by bytes.
#[derive(Default)]
struct Shadow {
    capacity: u64,
    used: u64,
    clock: u64,
    keys: HashMap<String, (u64, u64)>,
    order: BTreeMap<u64, String>,
    /// Keeping shadow only: victims refused since the last admitted one.
    refused: u64,
}

impl Shadow {
    fn reset(&mut self, capacity: u64) {
        *self = Shadow {
            capacity,
            ..Default::default()
        };
    }

    /// A new capacity, keeping the most recent keys that fit.
    fn resize(&mut self, capacity: u64) {
        self.capacity = capacity;
        self.shrink_to(capacity);
    }

    fn shrink_to(&mut self, bytes: u64) {
        while self.used > bytes {
            let Some((_, k)) = self.order.pop_first() else {
                break;
            };
            if let Some((_, s)) = self.keys.remove(&k) {
                self.used -= s;
            }
        }
    }

    /// Whether `key` is cached; a hit makes it the most recent.
    fn lookup(&mut self, key: &str) -> bool {
        let Some(e) = self.keys.get_mut(key) else {
            return false;
        };
        self.clock += 1;
        let k = self.order.remove(&e.0).unwrap_or_default();
        e.0 = self.clock;
        self.order.insert(self.clock, k);
        true
    }

    /// A DRAM victim offered. `keep`: admit only into free room, or one in
    /// `KEEP_ADMIT_EVERY` otherwise.
    fn offer(&mut self, key: &str, size: u64, keep: bool) {
        if size > self.capacity || self.keys.contains_key(key) {
            return;
        }
        if keep && self.used + size > self.capacity {
            self.refused += 1;
            if self.refused < KEEP_ADMIT_EVERY {
                return;
            }
            self.refused = 0;
        }
        self.shrink_to(self.capacity - size);
        self.clock += 1;
        self.keys.insert(key.to_string(), (self.clock, size));
        self.order.insert(self.clock, key.to_string());
        self.used += size;
    }
}

#[derive(Default)]
struct Duel {
    /// One key in `sample` (by hash) feeds the shadows.
    sample: u64,
    all: Shadow,
    keep: Shadow,
    /// > 0: admitting all would have served more sampled misses.
    score: i64,
    /// Average size of the objects offered (the sample rate needs a count).
    avg_size: u64,
}

/// Metrics of the filter (registered by `MasterMetrics`).
#[derive(Clone)]
pub struct AdmissionMetrics {
    /// `admitted` / `refused` DRAM victims.
    pub decisions: IntCounterVec,
    /// 0 = admit all, 1 = keep.
    pub mode: IntGauge,
    pub score: IntGauge,
    pub sample: IntGauge,
}

impl AdmissionMetrics {
    /// DRAM victims kept out of the SSD so far.
    pub fn refused(&self) -> u64 {
        self.decisions.with_label_values(&["refused"]).get()
    }
}

pub struct AdmissionFilter {
    enabled: bool,
    keep: AtomicBool,
    /// Copy of `Duel::sample`, so a DRAM miss of an unsampled key (almost
    /// all of them) takes no lock.
    sample: AtomicU64,
    duel: Mutex<Duel>,
    /// Bytes the keeping mode may still admit without making the agents evict.
    room: AtomicU64,
    refused: AtomicU64,
    metrics: AdmissionMetrics,
}

impl AdmissionFilter {
    /// A disabled filter admits every victim and models nothing.
    pub fn new(enabled: bool, metrics: AdmissionMetrics) -> Self {
        AdmissionFilter {
            enabled,
            keep: AtomicBool::new(false),
            sample: AtomicU64::new(0),
            duel: Mutex::new(Duel::default()),
            room: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            metrics,
        }
    }

    pub fn mode(&self) -> Mode {
        if self.keep.load(Ordering::Relaxed) {
            Mode::Keep
        } else {
            Mode::AdmitAll
        }
    }

    /// For `/api/v1/offload`: whether the filter runs, its mode, score and
    /// sample rate.
    pub fn describe(&self) -> serde_json::Value {
        let d = self.duel.lock();
        serde_json::json!({
            "enabled": self.enabled,
            "mode": match self.mode() {
                Mode::AdmitAll => "admit-all",
                Mode::Keep => "keep",
            },
            "score": d.score,
            "sample": d.sample,
        })
    }

    /// The SSD tier as it is now: capacity of the live owners and bytes used
    /// or queued there. Sets the sample rate (the shadows start over when it
    /// changes by more than 2x) and the room the keeping mode fills freely.
    pub fn observe_tier(&self, capacity: u64, used: u64) {
        if !self.enabled {
            return;
        }
        let free = ((capacity as f64 * FREE_FILL) as u64).saturating_sub(used);
        self.room.store(free, Ordering::Relaxed);
        let mut d = self.duel.lock();
        if d.avg_size == 0 || capacity == 0 {
            return;
        }
        let want = capacity
            .div_ceil(SHADOW_ENTRIES.saturating_mul(d.avg_size))
            .max(1)
            .next_power_of_two();
        if d.sample == 0 || want > d.sample * 2 || want * 2 < d.sample {
            // Another sample of keys: what the shadows learned is void.
            d.sample = want;
            self.sample.store(want, Ordering::Relaxed);
            d.all.reset(capacity / want);
            d.keep.reset(capacity / want);
            d.score = 0;
            self.set_keep(false, 0, want);
            self.metrics.sample.set(want as i64);
        } else if d.all.capacity != capacity / d.sample {
            // Owners came or went: same keys, another size.
            let cap = capacity / d.sample;
            d.all.resize(cap);
            d.keep.resize(cap);
        }
    }

    /// A read of `key` that DRAM could not serve (served from SSD, or missed).
    pub fn lookup_miss(&self, key: &str) {
        if !self.enabled || !sampled(key, self.sample.load(Ordering::Relaxed)) {
            return;
        }
        let mut d = self.duel.lock();
        if !sampled(key, d.sample) {
            return;
        }
        let all = d.all.lookup(key);
        let keep = d.keep.lookup(key);
        if all != keep {
            d.score = (d.score + if all { 1 } else { -1 }).clamp(-SCORE_LIMIT, SCORE_LIMIT);
            self.metrics.score.set(d.score);
            let keep_now = self.keep.load(Ordering::Relaxed);
            if !keep_now && d.score <= -FLIP_AT {
                self.set_keep(true, d.score, d.sample);
            } else if keep_now && d.score >= FLIP_AT {
                self.set_keep(false, d.score, d.sample);
            }
        }
    }

    fn set_keep(&self, keep: bool, score: i64, sample: u64) {
        if self.keep.swap(keep, Ordering::Relaxed) != keep {
            tracing::info!(
                mode = if keep { "keep" } else { "admit-all" },
                score,
                sample,
                "SSD admission switched: {}",
                if keep {
                    "the SSD keeps what it holds (a working set larger than DRAM + SSD read in a loop)"
                } else {
                    "every DRAM victim goes to SSD again"
                }
            );
        }
        self.metrics.mode.set(i64::from(keep));
    }

    /// A DRAM victim nothing is decided for (it has an SSD copy already, or
    /// a put needing room drops it now): the shadows still see it, as they
    /// model the tier under each mode, not what happened to this object.
    pub fn victim_undecided(&self, key: &str, size: u64) {
        self.shadow_offer(key, size);
    }

    /// Whether a DRAM victim with no SSD copy goes to SSD (else it is dropped).
    pub fn admit(&self, key: &str, size: u64) -> bool {
        if !self.enabled {
            return true;
        }
        self.shadow_offer(key, size);
        let admit = match self.mode() {
            Mode::AdmitAll => true,
            Mode::Keep => {
                let free = self
                    .room
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| {
                        r.checked_sub(size)
                    })
                    .is_ok();
                free || self.refused.fetch_add(1, Ordering::Relaxed) % KEEP_ADMIT_EVERY
                    == KEEP_ADMIT_EVERY - 1
            }
        };
        let label = if admit { "admitted" } else { "refused" };
        self.metrics.decisions.with_label_values(&[label]).inc();
        admit
    }

    fn shadow_offer(&self, key: &str, size: u64) {
        if !self.enabled {
            return;
        }
        let mut d = self.duel.lock();
        // Running average over the last ~64 victims.
        d.avg_size = if d.avg_size == 0 {
            size.max(1)
        } else {
            (d.avg_size.saturating_mul(63).saturating_add(size) / 64).max(1)
        };
        if sampled(key, d.sample) {
            d.all.offer(key, size, false);
            d.keep.offer(key, size, true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics() -> AdmissionMetrics {
        crate::metrics::MasterMetrics::new().admission
    }

    #[test]
    fn shadow_is_lru_by_bytes() {
        let mut s = Shadow::default();
        s.reset(300);
        for k in ["a", "b", "c"] {
            s.offer(k, 100, false);
        }
        assert!(s.lookup("a"));
        s.offer("d", 100, false);
        assert!(!s.lookup("b"), "least recent goes first");
        assert!(s.lookup("a") && s.lookup("c") && s.lookup("d"));
        assert_eq!(s.used, 300);
        s.offer("huge", 301, false);
        assert!(!s.lookup("huge"), "larger than the shadow: never cached");
    }

    #[test]
    fn keeping_shadow_admits_a_trickle_when_full() {
        let mut s = Shadow::default();
        s.reset(10);
        for i in 0..10 {
            s.offer(&format!("k{i}"), 1, true);
        }
        for i in 10..10 + KEEP_ADMIT_EVERY {
            s.offer(&format!("k{i}"), 1, true);
        }
        let new = (10..10 + KEEP_ADMIT_EVERY)
            .filter(|i| s.keys.contains_key(&format!("k{i}")))
            .count();
        assert_eq!(new, 1, "one in KEEP_ADMIT_EVERY");
        assert_eq!(s.used, 10);
    }

    /// Drives the filter with `rounds` of a workload: each access that is not
    /// in a small DRAM LRU is a lookup miss; DRAM victims are offered.
    fn drive(f: &AdmissionFilter, keys: impl Iterator<Item = u64>, dram: usize) {
        let mut lru: std::collections::VecDeque<u64> = Default::default();
        for k in keys {
            if let Some(p) = lru.iter().position(|&x| x == k) {
                lru.remove(p);
            } else {
                f.lookup_miss(&format!("ws/{k}"));
            }
            lru.push_back(k);
            if lru.len() > dram {
                let v = lru.pop_front().unwrap_or_default();
                f.admit(&format!("ws/{v}"), 1000);
            }
        }
    }

    #[test]
    fn a_loop_larger_than_the_tier_switches_to_keep() {
        let f = AdmissionFilter::new(true, metrics());
        f.admit("warm", 1000);
        // SSD of 1,000 objects, a loop over 3,000, DRAM of 300.
        f.observe_tier(1000 * 1000, 0);
        assert_eq!(f.mode(), Mode::AdmitAll, "admit-all until proven worse");
        drive(&f, (0..4).flat_map(|_| 0..3000u64), 300);
        assert_eq!(f.mode(), Mode::Keep);
        let refused = f.metrics.refused();
        assert!(refused > 1000, "refused {refused}");
    }

    #[test]
    fn recency_friendly_workloads_stay_admit_all() {
        let f = AdmissionFilter::new(true, metrics());
        f.admit("warm", 1000);
        f.observe_tier(1000 * 1000, 0);
        // A sliding window: each key is read again ~800 accesses later,
        // within DRAM + SSD: admitting all serves it, keeping does not.
        let keys = (0..20_000u64).map(|i| {
            if i % 2 == 0 {
                i / 2
            } else {
                (i / 2).saturating_sub(400)
            }
        });
        drive(&f, keys, 300);
        assert_eq!(f.mode(), Mode::AdmitAll);
        assert!(f.duel.lock().score >= FLIP_AT, "admit-all served more");
        assert_eq!(f.metrics.refused(), 0);
    }

    #[test]
    fn the_mode_follows_the_workload_back_to_admit_all() {
        let f = AdmissionFilter::new(true, metrics());
        f.admit("warm", 1000);
        f.observe_tier(1000 * 1000, 0);
        drive(&f, (0..4).flat_map(|_| 0..3000u64), 300);
        assert_eq!(f.mode(), Mode::Keep);
        // Then a sliding window over new keys: the admit-all shadow serves
        // its re-reads, the keeping one cannot take the new keys in.
        let keys = (0..20_000u64).map(|i| {
            let k = 10_000 + i / 2;
            if i % 2 == 0 {
                k
            } else {
                k.saturating_sub(400).max(10_000)
            }
        });
        drive(&f, keys, 300);
        assert_eq!(f.mode(), Mode::AdmitAll);
        assert_eq!(f.metrics.mode.get(), 0);
    }

    #[test]
    fn keeping_mode_fills_free_room_first_and_a_disabled_filter_admits_all() {
        let f = AdmissionFilter::new(true, metrics());
        f.admit("warm", 10);
        f.observe_tier(1000, 0);
        f.set_keep(true, -FLIP_AT, 1);
        // 900 bytes of room (90% of 1,000): 90 victims of 10 bytes go in.
        let admitted = (0..90).filter(|i| f.admit(&format!("k{i}"), 10)).count();
        assert_eq!(admitted, 90);
        let more = (0..(KEEP_ADMIT_EVERY * 4))
            .filter(|i| f.admit(&format!("x{i}"), 10))
            .count();
        assert_eq!(more, 4, "then one in KEEP_ADMIT_EVERY");

        let off = AdmissionFilter::new(false, metrics());
        off.set_keep(true, 0, 1);
        assert!(off.admit("k", 10));
    }

    #[test]
    fn sample_rate_follows_capacity_over_object_size() {
        let f = AdmissionFilter::new(true, metrics());
        f.admit("warm", 64 << 10);
        // 1.15 GB of 64 KiB objects: ~17,500 objects, sampled 1 in 8.
        f.observe_tier(17_577 * (64 << 10), 0);
        assert_eq!(f.duel.lock().sample, 8);
        // An owner joins (1.5x): same sample, the shadows keep what they hold.
        f.duel.lock().all.offer("kept", 64 << 10, false);
        f.observe_tier(26_365 * (64 << 10), 0);
        {
            let mut d = f.duel.lock();
            assert_eq!(d.sample, 8);
            assert_eq!(d.all.capacity, 26_365 * (64 << 10) / 8);
            assert!(d.all.lookup("kept"), "resized, not reset");
        }
        // A 64x larger tier samples 64x fewer keys; the shadows start over.
        f.observe_tier(64 * 17_577 * (64 << 10), 0);
        assert_eq!(f.duel.lock().sample, 512);
        assert_eq!(f.duel.lock().all.capacity, 64 * 17_577 * (64 << 10) / 512);
    }
}
