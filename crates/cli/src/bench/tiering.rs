//! What the tiers are worth: hit rates per admission policy, each on a fresh
//! in-process cluster whose DRAM and SSD hold exactly the configured number
//! of objects. Shared by the scan/Zipf scenario and the trace replay.

use crate::local::{ClusterBuilder, LocalCluster};
use crate::{Client, Code, PutOptions, Tier};
use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use strata_master::config::{OffloadPolicy, SsdAdmission};

/// Bucket-table bytes an SSD object costs beyond its data (entry + key).
const SSD_ENTRY: u64 = 96;

/// Sizing of one policy's cluster, in objects of `block` bytes.
#[derive(Debug, Clone)]
pub struct Tiers {
    pub dram_blocks: u64,
    pub ssd_blocks: u64,
    pub block: u64,
    pub ssd_dir: Option<std::path::PathBuf>,
    pub promote: bool,
}

impl Tiers {
    /// A cluster whose DRAM holds `dram_blocks` and whose one SSD owner holds
    /// `ssd_blocks`. The SSD watermarks are set close to full so the
    /// configured capacity is what the policies get to use.
    pub async fn start(&self, policy: BenchPolicy) -> anyhow::Result<PolicyCluster> {
        let aligned = self.block.div_ceil(64) * 64;
        let bucket_blocks = 64;
        let bucket_bytes = bucket_blocks * (self.block + SSD_ENTRY) + 4096;
        // Whole buckets: capacity for the blocks plus one bucket of slack,
        // which the agent's low watermark keeps free.
        let ssd = self.ssd_blocks * (self.block + SSD_ENTRY) + bucket_bytes;
        let promote = self.promote;
        let mut b = ClusterBuilder::new()
            .store_nodes(1)
            .node_capacity(self.dram_blocks * aligned)
            .ssd_agents(usize::from(self.ssd_blocks > 0))
            .ssd_capacity(ssd.max(1 << 20))
            .ssd(move |a| {
                a.bucket_bytes = bucket_bytes;
                a.bucket_keys = bucket_blocks as usize;
                a.high_watermark = 1.0;
                a.low_watermark = 1.0 - bucket_bytes as f64 / ssd.max(1) as f64;
                a.poll_interval = std::time::Duration::from_millis(20);
            })
            .master(move |m| {
                m.offload_policy = policy.offload;
                m.ssd_admission = policy.admission;
                // Background eviction keeps headroom so puts rarely have to
                // evict synchronously (which drops instead of offloading);
                // victims queued for offload stay readable in DRAM.
                m.high_watermark = 0.95;
                m.eviction_ratio = 0.03;
                m.promote_on_hit = promote;
                m.lease_ttl = std::time::Duration::from_millis(200);
            })
            .prefault(false);
        // A fresh directory per cluster: an agent must not adopt the buckets
        // a previous policy's run left behind.
        let dir = fresh_ssd_dir(self.ssd_dir.as_deref())?;
        if let Some(d) = &dir {
            b = b.ssd_dir(d.path());
        }
        let cluster = b
            .build()
            .await
            .context("cannot start the policy's cluster")?;
        Ok(PolicyCluster { cluster, _dir: dir })
    }
}

/// A policy's cluster and its SSD directory (removed when dropped).
pub struct PolicyCluster {
    pub cluster: LocalCluster,
    _dir: Option<tempfile::TempDir>,
}

impl PolicyCluster {
    pub async fn shutdown(self) {
        self.cluster.shutdown().await;
    }
}

impl std::ops::Deref for PolicyCluster {
    type Target = LocalCluster;
    fn deref(&self) -> &LocalCluster {
        &self.cluster
    }
}

/// Lookups by outcome.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct Tally {
    pub dram: u64,
    pub ssd: u64,
    pub miss: u64,
}

impl Tally {
    pub fn total(&self) -> u64 {
        self.dram + self.ssd + self.miss
    }
    pub fn rate(&self, n: u64) -> f64 {
        n as f64 / self.total().max(1) as f64
    }
    pub fn hit_rate(&self) -> f64 {
        self.rate(self.dram + self.ssd)
    }
    /// "DRAM x% SSD y% miss z%", for report notes.
    pub fn breakdown(&self) -> String {
        format!(
            "DRAM {:.1}% SSD {:.1}% miss {:.1}%",
            self.rate(self.dram) * 100.0,
            self.rate(self.ssd) * 100.0,
            self.rate(self.miss) * 100.0
        )
    }
}

/// Looks `keys` up in order and stops at the first miss, as a prefix cache
/// does; returns how many hit. Lookups go in small batches, so a few keys
/// past the first miss may be read (and touched) too.
pub async fn prefix_lookup(c: &Client, keys: &[String], t: &mut Tally) -> anyhow::Result<usize> {
    const CHUNK: usize = 8;
    let mut hits = 0;
    for chunk in keys.chunks(CHUNK) {
        let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
        for r in c.batch_get_tiered(&refs).await? {
            match r {
                Ok((_, Tier::Memory)) => t.dram += 1,
                Ok((_, Tier::Ssd)) => t.ssd += 1,
                Err(e) if e.code == Code::NotFound => {
                    t.miss += (keys.len() - hits) as u64;
                    return Ok(hits);
                }
                // A copy that vanished or a full arena: the engine would
                // recompute, so it counts as a miss, never as an abort.
                Err(e) => {
                    tracing::debug!(error = %e, "lookup failed; counted as a miss");
                    t.miss += (keys.len() - hits) as u64;
                    return Ok(hits);
                }
            }
            hits += 1;
        }
    }
    Ok(hits)
}

/// Puts `keys` (objects of `data`), as an engine storing freshly computed
/// blocks; keys that appeared meanwhile are fine.
pub async fn put_blocks(c: &Client, keys: &[String], data: &[u8]) -> anyhow::Result<()> {
    for chunk in keys.chunks(32) {
        let items: Vec<(&str, &[u8])> = chunk.iter().map(|k| (k.as_str(), data)).collect();
        for r in c.batch_put(&items, &PutOptions::default()).await? {
            match r {
                Ok(()) => {}
                Err(e) if matches!(e.code, Code::AlreadyExists | Code::NoSpace) => {}
                Err(e) => tracing::debug!(error = %e, "block put failed"),
            }
        }
    }
    Ok(())
}

pub fn progress(name: &str, len: u64, quiet: bool) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template(
            "{prefix:>24} [{bar:30}] {pos}/{len} {per_sec} eta {eta} {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    pb.set_prefix(name.to_string());
    pb
}

/// A fresh directory under `base` for one cluster's SSD agent (None: the
/// cluster makes its own temporary one). Removed when dropped.
pub fn fresh_ssd_dir(base: Option<&std::path::Path>) -> anyhow::Result<Option<tempfile::TempDir>> {
    let Some(base) = base else { return Ok(None) };
    std::fs::create_dir_all(base)?;
    let d = tempfile::Builder::new()
        .prefix("strata-bench-")
        .tempdir_in(base)
        .with_context(|| format!("creating a directory under {}", base.display()))?;
    Ok(Some(d))
}

/// What the master's offload did during a run: (persisted, victims lost
/// before their copy, dropped after failures).
pub fn offload_outcomes(c: &LocalCluster) -> (u64, u64, u64) {
    let m = &c.master.metrics.offload_results;
    let get = |o: &str| m.with_label_values(&[o]).get();
    (get("persisted"), get("source_gone"), get("dropped"))
}

/// A master's `--offload-policy` and, for `on-evict`, its `--ssd-admission`:
/// written `on-evict` (auto) or `on-evict/all`.
#[derive(Debug, Clone, Copy)]
pub struct BenchPolicy {
    pub offload: OffloadPolicy,
    pub admission: SsdAdmission,
}

impl BenchPolicy {
    pub fn of(offload: OffloadPolicy) -> Self {
        BenchPolicy {
            offload,
            admission: SsdAdmission::default(),
        }
    }
}

impl std::str::FromStr for BenchPolicy {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        let (policy, admission) = match s.split_once('/') {
            Some((p, a)) => (p, a.parse().map_err(anyhow::Error::msg)?),
            None => (s, SsdAdmission::default()),
        };
        let offload: OffloadPolicy = policy.parse().map_err(anyhow::Error::msg)?;
        anyhow::ensure!(
            offload == OffloadPolicy::OnEvict || admission == SsdAdmission::default(),
            "policy {s:?}: only on-evict takes an SSD admission (on-evict/auto or on-evict/all)"
        );
        Ok(BenchPolicy { offload, admission })
    }
}

impl std::fmt::Display for BenchPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.offload)?;
        if self.admission != SsdAdmission::default() {
            write!(f, "/{}", self.admission)?;
        }
        Ok(())
    }
}

pub fn parse_policies(list: &[String]) -> anyhow::Result<Vec<BenchPolicy>> {
    list.iter().map(|p| p.parse()).collect()
}
