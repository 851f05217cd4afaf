//! The quick call protocol: the master's hottest unary calls (`GetReplicas`,
//! `PutStart`, `PutEnd`, and store nodes' long-polled `Heartbeat`) on a
//! plain TCP connection that shares its gRPC port, with the same messages,
//! checks and answers.
//!
//! Why: a first read is one lookup and one transfer, a put two calls and a
//! write, and a gRPC call costs
//! several task hand-offs on each side (the channel's buffer task, the
//! HTTP/2 connection tasks, a task per stream), each a thread wake-up; on
//! two cores that made a lookup ~140 us where a plain request and answer
//! on a socket take ~10. Here the caller's task writes the request and
//! reads the answer on a connection it holds alone, and the master answers
//! on the connection's task.
//!
//! The master tells the two apart by a connection's first bytes ([`MAGIC`]
//! cannot start an HTTP/2 preface), so no port, flag or Service changes.
//! An older master closes a connection that does not speak HTTP/2, and a
//! client then keeps to gRPC. Every number is little-endian:
//!
//! ```text
//! hello    client: MAGIC (8) | version u16 | token length u16 | token
//!          master: code u32 | retryable u8 | message length u32 | message
//!                  (code 0: go on; otherwise the master closes)
//! request  length u32 | op u8 | the op's request (protobuf; length bytes)
//! answer   code u32 | retryable u8 | length u32 | the op's response
//!          (protobuf) when code is 0, else the error's message (UTF-8)
//! ```
//!
//! While a call runs (a put waiting for room or for its nodes), the master
//! sends an answer with code [`BUSY`] and no body every [`BUSY_EVERY`], so
//! a client tells a slow call from a master that stopped (paused, cut off)
//! by silence, as gRPC's keep-alive pings do.
//!
//! The hello's token is checked once, as gRPC checks a call's: it must
//! prove some role. Each call is then checked against its method's role
//! (a member may heartbeat, not look up; a client the reverse).
//!
//! An op a master does not know is answered `InvalidArgument` and the
//! connection stays usable; new ops are added with new numbers (a caller
//! that meets the refusal uses gRPC). `Heartbeat` (op 4) came after the
//! first three: a master of that release refuses it that way, and also
//! refuses a member's hello (it served clients only). The batch calls
//! (`BatchGetReplicas`, `BatchPutStart`, `BatchPutEnd`, ops 5 to 7) came
//! next; a request longer than [`MAX_REQUEST`] goes over gRPC.
//!
//! Requests go one at a time per connection, in order.

use crate::{Code, Error, Result};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// A connection's first bytes: not an HTTP/2 preface (`PRI * HTTP/2.0`).
pub const MAGIC: &[u8; 8] = b"STRATAQC";

/// The calls a quick connection carries (`Master` RPCs of the same name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    GetReplicas = 1,
    PutStart = 2,
    PutEnd = 3,
    Heartbeat = 4,
    BatchGetReplicas = 5,
    BatchPutStart = 6,
    BatchPutEnd = 7,
}

impl Op {
    pub fn from_u8(b: u8) -> Option<Op> {
        match b {
            1 => Some(Op::GetReplicas),
            2 => Some(Op::PutStart),
            3 => Some(Op::PutEnd),
            4 => Some(Op::Heartbeat),
            5 => Some(Op::BatchGetReplicas),
            6 => Some(Op::BatchPutStart),
            7 => Some(Op::BatchPutEnd),
            _ => None,
        }
    }

    /// The gRPC method's name (for its role).
    pub fn method(self) -> &'static str {
        match self {
            Op::GetReplicas => "GetReplicas",
            Op::PutStart => "PutStart",
            Op::PutEnd => "PutEnd",
            Op::Heartbeat => "Heartbeat",
            Op::BatchGetReplicas => "BatchGetReplicas",
            Op::BatchPutStart => "BatchPutStart",
            Op::BatchPutEnd => "BatchPutEnd",
        }
    }

    /// Longest answer a caller accepts to this op: a heartbeat brings a
    /// page of the node's object log, a batch an answer per item (as large
    /// as gRPC would carry).
    pub fn max_answer(self) -> usize {
        match self {
            Op::Heartbeat | Op::BatchGetReplicas | Op::BatchPutStart | Op::BatchPutEnd => {
                MAX_LOG_ANSWER
            }
            Op::GetReplicas | Op::PutStart | Op::PutEnd => MAX_ANSWER,
        }
    }

    /// Every op, in number order.
    pub const ALL: [Op; 7] = [
        Op::GetReplicas,
        Op::PutStart,
        Op::PutEnd,
        Op::Heartbeat,
        Op::BatchGetReplicas,
        Op::BatchPutStart,
        Op::BatchPutEnd,
    ];
}

/// Whether `e` is a master's refusal of an op it does not know (an older
/// release): it refuses before acting, so the caller may send the call
/// over gRPC instead.
pub fn is_unknown_op(e: &Error) -> bool {
    e.code == Code::InvalidArgument
        && e.message.starts_with("quick call op ")
        && e.message.contains("is not served here")
}
/// The code of a "still working" answer (never an error code).
pub const BUSY: u32 = u32::MAX;
/// How often a master says it is still working on a call.
pub const BUSY_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// The protocol version a client asks for; a master refuses others.
pub const VERSION: u16 = 1;
/// Longest token a hello may carry.
pub const MAX_TOKEN: usize = 4096;
/// Longest request (a key is at most a few KiB; see the master's limits).
pub const MAX_REQUEST: usize = 64 << 10;
/// Longest answer a client accepts (a few replicas and a message).
pub const MAX_ANSWER: usize = 1 << 20;
/// Longest heartbeat answer a node accepts (`crate::grpc::MAX_MESSAGE`).
pub const MAX_LOG_ANSWER: usize = crate::grpc::MAX_MESSAGE;

/// The hello a client sends.
pub fn hello(token: Option<&str>) -> Result<Vec<u8>> {
    let token = token.unwrap_or_default().as_bytes();
    if token.len() > MAX_TOKEN {
        return Err(Error::invalid(format!(
            "token of {} bytes is longer than {MAX_TOKEN}",
            token.len()
        )));
    }
    let mut b = Vec::with_capacity(12 + token.len());
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(&VERSION.to_le_bytes());
    b.extend_from_slice(&(token.len() as u16).to_le_bytes());
    b.extend_from_slice(token);
    Ok(b)
}

/// Reads a hello after its [`MAGIC`] (already consumed): the version and
/// the token (empty when none was sent).
pub async fn read_hello<R: AsyncRead + Unpin>(r: &mut R) -> Result<(u16, Vec<u8>)> {
    let version = r.read_u16_le().await.map_err(io)?;
    let n = r.read_u16_le().await.map_err(io)? as usize;
    if n > MAX_TOKEN {
        return Err(Error::invalid(format!(
            "token of {n} bytes is longer than {MAX_TOKEN}"
        )));
    }
    let mut token = vec![0; n];
    r.read_exact(&mut token).await.map_err(io)?;
    Ok((version, token))
}

/// A request: its length, `op`, then `body`.
pub async fn write_request<W: AsyncWrite + Unpin>(w: &mut W, op: u8, body: &[u8]) -> Result<()> {
    if body.len() > MAX_REQUEST {
        return Err(Error::invalid(format!(
            "lookup of {} bytes is longer than {MAX_REQUEST}",
            body.len()
        )));
    }
    let mut b = Vec::with_capacity(5 + body.len());
    b.extend_from_slice(&(body.len() as u32).to_le_bytes());
    b.push(op);
    b.extend_from_slice(body);
    w.write_all(&b).await.map_err(io)
}

/// The next request's op and body; `None` at a clean end of the connection.
pub async fn read_request<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<(u8, Vec<u8>)>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(io(e)),
    }
    let n = u32::from_le_bytes(len) as usize;
    if n > MAX_REQUEST {
        return Err(Error::invalid(format!(
            "lookup of {n} bytes is longer than {MAX_REQUEST}"
        )));
    }
    let op = r.read_u8().await.map_err(io)?;
    let mut body = vec![0; n];
    r.read_exact(&mut body).await.map_err(io)?;
    Ok(Some((op, body)))
}

/// An answer (also a hello's): `Ok` carries the encoded response.
pub async fn write_answer<W: AsyncWrite + Unpin>(w: &mut W, r: &Result<Vec<u8>>) -> Result<()> {
    let (code, retryable, body) = match r {
        Ok(b) => (Code::Ok, false, b.as_slice()),
        Err(e) => (e.code, e.retryable(), e.message.as_bytes()),
    };
    let mut b = Vec::with_capacity(9 + body.len());
    b.extend_from_slice(&(code as u32).to_le_bytes());
    b.push(u8::from(retryable));
    b.extend_from_slice(&(body.len() as u32).to_le_bytes());
    b.extend_from_slice(body);
    w.write_all(&b).await.map_err(io)
}

/// "Still working on it" (see [`BUSY`]).
pub async fn write_busy<W: AsyncWrite + Unpin>(w: &mut W) -> Result<()> {
    let mut b = [0u8; 9];
    b[..4].copy_from_slice(&BUSY.to_le_bytes());
    w.write_all(&b).await.map_err(io)
}

/// Reads an answer of at most `max` bytes, past any [`BUSY`] ones: the
/// response's bytes, or the master's error. The outer error is the
/// connection's (it cannot be used again).
pub async fn read_answer<R: AsyncRead + Unpin>(r: &mut R, max: usize) -> Result<Result<Vec<u8>>> {
    loop {
        if let Some(a) = read_frame(r, max).await? {
            return Ok(a);
        }
    }
}

/// Reads one answer frame of at most `max` bytes; `None` for a [`BUSY`]
/// one.
pub async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    max: usize,
) -> Result<Option<Result<Vec<u8>>>> {
    let mut head = [0u8; 9];
    r.read_exact(&mut head).await.map_err(io)?;
    let code = u32::from_le_bytes(head[0..4].try_into().expect("4 bytes"));
    let retryable = head[4] != 0;
    let n = u32::from_le_bytes(head[5..9].try_into().expect("4 bytes")) as usize;
    if n > max {
        return Err(Error::internal(format!(
            "quick call answer of {n} bytes is longer than {max}"
        )));
    }
    let mut body = vec![0; n];
    r.read_exact(&mut body).await.map_err(io)?;
    if code == BUSY {
        return Ok(None);
    }
    if code == Code::Ok as u32 {
        return Ok(Some(Ok(body)));
    }
    let message = String::from_utf8_lossy(&body).into_owned();
    Ok(Some(Err(Error::from_parts(code, message, retryable))))
}

fn io(e: std::io::Error) -> Error {
    Error::unavailable(format!("lookup connection: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magic_cannot_start_an_http2_preface_and_ops_read_back() {
        assert!(!b"PRI * HTTP/2.0".starts_with(&MAGIC[..1]));
        assert_eq!(Op::ALL.len(), 7);
        for (i, op) in Op::ALL.into_iter().enumerate() {
            assert_eq!(op as usize, i + 1, "numbered in order");
            assert_eq!(Op::from_u8(op as u8), Some(op));
        }
        assert_eq!(Op::from_u8(0), None);
        assert_eq!(Op::from_u8(8), None);
        // Batches and log pages may be long; single answers are not.
        for op in [
            Op::Heartbeat,
            Op::BatchGetReplicas,
            Op::BatchPutStart,
            Op::BatchPutEnd,
        ] {
            assert_eq!(op.max_answer(), MAX_LOG_ANSWER, "{op:?}");
        }
        for op in [Op::GetReplicas, Op::PutStart, Op::PutEnd] {
            assert_eq!(op.max_answer(), MAX_ANSWER, "{op:?}");
        }
    }

    #[tokio::test]
    async fn a_hello_reads_back_and_an_overlong_token_is_refused() {
        let b = hello(Some("secret")).unwrap();
        assert_eq!(&b[..8], MAGIC);
        let (v, t) = read_hello(&mut &b[8..]).await.unwrap();
        assert_eq!((v, t.as_slice()), (VERSION, &b"secret"[..]));
        let at = "x".repeat(MAX_TOKEN);
        assert!(hello(Some(&at)).is_ok());
        let over = "x".repeat(MAX_TOKEN + 1);
        assert_eq!(hello(Some(&over)).unwrap_err().code, Code::InvalidArgument);
        // A hello claiming a longer token is refused before reading it.
        let mut forged = vec![];
        forged.extend_from_slice(&VERSION.to_le_bytes());
        forged.extend_from_slice(&((MAX_TOKEN + 1) as u16).to_le_bytes());
        let e = read_hello(&mut forged.as_slice()).await.unwrap_err();
        assert_eq!(e.code, Code::InvalidArgument);
    }

    #[tokio::test]
    async fn requests_read_back_and_one_over_the_limit_is_refused() {
        let mut b = vec![];
        write_request(&mut b, 2, b"abc").await.unwrap();
        write_request(&mut b, 1, &vec![7; MAX_REQUEST])
            .await
            .unwrap();
        let mut r = b.as_slice();
        assert_eq!(
            read_request(&mut r).await.unwrap().unwrap(),
            (2, b"abc".to_vec())
        );
        let (op, body) = read_request(&mut r).await.unwrap().unwrap();
        assert_eq!((op, body.len()), (1, MAX_REQUEST));
        assert!(read_request(&mut r).await.unwrap().is_none(), "clean end");
        let mut over = vec![];
        assert!(write_request(&mut over, 1, &vec![0; MAX_REQUEST + 1])
            .await
            .is_err());
        over.extend_from_slice(&((MAX_REQUEST + 1) as u32).to_le_bytes());
        let e = read_request(&mut over.as_slice()).await.unwrap_err();
        assert_eq!(e.code, Code::InvalidArgument);
    }

    #[tokio::test]
    async fn answers_carry_bytes_or_the_error_with_its_code_and_retryability() {
        let mut b = vec![];
        write_answer(&mut b, &Ok(b"resp".to_vec())).await.unwrap();
        let e = Error::new(Code::NotLeader, "not the leader");
        write_busy(&mut b).await.unwrap();
        write_answer(&mut b, &Err(e.clone())).await.unwrap();
        write_busy(&mut b).await.unwrap();
        let mut r = b.as_slice();
        assert_eq!(
            read_answer(&mut r, MAX_ANSWER).await.unwrap().unwrap(),
            b"resp"
        );
        let got = read_answer(&mut r, MAX_ANSWER).await.unwrap().unwrap_err();
        assert_eq!(got.code, Code::NotLeader);
        assert_eq!(got.retryable(), e.retryable());
        assert_eq!(got.message, e.message);
        assert!(
            read_frame(&mut r, MAX_ANSWER).await.unwrap().is_none(),
            "busy"
        );
        // A truncated answer is the connection's error.
        assert!(read_answer(&mut &b[..5], MAX_ANSWER).await.is_err());
    }

    #[tokio::test]
    async fn an_answer_at_its_limit_reads_and_one_byte_over_is_refused() {
        let mut b = vec![];
        write_answer(&mut b, &Ok(vec![1; 100])).await.unwrap();
        assert_eq!(
            read_answer(&mut b.as_slice(), 100)
                .await
                .unwrap()
                .unwrap()
                .len(),
            100
        );
        let e = read_answer(&mut b.as_slice(), 99).await.unwrap_err();
        assert_eq!(e.code, Code::Internal);
        // Heartbeats carry log pages as large as gRPC's; lookups stay small.
        assert_eq!(Op::Heartbeat.max_answer(), crate::grpc::MAX_MESSAGE);
        assert_eq!(Op::GetReplicas.max_answer(), MAX_ANSWER);
    }
}
