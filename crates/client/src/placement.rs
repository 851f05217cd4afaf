//! Placement on a named node (`PutOptions::preferred_node`): which segment
//! the master should try first, from a map of node name -> segments that is
//! refreshed from `Stat` now and then. A stale answer only costs placement
//! (the master places elsewhere when the segment is gone or full), never
//! correctness.

use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use strata_common::Result;
use strata_proto as pb;

/// How long the map is trusted before it is asked for again.
const TTL: Duration = Duration::from_secs(5);
/// A node missing from a fresh map is looked for again at most this often.
const MISS_RETRY: Duration = Duration::from_secs(1);

/// Segments by node name, as of `at`.
#[derive(Default)]
pub(crate) struct NodeSegments {
    map: Mutex<Map>,
}

#[derive(Default)]
struct Map {
    at: Option<Instant>,
    by_node: Vec<(String, u64)>,
}

impl Map {
    fn lookup(&self, node: &str) -> Option<u64> {
        self.by_node
            .iter()
            .find(|(n, _)| n == node)
            .map(|&(_, seg)| seg)
    }

    fn younger_than(&self, d: Duration) -> bool {
        self.at.is_some_and(|t| t.elapsed() < d)
    }
}

impl NodeSegments {
    /// A segment of `node` (the one with the most free room when the map
    /// was made), asking `stat` for a new map when this one is old or, at
    /// most once a second, when it lacks the node.
    pub(crate) async fn segment_of<F, Fut>(&self, node: &str, stat: F) -> Option<u64>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<pb::StatResponse>>,
    {
        {
            let m = self.map.lock().unwrap_or_else(|p| p.into_inner());
            if m.younger_than(TTL) {
                if let Some(seg) = m.lookup(node) {
                    return Some(seg);
                }
                if m.younger_than(MISS_RETRY) {
                    return None;
                }
            }
        }
        let mut segs = stat().await.ok()?.segment_info;
        // Most free room first, so a node's emptiest segment is preferred.
        segs.sort_by_key(|s| std::cmp::Reverse(s.capacity_bytes.saturating_sub(s.allocated_bytes)));
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        m.at = Some(Instant::now());
        m.by_node = segs
            .into_iter()
            .map(|s| (s.node_id, s.segment_id))
            .collect();
        m.lookup(node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(segs: &[(&str, u64, u64)]) -> pb::StatResponse {
        pb::StatResponse {
            segment_info: segs
                .iter()
                .map(|&(node, id, free)| pb::SegmentInfo {
                    segment_id: id,
                    node_id: node.into(),
                    capacity_bytes: 1000,
                    allocated_bytes: 1000 - free,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn picks_the_named_nodes_emptiest_segment_and_caches_the_map() {
        let n = NodeSegments::default();
        let asked = std::sync::atomic::AtomicUsize::new(0);
        let ask = |segs: Vec<(&'static str, u64, u64)>| {
            asked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            async move { Ok(stat(&segs)) }
        };
        let segs = vec![("a", 1, 10), ("b", 2, 500), ("a", 3, 900)];
        assert_eq!(n.segment_of("a", || ask(segs.clone())).await, Some(3));
        assert_eq!(n.segment_of("b", || ask(segs.clone())).await, Some(2));
        // Unknown node, map fresh: no second Stat within a second.
        assert_eq!(n.segment_of("c", || ask(segs.clone())).await, None);
        assert_eq!(asked.load(std::sync::atomic::Ordering::Relaxed), 1);
        // A failed Stat places nowhere in particular.
        let m = NodeSegments::default();
        let failed = m
            .segment_of("a", || async {
                Err(strata_common::Error::unavailable("down"))
            })
            .await;
        assert_eq!(failed, None);
    }
}
