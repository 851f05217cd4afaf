//! `strata up`: one master and N store nodes in this process.

use crate::local::ClusterBuilder;
use anyhow::Context;
use std::net::SocketAddr;
use strata_common::units::{format_size, ByteSize};

#[derive(Debug, clap::Args)]
pub struct UpArgs {
    /// Store nodes to run
    #[arg(long, env = "STRATA_STORE_NODES", default_value_t = 2)]
    pub store_nodes: usize,
    /// DRAM each store node contributes
    #[arg(long, env = "STRATA_NODE_CAPACITY", default_value = "512MiB")]
    pub node_capacity: ByteSize,
    /// Master gRPC address (use 127.0.0.1:0 for any free port)
    #[arg(long, env = "STRATA_LISTEN", default_value = "127.0.0.1:7400")]
    pub listen: SocketAddr,
    /// Master admin HTTP address
    #[arg(long, env = "STRATA_ADMIN_ADDR", default_value = "127.0.0.1:7401")]
    pub admin_addr: SocketAddr,
    /// SSD agents to run (0: DRAM only)
    #[arg(long, env = "STRATA_SSD_AGENTS", default_value_t = 1)]
    pub ssd_agents: usize,
    /// Directory the SSD agents keep buckets in [default: a temporary directory]
    #[arg(long, env = "STRATA_SSD_DIR")]
    pub ssd_dir: Option<std::path::PathBuf>,
    /// Bytes each SSD agent may keep
    #[arg(long, env = "STRATA_SSD_CAPACITY", default_value = "4GiB")]
    pub ssd_capacity: ByteSize,
}

pub async fn run(a: UpArgs, transport: crate::TransportKind) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=64).contains(&a.store_nodes),
        "--store-nodes must be between 1 and 64"
    );
    let (listen, admin) = (a.listen, a.admin_addr);
    anyhow::ensure!(a.ssd_agents <= 16, "--ssd-agents must be at most 16");
    // Its state, tokens and SSD buckets are this user's alone.
    strata_common::files::private_by_default();
    let ucx = transport == crate::TransportKind::Ucx;
    let mut b = ClusterBuilder::new()
        .node_transport(transport)
        .store_nodes(a.store_nodes)
        .ssd_agents(a.ssd_agents)
        .ssd_capacity(a.ssd_capacity.0);
    if let Some(d) = &a.ssd_dir {
        b = b.ssd_dir(d);
    }
    let cluster = b
        .node_capacity(a.node_capacity.0)
        .master(|m| {
            m.listen = listen;
            m.admin_addr = admin;
        })
        .build()
        .await
        .context(
            "cannot start the local cluster (is another `strata up` running? \
             try --listen 127.0.0.1:0 --admin-addr 127.0.0.1:0)",
        )?;
    let addr = cluster.master_addr();
    // The CLI on this machine finds the admin token (and with UCX the rdma
    // token) here by itself.
    let wrote = write_token(
        strata_client::up_token::default_token_file(false),
        &cluster.credentials().admin,
    )?;
    let wrote_rdma = match ucx {
        true => write_token(
            strata_client::up_token::default_token_file(true),
            &cluster.credentials().rdma,
        )?,
        false => None,
    };
    // ...for this master only (`token_for`).
    let wrote_master = match strata_client::up_token::master_file().filter(|_| wrote.is_some()) {
        Some(p) => {
            std::fs::write(&p, format!("{addr}\n"))
                .with_context(|| format!("cannot write {}", p.display()))?;
            Some(p)
        }
        None => None,
    };
    println!("Strata local cluster is up.");
    println!("  master:       {addr}    (export STRATA_MASTER={addr})");
    if let Some(p) = &wrote {
        println!(
            "  admin token:  {}    (the CLI here reads it; elsewhere: --token-file)",
            p.display()
        );
    }
    if let Some(p) = &wrote_rdma {
        println!(
            "  rdma token:   {}    (strata --transport ucx here reads it)",
            p.display()
        );
    }
    println!("  admin:        http://{}/metrics", cluster.master_admin);
    println!(
        "  store nodes:  {} x {}",
        cluster.nodes.len(),
        format_size(a.node_capacity.0)
    );
    for n in &cluster.nodes {
        println!("    {}  admin http://{}", n.data_addr, n.admin_addr);
    }
    if !cluster.agents.is_empty() {
        println!(
            "  ssd agents:   {} x {} in {}",
            cluster.agents.len(),
            format_size(a.ssd_capacity.0),
            cluster.ssd_dir.display()
        );
        for g in &cluster.agents {
            println!(
                "    {} (owner {})  admin http://{}",
                g.handle, g.owner_id, g.admin_addr
            );
        }
    }
    println!("Try: echo hello | strata --master {addr} put greeting - && strata --master {addr} get greeting");
    println!("Press Ctrl-C to stop.");
    strata_common::shutdown::on_signals().cancelled().await;
    eprintln!("stopping...");
    cluster.shutdown().await;
    for p in [&wrote, &wrote_rdma, &wrote_master].into_iter().flatten() {
        let _ = std::fs::remove_file(p);
    }
    eprintln!("stopped.");
    Ok(())
}

/// Writes `token` to `path` (owner-only), creating its directory.
fn write_token(
    path: Option<std::path::PathBuf>,
    token: &Option<strata_common::auth::Secret>,
) -> anyhow::Result<Option<std::path::PathBuf>> {
    let (Some(p), Some(t)) = (path, token) else {
        return Ok(None);
    };
    if let Some(dir) = p.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    t.write_file(&p)?;
    Ok(Some(p))
}
