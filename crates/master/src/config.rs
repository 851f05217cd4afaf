//! Master settings: the resolved [`MasterConfig`] the library runs with, and
//! the [`MasterArgs`] flag/env/config-file layer the binary parses.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use strata_common::auth::{Credentials, Secret};
use strata_common::units::{ByteSize, HumanDuration};
use strata_common::{Error, Result};

/// How PutStart chooses segments among those with room.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AllocStrategy {
    /// Uniformly random among segments that fit: spreads load.
    #[default]
    Random,
    /// The segment with the most free bytes first: evens out fill.
    MostFreeFirst,
}

impl std::str::FromStr for AllocStrategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "random" => Ok(AllocStrategy::Random),
            "most-free-first" => Ok(AllocStrategy::MostFreeFirst),
            _ => Err(format!(
                "unknown allocation strategy {s:?}; use random or most-free-first"
            )),
        }
    }
}

/// Which objects go to the SSD tier. Parsed and validated now; the SSD tier
/// that acts on it arrives with `strata-ssd-agent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OffloadPolicy {
    Eager,
    /// The default: best hit rates in `strata bench scan` and `replay`
    /// (docs/ssd-offload.md says why).
    #[default]
    OnEvict,
    Reads(u32),
}

impl std::str::FromStr for OffloadPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "eager" => Ok(OffloadPolicy::Eager),
            "on-evict" => Ok(OffloadPolicy::OnEvict),
            _ => match s.strip_prefix("reads:").map(str::parse::<u32>) {
                // Objects count reads in 16 bits (they are kept small).
                Some(Ok(n)) if (1..=u32::from(u16::MAX)).contains(&n) => {
                    Ok(OffloadPolicy::Reads(n))
                }
                _ => Err(format!(
                    "unknown offload policy {s:?}; use eager, on-evict or reads:N with N from 1 to {}",
                    u16::MAX
                )),
            },
        }
    }
}

impl std::fmt::Display for OffloadPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OffloadPolicy::Eager => f.write_str("eager"),
            OffloadPolicy::OnEvict => f.write_str("on-evict"),
            OffloadPolicy::Reads(n) => write!(f, "reads:{n}"),
        }
    }
}

/// Which DRAM victims `on-evict` sends to SSD.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SsdAdmission {
    /// Every victim, unless a loop larger than DRAM + SSD is detected; then
    /// the SSD keeps what it holds (offload/admission.rs).
    #[default]
    Auto,
    /// Every victim.
    All,
}

impl std::str::FromStr for SsdAdmission {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(SsdAdmission::Auto),
            "all" => Ok(SsdAdmission::All),
            _ => Err(format!("unknown SSD admission {s:?}; use auto or all")),
        }
    }
}

impl std::fmt::Display for SsdAdmission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SsdAdmission::Auto => "auto",
            SsdAdmission::All => "all",
        })
    }
}

/// What readers verify objects with (`--integrity`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Integrity {
    /// The crc32c every transfer carries: catches corruption, not a member
    /// that forges bytes with the same crc32c (four chosen bytes do it).
    #[default]
    Crc32c,
    /// Every PutEnd brings the writer's BLAKE3 digest; readers accept a
    /// replica's bytes only with that digest.
    Blake3,
}

impl std::str::FromStr for Integrity {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "crc32c" => Ok(Integrity::Crc32c),
            "blake3" => Ok(Integrity::Blake3),
            _ => Err(format!("unknown integrity {s:?}; use crc32c or blake3")),
        }
    }
}

impl std::fmt::Display for Integrity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Integrity::Crc32c => "crc32c",
            Integrity::Blake3 => "blake3",
        })
    }
}

/// Longest `--put-wait`: well inside the clients' 30 s call timeout.
pub const MAX_PUT_WAIT: Duration = Duration::from_secs(20);
/// Smallest `--max-inflight-bytes`: room for any small call.
pub const MIN_INFLIGHT_BYTES: u64 = 1 << 20;

#[derive(Debug, Clone)]
pub struct MasterConfig {
    pub listen: SocketAddr,
    pub admin_addr: SocketAddr,
    /// What nodes and clients should dial; defaults to `listen`.
    pub advertise: Option<String>,
    pub state_dir: Option<PathBuf>,
    /// Read lease granted by GetReplicas.
    pub lease_ttl: Duration,
    /// The longest a lease is held without a break (`Object::lease`);
    /// None: `max_lease()`'s default.
    pub max_lease: Option<Duration>,
    /// A node silent for this long loses its segments.
    pub node_ttl: Duration,
    /// A PutStart not ended within this time is reclaimed.
    pub put_timeout: Duration,
    /// A put that needs DRAM held by objects still being copied to SSD waits
    /// this long for the copies (then fails with a retryable no_space).
    pub put_wait: Duration,
    pub high_watermark: f64,
    pub eviction_ratio: f64,
    pub alloc_strategy: AllocStrategy,
    pub offload_policy: OffloadPolicy,
    /// `on-evict` only: which victims go to SSD.
    pub ssd_admission: SsdAdmission,
    /// What readers verify objects with.
    pub integrity: Integrity,
    /// An offload task handed to an agent must be reported within this time.
    pub offload_task_ttl: Duration,
    /// An SSD hit queues a copy of the object back into DRAM.
    pub promote_on_hit: bool,
    /// Promotions waiting at most (more are not queued: a read never waits).
    pub promote_queue: usize,
    /// One secret per role; none at all = protected mode (loopback only).
    pub credentials: Credentials,
    /// Serve beyond loopback without credentials (protected mode off).
    pub insecure: bool,
    /// HA mode: etcd endpoints (`HOST:PORT`, or with the scheme that
    /// `etcd_access` implies); empty = single master.
    pub etcd: Vec<String>,
    /// HA mode: the etcd user and password (an etcd with authentication)
    /// and TLS to etcd.
    pub etcd_access: strata_common::leader::EtcdAccess,
    /// HA mode: the cluster these masters lead (names etcd keys).
    pub cluster_id: String,
    /// HA mode: the leader's etcd lease; a dead leader is replaced after
    /// at most this long.
    pub election_ttl: Duration,
    /// Connections the port holds at most (gRPC and quick calls).
    pub max_connections: usize,
    /// Of those, from one peer address at most.
    pub max_connections_per_peer: usize,
    /// Request bytes being received at once, all calls together.
    pub max_inflight_bytes: u64,
    /// HTTP/2 pings on each gRPC connection this often, and the connection
    /// is dropped when one is not answered in `keepalive_timeout` (a peer
    /// gone without closing its socket gives its slot back). Not a flag:
    /// tests shorten them.
    pub keepalive_interval: Duration,
    pub keepalive_timeout: Duration,
    /// Encoded bytes of a store node's object log it has not applied; past
    /// it the node is dropped and registers again (`cluster/node.rs`). Not
    /// a flag: a healthy node applies its log within a heartbeat; tests
    /// shrink it.
    pub max_node_log_bytes: u64,
}

impl Default for MasterConfig {
    fn default() -> Self {
        MasterConfig {
            listen: ([127, 0, 0, 1], 7400).into(),
            admin_addr: ([127, 0, 0, 1], 7401).into(),
            advertise: None,
            state_dir: None,
            lease_ttl: Duration::from_secs(5),
            max_lease: None,
            node_ttl: Duration::from_secs(10),
            put_timeout: Duration::from_secs(30),
            put_wait: Duration::from_secs(5),
            high_watermark: 0.9,
            eviction_ratio: 0.05,
            alloc_strategy: AllocStrategy::Random,
            offload_policy: OffloadPolicy::OnEvict,
            ssd_admission: SsdAdmission::Auto,
            integrity: Integrity::Crc32c,
            offload_task_ttl: Duration::from_secs(30),
            promote_on_hit: false,
            promote_queue: 1024,
            credentials: Credentials::default(),
            insecure: false,
            etcd: Vec::new(),
            etcd_access: Default::default(),
            cluster_id: "strata".into(),
            election_ttl: Duration::from_secs(6),
            max_connections: 8192,
            max_connections_per_peer: 1024,
            max_inflight_bytes: 1 << 30,
            keepalive_interval: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(20),
            max_node_log_bytes: 128 << 20,
        }
    }
}

impl MasterConfig {
    /// For tests and `strata up`: loopback, ephemeral ports.
    pub fn local() -> Self {
        MasterConfig {
            listen: ([127, 0, 0, 1], 0).into(),
            admin_addr: ([127, 0, 0, 1], 0).into(),
            ..Default::default()
        }
    }

    /// The longest a read lease is held without a break: `--max-lease`, or
    /// 12 lease TTLs and at least a minute.
    pub fn max_lease(&self) -> Duration {
        self.max_lease
            .unwrap_or((self.lease_ttl * 12).max(Duration::from_secs(60)))
    }

    /// How often members heartbeat (a quarter of `--node-ttl`, 20 ms to 2 s).
    pub(crate) fn heartbeat_interval(&self) -> std::time::Duration {
        std::time::Duration::from_millis((self.node_ttl.as_millis() as u64 / 4).clamp(20, 2000))
    }

    /// Longest a PutEnd waits for its nodes: a node that does not answer
    /// within two heartbeat intervals is failing anyway (its objects go
    /// with it), and the put stays committed in this master.
    pub(crate) fn sync_wait(&self) -> std::time::Duration {
        (self.node_ttl / 2).min(std::time::Duration::from_secs(2))
    }

    /// Checks the settings; says how calls are guarded (protected mode).
    pub fn validate(&self) -> Result<strata_common::auth::Protection> {
        self.credentials.check_distinct()?;
        strata_common::auth::check_advertise("--listen", self.listen, self.advertise.as_deref())?;
        if !(self.high_watermark > 0.0 && self.high_watermark <= 1.0) {
            return Err(Error::invalid(format!(
                "--high-watermark must be in (0, 1], got {}",
                self.high_watermark
            )));
        }
        if !(self.eviction_ratio > 0.0 && self.eviction_ratio <= 1.0) {
            return Err(Error::invalid(format!(
                "--eviction-ratio must be in (0, 1], got {}",
                self.eviction_ratio
            )));
        }
        for (name, d) in [
            ("--lease-ttl", self.lease_ttl),
            ("--node-ttl", self.node_ttl),
            ("--put-timeout", self.put_timeout),
            ("--offload-task-ttl", self.offload_task_ttl),
        ] {
            if d < Duration::from_millis(10) {
                return Err(Error::invalid(format!("{name} must be at least 10ms")));
            }
        }
        if self.max_lease.is_some_and(|m| m < self.lease_ttl) {
            return Err(Error::invalid(format!(
                "--max-lease ({} ms) must be at least --lease-ttl ({} ms)",
                self.max_lease().as_millis(),
                self.lease_ttl.as_millis()
            )));
        }
        strata_common::leader::validate_cluster_id(&self.cluster_id)
            .map_err(|e| Error::invalid(format!("--cluster-id: {}", e.message)))?;
        if self.election_ttl < Duration::from_secs(2)
            || self.election_ttl > Duration::from_secs(300)
        {
            return Err(Error::invalid(format!(
                "--election-ttl must be 2s to 300s (etcd leases are whole seconds), got {:?}",
                self.election_ttl
            )));
        }
        if self.etcd_access.is_set() && self.etcd.is_empty() {
            return Err(Error::invalid(
                "--etcd-user, --etcd-password-file and the --etcd-*-file TLS settings are \
                 for HA mode: give --etcd too",
            ));
        }
        if !self.etcd.is_empty() && self.advertise.is_none() && self.listen.ip().is_unspecified() {
            return Err(Error::invalid(
                "HA mode (--etcd) publishes the leader's address: give --advertise HOST:PORT",
            ));
        }
        self.etcd_access
            .urls(&self.etcd)
            .map_err(|e| Error::invalid(format!("--etcd: {}", e.message)))?;
        if self.max_connections == 0
            || self.max_connections_per_peer == 0
            || self.max_connections_per_peer > self.max_connections
        {
            return Err(Error::invalid(format!(
                "--max-connections ({}) and --max-connections-per-peer ({}) must be positive, \
                 the share of one peer no more than all",
                self.max_connections, self.max_connections_per_peer
            )));
        }
        if self.max_inflight_bytes < MIN_INFLIGHT_BYTES {
            return Err(Error::invalid(format!(
                "--max-inflight-bytes must be at least {MIN_INFLIGHT_BYTES} (1MiB), got {}",
                self.max_inflight_bytes
            )));
        }
        if self.put_wait > MAX_PUT_WAIT {
            return Err(Error::invalid(format!(
                "--put-wait must be at most {}s (clients give up on a call after 30s), got {:?}",
                MAX_PUT_WAIT.as_secs(),
                self.put_wait
            )));
        }
        strata_common::auth::check_protected_mode(
            &self.credentials,
            &[("--listen", self.listen), ("--admin-addr", self.admin_addr)],
            self.insecure,
        )
    }
}

/// `--etcd` as a list of endpoints (a bare HOST:PORT gets its scheme from
/// the TLS settings when the master connects).
fn etcd_endpoints(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(String::from)
        .collect()
}

/// Flags of `strata-master`. Every flag has an env var; `--config` supplies
/// values for flags given neither way.
#[derive(Debug, Default, clap::Parser, serde::Deserialize)]
#[command(name = "strata-master", version, about = "Strata metadata master")]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct MasterArgs {
    /// TOML file with any of these settings (kebab-case keys).
    #[arg(long, env = "STRATA_CONFIG")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// gRPC listen address [default: 127.0.0.1:7400]
    #[arg(long, env = "STRATA_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Admin HTTP address: /metrics, /health, /ready, /api/v1 [default: 127.0.0.1:7401]
    #[arg(long, env = "STRATA_ADMIN_ADDR")]
    pub admin_addr: Option<SocketAddr>,
    /// Address others should dial (HOST:PORT) [default: the listen address]
    #[arg(long, env = "STRATA_ADVERTISE")]
    pub advertise: Option<String>,
    /// Directory for single-master durable state
    #[arg(long, env = "STRATA_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Read lease granted to readers [default: 5s]
    #[arg(long, env = "STRATA_LEASE_TTL")]
    pub lease_ttl: Option<HumanDuration>,
    /// The longest a read lease is held without a break (every reader done, or a lease TTL without lookups): lookups past it get no lease, so a client that never ends its leases cannot keep objects from eviction or removal [default: 12 x --lease-ttl, at least 60s]
    #[arg(long, env = "STRATA_MAX_LEASE")]
    pub max_lease: Option<HumanDuration>,
    /// A store node silent this long loses its segments [default: 10s]
    #[arg(long, env = "STRATA_NODE_TTL")]
    pub node_ttl: Option<HumanDuration>,
    /// A PutStart not ended within this time is reclaimed [default: 30s]
    #[arg(long, env = "STRATA_PUT_TIMEOUT")]
    pub put_timeout: Option<HumanDuration>,
    /// How long a put waits for DRAM while victims are copied to SSD (or
    /// versions an overwrite replaced are still leased by readers) before
    /// failing with a retryable no_space; 0 = never wait [default: 5s]
    #[arg(long, env = "STRATA_PUT_WAIT")]
    pub put_wait: Option<HumanDuration>,
    /// Fill ratio that triggers eviction [default: 0.9]
    #[arg(long, env = "STRATA_HIGH_WATERMARK")]
    pub high_watermark: Option<f64>,
    /// Share of capacity one eviction pass frees [default: 0.05]
    #[arg(long, env = "STRATA_EVICTION_RATIO")]
    pub eviction_ratio: Option<f64>,
    /// random | most-free-first [default: random]
    #[arg(long, env = "STRATA_ALLOC_STRATEGY")]
    pub alloc_strategy: Option<String>,
    /// SSD admission: eager | on-evict | reads:N [default: on-evict]
    #[arg(long, env = "STRATA_OFFLOAD_POLICY")]
    pub offload_policy: Option<String>,
    /// on-evict: which DRAM victims go to SSD: auto (all, unless a loop larger than DRAM + SSD is detected) | all [default: auto]
    #[arg(long, env = "STRATA_SSD_ADMISSION")]
    pub ssd_admission: Option<String>,
    /// What readers verify objects with: crc32c (catches corruption) | blake3 (every put brings the writer's BLAKE3 digest, and readers accept no other bytes, even from a lying store node or SSD agent; costs a hash of each object on both sides) [default: crc32c]
    #[arg(long, env = "STRATA_INTEGRITY")]
    pub integrity: Option<String>,
    /// An offload task not reported within this time is requeued [default: 30s]
    #[arg(long, env = "STRATA_OFFLOAD_TASK_TTL")]
    pub offload_task_ttl: Option<HumanDuration>,
    /// Copy an object back into DRAM after an SSD hit (asynchronously) [default: false]
    #[arg(long, env = "STRATA_PROMOTE_ON_HIT")]
    pub promote_on_hit: Option<bool>,
    /// Promotions queued at most; beyond it SSD hits are not promoted [default: 1024]
    #[arg(long, env = "STRATA_PROMOTE_QUEUE")]
    pub promote_queue: Option<usize>,
    /// File holding the secret store nodes and SSD agents present (register, heartbeat, report)
    #[arg(long, env = "STRATA_MEMBER_TOKEN_FILE")]
    pub member_token_file: Option<PathBuf>,
    /// File holding the secret clients present (put, get, exists, remove, list)
    #[arg(long, env = "STRATA_CLIENT_TOKEN_FILE")]
    pub client_token_file: Option<PathBuf>,
    /// File holding the secret admins present (client calls plus forced removes, rm --all, evict)
    #[arg(long, env = "STRATA_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// File holding the secret rdma clients present (client calls plus the UCX remote keys of store nodes' segments: one-sided access to whole segments) [default: none: nobody gets them, except in protected mode, where every caller has every role]
    #[arg(long, env = "STRATA_RDMA_TOKEN_FILE")]
    pub rdma_token_file: Option<PathBuf>,
    /// Serve beyond loopback without any token file (anyone reaching the ports owns the cluster) [default: false]
    #[arg(long, env = "STRATA_INSECURE", num_args = 0..=1, default_missing_value = "true")]
    pub insecure: Option<bool>,
    /// HA mode: etcd endpoints, comma-separated (HOST:PORT, http://HOST:PORT, or https://HOST:PORT with --etcd-ca-file); without it the master runs single [default: none]
    #[arg(long, env = "STRATA_ETCD")]
    pub etcd: Option<String>,
    /// HA mode: the etcd user to authenticate as (an etcd with authentication on; with --etcd-password-file) [default: none]
    #[arg(long, env = "STRATA_ETCD_USER")]
    pub etcd_user: Option<String>,
    /// HA mode: file holding that etcd user's password [default: none]
    #[arg(long, env = "STRATA_ETCD_PASSWORD_FILE")]
    pub etcd_password_file: Option<PathBuf>,
    /// HA mode: TLS to etcd: PEM file of the CA that signed etcd's certificate; bare --etcd endpoints then get https:// [default: none: plain http]
    #[arg(long, env = "STRATA_ETCD_CA_FILE")]
    pub etcd_ca_file: Option<PathBuf>,
    /// HA mode: this master's client certificate (PEM) for an etcd that checks its clients (--client-cert-auth); with --etcd-key-file [default: none]
    #[arg(long, env = "STRATA_ETCD_CERT_FILE")]
    pub etcd_cert_file: Option<PathBuf>,
    /// HA mode: the private key (PEM) of --etcd-cert-file [default: none]
    #[arg(long, env = "STRATA_ETCD_KEY_FILE")]
    pub etcd_key_file: Option<PathBuf>,
    /// HA mode: name of the cluster these masters lead (etcd key prefix) [default: strata]
    #[arg(long, env = "STRATA_CLUSTER_ID")]
    pub cluster_id: Option<String>,
    /// HA mode: the leader's etcd lease TTL; a dead leader is replaced within it (2s to 300s) [default: 6s]
    #[arg(long, env = "STRATA_ELECTION_TTL")]
    pub election_ttl: Option<HumanDuration>,
    /// Connections the master's port holds at most; more are closed at once [default: 8192]
    #[arg(long, env = "STRATA_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// Connections one peer address may hold at most, so a few hosts cannot take every slot [default: 1024]
    #[arg(long, env = "STRATA_MAX_CONNECTIONS_PER_PEER")]
    pub max_connections_per_peer: Option<usize>,
    /// Request bytes the master receives at once, all calls together; a call past it is refused (retryable). Below 256MiB the largest member reports may never fit [default: 1GiB]
    #[arg(long, env = "STRATA_MAX_INFLIGHT_BYTES")]
    pub max_inflight_bytes: Option<ByteSize>,
    #[command(flatten)]
    #[serde(skip)]
    pub telemetry: strata_common::telemetry::TelemetryArgs,
    /// Validate the flags, environment, config file and token files, then exit (0 valid, 2 not) without starting
    #[arg(long)]
    #[serde(skip)]
    pub check_config: bool,
}

impl MasterArgs {
    /// Applies the config file (if any) under flags/env, then defaults.
    pub fn resolve(mut self) -> Result<MasterConfig> {
        if let Some(path) = self.config.clone() {
            let mut file: MasterArgs = strata_common::config::load_toml(&path)?;
            strata_common::merge_opts!(
                self,
                file,
                [
                    listen,
                    admin_addr,
                    advertise,
                    state_dir,
                    lease_ttl,
                    max_lease,
                    node_ttl,
                    put_timeout,
                    put_wait,
                    high_watermark,
                    eviction_ratio,
                    alloc_strategy,
                    offload_policy,
                    ssd_admission,
                    integrity,
                    offload_task_ttl,
                    promote_on_hit,
                    promote_queue,
                    member_token_file,
                    client_token_file,
                    admin_token_file,
                    rdma_token_file,
                    insecure,
                    etcd,
                    etcd_user,
                    etcd_password_file,
                    etcd_ca_file,
                    etcd_cert_file,
                    etcd_key_file,
                    cluster_id,
                    election_ttl,
                    max_connections,
                    max_connections_per_peer,
                    max_inflight_bytes
                ]
            );
        }
        let d = MasterConfig::default();
        let cfg = MasterConfig {
            listen: self.listen.unwrap_or(d.listen),
            admin_addr: self.admin_addr.unwrap_or(d.admin_addr),
            advertise: self.advertise,
            state_dir: self.state_dir,
            etcd: self.etcd.as_deref().map(etcd_endpoints).unwrap_or_default(),
            etcd_access: strata_common::leader::EtcdAccess::from_parts(
                self.etcd_user,
                self.etcd_password_file.as_deref(),
                self.etcd_ca_file.as_deref(),
                self.etcd_cert_file.as_deref(),
                self.etcd_key_file.as_deref(),
            )?,
            cluster_id: self.cluster_id.unwrap_or(d.cluster_id.clone()),
            election_ttl: self.election_ttl.map_or(d.election_ttl, |v| v.0),
            max_connections: self.max_connections.unwrap_or(d.max_connections),
            max_connections_per_peer: self
                .max_connections_per_peer
                .unwrap_or(d.max_connections_per_peer),
            max_inflight_bytes: self
                .max_inflight_bytes
                .map_or(d.max_inflight_bytes, |v| v.0),
            keepalive_interval: d.keepalive_interval,
            keepalive_timeout: d.keepalive_timeout,
            max_node_log_bytes: d.max_node_log_bytes,
            lease_ttl: self.lease_ttl.map_or(d.lease_ttl, |v| v.0),
            max_lease: self.max_lease.map(|v| v.0),
            node_ttl: self.node_ttl.map_or(d.node_ttl, |v| v.0),
            put_timeout: self.put_timeout.map_or(d.put_timeout, |v| v.0),
            put_wait: self.put_wait.map_or(d.put_wait, |v| v.0),
            high_watermark: self.high_watermark.unwrap_or(d.high_watermark),
            eviction_ratio: self.eviction_ratio.unwrap_or(d.eviction_ratio),
            alloc_strategy: match self.alloc_strategy {
                Some(s) => s.parse().map_err(Error::invalid)?,
                None => d.alloc_strategy,
            },
            offload_policy: match self.offload_policy {
                Some(s) => s.parse().map_err(Error::invalid)?,
                None => d.offload_policy,
            },
            ssd_admission: match self.ssd_admission {
                Some(s) => s.parse().map_err(Error::invalid)?,
                None => d.ssd_admission,
            },
            integrity: match self.integrity {
                Some(s) => s.parse().map_err(Error::invalid)?,
                None => d.integrity,
            },
            offload_task_ttl: self.offload_task_ttl.map_or(d.offload_task_ttl, |v| v.0),
            promote_on_hit: self.promote_on_hit.unwrap_or(d.promote_on_hit),
            promote_queue: self.promote_queue.unwrap_or(d.promote_queue),
            credentials: Credentials {
                member: Secret::from_optional_file(
                    self.member_token_file.as_deref(),
                    "--member-token-file",
                )?,
                client: Secret::from_optional_file(
                    self.client_token_file.as_deref(),
                    "--client-token-file",
                )?,
                admin: Secret::from_optional_file(
                    self.admin_token_file.as_deref(),
                    "--admin-token-file",
                )?,
                rdma: Secret::from_optional_file(
                    self.rdma_token_file.as_deref(),
                    "--rdma-token-file",
                )?,
            },
            insecure: self.insecure.unwrap_or(false),
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn precedence_flag_over_file_over_default() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("m.toml");
        std::fs::write(&f, "lease-ttl = \"7s\"\nhigh-watermark = 0.8\n").unwrap();
        let args = MasterArgs::parse_from([
            "strata-master",
            "--config",
            f.to_str().unwrap(),
            "--high-watermark",
            "0.5",
        ]);
        let c = args.resolve().unwrap();
        assert_eq!(c.high_watermark, 0.5);
        assert_eq!(c.lease_ttl, Duration::from_secs(7));
        assert_eq!(c.node_ttl, Duration::from_secs(10));
    }

    #[test]
    fn bad_values_are_clear() {
        let e = MasterArgs::parse_from(["m", "--high-watermark", "1.5"])
            .resolve()
            .unwrap_err();
        assert!(e.message.contains("--high-watermark"), "{e}");
        // Both sides of the --put-wait bound.
        let ok = MasterArgs::parse_from(["m", "--put-wait", "20s"]).resolve();
        assert_eq!(ok.unwrap().put_wait, Duration::from_secs(20));
        let e = MasterArgs::parse_from(["m", "--put-wait", "21s"])
            .resolve()
            .unwrap_err();
        assert!(e.message.contains("--put-wait"), "{e}");
        let e = MasterArgs::parse_from(["m", "--offload-policy", "reads:0"])
            .resolve()
            .unwrap_err();
        assert!(e.message.contains("reads:N"), "{e}");
        assert_eq!(
            "reads:3".parse::<OffloadPolicy>(),
            Ok(OffloadPolicy::Reads(3))
        );
        assert_eq!(
            "reads:65535".parse::<OffloadPolicy>(),
            Ok(OffloadPolicy::Reads(65535))
        );
        let e = "reads:65536".parse::<OffloadPolicy>().unwrap_err();
        assert!(e.contains("1 to 65535"), "{e}");
        // --max-lease: both sides of its bound, its default, --integrity.
        let e = MasterArgs::parse_from(["m", "--lease-ttl", "5s", "--max-lease", "4s"])
            .resolve()
            .unwrap_err();
        assert!(e.message.contains("--max-lease"), "{e}");
        let ok = MasterArgs::parse_from(["m", "--lease-ttl", "5s", "--max-lease", "5s"]);
        assert_eq!(ok.resolve().unwrap().max_lease(), Duration::from_secs(5));
        let c = MasterArgs::parse_from(["m", "--lease-ttl", "10s"]).resolve();
        assert_eq!(c.unwrap().max_lease(), Duration::from_secs(120));
        assert_eq!(MasterConfig::default().max_lease(), Duration::from_secs(60));
        let c = MasterArgs::parse_from(["m", "--integrity", "blake3"]).resolve();
        assert_eq!(c.unwrap().integrity, Integrity::Blake3);
        let e = MasterArgs::parse_from(["m", "--integrity", "md5"])
            .resolve()
            .unwrap_err();
        assert!(e.message.contains("crc32c or blake3"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("m.toml");
        std::fs::write(&f, "no-such-key = 1\n").unwrap();
        let e = MasterArgs::parse_from(["m", "--config", f.to_str().unwrap()])
            .resolve()
            .unwrap_err();
        assert!(e.message.contains("no-such-key"), "{e}");
    }
}
