//! Read leases end with the read. Every lookup leases its object to this
//! client (the master neither evicts it nor lets an unforced remove take it
//! meanwhile); a [`Lease`] is held while the read runs and, when dropped
//! (the read done, failed or abandoned), queues the lease's end. One task
//! per client sends what queued, one `ReportReads` at a time, so many reads
//! ending together cost few round trips and no read waits for it.
//!
//! The TTL stays the safety net: an end that could not be sent (the queue
//! full, the master away, the process killed) leaves the lease to run its
//! time, which only delays eviction. Masters that predate lease ends ignore
//! them.

use std::time::Duration;
use strata_common::grpc::MasterChannel;
use strata_proto as pb;
use strata_proto::master_client::MasterClient;
use tokio::sync::{mpsc, oneshot};

/// Ends queued and not sent yet, at most (beyond, they are dropped and
/// those leases run their TTL).
const QUEUE: usize = 65_536;
/// Ends per request (with the cached-read counts, well under the master's
/// batch limit).
const PER_REQUEST: usize = 1024;
/// How long one request may take before its ends are given up.
const SEND_TIMEOUT: Duration = Duration::from_secs(2);
/// How long ends gather before a request goes (unless a flush asks, or a
/// request fills): at high read rates one request then carries hundreds
/// of ends. Measured (`strata bench --local`, release, 4 KiB gets, 4
/// clients on 2 cores): a request per handful of reads halved the get
/// rate; a few milliseconds is nothing against a lease TTL of seconds.
const GATHER: Duration = Duration::from_millis(5);
/// How often a gathering sender looks at its queue (and so how long a
/// flush may wait).
const TICK: Duration = Duration::from_millis(1);

enum Msg {
    End(pb::LeaseEnd),
    /// Answered once every end queued before it was sent (or given up).
    Flush(oneshot::Sender<()>),
}

/// Where a client's leases go when their reads are done. Cheap to clone.
#[derive(Clone)]
pub(crate) struct LeaseEnds {
    tx: mpsc::Sender<Msg>,
}

impl LeaseEnds {
    /// Starts the task that sends ends to `master`; it ends when the last
    /// handle and lease are dropped.
    pub(crate) fn start(master: MasterClient<MasterChannel>) -> LeaseEnds {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(send_ends(master, rx));
        LeaseEnds { tx }
    }

    /// A handle that drops everything (`ClientConfig::end_leases` off).
    pub(crate) fn off() -> LeaseEnds {
        let (tx, _) = mpsc::channel(1);
        LeaseEnds { tx }
    }

    /// The lease a lookup's answer gave to this reader, ended when dropped.
    /// None when the answer carries no lease (masters that predate leases
    /// measured on their clock) or ends are off.
    pub(crate) fn lease(&self, key: &str, info: &pb::GetReplicasResponse) -> Option<Lease> {
        if info.lease_ms == 0 || self.tx.is_closed() {
            return None;
        }
        let generation = info
            .replicas
            .iter()
            .find(|r| r.kind == pb::ReplicaKind::Memory as i32)
            .and_then(|r| r.grant.as_ref())
            .map_or(0, |g| g.generation);
        Some(Lease {
            end: Some(pb::LeaseEnd {
                key: key.to_string(),
                generation,
            }),
            tx: self.tx.clone(),
        })
    }

    /// Waits (up to `within`) until every end queued so far was sent: for
    /// a process about to exit (the CLI) or a client closing.
    pub(crate) async fn flush(&self, within: Duration) {
        let (done, wait) = oneshot::channel();
        let queued = tokio::time::timeout(within, self.tx.send(Msg::Flush(done)));
        if matches!(queued.await, Ok(Ok(()))) {
            let _ = tokio::time::timeout(within, wait).await;
        }
    }
}

/// One reader's lease on one object version; its end is queued on drop.
pub(crate) struct Lease {
    end: Option<pb::LeaseEnd>,
    tx: mpsc::Sender<Msg>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(end) = self.end.take() {
            // Never blocks a reader: a full queue leaves it to the TTL.
            let _ = self.tx.try_send(Msg::End(end));
        }
    }
}

/// What queued next, without registering for a wake-up; notes a closed
/// queue in `closed`.
fn try_next(rx: &mut mpsc::Receiver<Msg>, closed: &mut bool) -> Option<Msg> {
    match rx.try_recv() {
        Ok(m) => Some(m),
        Err(mpsc::error::TryRecvError::Empty) => None,
        Err(mpsc::error::TryRecvError::Disconnected) => {
            *closed = true;
            None
        }
    }
}

/// Sends what queued, one request at a time: ends gather for `GATHER`
/// after the first (and while a request is out), a flush sends at once
/// (within a `TICK`).
async fn send_ends(mut master: MasterClient<MasterChannel>, mut rx: mpsc::Receiver<Msg>) {
    let mut ended = Vec::new();
    let mut flushes = Vec::new();
    while let Some(first) = rx.recv().await {
        let until = tokio::time::Instant::now() + GATHER;
        let mut next = Some(first);
        let mut closed = false;
        loop {
            while let Some(msg) = next.take() {
                match msg {
                    Msg::End(e) => ended.push(e),
                    Msg::Flush(f) => flushes.push(f),
                }
                if ended.len() >= PER_REQUEST {
                    break;
                }
                next = try_next(&mut rx, &mut closed);
            }
            let now = tokio::time::Instant::now();
            if closed || ended.len() >= PER_REQUEST || !flushes.is_empty() || now >= until {
                break;
            }
            // Sleep, rather than wait on the queue: a task waiting on it is
            // woken by every end, which for a reader on a thread of its own
            // (the Python client's per-thread I/O) is a thread switch per
            // read (measured: 64 KiB gets over UCX, 63 against 30 µs).
            tokio::time::sleep(TICK.min(until - now)).await;
            next = try_next(&mut rx, &mut closed);
        }
        if !ended.is_empty() {
            let req = pb::ReportReadsRequest {
                reads: Vec::new(),
                ended: std::mem::take(&mut ended),
            };
            let n = req.ended.len();
            let sent = tokio::time::timeout(SEND_TIMEOUT, master.report_reads(req));
            match sent.await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    tracing::debug!(ends = n, error = %e, "ending read leases failed; they run their TTL")
                }
                Err(_) => {
                    tracing::debug!(ends = n, "ending read leases timed out; they run their TTL")
                }
            }
        }
        // A flush is answered once what queued before it went: the ends
        // before it were in this request or an earlier one.
        for f in flushes.drain(..) {
            let _ = f.send(());
        }
    }
}

/// Leases held by a batch read until it is done.
pub(crate) type Leases = Vec<Option<Lease>>;

#[cfg(test)]
mod tests {
    use super::*;

    fn ends(cap: usize) -> (LeaseEnds, mpsc::Receiver<Msg>) {
        let (tx, rx) = mpsc::channel(cap);
        (LeaseEnds { tx }, rx)
    }

    fn answer(lease_ms: u64, replicas: &[(pb::ReplicaKind, u64)]) -> pb::GetReplicasResponse {
        pb::GetReplicasResponse {
            lease_ms,
            replicas: replicas
                .iter()
                .map(|(kind, generation)| pb::Replica {
                    kind: *kind as i32,
                    grant: Some(pb::Grant {
                        generation: *generation,
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn ended(rx: &mut mpsc::Receiver<Msg>) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        while let Ok(m) = rx.try_recv() {
            if let Msg::End(e) = m {
                out.push((e.key, e.generation));
            }
        }
        out
    }

    /// A lease's end is queued when it is dropped, once, naming the version
    /// by its first memory replica (0 for an SSD read).
    #[test]
    fn a_lease_ends_when_dropped_naming_its_version() {
        use pb::ReplicaKind::{Memory, Ssd};
        let (e, mut rx) = ends(16);
        let l = e.lease("k", &answer(5000, &[(Ssd, 3), (Memory, 7), (Memory, 9)]));
        assert!(ended(&mut rx).is_empty(), "held while the read runs");
        drop(l);
        assert_eq!(ended(&mut rx), [("k".to_string(), 7)]);
        drop(e.lease("s", &answer(5000, &[(Ssd, 3)])));
        assert_eq!(ended(&mut rx), [("s".to_string(), 0)]);
        // An answer without a lease (an older master) has nothing to end.
        assert!(e.lease("old", &answer(0, &[(Memory, 7)])).is_none());
        assert!(ended(&mut rx).is_empty());
    }

    /// A full queue drops ends (their leases run the TTL) without blocking
    /// the reader; with ends off nothing is held at all.
    #[test]
    fn a_full_queue_drops_ends_and_off_holds_none() {
        let (e, mut rx) = ends(2);
        let a = answer(5000, &[(pb::ReplicaKind::Memory, 1)]);
        for i in 0..5 {
            drop(e.lease(&format!("k{i}"), &a));
        }
        assert_eq!(ended(&mut rx).len(), 2);
        assert!(LeaseEnds::off().lease("k", &a).is_none());
    }
}
