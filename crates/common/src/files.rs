//! Files a service writes are its own: state (the master's grant key and
//! records), SSD buckets (users' data) and tokens. Services create them
//! readable by their own user only, whatever the environment's umask.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

/// Makes every file and directory this process creates from now on
/// private (0600 / 0700): called first thing by a service's `main`.
pub fn private_by_default() {
    // SAFETY: umask only swaps the process's file creation mask.
    unsafe {
        libc::umask(0o077);
    }
}

/// Makes a directory a service keeps state in private (0700) if this
/// process owns it and others may read or enter it. One it does not own
/// (a volume's root, say, shared through a group) is left alone, with a
/// warning: the files inside are private anyway.
pub fn tighten_dir(dir: &Path) {
    tighten_files_in(dir);
    let Ok(meta) = std::fs::metadata(dir) else {
        return;
    };
    let mode = meta.mode() & 0o777;
    if mode & 0o077 == 0 {
        return;
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        tracing::warn!(
            dir = %dir.display(),
            mode = format!("{mode:o}"),
            "state directory is open to other users and not owned by this one: left as is (the files in it are private)"
        );
        return;
    }
    match std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)) {
        Ok(()) => {
            tracing::info!(dir = %dir.display(), was = format!("{mode:o}"), "state directory made private (0700)")
        }
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot make the state directory private")
        }
    }
}

/// Files in `dir` this process owns that others could read (written by an
/// earlier release, or under another umask) become 0600: they would keep
/// their mode until rewritten otherwise.
fn tighten_files_in(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    for e in entries.flatten() {
        let Ok(meta) = e.metadata() else { continue };
        if meta.is_file() && meta.uid() == me && meta.mode() & 0o077 != 0 {
            if let Err(err) =
                std::fs::set_permissions(e.path(), std::fs::Permissions::from_mode(0o600))
            {
                tracing::warn!(file = %e.path().display(), error = %err, "cannot make a state file private");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// After `private_by_default`, what the process makes is its own; an
    /// open directory it owns is closed.
    #[test]
    fn what_a_service_makes_is_private() {
        private_by_default();
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("state");
        std::fs::write(&f, b"secret").unwrap();
        assert_eq!(std::fs::metadata(&f).unwrap().mode() & 0o777, 0o600);
        let sub = d.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        assert_eq!(std::fs::metadata(&sub).unwrap().mode() & 0o777, 0o700);
        std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o755)).unwrap();
        let old = sub.join("written-before");
        std::fs::write(&old, b"grant key").unwrap();
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o644)).unwrap();
        tighten_dir(&sub);
        assert_eq!(std::fs::metadata(&sub).unwrap().mode() & 0o777, 0o700);
        assert_eq!(std::fs::metadata(&old).unwrap().mode() & 0o777, 0o600);
    }
}
