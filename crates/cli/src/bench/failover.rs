//! `strata bench failover`: how long puts stop when the leader dies
//! (SIGKILL) or steps down (SIGTERM), against the election TTL, measured in
//! the same run on real `strata-master` processes electing through a real
//! etcd (a private one from `PATH` unless `--etcd` names one). A client puts
//! 64 KiB objects without pause; the figure is the longest gap between its
//! acknowledged puts from the signal on (retries included, as an engine
//! would see it).

use crate::{Client, ClientConfig, PutOptions};
use parking_lot::Mutex;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_common::units::HumanDuration;
use strata_proto::master_client::MasterClient;
use tokio_util::sync::CancellationToken;

#[derive(Debug, clap::Args)]
pub struct FailoverArgs {
    /// etcd endpoint (http://HOST:PORT); default: start a private etcd
    #[arg(long)]
    pub etcd: Option<String>,
    /// The masters' --election-ttl
    #[arg(long, default_value = "3s")]
    pub election_ttl: HumanDuration,
    /// Kills and graceful stops to measure (each)
    #[arg(long, default_value_t = 3)]
    pub rounds: u32,
}

struct Masters {
    bin: std::path::PathBuf,
    args: Vec<Vec<String>>,
    addrs: Vec<String>,
    procs: Vec<Option<Child>>,
}

impl Drop for Masters {
    fn drop(&mut self) {
        for c in self.procs.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(strata_common::ports::unused_loopback_port()?)
}

impl Masters {
    fn spawn(&mut self, i: usize) -> anyhow::Result<()> {
        let child = Command::new(&self.bin)
            .args(&self.args[i])
            .env("RUST_LOG", "error")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        self.procs[i] = Some(child);
        Ok(())
    }

    /// The master that serves (a stat call to it alone succeeds).
    async fn leader(&self, within: Duration) -> anyhow::Result<usize> {
        let t0 = Instant::now();
        while t0.elapsed() < within {
            for (i, a) in self.addrs.iter().enumerate() {
                if self.procs[i].is_none() {
                    continue;
                }
                // A fresh channel: the call goes to this address only.
                let mut c = MasterClient::new(strata_common::grpc::master_channel(a, None)?);
                let call = c.stat(strata_proto::StatRequest {});
                if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_millis(500), call).await {
                    return Ok(i);
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        anyhow::bail!("no master led within {within:?}")
    }

    fn signal(&mut self, i: usize, sig: i32) -> anyhow::Result<Child> {
        let child = self.procs[i].take().context("not running")?;
        // SAFETY: kill(2) on a child we spawned and have not reaped.
        let rc = unsafe { libc::kill(child.id() as i32, sig) };
        anyhow::ensure!(rc == 0, "kill failed");
        Ok(child)
    }
}

use anyhow::Context;

pub async fn run(args: FailoverArgs) -> anyhow::Result<()> {
    let ttl = args.election_ttl.0;
    anyhow::ensure!(args.rounds >= 1, "--rounds must be at least 1");
    let _own_etcd;
    let etcd = match &args.etcd {
        Some(e) => e.clone(),
        None => {
            let s = strata_common::testing::EtcdServer::start().await;
            let e = s.endpoint.clone();
            _own_etcd = s;
            e
        }
    };
    let bin = std::env::current_exe()?
        .parent()
        .context("no directory for the strata binary")?
        .join("strata-master");
    anyhow::ensure!(
        bin.exists(),
        "{} is missing: build strata-master next to strata",
        bin.display()
    );
    let cluster = format!("bench-{}", std::process::id());
    let mut m = Masters {
        bin,
        args: Vec::new(),
        addrs: Vec::new(),
        procs: Vec::new(),
    };
    for _ in 0..3 {
        let (p, a) = (free_port()?, free_port()?);
        m.addrs.push(format!("127.0.0.1:{p}"));
        m.args.push(
            [
                "--listen",
                &format!("127.0.0.1:{p}"),
                "--admin-addr",
                &format!("127.0.0.1:{a}"),
                "--etcd",
                &etcd,
                "--cluster-id",
                &cluster,
                "--election-ttl",
                &format!("{}ms", ttl.as_millis()),
                "--node-ttl",
                "2s",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        );
        m.procs.push(None);
    }
    for i in 0..3 {
        m.spawn(i)?;
    }
    m.leader(Duration::from_secs(30)).await?;
    let list = m.addrs.join(",");
    let node_stop = CancellationToken::new();
    let node = strata_store_node::start(
        strata_store_node::StoreNodeConfig::local(&list, 256 << 20),
        node_stop.clone(),
    )
    .await?;
    let cl = Client::connect(ClientConfig::new(list.clone())).await?;
    // The load: puts back to back, each success stamped.
    let acked: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let stop = CancellationToken::new();
    let load = {
        let (cl, acked, stop) = (cl.clone(), acked.clone(), stop.clone());
        tokio::spawn(async move {
            let data = vec![7u8; 64 << 10];
            let mut errors = Vec::new();
            for i in 0u64.. {
                if stop.is_cancelled() {
                    break;
                }
                match cl
                    .put(&format!("failover/{i}"), &data, &PutOptions::default())
                    .await
                {
                    Ok(()) => acked.lock().push(Instant::now()),
                    Err(e) => errors.push(e.to_string()),
                }
                // Keep DRAM bounded: old keys go.
                if i >= 1000 {
                    let _ = cl.remove(&format!("failover/{}", i - 1000), false).await;
                }
            }
            errors
        })
    };
    let first_after = |t: Instant| acked.lock().iter().copied().find(|&a| a > t);
    let mut results: Vec<(&str, Vec<Duration>)> = vec![("SIGKILL", vec![]), ("SIGTERM", vec![])];
    let bar = indicatif::ProgressBar::new(u64::from(args.rounds) * 2);
    for round in 0..args.rounds * 2 {
        let (name, sig) = if round % 2 == 0 {
            ("SIGKILL", libc::SIGKILL)
        } else {
            ("SIGTERM", libc::SIGTERM)
        };
        let leader = m.leader(Duration::from_secs(30)).await?;
        // Running load before the signal.
        let t = Instant::now();
        while first_after(t).is_none() {
            anyhow::ensure!(
                t.elapsed() < Duration::from_secs(30),
                "no puts before the signal"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let t_sig = Instant::now();
        let mut child = m.signal(leader, sig)?;
        // Until another master serves and the load has gone on a while.
        let next = m.leader(Duration::from_secs(60)).await?;
        anyhow::ensure!(next != leader, "the signalled master still leads");
        let t_next = Instant::now();
        while acked.lock().iter().filter(|&&a| a > t_next).count() < 20 {
            anyhow::ensure!(
                t_next.elapsed() < Duration::from_secs(60),
                "puts did not resume within 60s of the {name}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // The pause: the longest gap between acknowledged puts from the
        // signal on (a put in flight may still finish on a leader that
        // drains gracefully).
        let pause = {
            let a = acked.lock();
            let mut prev = t_sig;
            let mut worst = Duration::ZERO;
            for &t in a.iter().filter(|&&t| t > t_sig) {
                worst = worst.max(t - prev);
                prev = t;
            }
            worst
        };
        results
            .iter_mut()
            .find(|(n, _)| *n == name)
            .expect("known")
            .1
            .push(pause);
        let _ = tokio::task::spawn_blocking(move || child.wait()).await;
        m.spawn(leader)?;
        bar.inc(1);
    }
    bar.finish_and_clear();
    stop.cancel();
    let errors = load.await?;
    node_stop.cancel();
    node.wait().await;
    println!("election TTL {ttl:?}; 3 masters, one store node, one client putting 64 KiB objects back to back");
    println!(
        "{:<10} {:>7} {:>12} {:>12} {:>12}",
        "leader", "rounds", "p50 ms", "max ms", "max / TTL"
    );
    for (name, mut v) in results {
        v.sort();
        let p50 = v[v.len() / 2].as_secs_f64() * 1e3;
        let max = v.last().map_or(0.0, |d| d.as_secs_f64() * 1e3);
        println!(
            "{:<10} {:>7} {:>12.0} {:>12.0} {:>12.2}",
            name,
            v.len(),
            p50,
            max,
            max / 1e3 / ttl.as_secs_f64()
        );
    }
    println!(
        "pause: the longest gap between acknowledged puts from the signal on (retries included); puts that failed for good: {}",
        errors.len()
    );
    for e in errors.iter().take(5) {
        println!("  {e}");
    }
    Ok(())
}
