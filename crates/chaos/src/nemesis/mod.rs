//! The nemesis (issue #33): clients put, overwrite, get and remove across a
//! fleet of hosts while faults are injected at random — a store node cut
//! from the masters, from the clients or from everyone, paused, killed, or
//! behind a slow link; with two masters, the leader killed, paused or cut
//! from etcd — and a checker holds every answer against what users rely on:
//! no read returns bytes that were never written for its key; a removed key
//! never comes back; clients see only retryable errors and every call ends
//! within its deadline; after healing the cluster serves with no manual
//! step, and every acknowledged object is readable unless every host that
//! held it was disrupted after it was acknowledged.
//!
//! [`run`] builds the fleet, runs the clients and the nemesis, and returns
//! a [`Report`]; `strata bench chaos` and the CI test both call it. A run
//! with anomalies keeps its history (one JSON line per call).

pub mod checker;
pub mod report;

use crate::fleet::{Fleet, HostRuntime};
use crate::procs::{ready, wait_ready, Proc, TokenFiles};
use crate::proxy::Proxy;
use anyhow::Context;
use checker::{gone, value, version_of, Disruptions, Gone, History, DEADLINE};
use parking_lot::Mutex;
use rand::{rngs::StdRng, Rng, SeedableRng};
use report::{FaultWindow, FinalCheck, MissedMidRun, Report};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_client::{Client, ClientConfig, Code, PutOptions};

/// What the caller sees while a run goes on (about once a second).
#[derive(Debug, Clone)]
pub struct Progress {
    pub elapsed: Duration,
    pub ops: u64,
    pub faults: u64,
    pub anomalies: usize,
}

pub type ProgressFn = Arc<dyn Fn(&Progress) + Send + Sync>;

pub struct Config {
    pub duration: Duration,
    /// Seeds every random choice (the clients' and the nemesis's); timing
    /// still differs between runs.
    pub seed: u64,
    pub clients: usize,
    /// Two masters electing through a real etcd, and faults aimed at the
    /// leader; else one master.
    pub ha: bool,
    /// Where the history goes: always when given, else to the temporary
    /// directory when the run found anomalies.
    pub history: Option<PathBuf>,
    /// Where the services' logs go (else the caller's stderr).
    pub logs: Option<PathBuf>,
    pub progress: Option<ProgressFn>,
}

impl Config {
    pub fn new(duration: Duration, seed: u64) -> Config {
        Config {
            duration,
            seed,
            clients: 3,
            ha: false,
            history: None,
            logs: None,
            progress: None,
        }
    }
}

/// The masters drop a silent node after this, and (with two) a leader
/// that cannot renew its election lease steps down after `ELECTION_TTL`.
const NODE_TTL_S: u64 = 2;
const ELECTION_TTL_S: u64 = 2;
/// The data port a node listens on, and the proxy in front of it that
/// clients and masters are told to use (so its link can be slowed).
const DATA: u16 = 7100;
const ADVERTISED: u16 = 7102;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    NodeCutFromMasters,
    NodeCutFromClients,
    NodeIsolated,
    NodePaused,
    NodeKilled,
    NodeLinkSlowed,
    LeaderKilled,
    LeaderPaused,
    LeaderCutFromEtcd,
}

const NODE_FAULTS: [Fault; 6] = [
    Fault::NodeCutFromMasters,
    Fault::NodeCutFromClients,
    Fault::NodeIsolated,
    Fault::NodePaused,
    Fault::NodeKilled,
    Fault::NodeLinkSlowed,
];
const LEADER_FAULTS: [Fault; 3] = [
    Fault::LeaderKilled,
    Fault::LeaderPaused,
    Fault::LeaderCutFromEtcd,
];

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::NodeCutFromMasters => "node cut from masters",
            Fault::NodeCutFromClients => "node cut from clients",
            Fault::NodeIsolated => "node isolated",
            Fault::NodePaused => "node paused",
            Fault::NodeKilled => "node killed",
            Fault::NodeLinkSlowed => "node link slowed",
            Fault::LeaderKilled => "leader killed",
            Fault::LeaderPaused => "leader paused",
            Fault::LeaderCutFromEtcd => "leader cut from etcd",
        }
    }

    /// Whether the node's objects may be lost by it: the masters may drop
    /// a node they cannot hear past its TTL, and a killed node's DRAM is
    /// gone. A leader fault or a slow link loses nothing.
    fn may_lose_objects(self) -> bool {
        !matches!(self, Fault::NodeCutFromClients | Fault::NodeLinkSlowed)
            && !LEADER_FAULTS.contains(&self)
    }
}

/// Which host runs what: etcd (with two masters), the masters, three store
/// nodes, and the clients.
struct Layout {
    etcd: Option<usize>,
    masters: Vec<usize>,
    nodes: Vec<usize>,
    client: usize,
}

impl Layout {
    fn new(ha: bool) -> Layout {
        match ha {
            false => Layout {
                etcd: None,
                masters: vec![0],
                nodes: vec![1, 2, 3],
                client: 4,
            },
            true => Layout {
                etcd: Some(0),
                masters: vec![1, 2],
                nodes: vec![3, 4, 5],
                client: 6,
            },
        }
    }

    fn hosts(&self) -> usize {
        self.client + 1
    }
}

/// The services of the run, restartable.
struct Cluster<'a> {
    f: &'a Fleet,
    l: Layout,
    tokens: TokenFiles,
    /// `HOST:PORT[,HOST:PORT]` of the masters.
    list: String,
    master_flags: Vec<String>,
    masters: Vec<Option<Proc>>,
    nodes: Vec<Option<Proc>>,
    /// One per node, in the node's host, with the runtime it runs on.
    proxies: Vec<(Proxy, HostRuntime)>,
    _etcd: Option<Proc>,
}

impl Cluster<'_> {
    fn start_master(&mut self, i: usize) -> anyhow::Result<()> {
        let flags: Vec<&str> = self.master_flags.iter().map(String::as_str).collect();
        self.masters[i] = Some(
            self.f
                .spawn_master(self.l.masters[i], &self.tokens, &flags)?,
        );
        Ok(())
    }

    fn start_node(&mut self, i: usize) -> anyhow::Result<()> {
        let h = self.l.nodes[i];
        let advertised = self.f.host(h).at(ADVERTISED);
        let extra = ["--advertise", &advertised];
        let id = format!("node-{h}");
        self.nodes[i] = Some(
            self.f
                .spawn_node(h, &self.list, &id, &self.tokens, &extra)?,
        );
        Ok(())
    }

    fn admin(&self, i: usize) -> String {
        self.f.host(self.l.masters[i]).at(7001)
    }

    /// The master that serves, if one answers so.
    async fn leader(&self) -> Option<usize> {
        for i in 0..self.masters.len() {
            if self.masters[i].is_some() && ready(&self.admin(i)).await == Some(true) {
                return Some(i);
            }
        }
        None
    }

    /// How many store nodes the serving master counts in.
    async fn live_nodes(&self) -> usize {
        let mut n = 0;
        for &h in &self.l.masters {
            n = n.max(self.f.live_nodes(h).await);
        }
        n
    }

    /// Waits until a master serves and counts every node in.
    async fn whole(&self, within: Duration) -> anyhow::Result<()> {
        let t0 = Instant::now();
        while self.leader().await.is_none() || self.live_nodes().await < self.l.nodes.len() {
            anyhow::ensure!(
                t0.elapsed() < within,
                "the cluster was not whole within {within:?} (a leader and {} nodes)",
                self.l.nodes.len()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }
}

/// Runs the nemesis: builds a fleet (root and iproute2 needed; with `ha`,
/// `etcd` on PATH), runs it for `cfg.duration`, and reports. An `Err` means
/// the run could not be made (no rights, a binary missing, a service that
/// never started); anomalies are in the report.
pub fn run(cfg: Config) -> anyhow::Result<Report> {
    let l = Layout::new(cfg.ha);
    let mut fleet = Fleet::try_new(l.hosts())?;
    let dir = tempfile::tempdir().context("a directory for the run")?;
    if let Some(logs) = &cfg.logs {
        std::fs::create_dir_all(logs)
            .with_context(|| format!("cannot create {}", logs.display()))?;
        fleet.log_to(logs);
    }
    let f = &fleet;
    let tokens = TokenFiles::generate(dir.path())?;
    let list = l
        .masters
        .iter()
        .map(|&h| f.host(h).at(7000))
        .collect::<Vec<_>>()
        .join(",");
    let mut master_flags = vec!["--node-ttl".to_string(), format!("{NODE_TTL_S}s")];
    let etcd = match l.etcd {
        None => None,
        Some(h) => {
            let data = dir.path().join("etcd");
            let p = f
                .spawn_etcd(h, &data)
                .context("etcd (install it: it is on the CI's PATH)")?;
            master_flags.extend(
                [
                    "--etcd",
                    &f.host(h).at(2379),
                    "--cluster-id",
                    "chaos",
                    "--election-ttl",
                    &format!("{ELECTION_TTL_S}s"),
                ]
                .map(String::from),
            );
            Some(p)
        }
    };
    let mut proxies = Vec::new();
    for &h in &l.nodes {
        let rt = f.runtime(h)?;
        let host = f.host(h);
        let p = Proxy::start(&rt, &host.at(ADVERTISED), &host.at(DATA), Duration::ZERO, 0)?;
        proxies.push((p, rt));
    }
    let mut c = Cluster {
        f,
        tokens,
        list,
        master_flags,
        masters: l.masters.iter().map(|_| None).collect(),
        nodes: l.nodes.iter().map(|_| None).collect(),
        proxies,
        _etcd: etcd,
        l,
    };
    for i in 0..c.masters.len() {
        c.start_master(i)?;
    }
    for i in 0..c.nodes.len() {
        c.start_node(i)?;
    }
    let rt = f.runtime(c.l.client)?;
    rt.block_on(drive(&mut c, &cfg))
}

/// The run proper, on a runtime in the clients' host.
async fn drive(c: &mut Cluster<'_>, cfg: &Config) -> anyhow::Result<Report> {
    for i in 0..c.masters.len() {
        // Each master answers (a follower's /ready is 503, so only the
        // answer is awaited here; `whole` waits for a leader).
        let t0 = Instant::now();
        while ready(&c.admin(i)).await.is_none() {
            anyhow::ensure!(
                t0.elapsed() < Duration::from_secs(30),
                "master {i} never answered"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    if c.masters.len() == 1 {
        wait_ready(&c.admin(0), Duration::from_secs(30)).await?;
    }
    c.whole(Duration::from_secs(30)).await?;
    let token = c.tokens.client_secret()?;
    let list = c.list.clone();
    let connect = || async {
        Client::connect(ClientConfig::new(&list).with_token(Some(token.clone()))).await
    };
    let t0 = Instant::now();
    let started_unix_ms = strata_common::time::unix_ms();
    let until = t0 + cfg.duration;
    let h = Arc::new(Mutex::new(History::new(t0)));
    let mut tasks = Vec::new();
    for i in 0..cfg.clients {
        let cl = connect().await.context("a client connects")?;
        let seed = cfg.seed ^ (i as u64 + 1);
        tasks.push(tokio::spawn(client_loop(cl, i, seed, until, h.clone())));
    }
    let injected = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let ticker = cfg.progress.clone().map(|p| {
        let (h, injected) = (h.clone(), injected.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let (ops, anomalies) = {
                    let g = h.lock();
                    (g.ops.values().sum(), g.anomalies.len())
                };
                p(&Progress {
                    elapsed: t0.elapsed(),
                    ops,
                    faults: injected.load(std::sync::atomic::Ordering::Relaxed),
                    anomalies,
                });
            }
        })
    });

    // The nemesis: a fault every 1–3 s, held 1–4 s, then healed. When each
    // node's disruptions ended is kept: an acknowledged object may be lost
    // only if every node holding it was disrupted after it was acknowledged.
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let mut windows: Vec<FaultWindow> = Vec::new();
    let mut disrupted = Disruptions::new();
    let kinds: Vec<Fault> = match c.masters.len() {
        1 => NODE_FAULTS.to_vec(),
        _ => [&NODE_FAULTS[..], &LEADER_FAULTS[..]].concat(),
    };
    let ms = |t: Instant| t.saturating_duration_since(t0).as_millis() as u64;
    let outcome = async {
        while Instant::now() + Duration::from_secs(5) < until {
            tokio::time::sleep(Duration::from_millis(rng.gen_range(1000..3000))).await;
            let fault = kinds[rng.gen_range(0..kinds.len())];
            let hold = Duration::from_millis(rng.gen_range(1000..4000));
            let i = rng.gen_range(0..c.nodes.len());
            let start = Instant::now();
            let target = inject(c, fault, i).await?;
            injected.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tokio::time::sleep(hold).await;
            heal(c, fault, &target).await?;
            let healed = Instant::now();
            if fault.may_lose_objects() {
                disrupted
                    .entry(target.name.clone())
                    .or_default()
                    .push((start, healed));
            }
            windows.push(FaultWindow {
                kind: fault.name(),
                target: target.name,
                start_ms: ms(start),
                heal_ms: ms(healed),
            });
        }
        anyhow::Ok(())
    }
    .await;
    for t in tasks {
        t.await.context("a client task")?;
    }
    if let Some(t) = ticker {
        t.abort();
    }
    outcome?;
    let end_ms = ms(Instant::now());

    // Healed: the cluster serves again with no manual step.
    c.f.heal()?;
    c.whole(Duration::from_secs(60))
        .await
        .context("after healing")?;
    let cl = connect().await.context("a client connects after healing")?;
    let final_check = final_check(&cl, &h, &disrupted).await;
    let after = cl
        .put("after-nemesis", b"fine", &PutOptions::default())
        .await;
    let mut g = h.lock();
    if let Err(e) = after {
        g.anomalies
            .push(format!("the cluster takes no write after healing: {e}"));
    }
    // Acknowledged keys a get found missing during the run: each must have
    // lost every host that held it between its acknowledgement and the miss.
    let mut missed_mid_run = MissedMidRun::default();
    for m in std::mem::take(&mut g.missing) {
        match gone(&m.nodes, m.acked_at, Some(m.at), &disrupted) {
            Gone::WithHosts => missed_mid_run.with_hosts += 1,
            Gone::Unknown => missed_mid_run.unknown += 1,
            Gone::Lost => {
                let when = ms(m.at);
                g.anomalies.push(format!(
                    "get {} at {when} ms: acknowledged v{} not found though {:?} were not all \
                     disrupted since",
                    m.key, m.acked, m.nodes
                ))
            }
        }
    }
    let mut report = Report {
        seed: cfg.seed,
        started_unix_ms,
        seconds: cfg.duration.as_secs(),
        ha: c.masters.len() > 1,
        node_ttl_s: NODE_TTL_S,
        election_ttl_s: (c.masters.len() > 1).then_some(ELECTION_TTL_S),
        ops: g.ops.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        final_check,
        missed_mid_run,
        stale_reads: g.stale_reads,
        anomalies: g.anomalies.clone(),
        ..Default::default()
    };
    with_every_kind(&mut report);
    report.injected = windows.clone();
    report.availability(&g.outcomes, &windows, end_ms);
    let keep = match (&cfg.history, g.anomalies.is_empty()) {
        (Some(p), _) => Some(p.clone()),
        (None, false) => {
            Some(std::env::temp_dir().join(format!("strata-nemesis-{}.jsonl", cfg.seed)))
        }
        (None, true) => None,
    };
    if let Some(path) = keep {
        // Times are ms after `started_unix_ms` (to line up with the logs).
        let start = serde_json::json!({ "started_unix_ms": started_unix_ms }).to_string();
        let faults = windows
            .iter()
            .map(|w| serde_json::json!({"fault": w}).to_string());
        let lines: Vec<String> = std::iter::once(start)
            .chain(g.lines.iter().cloned())
            .chain(faults)
            .collect();
        std::fs::write(&path, lines.join("\n") + "\n")
            .with_context(|| format!("cannot write the history to {}", path.display()))?;
        report.history = Some(path);
    }
    Ok(report)
}

/// What a fault was aimed at.
struct Target {
    name: String,
    /// Index into the cluster's nodes or masters.
    index: usize,
}

async fn inject(c: &mut Cluster<'_>, fault: Fault, i: usize) -> anyhow::Result<Target> {
    let node = c.l.nodes[i];
    let on_node = Target {
        name: format!("node-{node}"),
        index: i,
    };
    match fault {
        Fault::NodeCutFromMasters => {
            for &m in &c.l.masters {
                c.f.partition(node, m)?;
            }
        }
        Fault::NodeCutFromClients => c.f.partition(node, c.l.client)?,
        Fault::NodeIsolated => c.f.isolate(node)?,
        Fault::NodePaused => signal(&c.nodes[i], libc::SIGSTOP),
        Fault::NodeKilled => c.nodes[i] = None,
        Fault::NodeLinkSlowed => c.proxies[i]
            .0
            .link
            .set(Duration::from_millis(100), 512 << 10),
        Fault::LeaderKilled | Fault::LeaderPaused | Fault::LeaderCutFromEtcd => {
            // Mid-failover no master may serve yet: aim at either then.
            let m = match c.leader().await {
                Some(m) => m,
                None => i % c.masters.len(),
            };
            let host = c.l.masters[m];
            match fault {
                Fault::LeaderKilled => c.masters[m] = None,
                Fault::LeaderPaused => signal(&c.masters[m], libc::SIGSTOP),
                _ => {
                    c.f.partition(host, c.l.etcd.context("a leader fault without etcd")?)?
                }
            }
            return Ok(Target {
                name: format!("master-{host}"),
                index: m,
            });
        }
    }
    Ok(on_node)
}

async fn heal(c: &mut Cluster<'_>, fault: Fault, t: &Target) -> anyhow::Result<()> {
    match fault {
        Fault::NodePaused => signal(&c.nodes[t.index], libc::SIGCONT),
        Fault::NodeKilled => c.start_node(t.index)?,
        Fault::NodeLinkSlowed => c.proxies[t.index].0.link.set(Duration::ZERO, 0),
        Fault::LeaderPaused => signal(&c.masters[t.index], libc::SIGCONT),
        Fault::LeaderKilled => c.start_master(t.index)?,
        Fault::NodeCutFromMasters
        | Fault::NodeCutFromClients
        | Fault::NodeIsolated
        | Fault::LeaderCutFromEtcd => c.f.heal()?,
    }
    Ok(())
}

fn signal(p: &Option<Proc>, sig: libc::c_int) {
    if let Some(p) = p {
        p.signal(sig);
    }
}

/// Reads back every acknowledged key (retrying what is retryable within
/// the deadline) and judges it.
async fn final_check(cl: &Client, h: &Mutex<History>, disrupted: &Disruptions) -> FinalCheck {
    let mut out = FinalCheck::default();
    type Acked = (String, u32, Vec<String>, Option<Instant>, bool);
    let keys: Vec<Acked> = {
        let g = h.lock();
        g.keys
            .iter()
            .filter(|(_, s)| !s.remove_tried || s.removed)
            .filter_map(|(k, s)| {
                s.acked
                    .map(|a| (k.clone(), a, s.nodes.clone(), s.acked_at, s.removed))
            })
            .collect()
    };
    if keys.is_empty() {
        h.lock()
            .anomalies
            .push("the clients acknowledged no put".into());
    }
    for (k, acked, held_by, acked_at, removed) in &keys {
        out.checked += 1;
        let t = Instant::now();
        let r = loop {
            match tokio::time::timeout(DEADLINE, cl.get(k)).await {
                Ok(Err(e)) if e.retryable() && t.elapsed() < DEADLINE => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                Ok(r) => break Some(r),
                Err(_) => break None,
            }
        };
        let mut g = h.lock();
        let Some(r) = r else {
            g.anomalies
                .push(format!("final get {k}: no answer within {DEADLINE:?}"));
            continue;
        };
        match (r, removed) {
            (Ok(_), true) => g
                .anomalies
                .push(format!("final get {k}: a removed key came back")),
            (Ok(b), false) => match version_of(k, &b) {
                Some(v) if v >= *acked && g.keys[k].attempted.contains(&v) => out.readable += 1,
                v => g
                    .anomalies
                    .push(format!("final get {k}: v{v:?}, acknowledged v{acked}")),
            },
            (Err(e), false) if e.code == Code::NotFound => {
                match gone(held_by, *acked_at, None, disrupted) {
                    Gone::Unknown => out.unknown += 1,
                    Gone::WithHosts => out.lost_with_hosts += 1,
                    Gone::Lost => g.anomalies.push(format!(
                        "final get {k}: acknowledged v{acked} lost though {held_by:?} were not all \
                         disrupted"
                    )),
                }
            }
            (Err(e), true) if e.code == Code::NotFound => out.stayed_removed += 1,
            (Err(e), _) => g.anomalies.push(format!("final get {k}: {e}")),
        }
    }
    out
}

/// Keys one client keeps at most (acknowledged, not removed): 3 clients'
/// keys, twice over, take a sixth of the nodes' 3 × 64 MiB.
const LIVE_KEYS: usize = 600;

/// One client: puts new keys (two replicas), overwrites, reads and removes
/// its own keys until `until`, recording everything in `h`.
async fn client_loop(cl: Client, c: usize, seed: u64, until: Instant, h: Arc<Mutex<History>>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let two = PutOptions {
        replicas: 2,
        ..Default::default()
    };
    let mut mine: Vec<String> = Vec::new();
    let mut n = 0;
    while Instant::now() < until {
        let roll = rng.gen_range(0..100);
        let live: Vec<&String> = {
            let g = h.lock();
            mine.iter()
                .filter(|k| g.keys[k.as_str()].acked.is_some() && !g.keys[k.as_str()].remove_tried)
                .collect()
        };
        let pick = |rng: &mut StdRng| {
            (!live.is_empty()).then(|| live[rng.gen_range(0..live.len())].clone())
        };
        // A bounded working set: the cluster's DRAM never fills, so no
        // acknowledged object is evicted (which would look like a loss).
        let roll = match roll {
            0..=34 if live.len() >= LIVE_KEYS => 90,
            r => r,
        };
        let (op, key, overwrite) = match roll {
            0..=34 => {
                n += 1;
                ("put", format!("c{c}-k{n}"), false)
            }
            35..=49 => match pick(&mut rng) {
                Some(k) => ("overwrite", k, true),
                None => continue,
            },
            50..=89 => match mine.is_empty() {
                true => continue,
                false => ("get", mine[rng.gen_range(0..mine.len())].clone(), false),
            },
            _ => match pick(&mut rng) {
                Some(k) => ("remove", k, false),
                None => continue,
            },
        };
        let started = Instant::now();
        match op {
            "put" | "overwrite" => {
                let version = {
                    let mut g = h.lock();
                    let s = g.keys.entry(key.clone()).or_default();
                    let v = s.attempted.iter().max().map_or(0, |v| v + 1);
                    s.attempted.push(v);
                    v
                };
                if !overwrite {
                    mine.push(key.clone());
                }
                let opts = PutOptions {
                    overwrite,
                    ..two.clone()
                };
                let r = tokio::time::timeout(DEADLINE, cl.put(&key, &value(&key, version), &opts))
                    .await;
                // When the put was acknowledged, before the lookup below.
                let acked_at = Instant::now();
                let nodes = match &r {
                    Ok(Ok(())) => tokio::time::timeout(DEADLINE, cl.inspect(&key))
                        .await
                        .ok()
                        .and_then(Result::ok)
                        .map(|i| i.replicas.into_iter().map(|r| r.node_id).collect()),
                    _ => None,
                };
                let mut g = h.lock();
                let answered = answered(&r);
                let what = match r {
                    Err(_) => g.no_answer(op, &key),
                    Ok(Ok(())) => {
                        if let Some(s) = g.keys.get_mut(&key) {
                            s.acked = Some(version);
                            s.acked_at = Some(acked_at);
                            s.nodes = nodes.unwrap_or_default();
                        }
                        format!("ok v{version}")
                    }
                    Ok(Err(e)) => {
                        // Perhaps committed after all, on other nodes than
                        // the acknowledged version's: which nodes hold the
                        // key is no longer known.
                        if let Some(s) = g.keys.get_mut(&key) {
                            s.nodes.clear();
                        }
                        g.judge(op, &key, &e, &[]);
                        format!("{:?}", e.code)
                    }
                };
                g.record(started, c, op, &key, &what, answered);
            }
            "get" => {
                let r = tokio::time::timeout(DEADLINE, cl.get(&key)).await;
                let mut g = h.lock();
                let answered = answered(&r);
                let what = match r {
                    Err(_) => g.no_answer(op, &key),
                    Ok(Ok(bytes)) => g.read(&key, &bytes),
                    Ok(Err(e)) => {
                        g.judge(op, &key, &e, &[Code::NotFound]);
                        // Only a final answer: a node's NotFound comes back
                        // retryable (the client asks the master again).
                        if e.code == Code::NotFound && !e.retryable() {
                            g.not_found(&key);
                        }
                        format!("{:?}", e.code)
                    }
                };
                g.record(started, c, op, &key, &what, answered);
            }
            _ => {
                if let Some(s) = h.lock().keys.get_mut(&key) {
                    s.remove_tried = true;
                }
                let r = tokio::time::timeout(DEADLINE, cl.remove(&key, false)).await;
                let mut g = h.lock();
                let answered = answered(&r);
                let what = match r {
                    Err(_) => g.no_answer(op, &key),
                    Ok(Ok(())) => {
                        if let Some(s) = g.keys.get_mut(&key) {
                            s.removed = true;
                        }
                        "ok".to_string()
                    }
                    Ok(Err(e)) => {
                        // Gone with its hosts, or a reader's lease holds it.
                        g.judge(op, &key, &e, &[Code::NotFound, Code::Leased]);
                        format!("{:?}", e.code)
                    }
                };
                g.record(started, c, op, &key, &what, answered);
            }
        }
    }
}

/// Whether a call got an answer: a success or a final error, not a
/// retryable one or none within its deadline.
fn answered<T, E>(r: &Result<strata_client::Result<T>, E>) -> bool {
    match r {
        Ok(Ok(_)) => true,
        Ok(Err(e)) => !e.retryable(),
        Err(_) => false,
    }
}

/// Names of the fault kinds a run may inject (`ha`: the leader's too).
pub fn fault_kinds(ha: bool) -> Vec<&'static str> {
    let mut v: Vec<&'static str> = NODE_FAULTS.iter().map(|f| f.name()).collect();
    if ha {
        v.extend(LEADER_FAULTS.iter().map(|f| f.name()));
    }
    v
}

/// Every kind the run could inject present in its report (at zero when it
/// injected none of it), so runs compare line by line.
fn with_every_kind(report: &mut Report) {
    for k in fault_kinds(report.ha) {
        report.faults.entry(k.to_string()).or_default();
    }
}
