use super::DurableKv;
use futures::future::BoxFuture;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use strata_common::{Error, Result};

const FILE: &str = "master-state.json";
const VERSION: u32 = 1;

#[derive(serde::Serialize, serde::Deserialize)]
struct OnDisk {
    version: u32,
    crc32c: u32,
    entries: BTreeMap<String, String>,
}

fn entries_crc(e: &BTreeMap<String, String>) -> u32 {
    let mut crc = 0;
    for (k, v) in e {
        crc = crc32c::crc32c_append(crc, k.as_bytes());
        crc = crc32c::crc32c_append(crc, &[0]);
        crc = crc32c::crc32c_append(crc, v.as_bytes());
        crc = crc32c::crc32c_append(crc, &[0]);
    }
    crc
}

/// Durable KV in one checksummed JSON file under `--state-dir`, rewritten
/// atomically (write temp, fsync, rename, fsync dir) on every change. Changes
/// are rare (registrations), so simplicity wins over throughput. A lock file
/// keeps a second master off the same directory.
pub struct FileKv {
    dir: PathBuf,
    map: Arc<Mutex<BTreeMap<String, String>>>,
    _lock: File,
}

impl FileKv {
    pub fn open(dir: &Path) -> Result<FileKv> {
        std::fs::create_dir_all(dir).map_err(|e| {
            Error::invalid(format!("cannot create --state-dir {}: {e}", dir.display()))
        })?;
        let lock_path = dir.join("master.lock");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| Error::invalid(format!("cannot open {}: {e}", lock_path.display())))?;
        if lock.try_lock().is_err() {
            return Err(Error::invalid(format!(
                "--state-dir {} is in use by another strata-master (lock {})",
                dir.display(),
                lock_path.display()
            )));
        }
        let path = dir.join(FILE);
        let map = match std::fs::read(&path) {
            Ok(bytes) => {
                let d: OnDisk = serde_json::from_slice(&bytes).map_err(|e| {
                    Error::new(
                        strata_common::Code::Corrupted,
                        format!("{} is not valid master state ({e}); restore it from backup or move it away", path.display()),
                    )
                })?;
                if d.version != VERSION {
                    return Err(Error::invalid(format!(
                        "{} has format version {}, this master reads {VERSION}",
                        path.display(),
                        d.version
                    )));
                }
                if entries_crc(&d.entries) != d.crc32c {
                    return Err(Error::new(
                        strata_common::Code::Corrupted,
                        format!(
                            "{} fails its checksum; restore it from backup or move it away",
                            path.display()
                        ),
                    ));
                }
                d.entries
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => {
                return Err(Error::internal(format!(
                    "cannot read {}: {e}",
                    path.display()
                )))
            }
        };
        Ok(FileKv {
            dir: dir.to_path_buf(),
            map: Arc::new(Mutex::new(map)),
            _lock: lock,
        })
    }

    fn persist(dir: &Path, entries: &BTreeMap<String, String>) -> Result<()> {
        let body = serde_json::to_vec_pretty(&OnDisk {
            version: VERSION,
            crc32c: entries_crc(entries),
            entries: entries.clone(),
        })
        .map_err(|e| Error::internal(e.to_string()))?;
        let tmp = dir.join(format!("{FILE}.tmp"));
        let io = |e: std::io::Error| {
            Error::internal(format!("writing master state in {}: {e}", dir.display()))
        };
        let mut f = File::create(&tmp).map_err(io)?;
        f.write_all(&body).map_err(io)?;
        f.sync_all().map_err(io)?;
        std::fs::rename(&tmp, dir.join(FILE)).map_err(io)?;
        File::open(dir).and_then(|d| d.sync_all()).map_err(io)?;
        Ok(())
    }
}

impl DurableKv for FileKv {
    fn get(&self, key: String) -> BoxFuture<'_, Result<Option<String>>> {
        let v = self.map.lock().get(&key).cloned();
        Box::pin(async move { Ok(v) })
    }

    fn compare_and_set(
        &self,
        key: String,
        expected: Option<String>,
        value: String,
    ) -> BoxFuture<'_, Result<bool>> {
        let (map, dir) = (self.map.clone(), self.dir.clone());
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                // Held across the write so changes reach the disk in order.
                let mut m = map.lock();
                if m.get(&key) != expected.as_ref() {
                    return Ok(false);
                }
                let mut next = m.clone();
                next.insert(key, value);
                Self::persist(&dir, &next)?;
                *m = next;
                Ok(true)
            })
            .await
            .map_err(|e| Error::internal(format!("state write task failed: {e}")))?
        })
    }

    fn list(&self, prefix: String) -> BoxFuture<'_, Result<Vec<(String, String)>>> {
        let v = super::prefix_entries(&self.map.lock(), &prefix);
        Box::pin(async move { Ok(v) })
    }

    fn name(&self) -> &'static str {
        "file"
    }
}
