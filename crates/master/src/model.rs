//! The shared model the master's owners work on: the object table and what
//! goes with its objects (removal tombstones, versions an overwrite
//! replaced), with the configuration and metrics every step reads. `Master`
//! owns these; each owner (`Cluster`, `Writes`, `Pressure`, `SsdTier`,
//! `RebuildGate`) is handed a `Model` for one call, Quickwit style, so no
//! owner reaches into another's state.

use crate::config::MasterConfig;
use crate::metrics::MasterMetrics;
use crate::objects::{Object, ObjectTable, Retired};
use crate::tombstones::Tombstones;

/// The shared model, borrowed from `Master` for one call.
#[derive(Clone, Copy)]
pub(crate) struct Model<'a> {
    pub(crate) cfg: &'a MasterConfig,
    pub(crate) objects: &'a ObjectTable,
    pub(crate) tombstones: &'a Tombstones,
    pub(crate) retired: &'a Retired,
    pub(crate) metrics: &'a MasterMetrics,
}

impl Model<'_> {
    /// Records durable tombstones for removed objects that may have SSD
    /// copies somewhere (`tombstones.rs`).
    pub(crate) fn tombstone(&self, removed: &[(&str, &Object)]) {
        let t: Vec<(String, u64, u32)> = removed
            .iter()
            .filter(|(_, o)| o.is_complete() && (o.offloaded() || !o.ssd().is_empty()))
            .map(|(k, o)| (k.to_string(), o.size, o.crc32c))
            .collect();
        if let Err(e) = self.tombstones.record(&t) {
            // The removal stands; a copy on an unreachable owner may come
            // back at a restart. Loud, because it needs the disk fixed.
            tracing::error!(error = %e, keys = t.len(), "cannot persist removal tombstones");
            self.metrics.tombstone_failures.inc();
        }
    }
}
