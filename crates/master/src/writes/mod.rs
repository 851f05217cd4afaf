//! Puts: PutStart records a put whose space is allocated (`start`), PutEnd
//! commits it (`commit`, `commit_object`), a revoke takes it back
//! (`revoke`), and a put never ended is reclaimed after `--put-timeout`
//! (`reclaim_expired`). `Writes` owns the ids PutStart hands out and the
//! deadlines by which their PutEnd must come; the objects themselves live
//! in the shared model. Atomic overwrite: `overwrite.rs`; the records nodes
//! keep of puts and their receipts: `records.rs`.
//!
//! Locks: `pending` is a leaf, never held with a shard's; a shard lock is
//! released before `Retired`'s and before any `SsdTier` lock.

mod overwrite;
pub(crate) mod records;
mod removal;
#[cfg(test)]
mod tests;

use crate::cluster::Replica;
use crate::config::Integrity;
use crate::grants::TermKeys;
use crate::model::Model;
use crate::objects::{validate_key, ObjState, Object, MAX_REPLICAS};
use crate::offload::SsdTier;
use crate::pressure::Pressure;
use crate::sync::Unsynced;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;
use strata_common::grant::{same_mac, PERM_WRITE};
use strata_common::time::unix_ms;
use strata_common::{Code, Error, Result};
use strata_proto as pb;

/// What PutStart/PutEnd callers ask for.
#[derive(Debug, Clone, Default)]
pub struct PutSpec {
    pub key: String,
    pub size: u64,
    pub replica_num: u32,
    pub preferred_segment: Option<u64>,
    pub soft_pin: bool,
    pub hard_pin: bool,
    /// The checksum the client declared at PutStart, if any.
    pub crc32c: Option<u32>,
    /// With the checksum: the client's writes carry records and PutEnd
    /// brings the nodes' receipts (`PutStartRequest.receipts`).
    pub receipts: bool,
    /// Replace a committed key atomically (`overwrite.rs`).
    pub overwrite: bool,
    /// Bind the put to its starter (`PutStartRequest.bind`): its end or
    /// revoke must bring the put token.
    pub bind: bool,
    /// The client's name for this logical put across its retries
    /// (`PutStartRequest.attempt`; 0: none).
    pub attempt: u64,
}

impl From<pb::PutStartRequest> for PutSpec {
    fn from(r: pb::PutStartRequest) -> Self {
        PutSpec {
            key: r.key,
            size: r.size,
            replica_num: r.replica_num,
            preferred_segment: r.preferred_segment,
            soft_pin: r.soft_pin,
            hard_pin: r.hard_pin,
            crc32c: r.crc32c,
            receipts: r.receipts,
            overwrite: r.overwrite,
            bind: r.bind,
            attempt: r.attempt,
        }
    }
}

/// What a PutEnd names: the put's key, its checksum, its nodes' receipts
/// and, for an overwrite, its version; and what proves it is the put's.
pub(crate) struct PutEnd<'a> {
    pub(crate) key: &'a str,
    pub(crate) crc32c: u32,
    /// The writer's BLAKE3 digest (`PutEndRequest.blake3`).
    pub(crate) digest: Option<[u8; 32]>,
    pub(crate) receipts: &'a [pb::PutReceipt],
    pub(crate) generation: Option<u64>,
    pub(crate) proof: Proof<'a>,
}

/// What a PutEnd or revoke brings to show it belongs to the put: the put
/// token (`PutStartRequest.bind`), which a bound put's must be.
#[derive(Clone, Copy)]
pub(crate) struct Proof<'a> {
    pub(crate) keys: &'a TermKeys,
    pub(crate) token: Option<&'a [u8]>,
}

impl Proof<'_> {
    /// Refuses to end a bound put being written without its token.
    pub(crate) fn check(&self, key: &str, o: &Object) -> Result<()> {
        let Some(g) = o.bound_generation() else {
            return Ok(());
        };
        match self.token {
            Some(t) if same_mac(&self.keys.put_token(key, g), t) => Ok(()),
            _ => Err(Error::new(
                Code::PermissionDenied,
                format!(
                    "the put of {key:?} being written is bound to the client that started it: \
                     only a PutEnd or PutRevoke with the put token PutStart answered ends it"
                ),
            )),
        }
    }
}

/// The puts this term started and has not seen end.
pub(crate) struct Writes {
    next_put_id: AtomicU64,
    /// In-flight puts in deadline order (the timeout is constant, so FIFO):
    /// (deadline, key, put id). A leaf lock.
    pending: Mutex<VecDeque<(Instant, String, u64)>>,
}

impl Writes {
    pub(crate) fn new() -> Writes {
        Writes {
            next_put_id: AtomicU64::new(1),
            pending: Mutex::new(VecDeque::new()),
        }
    }

    /// Checks a PutStart before any space is allocated for it: `Some` when
    /// it repeats a put its client's attempt started and is still writing
    /// (its answer was lost), with that put's replicas again.
    pub(crate) fn check(&self, m: Model, spec: &PutSpec) -> Result<Option<Vec<pb::Replica>>> {
        validate_key(&spec.key)?;
        if spec.size == 0 {
            return Err(Error::invalid("object size must be positive"));
        }
        if spec.replica_num == 0 || spec.replica_num > MAX_REPLICAS {
            return Err(Error::invalid(format!(
                "replica_num must be between 1 and {MAX_REPLICAS}, got {}",
                spec.replica_num
            )));
        }
        if let Some(Ok(views)) = own_put(m, spec) {
            m.metrics.resumed_puts.inc();
            return Ok(Some(views));
        }
        if spec.overwrite {
            match overwrite::refusal(&m.objects.shard(&spec.key), &spec.key) {
                Some(e) => Err(e),
                None => Ok(None),
            }
        } else {
            check_absent(m, &spec.key).map(|()| None)
        }
    }

    /// Records a put whose space is allocated; frees it if the put lost a
    /// race meanwhile.
    pub(crate) fn start(
        &self,
        m: Model,
        pressure: &Pressure,
        spec: PutSpec,
        replicas: Vec<Replica>,
    ) -> Result<Vec<pb::Replica>> {
        let put_id = self.next_put_id.fetch_add(1, Ordering::Relaxed);
        let deadline = Instant::now() + m.cfg.put_timeout;
        let now = unix_ms();
        let expires = now + m.cfg.put_timeout.as_millis() as u64;
        // Nodes that record puts from their writes get the put's record
        // (signed with their key) through the client instead of an
        // announcement.
        let views = write_views(&spec, &replicas, expires);
        {
            let mut shard = m.objects.shard(&spec.key);
            // Lost a race with another PutStart of the same key, or with the
            // loss of a node (checked under the shard lock, which the node
            // reaper takes after unmounting, so no dead replica slips in).
            // A repeat of this very put that raced its first PutStart here
            // (both passed `check` before either was recorded): the put
            // recorded first is the one; this allocation goes back.
            if let Some(Ok(views)) = own_put_in(&shard, &spec) {
                drop(shard);
                for r in replicas {
                    r.seg.free(r.offset, r.alloc_len);
                }
                pressure.space_freed();
                m.metrics.resumed_puts.inc();
                return Ok(views);
            }
            let refused = if spec.overwrite {
                overwrite::refusal(&shard, &spec.key)
            } else if shard.contains_key(&spec.key) || shard.overwrite(&spec.key).is_some() {
                Some(already_exists(&spec.key, false))
            } else {
                None
            };
            let refused = if refused.is_some() {
                refused
            } else if replicas.iter().any(|r| !r.seg.is_mounted()) {
                Some(Error::unavailable(
                    "a chosen store node just left the cluster; retry",
                ))
            } else {
                None
            };
            if let Some(e) = refused {
                drop(shard);
                for r in replicas {
                    r.seg.free(r.offset, r.alloc_len);
                }
                pressure.space_freed();
                return Err(e);
            }
            let mut obj = Object::processing(spec.size, replicas, put_id, deadline, now);
            if spec.bind {
                obj.bind();
            }
            obj.set_attempt(spec.attempt);
            obj.set_soft_pin(spec.soft_pin);
            obj.set_hard_pin(spec.hard_pin);
            if let Some(crc) = spec.crc32c {
                // Under the shard lock, so no free of this put (revoke,
                // reclaim) can reach a node's log before its announcement.
                // Kept even when every node records the put from its write
                // instead (no entry to wait for): a revoke then waits for
                // its frees, or a node could report the put it recorded.
                obj.set_announced(records::announce(
                    &spec.key,
                    spec.size,
                    crc,
                    obj.replicas(),
                    spec.receipts,
                ));
            }
            // An overwrite of a committed key is written beside it; of an
            // absent key (never there, or removed meanwhile) it is a put.
            if spec.overwrite && shard.contains_key(&spec.key) {
                shard.insert_overwrite(&spec.key, obj);
            } else {
                shard.insert(&spec.key, obj);
            }
        }
        m.metrics.keys.inc();
        self.pending.lock().push_back((deadline, spec.key, put_id));
        Ok(views)
    }

    /// Commits a put (the version whose first replica has `generation`,
    /// when named): what its nodes must apply, and the size to offer the
    /// offload policy (`None` when the object is not DRAM-only).
    pub(crate) fn commit(
        &self,
        m: Model,
        ssd: &SsdTier,
        pressure: &Pressure,
        end: PutEnd,
    ) -> Result<(Unsynced, Option<u64>)> {
        if end.receipts.len() > MAX_REPLICAS as usize {
            return Err(Error::invalid(format!(
                "{} receipts for one put; a put has at most {MAX_REPLICAS} replicas",
                end.receipts.len()
            )));
        }
        if m.cfg.integrity == Integrity::Blake3 && end.digest.is_none() {
            // Committing it would leave readers nothing to check a lying
            // member's bytes with; the client that wrote it predates
            // digests (or was not told to send one).
            return Err(Error::invalid(format!(
                "this master runs with --integrity blake3: the PutEnd of {:?} must bring \
                 the object's BLAKE3 digest (upgrade the client)",
                end.key
            )));
        }
        if let Some(g) = end.generation {
            return overwrite::commit_version(m, ssd, pressure, &end, g);
        }
        validate_key(end.key)?;
        let mut shard = m.objects.shard(end.key);
        let obj = shard
            .get_mut(end.key)
            .ok_or_else(|| no_put_in_progress(end.key))?;
        commit_object(m, obj, &end)
    }

    /// Revokes a put (the version whose first replica has `generation`,
    /// when named); an announced one's frees must reach its nodes before
    /// the revoke is answered, or a rebuilding master could adopt the
    /// revoked bytes from a node that wrote them whole.
    pub(crate) fn revoke(
        &self,
        m: Model,
        ssd: &SsdTier,
        pressure: &Pressure,
        key: &str,
        generation: Option<u64>,
        proof: Proof,
    ) -> Result<Unsynced> {
        validate_key(key)?;
        if let Some(g) = generation {
            if let Some(u) = overwrite::revoke(m, pressure, key, g, proof)? {
                return Ok(u);
            }
        }
        let obj = {
            let mut shard = m.objects.shard(key);
            match shard.get(key) {
                None => {
                    return Err(Error::not_found(format!(
                        "no put in progress for key {key:?}"
                    )))
                }
                Some(o) if o.is_complete() => {
                    return Err(Error::invalid(format!(
                        "key {key:?} is already committed; use remove instead of revoke"
                    )))
                }
                // Another writer's put of the key: not this revoke's.
                Some(o) if generation.is_some_and(|g| !o.is_version(g)) => {
                    return Err(no_put_in_progress(key))
                }
                Some(o) => {
                    proof.check(key, o)?;
                    shard.remove(key)
                }
            }
        };
        let Some(o) = obj else {
            return Ok(Default::default());
        };
        m.metrics.keys.dec();
        ssd.forget(key, o.ssd());
        let (_, unsynced) = o.release_unsynced();
        pressure.space_freed();
        Ok(unsynced)
    }

    /// Reclaims puts whose deadline passed without PutEnd. Returns how many.
    pub(crate) fn reclaim_expired(&self, m: Model, pressure: &Pressure, now: Instant) -> usize {
        let mut n = 0;
        // The queue's lock is taken and released inside next_expired: never
        // held with the shard's.
        while let Some((key, put_id)) = self.next_expired(now) {
            let obj = {
                let mut shard = m.objects.shard(&key);
                let ours = |o: &Object| matches!(o.state(), ObjState::Processing { put_id: p, .. } if p == put_id);
                if shard.get(&key).is_some_and(ours) {
                    shard.remove(&key)
                } else {
                    // An overwrite's new version (the committed one stays).
                    shard.take_overwrite_if(&key, ours)
                }
            };
            if let Some(o) = obj {
                tracing::info!(key, "reclaimed a put that was never ended");
                m.metrics.keys.dec();
                m.metrics.reclaimed_puts.inc();
                o.release();
                n += 1;
            }
        }
        if n > 0 {
            pressure.space_freed();
        }
        n
    }

    /// Frees the versions an overwrite replaced whose readers are done
    /// (housekeeping). Returns how many.
    pub(crate) fn free_retired(&self, m: Model, pressure: &Pressure, now_ms: u64) -> usize {
        overwrite::free_retired(m, pressure, now_ms)
    }

    /// The oldest watched put whose deadline is `now` or earlier, taken
    /// off the watch (it may have ended meanwhile: the caller checks).
    fn next_expired(&self, now: Instant) -> Option<(String, u64)> {
        let mut q = self.pending.lock();
        match q.front() {
            Some((d, _, _)) if *d <= now => q.pop_front().map(|(_, k, id)| (k, id)),
            _ => None,
        }
    }
}

/// What a writer is given for each replica of a put: a write grant until
/// `expires`, and the put's record signed for nodes that record puts from
/// their writes.
fn write_views(spec: &PutSpec, replicas: &[Replica], expires: u64) -> Vec<pb::Replica> {
    replicas
        .iter()
        .map(|r| {
            let mut v = r.view(spec.size, PERM_WRITE, expires, false);
            let recorded = r.seg.node.records_from_write(spec.receipts);
            if let Some(crc32c) = spec.crc32c.filter(|_| recorded) {
                let put = records::put_record(&spec.key, r, spec.size, crc32c);
                v.record = r.seg.node.grant_key.sign_record(&put).to_vec();
            }
            v
        })
        .collect()
}

/// The put `spec`'s attempt started and is still writing (an overwrite's
/// new version, or a put), if any: `Ok` with its replicas again when it is
/// whole and asked the same way; `Err` with (a generation naming it, the
/// generation its token signs) when it lost a copy with its node, so the
/// caller drops it and starts afresh (it is short of copies, and its first
/// may no longer be the one its token names). An attempt is a random
/// 63-bit name only its client knows; a repeat must also bring the same
/// size and declared checksum.
pub(crate) fn own_put(m: Model, spec: &PutSpec) -> Option<Result<Vec<pb::Replica>, (u64, u64)>> {
    own_put_in(&m.objects.shard(&spec.key), spec)
}

/// `own_put` under the key's shard lock, held by the caller.
fn own_put_in(
    shard: &crate::objects::ShardGuard<'_>,
    spec: &PutSpec,
) -> Option<Result<Vec<pb::Replica>, (u64, u64)>> {
    if spec.attempt == 0 {
        return None;
    }
    let o = [shard.overwrite(&spec.key), shard.get(&spec.key)]
        .into_iter()
        .flatten()
        .find(|o| o.started_by(spec.attempt))?;
    let ObjState::Processing { deadline, .. } = o.state() else {
        return None;
    };
    let first = o.replicas().first()?.generation;
    if o.lost_a_copy() {
        return Some(Err((first, o.bound_generation().unwrap_or(first))));
    }
    // The same put, asked the same way (a repeat that differs is not this
    // put's: the normal answer, AlreadyExists), and not past its deadline
    // (its grants would be dead on arrival; --put-timeout reclaims it).
    let declared = o.announced().map(|a| a.crc32c);
    let now = Instant::now();
    if o.size != spec.size || declared != spec.crc32c || deadline <= now {
        return None;
    }
    let left = deadline.saturating_duration_since(now);
    let expires = unix_ms() + left.as_millis() as u64;
    Some(Ok(write_views(spec, o.replicas(), expires)))
}

fn check_absent(m: Model, key: &str) -> Result<()> {
    let shard = m.objects.shard(key);
    match shard.get(key) {
        Some(o) => Err(already_exists(key, o.is_complete())),
        // Removed while an overwrite of it is being written.
        None if shard.overwrite(key).is_some() => Err(already_exists(key, false)),
        None => Ok(()),
    }
}

/// Commits `obj`, the object of `key` (or the new version an overwrite is
/// about to swap in), under its shard's lock.
fn commit_object(m: Model, obj: &mut Object, end: &PutEnd) -> Result<(Unsynced, Option<u64>)> {
    let (key, crc32c, receipts) = (end.key, end.crc32c, end.receipts);
    end.proof.check(key, obj)?;
    // These very bytes committed already: a put a restarted master
    // adopted from its nodes (announced, bytes whole) before its PutEnd
    // came. Answered once its nodes have its commit in their records:
    // logged again below (a node keeps one record per range), woken,
    // and waited for.
    let already = obj.is_complete();
    if already && (obj.crc32c != crc32c || obj.digest().is_some_and(|d| Some(d) != end.digest)) {
        return Err(Error::new(
            Code::AlreadyExists,
            format!("key {key:?} is already committed (with another checksum)"),
        ));
    }
    // A node that holds the announcement of these very bytes reports
    // them to a rebuilding master on its own: that entry is what this
    // PutEnd waits for (usually applied while the bytes were written).
    let announced: Vec<(u64, u64)> = match obj.take_announced() {
        Some(a) if a.crc32c == crc32c => a.seqs,
        _ => Vec::new(),
    };
    if let Some(d) = end.digest {
        // An adopted object whose report carried none gets its writer's
        // here, too.
        obj.set_digest(d);
    }
    // Committed by this term now: no report replaces it.
    obj.set_adopted(false);
    if !already {
        obj.crc32c = crc32c;
        obj.complete();
        obj.last_access_ms = unix_ms();
    }
    let mut unsynced = Unsynced::default();
    for r in obj.replicas() {
        let pending = announced
            .iter()
            .find(|(seg, _)| *seg == r.seg.id)
            .map(|&(_, pending)| pending);
        let receipted = records::receipted(m.metrics, key, r, obj.size, crc32c, receipts);
        // Nobody waits for the commit of an announced or recorded put:
        // it reaches the node with its next entry (or heartbeat).
        let seq = r.seg.node.log_object(
            pb::object_log_entry::Op::Commit,
            pending.is_none() && !receipted,
            key,
            r.seg.id,
            r.offset,
            obj.size,
            crc32c,
            r.generation,
            obj.digest(),
        );
        if !receipted {
            unsynced.push(r.seg.node.acks.clone(), pending.unwrap_or(seq));
        }
    }
    // A first PutEnd always offers it; an adopted object (the rebuild
    // queues no offload) only while it is in DRAM alone.
    let dram_only = !obj.replicas().is_empty() && obj.ssd().is_empty();
    Ok((unsynced, (!already || dram_only).then_some(obj.size)))
}

pub(crate) fn no_put_in_progress(key: &str) -> Error {
    Error::not_found(format!(
        "no put in progress for key {key:?} (it may have timed out after --put-timeout)"
    ))
}

fn already_exists(key: &str, complete: bool) -> Error {
    if complete {
        Error::new(
            Code::AlreadyExists,
            format!("key {key:?} already exists; remove it first"),
        )
    } else {
        Error::new(
            Code::AlreadyExists,
            format!("key {key:?} is already being written by another put"),
        )
    }
}
