//! Revocations one-sided readers can check themselves.
//!
//! A node never sees a one-sided (UCX) read, so it cannot refuse one whose
//! range was freed, as its generation fences refuse TCP reads (`fence.rs`).
//! Instead it publishes, in memory registered next to each segment, what a
//! reader needs to tell: a header word holding the segment id it serves now
//! (0: none), and one word per granule of the segment holding the newest
//! generation freed among the allocations *starting* in that granule. The
//! node writes them when it applies the master's object log, before it
//! acknowledges the entries, so once a forced remove (which waits for that
//! acknowledgement) has returned, every reader that looks sees it.
//!
//! A reader reads its bytes first, then the two words. Its grant still
//! stands when the header names its segment and its start granule's word is
//! below its generation: an allocation's free writes at least its own
//! generation there, and a newer allocation can overlap it only after it
//! was freed. A range reused before the free notice arrived (an eviction
//! the node has not heard of yet) shows up in the bytes instead, as a
//! checksum mismatch, which is why readers verify one. A failed check is
//! not an error: the reader asks the node over TCP, whose fences decide. It
//! can fail spuriously (a newer allocation starting in the same granule was
//! freed), which only costs that TCP read.

use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes of segment per published word: 0.2% of the segment in words.
pub const GRANULE: u64 = 4096;

/// The published words of one segment (the memory UCX registers).
pub struct FenceWords {
    words: Box<[AtomicU64]>,
}

impl FenceWords {
    /// Words for a segment of `len` bytes: the header and one per granule.
    pub fn new(len: u64) -> FenceWords {
        let n = 1 + len.div_ceil(GRANULE) as usize;
        FenceWords {
            words: (0..n).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Publishes the segment id the node now serves the segment as (0:
    /// none; every grant naming another id fails the check).
    pub fn serve(&self, segment_id: u64) {
        self.words[0].store(segment_id, Ordering::Release);
    }

    /// The allocation of `generation` starting at `start` was freed.
    pub fn freed(&self, start: u64, generation: u64) {
        if let Some(w) = self.words.get(word_index(start)) {
            w.fetch_max(generation, Ordering::AcqRel);
        }
    }

    /// The first word, for registering them with a network stack.
    pub fn as_ptr(&self) -> *mut u8 {
        self.words.as_ptr() as *mut u8
    }

    /// Bytes of words.
    pub fn byte_len(&self) -> usize {
        self.words.len() * 8
    }

    /// What a reader of `[start, …)` of `segment_id` would read.
    pub fn read(&self, start: u64) -> (u64, u64) {
        let word = self
            .words
            .get(word_index(start))
            .map_or(u64::MAX, |w| w.load(Ordering::Acquire));
        (self.words[0].load(Ordering::Acquire), word)
    }
}

fn word_index(start: u64) -> usize {
    1 + (start / GRANULE) as usize
}

/// Offset in the published words of the word a reader of an allocation
/// starting at `start` checks (the header is at offset 0).
pub fn word_offset(start: u64, granule: u64) -> u64 {
    8 * (1 + start / granule)
}

/// Bytes of words published for a segment of `size` bytes.
pub fn words_len(size: u64, granule: u64) -> u64 {
    8 * (1 + size.div_ceil(granule))
}

/// Whether a grant of `generation` for an allocation of `segment_id` still
/// stands, given the header and start-granule word read after the bytes.
pub fn stands(header: u64, word: u64, segment_id: u64, generation: u64) -> bool {
    header == segment_id && segment_id != 0 && word < generation
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_freed_allocation_fails_and_its_neighbours_do_not() {
        let f = FenceWords::new(1 << 20);
        assert_eq!(f.byte_len(), 8 * (1 + 256));
        assert_eq!(words_len(1 << 20, GRANULE), f.byte_len() as u64);
        let check = |start: u64, generation: u64| {
            let (h, w) = f.read(start);
            stands(h, w, 7, generation)
        };
        // Not served yet: nothing stands.
        assert!(!check(0, 5));
        f.serve(7);
        assert!(check(0, 5) && check(8192, 5));
        f.freed(8192, 5);
        // Both sides: the freed generation, and one just newer.
        assert!(!check(8192, 5));
        assert!(check(8192, 6));
        // An older allocation freed late does not lower the word.
        f.freed(8192, 3);
        assert!(!check(8192, 5));
        // Another granule is untouched; one starting in the same granule
        // after the free's start fails too (spuriously, if it is older).
        assert!(check(0, 5));
        assert!(!check(8192 + 64, 4));
        // Served under another id (registered again): old grants fail.
        f.serve(8);
        assert!(!check(0, 5));
        assert!(stands(8, 0, 8, 1));
        // A start past the end reads as revoked.
        assert_eq!(f.read(1 << 30).1, u64::MAX);
        assert_eq!(word_offset(8192, GRANULE), 8 * 3);
    }
}
