//! Revocations one-sided readers can check themselves.
//!
//! A node never sees a one-sided (UCX) read, so it cannot refuse one whose
//! range was freed, as its generation fences refuse TCP reads (`fence.rs`).
//! Instead it publishes, in memory registered next to each segment, what a
//! reader needs to tell: a header word holding the stamp of the node's
//! current registration (a random value it picks each time it registers;
//! 0: none), and one word per granule of the segment holding the newest
//! generation freed among the allocations *starting* in that granule. The
//! node writes them when it applies the master's object log, before it
//! acknowledges the entries, so once a forced remove (which waits for that
//! acknowledgement) has returned, every reader that looks sees it.
//!
//! The master puts the stamp in the route it hands out and in the route's
//! fingerprint, which every replica names: a grant of an earlier
//! registration (another master, which may reuse segment ids and knows
//! nothing of the new one's frees) is read with its own route's stamp, and
//! fails.
//!
//! A reader reads its bytes first, then the two words. Its grant still
//! stands when the header holds its route's stamp and its start granule's
//! word is below its generation: an allocation's free writes at least its
//! own generation there, and a newer allocation can overlap it only after
//! it was freed. A range reused before the free notice arrived (an eviction
//! the node has not heard of yet) shows up in the bytes instead, as a
//! checksum mismatch, which is why readers verify one. A failed check is
//! not an error: the reader asks the node over TCP, whose fences decide. It
//! can fail spuriously (a newer allocation starting in the same granule was
//! freed), which only costs that TCP read.

use std::sync::atomic::{AtomicU64, Ordering};
use strata_common::{Code, Error, Result};

/// Bytes of segment per published word: 0.2% of the segment in words.
pub const GRANULE: u64 = 4096;

/// The published words of one segment: a private anonymous mapping, so
/// registering it exposes whole pages of its own and nothing else of the
/// heap, and its zero pages cost nothing until written.
pub struct FenceWords {
    ptr: *mut AtomicU64,
    words: usize,
    bytes: usize,
}

// SAFETY: the mapping is owned by this value and only accessed through
// atomics.
unsafe impl Send for FenceWords {}
unsafe impl Sync for FenceWords {}

impl FenceWords {
    /// Words for a segment of `len` bytes: the header and one per granule.
    pub fn new(len: u64) -> Result<FenceWords> {
        let words = 1 + len.div_ceil(GRANULE) as usize;
        let bytes = (words * 8).next_multiple_of(4096);
        // SAFETY: an anonymous private mapping the kernel places; no file
        // or existing memory involved.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(Error::new(
                Code::NoSpace,
                format!(
                    "cannot map {bytes} bytes of revocation words: {}",
                    std::io::Error::last_os_error()
                ),
            ));
        }
        Ok(FenceWords {
            ptr: ptr.cast(),
            words,
            bytes,
        })
    }

    fn word(&self, i: usize) -> Option<&AtomicU64> {
        // SAFETY: in bounds of the mapping (page-aligned, zeroed, so every
        // word is a valid AtomicU64), which lives as long as `self`.
        (i < self.words).then(|| unsafe { &*self.ptr.add(i) })
    }

    /// Publishes the stamp of the registration the node now serves under
    /// (0: none; every route with another stamp fails the check).
    pub fn serve(&self, stamp: u64) {
        if let Some(w) = self.word(0) {
            w.store(stamp, Ordering::Release);
        }
    }

    /// The allocation of `generation` starting at `start` was freed.
    pub fn freed(&self, start: u64, generation: u64) {
        if let Some(w) = self.word(word_index(start)) {
            w.fetch_max(generation, Ordering::AcqRel);
        }
    }

    /// The first word, for registering them with a network stack.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.cast()
    }

    /// Bytes mapped (whole pages).
    pub fn byte_len(&self) -> usize {
        self.bytes
    }

    /// What a reader of an allocation starting at `start` would read: the
    /// header and its word (past the end: revoked).
    pub fn read(&self, start: u64) -> (u64, u64) {
        let word = self
            .word(word_index(start))
            .map_or(u64::MAX, |w| w.load(Ordering::Acquire));
        (self.word(0).map_or(0, |w| w.load(Ordering::Acquire)), word)
    }
}

impl Drop for FenceWords {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping made in `new`.
        unsafe { libc::munmap(self.ptr.cast(), self.bytes) };
    }
}

fn word_index(start: u64) -> usize {
    usize::try_from(1 + start / GRANULE).unwrap_or(usize::MAX)
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

/// Granules a route may name: powers of two in this range.
pub const MIN_GRANULE: u64 = 64;
pub const MAX_GRANULE: u64 = 1 << 30;

/// Whether words published at `base`, one per `granule` of a segment of
/// `size` bytes, are a layout a reader can use: a granule as above, a
/// non-null base, and words that end inside the address space.
pub fn layout_ok(size: u64, base: u64, granule: u64) -> bool {
    granule.is_power_of_two()
        && (MIN_GRANULE..=MAX_GRANULE).contains(&granule)
        && base != 0
        && base.checked_add(words_len(size, granule)).is_some()
}

/// Whether a grant of `generation`, read through a route of `stamp`, still
/// stands, given the header and start-granule word read after the bytes.
pub fn stands(header: u64, word: u64, stamp: u64, generation: u64) -> bool {
    header == stamp && stamp != 0 && word < generation
}

/// A registration stamp: random, never 0.
pub fn new_stamp() -> u64 {
    rand::random::<u64>().max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_freed_allocation_fails_and_its_neighbours_do_not() {
        let f = FenceWords::new(1 << 20).unwrap();
        assert_eq!(f.byte_len(), 4096, "257 words, one page");
        assert_eq!(words_len(1 << 20, GRANULE), 8 * 257);
        assert_eq!(f.as_ptr() as usize % 4096, 0, "page-aligned");
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
        // Served under another registration: old routes fail.
        f.serve(8);
        assert!(!check(0, 5));
        assert!(stands(8, 0, 8, 1));
        assert!(!stands(0, 0, 0, 1), "no stamp never stands");
        // The last granule's word exists; a start past the end reads as
        // revoked.
        f.freed((1 << 20) - 64, 9);
        assert_eq!(f.read((1 << 20) - 64).1, 9);
        assert_eq!(f.read(1 << 20).1, u64::MAX);
        assert_eq!(f.read(1 << 40).1, u64::MAX);
        assert_eq!(word_offset(8192, GRANULE), 8 * 3);
        assert!(layout_ok(1 << 20, 0x9000, GRANULE));
        assert!(!layout_ok(1 << 20, 0x9000, 4095) && !layout_ok(1 << 20, 0, GRANULE));
        assert!(!layout_ok(1 << 20, u64::MAX - 8 * 257 + 1, GRANULE));
        assert!(layout_ok(1 << 20, u64::MAX - 8 * 257, GRANULE));
        assert_ne!(new_stamp(), 0);
    }
}
