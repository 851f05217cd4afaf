//! Versions an overwrite replaced (`overwrite/`), kept until the read
//! leases on them end (their readers' ends, or the TTL), then freed by
//! housekeeping.
//!
//! Indexed by key (a reader's end, a copier's unpin) and by when each is
//! due (housekeeping, a put waiting for room), with their DRAM bytes kept
//! as a running sum: no call scans every replaced version, however many
//! an overwrite-heavy load keeps at once.

use super::Object;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};

/// Replaced versions waiting for their readers. A leaf lock: nothing else
/// is taken under it.
#[derive(Default)]
pub struct Retired {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// The versions of each key (a few at most: one per overwrite whose
    /// readers are still reading).
    by_key: HashMap<Box<str>, Vec<Version>>,
    /// (due, id) → key: what is due first.
    due: BTreeMap<(u64, u64), Box<str>>,
    /// DRAM bytes of every version kept.
    bytes: u64,
    next_id: u64,
}

struct Version {
    id: u64,
    /// Free no earlier than (unix ms).
    until: u64,
    /// Its replicas' DRAM (fixed: a kept version's replicas never change).
    bytes: u64,
    object: Object,
}

impl Inner {
    /// Moves version `id` of `key` (due at `from`) to `to` in the due index.
    fn reschedule(&mut self, key: &str, id: u64, from: u64, to: u64) {
        if from != to {
            self.due.remove(&(from, id));
            self.due.insert((to, id), key.into());
        }
    }
}

impl Retired {
    /// Keeps `o`, the version of `key` an overwrite replaced, until
    /// `until_ms`; returns the DRAM bytes now kept.
    pub fn keep(&self, until_ms: u64, key: &str, o: Object) -> u64 {
        let mut g = self.inner.lock();
        let id = g.next_id;
        g.next_id += 1;
        let bytes = o.replicas().iter().map(|r| r.alloc_len).sum::<u64>();
        g.bytes += bytes;
        g.due.insert((until_ms, id), key.into());
        g.by_key.entry(key.into()).or_default().push(Version {
            id,
            until: until_ms,
            bytes,
            object: o,
        });
        g.bytes
    }

    /// One reader of `key`'s replaced version `generation` is done
    /// (`ReportReads.ended`): with the last one, and no copier holding
    /// it, it is due at once. False when no such lease was running.
    pub fn end_lease(&self, key: &str, generation: u64, now_ms: u64) -> bool {
        if generation == 0 {
            return false;
        }
        let mut g = self.inner.lock();
        let Some(r) = g
            .by_key
            .get_mut(key)
            .and_then(|vs| vs.iter_mut().find(|r| r.object.is_version(generation)))
        else {
            return false;
        };
        let ended = r.object.end_lease(now_ms);
        let (id, from) = (r.id, r.until);
        if ended && !r.object.leased(now_ms) && r.object.pins == 0 {
            r.until = r.until.min(now_ms);
        }
        let to = r.until;
        g.reschedule(key, id, from, to);
        ended
    }

    /// An offload task copying `key` reported (or ran out): the versions
    /// of it replaced meanwhile hold one copier fewer, and with none left
    /// wait only for their readers. (Tasks unpin by key, so this may let
    /// a version go while another task still reads it: that read is then
    /// refused by the node or fails its checksum, and the copy is refused
    /// as another version's anyway.)
    pub fn unpin(&self, key: &str, now_ms: u64) {
        let mut g = self.inner.lock();
        let mut moved = Vec::new();
        if let Some(vs) = g.by_key.get_mut(key) {
            for r in vs.iter_mut().filter(|r| r.object.pins > 0) {
                r.object.pins -= 1;
                if r.object.pins == 0 {
                    let from = r.until;
                    r.until = r.until.min(r.object.lease_until_ms.max(now_ms));
                    moved.push((r.id, from, r.until));
                }
            }
        }
        for (id, from, to) in moved {
            g.reschedule(key, id, from, to);
        }
    }

    /// The DRAM bytes kept now.
    pub fn bytes(&self) -> u64 {
        self.inner.lock().bytes
    }

    /// The DRAM bytes of the versions due by `until_ms` (a put waiting
    /// until then may get them).
    pub fn bytes_due_by(&self, until_ms: u64) -> u64 {
        let g = self.inner.lock();
        g.due
            .range(..=(until_ms, u64::MAX))
            .filter_map(|((_, id), key)| {
                let vs = g.by_key.get(key)?;
                vs.iter().find(|r| r.id == *id).map(|r| r.bytes)
            })
            .sum()
    }

    /// Takes out the versions due at `now_ms`; returns them and the DRAM
    /// bytes still kept.
    pub fn take_due(&self, now_ms: u64) -> (Vec<Object>, u64) {
        let mut g = self.inner.lock();
        let mut due = Vec::new();
        while let Some(entry) = g.due.first_entry() {
            if entry.key().0 > now_ms {
                break;
            }
            let ((_, id), key) = entry.remove_entry();
            let Some(vs) = g.by_key.get_mut(&key) else {
                continue;
            };
            if let Some(i) = vs.iter().position(|r| r.id == id) {
                let r = vs.swap_remove(i);
                if vs.is_empty() {
                    g.by_key.remove(&key);
                }
                g.bytes -= r.bytes;
                due.push(r.object);
            }
        }
        (due, g.bytes)
    }
}
