//! The offload worker: takes a batch of tasks from the master, copies the
//! pinned DRAM sources, groups them into buckets and writes EVERY bucket of
//! the batch in the same cycle (the last, partial one included), then reports
//! each task as persisted or failed. No task of a batch is left unreported.

use crate::store::OwnerStore;
use futures::StreamExt;
use prometheus::IntCounterVec;
use std::sync::Arc;
use strata_common::{Code, Error};
use strata_proto as pb;
use strata_transport::Transport;

/// Splits tasks into buckets: at most `max_keys` objects and `max_bytes`
/// bytes each; an object larger than `max_bytes` gets a bucket of its own.
pub fn plan_buckets(sizes: &[u64], max_keys: usize, max_bytes: u64) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut cur: Vec<usize> = Vec::new();
    let mut cur_bytes = 0u64;
    for (i, &s) in sizes.iter().enumerate() {
        if !cur.is_empty() && (cur.len() >= max_keys || cur_bytes + s > max_bytes) {
            out.push(std::mem::take(&mut cur));
            cur_bytes = 0;
        }
        cur.push(i);
        cur_bytes += s;
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// Source copies in flight per bucket.
const FETCH_CONCURRENCY: usize = 16;

/// A bucket being written on the blocking pool, and the tasks in it.
struct PendingWrite {
    tasks: Vec<usize>,
    handle: tokio::task::JoinHandle<strata_common::Result<crate::index::BucketRecord>>,
}

impl PendingWrite {
    async fn finish(self, tasks: &[pb::OffloadTask], results: &mut Vec<pb::OffloadResult>) {
        let written = self
            .handle
            .await
            .map_err(|e| Error::internal(format!("bucket write task failed: {e}")))
            .and_then(|r| r);
        match written {
            Ok(rec) => {
                for (&i, e) in self.tasks.iter().zip(&rec.objects) {
                    results.push(pb::OffloadResult {
                        task_id: tasks[i].task_id,
                        persisted: true,
                        bucket_id: rec.bucket_id,
                        offset: e.offset,
                        error: String::new(),
                        code: 0,
                    });
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, objects = self.tasks.len(), "bucket write failed");
                for &i in &self.tasks {
                    results.push(failed(&tasks[i], format!("bucket write: {e}"), e.code));
                }
            }
        }
    }
}

/// A source's bytes, or why they could not be copied (and whether retrying
/// may help: `Corrupted` never does).
type Fetched = Result<Vec<u8>, (String, Code)>;

pub struct Worker {
    pub store: Arc<OwnerStore>,
    pub transport: Arc<dyn Transport>,
    pub bucket_keys: usize,
    pub bucket_bytes: u64,
    pub outcomes: IntCounterVec,
    pub checksum_failures: prometheus::IntCounter,
}

fn failed(t: &pb::OffloadTask, why: String, code: strata_common::Code) -> pb::OffloadResult {
    pb::OffloadResult {
        task_id: t.task_id,
        persisted: false,
        bucket_id: 0,
        offset: 0,
        error: why,
        code: code as u32,
    }
}

impl Worker {
    /// Copies one source replica, checking the committed checksum. A
    /// mismatch is `Corrupted` (the object's bytes are bad: retrying cannot
    /// help); anything else may pass on a retry.
    async fn fetch(&self, t: &pb::OffloadTask) -> Fetched {
        let unavailable = |e: String| (e, Code::Unavailable);
        let src = t
            .source
            .as_ref()
            .ok_or_else(|| unavailable("task has no source replica".into()))?;
        let range = strata_transport::remote_range(src).map_err(|e| unavailable(e.to_string()))?;
        let mut buf = vec![0u8; t.size as usize];
        let crc = self
            .transport
            .read_crc32c(&range, 0, &mut buf)
            .await
            .map_err(|e| unavailable(format!("reading source: {e}")))?;
        if crc != t.crc32c {
            self.checksum_failures.inc();
            tracing::error!(key = t.key, "offload source failed its committed checksum");
            return Err((
                "source bytes fail the committed checksum".into(),
                Code::Corrupted,
            ));
        }
        Ok(buf)
    }

    /// Processes one batch; returns exactly one result per task.
    /// Processes one batch; returns exactly one result per task. The sources
    /// of bucket n+1 are copied while bucket n is written and synced.
    pub async fn process(&self, tasks: &[pb::OffloadTask]) -> Vec<pb::OffloadResult> {
        let sizes: Vec<u64> = tasks.iter().map(|t| t.size).collect();
        let mut results = Vec::with_capacity(tasks.len());
        let mut writing: Option<PendingWrite> = None;
        for group in plan_buckets(&sizes, self.bucket_keys, self.bucket_bytes) {
            let mut futs = Vec::with_capacity(group.len());
            for &i in &group {
                futs.push(async move { (i, self.fetch(&tasks[i]).await) });
            }
            let fetched: Vec<(usize, Fetched)> = futures::stream::iter(futs)
                .buffered(FETCH_CONCURRENCY)
                .collect()
                .await;
            let mut ok: Vec<usize> = Vec::new();
            let mut owned: Vec<(String, Vec<u8>, u32)> = Vec::new();
            let mut records: Vec<Vec<u8>> = Vec::new();
            for (i, r) in fetched {
                match r {
                    Ok(data) => {
                        ok.push(i);
                        owned.push((tasks[i].key.clone(), data, tasks[i].crc32c));
                        records.push(tasks[i].copy_record.clone());
                    }
                    Err((why, code)) => results.push(failed(&tasks[i], why, code)),
                }
            }
            // One bucket in flight at a time: finish the previous write first.
            if let Some(w) = writing.take() {
                w.finish(tasks, &mut results).await;
            }
            if ok.is_empty() {
                continue;
            }
            let store = self.store.clone();
            writing = Some(PendingWrite {
                tasks: ok,
                handle: tokio::task::spawn_blocking(move || {
                    let objs: Vec<(&str, &[u8], u32)> = owned
                        .iter()
                        .map(|(k, d, c)| (k.as_str(), d.as_slice(), *c))
                        .collect();
                    store.write_bucket_with_slack(&objs, &records, 0)
                }),
            });
        }
        if let Some(w) = writing.take() {
            w.finish(tasks, &mut results).await;
        }
        for r in &results {
            let outcome = if r.persisted { "persisted" } else { "failed" };
            self.outcomes.with_label_values(&[outcome]).inc();
        }
        debug_assert_eq!(results.len(), tasks.len());
        results
    }

    pub fn drop_report(&self) -> bool {
        fail::fail_point!("ssd-agent::drop-offload-report", |_| true);
        false
    }
}

#[cfg(test)]
mod tests {
    use super::plan_buckets;

    #[test]
    fn every_task_lands_in_exactly_one_bucket_tail_included() {
        let mb = 1 << 20;
        // 11 objects, 500-key buckets: one bucket, the "tail".
        assert_eq!(
            plan_buckets(&[mb; 11], 500, 256 * mb),
            vec![(0..11).collect::<Vec<_>>()]
        );
        // Key limit splits, last partial bucket kept.
        let b = plan_buckets(&[1; 7], 3, 100);
        assert_eq!(b, vec![vec![0, 1, 2], vec![3, 4, 5], vec![6]]);
        // Oversized objects get their own bucket.
        let b = plan_buckets(&[10, 500, 10, 10], 100, 100);
        assert_eq!(b, vec![vec![0], vec![1], vec![2, 3]]);
        assert!(plan_buckets(&[], 3, 3).is_empty());
    }

    proptest::proptest! {
        #[test]
        fn plan_covers_each_task_once(sizes in proptest::collection::vec(1u64..1000, 0..200), keys in 1usize..20, bytes in 1u64..3000) {
            let plan = plan_buckets(&sizes, keys, bytes);
            let mut seen: Vec<usize> = plan.iter().flatten().copied().collect();
            seen.sort();
            proptest::prop_assert_eq!(seen, (0..sizes.len()).collect::<Vec<_>>());
            for b in &plan {
                proptest::prop_assert!(b.len() <= keys);
                let total: u64 = b.iter().map(|&i| sizes[i]).sum();
                proptest::prop_assert!(total <= bytes || b.len() == 1);
            }
        }
    }
}
