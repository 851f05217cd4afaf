//! Retry with exponential backoff and jitter, for errors marked retryable:
//! long enough by default to ride out a leader failover (a new leader
//! serves within the election TTL plus its rebuild gate), bounded in both
//! attempts and time so nothing retries forever.

use std::future::Future;
use std::time::Duration;
use strata_common::Result;

#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    pub attempts: u32,
    pub base: Duration,
    pub max: Duration,
    /// No new attempt starts this long after the first one.
    pub deadline: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            attempts: 40,
            base: Duration::from_millis(20),
            max: Duration::from_millis(500),
            deadline: Duration::from_secs(20),
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
    /// attempts or the deadline are used up (the last error is returned).
    pub async fn run<T, F, Fut>(&self, mut f: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let mut attempt = 0;
        let t0 = tokio::time::Instant::now();
        loop {
            let e = match f().await {
                Err(e) if e.retryable() && attempt + 1 < self.attempts => e,
                r => return r,
            };
            let d = self.delay(attempt);
            if t0.elapsed() + d >= self.deadline {
                return Err(e);
            }
            tracing::debug!(error = %e, attempt, "retrying");
            tokio::time::sleep(d).await;
            attempt += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_common::Error;

    #[tokio::test]
    async fn retries_stop_at_the_deadline_and_not_on_fatal_errors() {
        let b = Backoff {
            attempts: 1000,
            base: Duration::from_millis(10),
            max: Duration::from_millis(10),
            deadline: Duration::from_millis(300),
        };
        let t0 = tokio::time::Instant::now();
        let mut n = 0;
        let r: Result<()> = b
            .run(|| {
                n += 1;
                async { Err(Error::unavailable("down")) }
            })
            .await;
        assert!(r.is_err());
        // No attempt starts past the deadline (the attempts are instant).
        assert!(
            t0.elapsed() < Duration::from_millis(300) + Duration::from_millis(100),
            "{:?}",
            t0.elapsed()
        );
        assert!((2..1000).contains(&n), "{n} attempts");
        let mut n = 0;
        let r: Result<()> = b
            .run(|| {
                n += 1;
                async { Err(Error::invalid("bad")) }
            })
            .await;
        assert!(r.is_err());
        assert_eq!(n, 1, "a fatal error is not retried");
    }
}
