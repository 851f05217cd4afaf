//! The TCP data plane: a server that maps requests straight into segment
//! memory, and a pooled, chunking client.

mod client;
mod server;

pub use client::{
    spawn_give_back, spawn_give_back_held, HeldLease, TcpTransport, TcpTransportConfig,
};
pub use server::{current_peer, serve, serve_with, ServerLimits, ServerMetrics};

use std::io::{self, IoSlice};
use tokio::io::AsyncWriteExt;

/// Writes a header and a body with vectored writes (one syscall in the common
/// case, no copy of the body into a frame buffer).
pub(crate) async fn write_all_vectored<W: AsyncWriteExt + Unpin>(
    w: &mut W,
    mut head: &[u8],
    mut body: &[u8],
) -> io::Result<()> {
    // No allocation: every response of the servers goes through here.
    while !head.is_empty() || !body.is_empty() {
        let n = if head.is_empty() {
            w.write(body).await?
        } else {
            w.write_vectored(&[IoSlice::new(head), IoSlice::new(body)])
                .await?
        };
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        if n >= head.len() {
            body = &body[n - head.len()..];
            head = &[];
        } else {
            head = &head[n..];
        }
    }
    Ok(())
}

/// Slices handed to one vectored write (well under any IOV_MAX).
const MAX_SLICES: usize = 64;

/// Writes a header and then the concatenation of `body`'s slices with
/// vectored writes: an object of many parts goes out without being joined.
pub(crate) async fn write_all_gather<W: AsyncWriteExt + Unpin>(
    w: &mut W,
    head: &[u8],
    body: &[&[u8]],
) -> io::Result<()> {
    if let [one] = body {
        return write_all_vectored(w, head, one).await;
    }
    // What is left to write, in order; the first slice may be partly sent.
    let mut rest: Vec<&[u8]> = std::iter::once(head)
        .chain(body.iter().copied())
        .filter(|s| !s.is_empty())
        .collect();
    let mut first = 0;
    while first < rest.len() {
        let n = if first + 1 == rest.len() {
            w.write(rest[first]).await?
        } else {
            let slices: Vec<IoSlice<'_>> = rest[first..]
                .iter()
                .take(MAX_SLICES)
                .map(|s| IoSlice::new(s))
                .collect();
            w.write_vectored(&slices).await?
        };
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        let mut n = n;
        while n > 0 {
            let s = rest[first];
            if n >= s.len() {
                n -= s.len();
                first += 1;
            } else {
                rest[first] = &s[n..];
                n = 0;
            }
        }
    }
    Ok(())
}
