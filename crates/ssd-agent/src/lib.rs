//! `strata-ssd-agent`: the SSD tier of one owner. It holds the owner's
//! identity (a stable `--handle`, mapped by the master to an `owner_id` with a
//! fencing epoch), writes offloaded objects into bucket files in a directory
//! other owners may share, indexes them in RocksDB, recovers exactly its own
//! buckets after a restart, and serves SSD reads on the data plane.

pub mod bucket;
pub mod config;
pub mod eviction;
pub mod index;
pub mod lock;
pub mod offload;
pub mod promotion;
pub mod serve;
pub mod staging;
pub mod store;

pub use config::{SsdAgentArgs, SsdAgentConfig};

use prometheus::{Histogram, HistogramOpts, IntCounterVec, IntGauge, Opts, Registry};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use store::{Faults, OwnerStore, RecoveryReport};
use strata_common::grant::GrantKey;
use strata_common::grpc::MasterChannel;
use strata_common::{Code, Error, Result};
use strata_proto as pb;
use strata_proto::master_client::MasterClient;
use strata_transport::tcp::{ServerMetrics, TcpTransport, TcpTransportConfig};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

struct AgentMetrics {
    registry: Registry,
    used: IntGauge,
    capacity: IntGauge,
    buckets: IntGauge,
    objects: IntGauge,
    unknown_files: IntGauge,
    quarantined_files: IntGauge,
    overhead: IntGauge,
    heartbeats: prometheus::IntCounter,
    outcomes: IntCounterVec,
    /// Bytes that failed their checksum, by where: `read` (a data-plane
    /// read of a bucket), `promotion` (copying back to DRAM),
    /// `offload_source` (a DRAM source handed to this agent).
    checksum_failures: IntCounterVec,
    staging: staging::StagingMetrics,
    /// The lend window's slots (`--transport ucx`). Registered in every
    /// build, so dashboards see zeros rather than absent series.
    #[cfg_attr(not(feature = "ucx"), allow(dead_code))]
    lend: strata_transport::lend::LendMetrics,
    eviction: eviction::EvictionMetrics,
    server: ServerMetrics,
}

impl AgentMetrics {
    fn new() -> Self {
        let r = Registry::new();
        let g = |n: &str, h: &str| strata_common::metrics::gauge(&r, n, h);
        let c = |n: &str, h: &str| strata_common::metrics::counter(&r, n, h);
        let outcomes = IntCounterVec::new(
            Opts::new(
                "strata_ssd_agent_offload_tasks_total",
                "Offload tasks by outcome",
            ),
            &["outcome"],
        )
        .expect("valid metric");
        let _ = r.register(Box::new(outcomes.clone()));
        let checksum_failures = IntCounterVec::new(
            Opts::new(
                "strata_ssd_agent_checksum_failures_total",
                "Objects whose bytes failed their checksum, by stage (read, promotion, offload_source)",
            ),
            &["stage"],
        )
        .expect("valid metric");
        let _ = r.register(Box::new(checksum_failures.clone()));
        let wait = Histogram::with_opts(
            HistogramOpts::new(
                "strata_ssd_agent_staging_wait_seconds",
                "Time reads waited for staging space",
            )
            .buckets(vec![
                0.0001, 0.001, 0.01, 0.05, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0,
            ]),
        )
        .expect("valid metric");
        let _ = r.register(Box::new(wait.clone()));
        AgentMetrics {
            used: g(
                "strata_ssd_agent_used_bytes",
                "Bytes of this owner's bucket files",
            ),
            capacity: g(
                "strata_ssd_agent_capacity_bytes",
                "Bytes this owner may keep",
            ),
            buckets: g("strata_ssd_agent_buckets", "Buckets of this owner"),
            overhead: g(
                "strata_ssd_agent_overhead_bytes",
                "Bytes of this owner's index, WAL and logs (counted against --capacity with the buckets)",
            ),
            heartbeats: c(
                "strata_ssd_agent_heartbeats_total",
                "Owner heartbeats the master answered",
            ),
            objects: g(
                "strata_ssd_agent_objects",
                "Objects in this owner's buckets",
            ),
            unknown_files: g(
                "strata_ssd_agent_unknown_files",
                "Files in the bucket directory that are not bucket files (left alone)",
            ),
            quarantined_files: g(
                "strata_ssd_agent_quarantined_files",
                "This owner's damaged or unindexed files moved to quarantine/",
            ),
            outcomes,
            checksum_failures,
            staging: staging::StagingMetrics {
                capacity: g(
                    "strata_ssd_agent_staging_capacity_bytes",
                    "Read staging arena of this process",
                ),
                in_use: g(
                    "strata_ssd_agent_staging_in_use_bytes",
                    "Staging bytes held by reads",
                ),
                waiters: g(
                    "strata_ssd_agent_staging_waiters",
                    "Reads waiting for staging space",
                ),
                wait_seconds: wait,
                timeouts: c(
                    "strata_ssd_agent_staging_timeouts_total",
                    "Reads that gave up waiting for staging space",
                ),
            },
            lend: strata_transport::lend::LendMetrics {
                leases: g(
                    "strata_ssd_agent_staging_remote_leases",
                    "Lend window slots lent to one-sided (rdma) readers right now",
                ),
                expired: c(
                    "strata_ssd_agent_staging_remote_expired_total",
                    "Lent slots reclaimed after their TTL (never given back)",
                ),
                disconnected: c(
                    "strata_ssd_agent_staging_remote_disconnected_total",
                    "Lent slots taken back when the reader's connection closed before it gave them back",
                ),
                lent_bytes: c(
                    "strata_ssd_agent_staged_bytes_total",
                    "Bytes staged into the UCX lend window for one-sided (rdma) readers",
                ),
            },
            eviction: eviction::EvictionMetrics {
                buckets: c(
                    "strata_ssd_agent_evicted_buckets_total",
                    "Buckets evicted (capacity or mostly removed objects)",
                ),
                kept_objects: c(
                    "strata_ssd_agent_kept_objects_total",
                    "Recently read objects rewritten out of evicted buckets",
                ),
                bytes: c(
                    "strata_ssd_agent_evicted_bytes_total",
                    "Bytes of bucket files evicted",
                ),
                removed_objects: c(
                    "strata_ssd_agent_removed_objects_total",
                    "Objects forgotten because their key was removed from Strata",
                ),
                forced_buckets: c(
                    "strata_ssd_agent_forced_evictions_total",
                    "Buckets evicted without keeping their read objects: what is read no longer fits the capacity",
                ),
            },
            server: ServerMetrics {
                requests: c(
                    "strata_ssd_agent_data_plane_requests_total",
                    "Data-plane requests received (a batch read counts once)",
                ),
                read_bytes: c(
                    "strata_ssd_agent_read_bytes_total",
                    "Bytes served to SSD readers",
                ),
                written_bytes: c(
                    "strata_ssd_agent_data_plane_written_bytes_total",
                    "Always 0: agents take no writes",
                ),
                rejected: c(
                    "strata_ssd_agent_rejected_requests_total",
                    "Data-plane requests refused",
                ),
                refused_connections: c(
                    "strata_ssd_agent_refused_connections_total",
                    "Data-plane connections refused at accept (total or per-peer limit)",
                ),
                cut_off: c(
                    "strata_ssd_agent_cut_off_connections_total",
                    "Data-plane connections cut off: no grant in time, stalled I/O, too many refused requests",
                ),
            },
            registry: r,
        }
    }
}

pub struct SsdAgentHandle {
    pub data_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub owner_id: u64,
    pub recovery: RecoveryReport,
    pub store: Arc<OwnerStore>,
    /// The read staging arena (tests hold space in it to fill it up).
    pub staging: staging::Staging,
    pub faults: Arc<Faults>,
    /// Eviction counters (benchmarks report them).
    pub eviction: eviction::EvictionMetrics,
    fatal: Arc<parking_lot::Mutex<Option<Error>>>,
    tasks: JoinSet<()>,
}

impl SsdAgentHandle {
    /// Waits for every task; returns the error that stopped the agent, if any.
    pub async fn wait(mut self) -> Result<()> {
        while self.tasks.join_next().await.is_some() {}
        match self.fatal.lock().take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Who this agent currently is to the master: every call of a registration
/// carries its owner id, fencing epoch and the process's instance proof.
pub struct Registration {
    pub owner_id: u64,
    pub epoch: u64,
    pub proof: Vec<u8>,
}

/// Registration state shared by the worker loop.
struct Session {
    client: MasterClient<MasterChannel>,
    handle: String,
    advertise: String,
    capacity: u64,
    instance: String,
    proof: Vec<u8>,
    /// Highest master term seen: answers from a deposed leader are refused.
    fence: strata_common::term::TermFence,
}

impl Session {
    async fn register(&mut self) -> Result<pb::RegisterOwnerResponse> {
        let req = pb::RegisterOwnerRequest {
            handle: self.handle.clone(),
            data_addr: self.advertise.clone(),
            capacity_bytes: self.capacity,
            instance: self.instance.clone(),
            instance_proof: self.proof.clone(),
        };
        let r = self
            .client
            .register_owner(req)
            .await
            .map_err(Error::from)?
            .into_inner();
        self.fence.admit(r.term)?;
        Ok(r)
    }

    /// Registers, retrying while the master is unreachable.
    async fn register_retrying(
        &mut self,
        shutdown: &CancellationToken,
    ) -> Result<pb::RegisterOwnerResponse> {
        let mut backoff = Duration::from_millis(50);
        loop {
            match self.register().await {
                Ok(r) => return Ok(r),
                Err(e) if e.retryable() => {
                    tracing::warn!(error = %e, retry_in = ?backoff, "cannot register with master");
                    tokio::select! {
                        _ = shutdown.cancelled() => return Err(Error::unavailable("shutting down")),
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn report_inventory(&mut self, store: &OwnerStore, who: &Registration) -> Result<u64> {
        let objects = store
            .inventory()
            .into_iter()
            .map(|(b, e)| pb::SsdObject {
                key: e.key,
                bucket_id: b,
                offset: e.offset,
                length: e.length,
                crc32c: e.crc32c,
            })
            .collect();
        let r = self
            .client
            .report_inventory(pb::ReportInventoryRequest {
                owner_id: who.owner_id,
                epoch: who.epoch,
                objects,
                relocation: false,
                instance_proof: who.proof.clone(),
            })
            .await
            .map_err(Error::from)?;
        Ok(r.into_inner().adopted)
    }
}

/// What lends reads one-sided, with `--transport ucx`: a window as large as
/// the arena, in slots of one staging piece, waited for like the arena.
#[cfg(feature = "ucx")]
async fn lender(
    cfg: &SsdAgentConfig,
    staging: &staging::Staging,
    m: &AgentMetrics,
) -> Result<Option<Arc<strata_transport::lend::Lender>>> {
    use strata_transport::lend::{LendConfig, LEND_TTL};
    if cfg.transport != config::TransportKind::Ucx {
        return Ok(None);
    }
    let lend = LendConfig {
        slot_bytes: staging.piece_bytes(),
        wait: cfg.staging_wait,
        ttl: LEND_TTL,
        setting: "--staging-bytes (STRATA_STAGING_BYTES) on this SSD agent",
    };
    let l = strata_transport::lend::start_ucx(cfg.staging_bytes, lend, m.lend.clone())
        .await
        .map_err(|e| {
            Error::new(
                e.code,
                format!("cannot serve --transport ucx: {}", e.message),
            )
        })?;
    tracing::info!(
        window_bytes = l.size(),
        slot_bytes = l.slot_bytes(),
        "SSD reads are lent to rdma readers over UCX"
    );
    Ok(Some(Arc::new(l)))
}

#[cfg(not(feature = "ucx"))]
async fn lender(
    _: &SsdAgentConfig,
    _: &staging::Staging,
    _: &AgentMetrics,
) -> Result<Option<Arc<strata_transport::lend::Lender>>> {
    // `validate` refused --transport ucx in this build.
    Ok(None)
}

pub async fn start(cfg: SsdAgentConfig, shutdown: CancellationToken) -> Result<SsdAgentHandle> {
    cfg.validate()?;
    let instance = strata_common::time::instance_id();
    let owner_dir = cfg
        .data_dir
        .join("owners")
        .join(lock::encode_handle(&cfg.handle));
    let lock = lock::lock_handle(&owner_dir, &cfg.handle, &instance)?;
    let metrics = Arc::new(AgentMetrics::new());
    metrics.capacity.set(cfg.capacity as i64);

    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .map_err(|e| Error::invalid(format!("cannot bind --listen {}: {e}", cfg.listen)))?;
    let data_addr = listener.local_addr()?;
    let advertise = cfg
        .advertise
        .clone()
        .unwrap_or_else(|| data_addr.to_string());
    let staging =
        staging::Staging::new(cfg.staging_bytes, cfg.staging_wait, metrics.staging.clone());
    let lender = lender(&cfg, &staging, &metrics).await?;
    let region = Arc::new(serve::BucketRegion::new(
        staging.clone(),
        lender.clone(),
        instance.clone(),
        metrics.checksum_failures.with_label_values(&["read"]),
    ));
    let mut tasks = JoinSet::new();
    if let Some(lender) = lender {
        // Reclaims slots lent to readers that never gave them back.
        let sd = shutdown.clone();
        tasks.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            loop {
                tokio::select! {
                    _ = sd.cancelled() => break,
                    _ = tick.tick() => { lender.reap(std::time::Instant::now()); }
                }
            }
        });
    }
    tasks.spawn(strata_transport::tcp::serve_with(
        listener,
        region.clone() as Arc<dyn strata_transport::region::DataRegion>,
        metrics.server.clone(),
        strata_transport::tcp::ServerLimits {
            io_timeout: cfg.io_timeout,
            ..Default::default()
        },
        shutdown.clone(),
    ));

    let index_path = owner_dir.join("index");
    let index = tokio::task::spawn_blocking(move || index::Index::open(&index_path))
        .await
        .map_err(|e| Error::internal(e.to_string()))??;

    let mut session = Session {
        client: MasterClient::new(strata_common::grpc::master_channel(
            &cfg.master,
            cfg.token.as_ref(),
        )?)
        .max_decoding_message_size(strata_common::grpc::MAX_MESSAGE)
        .max_encoding_message_size(strata_common::grpc::MAX_MESSAGE),
        handle: cfg.handle.clone(),
        advertise: advertise.clone(),
        capacity: cfg.capacity,
        instance: instance.clone(),
        proof: strata_common::auth::new_instance_proof(),
        fence: Default::default(),
    };
    let reg = session.register_retrying(&shutdown).await?;
    let key = GrantKey::from_bytes(&reg.grant_key)
        .ok_or_else(|| Error::internal("master sent a malformed grant key"))?;
    let faults = Arc::new(Faults::default());
    let store = {
        let (dir, handle, cap, f) = (
            cfg.data_dir.clone(),
            cfg.handle.clone(),
            cfg.capacity,
            faults.clone(),
        );
        let owner_id = reg.owner_id;
        tokio::task::spawn_blocking(move || OwnerStore::new(&dir, index, owner_id, &handle, cap, f))
            .await
            .map_err(|e| Error::internal(e.to_string()))??
    };
    let store = Arc::new(store);
    let s2 = store.clone();
    let recovery = tokio::task::spawn_blocking(move || s2.recover())
        .await
        .map_err(|e| Error::internal(e.to_string()))??;
    tracing::info!(
        handle = cfg.handle,
        owner_id = reg.owner_id,
        epoch = reg.epoch,
        ?recovery,
        "SSD owner recovered"
    );
    let who_id = reg.owner_id;
    let who = Registration {
        owner_id: reg.owner_id,
        epoch: reg.epoch,
        proof: session.proof.clone(),
    };
    let adopted = session.report_inventory(&store, &who).await?;
    tracing::info!(adopted, "inventory reported to the master");
    region.install(key, store.clone());

    let ready = Arc::new(AtomicBool::new(true));
    let router = admin_router(&metrics, &store, ready.clone(), recovery.clone());
    let (admin_addr, admin_task) =
        strata_common::admin::serve(cfg.admin_addr, router, shutdown.clone()).await?;
    tasks.spawn(async move {
        let _ = admin_task.await;
    });

    let transport: Arc<dyn strata_transport::Transport> =
        Arc::new(TcpTransport::new(TcpTransportConfig::default()));
    let promoter = promotion::Promoter {
        store: store.clone(),
        staging: staging.clone(),
        transport: transport.clone(),
        checksum_failures: metrics.checksum_failures.with_label_values(&["promotion"]),
    };
    let worker = offload::Worker {
        store: store.clone(),
        transport,
        bucket_keys: cfg.bucket_keys,
        bucket_bytes: cfg.bucket_bytes,
        outcomes: metrics.outcomes.clone(),
        checksum_failures: metrics
            .checksum_failures
            .with_label_values(&["offload_source"]),
    };
    let evictor = eviction::Evictor {
        store: store.clone(),
        keep_budget: cfg.bucket_bytes.min(cfg.capacity / 8),
        high_watermark: cfg.high_watermark,
        low_watermark: cfg.low_watermark,
        sparse_below: cfg.sparse_below,
        metrics: metrics.eviction.clone(),
    };
    let interval = Duration::from_millis(reg.heartbeat_interval_ms);
    let m2 = metrics.clone();
    let region2 = region.clone();
    let sd = shutdown.clone();
    let max_tasks = cfg.max_tasks;
    let poll = cfg.poll_interval.min(interval);
    let fatal = Arc::new(parking_lot::Mutex::new(None));
    let f2 = fatal.clone();
    tasks.spawn(async move {
        let _lock = lock; // held until the agent stops
        let r = run_loop(
            session, worker, evictor, promoter, region2, m2, who, max_tasks, poll, &sd,
        )
        .await;
        if let Err(e) = r {
            tracing::error!(error = %e, "SSD agent stopping");
            *f2.lock() = Some(e);
            sd.cancel();
        }
        ready.store(false, Ordering::Release);
    });
    tracing::info!(%data_addr, %admin_addr, handle = cfg.handle, owner_id = who_id, "strata-ssd-agent started");
    Ok(SsdAgentHandle {
        data_addr,
        admin_addr,
        owner_id: who_id,
        recovery,
        store,
        staging,
        faults,
        eviction: metrics.eviction.clone(),
        fatal,
        tasks,
    })
}

fn admin_router(
    m: &Arc<AgentMetrics>,
    store: &Arc<OwnerStore>,
    ready: Arc<AtomicBool>,
    recovery: RecoveryReport,
) -> axum::Router {
    let (m2, s2) = (m.clone(), store.clone());
    let refresh = Arc::new(move || {
        let st = s2.stats();
        m2.used.set(st.used as i64);
        m2.overhead.set(st.overhead as i64);
        m2.buckets.set(st.buckets as i64);
        m2.objects.set(st.objects as i64);
        m2.unknown_files.set(st.unknown_files as i64);
        m2.quarantined_files.set(st.quarantined as i64);
    });
    let s3 = store.clone();
    strata_common::admin::base_router(
        m.registry.clone(),
        Arc::new(move || ready.load(Ordering::Acquire)),
        Some(refresh),
    )
    .route(
        "/api/v1/owner",
        axum::routing::get(move || {
            let (s, rec) = (s3.clone(), recovery.clone());
            async move {
                axum::Json(serde_json::json!({
                    "handle": s.handle,
                    "owner_id": s.owner_id,
                    "capacity": s.capacity,
                    "stats": s.stats(),
                    "recovery": rec,
                }))
            }
        }),
    )
}

/// Heartbeats, takes offload batches, writes them, reports. Returns an
/// error only when this process must stop (fenced by a newer registration).
#[allow(clippy::too_many_arguments)]
async fn run_loop(
    mut session: Session,
    worker: offload::Worker,
    evictor: eviction::Evictor,
    promoter: promotion::Promoter,
    region: Arc<serve::BucketRegion>,
    m: Arc<AgentMetrics>,
    mut who: Registration,
    max_tasks: u32,
    poll: Duration,
    shutdown: &CancellationToken,
) -> Result<()> {
    // Drops applied: (the master's term, its sequence number), confirmed
    // with the next heartbeat.
    let mut drops_applied = (0u64, 0u64);
    loop {
        if let Err(e) = evictor.pass(&mut session.client, &who, 0).await {
            tracing::warn!(error = %e, "bucket eviction pass failed");
        }
        let s = worker.store.clone();
        let overhead = tokio::task::spawn_blocking(move || s.refresh_overhead())
            .await
            .unwrap_or_else(|_| worker.store.overhead());
        let st = worker.store.stats();
        m.used.set(st.used as i64);
        m.overhead.set(overhead as i64);
        m.buckets.set(st.buckets as i64);
        let room = st.used < worker.store.bucket_capacity()
            && !worker.store.faults.pause_offload.load(Ordering::Relaxed);
        let req = pb::OwnerHeartbeatRequest {
            owner_id: who.owner_id,
            epoch: who.epoch,
            instance_proof: who.proof.clone(),
            used_bytes: st.used + overhead,
            overhead_bytes: overhead,
            buckets: st.buckets,
            capacity_bytes: worker.store.capacity,
            max_tasks: if room { max_tasks } else { 0 },
            unknown_files: st.unknown_files,
            quarantined_files: st.quarantined,
            accepts_promotions: true,
            // Long poll for one poll interval while there is room: urgent
            // offloads (a put waits for the DRAM they free) arrive at once,
            // the rest at the usual cadence. With no room, answer at once.
            wait_ms: if room { poll.as_millis() as u32 } else { 0 },
            acks_drops: true,
            drops_term: drops_applied.0,
            drops_applied: drops_applied.1,
        };
        // The same report, asking for nothing: confirms drops between the
        // main heartbeats.
        let confirm = pb::OwnerHeartbeatRequest {
            max_tasks: 0,
            accepts_promotions: false,
            wait_ms: 0,
            ..req.clone()
        };
        let t0 = tokio::time::Instant::now();
        let mut wait = poll;
        // A long poll must not hold up shutdown (tasks it would have brought
        // expire on the master and go to the next registration).
        let reply = tokio::select! {
            _ = shutdown.cancelled() => break,
            r = session.client.owner_heartbeat(req) => r.map_err(Error::from).and_then(|r| {
                let r = r.into_inner();
                session.fence.admit(r.term).map(|()| r)
            }),
        };
        match reply {
            Ok(r) => {
                m.heartbeats.inc();
                let (mut drops, mut through, mut term) = (r.drops, r.drops_through, r.term);
                // Apply drops and confirm them at once, before the batch
                // below (which may take seconds): a removal waits for the
                // confirmation. Bounded: new drops keep coming only while
                // keys are being removed.
                for _ in 0..4 {
                    if drops.is_empty() || !evictor.apply_drops(drops).await {
                        break;
                    }
                    drops_applied = (term, through);
                    let ack = pb::OwnerHeartbeatRequest {
                        drops_term: term,
                        drops_applied: through,
                        ..confirm.clone()
                    };
                    match session.client.owner_heartbeat(ack).await {
                        Ok(c) => {
                            let c = c.into_inner();
                            if session.fence.admit(c.term).is_err() {
                                break;
                            }
                            (drops, through, term) = (c.drops, c.drops_through, c.term);
                        }
                        Err(e) => {
                            tracing::warn!(error = %Error::from(e), "could not confirm removals; the next heartbeat will");
                            break;
                        }
                    }
                }
                if !r.promotions.is_empty() {
                    let results = promoter.process(&r.promotions).await;
                    if let Err(e) = session
                        .client
                        .report_promotion(pb::ReportPromotionRequest {
                            owner_id: who.owner_id,
                            epoch: who.epoch,
                            results,
                            instance_proof: who.proof.clone(),
                        })
                        .await
                    {
                        // The master frees the ranges when they expire.
                        tracing::warn!(error = %Error::from(e), "promotion report failed");
                    }
                }
                let tasks = r.tasks;
                if !tasks.is_empty() {
                    // Make room for the batch first (buckets add headers and
                    // tables: count a little per object).
                    let need: u64 = tasks
                        .iter()
                        .map(|t| t.size + 128 + t.key.len() as u64)
                        .sum();
                    if let Err(e) = evictor.pass(&mut session.client, &who, need).await {
                        tracing::warn!(error = %e, "could not make room for offloads");
                    }
                    let results = worker.process(&tasks).await;
                    if worker.drop_report() {
                        tracing::warn!(
                            tasks = results.len(),
                            "injected fault: dropping this offload report"
                        );
                    } else if let Err(e) = session
                        .client
                        .report_offload(pb::ReportOffloadRequest {
                            owner_id: who.owner_id,
                            epoch: who.epoch,
                            results,
                            instance_proof: who.proof.clone(),
                        })
                        .await
                    {
                        // The master expires and requeues the tasks.
                        tracing::warn!(error = %Error::from(e), "offload report failed");
                    }
                    wait = Duration::ZERO;
                }
            }
            Err(e) if e.code == Code::PermissionDenied => {
                return Err(Error::new(
                    Code::PermissionDenied,
                    format!(
                        "fenced: another process registered handle {:?} ({})",
                        session.handle, e.message
                    ),
                ));
            }
            Err(e) if e.code == Code::NotFound => {
                // The master restarted and forgot us: register again and
                // re-report what we hold.
                tracing::warn!("master no longer knows this owner; registering again");
                let reg = session.register_retrying(shutdown).await?;
                if reg.owner_id != who.owner_id {
                    return Err(Error::new(
                        Code::Corrupted,
                        format!(
                            "master now maps handle {:?} to owner {} (was {}): it lost its --state-dir",
                            session.handle, reg.owner_id, who.owner_id
                        ),
                    ));
                }
                who.epoch = reg.epoch;
                // The master may hand out a new key (e.g. it lost its state):
                // verify grants with the one it signs with now.
                match GrantKey::from_bytes(&reg.grant_key) {
                    Some(k) => region.install(k, worker.store.clone()),
                    None => tracing::warn!("master sent a malformed grant key"),
                }
                if let Err(e) = session.report_inventory(&worker.store, &who).await {
                    tracing::warn!(error = %e, "inventory report failed");
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "owner heartbeat failed");
                wait = poll.max(Duration::from_millis(200));
            }
        }
        // At most one heartbeat per `poll` (a master that answers at once,
        // e.g. an older one, is not polled in a tight loop).
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep_until(t0 + wait) => {}
        }
    }
    let store = worker.store.clone();
    let _ = tokio::task::spawn_blocking(move || store.flush()).await;
    Ok(())
}

pub async fn run(cfg: SsdAgentConfig, shutdown: CancellationToken) -> Result<()> {
    let h = start(cfg, shutdown.clone()).await?;
    h.wait().await?;
    tracing::info!("strata-ssd-agent stopped");
    Ok(())
}
