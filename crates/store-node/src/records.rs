//! The node's own record of the committed objects it holds, kept from the
//! master's object log. A new master leader rebuilds its metadata from this.
//! It also keeps the puts the master announced (their client declared the
//! checksum at PutStart): the master acknowledges such a put once the node
//! holds its announcement, so the node reports it as committed to a
//! rebuilding master if, and only if, the bytes it holds match.

use parking_lot::Mutex;
use std::collections::HashMap;
use strata_proto::{object_log_entry::Op, CommittedObject, ObjectLogEntry};

/// Where a page of records ends (`ObjectRecords::page`): their order is
/// by key, then by where the record is (one key may have two versions).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cursor {
    pub key: String,
    pub segment_id: u64,
    pub offset: u64,
}

impl Cursor {
    pub fn of(c: &CommittedObject) -> Cursor {
        Cursor {
            key: c.key.clone(),
            segment_id: c.segment_id,
            offset: c.offset,
        }
    }

    /// `SEGMENT:OFFSET:KEY`, as the admin view hands it out in `next`.
    pub fn parse(s: &str) -> Option<Cursor> {
        let mut it = s.splitn(3, ':');
        Some(Cursor {
            segment_id: it.next()?.parse().ok()?,
            offset: it.next()?.parse().ok()?,
            key: it.next()?.to_string(),
        })
    }
}

impl std::fmt::Display for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}:{}", self.segment_id, self.offset, self.key)
    }
}

#[derive(Default)]
pub struct ObjectRecords {
    inner: Mutex<Inner>,
}

/// Records by (segment id, offset). Boxed: a node holds millions, and
/// growing the table moves every entry (a record is ~200 bytes, its box 8).
type ByRange = HashMap<(u64, u64), Box<CommittedObject>>;

#[derive(Default)]
struct Inner {
    applied_seq: u64,
    /// Committed objects.
    by_range: ByRange,
    /// Announced puts, until their commit or free.
    pending: ByRange,
    /// Sum of their lengths, kept as they change (read every heartbeat,
    /// which follows every commit).
    bytes: u64,
}

/// Removes the record at `at` if it is of the allocation of `generation`
/// or an older one: a late commit or free of an older allocation never ends
/// a newer one placed at the same offset.
fn end_at(records: &mut ByRange, at: (u64, u64), generation: u64) -> Option<Box<CommittedObject>> {
    match records.get(&at) {
        Some(r) if r.generation <= generation => records.remove(&at),
        _ => None,
    }
}

/// Copies of the records, in key order.
fn by_key(records: &ByRange) -> Vec<CommittedObject> {
    let mut v: Vec<_> = records.values().map(|c| (**c).clone()).collect();
    v.sort_by(|a, b| a.key.cmp(&b.key));
    v
}

impl ObjectRecords {
    /// Applies log entries in order; entries at or below the applied sequence
    /// (re-sent after a lost response) are skipped.
    pub fn apply(&self, entries: impl IntoIterator<Item = ObjectLogEntry>) -> u64 {
        self.apply_freeing(entries, |_| {})
    }

    /// [`ObjectRecords::apply`], calling `freed` for each free before it
    /// ends the records of its range, under this records' lock: a put
    /// recorded from its write checks its allocation's fence under the same
    /// lock (`record_put`), so it is kept either before the free (which
    /// then ends it) or not at all.
    /// The entries are moved in, not copied (a heartbeat brings up to
    /// 32,768).
    pub fn apply_freeing(
        &self,
        entries: impl IntoIterator<Item = ObjectLogEntry>,
        freed: impl Fn(&strata_proto::FreedRange),
    ) -> u64 {
        let mut g = self.inner.lock();
        for e in entries {
            if e.seq <= g.applied_seq {
                continue;
            }
            match e.op {
                Some(Op::Pending(p)) => {
                    g.pending.insert((p.segment_id, p.offset), Box::new(p));
                }
                Some(Op::Commit(c)) => {
                    let at = (c.segment_id, c.offset);
                    end_at(&mut g.pending, at, c.generation);
                    g.bytes += c.length;
                    if let Some(old) = g.by_range.insert(at, Box::new(c)) {
                        g.bytes -= old.length;
                    }
                }
                Some(Op::Free(f)) => {
                    freed(&f);
                    let at = (f.segment_id, f.offset);
                    end_at(&mut g.pending, at, f.generation);
                    if let Some(old) = end_at(&mut g.by_range, at, f.generation) {
                        g.bytes -= old.length;
                    }
                }
                None => {}
            }
            g.applied_seq = e.seq;
        }
        g.applied_seq
    }

    /// Keeps a put its client's write carried (a record the master signed),
    /// as an announcement would have: unless `live` says its allocation was
    /// freed meanwhile, or a commit of it (or of a newer allocation there)
    /// is in already. `live` runs under this records' lock, under which a
    /// free ends the allocation's fence (`apply_freeing`): so a put
    /// recorded after its free is impossible (see `receipts::NodeRegion`).
    pub fn record_put(&self, p: CommittedObject, live: impl FnOnce() -> bool) -> bool {
        let mut g = self.inner.lock();
        let at = (p.segment_id, p.offset);
        let committed = g
            .by_range
            .get(&at)
            .is_some_and(|c| c.generation >= p.generation);
        if committed || !live() {
            return false;
        }
        g.pending.insert(at, Box::new(p));
        true
    }

    pub fn applied_seq(&self) -> u64 {
        self.inner.lock().applied_seq
    }

    pub fn len(&self) -> usize {
        self.inner.lock().by_range.len()
    }

    pub fn pending_len(&self) -> usize {
        self.inner.lock().pending.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn bytes(&self) -> u64 {
        self.inner.lock().bytes
    }

    pub fn snapshot(&self) -> Vec<CommittedObject> {
        by_key(&self.inner.lock().by_range)
    }

    /// Up to `limit` committed objects (announced puts, with `pending`)
    /// after `after` in (key, segment, offset) order, and whether more
    /// follow: what a page of the admin view holds, in memory bounded by
    /// `limit` rather than by the node's table.
    pub fn page(
        &self,
        pending: bool,
        after: Option<&Cursor>,
        limit: usize,
    ) -> (Vec<CommittedObject>, bool) {
        let g = self.inner.lock();
        let map = if pending { &g.pending } else { &g.by_range };
        let mut heap: std::collections::BinaryHeap<Cursor> = std::collections::BinaryHeap::new();
        for c in map.values() {
            let at = Cursor::of(c);
            if after.is_some_and(|a| at <= *a) {
                continue;
            }
            // Keeps the `limit + 1` smallest: one more says a page follows.
            if heap.len() <= limit {
                heap.push(at);
            } else if heap.peek().is_some_and(|top| at < *top) {
                heap.pop();
                heap.push(at);
            }
        }
        let more = heap.len() > limit;
        let mut keep = heap.into_sorted_vec();
        keep.truncate(limit);
        let page = keep
            .iter()
            .filter_map(|c| map.get(&(c.segment_id, c.offset)).map(|c| (**c).clone()))
            .collect();
        (page, more)
    }

    /// Announced puts not yet committed or freed; a rebuilding master gets
    /// those whose bytes match (`verified_pending`).
    pub fn pending(&self) -> Vec<CommittedObject> {
        by_key(&self.inner.lock().pending)
    }

    /// Of the announced puts, those whose bytes (`bytes_of`, None when the
    /// range is not ours) match the declared checksum: their writes ended,
    /// so their PutEnd may have been acknowledged. Runs over the bytes: call
    /// it off the async runtime.
    pub fn complete_puts<'a>(
        pending: Vec<CommittedObject>,
        bytes_of: impl Fn(&CommittedObject) -> Option<&'a [u8]>,
    ) -> Vec<CommittedObject> {
        pending
            .into_iter()
            .filter(|p| bytes_of(p).is_some_and(|b| crc32c::crc32c(b) == p.crc32c))
            .collect()
    }

    /// A new registration starts from nothing.
    pub fn reset(&self) {
        let mut g = self.inner.lock();
        g.applied_seq = 0;
        g.by_range.clear();
        g.pending.clear();
        g.bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(key: &str, offset: u64, length: u64, crc32c: u32) -> CommittedObject {
        CommittedObject {
            key: key.into(),
            segment_id: 1,
            offset,
            length,
            crc32c,
            generation: 7,
            ..Default::default()
        }
    }

    fn entry(seq: u64, op: Op) -> ObjectLogEntry {
        ObjectLogEntry { seq, op: Some(op) }
    }

    #[test]
    fn announced_puts_end_with_their_commit_or_free() {
        let r = ObjectRecords::default();
        r.apply([
            entry(1, Op::Pending(obj("a", 0, 10, 1))),
            entry(2, Op::Pending(obj("b", 64, 10, 2))),
        ]);
        assert_eq!(r.pending_len(), 2);
        assert!(r.is_empty(), "announced puts are not committed objects");
        assert_eq!(r.bytes(), 0);
        r.apply([
            entry(3, Op::Commit(obj("a", 0, 10, 1))),
            entry(
                4,
                Op::Free(strata_proto::FreedRange {
                    segment_id: 1,
                    offset: 64,
                    length: 64,
                    generation: 7,
                }),
            ),
        ]);
        assert_eq!(r.pending_len(), 0);
        assert_eq!(r.len(), 1);
        assert_eq!(r.bytes(), 10);
        // Re-sent entries are skipped: no announcement comes back.
        r.apply([entry(2, Op::Pending(obj("b", 64, 10, 2)))]);
        assert_eq!(r.pending_len(), 0);
        r.apply([entry(5, Op::Pending(obj("c", 128, 10, 3)))]);
        r.reset();
        assert_eq!(r.pending_len(), 0);
    }

    /// A put recorded from its write is kept as an announced one (its
    /// commit or free ends it), unless its allocation is no longer live or
    /// a commit of it (or of a newer allocation) is in already.
    #[test]
    fn puts_recorded_from_writes_are_kept_only_while_live() {
        let r = ObjectRecords::default();
        let put = |key: &str, generation| CommittedObject {
            generation,
            ..obj(key, 64, 10, 1)
        };
        assert!(!r.record_put(put("dead", 7), || false));
        assert_eq!(r.pending_len(), 0);
        assert!(r.record_put(put("a", 7), || true));
        assert_eq!(r.pending(), [put("a", 7)]);
        r.apply([entry(1, Op::Commit(put("a", 7)))]);
        assert_eq!((r.pending_len(), r.len()), (0, 1), "its commit ends it");
        // A commit of this allocation, or a newer one, is in: not again.
        assert!(!r.record_put(put("a", 7), || true));
        assert!(!r.record_put(put("old", 6), || true));
        assert_eq!(r.pending_len(), 0);
        assert!(r.record_put(put("new", 8), || true));
        r.apply([entry(
            2,
            Op::Free(strata_proto::FreedRange {
                segment_id: 1,
                offset: 64,
                length: 10,
                generation: 8,
            }),
        )]);
        assert_eq!((r.pending_len(), r.len()), (0, 0), "its free ends it");
    }

    /// A free or commit of an older allocation at the same offset (an entry
    /// that was late) leaves a newer announcement and a newer commit alone.
    #[test]
    fn older_entries_leave_newer_allocations_alone() {
        let r = ObjectRecords::default();
        let at = |generation, op: fn(CommittedObject) -> Op| {
            op(CommittedObject {
                generation,
                ..obj("k", 0, 10, 1)
            })
        };
        let free = |generation| {
            Op::Free(strata_proto::FreedRange {
                segment_id: 1,
                offset: 0,
                length: 64,
                generation,
            })
        };
        r.apply([entry(1, at(8, Op::Pending)), entry(2, free(7))]);
        assert_eq!(
            r.pending_len(),
            1,
            "an older free ended a newer announcement"
        );
        r.apply([entry(3, at(7, Op::Commit))]);
        assert_eq!(
            r.pending_len(),
            1,
            "an older commit ended a newer announcement"
        );
        r.apply([entry(4, free(7))]);
        assert_eq!(r.len(), 0, "the older commit is freed by its own free");
        r.apply([entry(5, at(8, Op::Commit)), entry(6, free(7))]);
        assert_eq!((r.len(), r.pending_len()), (1, 0), "{:?}", r.snapshot());
        assert_eq!(r.bytes(), 10);
        // The allocation's own free ends it (both sides of the check).
        r.apply([entry(7, free(8))]);
        assert_eq!((r.len(), r.bytes()), (0, 0));
        r.apply([entry(8, at(9, Op::Pending)), entry(9, free(9))]);
        assert_eq!(r.pending_len(), 0);
    }

    #[test]
    fn only_puts_whose_bytes_match_are_complete() {
        let bytes = [5u8; 100];
        let crc = crc32c::crc32c(&bytes[..40]);
        let pending = vec![
            obj("whole", 0, 40, crc),
            // One byte short of the checksummed bytes.
            obj("short", 0, 39, crc),
            // The same length, another checksum (bytes not written).
            obj("other", 0, 40, crc ^ 1),
            // A range the node cannot find.
            obj("elsewhere", 90, 40, crc),
        ];
        let done = ObjectRecords::complete_puts(pending, |p| {
            bytes.get(p.offset as usize..(p.offset + p.length) as usize)
        });
        let keys: Vec<&str> = done.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(keys, ["whole"]);
    }
}
