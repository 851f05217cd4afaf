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
//! stopped and killed with signals (`procs::Proc`); `Proxy` delays and
//! paces a link.
//!
//! Needs root and iproute2 (`ip`); without them `Fleet::new` fails with a
//! message that says so (a test never skips silently). Namespace names carry
//! the creating process's pid, and a new fleet first deletes those of
//! processes that are gone, so a killed test leaves nothing behind for long.

use crate::bin;
use crate::procs::{Proc, TokenFiles};
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
    pub hosts: Vec<Host>,
    /// (from, to): what `from` sends `to` is dropped on arrival.
    dropped: std::sync::Mutex<std::collections::HashSet<(usize, usize)>>,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let tool = "ip";
    let out = Command::new(tool)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run `{tool}` (iproute2): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{tool} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
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
            Err(e) => panic!(
                "cannot build a fleet of network namespaces: {e}. These tests need root \
                 (CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2; CI runs them as root"
            ),
        }
    }

    pub fn try_new(n: usize) -> Result<Fleet, String> {
        if n == 0 || n > MAX_HOSTS {
            return Err(format!("a fleet has 1 to {MAX_HOSTS} hosts, not {n}"));
        }
        if unsafe { libc::geteuid() } != 0 {
            return Err("not running as root".into());
        }
        sweep_stale();
        let id = format!(
            "{PREFIX}{}x{}",
            std::process::id(),
            FLEETS.fetch_add(1, Ordering::Relaxed)
        );
        let mut fleet = Fleet {
            switch: format!("{id}sw"),
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

    pub fn host(&self, i: usize) -> &Host {
        &self.hosts[i]
    }

    /// Runs workspace binary `name` on host `h` (killed when the `Proc` is
    /// dropped).
    pub fn spawn(&self, h: usize, name: &str, args: &[String]) -> Proc {
        let mut cmd = Command::new(bin(name));
        cmd.args(args).env(
            "RUST_LOG",
            std::env::var("STRATA_TEST_LOG").unwrap_or("warn".into()),
        );
        self.spawn_command(h, cmd)
    }

    /// `strata-master` on host `h` (gRPC port 7000, admin 7001) with every
    /// role's token (off loopback, every service wants credentials).
    pub fn spawn_master(&self, h: usize, t: &TokenFiles, extra: &[&str]) -> Proc {
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
    ) -> Proc {
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
            t.member.to_str().expect("a UTF-8 path"),
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
        let (_, body) = crate::http_get(admin, "/api/v1/nodes").await;
        serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["nodes"].as_array().map(Vec::len))
            .unwrap_or(0)
    }

    /// Runs `cmd` (any program: etcd, …) on host `h`, its stdout
    /// discarded, its stderr the test's.
    pub fn spawn_command(&self, h: usize, mut cmd: Command) -> Proc {
        let ns = std::fs::File::open(format!("/run/netns/{}", self.hosts[h].netns))
            .expect("the host's namespace exists");
        cmd.stdout(Stdio::null()).stderr(Stdio::inherit());
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
        let child = cmd.spawn().expect("spawn a program in its host");
        drop(ns);
        Proc(child)
    }

    /// A single-member etcd on host `h` (client port 2379); its data in
    /// `dir`.
    pub fn spawn_etcd(&self, h: usize, dir: &std::path::Path) -> Proc {
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
    pub fn runtime(&self, h: usize) -> HostRuntime {
        let path = format!("/run/netns/{}", self.hosts[h].netns);
        let p = path.clone();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .on_thread_start(move || enter_netns(&p))
            .build()
            .expect("a runtime in the host");
        HostRuntime { rt, netns: path }
    }

    /// Cuts `a` and `b` apart both ways; other hosts still reach both.
    /// Packets are dropped where they arrive, so the sender hears nothing
    /// (no refusal, no route error): calls wait out their timeouts, as
    /// across a real partition.
    pub fn partition(&self, a: usize, b: usize) {
        self.drop_from(a, b);
        self.drop_from(b, a);
    }

    /// What `a` sends `b` vanishes on arrival; what `b` sends `a` still
    /// arrives. Over TCP both directions fail, at different points: `a`'s
    /// connections to `b` are never answered, `b`'s answers to `a` never
    /// acknowledged.
    pub fn drop_from(&self, a: usize, b: usize) {
        // A policy rule on the receiver: packets from `a` meet a blackhole
        // on input and are freed without a word (the kernel here has no tc
        // drop action, and a route on the sender fails its connects at
        // once instead).
        if self.dropped.lock().expect("fleet lock").insert((a, b)) {
            self.drop_rule("add", a, b).expect("drop rule");
        }
    }

    /// Adds or deletes the rule on `b` that drops what `a` sends it.
    fn drop_rule(&self, op: &str, a: usize, b: usize) -> Result<(), String> {
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
    pub fn isolate(&self, h: usize) {
        ip(&["-n", &self.switch, "link", "set", &format!("p{h}"), "down"]).expect("port down");
    }

    /// Undoes every partition and isolation.
    pub fn heal(&self) {
        for a in 0..self.hosts.len() {
            ip(&["-n", &self.switch, "link", "set", &format!("p{a}"), "up"]).expect("port up");
        }
        for (a, b) in self.dropped.lock().expect("fleet lock").drain() {
            self.drop_rule("del", a, b).expect("drop rule removed");
        }
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

/// A TCP proxy in a host, for what the kernel here cannot do (no netem):
/// each chunk read from either side is held `delay` and then paced to
/// `bytes_per_sec` (0: unpaced) before it is written on. Point a service's
/// advertised address at it to slow every link to that service.
pub struct Proxy {
    stop: tokio_util::sync::CancellationToken,
}

impl Proxy {
    /// Listens on `listen` (an address of the runtime's host) and forwards
    /// each connection to `target`.
    pub fn start(
        rt: &HostRuntime,
        listen: &str,
        target: &str,
        delay: std::time::Duration,
        bytes_per_sec: u64,
    ) -> Proxy {
        let stop = tokio_util::sync::CancellationToken::new();
        let l = rt
            .block_on(tokio::net::TcpListener::bind(listen))
            .expect("proxy listens");
        let (target, s) = (target.to_string(), stop.clone());
        rt.spawn(async move {
            loop {
                let (down, _) = tokio::select! {
                    _ = s.cancelled() => return,
                    r = l.accept() => match r { Ok(c) => c, Err(_) => continue },
                };
                let (target, s) = (target.clone(), s.clone());
                tokio::spawn(async move {
                    let Ok(up) = tokio::net::TcpStream::connect(&target).await else {
                        return;
                    };
                    let (dr, dw) = down.into_split();
                    let (ur, uw) = up.into_split();
                    tokio::select! {
                        _ = s.cancelled() => {}
                        _ = pump(dr, uw, delay, bytes_per_sec) => {}
                        _ = pump(ur, dw, delay, bytes_per_sec) => {}
                    }
                });
            }
        });
        Proxy { stop }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: std::time::Duration,
    bytes_per_sec: u64,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let pace = match bytes_per_sec {
            0 => std::time::Duration::ZERO,
            r => std::time::Duration::from_secs_f64(n as f64 / r as f64),
        };
        tokio::time::sleep(delay + pace).await;
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
