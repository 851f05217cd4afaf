//! A TCP proxy in a host, for what the kernel here cannot do (no netem):
//! each chunk read from either side is held for the link's delay and paced
//! to its rate before it is written on. Point a service's advertised address
//! at it to slow every link to that service; `Link::set` changes the delay
//! and rate of connections already open, so a nemesis can slow and restore a
//! link at will.

use crate::fleet::HostRuntime;
use anyhow::Context;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The delay and rate a proxy applies now (shared with its connections).
#[derive(Default)]
pub struct Link {
    delay_us: AtomicU64,
    /// Bytes per second; 0: unpaced.
    rate: AtomicU64,
}

impl Link {
    pub fn set(&self, delay: Duration, bytes_per_sec: u64) {
        self.delay_us
            .store(delay.as_micros() as u64, Ordering::Relaxed);
        self.rate.store(bytes_per_sec, Ordering::Relaxed);
    }

    /// How long `n` bytes are held now.
    fn hold(&self, n: usize) -> Duration {
        let delay = Duration::from_micros(self.delay_us.load(Ordering::Relaxed));
        match self.rate.load(Ordering::Relaxed) {
            0 => delay,
            r => delay + Duration::from_secs_f64(n as f64 / r as f64),
        }
    }
}

/// Forwards connections until dropped (its tasks end with it).
pub struct Proxy {
    stop: tokio_util::sync::CancellationToken,
    pub link: Arc<Link>,
}

impl Proxy {
    /// Listens on `listen` (an address of the runtime's host) and forwards
    /// each connection to `target`, with `delay` and `bytes_per_sec` (0:
    /// unpaced) to begin with.
    pub fn start(
        rt: &HostRuntime,
        listen: &str,
        target: &str,
        delay: Duration,
        bytes_per_sec: u64,
    ) -> anyhow::Result<Proxy> {
        let stop = tokio_util::sync::CancellationToken::new();
        let link = Arc::new(Link::default());
        link.set(delay, bytes_per_sec);
        let l = rt
            .block_on(tokio::net::TcpListener::bind(listen))
            .with_context(|| format!("the proxy cannot listen on {listen}"))?;
        let (target, s, lk) = (target.to_string(), stop.clone(), link.clone());
        rt.spawn(async move {
            loop {
                let (down, _) = tokio::select! {
                    _ = s.cancelled() => return,
                    r = l.accept() => match r {
                        Ok(c) => c,
                        // Out of descriptors and the like: do not spin.
                        Err(_) => {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            continue;
                        }
                    },
                };
                let (target, s, lk) = (target.clone(), s.clone(), lk.clone());
                tokio::spawn(async move {
                    let Ok(up) = tokio::net::TcpStream::connect(&target).await else {
                        return;
                    };
                    let (dr, dw) = down.into_split();
                    let (ur, uw) = up.into_split();
                    tokio::select! {
                        _ = s.cancelled() => {}
                        _ = pump(dr, uw, &lk) => {}
                        _ = pump(ur, dw, &lk) => {}
                    }
                });
            }
        });
        Ok(Proxy { stop, link })
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    link: &Link,
) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let hold = link.hold(n);
        if !hold.is_zero() {
            tokio::time::sleep(hold).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_holds_its_delay_plus_the_time_its_rate_takes() {
        let l = Link::default();
        assert_eq!(l.hold(1 << 20), Duration::ZERO);
        l.set(Duration::from_millis(50), 1 << 20);
        assert_eq!(l.hold(1 << 19), Duration::from_millis(550));
        l.set(Duration::ZERO, 0);
        assert_eq!(l.hold(1 << 19), Duration::ZERO);
    }
}
