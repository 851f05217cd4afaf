//! `Master`: one leadership term's root and its one API (the front ends,
//! `service.rs`, `quick_calls.rs` and `admin.rs`, call these methods). It
//! holds the shared model (`ObjectTable`, `Tombstones`, `Retired`, lent to
//! owners as a `Model`) and the owners, each keeping its state and locks
//! private: `Cluster` (nodes, segments), `Writes` (puts, commits, removals),
//! `Pressure` (placement, eviction, waiting puts), `SsdTier` (owners,
//! offload queue, drops, promotions), `RebuildGate` (the rebuild from the
//! members) and `TermKeys`. Methods here delegate; the work is in the owners.
//!
//! # Lock order
//!
//! "A → B": B may be taken while A is held, never the reverse. Each lock is
//! private to its owner, so this list is complete by construction.
//!
//! - `PutWaiters.turn` (a tokio mutex, `pressure/backpressure.rs`) is
//!   outermost: the put whose turn it is holds it across
//!   `Pressure::allocate_once`, which may take any lock below. It is the one
//!   lock held across an `.await`.
//! - Offload queue → owner registry (`SsdTier::enqueue` via `pick_owner`;
//!   `describe_owners`).
//! - Never the offload queue and a shard together: `SsdTier::take_tasks` and
//!   `report_offload` release the queue first; `Pressure::evict_with` calls
//!   `SsdTier::urge` before the shard; `describe_offload` counts pins after.
//! - Shard → node object log (`Writes::start` via `records::announce`,
//!   `commit_object`, `rebuild::adopt_one`, `SsdTier::report_promotion`):
//!   logging under the shard keeps a node's log in the order the object
//!   changed.
//! - Shard → tombstone map (`SsdTier::add_ssd_replica` asks
//!   `Tombstones::is_removed`); tombstone log → tombstone map
//!   (`Tombstones::record`), so a lookup never waits for the fsync.
//! - Shard → owner registry, read (`reads::inspect` builds SSD views).
//! - Shard → rebuild members (`Writes::remove` asks `RebuildGate::absent`
//!   under the shard).
//! - Cluster maps never across a shard lock: `Cluster::drop_node` unmounts
//!   before scanning shards, `adopt_node_objects` copies the segments out
//!   first. `nodes` and `segments` never together; `nodes` (read) → node log
//!   (`describe_nodes`).
//! - Leaves, under which nothing is taken: node log, segment allocator,
//!   owner registry, tombstone map, promotions, drops, admission duel,
//!   retired versions, puts in flight, `left_nodes`, members. Ranges are
//!   freed only after the shard lock is released.
//!
//! `parking_lot` guards are not `Send`: none lives across an `.await`.
//!
//! Debug builds check the first three rules as locks are taken
//! (`lock_order.rs`: shards, the offload queue, `nodes` and `segments` are
//! `Ordered*` locks that panic when one is taken under a lock it must never
//! meet), so every test drives the order, not just this list.

use crate::cluster::Cluster;
use crate::cluster::Replica;
use crate::config::MasterConfig;
use crate::durable::{DurableKv, FileKv, MemKv};
use crate::grants::TermKeys;
use crate::metrics::MasterMetrics;
use crate::model::Model;
use crate::objects::ObjectTable;
pub use crate::objects::{validate_key, MAX_KEY_LEN, MAX_REPLICAS};
use crate::offload::SsdTier;
use crate::pressure::{Placement, Pressure, Want};
use crate::reads;
use crate::rebuild::members::Member;
use crate::rebuild::RebuildGate;
use crate::sync::Unsynced;
pub use crate::writes::PutSpec;
use crate::writes::{Proof, PutEnd, Writes};
use std::sync::Arc;
use std::time::Instant;
use strata_common::auth::ProofHash;
use strata_common::Result;
use strata_proto as pb;

/// Removal tombstones kept at most (the oldest are forgotten beyond it).
const MAX_TOMBSTONES: usize = 4 << 20;
pub struct Master {
    cfg: MasterConfig,
    /// The leadership term and the keys derived for it (`grants.rs`).
    keys: TermKeys,
    objects: ObjectTable,
    /// Store nodes, their segments, and what is handed out to them.
    cluster: Cluster,
    /// The rebuild of this term's metadata from its members (`rebuild/`).
    gate: RebuildGate,
    kv: Arc<dyn DurableKv>,
    /// Puts in flight and their deadlines (`writes.rs`).
    writes: Writes,
    /// DRAM pressure: puts waiting for room, the evictor's wake-up
    /// (`pressure/`).
    pressure: Pressure,
    pub metrics: MasterMetrics,
    /// The SSD tier: owners, offload queue, admission, removals,
    /// promotions (`offload/`).
    ssd: SsdTier,
    /// Removed objects whose SSD copies must never be adopted again.
    tombstones: crate::tombstones::Tombstones,
    /// Versions an overwrite replaced, kept for their readers.
    retired: crate::objects::Retired,
}

impl Master {
    /// Opens the durable state (`--state-dir`, or memory without one).
    pub fn new(cfg: MasterConfig) -> Result<Arc<Self>> {
        let kv = Self::local_kv_of(&cfg)?;
        Self::with_kv(cfg, kv)
    }

    /// The single master's durable state: `--state-dir`, or memory.
    pub fn local_kv_of(cfg: &MasterConfig) -> Result<Arc<dyn DurableKv>> {
        Ok(match &cfg.state_dir {
            Some(dir) => Arc::new(FileKv::open(dir)?),
            None => {
                tracing::warn!(
                    "no --state-dir: SSD owner identities will not survive a master restart"
                );
                Arc::new(MemKv::new())
            }
        })
    }

    /// A master for unit tests: term 1, its own metrics.
    pub fn with_kv(cfg: MasterConfig, kv: Arc<dyn DurableKv>) -> Result<Arc<Self>> {
        futures::executor::block_on(Self::for_term(cfg, kv, MasterMetrics::new(), 1))
    }

    /// The metadata of one leadership term, starting empty (members report
    /// what they hold, `rebuild.rs`). `metrics` outlive terms.
    pub async fn for_term(
        cfg: MasterConfig,
        kv: Arc<dyn DurableKv>,
        metrics: MasterMetrics,
        term: u64,
    ) -> Result<Arc<Self>> {
        // A grant key already in the durable state means a master ran
        // before: its nodes may hold objects to report (`rebuild.rs`).
        let restarted = kv.get("grant-key/v1".into()).await?.is_some();
        let keys = TermKeys::new(crate::grants::load_grant_key(kv.as_ref()).await?, term);
        // Read once per term (a startup cost, as before terms existed).
        let tombstones = match &cfg.state_dir {
            Some(dir) => crate::tombstones::Tombstones::open(dir, MAX_TOMBSTONES)?,
            None => crate::tombstones::Tombstones::memory(MAX_TOMBSTONES),
        };
        metrics.keys.set(0);
        metrics.term.set(term as i64);
        let ssd = SsdTier::new(&cfg, kv.clone(), &metrics, term, keys.copy_records())?;
        let gate = RebuildGate::load(kv.as_ref(), restarted, cfg.node_ttl).await?;
        Ok(Arc::new(Master {
            cfg,
            keys,
            objects: ObjectTable::default(),
            cluster: Cluster::new(),
            gate,
            kv,
            writes: Writes::new(),
            pressure: Default::default(),
            metrics,
            ssd,
            tombstones,
            retired: Default::default(),
        }))
    }

    pub fn term(&self) -> u64 {
        self.keys.term()
    }

    pub fn config(&self) -> &MasterConfig {
        &self.cfg
    }

    /// The UCX routes of `segment_ids` (those that have one). The caller's
    /// rdma role was checked by the service.
    pub fn ucx_routes(&self, segment_ids: &[u64]) -> Vec<pb::UcxRoute> {
        self.cluster.ucx_routes(segment_ids)
    }

    // ---------------- put ----------------

    /// Starts a put without waiting for DRAM (in-process callers and unit
    /// tests; the RPCs wait, see `crate::pressure::backpressure`).
    pub fn put_start(&self, spec: PutSpec) -> Result<Vec<pb::Replica>> {
        if let Some(views) = self.check_put(&spec)? {
            return Ok(views);
        }
        let replicas =
            self.pressure
                .allocate(self.model(), &self.cluster, &self.ssd, self.want(&spec))?;
        self.start_put(spec, replicas)
    }

    /// `Some`: the put repeats one its attempt started (`Writes::check`).
    pub(crate) fn check_put(&self, spec: &PutSpec) -> Result<Option<Vec<pb::Replica>>> {
        self.check_accepting_writes()?;
        if let Some(Err((generation, bound))) = crate::writes::own_put(self.model(), spec) {
            // This client's own earlier attempt, broken while written (a
            // replica lost with its node): dropped, so the retry starts
            // afresh. Not waited for: its frees reach the nodes with their
            // next heartbeats, and a rebuild that found the put announced
            // would adopt only these very bytes, whole.
            let token = self.keys.put_token(&spec.key, bound);
            let dropped = self.put_revoke_proved(&spec.key, Some(generation), Some(&token));
            tracing::debug!(
                key = spec.key,
                ok = dropped.is_ok(),
                "dropped a broken put of the same attempt"
            );
        }
        self.writes.check(self.model(), spec)
    }

    /// Records a put whose space is allocated (`Writes::start`).
    pub(crate) fn start_put(
        &self,
        spec: PutSpec,
        replicas: Vec<Replica>,
    ) -> Result<Vec<pb::Replica>> {
        let views = self
            .writes
            .start(self.model(), &self.pressure, spec, replicas)?;
        if crate::pressure::over_high_watermark(self.model(), &self.cluster) {
            self.pressure.wake_evictor();
        }
        Ok(views)
    }

    pub fn put_end(&self, key: &str, crc32c: u32) -> Result<()> {
        self.put_end_unsynced(key, crc32c, &[]).map(|_| ())
    }

    /// Commits a put; the commit reaches its nodes' records with their next
    /// heartbeat (`crate::sync` waits for that), except on nodes whose
    /// receipt shows they recorded the put already.
    pub(crate) fn put_end_unsynced(
        &self,
        key: &str,
        crc32c: u32,
        receipts: &[pb::PutReceipt],
    ) -> Result<Unsynced> {
        self.put_end_of(key, crc32c, receipts, None)
    }

    /// `put_end_unsynced` of the put whose first replica has `generation`
    /// (an overwrite's PutEnd names its version so).
    pub(crate) fn put_end_of(
        &self,
        key: &str,
        crc32c: u32,
        receipts: &[pb::PutReceipt],
        generation: Option<u64>,
    ) -> Result<Unsynced> {
        self.put_end_proved(key, crc32c, None, receipts, generation, None)
    }

    /// A client's PutEnd: `put_end_of` with the put token it brings (a
    /// bound put's must be its own).
    pub(crate) fn put_end_request(&self, r: &pb::PutEndRequest) -> Result<Unsynced> {
        let token = (!r.put_token.is_empty()).then_some(&r.put_token[..]);
        let digest = match r.blake3.len() {
            0 => None,
            _ => Some(<[u8; 32]>::try_from(&r.blake3[..]).map_err(|_| {
                strata_common::Error::invalid(format!(
                    "PutEnd of {:?} brings a BLAKE3 digest of {} bytes; a digest has 32",
                    r.key,
                    r.blake3.len()
                ))
            })?),
        };
        self.put_end_proved(&r.key, r.crc32c, digest, &r.receipts, r.generation, token)
    }

    fn put_end_proved(
        &self,
        key: &str,
        crc32c: u32,
        digest: Option<[u8; 32]>,
        receipts: &[pb::PutReceipt],
        generation: Option<u64>,
        token: Option<&[u8]>,
    ) -> Result<Unsynced> {
        let end = PutEnd {
            key,
            crc32c,
            digest,
            receipts,
            generation,
            proof: Proof {
                keys: &self.keys,
                token,
            },
        };
        let (unsynced, admit) = self
            .writes
            .commit(self.model(), &self.ssd, &self.pressure, end)?;
        if let Some(size) = admit {
            self.ssd.admit_on_put_end(&self.metrics, key, size);
        }
        Ok(unsynced)
    }

    pub fn put_revoke(&self, key: &str) -> Result<()> {
        self.put_revoke_unsynced(key).map(|_| ())
    }

    /// Revokes a put; an announced one's frees must reach its nodes before
    /// the revoke is answered (`Writes::revoke`).
    pub(crate) fn put_revoke_unsynced(&self, key: &str) -> Result<Unsynced> {
        self.put_revoke_of(key, None)
    }

    /// `put_revoke_unsynced` of the put whose first replica has
    /// `generation` (an overwrite's revoke names its version so).
    pub(crate) fn put_revoke_of(&self, key: &str, generation: Option<u64>) -> Result<Unsynced> {
        self.put_revoke_proved(key, generation, None)
    }

    /// A client's revoke: `put_revoke_of` with the put token it brings
    /// (empty: none; a bound put's must be its own).
    pub(crate) fn put_revoke_proved(
        &self,
        key: &str,
        generation: Option<u64>,
        token: Option<&[u8]>,
    ) -> Result<Unsynced> {
        let proof = Proof {
            keys: &self.keys,
            token: token.filter(|t| !t.is_empty()),
        };
        self.writes.revoke(
            self.model(),
            &self.ssd,
            &self.pressure,
            key,
            generation,
            proof,
        )
    }

    /// The token a bound put (`PutStartRequest.bind`) of `key` whose first
    /// replica has `generation` is ended with.
    pub fn put_token(&self, key: &str, generation: u64) -> Vec<u8> {
        self.keys.put_token(key, generation).to_vec()
    }

    /// Frees the versions an overwrite replaced whose readers are done
    /// (housekeeping). Returns how many.
    pub fn free_retired(&self, now_ms: u64) -> usize {
        self.writes
            .free_retired(self.model(), &self.pressure, now_ms)
    }

    /// Waits until every member applied what `u` holds, within
    /// `MasterConfig::sync_wait` (else a retryable error: `Unsynced::wait`).
    pub(crate) async fn await_synced(&self, u: Unsynced, what: &str) -> Result<()> {
        let deadline = Instant::now() + self.cfg.sync_wait();
        u.wait(
            deadline,
            self.closing(),
            &self.metrics.unsynced_commits,
            what,
        )
        .await
    }

    /// `r`'s answer once its members applied what it logged (`await_synced`).
    pub(crate) async fn when_synced<T>(&self, r: Result<(T, Unsynced)>, what: &str) -> Result<T> {
        let (answer, u) = r?;
        self.await_synced(u, what).await.map(|()| answer)
    }

    /// Starts a put, waiting until `deadline` for DRAM that copies to SSD
    /// in flight will free. Nothing is allocated until the put has its
    /// space, so a call dropped while waiting leaks nothing.
    pub async fn put_start_waiting(
        &self,
        spec: PutSpec,
        deadline: Instant,
    ) -> Result<Vec<pb::Replica>> {
        if let Some(views) = self.check_put(&spec)? {
            return Ok(views);
        }
        let replicas = self
            .pressure
            .allocate_waiting(
                self.model(),
                &self.cluster,
                &self.ssd,
                self.want(&spec),
                deadline,
            )
            .await?;
        self.start_put(spec, replicas)
    }

    /// Starts the puts of a batch that need not wait, in order, stopping at
    /// the first that must (it and the rest are returned, to wait in order).
    /// Blocking work (eviction scans): run it off the async workers.
    pub fn put_start_batch_now(
        &self,
        specs: Vec<PutSpec>,
    ) -> (Vec<Result<Vec<pb::Replica>>>, Vec<PutSpec>) {
        let mut done = Vec::with_capacity(specs.len());
        let mut specs = specs.into_iter();
        while self.pressure.waiting() == 0 {
            let Some(spec) = specs.next() else { break };
            let placed = match self.check_put(&spec) {
                Ok(Some(views)) => {
                    done.push(Ok(views));
                    continue;
                }
                Ok(None) => self.pressure.allocate_once(
                    self.model(),
                    &self.cluster,
                    &self.ssd,
                    self.want(&spec),
                ),
                Err(e) => Err(e),
            };
            match placed {
                Ok(Placement::Placed(r)) => done.push(self.start_put(spec, r)),
                Ok(Placement::Wait(_)) => {
                    return (done, std::iter::once(spec).chain(specs).collect());
                }
                Err(e) => done.push(Err(e)),
            }
        }
        (done, specs.collect())
    }

    /// The DRAM `spec` asks for, placed now (not urgent).
    fn want(&self, spec: &PutSpec) -> Want {
        let (n, preferred) = (spec.replica_num, spec.preferred_segment);
        Want::now(spec.size, n, preferred, self.rebuilding())
    }

    /// Places one replica of `size` bytes now (an SSD hit promoted back to
    /// DRAM).
    pub(crate) fn place_one(&self, size: u64) -> Result<Vec<Replica>> {
        let want = Want::now(size, 1, None, self.rebuilding());
        self.pressure
            .allocate(self.model(), &self.cluster, &self.ssd, want)
    }

    /// Shutting down: waiting puts (and later ones) fail at once with a
    /// retryable `unavailable` instead of holding up the drain.
    pub fn stop_waiting(&self) {
        self.pressure.stop_waiting();
    }

    /// Fires when the term ends (shutdown or step-down): every wait and
    /// long poll answers at once.
    pub(crate) fn closing(&self) -> &tokio_util::sync::CancellationToken {
        self.pressure.closing()
    }

    /// Evicts until at least `want` bytes are freed or on their way, or
    /// nothing evictable is left (`Pressure::evict_with`). Returns the bytes
    /// freed.
    pub fn evict(&self, want: u64) -> u64 {
        self.pressure
            .evict_with(self.model(), &self.ssd, want, false)
            .freed
    }

    /// Fires when a put asked the evictor to run.
    pub(crate) fn evictor_wanted(&self) -> tokio::sync::futures::Notified<'_> {
        self.pressure.evictor_wanted()
    }

    /// One background pass: above the high watermark, free
    /// `--eviction-ratio` of capacity below it.
    pub fn evict_to_watermark(&self) -> u64 {
        self.pressure
            .evict_to_watermark(self.model(), &self.cluster, &self.ssd)
    }

    // ---------------- get ----------------

    pub fn get_replicas(&self, key: &str) -> Result<pb::GetReplicasResponse> {
        self.get_replicas_for(key, false)
    }

    /// Like [`Master::get_replicas`]; with `stage` (an rdma caller), SSD
    /// grants also allow staging for a one-sided read (`reads.rs`).
    pub fn get_replicas_for(&self, key: &str, stage: bool) -> Result<pb::GetReplicasResponse> {
        reads::get_replicas(self.model(), &self.ssd, &self.gate, key, stage)
    }

    /// Counts reads a client served from its location cache and ends the
    /// leases its reads are done with (`reads.rs`).
    pub fn report_reads(&self, req: &pb::ReportReadsRequest) -> Result<()> {
        if reads::report(self.model(), &self.ssd, req)? > 0 {
            // Objects may have become evictable: a waiting put looks again.
            self.pressure.space_freed();
        }
        Ok(())
    }

    pub fn inspect(&self, key: &str) -> Result<pb::InspectResponse> {
        reads::inspect(self.model(), &self.ssd, key)
    }

    pub fn exists(&self, key: &str) -> Result<bool> {
        reads::exists(self.model(), &self.gate, key)
    }

    /// The committed size of `key`, `None` when it is absent.
    pub fn committed_size(&self, key: &str) -> Result<Option<u64>> {
        reads::committed_size(self.model(), &self.gate, key)
    }

    // ---------------- remove ----------------

    pub fn remove(&self, key: &str, force: bool) -> Result<()> {
        self.remove_unsynced(key, force).map(|_| ())
    }

    /// Removes a key; the caller waits for its nodes and owners to apply
    /// it (`writes/removal.rs`).
    pub(crate) fn remove_unsynced(&self, key: &str, force: bool) -> Result<Unsynced> {
        let m = self.model();
        self.writes
            .remove(m, &self.ssd, &self.pressure, self.removing(), key, force)
    }

    /// Removes every committed object; leased ones are skipped unless `force`.
    /// Objects being written are always skipped. Returns (removed, skipped).
    pub fn remove_all(&self, force: bool) -> (u64, u64) {
        self.writes.remove_all(
            self.model(),
            &self.ssd,
            &self.pressure,
            self.removing(),
            force,
        )
    }

    pub fn list(
        &self,
        prefix: &str,
        start_after: &str,
        limit: usize,
    ) -> (Vec<pb::ObjectSummary>, bool) {
        self.objects.list(prefix, start_after, limit)
    }

    // ---------------- space ----------------

    pub fn capacity_bytes(&self) -> u64 {
        self.cluster.capacity_bytes()
    }

    pub fn allocated_bytes(&self) -> u64 {
        self.cluster.allocated_bytes()
    }

    /// One housekeeping pass (blocking: run it off the async workers):
    /// expires silent nodes, reclaims puts never ended, expires and moves
    /// offload tasks and promotions, frees replaced versions whose readers
    /// are done. Returns the nodes that went (to forget durably).
    pub fn tick(&self) -> Vec<String> {
        let now_ms = strata_common::time::unix_ms;
        let dead = self.expire_nodes(now_ms());
        self.reclaim_expired_puts(Instant::now());
        self.expire_offload_tasks(now_ms());
        self.reassign_orphaned_tasks(now_ms());
        self.expire_promotions(now_ms());
        self.free_retired(now_ms());
        dead
    }

    /// Reclaims puts whose deadline passed without PutEnd. Returns how many.
    pub fn reclaim_expired_puts(&self, now: Instant) -> usize {
        self.writes
            .reclaim_expired(self.model(), &self.pressure, now)
    }

    pub fn stat(&self) -> pb::StatResponse {
        let info = self.cluster.segment_infos();
        let (queued, assigned) = self.queue_counts();
        pb::StatResponse {
            keys: self.objects.len() as u64,
            capacity_bytes: info
                .iter()
                .map(|s| s.capacity_bytes)
                .fold(0, u64::saturating_add),
            allocated_bytes: info
                .iter()
                .map(|s| s.allocated_bytes)
                .fold(0, u64::saturating_add),
            nodes: self.cluster.node_count() as u32,
            segments: info.len() as u32,
            evictions: self.metrics.evictions.get(),
            segment_info: info,
            owners: self.ssd.owner_infos(),
            offload_queued: queued as u64,
            offload_assigned: assigned as u64,
        }
    }

    /// Updates gauges that are cheaper to compute at scrape time.
    pub fn refresh_gauges(&self) {
        let m = &self.metrics;
        let gauge = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        m.capacity_bytes.set(gauge(self.capacity_bytes()));
        m.allocated_bytes.set(gauge(self.allocated_bytes()));
        m.nodes.set(self.cluster.node_count() as i64);
        self.ssd.refresh_owner_gauges(m);
        m.segments.set(self.cluster.segment_count() as i64);
        // As the writes count them: an overwrite being written is a key
        // until its commit retires the version it replaces.
        m.keys
            .set((self.objects.len() + self.objects.overwrites_len()) as i64);
        m.tombstones.set(self.tombstones.len() as i64);
    }

    // ---------------- nodes ----------------

    pub fn register_node(&self, req: pb::RegisterNodeRequest) -> Result<pb::RegisterNodeResponse> {
        // Asked now, or never: a registration told not to report may not.
        let r = self
            .cluster
            .register(self.model(), &self.keys, &req, self.rebuilding())?;
        let report = r.report;
        if req.held_objects == 0 || !report {
            // Nothing to report: this node is accounted for.
            self.gate.reported(Member::Node(req.node_id.clone()));
        }
        Ok(pb::RegisterNodeResponse {
            segment_ids: r.segment_ids,
            grant_key: r.grant_key.as_bytes().to_vec(),
            incarnation: r.incarnation,
            heartbeat_interval_ms: self.cfg.heartbeat_interval().as_millis() as u64,
            report_objects: report,
            term: self.keys.term(),
        })
    }

    /// Refuses a registration whose node id a live process holds
    /// (`Cluster::check_node_takeover`).
    pub async fn check_node_takeover(&self, req: &pb::RegisterNodeRequest) -> Result<()> {
        self.cluster
            .check_node_takeover(req, self.cfg.node_ttl.as_millis() as u64)
            .await
    }

    pub fn heartbeat(&self, req: &pb::HeartbeatRequest) -> Result<pb::HeartbeatResponse> {
        self.cluster.heartbeat(self.model(), self.keys.term(), req)
    }

    /// A node heartbeat that waits for new log entries (`Cluster::heartbeat_wait`).
    pub async fn heartbeat_wait(
        &self,
        req: &pb::HeartbeatRequest,
    ) -> Result<pb::HeartbeatResponse> {
        self.cluster
            .heartbeat_wait(self.model(), self.keys.term(), self.closing(), req)
            .await
    }

    pub async fn register_owner(
        &self,
        req: pb::RegisterOwnerRequest,
    ) -> Result<pb::RegisterOwnerResponse> {
        let (owner_id, epoch) = self
            .ssd
            .owners()
            .register(&req, |addr| async move { self.cluster.ping(&addr).await })
            .await?;
        // Before the owner hears back: a later master waits for its inventory.
        self.remember(Member::Owner(owner_id)).await?;
        let key = self
            .keys
            .owner_key(owner_id, &ProofHash::of(&req.instance_proof)?);
        self.ssd
            .new_incarnation(self.model(), owner_id, epoch, key.clone());
        Ok(pb::RegisterOwnerResponse {
            owner_id,
            epoch,
            grant_key: key.as_bytes().to_vec(),
            heartbeat_interval_ms: self.cfg.heartbeat_interval().as_millis() as u64,
            term: self.keys.term(),
        })
    }

    pub fn owner_heartbeat(
        &self,
        req: &pb::OwnerHeartbeatRequest,
    ) -> Result<pb::OwnerHeartbeatResponse> {
        self.ssd
            .heartbeat(self.model(), self.term(), req, |size| self.place_one(size))
    }

    /// An owner's heartbeat that, with nothing to hand out, waits for
    /// urgent offloads (`SsdTier::heartbeat_wait`).
    pub async fn owner_heartbeat_wait(
        &self,
        req: &pb::OwnerHeartbeatRequest,
    ) -> Result<pb::OwnerHeartbeatResponse> {
        let place = |size| self.place_one(size);
        self.ssd
            .heartbeat_wait(self.model(), self.term(), self.closing(), req, place)
            .await
    }

    pub fn report_offload(&self, req: pb::ReportOffloadRequest) -> Result<()> {
        self.ssd.report_offload(self.model(), &self.pressure, req)
    }

    /// `o` with the commit record a master gives node `node_id` for it
    /// (what its object log entry carries): for tests and benchmarks that
    /// play a store node.
    #[doc(hidden)]
    pub fn signed(&self, node_id: &str, mut o: pb::NodeObject) -> pb::NodeObject {
        let record = self.keys.commit_records();
        o.commit_record = record
            .sign(&crate::grants::Committed::reported(node_id, &o))
            .to_vec();
        o
    }

    /// The record a master gives an SSD owner with a copy of `key`
    /// (`OffloadTask.copy_record`): for tests that play an owner.
    #[doc(hidden)]
    pub fn copy_record(&self, key: &str, size: u64, crc32c: u32) -> Vec<u8> {
        self.keys.copy_records().sign(key, size, crc32c, None)
    }

    /// [`Master::copy_record`] of a copy with the writer's digest (a
    /// version-2 record, which carries it).
    #[doc(hidden)]
    pub fn copy_record_with_digest(
        &self,
        key: &str,
        size: u64,
        crc32c: u32,
        digest: &[u8; 32],
    ) -> Vec<u8> {
        self.keys
            .copy_records()
            .sign(key, size, crc32c, Some(digest))
    }

    pub fn report_inventory(&self, req: pb::ReportInventoryRequest) -> Result<u64> {
        let adopted = self.ssd.report_inventory(self.model(), &req)?;
        if !req.relocation && !req.more {
            // A restarted master waits for this (the last page of the
            // inventory) before calling keys absent.
            self.gate.reported(Member::Owner(req.owner_id));
        }
        Ok(adopted)
    }

    pub fn report_promotion(&self, req: pb::ReportPromotionRequest) -> Result<()> {
        self.ssd.report_promotion(self.model(), req)
    }

    /// Forgets every SSD replica in `bucket_ids` of the owner (which deletes
    /// them next). Objects left with no replica at all disappear.
    pub fn evict_buckets(&self, req: &pb::EvictBucketsRequest) -> Result<pb::EvictBucketsResponse> {
        self.ssd.evict_buckets(self.model(), req)
    }

    /// Drops the DRAM replicas of a key that has an SSD replica.
    pub fn evict_memory(&self, key: &str) -> Result<()> {
        self.ssd.evict_memory(self.model(), key)
    }

    /// Expires offload tasks whose deadline passed; their sources are
    /// unpinned.
    pub fn expire_offload_tasks(&self, now_ms: u64) -> usize {
        self.ssd.expire_tasks(self.model(), now_ms)
    }

    /// Offload tasks of owners that stopped heartbeating go to a live owner
    /// (or are dropped). Returns how many moved.
    pub fn reassign_orphaned_tasks(&self, now_ms: u64) -> usize {
        self.ssd
            .reassign_orphaned_tasks(self.model(), &self.pressure, now_ms)
    }

    pub fn expire_promotions(&self, now_ms: u64) {
        self.ssd.expire_promotions(self.model(), now_ms)
    }

    /// (queued, in flight) promotions.
    pub fn promotion_counts(&self) -> (usize, usize) {
        self.ssd.promotion_counts()
    }

    /// (queued, assigned) offload tasks.
    pub fn queue_counts(&self) -> (usize, usize) {
        self.ssd.queue_counts()
    }

    /// Pins currently held on objects (0 when no offload is in flight).
    pub fn total_pins(&self) -> u64 {
        self.ssd.total_pins(self.model())
    }

    /// Forgets a node: its segments are unmounted and every replica on them
    /// is dropped; objects left without replicas disappear.
    /// What a removal hands the rebuild (`rebuild::Removing`).
    fn removing(&self) -> crate::rebuild::Removing<'_> {
        crate::rebuild::Removing {
            gate: &self.gate,
            watermark: self.cluster.generation_watermark(),
        }
    }

    pub fn drop_node(&self, node_id: &str, why: &str) {
        self.cluster.drop_node(self.model(), node_id, None, why)
    }

    /// Drops nodes whose last heartbeat is older than `--node-ttl`; returns
    /// them and the nodes that left since the last call (both to forget).
    pub fn expire_nodes(&self, now_ms: u64) -> Vec<String> {
        let dead = self.cluster.expire(self.model(), now_ms);
        // The sweep ran late: the SSD owners' silence meanwhile is not held
        // against them either (their loss requeues tasks, drops victims),
        // judged later in the same tick.
        let stall = self.cluster.last_stall_ms();
        if stall > 0 {
            self.ssd.owners().forgive(stall, now_ms);
        }
        dead
    }

    // ---------------- admin ----------------

    /// A key's metadata for operators; does not grant a lease.
    pub fn describe(&self, key: &str) -> Option<serde_json::Value> {
        self.objects.describe(key)
    }

    pub fn describe_owners(&self) -> serde_json::Value {
        self.ssd.describe_owners()
    }

    /// The offload queue's view; its tasks' keys only `with_keys`.
    pub fn describe_offload(&self, with_keys: bool) -> serde_json::Value {
        self.ssd.describe_offload(with_keys, || self.total_pins())
    }

    pub fn describe_nodes(&self) -> serde_json::Value {
        self.cluster.describe_nodes()
    }

    // ---------------- rebuild ----------------

    /// Whether asked registrations' reports are still taken (tests).
    #[cfg(test)]
    pub(crate) fn taking_reports(&self) -> bool {
        self.gate.taking_reports()
    }

    /// Whether a node registering now should report what it holds.
    pub(crate) fn rebuilding(&self) -> bool {
        self.gate.rebuilding()
    }

    /// Whether puts are taken (and `/ready` says so): a restarted master
    /// (or a new leader) waits until every member it remembers re-registered
    /// and reported what it holds, since a put before that could take a
    /// range a not-yet-reported object holds, and a get would call a key
    /// an SSD owner has not reported yet "not found".
    pub fn accepting_writes(&self) -> bool {
        self.gate.open()
    }

    pub(crate) fn check_accepting_writes(&self) -> Result<()> {
        self.gate.check_open()
    }

    /// Forgets a lost member durably, so a later master does not wait for
    /// it.
    pub async fn forget(&self, m: &Member) -> Result<()> {
        crate::rebuild::members::forget(self.kv.as_ref(), m).await
    }

    /// Remembers a registered member durably (`RebuildGate::remember`).
    pub async fn remember(&self, m: Member) -> Result<()> {
        self.gate.remember(self.kv.as_ref(), m).await
    }

    /// The remembered members that did not come back within the gate's
    /// bound, once (the caller forgets them durably, so the next master
    /// does not wait for them either). Empty before the bound. One that
    /// registered and is still reporting is not lost.
    pub fn lost_members(&self) -> Vec<Member> {
        self.gate.take_lost(|m| self.registered(m))
    }

    /// Whether `m` registered with this master.
    pub fn registered(&self, m: &Member) -> bool {
        match m {
            Member::Node(id) => self.cluster.node(id).is_some(),
            Member::Owner(id) => self.ssd.owners().registered(*id),
        }
    }

    /// Adopts the objects a store node reports it still holds.
    pub fn adopt_node_objects(
        &self,
        req: &pb::ReportNodeObjectsRequest,
    ) -> Result<pb::ReportNodeObjectsResponse> {
        self.gate
            .adopt_node_objects(self.model(), &self.cluster, &self.keys, req)
    }

    /// The owners, for the unit tests (which go through their APIs).
    #[cfg(test)]
    pub(crate) fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    #[cfg(test)]
    pub(crate) fn objects(&self) -> &ObjectTable {
        &self.objects
    }

    #[cfg(test)]
    pub(crate) fn pressure(&self) -> &Pressure {
        &self.pressure
    }

    #[cfg(test)]
    pub(crate) fn ssd(&self) -> &SsdTier {
        &self.ssd
    }

    #[cfg(test)]
    pub(crate) fn gate(&self) -> &RebuildGate {
        &self.gate
    }

    /// The shared model, lent to an owner for one call.
    pub(crate) fn model(&self) -> Model<'_> {
        Model {
            cfg: &self.cfg,
            objects: &self.objects,
            tombstones: &self.tombstones,
            retired: &self.retired,
            metrics: &self.metrics,
        }
    }
}
