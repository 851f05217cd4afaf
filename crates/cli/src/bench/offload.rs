//! SSD offload throughput against the raw sequential write speed of the same
//! directory, measured in the same run.

use super::report::{Report, Row};
use super::{drive, BenchArgs, Phase};
use crate::local::LocalCluster;
use crate::{Client, PutOptions};
use anyhow::Context;
use std::io::Write;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use strata_common::units::format_size;

/// Writes `total` bytes in 1 MiB writes to a new file in `dir` and fsyncs it.
fn raw_write(dir: &std::path::Path, total: u64) -> anyhow::Result<Duration> {
    let path = dir.join(format!("raw-write-baseline-{}.tmp", std::process::id()));
    let buf = vec![0x3cu8; 1 << 20];
    let t0 = Instant::now();
    let mut f =
        std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    let mut left = total;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        f.write_all(&buf[..n])?;
        left -= n as u64;
    }
    f.sync_all()?;
    let el = t0.elapsed();
    drop(f);
    let _ = std::fs::remove_file(&path);
    Ok(el)
}

fn row(scenario: &str, size: u64, objects: u64, bytes: u64, el: Duration, note: String) -> Row {
    let secs = el.as_secs_f64().max(1e-9);
    Row {
        scenario: scenario.into(),
        size,
        conns: 1,
        ops: objects,
        ops_per_sec: objects as f64 / secs,
        gb_per_sec: bytes as f64 / secs / 1e9,
        p50_ms: 0.0,
        p99_ms: 0.0,
        note,
        cpu_us_per_op: None,
    }
}

pub async fn run(
    c: &mut LocalCluster,
    client: &Client,
    args: &BenchArgs,
    run_id: &str,
    report: &mut Report,
) -> anyhow::Result<()> {
    // The agent joins only now, so the DRAM phases ran without offload.
    if c.agents.is_empty() {
        c.add_agent("bench/ssd-0")
            .await
            .context("cannot start the benchmark's SSD agent")?;
    }
    let dir = c.ssd_dir.join("buckets");
    std::fs::create_dir_all(&dir)?;
    for size in args.offload_sizes.iter().map(|s| s.0) {
        let n = (args.offload_bytes.0 / size.max(1)).max(1);
        let total = n * size;
        let raw = tokio::task::spawn_blocking({
            let dir = dir.clone();
            move || raw_write(&dir, total)
        })
        .await??;
        report.rows.push(row(
            "raw write+fsync",
            size,
            1,
            total,
            raw,
            format!("same directory, {}", format_size(total)),
        ));

        // Queue everything first (agent paused), then time the offload alone:
        // copy from DRAM, bucket write, fsync, index, report.
        let before = c.master.describe_offload(false)["persisted"]
            .as_u64()
            .unwrap_or(0);
        let pause = &c.agents[0].faults.pause_offload;
        pause.store(true, Ordering::Relaxed);
        let data = vec![0x77u8; size as usize];
        let keys: Vec<String> = (0..n)
            .map(|i| format!("offload/{run_id}/{size}/{i}"))
            .collect();
        for chunk in keys.chunks(64) {
            let items: Vec<(&str, &[u8])> = chunk
                .iter()
                .map(|k| (k.as_str(), data.as_slice()))
                .collect();
            for r in client.batch_put(&items, &PutOptions::default()).await? {
                r?;
            }
        }
        let t0 = Instant::now();
        pause.store(false, Ordering::Relaxed);
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            let persisted = c.master.describe_offload(false)["persisted"]
                .as_u64()
                .unwrap_or(0)
                - before;
            if persisted >= n {
                break;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "offload did not finish within 10 minutes ({persisted} of {n})"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let el = t0.elapsed();
        let ratio = raw.as_secs_f64() / el.as_secs_f64();
        report.rows.push(row(
            "strata offload",
            size,
            n,
            total,
            el,
            format!("{ratio:.2}x raw write; DRAM copy + bucket write + fsync + index"),
        ));
        ssd_reads(c, client, args, &keys, size, report).await?;
        client.remove_all(true).await?;
    }
    Ok(())
}

/// Reads of the objects just offloaded once their DRAM copies are gone:
/// through the agent's TCP data plane, and (with a UCX cluster) through its
/// lent staging by an rdma client, one client each, same objects.
async fn ssd_reads(
    c: &LocalCluster,
    client: &Client,
    args: &BenchArgs,
    keys: &[String],
    size: u64,
    report: &mut Report,
) -> anyhow::Result<()> {
    for chunk in keys.chunks(1024) {
        let r = client
            .master_client()
            .evict_memory(strata_proto::EvictMemoryRequest {
                keys: chunk.to_vec(),
            })
            .await?
            .into_inner();
        for s in r.results {
            anyhow::ensure!(
                s.code == 0,
                "cannot evict for the SSD read phase: {}",
                s.message
            );
        }
    }
    let mut readers = vec![("strata get ssd", client.clone())];
    if c.transport() == crate::TransportKind::Ucx {
        let rdma = Client::connect(c.rdma_client_config()).await?;
        readers.push(("strata get ssd (ucx, lent staging)", rdma));
    }
    for (name, reader) in readers {
        let phase = Phase::new(
            &format!("{name} {}", format_size(size)),
            keys.len() as u64,
            args.json,
        );
        let el = drive(&phase, 1, |_, ph| {
            let (reader, keys) = (reader.clone(), keys.to_vec());
            let mut buf = vec![0u8; size as usize];
            async move {
                while let Some(i) = ph.take() {
                    let t0 = Instant::now();
                    reader.get_into(&keys[i as usize], &mut buf).await?;
                    ph.record(t0);
                }
                Ok(())
            }
        })
        .await?;
        let mut r = phase.finish(name, size, 1, size, el);
        r.note = "DRAM copies evicted: each read is staged from the bucket file".into();
        report.rows.push(r);
    }
    Ok(())
}
