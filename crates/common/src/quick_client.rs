//! The caller's side of quick calls (`crate::quick_wire`): pooled plain
//! connections to the leader, each held by one caller for one request and
//! answer, so a call costs the two sockets' wake-ups and not a gRPC call's
//! task hand-offs (on a 2-core machine ~10 to 20 us against ~140 us;
//! docs/benchmarks.md). Clients make their lookups and puts this way
//! (`strata_client::quick`), store nodes their long-polled heartbeats.
//!
//! [`QuickClient::call`] answers `None` whenever a call cannot be sent this
//! way, and the caller uses gRPC: no leader known yet, a master that does
//! not speak the protocol (an older one) or refuses the hello, a follower
//! (it answers `NotLeader` without acting). Once a request may have reached
//! the master, a broken connection or a timeout is an `Unavailable` error,
//! as a gRPC call's would be, and the caller decides whether to send it
//! again. Traced calls use gRPC, so the master's span joins the caller's
//! trace.

use crate::auth::Secret;
use crate::leader::LeaderChannel;
use crate::quick_wire::{self as wire, Op};
use crate::{Code, Error, Result};
use prost::Message;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// Idle connections kept for reuse (a connection per concurrent lookup).
const IDLE: usize = 8;
/// Longest a dial or hello may take before gRPC is used instead.
const DIAL_TIMEOUT: Duration = Duration::from_secs(3);
/// Longest a call may take (as the gRPC channel's call timeout).
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest the master may stay silent during a call (it says it is busy
/// every `quick_wire::BUSY_EVERY`): as gRPC's keep-alive timeout.
const SILENCE: Duration = Duration::from_secs(3);
/// How long an address that refused the protocol is left alone.
const RECHECK: Duration = Duration::from_secs(30);
/// How long an address that could not be reached is left alone.
const UNREACHABLE: Duration = Duration::from_secs(1);

type Conn = BufReader<TcpStream>;

pub struct QuickClient {
    route: LeaderChannel,
    hello: Vec<u8>,
    idle: Mutex<Vec<(String, Conn)>>,
    refused: Mutex<HashMap<String, Instant>>,
    answered: AtomicU64,
}

impl QuickClient {
    pub fn new(route: LeaderChannel, token: Option<&Secret>) -> Result<QuickClient> {
        Ok(QuickClient {
            route,
            hello: wire::hello(token.map(|t| t.expose()))?,
            idle: Mutex::new(Vec::new()),
            refused: Mutex::new(HashMap::new()),
            answered: AtomicU64::new(0),
        })
    }

    /// A client of the same route and credentials with connections of its
    /// own (made by whoever calls it, on that caller's runtime).
    pub fn sibling(&self) -> QuickClient {
        QuickClient {
            route: self.route.clone(),
            hello: self.hello.clone(),
            idle: Mutex::new(Vec::new()),
            refused: Mutex::new(HashMap::new()),
            answered: AtomicU64::new(0),
        }
    }

    /// Calls the master answered this way (for tests and engines' metrics).
    pub fn answered(&self) -> u64 {
        self.answered.load(Ordering::Relaxed)
    }

    /// The master's answer to `req`, or `None` if it was not sent (use
    /// gRPC). The request goes out on the first poll.
    pub async fn call<Req: Message, Resp: Message + Default>(
        &self,
        op: Op,
        req: &Req,
    ) -> Option<Result<Resp>> {
        if crate::telemetry::TraceParent::current().is_some() {
            return None;
        }
        let body = req.encode_to_vec();
        // A large batch: gRPC carries it (the master reads no more here).
        if body.len() > wire::MAX_REQUEST {
            return None;
        }
        let addr = self.route.current()?;
        if self.is_refused(&addr) || self.is_refused(&unserved(&addr, op)) {
            return None;
        }
        let mut conn = match self.take(&addr) {
            Some(c) => c,
            None => match tokio::time::timeout(DIAL_TIMEOUT, self.dial(&addr)).await {
                Ok(Ok(Ok(c))) => c,
                Ok(Ok(Err(e))) => {
                    tracing::debug!(%addr, error = %e, "quick calls refused; using gRPC");
                    self.refused
                        .lock()
                        .expect("refused lock")
                        .insert(addr, Instant::now() + RECHECK);
                    return None;
                }
                // Not reached (gRPC reports why), or too slow: left alone
                // for a moment rather than dialled on every call.
                Ok(Err(_)) | Err(_) => {
                    self.refused
                        .lock()
                        .expect("refused lock")
                        .insert(addr, Instant::now() + UNREACHABLE);
                    return None;
                }
            },
        };
        let asked = tokio::time::timeout(CALL_TIMEOUT, async {
            wire::write_request(&mut conn, op as u8, &body).await?;
            loop {
                match tokio::time::timeout(SILENCE, wire::read_frame(&mut conn, op.max_answer()))
                    .await
                {
                    Ok(Ok(Some(a))) => return Ok(a),
                    Ok(Ok(None)) => continue,
                    Ok(Err(e)) => return Err(e),
                    Err(_) => {
                        // Hung (paused, cut off): the route picks another
                        // master next, and so does this call's gRPC retry.
                        self.route.forget(&addr);
                        return Err(Error::unavailable(format!(
                            "master {addr} went silent during {} for {SILENCE:?}",
                            op.method()
                        )));
                    }
                }
            }
        })
        .await;
        // A connection that failed or timed out mid-call is dropped (its
        // stream may hold half an answer); the call may have been served.
        let answer = match asked {
            Ok(Ok(a)) => a,
            Ok(Err(e)) => return Some(Err(e)),
            Err(_) => {
                return Some(Err(Error::unavailable(format!(
                    "master {addr} did not answer {} within {CALL_TIMEOUT:?}",
                    op.method()
                ))))
            }
        };
        self.give_back(addr.clone(), conn);
        match answer {
            // A follower, or a master whose term is over, refused before
            // acting (after acting it answers `Unavailable`): gRPC follows
            // the leader.
            Err(e) if e.code == Code::NotLeader => None,
            // An older master does not know this op (it refused before
            // acting): gRPC for it, and for a while no quick attempt.
            Err(e) if wire::is_unknown_op(&e) => {
                tracing::info!(%addr, op = op.method(), error = %e, "the master does not take this call quickly; using gRPC");
                self.refused
                    .lock()
                    .expect("refused lock")
                    .insert(unserved(&addr, op), Instant::now() + RECHECK);
                None
            }
            Err(e) => {
                self.answered.fetch_add(1, Ordering::Relaxed);
                Some(Err(e))
            }
            Ok(bytes) => {
                self.answered.fetch_add(1, Ordering::Relaxed);
                Some(Resp::decode(bytes.as_slice()).map_err(|e| {
                    Error::internal(format!("undecodable {} answer: {e}", op.method()))
                }))
            }
        }
    }

    fn is_refused(&self, addr: &str) -> bool {
        let mut r = self.refused.lock().expect("refused lock");
        match r.get(addr) {
            Some(until) if *until > Instant::now() => true,
            Some(_) => {
                r.remove(addr);
                false
            }
            None => false,
        }
    }

    /// An idle connection to `addr`; those to other addresses (a former
    /// leader) are closed, and so are those the master closed meanwhile
    /// (it restarted or stopped): nothing may arrive on an idle one.
    fn take(&self, addr: &str) -> Option<Conn> {
        let mut idle = self.idle.lock().expect("idle lock");
        idle.retain(|(a, _)| a == addr);
        while let Some((_, c)) = idle.pop() {
            let quiet = c.buffer().is_empty()
                && matches!(c.get_ref().try_read(&mut [0u8; 1]),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
            if quiet {
                return Some(c);
            }
        }
        None
    }

    fn give_back(&self, addr: String, conn: Conn) {
        let mut idle = self.idle.lock().expect("idle lock");
        if idle.len() < IDLE {
            idle.push((addr, conn));
        }
    }

    /// A new connection to `addr` that passed its hello. The outer error:
    /// `addr` could not be reached; the inner: the master there does not
    /// serve quick lookups to this client.
    async fn dial(&self, addr: &str) -> Result<Result<Conn>> {
        // The route may name the master as a URI (`http://host:port`).
        let hostport = addr
            .trim_start_matches("http://")
            .trim_start_matches("https://")
            .trim_end_matches('/');
        let s = TcpStream::connect(hostport)
            .await
            .map_err(|e| Error::unavailable(format!("connect {addr}: {e}")))?;
        let _ = s.set_nodelay(true);
        let mut conn = BufReader::new(s);
        let greeted = async {
            conn.write_all(&self.hello)
                .await
                .map_err(|e| Error::unavailable(format!("hello to {addr}: {e}")))?;
            // An older master closes the connection (it is not HTTP/2).
            wire::read_answer(&mut conn, wire::MAX_ANSWER).await?
        };
        Ok(greeted.await.map(|_| conn))
    }
}

/// The `refused` entry of one op an address does not serve (the address
/// itself stays usable for the others).
fn unserved(addr: &str, op: Op) -> String {
    format!("{addr}#op{}", op as u8)
}
