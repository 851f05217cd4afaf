//! The owner's RocksDB index: bucket → objects, key → location, and the
//! persisted bucket-id counter. Keys are versioned (`v1/…`); values are JSON
//! so fields can be added compatibly. All calls block: run them off the
//! async runtime (`spawn_blocking`).

use crate::bucket::Entry;
use rocksdb::{Options, WriteBatch, WriteOptions, DB};
use std::path::Path;
use strata_common::{Code, Error, Result};

const OWNER_ID: &[u8] = b"v1/meta/owner_id";
const HANDLE: &[u8] = b"v1/meta/handle";
const NEXT_BUCKET: &[u8] = b"v1/meta/next_bucket";
const BUCKET_PREFIX: &str = "v1/bucket/";
const KEY_PREFIX: &str = "v1/key/";
/// `v1/dead/{bucket:016x}/{offset:016x}`: an object removed from Strata whose
/// bytes still sit in its bucket until the bucket is dropped.
const DEAD_PREFIX: &str = "v1/dead/";

fn dead_key(bucket_id: u64, offset: u64) -> String {
    format!("{DEAD_PREFIX}{bucket_id:016x}/{offset:016x}")
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BucketRecord {
    pub bucket_id: u64,
    pub file_len: u64,
    pub created_unix_ms: u64,
    pub objects: Vec<Entry>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KeyLocation {
    pub bucket_id: u64,
    pub offset: u64,
    pub length: u64,
    pub crc32c: u32,
}

/// RocksDB write buffer of the index (and so its WAL preallocation).
const WRITE_BUFFER: usize = 4 << 20;

/// Bucket ids are reserved durably in blocks of this many: a crash skips at
/// most a block of ids, and most buckets cost no extra synced write.
const ID_BLOCK: u64 = 64;

pub struct Index {
    db: DB,
    /// Next id to hand out and the end of the durably reserved block.
    ids: parking_lot::Mutex<(u64, u64)>,
    bad_records: std::sync::atomic::AtomicU64,
}

fn db_err(e: rocksdb::Error) -> Error {
    Error::internal(format!("index: {e}"))
}

fn sync() -> WriteOptions {
    let mut w = WriteOptions::default();
    w.set_sync(true);
    w
}

impl Index {
    pub fn open(path: &Path) -> Result<Index> {
        let mut o = Options::default();
        o.create_if_missing(true);
        // Sized for what the index holds (small records, a few per bucket),
        // not RocksDB's defaults: each WAL was preallocated to about 1.1 x
        // the write buffer (64 MiB by default) and the manifest to 4 MiB,
        // disk no capacity figure accounted for. Files now grow as written,
        // and their size counts against --capacity (`OwnerStore::overhead`).
        o.set_write_buffer_size(WRITE_BUFFER);
        o.set_max_write_buffer_number(2);
        o.set_max_total_wal_size(4 * WRITE_BUFFER as u64);
        o.set_manifest_preallocation_size(64 << 10);
        o.set_max_manifest_file_size(4 << 20);
        o.set_target_file_size_base(WRITE_BUFFER as u64);
        o.set_max_bytes_for_level_base(4 * WRITE_BUFFER as u64);
        o.set_keep_log_file_num(2);
        o.set_max_log_file_size(1 << 20);
        // Not in the crate's setters; the C++ option parser takes it.
        let o = o
            .get_options_from_string("allow_fallocate=false")
            .map_err(db_err)?;
        let db = DB::open(&o, path).map_err(|e| {
            Error::new(
                Code::Unavailable,
                format!("cannot open index {}: {e}", path.display()),
            )
        })?;
        Ok(Index {
            db,
            ids: parking_lot::Mutex::new((0, 0)),
            bad_records: Default::default(),
        })
    }

    fn get_u64(&self, k: &[u8]) -> Result<Option<u64>> {
        match self.db.get(k).map_err(db_err)? {
            None => Ok(None),
            Some(v) => Ok(Some(u64::from_le_bytes(v.as_slice().try_into().map_err(
                |_| {
                    Error::new(
                        Code::Corrupted,
                        format!("index value of {} is malformed", String::from_utf8_lossy(k)),
                    )
                },
            )?))),
        }
    }

    /// Binds the index to its owner on first use; afterwards refuses a
    /// different owner id (the master lost its durable state).
    pub fn bind_owner(&self, owner_id: u64, handle: &str) -> Result<()> {
        match self.get_u64(OWNER_ID)? {
            Some(id) if id == owner_id => Ok(()),
            Some(id) => Err(Error::new(
                Code::Corrupted,
                format!(
                    "the master maps handle {handle:?} to owner {owner_id}, but this index belongs to owner {id}: \
                     the master lost its --state-dir; restore it (or move this owner's directory away to start empty)"
                ),
            )),
            None => {
                let mut b = WriteBatch::default();
                b.put(OWNER_ID, owner_id.to_le_bytes());
                b.put(HANDLE, handle.as_bytes());
                self.db.write_opt(b, &sync()).map_err(db_err)
            }
        }
    }

    /// Hands out the next bucket id. The persisted counter always runs ahead
    /// of every id handed out (reserved before the file exists), so a crash
    /// can skip ids but never reuse one.
    pub fn reserve_bucket_id(&self) -> Result<u64> {
        let mut ids = self.ids.lock();
        if ids.0 >= ids.1 {
            let start = self.get_u64(NEXT_BUCKET)?.unwrap_or(1);
            self.db
                .put_opt(NEXT_BUCKET, (start + ID_BLOCK).to_le_bytes(), &sync())
                .map_err(db_err)?;
            *ids = (start, start + ID_BLOCK);
        }
        let id = ids.0;
        ids.0 += 1;
        Ok(id)
    }

    /// Records a written bucket and its keys in one atomic batch.
    pub fn add_bucket(&self, rec: &BucketRecord) -> Result<()> {
        let mut b = WriteBatch::default();
        b.put(
            format!("{BUCKET_PREFIX}{:016x}", rec.bucket_id),
            serde_json::to_vec(rec).map_err(|e| Error::internal(e.to_string()))?,
        );
        for e in &rec.objects {
            let loc = KeyLocation {
                bucket_id: rec.bucket_id,
                offset: e.offset,
                length: e.length,
                crc32c: e.crc32c,
            };
            b.put(
                format!("{KEY_PREFIX}{}", e.key),
                serde_json::to_vec(&loc).map_err(|e| Error::internal(e.to_string()))?,
            );
        }
        self.db.write_opt(b, &sync()).map_err(db_err)
    }

    /// Removes a bucket and the keys that still point into it.
    pub fn remove_bucket(&self, rec: &BucketRecord) -> Result<()> {
        let mut b = WriteBatch::default();
        b.delete(format!("{BUCKET_PREFIX}{:016x}", rec.bucket_id));
        b.delete_range(
            format!("{DEAD_PREFIX}{:016x}/", rec.bucket_id),
            format!("{DEAD_PREFIX}{:016x}0", rec.bucket_id),
        );
        for e in &rec.objects {
            if self
                .key(&e.key)?
                .is_some_and(|l| l.bucket_id == rec.bucket_id)
            {
                b.delete(format!("{KEY_PREFIX}{}", e.key));
            }
        }
        self.db.write_opt(b, &sync()).map_err(db_err)
    }

    /// Records that the objects at `(key, bucket, offset)` were removed, and
    /// drops each key's location if it still points there, in one synced
    /// batch.
    pub fn mark_dead(&self, objects: &[(&str, u64, u64)]) -> Result<()> {
        let mut b = WriteBatch::default();
        for &(key, bucket_id, offset) in objects {
            b.put(dead_key(bucket_id, offset), b"");
            if self
                .key(key)?
                .is_some_and(|l| l.bucket_id == bucket_id && l.offset == offset)
            {
                b.delete(format!("{KEY_PREFIX}{key}"));
            }
        }
        self.db.write_opt(b, &sync()).map_err(db_err)
    }

    /// Every removed object still inside a bucket: (bucket, offset).
    pub fn dead(&self) -> Result<Vec<(u64, u64)>> {
        let mut out = Vec::new();
        for item in self.db.prefix_iterator(DEAD_PREFIX.as_bytes()) {
            let (k, _) = item.map_err(db_err)?;
            let Some(rest) = k.strip_prefix(DEAD_PREFIX.as_bytes()) else {
                break;
            };
            let parsed = std::str::from_utf8(rest).ok().and_then(|r| {
                let (b, o) = r.split_once('/')?;
                Some((
                    u64::from_str_radix(b, 16).ok()?,
                    u64::from_str_radix(o, 16).ok()?,
                ))
            });
            match parsed {
                Some(v) => out.push(v),
                None => self.drop_bad(&k, "malformed key"),
            }
        }
        Ok(out)
    }

    /// A record that does not parse is data from disk, not a reason to stop:
    /// it is logged, counted and deleted (its bucket file, if any, is then
    /// unknown to the index and quarantined by recovery).
    fn drop_bad(&self, k: &[u8], why: &str) {
        tracing::warn!(
            record = %String::from_utf8_lossy(k),
            why,
            "bad index record; dropping it"
        );
        self.bad_records
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Err(e) = self.db.delete(k) {
            tracing::warn!(error = %e, "cannot delete a bad index record");
        }
    }

    /// Bad records dropped since the index was opened.
    pub fn bad_records(&self) -> u64 {
        self.bad_records.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn key(&self, key: &str) -> Result<Option<KeyLocation>> {
        match self.db.get(format!("{KEY_PREFIX}{key}")).map_err(db_err)? {
            None => Ok(None),
            Some(v) => serde_json::from_slice(&v)
                .map(Some)
                .map_err(|e| Error::new(Code::Corrupted, format!("index entry of {key:?}: {e}"))),
        }
    }

    pub fn buckets(&self) -> Result<Vec<BucketRecord>> {
        let mut out = Vec::new();
        for item in self.db.prefix_iterator(BUCKET_PREFIX.as_bytes()) {
            let (k, v) = item.map_err(db_err)?;
            if !k.starts_with(BUCKET_PREFIX.as_bytes()) {
                break;
            }
            match serde_json::from_slice(&v) {
                Ok(r) => out.push(r),
                Err(e) => self.drop_bad(&k, &e.to_string()),
            }
        }
        Ok(out)
    }

    pub fn flush(&self) -> Result<()> {
        self.db.flush().map_err(db_err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The index takes what it holds, not RocksDB's default preallocation
    /// (a 72 MiB WAL for a few hundred records, once).
    #[test]
    fn a_small_index_takes_little_disk() {
        let d = tempfile::tempdir().unwrap();
        let ix = Index::open(d.path()).unwrap();
        ix.bind_owner(7, "h").unwrap();
        for b in 1..=200u64 {
            let objects = (0..4)
                .map(|i| Entry {
                    key: format!("key-{b}-{i}"),
                    offset: 64 + i * 4096,
                    length: 4000,
                    crc32c: 5,
                    record: Vec::new(),
                })
                .collect();
            let rec = BucketRecord {
                bucket_id: b,
                file_len: 1 << 20,
                created_unix_ms: 1,
                objects,
            };
            ix.add_bucket(&rec).unwrap();
        }
        let du = crate::store::allocated_bytes(d.path(), 2);
        assert!(du > 0);
        assert!(du < 1 << 20, "a 200-bucket index takes {du} bytes of disk");
    }

    #[test]
    fn counter_owner_and_buckets_persist() {
        let d = tempfile::tempdir().unwrap();
        {
            let ix = Index::open(d.path()).unwrap();
            ix.bind_owner(7, "h").unwrap();
            assert_eq!(ix.reserve_bucket_id().unwrap(), 1);
            assert_eq!(ix.reserve_bucket_id().unwrap(), 2);
            let rec = BucketRecord {
                bucket_id: 2,
                file_len: 100,
                created_unix_ms: 1,
                objects: vec![Entry {
                    key: "k".into(),
                    offset: 64,
                    length: 10,
                    crc32c: 5,
                    record: b"the master's record".to_vec(),
                }],
            };
            ix.add_bucket(&rec).unwrap();
        }
        let ix = Index::open(d.path()).unwrap();
        assert!(ix
            .bind_owner(8, "h")
            .unwrap_err()
            .message
            .contains("lost its --state-dir"));
        ix.bind_owner(7, "h").unwrap();
        let next = ix.reserve_bucket_id().unwrap();
        assert!(next > 2, "never reuses an id after restart: got {next}");
        assert_eq!(ix.reserve_bucket_id().unwrap(), next + 1);
        let b = ix.buckets().unwrap();
        assert_eq!(b.len(), 1);
        assert_eq!(
            b[0].objects[0].record, b"the master's record",
            "kept with the copy"
        );
        assert_eq!(ix.key("k").unwrap().unwrap().bucket_id, 2);
        ix.mark_dead(&[("k", 2, 64)]).unwrap();
        assert!(ix.key("k").unwrap().is_none());
        assert_eq!(ix.dead().unwrap(), vec![(2, 64)]);
        ix.remove_bucket(&b[0]).unwrap();
        assert!(ix.key("k").unwrap().is_none());
        assert!(ix.dead().unwrap().is_empty());
        assert!(ix.buckets().unwrap().is_empty());
    }

    #[test]
    fn bad_records_are_dropped_not_fatal() {
        let d = tempfile::tempdir().unwrap();
        let ix = Index::open(d.path()).unwrap();
        let rec = BucketRecord {
            bucket_id: 3,
            file_len: 100,
            created_unix_ms: 1,
            objects: vec![],
        };
        ix.add_bucket(&rec).unwrap();
        ix.db
            .put(format!("{BUCKET_PREFIX}zz"), b"{not json")
            .unwrap();
        ix.db.put(format!("{DEAD_PREFIX}nothex"), b"").unwrap();
        ix.mark_dead(&[("k", 3, 64)]).unwrap();
        assert_eq!(ix.buckets().unwrap().len(), 1);
        assert_eq!(ix.dead().unwrap(), vec![(3, 64)]);
        assert_eq!(ix.bad_records(), 2);
        // Deleted: the next scan is clean.
        assert_eq!(ix.buckets().unwrap().len(), 1);
        assert_eq!(ix.dead().unwrap().len(), 1);
        assert_eq!(ix.bad_records(), 2);
    }
}
