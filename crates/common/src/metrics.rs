//! Registering metrics on a service's own registry (several services can run
//! in one process, so none uses the global registry).

use prometheus::core::Collector;
use prometheus::core::{MetricVec, MetricVecBuilder};
use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

/// Registers `c` on `r` and returns it. Names are static and unique per
/// registry, so registration cannot fail in practice; if it did, the metric
/// would simply be missing from /metrics.
pub fn register<C: Collector + Clone + 'static>(r: &Registry, c: C) -> C {
    let _ = r.register(Box::new(c.clone()));
    c
}

pub fn gauge(r: &Registry, name: &str, help: &str) -> IntGauge {
    register(r, IntGauge::new(name, help).expect("valid metric name"))
}

pub fn counter(r: &Registry, name: &str, help: &str) -> IntCounter {
    register(r, IntCounter::new(name, help).expect("valid metric name"))
}

/// A counter family of one label whose values are known up front, with a
/// series at zero for each of `values` from the start: a dashboard's
/// `rate()` or an alert over it reads 0, not "no data", before the first
/// event. A value outside `values` still counts (it appears on first use).
pub fn counter_vec(
    r: &Registry,
    name: &str,
    help: &str,
    label: &str,
    values: &[&str],
) -> IntCounterVec {
    let v = IntCounterVec::new(Opts::new(name, help), &[label]).expect("valid metric name");
    at_zero(register(r, v), values)
}

/// `counter_vec` for a gauge family.
pub fn gauge_vec(
    r: &Registry,
    name: &str,
    help: &str,
    label: &str,
    values: &[&str],
) -> IntGaugeVec {
    let v = IntGaugeVec::new(Opts::new(name, help), &[label]).expect("valid metric name");
    at_zero(register(r, v), values)
}

/// `v` with a series for each of `values` (its one label's).
fn at_zero<T: MetricVecBuilder>(v: MetricVec<T>, values: &[&str]) -> MetricVec<T> {
    for value in values {
        v.with_label_values(&[value]);
    }
    v
}

/// Checks that each `(family, label, values)` exports exactly `values`, each
/// at zero (the contract of `counter_vec` on a fresh registry; for tests).
pub fn check_at_zero(r: &Registry, families: &[(&str, &str, &[&str])]) -> Result<(), String> {
    use prometheus::proto::MetricType;
    let gathered = r.gather();
    for (name, label, values) in families {
        let mut got = Vec::new();
        for family in gathered.iter().filter(|f| f.name() == *name) {
            for m in family.get_metric() {
                let Some(l) = m.get_label().iter().find(|l| l.name() == *label) else {
                    continue;
                };
                let value = match family.get_field_type() {
                    MetricType::COUNTER => m.get_counter().get_value(),
                    _ => m.get_gauge().get_value(),
                };
                got.push((l.value().to_string(), value));
            }
        }
        let want: Vec<(String, f64)> = values.iter().map(|v| (v.to_string(), 0.0)).collect();
        got.sort_by(|a, b| a.0.cmp(&b.0));
        let mut want_sorted = want.clone();
        want_sorted.sort_by(|a, b| a.0.cmp(&b.0));
        if got != want_sorted {
            return Err(format!(
                "{name}{{{label}}}: exported {got:?}, want {want:?}"
            ));
        }
    }
    Ok(())
}
