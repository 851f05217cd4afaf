//! Grants die with their range. Every allocation the master makes gets a
//! generation (increasing), carried in the grants for it. A store node keeps,
//! per segment, the newest generation it has seen on each range: a grant of
//! an older generation for an overlapping range is refused, and a range whose
//! allocation was freed (the object log says so) refuses its own generation
//! too. So a slow writer holding the grant of a revoked put, or a reader
//! holding a lease of a forced remove, can never touch the next object placed
//! there — whatever the clocks say, because no expiry time is involved.
//!
//! Writes in flight are counted: a newer generation is refused (retryably)
//! while an older writer is still copying into an overlapping range, so bytes
//! of the old holder can never land after the new holder's. That holds
//! across registrations too: a node that registers again (its master dropped
//! it, or a new master leads) serves the same memory under new segment ids
//! and new generations, while a write admitted under the old registration
//! may still be copying in (its client's bytes held up on a link that just
//! healed). The new fences keep the old ones ([`SegmentFences::after`]) and
//! refuse overlapping accesses until those writes are done.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use strata_common::{Code, Error, Result};

#[derive(Debug, Clone, Copy)]
struct Fence {
    end: u64,
    generation: u64,
    writers: u32,
    freed: bool,
    /// Allocations up to this generation overlapping the range were freed
    /// while this one still had writers in flight (so no fence of their
    /// own could replace it): their grants are refused here.
    dead_upto: u64,
}

/// The ranges of one segment, by start offset; they never overlap.
#[derive(Default)]
pub struct SegmentFences {
    ranges: Mutex<BTreeMap<u64, Fence>>,
    /// The same memory's fences under the node's previous registration,
    /// while writes admitted there may still be copying in. Their writer
    /// counts only fall (nothing is admitted under a retired registration),
    /// so a range found idle there stays idle. Never locked together with
    /// `ranges`.
    before: Mutex<Option<Arc<SegmentFences>>>,
    /// Writes admitted here and not yet dropped (all ranges): whether a
    /// later registration must still look here, without a scan.
    in_flight: AtomicU64,
}

/// A write admitted under a fence; the range is released when it drops.
pub struct WriteLease {
    fences: Arc<SegmentFences>,
    start: u64,
    generation: u64,
}

impl Drop for WriteLease {
    fn drop(&mut self) {
        let mut g = self.fences.ranges.lock();
        if let Some(f) = g.get_mut(&self.start) {
            if f.generation == self.generation {
                f.writers = f.writers.saturating_sub(1);
            }
        }
        self.fences.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

fn revoked(start: u64, end: u64, generation: u64, newer: u64) -> Error {
    Error::new(
        Code::PermissionDenied,
        format!(
            "grant revoked: range [{start}, {end}) of generation {generation} was freed \
             (it now belongs to generation {newer}); ask the master for fresh replicas"
        ),
    )
}

impl SegmentFences {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Fences of memory that `before` fenced under the node's previous
    /// registration: its writes still in flight keep overlapping accesses
    /// out (whatever their generations: each registration numbers its own).
    pub fn after(before: Arc<SegmentFences>) -> Arc<Self> {
        let f = Self::default();
        if before.busy() {
            *f.before.lock() = Some(before);
        }
        Arc::new(f)
    }

    /// Whether any write admitted here, or under an earlier registration
    /// of the same memory, is still in flight.
    pub(crate) fn busy(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) > 0 || self.earlier().is_some()
    }

    /// Whether a write admitted here, or under an earlier registration of
    /// the same memory, is still copying into `[start, end)`.
    fn writing(&self, start: u64, end: u64) -> bool {
        let here = self
            .ranges
            .lock()
            .range(..end)
            .rev()
            .take_while(|(_, f)| f.end > start)
            .any(|(_, f)| f.writers > 0);
        here || self.earlier().is_some_and(|b| b.writing(start, end))
    }

    /// The previous registration's fences while any of its writes are in
    /// flight; forgotten once none are.
    fn earlier(&self) -> Option<Arc<SegmentFences>> {
        let b = self.before.lock().clone()?;
        if b.busy() {
            return Some(b);
        }
        let mut before = self.before.lock();
        if before.as_ref().is_some_and(|x| Arc::ptr_eq(x, &b)) {
            *before = None;
        }
        None
    }

    /// Admits an access under a grant for `[start, end)` of `generation`.
    /// Writes get a lease that counts them in flight until dropped.
    pub fn admit(
        self: &Arc<Self>,
        start: u64,
        end: u64,
        generation: u64,
        write: bool,
    ) -> Result<Option<WriteLease>> {
        if end <= start {
            return Err(Error::invalid("a grant must cover at least one byte"));
        }
        // Checked before this registration's own lock is taken (the two are
        // never held together); what is idle there stays idle.
        if self.earlier().is_some_and(|b| b.writing(start, end)) {
            return Err(Error::new(
                Code::Unavailable,
                format!(
                    "range [{start}, {end}) is still being written under this node's previous \
                     registration; retry shortly"
                ),
            ));
        }
        let mut g = self.ranges.lock();
        let mut stale = Vec::new();
        let mut same = false;
        // Ranges are disjoint and sorted, so their ends are sorted too: walk
        // back from the last range starting before `end` while they overlap.
        for (&s, f) in g.range(..end).rev() {
            if f.end <= start {
                break;
            }
            if f.generation > generation {
                return Err(revoked(start, end, generation, f.generation));
            }
            if generation <= f.dead_upto {
                return Err(revoked(start, end, generation, f.dead_upto));
            }
            if f.generation == generation {
                if f.freed {
                    return Err(Error::new(
                        Code::PermissionDenied,
                        format!(
                            "grant revoked: range [{start}, {end}) of generation {generation} \
                             was freed; ask the master for fresh replicas"
                        ),
                    ));
                }
                if s != start || f.end != end {
                    return Err(Error::invalid(format!(
                        "grant range [{start}, {end}) does not match generation \
                         {generation}'s range [{s}, {})",
                        f.end
                    )));
                }
                same = true;
            } else if f.writers > 0 {
                // An older holder is still copying in: the new one waits.
                return Err(Error::new(
                    Code::Unavailable,
                    format!(
                        "range [{start}, {end}) is still being written under the previous \
                         allocation; retry shortly"
                    ),
                ));
            } else {
                stale.push(s);
            }
        }
        for s in stale {
            g.remove(&s);
        }
        let f = g.entry(start).or_insert(Fence {
            end,
            generation,
            writers: 0,
            freed: false,
            dead_upto: 0,
        });
        debug_assert!(same || f.writers == 0);
        if !write {
            return Ok(None);
        }
        f.writers += 1;
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        Ok(Some(WriteLease {
            fences: self.clone(),
            start,
            generation,
        }))
    }

    /// Whether the allocation `generation` at `start` was admitted here and
    /// not freed since (a write's record is kept only then).
    pub fn is_live(&self, start: u64, generation: u64) -> bool {
        self.ranges
            .lock()
            .get(&start)
            .is_some_and(|f| f.generation == generation && !f.freed && f.dead_upto < generation)
    }

    /// The master freed the allocation `generation` at `[start, start+len)`:
    /// its grants (and any older ones seen inside the range) die now, even
    /// before the range is reused, and even if this node never saw the
    /// allocation (its bytes came one-sided). A newer allocation already
    /// placed there (the notice can arrive late) is untouched.
    pub fn freed(&self, start: u64, len: u64, generation: u64) {
        let end = start.saturating_add(len);
        if end <= start {
            return;
        }
        let mut g = self.ranges.lock();
        let mut overlapping = Vec::new();
        let mut keep = false;
        for (&s, f) in g.range(..end).rev() {
            if f.end <= start {
                break;
            }
            // A newer allocation is there already, or an older holder is
            // still writing (its count must keep newer writers out).
            keep |= f.generation > generation || f.writers > 0;
            overlapping.push(s);
        }
        if keep {
            for s in overlapping {
                let f = g.get_mut(&s).expect("just seen");
                if f.generation <= generation {
                    f.freed |= s >= start && f.end <= end;
                    f.dead_upto = f.dead_upto.max(generation);
                }
            }
            return;
        }
        // Everything here is of this allocation or older (dead since it was
        // made): one freed fence covers the range, and what older fences
        // had outside it stays fenced (they are dead too).
        for s in overlapping {
            let f = g.remove(&s).expect("just seen");
            let piece = |end| Fence {
                end,
                freed: true,
                writers: 0,
                ..f
            };
            if s < start {
                g.insert(s, piece(start));
            }
            if f.end > end {
                g.insert(end, piece(f.end));
            }
        }
        g.insert(
            start,
            Fence {
                end,
                generation,
                writers: 0,
                freed: true,
                dead_upto: 0,
            },
        );
    }

    /// Ranges tracked (for tests and metrics).
    pub fn len(&self) -> usize {
        self.ranges.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn older_generations_die_when_a_newer_one_touches_the_range() {
        let f = SegmentFences::new();
        assert!(f.is_empty());
        assert!(f.admit(0, 100, 5, false).unwrap().is_none());
        assert!(!f.is_empty());
        // Same generation, same range: fine, as often as wanted.
        f.admit(0, 100, 5, false).unwrap();
        drop(f.admit(0, 100, 5, true).unwrap());
        // A newer allocation overlapping part of it takes over...
        drop(f.admit(50, 150, 6, true).unwrap());
        // ...and the older one is refused for reads and writes alike.
        for w in [false, true] {
            let e = f.admit(0, 100, 5, w).err().unwrap();
            assert_eq!(e.code, Code::PermissionDenied, "{e}");
            assert!(e.message.contains("revoked"), "{e}");
        }
        // Disjoint ranges do not interfere; the newer one is still fine.
        f.admit(200, 300, 1, false).unwrap();
        f.admit(50, 150, 6, false).unwrap();
        // Both sides of the check: a still newer one wins again.
        f.admit(0, 60, 7, false).unwrap();
        assert!(f.admit(50, 150, 6, false).is_err());
        assert_eq!(f.len(), 2);
    }

    #[test]
    fn a_new_generation_waits_for_an_older_writer_in_flight() {
        let f = SegmentFences::new();
        let old = f.admit(0, 100, 1, true).unwrap();
        let e = f.admit(0, 100, 2, true).err().unwrap();
        assert_eq!(e.code, Code::Unavailable, "{e}");
        assert!(e.retryable());
        let e = f.admit(90, 120, 2, false).err().unwrap();
        assert_eq!(e.code, Code::Unavailable, "{e}");
        drop(old);
        let new = f.admit(0, 100, 2, true).unwrap();
        // Now the old holder is out for good.
        assert!(f.admit(0, 100, 1, true).is_err());
        drop(new);
    }

    /// A write admitted under the node's previous registration keeps the
    /// same memory's overlapping ranges out of the next one (whatever its
    /// generations), through a registration in between, until it is done.
    #[test]
    fn writes_of_a_previous_registration_keep_the_same_memory_fenced() {
        let old = SegmentFences::new();
        let w = old.admit(0, 100, 50, true).unwrap();
        old.admit(200, 300, 51, false).unwrap();
        let mid = SegmentFences::after(old.clone());
        let new = SegmentFences::after(mid.clone());
        for f in [&mid, &new] {
            for write in [true, false] {
                // A new registration numbers generations afresh: lower ones.
                let e = f.admit(50, 150, 1, write).err().unwrap();
                assert_eq!(e.code, Code::Unavailable, "{e}");
                assert!(
                    e.retryable() && e.message.contains("previous registration"),
                    "{e}"
                );
            }
        }
        // Other ranges at once, also where the old registration only read.
        drop(new.admit(100, 300, 2, true).unwrap());
        drop(w);
        drop(new.admit(0, 100, 3, true).unwrap());
        assert!(new.before.lock().is_none(), "forgotten once idle");
        // Nothing in flight: nothing kept.
        let w = new.admit(0, 100, 3, true).unwrap();
        assert!(SegmentFences::after(new.clone()).before.lock().is_some());
        drop(w);
        assert!(SegmentFences::after(new.clone()).before.lock().is_none());
    }

    #[test]
    fn freed_ranges_refuse_their_own_generation() {
        let f = SegmentFences::new();
        f.admit(64, 128, 3, false).unwrap();
        f.admit(256, 512, 4, false).unwrap();
        f.freed(0, 200, 3);
        let e = f.admit(64, 128, 3, true).err().unwrap();
        assert_eq!(e.code, Code::PermissionDenied, "{e}");
        // Outside the freed range: untouched.
        f.admit(256, 512, 4, true).unwrap();
        // The range is reused by a newer generation.
        f.admit(0, 200, 9, true).unwrap();
    }

    /// The bytes came one-sided: the node never saw the allocation, and its
    /// free still kills its grants (and older ones), not newer ones.
    #[test]
    fn a_free_kills_grants_of_an_allocation_never_seen() {
        let f = SegmentFences::new();
        f.admit(0, 64, 2, false).unwrap();
        f.freed(0, 8192, 10);
        assert_eq!(f.len(), 1, "one fence for the freed range");
        for (s, e, gen) in [(0, 8192, 10), (4096, 4160, 9), (0, 64, 2)] {
            let err = f.admit(s, e, gen, false).err().unwrap();
            assert_eq!(err.code, Code::PermissionDenied, "{s} {gen}: {err}");
        }
        // The next allocation there is admitted.
        f.admit(0, 4096, 11, true).unwrap();
        // Outside the range: untouched.
        f.admit(8192, 9000, 3, false).unwrap();
    }

    /// Frees the node never saw keep what older fences knew outside them,
    /// and one arriving while an older writer is in flight still kills its
    /// allocation's grants, then and after.
    #[test]
    fn frees_keep_what_older_fences_knew() {
        let f = SegmentFences::new();
        f.admit(0, 64, 1, false).unwrap();
        f.freed(0, 64, 1);
        f.admit(0, 8192, 2, false).unwrap();
        f.freed(0, 8192, 2);
        f.freed(4096, 64, 4);
        for (s, e, gen) in [(0, 64, 1), (0, 8192, 2), (4096, 4160, 4), (4100, 4200, 3)] {
            let err = f.admit(s, e, gen, false).err().unwrap();
            assert_eq!(err.code, Code::PermissionDenied, "[{s}, {e}) {gen}: {err}");
        }
        f.admit(0, 4096, 5, false)
            .expect("a newer allocation is admitted");

        let f = SegmentFences::new();
        let old = f.admit(0, 8192, 1, true).unwrap();
        f.freed(0, 8192, 5);
        let err = f.admit(0, 8192, 5, false).err().unwrap();
        assert_eq!(err.code, Code::PermissionDenied, "{err}");
        drop(old);
        let err = f.admit(0, 8192, 5, false).err().unwrap();
        assert_eq!(err.code, Code::PermissionDenied, "after the writer: {err}");
        f.admit(0, 8192, 6, true)
            .expect("the next allocation is admitted");
    }

    /// A free notice arriving after the range was already reused (the
    /// next put evicted its way in) must not kill the new object.
    #[test]
    fn a_late_free_notice_spares_a_newer_allocation() {
        let f = SegmentFences::new();
        f.admit(0, 128, 5, false).unwrap();
        drop(f.admit(0, 128, 6, true).unwrap());
        f.freed(0, 128, 5);
        f.admit(0, 128, 6, false).expect("generation 6 still lives");
        assert!(f.admit(0, 128, 5, false).is_err());
        // Its own free notice does kill it.
        f.freed(0, 128, 6);
        assert!(f.admit(0, 128, 6, false).is_err());
    }

    #[test]
    fn mismatched_ranges_and_empty_grants_are_refused() {
        let f = SegmentFences::new();
        f.admit(0, 100, 1, false).unwrap();
        assert_eq!(
            f.admit(0, 50, 1, false).err().unwrap().code,
            Code::InvalidArgument
        );
        assert!(f.admit(10, 10, 2, false).is_err());
    }
}
