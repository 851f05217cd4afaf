//! The window SSD reads are lent from (`--transport ucx`): one block of
//! memory registered with UCX, split into slots of one staging piece. A
//! `Stage` request reads an object's piece from disk into a free slot and
//! lends it; the reader fetches it one-sided (`ucp_get_nbx`, no agent CPU on
//! the data path) and gives the slot back, or the staging reaper reclaims it
//! after its TTL. The slot is held by the lease, so it is reused only once
//! the lease is gone.
//!
//! The window is memory of its own (the arena's buffers serve TCP readers),
//! so a lent piece holds a slot, not arena space. A stager waits for a free
//! slot first come first served, for at most `--staging-wait`, like a TCP
//! reader waits for arena space.

use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;
use strata_common::{Code, Error, Result};
use strata_transport::region::Segment;
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

pub struct LendWindow {
    segment: Arc<Segment>,
    slot_bytes: u64,
    free: Arc<Mutex<Vec<u64>>>,
    /// One permit per free slot: waiters queue here (FIFO).
    slots: Arc<Semaphore>,
    route: WindowRoute,
    /// What keeps the registration alive (the UCX engine); dropped with the
    /// window.
    _registration: Box<dyn std::any::Any + Send + Sync>,
}

/// A slot taken from the window; back in the free list when dropped, before
/// its permit lets the next waiter in.
pub struct Slot {
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

impl LendWindow {
    /// A window over `segment` (whole slots of `slot_bytes`), reached
    /// through `route` while `registration` lives.
    pub fn new(
        segment: Arc<Segment>,
        slot_bytes: u64,
        route: WindowRoute,
        registration: Box<dyn std::any::Any + Send + Sync>,
    ) -> LendWindow {
        let slots = (segment.len() as u64 / slot_bytes.max(1)).max(1);
        LendWindow {
            segment,
            slot_bytes,
            // Popped from the end: slot 0 first.
            free: Arc::new(Mutex::new((0..slots).rev().collect())),
            slots: Arc::new(Semaphore::new(slots as usize)),
            route,
            _registration: registration,
        }
    }

    pub fn slot_bytes(&self) -> u64 {
        self.slot_bytes
    }

    pub fn size(&self) -> u64 {
        self.segment.len() as u64
    }

    pub fn route(&self) -> &WindowRoute {
        &self.route
    }

    /// A free slot, waiting (first come, first served) up to `wait` for
    /// one.
    pub async fn take(&self, wait: Duration) -> Result<Slot> {
        let permit = tokio::time::timeout(wait, self.slots.clone().acquire_owned())
            .await
            .map_err(|_| {
                Error::new(
                    Code::ResourceExhausted,
                    format!(
                        "every slot of the lend window ({} x {} bytes) stayed lent for {wait:?}; \
                         raise --staging-bytes (STRATA_STAGING_BYTES) on this SSD agent",
                        self.segment.len() as u64 / self.slot_bytes.max(1),
                        self.slot_bytes
                    ),
                )
            })?
            .map_err(|_| Error::unavailable("the SSD agent is shutting down"))?;
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

    /// Where `slot` starts in the window.
    pub fn offset_of(&self, slot: &Slot) -> u64 {
        slot.index * self.slot_bytes
    }

    /// The first `len` bytes of `slot`, to read a piece into.
    ///
    /// # Safety
    /// The caller holds `slot` and nothing else writes it: a slot is taken
    /// by one `Stage` and is not lent (readable by peers) until it is filled.
    pub unsafe fn slot_mut<'a>(&'a self, slot: &'a mut Slot, len: u64) -> Result<&'a mut [u8]> {
        let len = len.min(self.slot_bytes);
        // SAFETY: exclusivity is the caller's contract; bounds are checked.
        unsafe { self.segment.slice_mut(self.offset_of(slot), len) }
    }

    /// The window's memory (to move into a blocking read).
    pub fn segment(&self) -> &Arc<Segment> {
        &self.segment
    }

    /// Free slots right now.
    pub fn free_slots(&self) -> usize {
        self.free.lock().len()
    }
}

/// Registers a window of `bytes` (whole slots of `slot_bytes`) with a UCX
/// engine of its own.
#[cfg(feature = "ucx")]
pub async fn start_ucx(bytes: u64, slot_bytes: u64) -> Result<LendWindow> {
    let len = (bytes / slot_bytes).max(1) * slot_bytes;
    let segment = Arc::new(Segment::new(len as usize)?);
    let node = strata_transport::ucx::UcxNode::start(None, std::slice::from_ref(&segment)).await?;
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
    Ok(LendWindow::new(segment, slot_bytes, route, Box::new(node)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(len: usize, slot: u64) -> LendWindow {
        let route = WindowRoute {
            fingerprint: 1,
            base: 0x1000,
            worker: vec![1],
            rkey: vec![2],
        };
        LendWindow::new(
            Arc::new(Segment::new(len).unwrap()),
            slot,
            route,
            Box::new(()),
        )
    }

    const NOW: Duration = Duration::from_millis(20);

    #[tokio::test]
    async fn slots_are_whole_distinct_and_come_back_when_dropped() {
        let w = window(64 << 10, 16 << 10);
        let mut slots = Vec::new();
        for _ in 0..4 {
            slots.push(w.take(NOW).await.expect("a slot"));
        }
        let mut offs: Vec<u64> = slots.iter().map(|s| w.offset_of(s)).collect();
        offs.sort_unstable();
        assert_eq!(offs, [0, 16 << 10, 32 << 10, 48 << 10]);
        // 4 whole slots, no fifth: a taker waits, then says what to raise.
        let e = w.take(NOW).await.err().expect("no fifth slot");
        assert_eq!(e.code, Code::ResourceExhausted);
        assert!(e.message.contains("--staging-bytes"), "{e}");
        // A waiter gets the first slot given back.
        let (tx, rx) = tokio::sync::oneshot::channel();
        let back = slots.pop().unwrap();
        let freed = w.offset_of(&back);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            drop(back);
            let _ = tx.send(());
        });
        let s = w
            .take(Duration::from_secs(5))
            .await
            .expect("woken by the drop");
        assert_eq!(w.offset_of(&s), freed);
        rx.await.unwrap();
        drop((s, slots));
        assert_eq!(w.free_slots(), 4);
        // A partial slot at the end is not one.
        assert_eq!(window((64 << 10) + 100, 16 << 10).free_slots(), 4);
        // A slot's bytes stay inside it.
        let mut s = w.take(NOW).await.unwrap();
        // SAFETY: the slot is held and written only here.
        assert_eq!(
            unsafe { w.slot_mut(&mut s, 1 << 30) }.unwrap().len(),
            16 << 10
        );
    }
}
