//! Rebuilding object metadata from the members after a master restart:
//! store nodes are authoritative for the committed objects they hold, so a
//! node that registers while the master is young reports them and the master
//! adopts what is consistent (its exact range free, no other version of the
//! key, not removed). What it refuses the node forgets: never wrong bytes,
//! at worst an object less. [`RebuildGate`] holds the term's rebuild: when
//! it started, whether a master ran before it, and which members
//! (`members.rs`) it waits for before taking writes.

pub mod members;
#[cfg(test)]
mod tests;

use crate::cluster::allocator::{aligned_len, ALIGN};
use crate::cluster::Cluster;
use crate::cluster::{NodeEntry, Replica};
use crate::durable::DurableKv;
use crate::grants::TermKeys;
use crate::model::Model;
use crate::objects::validate_key;
use crate::objects::Object;
use members::{Member, Members};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use strata_common::grant::{node_member, PutRecord};
use strata_common::{Code, Error, Result};
use strata_proto as pb;

/// Objects one ReportNodeObjects call may carry.
pub const MAX_REPORT: usize = 65_536;

/// How long after its start the master asks registering nodes for their
/// objects. Later registrations (a node back from a partition) start clean,
/// so an object removed meanwhile cannot come back.
pub fn window(node_ttl: Duration) -> Duration {
    node_ttl * 2
}

/// Why a reported object was not adopted (metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// No record of a master's giving the node this object.
    Unsigned,
    /// `--integrity blake3`, and no digest a commit's record covers.
    NoDigest,
    Malformed,
    RangeInUse,
    OtherVersion,
    Removed,
}

/// What adopting one reported object did.
enum Adopted {
    /// A new object, or another replica of the same bytes.
    Added,
    /// A newer commit of the key than the one adopted before, which goes.
    ReplacedOlder(Object),
}

impl Refusal {
    fn label(self) -> &'static str {
        match self {
            Refusal::Unsigned => "unsigned",
            Refusal::NoDigest => "no_digest",
            Refusal::Malformed => "malformed",
            Refusal::RangeInUse => "range_in_use",
            Refusal::OtherVersion => "other_version",
            Refusal::Removed => "removed",
        }
    }
}

/// What a removal hands the rebuild: its gate, and the generation
/// watermark when the removal ran (`RebuildGate::note_removed`).
#[derive(Clone, Copy)]
pub(crate) struct Removing<'a> {
    pub(crate) gate: &'a RebuildGate,
    pub(crate) watermark: u64,
}

/// A term's rebuild from its members: nodes registering within the
/// window report the objects they hold, and a restarted master (or a new
/// leader) takes writes once every member it remembers reported, or after
/// a bound. Its state is private to `rebuild/`.
pub(crate) struct RebuildGate {
    /// When this term's master started.
    started: Instant,
    /// It found its durable state from an earlier run.
    restarted: bool,
    /// The members it waits for before taking writes (when restarted).
    members: Members,
    /// `lost_members` answered once.
    lost_taken: AtomicBool,
    /// `--node-ttl`: the window is twice it, the gate's bound it.
    node_ttl: Duration,
    /// Keys removed while reports are still taken, with the newest
    /// generation removed: a member reporting late (writes open after the
    /// bound, reports are taken for longer) must not bring back a copy of
    /// what this term removed. Emptied once reports end; at most one entry
    /// per removal within the window.
    removed: parking_lot::Mutex<std::collections::HashMap<String, u64>>,
}

impl RebuildGate {
    /// The gate of a term; a `restarted` one loads the members to wait for.
    pub(crate) async fn load(
        kv: &dyn DurableKv,
        restarted: bool,
        node_ttl: Duration,
    ) -> Result<RebuildGate> {
        let members = if restarted {
            Members::load(kv).await?
        } else {
            Default::default()
        };
        Ok(RebuildGate {
            started: Instant::now(),
            restarted,
            members,
            lost_taken: AtomicBool::new(false),
            node_ttl,
            removed: Default::default(),
        })
    }

    /// Whether a node registering now should report what it holds.
    pub(crate) fn rebuilding(&self) -> bool {
        self.started.elapsed() < window(self.node_ttl)
    }

    /// Whether reports (of registrations asked within the window) are
    /// still taken: a node with many objects sends many batches, so twice
    /// the window, and no longer (the object log moves on without it).
    pub(crate) fn taking_reports(&self) -> bool {
        self.started.elapsed() < window(self.node_ttl) * 2
    }

    /// `key` was removed when the next generation to hand out was
    /// `watermark`: every copy of what was removed is older (each replica
    /// has its own generation, so the removed object's own are not enough),
    /// a copy of a later put newer. Remembered while reports are taken
    /// (lock order: a key's shard lock, then this).
    pub(crate) fn note_removed(&self, key: &str, watermark: u64) {
        let mut r = self.removed.lock();
        if !self.taking_reports() {
            r.clear();
            return;
        }
        let g = r.entry(key.to_string()).or_insert(watermark);
        *g = (*g).max(watermark);
    }

    /// Whether a reported copy of `key` with `generation` is older than a
    /// removal of the key this term (checked under the key's shard lock, so
    /// no removal slips between the check and the adoption).
    fn was_removed(&self, key: &str, generation: u64) -> bool {
        self.removed
            .lock()
            .get(key)
            .is_some_and(|&g| generation < g)
    }

    /// Longest a restarted master waits for the members it remembers: a
    /// live one heartbeats well within `--node-ttl`, so one that has not
    /// come back by then is lost (and forgotten, `lost_members`).
    fn bound(&self) -> Duration {
        self.node_ttl
    }

    /// Whether puts are taken (see [`Master::accepting_writes`]).
    pub(crate) fn open(&self) -> bool {
        !self.restarted
            || self.members.missing().is_empty()
            || self.started.elapsed() >= self.bound()
    }

    /// Why writes wait, when they do.
    pub(crate) fn check_open(&self) -> Result<()> {
        if self.open() {
            return Ok(());
        }
        let left = self.bound().saturating_sub(self.started.elapsed());
        let missing = self.members.missing();
        let first = missing
            .first()
            .map(|m| format!(", e.g. {m}"))
            .unwrap_or_default();
        Err(Error::new(
            Code::NotReady,
            format!(
                "the master rebuilds its metadata from its members ({} have not reported yet{first}; at most another {} ms); retry",
                missing.len(),
                left.as_millis()
            ),
        ))
    }

    /// `m` reported what it holds (or has nothing to report).
    pub(crate) fn reported(&self, m: Member) {
        self.members.reported(m);
    }

    /// The remembered members that have not reported yet (tests).
    #[cfg(test)]
    pub(crate) fn missing(&self) -> Vec<Member> {
        self.members.missing()
    }

    /// The remembered members that did not come back within the bound
    /// and are not `registered`, once; empty before the bound.
    pub(crate) fn take_lost(&self, registered: impl Fn(&Member) -> bool) -> Vec<Member> {
        if !self.restarted
            || self.started.elapsed() < self.bound()
            || self.lost_taken.swap(true, Ordering::Relaxed)
        {
            return Vec::new();
        }
        let mut lost = self.members.missing();
        lost.retain(|m| !registered(m));
        lost
    }
}

impl RebuildGate {
    /// Remembers a registered member durably, so a later master waits for
    /// it. A registration whose member is not remembered fails (retryably):
    /// a later master would not wait for its report.
    pub(crate) async fn remember(&self, kv: &dyn DurableKv, m: Member) -> Result<()> {
        members::remember(kv, &m).await.map_err(|e| {
            Error::unavailable(format!(
                "could not record {m} in the durable state ({e}); retry"
            ))
        })
    }

    /// A key this master does not know: not found, unless it is still
    /// rebuilding (then a member may yet report it: retry).
    pub(crate) fn absent(&self, key: &str) -> Error {
        if self.open() {
            return Error::not_found(format!("key {key:?} not found"));
        }
        Error::new(
            Code::NotReady,
            format!(
                "key {key:?} is not known yet: the master is rebuilding its metadata from its members; retry"
            ),
        )
    }

    /// Adopts the objects a store node reports it still holds.
    pub(crate) fn adopt_node_objects(
        &self,
        m: Model,
        cluster: &Cluster,
        keys: &TermKeys,
        req: &pb::ReportNodeObjectsRequest,
    ) -> Result<pb::ReportNodeObjectsResponse> {
        if req.objects.len() > MAX_REPORT {
            return Err(Error::invalid(format!(
                "{} objects in one report; send at most {MAX_REPORT}",
                req.objects.len()
            )));
        }
        let node = cluster
            .node(&req.node_id)
            .ok_or_else(|| Error::not_found(format!("node {:?} is not registered", req.node_id)))?;
        if !node.proof.matches(&req.instance_proof) || node.incarnation != req.incarnation {
            return Err(Error::new(
                Code::PermissionDenied,
                format!(
                    "object report for node {:?} does not come from its current registration",
                    req.node_id
                ),
            ));
        }
        // Only a registration a rebuilding master asked, until its last
        // batch, and only while the rebuild takes reports: later, the
        // object log has moved on without the node (a key removed
        // meanwhile must not come back).
        let refused = if !node.asked_to_report {
            Some("its registration was not asked to (RegisterNodeResponse.report_objects)")
        } else if node.reported.load(Ordering::Acquire) {
            Some("it sent its last batch already")
        } else if !self.taking_reports() {
            Some("the rebuild no longer takes reports")
        } else {
            None
        };
        if let Some(why) = refused {
            return Err(Error::new(
                Code::PermissionDenied,
                format!("node {:?} may not report objects: {why}", req.node_id),
            ));
        }
        let segments = cluster.segments_of(&node);
        let mut out = pb::ReportNodeObjectsResponse::default();
        for o in &req.objects {
            let seg = usize::try_from(o.local_segment)
                .ok()
                .and_then(|i| segments.get(i).cloned().flatten());
            let outcome = match (seg, given(keys, &node, o)) {
                (Some(_), None) => Err(Refusal::Unsigned),
                // Under --integrity blake3 an object is adopted only with
                // its writer's digest, which only a commit's record covers
                // (a put not committed on the node yet is dropped).
                (Some(_), Some(Evidence::BeforeCommit))
                    if m.cfg.integrity == crate::config::Integrity::Blake3 =>
                {
                    Err(Refusal::NoDigest)
                }
                (Some(_), Some(Evidence::Commit))
                    if m.cfg.integrity == crate::config::Integrity::Blake3
                        && o.blake3.len() != 32 =>
                {
                    Err(Refusal::NoDigest)
                }
                (Some(seg), Some(evidence)) => adopt_one(m, cluster, o, seg, evidence, self),
                (None, _) => Err(Refusal::Malformed),
            };
            let label = match outcome {
                Ok(Adopted::Added) => {
                    out.adopted += 1;
                    "adopted"
                }
                Ok(Adopted::ReplacedOlder(old)) => {
                    // The older version's ranges are freed; their nodes
                    // forget them through the object log.
                    old.release();
                    out.adopted += 1;
                    m.metrics
                        .rebuilt_objects
                        .with_label_values(&["older_version_dropped"])
                        .inc();
                    "adopted"
                }
                Err(why) => {
                    out.refused += 1;
                    why.label()
                }
            };
            m.metrics.rebuilt_objects.with_label_values(&[label]).inc();
        }
        if req.last {
            node.reported.store(true, Ordering::Release);
            self.reported(Member::Node(req.node_id.clone()));
        }
        tracing::info!(
            node = req.node_id,
            adopted = out.adopted,
            refused = out.refused,
            last = req.last,
            "adopted objects a store node still holds"
        );
        Ok(out)
    }
}

/// What shows a master gave a node the object it reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Evidence {
    /// The commit record of its commit's log entry: the only one that
    /// covers the writer's digest.
    Commit,
    /// The record of its announcement (its PutEnd had not reached the
    /// node), or the put record the master signed at PutStart (the node
    /// recorded the put from the client's write).
    BeforeCommit,
}

/// Which record, if any, shows that a master gave `node` the reported
/// object: its log entry's commit record (a commit's or an
/// announcement's), or, for a put the node recorded from the client's
/// write, the put record the master signed at PutStart (under the node's
/// key of that term; it names the segment id of that registration).
fn given(keys: &TermKeys, node: &NodeEntry, o: &pb::NodeObject) -> Option<Evidence> {
    match node.verify_commit_record(o) {
        Some(false) => return Some(Evidence::Commit),
        Some(true) => return Some(Evidence::BeforeCommit),
        None => {}
    }
    if o.put_record.is_empty() || o.term == 0 {
        return None;
    }
    let key = keys.member_key_in(&node_member(&node.node_id), &node.proof, o.term);
    let put = PutRecord {
        key: &o.key,
        segment_id: o.segment_id,
        offset: o.offset,
        length: o.length,
        generation: o.generation,
        crc32c: o.crc32c,
    };
    key.verify_record(&put, &o.put_record)
        .then_some(Evidence::BeforeCommit)
}

fn adopt_one(
    m: Model,
    cluster: &Cluster,
    o: &pb::NodeObject,
    seg: std::sync::Arc<crate::cluster::SegmentEntry>,
    evidence: Evidence,
    gate: &RebuildGate,
) -> std::result::Result<Adopted, Refusal> {
    if validate_key(&o.key).is_err() || o.length == 0 || !o.offset.is_multiple_of(ALIGN) {
        return Err(Refusal::Malformed);
    }
    let len = aligned_len(o.length).ok_or(Refusal::Malformed)?;
    if m.tombstones.is_removed(&o.key, o.length, o.crc32c) {
        return Err(Refusal::Removed);
    }
    if !seg.reserve(o.offset, len) {
        return Err(Refusal::RangeInUse);
    }
    // The commit's own generation (grants for the range keep fencing
    // as before); a fresh one if the node did not say.
    let generation = if o.generation > 0 {
        // Later allocations must get newer generations than every
        // adopted one (a successor whose clock is behind would hand an
        // overwrite an older generation than the version it replaces,
        // and a rebuild keeps the newest). Capped a day ahead of this
        // clock, so a node's claim cannot exhaust the counter.
        let cap = strata_common::time::unix_ms().saturating_add(86_400_000) << 16;
        if o.generation < cap {
            cluster.raise_generation(o.generation);
        }
        o.generation
    } else {
        cluster.next_generation()
    };
    let replica = Replica {
        seg: seg.clone(),
        offset: o.offset,
        alloc_len: len,
        generation,
    };
    // The writer's digest, only where a commit's record covers it.
    let digest = <[u8; 32]>::try_from(&o.blake3[..])
        .ok()
        .filter(|_| evidence == Evidence::Commit);
    let adopted_object = |replica| {
        let mut obj = Object::committed(o.length, o.crc32c, vec![replica], Vec::new());
        obj.set_adopted(true);
        if let Some(d) = digest {
            obj.set_digest(d);
        }
        obj
    };
    let adopted = {
        let mut shard = m.objects.shard(&o.key);
        // A copy of what this term removed (a node with no generation to
        // report counts as older).
        if gate.was_removed(&o.key, o.generation) {
            drop(shard);
            seg.free(o.offset, len);
            return Err(Refusal::Removed);
        }
        let adopted = match shard.get_mut(&o.key) {
            None => {
                shard.insert(&o.key, adopted_object(replica));
                m.metrics.keys.inc();
                Ok(Adopted::Added)
            }
            // Another replica of the same bytes (a second node's copy; or
            // the DRAM copy of an object an SSD inventory brought back
            // first, which learns its digest from this record).
            Some(x)
                if x.is_complete()
                    && x.size == o.length
                    && x.crc32c == o.crc32c
                    // An SSD copy's record may bring a digest the node's
                    // report lacks (or the other way round); readers check
                    // every copy against the object's digest either way.
                    && (x.digest() == digest
                        || (x.adopted() && (x.digest().is_none() || digest.is_none())))
                    && x.replicas().iter().all(|r| r.seg.id != seg.id) =>
            {
                if let (None, Some(d)) = (x.digest(), digest) {
                    x.set_digest(d);
                }
                x.push_replica(replica);
                Ok(Adopted::Added)
            }
            // Another version: the newest commit wins. Only between
            // versions both adopted from reports (never one this term
            // committed), DRAM copies whose generations are known (an SSD
            // copy's is not), and never under a pin.
            Some(x)
                if x.is_complete()
                    && x.adopted()
                    && (x.size, x.crc32c) != (o.length, o.crc32c)
                    && x.ssd().is_empty()
                    && x.pins == 0
                    && o.generation > 0
                    && x.replicas().iter().all(|r| r.generation < o.generation) =>
            {
                let old = std::mem::replace(x, adopted_object(replica));
                Ok(Adopted::ReplacedOlder(old))
            }
            Some(_) => Err(replica),
        };
        if adopted.is_ok() {
            // The node's records come back through its object log;
            // logged under the shard lock, so a removal or a PutEnd of
            // the object logs after it.
            seg.node.log_object(
                pb::object_log_entry::Op::Commit,
                true,
                &o.key,
                seg.id,
                o.offset,
                o.length,
                o.crc32c,
                generation,
                digest,
            );
        }
        adopted
    };
    adopted.map_err(|r| {
        r.seg.free(r.offset, r.alloc_len);
        Refusal::OtherVersion
    })
}
