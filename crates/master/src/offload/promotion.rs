//! Promotion (`--promote-on-hit`): a read served from SSD queues a copy of
//! the object back into DRAM. The read itself never waits: the queue is
//! bounded and a hit that finds it full is simply not promoted. The owning
//! agent does the copy (it has the bytes locally): at hand-out the master
//! places a DRAM range and gives the agent a write grant; the range joins
//! the object only when the agent reports the copy done, and is freed on
//! failure, on expiry, or if the object changed meanwhile.

use super::SsdTier;
use crate::cluster::Replica;
use crate::model::Model;
use std::collections::{HashMap, HashSet, VecDeque};
use strata_common::grant::PERM_WRITE;
use strata_common::time::unix_ms;
use strata_common::Result;
use strata_proto as pb;

/// Promotions handed to one owner per heartbeat.
const PER_HEARTBEAT: usize = 64;

struct InFlight {
    key: String,
    owner: u64,
    size: u64,
    crc32c: u32,
    replicas: Vec<Replica>,
    deadline_ms: u64,
}

#[derive(Default)]
pub(crate) struct Promotions {
    queued: HashMap<u64, VecDeque<String>>,
    queued_len: usize,
    /// Keys queued or in flight: each is promoted once at a time.
    keys: HashSet<String>,
    in_flight: HashMap<u64, InFlight>,
    next_id: u64,
}

fn free(replicas: Vec<Replica>) {
    for r in replicas {
        r.seg.free(r.offset, r.alloc_len);
    }
}

impl SsdTier {
    /// Called on an SSD hit: queues `key` for promotion by `owner`.
    pub(crate) fn maybe_promote(&self, m: Model, key: &str, owner: u64) {
        if !m.cfg.promote_on_hit {
            return;
        }
        let mut p = self.promotions.lock();
        if p.keys.contains(key) {
            return;
        }
        if p.queued_len >= m.cfg.promote_queue {
            drop(p);
            m.metrics
                .promotions
                .with_label_values(&["queue_full"])
                .inc();
            return;
        }
        p.keys.insert(key.to_string());
        p.queued
            .entry(owner)
            .or_default()
            .push_back(key.to_string());
        p.queued_len += 1;
        drop(p);
        m.metrics.promotions.with_label_values(&["queued"]).inc();
    }

    /// Hands `owner` its next promotions, each with a DRAM range to fill.
    /// `place` finds the DRAM of one promoted object (a `Pressure` placement).
    pub(crate) fn take_promotions(
        &self,
        m: Model,
        owner: u64,
        place: impl Fn(u64) -> Result<Vec<Replica>>,
    ) -> Vec<pb::PromoteTask> {
        let keys: Vec<String> = {
            let mut p = self.promotions.lock();
            let Some(q) = p.queued.get_mut(&owner) else {
                return Vec::new();
            };
            let n = q.len().min(PER_HEARTBEAT);
            let keys: Vec<String> = q.drain(..n).collect();
            if q.is_empty() {
                p.queued.remove(&owner);
            }
            p.queued_len -= keys.len();
            keys
        };
        let now = unix_ms();
        let deadline = now + m.cfg.offload_task_ttl.as_millis() as u64;
        let mut out = Vec::new();
        for key in keys {
            // Still SSD-only, and held by this owner?
            let src = m.objects.shard(&key).get(&key).and_then(|o| {
                let s = o.ssd().iter().find(|s| s.owner_id == owner)?;
                (o.is_complete() && o.replicas().is_empty()).then_some((o.size, o.crc32c, *s))
            });
            let placed = src.map(|(size, crc, s)| (size, crc, s, place(size)));
            let (size, crc, s, replicas) = match placed {
                Some((size, crc, s, Ok(r))) => (size, crc, s, r),
                other => {
                    let why = if matches!(other, Some((.., Err(_)))) {
                        "no_room"
                    } else {
                        "stale"
                    };
                    m.metrics.promotions.with_label_values(&[why]).inc();
                    self.promotions.lock().keys.remove(&key);
                    continue;
                }
            };
            let dest = replicas[0].view(size, PERM_WRITE, deadline, false);
            let mut p = self.promotions.lock();
            p.next_id += 1;
            let task_id = p.next_id;
            p.in_flight.insert(
                task_id,
                InFlight {
                    key: key.clone(),
                    owner,
                    size,
                    crc32c: crc,
                    replicas,
                    deadline_ms: deadline,
                },
            );
            out.push(pb::PromoteTask {
                task_id,
                key,
                size,
                crc32c: crc,
                bucket_id: s.bucket_id,
                offset: s.offset,
                dest: Some(dest),
                deadline_unix_ms: deadline,
            });
        }
        out
    }

    pub(crate) fn report_promotion(&self, m: Model, req: pb::ReportPromotionRequest) -> Result<()> {
        self.owners
            .check_epoch(req.owner_id, req.epoch, &req.instance_proof)?;
        for r in req.results {
            let Some(f) = ({
                let mut p = self.promotions.lock();
                let f = p
                    .in_flight
                    .remove_entry(&r.task_id)
                    .filter(|(_, f)| f.owner == req.owner_id);
                match f {
                    Some((_, f)) => {
                        p.keys.remove(&f.key);
                        Some(f)
                    }
                    None => None,
                }
            }) else {
                continue;
            };
            if !r.ok {
                tracing::debug!(key = f.key, error = r.error, "promotion failed");
                free(f.replicas);
                m.metrics.promotions.with_label_values(&["failed"]).inc();
                continue;
            }
            let leftover = {
                let mut shard = m.objects.shard(&f.key);
                match shard.get_mut(&f.key) {
                    Some(o)
                        if o.is_complete()
                            && o.replicas().is_empty()
                            && o.size == f.size
                            && o.crc32c == f.crc32c =>
                    {
                        for r in &f.replicas {
                            r.seg.node.log_object(
                                strata_proto::object_log_entry::Op::Commit,
                                true,
                                &f.key,
                                r.seg.id,
                                r.offset,
                                o.size,
                                o.crc32c,
                                r.generation,
                                o.digest(),
                            );
                        }
                        o.set_replicas(f.replicas);
                        o.last_access_ms = unix_ms();
                        None
                    }
                    _ => Some(f.replicas),
                }
            };
            let outcome = match leftover {
                None => "promoted",
                Some(r) => {
                    free(r);
                    "stale"
                }
            };
            m.metrics.promotions.with_label_values(&[outcome]).inc();
        }
        Ok(())
    }

    /// Frees the ranges of promotions not reported in time.
    pub(crate) fn expire_promotions(&self, m: Model, now_ms: u64) {
        let expired: Vec<InFlight> = {
            let mut p = self.promotions.lock();
            let ids: Vec<u64> = p
                .in_flight
                .iter()
                .filter(|(_, f)| f.deadline_ms <= now_ms)
                .map(|(&id, _)| id)
                .collect();
            let out: Vec<InFlight> = ids.iter().filter_map(|id| p.in_flight.remove(id)).collect();
            for f in &out {
                p.keys.remove(&f.key);
            }
            out
        };
        for f in expired {
            free(f.replicas);
            m.metrics.promotions.with_label_values(&["expired"]).inc();
        }
    }

    /// (queued, in flight) promotions.
    pub(crate) fn promotion_counts(&self) -> (usize, usize) {
        let p = self.promotions.lock();
        (p.queued_len, p.in_flight.len())
    }
}
