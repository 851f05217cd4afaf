//! Removals: `remove` takes one committed key out of the table (refused
//! while it is written, copied to SSD or leased, unless forced) and
//! `remove_all` every committed key. A removal leaves a tombstone when SSD
//! copies may exist, tells their owners to drop them, and frees the DRAM;
//! the caller waits for the nodes' and owners' confirmations as a PutEnd
//! does (`crate::sync`).
//!
//! Locks: a key's shard lock, then (inside it) the rebuild gate's member
//! list for the "not known yet" answer; the tombstone log and the SSD
//! tier's drop queue only after the shard lock is released.

use super::Writes;
use crate::model::Model;
use crate::objects::{validate_key, Object};
use crate::offload::SsdTier;
use crate::pressure::Pressure;
use crate::rebuild::Removing;
use crate::sync::Unsynced;
use strata_common::time::unix_ms;
use strata_common::{Code, Error, Result};

impl Writes {
    /// Removes a key; the frees reach its nodes' records with their next
    /// heartbeat, and the caller waits for that as a PutEnd does (a master
    /// that dies right after must not leave the removed object in the
    /// records its successor rebuilds from).
    pub(crate) fn remove(
        &self,
        m: Model,
        ssd: &SsdTier,
        pressure: &Pressure,
        removing: Removing,
        key: &str,
        force: bool,
    ) -> Result<Unsynced> {
        let Removing { gate, watermark } = removing;
        validate_key(key)?;
        let now = unix_ms();
        let obj = {
            let mut shard = m.objects.shard(key);
            let obj = shard.get(key).ok_or_else(|| gate.absent(key))?;
            if !force && !obj.is_complete() {
                return Err(Error::new(
                    Code::NotReady,
                    format!("key {key:?} is being written; revoke the put or remove with force"),
                ));
            }
            if !force && obj.pins > 0 {
                return Err(Error::new(
                    Code::Leased,
                    format!(
                        "key {key:?} is being copied to SSD; retry shortly or remove with force"
                    ),
                ));
            }
            if !force && obj.leased(now) {
                return Err(Error::new(
                    Code::Leased,
                    format!(
                        "key {key:?} is leased to a reader for another {} ms; retry later or remove with force",
                        obj.lease_until_ms - now
                    ),
                ));
            }
            // A member yet to report must not bring it back.
            gate.note_removed(key, watermark.max(newest_generation(obj) + 1));
            // Nor an overwrite of it still being written: its nodes may
            // hold it announced, and a rebuild would adopt it, bringing the
            // key back after its removal was answered (found by the HA
            // nemesis). Its writer's PutEnd finds it gone and starts over.
            let pending = shard.take_overwrite_if(key, |_| true);
            shard.remove(key).map(|o| (o, pending))
        };
        if let Some((o, pending)) = obj {
            m.metrics.keys.dec();
            m.tombstone(&[(key, &o)]);
            let mut unsynced = ssd.forget(key, o.ssd());
            unsynced.extend(o.release_unsynced().1);
            if let Some(p) = pending {
                m.metrics.keys.dec();
                unsynced.extend(p.release_unsynced().1);
            }
            pressure.space_freed();
            return Ok(unsynced);
        }
        Ok(Default::default())
    }

    /// Removes every committed object; leased ones are skipped unless `force`.
    /// Objects being written are always skipped. Returns (removed, skipped).
    pub(crate) fn remove_all(
        &self,
        m: Model,
        ssd: &SsdTier,
        pressure: &Pressure,
        removing: Removing,
        force: bool,
    ) -> (u64, u64) {
        let Removing { gate, watermark } = removing;
        let now = unix_ms();
        let (mut removed, mut skipped) = (0, 0);
        for shard in m.objects.shards() {
            let victims: Vec<(String, Object)> = {
                let mut s = shard.lock();
                let keys: Vec<String> = s
                    .iter()
                    .filter_map(|(k, o)| {
                        if o.is_complete() && (force || (!o.leased(now) && o.pins == 0)) {
                            Some(k.to_string())
                        } else {
                            skipped += 1;
                            None
                        }
                    })
                    .collect();
                keys.into_iter()
                    .filter_map(|k| {
                        let o = s.remove(&k)?;
                        gate.note_removed(&k, watermark.max(newest_generation(&o) + 1));
                        // As `remove`: an overwrite of it being written goes too.
                        if let Some(p) = s.take_overwrite_if(&k, |_| true) {
                            m.metrics.keys.dec();
                            p.release();
                        }
                        Some((k, o))
                    })
                    .collect()
            };
            removed += victims.len() as u64;
            m.metrics.keys.sub(victims.len() as i64);
            let refs: Vec<(&str, &Object)> = victims.iter().map(|(k, o)| (k.as_str(), o)).collect();
            m.tombstone(&refs);
            for (k, o) in victims {
                ssd.forget(&k, o.ssd());
                o.release();
            }
        }
        pressure.space_freed();
        (removed, skipped)
    }
}

/// The newest generation among an object's DRAM copies (0 with none).
fn newest_generation(o: &Object) -> u64 {
    o.replicas().iter().map(|r| r.generation).max().unwrap_or(0)
}
