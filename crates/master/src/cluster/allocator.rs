//! Space allocation inside one mounted segment: a best-fit offset allocator
//! over free ranges kept both by offset (to coalesce on free) and by size (to
//! find the smallest range that fits).

use std::collections::{BTreeMap, BTreeSet};

/// Allocations are rounded up to this many bytes, which keeps tiny leftover
/// fragments out of the free lists.
pub const ALIGN: u64 = 64;

#[derive(Debug)]
pub struct RangeAllocator {
    capacity: u64,
    by_offset: BTreeMap<u64, u64>,
    by_size: BTreeSet<(u64, u64)>,
    allocated: u64,
}

pub fn aligned_len(size: u64) -> Option<u64> {
    size.checked_add(ALIGN - 1).map(|v| v / ALIGN * ALIGN)
}

impl RangeAllocator {
    pub fn new(capacity: u64) -> Self {
        let capacity = capacity / ALIGN * ALIGN;
        let mut a = RangeAllocator {
            capacity,
            by_offset: BTreeMap::new(),
            by_size: BTreeSet::new(),
            allocated: 0,
        };
        if capacity > 0 {
            a.insert_free(0, capacity);
        }
        a
    }

    fn insert_free(&mut self, off: u64, len: u64) {
        self.by_offset.insert(off, len);
        self.by_size.insert((len, off));
    }

    fn remove_free(&mut self, off: u64, len: u64) {
        self.by_offset.remove(&off);
        self.by_size.remove(&(len, off));
    }

    /// Allocates `size` bytes; returns `(offset, allocated_len)`.
    pub fn alloc(&mut self, size: u64) -> Option<(u64, u64)> {
        if size == 0 {
            return None;
        }
        let len = aligned_len(size)?;
        let &(flen, off) = self.by_size.range((len, 0)..).next()?;
        self.remove_free(off, flen);
        if flen > len {
            self.insert_free(off + len, flen - len);
        }
        self.allocated += len;
        Some((off, len))
    }

    /// Allocates exactly `[off, off + len)` (a range a store node reports it
    /// still holds). False when any of it is not free or it is misaligned.
    pub fn alloc_at(&mut self, off: u64, len: u64) -> bool {
        let Some(end) = off.checked_add(len) else {
            return false;
        };
        if len == 0 || !off.is_multiple_of(ALIGN) || !len.is_multiple_of(ALIGN) {
            return false;
        }
        let Some((fo, fl)) = self
            .by_offset
            .range(..=off)
            .next_back()
            .map(|(&o, &l)| (o, l))
        else {
            return false;
        };
        if fo + fl < end {
            return false;
        }
        self.remove_free(fo, fl);
        if fo < off {
            self.insert_free(fo, off - fo);
        }
        if end < fo + fl {
            self.insert_free(end, fo + fl - end);
        }
        self.allocated += len;
        true
    }

    /// Returns a range to the free lists, merging neighbours. Refuses (and
    /// returns false) a range that is out of bounds or already free, so a
    /// double free cannot corrupt the lists.
    pub fn free(&mut self, off: u64, len: u64) -> bool {
        let Some(end) = off.checked_add(len) else {
            return false;
        };
        if len == 0
            || end > self.capacity
            || !off.is_multiple_of(ALIGN)
            || !len.is_multiple_of(ALIGN)
        {
            return false;
        }
        let prev = self
            .by_offset
            .range(..=off)
            .next_back()
            .map(|(&o, &l)| (o, l));
        let next = self.by_offset.range(off..).next().map(|(&o, &l)| (o, l));
        if prev.is_some_and(|(po, pl)| po + pl > off) || next.is_some_and(|(no, _)| no < end) {
            return false;
        }
        let (mut start, mut total) = (off, len);
        if let Some((po, pl)) = prev {
            if po + pl == off {
                self.remove_free(po, pl);
                start = po;
                total += pl;
            }
        }
        if let Some((no, nl)) = next {
            if no == end {
                self.remove_free(no, nl);
                total += nl;
            }
        }
        self.insert_free(start, total);
        self.allocated -= len;
        true
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }
    pub fn allocated(&self) -> u64 {
        self.allocated
    }
    pub fn free_bytes(&self) -> u64 {
        self.capacity - self.allocated
    }
    pub fn largest_free(&self) -> u64 {
        self.by_size.iter().next_back().map_or(0, |&(l, _)| l)
    }
    /// 0 when all free space is one range, towards 1 as it splinters.
    pub fn fragmentation(&self) -> f64 {
        let free = self.free_bytes();
        if free == 0 {
            0.0
        } else {
            1.0 - self.largest_free() as f64 / free as f64
        }
    }
    pub fn free_ranges(&self) -> usize {
        self.by_offset.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn alloc_at_takes_exactly_a_free_range() {
        let mut a = RangeAllocator::new(1024);
        assert!(a.alloc_at(128, 64));
        assert!(!a.alloc_at(128, 64), "taken");
        assert!(!a.alloc_at(64, 128), "overlaps the taken range");
        assert!(!a.alloc_at(192, 63), "misaligned");
        assert!(!a.alloc_at(960, 128), "past the end");
        assert!(a.alloc_at(960, 64), "the last range");
        assert_eq!(a.allocated(), 128);
        assert!(a.free(128, 64) && a.free(960, 64));
        assert_eq!((a.allocated(), a.free_ranges()), (0, 1), "coalesced again");
    }

    #[test]
    fn reuse_and_coalesce() {
        let mut a = RangeAllocator::new(1024);
        let x = a.alloc(100).unwrap();
        let y = a.alloc(100).unwrap();
        assert_eq!(x, (0, 128));
        assert_eq!(y, (128, 128));
        assert!(a.free(x.0, x.1));
        assert!(!a.free(x.0, x.1), "double free refused");
        assert_eq!(a.alloc(64), Some((0, 64)));
        assert!(a.free(0, 64));
        assert!(a.free(y.0, y.1));
        assert_eq!(a.free_ranges(), 1);
        assert_eq!(a.largest_free(), 1024);
        assert_eq!(a.alloc(2048), None);
        assert_eq!(a.alloc(0), None);
        assert!(!a.free(2048, 64));
        assert!(!a.free(u64::MAX - 10, 64));
    }

    /// Fragmentation after a churn of mixed sizes stays measurable and bounded:
    /// once everything is freed the space is one range again.
    #[test]
    fn fragmentation_measured() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let cap = 64 << 20;
        let mut a = RangeAllocator::new(cap);
        let mut live: Vec<(u64, u64)> = Vec::new();
        for _ in 0..20_000 {
            if rng.gen_bool(0.55) {
                let size = [4 << 10, 64 << 10, 1 << 20][rng.gen_range(0..3)];
                if let Some(r) = a.alloc(size) {
                    live.push(r);
                }
            } else if !live.is_empty() {
                let i = rng.gen_range(0..live.len());
                let (o, l) = live.swap_remove(i);
                assert!(a.free(o, l));
            }
        }
        let frag = a.fragmentation();
        let used = a.allocated() as f64 / cap as f64;
        println!(
            "after churn: used {used:.2}, fragmentation {frag:.3}, free ranges {}",
            a.free_ranges()
        );
        assert!((0.0..1.0).contains(&frag));
        for (o, l) in live.drain(..) {
            assert!(a.free(o, l));
        }
        assert_eq!(a.fragmentation(), 0.0);
        assert_eq!(a.largest_free(), cap);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Alloc(u64),
        Free(usize),
    }

    proptest! {
        #[test]
        fn random_alloc_free_never_overlaps(ops in proptest::collection::vec(
            prop_oneof![(1u64..5000).prop_map(Op::Alloc), (0usize..64).prop_map(Op::Free)], 1..300)) {
            let cap = 64 * 1024;
            let mut a = RangeAllocator::new(cap);
            let mut live: Vec<(u64, u64)> = Vec::new();
            for op in ops {
                match op {
                    Op::Alloc(s) => {
                        if let Some((o, l)) = a.alloc(s) {
                            prop_assert!(l >= s && o + l <= cap);
                            for &(lo, ll) in &live {
                                prop_assert!(o + l <= lo || lo + ll <= o, "overlap");
                            }
                            live.push((o, l));
                        }
                    }
                    Op::Free(i) if !live.is_empty() => {
                        let (o, l) = live.swap_remove(i % live.len());
                        prop_assert!(a.free(o, l));
                    }
                    Op::Free(_) => {}
                }
                let used: u64 = live.iter().map(|r| r.1).sum();
                prop_assert_eq!(a.allocated(), used);
            }
            for (o, l) in live { prop_assert!(a.free(o, l)); }
            prop_assert_eq!(a.allocated(), 0);
            prop_assert_eq!(a.largest_free(), cap);
        }
    }
}
