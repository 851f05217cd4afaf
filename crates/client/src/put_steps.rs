//! Where a put's time goes, step by step: the checksum worked out before
//! PutStart, PutStart, the replica writes and PutEnd
//! (`ClientConfig::put_steps`, off by default). For benchmarks and for
//! chasing latency (`strata bench --put-steps`), not a production metric:
//! with it off a put takes no timestamps.

use std::sync::Mutex;
use std::time::Instant;

/// The steps, in the order of [`PutSteps::take_medians`]'s answer.
pub const STEPS: [&str; 4] = ["crc32c", "PutStart", "write", "PutEnd"];

/// Puts remembered between two `take_medians`: enough for any bench phase,
/// bounded for a client left with it on.
const MAX_PUTS: usize = 1 << 20;

/// Step durations (µs) of the puts made since the last
/// [`PutSteps::take_medians`].
#[derive(Default)]
pub struct PutSteps {
    puts: Mutex<Vec<[u32; 4]>>,
}

impl PutSteps {
    /// One put attempt that reached PutEnd: `crc` is the checksum worked
    /// out before its first PutStart (zero when it is worked out while
    /// PutStart is in flight, which then counts it); `marks` are taken as
    /// the attempt starts and after PutStart, the writes and PutEnd.
    pub(crate) fn record(&self, crc: std::time::Duration, marks: [Instant; 4]) {
        let us = |d: std::time::Duration| u32::try_from(d.as_micros()).unwrap_or(u32::MAX);
        let put = [
            us(crc),
            us(marks[1] - marks[0]),
            us(marks[2] - marks[1]),
            us(marks[3] - marks[2]),
        ];
        let mut puts = self.puts.lock().unwrap_or_else(|e| e.into_inner());
        if puts.len() < MAX_PUTS {
            puts.push(put);
        }
    }

    /// The median of each step ([`STEPS`]) in µs over the puts recorded
    /// since the last call, and how many there were; forgets them. `None`
    /// when there were none.
    pub fn take_medians(&self) -> Option<(usize, [u32; 4])> {
        let mut puts = std::mem::take(&mut *self.puts.lock().unwrap_or_else(|e| e.into_inner()));
        if puts.is_empty() {
            return None;
        }
        let mut medians = [0u32; 4];
        for (i, m) in medians.iter_mut().enumerate() {
            puts.sort_unstable_by_key(|p| p[i]);
            *m = puts[puts.len() / 2][i];
        }
        Some((puts.len(), medians))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn medians_are_per_step_and_taking_them_forgets_the_puts() {
        let s = PutSteps::default();
        assert_eq!(s.take_medians(), None);
        let t = Instant::now();
        let ms = Duration::from_millis;
        // Steps of 1/2/3 ms, 5/1/9 ms and 2/7/4 ms: medians 2, 2, 4 ms.
        for (a, b, c) in [(1, 2, 3), (5, 1, 9), (2, 7, 4)] {
            let m1 = t + ms(a);
            let m2 = m1 + ms(b);
            s.record(ms(c), [t, m1, m2, m2 + ms(10)]);
        }
        assert_eq!(s.take_medians(), Some((3, [4000, 2000, 2000, 10000])));
        assert_eq!(s.take_medians(), None, "forgotten once taken");
    }
}
