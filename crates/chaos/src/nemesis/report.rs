//! The summary of a nemesis run: what was done, what was injected, how
//! available the cluster stayed around each kind of fault, and what the
//! checker found.

use super::checker::Outcome;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;

/// How long after a fault is healed its effect is still counted against it.
pub const AFTERMATH_MS: u64 = 5_000;

/// One injected fault: its kind, when it began and when it was healed (ms
/// into the run).
#[derive(Debug, Clone, Serialize)]
pub struct FaultWindow {
    pub kind: &'static str,
    pub target: String,
    pub start_ms: u64,
    pub heal_ms: u64,
}

/// What one kind of fault did to the clients.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Impact {
    pub injected: u64,
    /// Share of calls started while it was held that were answered (not
    /// failed retryably or timed out).
    pub held_availability: Option<f64>,
    /// The same for calls started in the 5 s after it was healed.
    pub after_availability: Option<f64>,
    /// The longest stretch with no call answered, from its start to 10 s
    /// after it was healed (the worst of its instances).
    pub longest_gap_ms: u64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct FinalCheck {
    /// Acknowledged keys read back after healing.
    pub checked: u64,
    pub readable: u64,
    /// Gone, and every node that held it was disrupted after it was
    /// acknowledged (allowed: those were its only copies).
    pub lost_with_hosts: u64,
    /// Gone, and which nodes held it was never learnt (a lookup after its
    /// put failed); counted apart, neither excused nor an anomaly.
    pub unknown: u64,
    /// Removed keys that stayed removed.
    pub stayed_removed: u64,
}

/// Acknowledged keys a get found missing while the run went on (each an
/// anomaly unless one of these).
#[derive(Debug, Clone, Default, Serialize)]
pub struct MissedMidRun {
    /// Every node that held it was disrupted between its acknowledgement
    /// and the miss.
    pub with_hosts: u64,
    /// Which nodes held it was never learnt.
    pub unknown: u64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    pub seed: u64,
    /// Wall clock at the run's start; every `_ms` is after it.
    pub started_unix_ms: u64,
    pub seconds: u64,
    pub ha: bool,
    pub node_ttl_s: u64,
    pub election_ttl_s: Option<u64>,
    pub ops: BTreeMap<String, u64>,
    pub faults: BTreeMap<String, Impact>,
    /// Share of calls answered when no fault was held nor recent.
    pub baseline_availability: Option<f64>,
    /// (second of the run, share of calls started in that 10 s that were
    /// answered).
    pub availability_by_10s: Vec<(u64, f64)>,
    /// Every fault injected, in order.
    pub injected: Vec<FaultWindow>,
    pub final_check: FinalCheck,
    pub missed_mid_run: MissedMidRun,
    pub stale_reads: u64,
    pub anomalies: Vec<String>,
    /// The run's history (one JSON line per call), when it was kept.
    pub history: Option<std::path::PathBuf>,
}

fn share(it: impl Iterator<Item = bool>) -> Option<f64> {
    let (mut n, mut ok) = (0u64, 0u64);
    for o in it {
        n += 1;
        ok += o as u64;
    }
    (n > 0).then(|| ok as f64 / n as f64)
}

/// The longest stretch in `[from, to)` with no success ending in it.
fn longest_gap(successes: &[u64], from: u64, to: u64) -> u64 {
    let mut last = from;
    let mut gap = 0;
    for &t in successes.iter().filter(|&&t| t >= from && t < to) {
        gap = gap.max(t - last);
        last = t;
    }
    gap.max(to.saturating_sub(last))
}

impl Report {
    /// Fills the availability figures from every call and every fault.
    pub fn availability(&mut self, outcomes: &[Outcome], faults: &[FaultWindow], end_ms: u64) {
        let mut successes: Vec<u64> = outcomes.iter().filter(|o| o.ok).map(|o| o.end_ms).collect();
        successes.sort_unstable();
        for f in faults {
            let i = self.faults.entry(f.kind.to_string()).or_default();
            i.injected += 1;
            let gap = longest_gap(&successes, f.start_ms, (f.heal_ms + 10_000).min(end_ms));
            i.longest_gap_ms = i.longest_gap_ms.max(gap);
        }
        for (kind, i) in &mut self.faults {
            let of_kind = || faults.iter().filter(move |f| f.kind == kind);
            i.held_availability = share(
                outcomes
                    .iter()
                    .filter(|o| of_kind().any(|f| (f.start_ms..f.heal_ms).contains(&o.start_ms)))
                    .map(|o| o.ok),
            );
            i.after_availability = share(
                outcomes
                    .iter()
                    .filter(|o| {
                        of_kind()
                            .any(|f| (f.heal_ms..f.heal_ms + AFTERMATH_MS).contains(&o.start_ms))
                    })
                    .map(|o| o.ok),
            );
        }
        self.baseline_availability = share(
            outcomes
                .iter()
                .filter(|o| {
                    !faults
                        .iter()
                        .any(|f| (f.start_ms..f.heal_ms + AFTERMATH_MS).contains(&o.start_ms))
                })
                .map(|o| o.ok),
        );
        for w in (0..end_ms.div_ceil(1000)).step_by(10) {
            let range = w * 1000..(w + 10) * 1000;
            if let Some(a) = share(
                outcomes
                    .iter()
                    .filter(|o| range.contains(&o.start_ms))
                    .map(|o| o.ok),
            ) {
                self.availability_by_10s.push((w, a));
            }
        }
    }
}

fn pct(a: Option<f64>) -> String {
    a.map_or("-".into(), |a| format!("{:.1}%", 100.0 * a))
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total: u64 = self.ops.values().sum();
        writeln!(
            f,
            "nemesis: {} s, seed {}, {} (node TTL {} s{})",
            self.seconds,
            self.seed,
            if self.ha {
                "two masters on etcd"
            } else {
                "one master"
            },
            self.node_ttl_s,
            self.election_ttl_s
                .map_or(String::new(), |e| format!(", election TTL {e} s")),
        )?;
        let ops: Vec<String> = self.ops.iter().map(|(k, v)| format!("{k} {v}")).collect();
        writeln!(f, "operations checked: {total} ({})", ops.join(", "))?;
        writeln!(
            f,
            "availability with no fault near: {}",
            pct(self.baseline_availability)
        )?;
        writeln!(
            f,
            "{:<22} {:>8} {:>12} {:>12} {:>14}",
            "fault", "injected", "held avail", "after avail", "longest gap"
        )?;
        for (k, i) in &self.faults {
            writeln!(
                f,
                "{k:<22} {:>8} {:>12} {:>12} {:>11} ms",
                i.injected,
                pct(i.held_availability),
                pct(i.after_availability),
                i.longest_gap_ms
            )?;
        }
        let by10: Vec<String> = self
            .availability_by_10s
            .iter()
            .map(|(s, a)| format!("{s}s:{:.0}%", 100.0 * a))
            .collect();
        writeln!(f, "availability by 10 s: {}", by10.join(" "))?;
        let c = &self.final_check;
        writeln!(
            f,
            "after healing: {} acknowledged keys checked — {} readable, {} lost with every \
             host that held them, {} lost whose nodes were never learnt; {} removed keys \
             stayed removed",
            c.checked, c.readable, c.lost_with_hosts, c.unknown, c.stayed_removed
        )?;
        writeln!(
            f,
            "acknowledged keys a get found missing during the run: {} with every host that \
             held them disrupted since, {} whose nodes were never learnt",
            self.missed_mid_run.with_hosts, self.missed_mid_run.unknown
        )?;
        writeln!(
            f,
            "reads older than the acknowledged version: {}",
            self.stale_reads
        )?;
        write!(f, "anomalies: {}", self.anomalies.len())?;
        for a in self.anomalies.iter().take(20) {
            write!(f, "\n  {a}")?;
        }
        if let Some(h) = &self.history {
            write!(f, "\nhistory: {}", h.display())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(start_ms: u64, end_ms: u64, ok: bool) -> Outcome {
        Outcome {
            start_ms,
            end_ms,
            ok,
        }
    }

    #[test]
    fn gaps_count_from_the_fault_to_the_window_end() {
        assert_eq!(longest_gap(&[], 100, 500), 400);
        assert_eq!(longest_gap(&[150, 450], 100, 500), 300);
        assert_eq!(longest_gap(&[50, 120, 480], 100, 500), 360);
    }

    #[test]
    fn availability_is_split_by_fault_and_aftermath() {
        let outcomes = [
            o(100, 150, true),
            o(1_000, 2_000, false),
            o(1_500, 2_500, true),
            o(3_500, 3_600, true),
            o(20_000, 20_010, true),
            o(21_000, 21_010, false),
        ];
        let faults = [FaultWindow {
            kind: "kill",
            target: "node-1".into(),
            start_ms: 900,
            heal_ms: 3_000,
        }];
        let mut r = Report::default();
        r.availability(&outcomes, &faults, 22_000);
        let k = &r.faults["kill"];
        assert_eq!(k.injected, 1);
        assert_eq!(k.held_availability, Some(0.5));
        assert_eq!(k.after_availability, Some(1.0));
        // 900 → 2 500 → 3 600 → the window's end at 13 000.
        assert_eq!(k.longest_gap_ms, 9_400);
        assert_eq!(r.baseline_availability, Some(2.0 / 3.0));
        // No call started in 10–20 s: no figure for it.
        assert_eq!(r.availability_by_10s.len(), 2);
        assert_eq!(r.availability_by_10s[0], (0, 0.75));
        assert_eq!(r.availability_by_10s[1], (20, 0.5));
    }
}
