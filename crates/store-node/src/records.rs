//! The node's own record of the committed objects it holds, kept from the
//! master's object log. A new master leader rebuilds its metadata from this.

use parking_lot::Mutex;
use std::collections::HashMap;
use strata_proto::{object_log_entry::Op, CommittedObject, ObjectLogEntry};

#[derive(Default)]
pub struct ObjectRecords {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    applied_seq: u64,
    /// (segment id, offset) → committed object.
    by_range: HashMap<(u64, u64), CommittedObject>,
    /// Sum of their lengths, kept as they change (read every heartbeat,
    /// which follows every commit).
    bytes: u64,
}

impl ObjectRecords {
    /// Applies log entries in order; entries at or below the applied sequence
    /// (re-sent after a lost response) are skipped.
    pub fn apply(&self, entries: &[ObjectLogEntry]) -> u64 {
        let mut g = self.inner.lock();
        for e in entries {
            if e.seq <= g.applied_seq {
                continue;
            }
            match &e.op {
                Some(Op::Commit(c)) => {
                    g.bytes += c.length;
                    if let Some(old) = g.by_range.insert((c.segment_id, c.offset), c.clone()) {
                        g.bytes -= old.length;
                    }
                }
                Some(Op::Free(f)) => {
                    if let Some(old) = g.by_range.remove(&(f.segment_id, f.offset)) {
                        g.bytes -= old.length;
                    }
                }
                None => {}
            }
            g.applied_seq = e.seq;
        }
        g.applied_seq
    }

    pub fn applied_seq(&self) -> u64 {
        self.inner.lock().applied_seq
    }

    pub fn len(&self) -> usize {
        self.inner.lock().by_range.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn bytes(&self) -> u64 {
        self.inner.lock().bytes
    }

    pub fn snapshot(&self) -> Vec<CommittedObject> {
        let mut v: Vec<_> = self.inner.lock().by_range.values().cloned().collect();
        v.sort_by(|a, b| a.key.cmp(&b.key));
        v
    }

    /// A new registration starts from nothing.
    pub fn reset(&self) {
        let mut g = self.inner.lock();
        g.applied_seq = 0;
        g.by_range.clear();
        g.bytes = 0;
    }
}
