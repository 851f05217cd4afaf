//! The SSD agent's Prometheus metrics (`strata_ssd_agent_*`): names are a
//! contract with the dashboard and alerts (`deploy/`); add, never rename.

use crate::{eviction, staging};
use prometheus::{Histogram, HistogramOpts, IntCounterVec, IntGauge, Registry};
use strata_transport::tcp::ServerMetrics;

// The label values of the labelled families, each exported at zero from
// the start: dashboards and alerts over them read 0, not "no data".
pub(crate) const OFFLOAD_OUTCOMES: &[&str] = &["persisted", "failed"];
pub(crate) const CHECKSUM_STAGES: &[&str] = &["read", "promotion", "offload_source"];

pub(crate) struct AgentMetrics {
    pub(crate) registry: Registry,
    pub(crate) used: IntGauge,
    pub(crate) capacity: IntGauge,
    pub(crate) buckets: IntGauge,
    pub(crate) objects: IntGauge,
    pub(crate) unknown_files: IntGauge,
    pub(crate) quarantined_files: IntGauge,
    pub(crate) overhead: IntGauge,
    pub(crate) heartbeats: prometheus::IntCounter,
    pub(crate) fenced_answers: prometheus::IntCounter,
    pub(crate) outcomes: IntCounterVec,
    /// Bytes that failed their checksum, by where: `read` (a data-plane
    /// read of a bucket), `promotion` (copying back to DRAM),
    /// `offload_source` (a DRAM source handed to this agent).
    pub(crate) checksum_failures: IntCounterVec,
    pub(crate) staging: staging::StagingMetrics,
    /// The lend window's slots (`--transport ucx`). Registered in every
    /// build, so dashboards see zeros rather than absent series.
    #[cfg_attr(not(feature = "ucx"), allow(dead_code))]
    pub(crate) lend: strata_transport::lend::LendMetrics,
    pub(crate) eviction: eviction::EvictionMetrics,
    pub(crate) server: ServerMetrics,
}

impl AgentMetrics {
    pub(crate) fn new() -> Self {
        let r = Registry::new();
        let g = |n: &str, h: &str| strata_common::metrics::gauge(&r, n, h);
        let c = |n: &str, h: &str| strata_common::metrics::counter(&r, n, h);
        let outcomes = strata_common::metrics::counter_vec(
            &r,
            "strata_ssd_agent_offload_tasks_total",
            "Offload tasks by outcome (persisted, failed)",
            "outcome",
            OFFLOAD_OUTCOMES,
        );
        let checksum_failures = strata_common::metrics::counter_vec(
            &r,
            "strata_ssd_agent_checksum_failures_total",
            "Objects whose bytes failed their checksum, by stage (read, promotion, offload_source)",
            "stage",
            CHECKSUM_STAGES,
        );
        let wait = Histogram::with_opts(
            HistogramOpts::new(
                "strata_ssd_agent_staging_wait_seconds",
                "Time reads waited for staging space",
            )
            .buckets(vec![
                0.0001, 0.001, 0.01, 0.05, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0,
            ]),
        )
        .expect("valid metric");
        let _ = r.register(Box::new(wait.clone()));
        AgentMetrics {
            used: g(
                "strata_ssd_agent_used_bytes",
                "Bytes of this owner's bucket files",
            ),
            capacity: g(
                "strata_ssd_agent_capacity_bytes",
                "Bytes this owner may keep",
            ),
            buckets: g("strata_ssd_agent_buckets", "Buckets of this owner"),
            overhead: g(
                "strata_ssd_agent_overhead_bytes",
                "Bytes of this owner's index, WAL and logs (counted against --capacity with the buckets)",
            ),
            fenced_answers: c(
                "strata_ssd_agent_fenced_answers_total",
                "Master answers refused because they came from a lower term than one already seen (a deposed leader still answering)",
            ),
            heartbeats: c(
                "strata_ssd_agent_heartbeats_total",
                "Owner heartbeats the master answered",
            ),
            objects: g(
                "strata_ssd_agent_objects",
                "Objects in this owner's buckets",
            ),
            unknown_files: g(
                "strata_ssd_agent_unknown_files",
                "Files in the bucket directory that are not bucket files (left alone)",
            ),
            quarantined_files: g(
                "strata_ssd_agent_quarantined_files",
                "This owner's damaged or unindexed files moved to quarantine/",
            ),
            outcomes,
            checksum_failures,
            staging: staging::StagingMetrics {
                capacity: g(
                    "strata_ssd_agent_staging_capacity_bytes",
                    "Read staging arena of this process",
                ),
                in_use: g(
                    "strata_ssd_agent_staging_in_use_bytes",
                    "Staging bytes held by reads",
                ),
                waiters: g(
                    "strata_ssd_agent_staging_waiters",
                    "Reads waiting for staging space",
                ),
                wait_seconds: wait,
                timeouts: c(
                    "strata_ssd_agent_staging_timeouts_total",
                    "Reads that gave up waiting for staging space",
                ),
            },
            lend: strata_transport::lend::LendMetrics {
                leases: g(
                    "strata_ssd_agent_staging_remote_leases",
                    "Lend window slots lent to one-sided (rdma) readers right now",
                ),
                expired: c(
                    "strata_ssd_agent_staging_remote_expired_total",
                    "Lent slots reclaimed after their TTL (never given back)",
                ),
                disconnected: c(
                    "strata_ssd_agent_staging_remote_disconnected_total",
                    "Lent slots taken back when the reader's connection closed before it gave them back",
                ),
                lent_bytes: c(
                    "strata_ssd_agent_staged_bytes_total",
                    "Bytes staged into the UCX lend window for one-sided (rdma) readers",
                ),
            },
            eviction: eviction::EvictionMetrics {
                buckets: c(
                    "strata_ssd_agent_evicted_buckets_total",
                    "Buckets evicted (capacity or mostly removed objects)",
                ),
                kept_objects: c(
                    "strata_ssd_agent_kept_objects_total",
                    "Recently read objects rewritten out of evicted buckets",
                ),
                bytes: c(
                    "strata_ssd_agent_evicted_bytes_total",
                    "Bytes of bucket files evicted",
                ),
                removed_objects: c(
                    "strata_ssd_agent_removed_objects_total",
                    "Objects forgotten because their key was removed from Strata",
                ),
                forced_buckets: c(
                    "strata_ssd_agent_forced_evictions_total",
                    "Buckets evicted without keeping their read objects: what is read no longer fits the capacity",
                ),
            },
            server: ServerMetrics {
                requests: c(
                    "strata_ssd_agent_data_plane_requests_total",
                    "Data-plane requests received (a batch read counts once)",
                ),
                read_bytes: c(
                    "strata_ssd_agent_read_bytes_total",
                    "Bytes served to SSD readers",
                ),
                written_bytes: c(
                    "strata_ssd_agent_data_plane_written_bytes_total",
                    "Always 0: agents take no writes",
                ),
                rejected: c(
                    "strata_ssd_agent_rejected_requests_total",
                    "Data-plane requests refused",
                ),
                refused_connections: c(
                    "strata_ssd_agent_refused_connections_total",
                    "Data-plane connections refused at accept (total or per-peer limit)",
                ),
                cut_off: c(
                    "strata_ssd_agent_cut_off_connections_total",
                    "Data-plane connections cut off: no grant in time, stalled I/O, too many refused requests",
                ),
            },
            registry: r,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labelled_families_export_their_known_values_at_zero_from_the_start() {
        let m = AgentMetrics::new();
        let families: [(&str, &str, &[&str]); 2] = [
            (
                "strata_ssd_agent_offload_tasks_total",
                "outcome",
                OFFLOAD_OUTCOMES,
            ),
            (
                "strata_ssd_agent_checksum_failures_total",
                "stage",
                CHECKSUM_STAGES,
            ),
        ];
        strata_common::metrics::check_at_zero(&m.registry, &families).unwrap();
    }
}
