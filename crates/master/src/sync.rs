//! A put is acknowledged once its commit is in the records of the store
//! nodes holding it, not only in the master's memory: a master that dies
//! (or is deposed) right after a PutEnd must not take an acknowledged object
//! with it, since a new master rebuilds from what the nodes report
//! (`rebuild.rs`). Nodes long-poll their heartbeats, so a commit reaches
//! them at once and their next heartbeat acknowledges it: about one extra
//! round trip per PutEnd (or per batch). A removal waits the same way for
//! its frees, and for SSD owners to drop their copies (`offload/removal.rs`),
//! so that no restart or failover brings a removed object back.
//!
//! A client that knows its object's checksum before writing declares it at
//! PutStart: the master announces the put to its nodes then (`announce`),
//! and they report it to a rebuilding master only if the bytes they hold
//! match. The round trip to the nodes then overlaps the write, and PutEnd
//! waits only for the announcement, which has usually been applied by then.
//!
//! This module keeps the protocol's bookkeeping: how far each member (a
//! store node's object log, an SSD owner's drops) confirmed what it was
//! sent, and the changes an answer waits for (`Unsynced`); `Master`'s
//! `await_synced` waits for them, `writes/records.rs` makes the records.

use prometheus::IntCounter;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;
use strata_common::Result;
use tokio_util::sync::CancellationToken;

/// How far one member (a store node's object log, an SSD owner's drops)
/// confirmed what the master sent it.
pub struct Acks {
    /// For logs and errors: "store node n0", "SSD owner 3".
    pub(crate) who: String,
    seq: AtomicU64,
    /// Everything up to this was discarded unconfirmed (a bounded queue
    /// overflowed): a later confirmation does not cover it.
    lost: AtomicU64,
    changed: tokio::sync::Notify,
}

impl Acks {
    pub(crate) fn new(who: String) -> Acks {
        Acks {
            who,
            seq: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            changed: tokio::sync::Notify::new(),
        }
    }

    /// The member applied everything up to `seq`.
    pub(crate) fn ack(&self, seq: u64) {
        if self.seq.fetch_max(seq, Ordering::AcqRel) < seq {
            self.changed.notify_waiters();
        }
    }

    pub(crate) fn acked(&self) -> u64 {
        self.seq.load(Ordering::Acquire)
    }

    /// Entries up to `seq` will never be confirmed (they were dropped).
    pub(crate) fn lose(&self, seq: u64) {
        if self.lost.fetch_max(seq, Ordering::AcqRel) < seq {
            self.changed.notify_waiters();
        }
    }
}

/// Changes waiting for their members: (member, sequence number).
#[derive(Default)]
pub struct Unsynced(Vec<(Arc<Acks>, u64)>);

impl Unsynced {
    pub(crate) fn push(&mut self, acks: Arc<Acks>, seq: u64) {
        self.0.push((acks, seq));
    }

    pub(crate) fn extend(&mut self, other: Unsynced) {
        self.0.extend(other.0);
    }
}

impl Unsynced {
    /// Waits until every member acknowledged its changes. A member that
    /// does not by `deadline`, a change that was dropped unsent, or a term
    /// that ends meanwhile (`closing`) makes the answer a retryable error
    /// (counted in `unconfirmed`) rather than an acknowledgement the next
    /// master might not honour: the client's retry finds the key (if a node
    /// has it) and checks it holds its bytes.
    pub(crate) async fn wait(
        self,
        deadline: Instant,
        closing: &CancellationToken,
        unconfirmed: &IntCounter,
        what: &str,
    ) -> Result<()> {
        for (member, seq) in self.0 {
            loop {
                let acked = member.changed.notified();
                tokio::pin!(acked);
                acked.as_mut().enable();
                let lost = member.lost.load(Ordering::Acquire) >= seq;
                if !lost && member.acked() >= seq {
                    break;
                }
                let why = if lost {
                    "was never sent it (its queue overflowed)"
                } else {
                    tokio::select! {
                    _ = acked => continue,
                    _ = tokio::time::sleep_until(deadline.into()) => "did not confirm it in time",
                    _ = closing.cancelled() => "is no longer reachable through this master (its term ended)",
                    }
                };
                unconfirmed.inc();
                tracing::warn!(
                    member = member.who,
                    seq,
                    why,
                    what,
                    "not confirmed by a member"
                );
                return Err(strata_common::Error::unavailable(format!(
                    "the {what} is not confirmed: {} {why}; retry (it may have taken effect)",
                    member.who
                )));
            }
        }
        Ok(())
    }
}
