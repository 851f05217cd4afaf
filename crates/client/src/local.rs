//! A whole cluster in one process on loopback ports: what `strata up` runs
//! and what integration tests build with [`ClusterBuilder`].

use crate::{Client, ClientConfig};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_common::{Error, Result};
use strata_master::{Master, MasterConfig};
use strata_store_node::{StoreNodeConfig, StoreNodeHandle};
use tokio_util::sync::CancellationToken;

/// Builds an in-process cluster: `ClusterBuilder::new().store_nodes(3).build()`.
#[derive(Debug, Clone)]
pub struct ClusterBuilder {
    store_nodes: usize,
    node_capacity: u64,
    segment_size: Option<u64>,
    prefault: bool,
    master: MasterConfig,
}

impl Default for ClusterBuilder {
    fn default() -> Self {
        ClusterBuilder {
            store_nodes: 2,
            node_capacity: 256 << 20,
            segment_size: None,
            prefault: false,
            master: MasterConfig::local(),
        }
    }
}

impl ClusterBuilder {
    pub fn new() -> Self {
        Self::default()
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
    /// Adjusts the master's configuration (TTLs, watermarks, addresses).
    pub fn master(mut self, f: impl FnOnce(&mut MasterConfig)) -> Self {
        f(&mut self.master);
        self
    }

    /// Starts the master and the nodes and waits until every node has
    /// registered its segments.
    pub async fn build(self) -> Result<LocalCluster> {
        let root = CancellationToken::new();
        let master_token = root.child_token();
        let mh = strata_master::start(self.master.clone(), master_token.clone()).await?;
        let (master_addr, master_admin, master) = (mh.grpc_addr, mh.admin_addr, mh.master.clone());
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
        };
        for _ in 0..self.store_nodes {
            c.add_node().await?;
        }
        c.wait_registered(Duration::from_secs(10)).await?;
        Ok(c)
    }
}

pub struct LocalNode {
    pub data_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub node_id: String,
    pub records: Arc<strata_store_node::records::ObjectRecords>,
    token: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl LocalNode {
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
}

impl LocalCluster {
    pub async fn add_node(&mut self) -> Result<&LocalNode> {
        let mut cfg = StoreNodeConfig::local(&self.master_addr.to_string(), self.node_capacity);
        if let Some(s) = self.segment_size {
            cfg.segment_size = s;
        }
        cfg.prefault = self.prefault;
        let token = self.root.child_token();
        let h: StoreNodeHandle = strata_store_node::start(cfg, token.clone()).await?;
        self.nodes.push(LocalNode {
            data_addr: h.data_addr,
            admin_addr: h.admin_addr,
            node_id: h.node_id.clone(),
            records: h.records.clone(),
            token,
            task: Some(tokio::spawn(h.wait())),
        });
        Ok(self.nodes.last().expect("just pushed"))
    }

    /// Waits until the master has a segment from every running node.
    pub async fn wait_registered(&self, timeout: Duration) -> Result<()> {
        let want = self.nodes.iter().filter(|n| n.is_running()).count();
        let t0 = Instant::now();
        while self.master.stat().nodes as usize != want {
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

    pub fn master_addr(&self) -> String {
        self.master_addr.to_string()
    }

    pub async fn client(&self) -> Result<Client> {
        Client::connect(ClientConfig::new(self.master_addr())).await
    }

    /// Stops every service cleanly and waits for their tasks.
    pub async fn shutdown(mut self) {
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
