//! Memory lent to one-sided readers: a window registered with a transport
//! that peers read directly (UCX), split into slots of one piece. A server
//! stages bytes it does not keep in registered memory (an SSD agent's
//! bucket files) into a free slot and lends it (`Op::Stage`); the reader
//! fetches the piece itself and gives the slot back (`Op::GiveBack`), or
//! [`Lender::reap`] reclaims it after its TTL. A lease asked for with
//! `FLAG_HELD` is also taken back as soon as the connection it was asked on
//! closes ([`Lender::reclaim_held`]): a reader that died frees its slots at
//! once, not a TTL later. A slot is held by its lease, so it is written
//! again only once the lease is gone.
//!
//! A stager waits for a free slot first come first served, for at most the
//! lender's wait, then fails with an error that says what to raise.

use crate::frame::Staged;
use crate::region::Segment;
use parking_lot::Mutex;
use prometheus::{IntCounter, IntGauge};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_common::{Code, Error, Result};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How long a lent slot stays lent if it is never given back.
pub const LEND_TTL: Duration = Duration::from_secs(10);

/// How peers reach the window: what a `Staged` answer carries.
#[derive(Debug, Clone)]
pub struct WindowRoute {
    /// Names this window (random, never 0): readers cache its route by it.
    pub fingerprint: u64,
    pub base: u64,
    pub worker: Vec<u8>,
    pub rkey: Vec<u8>,
}

#[derive(Clone)]
pub struct LendMetrics {
    /// Slots lent right now.
    pub leases: IntGauge,
    /// Leases reclaimed because their TTL passed.
    pub expired: IntCounter,
    /// Leases taken back because the connection that held them closed
    /// before the reader gave them back.
    pub disconnected: IntCounter,
    /// Bytes staged into lent slots.
    pub lent_bytes: IntCounter,
}

/// Tuning of a [`Lender`].
#[derive(Debug, Clone)]
pub struct LendConfig {
    /// Bytes of a slot: the most one `Stage` lends.
    pub slot_bytes: u64,
    /// How long a stager waits for a free slot.
    pub wait: Duration,
    /// How long a slot stays lent if never given back.
    pub ttl: Duration,
    /// The setting to name when the window is too small.
    pub setting: &'static str,
}

pub struct Lender {
    segment: Arc<Segment>,
    cfg: LendConfig,
    free: Arc<Mutex<Vec<u64>>>,
    /// One permit per free slot: waiters queue here (FIFO).
    slots: Arc<Semaphore>,
    route: WindowRoute,
    lent: Mutex<HashMap<u64, Lent>>,
    next_lease: AtomicU64,
    m: LendMetrics,
    /// What keeps the registration alive (the UCX engine); dropped with the
    /// lender, before the window's memory may go.
    _registration: Box<dyn std::any::Any + Send + Sync>,
}

/// A slot taken from the window; back in the free list when dropped, before
/// its permit lets the next waiter in.
struct Slot {
    index: u64,
    free: Arc<Mutex<Vec<u64>>>,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Slot {
    fn drop(&mut self) {
        // Runs before the fields (the permit) drop.
        self.free.lock().push(self.index);
    }
}

/// A slot lent to a reader.
struct Lent {
    deadline: Instant,
    token: u64,
    bytes: u64,
    _slot: Slot,
}

impl Lender {
    /// Lends `segment` (whole slots of `cfg.slot_bytes`), reached through
    /// `route` while `registration` lives.
    pub fn new(
        segment: Arc<Segment>,
        cfg: LendConfig,
        route: WindowRoute,
        registration: Box<dyn std::any::Any + Send + Sync>,
        m: LendMetrics,
    ) -> Lender {
        let slots = (segment.len() as u64 / cfg.slot_bytes.max(1)).max(1);
        Lender {
            segment,
            cfg,
            // Popped from the end: slot 0 first.
            free: Arc::new(Mutex::new((0..slots).rev().collect())),
            slots: Arc::new(Semaphore::new(slots as usize)),
            route,
            lent: Mutex::new(HashMap::new()),
            next_lease: AtomicU64::new(1),
            m,
            _registration: registration,
        }
    }

    pub fn slot_bytes(&self) -> u64 {
        self.cfg.slot_bytes
    }

    /// Bytes of the window.
    pub fn size(&self) -> u64 {
        self.segment.len() as u64
    }

    /// Slots lent right now.
    pub fn leases(&self) -> usize {
        self.lent.lock().len()
    }

    /// Free slots right now.
    pub fn free_slots(&self) -> usize {
        self.free.lock().len()
    }

    async fn take(&self) -> Result<Slot> {
        let wait = self.cfg.wait;
        let permit = tokio::time::timeout(wait, self.slots.clone().acquire_owned())
            .await
            .map_err(|_| {
                Error::new(
                    Code::ResourceExhausted,
                    format!(
                        "every slot of the lend window ({} x {} bytes) stayed lent for {wait:?}; raise {}",
                        self.size() / self.cfg.slot_bytes.max(1),
                        self.cfg.slot_bytes,
                        self.cfg.setting
                    ),
                )
            })?
            .map_err(|_| Error::unavailable("shutting down"))?;
        // A permit means a free slot: slots go back to the list before
        // their permit does.
        let index = self
            .free
            .lock()
            .pop()
            .ok_or_else(|| Error::internal("lend window permit without a free slot"))?;
        Ok(Slot {
            index,
            free: self.free.clone(),
            _permit: permit,
        })
    }

    /// Stages up to `want` bytes (at most a slot) for a one-sided reader:
    /// takes a free slot, has `fill` write the bytes into it (on a blocking
    /// thread: it may read a file) and lends it. Returns where they are and
    /// the lease and token that give the slot back.
    pub async fn stage<F>(&self, want: u64, fill: F) -> Result<Staged>
    where
        F: FnOnce(&mut [u8]) -> Result<()> + Send + 'static,
    {
        if want == 0 {
            return Err(Error::invalid("nothing to stage"));
        }
        let n = want.min(self.cfg.slot_bytes);
        let slot = self.take().await?;
        let off = slot.index * self.cfg.slot_bytes;
        let seg = self.segment.clone();
        let slot = tokio::task::spawn_blocking(move || {
            // SAFETY: this call holds the slot; it is lent (readable by
            // peers) only once filled, and written by nobody else.
            let dst = unsafe { seg.slice_mut(off, n) }?;
            fill(dst).map(|()| slot)
        })
        .await
        .map_err(|e| Error::internal(format!("staging task failed: {e}")))??;
        let lease = self.next_lease.fetch_add(1, Ordering::Relaxed);
        let token = rand::random::<u64>();
        {
            let mut lent = self.lent.lock();
            lent.insert(
                lease,
                Lent {
                    deadline: Instant::now() + self.cfg.ttl,
                    token,
                    bytes: n,
                    _slot: slot,
                },
            );
            self.m.leases.set(lent.len() as i64);
        }
        self.m.lent_bytes.inc_by(n);
        Ok(Staged {
            lease,
            token,
            window_offset: off,
            length: n,
            ttl_ms: self.cfg.ttl.as_millis() as u64,
            fingerprint: self.route.fingerprint,
            base: self.route.base,
            size: self.size(),
            worker: self.route.worker.clone(),
            rkey: self.route.rkey.clone(),
        })
    }

    /// The reader is done with a lease. False if it was unknown (given back
    /// already, reclaimed) or the token is wrong.
    pub fn give_back(&self, lease: u64, token: u64) -> bool {
        self.take_back(lease, token, None)
    }

    /// Ends a lease; `counter` counts it first (before the gauge shows the
    /// slot free, so a reader of both never sees one without the other).
    fn take_back(&self, lease: u64, token: u64, counter: Option<&IntCounter>) -> bool {
        let mut lent = self.lent.lock();
        if lent.get(&lease).is_none_or(|l| l.token != token) {
            return false;
        }
        let taken = lent.remove(&lease);
        if let Some(c) = counter {
            c.inc();
        }
        self.m.leases.set(lent.len() as i64);
        drop(lent);
        // The slot is freed outside the lock.
        drop(taken);
        true
    }

    /// Takes back a lease whose holding connection closed before the
    /// reader gave it back (`FLAG_HELD`). False if it was gone already.
    pub fn reclaim_held(&self, lease: u64, token: u64) -> bool {
        let back = self.take_back(lease, token, Some(&self.m.disconnected));
        if back {
            tracing::debug!(
                lease,
                "a one-sided reader's connection closed before it gave its lent slot back; reclaimed"
            );
        }
        back
    }

    /// Reclaims leases whose TTL passed. Returns how many.
    pub fn reap(&self, now: Instant) -> usize {
        let mut lent = self.lent.lock();
        let before = lent.len();
        lent.retain(|id, l| {
            let keep = l.deadline > now;
            if !keep {
                tracing::warn!(
                    lease = id,
                    bytes = l.bytes,
                    "a one-sided reader never gave its lent slot back; reclaimed"
                );
            }
            keep
        });
        let reaped = before - lent.len();
        self.m.leases.set(lent.len() as i64);
        self.m.expired.inc_by(reaped as u64);
        reaped
    }
}

/// A lender whose window (`bytes`, whole slots) is registered with a UCX
/// engine of its own.
#[cfg(feature = "ucx")]
pub async fn start_ucx(bytes: u64, cfg: LendConfig, m: LendMetrics) -> Result<Lender> {
    let slot = cfg.slot_bytes.max(1);
    let len = (bytes / slot).max(1) * slot;
    let segment = Arc::new(Segment::new(len as usize)?);
    let node = crate::ucx::UcxNode::start(None, std::slice::from_ref(&segment)).await?;
    let reg = node
        .routes()
        .first()
        .cloned()
        .ok_or_else(|| Error::internal("UCX registered no window"))?;
    let route = WindowRoute {
        fingerprint: rand::random::<u64>().max(1),
        base: reg.base,
        worker: node.worker_address().to_vec(),
        rkey: reg.rkey,
    };
    Ok(Lender::new(segment, cfg, route, Box::new(node), m))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics() -> LendMetrics {
        LendMetrics {
            leases: IntGauge::new("l", "l").unwrap(),
            expired: IntCounter::new("e", "e").unwrap(),
            disconnected: IntCounter::new("d", "d").unwrap(),
            lent_bytes: IntCounter::new("b", "b").unwrap(),
        }
    }

    fn lender(len: usize, slot: u64, ttl: Duration, wait: Duration) -> Lender {
        let route = WindowRoute {
            fingerprint: 1,
            base: 0x1000,
            worker: vec![1],
            rkey: vec![2],
        };
        let cfg = LendConfig {
            slot_bytes: slot,
            wait,
            ttl,
            setting: "--staging-bytes",
        };
        Lender::new(
            Arc::new(Segment::new(len).unwrap()),
            cfg,
            route,
            Box::new(()),
            metrics(),
        )
    }

    fn fill(byte: u8) -> impl FnOnce(&mut [u8]) -> Result<()> + Send + 'static {
        move |d: &mut [u8]| {
            d.fill(byte);
            Ok(())
        }
    }

    #[tokio::test]
    async fn slots_are_whole_distinct_filled_and_waited_for() {
        let l = lender(
            (64 << 10) + 100,
            16 << 10,
            LEND_TTL,
            Duration::from_secs(30),
        );
        assert_eq!(l.free_slots(), 4, "a partial slot at the end is not one");
        let mut lent = Vec::new();
        for i in 0..4u8 {
            let st = l.stage(1 << 30, fill(i)).await.expect("a slot");
            assert_eq!(st.length, 16 << 10, "at most a slot");
            let bytes = l.segment.slice(st.window_offset, st.length).unwrap();
            assert!(bytes.iter().all(|b| *b == i));
            lent.push(st);
        }
        let mut offs: Vec<u64> = lent.iter().map(|s| s.window_offset).collect();
        offs.sort_unstable();
        assert_eq!(offs, [0, 16 << 10, 32 << 10, 48 << 10]);
        assert_eq!((l.leases(), l.m.lent_bytes.get()), (4, 64 << 10));
        // No fifth: a stager waits...
        let l = Arc::new(l);
        let waiter = {
            let l = l.clone();
            tokio::spawn(async move { l.stage(100, fill(7)).await })
        };
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(!waiter.is_finished(), "no free slot yet");
        // ...and gets the slot given back.
        let first = lent.remove(0);
        assert!(l.give_back(first.lease, first.token));
        let st = waiter.await.unwrap().expect("woken by the give-back");
        assert_eq!((st.window_offset, st.length), (first.window_offset, 100));
        // A failed fill lends nothing and frees its slot.
        assert!(l.give_back(st.lease, st.token));
        let e = l
            .stage(10, |_: &mut [u8]| Err(Error::new(Code::Corrupted, "bad")))
            .await
            .unwrap_err();
        assert_eq!(e.code, Code::Corrupted);
        assert_eq!((l.leases(), l.free_slots()), (3, 1));
        assert!(l.stage(0, fill(1)).await.is_err(), "nothing to stage");
    }

    /// A stager that finds every slot lent past its wait says what to raise.
    #[tokio::test]
    async fn a_full_window_names_the_setting_after_the_wait() {
        let l = lender(16 << 10, 16 << 10, LEND_TTL, Duration::from_millis(20));
        let _held = l.stage(1, fill(1)).await.unwrap();
        let e = l.stage(1, fill(9)).await.unwrap_err();
        assert_eq!(e.code, Code::ResourceExhausted);
        assert!(
            e.message.contains("1 x 16384") && e.message.contains("--staging-bytes"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn leases_are_given_back_with_their_token_once_or_reclaimed_at_their_deadline() {
        let l = lender(64 << 10, 16 << 10, Duration::from_secs(60), LEND_TTL);
        let before = Instant::now();
        let a = l.stage(100, fill(1)).await.unwrap();
        let b = l.stage(100, fill(2)).await.unwrap();
        let after = Instant::now();
        assert!(
            !l.give_back(a.lease, a.token ^ 1),
            "a wrong token returns nothing"
        );
        assert_eq!((l.leases(), l.m.leases.get()), (2, 2));
        assert!(l.give_back(a.lease, a.token));
        assert!(!l.give_back(a.lease, a.token), "a lease is returned once");
        assert_eq!((l.leases(), l.free_slots()), (1, 3));
        let ttl = Duration::from_secs(60);
        assert_eq!(
            l.reap(before + ttl - Duration::from_millis(1)),
            0,
            "not before"
        );
        assert_eq!(l.reap(after + ttl), 1, "due at its deadline");
        assert_eq!((l.leases(), l.free_slots(), l.m.expired.get()), (0, 4, 1));
        assert!(!l.give_back(b.lease, b.token), "already reclaimed");
    }
}
