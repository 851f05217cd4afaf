//! Puts in flight: the ids PutStart hands out and the deadlines by which
//! their PutEnd must come, so that a put never ended is reclaimed after
//! `--put-timeout` (`Master::reclaim_expired_puts`). The put, commit and
//! revoke bodies are still `Master` methods (master.rs); REDESIGN.md moves
//! them here next.

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// The puts this term started and has not seen end.
pub(crate) struct Writes {
    next_put_id: AtomicU64,
    /// In-flight puts in deadline order (the timeout is constant, so FIFO):
    /// (deadline, key, put id). A leaf lock.
    pending: Mutex<VecDeque<(Instant, String, u64)>>,
}

impl Writes {
    pub(crate) fn new() -> Writes {
        Writes {
            next_put_id: AtomicU64::new(1),
            pending: Mutex::new(VecDeque::new()),
        }
    }

    /// The id of a new put.
    pub(crate) fn next_id(&self) -> u64 {
        self.next_put_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Watches the put `put_id` of `key` until `deadline`.
    pub(crate) fn track(&self, deadline: Instant, key: String, put_id: u64) {
        self.pending.lock().push_back((deadline, key, put_id));
    }

    /// The oldest watched put whose deadline is `now` or earlier, taken
    /// off the watch (it may have ended meanwhile: the caller checks).
    pub(crate) fn next_expired(&self, now: Instant) -> Option<(String, u64)> {
        let mut q = self.pending.lock();
        match q.front() {
            Some((d, _, _)) if *d <= now => q.pop_front().map(|(_, k, id)| (k, id)),
            _ => None,
        }
    }
}
