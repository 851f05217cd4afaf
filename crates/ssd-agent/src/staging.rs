//! The read staging arena of this process: SSD reads stage their bytes in
//! memory bounded by `--staging-bytes`, shared by all readers. A read that
//! finds it full waits, first come first served (tokio's semaphore is FIFO),
//! for at most `--staging-wait`, then fails with an error that says what to
//! change. Space is released when the guard drops, on every path.

use prometheus::{Histogram, IntCounter, IntGauge};
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_common::{Code, Error, Result};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Granularity of arena accounting.
const UNIT: u64 = 4096;

#[derive(Clone)]
pub struct StagingMetrics {
    pub capacity: IntGauge,
    pub in_use: IntGauge,
    pub waiters: IntGauge,
    pub wait_seconds: Histogram,
    pub timeouts: IntCounter,
}

pub struct Staging {
    sem: Arc<Semaphore>,
    capacity: u64,
    wait: Duration,
    m: StagingMetrics,
}

/// Staged bytes; released on drop.
pub struct StagingGuard {
    _permit: OwnedSemaphorePermit,
    bytes: u64,
    m: StagingMetrics,
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
            sem: Arc::new(Semaphore::new(units as usize)),
            capacity: units * UNIT,
            wait,
            m,
        }
    }

    /// Reserves room for `bytes` (a read larger than the arena reserves all
    /// of it, so it still proceeds, alone).
    pub async fn acquire(&self, bytes: u64) -> Result<StagingGuard> {
        let units = bytes.div_ceil(UNIT).clamp(1, self.capacity / UNIT);
        let t0 = Instant::now();
        self.m.waiters.inc();
        let r = tokio::time::timeout(self.wait, self.sem.clone().acquire_many_owned(units as u32))
            .await;
        self.m.waiters.dec();
        self.m.wait_seconds.observe(t0.elapsed().as_secs_f64());
        match r {
            Ok(Ok(permit)) => {
                let staged = units * UNIT;
                self.m.in_use.add(staged as i64);
                Ok(StagingGuard {
                    _permit: permit,
                    bytes: staged,
                    m: self.m.clone(),
                })
            }
            Ok(Err(_)) => Err(Error::unavailable("the SSD agent is shutting down")),
            Err(_) => {
                self.m.timeouts.inc();
                let in_use = self.capacity - self.sem.available_permits() as u64 * UNIT;
                let msg = format!(
                    "SSD read of {bytes} bytes waited {:?} for staging space: arena {} bytes, {in_use} in use, {} waiting; \
                     raise --staging-bytes (STRATA_STAGING_BYTES) on the SSD agent that owns this disk \
                     (size it to concurrent readers x bytes per read)",
                    self.wait,
                    self.capacity,
                    self.m.waiters.get()
                );
                tracing::warn!("{msg}");
                Err(Error::new(Code::ResourceExhausted, msg))
            }
        }
    }
}
