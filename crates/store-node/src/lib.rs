//! `strata-store-node`: contributes DRAM segments to the cluster and serves
//! the data plane. It registers its segments with the master, heartbeats, and
//! keeps its own record of the committed objects it holds.

pub mod config;
pub mod receipts;
pub mod records;

pub use config::{StoreNodeArgs, StoreNodeConfig};

use axum::routing::get;
use axum::Json;
use prometheus::{IntCounter, IntGauge, Registry};
use records::ObjectRecords;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use strata_common::grant::GrantKey;
use strata_common::grpc::MasterChannel;
use strata_common::quick_client::QuickClient;
use strata_common::quick_wire::Op;
use strata_common::{Error, Result};
use strata_proto as pb;
use strata_proto::master_client::MasterClient;
use strata_transport::region::{Segment, SegmentTable};
use strata_transport::tcp::ServerMetrics;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

pub struct StoreNodeHandle {
    pub data_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub node_id: String,
    pub records: Arc<ObjectRecords>,
    registered: Arc<AtomicBool>,
    tasks: JoinSet<()>,
}

impl StoreNodeHandle {
    pub fn is_registered(&self) -> bool {
        self.registered.load(Ordering::Acquire)
    }
    /// A flag that stays true while the node holds a registration (it has
    /// installed the master's grant key), for harnesses that outlive `wait`.
    pub fn registered_flag(&self) -> Arc<AtomicBool> {
        self.registered.clone()
    }
    pub async fn wait(mut self) {
        while self.tasks.join_next().await.is_some() {}
    }
}

struct NodeMetrics {
    registry: Registry,
    capacity: IntGauge,
    ucx_exposed: IntGauge,
    objects: IntGauge,
    object_bytes: IntGauge,
    pending_puts: IntGauge,
    recorded_puts: IntCounter,
    refused_records: IntCounter,
    registrations: IntCounter,
    heartbeats_quick: IntCounter,
    heartbeats_grpc: IntCounter,
    server: ServerMetrics,
}

impl NodeMetrics {
    fn new() -> Self {
        let r = Registry::new();
        let g = |n: &str, h: &str| strata_common::metrics::gauge(&r, n, h);
        let c = |n: &str, h: &str| strata_common::metrics::counter(&r, n, h);
        let heartbeats = strata_common::metrics::register(
            &r,
            prometheus::IntCounterVec::new(
                prometheus::Opts::new(
                    "strata_store_node_heartbeats_total",
                    "Heartbeats the master answered, by path: quick (a plain connection) or grpc (the fallback: an older master, no leader known yet, a broken quick connection)",
                ),
                &["path"],
            )
            .expect("valid metric"),
        );
        NodeMetrics {
            capacity: g(
                "strata_store_node_capacity_bytes",
                "DRAM this node contributes",
            ),
            ucx_exposed: g(
                "strata_store_node_ucx_exposed_bytes",
                "DRAM registered with UCX for one-sided access by rdma clients (0: TCP only; one-sided traffic bypasses the data-plane byte counters)",
            ),
            objects: g(
                "strata_store_node_objects",
                "Committed objects this node holds",
            ),
            object_bytes: g(
                "strata_store_node_object_bytes",
                "Bytes of committed objects held",
            ),
            pending_puts: g(
                "strata_store_node_pending_puts",
                "Puts announced to this node or recorded from their writes, not yet committed or freed (reported to a rebuilding master if their bytes match their checksum)",
            ),
            recorded_puts: c(
                "strata_store_node_recorded_puts_total",
                "Puts recorded from their clients' writes and answered with a receipt (the master acknowledges them without this node's heartbeat)",
            ),
            refused_records: c(
                "strata_store_node_refused_records_total",
                "Writes whose put record was refused: not signed by the master, not the whole grant, or its range freed before it was kept",
            ),
            registrations: c(
                "strata_store_node_registrations_total",
                "Registrations with the master",
            ),
            heartbeats_quick: heartbeats.with_label_values(&["quick"]),
            heartbeats_grpc: heartbeats.with_label_values(&["grpc"]),
            server: ServerMetrics {
                requests: c(
                    "strata_store_node_data_plane_requests_total",
                    "Data-plane requests received (a batch read counts once)",
                ),
                read_bytes: c(
                    "strata_store_node_read_bytes_total",
                    "Bytes served to readers",
                ),
                written_bytes: c(
                    "strata_store_node_written_bytes_total",
                    "Bytes written by clients",
                ),
                rejected: c(
                    "strata_store_node_rejected_requests_total",
                    "Data-plane requests refused (bad frame, grant or range)",
                ),
                refused_connections: c(
                    "strata_store_node_refused_connections_total",
                    "Data-plane connections refused at accept (total or per-peer limit)",
                ),
                cut_off: c(
                    "strata_store_node_cut_off_connections_total",
                    "Data-plane connections cut off: no grant in time, stalled I/O, too many refused requests",
                ),
            },
            registry: r,
        }
    }
}

pub async fn start(cfg: StoreNodeConfig, shutdown: CancellationToken) -> Result<StoreNodeHandle> {
    cfg.validate()?;
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .map_err(|e| Error::invalid(format!("cannot bind --listen {}: {e}", cfg.listen)))?;
    let data_addr = listener.local_addr()?;
    let advertise = cfg
        .advertise
        .clone()
        .unwrap_or_else(|| data_addr.to_string());
    let node_id = cfg.node_id.clone().unwrap_or_else(|| advertise.clone());

    let sizes = cfg.segment_sizes();
    let segments: Vec<Arc<Segment>> = sizes
        .iter()
        .map(|&s| {
            // With UCX, co-located clients may map the segments and read
            // them without a system call (`cross_memory.rs`).
            if cfg.transport == config::TransportKind::Ucx {
                Segment::new_shared(s as usize, cfg.huge_pages).map(Arc::new)
            } else if cfg.huge_pages {
                Segment::new_huge(s as usize).map(Arc::new)
            } else {
                Segment::new(s as usize).map(Arc::new)
            }
        })
        .collect::<Result<_>>()?;
    if cfg.prefault {
        let segs = segments.clone();
        let t0 = std::time::Instant::now();
        tokio::task::spawn_blocking(move || segs.iter().for_each(|s| s.prefault()))
            .await
            .map_err(|e| Error::internal(format!("prefaulting segments failed: {e}")))?;
        tracing::info!(bytes = cfg.capacity, took = ?t0.elapsed(), "segment memory is resident");
    }
    let instance = strata_common::time::instance_id();
    let table = Arc::new(SegmentTable::new());
    table.set_ping_payload(instance.clone().into_bytes());
    let records = Arc::new(ObjectRecords::default());
    let registered = Arc::new(AtomicBool::new(false));
    let metrics = Arc::new(NodeMetrics::new());
    metrics.capacity.set(cfg.capacity as i64);

    let ucx = expose_over_ucx(&cfg, &segments).await?;
    if ucx.is_some() {
        metrics.ucx_exposed.set(cfg.capacity as i64);
    }

    let mut tasks = JoinSet::new();
    tasks.spawn(strata_transport::tcp::serve_with(
        listener,
        Arc::new(receipts::NodeRegion {
            table: table.clone(),
            records: records.clone(),
            recorded: metrics.recorded_puts.clone(),
            refused: metrics.refused_records.clone(),
            pending: metrics.pending_puts.clone(),
        }) as Arc<dyn strata_transport::region::DataRegion>,
        metrics.server.clone(),
        strata_transport::tcp::ServerLimits {
            io_timeout: cfg.io_timeout,
            ..Default::default()
        },
        shutdown.clone(),
    ));

    let ready = registered.clone();
    let (rec, m2) = (records.clone(), metrics.clone());
    let router = strata_common::admin::base_router(
        metrics.registry.clone(),
        Arc::new(move || ready.load(Ordering::Acquire)),
        None,
    )
    .route(
        "/api/v1/objects",
        get(move || {
            let (rec, m2) = (rec.clone(), m2.clone());
            async move {
                m2.objects.set(rec.len() as i64);
                let view = |c: &pb::CommittedObject| {
                    serde_json::json!({
                        "key": c.key, "segment_id": c.segment_id, "offset": c.offset,
                        "length": c.length, "crc32c": c.crc32c,
                    })
                };
                Json(serde_json::json!({
                    "applied_seq": rec.applied_seq(),
                    "objects": rec.snapshot().iter().map(view).collect::<Vec<_>>(),
                    "pending": rec.pending().iter().map(view).collect::<Vec<_>>(),
                }))
            }
        }),
    );
    let (admin_addr, admin_task) =
        strata_common::admin::serve(cfg.admin_addr, router, shutdown.clone()).await?;
    tasks.spawn(async move {
        let _ = admin_task.await;
    });

    let (channel, route) =
        strata_common::grpc::master_channel_routed(&cfg.master, cfg.token.as_ref())?;
    let quick = cfg
        .quick_heartbeats
        .then(|| QuickClient::new(route, cfg.token.as_ref()))
        .transpose()?;
    let agent = Agent {
        client: MasterClient::new(channel)
            .max_decoding_message_size(strata_common::grpc::MAX_MESSAGE),
        quick,
        quick_off_until: None,
        node_id: node_id.clone(),
        instance,
        proof: strata_common::auth::new_instance_proof(),
        advertise: advertise.clone(),
        sizes,
        segments,
        table,
        records: records.clone(),
        registered: registered.clone(),
        metrics,
        segment_ids: Vec::new(),
        fence: Default::default(),
        ucx,
        leave_on_shutdown: cfg.leave_on_shutdown,
    };
    tasks.spawn(agent.run(shutdown.clone()));
    tracing::info!(%data_addr, %admin_addr, node_id, master = cfg.master, capacity = cfg.capacity, transport = ?cfg.transport, "strata-store-node started");
    Ok(StoreNodeHandle {
        data_addr,
        admin_addr,
        node_id,
        records,
        registered,
        tasks,
    })
}

pub async fn run(cfg: StoreNodeConfig, shutdown: CancellationToken) -> Result<()> {
    start(cfg, shutdown).await?.wait().await;
    tracing::info!("strata-store-node stopped");
    Ok(())
}

/// The segments exposed over UCX (`--transport ucx`): TCP keeps serving
/// every client; rdma clients may also read and write one-sided.
#[cfg(feature = "ucx")]
type Ucx = strata_transport::ucx::UcxNode;
#[cfg(not(feature = "ucx"))]
type Ucx = std::convert::Infallible;

#[cfg(feature = "ucx")]
async fn expose_over_ucx(cfg: &StoreNodeConfig, segments: &[Arc<Segment>]) -> Result<Option<Ucx>> {
    if cfg.transport != config::TransportKind::Ucx {
        return Ok(None);
    }
    let node = strata_transport::ucx::UcxNode::start(None, segments)
        .await
        .map_err(|e| {
            Error::new(
                e.code,
                format!("cannot serve --transport ucx: {}", e.message),
            )
        })?;
    tracing::info!(
        worker_address_bytes = node.worker_address().len(),
        segments = segments.len(),
        "segments registered with UCX"
    );
    Ok(Some(node))
}

#[cfg(not(feature = "ucx"))]
async fn expose_over_ucx(_: &StoreNodeConfig, _: &[Arc<Segment>]) -> Result<Option<Ucx>> {
    // `validate` refused --transport ucx in this build.
    Ok(None)
}

/// The UCX halves of a registration: the worker address, each segment's
/// (remote key, base address), and this process for co-located clients'
/// cross-memory attach.
#[cfg(feature = "ucx")]
fn ucx_registration(ucx: Option<&Ucx>, stamp: u64) -> UcxRegistration {
    match ucx {
        Some(n) => (
            n.worker_address().to_vec(),
            n.routes()
                .iter()
                .zip(n.fence_routes())
                .map(|(r, f)| pb::SegmentSpec {
                    ucx_rkey: r.rkey.clone(),
                    ucx_base: r.base,
                    ucx_fence_rkey: f.rkey.clone(),
                    ucx_fence_base: f.base,
                    ucx_fence_granule: strata_transport::published::GRANULE,
                    ucx_fence_stamp: stamp,
                    ..Default::default()
                })
                .collect(),
            strata_transport::ucx::cross_memory::this_process().cloned(),
        ),
        None => (Vec::new(), Vec::new(), None),
    }
}

type UcxRegistration = (Vec<u8>, Vec<pb::SegmentSpec>, Option<pb::HostProcess>);

#[cfg(not(feature = "ucx"))]
fn ucx_registration(_: Option<&Ucx>, _: u64) -> UcxRegistration {
    (Vec::new(), Vec::new(), None)
}

/// How long a master that refused a quick heartbeat is heartbeated over
/// gRPC before it is asked again (it may have been upgraded).
const QUICK_RECHECK: Duration = Duration::from_secs(60);

/// Keeps the node registered with the master and applies its object log.
struct Agent {
    client: MasterClient<MasterChannel>,
    /// Heartbeats on a plain connection to the leader (`quick_wire`):
    /// a put waits for its node to apply an entry the heartbeat's long poll
    /// brings, and a gRPC round trip each way cost it ~0.1 ms.
    quick: Option<QuickClient>,
    /// Quick heartbeats were refused (an older master): gRPC until then.
    quick_off_until: Option<tokio::time::Instant>,
    node_id: String,
    /// Public id of this process (ping answer) and the secret it proves
    /// its registration with.
    instance: String,
    proof: Vec<u8>,
    advertise: String,
    sizes: Vec<u64>,
    segments: Vec<Arc<Segment>>,
    table: Arc<SegmentTable>,
    records: Arc<ObjectRecords>,
    registered: Arc<AtomicBool>,
    metrics: Arc<NodeMetrics>,
    /// The master's ids of our segments, by local index (last registration).
    segment_ids: Vec<u64>,
    /// Highest master term seen: answers from a deposed leader are refused.
    fence: strata_common::term::TermFence,
    /// Segments exposed over UCX; dropped (unregistered) when the agent stops.
    ucx: Option<Ucx>,
    /// Tell the master at shutdown (`StoreNodeConfig::leave_on_shutdown`).
    leave_on_shutdown: bool,
}

/// Objects per ReportNodeObjects call.
const REPORT_BATCH: usize = 4096;

impl Agent {
    /// The objects we hold, by local segment index (a new master gives our
    /// segments new ids): committed ones, and announced puts whose bytes
    /// match their checksum (their PutEnd may have been acknowledged).
    async fn held_objects(&self) -> Vec<pb::NodeObject> {
        let local: Arc<HashMap<u64, usize>> = Arc::new(
            self.segment_ids
                .iter()
                .enumerate()
                .map(|(i, &id)| (id, i))
                .collect(),
        );
        let node_object = |c: pb::CommittedObject| {
            Some(pb::NodeObject {
                local_segment: *local.get(&c.segment_id)? as u64,
                key: c.key,
                offset: c.offset,
                length: c.length,
                crc32c: c.crc32c,
                generation: c.generation,
            })
        };
        let mut held: Vec<pb::NodeObject> = self
            .records
            .snapshot()
            .into_iter()
            .filter_map(node_object)
            .collect();
        let pending = self.records.pending();
        if !pending.is_empty() {
            let (segments, ids) = (self.segments.clone(), local.clone());
            let complete = tokio::task::spawn_blocking(move || {
                ObjectRecords::complete_puts(pending, |p| {
                    let seg = segments.get(*ids.get(&p.segment_id)?)?;
                    seg.slice(p.offset, p.length).ok()
                })
            })
            .await
            .unwrap_or_default();
            held.extend(complete.into_iter().filter_map(node_object));
        }
        held
    }

    /// Reports what we hold to a master rebuilding its metadata; what it
    /// adopts comes back through the object log. A failed report loses those
    /// objects (their memory is free space to the master), never bytes.
    async fn report_objects(&mut self, incarnation: u64, held: Vec<pb::NodeObject>) {
        let (mut adopted, mut refused) = (0, 0);
        let batches = held.len().div_ceil(REPORT_BATCH);
        for (i, chunk) in held.chunks(REPORT_BATCH).enumerate() {
            let req = pb::ReportNodeObjectsRequest {
                node_id: self.node_id.clone(),
                incarnation,
                instance_proof: self.proof.clone(),
                objects: chunk.to_vec(),
                // The master takes writes once every node it remembers
                // sent its last batch.
                last: i + 1 == batches,
            };
            match self.client.report_node_objects(req).await {
                Ok(r) => {
                    let r = r.into_inner();
                    adopted += r.adopted;
                    refused += r.refused;
                }
                Err(e) => {
                    tracing::warn!(error = %Error::from(e), objects = chunk.len(), "object report failed; those objects are forgotten");
                    refused += chunk.len() as u64;
                }
            }
        }
        tracing::info!(
            node = self.node_id,
            adopted,
            refused,
            "reported the objects this node holds to a restarted master"
        );
    }
    async fn register(&mut self) -> Result<(u64, Duration)> {
        let held = self.held_objects().await;
        // Names this registration to one-sided readers: routes of an
        // earlier one (another master's grants) stop reading.
        let stamp = strata_transport::published::new_stamp();
        let (ucx_worker, ucx_segments, ucx_process) = ucx_registration(self.ucx.as_ref(), stamp);
        let req = pb::RegisterNodeRequest {
            ucx_worker,
            ucx_process,
            node_id: self.node_id.clone(),
            data_addr: self.advertise.clone(),
            instance: self.instance.clone(),
            instance_proof: self.proof.clone(),
            held_objects: held.len() as u64,
            records_pending: true,
            records_receipts: true,
            segments: self
                .sizes
                .iter()
                .enumerate()
                .map(|(i, &size)| pb::SegmentSpec {
                    local_id: i as u64,
                    size,
                    ..ucx_segments.get(i).cloned().unwrap_or_default()
                })
                .collect(),
        };
        let resp = self
            .client
            .register_node(req)
            .await
            .map_err(Error::from)?
            .into_inner();
        self.fence.admit(resp.term)?;
        let key = GrantKey::from_bytes(&resp.grant_key)
            .ok_or_else(|| Error::internal("master sent a malformed grant key"))?;
        if resp.segment_ids.len() != self.segments.len() {
            return Err(Error::internal(
                "master returned a wrong number of segment ids",
            ));
        }
        let map: HashMap<u64, Arc<Segment>> = resp
            .segment_ids
            .iter()
            .copied()
            .zip(self.segments.iter().cloned())
            .collect();
        self.records.reset();
        self.table.install(key, map, stamp);
        self.segment_ids = resp.segment_ids.clone();
        if resp.report_objects && !held.is_empty() {
            self.report_objects(resp.incarnation, held).await;
        }
        self.registered.store(true, Ordering::Release);
        self.metrics.registrations.inc();
        tracing::info!(node = self.node_id, segments = ?resp.segment_ids, "registered with master");
        Ok((
            resp.incarnation,
            Duration::from_millis(resp.heartbeat_interval_ms.max(10)),
        ))
    }

    /// One heartbeat: quickly where the master allows, else over gRPC. A
    /// heartbeat may be sent twice (it acknowledges what was applied and
    /// asks for what follows), so a quick one lost on the way goes over
    /// gRPC at once. A master that does not serve quick heartbeats (an
    /// older one answers the op `InvalidArgument`) is asked over gRPC for
    /// a while.
    async fn heartbeat(&mut self, req: pb::HeartbeatRequest) -> Result<pb::HeartbeatResponse> {
        let now = tokio::time::Instant::now();
        if let (Some(q), true) = (&self.quick, self.quick_off_until.is_none_or(|t| t <= now)) {
            match q.call(Op::Heartbeat, &req).await {
                Some(Ok(r)) => {
                    self.metrics.heartbeats_quick.inc();
                    return Ok(r);
                }
                // An older master's refusal of the op itself (its words), not
                // an invalid heartbeat, which gRPC would refuse the same way.
                Some(Err(e))
                    if e.code == strata_common::Code::InvalidArgument
                        && e.message.contains("is not served here") =>
                {
                    tracing::info!(error = %e, "the master does not take quick heartbeats; heartbeating over gRPC");
                    self.quick_off_until = Some(now + QUICK_RECHECK);
                }
                Some(Err(e)) if e.code == strata_common::Code::Unavailable => {
                    tracing::debug!(error = %e, "quick heartbeat lost; sending it over gRPC");
                }
                Some(Err(e)) => return Err(e),
                None => {}
            }
        }
        let r = self
            .client
            .heartbeat(req)
            .await
            .map(tonic::Response::into_inner)
            .map_err(Error::from)?;
        self.metrics.heartbeats_grpc.inc();
        Ok(r)
    }

    async fn run(mut self, shutdown: CancellationToken) {
        let mut backoff = Duration::from_millis(50);
        // The registration held when shutdown came, for a graceful leave.
        let mut held: Option<u64>;
        'outer: loop {
            held = None;
            let (incarnation, interval) = loop {
                match self.register().await {
                    Ok(v) => break v,
                    Err(e) => {
                        tracing::warn!(error = %e, retry_in = ?backoff, "cannot register with master");
                        tokio::select! {
                            _ = shutdown.cancelled() => break 'outer,
                            _ = tokio::time::sleep(backoff) => {}
                        }
                        backoff = (backoff * 2).min(Duration::from_secs(2));
                    }
                }
            };
            backoff = Duration::from_millis(50);
            held = Some(incarnation);
            loop {
                let req = pb::HeartbeatRequest {
                    node_id: self.node_id.clone(),
                    incarnation,
                    applied_seq: self.records.applied_seq(),
                    instance_proof: self.proof.clone(),
                    // Long poll: commits reach us (and PutEnds waiting for
                    // them go on) at once, not one interval later.
                    wait_ms: interval.as_millis() as u64,
                    leaving: false,
                };
                let t0 = tokio::time::Instant::now();
                let mut wait = interval;
                let call = tokio::select! {
                    // The master may hold the call for an interval.
                    _ = shutdown.cancelled() => break 'outer,
                    r = self.heartbeat(req) => r,
                };
                let answer = call.and_then(|r| self.fence.admit(r.term).map(|()| r));
                match answer {
                    Ok(r) => {
                        if !r.known {
                            // The master forgot us (TTL, restart): whatever it
                            // knew of our contents is gone, so start clean.
                            tracing::warn!(
                                node = self.node_id,
                                "master no longer knows this node; registering again"
                            );
                            self.registered.store(false, Ordering::Release);
                            self.table.clear();
                            continue 'outer;
                        }
                        let full = r.log.len() >= 32_768;
                        // A free ends its fence under the records' lock: a
                        // write's record is kept only while its allocation's
                        // fence stands (`receipts.rs`).
                        self.records.apply_freeing(&r.log, |f| {
                            self.table
                                .freed(f.segment_id, f.offset, f.length, f.generation)
                        });
                        self.metrics.objects.set(self.records.len() as i64);
                        self.metrics.object_bytes.set(self.records.bytes() as i64);
                        self.metrics
                            .pending_puts
                            .set(self.records.pending_len() as i64);
                        // Entries delivered: acknowledge them at once. Else
                        // the master held the call; keep the cadence.
                        if full || !r.log.is_empty() {
                            wait = Duration::ZERO;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "heartbeat failed");
                        // Not the leader (the channel follows the one it
                        // named) or unreachable (the next one is tried):
                        // try again soon, so a new leader hears from us
                        // and stops waiting for our report.
                        if e.code == strata_common::Code::NotLeader || e.retryable() {
                            wait = wait.min(Duration::from_millis(50));
                        }
                    }
                }
                if !wait.is_zero() {
                    tokio::select! {
                        _ = shutdown.cancelled() => break 'outer,
                        _ = tokio::time::sleep_until(t0 + wait) => {}
                    }
                }
            }
        }
        self.registered.store(false, Ordering::Release);
        if let (true, Some(incarnation)) = (self.leave_on_shutdown, held) {
            self.leave(incarnation).await;
        }
    }

    /// Tells the master this node is gone (bounded: a master that does not
    /// answer drops it after --node-ttl instead).
    async fn leave(&mut self, incarnation: u64) {
        let req = pb::HeartbeatRequest {
            node_id: self.node_id.clone(),
            incarnation,
            applied_seq: self.records.applied_seq(),
            instance_proof: self.proof.clone(),
            wait_ms: 0,
            leaving: true,
        };
        match tokio::time::timeout(LEAVE_WAIT, self.heartbeat(req)).await {
            Ok(Ok(_)) => tracing::info!(node = self.node_id, "left the cluster"),
            Ok(Err(e)) => {
                tracing::warn!(node = self.node_id, error = %e, "could not leave the cluster; the master drops this node after --node-ttl")
            }
            Err(_) => tracing::warn!(
                node = self.node_id,
                "the master did not answer the leave; it drops this node after --node-ttl"
            ),
        }
    }
}

/// How long a leaving node waits for the master's answer.
const LEAVE_WAIT: Duration = Duration::from_secs(2);
