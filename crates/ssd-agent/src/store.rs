//! One owner's SSD state: bucket files in the shared data directory, the
//! RocksDB index, recovery, and the bucket write and read paths. Everything
//! here blocks; callers run it with `spawn_blocking`.

use crate::bucket::{self, Entry};
use crate::index::{BucketRecord, Index};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;
use strata_common::time::unix_ms;
use strata_common::{Code, Error, Result};

/// Test hooks: make the next writes fail or stall, or drop reports. Set in
/// process by tests, or through `STRATA_TEST_FAULTS` (e.g.
/// `fail_writes=1,write_delay_ms=3000,drop_reports=1`) for real processes.
#[derive(Debug, Default)]
pub struct Faults {
    pub fail_writes: AtomicU32,
    pub write_delay_ms: AtomicU64,
    pub drop_reports: AtomicU32,
    /// Take no offload tasks while set (benchmarks queue work first).
    pub pause_offload: std::sync::atomic::AtomicBool,
}

impl Faults {
    pub fn from_env() -> Faults {
        let f = Faults::default();
        if let Ok(spec) = std::env::var("STRATA_TEST_FAULTS") {
            for kv in spec.split(',') {
                match kv
                    .split_once('=')
                    .map(|(k, v)| (k.trim(), v.trim().parse::<u64>()))
                {
                    Some(("fail_writes", Ok(n))) => {
                        f.fail_writes.store(n as u32, Ordering::Relaxed)
                    }
                    Some(("write_delay_ms", Ok(n))) => f.write_delay_ms.store(n, Ordering::Relaxed),
                    Some(("drop_reports", Ok(n))) => {
                        f.drop_reports.store(n as u32, Ordering::Relaxed)
                    }
                    _ => tracing::warn!(entry = kv, "ignoring unknown STRATA_TEST_FAULTS entry"),
                }
            }
        }
        f
    }

    /// Consumes one unit of a countdown fault; true when it fires.
    pub fn take(c: &AtomicU32) -> bool {
        c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
    }
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
}

#[derive(Default)]
struct State {
    buckets: HashMap<u64, BucketRecord>,
    /// (bucket, offset) → (length, crc32c) of each object, for read checks.
    by_loc: HashMap<(u64, u64), (u64, u32)>,
    used: u64,
    unknown_files: u64,
    quarantined: u64,
    foreign_files: u64,
}

pub struct OwnerStore {
    pub owner_id: u64,
    pub handle: String,
    pub capacity: u64,
    buckets_dir: PathBuf,
    quarantine_dir: PathBuf,
    index: Index,
    state: Mutex<State>,
    pub faults: std::sync::Arc<Faults>,
}

#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Stats {
    pub used: u64,
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
        }
        index.bind_owner(owner_id, handle)?;
        Ok(OwnerStore {
            owner_id,
            handle: handle.to_string(),
            capacity,
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
        for rec in self.index.buckets()? {
            let path = self.path(rec.bucket_id);
            let ok = match bucket::verify(&path, self.owner_id, rec.bucket_id) {
                Ok((_, entries)) if entries == rec.objects => true,
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
            for e in &rec.objects {
                st.by_loc
                    .insert((rec.bucket_id, e.offset), (e.length, e.crc32c));
            }
            rep.objects += rec.objects.len() as u64;
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
        rep.quarantined = st.quarantined;
        rep.unknown_files = st.unknown_files;
        rep.foreign_files = st.foreign_files;
        *self.state.lock() = st;
        Ok(rep)
    }

    /// Writes one bucket holding `objects` (key, bytes, crc32c) and indexes
    /// it. Nothing is indexed unless the file is complete and synced.
    pub fn write_bucket(&self, objects: &[(&str, &[u8], u32)]) -> Result<BucketRecord> {
        let delay = self.faults.write_delay_ms.load(Ordering::Relaxed);
        let pause = (delay > 0).then(|| Duration::from_millis(delay));
        if Faults::take(&self.faults.fail_writes) {
            return Err(Error::internal("injected bucket write failure"));
        }
        let bytes = bucket::file_len_for(objects);
        let used = self.state.lock().used;
        if used + bytes > self.capacity {
            return Err(Error::new(
                Code::NoSpace,
                format!(
                    "owner {} is at capacity: {used} of {} bytes used, bucket needs {bytes}",
                    self.handle, self.capacity
                ),
            ));
        }
        let id = self.index.reserve_bucket_id()?;
        let (objects_out, file_len) =
            bucket::write(&self.buckets_dir, self.owner_id, id, objects, pause)?;
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
        st.buckets.insert(id, rec.clone());
        Ok(rec)
    }

    /// Reads a granted range of a bucket. When the range is exactly one
    /// object, its checksum is verified: damaged bytes are never served.
    pub fn read(&self, bucket_id: u64, offset: u64, length: u64) -> Result<Vec<u8>> {
        let known = {
            let st = self.state.lock();
            if !st.buckets.contains_key(&bucket_id) {
                return Err(Error::not_found(format!(
                    "bucket {bucket_id} of owner {} does not exist (evicted or never written)",
                    self.handle
                )));
            }
            st.by_loc.get(&(bucket_id, offset)).copied()
        };
        let data = bucket::read_range(&self.path(bucket_id), offset, length)?;
        if let Some((len, crc)) = known {
            if len == length && crc32c::crc32c(&data) != crc {
                tracing::error!(
                    bucket = bucket_id,
                    offset,
                    "object failed its checksum on read"
                );
                return Err(Error::new(
                    Code::Corrupted,
                    format!("object at bucket {bucket_id} offset {offset} failed its checksum"),
                ));
            }
        }
        Ok(data)
    }

    pub fn stats(&self) -> Stats {
        let st = self.state.lock();
        Stats {
            used: st.used,
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
            .flat_map(|b| b.objects.iter().map(move |e| (b.bucket_id, e.clone())))
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
