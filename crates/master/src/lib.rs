//! `strata-master`: metadata only, never object bytes. Keys → replicas,
//! segment allocation, leases, eviction and store-node liveness.

pub mod admin;
pub mod allocator;
pub mod backpressure;
pub mod cluster;
pub mod config;
pub mod durable;
pub mod election;
pub mod eviction;
pub mod master;
pub mod metrics;
pub mod objects;
pub mod offload;
pub mod rebuild;
pub mod service;
pub mod tombstones;

pub use config::{MasterArgs, MasterConfig};
pub use master::Master;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_common::{Error, Result};
use strata_proto::master_server::MasterServer;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// A running master: its bound addresses and its tasks.
pub struct MasterHandle {
    pub grpc_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub master: Arc<Master>,
    tasks: JoinSet<()>,
}

impl MasterHandle {
    /// Waits until every task has stopped (after the shutdown token fired).
    pub async fn wait(mut self) {
        while self.tasks.join_next().await.is_some() {}
    }
}

/// Binds the gRPC and admin listeners and starts the master's tasks.
pub async fn start(cfg: MasterConfig, shutdown: CancellationToken) -> Result<MasterHandle> {
    cfg.validate()?.log();
    if let Some(dir) = &cfg.state_dir {
        std::fs::create_dir_all(dir).map_err(|e| {
            Error::invalid(format!("cannot create --state-dir {}: {e}", dir.display()))
        })?;
    }
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .map_err(|e| Error::invalid(format!("cannot bind --listen {}: {e}", cfg.listen)))?;
    let grpc_addr = listener.local_addr()?;
    let advertise = cfg
        .advertise
        .clone()
        .unwrap_or_else(|| grpc_addr.to_string());
    let master = Master::new(cfg.clone())?;
    let mut tasks = JoinSet::new();

    let (refresh, ready) = (master.clone(), master.clone());
    let router = strata_common::admin::base_router(
        master.metrics.registry.clone(),
        // Not while a restarted master waits for its nodes' reports.
        Arc::new(move || ready.accepting_writes()),
        Some(Arc::new(move || refresh.refresh_gauges())),
    )
    .merge(admin::api_router(master.clone(), advertise.clone()));
    let (admin_addr, admin_task) =
        strata_common::admin::serve(cfg.admin_addr, router, shutdown.clone()).await?;
    tasks.spawn(async move {
        let _ = admin_task.await;
    });

    let svc = strata_common::grpc::Authenticated::new(
        MasterServer::new(service::MasterService {
            master: master.clone(),
        })
        .max_decoding_message_size(service::MAX_REQUEST)
        .max_encoding_message_size(strata_common::grpc::MAX_MESSAGE),
        Arc::new(cfg.credentials.clone()),
        service::policy_of,
    );
    let sd = shutdown.clone();
    tasks.spawn(async move {
        let incoming =
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        let res = tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming_shutdown(incoming, sd.cancelled())
            .await;
        if let Err(e) = res {
            tracing::error!(error = %e, "gRPC server failed");
            sd.cancel();
        }
    });

    tasks.spawn(housekeeping(master.clone(), shutdown.clone()));
    {
        // Puts waiting for DRAM answer at once (retryable) instead of
        // holding the server's drain for up to --put-wait.
        let (m, sd) = (master.clone(), shutdown.clone());
        tasks.spawn(async move {
            sd.cancelled().await;
            m.stop_waiting();
        });
    }
    tasks.spawn(evictor(master.clone(), shutdown.clone()));
    tracing::info!(%grpc_addr, %admin_addr, %advertise, "strata-master started (single-master mode)");
    Ok(MasterHandle {
        grpc_addr,
        admin_addr,
        master,
        tasks,
    })
}

/// Runs until `shutdown` fires.
pub async fn run(cfg: MasterConfig, shutdown: CancellationToken) -> Result<()> {
    let h = start(cfg, shutdown).await?;
    h.wait().await;
    tracing::info!("strata-master stopped");
    Ok(())
}

/// Expires silent nodes and reclaims puts that were never ended.
async fn housekeeping(m: Arc<Master>, shutdown: CancellationToken) {
    let c = m.config();
    let tick = (c.node_ttl.min(c.put_timeout) / 4)
        .clamp(Duration::from_millis(10), Duration::from_secs(1));
    let mut iv = tokio::time::interval(tick);
    iv.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = iv.tick() => {}
        }
        let m2 = m.clone();
        let _ = tokio::task::spawn_blocking(move || {
            m2.expire_nodes(strata_common::time::unix_ms());
            m2.reclaim_expired_puts(Instant::now());
            m2.expire_offload_tasks(strata_common::time::unix_ms());
            m2.reassign_orphaned_tasks(strata_common::time::unix_ms());
            m2.expire_promotions(strata_common::time::unix_ms());
        })
        .await;
    }
}

/// Background eviction above the high watermark.
async fn evictor(m: Arc<Master>, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = m.evict_wakeup.notified() => {}
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        let m2 = m.clone();
        let _ = tokio::task::spawn_blocking(move || m2.evict_to_watermark()).await;
    }
}

#[cfg(test)]
mod tests;
