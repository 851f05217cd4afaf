//! The TCP data plane: a server that maps requests straight into segment
//! memory, and a pooled, chunking client.

mod client;
mod server;

pub use client::{
    spawn_give_back, spawn_give_back_held, HeldLease, TcpTransport, TcpTransportConfig,
};
pub use server::{serve, serve_with, ServerLimits, ServerMetrics};

use std::io::{self, IoSlice};
use tokio::io::AsyncWriteExt;

/// Writes a header and a body with vectored writes (one syscall in the common
/// case, no copy of the body into a frame buffer).
pub(crate) async fn write_all_vectored<W: AsyncWriteExt + Unpin>(
    w: &mut W,
    mut head: &[u8],
    mut body: &[u8],
) -> io::Result<()> {
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
