use super::write_all_gather;
use crate::frame::{
    Op, Request, Response, Staged, WriteRecord, FLAG_HELD, MAX_READV_ITEMS, MAX_STAGED_LEN,
    RESP_LEN,
};
use crate::{check_sub_range, parts, RemoteRange, Transport, Verified, WriteItem};
use futures::future::BoxFuture;
use futures::{StreamExt, TryStreamExt};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use strata_common::grant::MAC_LEN;
use strata_common::telemetry::TraceParent;
use strata_common::{Code, Error, Result};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tracing::Instrument;

/// Tuning of the TCP data-plane client.
#[derive(Debug, Clone)]
pub struct TcpTransportConfig {
    /// Transfers larger than this are split into chunks...
    pub chunk_bytes: usize,
    /// ...that move over up to this many connections at once.
    pub parallel: usize,
    /// Idle connections kept per node.
    pub max_idle_per_node: usize,
    pub connect_timeout: Duration,
    /// Bound on one request (header, payload, response).
    pub io_timeout: Duration,
}

impl Default for TcpTransportConfig {
    fn default() -> Self {
        TcpTransportConfig {
            chunk_bytes: 4 << 20,
            parallel: 4,
            max_idle_per_node: 64,
            connect_timeout: Duration::from_secs(3),
            io_timeout: Duration::from_secs(30),
        }
    }
}

/// Client side of the TCP data plane, with a connection pool per node.
pub struct TcpTransport {
    cfg: TcpTransportConfig,
    pools: Mutex<HashMap<String, Arc<Mutex<Vec<TcpStream>>>>>,
    next_id: AtomicU64,
}

impl TcpTransport {
    pub fn new(cfg: TcpTransportConfig) -> Self {
        TcpTransport {
            cfg,
            pools: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
        }
    }

    /// A transport of the same configuration with no connections yet (a
    /// sibling's: `Transport::sibling`, UCX's too).
    pub fn fresh(&self) -> TcpTransport {
        TcpTransport::new(self.cfg.clone())
    }

    fn pool(&self, addr: &str) -> Arc<Mutex<Vec<TcpStream>>> {
        self.pools
            .lock()
            .entry(addr.to_string())
            .or_default()
            .clone()
    }

    async fn connect(&self, addr: &str) -> Result<TcpStream> {
        let s = tokio::time::timeout(self.cfg.connect_timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| Error::new(Code::Timeout, format!("connecting to {addr} timed out")))?
            .map_err(|e| Error::unavailable(format!("cannot connect to store node {addr}: {e}")))?;
        let _ = s.set_nodelay(true);
        Ok(s)
    }

    /// Runs one request on a pooled connection. A connection goes back to the
    /// pool only after a complete exchange, so a stream is never reused in an
    /// unknown state.
    async fn request(&self, range: &RemoteRange, op: Op, at: u64, io: Io<'_>) -> Result<u32> {
        let pool = self.pool(&range.addr);
        let pooled = pool.lock().pop();
        let mut conn = match pooled {
            Some(c) => c,
            None => self.connect(&range.addr).await?,
        };
        let req = Request {
            op,
            req_id: self.next_id.fetch_add(1, Ordering::Relaxed),
            grant: range.scope,
            mac: range.mac,
            offset: range.scope.offset + at,
            length: io.len() as u64,
            flags: 0,
            trace: TraceParent::current(),
            record: match &io {
                Io::Recorded(_, r, _) => Some((*r).clone()),
                _ => None,
            },
        };
        let res = tokio::time::timeout(self.cfg.io_timeout, exchange(&mut conn, &req, io)).await;
        match res {
            Err(_) => Err(Error::new(
                Code::Timeout,
                format!("data-plane request to {} timed out", range.addr),
            )),
            Ok(Err(Exchange::Io(e))) => Err(Error::unavailable(format!(
                "data-plane connection to {} failed: {e}",
                range.addr
            ))),
            Ok(Err(Exchange::Remote(e))) => {
                self.give_back_conn(&pool, conn);
                Err(e)
            }
            Ok(Ok(crc)) => {
                self.give_back_conn(&pool, conn);
                Ok(crc)
            }
        }
    }

    fn give_back_conn(&self, pool: &Mutex<Vec<TcpStream>>, conn: TcpStream) {
        let mut p = pool.lock();
        if p.len() < self.cfg.max_idle_per_node {
            p.push(conn);
        }
    }
}

/// A batch's results in the caller's order: each slot filled, or an
/// internal error for one that was lost (never expected).
fn every_item<T>(out: Vec<Option<Result<T>>>, batch: &str) -> Vec<Result<T>> {
    out.into_iter()
        .map(|r| r.unwrap_or_else(|| Err(Error::internal(format!("{batch} lost an item")))))
        .collect()
}

/// One range of a batch read: its index in the caller's list, the range and
/// the buffer it lands in.
type BatchItem<'a> = (usize, &'a RemoteRange, Vec<&'a mut [u8]>);

/// One request's payload: the concatenation of its slices (an object's
/// parts, or one buffer).
enum Io<'a> {
    Out(Vec<&'a [u8]>),
    /// Read into the buffers; with `true`, checksum them as they stream in,
    /// and with a hasher, hash them with BLAKE3 as they land too.
    In(Vec<&'a mut [u8]>, bool, Option<&'a mut blake3::Hasher>),
    /// Write a put's bytes with its record; the node's receipt (if it keeps
    /// records) lands in the slot.
    Recorded(
        Vec<&'a [u8]>,
        &'a WriteRecord,
        &'a mut Option<[u8; MAC_LEN]>,
    ),
}

impl Io<'_> {
    fn len(&self) -> usize {
        match self {
            Io::Out(b) | Io::Recorded(b, ..) => parts::total_len(b),
            Io::In(b, ..) => parts::total_len(b),
        }
    }
}

enum Exchange {
    Io(std::io::Error),
    /// The node answered with an error; the connection is still in sync.
    Remote(Error),
}

impl From<std::io::Error> for Exchange {
    fn from(e: std::io::Error) -> Self {
        Exchange::Io(e)
    }
}

/// One request/response. Returns the crc32c of the bytes read when asked.
async fn exchange(s: &mut TcpStream, req: &Request, io: Io<'_>) -> Result<u32, Exchange> {
    let hdr = req.encode();
    match &io {
        Io::Out(data) | Io::Recorded(data, ..) => write_all_gather(s, &hdr, data).await?,
        Io::In(..) => s.write_all(&hdr).await?,
    }
    match io {
        Io::Out(_) => read_response(s, req, &mut [], false, None).await,
        Io::In(mut bufs, with_crc, hasher) => {
            read_response(s, req, &mut bufs, with_crc, hasher).await
        }
        Io::Recorded(_, _, receipt) => {
            *receipt = read_written(s, req, true).await?;
            Ok(0)
        }
    }
}

/// Reads the answer to a write: the node's receipt when the write carried
/// a record (`recorded`) and the node keeps records (a node that keeps
/// none answers with no body), else nothing.
async fn read_written<R: AsyncRead + Unpin>(
    s: &mut R,
    req: &Request,
    recorded: bool,
) -> Result<Option<[u8; MAC_LEN]>, Exchange> {
    let resp = read_head(s, req).await?;
    match resp.length {
        0 => Ok(None),
        n if recorded && n == MAC_LEN as u64 => {
            let mut mac = [0u8; MAC_LEN];
            s.read_exact(&mut mac).await?;
            Ok(Some(mac))
        }
        n => Err(Exchange::Io(std::io::Error::other(format!(
            "data-plane node answered a write with {n} bytes"
        )))),
    }
}

/// Reads a response header to `req`; an error answer (with its message)
/// is `Exchange::Remote`.
async fn read_head<R: AsyncRead + Unpin>(s: &mut R, req: &Request) -> Result<Response, Exchange> {
    let mut rh = [0u8; RESP_LEN];
    s.read_exact(&mut rh).await?;
    let resp = Response::decode(&rh).map_err(|e| Exchange::Io(std::io::Error::other(e)))?;
    if resp.req_id != req.req_id && resp.req_id != 0 {
        return Err(Exchange::Io(std::io::Error::other(
            "data-plane response for another request",
        )));
    }
    if resp.status != Code::Ok {
        let n = resp.length.min(64 << 10) as usize;
        let mut msg = vec![0u8; n];
        s.read_exact(&mut msg).await?;
        if resp.length as usize != n {
            return Err(Exchange::Io(std::io::Error::other(
                "oversized error message",
            )));
        }
        return Err(Exchange::Remote(Error::new(
            resp.status,
            format!("store node: {}", String::from_utf8_lossy(&msg)),
        )));
    }
    Ok(resp)
}

/// Reads one response to `req`: for a read, its bytes into `bufs` in order
/// (checksummed when asked, and hashed into `hasher` when given); for a
/// write (no buffers), nothing.
async fn read_response(
    s: &mut TcpStream,
    req: &Request,
    bufs: &mut [&mut [u8]],
    with_crc: bool,
    mut hasher: Option<&mut blake3::Hasher>,
) -> Result<u32, Exchange> {
    let resp = read_head(s, req).await?;
    let want = parts::total_len(bufs);
    if resp.length != want as u64 {
        return Err(Exchange::Io(std::io::Error::other(format!(
            "data-plane node returned {} bytes, expected {want}",
            resp.length,
        ))));
    }
    if bufs.len() > 1 {
        return Ok(read_vectored_exact(s, bufs, with_crc, hasher).await?);
    }
    // Checksum (and hash) each piece as it lands, while the sender keeps
    // filling the socket: the check costs almost no extra time.
    let mut crc = 0;
    for buf in bufs.iter_mut() {
        for piece in buf.chunks_mut(CRC_PIECE) {
            s.read_exact(piece).await?;
            if with_crc {
                crc = crc32c::crc32c_append(crc, piece);
            }
            if let Some(h) = hasher.as_deref_mut() {
                h.update(piece);
            }
        }
    }
    Ok(crc)
}

/// Fills `bufs` in order from `s` with vectored reads (one syscall takes
/// whatever arrived, across many small parts), checksumming what lands.
async fn read_vectored_exact(
    s: &mut TcpStream,
    bufs: &mut [&mut [u8]],
    with_crc: bool,
    mut hasher: Option<&mut blake3::Hasher>,
) -> std::io::Result<u32> {
    let mut crc = 0;
    // The next byte to fill: part `i`, offset `off`.
    let (mut i, mut off) = (0, 0);
    loop {
        while i < bufs.len() && off == bufs[i].len() {
            i += 1;
            off = 0;
        }
        if i == bufs.len() {
            return Ok(crc);
        }
        s.readable().await?;
        let got = {
            let (head, rest) = bufs[i..].split_first_mut().expect("a part left");
            let mut slices = Vec::with_capacity(rest.len().min(MAX_READ_SLICES) + 1);
            slices.push(std::io::IoSliceMut::new(&mut head[off..]));
            slices.extend(
                rest.iter_mut()
                    .take(MAX_READ_SLICES)
                    .map(|b| std::io::IoSliceMut::new(b)),
            );
            s.try_read_vectored(&mut slices)
        };
        let mut n = match got {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        };
        while n > 0 {
            let take = n.min(bufs[i].len() - off);
            if with_crc {
                crc = crc32c::crc32c_append(crc, &bufs[i][off..off + take]);
            }
            if let Some(h) = hasher.as_deref_mut() {
                h.update(&bufs[i][off..off + take]);
            }
            off += take;
            n -= take;
            if off == bufs[i].len() {
                i += 1;
                off = 0;
            }
        }
    }
}

/// Parts handed to one vectored read beyond the current one.
const MAX_READ_SLICES: usize = 63;

/// A lease from [`TcpTransport::stage_held`] and the connection it lives
/// on: dropped unreturned, the connection closes and the node takes the
/// lease back.
pub struct HeldLease {
    addr: String,
    conn: TcpStream,
    lease: u64,
    token: u64,
}

/// Bound on giving a lent piece back in the background.
const GIVE_BACK_TIMEOUT: Duration = Duration::from_secs(5);

/// Gives a lease back from a task of its own, bounded, when there is a
/// runtime to run it: off the reader's path, and from `Drop` too. A lease
/// never given back is reclaimed by the node after its TTL.
pub fn spawn_give_back(tcp: Arc<TcpTransport>, addr: String, lease: u64, token: u64) {
    spawn_bounded(
        async move { tcp.give_back(&addr, lease, token).await },
        "staging slot not given back; the node reclaims it after its TTL",
    );
}

/// Gives a held lease back on its connection from a task of its own,
/// bounded; with no runtime to run it, or past the bound, the connection
/// closes and the node takes the lease back itself.
pub fn spawn_give_back_held(tcp: Arc<TcpTransport>, held: HeldLease) {
    spawn_bounded(
        async move { tcp.give_back_held(held).await },
        "held staging slot not given back; its connection closed, which frees it",
    );
}

/// Runs a give-back on a task of its own for at most [`GIVE_BACK_TIMEOUT`]
/// (nothing without a runtime to run it), logging `missed` when it fails.
fn spawn_bounded(
    give_back: impl std::future::Future<Output = Result<()>> + Send + 'static,
    missed: &'static str,
) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    rt.spawn(async move {
        let r = tokio::time::timeout(GIVE_BACK_TIMEOUT, give_back).await;
        if !matches!(r, Ok(Ok(()))) {
            tracing::debug!("{missed}");
        }
    });
}

/// Bytes received between checksum updates on a verified read.
const CRC_PIECE: usize = 128 << 10;

impl TcpTransport {
    /// Asks the data-plane server at `addr` who it is (its ping payload).
    pub async fn ping(&self, addr: &str) -> Result<Vec<u8>> {
        let mut s = self.connect(addr).await?;
        let req = Request::ungranted(Op::Ping, self.next_id.fetch_add(1, Ordering::Relaxed), 0, 0);
        let exchange = async {
            s.write_all(&req.encode()).await?;
            let mut rh = [0u8; RESP_LEN];
            s.read_exact(&mut rh).await?;
            let resp = Response::decode(&rh).map_err(std::io::Error::other)?;
            let mut body = vec![0u8; resp.length.min(4096) as usize];
            s.read_exact(&mut body).await?;
            Ok::<_, std::io::Error>(body)
        };
        tokio::time::timeout(self.cfg.io_timeout, exchange)
            .await
            .map_err(|_| Error::new(Code::Timeout, format!("ping of {addr} timed out")))?
            .map_err(|e| Error::unavailable(format!("ping of {addr} failed: {e}")))
    }

    /// Runs one request per chunk, up to `parallel` at once, each on its own
    /// pooled connection; inside a traced span, as one client span.
    async fn chunked(&self, range: &RemoteRange, op: Op, at: u64, ios: Vec<Io<'_>>) -> Result<u32> {
        if TraceParent::current().is_none() {
            return self.chunks(range, op, at, ios).await;
        }
        let length: usize = ios.iter().map(Io::len).sum();
        let span = tracing::info_span!(
            "data",
            otel.name = if op == Op::Write { "data.write" } else { "data.read" },
            otel.kind = "client",
            server.address = %range.addr,
            length,
        );
        self.chunks(range, op, at, ios).instrument(span).await
    }

    async fn chunks(&self, range: &RemoteRange, op: Op, at: u64, ios: Vec<Io<'_>>) -> Result<u32> {
        let mut futs = Vec::with_capacity(ios.len());
        let mut lens = Vec::with_capacity(ios.len());
        let mut off = at;
        for io in ios {
            let n = io.len();
            lens.push(n);
            futs.push(self.request(range, op, off, io));
            off += n as u64;
        }
        if futs.len() == 1 {
            return futs.pop().expect("one future").await;
        }
        // `buffered` keeps results in order, so chunk checksums combine.
        let crcs: Vec<u32> = futures::stream::iter(futs)
            .buffered(self.cfg.parallel.max(1))
            .try_collect()
            .await?;
        let mut it = crcs.into_iter().zip(lens);
        let first = it.next().map_or(0, |(c, _)| c);
        Ok(it.fold(first, |acc, (c, n)| crc32c::crc32c_combine(acc, c, n)))
    }
}

impl TcpTransport {
    /// Asks the node holding `range` to stage up to `len` bytes at `at` of
    /// it into memory it lends (`Op::Stage`): where they are and how to
    /// reach them. The answer may hold fewer bytes (one piece).
    pub async fn stage(&self, range: &RemoteRange, at: u64, len: u64) -> Result<Staged> {
        let req = self.stage_request(range, at, len, 0)?;
        let body = self.call(&range.addr, &req, MAX_STAGED_LEN).await?;
        Staged::decode(&body, len).inspect_err(|_| self.give_back_unusable(&range.addr, &body))
    }

    /// Lent, but not usable (a malformed answer): gives it back at once if
    /// the answer names a lease at all (else the agent's TTL reclaims it).
    fn give_back_unusable(&self, addr: &str, body: &[u8]) {
        if let (Some(lease), Some(token)) = (body.get(8..16), body.get(16..24)) {
            let lease = u64::from_le_bytes(lease.try_into().expect("8 bytes"));
            let token = u64::from_le_bytes(token.try_into().expect("8 bytes"));
            self.give_back_soon(addr.to_string(), lease, token);
        }
    }

    /// [`TcpTransport::stage`] whose lease lives no longer than the
    /// connection it is asked on (`FLAG_HELD`), which the answer keeps out
    /// of the pool: give it back with [`TcpTransport::give_back_held`], or
    /// drop it, and the node takes the space back as the connection closes
    /// (a reader that dies or gives up frees its slots at once). Nodes that
    /// predate the flag reclaim unreturned space after its TTL.
    pub async fn stage_held(
        &self,
        range: &RemoteRange,
        at: u64,
        len: u64,
    ) -> Result<(Staged, HeldLease)> {
        let req = self.stage_request(range, at, len, FLAG_HELD)?;
        let conn = self.pooled(&range.addr).await?;
        let (body, conn) = self
            .exchange_on(&range.addr, conn, &req, MAX_STAGED_LEN)
            .await;
        // Without its connection (a broken exchange) a lease cannot be
        // given back on it: it was closed, and the node took the lease back.
        let (body, conn) = match (body, conn) {
            (Ok(b), Some(c)) => (b, c),
            (Err(e), conn) => {
                self.repool(&range.addr, conn);
                return Err(e);
            }
            (Ok(_), None) => return Err(Error::internal("an answered stage lost its connection")),
        };
        // An unusable answer: dropping the connection gives its lease back
        // (an agent that predates held leases is asked to).
        let st = Staged::decode(&body, len)
            .inspect_err(|_| self.give_back_unusable(&range.addr, &body))?;
        let held = HeldLease {
            addr: range.addr.clone(),
            conn,
            lease: st.lease,
            token: st.token,
        };
        Ok((st, held))
    }

    fn stage_request(&self, range: &RemoteRange, at: u64, len: u64, flags: u32) -> Result<Request> {
        check_sub_range(range.len(), at, len as usize)?;
        Ok(Request {
            op: Op::Stage,
            req_id: self.next_id.fetch_add(1, Ordering::Relaxed),
            grant: range.scope,
            mac: range.mac,
            offset: range.scope.offset + at,
            length: len,
            flags,
            trace: TraceParent::current(),
            record: None,
        })
    }

    /// Gives a [`TcpTransport::stage_held`] lease back on its own
    /// connection, which then returns to the pool.
    pub async fn give_back_held(&self, held: HeldLease) -> Result<()> {
        let req = self.give_back_request(held.lease, held.token);
        let (r, conn) = self.exchange_on(&held.addr, held.conn, &req, 0).await;
        self.repool(&held.addr, conn);
        r.map(|_| ())
    }

    fn give_back_request(&self, lease: u64, token: u64) -> Request {
        Request::ungranted(
            Op::GiveBack,
            self.next_id.fetch_add(1, Ordering::Relaxed),
            lease,
            token,
        )
    }

    /// Gives a lease back from a task of its own (over a connection of its
    /// own: no pooled one is at hand here).
    fn give_back_soon(&self, addr: String, lease: u64, token: u64) {
        let tcp = Arc::new(TcpTransport::new(self.cfg.clone()));
        spawn_give_back(tcp, addr, lease, token);
    }

    /// Gives back space a [`TcpTransport::stage`] lent.
    pub async fn give_back(&self, addr: &str, lease: u64, token: u64) -> Result<()> {
        let req = self.give_back_request(lease, token);
        self.call(addr, &req, 0).await.map(|_| ())
    }

    /// A pooled connection to `addr`, or a new one.
    async fn pooled(&self, addr: &str) -> Result<TcpStream> {
        let pooled = self.pool(addr).lock().pop();
        match pooled {
            Some(c) => Ok(c),
            None => self.connect(addr).await,
        }
    }

    /// One request without payload on a pooled connection, answered by a
    /// body of at most `max` bytes.
    async fn call(&self, addr: &str, req: &Request, max: usize) -> Result<Vec<u8>> {
        let conn = self.pooled(addr).await?;
        let (r, conn) = self.exchange_on(addr, conn, req, max).await;
        self.repool(addr, conn);
        r
    }

    /// Pools a connection an exchange left reusable.
    fn repool(&self, addr: &str, conn: Option<TcpStream>) {
        if let Some(c) = conn {
            self.give_back_conn(&self.pool(addr), c);
        }
    }

    /// One request without payload on `conn`, answered by a body of at most
    /// `max` bytes; the connection comes back when it may be reused.
    async fn exchange_on(
        &self,
        addr: &str,
        mut conn: TcpStream,
        req: &Request,
        max: usize,
    ) -> (Result<Vec<u8>>, Option<TcpStream>) {
        let exchange = async {
            conn.write_all(&req.encode()).await?;
            let mut rh = [0u8; RESP_LEN];
            conn.read_exact(&mut rh).await?;
            let resp = Response::decode(&rh).map_err(|e| Exchange::Io(std::io::Error::other(e)))?;
            if resp.req_id != req.req_id && resp.req_id != 0 {
                return Err(Exchange::Io(std::io::Error::other(
                    "data-plane response for another request",
                )));
            }
            let limit = if resp.status == Code::Ok {
                max
            } else {
                64 << 10
            };
            if resp.length > limit as u64 {
                return Err(Exchange::Io(std::io::Error::other("oversized response")));
            }
            let mut body = vec![0u8; resp.length as usize];
            conn.read_exact(&mut body).await?;
            if resp.status != Code::Ok {
                return Err(Exchange::Remote(Error::new(
                    resp.status,
                    format!("store node: {}", String::from_utf8_lossy(&body)),
                )));
            }
            Ok(body)
        };
        match tokio::time::timeout(self.cfg.io_timeout, exchange).await {
            Err(_) => (
                Err(Error::new(
                    Code::Timeout,
                    format!("data-plane request to {addr} timed out"),
                )),
                None,
            ),
            Ok(Err(Exchange::Io(e))) => (
                Err(Error::unavailable(format!(
                    "data-plane connection to {addr} failed: {e}"
                ))),
                None,
            ),
            // An unknown op is answered and then the node hangs up (older
            // nodes): this connection is not reused.
            Ok(Err(Exchange::Remote(e))) => {
                let conn = (e.code != Code::InvalidArgument).then_some(conn);
                (Err(e), conn)
            }
            Ok(Ok(body)) => (Ok(body), Some(conn)),
        }
    }

    /// One `ReadV` request per node for all the ranges it holds.
    async fn read_batch(&self, items: Vec<(&RemoteRange, Vec<&mut [u8]>)>) -> Vec<Result<u32>> {
        let n = items.len();
        let mut out: Vec<Option<Result<u32>>> = (0..n).map(|_| None).collect();
        let mut by_node: HashMap<String, Vec<BatchItem<'_>>> = HashMap::new();
        for (i, (r, buf)) in items.into_iter().enumerate() {
            if let Err(e) = check_sub_range(r.len(), 0, parts::total_len(&buf)) {
                out[i] = Some(Err(e));
                continue;
            }
            by_node.entry(r.addr.clone()).or_default().push((i, r, buf));
        }
        let futs: Vec<_> = by_node
            .into_iter()
            .flat_map(|(addr, group)| {
                let mut batches = Vec::new();
                let mut group = group.into_iter().peekable();
                while group.peek().is_some() {
                    let batch: Vec<_> = group.by_ref().take(MAX_READV_ITEMS as usize).collect();
                    batches.push((addr.clone(), batch));
                }
                batches
            })
            .map(|(addr, batch)| {
                let traced = TraceParent::current().is_some();
                let span = traced.then(|| {
                    tracing::info_span!(
                        "data",
                        otel.name = "data.readv",
                        otel.kind = "client",
                        server.address = %addr,
                        items = batch.len(),
                    )
                });
                self.readv(addr, batch)
                    .instrument(span.unwrap_or_else(tracing::Span::none))
            })
            .collect();
        for (i, r) in futures::future::join_all(futs).await.into_iter().flatten() {
            out[i] = Some(r);
        }
        every_item(out, "batch read")
    }

    async fn readv(
        &self,
        addr: String,
        mut batch: Vec<BatchItem<'_>>,
    ) -> Vec<(usize, Result<u32>)> {
        let pool = self.pool(&addr);
        let pooled = pool.lock().pop();
        let conn = match pooled {
            Some(c) => Ok(c),
            None => self.connect(&addr).await,
        };
        let mut conn = match conn {
            Ok(c) => c,
            Err(e) => {
                return batch
                    .into_iter()
                    .map(|(i, ..)| (i, Err(e.clone())))
                    .collect()
            }
        };
        let top_id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut head = Vec::with_capacity((batch.len() + 1) * crate::frame::REQ_LEN);
        let mut top = Request {
            op: Op::ReadV,
            req_id: top_id,
            grant: batch[0].1.scope,
            mac: batch[0].1.mac,
            offset: 0,
            length: batch.len() as u64,
            flags: 0,
            trace: TraceParent::current(),
            record: None,
        };
        top.grant.length = 0;
        head.extend_from_slice(&top.encode());
        let mut ids = Vec::with_capacity(batch.len());
        for (_, r, buf) in &batch {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            ids.push(id);
            let req = Request {
                op: Op::Read,
                req_id: id,
                grant: r.scope,
                mac: r.mac,
                offset: r.scope.offset,
                length: parts::total_len(buf) as u64,
                flags: 0,
                trace: None,
                record: None,
            };
            head.extend_from_slice(&req.encode());
        }
        let mut results: Vec<(usize, Result<u32>)> = Vec::with_capacity(batch.len());
        let t = self.cfg.io_timeout;
        let io = async {
            conn.write_all(&head).await?;
            let mut rh = [0u8; RESP_LEN];
            tokio::time::timeout(t, conn.read_exact(&mut rh))
                .await
                .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
            let resp = Response::decode(&rh).map_err(std::io::Error::other)?;
            if resp.status != Code::Ok || resp.length != batch.len() as u64 {
                return Err(std::io::Error::other(format!(
                    "batch read refused ({:?}): the node may not support batch reads",
                    resp.status
                )));
            }
            for ((i, _, buf), id) in batch.iter_mut().zip(&ids) {
                let item = Request {
                    op: Op::Read,
                    req_id: *id,
                    grant: top.grant,
                    mac: top.mac,
                    offset: 0,
                    length: parts::total_len(buf) as u64,
                    flags: 0,
                    trace: None,
                    record: None,
                };
                let r = tokio::time::timeout(t, read_response(&mut conn, &item, buf, true, None))
                    .await
                    .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))?;
                match r {
                    Ok(crc) => results.push((*i, Ok(crc))),
                    Err(Exchange::Remote(e)) => results.push((*i, Err(e))),
                    Err(Exchange::Io(e)) => return Err(e),
                }
            }
            Ok(())
        };
        match io.await {
            Ok(()) => self.give_back_conn(&pool, conn),
            Err(e) => {
                let err = Error::unavailable(format!("batch read from {addr} failed: {e}"));
                let done = results.len();
                results.extend(
                    batch
                        .iter()
                        .skip(done)
                        .map(|(i, ..)| (*i, Err(err.clone()))),
                );
            }
        }
        results
    }

    /// Reads into `bufs` in order from `at` of `src`, in chunks.
    async fn read_in(
        &self,
        src: &RemoteRange,
        at: u64,
        bufs: Vec<&mut [u8]>,
        crc: bool,
    ) -> Result<u32> {
        check_sub_range(src.len(), at, parts::total_len(&bufs))?;
        let ios = parts::chunks_mut(bufs, self.cfg.chunk_bytes)
            .into_iter()
            .map(|c| Io::In(c, crc, None))
            .collect();
        self.chunked(src, Op::Read, at, ios).await
    }

    /// Writes the concatenation of `data` at `at` of `dst`, in chunks; a
    /// whole object small enough for one request carries its `record`.
    async fn write_in(
        &self,
        dst: &RemoteRange,
        at: u64,
        data: &[&[u8]],
        record: Option<&WriteRecord>,
    ) -> Result<Option<[u8; MAC_LEN]>> {
        let len = parts::total_len(data);
        check_sub_range(dst.len(), at, len)?;
        let whole = at == 0 && len as u64 == dst.len() && self.records_writes(len);
        if let Some(record) = record.filter(|_| whole) {
            let mut receipt = None;
            let io = vec![Io::Recorded(data.to_vec(), record, &mut receipt)];
            self.chunked(dst, Op::Write, 0, io).await?;
            return Ok(receipt);
        }
        let ios = parts::chunks(data, self.cfg.chunk_bytes)
            .into_iter()
            .map(Io::Out)
            .collect();
        self.chunked(dst, Op::Write, at, ios).await.map(|_| None)
    }
}

/// A write's receipt from its node, when it keeps records.
type Receipt = Option<[u8; MAC_LEN]>;

/// One write of a pipeline: its index in the caller's list, and the write.
type Piped<'a> = (usize, WriteItem<'a>);

/// Writes' outcomes, by their index in the caller's list.
type Answered = Vec<(usize, Result<Receipt>)>;

/// Refusals of a grant or record one pipeline takes before it sends no
/// more (well under the node's `max_refusals`, after which it would hang up
/// and count this client as hostile): a master that changed keys makes
/// every grant of the batch fail alike.
const REFUSALS_PER_PIPELINE: usize = 8;

impl TcpTransport {
    /// Writes the objects bound for each node back to back on pooled
    /// connections, reading the answers as they come: one connection and
    /// one wake-up of the node's connection task for many small writes,
    /// where each write took a connection and a round trip of its own.
    /// Nodes serve a connection's requests in order, so this needs nothing
    /// of them. A pipeline carries at most a chunk's bytes (its time bound
    /// is one request's), and up to `parallel` run per node at once.
    /// Objects larger than a chunk are written on their own, chunked, up
    /// to `parallel` per node at once.
    async fn write_batch(&self, items: Vec<WriteItem<'_>>) -> Vec<Result<Receipt>> {
        let mut out: Vec<Option<Result<Receipt>>> = (0..items.len()).map(|_| None).collect();
        let mut by_node: HashMap<&str, (Vec<Piped<'_>>, Vec<Piped<'_>>)> = HashMap::new();
        for (i, w) in items.into_iter().enumerate() {
            let len = parts::total_len(w.parts);
            if let Err(e) = check_sub_range(w.dst.len(), 0, len) {
                out[i] = Some(Err(e));
                continue;
            }
            let (piped, alone) = by_node.entry(w.dst.addr.as_str()).or_default();
            match len == 0 || len > self.cfg.chunk_bytes {
                true => alone.push((i, w)),
                false => piped.push((i, w)),
            }
        }
        let at_once = self.cfg.parallel.max(1);
        let mut nodes = Vec::with_capacity(by_node.len());
        for (addr, (piped, alone)) in by_node {
            let mut work: Vec<BoxFuture<'_, Answered>> = Vec::new();
            let mut lane: Vec<Piped<'_>> = Vec::new();
            let mut bytes = 0;
            for item in piped {
                let len = parts::total_len(item.1.parts);
                if !lane.is_empty() && bytes + len > self.cfg.chunk_bytes {
                    work.push(Box::pin(
                        self.traced_pipeline(addr, std::mem::take(&mut lane)),
                    ));
                    bytes = 0;
                }
                bytes += len;
                lane.push(item);
            }
            if !lane.is_empty() {
                work.push(Box::pin(self.traced_pipeline(addr, lane)));
            }
            for (i, w) in alone {
                let write = self.write_in(w.dst, 0, w.parts, w.record);
                work.push(Box::pin(async move { vec![(i, write.await)] }));
            }
            nodes.push(
                futures::stream::iter(work)
                    .buffer_unordered(at_once)
                    .collect::<Vec<_>>(),
            );
        }
        for (i, r) in futures::future::join_all(nodes)
            .await
            .into_iter()
            .flatten()
            .flatten()
        {
            out[i] = Some(r);
        }
        every_item(out, "batch write")
    }

    /// [`TcpTransport::pipeline`] in a client span when the caller traces.
    async fn traced_pipeline(&self, addr: &str, lane: Vec<Piped<'_>>) -> Answered {
        let span = TraceParent::current().is_some().then(|| {
            tracing::info_span!(
                "data",
                otel.name = "data.write",
                otel.kind = "client",
                server.address = %addr,
                items = lane.len(),
                length = lane.iter().map(|(_, w)| parts::total_len(w.parts)).sum::<usize>(),
            )
        });
        self.pipeline(addr, lane)
            .instrument(span.unwrap_or_else(tracing::Span::none))
            .await
    }

    /// One connection's writes, sent back to back while their answers are
    /// read. An answer the node gives as an error fails that write alone;
    /// a broken connection or the time running out fails every write not
    /// answered yet, whose outcome the caller then treats as unknown, as
    /// for a single write. The connection is pooled again only when every
    /// request went out whole and every answer came back.
    async fn pipeline(&self, addr: &str, lane: Vec<Piped<'_>>) -> Answered {
        let mut conn = match self.pooled(addr).await {
            Ok(c) => c,
            Err(e) => return lane.into_iter().map(|(i, _)| (i, Err(e.clone()))).collect(),
        };
        let trace = TraceParent::current();
        let reqs: Vec<Request> = lane
            .iter()
            .map(|(_, w)| {
                let len = parts::total_len(w.parts);
                let whole = len as u64 == w.dst.len() && self.records_writes(len);
                Request {
                    op: Op::Write,
                    req_id: self.next_id.fetch_add(1, Ordering::Relaxed),
                    grant: w.dst.scope,
                    mac: w.dst.mac,
                    offset: w.dst.scope.offset,
                    length: len as u64,
                    flags: 0,
                    trace,
                    record: w.record.filter(|_| whole).cloned(),
                }
            })
            .collect();
        let mut answers: Vec<Option<Result<Receipt>>> = (0..lane.len()).map(|_| None).collect();
        // Requests sent whole, and refusals of grants or records so far.
        let sent = std::sync::atomic::AtomicUsize::new(0);
        let refused = std::sync::atomic::AtomicUsize::new(0);
        let mut in_step = true;
        let ran = {
            let (mut rd, mut wr) = conn.split();
            let (sent, refused) = (&sent, &refused);
            let send = async {
                for (req, (_, w)) in reqs.iter().zip(&lane) {
                    if refused.load(Ordering::Relaxed) >= REFUSALS_PER_PIPELINE {
                        break;
                    }
                    write_all_gather(&mut wr, &req.encode(), w.parts).await?;
                    sent.fetch_add(1, Ordering::Relaxed);
                }
                Ok::<_, std::io::Error>(())
            };
            let (answers, reqs, in_step) = (&mut answers, &reqs, &mut in_step);
            let recv = async move {
                for (k, (req, slot)) in reqs.iter().zip(answers.iter_mut()).enumerate() {
                    if k >= sent.load(Ordering::Relaxed)
                        && refused.load(Ordering::Relaxed) >= REFUSALS_PER_PIPELINE
                    {
                        // Not sent, and will not be.
                        break;
                    }
                    match read_written(&mut rd, req, req.record.is_some()).await {
                        Ok(receipt) => *slot = Some(Ok(receipt)),
                        Err(Exchange::Remote(e)) => {
                            if e.code == Code::PermissionDenied {
                                refused.fetch_add(1, Ordering::Relaxed);
                            }
                            // A node refusing the request as such hangs up
                            // after saying why (as for unknown ops).
                            if e.code == Code::InvalidArgument {
                                *in_step = false;
                            }
                            *slot = Some(Err(e));
                        }
                        Err(Exchange::Io(e)) => return Err(e),
                    }
                }
                Ok(())
            };
            let both = async {
                futures::pin_mut!(send, recv);
                match futures::future::select(send, recv).await {
                    // All sent (or sending stopped): answers still coming.
                    futures::future::Either::Left((Ok(()), recv)) => recv.await,
                    // The node stopped reading, perhaps after answering
                    // why: keep what it answered.
                    futures::future::Either::Left((Err(e), recv)) => {
                        let _ = recv.await;
                        Err(e)
                    }
                    // Every answer read, or a broken connection.
                    futures::future::Either::Right((r, _)) => r,
                }
            };
            tokio::time::timeout(self.cfg.io_timeout, both).await
        };
        let unanswered = match ran {
            Ok(Ok(())) => {
                // A node may answer before it reads a request's bytes, and
                // then hang up: only a connection that sent everything and
                // heard back about everything is in step.
                let whole = sent.load(Ordering::Relaxed) == lane.len();
                if whole && in_step {
                    self.repool(addr, Some(conn));
                }
                Error::unavailable(format!(
                    "no answer from {addr}: it refused {REFUSALS_PER_PIPELINE} earlier \
                     writes' grants on the same connection, so the rest were not sent"
                ))
            }
            Ok(Err(e)) => {
                Error::unavailable(format!("data-plane connection to {addr} failed: {e}"))
            }
            Err(_) => Error::new(
                Code::Timeout,
                format!("data-plane request to {addr} timed out"),
            ),
        };
        lane.into_iter()
            .zip(answers)
            .map(|((i, _), a)| (i, a.unwrap_or_else(|| Err(unanswered.clone()))))
            .collect()
    }
}

impl Transport for TcpTransport {
    fn write<'a>(
        &'a self,
        dst: &'a RemoteRange,
        at: u64,
        data: &'a [u8],
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move { self.write_in(dst, at, &[data], None).await.map(|_| ()) })
    }

    fn write_recorded<'a>(
        &'a self,
        dst: &'a RemoteRange,
        data: &'a [u8],
        record: &'a WriteRecord,
    ) -> BoxFuture<'a, Result<Option<[u8; MAC_LEN]>>> {
        Box::pin(async move { self.write_in(dst, 0, &[data], Some(record)).await })
    }

    fn write_parts<'a>(
        &'a self,
        dst: &'a RemoteRange,
        parts: &'a [&'a [u8]],
        record: Option<&'a WriteRecord>,
    ) -> BoxFuture<'a, Result<Option<[u8; MAC_LEN]>>> {
        Box::pin(self.write_in(dst, 0, parts, record))
    }

    fn write_many_parts<'a>(
        &'a self,
        items: Vec<WriteItem<'a>>,
    ) -> BoxFuture<'a, Vec<Result<Receipt>>> {
        Box::pin(self.write_batch(items))
    }

    fn read_parts<'a>(
        &'a self,
        src: &'a RemoteRange,
        parts: Vec<&'a mut [u8]>,
    ) -> BoxFuture<'a, Result<u32>> {
        Box::pin(self.read_in(src, 0, parts, true))
    }

    /// A read of one request (no larger than a chunk) hashes each piece as
    /// it lands, as it checksums it; one in several chunks, which arrive
    /// side by side, is hashed once they are all in.
    fn read_parts_verified<'a>(
        &'a self,
        src: &'a RemoteRange,
        mut parts: Vec<&'a mut [u8]>,
        blake3: bool,
    ) -> BoxFuture<'a, Result<Verified>> {
        Box::pin(async move {
            let len = parts::total_len(&parts);
            if !blake3 || len > self.cfg.chunk_bytes || len == 0 {
                let crc32c = self
                    .read_in(src, 0, parts::reborrow(&mut parts), true)
                    .await?;
                return Ok(Verified::hashed_after(crc32c, &parts, blake3));
            }
            check_sub_range(src.len(), 0, len)?;
            let mut h = blake3::Hasher::new();
            let io = vec![Io::In(parts, true, Some(&mut h))];
            let crc = self.chunked(src, Op::Read, 0, io).await?;
            Ok(Verified {
                crc32c: crc,
                blake3: Some(*h.finalize().as_bytes()),
            })
        })
    }

    fn read_many_parts<'a>(
        &'a self,
        items: Vec<(&'a RemoteRange, Vec<&'a mut [u8]>)>,
    ) -> BoxFuture<'a, Vec<Result<u32>>> {
        Box::pin(self.read_batch(items))
    }

    /// One request carries a record: a write no larger than a chunk.
    fn records_writes(&self, len: usize) -> bool {
        len > 0 && len <= self.cfg.chunk_bytes
    }

    fn read<'a>(
        &'a self,
        src: &'a RemoteRange,
        at: u64,
        buf: &'a mut [u8],
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move { self.read_in(src, at, vec![buf], false).await.map(|_| ()) })
    }

    fn read_crc32c<'a>(
        &'a self,
        src: &'a RemoteRange,
        at: u64,
        buf: &'a mut [u8],
    ) -> BoxFuture<'a, Result<u32>> {
        Box::pin(self.read_in(src, at, vec![buf], true))
    }

    fn read_many<'a>(
        &'a self,
        items: Vec<(&'a RemoteRange, &'a mut [u8])>,
    ) -> BoxFuture<'a, Vec<Result<u32>>> {
        Box::pin(self.read_batch(items.into_iter().map(|(r, buf)| (r, vec![buf])).collect()))
    }

    fn name(&self) -> &'static str {
        "tcp"
    }

    fn sibling(&self) -> Option<Arc<dyn Transport>> {
        Some(Arc::new(self.fresh()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::REQ_LEN;
    use strata_common::grant::{GrantScope, MAC_LEN};

    fn range(addr: String) -> RemoteRange {
        RemoteRange {
            addr,
            scope: GrantScope {
                perm: 12,
                segment_id: 1,
                offset: 0,
                length: 4096,
                expires_unix_ms: u64::MAX,
                generation: 0,
            },
            mac: [0; MAC_LEN],
            ucx_route: 0,
        }
    }

    /// A node that predates staging refuses the op as unknown (request id
    /// 0, since it could not parse the request) and hangs up: the caller
    /// gets `invalid_argument`, and the connection is not pooled.
    #[tokio::test]
    async fn an_old_node_refuses_staging_and_its_connection_is_not_reused() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let server = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut hdr = [0u8; REQ_LEN];
            s.read_exact(&mut hdr).await.unwrap();
            assert_eq!(hdr[5], Op::Stage as u8);
            let msg = b"unknown data-plane op 5";
            let h = Response {
                status: Code::InvalidArgument,
                req_id: 0,
                length: msg.len() as u64,
            }
            .encode();
            s.write_all(&h).await.unwrap();
            s.write_all(msg).await.unwrap();
            s.shutdown().await.unwrap();
        });
        let t = TcpTransport::new(TcpTransportConfig::default());
        let e = t.stage(&range(addr.clone()), 0, 4096).await.unwrap_err();
        assert_eq!(e.code, Code::InvalidArgument, "{e}");
        assert!(e.message.contains("unknown data-plane op"), "{e}");
        server.await.unwrap();
        assert!(
            t.pool(&addr).lock().is_empty(),
            "a hung-up connection is not reused"
        );
        // A request outside the range is refused before anything is sent.
        let e = t.stage(&range(addr), 4000, 97).await.unwrap_err();
        assert_eq!(e.code, Code::InvalidArgument, "{e}");
    }

    /// How a fake node answers the n-th write of a connection.
    #[derive(Clone, Copy)]
    enum Answer {
        Ok,
        Refuse,
        /// Refuses the write's grant.
        Deny,
        /// Answers, then hangs up.
        OkAndClose,
    }

    /// Per connection, each write's offset and bytes.
    type Seen = Vec<Vec<(u64, Vec<u8>)>>;

    /// A node that serves writes in order on each connection it accepts,
    /// as store nodes do, and notes each connection's writes (offset and
    /// bytes).
    fn fake_writes_node(answer: fn(usize) -> Answer) -> (String, Arc<Mutex<Seen>>) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let seen: Arc<Mutex<Seen>> = Arc::default();
        let noted = seen.clone();
        tokio::spawn(async move {
            let l = tokio::net::TcpListener::from_std(l).unwrap();
            loop {
                let (mut s, _) = l.accept().await.unwrap();
                // As a node's: an answer written just before a close goes
                // out at once, not held back by Nagle and then dropped by
                // the reset a close with unread bytes sends.
                s.set_nodelay(true).unwrap();
                let conn = {
                    let mut seen = noted.lock();
                    seen.push(Vec::new());
                    seen.len() - 1
                };
                let noted = noted.clone();
                tokio::spawn(async move {
                    for n in 0.. {
                        let mut hdr = [0u8; REQ_LEN];
                        if s.read_exact(&mut hdr).await.is_err() {
                            return;
                        }
                        let (req, ext) = Request::decode(&hdr).unwrap();
                        let mut block = vec![0u8; ext];
                        s.read_exact(&mut block).await.unwrap();
                        let req = req.unwrap();
                        assert_eq!(req.op, Op::Write);
                        let mut body = vec![0u8; req.length as usize];
                        s.read_exact(&mut body).await.unwrap();
                        noted.lock()[conn].push((req.offset, body));
                        let a = answer(n);
                        let (status, msg): (Code, &[u8]) = match a {
                            Answer::Refuse => (Code::Unavailable, b"fenced; retry shortly"),
                            Answer::Deny => (Code::PermissionDenied, b"grant does not verify"),
                            _ => (Code::Ok, b""),
                        };
                        let h = Response {
                            status,
                            req_id: req.req_id,
                            length: msg.len() as u64,
                        }
                        .encode();
                        s.write_all(&h).await.unwrap();
                        s.write_all(msg).await.unwrap();
                        if matches!(a, Answer::OkAndClose) {
                            return;
                        }
                    }
                });
            }
        });
        (addr, seen)
    }

    /// `n` ranges of `len` bytes of one node, and their bytes.
    fn writes(addr: &str, n: u64, len: usize) -> (Vec<RemoteRange>, Vec<Vec<u8>>) {
        let ranges = (0..n)
            .map(|i| {
                let mut r = range(addr.to_string());
                r.scope.offset = i * len as u64;
                r.scope.length = len as u64;
                r
            })
            .collect();
        let bytes = (0..n).map(|i| vec![i as u8 + 1; len]).collect();
        (ranges, bytes)
    }

    /// The writes of `bytes` into `ranges`, through `t`.
    async fn write_all(
        t: &TcpTransport,
        ranges: &[RemoteRange],
        bytes: &[Vec<u8>],
    ) -> Vec<Result<Receipt>> {
        let parts: Vec<[&[u8]; 1]> = bytes.iter().map(|b| [b.as_slice()]).collect();
        let items = ranges
            .iter()
            .zip(&parts)
            .map(|(dst, p)| WriteItem {
                dst,
                parts: p,
                record: None,
            })
            .collect();
        t.write_many_parts(items).await
    }

    /// A batch's writes to one node go back to back on one connection, in
    /// order, and the connection is reused; a write the node refuses fails
    /// alone.
    #[tokio::test]
    async fn a_batch_of_writes_to_one_node_shares_one_connection() {
        let (addr, seen) = fake_writes_node(|n| match n {
            2 => Answer::Refuse,
            _ => Answer::Ok,
        });
        let (ranges, bytes) = writes(&addr, 8, 4096);
        let t = TcpTransport::new(TcpTransportConfig::default());
        let res = write_all(&t, &ranges, &bytes).await;
        assert_eq!(res.len(), 8);
        for (i, r) in res.iter().enumerate() {
            match i {
                2 => assert_eq!(r.as_ref().unwrap_err().code, Code::Unavailable, "{r:?}"),
                _ => assert_eq!(r.as_ref().unwrap(), &None, "write {i}"),
            }
        }
        let seen = seen.lock().clone();
        assert_eq!(seen.len(), 1, "one connection for the batch");
        assert_eq!(seen[0].len(), 8);
        for (i, (offset, body)) in seen[0].iter().enumerate() {
            assert_eq!((*offset, body), (i as u64 * 4096, &bytes[i]), "write {i}");
        }
        assert_eq!(t.pool(&addr).lock().len(), 1, "the connection is reused");
    }

    /// A node that hangs up mid-batch, while the client is still sending
    /// (the batch is larger than the sockets' buffers): the writes it
    /// answered stand, every other one fails retryably, and the connection
    /// is not reused.
    #[tokio::test]
    async fn writes_a_node_never_answered_fail_and_the_connection_goes() {
        let (addr, seen) = fake_writes_node(|n| match n {
            2 => Answer::OkAndClose,
            _ => Answer::Ok,
        });
        let (ranges, bytes) = writes(&addr, 16, 1 << 20);
        let t = TcpTransport::new(TcpTransportConfig {
            chunk_bytes: 32 << 20,
            ..Default::default()
        });
        let res = write_all(&t, &ranges, &bytes).await;
        assert_eq!(res.len(), 16);
        for (i, r) in res.iter().enumerate() {
            match i {
                0..=2 => assert_eq!(r.as_ref().unwrap(), &None, "write {i}"),
                _ => {
                    let e = r.as_ref().unwrap_err();
                    assert!(e.retryable(), "write {i}: {e}");
                }
            }
        }
        assert_eq!(seen.lock()[0].len(), 3);
        assert!(
            t.pool(&addr).lock().is_empty(),
            "a hung-up connection is not reused"
        );
    }

    /// A pipeline carries at most a chunk's bytes, and up to `parallel` of
    /// them run at once: with one at a time, they follow each other on the
    /// one connection; with four, each has its own, every write in order.
    #[tokio::test]
    async fn a_pipeline_carries_a_chunk_and_up_to_parallel_run_at_once() {
        for (parallel, conns) in [(1, 1), (4, 4)] {
            let (addr, seen) = fake_writes_node(|_| Answer::Ok);
            let (ranges, bytes) = writes(&addr, 8, 4096);
            let t = TcpTransport::new(TcpTransportConfig {
                chunk_bytes: 8192,
                parallel,
                ..Default::default()
            });
            let res = write_all(&t, &ranges, &bytes).await;
            assert_eq!(res.len(), 8);
            assert!(
                res.iter().all(|r| r.as_ref().is_ok_and(|r| r.is_none())),
                "{res:?}"
            );
            let mut seen = seen.lock().clone();
            assert_eq!(seen.len(), conns, "connections with parallel {parallel}");
            for c in &seen {
                assert!(
                    c.windows(2).all(|w| w[0].0 < w[1].0),
                    "in order on a connection"
                );
                assert!(c.len() % 2 == 0, "two writes of 4 KiB a chunk of 8 KiB");
            }
            let mut all: Vec<(u64, Vec<u8>)> = seen.drain(..).flatten().collect();
            all.sort();
            assert_eq!(all.len(), 8);
            for (i, (offset, body)) in all.iter().enumerate() {
                assert_eq!((*offset, body), (i as u64 * 4096, &bytes[i]));
            }
        }
    }

    /// A node that refuses every grant (a master that changed keys): the
    /// pipeline stops sending after a few refusals, well before the node
    /// would count the client as hostile; what it did not send fails
    /// retryably.
    #[tokio::test]
    async fn a_pipeline_stops_sending_when_its_grants_are_refused() {
        let (addr, seen) = fake_writes_node(|_| Answer::Deny);
        let n = 32;
        let (ranges, bytes) = writes(&addr, n, 1 << 20);
        let t = TcpTransport::new(TcpTransportConfig {
            chunk_bytes: 64 << 20,
            ..Default::default()
        });
        let res = write_all(&t, &ranges, &bytes).await;
        assert_eq!(res.len(), n as usize);
        let denied = res
            .iter()
            .filter(|r| r.as_ref().is_err_and(|e| e.code == Code::PermissionDenied))
            .count();
        let unsent = res
            .iter()
            .filter(|r| {
                r.as_ref()
                    .is_err_and(|e| e.retryable() && e.message.contains("not sent"))
            })
            .count();
        assert_eq!(denied + unsent, n as usize, "{res:?}");
        assert!(denied >= REFUSALS_PER_PIPELINE, "{denied} refused");
        let received = seen.lock()[0].len();
        assert!(
            received < n as usize,
            "the node received all {received} writes"
        );
    }

    /// Any other refusal leaves the connection in step: it is reused.
    #[tokio::test]
    async fn a_refused_give_back_keeps_its_connection() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let (done, stop) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut hdr = [0u8; REQ_LEN];
            s.read_exact(&mut hdr).await.unwrap();
            let (req, _) = Request::decode(&hdr).unwrap();
            let req = req.unwrap();
            assert_eq!((req.op, req.offset, req.length), (Op::GiveBack, 7, 99));
            let msg = b"no such staging lease";
            let h = Response {
                status: Code::NotFound,
                req_id: req.req_id,
                length: msg.len() as u64,
            }
            .encode();
            s.write_all(&h).await.unwrap();
            s.write_all(msg).await.unwrap();
            let _ = stop.await;
        });
        let t = TcpTransport::new(TcpTransportConfig::default());
        let e = t.give_back(&addr, 7, 99).await.unwrap_err();
        assert_eq!(e.code, Code::NotFound, "{e}");
        assert_eq!(t.pool(&addr).lock().len(), 1, "the connection is reused");
        let _ = done.send(());
        server.await.unwrap();
    }
}
