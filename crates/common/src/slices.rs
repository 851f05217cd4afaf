//! Driving a future on a current-thread runtime in time slices (the
//! Python client's main thread runs its signal handlers between them).
//!
//! Why a helper: tokio's current-thread scheduler hands the wakers of
//! futures that yielded for their cooperative budget to a per-`block_on`
//! list, woken only when it next parks, and drops that list when
//! `block_on` returns. A slice that ended right after a leaf read yielded
//! so lost its wake-up: the read was never polled again until its own 30 s
//! timeout (seen as a 34 s large get under load in the Python tests). A
//! slice that runs out therefore yields once before it returns, which
//! parks the scheduler and wakes every deferred waker.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// Polls `fut` on `rt` for up to `slice`: its output, or `None` when the
/// slice ran out (call again to go on; no wake-up is lost in between).
pub fn block_on_slice<F: Future + ?Sized>(
    rt: &tokio::runtime::Runtime,
    fut: Pin<&mut F>,
    slice: Duration,
) -> Option<F::Output> {
    rt.block_on(async {
        match tokio::time::timeout(slice, fut).await {
            Ok(v) => Some(v),
            Err(_) => {
                // Parks once: the scheduler wakes what was deferred.
                tokio::task::yield_now().await;
                None
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::stream::{FuturesUnordered, StreamExt};
    use std::time::Instant;

    /// A consumer that spends its cooperative budget over and over (a
    /// large read does so in 128 KiB pieces) inside a FuturesUnordered, as
    /// the client's chunked reads are, driven in slices that keep running
    /// out: it finishes, however the slices fall.
    #[test]
    fn no_wake_up_is_lost_between_slices() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
        let n = 200_000u64;
        for i in 0..n {
            tx.send(i).unwrap();
        }
        drop(tx);
        let consumer = async move {
            let mut sum = 0u64;
            while let Some(v) = rx.recv().await {
                sum += v;
                // Slow enough that slices run out mid-stream.
                std::hint::black_box(&sum);
            }
            sum
        };
        let mut all: FuturesUnordered<_> = std::iter::once(Box::pin(consumer)).collect();
        let mut fut = std::pin::pin!(async move { all.next().await });
        let t0 = Instant::now();
        let (mut slices, mut ran_out) = (0, 0);
        let got = loop {
            slices += 1;
            match block_on_slice(&rt, fut.as_mut(), Duration::from_micros(200)) {
                Some(v) => break v,
                None => ran_out += 1,
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "stalled after {slices} slices: a wake-up was lost"
            );
        };
        assert_eq!(got, Some(n * (n - 1) / 2));
        assert!(ran_out > 0, "no slice ran out: the test proved nothing");
    }
}
