//! The store node's Prometheus metrics (`strata_store_node_*`): names are a
//! contract with the dashboard and alerts (`deploy/`); add, never rename.

use prometheus::{IntCounter, IntGauge, Registry};
use strata_transport::tcp::ServerMetrics;

pub(crate) struct NodeMetrics {
    pub(crate) registry: Registry,
    pub(crate) capacity: IntGauge,
    pub(crate) ucx_exposed: IntGauge,
    pub(crate) objects: IntGauge,
    pub(crate) object_bytes: IntGauge,
    pub(crate) pending_puts: IntGauge,
    pub(crate) recorded_puts: IntCounter,
    pub(crate) refused_records: IntCounter,
    pub(crate) registrations: IntCounter,
    pub(crate) heartbeats_quick: IntCounter,
    pub(crate) heartbeats_grpc: IntCounter,
    pub(crate) fenced_answers: IntCounter,
    pub(crate) server: ServerMetrics,
}

impl NodeMetrics {
    pub(crate) fn new() -> Self {
        let r = Registry::new();
        let g = |n: &str, h: &str| strata_common::metrics::gauge(&r, n, h);
        let c = |n: &str, h: &str| strata_common::metrics::counter(&r, n, h);
        let heartbeats = strata_common::metrics::register(
            &r,
            prometheus::IntCounterVec::new(
                prometheus::Opts::new(
                    "strata_store_node_heartbeats_total",
                    "Heartbeats the master answered, by path: quick (a plain connection) or grpc (the fallback: an older master, no leader known yet, a broken quick connection)",
                ),
                &["path"],
            )
            .expect("valid metric"),
        );
        NodeMetrics {
            capacity: g(
                "strata_store_node_capacity_bytes",
                "DRAM this node contributes",
            ),
            ucx_exposed: g(
                "strata_store_node_ucx_exposed_bytes",
                "DRAM registered with UCX for one-sided access by rdma clients (0: TCP only; one-sided traffic bypasses the data-plane byte counters)",
            ),
            objects: g(
                "strata_store_node_objects",
                "Committed objects this node holds",
            ),
            object_bytes: g(
                "strata_store_node_object_bytes",
                "Bytes of committed objects held",
            ),
            pending_puts: g(
                "strata_store_node_pending_puts",
                "Puts announced to this node or recorded from their writes, not yet committed or freed (reported to a rebuilding master if their bytes match their checksum)",
            ),
            recorded_puts: c(
                "strata_store_node_recorded_puts_total",
                "Puts recorded from their clients' writes and answered with a receipt (the master acknowledges them without this node's heartbeat)",
            ),
            refused_records: c(
                "strata_store_node_refused_records_total",
                "Writes whose put record was refused: not signed by the master, not the whole grant, or its range freed before it was kept",
            ),
            registrations: c(
                "strata_store_node_registrations_total",
                "Registrations with the master",
            ),
            fenced_answers: c(
                "strata_store_node_fenced_answers_total",
                "Master answers refused because they came from a lower term than one already seen (a deposed leader still answering)",
            ),
            heartbeats_quick: heartbeats.with_label_values(&["quick"]),
            heartbeats_grpc: heartbeats.with_label_values(&["grpc"]),
            server: ServerMetrics {
                requests: c(
                    "strata_store_node_data_plane_requests_total",
                    "Data-plane requests received (a batch read counts once)",
                ),
                read_bytes: c(
                    "strata_store_node_read_bytes_total",
                    "Bytes served to readers",
                ),
                written_bytes: c(
                    "strata_store_node_written_bytes_total",
                    "Bytes written by clients",
                ),
                rejected: c(
                    "strata_store_node_rejected_requests_total",
                    "Data-plane requests refused (bad frame, grant or range)",
                ),
                refused_connections: c(
                    "strata_store_node_refused_connections_total",
                    "Data-plane connections refused at accept (total or per-peer limit)",
                ),
                cut_off: c(
                    "strata_store_node_cut_off_connections_total",
                    "Data-plane connections cut off: no grant in time, stalled I/O, too many refused requests",
                ),
            },
            registry: r,
        }
    }
}
