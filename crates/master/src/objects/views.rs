//! What the table shows: an object's metadata for operators (the admin
//! API's `describe`) and key listings (`strata ls`).

use super::ObjectTable;
use serde_json::json;
use strata_common::time::unix_ms;
use strata_proto as pb;

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

    /// Up to `limit` keys after `start_after` that start with `prefix`, in
    /// key order, and whether more exist.
    pub fn list(
        &self,
        prefix: &str,
        start_after: &str,
        limit: usize,
    ) -> (Vec<pb::ObjectSummary>, bool) {
        let mut all: Vec<pb::ObjectSummary> = Vec::new();
        for shard in self.shards() {
            let s = shard.lock();
            all.extend(
                s.iter()
                    .filter(|(k, _)| k.starts_with(prefix) && *k > start_after)
                    .map(|(k, o)| pb::ObjectSummary {
                        key: k.to_string(),
                        size: o.size,
                        replicas: o.replicas().len() as u32,
                        complete: o.is_complete(),
                    }),
            );
        }
        all.sort_by(|a, b| a.key.cmp(&b.key));
        let truncated = all.len() > limit;
        all.truncate(limit);
        (all, truncated)
    }
}
