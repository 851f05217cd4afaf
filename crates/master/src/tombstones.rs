//! Removals stay removed. When an object is removed, a copy of it may still
//! sit in an SSD owner's bucket that the master cannot reach right now (the
//! agent is down, its drop notice was lost with a master restart, or its
//! offload report never arrived). The master keeps a durable tombstone of
//! (key, length, crc32c) for every removed object and checks inventories
//! against it: a reported copy matching a tombstone is dropped, never
//! adopted. A later put of the same key with other bytes is not affected (its
//! copies have another checksum); one with the very same bytes may lose its
//! SSD copy at a restart — a cache miss, never wrong bytes.
//!
//! On disk: `tombstones.log` under `--state-dir`, an append-only log of
//! records `key_len u16 | key | length u64 | crc32c u32 | record crc32c u32`
//! (little endian), written and fsynced before a remove returns. It is
//! rewritten (temp file, fsync, rename) when dead records dominate, and
//! bounded: beyond `max` tombstones the oldest are forgotten (counted).

use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use strata_common::{Error, Result};

const FILE: &str = "tombstones.log";
const MAX_KEY: usize = u16::MAX as usize;

#[derive(Default)]
struct Inner {
    /// key → (length, crc32c, sequence of its latest tombstone).
    map: HashMap<String, (u64, u32, u64)>,
    /// (key, sequence) in the order they were tombstoned, oldest first; an
    /// entry whose sequence is not the key's latest is dead.
    order: VecDeque<(String, u64)>,
    next_seq: u64,
    /// Bytes the live tombstones take on disk (what a rewrite would write).
    live_bytes: u64,
}

/// The log file, locked apart from the map so a lookup (made under an
/// object-table shard lock) never waits for an fsync. Lock order: file, then
/// map.
#[derive(Default)]
struct LogFile {
    file: Option<File>,
    bytes: u64,
}

/// On-disk size of one record.
fn record_len(key: &str) -> u64 {
    key.len() as u64 + 18
}

impl Inner {
    fn insert(&mut self, key: &str, len: u64, crc: u32) {
        let seq = self.next_seq;
        self.next_seq += 1;
        if self.map.insert(key.to_string(), (len, crc, seq)).is_none() {
            self.live_bytes += record_len(key);
        }
        self.order.push_back((key.to_string(), seq));
    }
}

pub struct Tombstones {
    inner: Mutex<Inner>,
    log: Mutex<LogFile>,
    path: Option<PathBuf>,
    max: usize,
    forgotten: std::sync::atomic::AtomicU64,
}

fn encode(out: &mut Vec<u8>, key: &str, len: u64, crc: u32) {
    let start = out.len();
    out.extend_from_slice(&(key.len() as u16).to_le_bytes());
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&crc.to_le_bytes());
    let c = crc32c::crc32c(&out[start..]);
    out.extend_from_slice(&c.to_le_bytes());
}

/// Parses records until the bytes end or one is damaged (a torn last write):
/// returns them and how many bytes were good.
fn decode(mut b: &[u8]) -> (Vec<(String, u64, u32)>, usize) {
    let total = b.len();
    let mut out = Vec::new();
    loop {
        if b.len() < 2 {
            break;
        }
        let klen = u16::from_le_bytes([b[0], b[1]]) as usize;
        let need = 2 + klen + 8 + 4 + 4;
        if b.len() < need {
            break;
        }
        let (rec, rest) = b.split_at(need);
        let body = &rec[..need - 4];
        let want = u32::from_le_bytes(rec[need - 4..].try_into().expect("4 bytes"));
        if crc32c::crc32c(body) != want {
            break;
        }
        let Ok(key) = std::str::from_utf8(&rec[2..2 + klen]) else {
            break;
        };
        let len = u64::from_le_bytes(rec[2 + klen..10 + klen].try_into().expect("8 bytes"));
        let crc = u32::from_le_bytes(rec[10 + klen..14 + klen].try_into().expect("4 bytes"));
        out.push((key.to_string(), len, crc));
        b = rest;
    }
    let good = total - b.len();
    (out, good)
}

impl Tombstones {
    /// In memory only (no `--state-dir`).
    pub fn memory(max: usize) -> Self {
        Tombstones {
            inner: Mutex::new(Inner::default()),
            log: Mutex::new(LogFile::default()),
            path: None,
            max,
            forgotten: Default::default(),
        }
    }

    /// Opens (or creates) the log in `dir`. A damaged tail (a torn write) is
    /// cut off with a WARNING; what precedes it is kept.
    pub fn open(dir: &Path, max: usize) -> Result<Self> {
        let path = dir.join(FILE);
        let mut bytes = Vec::new();
        match File::open(&path) {
            Ok(mut f) => {
                f.read_to_end(&mut bytes)
                    .map_err(|e| Error::internal(format!("cannot read {}: {e}", path.display())))?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(Error::internal(format!(
                    "cannot open {}: {e}",
                    path.display()
                )))
            }
        }
        let (records, good) = decode(&bytes);
        if good < bytes.len() {
            tracing::warn!(
                file = %path.display(),
                kept = records.len(),
                dropped_bytes = bytes.len() - good,
                "damaged tail in the tombstone log; cutting it off"
            );
        }
        let t = Tombstones {
            inner: Mutex::new(Inner::default()),
            log: Mutex::new(LogFile::default()),
            path: Some(path.clone()),
            max,
            forgotten: Default::default(),
        };
        let clean = {
            let mut g = t.inner.lock();
            for (k, len, crc) in records {
                g.insert(&k, len, crc);
            }
            t.trim(&mut g);
            good == bytes.len() && g.live_bytes == good as u64
        };
        let mut log = t.log.lock();
        if clean {
            // Exactly the live tombstones already: append to it as it is.
            log.file = Some(open_append(&path)?);
            log.bytes = good as u64;
        } else {
            // A damaged tail or dead records: start from a clean file.
            t.rewrite(&mut log)?;
        }
        drop(log);
        Ok(t)
    }

    /// Whether a copy of `key` with this length and checksum is of a removed
    /// object.
    pub fn is_removed(&self, key: &str, len: u64, crc: u32) -> bool {
        self.inner
            .lock()
            .map
            .get(key)
            .is_some_and(|&(l, c, _)| (l, c) == (len, crc))
    }

    pub fn len(&self) -> usize {
        self.inner.lock().map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tombstones forgotten to keep within the bound.
    pub fn forgotten(&self) -> u64 {
        self.forgotten.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Records removals durably (written and fsynced before it returns).
    pub fn record(&self, removed: &[(String, u64, u32)]) -> Result<()> {
        let removed: Vec<&(String, u64, u32)> = removed
            .iter()
            .filter(|(k, _, _)| k.len() <= MAX_KEY)
            .collect();
        if removed.is_empty() {
            return Ok(());
        }
        // Writers take the file first; lookups only ever need the map,
        // updated (in memory, at once) before the fsync.
        let mut log = self.log.lock();
        let mut buf = Vec::new();
        let live_bytes = {
            let mut g = self.inner.lock();
            for (k, len, crc) in &removed {
                encode(&mut buf, k, *len, *crc);
                g.insert(k, *len, *crc);
            }
            self.trim(&mut g);
            g.live_bytes
        };
        let good = log.bytes;
        if let Some(f) = log.file.as_mut() {
            let path = self.path.as_ref().expect("a file has a path");
            if let Err(e) = f.write_all(&buf).and_then(|_| f.sync_data()) {
                // Never leave a torn record for later records to follow
                // (the log is read up to its first damage): cut it off.
                let _ = f.set_len(good);
                return Err(Error::internal(format!(
                    "cannot write {}: {e}",
                    path.display()
                )));
            }
            log.bytes += buf.len() as u64;
        }
        // Dead records (re-tombstoned or forgotten keys) dominate: compact.
        if log.file.is_some() && log.bytes > 2 * live_bytes + (64 << 10) {
            self.rewrite(&mut log)?;
        }
        Ok(())
    }

    fn live(g: &Inner, k: &str, seq: u64) -> bool {
        g.map.get(k).is_some_and(|e| e.2 == seq)
    }

    fn trim(&self, g: &mut Inner) {
        while g.map.len() > self.max {
            let Some((k, seq)) = g.order.pop_front() else {
                break;
            };
            if Self::live(g, &k, seq) {
                g.map.remove(&k);
                g.live_bytes -= record_len(&k);
                self.forgotten
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        if g.order.len() > 2 * g.map.len() + 1024 {
            let order = std::mem::take(&mut g.order);
            g.order = order
                .into_iter()
                .filter(|(k, s)| Self::live(g, k, *s))
                .collect();
        }
    }

    /// Writes exactly the live tombstones to a new file and swaps it in.
    fn rewrite(&self, log: &mut LogFile) -> Result<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let mut buf = Vec::new();
        {
            let g = self.inner.lock();
            for (k, seq) in &g.order {
                if let Some(&(len, crc, s)) = g.map.get(k) {
                    if s == *seq {
                        encode(&mut buf, k, len, crc);
                    }
                }
            }
        }
        let tmp = path.with_extension("tmp");
        let e = |e: std::io::Error| Error::internal(format!("cannot write {}: {e}", tmp.display()));
        {
            let mut f = File::create(&tmp).map_err(e)?;
            f.write_all(&buf).map_err(e)?;
            f.sync_all().map_err(e)?;
        }
        std::fs::rename(&tmp, path).map_err(e)?;
        if let Some(dir) = path.parent() {
            if let Ok(d) = File::open(dir) {
                let _ = d.sync_all();
            }
        }
        log.file = Some(open_append(path)?);
        log.bytes = buf.len() as u64;
        Ok(())
    }
}

fn open_append(path: &Path) -> Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| Error::internal(format!("cannot open {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(k: &str, crc: u32) -> (String, u64, u32) {
        (k.to_string(), 100, crc)
    }

    #[test]
    fn tombstones_survive_a_reopen_and_match_exactly() {
        let d = tempfile::tempdir().unwrap();
        {
            let ts = Tombstones::open(d.path(), 100).unwrap();
            ts.record(&[t("a", 1), t("b", 2)]).unwrap();
            ts.record(&[t("a", 3)]).unwrap();
        }
        let ts = Tombstones::open(d.path(), 100).unwrap();
        assert_eq!(ts.len(), 2);
        // The newest tombstone of a key wins; other bytes are not removed.
        assert!(ts.is_removed("a", 100, 3));
        assert!(!ts.is_removed("a", 100, 1));
        assert!(ts.is_removed("b", 100, 2));
        assert!(!ts.is_removed("b", 101, 2));
        assert!(!ts.is_removed("c", 100, 2));
    }

    #[test]
    fn a_torn_tail_is_cut_off_and_the_rest_kept() {
        let d = tempfile::tempdir().unwrap();
        {
            let ts = Tombstones::open(d.path(), 100).unwrap();
            ts.record(&[t("a", 1), t("b", 2)]).unwrap();
        }
        let p = d.path().join(FILE);
        let mut bytes = std::fs::read(&p).unwrap();
        bytes.truncate(bytes.len() - 3);
        bytes.extend_from_slice(&[0xff; 40]);
        std::fs::write(&p, &bytes).unwrap();
        let ts = Tombstones::open(d.path(), 100).unwrap();
        assert!(ts.is_removed("a", 100, 1));
        assert!(!ts.is_removed("b", 100, 2), "torn record dropped");
        ts.record(&[t("c", 3)]).unwrap();
        drop(ts);
        let ts = Tombstones::open(d.path(), 100).unwrap();
        assert!(ts.is_removed("a", 100, 1) && ts.is_removed("c", 100, 3));
    }

    #[test]
    fn bounded_oldest_first_and_compacted() {
        let d = tempfile::tempdir().unwrap();
        let ts = Tombstones::open(d.path(), 3).unwrap();
        for (i, k) in ["a", "b", "c", "d"].iter().enumerate() {
            ts.record(&[t(k, i as u32)]).unwrap();
        }
        assert_eq!(ts.len(), 3);
        assert_eq!(ts.forgotten(), 1);
        assert!(!ts.is_removed("a", 100, 0));
        assert!(ts.is_removed("d", 100, 3));
        // Re-tombstoning one key many times does not grow the file forever.
        let many: Vec<_> = (0..5000u32).map(|i| t("d", i)).collect();
        ts.record(&many).unwrap();
        let size = std::fs::metadata(d.path().join(FILE)).unwrap().len();
        assert!(size < 1000, "compacted: {size}");
        drop(ts);
        let ts = Tombstones::open(d.path(), 3).unwrap();
        assert!(ts.is_removed("d", 100, 4999));
        assert!(ts.is_removed("b", 100, 1));
    }

    fn file_size(d: &Path) -> u64 {
        std::fs::metadata(d.join(FILE)).unwrap().len()
    }

    #[test]
    fn decode_counts_the_good_bytes_before_damage() {
        let mut b = Vec::new();
        encode(&mut b, "a", 1, 2);
        encode(&mut b, "bc", 3, 4);
        let whole = b.len();
        let want = vec![("a".to_string(), 1, 2), ("bc".to_string(), 3, 4)];
        assert_eq!(decode(&b), (want.clone(), whole));
        b.extend_from_slice(&[1, 0, b'x']);
        assert_eq!(decode(&b), (want, whole), "a torn record is not good");
    }

    /// A log holding dead records is compacted when opened; one holding
    /// exactly its live tombstones is appended to as it is (same file).
    #[test]
    fn reopening_compacts_dead_records_and_keeps_a_clean_log() {
        use std::os::unix::fs::MetadataExt;
        let d = tempfile::tempdir().unwrap();
        {
            let ts = Tombstones::open(d.path(), 100).unwrap();
            ts.record(&[t("a", 1)]).unwrap();
            ts.record(&[t("a", 2)]).unwrap();
            ts.record(&[t("b", 3)]).unwrap();
        }
        assert_eq!(file_size(d.path()), 3 * 19, "appended, not compacted");
        let ts = Tombstones::open(d.path(), 100).unwrap();
        assert_eq!(file_size(d.path()), 2 * 19, "compacted at open");
        assert!(ts.is_removed("a", 100, 2) && ts.is_removed("b", 100, 3));
        assert!(!ts.is_removed("a", 100, 1));
        drop(ts);
        let inode = std::fs::metadata(d.path().join(FILE)).unwrap().ino();
        let ts = Tombstones::open(d.path(), 100).unwrap();
        ts.record(&[t("c", 4)]).unwrap();
        let m = std::fs::metadata(d.path().join(FILE)).unwrap();
        assert_eq!((m.ino(), m.len()), (inode, 3 * 19), "clean: appended to");
    }

    /// `live_bytes` (which decides compaction, and whether a reopened log
    /// is clean) is exactly what a rewrite writes, through re-tombstoning
    /// and forgetting.
    #[test]
    fn live_bytes_are_what_a_rewrite_writes() {
        let d = tempfile::tempdir().unwrap();
        let ts = Tombstones::open(d.path(), 2).unwrap();
        let check = |ts: &Tombstones| {
            ts.rewrite(&mut ts.log.lock()).unwrap();
            assert_eq!(ts.inner.lock().live_bytes, file_size(d.path()));
        };
        ts.record(&[t("a", 1), t("bb", 2)]).unwrap();
        check(&ts);
        ts.record(&[t("a", 3)]).unwrap();
        check(&ts);
        ts.record(&[t("ccc", 4)]).unwrap();
        assert_eq!(ts.forgotten(), 1);
        check(&ts);
        assert_eq!(file_size(d.path()), 19 + 21);
    }

    /// Re-tombstoning a key makes it the newest: the bound forgets the
    /// oldest live tombstone, never a key's newest one, and counts each.
    #[test]
    fn the_bound_forgets_the_oldest_live_tombstone() {
        let ts = Tombstones::memory(2);
        assert!(ts.is_empty());
        ts.record(&[t("a", 1), t("b", 2), t("a", 3)]).unwrap();
        assert!(!ts.is_empty());
        assert_eq!((ts.len(), ts.forgotten()), (2, 0));
        ts.record(&[t("c", 4)]).unwrap();
        assert!(ts.is_removed("a", 100, 3) && ts.is_removed("c", 100, 4));
        assert!(!ts.is_removed("b", 100, 2), "b was the oldest live one");
        assert_eq!((ts.len(), ts.forgotten()), (2, 1));
        ts.record(&[t("d", 5), t("e", 6)]).unwrap();
        assert_eq!((ts.len(), ts.forgotten()), (2, 3));
    }

    /// The log is compacted once it passes twice the live bytes plus 64 KiB:
    /// not at that mark, and not on every write.
    #[test]
    fn the_log_is_compacted_just_past_its_threshold() {
        let d = tempfile::tempdir().unwrap();
        let ts = Tombstones::open(d.path(), 100).unwrap();
        let key = "fourteen-chars"; // a 32-byte record
                                    // 2050 records of one key: 65600 bytes = 2 * 32 + 64 KiB.
        let many: Vec<_> = (0..2050u32).map(|i| t(key, i)).collect();
        ts.record(&many).unwrap();
        assert_eq!(file_size(d.path()), 2050 * 32, "at the threshold: kept");
        ts.record(&[t(key, 2050)]).unwrap();
        assert_eq!(file_size(d.path()), 32, "past it: compacted");
        assert!(ts.is_removed(key, 100, 2050));
    }

    /// Re-tombstoning one key over and over keeps the in-memory order
    /// bounded: pruned to live entries once it passes twice the map + 1024.
    #[test]
    fn the_order_is_pruned_just_past_its_bound() {
        let ts = Tombstones::memory(100);
        let many: Vec<_> = (0..1026u32).map(|i| t("k", i)).collect();
        ts.record(&many).unwrap();
        assert_eq!(ts.inner.lock().order.len(), 1026, "at the bound: kept");
        ts.record(&[t("k", 1026)]).unwrap();
        assert_eq!(ts.inner.lock().order.len(), 1, "past it: the live one");
        assert!(ts.is_removed("k", 100, 1026));
    }
}
