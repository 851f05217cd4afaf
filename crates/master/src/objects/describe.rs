//! An object's metadata as the admin API shows it to operators.

use super::ObjectTable;
use serde_json::json;
use strata_common::time::unix_ms;

impl ObjectTable {
    /// A key's metadata for operators; does not grant a lease.
    pub fn describe(&self, key: &str) -> Option<serde_json::Value> {
        let now = unix_ms();
        let shard = self.shard(key);
        let o = shard.get(key)?;
        let state = if o.is_complete() {
            "complete"
        } else {
            "processing"
        };
        Some(json!({
            "key": key,
            "size": o.size,
            "crc32c": o.crc32c,
            "state": state,
            "replicas": o.replicas().iter().map(|r| json!({
                "kind": "memory",
                "node": r.seg.node.node_id,
                "data_addr": r.seg.node.data_addr,
                "segment_id": r.seg.id,
                "offset": r.offset,
                "state": state,
            })).chain(o.ssd().iter().map(|r| json!({
                "kind": "ssd",
                "owner_id": r.owner_id,
                "bucket_id": r.bucket_id,
                "offset": r.offset,
                "state": state,
            }))).collect::<Vec<_>>(),
            "pins": o.pins,
            "lease_until": o.lease_until_ms,
            "leased": o.leased(now),
            "last_access": o.last_access_ms,
            "pinned": o.hard_pin,
            "soft_pinned": o.soft_pin,
        }))
    }
}
