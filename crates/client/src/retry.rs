//! Retry with exponential backoff and jitter, for errors marked retryable.

use std::future::Future;
use std::time::Duration;
use strata_common::Result;

#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    pub attempts: u32,
    pub base: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            attempts: 6,
            base: Duration::from_millis(20),
            max: Duration::from_secs(1),
        }
    }
}

impl Backoff {
    pub fn delay(&self, attempt: u32) -> Duration {
        let exp = self.base.saturating_mul(1u32 << attempt.min(16));
        let d = exp.min(self.max);
        // Full jitter in [d/2, d] so retrying clients spread out.
        let half = d / 2;
        half + half.mul_f64(rand::random::<f64>())
    }

    /// Runs `f` until it succeeds, fails with a non-retryable error, or the
    /// attempts are used up (the last error is returned).
    pub async fn run<T, F, Fut>(&self, mut f: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let mut attempt = 0;
        loop {
            match f().await {
                Err(e) if e.retryable() && attempt + 1 < self.attempts => {
                    tracing::debug!(error = %e, attempt, "retrying");
                    tokio::time::sleep(self.delay(attempt)).await;
                    attempt += 1;
                }
                r => return r,
            }
        }
    }
}
