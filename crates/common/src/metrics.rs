//! Registering metrics on a service's own registry (several services can run
//! in one process, so none uses the global registry).

use prometheus::core::Collector;
use prometheus::{IntCounter, IntGauge, Registry};

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
