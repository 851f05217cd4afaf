//! Versions an overwrite replaced (`overwrite/`), kept until the read
//! leases on them end (their readers' ends, or the TTL), then freed by
//! housekeeping.

use super::Object;
use parking_lot::Mutex;

/// Replaced versions waiting for their readers. A leaf lock: nothing else
/// is taken under it.
#[derive(Default)]
pub struct Retired {
    versions: Mutex<Vec<Version>>,
}

struct Version {
    /// Free no earlier than (unix ms).
    until: u64,
    key: Box<str>,
    object: Object,
}

impl Retired {
    /// Keeps `o`, the version of `key` an overwrite replaced, until
    /// `until_ms`; returns the DRAM bytes now kept.
    pub fn keep(&self, until_ms: u64, key: &str, o: Object) -> u64 {
        let mut v = self.versions.lock();
        v.push(Version {
            until: until_ms,
            key: key.into(),
            object: o,
        });
        bytes(v.iter())
    }

    /// One reader of `key`'s replaced version `generation` is done
    /// (`ReportReads.ended`): with the last one, and no copier holding
    /// it, it is due at once. False when no such lease was running.
    pub fn end_lease(&self, key: &str, generation: u64, now_ms: u64) -> bool {
        let mut v = self.versions.lock();
        let Some(r) = v
            .iter_mut()
            .find(|r| &*r.key == key && generation != 0 && r.object.is_version(generation))
        else {
            return false;
        };
        let ended = r.object.end_lease(now_ms);
        if ended && !r.object.leased(now_ms) && r.object.pins == 0 {
            r.until = r.until.min(now_ms);
        }
        ended
    }

    /// An offload task copying `key` reported (or ran out): the versions
    /// of it replaced meanwhile hold one copier fewer, and with none left
    /// wait only for their readers. (Tasks unpin by key, so this may let
    /// a version go while another task still reads it: that read is then
    /// refused by the node or fails its checksum, and the copy is refused
    /// as another version's anyway.)
    pub fn unpin(&self, key: &str, now_ms: u64) {
        let mut v = self.versions.lock();
        for r in v.iter_mut().filter(|r| &*r.key == key && r.object.pins > 0) {
            r.object.pins -= 1;
            if r.object.pins == 0 {
                r.until = r.until.min(r.object.lease_until_ms.max(now_ms));
            }
        }
    }

    /// The DRAM bytes kept now.
    pub fn bytes(&self) -> u64 {
        bytes(self.versions.lock().iter())
    }

    /// The DRAM bytes of the versions due by `until_ms` (a put waiting
    /// until then may get them).
    pub fn bytes_due_by(&self, until_ms: u64) -> u64 {
        bytes(self.versions.lock().iter().filter(|r| r.until <= until_ms))
    }

    /// Takes out the versions due at `now_ms`; returns them and the DRAM
    /// bytes still kept.
    pub fn take_due(&self, now_ms: u64) -> (Vec<Object>, u64) {
        let mut v = self.versions.lock();
        if v.iter().all(|r| r.until > now_ms) {
            return (Vec::new(), bytes(v.iter()));
        }
        let (due, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut *v)
            .into_iter()
            .partition(|r| r.until <= now_ms);
        *v = kept;
        (due.into_iter().map(|r| r.object).collect(), bytes(v.iter()))
    }
}

fn bytes<'a>(v: impl Iterator<Item = &'a Version>) -> u64 {
    v.flat_map(|r| r.object.replicas())
        .map(|r| r.alloc_len)
        .sum()
}
