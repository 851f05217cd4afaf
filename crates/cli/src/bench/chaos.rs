//! `strata bench chaos`: the nemesis (`strata_chaos::nemesis`) for as long
//! as asked — every service on a host of its own (network namespaces; root
//! needed), clients putting, overwriting, reading and removing while store
//! nodes are partitioned, paused, killed and slowed and the leader is
//! killed, paused and cut from etcd — then a summary of the operations
//! checked, the faults injected by kind with the availability around each,
//! and the anomalies found (the target is none; any makes the command fail).

use indicatif::{ProgressBar, ProgressStyle};
use std::sync::Arc;
use std::time::Duration;
use strata_chaos::nemesis::{self, Config, Progress};

#[derive(Debug, clap::Args)]
pub struct ChaosArgs {
    /// How long the clients and the nemesis run
    #[arg(long, default_value_t = 2.0)]
    pub minutes: f64,
    /// Seed of every random choice (printed; reuse it to replay a run's
    /// choices); default: a random one
    #[arg(long)]
    pub seed: Option<u64>,
    /// Concurrent clients
    #[arg(long, default_value_t = 3)]
    pub clients: usize,
    /// One master instead of two electing through etcd (no leader faults;
    /// no etcd needed)
    #[arg(long)]
    pub single_master: bool,
    /// Keep the run's history here (one JSON line per call); a run with
    /// anomalies keeps it in the temporary directory anyway
    #[arg(long)]
    pub history: Option<std::path::PathBuf>,
    /// Directory for the services' logs (default: a temporary one, named
    /// in the summary)
    #[arg(long)]
    pub logs: Option<std::path::PathBuf>,
    /// Print the report as JSON instead of a summary
    #[arg(long)]
    pub json: bool,
}

pub async fn run(a: ChaosArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        a.minutes.is_finite() && (0.25..=24.0 * 60.0).contains(&a.minutes),
        "--minutes must be between 0.25 and 1440, not {}",
        a.minutes
    );
    anyhow::ensure!((1..=32).contains(&a.clients), "--clients must be 1..=32");
    let duration = Duration::from_secs_f64(a.minutes * 60.0);
    let seed = a.seed.unwrap_or_else(rand::random);
    let logs = match a.logs {
        Some(d) => d,
        None => tempfile::Builder::new()
            .prefix("strata-chaos-logs-")
            .tempdir()?
            .keep(),
    };
    eprintln!(
        "chaos: {:.1} min, seed {seed}, {} clients, {}; service logs in {}",
        a.minutes,
        a.clients,
        if a.single_master {
            "one master"
        } else {
            "two masters on etcd"
        },
        logs.display()
    );
    let bar = ProgressBar::new(duration.as_secs());
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} s {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let b = bar.clone();
    let mut cfg = Config::new(duration, seed);
    cfg.clients = a.clients;
    cfg.ha = !a.single_master;
    cfg.history = a.history;
    cfg.logs = Some(logs);
    cfg.progress = Some(Arc::new(move |p: &Progress| {
        b.set_position(p.elapsed.as_secs().min(b.length().unwrap_or(0)));
        b.set_message(format!(
            "{} ops, {} faults, {} anomalies",
            p.ops, p.faults, p.anomalies
        ));
    }));
    // The run blocks (it drives runtimes of its own, in the fleet's hosts):
    // on a thread of its own, not on this runtime's workers.
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("nemesis".into())
        .spawn(move || {
            let _ = tx.send(nemesis::run(cfg));
        })?;
    let report = rx.await??;
    bar.finish_and_clear();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("{report}");
    }
    anyhow::ensure!(
        report.anomalies.is_empty(),
        "the checker found {} anomalies (seed {seed})",
        report.anomalies.len()
    );
    Ok(())
}
