//! `strata-store-node`: contributes DRAM segments to the cluster and serves
//! the data plane. It registers its segments with the master, heartbeats, and
//! keeps its own record of the committed objects it holds.

mod admin;
mod agent;
pub mod config;
mod metrics;
pub mod receipts;
pub mod records;
mod ucx;

pub use config::{StoreNodeArgs, StoreNodeConfig};

use agent::Agent;
use metrics::NodeMetrics;
use ucx::expose_over_ucx;

use axum::routing::get;
use records::ObjectRecords;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use strata_common::quick_client::QuickClient;
use strata_common::{Error, Result};
use strata_proto::master_client::MasterClient;
use strata_transport::region::{Segment, SegmentTable};
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

    let fence = Arc::new(strata_common::term::TermFence::counted(
        metrics.fenced_answers.clone(),
    ));
    let mut tasks = JoinSet::new();
    tasks.spawn(strata_transport::tcp::serve_with(
        listener,
        Arc::new(receipts::NodeRegion {
            table: table.clone(),
            records: records.clone(),
            recorded: metrics.recorded_puts.clone(),
            refused: metrics.refused_records.clone(),
            pending: metrics.pending_puts.clone(),
            fence: fence.clone(),
        }) as Arc<dyn strata_transport::region::DataRegion>,
        metrics.server.clone(),
        strata_transport::tcp::ServerLimits {
            io_timeout: cfg.io_timeout,
            ..Default::default()
        },
        shutdown.clone(),
    ));

    let ready = registered.clone();
    let view = Arc::new(admin::ObjectsView::new(
        records.clone(),
        metrics.clone(),
        cfg.token.clone(),
    ));
    let router = strata_common::admin::base_router(
        metrics.registry.clone(),
        Arc::new(move || ready.load(Ordering::Acquire)),
        None,
    )
    .route(
        "/api/v1/objects",
        get(move |headers: axum::http::HeaderMap, q| {
            let view = view.clone();
            async move { view.answer(&headers, q) }
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
        .then(|| QuickClient::new(route.clone(), cfg.token.as_ref()))
        .transpose()?;
    let agent = Agent {
        client: MasterClient::new(channel)
            .max_decoding_message_size(strata_common::grpc::MAX_MESSAGE),
        quick,
        route,
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
        fence,
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
