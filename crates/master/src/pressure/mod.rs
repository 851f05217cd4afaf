//! DRAM pressure: eviction (`eviction.rs`: the background evictor down to
//! the watermark, and inline eviction for a put that does not fit) and
//! backpressure (`backpressure.rs`: puts that wait, bounded by
//! `--put-wait`, for DRAM that copies to SSD or the end of readers' leases
//! will free). [`Pressure`] holds their signals; its fields are private to
//! `pressure/`.

pub mod backpressure;
pub mod eviction;

use backpressure::PutWaiters;

/// The signals of DRAM pressure.
#[derive(Default)]
pub(crate) struct Pressure {
    /// Puts waiting for DRAM (`--put-wait`).
    waiters: PutWaiters,
    /// Rung when a put leaves DRAM above the high watermark: the evictor
    /// runs now rather than at its next tick.
    evict_wakeup: tokio::sync::Notify,
}

impl Pressure {
    /// DRAM may have been freed: the waiting put whose turn it is looks
    /// again.
    pub(crate) fn space_freed(&self) {
        self.waiters.notify();
    }

    /// Puts waiting for DRAM now.
    pub(crate) fn waiting(&self) -> usize {
        self.waiters.waiting()
    }

    /// Asks the background evictor to run now.
    pub(crate) fn wake_evictor(&self) {
        self.evict_wakeup.notify_one();
    }

    /// Fires when a put asked the evictor to run (`wake_evictor`).
    pub(crate) fn evictor_wanted(&self) -> tokio::sync::futures::Notified<'_> {
        self.evict_wakeup.notified()
    }
}
