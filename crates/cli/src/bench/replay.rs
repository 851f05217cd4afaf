//! `strata bench replay --trace FILE`: drives a cluster as an inference
//! engine with prefix caching would. For each request of the trace, its
//! blocks are looked up in order until the first miss; the blocks from the
//! miss on are computed and put (full blocks only: a partial last block is
//! not cached, as in vLLM). Block hit rates from DRAM and SSD are printed per
//! admission policy against the infinite-cache hit rate of the same trace,
//! computed in the same run.

use super::report::{Report, Row};
use super::tiering::{
    offload_outcomes, parse_policies, prefix_lookup, progress, put_blocks, Tally, Tiers,
};
use crate::Client;
use anyhow::Context;
use std::collections::HashSet;
use std::io::BufRead;
use std::time::{Duration, Instant};
use strata_common::units::{format_size, ByteSize};

/// Tokens per block of the trace's hash ids.
const TRACE_BLOCK_TOKENS: u64 = 512;

#[derive(Debug, clap::Args)]
pub struct ReplayArgs {
    /// JSONL trace: {"timestamp", "input_length", "output_length", "hash_ids"} per line
    #[arg(long)]
    pub trace: std::path::PathBuf,
    /// Bytes of one KV block object
    #[arg(long, default_value = "64KiB")]
    pub block_bytes: ByteSize,
    /// Blocks DRAM holds (3M tokens of 512-token blocks)
    #[arg(long, default_value_t = 5859)]
    pub dram_blocks: u64,
    /// Blocks the SSD tier holds
    #[arg(long, default_value_t = 17577)]
    pub ssd_blocks: u64,
    /// Admission policies to compare (on-evict/all: every DRAM victim to SSD)
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "eager,on-evict,on-evict/all,reads:1"
    )]
    pub policies: Vec<String>,
    /// Replay N times faster than the trace's timestamps (0 = as fast as
    /// possible, which outruns offload on a slow disk and turns victims into
    /// drops)
    #[arg(long, default_value_t = 30.0)]
    pub speedup: f64,
    /// Replay only the first N requests (0 = all)
    #[arg(long, default_value_t = 0)]
    pub requests: usize,
    /// Copy SSD hits back into DRAM (--promote-on-hit)
    #[arg(long)]
    pub promote: bool,
    /// Directory of the SSD agent (put it on the disk to measure)
    #[arg(long)]
    pub ssd_dir: Option<std::path::PathBuf>,
    #[arg(long)]
    pub json: bool,
}

struct Request {
    /// Milliseconds since the start of the trace.
    at_ms: u64,
    blocks: Vec<u64>,
    /// The last block holds fewer than 512 tokens.
    partial_tail: bool,
}

fn load(path: &std::path::Path, limit: usize) -> anyhow::Result<Vec<Request>> {
    let f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut out = Vec::new();
    for (n, line) in std::io::BufReader::new(f).lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(&line)
            .with_context(|| format!("{}:{}: not JSON", path.display(), n + 1))?;
        let blocks: Vec<u64> = v["hash_ids"]
            .as_array()
            .with_context(|| format!("{}:{}: no hash_ids array", path.display(), n + 1))?
            .iter()
            .map(|h| h.as_u64())
            .collect::<Option<_>>()
            .with_context(|| format!("{}:{}: hash_ids must be integers", path.display(), n + 1))?;
        let tokens = v["input_length"].as_u64().unwrap_or(0);
        out.push(Request {
            at_ms: v["timestamp"].as_u64().unwrap_or(0),
            blocks,
            partial_tail: !tokens.is_multiple_of(TRACE_BLOCK_TOKENS),
        });
        if limit > 0 && out.len() >= limit {
            break;
        }
    }
    anyhow::ensure!(!out.is_empty(), "{} holds no requests", path.display());
    Ok(out)
}

/// Hit rate of a cache that never forgets (every block cacheable), with the
/// same prefix semantics.
fn infinite_hit_rate(reqs: &[Request]) -> (f64, u64) {
    let mut seen = HashSet::new();
    let (mut hits, mut total) = (0u64, 0u64);
    for r in reqs {
        let prefix = r.blocks.iter().take_while(|b| seen.contains(*b)).count();
        hits += prefix as u64;
        total += r.blocks.len() as u64;
        seen.extend(r.blocks.iter().copied());
    }
    (hits as f64 / total.max(1) as f64, total)
}

pub async fn run(args: ReplayArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.block_bytes.0 > 0, "--block-bytes must be positive");
    anyhow::ensure!(args.dram_blocks > 0, "--dram-blocks must be positive");
    anyhow::ensure!(
        args.speedup >= 0.0 && args.speedup.is_finite(),
        "--speedup must be 0 (as fast as possible) or positive"
    );
    let policies = parse_policies(&args.policies)?;
    let reqs = load(&args.trace, args.requests)?;
    let (infinite, lookups) = infinite_hit_rate(&reqs);
    let tiers = Tiers {
        dram_blocks: args.dram_blocks,
        ssd_blocks: args.ssd_blocks,
        block: args.block_bytes.0,
        ssd_dir: args.ssd_dir.clone(),
        promote: args.promote,
    };
    let mut report = Report::default();
    report.notes.push(format!(
        "{} requests, {lookups} block lookups; infinite cache hits {:.1}% of blocks; DRAM {} blocks, SSD {} blocks of {}; {}",
        reqs.len(),
        infinite * 100.0,
        args.dram_blocks,
        args.ssd_blocks,
        format_size(args.block_bytes.0),
        if args.speedup > 0.0 {
            format!("paced at {}x the trace's timestamps", args.speedup)
        } else {
            "as fast as possible".to_string()
        }
    ));
    let data = vec![0x4bu8; args.block_bytes.0 as usize];
    for p in policies {
        let c = tiers.start(p).await?;
        let client = Client::connect(c.client_config()).await?;
        let pb = progress(&format!("replay {p}"), reqs.len() as u64, args.json);
        let mut t = Tally::default();
        let t0 = Instant::now();
        let start_ms = reqs[0].at_ms;
        for (i, r) in reqs.iter().enumerate() {
            if args.speedup > 0.0 {
                let due = Duration::from_secs_f64(
                    r.at_ms.saturating_sub(start_ms) as f64 / 1000.0 / args.speedup,
                );
                if let Some(wait) = due.checked_sub(t0.elapsed()) {
                    tokio::time::sleep(wait).await;
                }
            }
            let keys: Vec<String> = r.blocks.iter().map(|b| format!("blk/{b}")).collect();
            let hits = prefix_lookup(&client, &keys, &mut t).await?;
            let end = keys.len() - usize::from(r.partial_tail);
            if hits < end {
                put_blocks(&client, &keys[hits..end], &data).await?;
            }
            pb.inc(1);
            if i % 200 == 0 {
                pb.set_message(format!("hit {:.1}%", t.hit_rate() * 100.0));
            }
        }
        pb.finish_and_clear();
        let el = t0.elapsed();
        let (persisted, lost, dropped) = offload_outcomes(&c);
        let (evicted, kept) = c.agents.first().map_or((0, 0), |a| {
            (a.eviction.buckets.get(), a.eviction.kept_objects.get())
        });
        let refused = c.master.metrics.admission.refused();
        let mm = &c.master.metrics;
        let (waits, wait_p50, wait_p99) = (
            mm.put_waits.get(),
            mm.put_wait_quantile(0.5) * 1e3,
            mm.put_wait_quantile(0.99) * 1e3,
        );
        let (drops, timeouts) = (mm.dropped(), mm.put_wait_timeouts.get());
        c.shutdown().await;
        let secs = el.as_secs_f64().max(1e-9);
        report.rows.push(Row {
            scenario: format!("replay {p}"),
            size: args.block_bytes.0,
            conns: 1,
            ops: t.total(),
            ops_per_sec: t.total() as f64 / secs,
            gb_per_sec: ((t.dram + t.ssd) * args.block_bytes.0) as f64 / secs / 1e9,
            // Of the puts that waited for DRAM (SSD copies landing).
            p50_ms: wait_p50,
            p99_ms: wait_p99,
            note: format!(
                "{}; {:.2}x infinite; offloads {persisted}, lost before copy {lost}, offload failed {dropped}, refused by admission {refused}, objects dropped {drops}; {waits} puts waited (p50/p99 columns), {timeouts} ran out of --put-wait; SSD evicted {evicted} buckets, kept {kept} objects",
                t.breakdown(),
                t.hit_rate() / infinite.max(1e-9)
            ),
            cpu_us_per_op: None,
        });
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report.to_json())?);
    } else {
        report.print();
    }
    Ok(())
}
