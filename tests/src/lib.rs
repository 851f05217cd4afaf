//! Helpers shared by the cluster-level tests.

pub use strata_chaos::fleet;
pub mod load;
pub mod procs;

pub use strata_cli::{ClusterBuilder, LocalCluster};

/// Master setting for tests that expect every put to reach the SSD tier:
/// `--offload-policy eager` (the default, `on-evict`, offloads only what
/// DRAM eviction picks).
pub fn eager(m: &mut strata_master::MasterConfig) {
    m.offload_policy = strata_master::config::OffloadPolicy::Eager;
}

/// Deterministic test bytes for `key` of `len` bytes.
pub fn payload(seed: u64, len: usize) -> Vec<u8> {
    use rand::{RngCore, SeedableRng};
    let mut v = vec![0u8; len];
    rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

/// GET on an admin endpoint; returns (status, body).
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let r = reqwest::get(format!("http://{addr}{path}"))
        .await
        .expect("admin endpoint answers");
    let status = r.status().as_u16();
    (status, r.text().await.unwrap_or_default())
}

/// GET on an admin endpoint presenting `token` (`Authorization: Bearer`),
/// as the views that name keys need; returns (status, body).
pub async fn http_get_as(
    addr: std::net::SocketAddr,
    path: &str,
    token: Option<&strata_common::auth::Secret>,
) -> (u16, String) {
    let mut req = reqwest::Client::new().get(format!("http://{addr}{path}"));
    if let Some(t) = token {
        req = req.bearer_auth(t.expose());
    }
    let r = req.send().await.expect("admin endpoint answers");
    let status = r.status().as_u16();
    (status, r.text().await.unwrap_or_default())
}

/// Path of a workspace binary (built by `cargo build --workspace --bins`,
/// which `scripts/test.sh` runs before the tests).
pub fn bin(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    // target/<profile>/deps/<test> → target/<profile>/<name>
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let p = dir.join(name);
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --workspace --bins` first (scripts/test.sh does)",
        p.display()
    );
    p
}

/// Polls `f` every 20 ms until it returns true or `timeout` passes.
pub async fn wait_until(timeout: std::time::Duration, mut f: impl FnMut() -> bool) -> bool {
    let t0 = std::time::Instant::now();
    while t0.elapsed() < timeout {
        if f() {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    f()
}

/// The value of an unlabelled Prometheus sample `name` in a `/metrics`
/// body, or -1 when it is absent.
pub fn metric(body: &str, name: &str) -> f64 {
    body.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(-1.0)
}

/// Pauses the first SSD agent's offloads and returns once a heartbeat
/// answered after the pause has come back (one asked for before it may
/// still bring tasks; the second brings none).
pub async fn pause_offloads(c: &LocalCluster) {
    c.agents[0]
        .faults
        .pause_offload
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let agent = c.agents[0].admin_addr;
    let beats = || async move {
        metric(
            &http_get(agent, "/metrics").await.1,
            "strata_ssd_agent_heartbeats_total",
        )
    };
    let n = beats().await;
    for _ in 0..400 {
        if beats().await >= n + 2.0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(beats().await >= n + 2.0, "the agent stopped heartbeating");
}

/// Whether the master holds a DRAM replica of `key`.
pub fn in_dram(c: &LocalCluster, key: &str) -> bool {
    c.master.inspect(key).is_ok_and(|i| {
        i.replicas
            .iter()
            .any(|r| r.kind == strata_proto::ReplicaKind::Memory as i32)
    })
}

/// The master's offload queue is idle: nothing queued or in flight, no pin.
pub fn drained(c: &LocalCluster) -> bool {
    let (q, a) = c.master.queue_counts();
    q == 0 && a == 0 && c.master.total_pins() == 0
}

/// Waits (bounded) until `key` has an SSD copy, then evicts its DRAM copy:
/// an SSD-only object (the client needs the admin role when credentials
/// are on).
pub async fn make_ssd_only(cl: &strata_client::Client, key: &str) {
    let t0 = std::time::Instant::now();
    loop {
        let v = cl
            .master_client()
            .inspect(strata_proto::InspectRequest { key: key.into() })
            .await
            .map(tonic::Response::into_inner);
        let ssd = strata_proto::ReplicaKind::Ssd as i32;
        if let Ok(v) = &v {
            if v.replicas.iter().any(|r| r.kind == ssd) {
                break;
            }
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(20),
            "{key} offloaded: {v:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    evict_memory(cl, &[key.to_string()]).await;
}

/// Puts `keys` (object i = payload(i, size)), waits until each is on SSD and
/// drops its DRAM copy, so reads must go through the agent.
pub async fn put_on_ssd_only(
    c: &LocalCluster,
    cl: &strata_client::Client,
    keys: &[String],
    size: usize,
    seed: u64,
) {
    put_and_drain(c, cl, keys, size, seed).await;
    evict_memory(cl, keys).await;
}

/// Puts `keys` (object i = payload(seed + i, size)) and waits (bounded)
/// until the master's offload queue is idle.
pub async fn put_and_drain(
    c: &LocalCluster,
    cl: &strata_client::Client,
    keys: &[String],
    size: usize,
    seed: u64,
) {
    for (i, k) in keys.iter().enumerate() {
        cl.put(
            k,
            &payload(seed + i as u64, size),
            &strata_client::PutOptions::default(),
        )
        .await
        .unwrap();
    }
    assert!(wait_until(std::time::Duration::from_secs(20), || drained(c)).await);
}

/// Drops the DRAM copies of `keys` (admin role), each of which must succeed.
pub async fn evict_memory(cl: &strata_client::Client, keys: &[String]) {
    evict_memory_within(cl, keys, std::time::Duration::from_secs(5)).await
}

/// [`evict_memory`], asking again while a key is Leased for up to `within`.
pub async fn evict_memory_within(
    cl: &strata_client::Client,
    keys: &[String],
    within: std::time::Duration,
) {
    // A DRAM copy is evicted once its read leases (the puts' own, a get's)
    // have ended: asked again while any is Leased (bounded); any other
    // refusal fails at once.
    let t0 = std::time::Instant::now();
    loop {
        let r = cl
            .master_client()
            .evict_memory(strata_proto::EvictMemoryRequest {
                keys: keys.to_vec(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.results.len(), keys.len(), "{:?}", r.results);
        let leased = strata_client::Code::Leased as u32;
        for (k, s) in keys.iter().zip(&r.results) {
            assert!(
                s.code == 0 || s.code == leased,
                "{k} not evicted: {}",
                s.message
            );
            assert!(
                s.code == 0 || t0.elapsed() < within,
                "{k} still leased: {}",
                s.message
            );
        }
        if r.results.iter().all(|s| s.code == 0) {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// Changes the 4 bytes of `data` at `at` so that its crc32c becomes `want`:
/// what a lying member needs to pass bytes of its choosing off as an
/// object's under crc32c alone (crc32c is linear, so 32 chosen bits reach
/// any value). Panics if `at + 4` is past the end.
pub fn forge_crc32c(data: &mut [u8], at: usize, want: u32) {
    let flip = |d: &mut [u8], bit: usize| d[at + bit / 8] ^= 1 << (bit % 8);
    let base = crc32c::crc32c(data);
    // What flipping each of the 32 bits does to the crc, reduced to a basis
    // with distinct top bits (Gaussian elimination over GF(2)); `mask` says
    // which bits make up each basis vector.
    let mut basis: Vec<(u32, u32)> = Vec::new();
    for bit in 0..32 {
        flip(data, bit);
        let mut d = crc32c::crc32c(data) ^ base;
        flip(data, bit);
        let mut mask = 1u32 << bit;
        for &(b, m) in &basis {
            if d ^ b < d {
                d ^= b;
                mask ^= m;
            }
        }
        if d != 0 {
            basis.push((d, mask));
            basis.sort_unstable_by_key(|b| std::cmp::Reverse(b.0));
        }
    }
    let (mut rest, mut flips) = (base ^ want, 0u32);
    for &(b, m) in &basis {
        if rest ^ b < rest {
            rest ^= b;
            flips ^= m;
        }
    }
    assert_eq!(rest, 0, "32 consecutive bits reach every crc32c");
    for bit in (0..32).filter(|b| flips & (1 << b) != 0) {
        flip(data, bit);
    }
    assert_eq!(crc32c::crc32c(data), want);
}

/// Starts a put of `good.len()` bytes under `key` on `replicas` replicas
/// and writes `first` to the first replica, `good` to the others: a
/// replica whose node holds other bytes than the writer's, as a corrupted
/// or lying node would. Returns PutStart's answer; the caller ends the put.
pub async fn put_start_with_a_bad_first_replica(
    cl: &strata_client::Client,
    key: &str,
    replicas: u32,
    first: &[u8],
    good: &[u8],
) -> strata_proto::PutStartResponse {
    let st = cl
        .master_client()
        .put_start(strata_proto::PutStartRequest {
            key: key.into(),
            size: good.len() as u64,
            replica_num: replicas,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(st.replicas.len(), replicas as usize);
    for (i, r) in st.replicas.iter().enumerate() {
        let range = strata_client::remote_range(r).unwrap();
        let bytes = if i == 0 { first } else { good };
        cl.transport().write(&range, 0, bytes).await.unwrap();
    }
    st
}

/// A raw gRPC client of the master at `addr` presenting the secret in
/// `token_file` (connects lazily, on the runtime of its first call: a
/// fleet host's runtime connects from that host).
pub fn master_client_as(
    addr: &str,
    token_file: &std::path::Path,
) -> strata_proto::master_client::MasterClient<strata_common::grpc::MasterChannel> {
    let secret = strata_common::auth::Secret::from_file(token_file, "test").expect("a token file");
    strata_proto::master_client::MasterClient::new(
        strata_common::grpc::master_channel(addr, Some(&secret)).expect("a master channel"),
    )
}

/// The master's UCX routes (`GetUcxRoutes`, asked with the client's own
/// credentials) for a `UcxTransport` a test builds by hand, to see which
/// path its transfers took (the client library builds its own).
pub struct MasterRoutes(
    pub strata_proto::master_client::MasterClient<strata_common::grpc::MasterChannel>,
);

impl strata_transport::ucx::RouteSource for MasterRoutes {
    fn routes(
        &self,
        segment_ids: Vec<u64>,
    ) -> futures::future::BoxFuture<'_, strata_common::Result<Vec<strata_proto::UcxRoute>>> {
        let mut m = self.0.clone();
        Box::pin(async move {
            Ok(
                m.get_ucx_routes(strata_proto::GetUcxRoutesRequest { segment_ids })
                    .await
                    .map_err(strata_common::Error::from)?
                    .into_inner()
                    .routes,
            )
        })
    }
}

/// A UCX transport as the client library builds one (UCX's transports left
/// to UCX, shared memory wanted for co-located nodes; 10 s per transfer),
/// its routes from `m`, for tests that check the path its transfers took.
/// Made on the calling host: the threads it starts stay there.
pub fn ucx_transport(
    m: strata_proto::master_client::MasterClient<strata_common::grpc::MasterChannel>,
) -> strata_transport::ucx::UcxTransport {
    let tcp = std::sync::Arc::new(strata_transport::tcp::TcpTransport::new(
        strata_transport::tcp::TcpTransportConfig::default(),
    ));
    let cfg = strata_transport::ucx::UcxClientConfig {
        timeout: std::time::Duration::from_secs(10),
        ..Default::default()
    };
    strata_transport::ucx::UcxTransport::new(cfg, tcp, std::sync::Arc::new(MasterRoutes(m)))
        .expect("a UCX transport")
}

/// A single-threaded runtime and a sibling of `base` made on it, as each
/// Python thread's blocking calls get them (`crates/python/src/thread_io.rs`):
/// drive it from the thread that made it.
pub fn sibling_on_own_runtime(
    base: &strata_client::Client,
) -> (tokio::runtime::Runtime, strata_client::Client) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let sib = {
        let _in = rt.enter();
        base.sibling().expect("a sibling client")
    };
    (rt, sib)
}
