//! Prometheus metrics of the master. Their names and labels are a contract:
//! the dashboard (`deploy/grafana/strata.json`), the alert rules and their
//! promtool tests (`deploy/prometheus/`), the runbooks (docs/operations.md)
//! and `tests/tests/monitoring.rs` use them. Add metrics; rename none.

use prometheus::{
    HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

// The label values of the labelled families, each exported at zero from
// the start (`strata_common::metrics::counter_vec`): dashboards and alerts
// over them read 0, not "no data". A new value is added here.
pub(crate) const RECEIPT_OUTCOMES: &[&str] = &["accepted", "refused"];
pub(crate) const DROP_REASONS: &[&str] = &["policy", "admission", "no_owner", "offload_failed"];
pub(crate) const REBUILD_OUTCOMES: &[&str] = &[
    "adopted",
    "older_version_dropped",
    "malformed",
    "range_in_use",
    "other_version",
    "removed",
    "unsigned",
    "no_digest",
];
pub(crate) const LOOKUP_TIERS: &[&str] = &["dram", "ssd", "miss"];
/// Readers' lease ends (`LeaseEnd`): `ended` a running lease's reader,
/// `stale` named a lease that had ended already or another version.
pub(crate) const LEASE_END_OUTCOMES: &[&str] = &["ended", "stale"];
/// Why a connection to the master's port was closed at once
/// (`connections.rs`): all slots taken, or the peer's share.
pub(crate) const CONNECTION_REFUSALS: &[&str] = &["total", "peer"];
pub(crate) const OWNER_STATES: &[&str] = &["live", "gone"];
pub(crate) const TASK_STATES: &[&str] = &["queued", "assigned"];
pub(crate) const OFFLOAD_RESULTS: &[&str] = &[
    "persisted",
    "persisted_orphan",
    "failed_requeued",
    "expired_requeued",
    "lost_requeued",
    "dropped",
    "source_gone",
    "reassigned",
];
pub(crate) const PROMOTION_OUTCOMES: &[&str] = &[
    "queued",
    "queue_full",
    "promoted",
    "failed",
    "expired",
    "no_room",
    "stale",
];
pub(crate) const ADMISSION_DECISIONS: &[&str] = &["admitted", "refused"];
/// The master's RPCs as `strata_master_requests_total{op}` names them
/// (`MasterService::done`; a test checks service.rs names no other).
pub(crate) const REQUEST_OPS: &[&str] = &[
    "batch_exists",
    "batch_get_replicas",
    "batch_put_end",
    "batch_put_revoke",
    "batch_put_start",
    "evict_buckets",
    "evict_memory",
    "exists",
    "get_replicas",
    "get_ucx_routes",
    "heartbeat",
    "inspect",
    "list",
    "owner_heartbeat",
    "put_end",
    "put_revoke",
    "put_start",
    "register_node",
    "register_owner",
    "remove",
    "remove_all",
    "report_inventory",
    "report_node_objects",
    "report_offload",
    "report_promotion",
    "report_reads",
    "stat",
];

#[derive(Clone)]
pub struct MasterMetrics {
    pub registry: Registry,
    pub keys: IntGauge,
    pub capacity_bytes: IntGauge,
    pub allocated_bytes: IntGauge,
    pub requests: IntCounterVec,
    pub request_duration: HistogramVec,
    pub evictions: IntCounter,
    pub dropped_objects: IntCounterVec,
    pub rebuilt_objects: IntCounterVec,
    pub urgent_offloads: IntCounter,
    pub put_waits: IntCounter,
    pub put_wait_seconds: prometheus::Histogram,
    pub put_wait_timeouts: IntCounter,
    pub put_waiters: IntGauge,
    pub offload_tasks: IntGaugeVec,
    pub offload_results: IntCounterVec,
    pub promotions: IntCounterVec,
    pub admission: crate::offload::admission::AdmissionMetrics,
    pub unsynced_commits: IntCounter,
    pub resumed_puts: IntCounter,
    pub put_receipts_accepted: IntCounter,
    pub put_receipts_refused: IntCounter,
    pub is_leader: IntGauge,
    pub term: IntGauge,
    pub nodes: IntGauge,
    /// Lookups by what answered them: `dram` (a memory replica), `ssd`
    /// (only an SSD copy), `miss` (no such committed key): the per-tier
    /// hit rates of the dashboard.
    pub lookups: IntCounterVec,
    /// Reads clients served from their location cache (inside a lease the
    /// master gave), as they report them: DRAM hits no lookup counted.
    pub cached_reads: IntCounter,
    /// Lease ends readers sent, by `outcome` (`LEASE_END_OUTCOMES`).
    pub lease_ends: IntCounterVec,
    /// Lookups answered without a lease: the object's lease had run
    /// `--max-lease` without a break.
    pub capped_leases: IntCounter,
    /// Connections open on the master's port (gRPC and quick calls).
    pub open_connections: IntGauge,
    /// Connections closed at once for want of a slot, by `reason`
    /// (`CONNECTION_REFUSALS`: all slots taken, or the peer's share).
    pub refused_connections: IntCounterVec,
    /// Calls refused because requests being received held the whole
    /// `--max-inflight-bytes` budget.
    pub inflight_refused: IntCounter,
    /// Registered SSD owners by `state`: live (heartbeating) or gone.
    pub ssd_owners: IntGaugeVec,
    pub segments: IntGauge,
    pub reclaimed_puts: IntCounter,
    /// Versions an overwrite replaced (`PutStartRequest.overwrite`).
    pub overwrites: IntCounter,
    /// DRAM still held by replaced versions until their readers are done.
    pub retired_bytes: IntGauge,
    pub lost_replicas: IntCounter,
    /// Store nodes dropped because their object log overflowed.
    pub node_log_overflows: IntCounter,
    pub tombstones: IntGauge,
    pub tombstoned_copies: IntCounter,
    /// SSD copies reported without the master's record of making them.
    pub unrecorded_copies: IntCounter,
    pub tombstone_failures: IntCounter,
}

use strata_common::metrics::register as reg;

impl MasterMetrics {
    pub fn new() -> Self {
        let r = Registry::new();
        let g = |n: &str, h: &str| strata_common::metrics::gauge(&r, n, h);
        let c = |n: &str, h: &str| strata_common::metrics::counter(&r, n, h);
        let cv = |n: &str, h: &str, label: &str, values: &[&str]| {
            strata_common::metrics::counter_vec(&r, n, h, label, values)
        };
        let gv = |n: &str, h: &str, label: &str, values: &[&str]| {
            strata_common::metrics::gauge_vec(&r, n, h, label, values)
        };
        let receipts = cv(
                "strata_master_put_receipts_total",
                "Store nodes' put receipts PutEnds brought, by outcome: accepted (the commit is not waited for on that node) or refused (did not verify: another checksum, a node registered again since; the PutEnd waits for the node instead)",
                "outcome",
                RECEIPT_OUTCOMES,
            );
        MasterMetrics {
            keys: g(
                "strata_master_keys",
                "Objects in the metadata (complete and in flight)",
            ),
            capacity_bytes: g(
                "strata_master_capacity_bytes",
                "DRAM capacity of mounted segments",
            ),
            allocated_bytes: g(
                "strata_master_allocated_bytes",
                "DRAM bytes allocated to objects",
            ),
            requests: {
                let v = reg(
                    &r,
                    IntCounterVec::new(
                        Opts::new(
                            "strata_master_requests_total",
                            "Requests by operation and result code",
                        ),
                        &["op", "code"],
                    )
                    .expect("valid metric"),
                );
                // Each operation's ok series from the start (error codes
                // appear on first use: op x code would be hundreds).
                for op in REQUEST_OPS {
                    v.with_label_values(&[op, "ok"]);
                }
                v
            },
            request_duration: reg(
                &r,
                HistogramVec::new(
                    HistogramOpts::new("strata_master_request_duration_seconds", "Request latency")
                        .buckets(vec![
                            0.00001, 0.00005, 0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5,
                            1.0,
                        ]),
                    &["op"],
                )
                .expect("valid metric"),
            ),
            evictions: c(
                "strata_master_evictions_total",
                "Objects evicted to make room",
            ),
            dropped_objects: cv(
                "strata_master_dropped_objects_total",
                "Objects that left the cache with no copy anywhere, by reason: policy (the offload policy keeps them out of SSD), admission (--ssd-admission auto refused them), no_owner (no SSD owner had room), offload_failed (their copy failed for good)",
                "reason",
                DROP_REASONS,
            ),
            rebuilt_objects: cv(
                "strata_master_rebuilt_objects_total",
                "Objects store nodes reported holding after a master start: adopted (older_version_dropped counts the older versions an adopted one replaced), or refused (range_in_use, other_version, removed, malformed, unsigned: no master's record of giving that node the object, no_digest: --integrity blake3 and no digest a commit's record covers)",
                "outcome",
                REBUILD_OUTCOMES,
            ),
            urgent_offloads: c(
                "strata_master_urgent_offloads_total",
                "Offloads moved to the front of the queue because a put waits for the DRAM they free",
            ),
            put_waits: c(
                "strata_master_put_waits_total",
                "Puts that waited for DRAM while victims were copied to SSD (--put-wait)",
            ),
            put_wait_seconds: reg(
                &r,
                prometheus::Histogram::with_opts(
                    HistogramOpts::new(
                        "strata_master_put_wait_seconds",
                        "How long puts waited for DRAM (puts that waited)",
                    )
                    .buckets(vec![
                        0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                    ]),
                )
                .expect("valid metric"),
            ),
            put_wait_timeouts: c(
                "strata_master_put_wait_timeouts_total",
                "Puts that ran out of --put-wait and failed with a retryable no_space",
            ),
            put_waiters: g(
                "strata_master_put_waiters",
                "Puts waiting for DRAM right now",
            ),
            lookups: cv(
                "strata_master_lookups_total",
                "Key lookups (GetReplicas) by the tier that answered: dram, ssd or miss",
                "tier",
                LOOKUP_TIERS,
            ),
            ssd_owners: gv(
                "strata_master_ssd_owners",
                "Registered SSD owners by state (live: heartbeating within --node-ttl; gone)",
                "state",
                OWNER_STATES,
            ),
            offload_tasks: gv(
                "strata_master_offload_tasks",
                "Offload tasks by state",
                "state",
                TASK_STATES,
            ),
            offload_results: cv(
                "strata_master_offload_results_total",
                "Offload task outcomes: persisted, persisted_orphan (copied, but its object was gone meanwhile), failed_requeued, expired_requeued, lost_requeued (taken by an owner counted lost), dropped, source_gone, reassigned (queued for an owner that went away)",
                "outcome",
                OFFLOAD_RESULTS,
            ),
            promotions: cv(
                "strata_master_promotions_total",
                "SSD hits copied back to DRAM: queued, queue_full, promoted, failed, expired, no_room, stale",
                "outcome",
                PROMOTION_OUTCOMES,
            ),
            admission: crate::offload::admission::AdmissionMetrics {
                decisions: cv(
                "strata_master_ssd_admission_total",
                "DRAM victims the SSD tier admitted or refused (on-evict, --ssd-admission auto)",
                "decision",
                ADMISSION_DECISIONS,
            ),
                mode: g(
                    "strata_master_ssd_admission_mode",
                    "SSD admission mode: 0 admits every DRAM victim, 1 keeps what the SSD holds",
                ),
                score: g(
                    "strata_master_ssd_admission_score",
                    "Sampled DRAM misses the admit-all shadow served minus those the keeping shadow served (bounded)",
                ),
                sample: g(
                    "strata_master_ssd_admission_sample",
                    "One key in this many feeds the admission shadows",
                ),
            },
            unsynced_commits: c(
                "strata_master_unsynced_commits_total",
                "PutEnds answered with a retryable error because a store node did not confirm the commit (in time, or before the term ended)",
            ),
            resumed_puts: c(
                "strata_master_resumed_puts_total",
                "PutStarts that repeated a put their client's attempt had started and was still writing (its first answer lost), answered with that put again",
            ),
            put_receipts_accepted: receipts.with_label_values(&["accepted"]),
            put_receipts_refused: receipts.with_label_values(&["refused"]),
            is_leader: g(
                "strata_master_is_leader",
                "1 when this master serves as leader",
            ),
            term: g("strata_master_term", "Leadership term of this master"),
            nodes: g("strata_master_nodes", "Live store nodes"),
            segments: g("strata_master_segments", "Mounted segments"),
            open_connections: g(
                "strata_master_open_connections",
                "Connections open on the master's port (gRPC and quick calls)",
            ),
            refused_connections: cv(
                "strata_master_refused_connections_total",
                "Connections to the master's port closed at once, by reason: total (--max-connections reached) or peer (that address's --max-connections-per-peer share)",
                "reason",
                CONNECTION_REFUSALS,
            ),
            inflight_refused: c(
                "strata_master_inflight_refused_calls_total",
                "Calls refused (retryable) because the requests the master was receiving held its whole --max-inflight-bytes budget",
            ),
            lease_ends: cv(
                "strata_master_lease_ends_total",
                "Read leases readers ended when their reads were done, by outcome: ended (the reader's lease; with the last reader the object may be evicted again) or stale (it had ended already, by its TTL, or names a replaced version)",
                "outcome",
                LEASE_END_OUTCOMES,
            ),
            capped_leases: c(
                "strata_master_capped_leases_total",
                "Lookups answered without a read lease because the object's lease had been held --max-lease without a break (a reader that does not end its leases, or a very hot object); the read itself goes ahead",
            ),
            cached_reads: c(
                "strata_master_cached_reads_total",
                "Reads clients served from their location cache within a read lease (reported by them; DRAM hits beside lookups_total)",
            ),
            reclaimed_puts: c(
                "strata_master_reclaimed_puts_total",
                "PutStarts never ended and reclaimed after --put-timeout",
            ),
            overwrites: c(
                "strata_master_overwrites_total",
                "Committed versions replaced by an overwrite (their space is freed once their read leases end)",
            ),
            retired_bytes: g(
                "strata_master_retired_bytes",
                "DRAM held by versions an overwrite replaced, until the read leases on them end",
            ),
            lost_replicas: c(
                "strata_master_lost_replicas_total",
                "Replicas dropped because their node missed --node-ttl",
            ),
            node_log_overflows: c(
                "strata_master_node_log_overflows_total",
                "Store nodes dropped because they fell too far behind applying their object log (they register again)",
            ),
            tombstones: g(
                "strata_master_tombstones",
                "Removal tombstones kept (removed objects whose SSD copies are never adopted again)",
            ),
            unrecorded_copies: c(
                "strata_master_unrecorded_copies_total",
                "SSD copies owners reported without a master's record of giving them the copy (made by an agent of an older release, or forged): dropped instead of adopted",
            ),
            tombstoned_copies: c(
                "strata_master_tombstoned_copies_total",
                "SSD copies of removed objects reported by owners and dropped instead of adopted",
            ),
            tombstone_failures: c(
                "strata_master_tombstone_write_failures_total",
                "Removals whose tombstone could not be written to --state-dir",
            ),
            registry: r,
        }
    }
}

impl MasterMetrics {
    /// Objects dropped with no copy left, all reasons.
    pub fn dropped(&self) -> u64 {
        DROP_REASONS
            .iter()
            .map(|r| self.dropped_objects.with_label_values(&[r]).get())
            .sum()
    }

    /// The `q` quantile of put waits in seconds, interpolated within the
    /// histogram's buckets as PromQL's `histogram_quantile` does (0 when no
    /// put waited).
    pub fn put_wait_quantile(&self, q: f64) -> f64 {
        histogram_quantile(&self.put_wait_seconds, q)
    }
}

fn histogram_quantile(h: &prometheus::Histogram, q: f64) -> f64 {
    use prometheus::core::Collector;
    let Some(m) = h.collect().into_iter().next() else {
        return 0.0;
    };
    let Some(h) = m.get_metric().first().map(|m| m.get_histogram()) else {
        return 0.0;
    };
    let total = h.get_sample_count();
    if total == 0 {
        return 0.0;
    }
    let rank = q.clamp(0.0, 1.0) * total as f64;
    let (mut lower, mut below) = (0.0, 0u64);
    for b in h.get_bucket() {
        let (upper, count) = (b.upper_bound(), b.cumulative_count());
        if count as f64 >= rank {
            let in_bucket = (count - below).max(1) as f64;
            return lower + (upper - lower) * (rank - below as f64) / in_bucket;
        }
        (lower, below) = (upper, count);
    }
    lower
}

impl Default for MasterMetrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labelled_families_export_their_known_values_at_zero_from_the_start() {
        let m = MasterMetrics::new();
        let families: [(&str, &str, &[&str]); 11] = [
            (
                "strata_master_refused_connections_total",
                "reason",
                CONNECTION_REFUSALS,
            ),
            (
                "strata_master_lease_ends_total",
                "outcome",
                LEASE_END_OUTCOMES,
            ),
            (
                "strata_master_put_receipts_total",
                "outcome",
                RECEIPT_OUTCOMES,
            ),
            (
                "strata_master_dropped_objects_total",
                "reason",
                DROP_REASONS,
            ),
            (
                "strata_master_rebuilt_objects_total",
                "outcome",
                REBUILD_OUTCOMES,
            ),
            ("strata_master_lookups_total", "tier", LOOKUP_TIERS),
            ("strata_master_ssd_owners", "state", OWNER_STATES),
            ("strata_master_offload_tasks", "state", TASK_STATES),
            (
                "strata_master_offload_results_total",
                "outcome",
                OFFLOAD_RESULTS,
            ),
            (
                "strata_master_promotions_total",
                "outcome",
                PROMOTION_OUTCOMES,
            ),
            (
                "strata_master_ssd_admission_total",
                "decision",
                ADMISSION_DECISIONS,
            ),
        ];
        strata_common::metrics::check_at_zero(&m.registry, &families).unwrap();
    }

    /// Every operation's ok series exists from the start, and the list is
    /// every operation `service.rs` counts (a new RPC must join it).
    #[test]
    fn every_operation_has_an_ok_series_from_the_start() {
        let src = include_str!("service.rs");
        let mut counted: Vec<&str> = src
            .split("done(\"")
            .skip(1)
            .filter_map(|rest| rest.split('"').next())
            .collect();
        counted.sort_unstable();
        counted.dedup();
        assert_eq!(counted.len(), REQUEST_OPS.len(), "{counted:?}");
        assert_eq!(counted, REQUEST_OPS);
        let m = MasterMetrics::new();
        let families = [("strata_master_requests_total", "op", REQUEST_OPS)];
        strata_common::metrics::check_at_zero(&m.registry, &families).unwrap();
    }

    #[test]
    fn put_wait_quantiles_interpolate_within_buckets() {
        let m = super::MasterMetrics::new();
        assert_eq!(m.put_wait_quantile(0.5), 0.0);
        for _ in 0..99 {
            m.put_wait_seconds.observe(0.003); // bucket (0.001, 0.005]
        }
        m.put_wait_seconds.observe(3.0); // bucket (2.5, 5]
        let p50 = m.put_wait_quantile(0.5);
        assert!(p50 > 0.001 && p50 <= 0.005, "{p50}");
        let p999 = m.put_wait_quantile(0.999);
        assert!(p999 > 2.5 && p999 <= 5.0, "{p999}");
    }
}
