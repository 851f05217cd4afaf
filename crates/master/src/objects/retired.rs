//! Versions an overwrite replaced (`overwrite/`), kept until the read
//! leases on them end, then freed by housekeeping.

use super::Object;
use parking_lot::Mutex;

/// Replaced versions waiting for their readers.
#[derive(Default)]
pub struct Retired {
    /// (free no earlier than, unix ms; the version).
    versions: Mutex<Vec<(u64, Object)>>,
}

impl Retired {
    /// Keeps `o` until `until_ms`; returns the DRAM bytes now kept.
    pub fn keep(&self, until_ms: u64, o: Object) -> u64 {
        let mut v = self.versions.lock();
        v.push((until_ms, o));
        bytes(v.iter())
    }

    /// The DRAM bytes kept now.
    pub fn bytes(&self) -> u64 {
        bytes(self.versions.lock().iter())
    }

    /// The DRAM bytes of the versions due by `until_ms` (a put waiting
    /// until then may get them).
    pub fn bytes_due_by(&self, until_ms: u64) -> u64 {
        bytes(
            self.versions
                .lock()
                .iter()
                .filter(|(until, _)| *until <= until_ms),
        )
    }

    /// Takes out the versions due at `now_ms`; returns them and the DRAM
    /// bytes still kept.
    pub fn take_due(&self, now_ms: u64) -> (Vec<Object>, u64) {
        let mut v = self.versions.lock();
        if v.iter().all(|(until, _)| *until > now_ms) {
            return (Vec::new(), bytes(v.iter()));
        }
        let (due, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut *v)
            .into_iter()
            .partition(|(until, _)| *until <= now_ms);
        *v = kept;
        (due.into_iter().map(|(_, o)| o).collect(), bytes(v.iter()))
    }
}

fn bytes<'a>(v: impl Iterator<Item = &'a (u64, Object)>) -> u64 {
    v.flat_map(|(_, o)| o.replicas()).map(|r| r.alloc_len).sum()
}
