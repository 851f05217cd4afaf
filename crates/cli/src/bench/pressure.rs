//! `strata bench pressure`: what a put costs when DRAM is full of objects
//! that only exist there. The put waits for the oldest victim's copy to SSD
//! (urgent, long-polled by the agent) instead of the cache dropping it; the
//! difference to a put with room is the copy latency a writer sees.

use super::report::{Report, Row};
use crate::local::ClusterBuilder;
use crate::{Client, PutOptions};
use anyhow::Context;
use std::time::{Duration, Instant};
use strata_common::units::{format_size, ByteSize};
use strata_master::config::{OffloadPolicy, SsdAdmission};

/// Objects DRAM holds in this scenario.
const DRAM_OBJECTS: u64 = 8;

#[derive(Debug, clap::Args)]
pub struct PressureArgs {
    /// Object sizes to measure
    #[arg(long, value_delimiter = ',', default_value = "1MiB,16MiB")]
    pub sizes: Vec<ByteSize>,
    /// Puts per size that need a victim copied first
    #[arg(long, default_value_t = 24)]
    pub rounds: u64,
    /// Directory of the SSD agent (put it on the disk to measure)
    #[arg(long)]
    pub ssd_dir: Option<std::path::PathBuf>,
    #[arg(long)]
    pub json: bool,
}

fn row(scenario: &str, size: u64, lat: &mut [Duration], elapsed: Duration, note: String) -> Row {
    lat.sort_unstable();
    let pct = |p: f64| {
        lat.get(((lat.len().max(1) - 1) as f64 * p) as usize)
            .map_or(0.0, |d| d.as_secs_f64() * 1e3)
    };
    let secs = elapsed.as_secs_f64().max(1e-9);
    Row {
        scenario: scenario.to_string(),
        size,
        conns: 1,
        ops: lat.len() as u64,
        ops_per_sec: lat.len() as f64 / secs,
        gb_per_sec: (lat.len() as u64 * size) as f64 / secs / 1e9,
        p50_ms: pct(0.5),
        p99_ms: pct(0.99),
        note,
        cpu_us_per_op: None,
    }
}

pub async fn run(args: PressureArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.rounds >= 1, "--rounds must be at least 1");
    let mut report = Report::default();
    for size in args.sizes.iter().map(|s| s.0) {
        anyhow::ensure!(size > 0, "sizes must be positive");
        let aligned = size.div_ceil(64) * 64;
        let ssd = (args.rounds + DRAM_OBJECTS + 4) * (size + 4096) + (64 << 20);
        let mut b = ClusterBuilder::new()
            .store_nodes(1)
            .node_capacity(DRAM_OBJECTS * aligned)
            .ssd_agents(1)
            .ssd_capacity(ssd)
            .ssd(move |a| a.bucket_bytes = (4 * size).max(16 << 20))
            .master(|m| {
                // Nothing leaves DRAM before a put needs the room.
                m.offload_policy = OffloadPolicy::OnEvict;
                m.ssd_admission = SsdAdmission::All;
                m.high_watermark = 1.0;
                m.eviction_ratio = 0.01;
            })
            .prefault(false);
        let dir = super::tiering::fresh_ssd_dir(args.ssd_dir.as_deref())?;
        if let Some(d) = &dir {
            b = b.ssd_dir(d.path());
        }
        let c = b.build().await.context("cannot start the cluster")?;
        let client = Client::connect(c.client_config()).await?;
        let data = vec![0x5au8; size as usize];
        let put = |i: u64| {
            let (client, data) = (&client, &data);
            async move {
                let t = Instant::now();
                client
                    .put(&format!("p/{i}"), data, &PutOptions::default())
                    .await
                    .map(|_| t.elapsed())
            }
        };
        // With room: DRAM fills.
        let (mut room, t0) = (Vec::new(), Instant::now());
        for i in 0..DRAM_OBJECTS {
            room.push(put(i).await?);
        }
        let room_el = t0.elapsed();
        // Full: each put waits for a victim's copy to land.
        let (mut full, t0) = (Vec::new(), Instant::now());
        for i in DRAM_OBJECTS..DRAM_OBJECTS + args.rounds {
            full.push(put(i).await?);
        }
        let full_el = t0.elapsed();
        let m = &c.master.metrics;
        let note = format!(
            "copy latency a put waited for: p50 {:.2} ms, p99 {:.2} ms ({} of {} puts waited; the others found a victim copied for an earlier one); urgent offloads {}, objects dropped {}",
            m.put_wait_quantile(0.5) * 1e3,
            m.put_wait_quantile(0.99) * 1e3,
            m.put_waits.get(),
            args.rounds,
            m.urgent_offloads.get(),
            m.dropped(),
        );
        report.rows.push(row(
            "put, DRAM has room",
            size,
            &mut room,
            room_el,
            String::new(),
        ));
        report
            .rows
            .push(row("put, DRAM full", size, &mut full, full_el, note));
        c.shutdown().await;
        drop(dir);
    }
    report.notes.push(format!(
        "DRAM holds {DRAM_OBJECTS} objects; on-evict, admission all; sizes {}",
        args.sizes
            .iter()
            .map(|s| format_size(s.0))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report.to_json())?);
    } else {
        report.print();
    }
    Ok(())
}
