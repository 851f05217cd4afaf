//! A whole cluster in one process on loopback ports: what `strata up` runs
//! and what integration tests build with [`ClusterBuilder`].

use crate::{Client, ClientConfig};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_common::auth::Credentials;
use strata_common::{Error, Result};
use strata_master::{Master, MasterConfig};
use strata_ssd_agent::{SsdAgentConfig, SsdAgentHandle};
use strata_store_node::{StoreNodeConfig, StoreNodeHandle};
use tokio_util::sync::CancellationToken;

/// Adjusts an SSD agent's configuration before it starts.
type AgentTweak = Arc<dyn Fn(&mut SsdAgentConfig) + Send + Sync>;

/// Builds an in-process cluster: `ClusterBuilder::new().store_nodes(3).build()`.
#[derive(Clone)]
pub struct ClusterBuilder {
    store_nodes: usize,
    node_capacity: u64,
    segment_size: Option<u64>,
    prefault: bool,
    master: MasterConfig,
    ssd_agents: usize,
    ssd_capacity: u64,
    ssd_dir: Option<std::path::PathBuf>,
    ssd: Option<AgentTweak>,
    credentials: bool,
    transport: crate::TransportKind,
}

impl Default for ClusterBuilder {
    fn default() -> Self {
        ClusterBuilder {
            store_nodes: 2,
            node_capacity: 256 << 20,
            segment_size: None,
            prefault: false,
            master: MasterConfig::local(),
            ssd_agents: 0,
            ssd_capacity: 1 << 30,
            ssd_dir: None,
            ssd: None,
            credentials: true,
            transport: crate::TransportKind::Tcp,
        }
    }
}

impl std::fmt::Debug for ClusterBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterBuilder")
            .field("store_nodes", &self.store_nodes)
            .field("ssd_agents", &self.ssd_agents)
            .finish()
    }
}

impl ClusterBuilder {
    pub fn new() -> Self {
        Self::default()
    }
    /// SSD agents (handles `local/ssd-0`, …) sharing one data directory.
    pub fn ssd_agents(mut self, n: usize) -> Self {
        self.ssd_agents = n;
        self
    }
    pub fn ssd_capacity(mut self, bytes: u64) -> Self {
        self.ssd_capacity = bytes;
        self
    }
    /// The agents' shared data directory (default: a temporary one).
    pub fn ssd_dir(mut self, dir: impl Into<std::path::PathBuf>) -> Self {
        self.ssd_dir = Some(dir.into());
        self
    }
    /// Adjusts every SSD agent's configuration.
    pub fn ssd(mut self, f: impl Fn(&mut SsdAgentConfig) + Send + Sync + 'static) -> Self {
        self.ssd = Some(Arc::new(f));
        self
    }
    pub fn store_nodes(mut self, n: usize) -> Self {
        self.store_nodes = n;
        self
    }
    pub fn node_capacity(mut self, bytes: u64) -> Self {
        self.node_capacity = bytes;
        self
    }
    /// Splits each node's capacity into segments of at most this size.
    pub fn segment_size(mut self, bytes: u64) -> Self {
        self.segment_size = Some(bytes);
        self
    }
    /// Make store-node memory resident at start (see `--prefault`).
    pub fn prefault(mut self, yes: bool) -> Self {
        self.prefault = yes;
        self
    }
    /// Generate credentials for every role (the default) and pass them on,
    /// or run in protected mode (no credentials, loopback only).
    pub fn credentials(mut self, on: bool) -> Self {
        self.credentials = on;
        self
    }
    /// What the store nodes and SSD agents serve: TCP, or (`Ucx`) UCX as
    /// well (segments one-sided, SSD reads through lent staging).
    pub fn node_transport(mut self, t: crate::TransportKind) -> Self {
        self.transport = t;
        self
    }
    /// Adjusts the master's configuration (TTLs, watermarks, addresses).
    pub fn master(mut self, f: impl FnOnce(&mut MasterConfig)) -> Self {
        f(&mut self.master);
        self
    }

    /// Starts the master and the nodes and waits until every node has
    /// registered its segments.
    pub async fn build(mut self) -> Result<LocalCluster> {
        let tmp = tempfile::Builder::new()
            .prefix("strata-local-")
            .tempdir()
            .map_err(|e| Error::internal(format!("cannot create a temporary directory: {e}")))?;
        if self.master.state_dir.is_none() {
            self.master.state_dir = Some(tmp.path().join("master"));
        }
        let ssd_dir = self
            .ssd_dir
            .clone()
            .unwrap_or_else(|| tmp.path().join("ssd"));
        if self.credentials && self.master.credentials.is_empty() {
            self.master.credentials = Credentials::generate();
        }
        let credentials = self.master.credentials.clone();
        let root = CancellationToken::new();
        let master_token = root.child_token();
        let mh = strata_master::start(self.master.clone(), master_token.clone()).await?;
        let master = mh
            .master()
            .ok_or_else(|| Error::internal("the local master is not leading"))?;
        let (master_addr, master_admin) = (mh.grpc_addr, mh.admin_addr);
        let master_task = tokio::spawn(mh.wait());
        let mut c = LocalCluster {
            master_addr,
            master_admin,
            master,
            nodes: Vec::new(),
            root,
            master_token,
            master_task: Some(master_task),
            node_capacity: self.node_capacity,
            segment_size: self.segment_size,
            prefault: self.prefault,
            agents: Vec::new(),
            ssd_dir,
            ssd_capacity: self.ssd_capacity,
            ssd_cfg: self.ssd.clone(),
            credentials,
            transport: self.transport,
            _tmp: tmp,
        };
        for _ in 0..self.store_nodes {
            c.add_node().await?;
        }
        c.wait_registered(Duration::from_secs(10)).await?;
        for i in 0..self.ssd_agents {
            c.add_agent(&format!("local/ssd-{i}")).await?;
        }
        Ok(c)
    }
}

pub struct LocalNode {
    pub data_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub node_id: String,
    pub records: Arc<strata_store_node::records::ObjectRecords>,
    registered: Arc<std::sync::atomic::AtomicBool>,
    token: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl LocalNode {
    /// The node has installed its registration (grant key and segments), so
    /// it serves the grants the master hands out for it.
    pub fn is_registered(&self) -> bool {
        self.registered.load(std::sync::atomic::Ordering::Acquire)
    }
    /// Stops the node (its heartbeats end; the master drops it after the TTL).
    pub async fn stop(&mut self) {
        self.token.cancel();
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
    pub fn is_running(&self) -> bool {
        self.task.is_some()
    }
}

/// An SSD agent of a local cluster.
pub struct LocalAgent {
    pub handle: String,
    pub data_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub owner_id: u64,
    pub recovery: strata_ssd_agent::store::RecoveryReport,
    pub store: Arc<strata_ssd_agent::store::OwnerStore>,
    pub faults: Arc<strata_ssd_agent::store::Faults>,
    pub staging: strata_ssd_agent::staging::Staging,
    pub eviction: strata_ssd_agent::eviction::EvictionMetrics,
    token: CancellationToken,
    task: Option<tokio::task::JoinHandle<Result<()>>>,
}

impl LocalAgent {
    /// Stops the agent cleanly (flushes its index, releases its lock).
    pub async fn stop(&mut self) -> Result<()> {
        self.token.cancel();
        match self.task.take() {
            Some(t) => t.await.map_err(|e| Error::internal(e.to_string()))?,
            None => Ok(()),
        }
    }
}

pub struct LocalCluster {
    pub master_addr: SocketAddr,
    pub master_admin: SocketAddr,
    pub master: Arc<Master>,
    pub nodes: Vec<LocalNode>,
    root: CancellationToken,
    master_token: CancellationToken,
    master_task: Option<tokio::task::JoinHandle<()>>,
    node_capacity: u64,
    segment_size: Option<u64>,
    prefault: bool,
    pub agents: Vec<LocalAgent>,
    pub ssd_dir: std::path::PathBuf,
    ssd_capacity: u64,
    ssd_cfg: Option<AgentTweak>,
    credentials: Credentials,
    transport: crate::TransportKind,
    _tmp: tempfile::TempDir,
}

impl LocalCluster {
    /// Starts an SSD agent with `handle` on the cluster's SSD directory.
    pub async fn add_agent(&mut self, handle: &str) -> Result<&LocalAgent> {
        let a = self.spawn_agent(handle.to_string()).await?;
        self.agents.push(a);
        Ok(self.agents.last().expect("just pushed"))
    }

    /// Stops agent `i` and starts it again with the same handle and directory.
    pub async fn restart_agent(&mut self, i: usize) -> Result<&LocalAgent> {
        // Drop the old agent entirely first: its store holds the index open.
        let mut old = self.agents.remove(i);
        old.stop().await?;
        let handle = old.handle.clone();
        drop(old);
        let a = self.spawn_agent(handle).await?;
        self.agents.insert(i, a);
        Ok(&self.agents[i])
    }

    /// Starts an agent without adding it to `agents` (start several at once).
    pub async fn spawn_agent(&self, handle: String) -> Result<LocalAgent> {
        let handle = handle.as_str();
        let mut cfg = SsdAgentConfig::local(
            &self.master_addr(),
            handle,
            self.ssd_dir.clone(),
            self.ssd_capacity,
        );
        cfg.token = self.credentials.member.clone();
        cfg.transport = self.transport;
        if let Some(f) = &self.ssd_cfg {
            f(&mut cfg);
        }
        let token = self.root.child_token();
        let h: SsdAgentHandle = strata_ssd_agent::start(cfg, token.clone()).await?;
        Ok(LocalAgent {
            handle: handle.to_string(),
            data_addr: h.data_addr,
            admin_addr: h.admin_addr,
            owner_id: h.owner_id,
            recovery: h.recovery.clone(),
            store: h.store.clone(),
            faults: h.faults.clone(),
            staging: h.staging.clone(),
            eviction: h.eviction.clone(),
            token,
            task: Some(tokio::spawn(h.wait())),
        })
    }
    pub async fn add_node(&mut self) -> Result<&LocalNode> {
        let mut cfg = StoreNodeConfig::local(&self.master_addr.to_string(), self.node_capacity);
        if let Some(s) = self.segment_size {
            cfg.segment_size = s;
        }
        cfg.prefault = self.prefault;
        cfg.token = self.credentials.member.clone();
        cfg.transport = self.transport;
        let token = self.root.child_token();
        let h: StoreNodeHandle = strata_store_node::start(cfg, token.clone()).await?;
        self.nodes.push(LocalNode {
            data_addr: h.data_addr,
            admin_addr: h.admin_addr,
            node_id: h.node_id.clone(),
            records: h.records.clone(),
            registered: h.registered_flag(),
            token,
            task: Some(tokio::spawn(h.wait())),
        });
        Ok(self.nodes.last().expect("just pushed"))
    }

    /// Waits until the master has a segment from every running node and
    /// every running node has installed its registration. The master knows
    /// a node (and may grant on it) a moment before the node has the grant
    /// key from the answer; writes in that moment fail `unavailable`.
    pub async fn wait_registered(&self, timeout: Duration) -> Result<()> {
        let running = || self.nodes.iter().filter(|n| n.is_running());
        let want = running().count();
        let t0 = Instant::now();
        while self.master.stat().nodes as usize != want || !running().all(|n| n.is_registered()) {
            if t0.elapsed() > timeout {
                return Err(Error::unavailable(format!(
                    "only {} of {want} store nodes registered within {timeout:?}",
                    self.master.stat().nodes
                )));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }

    /// What the cluster's store nodes and SSD agents serve.
    pub fn transport(&self) -> crate::TransportKind {
        self.transport
    }

    pub fn master_addr(&self) -> String {
        self.master_addr.to_string()
    }

    pub async fn client(&self) -> Result<Client> {
        Client::connect(self.client_config()).await
    }

    /// A client configuration that presents the admin token (admins may
    /// do everything a client may, and tests force-remove and evict).
    pub fn client_config(&self) -> ClientConfig {
        ClientConfig::new(self.master_addr()).with_token(self.credentials.admin.clone())
    }

    /// A client configuration that presents the rdma token and moves bytes
    /// over UCX (one-sided to nodes that serve it).
    pub fn rdma_client_config(&self) -> ClientConfig {
        ClientConfig::new(self.master_addr())
            .with_token(self.credentials.rdma.clone())
            .with_transport(crate::TransportKind::Ucx)
    }

    /// The credentials the cluster's master checks (all `None` in
    /// protected mode).
    pub fn credentials(&self) -> &Credentials {
        &self.credentials
    }

    /// Stops every service cleanly and waits for their tasks.
    pub async fn shutdown(mut self) {
        for a in &mut self.agents {
            let _ = a.stop().await;
        }
        for n in &mut self.nodes {
            n.stop().await;
        }
        self.master_token.cancel();
        if let Some(t) = self.master_task.take() {
            let _ = t.await;
        }
        self.root.cancel();
    }
}
