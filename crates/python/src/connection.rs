//! A connection to a cluster: the Rust client, the process it was made in,
//! and the store node it may run inside this process (an embedded segment:
//! the engine contributes DRAM as the seed system's clients do).

use crate::errors::IntoPy;
use crate::thread_io::{Local, Locals};
use pyo3::prelude::*;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use strata_client::{Client, ClientConfig, TransportKind};
use strata_common::auth::Secret;
use strata_common::{Code, Error, Result};
use tokio_util::sync::CancellationToken;

/// What `connect` takes (Python keyword arguments, environment applied).
pub struct Settings {
    pub master: Option<String>,
    pub token_file: Option<PathBuf>,
    pub transport: String,
    pub segment_bytes: u64,
    pub timeout: f64,
    pub node_id: Option<String>,
    pub segment_token_file: Option<PathBuf>,
    pub segment_listen: Option<String>,
    /// End each read's lease when the read is done (`ClientConfig::end_leases`).
    pub end_leases: bool,
}

/// A store node running in this process.
struct Segment {
    node_id: String,
    shutdown: CancellationToken,
    handle: Option<strata_store_node::StoreNodeHandle>,
}

pub struct Shared {
    client: RwLock<Option<Client>>,
    pid: u32,
    pub master: String,
    segment: Mutex<Option<Segment>>,
    /// Blocking calls' per-thread runtimes and clients (TCP only; `None`
    /// when off): see `crate::thread_io`.
    locals: Option<Arc<Locals>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        let seg = self.segment.get_mut().ok().and_then(|s| s.take());
        let client = self.client.get_mut().ok().and_then(|c| c.take());
        if std::process::id() != self.pid {
            // A forked child: these belong to the parent's runtime (its
            // sockets share the parent's epoll); dropping them here would
            // unregister the parent's connections.
            std::mem::forget(seg);
            std::mem::forget(client);
            return;
        }
        // Garbage-collected without close(): the embedded node still
        // leaves, on the runtime (nothing waits for it here).
        if let Some(mut s) = seg {
            s.shutdown.cancel();
            if let (Some(h), Ok(rt)) = (s.handle.take(), crate::runtime::runtime()) {
                rt.spawn(async move {
                    let _ = tokio::time::timeout(Duration::from_secs(10), h.wait()).await;
                });
            }
        }
    }
}

impl Shared {
    /// The client, unless the store was closed or made before a fork.
    pub fn client(&self) -> Result<Client> {
        self.check_process()?;
        self.client
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| Error::new(Code::Cancelled, "the store is closed"))
    }

    /// The client and runtime a blocking call of this thread runs on:
    /// the thread's own where per-thread I/O is on (made on its first call,
    /// with the GIL released), else the shared client (`None`: the shared
    /// runtime).
    pub fn blocking_client(&self, py: Python<'_>) -> Result<(Client, Option<Arc<Local>>)> {
        let base = self.client()?;
        let Some(locals) = &self.locals else {
            return Ok((base, None));
        };
        let local = match locals.existing() {
            Some(l) => l,
            None => {
                let l = py.detach(|| locals.this_thread(&base))?;
                if self.is_closed() {
                    // close() ran while it was made: it must not outlive it
                    // (and is not dropped here, with the GIL held).
                    let mut all = locals.take_all();
                    all.push(l);
                    crate::thread_io::dispose(all, self.pid);
                    return Err(Error::new(Code::Cancelled, "the store is closed"));
                }
                l
            }
        };
        Ok((local.client.clone(), Some(local)))
    }

    /// Threads with their own runtime and client (tests, diagnostics).
    pub fn io_threads(&self) -> usize {
        self.locals.as_ref().map_or(0, |l| l.len())
    }

    pub fn is_closed(&self) -> bool {
        self.client
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
    }

    /// The embedded segment's node id, if this store runs one.
    pub fn node_id(&self) -> Option<String> {
        self.segment
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|s| s.node_id.clone())
    }

    /// Closes the client and stops the embedded node (it stops serving and
    /// heartbeating; the master drops its segments). Idempotent.
    pub async fn close(&self) -> Result<()> {
        self.check_process()?;
        let client = self
            .client
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(c) = client {
            // Reads done before the close end their leases now, not at the
            // master's TTL (bounded: a master away leaves them to it).
            c.flush_lease_ends(Duration::from_secs(2)).await;
        }
        if let Some(locals) = &self.locals {
            // A thread still in a call keeps its runtime until it returns.
            crate::thread_io::dispose(locals.take_all(), self.pid);
        }
        let seg = self
            .segment
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(mut s) = seg {
            s.shutdown.cancel();
            if let Some(h) = s.handle.take() {
                // Bounded: its tasks end at the cancellation.
                let _ = tokio::time::timeout(Duration::from_secs(10), h.wait()).await;
            }
        }
        Ok(())
    }

    /// Refuses a store made before `os.fork()`.
    fn check_process(&self) -> Result<()> {
        let pid = std::process::id();
        if pid != self.pid {
            return Err(Error::new(
                Code::Internal,
                format!(
                    "this Store was made in process {} and cannot be used after os.fork() \
                     (its connections and threads stayed in the parent); make a new Store in \
                     this process ({pid})",
                    self.pid
                ),
            ));
        }
        Ok(())
    }
}

/// Connects (and starts the embedded segment), checking that the master
/// answers and accepts the credential before returning.
pub async fn connect(s: Settings) -> Result<Shared> {
    let master = s
        .master
        .filter(|m| !m.trim().is_empty())
        .or_else(|| {
            std::env::var("STRATA_MASTER")
                .ok()
                .filter(|m| !m.is_empty())
        })
        .unwrap_or_else(|| "127.0.0.1:7400".to_string());
    if !(s.timeout.is_finite() && s.timeout > 0.0) {
        return Err(Error::invalid(format!(
            "timeout must be a positive number of seconds, got {}",
            s.timeout
        )));
    }
    let timeout = Duration::from_secs_f64(s.timeout.min(86_400.0));
    // Before any call: a pure argument check.
    if s.segment_bytes > 0 && s.segment_listen.is_none() && !loopback_only(&master) {
        return Err(Error::invalid(format!(
            "an embedded segment listens on 127.0.0.1 unless told otherwise, which the other \
             hosts of master {master} cannot reach: pass segment_listen=\"ADDRESS:0\" with \
             an address of this host they can"
        )));
    }
    // As the CLI: the argument, $STRATA_TOKEN_FILE, else the token a local
    // `strata up` left for this user, if `master` is the one it started.
    let token_file = s
        .token_file
        .or_else(|| {
            std::env::var_os("STRATA_TOKEN_FILE")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        })
        .or_else(|| strata_client::up_token::token_for(&master, false));
    let token = Secret::from_optional_file(token_file.as_deref(), "token_file")?;
    let transport = match s.transport.as_str() {
        "tcp" => TransportKind::Tcp,
        "ucx" | "rdma" => TransportKind::Ucx,
        other => {
            return Err(Error::invalid(format!(
                "transport must be \"tcp\" or \"ucx\", got {other:?}"
            )))
        }
    };
    let mut cfg = ClientConfig::new(master.clone())
        .with_token(token.clone())
        .with_transport(transport)
        .with_end_leases(s.end_leases);
    cfg.backoff.deadline = timeout;
    let client = Client::connect(cfg).await?;
    // The first call: an unreachable master or a refused credential is
    // reported here, not at the first put.
    let probe = client.config().backoff.run(|| client.stat());
    match tokio::time::timeout(timeout, probe).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => return Err(e),
        Err(_) => {
            return Err(Error::new(
                Code::Unavailable,
                format!("master {master} did not answer within {timeout:?}"),
            ))
        }
    }
    let segment = if s.segment_bytes > 0 {
        let member = match s.segment_token_file.or_else(|| {
            std::env::var_os("STRATA_SEGMENT_TOKEN_FILE")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        }) {
            Some(p) => Secret::from_optional_file(Some(&p), "segment_token_file")?,
            None => token,
        };
        Some(
            start_segment(
                &master,
                s.segment_bytes,
                s.node_id,
                s.segment_listen,
                member,
                timeout,
            )
            .await?,
        )
    } else {
        None
    };
    // Every transport makes siblings (`Client::sibling`), UCX too.
    let locals = crate::thread_io::enabled().then(Locals::new);
    Ok(Shared {
        client: RwLock::new(Some(client)),
        pid: std::process::id(),
        master,
        segment: Mutex::new(segment),
        locals,
    })
}

/// Starts a store node of `bytes` in this process and waits until the
/// master has registered it.
async fn start_segment(
    master: &str,
    bytes: u64,
    node_id: Option<String>,
    listen: Option<String>,
    token: Option<Secret>,
    timeout: Duration,
) -> Result<Segment> {
    let mut cfg = strata_store_node::StoreNodeConfig::local(master, bytes);
    cfg.token = token;
    cfg.leave_on_shutdown = true;
    if let Some(l) = listen {
        cfg.listen = l
            .parse()
            .map_err(|e| Error::invalid(format!("segment_listen {l:?} is not HOST:PORT: {e}")))?;
    }
    let node_id = node_id.unwrap_or_else(default_node_id);
    cfg.node_id = Some(node_id.clone());
    let shutdown = CancellationToken::new();
    let handle = strata_store_node::start(cfg, shutdown.clone()).await?;
    let registered = handle.registered_flag();
    let t0 = tokio::time::Instant::now();
    while !registered.load(std::sync::atomic::Ordering::Acquire) {
        if t0.elapsed() > timeout {
            shutdown.cancel();
            return Err(Error::new(
                Code::Unavailable,
                format!(
                    "the embedded segment ({node_id}) was not registered by master {master} \
                     within {timeout:?}; it needs the member token (segment_token_file or \
                     STRATA_SEGMENT_TOKEN_FILE) unless the master runs without credentials"
                ),
            ));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(Segment {
        node_id,
        shutdown,
        handle: Some(handle),
    })
}

/// Whether every host the master address names is this machine's loopback
/// (`HOST:PORT`, a list of them, or `etcd://HOST:PORT[,…]/CLUSTER`).
fn loopback_only(master: &str) -> bool {
    let hosts = master.strip_prefix("etcd://").unwrap_or(master);
    let hosts = hosts.split('/').next().unwrap_or_default();
    hosts.split(',').all(|hp| {
        let host = hp.trim().rsplit_once(':').map_or(hp.trim(), |(h, _)| h);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        host == "localhost"
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    })
}

/// `HOST-py-PID-N`: unique per embedded segment of this machine.
fn default_node_id() -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{host}-py-{}-{n}", std::process::id())
}

/// `connect`, from Python: waits with the GIL released.
pub fn connect_blocking(py: Python<'_>, s: Settings) -> PyResult<Shared> {
    crate::runtime::wait(py, move || connect(s))?.py(py)
}
