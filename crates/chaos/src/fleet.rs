//! A fleet of simulated hosts on one machine (issue #33): each host is a
//! network namespace with its own address, joined to the others through a
//! bridge that lives in a namespace of its own, so nothing is added to the
//! machine's own network and deleting the namespaces removes every link.
//! Services run inside a host (`Fleet::spawn` enters its namespace before
//! exec); the test's own clients run on a tokio runtime whose threads live
//! in a host (`Fleet::runtime`), since sockets belong to the namespace of
//! the thread that made them.
//!
//! Faults: `partition` and `drop_from` (packets dropped where they arrive,
//! by a policy rule: the sender hears nothing, as across a real partition),
//! `isolate` (the host's port on the bridge down), `heal`; processes are
//! stopped and killed with signals (`procs::Proc`); `proxy::Proxy` delays
//! and paces a link.
//!
//! Needs root and iproute2 (`ip`); without them `Fleet::new` fails with a
//! message that says so (a test never skips silently). Namespace names carry
//! the creating process's pid, and a new fleet first deletes those of
//! processes that are gone, so a killed test leaves nothing behind for long.

use crate::procs::{bin_dir, Proc, TokenFiles};
use anyhow::Context;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// Every fleet's hosts are 10.77.0.1, 10.77.0.2, …: each fleet has its own
/// bridge, so fleets of concurrent tests never see each other.
const SUBNET: [u8; 3] = [10, 77, 0];
const PREFIX: &str = "stf";
/// At most this many hosts (addresses .1 to .N; interface names stay short).
pub const MAX_HOSTS: usize = 32;

static FLEETS: AtomicU32 = AtomicU32::new(0);

/// One simulated host.
#[derive(Debug, Clone)]
pub struct Host {
    pub index: usize,
    /// Its network namespace (`ip netns`).
    pub netns: String,
    pub addr: Ipv4Addr,
}

impl Host {
    /// `ADDR:PORT` on this host.
    pub fn at(&self, port: u16) -> String {
        format!("{}:{port}", self.addr)
    }
}

/// Hosts joined by a bridge; every namespace is deleted on drop.
pub struct Fleet {
    switch: String,
    /// Where the workspace's binaries are (`procs::bin_dir`).
    bins: std::path::PathBuf,
    /// Where services' stderr goes (`log_to`); the caller's stderr if None.
    logs: Option<std::path::PathBuf>,
    pub hosts: Vec<Host>,
    /// (from, to): what `from` sends `to` is dropped on arrival.
    dropped: parking_lot::Mutex<std::collections::HashSet<(usize, usize)>>,
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    let tool = "ip";
    let out = Command::new(tool)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run `{tool}` (iproute2)"))?;
    if out.status.success() {
        Ok(())
    } else {
        anyhow::bail!(
            "`{tool} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )
    }
}

fn netns_names() -> Vec<String> {
    Command::new("ip")
        .args(["netns", "list"])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter_map(|l| l.split_whitespace().next().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Deletes the namespaces of fleets whose process is gone.
fn sweep_stale() {
    for name in netns_names() {
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let pid: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let alive = pid
            .parse::<u32>()
            .is_ok_and(|p| std::path::Path::new(&format!("/proc/{p}")).exists());
        if !pid.is_empty() && !alive {
            let _ = ip(&["netns", "delete", &name]);
        }
    }
}

impl Fleet {
    /// `n` hosts (1 ≤ n ≤ [`MAX_HOSTS`]), each up and able to reach every
    /// other; panics with the reason when this machine cannot make them.
    pub fn new(n: usize) -> Fleet {
        match Fleet::try_new(n) {
            Ok(f) => f,
            Err(e) => panic!("{e:#}"),
        }
    }

    /// `n` hosts, or why this machine cannot make them.
    pub fn try_new(n: usize) -> anyhow::Result<Fleet> {
        Fleet::build(n).context(
            "cannot build a fleet of network namespaces (it needs root — CAP_NET_ADMIN and \
             CAP_SYS_ADMIN — and iproute2; CI runs these tests as root)",
        )
    }

    fn build(n: usize) -> anyhow::Result<Fleet> {
        anyhow::ensure!(
            (1..=MAX_HOSTS).contains(&n),
            "a fleet has 1 to {MAX_HOSTS} hosts, not {n}"
        );
        // SAFETY: a plain syscall.
        anyhow::ensure!(unsafe { libc::geteuid() } == 0, "not running as root");
        let bins = bin_dir()?;
        sweep_stale();
        let id = format!(
            "{PREFIX}{}x{}",
            std::process::id(),
            FLEETS.fetch_add(1, Ordering::Relaxed)
        );
        let mut fleet = Fleet {
            switch: format!("{id}sw"),
            bins,
            logs: None,
            hosts: Vec::new(),
            dropped: Default::default(),
        };
        // Made one step at a time so that a failure part-way leaves only
        // namespaces that `Drop` deletes.
        ip(&["netns", "add", &fleet.switch])?;
        let sw = fleet.switch.clone();
        ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &sw, "link", "set", "br0", "up"])?;
        for i in 0..n {
            let host = Host {
                index: i,
                netns: format!("{id}h{i}"),
                addr: Ipv4Addr::new(SUBNET[0], SUBNET[1], SUBNET[2], i as u8 + 1),
            };
            ip(&["netns", "add", &host.netns])?;
            fleet.hosts.push(host.clone());
            let port = format!("p{i}");
            ip(&[
                "-n",
                &sw,
                "link",
                "add",
                &port,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                &host.netns,
            ])?;
            ip(&["-n", &sw, "link", "set", &port, "master", "br0"])?;
            ip(&["-n", &sw, "link", "set", &port, "up"])?;
            let cidr = format!("{}/24", host.addr);
            ip(&["-n", &host.netns, "addr", "add", &cidr, "dev", "eth0"])?;
            ip(&["-n", &host.netns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &host.netns, "link", "set", "lo", "up"])?;
            // The local table is consulted after the fault rules (it comes
            // first by default, and would deliver a dropped host's packets).
            ip(&[
                "-n",
                &host.netns,
                "rule",
                "add",
                "pref",
                "100",
                "lookup",
                "local",
            ])?;
            ip(&["-n", &host.netns, "rule", "del", "pref", "0"])?;
        }
        Ok(fleet)
    }

    /// Sends each service's stderr to `dir/h<host>-<program>.log` (appended
    /// to across restarts) instead of the caller's stderr.
    pub fn log_to(&mut self, dir: &std::path::Path) {
        self.logs = Some(dir.to_path_buf());
    }

    pub fn host(&self, i: usize) -> &Host {
        &self.hosts[i]
    }

    /// Runs workspace binary `name` on host `h` (killed when the `Proc` is
    /// dropped).
    pub fn spawn(&self, h: usize, name: &str, args: &[String]) -> anyhow::Result<Proc> {
        let mut cmd = Command::new(self.bins.join(name));
        cmd.args(args).env(
            "RUST_LOG",
            std::env::var("STRATA_TEST_LOG").unwrap_or("warn".into()),
        );
        self.spawn_command(h, cmd)
    }

    /// `strata-master` on host `h` (gRPC port 7000, admin 7001) with every
    /// role's token (off loopback, every service wants credentials).
    pub fn spawn_master(&self, h: usize, t: &TokenFiles, extra: &[&str]) -> anyhow::Result<Proc> {
        let host = &self.hosts[h];
        let mut args = vec![
            "--listen".into(),
            host.at(7000),
            "--admin-addr".into(),
            host.at(7001),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        args.extend(t.master_args());
        self.spawn(h, "strata-master", &args)
    }

    /// `strata-store-node` `id` of 64 MiB on host `h` (data port 7100,
    /// admin 7101) registering with `master`.
    pub fn spawn_node(
        &self,
        h: usize,
        master: &str,
        id: &str,
        t: &TokenFiles,
        extra: &[&str],
    ) -> anyhow::Result<Proc> {
        let host = &self.hosts[h];
        let mut args: Vec<String> = [
            "--master",
            master,
            "--listen",
            &host.at(7100),
            "--admin-addr",
            &host.at(7101),
            "--node-id",
            id,
            "--capacity",
            "64MiB",
            "--token-file",
            &t.member.to_string_lossy(),
        ]
        .map(String::from)
        .into();
        args.extend(extra.iter().map(|s| s.to_string()));
        self.spawn(h, "strata-store-node", &args)
    }

    /// How many store nodes the master on host `h` counts in (0 when it
    /// does not answer); call it from a host's runtime.
    pub async fn live_nodes(&self, h: usize) -> usize {
        let Ok(admin) = self.hosts[h].at(7001).parse() else {
            return 0;
        };
        let admin: std::net::SocketAddr = admin;
        let get = async {
            reqwest::get(format!("http://{admin}/api/v1/nodes"))
                .await?
                .text()
                .await
        };
        let Ok(Ok(body)) = tokio::time::timeout(std::time::Duration::from_secs(1), get).await
        else {
            return 0;
        };
        serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["nodes"].as_array().map(Vec::len))
            .unwrap_or(0)
    }

    /// Waits until the master on host `h` counts exactly `n` store nodes;
    /// false if it does not within `within`.
    pub async fn wait_live_nodes(&self, h: usize, n: usize, within: std::time::Duration) -> bool {
        let t0 = std::time::Instant::now();
        while t0.elapsed() < within {
            if self.live_nodes(h).await == n {
                return true;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        false
    }

    /// Runs `cmd` (any program: etcd, …) on host `h`, its stdout
    /// discarded, its stderr the test's.
    pub fn spawn_command(&self, h: usize, mut cmd: Command) -> anyhow::Result<Proc> {
        let ns = std::fs::File::open(format!("/run/netns/{}", self.hosts[h].netns))
            .context("the host's namespace")?;
        let stderr = match &self.logs {
            None => Stdio::inherit(),
            Some(dir) => {
                let program = std::path::Path::new(cmd.get_program());
                let name = program.file_name().unwrap_or_default().to_string_lossy();
                let path = dir.join(format!("h{h}-{name}.log"));
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .with_context(|| format!("cannot open {}", path.display()))?
                    .into()
            }
        };
        cmd.stdout(Stdio::null()).stderr(stderr);
        let fd = ns.as_raw_fd();
        // SAFETY: setns is async-signal-safe; the fd stays open in the
        // parent until spawn returns.
        unsafe {
            cmd.pre_exec(move || {
                // Killed with the test (even a SIGKILLed one): the sweep of
                // stale namespaces then finds nothing running in them.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0
                    || libc::setns(fd, libc::CLONE_NEWNET) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let program = cmd.get_program().to_string_lossy().into_owned();
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start {program} in host {h}"))?;
        drop(ns);
        Ok(Proc(child))
    }

    /// A single-member etcd on host `h` (client port 2379); its data in
    /// `dir`.
    pub fn spawn_etcd(&self, h: usize, dir: &std::path::Path) -> anyhow::Result<Proc> {
        let host = &self.hosts[h];
        let (client, peer) = (
            format!("http://{}", host.at(2379)),
            format!("http://{}", host.at(2380)),
        );
        let mut cmd = Command::new("etcd");
        cmd.args(["--name", "fleet", "--data-dir"])
            .arg(dir)
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("fleet={peer}")])
            .args(["--log-level", "error"]);
        self.spawn_command(h, cmd)
    }

    /// A runtime whose threads (workers and blocking ones) live in host
    /// `h`: clients built and driven on it connect from that host.
    pub fn runtime(&self, h: usize) -> anyhow::Result<HostRuntime> {
        let path = format!("/run/netns/{}", self.hosts[h].netns);
        let p = path.clone();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .on_thread_start(move || enter_netns(&p))
            .build()
            .context("a runtime in the host")?;
        Ok(HostRuntime { rt, netns: path })
    }

    /// Cuts `a` and `b` apart both ways; other hosts still reach both.
    /// Packets are dropped where they arrive, so the sender hears nothing
    /// (no refusal, no route error): calls wait out their timeouts, as
    /// across a real partition.
    pub fn partition(&self, a: usize, b: usize) -> anyhow::Result<()> {
        self.drop_from(a, b)?;
        self.drop_from(b, a)
    }

    /// What `a` sends `b` vanishes on arrival; what `b` sends `a` still
    /// arrives. Over TCP both directions fail, at different points: `a`'s
    /// connections to `b` are never answered, `b`'s answers to `a` never
    /// acknowledged.
    pub fn drop_from(&self, a: usize, b: usize) -> anyhow::Result<()> {
        // A policy rule on the receiver: packets from `a` meet a blackhole
        // on input and are freed without a word (the kernel here has no tc
        // drop action, and a route on the sender fails its connects at
        // once instead).
        // Recorded once the rule is in, so `heal` deletes only rules that
        // exist.
        if !self.dropped.lock().contains(&(a, b)) {
            self.drop_rule("add", a, b)?;
            self.dropped.lock().insert((a, b));
        }
        Ok(())
    }

    /// Adds or deletes the rule on `b` that drops what `a` sends it.
    fn drop_rule(&self, op: &str, a: usize, b: usize) -> anyhow::Result<()> {
        let from = format!("{}/32", self.hosts[a].addr);
        let ns = &self.hosts[b].netns;
        ip(&[
            "-n",
            ns,
            "rule",
            op,
            "pref",
            "10",
            "from",
            &from,
            "blackhole",
        ])
    }

    /// Takes host `h` off the bridge: it reaches no one, no one reaches it.
    pub fn isolate(&self, h: usize) -> anyhow::Result<()> {
        ip(&["-n", &self.switch, "link", "set", &format!("p{h}"), "down"])
    }

    /// Undoes every partition and isolation.
    pub fn heal(&self) -> anyhow::Result<()> {
        for a in 0..self.hosts.len() {
            ip(&["-n", &self.switch, "link", "set", &format!("p{a}"), "up"])?;
        }
        let dropped: Vec<_> = self.dropped.lock().drain().collect();
        for (a, b) in dropped {
            self.drop_rule("del", a, b)?;
        }
        Ok(())
    }
}

/// Moves the calling thread into the network namespace at `path`.
fn enter_netns(path: &str) {
    let ns = std::fs::File::open(path).expect("the namespace exists");
    // SAFETY: switches only this thread's network namespace.
    let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns {path}: {}", std::io::Error::last_os_error());
}

/// A tokio runtime living in one host (`Fleet::runtime`).
pub struct HostRuntime {
    pub rt: tokio::runtime::Runtime,
    netns: String,
}

impl HostRuntime {
    /// Runs `fut` to completion in the host: the calling thread, which
    /// `block_on` polls it on, enters the host's namespace for the call and
    /// returns to its own afterwards (a socket made here without that would
    /// belong to the machine's namespace).
    pub fn block_on<F: std::future::Future>(&self, fut: F) -> F::Output {
        let own = std::fs::File::open("/proc/thread-self/ns/net").expect("own namespace");
        enter_netns(&self.netns);
        struct Back(std::fs::File);
        impl Drop for Back {
            fn drop(&mut self) {
                // SAFETY: as in `enter_netns`.
                unsafe { libc::setns(self.0.as_raw_fd(), libc::CLONE_NEWNET) };
            }
        }
        let _back = Back(own);
        self.rt.block_on(fut)
    }

    pub fn spawn<F>(&self, fut: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.rt.spawn(fut)
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for h in &self.hosts {
            let _ = ip(&["netns", "delete", &h.netns]);
        }
        let _ = ip(&["netns", "delete", &self.switch]);
    }
}
