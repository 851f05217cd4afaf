//! What the SSD tier shows: on the admin API (`admin.rs` serves it), in
//! `strata stat` and in the owner gauges.

use super::SsdTier;
use crate::metrics::MasterMetrics;
use serde_json::json;
use strata_proto as pb;

impl SsdTier {
    /// The owners as `strata stat` shows them.
    pub(crate) fn owner_infos(&self) -> Vec<pb::OwnerInfo> {
        self.owners
            .snapshot()
            .into_iter()
            .map(|(o, live)| pb::OwnerInfo {
                handle: o.handle,
                owner_id: o.owner_id,
                used_bytes: o.used,
                buckets: o.buckets,
                capacity_bytes: o.capacity,
                live,
                data_addr: o.data_addr,
                overhead_bytes: o.overhead,
            })
            .collect()
    }

    /// `strata_master_ssd_owners{state}`: live and gone owners.
    pub(crate) fn refresh_owner_gauges(&self, m: &MasterMetrics) {
        let owners = self.owners.snapshot();
        let live = owners.iter().filter(|(_, live)| *live).count();
        m.ssd_owners.with_label_values(&["live"]).set(live as i64);
        m.ssd_owners
            .with_label_values(&["gone"])
            .set((owners.len() - live) as i64);
    }

    /// The owners, for `/api/v1/owners`.
    pub(crate) fn describe_owners(&self) -> serde_json::Value {
        let q = self.queue.lock();
        let owners: Vec<serde_json::Value> = self
            .owners
            .snapshot()
            .into_iter()
            .map(|(o, live)| {
                json!({
                    "handle": o.handle,
                    "owner_id": o.owner_id,
                    "epoch": o.epoch,
                    "instance": o.instance,
                    "data_addr": o.data_addr,
                    "bytes": o.used,
                    "object_bytes": o.used - o.overhead,
                    "overhead_bytes": o.overhead,
                    "buckets": o.buckets,
                    "capacity": o.capacity,
                    "pending_offload_bytes": q.pending_bytes(o.owner_id),
                    "unknown_files": o.unknown_files,
                    "quarantined_files": o.quarantined_files,
                    "live": live,
                })
            })
            .collect();
        json!({ "owners": owners, "durable_state": self.owners.kv_name() })
    }

    /// The offload queue, for `/api/v1/offload`, naming its tasks' keys
    /// only `with_keys` (the admin's); `pins` counts the pins objects hold
    /// (asked once the queue's lock is released).
    pub(crate) fn describe_offload(
        &self,
        with_keys: bool,
        pins: impl FnOnce() -> u64,
    ) -> serde_json::Value {
        let q = self.queue.lock();
        let (queued, assigned) = q.counts();
        let c = q.counters;
        let tasks: Vec<serde_json::Value> = q
            .tasks()
            .take(1000)
            .map(|t| {
                let state = match t.state {
                    super::queue::TaskState::Queued { .. } => "queued",
                    super::queue::TaskState::Assigned { .. } => "assigned",
                };
                let mut v = json!({"task_id": t.id, "owner_id": t.owner, "size": t.size, "attempts": t.attempts, "state": state});
                if with_keys {
                    v["key"] = json!(t.key);
                }
                v
            })
            .collect();
        drop(q);
        json!({
            "policy": self.policy.name(),
            "ssd_admission": self.admission.describe(),
            "queued": queued,
            "assigned": assigned,
            "persisted": c.persisted,
            "failed": c.failed,
            "expired": c.expired,
            "dropped": c.dropped,
            "pins": pins(),
            "tasks": tasks,
        })
    }
}
