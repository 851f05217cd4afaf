use super::DurableKv;
use futures::future::BoxFuture;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use strata_common::{Code, Error, Result};

/// The snapshot: every entry, as of the last compaction.
const FILE: &str = "master-state.json";
/// The changes since the snapshot, one JSON line each.
const LOG: &str = "master-state.log";
/// Written: 2 (a snapshot with a log beside it). Read: 1 (a snapshot
/// alone, as masters before the log wrote) and 2. A master that reads only
/// 1 refuses a state directory this one wrote, rather than missing the log.
const VERSION: u32 = 2;
/// The log is folded into the snapshot once it is larger than this and
/// twice the snapshot: each change costs O(1) amortised, not a rewrite of
/// every entry (which made N registrations cost O(N²)).
const COMPACT_MIN: u64 = 1 << 20;

#[derive(serde::Serialize, serde::Deserialize)]
struct OnDisk {
    version: u32,
    crc32c: u32,
    entries: BTreeMap<String, String>,
}

/// One change in the log.
#[derive(serde::Serialize, serde::Deserialize)]
struct LogLine {
    k: String,
    v: String,
    crc: u32,
}

fn pair_crc(crc: u32, k: &str, v: &str) -> u32 {
    let crc = crc32c::crc32c_append(crc, k.as_bytes());
    let crc = crc32c::crc32c_append(crc, &[0]);
    let crc = crc32c::crc32c_append(crc, v.as_bytes());
    crc32c::crc32c_append(crc, &[0])
}

fn entries_crc(e: &BTreeMap<String, String>) -> u32 {
    e.iter().fold(0, |crc, (k, v)| pair_crc(crc, k, v))
}

fn corrupted(path: &Path, what: impl std::fmt::Display) -> Error {
    Error::new(
        Code::Corrupted,
        format!(
            "{} {what}; restore it from backup or move it away",
            path.display()
        ),
    )
}

/// What is on disk, kept with the entries.
struct State {
    map: BTreeMap<String, String>,
    /// The log, opened for appending.
    log: File,
    log_bytes: u64,
    snapshot_bytes: u64,
    /// A failed append could not be taken back: nothing more is written
    /// (a reopen finds the state as of the last acknowledged change).
    broken: bool,
    compactions: u64,
}

/// Durable KV under `--state-dir`: a checksummed JSON snapshot and a log of
/// the changes since, each change appended and fsynced before it is
/// acknowledged, the log folded into the snapshot (write temp, fsync,
/// rename, fsync dir, then empty the log) when it outgrows it. A change cut
/// short by a crash is the log's last line, dropped when the state is
/// opened; damage anywhere else is refused. A lock file keeps a second
/// master off the same directory.
pub struct FileKv {
    dir: PathBuf,
    state: Arc<Mutex<State>>,
    _lock: File,
}

fn io_err(dir: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| Error::internal(format!("writing master state in {}: {e}", dir.display()))
}

/// The bytes of `path`, or `None` when there is no such file.
fn read_if_exists(path: &Path) -> Result<Option<Vec<u8>>> {
    match std::fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::internal(format!(
            "cannot read {}: {e}",
            path.display()
        ))),
    }
}

/// Reads the snapshot (empty when there is none).
fn read_snapshot(path: &Path) -> Result<BTreeMap<String, String>> {
    let Some(bytes) = read_if_exists(path)? else {
        return Ok(BTreeMap::new());
    };
    let d: OnDisk = serde_json::from_slice(&bytes)
        .map_err(|e| corrupted(path, format!("is not valid master state ({e})")))?;
    if d.version == 0 || d.version > VERSION {
        return Err(Error::invalid(format!(
            "{} has format version {}, this master reads 1 to {VERSION}",
            path.display(),
            d.version
        )));
    }
    if entries_crc(&d.entries) != d.crc32c {
        return Err(corrupted(path, "fails its checksum"));
    }
    Ok(d.entries)
}

/// Applies the log at `path` to `map`. A last line cut short (no newline,
/// or not a whole, intact change) is a write a crash interrupted, never
/// acknowledged: skipped (logged as an error when it had its newline; the
/// fold at open empties the log). Any other bad line is damage.
fn replay_log(path: &Path, map: &mut BTreeMap<String, String>) -> Result<()> {
    let Some(bytes) = read_if_exists(path)? else {
        return Ok(());
    };
    let mut at = 0;
    while at < bytes.len() {
        let end = bytes[at..].iter().position(|b| *b == b'\n').map(|i| at + i);
        let line = end.map(|e| &bytes[at..e]);
        let change = line
            .and_then(|l| serde_json::from_slice::<LogLine>(l).ok())
            .filter(|c| pair_crc(0, &c.k, &c.v) == c.crc);
        match (change, end) {
            (Some(c), Some(e)) => {
                map.insert(c.k, c.v);
                at = e + 1;
            }
            // The last line without its newline: cut short by a crash.
            (_, None) => break,
            // A whole last line that is not intact: the same crash, with
            // the newline's block written before the rest (never
            // acknowledged either way, since the sync comes after).
            (_, Some(e)) if e + 1 == bytes.len() => {
                tracing::error!(
                    file = %path.display(),
                    byte = at,
                    "the last master state change fails its check; dropping it as a torn write"
                );
                break;
            }
            (None, Some(_)) => {
                return Err(corrupted(
                    path,
                    format!("has a damaged change at byte {at} (not its last)"),
                ))
            }
        }
    }
    if at < bytes.len() {
        tracing::warn!(
            file = %path.display(),
            dropped_bytes = bytes.len() - at,
            "dropping a master state change cut short by a crash (never acknowledged)"
        );
    }
    Ok(())
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
        let mut map = read_snapshot(&dir.join(FILE))?;
        replay_log(&dir.join(LOG), &mut map)?;
        // Folded at once: the snapshot then carries this version, so an
        // older master refuses the directory instead of missing the log.
        let snapshot_bytes = Self::write_snapshot(dir, &map)?;
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(LOG))
            .map_err(io_err(dir))?;
        log.set_len(0).map_err(io_err(dir))?;
        log.sync_all().map_err(io_err(dir))?;
        Ok(FileKv {
            dir: dir.to_path_buf(),
            state: Arc::new(Mutex::new(State {
                map,
                log,
                log_bytes: 0,
                snapshot_bytes,
                broken: false,
                compactions: 0,
            })),
            _lock: lock,
        })
    }

    /// Writes every entry as the new snapshot, atomically; its size.
    fn write_snapshot(dir: &Path, entries: &BTreeMap<String, String>) -> Result<u64> {
        #[derive(serde::Serialize)]
        struct Out<'a> {
            version: u32,
            crc32c: u32,
            entries: &'a BTreeMap<String, String>,
        }
        let body = serde_json::to_vec_pretty(&Out {
            version: VERSION,
            crc32c: entries_crc(entries),
            entries,
        })
        .map_err(|e| Error::internal(e.to_string()))?;
        let tmp = dir.join(format!("{FILE}.tmp"));
        let io = io_err(dir);
        let mut f = File::create(&tmp).map_err(&io)?;
        f.write_all(&body).map_err(&io)?;
        f.sync_all().map_err(&io)?;
        std::fs::rename(&tmp, dir.join(FILE)).map_err(&io)?;
        File::open(dir).and_then(|d| d.sync_all()).map_err(&io)?;
        Ok(body.len() as u64)
    }

    /// Appends one change and syncs it; on failure the log is cut back to
    /// where it was (or, failing that, nothing more is written).
    fn append(dir: &Path, s: &mut State, key: &str, value: &str) -> Result<()> {
        if s.broken {
            return Err(Error::internal(format!(
                "master state in {} could not be written earlier; restart the master",
                dir.display()
            )));
        }
        let mut line = serde_json::to_vec(&LogLine {
            k: key.to_string(),
            v: value.to_string(),
            crc: pair_crc(0, key, value),
        })
        .map_err(|e| Error::internal(e.to_string()))?;
        line.push(b'\n');
        let written = s.log.write_all(&line).and_then(|_| s.log.sync_data());
        if let Err(e) = written {
            if s.log
                .set_len(s.log_bytes)
                .and_then(|_| s.log.sync_all())
                .is_err()
            {
                s.broken = true;
            }
            return Err(io_err(dir)(e));
        }
        s.log_bytes += line.len() as u64;
        Ok(())
    }

    /// Folds the log into the snapshot once it outgrew it.
    fn maybe_compact(dir: &Path, s: &mut State) -> Result<()> {
        if s.log_bytes <= COMPACT_MIN.max(2 * s.snapshot_bytes) {
            return Ok(());
        }
        s.snapshot_bytes = Self::write_snapshot(dir, &s.map)?;
        // A crash before this leaves a log whose changes the snapshot
        // holds already: replaying them again changes nothing.
        s.log.set_len(0).map_err(io_err(dir))?;
        // Emptied, synced or not: a failed append cuts back to here.
        s.log_bytes = 0;
        s.log.sync_all().map_err(io_err(dir))?;
        s.compactions += 1;
        tracing::debug!(
            entries = s.map.len(),
            compactions = s.compactions,
            "folded the master state log into its snapshot"
        );
        Ok(())
    }

    /// Times the log was folded into the snapshot since opening (tests).
    #[cfg(test)]
    pub(crate) fn compactions(&self) -> u64 {
        self.state.lock().compactions
    }
}

impl DurableKv for FileKv {
    fn get(&self, key: String) -> BoxFuture<'_, Result<Option<String>>> {
        let v = self.state.lock().map.get(&key).cloned();
        Box::pin(async move { Ok(v) })
    }

    fn compare_and_set(
        &self,
        key: String,
        expected: Option<String>,
        value: String,
    ) -> BoxFuture<'_, Result<bool>> {
        let (state, dir) = (self.state.clone(), self.dir.clone());
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                // Held across the write so changes reach the disk in order.
                let mut s = state.lock();
                if s.map.get(&key) != expected.as_ref() {
                    return Ok(false);
                }
                Self::append(&dir, &mut s, &key, &value)?;
                s.map.insert(key, value);
                // The change is durable in the log; a failed compaction
                // only leaves the log longer (tried again next change).
                if let Err(e) = Self::maybe_compact(&dir, &mut s) {
                    tracing::warn!(error = %e, "could not fold the master state log into its snapshot");
                }
                Ok(true)
            })
            .await
            .map_err(|e| Error::internal(format!("state write task failed: {e}")))?
        })
    }

    fn list(&self, prefix: String) -> BoxFuture<'_, Result<Vec<(String, String)>>> {
        let v = super::prefix_entries(&self.state.lock().map, &prefix);
        Box::pin(async move { Ok(v) })
    }

    fn name(&self) -> &'static str {
        "file"
    }
}
