//! Atomic overwrite (`PutStartRequest.overwrite`): the new version of a
//! committed key is written beside the old one (`Shard::insert_overwrite`)
//! and swapped in by its PutEnd under the key's shard lock, so a reader is
//! handed the old version or the new, never a mix. The old version's DRAM
//! is kept (`Retired`) until the read leases on it end, then freed.
//!
//! A version is named by the generation of one of its replicas' grants
//! (unique per allocation): an overwrite's PutEnd and revoke carry it, so a
//! late or repeated call can never commit or revoke another writer's bytes.
//! One overwrite of a key at a time: a second one, or one racing a plain put
//! still being written, is refused as retryable (`NotReady`) and the
//! client's backoff tries again once the first is done.
//!
//! Across a restart nothing here is needed: until a retired version's frees
//! reach its nodes, they hold both versions' records, and a rebuilding
//! master keeps the newest generation (`rebuild.rs`). The old version's SSD
//! copies are dropped at the swap and tombstoned, so no owner's inventory
//! brings them back.
//!
//! Locks: the shard lock is taken alone; `Retired`'s (`objects/retired.rs`)
//! after it is released.

use super::{commit_object, no_put_in_progress, Proof, PutEnd};
use crate::model::Model;
use crate::objects::validate_key;
use crate::objects::{Object, Shard};
use crate::offload::SsdTier;
use crate::pressure::Pressure;
use crate::sync::Unsynced;
use strata_common::time::unix_ms;
use strata_common::{Code, Error, Result};

/// Why an overwrite of `key` cannot start now (under its shard lock):
/// another put of it is being written.
pub(super) fn refusal(shard: &Shard, key: &str) -> Option<Error> {
    let busy = shard.overwrite(key).is_some() || shard.get(key).is_some_and(|o| !o.is_complete());
    busy.then(|| {
        Error::new(
            Code::NotReady,
            format!(
                "key {key:?} is being written by another put; the overwrite can start once it ends (retry)"
            ),
        )
    })
}

/// Commits the version of `key` whose replica has `generation`: an
/// overwrite in progress is swapped in; otherwise it is a put of an
/// absent key (or a version a rebuild adopted before this PutEnd).
pub(super) fn commit_version(
    m: Model,
    ssd: &SsdTier,
    pressure: &Pressure,
    end: &PutEnd,
    generation: u64,
) -> Result<(Unsynced, Option<u64>)> {
    let (key, crc32c) = (end.key, end.crc32c);
    validate_key(key)?;
    let mut shard = m.objects.shard(key);
    let Some(mut new) = shard.take_overwrite_if(key, |o| o.is_version(generation)) else {
        let obj = shard
            .get_mut(key)
            .filter(|o| o.is_version(generation))
            .ok_or_else(|| no_put_in_progress(key))?;
        return commit_object(m, obj, end);
    };
    let (mut unsynced, admit) = match commit_object(m, &mut new, end) {
        Ok(c) => c,
        Err(e) => {
            shard.insert_overwrite(key, new);
            return Err(e);
        }
    };
    // Offload tasks copying the old version unpin by key: the pins move
    // with the key, and their copies are refused as another version's
    // (`report_offload` checks size and checksum).
    if let Some(old) = shard.get(key) {
        new.pins = old.pins;
    }
    let size = new.size;
    let old = shard.insert(key, new);
    drop(shard);
    if let Some(old) = old {
        unsynced.extend(retire(m, ssd, pressure, key, old, size, crc32c));
    }
    Ok((unsynced, admit))
}

/// Revokes the overwrite of `key` whose replica has `generation`, if it
/// is in progress; the committed version stays.
pub(super) fn revoke(
    m: Model,
    pressure: &Pressure,
    key: &str,
    generation: u64,
    proof: Proof,
) -> Result<Option<Unsynced>> {
    let o = {
        let mut shard = m.objects.shard(key);
        if let Some(o) = shard.overwrite(key).filter(|o| o.is_version(generation)) {
            proof.check(key, o)?;
        }
        shard.take_overwrite_if(key, |o| o.is_version(generation))
    };
    let Some(o) = o else { return Ok(None) };
    m.metrics.keys.dec();
    let (_, unsynced) = o.release_unsynced();
    pressure.space_freed();
    Ok(Some(unsynced))
}

/// Puts a replaced version away: its SSD copies are dropped (and
/// tombstoned, unless the new version has the same bytes), its DRAM is
/// freed once its read leases, and any offload reading it, are over.
fn retire(
    m: Model,
    ssd: &SsdTier,
    pressure: &Pressure,
    key: &str,
    old: Object,
    new_size: u64,
    new_crc32c: u32,
) -> Unsynced {
    m.metrics.keys.dec();
    m.metrics.overwrites.inc();
    if (old.size, old.crc32c) != (new_size, new_crc32c) {
        m.tombstone(&[(key, &old)]);
    }
    let unsynced = ssd.forget(key, old.ssd());
    if old.replicas().is_empty() {
        return unsynced;
    }
    let now = unix_ms();
    let mut until = old.lease_until_ms;
    if old.pins > 0 {
        // Its copier holds a grant for the range until its task's
        // deadline, at most one task TTL from now.
        let ttl = m.cfg.offload_task_ttl.as_millis() as u64;
        until = until.max(now.saturating_add(ttl));
    }
    if until <= now {
        old.release();
        pressure.space_freed();
    } else {
        let kept = m.retired.keep(until, key, old);
        m.metrics.retired_bytes.set(kept as i64);
    }
    unsynced
}

/// Frees the replaced versions whose readers are done (housekeeping).
/// Returns how many.
pub(super) fn free_retired(m: Model, pressure: &Pressure, now_ms: u64) -> usize {
    let (due, kept) = m.retired.take_due(now_ms);
    m.metrics.retired_bytes.set(kept as i64);
    let n = due.len();
    for o in due {
        o.release();
    }
    if n > 0 {
        pressure.space_freed();
    }
    n
}

#[cfg(test)]
mod tests;
