//! Baselines measured in the same run as Strata: memcpy, a minimal raw TCP
//! "get" server on loopback, and a real redis-server on loopback.

use super::report::Row;
use super::{drive, Phase};
use anyhow::Context;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_common::units::format_size;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// Single-threaded memcpy bandwidth for `size`-byte copies.
pub fn memcpy(size: u64, ops: u64) -> Row {
    let src = vec![1u8; size as usize];
    let mut dst = vec![0u8; size as usize];
    let phase = Phase::new("memcpy", ops, true);
    let t0 = Instant::now();
    while phase.take().is_some() {
        let t = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
        phase.record(t);
    }
    phase.finish("memcpy", size, 1, size, t0.elapsed())
}

/// Bytes of distinct source objects `memcpy_dram` cycles through: far more
/// than any last-level cache, so every copy reads DRAM, as a get of an
/// object that was put a while ago does.
const DRAM_SET: usize = 512 << 20;

/// Single-threaded memcpy bandwidth for `size`-byte copies from DRAM (a
/// source set larger than the caches) into one reused buffer.
pub fn memcpy_dram(size: u64, ops: u64) -> Row {
    let size = size as usize;
    let n = (DRAM_SET / size.max(1)).max(2);
    // Written, so its pages are resident (not the shared zero page).
    let src: Vec<Vec<u8>> = (0..n).map(|i| vec![i as u8; size]).collect();
    let mut dst = vec![0u8; size];
    let phase = Phase::new("memcpy dram", ops, true);
    let t0 = Instant::now();
    let mut i = 0;
    while phase.take().is_some() {
        let t = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src[i % n]));
        std::hint::black_box(&mut dst);
        phase.record(t);
        i += 1;
    }
    phase.finish("memcpy dram", size as u64, 1, size as u64, t0.elapsed())
}

/// A minimal request/response server: 8-byte request (the size), then that
/// many bytes back. The floor of any TCP "get", from one cache-hot buffer.
pub async fn tcp_get(size: u64, ops: u64, conns: usize, quiet: bool) -> anyhow::Result<Row> {
    let one = vec![vec![7u8; size as usize]];
    tcp_get_from("raw tcp get", one, ops, conns, quiet).await
}

/// [`tcp_get`] answering each request from the next of a set of buffers
/// larger than any cache, as a store serving many objects reads DRAM.
pub async fn tcp_get_dram(size: u64, ops: u64, conns: usize, quiet: bool) -> anyhow::Result<Row> {
    let n = (DRAM_SET / (size as usize).max(1)).max(2);
    // Written, so its pages are resident (not the shared zero page).
    let set = (0..n).map(|i| vec![i as u8; size as usize]).collect();
    tcp_get_from("raw tcp get dram", set, ops, conns, quiet).await
}

async fn tcp_get_from(
    name: &str,
    sources: Vec<Vec<u8>>,
    ops: u64,
    conns: usize,
    quiet: bool,
) -> anyhow::Result<Row> {
    let size = sources[0].len() as u64;
    let sources = Arc::new(sources);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (addr, server) = raw_server(move |mut s| {
        let (sources, next) = (sources.clone(), next.clone());
        async move {
            let mut req = [0u8; 8];
            while s.read_exact(&mut req).await.is_ok() {
                let n = u64::from_le_bytes(req) as usize;
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let src = &sources[i % sources.len()];
                if s.write_all(&src[..n.min(src.len())]).await.is_err() {
                    return;
                }
            }
        }
    })
    .await?;
    let request = size.to_le_bytes().to_vec();
    let row = exchanges(name, size, addr, request, size as usize, ops, conns, quiet).await;
    server.abort();
    row
}

/// The floor of any TCP "put": an 8-byte request header (the size), that
/// many bytes, an 8-byte answer; the server reads each payload into one
/// cache-hot buffer.
pub async fn tcp_put(size: u64, ops: u64, conns: usize, quiet: bool) -> anyhow::Result<Row> {
    tcp_put_into("raw tcp put", 1, size, ops, conns, quiet).await
}

/// [`tcp_put`] reading each payload into the next of a set of buffers
/// larger than any cache, as a store receiving many objects writes DRAM.
pub async fn tcp_put_dram(size: u64, ops: u64, conns: usize, quiet: bool) -> anyhow::Result<Row> {
    let n = (DRAM_SET / (size as usize).max(1)).max(2);
    tcp_put_into("raw tcp put dram", n, size, ops, conns, quiet).await
}

async fn tcp_put_into(
    name: &str,
    buffers: usize,
    size: u64,
    ops: u64,
    conns: usize,
    quiet: bool,
) -> anyhow::Result<Row> {
    // Written, so its pages are resident (not the shared zero page).
    let sinks: Vec<std::sync::Mutex<Vec<u8>>> = (0..buffers)
        .map(|i| std::sync::Mutex::new(vec![i as u8; size as usize]))
        .collect();
    let sinks = Arc::new(sinks);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (addr, server) = raw_server(move |mut s| {
        let (sinks, next) = (sinks.clone(), next.clone());
        async move {
            let mut req = [0u8; 8];
            while s.read_exact(&mut req).await.is_ok() {
                let n = (u64::from_le_bytes(req) as usize).min(size as usize);
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                // Taken out while it is read into, so no lock is held
                // across the await (another connection gets another).
                let sink = &sinks[i % sinks.len()];
                let mut dst = std::mem::take(&mut *sink.lock().unwrap());
                dst.resize(size as usize, 0);
                let read = s.read_exact(&mut dst[..n]).await;
                *sink.lock().unwrap() = dst;
                if read.is_err() || s.write_all(&req).await.is_err() {
                    return;
                }
            }
        }
    })
    .await?;
    let mut request = size.to_le_bytes().to_vec();
    request.resize(8 + size as usize, 9);
    let row = exchanges(name, size, addr, request, 8, ops, conns, quiet).await;
    server.abort();
    row
}

/// Times `ops` exchanges with the server at `addr` on `conns` connections:
/// each sends `request` and reads an answer of `answer` bytes.
#[allow(clippy::too_many_arguments)]
async fn exchanges(
    name: &str,
    size: u64,
    addr: std::net::SocketAddr,
    request: Vec<u8>,
    answer: usize,
    ops: u64,
    conns: usize,
    quiet: bool,
) -> anyhow::Result<Row> {
    let phase = Phase::new(&format!("{name} {}", format_size(size)), ops, quiet);
    let request: Arc<[u8]> = request.into();
    let el = drive(&phase, conns, |_, ph| {
        let request = request.clone();
        async move {
            let mut s = TcpStream::connect(addr).await?;
            s.set_nodelay(true)?;
            let mut buf = vec![0u8; answer];
            while ph.take().is_some() {
                let t0 = Instant::now();
                s.write_all(&request).await?;
                s.read_exact(&mut buf).await?;
                ph.record(t0);
            }
            Ok(())
        }
    })
    .await?;
    Ok(phase.finish(name, size, conns, size, el))
}

/// A loopback server running `conn` on each accepted connection (no
/// Nagle delay), until the returned task is aborted.
async fn raw_server<F, Fut>(
    conn: F,
) -> anyhow::Result<(std::net::SocketAddr, tokio::task::JoinHandle<()>)>
where
    F: Fn(TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let _ = s.set_nodelay(true);
            tokio::spawn(conn(s));
        }
    });
    Ok((addr, server))
}

/// A redis-server we started on a free loopback port; killed on drop.
pub struct Redis {
    child: tokio::process::Child,
    port: u16,
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

impl Redis {
    pub async fn start(bin: &str) -> anyhow::Result<Redis> {
        let port = strata_common::ports::unused_loopback_port()?;
        let child = tokio::process::Command::new(bin)
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args([
                "--protected-mode",
                "no",
                "--proto-max-bulk-len",
                "1gb",
                "--maxmemory",
                "0",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot run {bin:?} (apt-get install redis-server)"))?;
        let r = Redis { child, port };
        for _ in 0..100 {
            if TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
                return Ok(r);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        anyhow::bail!("redis-server did not start listening on port {port} within 5s")
    }

    pub async fn set(&self, size: u64, ops: u64, conns: usize, quiet: bool) -> anyhow::Result<Row> {
        self.phase("redis SET", size, ops, conns, quiet, true).await
    }

    pub async fn get(&self, size: u64, ops: u64, conns: usize, quiet: bool) -> anyhow::Result<Row> {
        self.phase("redis GET", size, ops, conns, quiet, false)
            .await
    }

    async fn phase(
        &self,
        name: &str,
        size: u64,
        ops: u64,
        conns: usize,
        quiet: bool,
        set: bool,
    ) -> anyhow::Result<Row> {
        let port = self.port;
        let phase = Phase::new(&format!("{name} {}", format_size(size)), ops, quiet);
        let el = drive(&phase, conns, |_, ph| async move {
            let s = TcpStream::connect(("127.0.0.1", port)).await?;
            s.set_nodelay(true)?;
            let mut s = BufReader::with_capacity(1 << 20, s);
            let value = vec![3u8; size as usize];
            let mut buf = vec![0u8; size as usize + 2];
            let mut line = String::new();
            while let Some(i) = ph.take() {
                let key = format!("b{size}:{i}");
                let t0 = Instant::now();
                if set {
                    let head = format!("*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n${size}\r\n", key.len());
                    let w = s.get_mut();
                    w.write_all(head.as_bytes()).await?;
                    w.write_all(&value).await?;
                    w.write_all(b"\r\n").await?;
                    line.clear();
                    s.read_line(&mut line).await?;
                    anyhow::ensure!(line.starts_with("+OK"), "redis SET failed: {line}");
                } else {
                    let head = format!("*2\r\n$3\r\nGET\r\n${}\r\n{key}\r\n", key.len());
                    s.get_mut().write_all(head.as_bytes()).await?;
                    line.clear();
                    s.read_line(&mut line).await?;
                    anyhow::ensure!(
                        line.trim_end() == format!("${size}"),
                        "redis GET: unexpected reply {line:?}"
                    );
                    s.read_exact(&mut buf).await?;
                }
                ph.record(t0);
            }
            Ok(())
        })
        .await?;
        Ok(phase.finish(name, size, conns, size, el))
    }
}
