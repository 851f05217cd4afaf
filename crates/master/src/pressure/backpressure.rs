//! Backpressure: a put that needs DRAM held by objects still being copied to
//! SSD waits for those copies (bounded by `--put-wait`, in arrival order)
//! instead of the cache dropping objects the SSD tier could take.

use crate::cluster::Replica;
use crate::master::{Master, Placement, PutSpec};
use crate::metrics::MasterMetrics;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use strata_common::Result;
use strata_proto as pb;
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

impl Master {
    /// Shutting down: waiting puts (and later ones) fail at once with a
    /// retryable `unavailable` instead of holding up the drain.
    pub fn stop_waiting(&self) {
        self.pressure.waiters.closed.cancel();
    }

    /// Fires when the term ends (shutdown or step-down): every wait and
    /// long poll answers at once.
    pub(crate) fn closing(&self) -> &tokio_util::sync::CancellationToken {
        &self.pressure.waiters.closed
    }

    /// Starts a put, waiting until `deadline` for DRAM that copies to SSD
    /// in flight will free. Nothing is allocated until the put has its
    /// space, so a call dropped while waiting leaks nothing.
    pub async fn put_start_waiting(
        &self,
        spec: PutSpec,
        deadline: Instant,
    ) -> Result<Vec<pb::Replica>> {
        self.check_put(&spec)?;
        let replicas = self
            .allocate_waiting(
                spec.size,
                spec.replica_num,
                spec.preferred_segment,
                deadline,
            )
            .await?;
        self.start_put(spec, replicas)
    }

    /// Starts the puts of a batch that need not wait, in order, stopping at
    /// the first that must (it and the rest are returned, to wait in order).
    /// Blocking work (eviction scans): run it off the async workers.
    pub fn put_start_batch_now(
        &self,
        specs: Vec<PutSpec>,
    ) -> (Vec<Result<Vec<pb::Replica>>>, Vec<PutSpec>) {
        let mut done = Vec::with_capacity(specs.len());
        let mut specs = specs.into_iter();
        while self.pressure.waiting() == 0 {
            let Some(spec) = specs.next() else { break };
            let placed = self.check_put(&spec).and_then(|()| {
                self.allocate_once(spec.size, spec.replica_num, spec.preferred_segment, false)
            });
            match placed {
                Ok(Placement::Placed(r)) => done.push(self.start_put(spec, r)),
                Ok(Placement::Wait(_)) => {
                    return (done, std::iter::once(spec).chain(specs).collect());
                }
                Err(e) => done.push(Err(e)),
            }
        }
        (done, specs.collect())
    }

    async fn allocate_waiting(
        &self,
        size: u64,
        n: u32,
        preferred: Option<u64>,
        deadline: Instant,
    ) -> Result<Vec<Replica>> {
        // Nobody waits ahead of this put: try at once.
        let mut pending = 0;
        let will_wait = !self.cfg.put_wait.is_zero();
        if self.pressure.waiting() == 0 {
            match self.allocate_once(size, n, preferred, will_wait)? {
                Placement::Placed(r) => return Ok(r),
                Placement::Wait(p) => pending = p,
            }
        }
        if Instant::now() >= deadline {
            self.metrics.put_wait_timeouts.inc();
            return Err(self.no_space_waiting(size, pending));
        }
        let t0 = Instant::now();
        let _waiting = self.pressure.waiters.enter(&self.metrics);
        let closed = || {
            Err(strata_common::Error::unavailable(
                "the master is shutting down; retry against its successor",
            ))
        };
        let placed: Result<Option<Vec<Replica>>> = async {
            let turn = tokio::select! {
                t = tokio::time::timeout_at(deadline.into(), self.pressure.waiters.turn.lock()) => t,
                _ = self.pressure.waiters.closed.cancelled() => return closed(),
            };
            let Ok(_turn) = turn else {
                return Ok(None);
            };
            loop {
                let notified = self.pressure.waiters.wake.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                match self.allocate_once(size, n, preferred, true)? {
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
                    _ = self.pressure.waiters.closed.cancelled() => return closed(),
                }
            }
        }
        .await;
        self.metrics
            .put_wait_seconds
            .observe(t0.elapsed().as_secs_f64());
        match placed? {
            Some(r) => Ok(r),
            None => {
                self.metrics.put_wait_timeouts.inc();
                tracing::debug!(
                    size,
                    waited_ms = t0.elapsed().as_millis() as u64,
                    "a put ran out of --put-wait while DRAM victims were copied to SSD"
                );
                Err(self.no_space_waiting(size, pending))
            }
        }
    }
}
