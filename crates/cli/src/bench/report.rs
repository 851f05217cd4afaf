//! The benchmark's summary table and its comparisons against baselines.

use std::collections::HashMap;
use strata_common::units::format_size;

#[derive(Debug, Clone, serde::Serialize)]
pub struct Row {
    pub scenario: String,
    pub size: u64,
    pub conns: usize,
    pub ops: u64,
    pub ops_per_sec: f64,
    pub gb_per_sec: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub note: String,
    /// CPU time (user + system) of this whole process per operation over
    /// the phase, where the phase measured it: with `--local` that is
    /// master, nodes and load generator together, and a baseline's counts
    /// the server it runs in this process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_us_per_op: Option<f64>,
}

impl Row {
    /// A row timed per batch, counted per item: `batch` items per op.
    pub fn per_item(mut self, batch: usize) -> Row {
        self.ops *= batch as u64;
        self.ops_per_sec *= batch as f64;
        self.cpu_us_per_op = self.cpu_us_per_op.map(|c| c / batch.max(1) as f64);
        self
    }
}

/// Suffix of the rows measured on the cluster without credentials.
pub const NO_CREDENTIALS: &str = " (no creds)";
/// Suffix of rows measured on a cluster with `--integrity blake3`
/// (`--compare-integrity`).
pub const BLAKE3: &str = " (blake3)";
/// Suffix of rows measured through a UCX client (`--compare-transports`).
pub const OVER_UCX: &str = " (ucx)";
/// Suffix of put rows whose client declared no checksum at PutStart
/// (`--compare-announce`).
pub const UNANNOUNCED: &str = " (unannounced)";
/// Suffix of put rows announced to their nodes at PutStart instead of
/// recorded by them from the writes (`--compare-announce`).
pub const ANNOUNCED: &str = " (announced)";

#[derive(Debug, Default)]
pub struct Report {
    pub rows: Vec<Row>,
    pub notes: Vec<String>,
}

impl Report {
    /// Adds "x of baseline" notes: Strata get vs raw TCP get and Redis GET,
    /// Strata put vs raw TCP put and Redis SET, at the same size and connection count.
    pub fn compare(&mut self) {
        let idx: HashMap<(String, u64), f64> = self
            .rows
            .iter()
            .map(|r| ((r.scenario.clone(), r.size), r.gb_per_sec))
            .collect();
        for r in &mut self.rows {
            let against: &[&str] = match r.scenario.as_str() {
                "strata get" | "strata get cached" | "strata batch_get" => {
                    &["raw tcp get", "raw tcp get dram", "redis GET"]
                }
                "strata put" | "strata batch_put" => &[
                    "raw tcp put",
                    "raw tcp put dram",
                    "raw tcp get",
                    "redis SET",
                ],
                "strata get (ucx)" | "strata get cached (ucx)" | "strata batch_get (ucx)" => {
                    &["memcpy", "memcpy dram", "raw tcp get"]
                }
                "strata put (ucx)" | "strata batch_put (ucx)" => {
                    &["memcpy", "memcpy dram", "raw tcp get"]
                }
                _ => &[],
            };
            let mut parts = Vec::new();
            if let Some(tcp) = r.scenario.strip_suffix(OVER_UCX) {
                if let Some(&base) = idx.get(&(tcp.to_string(), r.size)) {
                    if base > 0.0 {
                        parts.push(format!("{:.2}x over tcp", r.gb_per_sec / base));
                    }
                }
            }
            if let Some(crc) = r.scenario.strip_suffix(BLAKE3) {
                if let Some(&base) = idx.get(&(crc.to_string(), r.size)) {
                    if base > 0.0 {
                        parts.push(format!("{:.2}x crc32c alone", r.gb_per_sec / base));
                    }
                }
            }
            for suffix in [ANNOUNCED, UNANNOUNCED] {
                let other = format!("{}{suffix}", r.scenario);
                if let Some(&base) = idx.get(&(other, r.size)) {
                    if base > 0.0 {
                        let what = suffix.trim_matches([' ', '(', ')']);
                        parts.push(format!("{:.2}x {what}", r.gb_per_sec / base));
                    }
                }
            }
            if r.scenario.starts_with("strata ") && !r.scenario.ends_with(NO_CREDENTIALS) {
                let plain = format!("{}{NO_CREDENTIALS}", r.scenario);
                if let Some(&base) = idx.get(&(plain, r.size)) {
                    if base > 0.0 {
                        parts.push(format!("{:.3}x without credentials", r.gb_per_sec / base));
                    }
                }
            }
            for b in against {
                if let Some(&base) = idx.get(&(b.to_string(), r.size)) {
                    if base > 0.0 {
                        parts.push(format!("{:.2}x {b}", r.gb_per_sec / base));
                    }
                }
            }
            if !parts.is_empty() {
                if !r.note.is_empty() {
                    r.note.push_str("; ");
                }
                r.note.push_str(&parts.join(", "));
            }
        }
    }

    pub fn print(&self) {
        println!(
            "{:<22} {:>9} {:>5} {:>8} {:>11} {:>8} {:>9} {:>9}  NOTE",
            "SCENARIO", "SIZE", "CONNS", "OPS", "OPS/S", "GB/S", "P50 ms", "P99 ms"
        );
        for r in &self.rows {
            let size = if r.size == 0 {
                "-".to_string()
            } else {
                format_size(r.size)
            };
            println!(
                "{:<22} {:>9} {:>5} {:>8} {:>11.0} {:>8.3} {:>9.3} {:>9.3}  {}",
                r.scenario,
                size,
                r.conns,
                r.ops,
                r.ops_per_sec,
                r.gb_per_sec,
                r.p50_ms,
                r.p99_ms,
                r.note
            );
        }
        for n in &self.notes {
            println!("note: {n}");
        }
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({ "rows": self.rows, "notes": self.notes })
    }
}
