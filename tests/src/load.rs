//! A put/get load from several clients that records every acknowledged put
//! and every error it saw (failover and restart tests).

use crate::payload;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_client::{Client, ClientConfig, PutOptions};
use strata_common::Error;
use tokio_util::sync::CancellationToken;

/// What the load saw.
#[derive(Default, Debug)]
pub struct LoadStats {
    /// (key, seed, len) of every acknowledged put.
    pub acked: Vec<(String, u64, usize)>,
    /// When each acknowledged put ended.
    pub put_times: Vec<Instant>,
    pub gets: usize,
    pub errors: Vec<Error>,
}

impl LoadStats {
    /// The longest gap between acknowledged puts from `t` on (the gap
    /// from `t` to the first one included).
    pub fn longest_pause_after(&self, t: Instant) -> Duration {
        let mut after: Vec<Instant> = self.put_times.iter().copied().filter(|&p| p > t).collect();
        after.sort();
        let mut prev = t;
        let mut worst = Duration::ZERO;
        for p in after {
            worst = worst.max(p - prev);
            prev = p;
        }
        worst
    }

    /// Every acknowledged put reads back byte-identical.
    pub async fn verify(&self, cl: &Client) {
        for (k, seed, len) in &self.acked {
            let got = cl
                .get(k)
                .await
                .unwrap_or_else(|e| panic!("acknowledged {k} lost: {e}"));
            assert!(got == payload(*seed, *len), "{k}: wrong bytes");
        }
    }
}

pub struct Load {
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<LoadStats>>,
    acked: Arc<AtomicUsize>,
}

fn seed_of(c: usize, i: usize) -> u64 {
    (c as u64) << 32 | i as u64
}

impl Load {
    /// `clients` clients of `master`, each putting keys `{prefix}-{c}-{i}`
    /// (4 to 64 KiB; every fifth round a batch of four) and reading back
    /// earlier ones, until stopped (or 20,000 rounds each).
    pub async fn start(master: &str, clients: usize, prefix: &str) -> Load {
        let stop = CancellationToken::new();
        let acked = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for c in 0..clients {
            let cl = Client::connect(ClientConfig::new(master)).await.unwrap();
            let (stop, prefix, count) = (stop.clone(), prefix.to_string(), acked.clone());
            tasks.push(tokio::spawn(async move {
                let mut s = LoadStats::default();
                for i in 0..20_000usize {
                    if stop.is_cancelled() {
                        break;
                    }
                    let (k, seed, len) = (
                        format!("{prefix}-{c}-{i}"),
                        seed_of(c, i),
                        4096 + (i * 7919) % (60 << 10),
                    );
                    // Every fifth round a batch of four (retried per item
                    // through a failover, as single puts are).
                    let batch: Vec<(String, u64, usize)> = if i % 5 == 4 {
                        (0..4u64)
                            .map(|j| (format!("{k}-b{j}"), seed ^ (j + 1) << 60, len / 2))
                            .collect()
                    } else {
                        vec![(k, seed, len)]
                    };
                    let data: Vec<Vec<u8>> = batch
                        .iter()
                        .map(|(_, seed, len)| payload(*seed, *len))
                        .collect();
                    let results = if batch.len() == 1 {
                        vec![cl.put(&batch[0].0, &data[0], &PutOptions::default()).await]
                    } else {
                        let items: Vec<(&str, &[u8])> = batch
                            .iter()
                            .zip(&data)
                            .map(|((k, _, _), d)| (k.as_str(), d.as_slice()))
                            .collect();
                        match cl.batch_put(&items, &PutOptions::default()).await {
                            Ok(r) => r,
                            Err(e) => vec![Err(e)],
                        }
                    };
                    for (r, item) in results.into_iter().zip(batch) {
                        match r {
                            Ok(()) => {
                                s.acked.push(item);
                                s.put_times.push(Instant::now());
                                count.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(e) => s.errors.push(e),
                        }
                    }
                    if let Some((k, seed, len)) =
                        s.acked.get(i * 31 % s.acked.len().max(1)).cloned()
                    {
                        match cl.get(&k).await {
                            // Never wrong bytes, failover or not.
                            Ok(v) => assert!(v == payload(seed, len), "{k}: wrong bytes"),
                            Err(e) => s.errors.push(e),
                        }
                        s.gets += 1;
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                s
            }));
        }
        Load { stop, tasks, acked }
    }

    /// Waits until the load acknowledged `n` more puts (bounded).
    pub async fn progress(&self, n: usize, within: Duration) {
        let base = self.acked.load(Ordering::Relaxed);
        let t0 = Instant::now();
        while self.acked.load(Ordering::Relaxed) < base + n {
            assert!(
                t0.elapsed() < within,
                "the load made no progress within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn stop(self) -> LoadStats {
        self.stop.cancel();
        let mut all = LoadStats::default();
        for t in self.tasks {
            let s = t.await.expect("load task");
            all.acked.extend(s.acked);
            all.put_times.extend(s.put_times);
            all.gets += s.gets;
            all.errors.extend(s.errors);
        }
        all
    }
}
