//! What the table shows: an object's metadata for operators (the admin
//! API's `describe`) and key listings (`strata ls`).

use super::ObjectTable;
use serde_json::json;
use std::collections::BinaryHeap;
use strata_common::time::unix_ms;
use strata_proto as pb;

impl ObjectTable {
    /// A key's metadata for operators; does not grant a lease. Never its
    /// checksum: crc32c is forgeable, and a published one tells a lying
    /// member what its substitute bytes must match.
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
            "state": state,
            // What readers verify it with (the digest itself stays here).
            "verified_by": if o.digest().is_some() { "blake3" } else { "crc32c" },
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
            "readers": o.readers(now),
            "last_access": o.last_access_ms,
            "pinned": o.hard_pin(),
            "soft_pinned": o.soft_pin(),
        }))
    }

    /// Up to `limit` keys after `start_after` that start with `prefix`, in
    /// key order, and whether more exist.
    ///
    /// Keeps only the `limit + 1` smallest keys seen (a max-heap), so one
    /// call over millions of objects holds a page, never the whole table.
    /// Each call still scans every shard: the shards are hashed, not
    /// ordered.
    pub fn list(
        &self,
        prefix: &str,
        start_after: &str,
        limit: usize,
    ) -> (Vec<pb::ObjectSummary>, bool) {
        let mut page = Page::new(limit.saturating_add(1));
        for shard in self.shards() {
            let s = shard.lock();
            for (k, o) in s
                .iter()
                .filter(|(k, _)| k.starts_with(prefix) && *k > start_after)
            {
                if page.wants(k) {
                    page.offer(pb::ObjectSummary {
                        key: k.to_string(),
                        size: o.size,
                        replicas: o.replicas().len() as u32,
                        complete: o.is_complete(),
                    });
                }
            }
        }
        let mut all = page.into_sorted();
        let truncated = all.len() > limit;
        all.truncate(limit);
        (all, truncated)
    }
}

/// The `keep` smallest keys offered, in a max-heap: its top is the first
/// to go when a smaller key comes.
struct Page {
    keep: usize,
    heap: BinaryHeap<ByKey>,
}

impl Page {
    fn new(keep: usize) -> Page {
        Page {
            keep,
            heap: BinaryHeap::new(),
        }
    }

    /// Whether `key` would be kept (checked before building its summary).
    fn wants(&self, key: &str) -> bool {
        self.heap.len() < self.keep || self.heap.peek().is_some_and(|top| key < top.0.key.as_str())
    }

    fn offer(&mut self, s: pb::ObjectSummary) {
        self.heap.push(ByKey(s));
        if self.heap.len() > self.keep {
            self.heap.pop();
        }
    }

    fn into_sorted(self) -> Vec<pb::ObjectSummary> {
        self.heap
            .into_sorted_vec()
            .into_iter()
            .map(|s| s.0)
            .collect()
    }
}

/// A listed object ordered by its key (keys are unique in a table).
struct ByKey(pb::ObjectSummary);

impl PartialEq for ByKey {
    fn eq(&self, other: &Self) -> bool {
        self.0.key == other.0.key
    }
}

impl Eq for ByKey {}

impl PartialOrd for ByKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ByKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.key.cmp(&other.0.key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::Object;

    /// A page never holds more than it keeps, whatever it is offered,
    /// and keeps the smallest keys.
    #[test]
    fn a_page_holds_at_most_what_it_keeps() {
        let mut page = Page::new(5);
        // 1000 distinct keys in a scrambled order.
        for i in 0..1000u64 {
            let key = format!("{:04}", (i * 617) % 1000);
            if page.wants(&key) {
                page.offer(pb::ObjectSummary {
                    key,
                    ..Default::default()
                });
            }
            assert!(page.heap.len() <= 5, "after {i}: {}", page.heap.len());
        }
        let keys: Vec<String> = page.into_sorted().into_iter().map(|s| s.key).collect();
        assert_eq!(keys, ["0000", "0001", "0002", "0003", "0004"]);
    }

    /// Pages of a bounded heap are what sorting every key gives, across
    /// shards, prefixes, starting points and limits (0, 1, exact, beyond).
    #[test]
    fn a_page_is_the_smallest_keys_after_the_start_in_order() {
        let t = ObjectTable::default();
        let mut keys: Vec<String> = (0..500)
            .map(|i| format!("{}/{i:04}", ["a", "b"][i % 2]))
            .collect();
        for k in &keys {
            t.shard(k)
                .insert(k, Object::committed(10, 0, Vec::new(), Vec::new()));
        }
        keys.sort();
        for (prefix, start, limit) in [
            ("", "", 0),
            ("", "", 1),
            ("", "", 499),
            ("", "", 500),
            ("", "", 10_000),
            ("a/", "", 250),
            ("a/", "", 249),
            ("b/", "b/0100", 7),
            ("a/", "a/0498", 5),
            ("c/", "", 5),
        ] {
            let want: Vec<&String> = keys
                .iter()
                .filter(|k| k.starts_with(prefix) && k.as_str() > start)
                .collect();
            let (got, truncated) = t.list(prefix, start, limit);
            let got: Vec<&String> = got.iter().map(|s| &s.key).collect();
            assert_eq!(
                got.len(),
                want.len().min(limit),
                "{prefix:?} {start:?} {limit}"
            );
            assert_eq!(got, want[..got.len()], "{prefix:?} {start:?} {limit}");
            assert_eq!(
                truncated,
                want.len() > limit,
                "{prefix:?} {start:?} {limit}"
            );
        }
    }
}
