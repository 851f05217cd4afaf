//! SSD agent settings and their flag/env/config-file layer.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use strata_common::auth::Secret;
use strata_common::units::{ByteSize, HumanDuration};
use strata_common::{Error, Result};
pub use strata_transport::TransportKind;

#[derive(Debug, Clone)]
pub struct SsdAgentConfig {
    pub master: String,
    /// Stable identity of this SSD owner (same handle after restart = same owner).
    pub handle: String,
    /// May be shared with other agents (other handles).
    pub data_dir: PathBuf,
    /// Bytes of bucket files this owner may keep.
    pub capacity: u64,
    /// Data-plane address serving reads of this owner's buckets.
    pub listen: SocketAddr,
    pub advertise: Option<String>,
    pub admin_addr: SocketAddr,
    /// Bytes of concurrent SSD reads this process stages in memory.
    pub staging_bytes: u64,
    /// How long a read waits for staging space before failing.
    pub staging_wait: Duration,
    /// A bucket closes at this many objects…
    pub bucket_keys: usize,
    /// …or this many bytes (a larger object gets a bucket of its own).
    pub bucket_bytes: u64,
    /// Offload tasks taken per cycle.
    pub max_tasks: u32,
    /// Pause between offload cycles when there is no work.
    pub poll_interval: Duration,
    /// Above this share of `capacity`, buckets are evicted (oldest first; read
    /// objects are kept)...
    pub high_watermark: f64,
    /// ...until usage is back at this share.
    pub low_watermark: f64,
    /// A bucket whose live bytes (not removed) fall below this share is
    /// dropped at the next eviction pass.
    pub sparse_below: f64,
    /// The member token presented to the master.
    pub token: Option<Secret>,
    /// A data-plane reader that takes no bytes for this long is cut off,
    /// releasing its staging and its bucket's reader count.
    pub io_timeout: Duration,
    /// `ucx`: reads are also lent one-sided to rdma readers, from a UCX
    /// window of --staging-bytes beside the arena.
    pub transport: TransportKind,
}

impl Default for SsdAgentConfig {
    fn default() -> Self {
        SsdAgentConfig {
            master: "127.0.0.1:7400".into(),
            handle: String::new(),
            data_dir: PathBuf::from("/var/lib/strata/ssd"),
            capacity: 64 << 30,
            listen: ([127, 0, 0, 1], 7600).into(),
            advertise: None,
            admin_addr: ([127, 0, 0, 1], 7601).into(),
            staging_bytes: 256 << 20,
            staging_wait: Duration::from_secs(5),
            bucket_keys: 500,
            bucket_bytes: 256 << 20,
            max_tasks: 1024,
            poll_interval: Duration::from_millis(200),
            high_watermark: 0.95,
            low_watermark: 0.85,
            sparse_below: 0.25,
            token: None,
            io_timeout: Duration::from_secs(30),
            transport: TransportKind::Tcp,
        }
    }
}

impl SsdAgentConfig {
    /// Loopback, ephemeral ports: for tests and `strata up`.
    pub fn local(master: &str, handle: &str, data_dir: PathBuf, capacity: u64) -> Self {
        SsdAgentConfig {
            master: master.to_string(),
            handle: handle.to_string(),
            data_dir,
            capacity,
            listen: ([127, 0, 0, 1], 0).into(),
            admin_addr: ([127, 0, 0, 1], 0).into(),
            poll_interval: Duration::from_millis(50),
            ..Default::default()
        }
    }

    pub fn validate(&self) -> Result<()> {
        strata_common::auth::check_advertise("--listen", self.listen, self.advertise.as_deref())?;
        if self.handle.is_empty() {
            return Err(Error::invalid(
                "--handle is required: a stable name for this SSD owner, e.g. node-7/nvme0",
            ));
        }
        let ok = self.handle.len() <= 256
            && self
                .handle
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._:/-".contains(c));
        if !ok {
            return Err(Error::invalid(format!(
                "--handle {:?} may only use A-Z a-z 0-9 . _ : / - (at most 256)",
                self.handle
            )));
        }
        if self.capacity < 1 << 20 {
            return Err(Error::invalid("--capacity must be at least 1MiB"));
        }
        if self.bucket_keys == 0 || self.bucket_keys > 1_000_000 {
            return Err(Error::invalid(
                "--bucket-keys must be between 1 and 1000000",
            ));
        }
        if self.bucket_bytes < 4096 {
            return Err(Error::invalid("--bucket-bytes must be at least 4KiB"));
        }
        let share = |v: f64| (0.0..=1.0).contains(&v);
        if !share(self.high_watermark)
            || !share(self.low_watermark)
            || self.low_watermark > self.high_watermark
        {
            return Err(Error::invalid(
                "--low-watermark and --high-watermark must be shares in [0, 1] with low <= high",
            ));
        }
        if !share(self.sparse_below) {
            return Err(Error::invalid("--sparse-below must be a share in [0, 1]"));
        }
        if self.staging_bytes < 4096 {
            return Err(Error::invalid("--staging-bytes must be at least 4KiB"));
        }
        if self.transport == TransportKind::Ucx && !cfg!(feature = "ucx") {
            return Err(Error::invalid(
                "--transport ucx needs a build with UCX (cargo feature `ucx`, which needs \
                 libucx-dev); this one serves --transport tcp only",
            ));
        }
        if self.io_timeout < Duration::from_millis(10) {
            return Err(Error::invalid("--io-timeout must be at least 10ms"));
        }
        Ok(())
    }
}

#[derive(Debug, Default, clap::Parser, serde::Deserialize)]
#[command(
    name = "strata-ssd-agent",
    version,
    about = "Strata SSD tier agent: one owner's buckets on local disk"
)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct SsdAgentArgs {
    /// TOML file with any of these settings (kebab-case keys)
    #[arg(long, env = "STRATA_CONFIG")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Master: HOST:PORT, a comma-separated list of masters, or etcd://HOST:PORT[,…]/CLUSTER (follows the leader) [default: 127.0.0.1:7400]
    #[arg(long, env = "STRATA_MASTER")]
    pub master: Option<String>,
    /// Stable identity of this SSD owner, e.g. node-7/nvme0 (required)
    #[arg(long, env = "STRATA_HANDLE")]
    pub handle: Option<String>,
    /// Directory for bucket files and the index; may be shared by agents [default: /var/lib/strata/ssd]
    #[arg(long, env = "STRATA_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Bytes of buckets this owner may keep [default: 64GiB]
    #[arg(long, env = "STRATA_CAPACITY")]
    pub capacity: Option<ByteSize>,
    /// Data-plane listen address (SSD reads) [default: 127.0.0.1:7600]
    #[arg(long, env = "STRATA_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Data-plane address clients dial [default: the bound listen address]
    #[arg(long, env = "STRATA_ADVERTISE")]
    pub advertise: Option<String>,
    /// Admin HTTP address [default: 127.0.0.1:7601]
    #[arg(long, env = "STRATA_ADMIN_ADDR")]
    pub admin_addr: Option<SocketAddr>,
    /// Read staging memory of THIS process, shared by all its readers [default: 256MiB]
    #[arg(long, env = "STRATA_STAGING_BYTES")]
    pub staging_bytes: Option<ByteSize>,
    /// How long a read waits for staging space [default: 5s]
    #[arg(long, env = "STRATA_STAGING_WAIT")]
    pub staging_wait: Option<HumanDuration>,
    /// Objects per bucket [default: 500]
    #[arg(long, env = "STRATA_BUCKET_KEYS")]
    pub bucket_keys: Option<usize>,
    /// Bytes per bucket; larger objects get their own [default: 256MiB]
    #[arg(long, env = "STRATA_BUCKET_BYTES")]
    pub bucket_bytes: Option<ByteSize>,
    /// Offload tasks taken per cycle [default: 1024]
    #[arg(long, env = "STRATA_MAX_TASKS")]
    pub max_tasks: Option<u32>,
    /// Evict buckets above this share of --capacity [default: 0.95]
    #[arg(long, env = "STRATA_HIGH_WATERMARK")]
    pub high_watermark: Option<f64>,
    /// ...down to this share [default: 0.85]
    #[arg(long, env = "STRATA_LOW_WATERMARK")]
    pub low_watermark: Option<f64>,
    /// Drop a bucket once less than this share of its bytes is live [default: 0.25]
    #[arg(long, env = "STRATA_SPARSE_BELOW")]
    pub sparse_below: Option<f64>,
    /// File holding the member token (the master's --member-token-file secret)
    #[arg(long, env = "STRATA_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Cut off a data-plane reader that takes no bytes for this long [default: 30s]
    #[arg(long, env = "STRATA_IO_TIMEOUT")]
    pub io_timeout: Option<HumanDuration>,
    /// Data-plane transport: tcp, or ucx (TCP plus reads lent one-sided to rdma clients from a UCX window of --staging-bytes; builds with the `ucx` feature) [default: tcp]
    #[arg(long, env = "STRATA_TRANSPORT")]
    pub transport: Option<String>,
    #[command(flatten)]
    #[serde(skip)]
    pub telemetry: strata_common::telemetry::TelemetryArgs,
    /// Validate the flags, environment, config file and token files, then exit (0 valid, 2 not) without starting
    #[arg(long)]
    #[serde(skip)]
    pub check_config: bool,
}

impl SsdAgentArgs {
    pub fn resolve(mut self) -> Result<SsdAgentConfig> {
        if let Some(path) = self.config.clone() {
            let mut file: SsdAgentArgs = strata_common::config::load_toml(&path)?;
            strata_common::merge_opts!(
                self,
                file,
                [
                    master,
                    handle,
                    data_dir,
                    capacity,
                    listen,
                    advertise,
                    admin_addr,
                    staging_bytes,
                    staging_wait,
                    bucket_keys,
                    bucket_bytes,
                    max_tasks,
                    high_watermark,
                    low_watermark,
                    sparse_below,
                    token_file,
                    io_timeout,
                    transport
                ]
            );
        }
        let d = SsdAgentConfig::default();
        let cfg = SsdAgentConfig {
            master: self.master.unwrap_or(d.master),
            handle: self.handle.unwrap_or_default(),
            data_dir: self.data_dir.unwrap_or(d.data_dir),
            capacity: self.capacity.map_or(d.capacity, |v| v.0),
            listen: self.listen.unwrap_or(d.listen),
            advertise: self.advertise,
            admin_addr: self.admin_addr.unwrap_or(d.admin_addr),
            staging_bytes: self.staging_bytes.map_or(d.staging_bytes, |v| v.0),
            staging_wait: self.staging_wait.map_or(d.staging_wait, |v| v.0),
            bucket_keys: self.bucket_keys.unwrap_or(d.bucket_keys),
            bucket_bytes: self.bucket_bytes.map_or(d.bucket_bytes, |v| v.0),
            max_tasks: self.max_tasks.unwrap_or(d.max_tasks),
            poll_interval: d.poll_interval,
            high_watermark: self.high_watermark.unwrap_or(d.high_watermark),
            low_watermark: self.low_watermark.unwrap_or(d.low_watermark),
            sparse_below: self.sparse_below.unwrap_or(d.sparse_below),
            token: Secret::from_optional_file(self.token_file.as_deref(), "--token-file")?,
            io_timeout: self.io_timeout.map_or(d.io_timeout, |v| v.0),
            transport: match self.transport {
                Some(t) => t.parse().map_err(Error::invalid)?,
                None => d.transport,
            },
        };
        cfg.validate()?;
        Ok(cfg)
    }
}
