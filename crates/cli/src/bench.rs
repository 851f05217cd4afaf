//! `strata bench`: a load generator against a cluster, and (with
//! `--baselines`) the same workload against memcpy, raw loopback TCP and a
//! Redis on loopback, all in one run, with the ratios printed.

mod baselines;
mod chaos;
mod failover;
mod offload;
mod pressure;
mod rebuild;
mod replay;
mod report;
mod scan;
mod sink;
mod tiering;

use crate::local::ClusterBuilder;
use crate::{Client, PutOptions};
use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use report::{Report, Row};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_common::units::{format_size, ByteSize};

/// Scenarios with their own flags; without one, `strata bench` measures
/// the data path against its baselines.
#[derive(Debug, clap::Subcommand)]
pub enum BenchMode {
    /// Scan and Zipf hit rates per admission policy, and SSD read throughput
    Scan(scan::ScanArgs),
    /// Replay a request trace as a prefix-caching engine would
    Replay(replay::ReplayArgs),
    /// What a put costs when DRAM is full of objects not yet on SSD (the
    /// copy it waits for)
    Pressure(pressure::PressureArgs),
    /// Rebuild time and master memory per object after a failover or
    /// restart, for growing numbers of objects
    Rebuild(rebuild::RebuildArgs),
    /// Puts' pause when the leader is killed or stopped (real processes,
    /// real etcd), against the election TTL
    Failover(failover::FailoverArgs),
    /// Clients checked while a nemesis partitions, pauses, kills and slows
    /// hosts of a fleet of network namespaces (root needed)
    Chaos(chaos::ChaosArgs),
    /// A raw loopback TCP peer that puts land in and gets come from, and
    /// nothing else: the floor `python -m strata.bench` measures beside
    /// Strata (prints the address it listens on)
    Sink(sink::SinkArgs),
}

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub mode: Option<BenchMode>,
    /// Start an in-process local cluster for the run instead of using --master
    #[arg(long)]
    pub local: bool,
    /// Store nodes of the --local cluster
    #[arg(long, default_value_t = 2)]
    pub store_nodes: usize,
    /// DRAM per store node of the --local cluster
    #[arg(long, default_value = "2GiB")]
    pub node_capacity: ByteSize,
    /// Object sizes, comma-separated
    #[arg(long, value_delimiter = ',', default_value = "4KiB,64KiB,1MiB,16MiB")]
    pub sizes: Vec<ByteSize>,
    /// Bytes moved per size and phase (at least --min-ops objects)
    #[arg(long, default_value = "4GiB")]
    pub bytes: ByteSize,
    /// Cap on operations per phase
    #[arg(long, default_value_t = 20000)]
    pub max_ops: u64,
    #[arg(long, default_value_t = 64)]
    pub min_ops: u64,
    /// Concurrent clients (connections) for Strata and every baseline
    #[arg(long, default_value_t = 4)]
    pub clients: usize,
    /// Objects per batch in the batched phases
    #[arg(long, default_value_t = 16)]
    pub batch: usize,
    /// Also measure memcpy, raw loopback TCP and Redis in this run
    #[arg(long)]
    pub baselines: bool,
    /// redis-server binary for the Redis baseline
    #[arg(long, default_value = "redis-server")]
    pub redis_server: String,
    /// Keys for the metadata-path benchmark (0 skips it)
    #[arg(long, default_value_t = 200_000)]
    pub meta_keys: u64,
    /// Keys per batch in the metadata-path benchmark
    #[arg(long, default_value_t = 128)]
    pub meta_batch: usize,
    /// Object sizes of the SSD offload benchmark (--local only; "" skips it)
    #[arg(long, value_parser = size_list, default_value = "64KiB,1MiB")]
    pub offload_sizes: SizeList,
    /// Bytes offloaded per size
    #[arg(long, default_value = "512MiB")]
    pub offload_bytes: ByteSize,
    /// Directory of the benchmark's SSD agent (put it on the disk to measure)
    #[arg(long)]
    pub ssd_dir: Option<std::path::PathBuf>,
    /// Print the results as JSON instead of a table
    #[arg(long)]
    pub json: bool,
    /// --local: also run every data-path phase on a second local cluster
    /// without credentials (protected mode) and compare, size by size
    #[arg(long)]
    pub compare_credentials: bool,
    /// --local: the store nodes also serve UCX, and every data-path phase
    /// runs twice per size, over TCP and over UCX (rows marked "(ucx)"), with
    /// the ratios printed
    #[arg(long)]
    pub compare_transports: bool,
    /// --local: also run every data-path phase on a second local cluster
    /// whose master runs `--integrity blake3` (writers send a BLAKE3 digest,
    /// readers verify it) and compare with crc32c alone, size by size
    #[arg(long)]
    pub compare_integrity: bool,
    /// Before each size's phases, also time puts whose client declares no
    /// checksum at PutStart (rows marked "(unannounced)") and puts announced
    /// to their nodes instead of recorded from their writes (rows marked
    /// "(announced)"), to compare with the library's default
    #[arg(long)]
    pub compare_announce: bool,
    /// Time each step of every put (checksum, PutStart, writes, PutEnd)
    /// and add their medians to the put rows' notes
    #[arg(long)]
    pub put_steps: bool,
    /// The main client of the data-path phases as the library makes it by
    /// default, location cache included (`python -m strata.bench` passes
    /// it, as its Python clients are made so), instead of one whose every
    /// get asks the master; the get rows' notes say what the cache served.
    /// The --compare-* clusters' clients keep asking the master
    #[arg(long)]
    pub client_defaults: bool,
}

/// Comma-separated sizes, where an empty list (`""`) is allowed.
#[derive(Debug, Clone, Default)]
pub struct SizeList(pub Vec<ByteSize>);

impl std::ops::Deref for SizeList {
    type Target = Vec<ByteSize>;
    fn deref(&self) -> &Vec<ByteSize> {
        &self.0
    }
}

fn size_list(s: &str) -> Result<SizeList, String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| p.parse::<ByteSize>().map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()
        .map(SizeList)
}

/// Shared op counter and latency log of one phase.
pub(crate) struct Phase {
    next: AtomicU64,
    ops: u64,
    /// Latencies in microseconds, appended by all workers.
    lat_us: std::sync::Mutex<Vec<u64>>,
    pb: ProgressBar,
    /// This process's CPU time when its workers started (`drive`).
    cpu0: std::sync::OnceLock<Duration>,
}

impl Phase {
    pub(crate) fn new(name: &str, ops: u64, quiet: bool) -> Arc<Phase> {
        let pb = if quiet {
            ProgressBar::hidden()
        } else {
            let pb = ProgressBar::new(ops);
            pb.set_style(
                ProgressStyle::with_template("{prefix:>28} [{bar:30}] {pos}/{len} {per_sec}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
            );
            pb.set_prefix(name.to_string());
            pb
        };
        Arc::new(Phase {
            next: AtomicU64::new(0),
            ops,
            lat_us: Default::default(),
            pb,
            cpu0: std::sync::OnceLock::new(),
        })
    }

    /// The next op index, or None when the phase is done.
    pub(crate) fn take(&self) -> Option<u64> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        (i < self.ops).then_some(i)
    }

    pub(crate) fn record(&self, t0: Instant) {
        let us = t0.elapsed().as_micros() as u64;
        if let Ok(mut v) = self.lat_us.lock() {
            v.push(us);
        }
        self.pb.inc(1);
    }

    pub(crate) fn finish(
        &self,
        scenario: &str,
        size: u64,
        conns: usize,
        bytes_per_op: u64,
        elapsed: Duration,
    ) -> Row {
        self.pb.finish_and_clear();
        let mut lat = self.lat_us.lock().map(|v| v.clone()).unwrap_or_default();
        lat.sort_unstable();
        let pct = |p: f64| -> f64 {
            if lat.is_empty() {
                0.0
            } else {
                lat[((lat.len() - 1) as f64 * p) as usize] as f64 / 1000.0
            }
        };
        let ops = lat.len() as u64;
        let secs = elapsed.as_secs_f64().max(1e-9);
        let cpu_us_per_op = self
            .cpu0
            .get()
            .map(|c0| process_cpu().saturating_sub(*c0).as_secs_f64() * 1e6 / ops.max(1) as f64);
        Row {
            scenario: scenario.to_string(),
            size,
            conns,
            ops,
            ops_per_sec: ops as f64 / secs,
            gb_per_sec: (ops * bytes_per_op) as f64 / secs / 1e9,
            p50_ms: pct(0.50),
            p99_ms: pct(0.99),
            note: String::new(),
            cpu_us_per_op,
        }
    }
}

/// Runs `workers` copies of `f` until the phase's ops are used up.
pub(crate) async fn drive<F, Fut>(
    phase: &Arc<Phase>,
    workers: usize,
    f: F,
) -> anyhow::Result<Duration>
where
    F: Fn(usize, Arc<Phase>) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let t0 = Instant::now();
    // What the workers cost this process, from here to `finish`.
    let first = phase.cpu0.set(process_cpu()).is_ok();
    debug_assert!(first, "a phase is driven once");
    let mut set = tokio::task::JoinSet::new();
    for w in 0..workers {
        set.spawn(f(w, phase.clone()));
    }
    while let Some(r) = set.join_next().await {
        r.context("bench worker panicked")??;
    }
    Ok(t0.elapsed())
}

fn ops_for(args: &BenchArgs, size: u64) -> u64 {
    (args.bytes.0 / size.max(1)).clamp(args.min_ops, args.max_ops.max(args.min_ops))
}

pub async fn run(conn: &super::Conn, mut args: BenchArgs) -> anyhow::Result<()> {
    match args.mode.take() {
        Some(BenchMode::Scan(a)) => return scan::run(a).await,
        Some(BenchMode::Replay(a)) => return replay::run(a).await,
        Some(BenchMode::Pressure(a)) => return pressure::run(a).await,
        Some(BenchMode::Rebuild(a)) => return rebuild::run(a).await,
        Some(BenchMode::Failover(a)) => return failover::run(a).await,
        Some(BenchMode::Chaos(a)) => return chaos::run(a).await,
        Some(BenchMode::Sink(a)) => return sink::run(a).await,
        None => {}
    }
    anyhow::ensure!(
        args.clients >= 1 && args.clients <= 256,
        "--clients must be 1..=256"
    );
    anyhow::ensure!(
        args.batch >= 1 && args.batch <= 1024,
        "--batch must be 1..=1024"
    );
    anyhow::ensure!(
        !args.sizes.is_empty() && args.sizes.iter().all(|s| s.0 > 0),
        "--sizes must be positive"
    );
    let mut local = if args.local {
        Some(
            {
                // Bucket files stay until SSD eviction exists: room for all.
                let ssd = args.offload_bytes.0 * (args.offload_sizes.len() as u64 + 1) * 2;
                // The offload phase times offloading every object it puts.
                let ucx = args.compare_transports || conn.transport == crate::TransportKind::Ucx;
                let mut b = ClusterBuilder::new()
                    .node_transport(if ucx {
                        crate::TransportKind::Ucx
                    } else {
                        crate::TransportKind::Tcp
                    })
                    .master(|m| m.offload_policy = strata_master::config::OffloadPolicy::Eager)
                    .store_nodes(args.store_nodes)
                    .node_capacity(args.node_capacity.0)
                    .ssd_capacity(ssd.max(1 << 30))
                    .prefault(true);
                if let Some(d) = &args.ssd_dir {
                    b = b.ssd_dir(d);
                }
                b
            }
            .build()
            .await
            .context("cannot start the local cluster")?,
        )
    } else {
        None
    };
    let (addr, cfg) = match &local {
        Some(c) if conn.transport == crate::TransportKind::Ucx => {
            (c.master_addr(), c.rdma_client_config())
        }
        Some(c) => (c.master_addr(), c.client_config()),
        None => (conn.master.clone(), conn.config()?),
    };
    // Every get of the main client asks the master (unless
    // --client-defaults keeps its location cache on); `cached` keeps
    // locations between reads (the library's default) for the repeat-read
    // phase.
    let cached = Client::connect(cfg.clone()).await?;
    let cfg = cfg.with_put_steps(args.put_steps);
    let mut put_variants = Vec::new();
    if args.compare_announce {
        let plain = cfg.clone().with_location_cache(0);
        put_variants.push((
            Client::connect(plain.clone().with_announce_up_to(0)).await?,
            report::UNANNOUNCED,
        ));
        put_variants.push((
            Client::connect(plain.with_put_receipts(false)).await?,
            report::ANNOUNCED,
        ));
    }
    let client = if args.client_defaults {
        Client::connect(cfg).await?
    } else {
        Client::connect(cfg.with_location_cache(0)).await?
    };
    client
        .stat()
        .await
        .with_context(|| format!("cannot reach the master at {addr}"))?;
    let quiet = args.json;
    anyhow::ensure!(
        !args.compare_credentials || args.local,
        "--compare-credentials needs --local"
    );
    anyhow::ensure!(
        !args.compare_transports || args.local,
        "--compare-transports needs --local"
    );
    // The same cluster through a UCX (rdma) client.
    let ucx_client = match &local {
        Some(c) if args.compare_transports => Some((
            Client::connect(c.rdma_client_config().with_location_cache(0))
                .await
                .context("cannot start a UCX client")?,
            Client::connect(c.rdma_client_config()).await?,
        )),
        _ => None,
    };
    anyhow::ensure!(
        !args.compare_integrity || args.local,
        "--compare-integrity needs --local"
    );
    // Second clusters whose phases run beside the main one's, size by size,
    // with their rows marked: the same cluster in protected mode (no
    // credentials), and with `--integrity blake3`.
    let mut others: Vec<Other> = Vec::new();
    if args.compare_credentials && args.local {
        let b = ClusterBuilder::new().credentials(false);
        others.push(Other::start(b, &args, report::NO_CREDENTIALS, "without credentials").await?);
    }
    if args.compare_integrity && args.local {
        let b = ClusterBuilder::new()
            .master(|m| m.integrity = strata_master::config::Integrity::Blake3);
        others.push(Other::start(b, &args, report::BLAKE3, "with --integrity blake3").await?);
    }
    let mut report = Report::default();
    let run_id = format!("{:x}", rand::random::<u32>());

    let redis = if args.baselines {
        match baselines::Redis::start(&args.redis_server).await {
            Ok(r) => Some(r),
            Err(e) => {
                report.notes.push(format!("redis baseline skipped: {e:#}"));
                None
            }
        }
    } else {
        None
    };

    // Objects stored per size stay well under the cluster's capacity so no
    // eviction happens mid-run; get phases cycle over them.
    let capacity = client.stat().await?.capacity_bytes;
    for size in args.sizes.iter().map(|s| s.0) {
        let ops = ops_for(&args, size);
        if args.baselines {
            report.rows.push(baselines::memcpy(size, ops));
            if args.compare_transports {
                report.rows.push(baselines::memcpy_dram(size, ops));
            }
            report
                .rows
                .push(baselines::tcp_get(size, ops, args.clients, quiet).await?);
            report
                .rows
                .push(baselines::tcp_get_dram(size, ops, args.clients, quiet).await?);
            report
                .rows
                .push(baselines::tcp_put(size, ops, args.clients, quiet).await?);
            report
                .rows
                .push(baselines::tcp_put_dram(size, ops, args.clients, quiet).await?);
            if let Some(r) = &redis {
                report
                    .rows
                    .push(r.set(size, ops, args.clients, quiet).await?);
                report
                    .rows
                    .push(r.get(size, ops, args.clients, quiet).await?);
            }
        }
        let w = Workload {
            client: client.clone(),
            cached: cached.clone(),
            run: run_id.clone(),
            size,
            keys: ops.min(capacity * 3 / 10 / size).max(args.batch as u64),
            clients: args.clients,
            batch: args.batch,
            quiet,
        };
        for (u, suffix) in &put_variants {
            // First, on the same keys, so all puts find an empty cluster,
            // and after an untimed round, so none is a run's first (the
            // first puts fill the master's tables and open connections,
            // which would favour whichever phase goes later).
            for timed in [false, true] {
                let mut r = w.put_with(u).await?;
                client.remove_all(true).await?;
                if timed {
                    r.scenario.push_str(suffix);
                    report.rows.push(r);
                }
            }
        }
        report.rows.extend(w.phases(ops).await?);
        client.remove_all(true).await?;
        for o in &others {
            // Interleaved size by size, so drift hits both alike.
            let w = Workload {
                client: o.client.clone(),
                cached: o.cached.clone(),
                run: w.run.clone(),
                ..w
            };
            for mut r in w.phases(ops).await? {
                r.scenario.push_str(o.suffix);
                report.rows.push(r);
            }
            o.client.remove_all(true).await?;
        }
        if let Some((uc, ucached)) = &ucx_client {
            let w = Workload {
                client: uc.clone(),
                cached: ucached.clone(),
                ..w
            };
            for mut r in w.phases(ops).await? {
                r.scenario.push_str(report::OVER_UCX);
                report.rows.push(r);
            }
            // The rdma token is no admin token.
            client.remove_all(true).await?;
        }
    }

    // Before the SSD agent joins (as the DRAM phases): its objects carry
    // no bytes, so an agent would spend the cores offloading (and
    // refusing) placeholders.
    if args.meta_keys > 0 {
        report.rows.push(
            meta_path(
                &client,
                &run_id,
                args.meta_keys,
                args.meta_batch,
                args.clients,
                quiet,
            )
            .await?,
        );
        client.remove_all(true).await?;
        for o in &others {
            let mut r = meta_path(
                &o.client,
                &run_id,
                args.meta_keys,
                args.meta_batch,
                args.clients,
                quiet,
            )
            .await?;
            r.scenario.push_str(o.suffix);
            report.rows.push(r);
            o.client.remove_all(true).await?;
        }
    }
    if let Some(c) = local.as_mut() {
        if !args.offload_sizes.is_empty() {
            offload::run(c, &client, &args, &run_id, &mut report).await?;
        }
    }
    for o in others {
        o.cluster.shutdown().await;
    }
    drop(redis);
    if let Some(c) = local {
        c.shutdown().await;
    }
    report.compare();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report.to_json())?);
    } else {
        report.print();
    }
    Ok(())
}

/// A second local cluster measured beside the main one (`--compare-*`).
struct Other {
    cluster: crate::local::LocalCluster,
    /// Asks the master on every read.
    client: Client,
    /// Keeps locations (repeat reads).
    cached: Client,
    /// Marks its rows.
    suffix: &'static str,
}

impl Other {
    async fn start(
        b: ClusterBuilder,
        args: &BenchArgs,
        suffix: &'static str,
        what: &str,
    ) -> anyhow::Result<Other> {
        let cluster = b
            .store_nodes(args.store_nodes)
            .node_capacity(args.node_capacity.0)
            .prefault(true)
            .build()
            .await
            .with_context(|| format!("cannot start the local cluster {what}"))?;
        Ok(Other {
            client: Client::connect(cluster.client_config().with_location_cache(0)).await?,
            cached: cluster.client().await?,
            cluster,
            suffix,
        })
    }
}

/// Keys re-read by the cached-get phase.
const HOT_KEYS: u64 = 1024;

/// One object size's Strata phases.
struct Workload {
    /// Asks the master on every read (with --client-defaults: the
    /// library's default client, location cache on).
    client: Client,
    /// The same cluster through a client that keeps locations (repeat reads).
    cached: Client,
    run: String,
    size: u64,
    /// Objects stored by the put phases (get phases cycle over them).
    keys: u64,
    clients: usize,
    batch: usize,
    quiet: bool,
}

impl Workload {
    /// A buffer whose pages are already resident, as an engine's would be.
    fn buffer(&self) -> Vec<u8> {
        vec![0x5a; self.size as usize]
    }

    /// A client's own `n` buffers: each object of a batch moves from or
    /// into its own, as an engine's KV pages do (and as `python -m
    /// strata.bench` does), not one buffer that stays in the CPU's caches.
    fn buffers(&self, n: usize) -> Vec<Vec<u8>> {
        (0..n.max(1)).map(|_| self.buffer()).collect()
    }

    /// Every client's [`Self::buffers`], made (and their pages touched)
    /// before a phase's clock starts.
    fn pools(&self, n: usize) -> std::sync::Mutex<Vec<Vec<Vec<u8>>>> {
        std::sync::Mutex::new((0..self.clients).map(|_| self.buffers(n)).collect())
    }

    /// One client's buffers from `pools` (made now if none is left).
    fn take(&self, pools: &std::sync::Mutex<Vec<Vec<Vec<u8>>>>, n: usize) -> Vec<Vec<u8>> {
        let mine = pools.lock().unwrap_or_else(|p| p.into_inner()).pop();
        mine.unwrap_or_else(|| self.buffers(n))
    }

    /// Put, get, batch put and batch get, in that order.
    async fn phases(&self, ops: u64) -> anyhow::Result<Vec<Row>> {
        let mut rows = vec![
            self.put().await?,
            self.get(ops).await?,
            self.get_cached(ops).await?,
            self.batch(true, self.keys).await?,
            self.batch(false, ops).await?,
        ];
        // The put phases store at most 30% of the cluster's capacity (the
        // gets cycle over what they stored): say so rather than run fewer
        // than asked unannounced.
        if self.keys < ops {
            for r in rows.iter_mut().filter(|r| r.scenario.contains("put")) {
                let capped = format!(
                    "{} of {ops} puts: capped at 30% of the cluster's capacity",
                    self.keys
                );
                r.note = match r.note.is_empty() {
                    true => capped,
                    false => format!("{capped}; {}", r.note),
                };
            }
        }
        Ok(rows)
    }

    async fn put(&self) -> anyhow::Result<Row> {
        self.put_with(&self.client).await
    }

    async fn put_with(&self, client: &Client) -> anyhow::Result<Row> {
        let phase = Phase::new(
            &format!("strata put {}", format_size(self.size)),
            self.keys,
            self.quiet,
        );
        let pools = self.pools(ROTATED);
        let el = drive(&phase, self.clients, |_, ph| {
            let (c, bufs, keys) = (
                client.clone(),
                self.take(&pools, ROTATED),
                self.keys_fn("s"),
            );
            async move {
                while let Some(i) = ph.take() {
                    let data = &bufs[i as usize % bufs.len()];
                    let t0 = Instant::now();
                    c.put(&keys(i), data, &PutOptions::default()).await?;
                    ph.record(t0);
                }
                Ok(())
            }
        })
        .await?;
        let mut row = phase.finish("strata put", self.size, self.clients, self.size, el);
        if let Some((_, p50)) = client.put_steps().and_then(|s| s.take_medians()) {
            let steps = crate::put_steps::STEPS
                .iter()
                .zip(p50)
                .map(|(step, us)| format!("{step} {us}"))
                .collect::<Vec<_>>();
            row.note = format!("steps p50 us: {}", steps.join(", "));
        }
        Ok(row)
    }

    async fn get(&self, ops: u64) -> anyhow::Result<Row> {
        let before = self.client.cached_reads();
        let mut row = self
            .get_with(&self.client, "strata get", ops, self.keys)
            .await?;
        row.note = served_by_cache(self.client.cached_reads() - before, row.ops);
        Ok(row)
    }

    /// Repeat reads of a hot set (an engine's shared prefixes): each key
    /// read once, untimed, so its location is cached; then the timed reads,
    /// which ask the master only when a location's lease ran out.
    async fn get_cached(&self, ops: u64) -> anyhow::Result<Row> {
        let hot = self.keys.min(HOT_KEYS);
        let mut buf = self.buffer();
        let keys = self.keys_fn("s");
        for i in 0..hot {
            self.cached.get_into(&keys(i), &mut buf).await?;
        }
        let before = self.cached.cached_reads();
        let mut row = self
            .get_with(&self.cached, "strata get cached", ops, hot)
            .await?;
        let hits = self.cached.cached_reads() - before;
        row.note = format!(
            "hot set of {hot}; {:.0}% from cache",
            100.0 * hits as f64 / ops.max(1) as f64
        );
        Ok(row)
    }

    /// `ops` reads cycling over the first `over` keys.
    async fn get_with(
        &self,
        client: &Client,
        name: &str,
        ops: u64,
        over: u64,
    ) -> anyhow::Result<Row> {
        let phase = Phase::new(
            &format!("{name} {}", format_size(self.size)),
            ops,
            self.quiet,
        );
        let pools = self.pools(ROTATED);
        let el = drive(&phase, self.clients, |_, ph| {
            let (c, mut bufs, keys) = (
                client.clone(),
                self.take(&pools, ROTATED),
                self.keys_fn("s"),
            );
            async move {
                while let Some(i) = ph.take() {
                    let n = bufs.len();
                    let buf = &mut bufs[i as usize % n];
                    let t0 = Instant::now();
                    c.get_into(&keys(i % over.max(1)), buf).await?;
                    ph.record(t0);
                }
                Ok(())
            }
        })
        .await?;
        Ok(phase.finish(name, self.size, self.clients, self.size, el))
    }

    /// Key names as an owned closure, for tasks that outlive `&self`.
    fn keys_fn(&self, prefix: &str) -> impl Fn(u64) -> String + Send + 'static {
        let (run, size, n, prefix) = (self.run.clone(), self.size, self.keys, prefix.to_string());
        move |i| format!("bench/{run}/{prefix}/{size}/{}", i % n)
    }

    /// Batched puts of `objects` objects, or batched gets of `objects`.
    async fn batch(&self, put: bool, objects: u64) -> anyhow::Result<Row> {
        let before = self.client.cached_reads();
        let name = if put {
            "strata batch_put"
        } else {
            "strata batch_get"
        };
        let batch = self.batch;
        let batches = objects.div_ceil(batch as u64).max(1);
        let phase = Phase::new(
            &format!("{name} {batch}x{}", format_size(self.size)),
            batches,
            self.quiet,
        );
        let pools = self.pools(batch);
        let el = drive(&phase, self.clients, |_, ph| {
            let (c, keys) = (self.client.clone(), self.keys_fn("b"));
            // Reused like an engine's KV buffers (no fresh pages per batch).
            let mut bufs = self.take(&pools, batch);
            async move {
                while let Some(b) = ph.take() {
                    let names: Vec<String> = (0..batch as u64)
                        .map(|j| keys(b * batch as u64 + j))
                        .collect();
                    let t0 = Instant::now();
                    if put {
                        let items: Vec<(&str, &[u8])> = names
                            .iter()
                            .zip(&bufs)
                            .map(|(k, b)| (k.as_str(), b.as_slice()))
                            .collect();
                        for r in c.batch_put(&items, &PutOptions::default()).await? {
                            // Keys repeat when the last batch wraps around.
                            if let Err(e) = r {
                                anyhow::ensure!(e.code == crate::Code::AlreadyExists, e);
                            }
                        }
                    } else {
                        let mut items: Vec<(&str, &mut [u8])> = names
                            .iter()
                            .map(String::as_str)
                            .zip(bufs.iter_mut().map(Vec::as_mut_slice))
                            .collect();
                        for r in c.batch_get_into(&mut items).await? {
                            r?;
                        }
                    }
                    ph.record(t0);
                }
                Ok(())
            }
        })
        .await?;
        let mut row = phase
            .finish(name, self.size, self.clients, self.size * batch as u64, el)
            .per_item(batch);
        row.note = format!("batches of {batch}; latency per batch");
        let cached = served_by_cache(self.client.cached_reads() - before, row.ops);
        if !cached.is_empty() {
            row.note = format!("{}; {cached}", row.note);
        }
        Ok(row)
    }
}

/// A note for a main-client row some of whose reads the location cache
/// served (only with --client-defaults, and where the phase read a key
/// twice: a capped put phase leaves fewer keys than reads); empty if none.
fn served_by_cache(hits: u64, ops: u64) -> String {
    if hits == 0 {
        return String::new();
    }
    format!(
        "{hits} of {ops} reads from the location cache ({:.1}%)",
        100.0 * hits as f64 / ops.max(1) as f64
    )
}

/// Buffers a client's single puts and gets go round (python -m
/// strata.bench's pool for single calls is as large).
const ROTATED: usize = 4;

/// The master's metadata path alone: BatchPutStart + BatchPutEnd +
/// BatchGetReplicas per batch, no data moved.
async fn meta_path(
    c: &Client,
    run: &str,
    keys: u64,
    batch: usize,
    conns: usize,
    quiet: bool,
) -> anyhow::Result<Row> {
    use strata_proto as pb;
    let batches = keys.div_ceil(batch as u64);
    let phase = Phase::new(&format!("metadata path x{batch}"), batches, quiet);
    let el = drive(&phase, conns, |_, ph| {
        // The calls as the client's batch puts and gets make them (quick
        // where the master allows).
        let (m, run) = (c.master_calls(), run.to_string());
        async move {
            while let Some(b) = ph.take() {
                let ks: Vec<String> = (0..batch as u64)
                    .map(|j| format!("meta/{run}/{}", b * batch as u64 + j))
                    .collect();
                let t0 = Instant::now();
                let st = m
                    .batch_put_start(pb::BatchPutStartRequest {
                        items: ks
                            .iter()
                            .map(|k| pb::PutStartRequest {
                                key: k.clone(),
                                size: 256,
                                replica_num: 1,
                                ..Default::default()
                            })
                            .collect(),
                    })
                    .await?;
                all_ok(
                    "PutStart",
                    batch,
                    st.results.iter().map(|r| r.status.as_ref()),
                )?;
                // A master with --integrity blake3 asks each PutEnd for a
                // digest; no bytes were written, so any one will do.
                let end = m
                    .batch_put_end(pb::BatchPutEndRequest {
                        items: ks
                            .iter()
                            .zip(&st.results)
                            .map(|(k, r)| pb::PutEndRequest {
                                key: k.clone(),
                                crc32c: 0,
                                blake3: if r.integrity == pb::Integrity::Blake3 as i32 {
                                    vec![0; 32]
                                } else {
                                    Vec::new()
                                },
                                ..Default::default()
                            })
                            .collect(),
                    })
                    .await?;
                all_ok("PutEnd", batch, end.results.iter().map(Some))?;
                let g = m
                    .batch_get_replicas(pb::BatchGetReplicasRequest { keys: ks })
                    .await?;
                all_ok(
                    "GetReplicas",
                    batch,
                    g.results.iter().map(|r| r.status.as_ref()),
                )?;
                ph.record(t0);
            }
            Ok(())
        }
    })
    .await?;
    let mut row = phase
        .finish("master metadata path", 0, conns, 0, el)
        .per_item(batch);
    // CPU time per key of the whole process: the rate alone swings with
    // what else the machine runs; with --local this is master, nodes and
    // load generator together.
    let cpu_us = row.cpu_us_per_op.unwrap_or(0.0);
    row.note = format!(
        "keys/s; PutStart+PutEnd+GetReplicas, batches of {batch}; process CPU {cpu_us:.1} us/key"
    );
    Ok(row)
}

/// Fails the metadata phase unless the master answered each of `n` items
/// with success: a failed item is reported, never silently counted.
fn all_ok<'a>(
    call: &str,
    n: usize,
    statuses: impl ExactSizeIterator<Item = Option<&'a strata_proto::Status>>,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        statuses.len() == n,
        "metadata bench: {call} answered {} items of {n}",
        statuses.len()
    );
    for s in statuses.flatten() {
        anyhow::ensure!(
            s.code == 0,
            "metadata bench: {call} failed (code {}): {}",
            s.code,
            s.message
        );
    }
    Ok(())
}

/// User + system CPU time of this process so far.
fn process_cpu() -> Duration {
    // SAFETY: getrusage writes the struct it is given and nothing else.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CPU time of the calling thread (not the process: whatever else
    /// runs in it does not shorten a burn), to the nanosecond (getrusage's
    /// per-thread figure moves in scheduler ticks).
    fn thread_cpu() -> Duration {
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes the struct it is given and nothing else.
        assert_eq!(
            unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) },
            0
        );
        Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
    }

    fn burn(cpu: Duration) {
        let c0 = thread_cpu();
        while thread_cpu().saturating_sub(c0) < cpu {
            std::hint::spin_loop();
        }
    }

    /// A phase driven by workers reports what they cost this process per
    /// op, counted from the workers' start: CPU burnt before it is not.
    #[tokio::test]
    async fn a_driven_phase_reports_the_cpu_its_ops_cost() {
        // 8 ms of CPU before the phase: per op, 1 ms more if counted.
        burn(Duration::from_millis(8));
        let phase = Phase::new("burn", 8, true);
        let el = drive(&phase, 2, |_, ph| async move {
            while let Some(_i) = ph.take() {
                let t0 = Instant::now();
                burn(Duration::from_millis(1));
                ph.record(t0);
            }
            Ok(())
        })
        .await
        .unwrap();
        let row = phase.finish("burn", 1, 2, 1, el);
        assert_eq!(row.ops, 8);
        let cpu = row.cpu_us_per_op.expect("measured");
        assert!(
            (1000.0..1900.0).contains(&cpu),
            "{cpu} us of CPU per op that burns 1 ms"
        );
        // Not driven: nothing measured.
        let idle = Phase::new("idle", 0, true).finish("idle", 1, 1, 1, Duration::ZERO);
        assert_eq!(idle.cpu_us_per_op, None);
    }

    /// A row timed per batch counts ops, rate and CPU per item.
    #[test]
    fn a_batched_row_counts_per_item() {
        let row = Row {
            scenario: "b".into(),
            size: 1,
            conns: 1,
            ops: 10,
            ops_per_sec: 100.0,
            gb_per_sec: 0.0,
            p50_ms: 0.0,
            p99_ms: 0.0,
            note: String::new(),
            cpu_us_per_op: Some(64.0),
        };
        let per = row.clone().per_item(16);
        assert_eq!((per.ops, per.ops_per_sec), (160, 1600.0));
        assert_eq!(per.cpu_us_per_op, Some(4.0));
        let unmeasured = Row {
            cpu_us_per_op: None,
            ..row
        };
        assert_eq!(unmeasured.per_item(16).cpu_us_per_op, None);
    }

    #[test]
    fn a_note_says_what_the_cache_served_and_nothing_when_it_served_nothing() {
        assert_eq!(served_by_cache(0, 100), "");
        assert_eq!(
            served_by_cache(25, 100),
            "25 of 100 reads from the location cache (25.0%)"
        );
    }
}
