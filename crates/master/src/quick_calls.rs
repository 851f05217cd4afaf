//! The master's port serves two protocols: gRPC, and quick calls
//! (`strata_common::quick_wire`: clients' lookups and puts, single and
//! batched, nodes' heartbeats, on plain connections answered inline with no task
//! hand-off). Each accepted connection is
//! told apart by its first bytes and either served here or handed to the
//! gRPC server.

use crate::connections::{Connections, Held};
use crate::service::MasterService;
use crate::serving::Serving;
use prost::Message;
use std::sync::Arc;
use std::time::Duration;
use strata_common::auth::{Credentials, Role, Roles};
use strata_common::quick_wire as wire;
use strata_common::{Error, Result};
use strata_proto as pb;
use strata_proto::master_server::Master as _;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// How long a new connection may take to send its first bytes (or a quick
/// lookup client its hello) before it is closed.
const FIRST_BYTES: Duration = Duration::from_secs(10);
/// A quick call connection with no request for this long is closed (its
/// client finds it closed before reuse and dials again).
const IDLE: Duration = Duration::from_secs(300);

/// Accepts on `listener` until `stop`: quick lookup connections are served
/// here, the rest come out of the returned stream for the gRPC server.
pub(crate) fn split_incoming(
    listener: TcpListener,
    serving: Arc<Serving>,
    creds: Arc<Credentials>,
    conns: Arc<Connections>,
    stop: CancellationToken,
) -> impl futures::Stream<Item = std::io::Result<Held>> {
    let (tx, rx) = mpsc::channel::<Held>(64);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = stop.cancelled() => return,
                a = listener.accept() => a,
            };
            match accepted {
                Ok((s, peer)) => {
                    // Over the caps: closed before anything is read.
                    let slot = match conns.admit(peer.ip()) {
                        Ok(slot) => slot,
                        Err(why) => {
                            tracing::debug!(%peer, why, "master connection refused: no slot");
                            continue;
                        }
                    };
                    let _ = s.set_nodelay(true);
                    let (tx, serving, creds, stop) =
                        (tx.clone(), serving.clone(), creds.clone(), stop.clone());
                    tokio::spawn(async move {
                        match tokio::time::timeout(FIRST_BYTES, is_quick(&s)).await {
                            Ok(Ok(true)) => {
                                serve(s, &serving, &creds, stop).await;
                                drop(slot);
                            }
                            Ok(Ok(false)) => {
                                let _ = tx.send(Held::new(s, slot)).await;
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

/// Whether a connection opens with the quick call [`wire::MAGIC`]. HTTP/2
/// (gRPC) opens with its preface, `PRI * HTTP/2.0…`, which differs from the
/// magic at the first byte: one byte decides, so nothing polls for the rest
/// (a peer trickling the magic waits in `greet`'s read instead, which checks
/// all of it).
async fn is_quick(s: &TcpStream) -> std::io::Result<bool> {
    let mut first = [0u8; 1];
    if s.peek(&mut first).await? == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(first[0] == wire::MAGIC[0])
}

/// Serves one quick call connection until it closes or `stop` fires.
async fn serve(s: TcpStream, serving: &Serving, creds: &Credentials, stop: CancellationToken) {
    let (rd, mut wr) = s.into_split();
    let mut rd = BufReader::new(rd);
    let roles = match tokio::time::timeout(FIRST_BYTES, greet(&mut rd, creds)).await {
        Ok(Ok(roles)) => {
            if !sent(wire::write_answer(&mut wr, &Ok(Vec::new()))).await {
                return;
            }
            roles
        }
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "quick call hello refused");
            sent(wire::write_answer(&mut wr, &Err(e))).await;
            return;
        }
        Err(_) => return,
    };
    loop {
        let request = tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(IDLE) => return,
            r = wire::read_request(&mut rd) => r,
        };
        let (op, body) = match request {
            Ok(Some(r)) => r,
            Ok(None) => return,
            Err(e) => {
                // A length over the limit: the stream cannot be trusted on.
                sent(wire::write_answer(&mut wr, &Err(e))).await;
                return;
            }
        };
        // A call in flight ends with the connection at shutdown, as gRPC's
        // do when their server stops. A long one says it is still alive.
        let answering = call(serving, creds, roles, op, &body);
        tokio::pin!(answering);
        let mut busy = tokio::time::interval_at(
            tokio::time::Instant::now() + wire::BUSY_EVERY,
            wire::BUSY_EVERY,
        );
        // A client that goes away (or breaks the one-call-at-a-time rule)
        // ends the call, as a reset stream ends a gRPC handler.
        let answer = loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                a = &mut answering => break a,
                _ = rd.fill_buf() => return,
                _ = busy.tick() => {
                    if !sent(wire::write_busy(&mut wr)).await {
                        return;
                    }
                }
            }
        };
        if !sent(wire::write_answer(&mut wr, &answer)).await {
            return;
        }
    }
}

/// Reads the hello after the magic: the roles its token proves (some role:
/// each call is then checked against its own, as over gRPC).
async fn greet<R: tokio::io::AsyncRead + Unpin>(rd: &mut R, creds: &Credentials) -> Result<Roles> {
    let mut magic = [0u8; 8];
    rd.read_exact(&mut magic)
        .await
        .map_err(|e| Error::unavailable(format!("quick call connection: {e}")))?;
    if &magic != wire::MAGIC {
        return Err(Error::invalid(
            "not a quick call connection: it opened with neither the quick call magic nor HTTP/2",
        ));
    }
    let (version, token) = wire::read_hello(rd).await?;
    if version != wire::VERSION {
        return Err(Error::invalid(format!(
            "quick call version {version} is not served here (this master serves {})",
            wire::VERSION
        )));
    }
    let roles = creds.roles_of((!token.is_empty()).then_some(token.as_slice()))?;
    if roles.none() {
        // No token where the master has credentials: named as gRPC would.
        creds.check(roles, Role::Client)?;
    }
    Ok(roles)
}

/// Whether a write went out within [`FIRST_BYTES`] (a client that stopped
/// reading does not hold its task forever).
async fn sent(w: impl std::future::Future<Output = Result<()>>) -> bool {
    matches!(tokio::time::timeout(FIRST_BYTES, w).await, Ok(Ok(())))
}

/// Decodes `body` as the call's request, runs the gRPC handler itself
/// (same checks, metrics and answers) and encodes its response.
macro_rules! unary {
    ($svc:expr, $roles:expr, $body:expr, $method:ident, $req:ty) => {{
        let req = <$req>::decode($body)
            .map_err(|e| Error::invalid(format!("undecodable {}: {e}", stringify!($method))))?;
        let mut req = tonic::Request::new(req);
        req.extensions_mut().insert($roles);
        $svc.$method(req)
            .await
            .map(|r| r.into_inner().encode_to_vec())
            .map_err(Error::from)
    }};
}

/// One call, exactly as the gRPC gate and service serve it: on the current
/// term's master, its answer counting only if the leadership still holds.
async fn call(
    serving: &Serving,
    creds: &Credentials,
    roles: Roles,
    op: u8,
    body: &[u8],
) -> Result<Vec<u8>> {
    let Some(op) = wire::Op::from_u8(op) else {
        return Err(Error::invalid(format!(
            "quick call op {op} is not served here (version {})",
            wire::VERSION
        )));
    };
    creds.check(roles, crate::service::policy_of(op.method()).role)?;
    let (master, leadership) = serving.current_term()?;
    let svc = MasterService { master };
    let r: Result<Vec<u8>> = match op {
        wire::Op::GetReplicas => unary!(svc, roles, body, get_replicas, pb::GetReplicasRequest),
        wire::Op::PutStart => unary!(svc, roles, body, put_start, pb::PutStartRequest),
        wire::Op::PutEnd => unary!(svc, roles, body, put_end, pb::PutEndRequest),
        wire::Op::Heartbeat => unary!(svc, roles, body, heartbeat, pb::HeartbeatRequest),
        wire::Op::BatchGetReplicas => unary!(
            svc,
            roles,
            body,
            batch_get_replicas,
            pb::BatchGetReplicasRequest
        ),
        wire::Op::BatchPutStart => {
            unary!(svc, roles, body, batch_put_start, pb::BatchPutStartRequest)
        }
        wire::Op::BatchPutEnd => unary!(svc, roles, body, batch_put_end, pb::BatchPutEndRequest),
    };
    if !leadership.is_valid() {
        // Not `NotLeader`: the call may have acted, and a client must not
        // send it again elsewhere as if it had not; its own retry decides.
        return Err(Error::unavailable(
            "this master's leadership ended while the call ran; retry (the leader may have changed)",
        ));
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_common::Code;

    /// A connected pair on loopback.
    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        (c, l.accept().await.unwrap().0)
    }

    /// The first byte decides at once: a peer that sent only the magic's
    /// first byte is not polled for the rest (it used to be, every
    /// millisecond, until it gave up), and HTTP/2's preface goes to gRPC.
    #[tokio::test]
    async fn the_first_byte_tells_the_protocols_apart_without_waiting_for_more() {
        use tokio::io::AsyncWriteExt;
        for (sent, quick) in [(&b"S"[..], true), (&b"PRI * HTTP/2.0"[..], false)] {
            let (mut c, s) = pair().await;
            c.write_all(sent).await.unwrap();
            let r = tokio::time::timeout(Duration::from_millis(500), is_quick(&s)).await;
            assert_eq!(r.expect("decided at once").unwrap(), quick, "{sent:?}");
        }
        let (c, s) = pair().await;
        drop(c);
        assert!(is_quick(&s).await.is_err(), "closed before a byte");
    }

    /// `greet` checks the whole magic: a connection that shares only its
    /// first byte is refused, not served.
    #[tokio::test]
    async fn a_connection_with_a_wrong_magic_is_refused() {
        let creds = Credentials::default();
        let hello = |magic: &[u8]| {
            let mut b = magic.to_vec();
            b.extend_from_slice(&wire::VERSION.to_le_bytes());
            b.extend_from_slice(&0u16.to_le_bytes());
            b
        };
        let right = hello(wire::MAGIC);
        assert!(greet(&mut right.as_slice(), &creds).await.is_ok());
        let wrong = hello(b"SXXXXXXX");
        let e = greet(&mut wrong.as_slice(), &creds).await.unwrap_err();
        assert_eq!(e.code, Code::InvalidArgument, "{e}");
    }

    #[tokio::test]
    async fn a_master_that_does_not_lead_answers_not_leader_and_unknown_ops_are_refused() {
        let s = Serving::new(
            crate::metrics::MasterMetrics::new(),
            "127.0.0.1:1".into(),
            "ha",
        );
        let creds = Credentials::default();
        let body = pb::GetReplicasRequest { key: "k".into() }.encode_to_vec();
        for op in wire::Op::ALL {
            let e = call(&s, &creds, Roles::ALL, op as u8, &body)
                .await
                .unwrap_err();
            assert_eq!(e.code, Code::NotLeader);
        }
        let e = call(&s, &creds, Roles::ALL, 9, &body).await.unwrap_err();
        assert_eq!(e.code, Code::InvalidArgument);
    }
}
