//! `strata put|get|rm|ls|stat`.

use super::Conn;
use crate::{Client, PutOptions};
use anyhow::Context;
use std::io::{Read, Write};
use std::path::PathBuf;
use strata_common::time::unix_ms;
use strata_common::units::format_size;
use strata_proto as pb;

async fn client(conn: &Conn) -> anyhow::Result<Client> {
    Ok(Client::connect(conn.config()?).await?)
}

#[derive(Debug, clap::Args)]
pub struct PutArgs {
    pub key: String,
    /// File to store; `-` or nothing reads stdin
    pub file: Option<PathBuf>,
    /// Copies on distinct segments (best effort)
    #[arg(long, default_value_t = 1)]
    pub replicas: u32,
    /// Never evict this object
    #[arg(long)]
    pub pin: bool,
    /// Replace the key if it exists (atomically: readers get the old bytes
    /// or the new); without it a present key is an error
    #[arg(long)]
    pub overwrite: bool,
}

fn is_stdio(p: &Option<PathBuf>) -> bool {
    p.as_ref().is_none_or(|p| p.as_os_str() == "-")
}

pub async fn put(master: &Conn, a: PutArgs) -> anyhow::Result<()> {
    let data = if is_stdio(&a.file) {
        let mut v = Vec::new();
        std::io::stdin()
            .read_to_end(&mut v)
            .context("reading stdin")?;
        v
    } else {
        let p = a.file.as_ref().expect("checked above");
        tokio::fs::read(p)
            .await
            .with_context(|| format!("cannot read {}", p.display()))?
    };
    anyhow::ensure!(
        !data.is_empty(),
        "refusing to store an empty object (size must be positive)"
    );
    let opts = PutOptions {
        replicas: a.replicas,
        hard_pin: a.pin,
        overwrite: a.overwrite,
        ..Default::default()
    };
    client(master).await?.put(&a.key, &data, &opts).await?;
    eprintln!("stored {:?}: {}", a.key, format_size(data.len() as u64));
    Ok(())
}

#[derive(Debug, clap::Args)]
pub struct GetArgs {
    pub key: String,
    /// Where to write; `-` or nothing writes stdout
    pub file: Option<PathBuf>,
}

pub async fn get(master: &Conn, a: GetArgs) -> anyhow::Result<()> {
    let c = client(master).await?;
    let data = c.get(&a.key).await?;
    // The read is done: its lease ends now, not at the master's TTL.
    c.flush_lease_ends(std::time::Duration::from_secs(2)).await;
    if is_stdio(&a.file) {
        let mut out = std::io::stdout().lock();
        out.write_all(&data)?;
        out.flush()?;
    } else {
        let p = a.file.as_ref().expect("checked above");
        tokio::fs::write(p, &data)
            .await
            .with_context(|| format!("cannot write {}", p.display()))?;
        eprintln!(
            "wrote {} to {}",
            format_size(data.len() as u64),
            p.display()
        );
    }
    Ok(())
}

#[derive(Debug, clap::Args)]
pub struct RmArgs {
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    pub key: Option<String>,
    /// Remove every object (leased ones are skipped unless --force)
    #[arg(long)]
    pub all: bool,
    /// Remove even while readers hold a lease
    #[arg(long)]
    pub force: bool,
}

pub async fn rm(master: &Conn, a: RmArgs) -> anyhow::Result<()> {
    let c = client(master).await?;
    match a.key {
        Some(k) => {
            c.remove(&k, a.force).await?;
            eprintln!("removed {k:?}");
        }
        None => {
            let (removed, skipped) = c.remove_all(a.force).await?;
            eprintln!("removed {removed} objects, skipped {skipped} (leased or being written)");
        }
    }
    Ok(())
}

#[derive(Debug, clap::Args)]
pub struct LsArgs {
    #[arg(long, default_value = "")]
    pub prefix: String,
    /// At most this many keys
    #[arg(long, default_value_t = 1000)]
    pub limit: usize,
    #[arg(long)]
    pub json: bool,
}

pub async fn ls(master: &Conn, a: LsArgs) -> anyhow::Result<()> {
    let objs = client(master).await?.list(&a.prefix, a.limit).await?;
    let mut out = std::io::stdout().lock();
    if a.json {
        let v: Vec<_> = objs
            .iter()
            .map(|o| serde_json::json!({"key": o.key, "size": o.size, "replicas": o.replicas, "complete": o.complete}))
            .collect();
        writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
    } else {
        for o in &objs {
            let st = if o.complete { "" } else { "  (being written)" };
            writeln!(out, "{}\t{}\t{} replica(s){st}", o.key, o.size, o.replicas)?;
        }
    }
    Ok(())
}

#[derive(Debug, clap::Args)]
pub struct StatArgs {
    /// Show one key's replicas instead of the cluster summary
    pub key: Option<String>,
    #[arg(long)]
    pub json: bool,
}

fn kind_name(k: i32) -> &'static str {
    match pb::ReplicaKind::try_from(k) {
        Ok(pb::ReplicaKind::Ssd) => "ssd",
        _ => "memory",
    }
}

pub async fn stat(master: &Conn, a: StatArgs) -> anyhow::Result<()> {
    let c = client(master).await?;
    let mut out = std::io::stdout().lock();
    match a.key {
        Some(k) => {
            let i = c.inspect(&k).await?;
            let state = if i.complete { "complete" } else { "processing" };
            let replicas: Vec<_> = i
                .replicas
                .iter()
                .map(|r| serde_json::json!({"kind": kind_name(r.kind), "node": r.node_id, "segment": r.segment_id, "offset": r.offset, "state": state}))
                .collect();
            if a.json {
                let v = serde_json::json!({
                    "key": i.key, "size": i.size, "crc32c": i.crc32c, "state": state,
                    "replicas": replicas, "lease_until": i.lease_until_unix_ms,
                    "pinned": i.hard_pin, "soft_pinned": i.soft_pin,
                });
                writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
            } else {
                writeln!(out, "key:      {}", i.key)?;
                writeln!(out, "size:     {} ({})", i.size, format_size(i.size))?;
                writeln!(out, "crc32c:   {:08x}", i.crc32c)?;
                writeln!(out, "state:    {state}")?;
                let lease = i.lease_until_unix_ms.saturating_sub(unix_ms());
                writeln!(
                    out,
                    "leased:   {}",
                    if lease > 0 {
                        format!("{lease} ms more")
                    } else {
                        "no".into()
                    }
                )?;
                writeln!(out, "pinned:   {}", i.hard_pin)?;
                writeln!(out, "replicas: {}", i.replicas.len())?;
                for r in &i.replicas {
                    let place = if r.kind == pb::ReplicaKind::Ssd as i32 {
                        let (_, bucket) = strata_common::grant::split_ssd_segment_id(r.segment_id);
                        format!("bucket {bucket:<5}")
                    } else {
                        format!("segment {:<4}", r.segment_id)
                    };
                    let kind = kind_name(r.kind);
                    writeln!(
                        out,
                        "  {kind:<7} {:<22} {place} offset {}",
                        r.node_id, r.offset
                    )?;
                }
            }
        }
        None => {
            let s = c.stat().await?;
            if a.json {
                let v = serde_json::json!({
                    "keys": s.keys, "nodes": s.nodes, "segments": s.segments,
                    "capacity_bytes": s.capacity_bytes, "allocated_bytes": s.allocated_bytes,
                    "evictions": s.evictions,
                    "offload_queued": s.offload_queued, "offload_assigned": s.offload_assigned,
                    "owners": s.owners.iter().map(|o| serde_json::json!({
                        "handle": o.handle, "owner_id": o.owner_id, "bytes": o.used_bytes,
                        "object_bytes": o.used_bytes.saturating_sub(o.overhead_bytes),
                        "overhead_bytes": o.overhead_bytes,
                        "buckets": o.buckets, "capacity": o.capacity_bytes, "live": o.live,
                    })).collect::<Vec<_>>(),
                    "segment_info": s.segment_info.iter().map(|g| serde_json::json!({
                        "segment_id": g.segment_id, "node": g.node_id, "data_addr": g.data_addr,
                        "capacity_bytes": g.capacity_bytes, "allocated_bytes": g.allocated_bytes,
                        "largest_free_bytes": g.largest_free_bytes,
                    })).collect::<Vec<_>>(),
                });
                writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
            } else {
                let pct = if s.capacity_bytes > 0 {
                    100.0 * s.allocated_bytes as f64 / s.capacity_bytes as f64
                } else {
                    0.0
                };
                writeln!(out, "keys:      {}", s.keys)?;
                writeln!(out, "nodes:     {}", s.nodes)?;
                writeln!(out, "segments:  {}", s.segments)?;
                writeln!(out, "capacity:  {}", format_size(s.capacity_bytes))?;
                writeln!(
                    out,
                    "allocated: {} ({pct:.1}%)",
                    format_size(s.allocated_bytes)
                )?;
                writeln!(out, "evictions: {}", s.evictions)?;
                writeln!(
                    out,
                    "offload:   {} queued, {} in flight",
                    s.offload_queued, s.offload_assigned
                )?;
                writeln!(
                    out,
                    "{:<8} {:<22} {:>12} {:>12} {:>14}",
                    "SEGMENT", "NODE", "CAPACITY", "ALLOCATED", "LARGEST FREE"
                )?;
                for g in &s.segment_info {
                    writeln!(
                        out,
                        "{:<8} {:<22} {:>12} {:>12} {:>14}",
                        g.segment_id,
                        g.node_id,
                        format_size(g.capacity_bytes),
                        format_size(g.allocated_bytes),
                        format_size(g.largest_free_bytes)
                    )?;
                }
                if !s.owners.is_empty() {
                    writeln!(
                        out,
                        "{:<24} {:>6} {:>12} {:>12} {:>12} {:>8} {:>12} {:>5}",
                        "SSD OWNER",
                        "ID",
                        "USED",
                        "OBJECTS",
                        "OVERHEAD",
                        "BUCKETS",
                        "CAPACITY",
                        "LIVE"
                    )?;
                    for o in &s.owners {
                        writeln!(
                            out,
                            "{:<24} {:>6} {:>12} {:>12} {:>12} {:>8} {:>12} {:>5}",
                            o.handle,
                            o.owner_id,
                            format_size(o.used_bytes),
                            format_size(o.used_bytes.saturating_sub(o.overhead_bytes)),
                            format_size(o.overhead_bytes),
                            o.buckets,
                            format_size(o.capacity_bytes),
                            o.live
                        )?;
                    }
                }
            }
        }
    }
    Ok(())
}
