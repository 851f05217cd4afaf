//! Backpressure: a put that needs DRAM held by objects still being copied to
//! SSD waits for those copies (bounded by `--put-wait`, in arrival order)
//! instead of the cache dropping objects the SSD tier could take.

use super::{no_space_waiting, Placement, Pressure, Want};
use crate::cluster::Cluster;
use crate::cluster::Replica;
use crate::metrics::MasterMetrics;
use crate::model::Model;
use crate::offload::SsdTier;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use strata_common::Result;
use tokio::sync::Notify;

/// A waiting put re-checks at least this often (space freed by paths that
/// do not notify, e.g. a lease ending, is found this way).
const RECHECK: Duration = Duration::from_millis(25);

/// The puts waiting for DRAM.
#[derive(Default)]
pub struct PutWaiters {
    /// Waiting puts take turns in arrival order (tokio's mutex is fair), so
    /// space freed for the first is not taken by a later one.
    turn: tokio::sync::Mutex<()>,
    waiting: AtomicUsize,
    /// Rung when copies land or objects leave, so the wait is the copy time.
    wake: Notify,
    /// The master is shutting down: nobody waits any more.
    closed: tokio_util::sync::CancellationToken,
}

impl PutWaiters {
    /// DRAM may have been freed: the put whose turn it is looks again.
    pub fn notify(&self) {
        if self.waiting.load(Ordering::Acquire) > 0 {
            self.wake.notify_waiters();
        }
    }

    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }

    fn enter<'a>(&'a self, m: &'a MasterMetrics) -> Waiting<'a> {
        self.waiting.fetch_add(1, Ordering::AcqRel);
        m.put_waiters.inc();
        m.put_waits.inc();
        Waiting { w: self, m }
    }
}

/// One waiting put; leaving (success, error, timeout or a dropped call)
/// takes it off the count.
struct Waiting<'a> {
    w: &'a PutWaiters,
    m: &'a MasterMetrics,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.w.waiting.fetch_sub(1, Ordering::AcqRel);
        self.m.put_waiters.dec();
    }
}

impl Pressure {
    /// Shutting down: waiting puts (and later ones) fail at once with a
    /// retryable `unavailable` instead of holding up the drain.
    pub(crate) fn stop_waiting(&self) {
        self.waiters.closed.cancel();
    }

    /// Fires when the term ends (shutdown or step-down): every wait and
    /// long poll answers at once.
    pub(crate) fn closing(&self) -> &tokio_util::sync::CancellationToken {
        &self.waiters.closed
    }

    /// Places a put's replicas, waiting until `deadline` (in arrival
    /// order) for DRAM that copies to SSD in flight will free.
    pub(crate) async fn allocate_waiting(
        &self,
        m: Model<'_>,
        cluster: &Cluster,
        ssd: &SsdTier,
        want: Want,
        deadline: Instant,
    ) -> Result<Vec<Replica>> {
        let size = want.size;
        // Nobody waits ahead of this put: try at once.
        let mut pending = 0;
        let will_wait = !m.cfg.put_wait.is_zero();
        if self.waiting() == 0 {
            let first = Want {
                urgent: will_wait,
                ..want
            };
            match self.allocate_once(m, cluster, ssd, first)? {
                Placement::Placed(r) => return Ok(r),
                Placement::Wait(p) => pending = p,
            }
        }
        if Instant::now() >= deadline {
            m.metrics.put_wait_timeouts.inc();
            return Err(no_space_waiting(m, ssd, size, pending));
        }
        let t0 = Instant::now();
        let _waiting = self.waiters.enter(m.metrics);
        let closed = || {
            Err(strata_common::Error::unavailable(
                "the master is shutting down; retry against its successor",
            ))
        };
        let placed: Result<Option<Vec<Replica>>> = async {
            let turn = tokio::select! {
                t = tokio::time::timeout_at(deadline.into(), self.waiters.turn.lock()) => t,
                _ = self.waiters.closed.cancelled() => return closed(),
            };
            let Ok(_turn) = turn else {
                return Ok(None);
            };
            loop {
                let notified = self.waiters.wake.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                let urgent = Want {
                    urgent: true,
                    ..want
                };
                match self.allocate_once(m, cluster, ssd, urgent)? {
                    Placement::Placed(r) => return Ok(Some(r)),
                    Placement::Wait(p) => pending = p,
                }
                let now = Instant::now();
                if now >= deadline {
                    return Ok(None);
                }
                let recheck = deadline.min(now + RECHECK);
                tokio::select! {
                    _ = notified => {}
                    _ = tokio::time::sleep_until(recheck.into()) => {}
                    _ = self.waiters.closed.cancelled() => return closed(),
                }
            }
        }
        .await;
        m.metrics
            .put_wait_seconds
            .observe(t0.elapsed().as_secs_f64());
        match placed? {
            Some(r) => Ok(r),
            None => {
                m.metrics.put_wait_timeouts.inc();
                tracing::debug!(
                    size,
                    waited_ms = t0.elapsed().as_millis() as u64,
                    "a put ran out of --put-wait while DRAM victims were copied to SSD"
                );
                Err(no_space_waiting(m, ssd, size, pending))
            }
        }
    }
}
