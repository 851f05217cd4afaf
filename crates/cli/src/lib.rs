//! The `strata` command line: run a local cluster, move objects, inspect the
//! cluster and benchmark it. Exit status: 0 success, 2 usage error, 1 any
//! other failure.

mod bench;
pub mod local;
mod objects;
mod up;

pub use local::{ClusterBuilder, LocalCluster};
// The client library's names, as the commands spell them.
use strata_client::{put_steps, Client, ClientConfig, Code, PutOptions, Tier, TransportKind};

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Debug, Parser)]
#[command(
    name = "strata",
    version,
    about = "Strata: a distributed, tiered KV-cache store for LLM inference"
)]
pub struct Cli {
    /// Master: HOST:PORT, a comma-separated list of masters, or etcd://HOST:PORT[,…]/CLUSTER (follows the leader)
    #[arg(
        long,
        env = "STRATA_MASTER",
        default_value = "127.0.0.1:7400",
        global = true
    )]
    pub master: String,
    /// File holding the client or admin token [default: the token `strata up` wrote, if any]
    #[arg(long, env = "STRATA_TOKEN_FILE", global = true)]
    pub token_file: Option<std::path::PathBuf>,
    /// How object bytes move: tcp, or ucx (one-sided to nodes serving UCX, with an rdma token; TCP to the rest). `strata up` and `strata bench --local` also serve it from their store nodes
    #[arg(long, env = "STRATA_TRANSPORT", default_value = "tcp", global = true)]
    pub transport: crate::TransportKind,
    #[command(flatten)]
    pub telemetry: strata_common::telemetry::TelemetryArgs,
    /// With --otlp-endpoint: the fraction of this command's operations that are traced (0 to 1) [default: 1]
    #[arg(long, env = "STRATA_TRACE_SAMPLE_RATIO", global = true)]
    pub trace_sample_ratio: Option<f64>,
    #[command(subcommand)]
    pub cmd: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a whole local cluster in the foreground until Ctrl-C
    Up(up::UpArgs),
    /// Store a file (or stdin) under KEY
    Put(objects::PutArgs),
    /// Write the object under KEY to a file (or stdout)
    Get(objects::GetArgs),
    /// Remove KEY, or every object with --all
    Rm(objects::RmArgs),
    /// List keys
    Ls(objects::LsArgs),
    /// Cluster summary, or one key's replicas
    Stat(objects::StatArgs),
    /// Load generator and baseline comparison
    Bench(bench::BenchArgs),
}

/// Where the master is and what the CLI presents to it.
pub struct Conn {
    pub master: String,
    pub token_file: Option<std::path::PathBuf>,
    pub transport: crate::TransportKind,
}

impl Conn {
    /// The client configuration: `--token-file` if given, else the token
    /// file a running `strata up` wrote (its rdma token for `--transport
    /// ucx`) when `--master` is the master it started, else none
    /// (protected mode).
    pub fn config(&self) -> anyhow::Result<crate::ClientConfig> {
        let rdma = self.transport == crate::TransportKind::Ucx;
        let path = self
            .token_file
            .clone()
            .or_else(|| strata_client::up_token::token_for(&self.master, rdma));
        let token =
            strata_common::auth::Secret::from_optional_file(path.as_deref(), "--token-file")?;
        Ok(crate::ClientConfig::new(self.master.clone())
            .with_token(token)
            .with_transport(self.transport))
    }
}

/// Entry point of the `strata` binary.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let default_level = match cli.cmd {
        Command::Up(_) => "info",
        _ => "warn",
    };
    let telemetry = match cli.telemetry.resolve_client(cli.trace_sample_ratio) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {}", e.message);
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Spans of `strata put`/`get` are reported as service "strata".
    let telemetry = match strata_common::telemetry::init(&telemetry, "strata", default_level) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {}", e.message);
            return ExitCode::FAILURE;
        }
    };
    let conn = Conn {
        master: cli.master,
        token_file: cli.token_file,
        transport: cli.transport,
    };
    let res = rt.block_on(async move {
        match cli.cmd {
            Command::Up(a) => up::run(a, conn.transport).await,
            Command::Put(a) => objects::put(&conn, a).await,
            Command::Get(a) => objects::get(&conn, a).await,
            Command::Rm(a) => objects::rm(&conn, a).await,
            Command::Ls(a) => objects::ls(&conn, a).await,
            Command::Stat(a) => objects::stat(&conn, a).await,
            Command::Bench(a) => bench::run(&conn, a).await,
        }
    });
    // Outside the runtime: the last spans are exported before the exit.
    telemetry.shutdown();
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
