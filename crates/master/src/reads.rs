//! The read path: a lookup leases a committed object to its reader and
//! grants its replicas (`get_replicas`), the reader ends its lease when its
//! read is done and reads a client served from its location cache are
//! counted as lookups (`report`: `end_leases`, `count_reads`), and `inspect`,
//! `exists` and `committed_size` answer without a lease. Reads change no
//! owner's state but the objects' leases and read counts, so these are
//! functions over the shared model; the SSD tier hears of each read for its
//! admission and promotions.
//!
//! Locks: a key's shard lock alone; released before the SSD tier's.

use crate::model::Model;
use crate::objects::validate_key;
use crate::offload::SsdTier;
use crate::rebuild::RebuildGate;
use strata_common::grant::PERM_READ;
use strata_common::time::unix_ms;
use strata_common::{Code, Error, Result};
use strata_proto as pb;

/// A lookup: leases a committed object to the reader and grants its
/// replicas, memory first, then SSD; with `stage` (an rdma caller), SSD
/// grants also allow staging for a one-sided read.
pub(crate) fn get_replicas(
    m: Model,
    tier: &SsdTier,
    gate: &RebuildGate,
    key: &str,
    stage: bool,
) -> Result<pb::GetReplicasResponse> {
    validate_key(key)?;
    let now = unix_ms();
    let (size, crc, digest, replicas, ssd, lease, reads) = {
        let mut shard = m.objects.shard(key);
        let Some(obj) = shard.get_mut(key) else {
            drop(shard);
            tier.admission().lookup_miss(key);
            m.metrics.lookups.with_label_values(&["miss"]).inc();
            return Err(gate.absent(key));
        };
        if !obj.is_complete() {
            return Err(Error::new(
                Code::NotReady,
                format!("key {key:?} is not ready: it is still being written (no PutEnd yet)"),
            ));
        }
        let ttl = m.cfg.lease_ttl.as_millis() as u64;
        let held = obj.lease(now, ttl, m.cfg.max_lease().as_millis() as u64);
        if !held {
            m.metrics.capped_leases.inc();
        }
        obj.last_access_ms = now;
        if !obj.replicas().is_empty() {
            obj.reads = obj.reads.saturating_add(1);
        }
        let ssd = obj.ssd().to_vec();
        (
            obj.size,
            obj.crc32c,
            obj.digest(),
            obj.replicas().to_vec(),
            ssd,
            // A reader past --max-lease gets no lease (nothing to end, no
            // location to cache) but the grants to read (below).
            held.then_some(obj.lease_until_ms),
            obj.reads,
        )
    };
    // Grants never depended on the lease: a freed range is refused by its
    // node.
    let grant_until = now + m.cfg.lease_ttl.as_millis() as u64;
    let served = match (replicas.is_empty(), ssd.is_empty()) {
        (false, _) => "dram",
        (true, false) => "ssd",
        (true, true) => "miss",
    };
    m.metrics.lookups.with_label_values(&[served]).inc();
    if !replicas.is_empty() {
        tier.admit_on_read(m.metrics, key, size, u32::from(reads), !ssd.is_empty());
    } else {
        tier.admission().lookup_miss(key);
        if let Some(r) = ssd.first() {
            tier.maybe_promote(m, key, r.owner_id);
        }
    }
    // Memory first, then SSD (served by the owning agent).
    let mut views: Vec<pb::Replica> = replicas
        .iter()
        .map(|r| r.view(size, PERM_READ, grant_until, true))
        .collect();
    views.extend(
        ssd.iter()
            .filter_map(|r| tier.replica_view(r, grant_until, now, stage)),
    );
    if views.is_empty() {
        // Nothing to read: the lease taken above ends with this answer
        // (a reader retrying would count one more each time).
        if let Some(o) = m
            .objects
            .shard(key)
            .get_mut(key)
            .filter(|_| lease.is_some())
        {
            o.end_lease(now);
        }
        return Err(Error::unavailable(format!(
            "key {key:?} has no live replica"
        )));
    }
    Ok(pb::GetReplicasResponse {
        size,
        crc32c: crc,
        replicas: views,
        lease_until_unix_ms: lease.unwrap_or(0),
        lease_ms: lease.map_or(0, |l| l.saturating_sub(now)),
        blake3: digest.map(Vec::from).unwrap_or_default(),
    })
}

/// A client's report (`ReportReads`): the leases its reads are done with
/// end, and the reads it served from its location cache are counted. All
/// or nothing: every key is checked before anything is applied. Returns
/// how many leases ended.
pub(crate) fn report(m: Model, tier: &SsdTier, req: &pb::ReportReadsRequest) -> Result<u64> {
    let keys = req.reads.iter().map(|r| &r.key);
    for k in keys.chain(req.ended.iter().map(|e| &e.key)) {
        validate_key(k)?;
    }
    let ended = end_leases(m, &req.ended);
    count_reads(m, tier, &req.reads);
    Ok(ended)
}

/// Counts reads a client served from its location cache, as if each
/// had been a lookup: read-count admission and LRU age see them. Never
/// extends a lease (the client's cache lives inside the one it was
/// given). Keys gone meanwhile are skipped.
fn count_reads(m: Model, tier: &SsdTier, reads: &[pb::KeyReads]) {
    let now = unix_ms();
    let mut total = 0u64;
    for r in reads.iter().filter(|r| r.count > 0) {
        let (size, n, on_ssd) = {
            let mut shard = m.objects.shard(&r.key);
            let Some(obj) = shard.get_mut(&r.key) else {
                continue;
            };
            if !obj.is_complete() || obj.replicas().is_empty() {
                continue;
            }
            obj.last_access_ms = obj.last_access_ms.max(now);
            let add = u16::try_from(r.count).unwrap_or(u16::MAX);
            obj.reads = obj.reads.saturating_add(add);
            (obj.size, obj.reads, !obj.ssd().is_empty())
        };
        total += u64::from(r.count);
        tier.admit_on_read(m.metrics, &r.key, size, u32::from(n), on_ssd);
    }
    m.metrics.cached_reads.inc_by(total);
}

/// Ends the leases readers are done with (`LeaseEnd`): each names the
/// version it read by a memory replica's generation (0: it read an SSD
/// copy, and the object still has no memory replica). A lease of another
/// version, or one that ended already, is left alone. Returns the leases
/// ended.
///
/// Any client may end a lease, its own or another's: that costs the other
/// reader at most a retried read (an evicted range is refused by its node
/// and a changed one fails its checksum), never wrong bytes.
fn end_leases(m: Model, ended: &[pb::LeaseEnd]) -> u64 {
    let now = unix_ms();
    let (mut done, mut stale) = (0u64, 0u64);
    for e in ended {
        let mut shard = m.objects.shard(&e.key);
        let ended = shard.get_mut(&e.key).is_some_and(|o| {
            let same = match e.generation {
                0 => o.replicas().is_empty(),
                g => o.is_version(g),
            };
            same && o.is_complete() && o.end_lease(now)
        });
        drop(shard);
        // Or a reader of a version an overwrite replaced (freed once its
        // last reader is done).
        let ended = ended || m.retired.end_lease(&e.key, e.generation, now);
        if ended {
            done += 1;
        } else {
            stale += 1;
        }
    }
    m.metrics
        .lease_ends
        .with_label_values(&["ended"])
        .inc_by(done);
    m.metrics
        .lease_ends
        .with_label_values(&["stale"])
        .inc_by(stale);
    done
}

/// A key's metadata for `strata inspect`: no lease, no grants.
pub(crate) fn inspect(m: Model, tier: &SsdTier, key: &str) -> Result<pb::InspectResponse> {
    validate_key(key)?;
    let shard = m.objects.shard(key);
    let o = shard
        .get(key)
        .ok_or_else(|| Error::not_found(format!("key {key:?} not found")))?;
    let complete = o.is_complete();
    let now = unix_ms();
    let mut replicas: Vec<pb::Replica> = o
        .replicas()
        .iter()
        .map(|r| pb::Replica {
            grant: None,
            ..r.view(o.size, 0, 0, complete)
        })
        .collect();
    replicas.extend(
        o.ssd()
            .iter()
            .filter_map(|r| tier.replica_view(r, 0, now, false))
            .map(|r| pb::Replica { grant: None, ..r }),
    );
    Ok(pb::InspectResponse {
        key: key.to_string(),
        size: o.size,
        crc32c: o.crc32c,
        complete,
        replicas,
        lease_until_unix_ms: o.lease_until_ms,
        hard_pin: o.hard_pin(),
        soft_pin: o.soft_pin(),
    })
}

/// Whether `key` is committed (an error while the rebuild window leaves
/// its absence unsure).
pub(crate) fn exists(m: Model, gate: &RebuildGate, key: &str) -> Result<bool> {
    validate_key(key)?;
    let found = m
        .objects
        .shard(key)
        .get(key)
        .is_some_and(|o| o.is_complete());
    if !found && !gate.open() {
        return Err(gate.absent(key));
    }
    Ok(found)
}

/// The committed size of `key`, `None` when it is absent (an error
/// while the rebuild window leaves its absence unsure, as `exists`).
pub(crate) fn committed_size(m: Model, gate: &RebuildGate, key: &str) -> Result<Option<u64>> {
    validate_key(key)?;
    let size = m
        .objects
        .shard(key)
        .get(key)
        .filter(|o| o.is_complete())
        .map(|o| o.size);
    if size.is_none() && !gate.open() {
        return Err(gate.absent(key));
    }
    Ok(size)
}
