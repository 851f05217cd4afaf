//! Helpers for tests that run the real binaries as processes.

use crate::bin;
use std::process::{Command, Stdio};
use std::time::Duration;

/// A loopback port for a child process (see `strata_common::ports`).
pub fn free_port() -> u16 {
    strata_common::ports::unused_loopback_port().expect("a free loopback port")
}

pub use strata_chaos::procs::{Proc, TokenFiles};

/// Fresh token files for every role in `dir`.
pub fn token_files(dir: &std::path::Path) -> TokenFiles {
    TokenFiles::generate(dir).expect("token files")
}

pub struct Master {
    pub proc: Proc,
    pub addr: String,
    pub admin: std::net::SocketAddr,
}

pub fn spawn(name: &str, args: &[String]) -> Proc {
    Proc(
        Command::new(bin(name))
            .args(args)
            .env(
                "RUST_LOG",
                std::env::var("STRATA_TEST_LOG").unwrap_or("warn".into()),
            )
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    )
}

pub async fn wait_ready(admin: std::net::SocketAddr) {
    for _ in 0..500 {
        if let Ok(r) = reqwest::get(format!("http://{admin}/ready")).await {
            if r.status().is_success() {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{admin} never became ready");
}

pub async fn start_master(extra: &[&str]) -> Master {
    let (p, a) = (free_port(), free_port());
    let mut args = vec![
        "--listen".to_string(),
        format!("127.0.0.1:{p}"),
        "--admin-addr".into(),
        format!("127.0.0.1:{a}"),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let proc = spawn("strata-master", &args);
    let admin = format!("127.0.0.1:{a}").parse().unwrap();
    wait_ready(admin).await;
    Master {
        proc,
        addr: format!("127.0.0.1:{p}"),
        admin,
    }
}

pub async fn start_node(master: &str, node_id: &str) -> (Proc, String) {
    start_node_with(master, node_id, &[]).await
}

/// Starts `strata-store-node` with extra flags, waits until it is ready.
pub async fn start_node_with(master: &str, node_id: &str, extra: &[&str]) -> (Proc, String) {
    let (p, data, _) = start_node_admin(master, node_id, extra).await;
    (p, data)
}

/// Like [`start_node_with`]; also returns the node's admin address.
pub async fn start_node_admin(
    master: &str,
    node_id: &str,
    extra: &[&str],
) -> (Proc, String, std::net::SocketAddr) {
    let (d, a) = (free_port(), free_port());
    let mut args: Vec<String> = [
        "--master",
        master,
        "--listen",
        &format!("127.0.0.1:{d}"),
        "--admin-addr",
        &format!("127.0.0.1:{a}"),
        "--node-id",
        node_id,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // 64 MiB unless the caller sizes it.
    if !extra.contains(&"--capacity") {
        args.extend(["--capacity".to_string(), "64MiB".to_string()]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    let p = spawn("strata-store-node", &args);
    let admin = format!("127.0.0.1:{a}").parse().unwrap();
    wait_ready(admin).await;
    (p, format!("127.0.0.1:{d}"), admin)
}

/// Starts `strata-ssd-agent`; with `wait`, until it answers /ready.
pub async fn start_agent(
    master: &str,
    handle: &str,
    dir: &std::path::Path,
    env: &[(&str, &str)],
    wait: bool,
) -> (Proc, std::net::SocketAddr) {
    let (d, a) = (free_port(), free_port());
    let admin: std::net::SocketAddr = format!("127.0.0.1:{a}").parse().unwrap();
    let mut cmd = Command::new(bin("strata-ssd-agent"));
    cmd.args([
        "--master",
        master,
        "--handle",
        handle,
        "--capacity",
        "256MiB",
    ])
    .arg("--data-dir")
    .arg(dir)
    .args([
        "--listen",
        &format!("127.0.0.1:{d}"),
        "--admin-addr",
        &admin.to_string(),
    ])
    .env("RUST_LOG", "warn")
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let p = Proc(cmd.spawn().unwrap());
    if wait {
        wait_ready(admin).await;
    }
    (p, admin)
}

/// A master on fixed ports with a `--state-dir`, started again where nodes
/// and clients look for it (restart tests).
pub struct RestartableMaster {
    pub args: Vec<String>,
    pub addr: String,
    pub admin: std::net::SocketAddr,
}

impl RestartableMaster {
    pub fn new(state: &std::path::Path, extra: &[&str]) -> Self {
        let mut flags = vec!["--state-dir", state.to_str().unwrap()];
        flags.extend(extra);
        Self::on_free_ports(&flags)
    }

    /// One of several HA masters of `cluster` electing through `etcd`
    /// (`http://HOST:PORT`); no `--state-dir`.
    pub fn ha(etcd: &str, cluster: &str, extra: &[&str]) -> Self {
        let mut flags = vec!["--etcd", etcd, "--cluster-id", cluster];
        flags.extend(extra);
        Self::on_free_ports(&flags)
    }

    fn on_free_ports(flags: &[&str]) -> Self {
        let (p, a) = (free_port(), free_port());
        let mut args: Vec<String> = vec![
            "--listen".into(),
            format!("127.0.0.1:{p}"),
            "--admin-addr".into(),
            format!("127.0.0.1:{a}"),
        ];
        args.extend(flags.iter().map(|s| s.to_string()));
        RestartableMaster {
            args,
            addr: format!("127.0.0.1:{p}"),
            admin: format!("127.0.0.1:{a}").parse().unwrap(),
        }
    }

    /// Starts it and waits until it is ready.
    pub async fn start(&self) -> Proc {
        let p = spawn("strata-master", &self.args);
        wait_ready(self.admin).await;
        p
    }

    /// Starts it and waits until it answers /health (a follower is never
    /// ready).
    pub async fn start_live(&self) -> Proc {
        let p = spawn("strata-master", &self.args);
        for _ in 0..500 {
            if let Ok(r) = reqwest::get(format!("http://{}/health", self.admin)).await {
                if r.status().is_success() {
                    return p;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("{} never answered /health", self.admin);
    }

    /// Whether it leads and serves (`/ready` 200). A paused process does
    /// not answer: bounded.
    pub async fn is_ready(&self) -> bool {
        let get = reqwest::get(format!("http://{}/ready", self.admin));
        tokio::time::timeout(Duration::from_millis(500), get)
            .await
            .is_ok_and(|r| r.is_ok_and(|r| r.status().is_success()))
    }

    /// Its `/api/v1/leader` answer (None if it does not answer in time).
    pub async fn leader_view(&self) -> Option<serde_json::Value> {
        let get = async {
            reqwest::get(format!("http://{}/api/v1/leader", self.admin))
                .await
                .ok()?
                .json()
                .await
                .ok()
        };
        tokio::time::timeout(Duration::from_millis(500), get)
            .await
            .ok()
            .flatten()
    }
}

/// The index of the master that leads and serves, waiting up to `within`.
pub async fn wait_leader(masters: &[&RestartableMaster], within: Duration) -> Option<usize> {
    let t0 = std::time::Instant::now();
    while t0.elapsed() < within {
        for (i, m) in masters.iter().enumerate() {
            if m.is_ready().await {
                return Some(i);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}
