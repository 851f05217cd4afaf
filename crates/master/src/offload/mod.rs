//! The SSD tier as the master sees it: owners (SSD agents) and their
//! identity, the offload task queue, and SSD replicas.

pub mod admission;
mod describe;
pub mod owners;
pub mod policy;
pub(crate) mod promotion;
pub mod queue;
pub(crate) mod removal;
#[cfg(test)]
pub(crate) mod tests;

use crate::cluster::Replica;
use crate::config::{Integrity, MasterConfig, SsdAdmission};
use crate::durable::DurableKv;
use crate::grants::CopyRecords;
use crate::lock_order::{Lock, OrderedMutex};
use crate::metrics::MasterMetrics;
use crate::model::Model;
use crate::objects::SsdReplica;
use crate::pressure::eviction::DropReason;
use crate::pressure::Pressure;
use admission::AdmissionFilter;
use owners::OwnerRegistry;
use parking_lot::Mutex;
use policy::AdmissionPolicy;
use queue::OffloadQueue;
use std::sync::Arc;
use strata_common::grant::{
    ssd_segment_id, GrantKey, GrantScope, PERM_READ, PERM_SSD_READ, PERM_STAGE,
};
use strata_common::time::unix_ms;
use strata_common::{Code, Error, Result};
use strata_proto as pb;
use tokio_util::sync::CancellationToken;

/// What a reported SSD copy must match to be taken for the object's: its
/// size and crc32c and, when its record carries one, the writer's digest.
#[derive(Clone, Copy)]
struct Expected {
    size: u64,
    crc32c: u32,
    digest: Option<[u8; 32]>,
}

/// The SSD tier as the master keeps it: its owners (SSD agents), the
/// offload queue, the admission policy and filter, the removals owners must
/// apply and the promotions back to DRAM. The fields are private to
/// `offload/`; the rest of the master goes through the methods below.
pub(crate) struct SsdTier {
    owners: OwnerRegistry,
    queue: OrderedMutex<OffloadQueue>,
    policy: Box<dyn AdmissionPolicy>,
    /// `on-evict`: which DRAM victims the SSD tier takes.
    admission: AdmissionFilter,
    /// Per owner: SSD copies it should forget (removed keys, stale
    /// copies), delivered with its next heartbeats (`removal.rs`).
    drops: removal::Drops,
    /// SSD hits waiting to be copied back into DRAM (`--promote-on-hit`).
    promotions: Mutex<promotion::Promotions>,
    /// Urgent offloads appeared: long-polling owner heartbeats answer at
    /// once.
    owner_work: tokio::sync::Notify,
    /// Signs the copies handed out, checks those inventories report.
    records: CopyRecords,
}

impl SsdTier {
    pub(crate) fn new(
        cfg: &MasterConfig,
        kv: Arc<dyn DurableKv>,
        metrics: &MasterMetrics,
        term: u64,
        records: CopyRecords,
    ) -> Result<SsdTier> {
        let policy = policy::from_config(cfg.offload_policy)?;
        let admission = AdmissionFilter::new(
            policy.on_evict() && cfg.ssd_admission == SsdAdmission::Auto,
            metrics.admission.clone(),
        );
        Ok(SsdTier {
            owners: OwnerRegistry::new(kv, cfg.node_ttl.as_millis() as u64),
            queue: OrderedMutex::new(Lock::OffloadQueue, OffloadQueue::new(5, 500)),
            policy,
            admission,
            drops: removal::Drops::new(term),
            promotions: Mutex::new(Default::default()),
            owner_work: tokio::sync::Notify::new(),
            records,
        })
    }

    /// An SSD replica as a client sees it; with `stage`, its grant also
    /// lets the reader stage it for a one-sided read (rdma callers only:
    /// the window's remote key opens all of it).
    pub(crate) fn replica_view(
        &self,
        r: &SsdReplica,
        expires: u64,
        now: u64,
        stage: bool,
    ) -> Option<pb::Replica> {
        let (addr, handle, key) = self.owners.endpoint(r.owner_id, now)?;
        let perm = if stage {
            PERM_SSD_READ | PERM_STAGE
        } else {
            PERM_SSD_READ
        };
        let scope = GrantScope {
            perm,
            segment_id: ssd_segment_id(r.owner_id, r.bucket_id),
            offset: r.offset,
            length: r.length,
            expires_unix_ms: expires,
            generation: 0,
        };
        Some(pb::Replica {
            kind: pb::ReplicaKind::Ssd as i32,
            node_id: handle,
            data_addr: addr,
            segment_id: scope.segment_id,
            offset: r.offset,
            length: r.length,
            grant: Some(pb::Grant {
                perm,
                expires_unix_ms: expires,
                generation: 0,
                mac: key.sign(&scope).to_vec(),
            }),
            state: pb::ReplicaState::Complete as i32,
            owner_id: r.owner_id,
            ucx_route: 0,
            record: Vec::new(),
        })
    }

    /// The SSD agents (their own state and locks).
    pub(crate) fn owners(&self) -> &OwnerRegistry {
        &self.owners
    }

    /// Which objects go to SSD, and when (`--offload-policy`).
    pub(crate) fn policy(&self) -> &dyn AdmissionPolicy {
        self.policy.as_ref()
    }

    /// The `on-evict` admission filter (its own state and locks).
    pub(crate) fn admission(&self) -> &AdmissionFilter {
        &self.admission
    }

    /// Whether `key` is queued for its copy (`None`: not queued); with
    /// `urgent`, its task is made urgent, and owners waiting for work hear
    /// of it when it just became so (`Some(true)`).
    pub(crate) fn urge(&self, key: &str, urgent: bool, metrics: &MasterMetrics) -> Option<bool> {
        let queued = self.queue.lock().make_urgent_if(key, urgent);
        if queued == Some(true) {
            metrics.urgent_offloads.inc();
            self.owner_work.notify_waiters();
        }
        queued
    }

    /// The removals to send with `req`'s answer, and through which one.
    #[cfg(test)]
    pub(crate) fn take_drops(&self, req: &pb::OwnerHeartbeatRequest) -> (Vec<pb::SsdObject>, u64) {
        self.drops.take(req)
    }

    /// The tasks queued or assigned now (tests).
    #[cfg(test)]
    pub(crate) fn queued_tasks(&self) -> Vec<queue::Task> {
        self.queue.lock().tasks().cloned().collect()
    }

    /// Bytes queued or being copied to `owner` (tests).
    #[cfg(test)]
    pub(crate) fn pending_bytes(&self, owner: u64) -> u64 {
        self.queue.lock().pending_bytes(owner)
    }

    /// (queued, assigned) offload tasks.
    pub(crate) fn queue_counts(&self) -> (usize, usize) {
        self.queue.lock().counts()
    }

    /// A new incarnation of `owner` registered with `key`: whatever the
    /// previous one held goes back to the queue, and its SSD replicas wait
    /// for the new incarnation's verified inventory.
    pub(crate) fn new_incarnation(&self, m: Model, owner: u64, epoch: u64, key: GrantKey) {
        self.owners.set_key(owner, epoch, key);
        let released = self.release_owner(owner, unix_ms());
        for t in &released {
            self.unpin(m, &t.key);
        }
        self.drop_replicas_of(m, owner);
    }

    /// Takes back every task `owner` held (its new incarnation registered).
    pub(crate) fn release_owner(&self, owner: u64, now_ms: u64) -> Vec<queue::Task> {
        self.queue.lock().release_owner(owner, now_ms)
    }

    /// Queues `key` for offload unless it is queued already or no owner has
    /// room. Returns whether it is (now) queued.
    pub(crate) fn enqueue(&self, metrics: &MasterMetrics, key: &str, size: u64) -> bool {
        let now = unix_ms();
        let mut q = self.queue.lock();
        if q.has_key(key) {
            return true;
        }
        let Some(owner) = self.owners.pick_owner(size, now, &q) else {
            return false;
        };
        q.enqueue(key, owner, size, now);
        drop(q);
        self.refresh_gauges(metrics);
        true
    }

    /// Capacity of the live SSD owners, and the bytes used or queued there.
    pub(crate) fn tier_usage(&self) -> (u64, u64) {
        let usage = self.owners.live_usage(unix_ms());
        let q = self.queue.lock();
        usage.iter().fold((0, 0), |(c, u), &(id, cap, used)| {
            (c + cap, u + used + q.pending_bytes(id))
        })
    }

    /// The offload task gauges, from the queue.
    pub(crate) fn refresh_gauges(&self, metrics: &MasterMetrics) {
        let (queued, assigned) = self.queue.lock().counts();
        metrics
            .offload_tasks
            .with_label_values(&["queued"])
            .set(queued as i64);
        metrics
            .offload_tasks
            .with_label_values(&["assigned"])
            .set(assigned as i64);
    }
}

/// The term an owner's heartbeat answer carries. Failpoint (tests): an
/// older one, as a deposed leader's answer would; the agent's term fence
/// must refuse the drops it brings.
fn answered_term(term: u64) -> u64 {
    fail::fail_point!("master::deposed-owner-heartbeat", |_| 1);
    term
}

impl SsdTier {
    /// An owner's heartbeat: its offload tasks, the copies it must drop
    /// and, if it takes them, promotions (`place` finds their DRAM).
    pub(crate) fn heartbeat(
        &self,
        m: Model,
        term: u64,
        req: &pb::OwnerHeartbeatRequest,
        place: impl Fn(u64) -> Result<Vec<Replica>>,
    ) -> Result<pb::OwnerHeartbeatResponse> {
        self.owners.heartbeat(req)?;
        let tasks = match req.max_tasks {
            0 => Vec::new(),
            n => self.take_tasks(m, req.owner_id, req.epoch, (n as usize).min(10_000)),
        };
        let promotions = if req.accepts_promotions {
            self.take_promotions(m, req.owner_id, place)
        } else {
            Vec::new()
        };
        let (drops, drops_through) = self.drops.take(req);
        let term = answered_term(term);
        Ok(pb::OwnerHeartbeatResponse {
            tasks,
            drops,
            promotions,
            term,
            drops_through,
        })
    }

    /// An owner's heartbeat that, with nothing to hand out, waits (up to
    /// `wait_ms`, capped by the heartbeat interval so liveness is
    /// unaffected) for urgent offloads: a put waiting for their DRAM gets
    /// them copied at once, not a poll later. Other work keeps the agent's
    /// poll cadence (so buckets stay batched).
    pub(crate) async fn heartbeat_wait(
        &self,
        m: Model<'_>,
        term: u64,
        closing: &CancellationToken,
        req: &pb::OwnerHeartbeatRequest,
        place: impl Fn(u64) -> Result<Vec<Replica>>,
    ) -> Result<pb::OwnerHeartbeatResponse> {
        let cap = (m.cfg.node_ttl / 4).min(std::time::Duration::from_secs(1));
        let wait = std::time::Duration::from_millis(req.wait_ms.into()).min(cap);
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let notified = self.owner_work.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let r = self.heartbeat(m, term, req, &place)?;
            let work = !r.tasks.is_empty() || !r.drops.is_empty() || !r.promotions.is_empty();
            if work || tokio::time::Instant::now() >= deadline {
                return Ok(r);
            }
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(deadline) => {}
                // The term ends: answer now rather than hold the drain.
                _ = closing.cancelled() => return Ok(r),
            }
        }
    }

    /// `eager`: queue every committed object.
    pub(crate) fn admit_on_put_end(&self, metrics: &MasterMetrics, key: &str, size: u64) {
        if self.policy.on_put_end() {
            self.enqueue(metrics, key, size);
        }
    }

    /// `reads:N`: queue an object once it served N demand reads from DRAM.
    /// `reads` counts this read; `on_ssd` skips objects already there.
    pub(crate) fn admit_on_read(
        &self,
        metrics: &MasterMetrics,
        key: &str,
        size: u64,
        reads: u32,
        on_ssd: bool,
    ) {
        if on_ssd {
            return;
        }
        if let Some(n) = self.policy.reads_to_admit() {
            if reads >= n {
                self.enqueue(metrics, key, size);
            }
        }
    }

    /// Hands up to `max` tasks to `owner`, pinning each source. Tasks whose
    /// source is gone are dropped on the spot.
    fn take_tasks(&self, m: Model, owner: u64, epoch: u64, max: usize) -> Vec<pb::OffloadTask> {
        let now = unix_ms();
        let ttl = m.cfg.offload_task_ttl.as_millis() as u64;
        let taken = self.queue.lock().take(owner, epoch, max, now, ttl);
        let mut out = Vec::with_capacity(taken.len());
        for t in taken {
            let deadline = match t.state {
                queue::TaskState::Assigned { deadline_ms, .. } => deadline_ms,
                queue::TaskState::Queued { .. } => continue,
            };
            let source = {
                let mut shard = m.objects.shard(&t.key);
                match shard.get_mut(&t.key) {
                    Some(o) if o.is_complete() && !o.replicas().is_empty() => {
                        o.pins += 1;
                        // From now on an SSD copy may exist somewhere: its
                        // removal leaves a tombstone.
                        o.set_offloaded(true);
                        Some((o.replicas()[0].clone(), o.size, o.crc32c, o.digest()))
                    }
                    _ => None,
                }
            };
            match source {
                Some((r, size, crc, digest)) => {
                    self.queue.lock().note_source(t.id, size, crc, digest);
                    out.push(pb::OffloadTask {
                        task_id: t.id,
                        key: t.key.clone(),
                        size,
                        crc32c: crc,
                        source: Some(r.view(size, PERM_READ, deadline, true)),
                        deadline_unix_ms: deadline,
                        // With the writer's digest under --integrity
                        // blake3, which a later master adopting the copy
                        // takes from it. Not otherwise: a master that
                        // predates version-2 records refuses them, and a
                        // rollback would drop every such copy.
                        copy_record: self.records.sign(
                            &t.key,
                            size,
                            crc,
                            digest
                                .as_ref()
                                .filter(|_| m.cfg.integrity == Integrity::Blake3),
                        ),
                    });
                }
                None => {
                    // Removed or lost before it could be copied: nothing to pin.
                    self.queue.lock().drop_task(t.id);
                    m.metrics
                        .offload_results
                        .with_label_values(&["source_gone"])
                        .inc();
                }
            }
        }
        self.refresh_gauges(m.metrics);
        out
    }

    pub(crate) fn unpin(&self, m: Model, key: &str) {
        if let Some(o) = m.objects.shard(key).get_mut(key) {
            o.pins = o.pins.saturating_sub(1);
        }
        // A version an overwrite replaced while this task copied it.
        m.retired.unpin(key, unix_ms());
    }

    pub(crate) fn report_offload(
        &self,
        m: Model,
        pressure: &Pressure,
        req: pb::ReportOffloadRequest,
    ) -> Result<()> {
        self.owners
            .check_epoch(req.owner_id, req.epoch, &req.instance_proof)?;
        let now = unix_ms();
        // Failures are logged once per report (a full disk fails a whole
        // batch at once), with one example; each key at debug level.
        let (mut requeued, mut dropped) = (0u64, 0u64);
        let mut example: Option<(String, String)> = None;
        for r in req.results {
            // Retrying cannot help: the owner is full, or the object's own
            // bytes fail its checksum.
            let final_failure = r.code == Code::NoSpace as u32 || r.code == Code::Corrupted as u32;
            let res = self.queue.lock().report_with(
                req.owner_id,
                req.epoch,
                r.task_id,
                r.persisted,
                final_failure,
                now,
            );
            let (task, outcome) = match res {
                Ok(v) => v,
                Err(e) => {
                    // A late report for a task that expired and moved on: the
                    // bytes it wrote stay unreferenced in its bucket.
                    tracing::info!(task = r.task_id, error = %e, "ignoring offload report");
                    continue;
                }
            };
            self.unpin(m, &task.key);
            match outcome {
                queue::Outcome::Persisted => {
                    // The copy is of the version the task was handed; the
                    // key may hold another one by now (an overwrite).
                    let replica = SsdReplica {
                        owner_id: req.owner_id,
                        bucket_id: r.bucket_id,
                        offset: r.offset,
                        length: task.source.map_or(task.size, |(size, _)| size),
                    };
                    let expect = task.source.map(|(size, crc32c)| Expected {
                        size,
                        crc32c,
                        digest: task.source_digest,
                    });
                    let added = self.add_ssd_replica(m, &task.key, replica, expect, false);
                    if added {
                        pressure.free_after_offload(m, &task.key);
                    } else {
                        // Removed, or overwritten, while it was being
                        // copied: the owner drops it. A new version is
                        // offered to the policy as at its own PutEnd (this
                        // task kept it from being queued then).
                        self.forget(&task.key, &[replica]);
                        let fresh = m
                            .objects
                            .shard(&task.key)
                            .get(&task.key)
                            .filter(|o| o.is_complete() && o.ssd().is_empty())
                            .map(|o| o.size);
                        if let Some(size) = fresh {
                            self.admit_on_put_end(m.metrics, &task.key, size);
                        }
                    }
                    m.metrics
                        .offload_results
                        .with_label_values(&[if added {
                            "persisted"
                        } else {
                            "persisted_orphan"
                        }])
                        .inc();
                }
                queue::Outcome::Requeued => {
                    tracing::debug!(
                        key = task.key,
                        attempts = task.attempts + 1,
                        error = r.error,
                        "offload failed; will retry"
                    );
                    requeued += 1;
                    example.get_or_insert((task.key.clone(), r.error.clone()));
                    m.metrics
                        .offload_results
                        .with_label_values(&["failed_requeued"])
                        .inc();
                }
                queue::Outcome::Dropped(why) => {
                    tracing::debug!(
                        key = task.key,
                        why,
                        error = r.error,
                        "offload failed for good; dropped"
                    );
                    dropped += 1;
                    example.get_or_insert((task.key.clone(), r.error.clone()));
                    // Its copy cannot succeed (bad bytes, retries used up):
                    // eviction drops it from now on rather than wait for one.
                    // A full owner is not the object's fault: it may go to
                    // SSD later. An `on-evict` victim goes at once either way.
                    let hopeless = r.code == Code::Corrupted as u32 || why == "max_attempts";
                    if hopeless {
                        if let Some(o) = m.objects.shard(&task.key).get_mut(&task.key) {
                            o.set_offload_failed(true);
                        }
                    }
                    self.drop_victim_if_pending(m, pressure, &task.key, DropReason::OffloadFailed);
                    m.metrics
                        .offload_results
                        .with_label_values(&["dropped"])
                        .inc();
                }
            }
        }
        if let Some((key, error)) = example {
            tracing::warn!(
                owner = req.owner_id,
                requeued,
                dropped,
                example_key = key,
                error,
                "offload tasks failed (requeued ones are retried with backoff; dropped ones stay in DRAM or, under on-evict, are dropped)"
            );
        }
        self.refresh_gauges(m.metrics);
        // Copies landed (or failed for good): a waiting put looks again.
        pressure.space_freed();
        Ok(())
    }

    /// Adds an SSD replica to `key`. With `expect` the object must match its
    /// size, crc32c and (when both have one) digest, else the copy is stale;
    /// an object without a digest takes the copy's. With `create` an
    /// object the master does not know is created SSD-only (inventory after
    /// a master restart). Returns whether the replica was recorded.
    fn add_ssd_replica(
        &self,
        m: Model,
        key: &str,
        r: SsdReplica,
        expect: Option<Expected>,
        create: bool,
    ) -> bool {
        let mut shard = m.objects.shard(key);
        match shard.get_mut(key) {
            Some(o) if o.is_complete() => {
                if let Some(e) = expect {
                    let other_digest = matches!(
                        (e.digest, o.digest()),
                        (Some(a), Some(b)) if a != b
                    );
                    if e.size != o.size || e.crc32c != o.crc32c || other_digest {
                        return false; // a stale copy of an older object
                    }
                    // Readers learn the digest from the copy's record when
                    // the object had none (its DRAM copy came back first,
                    // from a report without one).
                    if let (Some(d), None) = (e.digest, o.digest()) {
                        o.set_digest(d);
                    }
                }
                // An owner holds one copy; its latest report of where wins
                // (compaction moves objects between buckets).
                match o.ssd_mut().iter_mut().find(|s| s.owner_id == r.owner_id) {
                    Some(s) => *s = r,
                    None => o.push_ssd(r),
                }
                // Its removal must leave a tombstone from now on.
                o.set_offloaded(true);
                true
            }
            Some(_) => false,
            None => match expect.filter(|_| create) {
                // A copy of a removed object (its drop notice was lost, or
                // its offload report never arrived): never adopted. Checked
                // only when creating, so a live object with the same bytes
                // keeps its copies.
                Some(e) if m.tombstones.is_removed(key, e.size, e.crc32c) => {
                    m.metrics.tombstoned_copies.inc();
                    false
                }
                Some(e) => {
                    // Adopted, with the digest its record carries; a node's
                    // report of its DRAM copy may add to it.
                    let mut o = crate::objects::Object::ssd_only(e.size, e.crc32c, r);
                    if let Some(d) = e.digest {
                        o.set_digest(d);
                    }
                    o.set_adopted(true);
                    shard.insert(key, o);
                    m.metrics.keys.inc();
                    true
                }
                None => false,
            },
        }
    }

    /// Adopts the SSD copies an owner's inventory lists; returns how many.
    pub(crate) fn report_inventory(
        &self,
        m: Model,
        req: &pb::ReportInventoryRequest,
    ) -> Result<u64> {
        self.owners
            .check_epoch(req.owner_id, req.epoch, &req.instance_proof)?;
        let mut adopted = 0;
        for o in &req.objects {
            if crate::objects::validate_key(&o.key).is_err() || o.length == 0 {
                continue;
            }
            let r = SsdReplica {
                owner_id: req.owner_id,
                bucket_id: o.bucket_id,
                offset: o.offset,
                length: o.length,
            };
            // Only copies a master gave this tier: never one matched by its
            // (public, forgeable) size and crc32c alone. With --integrity
            // blake3, a copy creates an object only from a record that
            // carries the writer's digest: readers then check the bytes
            // against it, so the owner cannot serve others. A version-1
            // record (a copy made before the flag, or by a master before
            // version 2) is still a master's record: under blake3 it may
            // join a live object (readers check the copy against that
            // object's digest), never create one.
            let digest = self
                .records
                .verify(&o.key, o.length, o.crc32c, &o.copy_record);
            let Some(digest) = digest else {
                m.metrics.unrecorded_copies.inc();
                self.forget(&o.key, &[r]);
                continue;
            };
            let digestless = digest.is_none() && m.cfg.integrity == Integrity::Blake3;
            // A relocation (compaction moved the object) never brings back
            // a key removed meanwhile; a restart's inventory may create it.
            let create = !req.relocation && !digestless;
            let expect = Expected {
                size: o.length,
                crc32c: o.crc32c,
                digest,
            };
            if self.add_ssd_replica(m, &o.key, r, Some(expect), create) {
                adopted += 1;
            } else {
                if digestless {
                    m.metrics.unrecorded_copies.inc();
                }
                // A stale copy of an older object under the same key (or,
                // without a digest under blake3, of no live object).
                self.forget(&o.key, &[r]);
            }
        }
        tracing::info!(owner = req.owner_id, adopted, "SSD inventory adopted");
        Ok(adopted)
    }

    /// Expires tasks whose deadline passed; their sources are unpinned.
    pub(crate) fn expire_tasks(&self, m: Model, now_ms: u64) -> usize {
        let expired = self.queue.lock().expire(now_ms);
        for t in &expired {
            self.unpin(m, &t.key);
            m.metrics
                .offload_results
                .with_label_values(&["expired_requeued"])
                .inc();
        }
        if !expired.is_empty() {
            self.refresh_gauges(m.metrics);
        }
        expired.len()
    }

    /// Tasks queued for an owner that stopped heartbeating (longer than
    /// `--node-ttl`) go to a live owner, or, if none can take them, are
    /// dropped (an `on-evict` victim then leaves DRAM). Returns how many
    /// moved.
    pub(crate) fn reassign_orphaned_tasks(
        &self,
        m: Model,
        pressure: &Pressure,
        now_ms: u64,
    ) -> usize {
        let live: std::collections::HashSet<u64> = self
            .owners
            .live_usage(now_ms)
            .into_iter()
            .map(|(id, _, _)| id)
            .collect();
        let (stalled, orphans): (Vec<queue::Task>, Vec<queue::Task>) = {
            let mut q = self.queue.lock();
            // A lost owner's assigned tasks first (found by the fleet
            // tests: they held their sources pinned, unoffloaded, until
            // --offload-task-ttl).
            let stalled = q.requeue_of_lost(now_ms, &live);
            let gone: Vec<u64> = q
                .owners_with_queued()
                .into_iter()
                .filter(|o| !live.contains(o))
                .collect();
            let orphans = gone.into_iter().flat_map(|o| q.take_orphans(o)).collect();
            (stalled, orphans)
        };
        for t in &stalled {
            self.unpin(m, &t.key);
        }
        if !stalled.is_empty() {
            m.metrics
                .offload_results
                .with_label_values(&["lost_requeued"])
                .inc_by(stalled.len() as u64);
        }
        if orphans.is_empty() {
            return 0;
        }
        let (mut moved, mut dropped) = (0, 0);
        for t in &orphans {
            if self.enqueue(m.metrics, &t.key, t.size) {
                moved += 1;
            } else {
                dropped += 1;
                self.drop_victim_if_pending(m, pressure, &t.key, DropReason::NoOwner);
            }
        }
        let results = &m.metrics.offload_results;
        results
            .with_label_values(&["reassigned"])
            .inc_by(moved as u64);
        results
            .with_label_values(&["dropped"])
            .inc_by(dropped as u64);
        tracing::info!(
            moved,
            dropped,
            "offload tasks of SSD owners that stopped heartbeating were placed elsewhere"
        );
        self.refresh_gauges(m.metrics);
        moved
    }

    /// An `on-evict` victim whose offload will not happen leaves DRAM (or is
    /// unmarked if a reader holds it); other objects are left alone.
    fn drop_victim_if_pending(&self, m: Model, pressure: &Pressure, key: &str, why: DropReason) {
        let pending = m
            .objects
            .shard(key)
            .get(key)
            .is_some_and(|o| o.offload_then_free());
        if pending {
            pressure.drop_victim(m, key, why);
        }
    }

    /// Forgets every SSD replica of `owner` (it registered again; its
    /// inventory report re-adds what it verified). Objects left with no
    /// replica at all disappear.
    pub(crate) fn drop_replicas_of(&self, m: Model, owner: u64) {
        let mut gone = 0i64;
        for shard in m.objects.shards() {
            shard.lock().retain(|_, o| {
                o.retain_ssd(|r| r.owner_id != owner);
                let keep = !o.replicas().is_empty() || !o.ssd().is_empty() || !o.is_complete();
                gone += i64::from(!keep);
                keep
            });
        }
        m.metrics.keys.sub(gone);
    }

    /// Drops the DRAM replicas of a key that has an SSD replica.
    pub(crate) fn evict_memory(&self, m: Model, key: &str) -> Result<()> {
        crate::objects::validate_key(key)?;
        let now = unix_ms();
        let obj = {
            let mut shard = m.objects.shard(key);
            let o = shard
                .get_mut(key)
                .ok_or_else(|| Error::not_found(format!("key {key:?} not found")))?;
            if o.ssd().is_empty() {
                return Err(Error::new(
                    Code::NotReady,
                    format!("key {key:?} has no SSD replica yet"),
                ));
            }
            if o.pins > 0 || o.leased(now) {
                return Err(Error::new(
                    Code::Leased,
                    format!("key {key:?} is being read or offloaded; retry later"),
                ));
            }
            o.take_memory()
        };
        obj.release();
        Ok(())
    }

    /// Pins currently held on objects (0 when no offload is in flight).
    pub(crate) fn total_pins(&self, m: Model) -> u64 {
        m.objects
            .shards()
            .map(|s| s.lock().values().map(|o| o.pins as u64).sum::<u64>())
            .sum()
    }
}
