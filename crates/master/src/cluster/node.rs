//! Store nodes and their mounted segments, as the master sees them.

use super::allocator::RangeAllocator;
use crate::grants::{CommitRecords, Committed};
use crate::sync::Acks;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use strata_common::auth::ProofHash;
use strata_common::grant::{GrantKey, GrantScope};
use strata_common::{Error, Result};
use strata_proto as pb;
use strata_proto::{object_log_entry, CommittedObject, FreedRange, ObjectLogEntry};

/// Heartbeat responses carry at most this many log entries; the node asks
/// again at once when it got a full page.
pub const LOG_PAGE: usize = 32_768;

/// Who a registered store node is.
pub struct NodeIdentity {
    pub node_id: String,
    pub data_addr: String,
    /// Public id of its process (its data-plane ping answer).
    pub instance: String,
    /// The secret its process registered with.
    pub proof: ProofHash,
    /// The key it verifies grants with (derived for it alone).
    pub grant_key: GrantKey,
}

/// A registered store node.
pub struct NodeEntry {
    pub node_id: String,
    pub data_addr: String,
    pub instance: String,
    pub proof: ProofHash,
    pub grant_key: GrantKey,
    pub incarnation: u64,
    pub segment_ids: Vec<u64>,
    pub last_heartbeat_ms: AtomicU64,
    log: Mutex<NodeLog>,
    /// Highest log entry the node says it applied (its heartbeats); PutEnds
    /// and removals wait on it.
    pub(crate) acks: Arc<Acks>,
    /// The log grew: a long-polling heartbeat answers at once.
    pub(crate) log_grew: tokio::sync::Notify,
    /// The node fell so far behind that an entry of its log was dropped
    /// unsent: its records no longer match the master's, so it is dropped
    /// (its next heartbeat, or its TTL) and starts over with a new
    /// registration. Set under the log's lock; read without it (placement).
    overflowed: AtomicBool,
    /// Counts nodes whose log overflowed (the master's metric).
    overflows: Option<prometheus::IntCounter>,
    /// The node keeps announced puts (`Op::Pending`); older nodes do not, so
    /// their PutEnds wait for the commit itself.
    pub records_pending: bool,
    /// The node records puts from their writes and answers with receipts
    /// (`Replica.record`, `PutEndRequest.receipts`).
    pub records_receipts: bool,
    /// Signs what the node is told it holds (`CommittedObject.commit_record`).
    commit_records: Option<CommitRecords>,
    /// This registration was asked to report what it holds (a rebuilding
    /// master); only such a one may, until its last batch.
    pub asked_to_report: bool,
    /// Its report's last batch came.
    pub(crate) reported: AtomicBool,
}

/// What the node must learn about the objects it holds: commits and frees, in
/// order. The node applies them and acknowledges the sequence number, so its
/// own record of committed objects (key, range, checksum) survives the
/// master's memory.
#[derive(Default)]
struct NodeLog {
    next_seq: u64,
    entries: VecDeque<ObjectLogEntry>,
    /// Encoded size of `entries`.
    bytes: u64,
    /// Most `bytes` held; past it the log overflowed.
    max_bytes: u64,
}

impl NodeEntry {
    pub fn new(id: NodeIdentity, incarnation: u64, segment_ids: Vec<u64>, now_ms: u64) -> Self {
        Self::with_log_bound(id, incarnation, segment_ids, now_ms, u64::MAX)
    }

    /// [`NodeEntry::new`] whose object log holds at most `max_log_bytes`
    /// (encoded) the node has not applied.
    pub fn with_log_bound(
        id: NodeIdentity,
        incarnation: u64,
        segment_ids: Vec<u64>,
        now_ms: u64,
        max_log_bytes: u64,
    ) -> Self {
        let id_for_acks = id.node_id.clone();
        NodeEntry {
            node_id: id.node_id,
            data_addr: id.data_addr,
            instance: id.instance,
            proof: id.proof,
            grant_key: id.grant_key,
            incarnation,
            segment_ids,
            last_heartbeat_ms: AtomicU64::new(now_ms),
            log: Mutex::new(NodeLog {
                next_seq: 1,
                max_bytes: max_log_bytes,
                ..Default::default()
            }),
            acks: Arc::new(Acks::new(format!("store node {}", id_for_acks))),
            log_grew: tokio::sync::Notify::new(),
            overflowed: AtomicBool::new(false),
            overflows: None,
            records_pending: false,
            records_receipts: false,
            commit_records: None,
            asked_to_report: false,
            reported: AtomicBool::new(false),
        }
    }

    pub(crate) fn with_commit_records(mut self, r: CommitRecords) -> Self {
        self.commit_records = Some(r);
        self
    }

    pub fn with_report(mut self, asked: bool) -> Self {
        self.asked_to_report = asked;
        self
    }

    /// The commit record of what this node holds (`commit_records`):
    /// of an announcement (`announced`) or of a commit.
    pub(crate) fn commit_record(&self, c: &CommittedObject, announced: bool) -> Vec<u8> {
        let Some(r) = &self.commit_records else {
            return Vec::new();
        };
        r.sign(&Committed {
            node_id: &self.node_id,
            key: &c.key,
            offset: c.offset,
            length: c.length,
            crc32c: c.crc32c,
            generation: c.generation,
            digest: (!c.blake3.is_empty()).then_some(&c.blake3[..]),
            announced,
        })
        .to_vec()
    }

    /// Which record a master gave this node for `o`, if any: a commit's
    /// (Some(false)) or an announcement's (Some(true)).
    pub(crate) fn verify_commit_record(&self, o: &strata_proto::NodeObject) -> Option<bool> {
        let r = self.commit_records.as_ref()?;
        [false, true].into_iter().find(|&announced| {
            let c = Committed {
                announced,
                ..Committed::reported(&self.node_id, o)
            };
            r.verify(&c, &o.commit_record)
        })
    }

    pub fn with_pending_records(mut self, yes: bool) -> Self {
        self.records_pending = yes;
        self
    }

    pub fn with_receipts(mut self, yes: bool) -> Self {
        self.records_receipts = yes;
        self
    }

    /// Whether a put whose client asked for receipts (`receipts`) is
    /// recorded by this node from the write, so it gets a signed record
    /// instead of an announcement.
    pub fn records_from_write(&self, receipts: bool) -> bool {
        receipts && self.records_receipts
    }

    /// Appends `op`; with `wake`, a long-polling heartbeat delivers it at
    /// once, else it rides with the next entry that wakes one (or the next
    /// heartbeat): one node round trip fewer for what nobody waits for.
    ///
    /// Past the log's bound the entry is dropped unsent and the log marked
    /// overflowed: whoever waits for it is told at once (`Acks::lose`), and
    /// the node's next heartbeat is answered "unknown" (it registers again,
    /// reporting nothing this term), so a node that stops applying its log
    /// costs the master a bounded amount of memory.
    fn push(&self, op: object_log_entry::Op, wake: bool) -> u64 {
        let (seq, overflowed, first) = {
            let mut log = self.log.lock();
            let seq = log.next_seq;
            log.next_seq += 1;
            let entry = ObjectLogEntry { seq, op: Some(op) };
            let len = prost::Message::encoded_len(&entry) as u64;
            let was = self.overflowed.load(Ordering::Acquire);
            let fits = !was && log.bytes.saturating_add(len) <= log.max_bytes;
            if fits {
                log.bytes += len;
                log.entries.push_back(entry);
            } else {
                self.overflowed.store(true, Ordering::Release);
            }
            (seq, !fits, !was && !fits)
        };
        if first {
            if let Some(c) = &self.overflows {
                c.inc();
            }
            tracing::warn!(
                node = self.node_id,
                "store node fell too far behind applying its object log; dropping it (it registers again)"
            );
        }
        if overflowed {
            self.acks.lose(seq);
        }
        if wake || overflowed {
            self.log_grew.notify_waiters();
        }
        seq
    }

    /// Whether the log overflowed (see [`NodeEntry::push`]).
    pub fn log_overflowed(&self) -> bool {
        self.overflowed.load(Ordering::Acquire)
    }

    /// Counts the overflow of this node's log in `c`.
    pub(crate) fn with_overflow_counter(mut self, c: prometheus::IntCounter) -> Self {
        self.overflows = Some(c);
        self
    }

    /// Records a committed object (`Op::Commit`) or an announced put
    /// (`Op::Pending`, whose client declared its checksum) for the node;
    /// returns its log sequence number. `wake`: someone waits for the node
    /// to apply it (`push`).
    #[allow(clippy::too_many_arguments)]
    pub fn log_object(
        &self,
        kind: fn(CommittedObject) -> object_log_entry::Op,
        wake: bool,
        key: &str,
        segment_id: u64,
        offset: u64,
        length: u64,
        crc: u32,
        generation: u64,
        digest: Option<[u8; 32]>,
    ) -> u64 {
        let c = CommittedObject {
            key: key.to_string(),
            segment_id,
            offset,
            length,
            crc32c: crc,
            generation,
            blake3: digest.map(Vec::from).unwrap_or_default(),
            ..Default::default()
        };
        let mut op = kind(c);
        match &mut op {
            object_log_entry::Op::Commit(c) => c.commit_record = self.commit_record(c, false),
            object_log_entry::Op::Pending(c) => c.commit_record = self.commit_record(c, true),
            object_log_entry::Op::Free(_) => {}
        }
        self.push(op, wake)
    }

    /// Records a freed range for the node; returns its log sequence number.
    pub fn log_free(&self, segment_id: u64, offset: u64, length: u64, generation: u64) -> u64 {
        self.push(
            object_log_entry::Op::Free(FreedRange {
                segment_id,
                offset,
                length,
                generation,
            }),
            true,
        )
    }

    /// The node applied the log up to `seq` (a heartbeat said so).
    pub fn ack(&self, seq: u64) {
        self.acks.ack(seq);
    }

    pub fn acked_seq(&self) -> u64 {
        self.acks.acked()
    }

    /// Drops what the node has applied and returns the next page. A node
    /// cannot have applied what was never sent: such a claim is refused
    /// (it would empty the log unread).
    pub fn log_page(&self, applied_seq: u64) -> Result<Vec<ObjectLogEntry>> {
        let mut log = self.log.lock();
        if applied_seq >= log.next_seq {
            return Err(Error::invalid(format!(
                "applied_seq {applied_seq} is beyond the last log entry sent ({})",
                log.next_seq - 1
            )));
        }
        while log.entries.front().is_some_and(|e| e.seq <= applied_seq) {
            if let Some(e) = log.entries.pop_front() {
                log.bytes -= prost::Message::encoded_len(&e) as u64;
            }
        }
        Ok(log.entries.iter().take(LOG_PAGE).cloned().collect())
    }

    pub fn log_backlog(&self) -> usize {
        self.log.lock().entries.len()
    }
}

/// One mounted DRAM segment and its allocator.
pub struct SegmentEntry {
    pub id: u64,
    pub node: Arc<NodeEntry>,
    pub capacity: u64,
    alloc: Mutex<RangeAllocator>,
    /// Mirrors the allocator so placement can skim segments without locking.
    allocated: AtomicU64,
    mounted: AtomicBool,
    /// Its UCX route, when its node serves UCX.
    pub ucx: Option<super::ucx_routes::UcxRoute>,
}

impl SegmentEntry {
    pub fn new(id: u64, node: Arc<NodeEntry>, size: u64) -> Self {
        let alloc = RangeAllocator::new(size);
        SegmentEntry {
            id,
            node,
            capacity: alloc.capacity(),
            alloc: Mutex::new(alloc),
            allocated: AtomicU64::new(0),
            mounted: AtomicBool::new(true),
            ucx: None,
        }
    }

    pub fn with_ucx(mut self, route: Option<super::ucx_routes::UcxRoute>) -> Self {
        self.ucx = route;
        self
    }

    /// The fingerprint replicas carry (0: TCP only).
    pub fn ucx_fingerprint(&self) -> u64 {
        self.ucx.as_ref().map_or(0, |r| r.fingerprint)
    }

    pub fn alloc(&self, size: u64) -> Option<(u64, u64)> {
        if !self.is_mounted() {
            return None;
        }
        let mut a = self.alloc.lock();
        let r = a.alloc(size);
        self.allocated.store(a.allocated(), Ordering::Relaxed);
        r
    }

    /// Allocates exactly `[offset, offset + len)`; false if any of it is
    /// in use (or the segment is gone).
    pub fn reserve(&self, offset: u64, len: u64) -> bool {
        if !self.is_mounted() {
            return false;
        }
        let mut a = self.alloc.lock();
        let ok = a.alloc_at(offset, len);
        self.allocated.store(a.allocated(), Ordering::Relaxed);
        ok
    }

    pub fn free(&self, offset: u64, len: u64) {
        let mut a = self.alloc.lock();
        if !a.free(offset, len) {
            tracing::error!(segment = self.id, offset, len, "refused an invalid free");
        }
        self.allocated.store(a.allocated(), Ordering::Relaxed);
    }

    pub fn allocated(&self) -> u64 {
        self.allocated.load(Ordering::Relaxed)
    }

    pub fn free_bytes(&self) -> u64 {
        self.capacity.saturating_sub(self.allocated())
    }

    pub fn largest_free(&self) -> u64 {
        self.alloc.lock().largest_free()
    }

    pub fn is_mounted(&self) -> bool {
        self.mounted.load(Ordering::Acquire)
    }

    pub fn unmount(&self) {
        self.mounted.store(false, Ordering::Release);
    }
}

/// One copy of an object's bytes in a DRAM segment.
#[derive(Clone)]
pub struct Replica {
    pub seg: Arc<SegmentEntry>,
    pub offset: u64,
    /// Bytes reserved in the allocator (the size rounded up).
    pub alloc_len: u64,
    /// The allocation's generation, carried in its grants.
    pub generation: u64,
}

impl Replica {
    /// The replica as a client or member sees it: where it is, and a grant
    /// for `perm` on `length` bytes until `expires`, signed with its node's
    /// key for this term.
    pub fn view(&self, length: u64, perm: u32, expires: u64, complete: bool) -> pb::Replica {
        let scope = GrantScope {
            perm,
            segment_id: self.seg.id,
            offset: self.offset,
            length,
            expires_unix_ms: expires,
            generation: self.generation,
        };
        pb::Replica {
            kind: pb::ReplicaKind::Memory as i32,
            node_id: self.seg.node.node_id.clone(),
            data_addr: self.seg.node.data_addr.clone(),
            segment_id: self.seg.id,
            offset: self.offset,
            length,
            grant: Some(pb::Grant {
                perm,
                expires_unix_ms: expires,
                generation: self.generation,
                mac: self.seg.node.grant_key.sign(&scope).to_vec(),
            }),
            state: if complete {
                pb::ReplicaState::Complete as i32
            } else {
                pb::ReplicaState::Processing as i32
            },
            owner_id: 0,
            ucx_route: self.seg.ucx_fingerprint(),
            record: Vec::new(),
        }
    }
}
