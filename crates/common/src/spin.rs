//! A blocking call that spins a little before its thread sleeps (the
//! Python client's calls: `crates/python/src/runtime.rs`).
//!
//! Why: on a virtual machine a thread that sleeps in `epoll_wait` is woken
//! by the scheduler when its answer comes, and that wake-up is the largest
//! single cost of a small call across processes (measured on the 2-core VM
//! this was built on: a 64 KiB get 160 -> 104 µs, a put 224 -> 143 µs, with
//! the calling thread polling its sockets for the first 300 µs instead).
//! So a blocking call first polls its future, letting the runtime look at
//! its sockets without sleeping between polls, for up to `window`; then it
//! waits as before.
//!
//! Spinning burns the CPU it waits on, which is only a gain while a CPU is
//! spare: a thread spins only while at most `spinners` blocking calls of
//! the process are in flight (default: a quarter of the CPUs, at least
//! one), and stops as soon as more are. With four Python threads calling at
//! once on two CPUs, spinning every one of them halved their throughput.
//! `STRATA_SPIN_US` sets the window (0 turns it off), `STRATA_SPINNERS` the
//! number of calls in flight up to which one spins.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

/// The window when `STRATA_SPIN_US` does not set one.
pub const DEFAULT_WINDOW: Duration = Duration::from_micros(300);

/// Blocking calls in flight in this process.
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// How blocking calls of this process spin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spin {
    /// Longest a call polls before it sleeps.
    pub window: Duration,
    /// Calls in flight up to which a call spins.
    pub spinners: usize,
}

impl Spin {
    /// From the environment, read once per process.
    pub fn from_env() -> Spin {
        static SPIN: OnceLock<Spin> = OnceLock::new();
        *SPIN.get_or_init(|| {
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
            Spin::parse(
                std::env::var("STRATA_SPIN_US").ok().as_deref(),
                std::env::var("STRATA_SPINNERS").ok().as_deref(),
                cpus,
            )
        })
    }

    /// The settings from the two variables' values (a value that does not
    /// parse is ignored: a tuning knob must never stop a store).
    pub fn parse(window_us: Option<&str>, spinners: Option<&str>, cpus: usize) -> Spin {
        let window = window_us
            .and_then(|v| v.trim().parse::<u64>().ok())
            // Beyond 10 ms a sleep's wake-up is noise; cap the burn.
            .map_or(DEFAULT_WINDOW, |us| Duration::from_micros(us.min(10_000)));
        let spinners = spinners
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or((cpus / 4).max(1));
        Spin { window, spinners }
    }

    /// Runs `fut` as a blocking call: counted in flight, polled without
    /// sleeping while few calls are and until it has waited a window with
    /// nothing happening (each wake-up, an answer or a socket ready, starts
    /// the window again: a call of several round trips spins through all
    /// of them), then awaited.
    pub async fn run<F: Future>(self, fut: F) -> F::Output {
        let _call = InFlight::enter();
        let mut fut = pin!(fut);
        if !self.window.is_zero() {
            let woke = Arc::new(Woke {
                flag: AtomicBool::new(false),
                inner: std::future::poll_fn(|cx| Poll::Ready(cx.waker().clone())).await,
            });
            let waker = Waker::from(woke.clone());
            let mut since = Instant::now();
            loop {
                if woke.flag.swap(false, Ordering::Relaxed) {
                    since = Instant::now();
                }
                if let Poll::Ready(v) = fut.as_mut().poll(&mut Context::from_waker(&waker)) {
                    return v;
                }
                if IN_FLIGHT.load(Ordering::Relaxed) > self.spinners
                    || since.elapsed() >= self.window
                {
                    break;
                }
                // Back to the scheduler, which looks at the sockets without
                // sleeping (a yield parks with a zero timeout) and polls
                // this call again.
                tokio::task::yield_now().await;
            }
        }
        fut.await
    }
}

/// The waker a spinning call is polled with: notes that something woke it
/// (the window starts again) and wakes the runtime's task as well, so a
/// wake-up that comes after the spin ends is not lost.
struct Woke {
    flag: AtomicBool,
    inner: Waker,
}

impl Wake for Woke {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.flag.store(true, Ordering::Relaxed);
        self.inner.wake_by_ref();
    }
}

/// One blocking call in flight, for as long as it lives.
struct InFlight;

impl InFlight {
    fn enter() -> InFlight {
        IN_FLIGHT.fetch_add(1, Ordering::Relaxed);
        InFlight
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        IN_FLIGHT.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    /// A call whose answer another thread gives after `after`, on a
    /// current-thread runtime as the Python client's threads use; how many
    /// times it was polled.
    fn polls_of_a_call(spin: Spin, after: Duration) -> u64 {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let polls = Arc::new(AtomicU64::new(0));
        let (tx, mut rx) = tokio::sync::oneshot::channel::<u32>();
        let answer = std::thread::spawn(move || {
            std::thread::sleep(after);
            tx.send(7).unwrap();
        });
        let counted = polls.clone();
        let call = std::future::poll_fn(move |cx| {
            counted.fetch_add(1, Ordering::Relaxed);
            std::pin::Pin::new(&mut rx).poll(cx)
        });
        let got = rt.block_on(spin.run(call)).unwrap();
        answer.join().unwrap();
        assert_eq!(got, 7);
        polls.load(Ordering::Relaxed)
    }

    #[test]
    fn a_call_polls_without_sleeping_within_its_window_and_sleeps_after() {
        let many = 1000;
        let spinning = Spin {
            window: Duration::from_secs(5),
            spinners: many,
        };
        let polls = polls_of_a_call(spinning, Duration::from_millis(20));
        assert!(
            polls > 100,
            "a spinning call was polled only {polls} times in 20 ms"
        );
        // Past its window a call sleeps until its answer wakes it.
        let short = Spin {
            window: Duration::from_micros(100),
            spinners: many,
        };
        let t0 = Instant::now();
        let spun_then_slept = polls_of_a_call(short, Duration::from_millis(300));
        assert!(t0.elapsed() >= Duration::from_millis(300));
        let off = Spin {
            window: Duration::ZERO,
            spinners: many,
        };
        let polls = polls_of_a_call(off, Duration::from_millis(20));
        assert!(polls <= 3, "a call with no window was polled {polls} times");
        // 300 ms of spinning would be tens of thousands of polls.
        assert!(
            spun_then_slept < 5_000,
            "{spun_then_slept} polls: it never slept"
        );
    }

    #[test]
    fn each_wake_up_starts_the_window_again() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let msgs = 40usize;
        let gap = Duration::from_millis(2);
        // Polls between two messages, by the number received before.
        let run = |window: Duration| -> Vec<u64> {
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
            let sender = std::thread::spawn(move || {
                for _ in 0..msgs {
                    std::thread::sleep(gap);
                    tx.send(()).unwrap();
                }
            });
            let mut polls = vec![0u64; msgs + 1];
            let mut got = 0usize;
            let call = std::future::poll_fn(|cx| {
                polls[got] += 1;
                while let Poll::Ready(m) = rx.poll_recv(cx) {
                    if m.is_none() {
                        return Poll::Ready(());
                    }
                    got += 1;
                    polls[got] += 1;
                }
                Poll::Pending
            });
            let spin = Spin {
                window,
                spinners: 1000,
            };
            rt.block_on(spin.run(call));
            sender.join().unwrap();
            assert_eq!(got, msgs, "every message arrives");
            polls
        };
        // A window longer than a gap (so a busy machine's late wake-up
        // does not end it: 5 ms did once in a full CI run) but far shorter
        // than the call (40 gaps): only a window that each message starts
        // again spins through the second half.
        let late = |p: &[u64]| p[msgs / 2..msgs - 1].iter().copied().min().unwrap();
        let spun = run(Duration::from_millis(30));
        assert!(
            late(&spun) > 20,
            "polls between late messages: {:?}",
            &spun[msgs / 2..]
        );
        // With a window much shorter than a gap, each gap is slept through.
        let slept = run(Duration::from_micros(50));
        assert!(
            late(&slept) < 200,
            "polls between late messages: {:?}",
            &slept[msgs / 2..]
        );
    }

    #[test]
    fn a_call_does_not_spin_while_more_calls_than_spinners_are_in_flight() {
        let spin = Spin {
            window: Duration::from_secs(5),
            spinners: 2,
        };
        // Calls of other threads in flight; other tests count in the same
        // process, so the bound is crossed whatever they do.
        let others: Vec<InFlight> = (0..3).map(|_| InFlight::enter()).collect();
        let polls = polls_of_a_call(spin, Duration::from_millis(20));
        assert!(
            polls <= 3,
            "polled {polls} times with {} calls in flight",
            others.len() + 1
        );
        drop(others);
    }

    #[test]
    fn settings_come_from_the_variables_and_bad_values_are_ignored() {
        let d = Spin::parse(None, None, 2);
        assert_eq!(
            d,
            Spin {
                window: DEFAULT_WINDOW,
                spinners: 1
            }
        );
        assert_eq!(Spin::parse(None, None, 16).spinners, 4);
        let s = Spin::parse(Some(" 50 "), Some("3"), 2);
        assert_eq!(
            s,
            Spin {
                window: Duration::from_micros(50),
                spinners: 3
            }
        );
        assert!(Spin::parse(Some("0"), None, 2).window.is_zero());
        assert_eq!(
            Spin::parse(Some("1000000"), None, 2).window,
            Duration::from_millis(10)
        );
        let bad = Spin::parse(Some("fast"), Some("0"), 8);
        assert_eq!(
            bad,
            Spin {
                window: DEFAULT_WINDOW,
                spinners: 2
            }
        );
    }
}
