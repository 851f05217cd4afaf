//! The client side of the UCX data plane: a [`Transport`] that reads and
//! writes the segments of UCX-serving nodes one-sided (`ucp_get_nbx` /
//! `ucp_put_nbx`) and everything else over TCP.
//!
//! A remote key opens its whole segment, and the node checks nothing on a
//! one-sided access, so routes come only from the master's `GetUcxRoutes`,
//! which needs the rdma role. A client without it (or a node without UCX, or
//! a route UCX cannot reach) is served over TCP, where the node checks every
//! grant. What the client can still check itself, it does before every
//! one-sided transfer: bounds, permission and expiry, and that a write ends
//! well before its grant does (a late write could land in the range's next
//! allocation; the TCP path is fenced against that on the node).

use super::engine::{Engine, Peer};
use crate::tcp::TcpTransport;
use crate::{check_sub_range, RemoteRange, Transport};
use futures::future::BoxFuture;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_common::grant::{PERM_READ, PERM_WRITE};
use strata_common::{Code, Error, Result};

/// Where routes come from: the master's `GetUcxRoutes` (rdma role).
pub trait RouteSource: Send + Sync + 'static {
    fn routes(&self, segment_ids: Vec<u64>) -> BoxFuture<'_, Result<Vec<strata_proto::UcxRoute>>>;
}

#[derive(Debug, Clone)]
pub struct UcxClientConfig {
    /// UCX transports (`UCX_TLS` syntax); `None` lets `UCX_TLS` decide.
    pub tls: Option<String>,
    /// Bound on one transfer.
    pub timeout: Duration,
    /// How long a route UCX failed on is left to TCP before UCX is tried
    /// again.
    pub retry_after: Duration,
}

impl Default for UcxClientConfig {
    fn default() -> Self {
        UcxClientConfig {
            tls: None,
            timeout: Duration::from_secs(30),
            retry_after: Duration::from_secs(30),
        }
    }
}

/// A segment reachable one-sided.
struct Route {
    peer: Peer,
    base: u64,
    size: u64,
    segment_id: u64,
    data_addr: String,
}

impl Route {
    /// Whether `r` names this route: its fingerprint (the cache key), and
    /// the segment and node it was published for.
    fn serves(&self, r: &RemoteRange) -> bool {
        self.segment_id == r.scope.segment_id && self.data_addr == r.addr
    }
}

enum Known {
    Ucx(Arc<Route>),
    /// No usable route (none published, or UCX failed on it) until then.
    Tcp(Instant),
}

/// How one transfer goes.
enum Path {
    /// One-sided, within this time.
    Ucx(Arc<Route>, Duration),
    Tcp,
}

/// How long before its grant ends a one-sided write must be done (clock
/// skew between client and master hosts must stay below it).
pub const WRITE_MARGIN: Duration = Duration::from_secs(2);
/// Below this much time for a one-sided write, it goes over TCP.
const MIN_WRITE_TIME: Duration = Duration::from_millis(200);

/// Counts of transfers by path, for tests and metrics.
#[derive(Debug, Default)]
pub struct PathCounts {
    pub ucx: std::sync::atomic::AtomicU64,
    pub tcp: std::sync::atomic::AtomicU64,
}

pub struct UcxTransport {
    engine: Engine,
    tcp: Arc<TcpTransport>,
    source: Arc<dyn RouteSource>,
    cfg: UcxClientConfig,
    /// Routes by fingerprint (see `strata_proto::Replica::ucx_route`).
    routes: Mutex<HashMap<u64, Known>>,
    /// The master refused us routes (no rdma role): TCP from now on.
    denied: AtomicBool,
    pub counts: PathCounts,
}

/// Routes cached at most; beyond it the cache starts over (segments are few;
/// this only bounds a pathological master).
const MAX_ROUTES: usize = 65_536;

impl UcxTransport {
    pub fn new(
        cfg: UcxClientConfig,
        tcp: Arc<TcpTransport>,
        source: Arc<dyn RouteSource>,
    ) -> Result<UcxTransport> {
        Ok(UcxTransport {
            engine: Engine::start(cfg.tls.as_deref())?,
            tcp,
            source,
            cfg,
            routes: Mutex::new(HashMap::new()),
            denied: AtomicBool::new(false),
            counts: PathCounts::default(),
        })
    }

    /// The path for a transfer of `len` bytes at `at` of `r` needing `perm`.
    async fn path(&self, r: &RemoteRange, at: u64, len: usize, perm: u32) -> Result<Path> {
        check_sub_range(r.len(), at, len)?;
        if r.ucx_route == 0 || self.denied.load(Ordering::Relaxed) {
            return Ok(Path::Tcp);
        }
        if r.scope.perm & perm == 0 {
            return Err(Error::new(
                Code::PermissionDenied,
                "the grant does not permit this operation",
            ));
        }
        let now = strata_common::time::unix_ms();
        if now >= r.scope.expires_unix_ms {
            return Err(Error::new(Code::PermissionDenied, "the grant has expired"));
        }
        // A one-sided write must be over well before its grant ends: once
        // it has, the master may reallocate the range, and no node fence
        // stops a late write. Too close to the end: the node's fenced TCP.
        let timeout = match perm {
            PERM_WRITE => {
                let left = Duration::from_millis(r.scope.expires_unix_ms - now);
                let t = left.saturating_sub(WRITE_MARGIN).min(self.cfg.timeout);
                if t < MIN_WRITE_TIME {
                    return Ok(Path::Tcp);
                }
                t
            }
            _ => self.cfg.timeout,
        };
        let Some(route) = self.route(r).await else {
            return Ok(Path::Tcp);
        };
        let end = r
            .scope
            .offset
            .checked_add(at)
            .and_then(|o| o.checked_add(len as u64));
        if end.is_none_or(|e| e > route.size) {
            return Err(Error::invalid(format!(
                "range [{}, +{}) is outside the segment of {} bytes",
                r.scope.offset + at,
                len,
                route.size
            )));
        }
        Ok(Path::Ucx(route, timeout))
    }

    async fn route(&self, r: &RemoteRange) -> Option<Arc<Route>> {
        match self.routes.lock().get(&r.ucx_route) {
            Some(Known::Ucx(route)) => return route.serves(r).then(|| route.clone()),
            Some(Known::Tcp(until)) if Instant::now() < *until => return None,
            _ => {}
        }
        let fetched = self.source.routes(vec![r.scope.segment_id]).await;
        let routes = match fetched {
            Ok(v) => v,
            Err(e) if matches!(e.code, Code::PermissionDenied | Code::Unauthenticated) => {
                if !self.denied.swap(true, Ordering::Relaxed) {
                    tracing::warn!(error = %e, "the master gives UCX routes to rdma clients only; reading and writing over TCP");
                }
                return None;
            }
            Err(e) => {
                tracing::debug!(error = %e, "cannot fetch UCX routes; this transfer goes over TCP");
                return None;
            }
        };
        // Only the route the replica named, at the node the replica named:
        // segment ids are reassigned by a new master.
        let found = routes
            .into_iter()
            .map(|x| {
                let fp = x.fingerprint;
                let route = Route {
                    peer: Peer {
                        worker: x.worker.into(),
                        rkey: x.rkey.into(),
                    },
                    base: x.base,
                    size: x.size,
                    segment_id: x.segment_id,
                    data_addr: x.data_addr,
                };
                (fp, route)
            })
            .find(|(fp, route)| *fp == r.ucx_route && route.serves(r));
        let mut cache = self.routes.lock();
        if cache.len() >= MAX_ROUTES {
            cache.clear();
        }
        match found {
            Some((_, route)) => {
                let route = Arc::new(route);
                cache.insert(r.ucx_route, Known::Ucx(route.clone()));
                Some(route)
            }
            None => {
                cache.insert(
                    r.ucx_route,
                    Known::Tcp(Instant::now() + self.cfg.retry_after),
                );
                None
            }
        }
    }

    /// UCX failed on `r`'s route: TCP for a while (the node may have died,
    /// or UCX cannot reach it from here).
    fn demote(&self, r: &RemoteRange, e: &Error) {
        tracing::warn!(node = r.addr, error = %e, "UCX transfer failed; using TCP for this segment for a while");
        self.routes.lock().insert(
            r.ucx_route,
            Known::Tcp(Instant::now() + self.cfg.retry_after),
        );
    }

    fn addr(route: &Route, r: &RemoteRange, at: u64) -> u64 {
        // In range: `path` checked offset + at + len <= size, and the master
        // checked that base + size does not overflow.
        route.base + r.scope.offset + at
    }
}

impl Transport for UcxTransport {
    fn write<'a>(
        &'a self,
        dst: &'a RemoteRange,
        at: u64,
        data: &'a [u8],
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            if let Path::Ucx(route, timeout) = self.path(dst, at, data.len(), PERM_WRITE).await? {
                let addr = Self::addr(&route, dst, at);
                match self
                    .engine
                    .put(&route.peer, addr, data.to_vec(), timeout)
                    .await
                {
                    Ok(()) => {
                        self.counts.ucx.fetch_add(1, Ordering::Relaxed);
                        return Ok(());
                    }
                    Err(e) => self.demote(dst, &e),
                }
            }
            self.counts.tcp.fetch_add(1, Ordering::Relaxed);
            self.tcp.write(dst, at, data).await
        })
    }

    fn read<'a>(
        &'a self,
        src: &'a RemoteRange,
        at: u64,
        buf: &'a mut [u8],
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            if let Path::Ucx(route, timeout) = self.path(src, at, buf.len(), PERM_READ).await? {
                let addr = Self::addr(&route, src, at);
                match self.engine.get(&route.peer, addr, buf.len(), timeout).await {
                    Ok(bytes) => {
                        buf.copy_from_slice(&bytes);
                        self.counts.ucx.fetch_add(1, Ordering::Relaxed);
                        return Ok(());
                    }
                    Err(e) => self.demote(src, &e),
                }
            }
            self.counts.tcp.fetch_add(1, Ordering::Relaxed);
            self.tcp.read(src, at, buf).await
        })
    }

    fn read_many<'a>(
        &'a self,
        items: Vec<(&'a RemoteRange, &'a mut [u8])>,
    ) -> BoxFuture<'a, Vec<Result<u32>>> {
        Box::pin(async move {
            // Ranges without a route go to TCP as one batch per node; the
            // rest are read one-sided, all at once.
            let (ucx, tcp): (Vec<_>, Vec<_>) = items
                .into_iter()
                .enumerate()
                .partition(|(_, (r, _))| r.ucx_route != 0 && !self.denied.load(Ordering::Relaxed));
            let n = ucx.len() + tcp.len();
            let (tcp_idx, tcp_items): (Vec<usize>, Vec<_>) = tcp.into_iter().unzip();
            let ucx_reads = futures::future::join_all(
                ucx.into_iter()
                    .map(|(i, (r, buf))| async move { (i, self.read_crc32c(r, 0, buf).await) }),
            );
            let tcp_reads = async {
                if tcp_items.is_empty() {
                    Vec::new()
                } else {
                    self.counts
                        .tcp
                        .fetch_add(tcp_items.len() as u64, Ordering::Relaxed);
                    self.tcp.read_many(tcp_items).await
                }
            };
            let (ucx_out, tcp_out) = futures::join!(ucx_reads, tcp_reads);
            let mut out: Vec<Option<Result<u32>>> = (0..n).map(|_| None).collect();
            for (i, r) in ucx_out {
                out[i] = Some(r);
            }
            for (i, r) in tcp_idx.into_iter().zip(tcp_out) {
                out[i] = Some(r);
            }
            out.into_iter()
                .map(|r| r.unwrap_or_else(|| Err(Error::internal("batch read lost an item"))))
                .collect()
        })
    }

    fn name(&self) -> &'static str {
        "ucx"
    }
}
