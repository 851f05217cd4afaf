//! What the nemesis's clients did and saw, and the judgement of it: every
//! value names its key and version in its first bytes, so any read can be
//! checked against what was ever written for its key, without asking the
//! cluster.

use rand::{rngs::StdRng, RngCore, SeedableRng};
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};
use strata_client::Code;

/// Every call's deadline, as a user would set one.
pub const DEADLINE: Duration = Duration::from_secs(30);
/// The size of every value.
pub const VALUE: usize = 8 << 10;

/// The bytes of `version` of `key`: a header naming both, then filler
/// derived from both.
pub fn value(key: &str, version: u32) -> Vec<u8> {
    let mut v = format!("{key}|{version}|").into_bytes();
    let seed = key
        .bytes()
        .fold(version as u64, |h, b| h.wrapping_mul(31) ^ b as u64);
    let mut filler = vec![0u8; VALUE.saturating_sub(v.len())];
    StdRng::seed_from_u64(seed).fill_bytes(&mut filler);
    v.extend(filler);
    v
}

/// The version `bytes` are of `key`, if they are exactly one.
pub fn version_of(key: &str, bytes: &[u8]) -> Option<u32> {
    let mut it = bytes.splitn(3, |&b| b == b'|');
    let (k, v) = (it.next()?, it.next()?);
    let v = std::str::from_utf8(v).ok()?.parse().ok()?;
    (k == key.as_bytes() && value(key, v) == bytes).then_some(v)
}

#[derive(Default)]
pub struct KeyState {
    /// Versions whose put was started (acknowledged or not).
    pub attempted: Vec<u32>,
    pub acked: Option<u32>,
    pub remove_tried: bool,
    pub removed: bool,
    /// Nodes that held its latest acknowledged version (empty: unknown, the
    /// lookup after the put failed), and when it was acknowledged.
    pub nodes: Vec<String>,
    pub acked_at: Option<Instant>,
}

/// A get that found an acknowledged key missing while the run went on
/// (judged at its end, when every fault's window is known).
pub struct Missing {
    pub key: String,
    pub acked: u32,
    pub nodes: Vec<String>,
    pub acked_at: Option<Instant>,
    pub at: Instant,
}

/// When each node's disruptions that may lose objects began and were
/// healed, by node name.
pub type Disruptions = HashMap<String, Vec<(Instant, Instant)>>;

/// Why an acknowledged object may be gone.
#[derive(Debug, PartialEq, Eq)]
pub enum Gone {
    /// Every node that held it was disrupted after it was acknowledged
    /// (and, for a miss seen during the run, before it was seen): those
    /// were its only copies.
    WithHosts,
    /// Which nodes held it was never learnt (a lookup after its put
    /// failed): neither excused nor an anomaly.
    Unknown,
    /// A node that held it was never disrupted in that span: an anomaly.
    Lost,
}

/// Judges an acknowledged object found gone (`seen`: when, for a miss
/// during the run; `None` after healing, when any later disruption counts).
pub fn gone(
    nodes: &[String],
    acked_at: Option<Instant>,
    seen: Option<Instant>,
    disrupted: &Disruptions,
) -> Gone {
    let hit = |n: &String| {
        disrupted.get(n).is_some_and(|w| {
            w.iter().any(|(start, healed)| {
                acked_at.is_some_and(|a| *healed >= a) && seen.is_none_or(|s| *start <= s)
            })
        })
    };
    if nodes.is_empty() {
        Gone::Unknown
    } else if nodes.iter().all(hit) {
        Gone::WithHosts
    } else {
        Gone::Lost
    }
}

/// One call: when it started and ended (ms into the run), and whether the
/// cluster answered it (a success, or a final answer such as NotFound for
/// a removed key) rather than failing it retryably or not at all.
#[derive(Clone, Copy)]
pub struct Outcome {
    pub start_ms: u64,
    pub end_ms: u64,
    pub ok: bool,
}

pub struct History {
    pub t0: Instant,
    pub keys: HashMap<String, KeyState>,
    /// One JSON line per call, for replay.
    pub lines: Vec<String>,
    pub ops: BTreeMap<&'static str, u64>,
    pub outcomes: Vec<Outcome>,
    pub anomalies: Vec<String>,
    /// Reads of an older version than the last acknowledged one (each also
    /// an anomaly).
    pub stale_reads: u64,
    /// Gets that found an acknowledged key missing during the run.
    pub missing: Vec<Missing>,
}

impl History {
    pub fn new(t0: Instant) -> History {
        History {
            t0,
            keys: HashMap::new(),
            lines: Vec::new(),
            ops: BTreeMap::new(),
            outcomes: Vec::new(),
            anomalies: Vec::new(),
            stale_reads: 0,
            missing: Vec::new(),
        }
    }

    /// A call that outlived its deadline: an anomaly.
    pub fn no_answer(&mut self, op: &str, key: &str) -> String {
        self.anomalies
            .push(format!("{op} {key}: no answer within {DEADLINE:?}"));
        "timeout".to_string()
    }

    /// A call's error: retryable ones (and the answers in `also`, which the
    /// call may get by design) are fine, anything else is an anomaly.
    pub fn judge(&mut self, op: &str, key: &str, e: &strata_client::Error, also: &[Code]) {
        if !e.retryable() && !also.contains(&e.code) {
            self.anomalies
                .push(format!("{op} {key}: non-retryable error {:?}: {e}", e.code));
        }
    }

    pub fn record(
        &mut self,
        started: Instant,
        client: usize,
        op: &'static str,
        key: &str,
        what: &str,
        answered: bool,
    ) {
        let ms = |t: Instant| t.saturating_duration_since(self.t0).as_millis() as u64;
        let (start_ms, end_ms) = (ms(started), ms(Instant::now()));
        *self.ops.entry(op).or_default() += 1;
        self.outcomes.push(Outcome {
            start_ms,
            end_ms,
            ok: answered,
        });
        self.lines.push(
            serde_json::json!({
                "start_ms": start_ms, "end_ms": end_ms, "client": client,
                "op": op, "key": key, "result": what, "answered": answered,
            })
            .to_string(),
        );
    }

    /// A get of `key` answered NotFound: fine for a key removed or being
    /// removed, else remembered to be judged against the faults.
    pub fn not_found(&mut self, key: &str) {
        let Some(s) = self.keys.get(key) else { return };
        if let (Some(acked), false) = (s.acked, s.remove_tried) {
            self.missing.push(Missing {
                key: key.to_string(),
                acked,
                nodes: s.nodes.clone(),
                acked_at: s.acked_at,
                at: Instant::now(),
            });
        }
    }

    /// Judges the bytes a read of `key` returned; the result to record.
    pub fn read(&mut self, key: &str, bytes: &[u8]) -> String {
        let s = &self.keys[key];
        let (removed, acked) = (s.removed, s.acked);
        match version_of(key, bytes) {
            Some(v) if self.keys[key].attempted.contains(&v) => {
                if removed {
                    self.anomalies
                        .push(format!("get {key}: a removed key came back (v{v})"));
                }
                // Each client works its own keys one call at a time: no
                // overwrite races this read, so an older version than the
                // acknowledged one is a lost update.
                if acked.is_some_and(|a| v < a) {
                    self.stale_reads += 1;
                    self.anomalies.push(format!(
                        "get {key}: v{v}, older than the acknowledged v{}",
                        acked.unwrap_or_default()
                    ));
                }
                format!("ok v{v}")
            }
            _ => {
                self.anomalies
                    .push(format!("get {key}: wrong bytes ({} bytes)", bytes.len()));
                "wrong bytes".to_string()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_names_its_key_and_version_and_nothing_else_passes() {
        let v = value("k1", 3);
        assert_eq!(v.len(), VALUE);
        assert_eq!(version_of("k1", &v), Some(3));
        assert_eq!(version_of("k2", &v), None, "another key's bytes");
        let mut flipped = v.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert_eq!(version_of("k1", &flipped), None, "one bit off");
        assert_eq!(version_of("k1", &v[..v.len() - 1]), None, "short");
        assert_ne!(value("k1", 3), value("k1", 4));
    }

    #[test]
    fn reads_of_bytes_never_written_or_of_removed_keys_are_anomalies() {
        let mut h = History::new(Instant::now());
        h.keys.insert(
            "k".into(),
            KeyState {
                attempted: vec![0, 1],
                acked: Some(1),
                ..Default::default()
            },
        );
        assert_eq!(h.read("k", &value("k", 1)), "ok v1");
        assert_eq!(h.anomalies.len(), 0);
        assert_eq!(h.read("k", &value("k", 0)), "ok v0");
        assert_eq!(
            (h.stale_reads, h.anomalies.len()),
            (1, 1),
            "older than acknowledged"
        );
        assert_eq!(h.read("k", &value("k", 2)), "wrong bytes", "never written");
        assert_eq!(h.anomalies.len(), 2);
        h.keys.get_mut("k").unwrap().removed = true;
        h.read("k", &value("k", 1));
        assert_eq!(h.anomalies.len(), 3, "{:?}", h.anomalies);
    }

    #[test]
    fn an_object_may_be_gone_only_with_every_host_disrupted_between_its_ack_and_the_miss() {
        let t = Instant::now();
        let at = |ms: u64| t + Duration::from_millis(ms);
        let mut d = Disruptions::new();
        d.insert("a".into(), vec![(at(100), at(200))]);
        d.insert("b".into(), vec![(at(300), at(400))]);
        let both = ["a".to_string(), "b".to_string()];
        let ack = Some(at(50));
        assert_eq!(gone(&both, ack, None, &d), Gone::WithHosts);
        assert_eq!(gone(&both, ack, Some(at(350)), &d), Gone::WithHosts);
        // Seen before b's disruption began: a copy stood.
        assert_eq!(gone(&both, ack, Some(at(250)), &d), Gone::Lost);
        // Acknowledged after a's disruption was healed.
        assert_eq!(gone(&both, Some(at(250)), None, &d), Gone::Lost);
        assert_eq!(gone(&["c".to_string()], ack, None, &d), Gone::Lost);
        assert_eq!(gone(&[], ack, None, &d), Gone::Unknown);
    }

    #[test]
    fn a_miss_of_an_acknowledged_key_not_being_removed_is_kept_for_judgement() {
        let mut h = History::new(Instant::now());
        for (k, acked, remove_tried) in [
            ("k", Some(1), false),
            ("r", Some(1), true),
            ("n", None, false),
        ] {
            h.keys.insert(
                k.into(),
                KeyState {
                    attempted: vec![1],
                    acked,
                    remove_tried,
                    ..Default::default()
                },
            );
        }
        for k in ["k", "r", "n", "unknown"] {
            h.not_found(k);
        }
        assert_eq!(h.missing.len(), 1);
        assert_eq!((h.missing[0].key.as_str(), h.missing[0].acked), ("k", 1));
    }

    #[test]
    fn only_retryable_or_expected_errors_pass() {
        let mut h = History::new(Instant::now());
        let e = |c| strata_client::Error::new(c, "x");
        h.judge("get", "k", &e(Code::Unavailable), &[]);
        h.judge("get", "k", &e(Code::NotFound), &[Code::NotFound]);
        assert!(h.anomalies.is_empty(), "{:?}", h.anomalies);
        h.judge("get", "k", &e(Code::NotFound), &[]);
        h.judge("get", "k", &e(Code::PermissionDenied), &[Code::NotFound]);
        assert_eq!(h.anomalies.len(), 2);
    }
}
