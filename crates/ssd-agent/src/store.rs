//! One owner's SSD state: bucket files in the shared data directory, the
//! RocksDB index, recovery, and the bucket write and read paths. Everything
//! here blocks; callers run it with `spawn_blocking`.

use crate::bucket::{self, Entry};
use crate::index::{BucketRecord, Index};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use strata_common::time::unix_ms;
use strata_common::{Code, Error, Result};

/// Reads an object's credit counts at most: an object read this often is
/// kept through up to this many evictions of its bucket without a new read.
pub const MAX_CREDIT: u8 = 3;

/// An object eviction keeps (rewrites into a new bucket).
#[derive(Debug, Clone)]
pub struct KeptObject {
    pub key: String,
    pub bucket_id: u64,
    pub offset: u64,
    pub length: u64,
    pub crc32c: u32,
    pub credit: u8,
    /// The master's record of the copy (`bucket::Entry::record`).
    pub record: Vec<u8>,
}

/// Controls the benchmark uses (not faults: release builds have them).
/// Injected faults are failpoints (the `fail` crate), compiled in only with
/// the `failpoints` feature that the tests enable: `ssd-agent::bucket-write`
/// (fails the next bucket writes, e.g. `2*return`),
/// `ssd-agent::bucket-mid-write` (e.g. `sleep(60000)`),
/// `ssd-agent::drop-offload-report` (e.g. `1*return`); real processes read
/// them from the `FAILPOINTS` environment variable.
#[derive(Debug, Default)]
pub struct Faults {
    /// Take no offload tasks while set (benchmarks queue work first).
    pub pause_offload: std::sync::atomic::AtomicBool,
}

/// What recovery found.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct RecoveryReport {
    pub buckets: u64,
    pub objects: u64,
    /// Index entries whose bucket file was missing or damaged.
    pub dropped_dangling: u64,
    /// This owner's files the index did not know (half-written), moved aside.
    pub quarantined: u64,
    /// Files in the directory that are not bucket files at all.
    pub unknown_files: u64,
    /// Other owners' buckets (never opened).
    pub foreign_files: u64,
    /// Index records that did not parse, dropped (counted as quarantined).
    pub bad_index_records: u64,
}

/// In-memory life of one bucket: who reads it, when it was last used, and
/// which of its objects were removed.
#[derive(Debug, Default, Clone)]
struct BucketMeta {
    readers: u32,
    /// The master was told; no new reads; deleted once `readers` is 0.
    evicting: bool,
    dead: HashSet<u64>,
    /// Reads of each object since the bucket was written (at most
    /// `MAX_CREDIT`): eviction keeps an object with credit by rewriting it
    /// into a new bucket with one credit less (CLOCK with counters).
    credit: HashMap<u64, u8>,
    data_bytes: u64,
    live_bytes: u64,
}

impl BucketMeta {
    fn new(rec: &BucketRecord, dead: HashSet<u64>) -> BucketMeta {
        let data_bytes: u64 = rec.objects.iter().map(|e| e.length).sum();
        let dead_bytes: u64 = rec
            .objects
            .iter()
            .filter(|e| dead.contains(&e.offset))
            .map(|e| e.length)
            .sum();
        BucketMeta {
            readers: 0,
            evicting: false,
            dead,
            credit: HashMap::new(),
            data_bytes,
            live_bytes: data_bytes - dead_bytes,
        }
    }

    /// Share of the bucket's data still live (1.0 for an empty bucket).
    fn live_ratio(&self) -> f64 {
        if self.data_bytes == 0 {
            1.0
        } else {
            self.live_bytes as f64 / self.data_bytes as f64
        }
    }
}

/// A read in progress on a bucket: the bucket is not deleted while it lives.
pub struct BucketReadGuard {
    store: std::sync::Arc<OwnerStore>,
    bucket_id: u64,
}

impl Drop for BucketReadGuard {
    fn drop(&mut self) {
        if let Some(m) = self.store.state.lock().meta.get_mut(&self.bucket_id) {
            m.readers = m.readers.saturating_sub(1);
        }
    }
}

#[derive(Default)]
struct State {
    buckets: HashMap<u64, BucketRecord>,
    meta: HashMap<u64, BucketMeta>,
    /// (bucket, offset) → (length, crc32c) of each object, for read checks.
    by_loc: HashMap<(u64, u64), (u64, u32)>,
    used: u64,
    unknown_files: u64,
    quarantined: u64,
    foreign_files: u64,
}

impl State {
    /// Live objects of bucket `b` with read credit, and their credit.
    fn credited(&self, b: u64) -> impl Iterator<Item = (&Entry, u8)> {
        let rec = self.buckets.get(&b);
        let meta = self.meta.get(&b);
        rec.into_iter()
            .flat_map(|r| r.objects.iter())
            .filter_map(move |e| {
                let c = meta?.credit.get(&e.offset).copied().unwrap_or(0);
                (c > 0 && self.by_loc.contains_key(&(b, e.offset))).then_some((e, c))
            })
    }
}

pub struct OwnerStore {
    pub owner_id: u64,
    pub handle: String,
    pub capacity: u64,
    /// This owner's own directory (its index, WAL and lock file).
    owner_dir: PathBuf,
    /// Bytes the filesystem holds for `owner_dir`: counted against
    /// `capacity`, so buckets + index stay within it.
    overhead: std::sync::atomic::AtomicU64,
    buckets_dir: PathBuf,
    quarantine_dir: PathBuf,
    index: Index,
    state: Mutex<State>,
    pub faults: std::sync::Arc<Faults>,
}

#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Stats {
    /// Bytes of bucket files (the objects).
    pub used: u64,
    /// Bytes of the index, its WAL and logs (the last refresh).
    pub overhead: u64,
    pub buckets: u64,
    pub objects: u64,
    pub unknown_files: u64,
    pub quarantined: u64,
    pub foreign_files: u64,
}

impl OwnerStore {
    pub fn new(
        data_dir: &Path,
        index: Index,
        owner_id: u64,
        handle: &str,
        capacity: u64,
        faults: std::sync::Arc<Faults>,
    ) -> Result<OwnerStore> {
        let buckets_dir = data_dir.join("buckets");
        let quarantine_dir = data_dir.join("quarantine");
        for d in [&buckets_dir, &quarantine_dir] {
            std::fs::create_dir_all(d)
                .map_err(|e| Error::invalid(format!("cannot create {}: {e}", d.display())))?;
            // Users' data.
            strata_common::files::tighten_dir(d);
        }
        index.bind_owner(owner_id, handle)?;
        Ok(OwnerStore {
            owner_id,
            handle: handle.to_string(),
            capacity,
            owner_dir: data_dir
                .join("owners")
                .join(crate::lock::encode_handle(handle)),
            overhead: Default::default(),
            buckets_dir,
            quarantine_dir,
            index,
            state: Mutex::new(State::default()),
            faults,
        })
    }

    fn path(&self, bucket_id: u64) -> PathBuf {
        self.buckets_dir
            .join(bucket::file_name(self.owner_id, bucket_id))
    }

    fn quarantine(&self, name: &str) {
        let from = self.buckets_dir.join(name);
        let to = self.quarantine_dir.join(format!("{name}.{}", unix_ms()));
        match std::fs::rename(&from, &to) {
            Ok(()) => {
                tracing::warn!(file = %from.display(), to = %to.display(), "quarantined a bucket file")
            }
            Err(e) => tracing::error!(file = %from.display(), error = %e, "cannot quarantine"),
        }
    }

    /// Adopts exactly this owner's verified buckets: drops index entries
    /// whose file is missing or damaged, quarantines this owner's files the
    /// index does not know, and never opens another owner's files.
    pub fn recover(&self) -> Result<RecoveryReport> {
        let mut rep = RecoveryReport::default();
        let mut st = State::default();
        let mut dead: HashMap<u64, HashSet<u64>> = HashMap::new();
        for (b, off) in self.index.dead()? {
            dead.entry(b).or_default().insert(off);
        }
        for rec in self.index.buckets()? {
            let path = self.path(rec.bucket_id);
            let ok = match bucket::verify(&path, self.owner_id, rec.bucket_id) {
                Ok((_, entries)) if bucket::same_table(&entries, &rec.objects) => true,
                Ok(_) => {
                    tracing::error!(file = %path.display(), "bucket table disagrees with the index; dropping it");
                    false
                }
                Err(e) => {
                    tracing::error!(error = %e, "bucket failed verification; dropping it");
                    false
                }
            };
            if !ok {
                self.index.remove_bucket(&rec)?;
                rep.dropped_dangling += 1;
                if path.exists() {
                    self.quarantine(&bucket::file_name(self.owner_id, rec.bucket_id));
                    st.quarantined += 1;
                }
                continue;
            }
            st.used += rec.file_len;
            let dead = dead.remove(&rec.bucket_id).unwrap_or_default();
            for e in rec.objects.iter().filter(|e| !dead.contains(&e.offset)) {
                st.by_loc
                    .insert((rec.bucket_id, e.offset), (e.length, e.crc32c));
                rep.objects += 1;
            }
            st.meta.insert(rec.bucket_id, BucketMeta::new(&rec, dead));
            st.buckets.insert(rec.bucket_id, rec);
        }
        rep.buckets = st.buckets.len() as u64;
        let adopted: HashSet<u64> = st.buckets.keys().copied().collect();
        let dir = std::fs::read_dir(&self.buckets_dir).map_err(|e| {
            Error::internal(format!("cannot list {}: {e}", self.buckets_dir.display()))
        })?;
        for ent in dir.flatten() {
            let name = ent.file_name().to_string_lossy().into_owned();
            match bucket::parse_name(&name) {
                None => {
                    tracing::warn!(
                        file = name,
                        "unknown file in the bucket directory; leaving it alone"
                    );
                    st.unknown_files += 1;
                }
                Some((o, _)) if o != self.owner_id => st.foreign_files += 1,
                Some((_, b)) if adopted.contains(&b) => {}
                Some(_) => {
                    self.quarantine(&name);
                    st.quarantined += 1;
                }
            }
        }
        rep.bad_index_records = self.index.bad_records();
        st.quarantined += rep.bad_index_records;
        rep.quarantined = st.quarantined;
        rep.unknown_files = st.unknown_files;
        rep.foreign_files = st.foreign_files;
        *self.state.lock() = st;
        Ok(rep)
    }

    /// Writes one bucket holding `objects` (key, bytes, crc32c) and indexes
    /// it. Nothing is indexed unless the file is complete and synced.
    pub fn write_bucket(&self, objects: &[(&str, &[u8], u32)]) -> Result<BucketRecord> {
        self.write_bucket_with_slack(objects, &[], 0)
    }

    /// Like [`OwnerStore::write_bucket`], allowed to pass the capacity by
    /// `slack` bytes: compaction writes the objects it keeps before the
    /// buckets it empties are deleted (disk use stays within the capacity
    /// plus one bucket).
    /// `records[i]` is the master's record of object `i` (missing: none).
    pub fn write_bucket_with_slack(
        &self,
        objects: &[(&str, &[u8], u32)],
        records: &[Vec<u8>],
        slack: u64,
    ) -> Result<BucketRecord> {
        fail::fail_point!("ssd-agent::bucket-write", |_| Err(Error::internal(
            "injected bucket write failure"
        )));
        let bytes = bucket::file_len_for(objects);
        let used = self.state.lock().used;
        if used + bytes > self.bucket_capacity() + slack {
            return Err(Error::new(
                Code::NoSpace,
                format!(
                    "owner {} is at capacity: {used} of {} bytes for buckets used ({} of --capacity {} is its index), bucket needs {bytes}",
                    self.handle,
                    self.bucket_capacity(),
                    self.overhead(),
                    self.capacity
                ),
            ));
        }
        let id = self.index.reserve_bucket_id()?;
        let (mut objects_out, file_len) =
            bucket::write(&self.buckets_dir, self.owner_id, id, objects)?;
        for (e, r) in objects_out.iter_mut().zip(records) {
            e.record.clone_from(r);
        }
        let rec = BucketRecord {
            bucket_id: id,
            file_len,
            created_unix_ms: unix_ms(),
            objects: objects_out,
        };
        if let Err(e) = self.index.add_bucket(&rec) {
            let _ = std::fs::remove_file(self.path(id));
            return Err(e);
        }
        let mut st = self.state.lock();
        st.used += file_len;
        for e in &rec.objects {
            st.by_loc.insert((id, e.offset), (e.length, e.crc32c));
        }
        st.meta.insert(id, BucketMeta::new(&rec, HashSet::new()));
        st.buckets.insert(id, rec.clone());
        Ok(rec)
    }

    /// Registers a read of `bucket_id`: refused (not found) once the bucket
    /// is being evicted, so a reader never races its deletion.
    pub fn begin_read(self: &std::sync::Arc<Self>, bucket_id: u64) -> Result<BucketReadGuard> {
        let mut st = self.state.lock();
        match st.meta.get_mut(&bucket_id) {
            Some(m) if !m.evicting => {
                m.readers += 1;
                Ok(BucketReadGuard {
                    store: self.clone(),
                    bucket_id,
                })
            }
            _ => Err(Error::not_found(format!(
                "bucket {bucket_id} of owner {} does not exist (evicted or never written)",
                self.handle
            ))),
        }
    }

    /// Notes that the object at `(bucket, offset)` was read.
    pub fn mark_read(&self, bucket_id: u64, offset: u64) {
        if let Some(m) = self.state.lock().meta.get_mut(&bucket_id) {
            let c = m.credit.entry(offset).or_insert(0);
            *c = (*c + 1).min(MAX_CREDIT);
        }
    }

    /// Gives objects of a bucket just written their credit (kept objects
    /// carry what they had left).
    pub fn set_credit(&self, bucket_id: u64, credits: &[(u64, u8)]) {
        if let Some(m) = self.state.lock().meta.get_mut(&bucket_id) {
            for &(offset, c) in credits.iter().filter(|(_, c)| *c > 0) {
                m.credit.insert(offset, c.min(MAX_CREDIT));
            }
        }
    }

    /// Live objects of `buckets` with read credit, at most `budget` bytes,
    /// oldest bucket first: (key, bucket, offset, length, crc32c, credit).
    pub fn read_objects(&self, buckets: &[u64], budget: u64) -> Vec<KeptObject> {
        let st = self.state.lock();
        let mut out = Vec::new();
        let mut bytes = 0;
        for &b in buckets {
            for (e, credit) in st.credited(b) {
                if bytes + e.length <= budget {
                    bytes += e.length;
                    out.push(KeptObject {
                        key: e.key.clone(),
                        bucket_id: b,
                        offset: e.offset,
                        length: e.length,
                        crc32c: e.crc32c,
                        credit,
                        record: e.record.clone(),
                    });
                }
            }
        }
        out
    }

    /// Length and crc32c of the live object starting at `(bucket, offset)`.
    pub fn object_at(&self, bucket_id: u64, offset: u64) -> Option<(u64, u32)> {
        self.state.lock().by_loc.get(&(bucket_id, offset)).copied()
    }

    /// Reads raw bytes of a bucket (callers hold a [`BucketReadGuard`] and
    /// verify object checksums over the whole object).
    pub fn read_piece(&self, bucket_id: u64, offset: u64, length: u64) -> Result<Vec<u8>> {
        bucket::read_range(&self.path(bucket_id), offset, length)
    }

    /// Like [`OwnerStore::read_piece`] into a caller's (reused) buffer.
    pub fn read_piece_into(&self, bucket_id: u64, offset: u64, buf: &mut [u8]) -> Result<()> {
        bucket::read_range_into(&self.path(bucket_id), offset, buf)
    }

    /// Forgets objects removed from Strata, durably (they stay out of the
    /// inventory after a restart), with one synced index write. Objects not
    /// held here are skipped. Returns how many were forgotten.
    pub fn remove_objects(&self, objects: &[(&str, u64, u64)]) -> Result<usize> {
        let live: Vec<(&str, u64, u64)> = {
            let st = self.state.lock();
            objects
                .iter()
                .copied()
                .filter(|&(key, bucket_id, offset)| {
                    st.by_loc.contains_key(&(bucket_id, offset))
                        && st.buckets.get(&bucket_id).is_some_and(|b| {
                            b.objects.iter().any(|e| e.offset == offset && e.key == key)
                        })
                })
                .collect()
        };
        if live.is_empty() {
            return Ok(0);
        }
        self.index.mark_dead(&live)?;
        let mut st = self.state.lock();
        for &(_, bucket_id, offset) in &live {
            if let Some((len, _)) = st.by_loc.remove(&(bucket_id, offset)) {
                if let Some(m) = st.meta.get_mut(&bucket_id) {
                    m.dead.insert(offset);
                    m.live_bytes = m.live_bytes.saturating_sub(len);
                }
            }
        }
        Ok(live.len())
    }

    /// Buckets to evict so that usage falls to `target_used`: first those
    /// whose live share fell below `sparse_below`, then the oldest written
    /// (bucket ids grow). Read objects survive through their credit, so a
    /// read does not keep a whole bucket of cold neighbours alive, as
    /// ordering buckets by last read would.
    pub fn eviction_candidates(&self, target_used: u64, sparse_below: f64) -> Vec<u64> {
        let st = self.state.lock();
        let mut order: Vec<(bool, u64, u64)> = st
            .meta
            .iter()
            .filter(|(_, m)| !m.evicting)
            .map(|(&id, m)| {
                let len = st.buckets.get(&id).map_or(0, |b| b.file_len);
                (m.live_ratio() >= sparse_below, id, len)
            })
            .collect();
        order.sort_unstable();
        // Buckets already being evicted are as good as gone.
        let going: u64 = st
            .meta
            .iter()
            .filter(|(_, m)| m.evicting)
            .filter_map(|(id, _)| st.buckets.get(id).map(|b| b.file_len))
            .sum();
        let mut used = st.used.saturating_sub(going);
        let mut out = Vec::new();
        for (dense, id, len) in order {
            if used <= target_used && dense {
                break;
            }
            out.push(id);
            used = used.saturating_sub(len);
        }
        out
    }

    /// How many of `victims`, from the first, can be evicted together: the
    /// objects they keep (live, with read credit) fit in `budget` bytes. At
    /// least one (its kept objects are cut to the budget).
    pub fn keep_group(&self, victims: &[u64], budget: u64) -> usize {
        let st = self.state.lock();
        let mut bytes = 0;
        for (i, &b) in victims.iter().enumerate() {
            bytes += st.credited(b).map(|(e, _)| e.length).sum::<u64>();
            if bytes > budget {
                return i.max(1);
            }
        }
        victims.len()
    }

    /// Marks buckets as being evicted: new reads are refused from now on.
    pub fn begin_evict(&self, buckets: &[u64]) {
        let mut st = self.state.lock();
        for b in buckets {
            if let Some(m) = st.meta.get_mut(b) {
                m.evicting = true;
            }
        }
    }

    /// Buckets marked for eviction and not deleted yet.
    pub fn evicting(&self) -> Vec<u64> {
        let st = self.state.lock();
        st.meta
            .iter()
            .filter(|(_, m)| m.evicting)
            .map(|(&id, _)| id)
            .collect()
    }

    /// Reads still running on `bucket_id`.
    pub fn readers(&self, bucket_id: u64) -> u32 {
        self.state
            .lock()
            .meta
            .get(&bucket_id)
            .map_or(0, |m| m.readers)
    }

    /// Deletes an evicting bucket with no readers: index first (so a crash
    /// leaves at worst an unindexed file, quarantined at recovery), then the
    /// file. Returns the bytes freed.
    pub fn delete_bucket(&self, bucket_id: u64) -> Result<u64> {
        let rec = {
            let st = self.state.lock();
            match (st.buckets.get(&bucket_id), st.meta.get(&bucket_id)) {
                (Some(rec), Some(m)) if m.evicting && m.readers == 0 => rec.clone(),
                (Some(_), _) => {
                    return Err(Error::new(
                        Code::Leased,
                        format!("bucket {bucket_id} is still being read or not evicting"),
                    ))
                }
                (None, _) => return Ok(0),
            }
        };
        self.index.remove_bucket(&rec)?;
        if let Err(e) = std::fs::remove_file(self.path(bucket_id)) {
            tracing::warn!(bucket = bucket_id, error = %e, "cannot delete an evicted bucket file");
        }
        let mut st = self.state.lock();
        st.buckets.remove(&bucket_id);
        st.meta.remove(&bucket_id);
        for e in &rec.objects {
            st.by_loc.remove(&(bucket_id, e.offset));
        }
        st.used = st.used.saturating_sub(rec.file_len);
        Ok(rec.file_len)
    }

    /// Bytes buckets may use: the capacity less the index's share.
    pub fn bucket_capacity(&self) -> u64 {
        self.capacity.saturating_sub(self.overhead())
    }

    pub fn overhead(&self) -> u64 {
        self.overhead.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Measures the index's disk use again (blocking: walks a directory).
    pub fn refresh_overhead(&self) -> u64 {
        let bytes = allocated_bytes(&self.owner_dir, 2);
        self.overhead
            .store(bytes, std::sync::atomic::Ordering::Relaxed);
        bytes
    }

    pub fn stats(&self) -> Stats {
        let st = self.state.lock();
        Stats {
            used: st.used,
            overhead: self.overhead(),
            buckets: st.buckets.len() as u64,
            objects: st.by_loc.len() as u64,
            unknown_files: st.unknown_files,
            quarantined: st.quarantined,
            foreign_files: st.foreign_files,
        }
    }

    /// Every object this owner holds, for the inventory report.
    pub fn inventory(&self) -> Vec<(u64, Entry)> {
        let st = self.state.lock();
        st.buckets
            .values()
            .filter(|b| st.meta.get(&b.bucket_id).is_some_and(|m| !m.evicting))
            .flat_map(|b| b.objects.iter().map(move |e| (b.bucket_id, e.clone())))
            .filter(|(b, e)| st.by_loc.contains_key(&(*b, e.offset)))
            .collect()
    }

    /// Where the index says `key` lives.
    pub fn location(&self, key: &str) -> Result<Option<crate::index::KeyLocation>> {
        self.index.key(key)
    }

    pub fn flush(&self) -> Result<()> {
        self.index.flush()
    }
}

/// Bytes the filesystem allocated to the files under `dir` (what `du`
/// counts: preallocated space included), `depth` levels down.
pub fn allocated_bytes(dir: &Path, depth: u32) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| Some((e.path(), e.metadata().ok()?)))
        .map(|(p, m)| {
            if m.is_dir() {
                if depth > 0 {
                    allocated_bytes(&p, depth - 1)
                } else {
                    0
                }
            } else {
                m.blocks() * 512
            }
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(dir: &Path) -> OwnerStore {
        let index = Index::open(&dir.join("index")).unwrap();
        OwnerStore::new(dir, index, 1, "t/0", 1 << 30, Default::default()).unwrap()
    }

    fn bucket(s: &OwnerStore, keys: &[&str]) -> BucketRecord {
        let data = vec![7u8; 1000];
        let crc = crc32c::crc32c(&data);
        let objs: Vec<(&str, &[u8], u32)> = keys.iter().map(|k| (*k, &data[..], crc)).collect();
        s.write_bucket(&objs).unwrap()
    }

    /// Buckets go oldest written first however they were read: a read keeps
    /// its object (credit), not its bucket.
    #[test]
    fn eviction_goes_oldest_written_first_and_reads_earn_credit() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path());
        let a = bucket(&s, &["a0", "a1"]);
        let b = bucket(&s, &["b0", "b1"]);
        // Reading bucket a (a1 twice) does not move it behind b.
        for _ in 0..2 {
            s.mark_read(a.bucket_id, a.objects[1].offset);
        }
        let one = s.stats().used - 1;
        assert_eq!(s.eviction_candidates(one, 0.0), vec![a.bucket_id]);
        assert_eq!(
            s.eviction_candidates(0, 0.0),
            vec![a.bucket_id, b.bucket_id]
        );
        let kept = s.read_objects(&[a.bucket_id, b.bucket_id], u64::MAX);
        assert_eq!(kept.len(), 1, "only the read object: {kept:?}");
        assert_eq!((kept[0].key.as_str(), kept[0].credit), ("a1", 2));
        // Credit is capped, and set on a rewritten object's new bucket.
        for _ in 0..10 {
            s.mark_read(b.bucket_id, b.objects[0].offset);
        }
        let kept = s.read_objects(&[b.bucket_id], u64::MAX);
        assert_eq!(kept[0].credit, MAX_CREDIT);
        let c = bucket(&s, &["a1"]);
        s.set_credit(c.bucket_id, &[(c.objects[0].offset, 1)]);
        let kept = s.read_objects(&[c.bucket_id], u64::MAX);
        assert_eq!((kept[0].key.as_str(), kept[0].credit), ("a1", 1));
        // The budget bounds what one pass keeps.
        assert!(s.read_objects(&[a.bucket_id, b.bucket_id], 999).is_empty());
    }
}
