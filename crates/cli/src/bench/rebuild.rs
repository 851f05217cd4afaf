//! `strata bench rebuild`: how long a new master takes to rebuild its
//! metadata from what one store node reports, and what the metadata costs in
//! memory per object, for growing numbers of objects. The reports go
//! through the protobuf encoding the wire uses (batches of 4096, as nodes
//! send them) into the same `adopt_node_objects` a master runs; the baseline
//! in the same run is the cost of building the batches alone.

use prost::Message;
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_master::durable::MemKv;
use strata_master::{Master, MasterConfig};
use strata_proto as pb;

#[derive(Debug, clap::Args)]
pub struct RebuildArgs {
    /// Numbers of objects to rebuild, comma-separated
    #[arg(long, value_delimiter = ',', default_value = "100000,1000000")]
    pub keys: Vec<u64>,
}

/// Objects per report (what a store node sends at once).
const BATCH: u64 = 4096;
/// Each object's size: 4 KiB, as small KV blocks are.
const OBJECT: u64 = 4096;
const PROOF: &[u8] = &[7u8; 32];

/// Resident memory of this process (Linux `/proc/self/statm`).
fn rss_bytes() -> u64 {
    let page = 4096;
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |p| p * page)
}

fn batch(start: u64, n: u64) -> Vec<pb::NodeObject> {
    (start..start + n)
        .map(|i| pb::NodeObject {
            // Engine-like keys: a model and a prefix hash.
            key: format!("llama-70b/{i:016x}/kv"),
            local_segment: 0,
            offset: i * OBJECT,
            length: OBJECT,
            crc32c: i as u32,
            generation: i + 1,
            ..Default::default()
        })
        .collect()
}

struct Measured {
    elapsed: Duration,
    encode_only: Duration,
    rss_per_object: f64,
}

async fn one(keys: u64) -> anyhow::Result<Measured> {
    let mut cfg = MasterConfig::local();
    cfg.node_ttl = Duration::from_secs(3600);
    let kv = Arc::new(MemKv::new());
    // The first term writes the grant key; the second is a "restarted"
    // master that asks its node for its objects.
    drop(Master::for_term(cfg.clone(), kv.clone(), Default::default(), 1).await?);
    let before = rss_bytes();
    let m = Master::for_term(cfg, kv, Default::default(), 2).await?;
    let reg = m.register_node(pb::RegisterNodeRequest {
        node_id: "n0".into(),
        data_addr: "127.0.0.1:1".into(),
        segments: vec![pb::SegmentSpec {
            local_id: 0,
            size: keys * OBJECT,
            ..Default::default()
        }],
        instance: "bench".into(),
        instance_proof: PROOF.to_vec(),
        held_objects: keys,
        ..Default::default()
    })?;
    anyhow::ensure!(reg.report_objects, "the master did not ask for a report");
    let (mut elapsed, mut encode_only) = (Duration::ZERO, Duration::ZERO);
    let (mut start, mut applied) = (0, 0);
    while start < keys {
        let n = BATCH.min(keys - start);
        // Signed as the node got them, in its object log (not timed).
        let objects = batch(start, n)
            .into_iter()
            .map(|o| m.signed("n0", o))
            .collect();
        let t0 = Instant::now();
        let req = pb::ReportNodeObjectsRequest {
            node_id: "n0".into(),
            incarnation: reg.incarnation,
            instance_proof: PROOF.to_vec(),
            objects,
            last: start + n == keys,
        };
        let wire = req.encode_to_vec();
        encode_only += t0.elapsed();
        let t1 = Instant::now();
        let req = pb::ReportNodeObjectsRequest::decode(wire.as_slice())?;
        let m2 = m.clone();
        let r = tokio::task::spawn_blocking(move || m2.adopt_node_objects(&req)).await??;
        elapsed += t1.elapsed();
        anyhow::ensure!(r.refused == 0, "{} objects refused", r.refused);
        start += n;
        // The node takes the re-sent commits with its next heartbeat (it
        // long-polls), which trims them from the master's log.
        let page = m.heartbeat(&pb::HeartbeatRequest {
            node_id: "n0".into(),
            incarnation: reg.incarnation,
            applied_seq: applied,
            instance_proof: PROOF.to_vec(),
            wait_ms: 0,
            leaving: false,
        })?;
        applied = page.log.last().map_or(applied, |e| e.seq);
    }
    anyhow::ensure!(m.accepting_writes(), "the master still waits for its node");
    let after = rss_bytes();
    let st = m.stat();
    anyhow::ensure!(st.keys == keys, "{} keys rebuilt of {keys}", st.keys);
    Ok(Measured {
        elapsed,
        encode_only,
        rss_per_object: after.saturating_sub(before) as f64 / keys as f64,
    })
}

pub async fn run(args: RebuildArgs) -> anyhow::Result<()> {
    anyhow::ensure!(!args.keys.is_empty(), "--keys needs at least one number");
    println!(
        "{:>10}  {:>10}  {:>12}  {:>14}  {:>16}",
        "objects", "rebuild s", "objects/s", "batches only s", "master B/object"
    );
    for &keys in &args.keys {
        anyhow::ensure!(
            (1..=100_000_000).contains(&keys),
            "--keys must be 1 to 100,000,000"
        );
        let r = one(keys).await?;
        println!(
            "{:>10}  {:>10.2}  {:>12.0}  {:>14.2}  {:>16.0}",
            keys,
            r.elapsed.as_secs_f64(),
            keys as f64 / r.elapsed.as_secs_f64().max(1e-9),
            r.encode_only.as_secs_f64(),
            r.rss_per_object
        );
    }
    println!(
        "rebuild: decode + adopt of the node's reports (batches of {BATCH}); batches only: building and encoding them (the node's side, the baseline); B/object: master RSS growth / objects"
    );
    Ok(())
}
