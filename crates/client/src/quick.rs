//! Quick lookups: `GetReplicas` on plain connections to the leader
//! (`strata_common::lookup_wire`), each held by one caller for one request
//! and answer, so a lookup costs the two sockets' wake-ups and not a gRPC
//! call's task hand-offs (on this 2-core machine ~10 to 20 us against
//! ~140 us for a first 4 KiB read; docs/benchmarks.md).
//!
//! Everything else stays on gRPC, which also remains the way back whenever
//! a quick lookup cannot answer: no leader known yet, a master that does
//! not speak the protocol (an older one) or refuses the hello, a follower,
//! a broken connection, a timeout. Traced calls use gRPC too, so the
//! master's span joins the caller's trace.

use prost::Message;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use strata_common::auth::Secret;
use strata_common::leader::LeaderChannel;
use strata_common::lookup_wire as wire;
use strata_common::{Code, Error, Result};
use strata_proto as pb;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// Idle connections kept for reuse (a connection per concurrent lookup).
const IDLE: usize = 8;
/// Longest a dial, hello or lookup may take before gRPC is asked instead.
const TIMEOUT: Duration = Duration::from_secs(3);
/// How long an address that refused the protocol is left alone.
const RECHECK: Duration = Duration::from_secs(30);

type Conn = BufReader<TcpStream>;

pub(crate) struct QuickLookups {
    route: LeaderChannel,
    hello: Vec<u8>,
    idle: Mutex<Vec<(String, Conn)>>,
    refused: Mutex<HashMap<String, Instant>>,
    answered: AtomicU64,
}

impl QuickLookups {
    pub(crate) fn new(route: LeaderChannel, token: Option<&Secret>) -> Result<QuickLookups> {
        Ok(QuickLookups {
            route,
            hello: wire::hello(token.map(|t| t.expose()))?,
            idle: Mutex::new(Vec::new()),
            refused: Mutex::new(HashMap::new()),
            answered: AtomicU64::new(0),
        })
    }

    /// Lookups the master answered this way (for tests and engines' metrics).
    pub(crate) fn answered(&self) -> u64 {
        self.answered.load(Ordering::Relaxed)
    }

    /// The master's answer for `key`, or `None`: ask over gRPC instead.
    pub(crate) async fn get(&self, key: &str) -> Option<Result<pb::GetReplicasResponse>> {
        if strata_common::telemetry::TraceParent::current().is_some() {
            return None;
        }
        let addr = self.route.current()?;
        if self.is_refused(&addr) {
            return None;
        }
        let mut conn = match self.take(&addr) {
            Some(c) => c,
            None => match tokio::time::timeout(TIMEOUT, self.dial(&addr)).await {
                Ok(Ok(Ok(c))) => c,
                Ok(Ok(Err(e))) => {
                    tracing::debug!(%addr, error = %e, "quick lookups refused; using gRPC");
                    self.refused
                        .lock()
                        .expect("refused lock")
                        .insert(addr, Instant::now() + RECHECK);
                    return None;
                }
                // Not reached (gRPC reports why), or too slow.
                Ok(Err(_)) | Err(_) => return None,
            },
        };
        let body = pb::GetReplicasRequest {
            key: key.to_string(),
        }
        .encode_to_vec();
        let asked = tokio::time::timeout(TIMEOUT, async {
            wire::write_request(&mut conn, &body).await?;
            conn.flush()
                .await
                .map_err(|e| Error::unavailable(e.to_string()))?;
            wire::read_answer(&mut conn).await
        })
        .await;
        // A connection that failed or timed out mid-request is dropped: its
        // stream may hold half an answer.
        let answer = asked.ok()?.ok()?;
        self.give_back(addr, conn);
        match answer {
            // A follower, or a leader stepping down: gRPC follows the leader.
            Err(e) if e.code == Code::NotLeader => None,
            Err(e) => {
                self.answered.fetch_add(1, Ordering::Relaxed);
                Some(Err(e))
            }
            Ok(bytes) => {
                self.answered.fetch_add(1, Ordering::Relaxed);
                Some(
                    pb::GetReplicasResponse::decode(bytes.as_slice())
                        .map_err(|e| Error::internal(format!("undecodable lookup answer: {e}"))),
                )
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
    /// leader) are closed.
    fn take(&self, addr: &str) -> Option<Conn> {
        let mut idle = self.idle.lock().expect("idle lock");
        idle.retain(|(a, _)| a == addr);
        idle.pop().map(|(_, c)| c)
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
        let s = TcpStream::connect(addr)
            .await
            .map_err(|e| Error::unavailable(format!("connect {addr}: {e}")))?;
        let _ = s.set_nodelay(true);
        let mut conn = BufReader::new(s);
        let greeted = async {
            conn.write_all(&self.hello)
                .await
                .map_err(|e| Error::unavailable(format!("hello to {addr}: {e}")))?;
            // An older master closes the connection (it is not HTTP/2).
            wire::read_answer(&mut conn).await?
        };
        Ok(greeted.await.map(|_| conn))
    }
}
