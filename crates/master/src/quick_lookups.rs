//! The master's port serves two protocols: gRPC, and quick lookups
//! (`strata_common::lookup_wire`: `GetReplicas` on a plain connection,
//! answered inline with no task hand-off). Each accepted connection is
//! told apart by its first bytes and either served here or handed to the
//! gRPC server.

use crate::serving::Serving;
use prost::Message;
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_common::auth::{Credentials, Role};
use strata_common::lookup_wire as wire;
use strata_common::{Error, Result};
use strata_proto as pb;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// How long a new connection may take to send its first bytes (or a quick
/// lookup client its hello) before it is closed.
const FIRST_BYTES: Duration = Duration::from_secs(10);

/// Accepts on `listener` until `stop`: quick lookup connections are served
/// here, the rest come out of the returned stream for the gRPC server.
pub(crate) fn split_incoming(
    listener: TcpListener,
    serving: Arc<Serving>,
    creds: Arc<Credentials>,
    stop: CancellationToken,
) -> impl futures::Stream<Item = std::io::Result<TcpStream>> {
    let (tx, rx) = mpsc::channel::<TcpStream>(64);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = stop.cancelled() => return,
                a = listener.accept() => a,
            };
            match accepted {
                Ok((s, _)) => {
                    let _ = s.set_nodelay(true);
                    let (tx, serving, creds, stop) =
                        (tx.clone(), serving.clone(), creds.clone(), stop.clone());
                    tokio::spawn(async move {
                        match tokio::time::timeout(FIRST_BYTES, is_quick(&s)).await {
                            Ok(Ok(true)) => serve(s, &serving, &creds, stop).await,
                            Ok(Ok(false)) => {
                                let _ = tx.send(s).await;
                            }
                            // Closed, failed, or silent: nothing to serve.
                            Ok(Err(_)) | Err(_) => {}
                        }
                    });
                }
                Err(e) => {
                    // Out of descriptors, say: back off instead of spinning.
                    tracing::warn!(error = %e, "accepting a master connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    });
    futures::stream::unfold(
        rx,
        |mut rx| async move { rx.recv().await.map(|s| (Ok(s), rx)) },
    )
}

/// Whether a connection opens with the quick lookup [`wire::MAGIC`]; an
/// HTTP/2 client differs at its first byte, so gRPC waits for nothing.
async fn is_quick(s: &TcpStream) -> std::io::Result<bool> {
    let mut first = [0u8; 8];
    for _ in 0..1000 {
        let n = s.peek(&mut first).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        if first[..n] != wire::MAGIC[..n] {
            return Ok(false);
        }
        if n == wire::MAGIC.len() {
            return Ok(true);
        }
        // The magic's start arrived alone: wait for the rest.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Err(std::io::ErrorKind::TimedOut.into())
}

/// Serves one quick lookup connection until it closes or `stop` fires.
async fn serve(s: TcpStream, serving: &Serving, creds: &Credentials, stop: CancellationToken) {
    let (rd, mut wr) = s.into_split();
    let mut rd = BufReader::new(rd);
    let stage = match tokio::time::timeout(FIRST_BYTES, greet(&mut rd, creds)).await {
        Ok(Ok(stage)) => {
            if wr.write_all(&ok_answer()).await.is_err() {
                return;
            }
            stage
        }
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "quick lookup hello refused");
            let _ = wire::write_answer(&mut wr, &Err(e)).await;
            return;
        }
        Err(_) => return,
    };
    loop {
        let body = tokio::select! {
            _ = stop.cancelled() => return,
            b = wire::read_request(&mut rd) => b,
        };
        let body = match body {
            Ok(Some(b)) => b,
            Ok(None) => return,
            Err(e) => {
                // A length over the limit: the stream cannot be trusted on.
                let _ = wire::write_answer(&mut wr, &Err(e)).await;
                return;
            }
        };
        let answer = lookup(serving, &body, stage);
        if wire::write_answer(&mut wr, &answer).await.is_err() {
            return;
        }
    }
}

/// Reads the hello after the magic: whether the token may look up keys,
/// and whether lookups stage SSD objects for one-sided reads (rdma role).
async fn greet<R: tokio::io::AsyncRead + Unpin>(rd: &mut R, creds: &Credentials) -> Result<bool> {
    let mut magic = [0u8; 8];
    rd.read_exact(&mut magic)
        .await
        .map_err(|e| Error::unavailable(format!("lookup connection: {e}")))?;
    let (version, token) = wire::read_hello(rd).await?;
    if version != wire::VERSION {
        return Err(Error::invalid(format!(
            "quick lookup version {version} is not served here (this master serves {})",
            wire::VERSION
        )));
    }
    let roles = creds.roles_of((!token.is_empty()).then_some(token.as_slice()))?;
    creds.check(roles, crate::service::policy_of("GetReplicas").role)?;
    Ok(creds.is_empty() || roles.has(Role::Rdma))
}

fn ok_answer() -> Vec<u8> {
    // code 0, not retryable, empty body.
    vec![0; 9]
}

/// One lookup, exactly as the gRPC `GetReplicas` serves it.
fn lookup(serving: &Serving, body: &[u8], stage: bool) -> Result<Vec<u8>> {
    let t0 = Instant::now();
    let req = pb::GetReplicasRequest::decode(body)
        .map_err(|e| Error::invalid(format!("undecodable lookup: {e}")))?;
    serving.on_leader(|m| {
        let r = m.get_replicas_for(&req.key, stage);
        crate::service::observe(&m.metrics, "get_replicas", t0, &r);
        r.map(|v| v.encode_to_vec())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_common::Code;

    #[test]
    fn a_master_that_does_not_lead_answers_not_leader_and_bad_bodies_are_refused() {
        let s = Serving::new(
            crate::metrics::MasterMetrics::new(),
            "127.0.0.1:1".into(),
            "ha",
        );
        let body = pb::GetReplicasRequest { key: "k".into() }.encode_to_vec();
        assert_eq!(lookup(&s, &body, false).unwrap_err().code, Code::NotLeader);
        assert_eq!(
            lookup(&s, &[0xff; 3], false).unwrap_err().code,
            Code::InvalidArgument
        );
    }
}
