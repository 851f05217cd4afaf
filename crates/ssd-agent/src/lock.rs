//! One process per owner: an exclusive lock file per handle in the data
//! directory, holding the holder's identity so a second process can say who
//! is in the way.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use strata_common::{Code, Error, Result};

/// Encodes a handle as one file-name component (`node-7/nvme0` →
/// `node-7%2Fnvme0`).
pub fn encode_handle(h: &str) -> String {
    let mut out = String::with_capacity(h.len());
    for b in h.bytes() {
        if b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Held for the life of the process; the OS releases it on any exit,
/// SIGKILL included.
pub struct HandleLock {
    _file: File,
    pub path: PathBuf,
}

pub fn lock_handle(owner_dir: &Path, handle: &str, instance: &str) -> Result<HandleLock> {
    std::fs::create_dir_all(owner_dir)
        .map_err(|e| Error::invalid(format!("cannot create {}: {e}", owner_dir.display())))?;
    let path = owner_dir.join("LOCK");
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| Error::invalid(format!("cannot open {}: {e}", path.display())))?;
    if f.try_lock().is_err() {
        let mut holder = String::new();
        let _ = f.read_to_string(&mut holder);
        return Err(Error::new(
            Code::AlreadyExists,
            format!(
                "handle {handle:?} is already held by a live process ({}) on this data directory (lock {})",
                holder.trim(),
                path.display()
            ),
        ));
    }
    f.set_len(0)
        .and_then(|_| f.rewind())
        .map_err(|e| Error::internal(e.to_string()))?;
    writeln!(f, "{instance}")
        .and_then(|_| f.sync_all())
        .map_err(|e| Error::internal(e.to_string()))?;
    Ok(HandleLock { _file: f, path })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_names_the_holder() {
        let d = tempfile::tempdir().unwrap();
        let _a = lock_handle(d.path(), "n/1", "pid 1@host").unwrap();
        let e = lock_handle(d.path(), "n/1", "pid 2@host").err().unwrap();
        assert!(
            e.message.contains("pid 1@host") && e.message.contains("n/1"),
            "{e}"
        );
        assert_eq!(encode_handle("node-7/nvme0"), "node-7%2Fnvme0");
        assert_ne!(
            encode_handle("a/b"),
            encode_handle("a%2Fb"),
            "encoding is injective"
        );
    }

    /// Lock directories made by earlier runs must be found again: the
    /// unreserved characters `.`, `_` and `-` stay as they are.
    #[test]
    fn unreserved_characters_are_not_escaped() {
        assert_eq!(encode_handle("node_7.a-b"), "node_7.a-b");
        assert_eq!(encode_handle("a b"), "a%20b");
    }
}
