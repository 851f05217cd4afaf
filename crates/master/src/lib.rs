//! `strata-master`: metadata only, never object bytes. Keys → replicas,
//! segment allocation, leases, eviction and store-node liveness.

pub mod admin;
pub mod cluster;
pub mod config;
mod connections;
pub mod durable;
pub mod election;
pub mod grants;
mod lock_order;
pub mod master;
pub mod metrics;
mod model;
pub mod objects;
pub mod offload;
pub mod pressure;
mod quick_calls;
mod reads;
pub mod rebuild;
pub mod service;
pub mod serving;
pub mod sync;
pub mod tombstones;
mod writes;

pub use config::{MasterArgs, MasterConfig};
pub use master::Master;

use crate::durable::{DurableKv, EtcdKv};
use crate::election::{Election, EtcdElection, Leadership, MemElection};
use crate::metrics::MasterMetrics;
use crate::rebuild::members::Member;
use crate::serving::Serving;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_common::{Error, Result};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Calls one gRPC connection may have in flight at once.
const MAX_STREAMS_PER_CONNECTION: u32 = 1024;
/// Longest any gRPC call may run: well past the clients' 30 s call
/// timeout and a member's largest report, so only a stuck call meets it.
const CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// A running master: its bound addresses and its tasks.
pub struct MasterHandle {
    pub grpc_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    /// What this process serves now (which term, if it leads).
    pub serving: Arc<Serving>,
    tasks: JoinSet<()>,
}

impl MasterHandle {
    /// The serving term's metadata (a single master has one at once).
    pub fn master(&self) -> Option<Arc<Master>> {
        self.serving.master()
    }

    /// Waits until every task has stopped (after the shutdown token fired).
    pub async fn wait(mut self) {
        while self.tasks.join_next().await.is_some() {}
    }
}

/// Where each term's durable state comes from.
enum DurableSource {
    /// Single master: one store for every term.
    Local(Arc<dyn DurableKv>),
    /// HA: etcd, fenced by the term that writes.
    Etcd(Box<EtcdKv>, String),
}

impl DurableSource {
    fn for_term(&self, term: u64) -> Arc<dyn DurableKv> {
        match self {
            DurableSource::Local(kv) => kv.clone(),
            DurableSource::Etcd(kv, cluster) => Arc::new(kv.fenced(cluster, term)),
        }
    }
}

/// Binds the gRPC and admin listeners and starts the master's tasks. A
/// single master leads at once (its term one above its last one, kept in
/// `--state-dir`); with `--etcd` it campaigns and serves only while it leads.
pub async fn start(cfg: MasterConfig, shutdown: CancellationToken) -> Result<MasterHandle> {
    cfg.validate()?.log();
    if let Some(dir) = &cfg.state_dir {
        std::fs::create_dir_all(dir).map_err(|e| {
            Error::invalid(format!("cannot create --state-dir {}: {e}", dir.display()))
        })?;
        // It holds the grant key.
        strata_common::files::tighten_dir(dir);
    }
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .map_err(|e| Error::invalid(format!("cannot bind --listen {}: {e}", cfg.listen)))?;
    let grpc_addr = listener.local_addr()?;
    let advertise = cfg
        .advertise
        .clone()
        .unwrap_or_else(|| grpc_addr.to_string());
    let metrics = MasterMetrics::new();
    let (election, durable, mode): (Arc<dyn Election>, _, _) = if cfg.etcd.is_empty() {
        let kv = Master::local_kv_of(&cfg)?;
        // Terms keep growing across restarts, so members fence a master
        // that came back as well as a deposed leader.
        let term = durable::advance_term(kv.as_ref()).await?;
        (
            Arc::new(MemElection::new(term - 1, cfg.election_ttl)),
            DurableSource::Local(kv),
            "single-master",
        )
    } else {
        let client = strata_common::leader::etcd_client_with(&cfg.etcd, &cfg.etcd_access).await?;
        (
            Arc::new(EtcdElection::new(
                client.clone(),
                &cfg.cluster_id,
                cfg.election_ttl,
            )?),
            DurableSource::Etcd(
                Box::new(EtcdKv::new(client, &cfg.cluster_id)?),
                cfg.cluster_id.clone(),
            ),
            "ha",
        )
    };
    let serving = Serving::new(metrics.clone(), advertise.clone(), mode);
    let mut tasks = JoinSet::new();

    let (refresh, ready) = (serving.clone(), serving.clone());
    let router = strata_common::admin::base_router(
        metrics.registry.clone(),
        // Only the serving leader, and not while it rebuilds from members.
        Arc::new(move || ready.ready()),
        Some(Arc::new(move || {
            if let Some(m) = refresh.master() {
                m.refresh_gauges()
            }
        })),
    )
    .merge(admin::api_router(serving.clone()));
    let (admin_addr, admin_task) =
        strata_common::admin::serve(cfg.admin_addr, router, shutdown.clone()).await?;
    tasks.spawn(async move {
        let _ = admin_task.await;
    });

    let svc = strata_common::grpc::Authenticated::new(
        serving::Gate {
            serving: serving.clone(),
        },
        Arc::new(cfg.credentials.clone()),
        service::policy_of,
    )
    .with_budget(strata_common::limits::InflightBudget::new(
        usize::try_from(cfg.max_inflight_bytes).unwrap_or(usize::MAX),
        Some(metrics.inflight_refused.clone()),
    ));
    let sd = shutdown.clone();
    let conns = connections::Connections::new(
        cfg.max_connections,
        cfg.max_connections_per_peer,
        metrics.clone(),
    );
    let incoming = quick_calls::split_incoming(
        listener,
        serving.clone(),
        Arc::new(cfg.credentials.clone()),
        conns,
        shutdown.clone(),
    );
    let keepalive = (cfg.keepalive_interval, cfg.keepalive_timeout);
    tasks.spawn(async move {
        let res = tonic::transport::Server::builder()
            // A peer that stops answering pings is dropped (its slot with
            // it); one connection carries a bounded number of calls; no
            // call is left running for ever.
            .http2_keepalive_interval(Some(keepalive.0))
            .http2_keepalive_timeout(Some(keepalive.1))
            .tcp_keepalive(Some(Duration::from_secs(60)))
            .max_concurrent_streams(Some(MAX_STREAMS_PER_CONNECTION))
            .timeout(CALL_TIMEOUT)
            .add_service(svc)
            .serve_with_incoming_shutdown(incoming, sd.cancelled())
            .await;
        if let Err(e) = res {
            tracing::error!(error = %e, "gRPC server failed");
            sd.cancel();
        }
    });
    let ctx = LeadCtx {
        cfg,
        serving: serving.clone(),
        election,
        durable,
        advertise: advertise.clone(),
    };
    if mode == "single-master" {
        // The single master leads at once: serve before returning.
        let (tx, rx) = tokio::sync::oneshot::channel();
        tasks.spawn(lead(ctx, shutdown.clone(), Some(tx)));
        let _ = rx.await;
        if serving.master().is_none() {
            return Err(Error::internal(
                "the master could not start its first term (see the log)",
            ));
        }
    } else {
        tasks.spawn(lead(ctx, shutdown.clone(), None));
    }
    tracing::info!(%grpc_addr, %admin_addr, %advertise, mode, "strata-master started");
    Ok(MasterHandle {
        grpc_addr,
        admin_addr,
        serving,
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

struct LeadCtx {
    cfg: MasterConfig,
    serving: Arc<Serving>,
    election: Arc<dyn Election>,
    durable: DurableSource,
    advertise: String,
}

/// The campaign loop: campaign, serve a term while it lasts, step down, and
/// campaign again, until shutdown (which resigns). `first` hears when the
/// first term serves (dropped unanswered if it cannot start).
async fn lead(
    ctx: LeadCtx,
    shutdown: CancellationToken,
    mut first: Option<tokio::sync::oneshot::Sender<()>>,
) {
    let poll = (ctx.cfg.election_ttl / 10).max(std::time::Duration::from_millis(50));
    loop {
        let watch = shutdown.child_token();
        tokio::spawn(serving::watch_leader(
            ctx.serving.clone(),
            ctx.election.clone(),
            poll,
            watch.clone(),
        ));
        let won = ctx.election.campaign(&ctx.advertise, &shutdown).await;
        watch.cancel();
        let leadership = match won {
            Ok(l) => l,
            Err(_) => return, // cancelled: shutting down
        };
        let term = leadership.term;
        let kv = ctx.durable.for_term(term);
        let t0 = Instant::now();
        let master =
            match Master::for_term(ctx.cfg.clone(), kv, ctx.serving.metrics.clone(), term).await {
                Ok(m) => m,
                Err(e) => {
                    tracing::error!(term, error = %e, "cannot start a term; resigning");
                    leadership.resign().await;
                    if first.take().is_some() || shutdown.is_cancelled() {
                        return;
                    }
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(ctx.cfg.election_ttl) => {}
                    }
                    continue;
                }
            };
        tracing::info!(
            term,
            advertise = %ctx.advertise,
            setup_ms = t0.elapsed().as_millis() as u64,
            "leading: members re-register and report what they hold"
        );
        let term_stop = shutdown.child_token();
        let mut tasks = JoinSet::new();
        tasks.spawn(housekeeping(
            master.clone(),
            leadership.clone(),
            term_stop.clone(),
        ));
        tasks.spawn(evictor(master.clone(), term_stop.clone()));
        ctx.serving.begin(master.clone(), leadership.clone());
        if let Some(tx) = first.take() {
            let _ = tx.send(());
        }
        let lost = leadership.lost();
        tokio::select! {
            _ = lost.cancelled() => {}
            _ = shutdown.cancelled() => {}
        }
        ctx.serving.end();
        term_stop.cancel();
        // Puts waiting for DRAM answer at once (retryable).
        master.stop_waiting();
        while tasks.join_next().await.is_some() {}
        if shutdown.is_cancelled() {
            leadership.resign().await;
            tracing::info!(term, "resigned leadership");
            return;
        }
        tracing::warn!(term, "stepped down; campaigning again");
    }
}

/// Expires silent nodes and reclaims puts that were never ended, while
/// `leadership` is sure: a leader resumed from a pause longer than its
/// lease would otherwise act on what it saw before (every node silent)
/// before its keeper noticed the lapse.
async fn housekeeping(m: Arc<Master>, leadership: Leadership, shutdown: CancellationToken) {
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
        if !leadership.is_valid() {
            continue;
        }
        let m2 = m.clone();
        let dead = tokio::task::spawn_blocking(move || m2.tick())
            .await
            .unwrap_or_default();
        // A later master should not wait for lost members: nodes that
        // expired, and members that did not come back to this master in
        // time. (An SSD owner that stops heartbeating keeps its entry and
        // may resume, so it is forgotten only in the second way.)
        let lost = dead.into_iter().map(Member::Node);
        for who in lost.chain(m.lost_members()) {
            if let Err(e) = m.forget(&who).await {
                tracing::warn!(member = %who, error = %e, "could not forget a lost member durably");
                continue;
            }
            tracing::info!(member = %who, "forgot a lost member");
            // It came back meanwhile, and its own remembering may have
            // gone first: remember it again.
            if m.registered(&who) {
                if let Err(e) = m.remember(who.clone()).await {
                    tracing::warn!(member = %who, error = %e, "could not remember a member again");
                }
            }
        }
    }
}

/// Background eviction above the high watermark.
async fn evictor(m: Arc<Master>, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = m.evictor_wanted() => {}
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        let m2 = m.clone();
        let _ = tokio::task::spawn_blocking(move || m2.evict_to_watermark()).await;
    }
}

#[cfg(test)]
mod tests;
