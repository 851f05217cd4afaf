//! In-memory election: one process's candidates share a [`MemElection`].
//! A single master uses it (it wins at once, with a term one above the last
//! one it persisted); unit tests use it with several candidates. The rules
//! live in [`MemElectionCore`], a synchronous state machine with an explicit
//! clock, so a model test can drive them step by step.

use super::{poll_interval, Election, Leadership, Lease};
use futures::future::BoxFuture;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_common::leader::LeaderRecord;
use strata_common::{Code, Error, Result};
use tokio_util::sync::CancellationToken;

/// The election's state: the last term and who holds the lease.
#[derive(Debug, Clone, Default)]
pub struct MemElectionCore {
    term: u64,
    held: Option<Held>,
    next_lease: u64,
}

#[derive(Debug, Clone)]
struct Held {
    addr: String,
    lease: u64,
    term: u64,
    expires_ms: u64,
}

impl MemElectionCore {
    pub fn starting_after(term: u64) -> Self {
        MemElectionCore {
            term,
            ..Default::default()
        }
    }

    fn live(&self, now_ms: u64) -> Option<&Held> {
        self.held.as_ref().filter(|h| h.expires_ms > now_ms)
    }

    /// Takes the leadership if nobody holds a live lease: (term, lease id).
    pub fn try_acquire(&mut self, addr: &str, ttl_ms: u64, now_ms: u64) -> Option<(u64, u64)> {
        if self.live(now_ms).is_some() {
            return None;
        }
        self.term += 1;
        self.next_lease += 1;
        // (In-process re-wins count up by one; `next_term` seeds the first.)
        self.held = Some(Held {
            addr: addr.to_string(),
            lease: self.next_lease,
            term: self.term,
            expires_ms: now_ms + ttl_ms,
        });
        Some((self.term, self.next_lease))
    }

    /// Extends `lease` if it is still the live one.
    pub fn renew(&mut self, lease: u64, ttl_ms: u64, now_ms: u64) -> bool {
        match self.held.as_mut() {
            Some(h) if h.lease == lease && h.expires_ms > now_ms => {
                h.expires_ms = now_ms + ttl_ms;
                true
            }
            _ => false,
        }
    }

    pub fn resign(&mut self, lease: u64) {
        if self.held.as_ref().is_some_and(|h| h.lease == lease) {
            self.held = None;
        }
    }

    pub fn leader(&self, now_ms: u64) -> Option<LeaderRecord> {
        self.live(now_ms).map(|h| LeaderRecord {
            addr: h.addr.clone(),
            term: h.term,
            instance: String::new(),
        })
    }

    /// Whether a write conditioned on `term` would be applied (as etcd
    /// transactions compare the term key).
    pub fn write_allowed(&self, term: u64) -> bool {
        term == self.term
    }

    pub fn term(&self) -> u64 {
        self.term
    }

    /// Ends whatever lease is held (a test's "etcd lost the lease").
    pub fn expire(&mut self) {
        self.held = None;
    }
}

/// [`MemElectionCore`] on the real clock, shared by candidates in one
/// process.
#[derive(Clone)]
pub struct MemElection {
    core: Arc<Mutex<MemElectionCore>>,
    ttl: Duration,
    base: Instant,
}

impl MemElection {
    /// An election whose first term is `last_term + 1`.
    pub fn new(last_term: u64, ttl: Duration) -> MemElection {
        MemElection {
            core: Arc::new(Mutex::new(MemElectionCore::starting_after(last_term))),
            ttl,
            base: Instant::now(),
        }
    }

    fn now_ms(&self) -> u64 {
        self.base.elapsed().as_millis() as u64
    }

    /// Drops the current lease, as if the store had lost it (tests).
    pub fn expire_lease(&self) {
        self.core.lock().expire();
    }
}

struct MemLease {
    e: MemElection,
    lease: u64,
}

impl Lease for MemLease {
    fn renew(&mut self) -> BoxFuture<'_, Result<bool>> {
        let now = self.e.now_ms();
        let ttl = self.e.ttl.as_millis() as u64;
        let ok = self.e.core.lock().renew(self.lease, ttl, now);
        Box::pin(async move { Ok(ok) })
    }

    fn resign(&mut self) -> BoxFuture<'_, ()> {
        self.e.core.lock().resign(self.lease);
        Box::pin(async {})
    }
}

impl Election for MemElection {
    fn campaign<'a>(
        &'a self,
        addr: &'a str,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<Leadership>> {
        Box::pin(async move {
            loop {
                let won =
                    self.core
                        .lock()
                        .try_acquire(addr, self.ttl.as_millis() as u64, self.now_ms());
                if let Some((term, lease)) = won {
                    let lease = MemLease {
                        e: self.clone(),
                        lease,
                    };
                    return Ok(Leadership::keep(term, self.ttl, Instant::now(), lease));
                }
                tokio::select! {
                    _ = cancel.cancelled() => {
                        return Err(Error::new(Code::Cancelled, "campaign cancelled"));
                    }
                    _ = tokio::time::sleep(poll_interval(self.ttl)) => {}
                }
            }
        })
    }

    fn leader(&self) -> BoxFuture<'_, Result<Option<LeaderRecord>>> {
        let r = self.core.lock().leader(self.now_ms());
        Box::pin(async move { Ok(r) })
    }

    fn name(&self) -> &'static str {
        "memory"
    }
}
