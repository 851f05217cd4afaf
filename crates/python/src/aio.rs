//! Operations as asyncio awaitables, driven by Strata's own runtime: the
//! operation runs on its I/O threads and completes an `asyncio.Future` of
//! the caller's loop through `call_soon_threadsafe`. No Python thread pool
//! and no GIL are involved while it runs. Cancelling the awaitable aborts
//! the operation (its buffers are released, a put cut short is revoked or
//! reclaimed).
//!
//! Completing a future needs the GIL. An I/O thread never waits for it: the
//! result goes to one completer thread per process, which takes the GIL
//! (while Python code holds it, only that thread waits; the I/O threads keep
//! serving every other operation).

use crate::errors::to_py;
use crate::ret::Ret;
use crate::runtime::runtime;
use pyo3::prelude::*;
use pyo3::types::PyCFunction;
use std::future::Future;
use std::sync::mpsc::{channel, Sender};
use std::sync::Mutex;

/// Work that needs the GIL, handed over by the I/O threads.
type Completion = Box<dyn FnOnce(Python<'_>) + Send>;

/// The completer thread's queue and the process it was started in (a child
/// of `os.fork()` has no such thread: it starts its own).
static COMPLETER: Mutex<Option<(u32, Sender<Completion>)>> = Mutex::new(None);

/// Hands `job` to the completer thread (started on first use).
fn complete(job: Completion) {
    let pid = std::process::id();
    let mut slot = COMPLETER.lock().unwrap_or_else(|p| p.into_inner());
    let tx = match &*slot {
        Some((p, tx)) if *p == pid => tx.clone(),
        _ => {
            let (tx, rx) = channel::<Completion>();
            let started = std::thread::Builder::new()
                .name("strata-complete".into())
                .spawn(move || {
                    for job in rx {
                        // One job's panic must not end the thread every
                        // later awaitable needs.
                        let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            Python::try_attach(job)
                        }));
                        // At interpreter shutdown nobody is left to tell.
                        if matches!(done, Ok(None)) {
                            return;
                        }
                    }
                });
            if started.is_err() {
                return; // no thread: the awaitable never completes, as at shutdown
            }
            // A fork child's inherited sender is leaked, not dropped:
            // dropping it touches the channel the parent's thread may have
            // held at the fork (as runtime.rs leaks the parent's runtime).
            if let Some(stale) = slot.replace((pid, tx.clone())) {
                std::mem::forget(stale);
            }
            tx
        }
    };
    drop(slot);
    let _ = tx.send(job);
}

/// Starts `fut` and returns an awaitable of its result on the running loop
/// (a `RuntimeError` when there is none).
pub fn spawn<T, F>(py: Python<'_>, fut: F) -> PyResult<Py<PyAny>>
where
    T: Ret,
    F: Future<Output = strata_common::Result<T>> + Send + 'static,
{
    let rt = runtime()?;
    let event_loop = py.import("asyncio")?.call_method0("get_running_loop")?;
    let future = event_loop.call_method0("create_future")?;
    let resolve = py.import("strata._aio")?.getattr("resolve")?.unbind();
    let (lp, fu) = (event_loop.unbind(), future.clone().unbind());
    let task = rt.spawn(async move {
        let r = fut.await;
        complete(Box::new(move |py| {
            let (ok, value) = match r {
                Ok(v) => match v.into_py(py) {
                    Ok(v) => (true, v),
                    Err(e) => (false, e.into_value(py).into_any()),
                },
                Err(e) => (false, to_py(py, e).into_value(py).into_any()),
            };
            // The loop may be closed by now; nobody is left to tell.
            let _ = lp
                .bind(py)
                .call_method1("call_soon_threadsafe", (resolve, fu, ok, value));
        }));
    });
    let abort = task.abort_handle();
    let on_done = PyCFunction::new_closure(py, None, None, move |args, _kwargs| {
        let cancelled = args
            .get_item(0)
            .and_then(|f| f.call_method0("cancelled"))
            .and_then(|c| c.extract::<bool>())
            .unwrap_or(false);
        if cancelled {
            abort.abort();
        }
    })?;
    future.call_method1("add_done_callback", (on_done,))?;
    Ok(future.unbind())
}
