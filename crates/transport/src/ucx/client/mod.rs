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
//!
//! SSD ranges whose grant carries `PERM_STAGE` (the master adds it for rdma
//! callers) are read through the owning agent's lend window: a `Stage`
//! request over TCP has the agent read a piece from disk into a slot it
//! lends, the piece is read one-sided, and the slot is given back. Agents
//! that do not stage are read over TCP.

mod routes;
mod staged;

use super::cross_memory::Attached;
use super::engine::{Engine, Peer};
use crate::frame::Staged;
use crate::tcp::TcpTransport;
use crate::{check_sub_range, RemoteRange, Transport, WriteItem};
use futures::future::BoxFuture;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_common::grant::{PERM_READ, PERM_STAGE, PERM_WRITE};
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
    /// Co-located: reached through the shared-memory engine.
    local: bool,
    base: u64,
    size: u64,
    segment_id: u64,
    data_addr: String,
    /// The segment's published revocations: one-sided reads check them
    /// after the bytes. Nodes that predate them publish none; reads of
    /// theirs go over TCP (writes still go one-sided).
    fence: Option<FenceRoute>,
    /// A co-located node's process, attached for cross-memory reads
    /// (`cross_memory.rs`) on the caller's thread instead of through the
    /// shared-memory engine. Only with published revocations, which every
    /// such read checks. Writes copy into the node's segment file when it
    /// is mapped writable, else go through the engine, never through the
    /// kernel: the node names its process itself, and a write aimed by a
    /// lying node at another process's memory would be the client's doing,
    /// where a read is only checked bytes.
    attached: Option<Attached>,
}

/// Where a segment's published revocations are (`published.rs`).
struct FenceRoute {
    peer: Peer,
    base: u64,
    granule: u64,
    /// The registration stamp the header holds while the route is good.
    stamp: u64,
}

impl FenceRoute {
    /// From a route's `fence_*` fields; `None` when absent or unusable (a
    /// granule that is no power of two, words that would not fit).
    fn of(x: &strata_proto::UcxRoute, worker: &Arc<[u8]>, same_host: bool) -> Option<FenceRoute> {
        let fits = crate::published::layout_ok(x.size, x.fence_base, x.fence_granule)
            && x.fence_stamp != 0
            && !x.fence_rkey.is_empty();
        fits.then(|| FenceRoute {
            peer: Peer {
                worker: worker.clone(),
                rkey: x.fence_rkey.clone().into(),
                same_host,
            },
            base: x.fence_base,
            granule: x.fence_granule,
            stamp: x.fence_stamp,
        })
    }
}

impl FenceRoute {
    /// The words a one-sided reader of `src` checks after its bytes: the
    /// header and its start granule's word.
    fn words(&self, src: &RemoteRange) -> Vec<(Peer, u64)> {
        let word = self.base + crate::published::word_offset(src.scope.offset, self.granule);
        vec![(self.peer.clone(), self.base), (self.peer.clone(), word)]
    }

    /// Whether `src`'s grant still stood once its bytes were read, by the
    /// words [`FenceRoute::words`] read after them.
    fn stands(&self, src: &RemoteRange, words: &[u64]) -> bool {
        match *words {
            [header, word] => {
                crate::published::stands(header, word, self.stamp, src.scope.generation)
            }
            _ => false,
        }
    }
}

impl Route {
    /// Whether `r` names this route: the cache key holds its fingerprint and
    /// segment; the node must match too.
    fn serves(&self, r: &RemoteRange) -> bool {
        self.segment_id == r.scope.segment_id && self.data_addr == r.addr
    }
}

/// What replicas name a route by: its fingerprint and segment id. A node
/// that registers again with a new master keeps its fingerprint but gets
/// new segment ids, so both are needed.
type RouteKey = (u64, u64);

fn key_of(r: &RemoteRange) -> RouteKey {
    (r.ucx_route, r.scope.segment_id)
}

enum Known {
    Ucx(Arc<Route>),
    /// No usable route (none published, the master did not answer, or UCX
    /// failed on it) until then.
    Tcp(Instant),
}

/// How a write into a mapped co-located segment went.
enum Mapped {
    /// In place, its grant standing after the bytes.
    Done,
    /// Its grant's margin ran out, or the grant was revoked: TCP writes it,
    /// under the node's fences.
    NotConfirmed,
    /// The node's process is gone (or the mapping refused the bytes).
    Failed(Error),
}

/// How one transfer goes.
enum Path {
    /// One-sided, to be done by then.
    Ucx(Arc<Route>, Instant),
    Tcp,
}

/// How long before its grant ends a one-sided write must be done (clock
/// skew between client and master hosts must stay below it).
pub const WRITE_MARGIN: Duration = Duration::from_secs(2);
/// A shared-memory transfer to a co-located node takes at most this (plus
/// 1 ms per MB): the only way to learn that the node died.
const SHARED_MEMORY_TIME: Duration = Duration::from_secs(1);
/// A lent piece is read at least this long before the agent may reclaim it.
const LEND_MARGIN: Duration = Duration::from_secs(2);
/// Staged reads one client runs at once.
const MAX_STAGED_READS: usize = 16;
/// Cross-memory reads copy this much at a time and checksum it while it is
/// still in the CPU's cache; every [`PIECES_PER_YIELD`] pieces (1 MiB) they
/// let other tasks run (a 16 MiB read keeps no runtime thread for
/// milliseconds).
const ATTACHED_PIECE: usize = 256 << 10;
const PIECES_PER_YIELD: usize = 4;
/// Below this much time for a one-sided write, it goes over TCP.
const MIN_WRITE_TIME: Duration = Duration::from_millis(200);
/// Bound on asking the master for routes; past it the transfer goes over
/// TCP.
const ROUTE_FETCH_TIMEOUT: Duration = Duration::from_secs(2);
/// After a failed route fetch, how long transfers to that segment use TCP
/// before asking again.
const FETCH_RETRY: Duration = Duration::from_secs(1);

/// The UCX client: what its siblings share, and TCP connections of its
/// own (for transfers that do not go one-sided).
pub struct UcxTransport {
    shared: Arc<UcxShared>,
    tcp: Arc<TcpTransport>,
    /// A sibling, on a runtime its thread drives only while it waits: a
    /// task spawned there (a lent piece's give-back) would wait for the
    /// thread's next call, so its lent pieces close their connection
    /// instead (the agent takes the slot back then).
    own_thread: bool,
}

/// A UCX client's engines, routes and counters, shared by its siblings
/// (`Transport::sibling`): the engines' progress threads serve any caller,
/// and a route (with its mapping of a co-located segment) is fetched once.
/// Its methods reach them through `Deref`.
pub struct UcxShared {
    engine: Engine,
    /// A shared-memory-only engine for co-located nodes: with network
    /// transports in the same context UCX picks them even for a peer on
    /// this host (measured: 1.1 GB/s over UCX tcp against 7 GB/s over
    /// shared memory for 16 MiB reads).
    local: Option<Engine>,
    source: Arc<dyn RouteSource>,
    cfg: UcxClientConfig,
    routes: Mutex<HashMap<RouteKey, Known>>,
    /// The master refused us routes (no rdma role): TCP until then, when
    /// it is asked again (credentials may be rotated meanwhile).
    denied_until: Mutex<Option<Instant>>,
    /// Transfers that went one-sided (tests check the path taken).
    one_sided: std::sync::atomic::AtomicU64,
    /// One-sided reads the published revocations did not confirm.
    unconfirmed: std::sync::atomic::AtomicU64,
    /// Writes the published revocations sent to TCP instead of one-sided.
    unconfirmed_writes: std::sync::atomic::AtomicU64,
    /// One-sided reads done by cross-memory attach.
    attached: std::sync::atomic::AtomicU64,
    /// Of those, copied from a mapped shared segment.
    mapped: std::sync::atomic::AtomicU64,
    /// Writes copied into a mapped shared segment.
    mapped_writes: std::sync::atomic::AtomicU64,
    /// Transfers given to the shared-memory engine (co-located peers).
    shared_memory: std::sync::atomic::AtomicU64,
    /// One route fetch at a time: transfers that miss together (a burst
    /// on a new segment) wait for it and find its answer, instead of each
    /// asking the master.
    fetching: tokio::sync::Mutex<()>,
    /// Demotions so far: a fetch that saw one happen while it was in flight
    /// does not overwrite the demotion with the (older) route.
    demotions: std::sync::atomic::AtomicU64,
    /// Lend windows of SSD agents, by the fingerprint their `Stage`
    /// answers carry.
    windows: Mutex<HashMap<u64, Arc<Route>>>,
    /// Agents that do not stage (older, or TCP only) or whose window UCX
    /// failed on: their reads go over TCP until then.
    no_stage: Mutex<HashMap<String, Instant>>,
    /// Staged reads in flight at most (a batch of SSD objects does not
    /// open a connection and take a window slot per object at once).
    staged_reads: tokio::sync::Semaphore,
}

impl std::ops::Deref for UcxTransport {
    type Target = UcxShared;

    fn deref(&self) -> &UcxShared {
        &self.shared
    }
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
        let local = wants_shared_memory(cfg.tls.as_deref()).then(|| {
            Engine::start(Some("sm,self"))
                .inspect_err(|e| tracing::debug!(error = %e, "no UCX shared memory here; co-located nodes are reached like the others"))
                .ok()
        });
        let shared = UcxShared {
            engine: Engine::start(cfg.tls.as_deref())?,
            local: local.flatten(),
            source,
            cfg,
            routes: Mutex::new(HashMap::new()),
            denied_until: Mutex::new(None),
            one_sided: Default::default(),
            unconfirmed: Default::default(),
            unconfirmed_writes: Default::default(),
            attached: Default::default(),
            mapped: Default::default(),
            mapped_writes: Default::default(),
            shared_memory: Default::default(),
            fetching: tokio::sync::Mutex::new(()),
            demotions: Default::default(),
            windows: Mutex::new(HashMap::new()),
            no_stage: Mutex::new(HashMap::new()),
            staged_reads: tokio::sync::Semaphore::new(MAX_STAGED_READS),
        };
        Ok(UcxTransport {
            shared: Arc::new(shared),
            tcp,
            own_thread: false,
        })
    }

    fn denied(&self) -> bool {
        let mut d = self.denied_until.lock();
        match *d {
            Some(until) if Instant::now() < until => true,
            Some(_) => {
                *d = None;
                false
            }
            None => false,
        }
    }

    /// The path for a transfer of `len` bytes at `at` of `r` needing `perm`.
    async fn path(&self, r: &RemoteRange, at: u64, len: usize, perm: u32) -> Result<Path> {
        check_sub_range(r.len(), at, len)?;
        if r.ucx_route == 0 || self.denied() {
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
        // stops a late write. The deadline is fixed before anything else
        // (the route fetch) takes time.
        let deadline = match perm {
            PERM_WRITE => {
                let left = Duration::from_millis(r.scope.expires_unix_ms - now);
                Instant::now() + left.saturating_sub(WRITE_MARGIN).min(self.cfg.timeout)
            }
            _ => Instant::now() + self.cfg.timeout,
        };
        let Some(route) = self.route(r).await else {
            return Ok(Path::Tcp);
        };
        // Too close to the end (or past it, after the fetch): the node's
        // fenced TCP path.
        if perm == PERM_WRITE && deadline.saturating_duration_since(Instant::now()) < MIN_WRITE_TIME
        {
            return Ok(Path::Tcp);
        }
        let end = r
            .scope
            .offset
            .checked_add(at)
            .and_then(|o| o.checked_add(len as u64));
        if end.is_none_or(|e| e > route.size) {
            return Err(Error::invalid(format!(
                "{len} bytes at {at} of the range at {} exceed the segment of {} bytes",
                r.scope.offset, route.size
            )));
        }
        Ok(Path::Ucx(route, deadline))
    }

    /// Reads into `buf` (and with `crc`, returns the bytes' crc32c, else 0).
    async fn read_in(&self, src: &RemoteRange, at: u64, buf: &mut [u8], crc: bool) -> Result<u32> {
        if self.stageable(src) {
            check_sub_range(src.len(), at, buf.len())?;
            if !buf.is_empty() {
                if let Some(c) = self.read_staged(src, at, buf, crc).await? {
                    return Ok(c);
                }
            }
        }
        if let Path::Ucx(route, deadline) = self.path(src, at, buf.len(), PERM_READ).await? {
            // Nodes that publish no revocations are read over TCP, where
            // their fences check each read.
            if let Some(fence) = &route.fence {
                let addr = Self::addr(&route, src, at);
                let read = match self.read_attached(&route, fence, src, addr, buf, crc).await {
                    Some(r) => {
                        if r.is_some() {
                            self.attached.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(r)
                    }
                    None => {
                        let (engine, deadline) = self.engine_for(&route, buf.len(), deadline);
                        // The words are read after the bytes have landed,
                        // by the progress thread, in the same hand-off.
                        engine
                            .get_then(&route.peer, addr, buf.len(), fence.words(src), deadline)
                            .await
                            .map(|(bytes, words)| {
                                fence
                                    .stands(src, &words)
                                    .then(|| copy_crc(&bytes, buf, crc))
                            })
                    }
                };
                match read {
                    Ok(Some(c)) => {
                        self.one_sided.fetch_add(1, Ordering::Relaxed);
                        return Ok(c);
                    }
                    // Revoked, or spuriously so: the node's fences decide.
                    Ok(None) => {
                        self.unconfirmed.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => self.demote(src, &e),
                }
            }
        }
        if crc {
            self.tcp.read_crc32c(src, at, buf).await
        } else {
            self.tcp.read(src, at, buf).await.map(|()| 0)
        }
    }

    /// One-sided reads whose revocation check failed (and went to TCP).
    pub fn unconfirmed_reads(&self) -> u64 {
        self.unconfirmed.load(Ordering::Relaxed)
    }

    /// Writes whose grant the published revocations did not confirm
    /// before the write (they went to the node's fenced TCP path).
    pub fn unconfirmed_writes(&self) -> u64 {
        self.unconfirmed_writes.load(Ordering::Relaxed)
    }

    /// Whether a one-sided write under `dst`'s grant may go ahead, by the
    /// node's published words read just before it: the header must hold
    /// the route's stamp (a grant of an earlier registration, e.g. from a
    /// deposed master whose segments the node's new master reallocates, is
    /// refused) and no free may have killed the grant's generation. Nodes
    /// that publish no words (older releases) are written one-sided
    /// unchecked, as before. The check narrows a late write's window from
    /// the grant's whole life to the moment between check and write.
    async fn may_write(&self, route: &Route, dst: &RemoteRange, deadline: Instant) -> Result<bool> {
        let Some(fence) = &route.fence else {
            return Ok(true);
        };
        let word = fence.base + crate::published::word_offset(dst.scope.offset, fence.granule);
        // A co-located node's words are read on this thread, no hand-off.
        if let Some(a) = route.attached.as_ref().filter(|a| a.usable()) {
            match a.read_words(fence.base, word) {
                Ok(words) => return Ok(fence.stands(dst, &words)),
                Err(e) => a.refuse(&e),
            }
        }
        let (engine, deadline) = self.engine_for(route, 16, deadline);
        let (header, words) = engine
            .get_then(
                &fence.peer,
                fence.base,
                8,
                vec![(fence.peer.clone(), word)],
                deadline,
            )
            .await?;
        let header = header
            .get(..8)
            .and_then(|h| h.try_into().ok())
            .map(u64::from_ne_bytes)
            .ok_or_else(|| Error::internal("a word read was not 8 bytes"))?;
        Ok(match *words {
            [w] => fence.stands(dst, &[header, w]),
            _ => false,
        })
    }

    /// Writes the concatenation of `parts` at `at` of `dst` one-sided when
    /// its route allows: `Ok(true)` when written, `Ok(false)` when TCP
    /// must (no route, a revoked or nearly expired grant, a failed
    /// transfer), an error for a transfer the grant does not allow.
    async fn write_one_sided(&self, dst: &RemoteRange, at: u64, parts: &[&[u8]]) -> Result<bool> {
        let len = crate::parts::total_len(parts);
        let Path::Ucx(route, deadline) = self.path(dst, at, len, PERM_WRITE).await? else {
            return Ok(false);
        };
        match self.may_write(&route, dst, deadline).await {
            Ok(true) => {}
            // Revoked (or spuriously so): the node's fences decide.
            Ok(false) => {
                self.unconfirmed_writes.fetch_add(1, Ordering::Relaxed);
                return Ok(false);
            }
            Err(e) => {
                self.demote(dst, &e);
                return Ok(false);
            }
        }
        let addr = Self::addr(&route, dst, at);
        let written = match self.write_mapped(&route, dst, addr, parts, deadline).await {
            Some(Mapped::Done) => Ok(()),
            // This write only goes over TCP, where the node's fences decide;
            // the route stays as it is.
            Some(Mapped::NotConfirmed) => {
                self.unconfirmed_writes.fetch_add(1, Ordering::Relaxed);
                return Ok(false);
            }
            Some(Mapped::Failed(e)) => Err(e),
            None => {
                let data = crate::parts::joined(parts);
                let (engine, deadline) = self.engine_for(&route, len, deadline);
                engine.put_slice(&route.peer, addr, &data, deadline).await
            }
        };
        match written {
            Ok(()) => {
                self.one_sided.fetch_add(1, Ordering::Relaxed);
                Ok(true)
            }
            Err(e) => {
                self.demote(dst, &e);
                Ok(false)
            }
        }
    }

    /// Copies `parts` one after another to `addr` of a co-located node's
    /// segment mapped writable into this process (no system call, no other
    /// thread): `None` when the route has no such mapping (the engine
    /// writes). Only a file without holes is written so (a prefaulted
    /// node): a page the client's write allocated would be charged to the
    /// client's memory cgroup. Large writes go a piece at a time, letting
    /// other tasks run between pieces, and stop once past `deadline`, after
    /// which a late piece could land in the range's next allocation. The
    /// published words are read again after the bytes: the mapping outlives
    /// its node, and a write into a dead node's file, or under a grant
    /// revoked meanwhile, is not reported done (TCP writes it, or fails).
    async fn write_mapped(
        &self,
        route: &Route,
        dst: &RemoteRange,
        addr: u64,
        parts: &[&[u8]],
        deadline: Instant,
    ) -> Option<Mapped> {
        let a = route.attached.as_ref().filter(|a| a.usable())?;
        let m = a.mapped().filter(|m| m.writable() && m.resident())?;
        let mut at = addr;
        let pieces = parts.iter().flat_map(|p| p.chunks(ATTACHED_PIECE));
        for (i, piece) in pieces.enumerate() {
            if i > 0 && i % PIECES_PER_YIELD == 0 {
                tokio::task::yield_now().await;
            }
            if Instant::now() >= deadline {
                return Some(Mapped::NotConfirmed);
            }
            if let Err(e) = m.write(route.base, at, piece) {
                return Some(Mapped::Failed(Error::internal(format!(
                    "mapped write: {e}"
                ))));
            }
            at += piece.len() as u64;
        }
        // The bytes are in place before the words are read (and before
        // anything, the PutEnd, says they are).
        std::sync::atomic::fence(Ordering::SeqCst);
        if let Some(fence) = &route.fence {
            let word = fence.base + crate::published::word_offset(dst.scope.offset, fence.granule);
            match a.read_words(fence.base, word) {
                Ok(words) if fence.stands(dst, &words) => {}
                Ok(_) => return Some(Mapped::NotConfirmed),
                Err(e) => {
                    a.refuse(&e);
                    return Some(Mapped::Failed(Error::unavailable(format!(
                        "the co-located node's process is gone: {e}"
                    ))));
                }
            }
        }
        self.mapped_writes.fetch_add(1, Ordering::Relaxed);
        Some(Mapped::Done)
    }

    /// Writes copied into a co-located node's mapped segment (also counted
    /// in [`UcxTransport::one_sided_transfers`]).
    pub fn mapped_writes(&self) -> u64 {
        self.mapped_writes.load(Ordering::Relaxed)
    }

    /// One-sided reads done by cross-memory attach (also counted in
    /// [`UcxTransport::one_sided_transfers`]).
    pub fn attached_reads(&self) -> u64 {
        self.attached.load(Ordering::Relaxed)
    }

    /// Transfers (one-sided, or to a lend window) that went through the
    /// shared-memory engine, which only co-located peers are given.
    pub fn shared_memory_transfers(&self) -> u64 {
        self.shared_memory.load(Ordering::Relaxed)
    }

    /// Cross-memory reads copied from a co-located node's shared segment
    /// mapped into this process (whether or not their grant then stood).
    pub fn mapped_reads(&self) -> u64 {
        self.mapped.load(Ordering::Relaxed)
    }

    /// Reads `buf` at `addr` of `route`'s attached process, then the words
    /// of `fence`: `None` when the route has no usable attachment or the
    /// kernel refused (the engine reads it instead), else whether the grant
    /// stood (and the bytes' crc32c with `crc`, else 0). Large reads go a
    /// piece at a time, letting other tasks run between pieces.
    async fn read_attached(
        &self,
        route: &Route,
        fence: &FenceRoute,
        src: &RemoteRange,
        addr: u64,
        buf: &mut [u8],
        crc: bool,
    ) -> Option<Option<u32>> {
        let a = route.attached.as_ref().filter(|a| a.usable())?;
        let mapped = a.mapped();
        let mut c = 0;
        let mut at = addr;
        let mut refused = None;
        for (i, piece) in buf.chunks_mut(ATTACHED_PIECE).enumerate() {
            if i > 0 && i % PIECES_PER_YIELD == 0 {
                tokio::task::yield_now().await;
            }
            // From the node's shared segment when mapped (one pass, no
            // system call), else copied by the kernel and checksummed
            // while still in cache.
            let got = match &mapped {
                Some(m) => m.read(route.base, at, piece, crc.then_some(c)),
                None => a.read(at, piece).map(|()| match crc {
                    true => crc32c::crc32c_append(c, piece),
                    false => 0,
                }),
            };
            match got {
                Ok(next) => c = next,
                Err(e) => {
                    refused = Some(e);
                    break;
                }
            }
            at += piece.len() as u64;
        }
        if mapped.is_some() && refused.is_none() {
            self.mapped.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(e) = refused {
            // The engine reads it again; nothing half-read stays behind.
            a.refuse(&e);
            buf.fill(0);
            return None;
        }
        let word = fence.base + crate::published::word_offset(src.scope.offset, fence.granule);
        match a.read_words(fence.base, word) {
            Ok(words) if fence.stands(src, &words) => Some(Some(c)),
            // What was read is not the grant's: none of it is left in the
            // caller's buffer, whatever the TCP read after it does.
            Ok(_) => {
                buf.fill(0);
                Some(None)
            }
            // The node's process is gone (or no longer ours to read): what
            // was copied (from a mapping that outlives the node) is not
            // left behind either.
            Err(e) => {
                a.refuse(&e);
                buf.fill(0);
                None
            }
        }
    }

    /// The engine for a transfer of `len` bytes to `route`, and its
    /// deadline: shared memory for a co-located node, where UCX cannot tell
    /// a dead peer from a slow one, so the transfer gets a tighter deadline
    /// (`SHARED_MEMORY_TIME` plus 1 ms per MB).
    fn engine_for(&self, route: &Route, len: usize, deadline: Instant) -> (&Engine, Instant) {
        match &self.local {
            Some(l) if route.local => {
                self.shared_memory.fetch_add(1, Ordering::Relaxed);
                let bound = SHARED_MEMORY_TIME + Duration::from_nanos(len as u64);
                (l, deadline.min(Instant::now() + bound))
            }
            _ => (&self.engine, deadline),
        }
    }

    fn addr(route: &Route, r: &RemoteRange, at: u64) -> u64 {
        // In range: `path` checked offset + at + len <= size, and the master
        // checked that base + size does not overflow.
        route.base + r.scope.offset + at
    }
}

/// Copies `from` into `to` and (with `crc`) checksums it in the same pass,
/// a cache-sized chunk at a time: one trip through memory instead of two.
fn copy_crc(from: &[u8], to: &mut [u8], crc: bool) -> u32 {
    const CHUNK: usize = 64 << 10;
    assert_eq!(from.len(), to.len(), "a transfer read what was asked");
    let mut c = 0;
    for (f, t) in from.chunks(CHUNK).zip(to.chunks_mut(CHUNK)) {
        if crc {
            c = crc32c::crc32c_append(c, f);
        }
        t.copy_from_slice(f);
    }
    c
}

/// Whether a client configured with `tls` (else `UCX_TLS`, else every
/// transport) may use UCX shared memory.
fn wants_shared_memory(tls: Option<&str>) -> bool {
    let env = std::env::var("UCX_TLS").ok();
    let list = tls.or(env.as_deref()).unwrap_or("all").trim();
    let shm = |t: &str| {
        matches!(
            t.trim(),
            "all" | "sm" | "shm" | "posix" | "sysv" | "cma" | "knem" | "xpmem"
        )
    };
    match list.strip_prefix('^') {
        // "Everything but": shared memory unless it is excluded.
        Some(but) => !but.split(',').any(|t| matches!(t.trim(), "sm" | "shm")),
        None => list.split(',').any(shm),
    }
}

/// Whether `data_addr` (HOST:PORT) is on this host: a loopback address, or
/// one of this host's interfaces. Co-located nodes are reached over shared
/// memory.
fn on_this_host(data_addr: &str) -> bool {
    let Ok(sa) = data_addr.parse::<std::net::SocketAddr>() else {
        return false;
    };
    let ip = sa.ip();
    ip.is_loopback() || (!ip.is_unspecified() && local_addresses().contains(&ip))
}

/// This host's interface addresses (getifaddrs).
fn local_addresses() -> Vec<std::net::IpAddr> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below, once.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*cur };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: ifa_addr points at a sockaddr of the family it names.
            match i32::from(unsafe { (*ifa.ifa_addr).sa_family }) {
                libc::AF_INET => {
                    let a = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                    out.push(std::net::Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)).into());
                }
                libc::AF_INET6 => {
                    let a = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                    out.push(std::net::Ipv6Addr::from(a.sin6_addr.s6_addr).into());
                }
                _ => {}
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: the list getifaddrs allocated, freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

impl Transport for UcxTransport {
    fn write<'a>(
        &'a self,
        dst: &'a RemoteRange,
        at: u64,
        data: &'a [u8],
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            if !self.write_one_sided(dst, at, &[data]).await? {
                self.tcp.write(dst, at, data).await?;
            }
            Ok(())
        })
    }

    /// One-sided from the parts themselves (into a mapped co-located
    /// segment, or joined for the engine); else over TCP, which sends
    /// from several buffers. No record goes with it: whether a write
    /// reaches the node's CPU is not known before its route is, so this
    /// transport never records writes (`records_writes`).
    fn write_parts<'a>(
        &'a self,
        dst: &'a RemoteRange,
        parts: &'a [&'a [u8]],
        _record: Option<&'a crate::frame::WriteRecord>,
    ) -> BoxFuture<'a, Result<Option<[u8; strata_common::grant::MAC_LEN]>>> {
        Box::pin(async move {
            match self.write_one_sided(dst, 0, parts).await? {
                true => Ok(None),
                false => self.tcp.write_parts(dst, parts, None).await,
            }
        })
    }

    /// The one-sided writes all at once; those that go over TCP as one
    /// batch per node.
    fn write_many_parts<'a>(
        &'a self,
        items: Vec<WriteItem<'a>>,
    ) -> BoxFuture<'a, Vec<Result<Option<[u8; strata_common::grant::MAC_LEN]>>>> {
        Box::pin(async move {
            let mut tries = Vec::with_capacity(items.len());
            for w in &items {
                tries.push(self.write_one_sided(w.dst, 0, w.parts));
            }
            let tried = crate::writes_in_order(tries).await;
            let mut out: Vec<Option<Result<Option<[u8; strata_common::grant::MAC_LEN]>>>> =
                Vec::with_capacity(items.len());
            let mut tcp_idx = Vec::new();
            let mut tcp_items = Vec::new();
            for (i, (w, t)) in items.into_iter().zip(tried).enumerate() {
                match t {
                    Ok(true) => out.push(Some(Ok(None))),
                    Err(e) => out.push(Some(Err(e))),
                    Ok(false) => {
                        out.push(None);
                        tcp_idx.push(i);
                        tcp_items.push(WriteItem { record: None, ..w });
                    }
                }
            }
            if !tcp_items.is_empty() {
                let done = self.tcp.write_many_parts(tcp_items).await;
                for (i, r) in tcp_idx.into_iter().zip(done) {
                    out[i] = Some(r);
                }
            }
            out.into_iter()
                .map(|r| r.unwrap_or_else(|| Err(Error::internal("batch write lost an item"))))
                .collect()
        })
    }

    fn read<'a>(
        &'a self,
        src: &'a RemoteRange,
        at: u64,
        buf: &'a mut [u8],
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move { self.read_in(src, at, buf, false).await.map(|_| ()) })
    }

    fn read_crc32c<'a>(
        &'a self,
        src: &'a RemoteRange,
        at: u64,
        buf: &'a mut [u8],
    ) -> BoxFuture<'a, Result<u32>> {
        Box::pin(self.read_in(src, at, buf, true))
    }

    fn read_many<'a>(
        &'a self,
        items: Vec<(&'a RemoteRange, &'a mut [u8])>,
    ) -> BoxFuture<'a, Vec<Result<u32>>> {
        Box::pin(async move {
            // Ranges without a route go to TCP as one batch per node; the
            // rest are read one-sided, all at once.
            let denied = self.denied();
            let (ucx, tcp): (Vec<_>, Vec<_>) = items
                .into_iter()
                .enumerate()
                .partition(|(_, (r, _))| (r.ucx_route != 0 && !denied) || self.stageable(r));
            // Routes this batch lacks, in one request.
            let missing: Vec<&RemoteRange> = ucx
                .iter()
                .map(|(_, (r, _))| *r)
                .filter(|r| r.ucx_route != 0 && self.cached(r).is_none())
                .collect();
            if !missing.is_empty() {
                self.fetch_missing(&missing).await;
            }
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

    /// Shares the engines, routes and counters; its TCP connections (for
    /// nodes without UCX, and fallbacks) are its own.
    fn sibling(&self) -> Option<Arc<dyn Transport>> {
        Some(Arc::new(UcxTransport {
            shared: self.shared.clone(),
            tcp: Arc::new(self.tcp.fresh()),
            own_thread: true,
        }))
    }

    /// Every read is: over TCP the node's fences check it, and one-sided
    /// reads check the revocations the node publishes (nodes that publish
    /// none are read over TCP).
    fn refuses_revoked(&self, _r: &RemoteRange) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn copies_and_checksums_in_one_pass() {
        let from: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let mut to = vec![0u8; from.len()];
        assert_eq!(super::copy_crc(&from, &mut to, true), crc32c::crc32c(&from));
        assert_eq!(to, from);
        let mut to = vec![0u8; 10];
        assert_eq!(super::copy_crc(&from[..10], &mut to, false), 0);
        assert_eq!(to, from[..10]);
    }

    #[test]
    fn shared_memory_follows_the_transport_list() {
        assert!(super::wants_shared_memory(Some("sm,self")));
        assert!(super::wants_shared_memory(Some("rc,cma,self")));
        assert!(super::wants_shared_memory(Some("all")));
        assert!(!super::wants_shared_memory(Some("tcp")));
        assert!(!super::wants_shared_memory(Some("rc,self")));
        // "Everything but": shared memory unless it is the exception.
        assert!(super::wants_shared_memory(Some("^ib")));
        assert!(!super::wants_shared_memory(Some("^sm,ib")));
    }

    #[test]
    fn co_located_nodes_are_recognised() {
        assert!(super::on_this_host("127.0.0.1:7500"));
        assert!(super::on_this_host("[::1]:7500"));
        // TEST-NET-1 is nobody's address here; a name is not an address;
        // the wildcard is no host.
        assert!(!super::on_this_host("192.0.2.1:7500"));
        assert!(!super::on_this_host("0.0.0.0:7500"));
        // Every interface address of this host is.
        let mine = super::local_addresses();
        assert!(mine.iter().any(|ip| ip.is_loopback()), "{mine:?}");
        for ip in mine {
            assert!(super::on_this_host(
                &std::net::SocketAddr::new(ip, 7500).to_string()
            ));
        }
        assert!(!super::on_this_host("node-a:7500"));
    }
}
