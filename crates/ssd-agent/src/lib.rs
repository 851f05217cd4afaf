//! `strata-ssd-agent`: the SSD tier of one owner. It holds the owner's
//! identity (a stable `--handle`, mapped by the master to an `owner_id` with a
//! fencing epoch), writes offloaded objects into bucket files in a directory
//! other owners may share, indexes them in RocksDB, recovers exactly its own
//! buckets after a restart, and serves SSD reads on the data plane.

mod admin;
pub mod bucket;
pub mod config;
pub mod eviction;
mod heartbeat;
pub mod index;
mod lending;
pub mod lock;
mod metrics;
pub mod offload;
pub mod promotion;
pub mod serve;
mod session;
pub mod staging;
pub mod store;

pub use config::{SsdAgentArgs, SsdAgentConfig};
pub use session::Registration;

use admin::admin_router;
use heartbeat::Member;
use lending::lender;
use metrics::AgentMetrics;
use session::Session;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use store::{Faults, OwnerStore, RecoveryReport};
use strata_common::grant::GrantKey;
use strata_common::{Error, Result};
use strata_proto::master_client::MasterClient;
use strata_transport::tcp::{TcpTransport, TcpTransportConfig};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

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
        fence: strata_common::term::TermFence::counted(metrics.fenced_answers.clone()),
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
    let interval = Duration::from_millis(reg.heartbeat_interval_ms.max(10));
    let m2 = metrics.clone();
    let region2 = region.clone();
    let sd = shutdown.clone();
    let max_tasks = cfg.max_tasks;
    let poll = cfg.poll_interval.min(interval);
    let fatal = Arc::new(parking_lot::Mutex::new(None));
    let f2 = fatal.clone();
    tasks.spawn(async move {
        let _lock = lock; // held until the agent stops
        let member = Member {
            session,
            worker,
            evictor,
            promoter,
            region: region2,
            metrics: m2,
            who,
            max_tasks,
            poll,
            deadline: strata_common::leader::heartbeat_deadline(interval),
            drops_applied: (0, 0),
        };
        let r = member.run(&sd).await;
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

pub async fn run(cfg: SsdAgentConfig, shutdown: CancellationToken) -> Result<()> {
    let h = start(cfg, shutdown.clone()).await?;
    h.wait().await?;
    tracing::info!("strata-ssd-agent stopped");
    Ok(())
}
