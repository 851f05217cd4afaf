//! One Tokio runtime per process, shared by every `Store` and `AsyncStore`,
//! and the one way Python threads wait on it: with the GIL released.

use pyo3::prelude::*;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;
use strata_common::spin::Spin;
use tokio::runtime::Runtime;

/// The runtime and the process it was made in. A child of `os.fork()`
/// inherits the parent's runtime without its worker threads, so it gets a
/// runtime of its own (the parent's is leaked there: dropping it would wait
/// for threads that do not exist in the child).
static RUNTIME: Mutex<Option<(u32, &'static Runtime)>> = Mutex::new(None);

/// How often a blocked call looks for a pending signal (Ctrl-C).
const SIGNAL_POLL: Duration = Duration::from_millis(100);

/// This process's runtime, made on first use: `STRATA_IO_THREADS` workers
/// (default: the CPUs available, at most 4; network I/O needs few).
pub fn runtime() -> PyResult<&'static Runtime> {
    let pid = std::process::id();
    let mut slot = RUNTIME.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((p, rt)) = *slot {
        if p == pid {
            return Ok(rt);
        }
    }
    let threads = std::env::var("STRATA_IO_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map_or(2, |n| n.get())
                .min(4)
        });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name("strata-io")
        .enable_all()
        .build()
        .map_err(|e| {
            pyo3::exceptions::PyRuntimeError::new_err(format!(
                "cannot start Strata's I/O threads: {e}"
            ))
        })?;
    let rt: &'static Runtime = Box::leak(Box::new(rt));
    *slot = Some((pid, rt));
    Ok(rt)
}

/// Runs the future `make` returns to completion on this thread with the
/// GIL released, so other Python threads run meanwhile. The future is made
/// there, so it need not be `Send` (starting an embedded UCX segment is
/// not). A signal handler that raises (Ctrl-C's KeyboardInterrupt) ends the
/// wait: the future is dropped, which every client operation allows (a put
/// cut short is revoked or reclaimed by the master).
pub fn wait<T, M, F>(py: Python<'_>, make: M) -> PyResult<T>
where
    M: FnOnce() -> F + Send,
    F: Future<Output = T>,
    T: Send,
{
    wait_on(py, runtime()?, make)
}

/// [`wait`] on a given runtime: the shared one, or the calling thread's own
/// (`crate::thread_io`), which this thread then drives while it waits.
pub fn wait_on<T, M, F>(py: Python<'_>, rt: &Runtime, make: M) -> PyResult<T>
where
    M: FnOnce() -> F + Send,
    F: Future<Output = T>,
    T: Send,
{
    // Only the main thread runs signal handlers; others wait in one go.
    if !is_main_thread(py) {
        return Ok(py.detach(|| rt.block_on(async { Spin::from_env().run(make()).await })));
    }
    // The main thread waits in slices and runs pending signal handlers
    // between them, with the GIL held and outside the runtime (a handler may
    // itself call the store: a nested block_on would panic).
    let mut fut = Box::pin(Spin::from_env().run(make()));
    loop {
        let slot = SameThread(&mut fut);
        let r = py.detach(move || {
            let slot = slot;
            // No wake-up is lost when a slice runs out (see the helper).
            strata_common::slices::block_on_slice(rt, slot.0.as_mut(), SIGNAL_POLL)
        });
        match r {
            Some(v) => return Ok(v),
            None => py.check_signals()?,
        }
    }
}

/// A borrow handed to `detach`, whose closure runs on this very thread:
/// what it holds never moves to another one.
struct SameThread<T>(T);
// SAFETY: `Python::detach` runs its closure on the calling thread.
unsafe impl<T> Send for SameThread<T> {}

/// Whether this is Python's main thread (asked once per thread).
fn is_main_thread(py: Python<'_>) -> bool {
    thread_local! {
        static MAIN: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
    }
    MAIN.with(|m| {
        if let Some(main) = m.get() {
            return main;
        }
        let check = || -> PyResult<bool> {
            let threading = py.import("threading")?;
            let current = threading.call_method0("current_thread")?;
            let main = threading.call_method0("main_thread")?;
            Ok(current.is(&main))
        };
        let main = check().unwrap_or(false);
        m.set(Some(main));
        main
    })
}
