//! Store-node settings and their flag/env/config-file layer.

use std::net::SocketAddr;
use std::path::PathBuf;
use strata_common::auth::Secret;
use strata_common::units::ByteSize;
use strata_common::{Error, Result};

pub use strata_transport::TransportKind;

#[derive(Debug, Clone)]
pub struct StoreNodeConfig {
    /// Master gRPC address (HOST:PORT).
    pub master: String,
    /// Data-plane listen address.
    pub listen: SocketAddr,
    /// What clients dial for the data plane; defaults to the bound address.
    pub advertise: Option<String>,
    pub admin_addr: SocketAddr,
    /// DRAM contributed, split into segments of at most `segment_size`.
    pub capacity: u64,
    pub segment_size: u64,
    /// Stable name of this node; defaults to the advertised address.
    pub node_id: Option<String>,
    pub transport: TransportKind,
    /// Touch all segment memory at start (resident, no faults on the data path).
    pub prefault: bool,
    /// Segments from the kernel's reserved 2 MiB huge pages.
    pub huge_pages: bool,
    /// The member token presented to the master.
    pub token: Option<Secret>,
    /// A data-plane peer whose payload or response does not move within
    /// this time is cut off.
    pub io_timeout: std::time::Duration,
    /// Heartbeat over the master's quick call protocol where it serves it
    /// (library only; on by default, no flag).
    pub quick_heartbeats: bool,
    /// At shutdown, tell the master this node leaves, so it drops the
    /// node's segments at once instead of after --node-ttl (library only:
    /// embedded segments, which leave with their process, set it).
    pub leave_on_shutdown: bool,
}

impl Default for StoreNodeConfig {
    fn default() -> Self {
        StoreNodeConfig {
            master: "127.0.0.1:7400".into(),
            listen: ([127, 0, 0, 1], 7500).into(),
            advertise: None,
            admin_addr: ([127, 0, 0, 1], 7501).into(),
            capacity: 1 << 30,
            segment_size: 16 << 30,
            node_id: None,
            transport: TransportKind::Tcp,
            prefault: true,
            huge_pages: false,
            token: None,
            io_timeout: std::time::Duration::from_secs(30),
            quick_heartbeats: true,
            leave_on_shutdown: false,
        }
    }
}

impl StoreNodeConfig {
    /// Loopback, ephemeral ports: for tests and `strata up`.
    pub fn local(master: &str, capacity: u64) -> Self {
        StoreNodeConfig {
            master: master.to_string(),
            listen: ([127, 0, 0, 1], 0).into(),
            admin_addr: ([127, 0, 0, 1], 0).into(),
            capacity,
            prefault: false,
            ..Default::default()
        }
    }

    pub fn validate(&self) -> Result<()> {
        if self.io_timeout < std::time::Duration::from_millis(10) {
            return Err(Error::invalid("--io-timeout must be at least 10ms"));
        }
        if self.capacity < 4096 {
            return Err(Error::invalid(format!(
                "--capacity must be at least 4KiB, got {} bytes",
                self.capacity
            )));
        }
        if self.segment_size < 4096 {
            return Err(Error::invalid("--segment-size must be at least 4KiB"));
        }
        if self.capacity / self.segment_size > 1024 {
            return Err(Error::invalid(
                "--capacity / --segment-size gives more than 1024 segments; raise --segment-size",
            ));
        }
        let huge = strata_transport::region::HUGE_PAGE as u64;
        if self.huge_pages
            && (!self.capacity.is_multiple_of(huge) || !self.segment_size.is_multiple_of(huge))
        {
            return Err(Error::invalid(
                "with --huge-pages, --capacity and --segment-size must be multiples of 2MiB",
            ));
        }
        if self.transport == TransportKind::Ucx && !cfg!(feature = "ucx") {
            return Err(Error::invalid(
                "--transport ucx needs a build with UCX (cargo feature `ucx`, which needs \
                 libucx-dev); this one serves --transport tcp only",
            ));
        }
        strata_common::auth::check_advertise("--listen", self.listen, self.advertise.as_deref())?;
        if self.master.trim().is_empty() {
            return Err(Error::invalid(
                "--master is required (HOST:PORT of strata-master)",
            ));
        }
        Ok(())
    }

    /// Segment sizes that add up to the capacity.
    pub fn segment_sizes(&self) -> Vec<u64> {
        let mut left = self.capacity;
        let mut out = Vec::new();
        while left > 0 {
            let s = left.min(self.segment_size);
            out.push(s);
            left -= s;
        }
        out
    }
}

#[derive(Debug, Default, clap::Parser, serde::Deserialize)]
#[command(
    name = "strata-store-node",
    version,
    about = "Strata store node: DRAM segments and the data plane"
)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct StoreNodeArgs {
    /// TOML file with any of these settings (kebab-case keys)
    #[arg(long, env = "STRATA_CONFIG")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Master: HOST:PORT, a comma-separated list of masters, or etcd://HOST:PORT[,…]/CLUSTER (follows the leader) [default: 127.0.0.1:7400]
    #[arg(long, env = "STRATA_MASTER")]
    pub master: Option<String>,
    /// Data-plane listen address [default: 127.0.0.1:7500]
    #[arg(long, env = "STRATA_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Data-plane address clients dial [default: the bound listen address]
    #[arg(long, env = "STRATA_ADVERTISE")]
    pub advertise: Option<String>,
    /// Admin HTTP address [default: 127.0.0.1:7501]
    #[arg(long, env = "STRATA_ADMIN_ADDR")]
    pub admin_addr: Option<SocketAddr>,
    /// DRAM this node contributes, e.g. 16GiB [default: 1GiB]
    #[arg(long, env = "STRATA_CAPACITY")]
    pub capacity: Option<ByteSize>,
    /// Largest single segment [default: 16GiB]
    #[arg(long, env = "STRATA_SEGMENT_SIZE")]
    pub segment_size: Option<ByteSize>,
    /// Stable node name [default: the advertised address]
    #[arg(long, env = "STRATA_NODE_ID")]
    pub node_id: Option<String>,
    /// Data-plane transport: tcp, or ucx (TCP plus one-sided UCX for rdma clients; builds with the `ucx` feature) [default: tcp]
    #[arg(long, env = "STRATA_TRANSPORT")]
    pub transport: Option<String>,
    /// Make all of --capacity resident at start: true | false [default: true]
    #[arg(long, env = "STRATA_PREFAULT")]
    pub prefault: Option<bool>,
    /// Back the pool with reserved 2MiB huge pages (sysctl vm.nr_hugepages; Kubernetes: hugepages-2Mi): true | false [default: false]
    #[arg(long, env = "STRATA_HUGE_PAGES")]
    pub huge_pages: Option<bool>,
    /// File holding the member token (the master's --member-token-file secret)
    #[arg(long, env = "STRATA_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Cut off a data-plane peer whose payload or response does not move for this long [default: 30s]
    #[arg(long, env = "STRATA_IO_TIMEOUT")]
    pub io_timeout: Option<strata_common::units::HumanDuration>,
    #[command(flatten)]
    #[serde(skip)]
    pub telemetry: strata_common::telemetry::TelemetryArgs,
    /// Validate the flags, environment, config file and token files, then exit (0 valid, 2 not) without starting
    #[arg(long)]
    #[serde(skip)]
    pub check_config: bool,
}

impl StoreNodeArgs {
    pub fn resolve(mut self) -> Result<StoreNodeConfig> {
        if let Some(path) = self.config.clone() {
            let mut file: StoreNodeArgs = strata_common::config::load_toml(&path)?;
            strata_common::merge_opts!(
                self,
                file,
                [
                    master,
                    listen,
                    advertise,
                    admin_addr,
                    capacity,
                    segment_size,
                    node_id,
                    transport,
                    prefault,
                    huge_pages,
                    token_file,
                    io_timeout
                ]
            );
        }
        let d = StoreNodeConfig::default();
        let cfg = StoreNodeConfig {
            master: self.master.unwrap_or(d.master),
            listen: self.listen.unwrap_or(d.listen),
            advertise: self.advertise,
            admin_addr: self.admin_addr.unwrap_or(d.admin_addr),
            capacity: self.capacity.map_or(d.capacity, |c| c.0),
            segment_size: self.segment_size.map_or(d.segment_size, |c| c.0),
            node_id: self.node_id,
            transport: match self.transport {
                Some(t) => t.parse().map_err(Error::invalid)?,
                None => d.transport,
            },
            prefault: self.prefault.unwrap_or(d.prefault),
            huge_pages: self.huge_pages.unwrap_or(d.huge_pages),
            token: Secret::from_optional_file(self.token_file.as_deref(), "--token-file")?,
            io_timeout: self.io_timeout.map_or(d.io_timeout, |v| v.0),
            quick_heartbeats: d.quick_heartbeats,
            leave_on_shutdown: d.leave_on_shutdown,
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(t: TransportKind) -> StoreNodeConfig {
        StoreNodeConfig {
            transport: t,
            ..StoreNodeConfig::local("127.0.0.1:7400", 1 << 20)
        }
    }

    #[test]
    fn transports() {
        assert!(with(TransportKind::Tcp).validate().is_ok());
        assert_eq!("ucx".parse::<TransportKind>(), Ok(TransportKind::Ucx));
        assert!("rdma".parse::<TransportKind>().is_err());
        // UCX is served by builds with the `ucx` feature only, and refused
        // with a clear message by the others.
        let ucx = with(TransportKind::Ucx).validate();
        if cfg!(feature = "ucx") {
            assert!(ucx.is_ok(), "{ucx:?}");
        } else {
            let e = ucx.unwrap_err();
            assert!(e.message.contains("cargo feature `ucx`"), "{e}");
        }
    }
}
