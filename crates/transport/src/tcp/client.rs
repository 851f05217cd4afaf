use super::write_all_vectored;
use crate::frame::{Op, Request, Response, RESP_LEN};
use crate::{check_sub_range, RemoteRange, Transport};
use futures::future::BoxFuture;
use futures::{StreamExt, TryStreamExt};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use strata_common::{Code, Error, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

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
                self.give_back(&pool, conn);
                Err(e)
            }
            Ok(Ok(crc)) => {
                self.give_back(&pool, conn);
                Ok(crc)
            }
        }
    }

    fn give_back(&self, pool: &Mutex<Vec<TcpStream>>, conn: TcpStream) {
        let mut p = pool.lock();
        if p.len() < self.cfg.max_idle_per_node {
            p.push(conn);
        }
    }
}

enum Io<'a> {
    Out(&'a [u8]),
    /// Read into the buffer; with `true`, checksum it while it streams in.
    In(&'a mut [u8], bool),
}

impl Io<'_> {
    fn len(&self) -> usize {
        match self {
            Io::Out(b) => b.len(),
            Io::In(b, _) => b.len(),
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
        Io::Out(data) => write_all_vectored(s, &hdr, data).await?,
        Io::In(..) => s.write_all(&hdr).await?,
    }
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
    match io {
        Io::Out(_) => {
            if resp.length != 0 {
                return Err(Exchange::Io(std::io::Error::other(
                    "unexpected write payload",
                )));
            }
        }
        Io::In(buf, with_crc) => {
            if resp.length != buf.len() as u64 {
                return Err(Exchange::Io(std::io::Error::other(format!(
                    "store node returned {} bytes, expected {}",
                    resp.length,
                    buf.len()
                ))));
            }
            if !with_crc {
                s.read_exact(buf).await?;
                return Ok(0);
            }
            // Checksum each piece as it lands, while the sender keeps
            // filling the socket: the check costs almost no extra time.
            let mut crc = 0;
            for piece in buf.chunks_mut(CRC_PIECE) {
                s.read_exact(piece).await?;
                crc = crc32c::crc32c_append(crc, piece);
            }
            return Ok(crc);
        }
    }
    Ok(0)
}

/// Bytes received between checksum updates on a verified read.
const CRC_PIECE: usize = 128 << 10;

impl TcpTransport {
    /// Asks the data-plane server at `addr` who it is (its ping payload).
    pub async fn ping(&self, addr: &str) -> Result<Vec<u8>> {
        let mut s = self.connect(addr).await?;
        let req = Request {
            op: Op::Ping,
            req_id: self.next_id.fetch_add(1, Ordering::Relaxed),
            grant: strata_common::grant::GrantScope {
                perm: 0,
                segment_id: 0,
                offset: 0,
                length: 0,
                expires_unix_ms: 0,
            },
            mac: [0; strata_common::grant::MAC_LEN],
            offset: 0,
            length: 0,
        };
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
    /// pooled connection.
    async fn chunked(&self, range: &RemoteRange, op: Op, at: u64, ios: Vec<Io<'_>>) -> Result<u32> {
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
    async fn read_in(&self, src: &RemoteRange, at: u64, buf: &mut [u8], crc: bool) -> Result<u32> {
        check_sub_range(src.len(), at, buf.len())?;
        let ios = buf
            .chunks_mut(self.cfg.chunk_bytes.max(1))
            .map(|c| Io::In(c, crc))
            .collect();
        self.chunked(src, Op::Read, at, ios).await
    }
}

impl Transport for TcpTransport {
    fn write<'a>(
        &'a self,
        dst: &'a RemoteRange,
        at: u64,
        data: &'a [u8],
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            check_sub_range(dst.len(), at, data.len())?;
            let ios = data
                .chunks(self.cfg.chunk_bytes.max(1))
                .map(Io::Out)
                .collect();
            self.chunked(dst, Op::Write, at, ios).await.map(|_| ())
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

    fn name(&self) -> &'static str {
        "tcp"
    }
}
