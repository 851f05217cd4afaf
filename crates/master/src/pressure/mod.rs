//! DRAM pressure: placing a put's replicas, evicting when nothing fits
//! (here), eviction itself (`eviction.rs`: the background evictor down to
//! the watermark, and inline eviction for a put that does not fit) and
//! backpressure (`backpressure.rs`: puts that wait, bounded by
//! `--put-wait`, for DRAM that copies to SSD or the end of readers' leases
//! will free). [`Pressure`] holds their signals; its fields are private to
//! `pressure/`. It takes the shared model, the cluster's segments and the
//! SSD tier as arguments.

pub mod backpressure;
pub mod eviction;
#[cfg(test)]
mod tests;

use crate::cluster::allocator::aligned_len;
use crate::cluster::{Cluster, Replica};
use crate::model::Model;
use crate::offload::SsdTier;
use backpressure::PutWaiters;
use strata_common::time::unix_ms;
use strata_common::{Code, Error, Result};

/// Rounds of "evict, then try again" a PutStart makes before giving up.
const EVICT_ROUNDS: usize = 4;

/// What one allocation attempt found.
pub(crate) enum Placement {
    Placed(Vec<Replica>),
    /// Nothing fits now; this many DRAM bytes free once copies to SSD land.
    Wait(u64),
}

/// The DRAM a put asks for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Want {
    pub(crate) size: u64,
    /// Replicas, on distinct segments.
    pub(crate) n: u32,
    pub(crate) preferred: Option<u64>,
    /// A put will wait for copies to SSD in flight: they go first.
    pub(crate) urgent: bool,
    /// The master is young (rebuild window): an empty cluster is a
    /// retryable refusal, its nodes may still be registering.
    pub(crate) rebuilding: bool,
}

impl Want {
    /// DRAM placed now, not ahead of copies in flight.
    pub(crate) fn now(size: u64, n: u32, preferred: Option<u64>, rebuilding: bool) -> Want {
        Want {
            size,
            n,
            preferred,
            urgent: false,
            rebuilding,
        }
    }
}

/// The signals of DRAM pressure.
#[derive(Default)]
pub(crate) struct Pressure {
    /// Puts waiting for DRAM (`--put-wait`).
    waiters: PutWaiters,
    /// Rung when a put leaves DRAM above the high watermark: the evictor
    /// runs now rather than at its next tick.
    evict_wakeup: tokio::sync::Notify,
}

impl Pressure {
    /// DRAM may have been freed: the waiting put whose turn it is looks
    /// again.
    pub(crate) fn space_freed(&self) {
        self.waiters.notify();
    }

    /// Puts waiting for DRAM now.
    pub(crate) fn waiting(&self) -> usize {
        self.waiters.waiting()
    }

    /// Asks the background evictor to run now.
    pub(crate) fn wake_evictor(&self) {
        self.evict_wakeup.notify_one();
    }

    /// Fires when a put asked the evictor to run (`wake_evictor`).
    pub(crate) fn evictor_wanted(&self) -> tokio::sync::futures::Notified<'_> {
        self.evict_wakeup.notified()
    }

    /// Places `want.n` replicas on distinct segments (at least one),
    /// evicting when nothing fits; never waits (what a waiting put would
    /// wait for is a retryable no_space here).
    pub(crate) fn allocate(
        &self,
        m: Model,
        cluster: &Cluster,
        ssd: &SsdTier,
        want: Want,
    ) -> Result<Vec<Replica>> {
        match self.allocate_once(m, cluster, ssd, want)? {
            Placement::Placed(r) => Ok(r),
            Placement::Wait(pending) => Err(no_space_waiting(m, ssd, want.size, pending)),
        }
    }

    /// One attempt: place, else evict (a few rounds) and place. Says when
    /// only copies to SSD in flight could make room; with `want.urgent` (a
    /// put will wait for them) those copies go first.
    pub(crate) fn allocate_once(
        &self,
        m: Model,
        cluster: &Cluster,
        ssd: &SsdTier,
        want: Want,
    ) -> Result<Placement> {
        let size = want.size;
        let len = aligned_len(size).ok_or_else(|| Error::invalid("object size is too large"))?;
        // Bytes that copies to SSD will free, over all rounds: a round that
        // freed something but still did not make a range fit (fragments)
        // must not turn a wait into a final refusal.
        let mut pending = 0;
        let place = || {
            cluster.try_place(
                m.cfg.alloc_strategy,
                size,
                len,
                want.n as usize,
                want.preferred,
                m.cfg.node_ttl.as_millis() as u64 / 2,
            )
        };
        // Every copy asked for that the nodes could hold: a put acknowledged
        // with fewer would not survive the loss of a node it counted on.
        // (Counting the nodes is needed only when a put came up short.)
        let asked = want.n.max(1) as usize;
        let all = || asked.min(cluster.nodes_for(len).max(1));
        for _ in 0..EVICT_ROUNDS {
            let placed = place();
            if placed.len() >= asked || (!placed.is_empty() && placed.len() >= all()) {
                return Ok(Placement::Placed(placed));
            }
            // Fewer: eviction may make room for the rest. With some
            // copies placed, only objects on other nodes are evicted, and
            // only what the missing copies need: never the cache drained
            // for room that would land on a node already holding a copy.
            let missing = all().saturating_sub(placed.len()).max(1) as u64;
            let held: Vec<_> = placed.iter().map(|r| r.seg.node.clone()).collect();
            for r in placed {
                r.seg.free(r.offset, r.alloc_len);
            }
            check_fits(cluster, size, len, want.rebuilding)?;
            let ev = if held.is_empty() {
                let cap = cluster.capacity_bytes();
                let goal = len + (cap as f64 * m.cfg.eviction_ratio) as u64;
                self.evict_with(m, ssd, goal, want.urgent)
            } else {
                let elsewhere = |o: &crate::objects::Object| {
                    o.replicas()
                        .iter()
                        .any(|r| !held.iter().any(|n| std::sync::Arc::ptr_eq(n, &r.seg.node)))
                };
                self.evict_where(m, ssd, len.saturating_mul(missing), want.urgent, &elsewhere)
            };
            pending = pending.max(ev.pending);
            if ev.freed == 0 {
                break;
            }
        }
        // Eviction freed what it could: as many copies as fit (at least one).
        let placed = place();
        if !placed.is_empty() {
            return Ok(Placement::Placed(placed));
        }
        check_fits(cluster, size, len, want.rebuilding)?;
        // Copies in flight (pinned, so not among the victims scanned) free
        // DRAM too once they land, and so do versions an overwrite replaced
        // once their readers' leases end (housekeeping frees them): those
        // due within --put-wait are worth waiting for.
        let (_, assigned) = ssd.queue_counts();
        let wait_ms = m.cfg.put_wait.as_millis() as u64;
        let retiring = m.retired.bytes_due_by(unix_ms().saturating_add(wait_ms));
        if pending > 0 || assigned > 0 || retiring > 0 {
            return Ok(Placement::Wait(pending));
        }
        Err(Error::new(
            Code::NoSpace,
            format!(
                "no segment has {size} contiguous free bytes and eviction cannot free more \
                 (allocated {} of {} bytes; the rest is leased, pinned or being written)",
                cluster.allocated_bytes(),
                cluster.capacity_bytes()
            ),
        ))
    }
}

/// Whether DRAM in use is above `--high-watermark` (the evictor should run).
pub(crate) fn over_high_watermark(m: Model, cluster: &Cluster) -> bool {
    let cap = cluster.capacity_bytes();
    cap > 0 && cluster.allocated_bytes() as f64 > cap as f64 * m.cfg.high_watermark
}

/// Refuses what no eviction can make room for.
fn check_fits(cluster: &Cluster, size: u64, len: u64, rebuilding: bool) -> Result<()> {
    match cluster.largest_capacity() {
        // A young master's nodes may still be registering: retry.
        None if rebuilding => Err(Error::new(
            Code::NoSpace,
            "no store node has registered any memory yet (the master started moments ago); retry",
        )
        .retry_later()),
        None => Err(Error::new(
            Code::NoSpace,
            "no store node has registered any memory yet; start strata-store-node",
        )),
        Some(l) if l < len => Err(Error::new(
            Code::NoSpace,
            format!("object of {size} bytes is larger than the largest segment ({l} bytes)"),
        )),
        _ => Ok(()),
    }
}

/// The retryable error of a put that found DRAM held by objects still
/// being copied to SSD, or by replaced versions still being read.
pub(crate) fn no_space_waiting(m: Model, ssd: &SsdTier, size: u64, pending: u64) -> Error {
    let (queued, assigned) = ssd.queue_counts();
    let retired = m.retired.bytes();
    Error::new(
        Code::NoSpace,
        format!(
            "no DRAM for {size} bytes within --put-wait ({:?}): {} bytes are waiting for \
             their SSD copies ({queued} queued, {assigned} being copied; the SSD tier is \
             behind) and {retired} bytes hold versions an overwrite replaced until their \
             readers' leases end; retry, raise --put-wait (STRATA_PUT_WAIT) or add DRAM",
            m.cfg.put_wait, pending
        ),
    )
    .retry_later()
}
