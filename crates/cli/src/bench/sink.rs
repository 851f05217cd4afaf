//! `strata bench sink`: the raw loopback TCP peer of `python -m
//! strata.bench`'s baseline rows. It stores nothing and checks nothing but
//! its framing: a put's bytes land in DRAM (the next stretch of a
//! per-connection arena larger than the caches, as a store node's segment
//! takes objects) and a get's bytes come from there. So those rows are the
//! floor of any store on this machine's loopback, driven by the same Python
//! threads and buffers as Strata's and the seed system's rows: a process
//! boundary, the kernel's copies, a wake-up each way, and no metadata.
//!
//! Wire (little-endian): a request is `op: u32` (1 put, 2 get), 4 bytes
//! of zeros, `len: u64` (at most the arena). A put's `len` bytes follow
//! and are answered with `len` as 8 bytes; a get is answered with `len`
//! bytes. Anything else closes the connection.

use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const PUT: u32 = 1;
const GET: u32 = 2;

#[derive(Debug, clap::Args)]
pub struct SinkArgs {
    /// Where to listen (loopback only: it trusts its peers with nothing,
    /// but serves anyone who connects)
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// DRAM per connection that puts land in and gets come from, cycled
    /// through (larger than the caches); also the largest object a request
    /// may move
    #[arg(long, default_value = "256MiB")]
    pub arena: strata_common::units::ByteSize,
    /// Arenas made before listening (connections at once without making
    /// one, which would stall that connection's first request)
    #[arg(long, default_value_t = 4)]
    pub arenas: usize,
}

/// Arenas not in use: a connection takes one and gives it back.
type Pool = std::sync::Arc<std::sync::Mutex<Vec<Vec<u8>>>>;

/// Written, so its pages are resident (not the shared zero page).
fn arena(len: usize) -> Vec<u8> {
    vec![1u8; len]
}

pub async fn run(a: SinkArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        a.listen.ip().is_loopback(),
        "--listen {} is not a loopback address: the sink serves anyone who connects",
        a.listen
    );
    anyhow::ensure!(
        (1..=1 << 40).contains(&a.arena.0),
        "--arena must be between 1 byte and 1 TiB"
    );
    let len = a.arena.0 as usize;
    let pool: Pool = Default::default();
    pool.lock()
        .expect("pool lock")
        .extend((0..a.arenas).map(|_| arena(len)));
    let listener = TcpListener::bind(a.listen).await?;
    // The benchmark reads the address it was given from here.
    println!("listening {}", listener.local_addr()?);
    loop {
        // A peer that reset, or no file descriptor left: that connection
        // fails, not the sink.
        let s = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!(error = %e, "sink: accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        if let Err(e) = s.set_nodelay(true) {
            tracing::warn!(error = %e, "sink: cannot set TCP_NODELAY");
            continue;
        }
        let pool = pool.clone();
        tokio::spawn(async move {
            let taken = pool.lock().expect("pool lock").pop();
            let mut mem = taken.unwrap_or_else(|| arena(len));
            if let Err(e) = serve(s, &mut mem).await {
                tracing::debug!(error = %e, "sink connection ended");
            }
            pool.lock().expect("pool lock").push(mem);
        });
    }
}

async fn serve(mut s: TcpStream, mem: &mut [u8]) -> std::io::Result<()> {
    let mut at = 0usize;
    let mut head = [0u8; 16];
    loop {
        match s.read_exact(&mut head).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let op = u32::from_le_bytes(head[0..4].try_into().expect("4 bytes"));
        let len = u64::from_le_bytes(head[8..16].try_into().expect("8 bytes"));
        if len > mem.len() as u64 || head[4..8] != [0; 4] {
            return Err(std::io::Error::other(format!(
                "bad request: op {op}, {len} bytes"
            )));
        }
        let len = len as usize;
        if at + len > mem.len() {
            at = 0;
        }
        let stretch = &mut mem[at..at + len];
        at += len;
        match op {
            PUT => {
                s.read_exact(stretch).await?;
                s.write_all(&(len as u64).to_le_bytes()).await?;
            }
            GET => s.write_all(stretch).await?,
            _ => return Err(std::io::Error::other(format!("unknown op {op}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A sink of one arena of `ARENA` bytes; each connection's end
    /// (`serve`'s result, or its panic) comes back on the channel.
    const ARENA: usize = 1 << 20;

    async fn sink() -> (
        std::net::SocketAddr,
        tokio::sync::mpsc::UnboundedReceiver<Result<std::io::Result<()>, tokio::task::JoinError>>,
    ) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                let served = tokio::spawn(async move {
                    let mut mem = arena(ARENA);
                    serve(s, &mut mem).await
                });
                let _ = tx.send(served.await);
            }
        });
        (addr, rx)
    }

    fn head(op: u32, len: u64) -> Vec<u8> {
        [&op.to_le_bytes()[..], &[0; 4], &len.to_le_bytes()].concat()
    }

    /// A put is answered with its length, a get with that many bytes; a
    /// request past the largest object, of an unknown op or with a bad
    /// reserved field closes the connection.
    #[tokio::test]
    async fn puts_and_gets_are_answered_and_bad_requests_close() {
        let (addr, mut ended) = sink().await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(&[head(PUT, 5), b"hello".to_vec(), head(GET, 3)].concat())
            .await
            .unwrap();
        let mut ack = [0u8; 8];
        s.read_exact(&mut ack).await.unwrap();
        assert_eq!(u64::from_le_bytes(ack), 5);
        let mut got = [0u8; 3];
        s.read_exact(&mut got).await.unwrap();
        drop(s);
        let first = ended.recv().await.unwrap();
        assert!(matches!(first, Ok(Ok(()))), "{first:?}");
        for bad in [head(PUT, ARENA as u64 + 1), head(7, 1), {
            let mut h = head(GET, 1);
            h[5] = 1;
            h
        }] {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(&bad).await.unwrap();
            let mut rest = Vec::new();
            let read = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest));
            let n = read.await.expect("the sink hung up").unwrap_or(0);
            assert_eq!(n, 0, "answered a bad request: {bad:?}");
            // Refused with an error, not a panic.
            let end = ended.recv().await.unwrap();
            assert!(matches!(end, Ok(Err(_))), "{bad:?}: {end:?}");
        }
    }
}
