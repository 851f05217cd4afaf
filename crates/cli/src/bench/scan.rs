//! `strata bench scan`: a working set 3x the SSD and 10x the DRAM, read as a
//! repeated sequential scan (long shared documents) and with a Zipf(0.9)
//! skew, per admission policy; a miss is recomputed and put, as an engine
//! does. Also SSD read throughput through the agent against a raw
//! sequential read of the same bucket files, in the same run.

use super::report::{Report, Row};
use super::tiering::{parse_policies, progress, put_blocks, BenchPolicy, Tally, Tiers};
use crate::{Client, PutOptions, Tier};
use anyhow::Context;
use std::time::{Duration, Instant};
use strata_common::units::{format_size, ByteSize};
use strata_proto as pb;

#[derive(Debug, clap::Args)]
pub struct ScanArgs {
    /// Objects in the working set (DRAM holds a tenth, SSD a third)
    #[arg(long, default_value_t = 3000)]
    pub working_set: u64,
    /// Size of each object
    #[arg(long, default_value = "64KiB")]
    pub object_bytes: ByteSize,
    /// Passes over the working set (the first warms up and is not counted)
    #[arg(long, default_value_t = 4)]
    pub passes: u64,
    /// Zipf skew of the second workload
    #[arg(long, default_value_t = 0.9)]
    pub zipf: f64,
    /// Admission policies to compare (on-evict/all: every DRAM victim to SSD)
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "eager,on-evict,on-evict/all,reads:1,reads:2"
    )]
    pub policies: Vec<String>,
    /// Objects of the SSD read-throughput phase (0 skips it)
    #[arg(long, default_value_t = 256)]
    pub read_objects: u64,
    /// Object size of the SSD read-throughput phase
    #[arg(long, default_value = "1MiB")]
    pub read_bytes: ByteSize,
    /// Directory of the SSD agents (put it on the disk to measure)
    #[arg(long)]
    pub ssd_dir: Option<std::path::PathBuf>,
    #[arg(long)]
    pub json: bool,
}

/// Zipf sampler over `0..n` by inverse CDF.
struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    fn new(n: u64, s: f64) -> Zipf {
        let mut cdf = Vec::with_capacity(n as usize);
        let mut acc = 0.0;
        for i in 0..n {
            acc += 1.0 / ((i + 1) as f64).powf(s);
            cdf.push(acc);
        }
        for v in &mut cdf {
            *v /= acc;
        }
        Zipf { cdf }
    }
    fn sample(&self, u: f64) -> u64 {
        self.cdf.partition_point(|&c| c < u) as u64
    }
}

/// Runs `accesses` (object indices) against a fresh cluster of `policy`:
/// each batch is read, and the misses are put. Accesses before `warm` are
/// not counted.
async fn drive(
    tiers: &Tiers,
    policy: BenchPolicy,
    name: &str,
    accesses: &[u64],
    warm: usize,
    quiet: bool,
) -> anyhow::Result<(Tally, Duration)> {
    let c = tiers.start(policy).await?;
    let client = Client::connect(c.client_config()).await?;
    let data = vec![0x6bu8; tiers.block as usize];
    let pb = progress(name, accesses.len() as u64, quiet);
    let mut t = Tally::default();
    let t0 = Instant::now();
    let mut counted_from = None;
    for (bi, batch) in accesses.chunks(16).enumerate() {
        if counted_from.is_none() && bi * 16 >= warm {
            counted_from = Some(Instant::now());
            t = Tally::default();
        }
        let keys: Vec<String> = batch.iter().map(|i| format!("ws/{i}")).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let mut missed = Vec::new();
        for (k, r) in keys.iter().zip(client.batch_get_tiered(&refs).await?) {
            match r {
                Ok((_, Tier::Memory)) => t.dram += 1,
                Ok((_, Tier::Ssd)) => t.ssd += 1,
                Err(_) => {
                    t.miss += 1;
                    if !missed.contains(k) {
                        missed.push(k.clone());
                    }
                }
            }
        }
        put_blocks(&client, &missed, &data).await?;
        pb.inc(batch.len() as u64);
    }
    pb.finish_and_clear();
    let el = counted_from.unwrap_or(t0).elapsed();
    c.shutdown().await;
    Ok((t, el))
}

fn tally_row(scenario: &str, size: u64, t: &Tally, el: Duration, note: String) -> Row {
    let secs = el.as_secs_f64().max(1e-9);
    Row {
        scenario: scenario.into(),
        size,
        conns: 1,
        ops: t.total(),
        ops_per_sec: t.total() as f64 / secs,
        gb_per_sec: ((t.dram + t.ssd) * size) as f64 / secs / 1e9,
        p50_ms: 0.0,
        p99_ms: 0.0,
        note,
        cpu_us_per_op: None,
    }
}

pub async fn run(args: ScanArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.working_set >= 30, "--working-set must be at least 30");
    anyhow::ensure!(
        args.passes >= 2,
        "--passes must be at least 2 (one warms up)"
    );
    anyhow::ensure!(args.zipf > 0.0, "--zipf must be positive");
    let policies = parse_policies(&args.policies)?;
    let w = args.working_set;
    let tiers = Tiers {
        dram_blocks: w / 10,
        ssd_blocks: w / 3,
        block: args.object_bytes.0,
        ssd_dir: args.ssd_dir.clone(),
        promote: false,
    };
    let oracle = tiers.ssd_blocks as f64 / w as f64;
    let scan: Vec<u64> = (0..args.passes).flat_map(|_| 0..w).collect();
    let z = Zipf::new(w, args.zipf);
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let zipf: Vec<u64> = (0..args.passes * w)
        .map(|_| z.sample(rand::Rng::gen::<f64>(&mut rng)))
        .collect();
    let mut report = Report::default();
    report.notes.push(format!(
        "working set {w} objects of {}: DRAM {} objects, SSD {} objects; oracle scan hit rate (a fixed subset pinned on SSD) {:.1}%",
        format_size(args.object_bytes.0),
        tiers.dram_blocks,
        tiers.ssd_blocks,
        oracle * 100.0
    ));
    let mut zipf_hits = Vec::new();
    for p in &policies {
        let (t, el) = drive(
            &tiers,
            *p,
            &format!("scan {p}"),
            &scan,
            w as usize,
            args.json,
        )
        .await?;
        let note = format!(
            "{}; SSD {:.2}x oracle",
            t.breakdown(),
            t.rate(t.ssd) / oracle
        );
        report.rows.push(tally_row(
            &format!("scan {p}"),
            args.object_bytes.0,
            &t,
            el,
            note,
        ));
        let (t, el) = drive(
            &tiers,
            *p,
            &format!("zipf {p}"),
            &zipf,
            w as usize,
            args.json,
        )
        .await?;
        let note = format!("{}; hit {:.1}%", t.breakdown(), t.hit_rate() * 100.0);
        zipf_hits.push((p.to_string(), t.hit_rate()));
        report.rows.push(tally_row(
            &format!("zipf {p}"),
            args.object_bytes.0,
            &t,
            el,
            note,
        ));
    }
    if let Some((_, eager)) = zipf_hits.iter().find(|(p, _)| p == "eager") {
        for (p, h) in &zipf_hits {
            report.notes.push(format!(
                "zipf {p}: {:.2}x the hit rate of eager",
                h / eager.max(1e-9)
            ));
        }
    }
    if args.read_objects > 0 {
        ssd_read_throughput(&args, &mut report).await?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report.to_json())?);
    } else {
        report.print();
    }
    Ok(())
}

/// Reads SSD-only objects through the agent, then the same bucket files
/// with plain sequential reads; both from the same (warm) files.
async fn ssd_read_throughput(args: &ScanArgs, report: &mut Report) -> anyhow::Result<()> {
    let size = args.read_bytes.0;
    let n = args.read_objects;
    let tiers = Tiers {
        dram_blocks: n + 16,
        ssd_blocks: n + 16,
        block: size,
        ssd_dir: args.ssd_dir.clone(),
        promote: false,
    };
    let c = tiers
        .start(BenchPolicy::of(strata_master::config::OffloadPolicy::Eager))
        .await?;
    let client = Client::connect(c.client_config()).await?;
    let keys: Vec<String> = (0..n).map(|i| format!("rd/{i}")).collect();
    let data = vec![0x2du8; size as usize];
    for k in &keys {
        client.put(k, &data, &PutOptions::default()).await?;
    }
    let t0 = Instant::now();
    while c.master.queue_counts() != (0, 0) || c.master.total_pins() > 0 {
        anyhow::ensure!(
            t0.elapsed() < Duration::from_secs(300),
            "offload did not finish"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await; // read leases end
    for chunk in keys.chunks(256) {
        let r = client
            .master_client()
            .evict_memory(pb::EvictMemoryRequest {
                keys: chunk.to_vec(),
            })
            .await?
            .into_inner();
        anyhow::ensure!(r.results.iter().all(|s| s.code == 0), "evict_memory failed");
    }
    // Both reads start from the disk, not the page cache: the bucket files
    // are synced, so dropping their cached pages loses nothing.
    let dir = c.ssd_dir.join("buckets");
    let cold = drop_cached_pages(&dir)?;
    let pb = progress("ssd read via agent", n, args.json);
    let t0 = Instant::now();
    for chunk in keys.chunks(16) {
        let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
        for r in client.batch_get_tiered(&refs).await? {
            let (v, tier) = r?;
            anyhow::ensure!(
                tier == Tier::Ssd && v.len() as u64 == size,
                "not an SSD read"
            );
        }
        pb.inc(chunk.len() as u64);
    }
    let via = t0.elapsed();
    pb.finish_and_clear();
    drop_cached_pages(&dir)?;
    let raw = tokio::task::spawn_blocking(move || -> anyhow::Result<(Duration, u64)> {
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .with_context(|| format!("listing {}", dir.display()))?
            .flatten()
            .map(|e| e.path())
            .collect();
        files.sort();
        let t0 = Instant::now();
        let mut bytes = 0;
        for f in files {
            bytes += std::fs::read(&f)?.len() as u64;
        }
        Ok((t0.elapsed(), bytes))
    })
    .await??;
    c.shutdown().await;
    let via_gbs = (n * size) as f64 / via.as_secs_f64().max(1e-9) / 1e9;
    let raw_gbs = raw.1 as f64 / raw.0.as_secs_f64().max(1e-9) / 1e9;
    let mk = |scenario: &str, el: Duration, gbs: f64, note: String| Row {
        scenario: scenario.into(),
        size,
        conns: 1,
        ops: n,
        ops_per_sec: n as f64 / el.as_secs_f64().max(1e-9),
        gb_per_sec: gbs,
        p50_ms: 0.0,
        p99_ms: 0.0,
        note,
        cpu_us_per_op: None,
    };
    report.rows.push(mk(
        "raw sequential read",
        raw.0,
        raw_gbs,
        format!(
            "the same bucket files, {}{}",
            format_size(raw.1),
            if cold {
                ", page cache dropped"
            } else {
                ", page cache warm"
            }
        ),
    ));
    report.rows.push(mk(
        "ssd read via agent",
        via,
        via_gbs,
        format!(
            "{:.2}x raw sequential read; batches of 16",
            via_gbs / raw_gbs.max(1e-9)
        ),
    ));
    Ok(())
}

use rand::SeedableRng;

/// Asks the kernel to drop the cached pages of every file in `dir`, so the
/// next read comes from the disk. False if it could not (reads are warm).
fn drop_cached_pages(dir: &std::path::Path) -> anyhow::Result<bool> {
    use std::os::fd::AsRawFd;
    let mut all = true;
    for e in std::fs::read_dir(dir)?.flatten() {
        let f = std::fs::File::open(e.path())?;
        // SAFETY: a valid open file descriptor; fadvise only drops clean
        // cached pages (the files were fsynced by the agent).
        let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        all &= rc == 0;
    }
    Ok(all)
}
