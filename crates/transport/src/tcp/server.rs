use super::write_all_vectored;
use crate::frame::{Op, Request, Response, MAX_READV_ITEMS, REQ_LEN};
use crate::region::{Chunk, ChunkStream, DataRegion, ReadSource};
use prometheus::IntCounter;
use std::sync::Arc;
use std::time::Duration;
use strata_common::time::unix_ms;
use strata_common::{Code, Error};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// A connection idle this long between requests is closed.
const IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// A payload that does not arrive within this time fails the connection.
const PAYLOAD_TIMEOUT: Duration = Duration::from_secs(60);
/// A rejected write's payload up to this size is drained so the connection
/// survives; larger ones close it.
const MAX_DRAIN: u64 = 64 << 20;
const MAX_CONNECTIONS: usize = 4096;

/// Counters the server bumps; the owning service registers them.
#[derive(Clone)]
pub struct ServerMetrics {
    pub requests: IntCounter,
    pub read_bytes: IntCounter,
    pub written_bytes: IntCounter,
    pub rejected: IntCounter,
}

/// Serves the data plane on `listener` until `shutdown`, then waits for
/// in-flight connections to finish their current request.
pub async fn serve(
    listener: TcpListener,
    table: Arc<dyn DataRegion>,
    metrics: ServerMetrics,
    shutdown: CancellationToken,
) {
    let tracker = TaskTracker::new();
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
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
            tracing::warn!(%peer, "too many data-plane connections; refusing");
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (table, metrics, shutdown) = (table.clone(), metrics.clone(), shutdown.clone());
        tracker.spawn(async move {
            if let Err(e) = connection(stream, table.as_ref(), &metrics, &shutdown).await {
                tracing::debug!(%peer, error = %e, "data-plane connection closed");
            }
            drop(permit);
        });
    }
    tracker.close();
    tracker.wait().await;
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

async fn connection(
    mut s: TcpStream,
    table: &dyn DataRegion,
    m: &ServerMetrics,
    shutdown: &CancellationToken,
) -> std::io::Result<()> {
    let mut hdr = [0u8; REQ_LEN];
    loop {
        let read = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            r = tokio::time::timeout(IDLE_TIMEOUT, s.read_exact(&mut hdr)) => r,
        };
        match read {
            Err(_) => return Ok(()), // idle
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Ok(Err(e)) => return Err(e),
            Ok(Ok(_)) => {}
        }
        m.requests.inc();
        let req = match Request::decode(&hdr) {
            Ok(r) => r,
            Err(e) => {
                // Not our protocol: say why once, then hang up.
                m.rejected.inc();
                respond_err(&mut s, 0, &e).await?;
                s.shutdown().await?;
                return Ok(());
            }
        };
        match req.op {
            Op::Ping => {
                let who = table.ping_payload();
                let h = Response {
                    status: Code::Ok,
                    req_id: req.req_id,
                    length: who.len() as u64,
                }
                .encode();
                write_all_vectored(&mut s, &h, &who).await?;
            }
            Op::Write => {
                let auth = table.write_target(&req, unix_ms());
                match auth {
                    Ok(seg) => {
                        // SAFETY: the grant verified above names exactly this
                        // range, and the master never grants overlapping writes.
                        let dst = match unsafe { seg.slice_mut(req.offset, req.length) } {
                            Ok(d) => d,
                            Err(e) => return respond_err(&mut s, req.req_id, &e).await,
                        };
                        tokio::time::timeout(PAYLOAD_TIMEOUT, s.read_exact(dst))
                            .await
                            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
                        m.written_bytes.inc_by(req.length);
                        respond_ok(&mut s, req.req_id).await?;
                    }
                    Err(e) => {
                        m.rejected.inc();
                        if req.length > MAX_DRAIN {
                            respond_err(&mut s, req.req_id, &e).await?;
                            return Ok(());
                        }
                        let mut sink = (&mut s).take(req.length);
                        let drained = tokio::time::timeout(
                            PAYLOAD_TIMEOUT,
                            tokio::io::copy(&mut sink, &mut tokio::io::sink()),
                        )
                        .await
                        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
                        if drained != req.length {
                            return Ok(());
                        }
                        respond_err(&mut s, req.req_id, &e).await?;
                    }
                }
            }
            Op::Read => serve_read(&mut s, table, &req, m).await?,
            Op::ReadV => {
                if req.length > MAX_READV_ITEMS {
                    m.rejected.inc();
                    let e = Error::invalid(format!(
                        "batch read of {} items exceeds the limit of {MAX_READV_ITEMS}",
                        req.length
                    ));
                    respond_err(&mut s, req.req_id, &e).await?;
                    return Ok(());
                }
                let mut items = Vec::with_capacity(req.length as usize);
                for _ in 0..req.length {
                    tokio::time::timeout(PAYLOAD_TIMEOUT, s.read_exact(&mut hdr))
                        .await
                        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
                    items.push(Request::decode(&hdr));
                }
                let h = Response {
                    status: Code::Ok,
                    req_id: req.req_id,
                    length: req.length,
                }
                .encode();
                s.write_all(&h).await?;
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
                    Some(item) => prep(item).await,
                    None => None,
                };
                for (i, item) in items.iter().enumerate() {
                    let prepared = next.take();
                    // Read the next item while this one is sent, but only
                    // when this one needs no more staging: a connection never
                    // holds staged pieces while it waits for more, so readers
                    // sharing the arena cannot deadlock.
                    let overlap = prepared.as_ref().is_some_and(|p| p.complete(item));
                    let reply = async {
                        match (item, prepared) {
                            (Ok(r), Some(p)) => send(&mut s, r, m, p).await,
                            (Ok(r), None) => {
                                m.rejected.inc();
                                let e = Error::invalid("a batch read may only hold reads");
                                respond_err(&mut s, r.req_id, &e).await
                            }
                            (Err(e), _) => {
                                m.rejected.inc();
                                respond_err(&mut s, 0, e).await
                            }
                        }
                    };
                    let upcoming = items.get(i + 1);
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
            }
        }
    }
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

/// Answers one read with one complete response.
async fn serve_read(
    s: &mut TcpStream,
    table: &dyn DataRegion,
    req: &Request,
    m: &ServerMetrics,
) -> std::io::Result<()> {
    let p = prepare(table, req, m).await;
    send(s, req, m, p).await
}

/// Sends a prepared read. A failure mid-stream (a later piece could not be
/// read) closes the connection, so the reader never takes a short or
/// patched body for the object.
async fn send(
    s: &mut TcpStream,
    req: &Request,
    m: &ServerMetrics,
    p: Prepared,
) -> std::io::Result<()> {
    let header = Response {
        status: Code::Ok,
        req_id: req.req_id,
        length: req.length,
    }
    .encode();
    let (mut stream, mut next) = match p {
        Prepared::Failed(e) => return respond_err(s, req.req_id, &e).await,
        Prepared::Ready(src) => {
            let data = match &src {
                ReadSource::Segment(seg) => seg.slice(req.offset, req.length),
                ReadSource::Owned(v, _) if v.len() as u64 == req.length => Ok(v.as_slice()),
                _ => Err(Error::internal("read returned a wrong length")),
            };
            return match data {
                Ok(d) => {
                    write_all_vectored(s, &header, d).await?;
                    m.read_bytes.inc_by(req.length);
                    Ok(())
                }
                Err(e) => respond_err(s, req.req_id, &e).await,
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
        if first {
            write_all_vectored(s, &header, &chunk.data).await?;
            first = false;
        } else {
            s.write_all(&chunk.data).await?;
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
        s.write_all(&header).await?;
    }
    Ok(())
}
