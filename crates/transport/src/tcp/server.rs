use super::write_all_vectored;
use crate::frame::{Op, Request, Response, FLAG_HELD, MAX_EXT_LEN, MAX_READV_ITEMS, REQ_LEN};
use crate::region::{Chunk, ChunkStream, DataRegion, ReadSource};
use prometheus::IntCounter;
use std::sync::Arc;
use std::time::Duration;
use strata_common::grant::MAC_LEN;
use strata_common::time::unix_ms;
use strata_common::{Code, Error};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// A rejected write's payload up to this size is drained so the connection
/// survives; larger ones close it.
const MAX_DRAIN: u64 = 64 << 20;

/// What one data-plane server tolerates from its peers. A peer that stays
/// within these limits is served as if they did not exist.
#[derive(Debug, Clone)]
pub struct ServerLimits {
    /// Connections at once, all peers together.
    pub max_connections: usize,
    /// Connections at once from one IP address.
    pub max_per_peer: usize,
    /// Connections that have not proved a grant yet (strangers), all peers
    /// together. A new one past it cuts off the oldest stranger instead of
    /// being refused: a real reader proves its grant with its first request,
    /// within milliseconds, so strangers from any number of addresses can
    /// never keep a reader (or the master's takeover ping) out, nor hold
    /// more than this many of the `max_connections` slots.
    pub max_strangers: usize,
    /// A connection must present a valid grant within this time (pings
    /// aside); until then it is a stranger.
    pub first_grant_timeout: Duration,
    /// A connection that proved a grant may idle this long between requests.
    pub idle_timeout: Duration,
    /// Any single payload read or response write that does not complete
    /// within this time cuts the connection off, releasing its staging and
    /// reader counts (e.g. a client that never reads its socket).
    pub io_timeout: Duration,
    /// Requests refused for their grant before the connection is cut off.
    pub max_rejections: u32,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            max_connections: 4096,
            max_per_peer: 256,
            max_strangers: 512,
            first_grant_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(120),
            io_timeout: Duration::from_secs(30),
            max_rejections: 32,
        }
    }
}

tokio::task_local! {
    /// The address of the peer whose request this task serves.
    static PEER: std::net::IpAddr;
}

/// The address of the data-plane peer whose request is being served, inside
/// a region's `read`, `write_target` or `stage` and the streams they return
/// (`None` outside a connection): how a region shares what it holds out
/// between peers (the SSD agent's staging arena).
pub fn current_peer() -> Option<std::net::IpAddr> {
    PEER.try_with(|p| *p).ok()
}

/// Connections per peer address; the guard gives the slot back.
#[derive(Default)]
struct PeerSlots(parking_lot::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>);

struct PeerSlot(Arc<PeerSlots>, std::net::IpAddr);

impl PeerSlots {
    fn take(self: &Arc<Self>, ip: std::net::IpAddr, max: usize) -> Option<PeerSlot> {
        let mut g = self.0.lock();
        let n = g.entry(ip).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(PeerSlot(self.clone(), ip))
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut g = (self.0).0.lock();
        if let Some(n) = g.get_mut(&self.1) {
            *n -= 1;
            if *n == 0 {
                g.remove(&self.1);
            }
        }
    }
}

/// The connections that have not proved a grant, oldest first; each holds
/// a token that cuts it off when newer strangers push it out.
struct Strangers {
    max: usize,
    queue: parking_lot::Mutex<(u64, std::collections::BTreeMap<u64, CancellationToken>)>,
}

/// A stranger's place in [`Strangers`]; leaving it (a proved grant, or the
/// connection's end) gives the place back.
struct Stranger {
    all: Arc<Strangers>,
    id: u64,
    cut: CancellationToken,
}

impl Strangers {
    /// Admits a new stranger, cutting off the oldest ones past the cap;
    /// returns how many were cut off.
    fn admit(self: &Arc<Self>) -> (Stranger, u64) {
        let mut g = self.queue.lock();
        let mut evicted = 0;
        while g.1.len() >= self.max.max(1) {
            match g.1.pop_first() {
                Some((_, cut)) => {
                    cut.cancel();
                    evicted += 1;
                }
                None => break,
            }
        }
        g.0 += 1;
        let (id, cut) = (g.0, CancellationToken::new());
        g.1.insert(id, cut.clone());
        let me = Stranger {
            all: self.clone(),
            id,
            cut,
        };
        (me, evicted)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.queue.lock().1.len()
    }
}

impl Drop for Stranger {
    fn drop(&mut self) {
        self.all.queue.lock().1.remove(&self.id);
    }
}

fn timed_out() -> std::io::Error {
    std::io::Error::from(std::io::ErrorKind::TimedOut)
}

/// Bounds one I/O step of a connection.
async fn within<T>(
    d: Duration,
    f: impl std::future::Future<Output = std::io::Result<T>>,
) -> std::io::Result<T> {
    tokio::time::timeout(d, f).await.map_err(|_| timed_out())?
}

/// Counters the server bumps; the owning service registers them.
#[derive(Clone)]
pub struct ServerMetrics {
    pub requests: IntCounter,
    pub read_bytes: IntCounter,
    pub written_bytes: IntCounter,
    pub rejected: IntCounter,
    /// Connections refused at accept (total or per-peer limit).
    pub refused_connections: IntCounter,
    /// Connections cut off: no grant in time, stalled I/O, too many refusals.
    pub cut_off: IntCounter,
}

/// Serves the data plane on `listener` with default limits.
pub async fn serve(
    listener: TcpListener,
    table: Arc<dyn DataRegion>,
    metrics: ServerMetrics,
    shutdown: CancellationToken,
) {
    serve_with(listener, table, metrics, ServerLimits::default(), shutdown).await
}

/// Serves the data plane on `listener` until `shutdown`, then waits for
/// in-flight connections to finish their current request.
pub async fn serve_with(
    listener: TcpListener,
    table: Arc<dyn DataRegion>,
    metrics: ServerMetrics,
    limits: ServerLimits,
    shutdown: CancellationToken,
) {
    let tracker = TaskTracker::new();
    let permits = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    let peers = Arc::new(PeerSlots::default());
    let strangers = Arc::new(Strangers {
        max: limits.max_strangers,
        queue: Default::default(),
    });
    let limits = Arc::new(limits);
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            a = listener.accept() => a,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "data-plane accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            metrics.refused_connections.inc();
            tracing::warn!(%peer, "too many data-plane connections; refusing");
            continue;
        };
        let Some(slot) = peers.take(peer.ip(), limits.max_per_peer) else {
            metrics.refused_connections.inc();
            tracing::debug!(%peer, "too many data-plane connections from this peer; refusing");
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (stranger, evicted) = strangers.admit();
        if evicted > 0 {
            tracing::debug!(%peer, evicted, "too many connections without a grant; cut off the oldest");
        }
        let (table, metrics, shutdown, limits) = (
            table.clone(),
            metrics.clone(),
            shutdown.clone(),
            limits.clone(),
        );
        tracker.spawn(async move {
            let cut = stranger.cut.clone();
            let served = connection(
                stream,
                table.as_ref(),
                &metrics,
                &limits,
                stranger,
                &shutdown,
            );
            // A stranger pushed out by newer ones holds no lease, staging or
            // write yet (each needs a proven grant first, which takes it out
            // of the queue), so it is dropped mid-request; checked first, so
            // a cut stranger is never polled again.
            let r = tokio::select! {
                biased;
                _ = cut.cancelled() => Err(timed_out()),
                r = PEER.scope(peer.ip(), served) => r,
            };
            if let Err(e) = r {
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::TimedOut | std::io::ErrorKind::PermissionDenied
                ) {
                    metrics.cut_off.inc();
                }
                tracing::debug!(%peer, error = %e, "data-plane connection closed");
            }
            drop((permit, slot));
        });
    }
    tracker.close();
    tracker.wait().await;
}

/// A connection's standing: has it proved a grant, how many refusals.
struct Peer<'a> {
    limits: &'a ServerLimits,
    granted: bool,
    /// Its place among the strangers, until it proves a grant.
    stranger: Option<Stranger>,
    rejections: u32,
    /// A stranger must prove a grant by then (pings do not extend it).
    first_grant_by: tokio::time::Instant,
    /// Leases this connection asked for with `FLAG_HELD`.
    held: Held<'a>,
}

/// Most leases one connection holds for its reader; past it the oldest
/// stops being tied to the connection (its TTL still reclaims it). A reader
/// holds one or two at a time.
const MAX_HELD: usize = 64;

/// The `FLAG_HELD` leases a connection lent and was not given back on it:
/// taken back when the reader closes the connection. Only then: a
/// connection this side ends (shutdown, a cut-off peer, a broken or reset
/// socket, which a middlebox may cause while the reader still reads over
/// another path) leaves its leases to their TTL, so a live reader never
/// has its slot refilled under it.
struct Held<'a> {
    table: &'a dyn DataRegion,
    leases: Vec<(u64, u64)>,
}

impl Held<'_> {
    fn hold(&mut self, lease: u64, token: u64) {
        if self.leases.len() >= MAX_HELD {
            self.leases.remove(0);
        }
        self.leases.push((lease, token));
    }

    fn given_back(&mut self, lease: u64) {
        self.leases.retain(|(l, _)| *l != lease);
    }
}

impl Held<'_> {
    /// The reader closed the connection: it reads none of them any more.
    fn reader_closed(&mut self) {
        for (lease, token) in self.leases.drain(..) {
            // False when given back on another connection or reaped.
            self.table.reclaim_held(lease, token);
        }
    }
}

impl Peer<'_> {
    /// Counts a request refused for its grant; too many cut the peer off.
    fn refused(&mut self) -> std::io::Result<()> {
        self.rejections += 1;
        if self.rejections > self.limits.max_rejections {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                "too many refused requests",
            ));
        }
        Ok(())
    }
    /// Notes how a read was authorised.
    fn note(&mut self, p: &Prepared) -> std::io::Result<()> {
        match p {
            Prepared::Failed(e)
                if matches!(e.code, Code::PermissionDenied | Code::InvalidArgument) =>
            {
                self.refused()
            }
            Prepared::Failed(_) => Ok(()),
            _ => {
                self.grant();
                Ok(())
            }
        }
    }
    /// The connection proved a grant: no longer a stranger.
    fn grant(&mut self) {
        self.granted = true;
        self.stranger = None;
    }
    /// When an I/O step that began now must end: `io` later, and for a
    /// stranger no later than its first-grant deadline (a batch read's
    /// items arrive under it too).
    fn io_by(&self, io: Duration) -> tokio::time::Instant {
        let by = tokio::time::Instant::now() + io;
        match self.granted {
            true => by,
            false => by.min(self.first_grant_by),
        }
    }
    fn deadline(&self) -> tokio::time::Instant {
        if self.granted {
            tokio::time::Instant::now() + self.limits.idle_timeout
        } else {
            self.first_grant_by
        }
    }
}

async fn respond_ok(s: &mut TcpStream, req_id: u64) -> std::io::Result<()> {
    let h = Response {
        status: Code::Ok,
        req_id,
        length: 0,
    }
    .encode();
    s.write_all(&h).await
}

/// Answers a write: OK, with the node's receipt as its body when the write
/// carried a record the region kept, or the region's refusal of the record.
async fn respond_written(
    s: &mut TcpStream,
    req_id: u64,
    receipt: Option<strata_common::Result<[u8; MAC_LEN]>>,
) -> std::io::Result<()> {
    let receipt = match receipt {
        None => return respond_ok(s, req_id).await,
        Some(Err(e)) => return respond_err(s, req_id, &e).await,
        Some(Ok(r)) => r,
    };
    let h = Response {
        status: Code::Ok,
        req_id,
        length: MAC_LEN as u64,
    }
    .encode();
    write_all_vectored(s, &h, &receipt).await
}

async fn respond_err(s: &mut TcpStream, req_id: u64, e: &Error) -> std::io::Result<()> {
    let msg = e.message.as_bytes();
    let h = Response {
        status: e.code,
        req_id,
        length: msg.len() as u64,
    }
    .encode();
    write_all_vectored(s, &h, msg).await
}

/// Whether a connection goes on after a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Next,
    Close,
}

/// A request as read from the stream.
enum Incoming {
    Ok(Request),
    /// Refused, but framed correctly: the stream can go on.
    Refused(Error),
    /// Not our framing (magic, version, extension length): nothing after
    /// it can be trusted.
    Broken(Error),
}

/// Reads the extension block (if any) after a request header.
async fn read_request(
    s: &mut TcpStream,
    hdr: &[u8; REQ_LEN],
    by: tokio::time::Instant,
) -> std::io::Result<Incoming> {
    let (req, ext) = match Request::decode(hdr) {
        Ok(r) => r,
        Err(e) => return Ok(Incoming::Broken(e)),
    };
    let mut block = [0u8; MAX_EXT_LEN];
    let block = &mut block[..ext];
    if ext > 0 {
        tokio::time::timeout_at(by, s.read_exact(block))
            .await
            .map_err(|_| timed_out())??;
    }
    Ok(match req {
        Ok(mut r) => match r.read_extensions(block) {
            Ok(()) => Incoming::Ok(r),
            Err(e) => Incoming::Refused(e),
        },
        Err(e) => Incoming::Refused(e),
    })
}

/// The span of a request that came with a trace context; untraced requests
/// get none (no cost per request when tracing is off). It is created
/// unparented: [`continue_trace`] joins it to the caller's trace once the
/// request proved a grant, so strangers cannot fill the span export queue
/// (an unparented span is never sampled: services start no traces).
fn request_span(req: &Request) -> Option<tracing::Span> {
    req.trace?;
    let name = match req.op {
        Op::Write => "data.write",
        Op::Read => "data.read",
        Op::ReadV => "data.readv",
        Op::Stage => "data.stage",
        Op::Ping | Op::GiveBack => return None,
    };
    Some(tracing::info_span!(
        "data",
        otel.name = name,
        otel.kind = "server",
        segment = req.grant.segment_id,
        offset = req.offset,
        length = req.length,
    ))
}

/// Joins `span` to the trace `req` came with (before it is first entered).
fn continue_trace(span: &Option<tracing::Span>, req: &Request) {
    if let (Some(span), Some(parent)) = (span, req.trace) {
        parent.adopt(span);
    }
}

/// Runs `f` inside `span`, if any.
async fn traced<F: std::future::Future>(span: &Option<tracing::Span>, f: F) -> F::Output {
    match span {
        Some(span) => tracing::Instrument::instrument(f, span.clone()).await,
        None => f.await,
    }
}

async fn connection(
    mut s: TcpStream,
    table: &dyn DataRegion,
    m: &ServerMetrics,
    limits: &ServerLimits,
    stranger: Stranger,
    shutdown: &CancellationToken,
) -> std::io::Result<()> {
    let mut hdr = [0u8; REQ_LEN];
    let io = limits.io_timeout;
    let mut peer = Peer {
        limits,
        granted: false,
        stranger: Some(stranger),
        rejections: 0,
        first_grant_by: tokio::time::Instant::now() + limits.first_grant_timeout,
        held: Held {
            table,
            leases: Vec::new(),
        },
    };
    loop {
        let read = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            r = tokio::time::timeout_at(peer.deadline(), s.read_exact(&mut hdr)) => r,
        };
        match read {
            // Idle, or a stranger that never presented a grant.
            Err(_) if peer.granted => return Ok(()),
            Err(_) => return Err(timed_out()),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                peer.held.reader_closed();
                return Ok(());
            }
            Ok(Err(e)) => return Err(e),
            Ok(Ok(_)) => {}
        }
        m.requests.inc();
        let req = match read_request(&mut s, &hdr, peer.io_by(io)).await? {
            Incoming::Ok(r) => r,
            Incoming::Refused(e) | Incoming::Broken(e) => {
                // Not our protocol: say why once, then hang up.
                m.rejected.inc();
                within(io, respond_err(&mut s, 0, &e)).await?;
                within(io, s.shutdown()).await?;
                return Ok(());
            }
        };
        if serve_request(&mut s, &req, table, m, &mut peer).await? == Flow::Close {
            return Ok(());
        }
    }
}

/// Whether `req` carries a live grant of this region's master (signed, not
/// expired; range and permission are checked when it is served): what
/// makes a connection a reader rather than a stranger.
fn vouched(table: &dyn DataRegion, req: &Request) -> bool {
    req.grant.expires_unix_ms > unix_ms() && table.signed(&req.grant, &req.mac)
}

/// Serves one request whose header has been read.
async fn serve_request(
    s: &mut TcpStream,
    req: &Request,
    table: &dyn DataRegion,
    m: &ServerMetrics,
    peer: &mut Peer<'_>,
) -> std::io::Result<Flow> {
    let io = peer.limits.io_timeout;
    let span = request_span(req);
    match req.op {
        Op::Ping => {
            let who = table.ping_payload();
            let h = Response {
                status: Code::Ok,
                req_id: req.req_id,
                length: who.len() as u64,
            }
            .encode();
            within(io, write_all_vectored(s, &h, &who)).await?;
        }
        Op::Write => {
            let auth = table.write_target(req, unix_ms());
            match auth {
                Ok(target) => {
                    peer.grant();
                    continue_trace(&span, req);
                    // SAFETY: the grant verified above names exactly this
                    // range; the master never grants overlapping writes of
                    // live allocations, and the segment's fences refuse
                    // grants of freed ones (`fence.rs`) while this write
                    // holds its lease.
                    let dst = match unsafe { target.segment.slice_mut(req.offset, req.length) } {
                        Ok(d) => d,
                        Err(e) => {
                            within(io, respond_err(s, req.req_id, &e)).await?;
                            return Ok(Flow::Close);
                        }
                    };
                    traced(&span, within(io, s.read_exact(dst))).await?;
                    // Recorded while the write still holds its range, so no
                    // free of it slips in unseen (`record_put`).
                    let receipt = req.record.as_ref().and_then(|r| table.record_put(req, r));
                    drop(target);
                    m.written_bytes.inc_by(req.length);
                    if let Some(Err(e)) = &receipt {
                        m.rejected.inc();
                        // A record that is not the master's is a bad grant.
                        if e.code == Code::PermissionDenied {
                            peer.refused()?;
                        }
                    }
                    let answered = respond_written(s, req.req_id, receipt);
                    traced(&span, within(io, answered)).await?;
                }
                Err(e) => {
                    m.rejected.inc();
                    // Only bad grants count against the peer: a fence's
                    // "retry shortly" or a just-evicted range does not.
                    if matches!(e.code, Code::PermissionDenied | Code::InvalidArgument) {
                        peer.refused()?;
                    }
                    if req.length > MAX_DRAIN {
                        within(io, respond_err(s, req.req_id, &e)).await?;
                        return Ok(Flow::Close);
                    }
                    let mut sink = (&mut *s).take(req.length);
                    let drained =
                        within(io, tokio::io::copy(&mut sink, &mut tokio::io::sink())).await?;
                    if drained != req.length {
                        return Ok(Flow::Close);
                    }
                    within(io, respond_err(s, req.req_id, &e)).await?;
                }
            }
        }
        Op::Stage => {
            if !peer.granted && vouched(table, req) {
                peer.grant();
            }
            let staged = table.stage(req, unix_ms()).await;
            match staged {
                Ok(st) => {
                    peer.grant();
                    continue_trace(&span, req);
                    let body = st.encode();
                    let h = Response {
                        status: Code::Ok,
                        req_id: req.req_id,
                        length: body.len() as u64,
                    }
                    .encode();
                    let sent = traced(&span, within(io, write_all_vectored(s, &h, &body))).await;
                    if sent.is_err() {
                        // The reader never learns of the lease: not lent.
                        table.give_back(st.lease, st.token);
                    } else if req.flags & FLAG_HELD != 0 {
                        peer.held.hold(st.lease, st.token);
                    }
                    sent?;
                }
                Err(e) => {
                    m.rejected.inc();
                    if matches!(e.code, Code::PermissionDenied | Code::InvalidArgument) {
                        peer.refused()?;
                    }
                    within(io, respond_err(s, req.req_id, &e)).await?;
                }
            }
        }
        Op::GiveBack => {
            // The lease and its token stand in for a grant: only the
            // connection that staged learned the token.
            if table.give_back(req.offset, req.length) {
                peer.held.given_back(req.offset);
                peer.grant();
                within(io, respond_ok(s, req.req_id)).await?;
            } else {
                m.rejected.inc();
                peer.refused()?;
                let e = Error::not_found(
                    "no such staging lease: given back already, reclaimed after its TTL, or a wrong token",
                );
                within(io, respond_err(s, req.req_id, &e)).await?;
            }
        }
        Op::Read => {
            // Proven before the read waits for anything (SSD staging):
            // a reader is never pushed out as a stranger while it waits.
            if !peer.granted && vouched(table, req) {
                peer.grant();
            }
            let p = prepare(table, req, m).await;
            peer.note(&p)?;
            if !matches!(p, Prepared::Failed(_)) {
                continue_trace(&span, req);
            }
            traced(&span, send(s, req, m, p, io)).await?
        }
        Op::ReadV => {
            if req.length > MAX_READV_ITEMS {
                m.rejected.inc();
                let e = Error::invalid(format!(
                    "batch read of {} items exceeds the limit of {MAX_READV_ITEMS}",
                    req.length
                ));
                within(io, respond_err(s, req.req_id, &e)).await?;
                return Ok(Flow::Close);
            }
            // Grown as items come: what a peer declares costs nothing until
            // it sends it.
            let mut items = Vec::new();
            let mut hdr = [0u8; REQ_LEN];
            for _ in 0..req.length {
                // A stranger's items arrive under its first-grant deadline.
                let by = peer.io_by(io);
                tokio::time::timeout_at(by, s.read_exact(&mut hdr))
                    .await
                    .map_err(|_| timed_out())??;
                let mut item = match read_request(s, &hdr, by).await? {
                    Incoming::Ok(r) => Ok(r),
                    // One bad item fails alone...
                    Incoming::Refused(e) => Err(e),
                    // ...unless the items after it cannot be found.
                    Incoming::Broken(e) => {
                        m.rejected.inc();
                        within(io, respond_err(s, req.req_id, &e)).await?;
                        return Ok(Flow::Close);
                    }
                };
                // Until one item carries a grant this region's master signed,
                // each is checked as it arrives, and each that does not
                // counts against the stranger (too many cut it off).
                let mut refused = false;
                if !peer.granted {
                    match &item {
                        Ok(r) if vouched(table, r) => peer.grant(),
                        _ => {
                            peer.refused()?;
                            refused = true;
                            if item.is_ok() {
                                item = Err(Error::new(
                                    Code::PermissionDenied,
                                    "the item's grant is not a live grant of this node's master",
                                ));
                            }
                        }
                    }
                }
                items.push((item, refused));
            }
            let h = Response {
                status: Code::Ok,
                req_id: req.req_id,
                length: req.length,
            }
            .encode();
            within(io, s.write_all(&h)).await?;
            let prep = |item: &'_ Result<Request, Error>| {
                let item = item.as_ref().ok().filter(|r| r.op == Op::Read).cloned();
                async move {
                    match item {
                        Some(r) => Some(prepare(table, &r, m).await),
                        None => None,
                    }
                }
            };
            let mut next = match items.first() {
                Some((item, _)) => prep(item).await,
                None => None,
            };
            if matches!(next, Some(Prepared::Ready(_) | Prepared::Streaming(..))) {
                continue_trace(&span, req);
            }
            let replies = async {
                for (i, (item, refused_on_arrival)) in items.iter().enumerate() {
                    let refused_on_arrival = *refused_on_arrival;
                    let prepared = next.take();
                    // Read the next item while this one is sent, but only
                    // when this one needs no more staging: a connection never
                    // holds staged pieces while it waits for more, so readers
                    // sharing the arena cannot deadlock.
                    let overlap = prepared.as_ref().is_some_and(|p| p.complete(item));
                    match &prepared {
                        Some(p) => peer.note(p)?,
                        // Counted once: as it arrived, if it was then.
                        None if refused_on_arrival => {}
                        None => peer.refused()?,
                    }
                    let reply = async {
                        match (item, prepared) {
                            (Ok(r), Some(p)) => send(s, r, m, p, io).await,
                            (Ok(r), None) => {
                                m.rejected.inc();
                                let e = Error::invalid("a batch read may only hold reads");
                                within(io, respond_err(s, r.req_id, &e)).await
                            }
                            (Err(e), _) => {
                                m.rejected.inc();
                                within(io, respond_err(s, 0, e)).await
                            }
                        }
                    };
                    let upcoming = items.get(i + 1).map(|(u, _)| u);
                    match upcoming {
                        Some(u) if overlap => {
                            let (sent, p) = tokio::join!(reply, prep(u));
                            sent?;
                            next = p;
                        }
                        Some(u) => {
                            reply.await?;
                            next = prep(u).await;
                        }
                        None => reply.await?,
                    }
                }
                Ok::<(), std::io::Error>(())
            };
            traced(&span, replies).await?;
        }
    }
    Ok(Flow::Next)
}

/// A read resolved up to its first bytes: anything that fails before the
/// first byte is sent becomes a clean error response.
enum Prepared {
    Failed(Error),
    Ready(ReadSource),
    Streaming(Box<dyn ChunkStream>, Option<Chunk>),
}

impl Prepared {
    /// Holds every byte of `item` already (sending it stages nothing more).
    fn complete(&self, item: &Result<Request, Error>) -> bool {
        match (self, item) {
            (Prepared::Failed(_) | Prepared::Ready(_), _) => true,
            (Prepared::Streaming(_, first), Ok(r)) => {
                first.as_ref().map_or(0, |c| c.data.len() as u64) == r.length
            }
            (Prepared::Streaming(..), Err(_)) => false,
        }
    }
}

async fn prepare(table: &dyn DataRegion, req: &Request, m: &ServerMetrics) -> Prepared {
    match table.read(req, unix_ms()).await {
        Err(e) => {
            m.rejected.inc();
            Prepared::Failed(e)
        }
        Ok(ReadSource::Stream(mut stream)) => match stream.next_chunk().await {
            Ok(first) => Prepared::Streaming(stream, first),
            Err(e) => Prepared::Failed(e),
        },
        Ok(src) => Prepared::Ready(src),
    }
}

/// Sends a prepared read. A failure mid-stream (a later piece could not be
/// read) closes the connection, so the reader never takes a short or
/// patched body for the object.
async fn send(
    s: &mut TcpStream,
    req: &Request,
    m: &ServerMetrics,
    p: Prepared,
    io: Duration,
) -> std::io::Result<()> {
    let header = Response {
        status: Code::Ok,
        req_id: req.req_id,
        length: req.length,
    }
    .encode();
    let (mut stream, mut next) = match p {
        Prepared::Failed(e) => return within(io, respond_err(s, req.req_id, &e)).await,
        Prepared::Ready(src) => {
            let data = match &src {
                ReadSource::Segment(seg) => seg.slice(req.offset, req.length),
                ReadSource::Owned(v, _) if v.len() as u64 == req.length => Ok(v.as_slice()),
                _ => Err(Error::internal("read returned a wrong length")),
            };
            return match data {
                Ok(d) => {
                    within(io, write_all_vectored(s, &header, d)).await?;
                    m.read_bytes.inc_by(req.length);
                    Ok(())
                }
                Err(e) => within(io, respond_err(s, req.req_id, &e)).await,
            };
        }
        Prepared::Streaming(stream, first) => (stream, first),
    };
    let mut sent = 0u64;
    let mut first = true;
    while let Some(chunk) = next.take() {
        sent += chunk.data.len() as u64;
        if sent > req.length {
            return Err(std::io::Error::other("read stream overran its length"));
        }
        // A reader that stops reading its socket is cut off here, which
        // drops the stream and with it its staging and bucket reader count.
        if first {
            within(io, write_all_vectored(s, &header, &chunk.data)).await?;
            first = false;
        } else {
            within(io, s.write_all(&chunk.data)).await?;
        }
        m.read_bytes.inc_by(chunk.data.len() as u64);
        // The piece's staging is released here, before the next is staged.
        let Chunk { data, guard } = chunk;
        drop(guard);
        stream.recycle(data);
        next = stream
            .next_chunk()
            .await
            .map_err(|e| std::io::Error::other(e.message))?;
    }
    if sent != req.length {
        return Err(std::io::Error::other("read stream ended short"));
    }
    if first {
        within(io, s.write_all(&header)).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_strangers_push_out_the_oldest_and_a_grant_leaves_the_queue() {
        let all = Arc::new(Strangers {
            max: 3,
            queue: Default::default(),
        });
        let first: Vec<Stranger> = (0..3).map(|_| all.admit().0).collect();
        assert_eq!(all.len(), 3);
        assert!(first.iter().all(|s| !s.cut.is_cancelled()));
        // Past the cap: the oldest is cut off, the others stay.
        let (fourth, evicted) = all.admit();
        assert_eq!(evicted, 1);
        let cut: Vec<bool> = first.iter().map(|s| s.cut.is_cancelled()).collect();
        assert_eq!(cut, [true, false, false]);
        assert_eq!(all.len(), 3);
        // One that proves a grant (or closes) leaves: room without a cut.
        let mut first = first.into_iter();
        drop(first.next());
        drop(first.next());
        assert_eq!(all.len(), 2);
        let (_fifth, evicted) = all.admit();
        assert_eq!(evicted, 0);
        assert!(first.all(|s| !s.cut.is_cancelled()) && !fourth.cut.is_cancelled());
    }
}
