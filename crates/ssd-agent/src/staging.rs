//! The read staging arena of this process: SSD reads stage their bytes in
//! memory bounded by `--staging-bytes`, shared by all readers. A read that
//! finds it full waits, first come first served (tokio's semaphore is FIFO),
//! for at most `--staging-wait`, then fails with an error that says what to
//! change. A read larger than the arena is staged piece by piece, so size
//! alone never fails a read. Space is released when its guard drops, on every
//! path. (Reads lent to one-sided readers are staged in a window of their
//! own: `strata_transport::lend`.)
//!
//! One peer address holds at most a quarter of the arena (at least a piece)
//! at a time, and one connection a piece or two (`tcp::server`), so readers
//! that stop reading their sockets, however many from one address, leave
//! the rest of the arena to everyone else until `--io-timeout` cuts them
//! off. A peer past its share waits for its own pieces to come back, never
//! holding anything while it waits.

use parking_lot::Mutex;
use prometheus::{Histogram, IntCounter, IntGauge};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_common::{Code, Error, Result};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Granularity of arena accounting.
const UNIT: u64 = 4096;
/// Largest piece one reader stages at a time.
const MAX_PIECE: u64 = 4 << 20;

#[derive(Clone)]
pub struct StagingMetrics {
    pub capacity: IntGauge,
    pub in_use: IntGauge,
    pub waiters: IntGauge,
    pub wait_seconds: Histogram,
    pub timeouts: IntCounter,
}

/// Shared handle to the arena (cheap to clone).
#[derive(Clone)]
pub struct Staging {
    inner: Arc<Inner>,
}

struct Inner {
    sem: Arc<Semaphore>,
    capacity: u64,
    /// Units one peer address may hold at once.
    peer_share: u64,
    /// Each active peer's share; removed once it holds nothing.
    peers: Mutex<HashMap<IpAddr, Arc<Semaphore>>>,
    wait: Duration,
    m: StagingMetrics,
    /// Piece buffers kept for reuse: staged reads do not fault in fresh
    /// pages for every piece. Bounded by the arena (pieces in use + idle).
    pool: Mutex<Vec<Vec<u8>>>,
}

/// Staged bytes; released on drop.
pub struct StagingGuard {
    _permit: OwnedSemaphorePermit,
    /// Given back after the arena's permit (fields drop in order).
    _peer: Option<PeerShare>,
    bytes: u64,
    m: StagingMetrics,
}

/// Part of a peer's share; the peer's entry goes once nothing holds it.
struct PeerShare {
    permit: Option<OwnedSemaphorePermit>,
    ip: IpAddr,
    inner: Arc<Inner>,
}

impl Drop for PeerShare {
    fn drop(&mut self) {
        drop(self.permit.take());
        forget_idle(&self.inner, self.ip);
    }
}

/// Removes `ip`'s share once nothing holds it (no permit, no waiter: each
/// keeps a handle). Under the lock no one else can take a new handle.
fn forget_idle(inner: &Inner, ip: IpAddr) {
    let mut peers = inner.peers.lock();
    if peers.get(&ip).is_some_and(|s| Arc::strong_count(s) == 1) {
        peers.remove(&ip);
    }
}

/// The arena's piece, in units: a quarter of it, between 4 KiB and 4 MiB.
fn piece_units(capacity_units: u64) -> u64 {
    (capacity_units / 4).clamp(1, MAX_PIECE / UNIT)
}

impl StagingGuard {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for StagingGuard {
    fn drop(&mut self) {
        self.m.in_use.sub(self.bytes as i64);
    }
}

impl Staging {
    pub fn new(capacity: u64, wait: Duration, m: StagingMetrics) -> Staging {
        let units = (capacity / UNIT).clamp(1, u32::MAX as u64 / 2);
        m.capacity.set((units * UNIT) as i64);
        Staging {
            inner: Arc::new(Inner {
                sem: Arc::new(Semaphore::new(units as usize)),
                capacity: units * UNIT,
                peer_share: (units / 4).max(piece_units(units)),
                peers: Mutex::new(HashMap::new()),
                wait,
                m,
                pool: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Bytes held right now by readers.
    pub fn in_use(&self) -> u64 {
        self.inner.capacity - self.inner.sem.available_permits() as u64 * UNIT
    }

    /// How much one reader stages at once: a quarter of the arena (so a few
    /// readers make progress together), between 4 KiB and 4 MiB.
    pub fn piece_bytes(&self) -> u64 {
        piece_units(self.inner.capacity / UNIT) * UNIT
    }

    /// A buffer of `n` bytes (at most a piece), reused when one is idle.
    pub fn buffer(&self, n: usize) -> Vec<u8> {
        let mut b = self.inner.pool.lock().pop().unwrap_or_default();
        b.resize(n, 0);
        b
    }

    /// Returns a piece buffer for reuse.
    pub fn recycle(&self, mut b: Vec<u8>) {
        let max = (self.inner.capacity / self.piece_bytes()).max(1) as usize;
        if b.capacity() as u64 > self.piece_bytes() {
            return;
        }
        b.clear();
        let mut pool = self.inner.pool.lock();
        if pool.len() < max {
            pool.push(b);
        }
    }

    /// Bytes one peer address may hold at once.
    pub fn peer_share(&self) -> u64 {
        self.inner.peer_share * UNIT
    }

    /// The semaphore of `ip`'s share (made on its first use).
    fn share_of(&self, ip: IpAddr) -> Arc<Semaphore> {
        let mut peers = self.inner.peers.lock();
        let share = self.inner.peer_share as usize;
        peers
            .entry(ip)
            .or_insert_with(|| Arc::new(Semaphore::new(share)))
            .clone()
    }

    /// Reserves room for `bytes` (at most the arena: larger reads must be
    /// staged in pieces of [`Staging::piece_bytes`]) for a reader at `peer`
    /// (`None`: not a data-plane peer, no share applies). Waits FIFO, first
    /// within the peer's share and then in the arena, for at most
    /// `--staging-wait` in all; `requested` is the whole read, for the error.
    pub async fn acquire(
        &self,
        bytes: u64,
        requested: u64,
        peer: Option<IpAddr>,
    ) -> Result<StagingGuard> {
        let i = &self.inner;
        // Never clamped: a reader larger than the arena must stage in
        // pieces, and one that does not is a bug to surface, not hide.
        if bytes > i.capacity {
            return Err(Error::internal(format!(
                "staging {bytes} bytes at once exceeds the arena of {} bytes; reads stage in pieces of {}",
                i.capacity,
                self.piece_bytes()
            )));
        }
        let units = bytes.div_ceil(UNIT).max(1);
        let t0 = Instant::now();
        i.m.waiters.inc();
        // Decrement on every path, including this future being dropped
        // (client gone, request cancelled) while it waits.
        let _waiting = scopeguard(|| i.m.waiters.dec());
        let both = async {
            let share = match peer {
                Some(ip) => {
                    let sem = self.share_of(ip);
                    let want = units.min(i.peer_share) as u32;
                    let permit = sem.acquire_many_owned(want).await?;
                    Some(PeerShare {
                        permit: Some(permit),
                        ip,
                        inner: i.clone(),
                    })
                }
                None => None,
            };
            let permit = i.sem.clone().acquire_many_owned(units as u32).await?;
            Ok::<_, tokio::sync::AcquireError>((permit, share))
        };
        let r = tokio::time::timeout(i.wait, both).await;
        i.m.wait_seconds.observe(t0.elapsed().as_secs_f64());
        if let (Some(ip), Err(_) | Ok(Err(_))) = (peer, &r) {
            // A waiter that got nothing held a handle to the share too.
            forget_idle(i, ip);
        }
        match r {
            Ok(Ok((permit, peer))) => {
                let staged = units * UNIT;
                i.m.in_use.add(staged as i64);
                Ok(StagingGuard {
                    _permit: permit,
                    _peer: peer,
                    bytes: staged,
                    m: i.m.clone(),
                })
            }
            Ok(Err(_)) => Err(Error::unavailable("the SSD agent is shutting down")),
            Err(_) => {
                i.m.timeouts.inc();
                // This reader still counts as a waiter until the guard drops.
                let waiting = (i.m.waiters.get() - 1).max(0);
                let msg = format!(
                    "SSD read of {requested} bytes waited {:?} for staging space: arena {} bytes, {} in use, \
                     {waiting} other readers waiting, one address holding at most {} at once; raise \
                     --staging-bytes (STRATA_STAGING_BYTES) on the SSD agent that owns this disk (size it \
                     to concurrent readers x bytes each stages at once, {} here)",
                    i.wait,
                    i.capacity,
                    self.in_use(),
                    self.peer_share(),
                    self.piece_bytes()
                );
                tracing::warn!(
                    requested,
                    arena = i.capacity,
                    in_use = self.in_use(),
                    waiters = waiting,
                    setting = "--staging-bytes / STRATA_STAGING_BYTES",
                    "{msg}"
                );
                Err(Error::new(Code::ResourceExhausted, msg))
            }
        }
    }
}

/// Runs `f` when dropped.
fn scopeguard<F: FnOnce()>(f: F) -> impl Drop {
    struct G<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for G<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f()
            }
        }
    }
    G(Some(f))
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn metrics() -> StagingMetrics {
        let r = prometheus::Registry::new();
        StagingMetrics {
            capacity: strata_common::metrics::gauge(&r, "c", "c"),
            in_use: strata_common::metrics::gauge(&r, "u", "u"),
            waiters: strata_common::metrics::gauge(&r, "w", "w"),
            wait_seconds: Histogram::with_opts(prometheus::HistogramOpts::new("h", "h"))
                .expect("histogram"),
            timeouts: strata_common::metrics::counter(&r, "t", "t"),
        }
    }

    #[tokio::test]
    async fn a_timed_out_waiter_names_the_setting_and_a_freed_arena_serves_again() {
        let m = metrics();
        let s = Staging::new(64 << 10, Duration::from_millis(50), m.clone());
        let held = s.acquire(64 << 10, 64 << 10, None).await.expect("fits");
        let e = match s.acquire(8192, 1 << 20, None).await {
            Err(e) => e,
            Ok(_) => panic!("the arena is full"),
        };
        assert_eq!(e.code, Code::ResourceExhausted);
        assert!(e.retryable());
        for part in [
            "1048576 bytes",
            "arena 65536",
            "65536 in use",
            "0 other readers waiting",
            "STRATA_STAGING_BYTES",
        ] {
            assert!(
                e.message.contains(part),
                "{part} missing from {}",
                e.message
            );
        }
        assert_eq!((m.timeouts.get(), m.waiters.get()), (1, 0));
        drop(held);
        assert_eq!(m.in_use.get(), 0);
        let g = s.acquire(8192, 8192, None).await.expect("space is back");
        assert_eq!(g.bytes(), 8192);
    }

    #[tokio::test]
    async fn a_waiter_is_woken_by_a_release_and_a_cancelled_waiter_leaves_no_trace() {
        let m = metrics();
        let s = Staging::new(16 << 10, Duration::from_secs(5), m.clone());
        let held = s.acquire(16 << 10, 16 << 10, None).await.expect("fits");
        // A waiter that is cancelled (its client went away) while it waits.
        let cancelled =
            tokio::time::timeout(Duration::from_millis(30), s.acquire(4096, 4096, None)).await;
        assert!(cancelled.is_err());
        assert_eq!(m.waiters.get(), 0);
        let s2 = s.clone();
        let waiter = tokio::spawn(async move {
            s2.acquire(16 << 10, 16 << 10, None)
                .await
                .map(|g| g.bytes())
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(m.waiters.get(), 1);
        let t0 = Instant::now();
        drop(held);
        assert_eq!(waiter.await.expect("join").expect("woken"), 16 << 10);
        assert!(
            t0.elapsed() < Duration::from_secs(4),
            "woken at once, not at the deadline"
        );
        assert_eq!(m.in_use.get(), 0);
    }

    #[tokio::test]
    async fn more_than_the_arena_at_once_is_refused_the_arena_itself_is_not() {
        let s = Staging::new(64 << 10, Duration::from_millis(50), metrics());
        assert!(s.acquire((64 << 10) + 1, 1 << 20, None).await.is_err());
        let g = s
            .acquire(64 << 10, 1 << 20, None)
            .await
            .expect("the whole arena");
        assert_eq!(g.bytes(), 64 << 10);
    }

    /// One address holds at most its share, however much is free; other
    /// addresses (and callers that are not peers) are served meanwhile, and
    /// a peer's entry goes once it holds nothing.
    #[tokio::test]
    async fn one_address_holds_at_most_its_share() {
        let s = Staging::new(64 << 10, Duration::from_millis(50), metrics());
        assert_eq!((s.piece_bytes(), s.peer_share()), (16 << 10, 16 << 10));
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let a1 = s
            .acquire(16 << 10, 1 << 20, Some(a))
            .await
            .expect("a's share");
        let e = match s.acquire(4096, 4096, Some(a)).await {
            Err(e) => e,
            Ok(_) => panic!("past a's share"),
        };
        assert_eq!(e.code, Code::ResourceExhausted);
        assert!(
            e.message.contains("one address holding at most 16384"),
            "{e}"
        );
        assert_eq!(s.in_use(), 16 << 10, "the refused read holds nothing");
        let b1 = s
            .acquire(16 << 10, 1 << 20, Some(b))
            .await
            .expect("b's share");
        let other = s.acquire(32 << 10, 1 << 20, None).await.expect("the rest");
        assert_eq!(s.in_use(), 64 << 10);
        drop((b1, other));
        drop(a1);
        let a2 = s
            .acquire(16 << 10, 1 << 20, Some(a))
            .await
            .expect("a's again");
        assert_eq!(s.inner.peers.lock().len(), 1);
        drop(a2);
        assert!(s.inner.peers.lock().is_empty(), "idle peers are forgotten");
        assert_eq!(s.in_use(), 0);
    }

    /// Waiters are served first come, first served: a small read that would
    /// fit in the space freed does not overtake a larger one queued before.
    #[tokio::test]
    async fn waiters_are_served_in_arrival_order() {
        let m = metrics();
        let s = Staging::new(16 << 10, Duration::from_secs(10), m.clone());
        let a_half = s.acquire(8 << 10, 8 << 10, None).await.expect("fits");
        let b_half = s.acquire(8 << 10, 8 << 10, None).await.expect("fits");
        let order = Arc::new(Mutex::new(Vec::new()));
        let spawn = |name: &'static str, bytes: u64| {
            let (s, order) = (s.clone(), order.clone());
            tokio::spawn(async move {
                let g = s.acquire(bytes, bytes, None).await.expect("served");
                order.lock().push(name);
                g
            })
        };
        let waiters = |n| {
            let m = m.clone();
            async move {
                for _ in 0..500 {
                    if m.waiters.get() == n {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                panic!("waiters never reached {n}");
            }
        };
        let big = spawn("big", 16 << 10);
        waiters(1).await;
        let small = spawn("small", 4 << 10);
        waiters(2).await;
        // 8 KiB free: enough for the small read, not the big one; the small
        // one still waits its turn.
        drop(a_half);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(order.lock().is_empty(), "nobody overtook the big read");
        drop(b_half);
        let g = big.await.expect("join");
        assert_eq!(*order.lock(), ["big"]);
        drop(g);
        drop(small.await.expect("join"));
        assert_eq!(*order.lock(), ["big", "small"]);
        assert_eq!((m.waiters.get(), m.in_use.get()), (0, 0));
    }

    #[test]
    fn a_piece_is_a_quarter_of_the_arena_in_whole_units_within_bounds() {
        let piece = |cap| Staging::new(cap, Duration::from_millis(1), metrics()).piece_bytes();
        assert_eq!(piece(64 << 10), 16 << 10);
        assert_eq!(piece(40 << 10), 8 << 10, "10 units: a quarter is 2 whole");
        assert_eq!(piece(4 << 10), 4 << 10, "never below one unit");
        assert_eq!(piece(64 << 20), 4 << 20, "never above 4 MiB");
    }

    /// Piece buffers come zeroed at the length asked; recycled ones are
    /// reused, at most one per piece the arena holds, never oversized ones.
    #[test]
    fn piece_buffers_are_zeroed_reused_and_bounded() {
        let s = Staging::new(64 << 10, Duration::from_millis(1), metrics());
        let piece = s.piece_bytes() as usize;
        assert_eq!(piece, 16 << 10);
        let pooled = |s: &Staging| s.inner.pool.lock().len();
        let mut b = s.buffer(100);
        assert_eq!(b, vec![0u8; 100]);
        b.fill(7);
        s.recycle(b);
        assert_eq!(pooled(&s), 1);
        assert_eq!(s.buffer(50), vec![0u8; 50], "a reused buffer is zeroed");
        assert_eq!(pooled(&s), 0, "taken from the pool");
        // A buffer of exactly a piece is kept; one byte larger is not.
        let exact = Vec::with_capacity(piece);
        let over = Vec::with_capacity(piece + 1);
        assert_eq!((exact.capacity(), over.capacity()), (piece, piece + 1));
        s.recycle(over);
        assert_eq!(pooled(&s), 0, "oversized buffers are dropped");
        s.recycle(exact);
        assert_eq!(pooled(&s), 1);
        // 64 KiB holds 4 pieces: the pool keeps 4 idle buffers, not 5.
        for _ in 0..4 {
            s.recycle(Vec::with_capacity(piece));
        }
        assert_eq!(pooled(&s), 4);
    }
}
