//! Leader election. A master serves only while it holds a [`Leadership`]:
//! won through an [`Election`] (etcd in HA mode, in memory for a single
//! master and for unit tests), renewed by keep-alives whose deadline is
//! shorter than the lease, and given up at once when a renewal fails, so a
//! leader whose etcd stalls stops serving before anyone else can win.
//! Both implementations pass one conformance suite (`conformance.rs`).

mod etcd;
mod memory;

#[cfg(test)]
mod conformance;
#[cfg(test)]
mod model;

pub use etcd::EtcdElection;
pub use memory::{MemElection, MemElectionCore};

use futures::future::BoxFuture;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_common::leader::LeaderRecord;
use strata_common::Result;
use tokio_util::sync::CancellationToken;

pub trait Election: Send + Sync + 'static {
    /// Campaigns as `addr` until this candidate leads (or `cancel` fires:
    /// then a `Cancelled` error). Waiting is not an error: an unreachable
    /// etcd is retried until it answers.
    fn campaign<'a>(
        &'a self,
        addr: &'a str,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<Leadership>>;

    /// Who leads now, if anyone.
    fn leader(&self) -> BoxFuture<'_, Result<Option<LeaderRecord>>>;

    fn name(&self) -> &'static str;
}

/// Renews one won lease (implementation side of a [`Leadership`]).
pub(crate) trait Lease: Send + 'static {
    /// Whether the lease is still held after this renewal.
    fn renew(&mut self) -> BoxFuture<'_, Result<bool>>;
    /// Gives the leadership up (deletes the record, drops the lease).
    fn resign(&mut self) -> BoxFuture<'_, ()>;
}

/// A won election, valid until lost. Cheap to clone.
#[derive(Clone)]
pub struct Leadership {
    pub term: u64,
    inner: Arc<Held>,
}

struct Held {
    lost: CancellationToken,
    base: Instant,
    /// Milliseconds after `base` up to which leading is certain: the last
    /// renewal that succeeded was *sent* at least a lease TTL before the
    /// lease could expire, and we give up a third of it as margin.
    valid_until_ms: Arc<AtomicU64>,
    /// Asks the keeper task to resign; it answers on the oneshot. Dropping
    /// every clone of the leadership drops it, which resigns too.
    resign: parking_lot::Mutex<Option<tokio::sync::mpsc::Sender<tokio::sync::oneshot::Sender<()>>>>,
}

/// How long before a lease could expire a leader stops believing it leads:
/// a third of the TTL (renewals are also sent every third).
fn margin_ms(ttl_ms: u64) -> u64 {
    ttl_ms / 3
}

/// Up to when leading is certain after a renewal (or the lease request)
/// *sent* at `sent_ms` succeeded: the lease lasts `ttl_ms` from when the
/// store saw it, which is after it was sent, less the margin. The model
/// test (`model.rs`) drives this same rule.
pub(crate) fn valid_until_ms(sent_ms: u64, ttl_ms: u64) -> u64 {
    sent_ms + ttl_ms - margin_ms(ttl_ms)
}

/// Whether a leadership still valid until `valid_until_ms` may serve at
/// `now_ms` (and has not been lost).
pub(crate) fn leads(now_ms: u64, valid_until_ms: u64, lost: bool) -> bool {
    !lost && now_ms < valid_until_ms
}

impl Leadership {
    /// Starts keeping `lease` alive: renewals every `ttl`/3, each with a
    /// deadline of `ttl`/3; the first that fails or times out ends the
    /// leadership. `granted` is when the lease was asked for (before the
    /// store could have started its clock), so the first validity window
    /// cannot outlast the lease either.
    pub(crate) fn keep(
        term: u64,
        ttl: Duration,
        granted: Instant,
        mut lease: impl Lease,
    ) -> Leadership {
        let base = granted;
        let margin = ttl / 3;
        let (tx, mut rx) = tokio::sync::mpsc::channel::<tokio::sync::oneshot::Sender<()>>(1);
        let lost = CancellationToken::new();
        let ttl_ms = ttl.as_millis() as u64;
        let valid = Arc::new(AtomicU64::new(valid_until_ms(0, ttl_ms)));
        let (lost2, valid2) = (lost.clone(), valid.clone());
        tokio::spawn(async move {
            let why = loop {
                tokio::select! {
                    done = rx.recv() => {
                        // Bounded: with etcd down, shutdown must not hang.
                        let _ = tokio::time::timeout(margin, lease.resign()).await;
                        lost2.cancel();
                        if let Some(done) = done {
                            let _ = done.send(());
                        }
                        return;
                    }
                    _ = tokio::time::sleep(margin) => {}
                }
                let sent = base.elapsed();
                match tokio::time::timeout(margin, lease.renew()).await {
                    Ok(Ok(true)) => {
                        let until = valid_until_ms(sent.as_millis() as u64, ttl_ms);
                        valid2.fetch_max(until, Ordering::AcqRel);
                    }
                    Ok(Ok(false)) => break "the lease expired".to_string(),
                    Ok(Err(e)) => break format!("keep-alive failed: {e}"),
                    Err(_) => break format!("keep-alive got no answer within {margin:?}"),
                }
            };
            tracing::warn!(term, reason = %why, "leadership lost: stepping down");
            lost2.cancel();
            // Best effort, so a successor need not wait out the TTL.
            let _ = tokio::time::timeout(margin, lease.resign()).await;
        });
        Leadership {
            term,
            inner: Arc::new(Held {
                lost,
                base,
                valid_until_ms: valid,
                resign: parking_lot::Mutex::new(Some(tx)),
            }),
        }
    }

    /// Whether this process may serve as leader right now.
    pub fn is_valid(&self) -> bool {
        leads(
            self.inner.base.elapsed().as_millis() as u64,
            self.inner.valid_until_ms.load(Ordering::Acquire),
            self.inner.lost.is_cancelled(),
        )
    }

    /// Fires when the leadership ends (lost or resigned).
    pub fn lost(&self) -> CancellationToken {
        self.inner.lost.clone()
    }

    /// Gives the leadership up so a successor takes over at once.
    pub async fn resign(&self) {
        let tx = self.inner.resign.lock().take();
        if let Some(tx) = tx {
            let (done, wait) = tokio::sync::oneshot::channel();
            if tx.send(done).await.is_ok() {
                let _ = wait.await;
            }
        }
        self.inner.lost.cancel();
    }
}

/// How often a candidate looks again while another leads: fast enough that
/// a graceful handover takes a fraction of the TTL.
pub(crate) fn poll_interval(ttl: Duration) -> Duration {
    (ttl / 10).clamp(Duration::from_millis(20), Duration::from_millis(500))
}
