//! Operations as asyncio awaitables, driven by Strata's own runtime: the
//! operation runs on its I/O threads and completes an `asyncio.Future` of
//! the caller's loop through `call_soon_threadsafe`. No Python thread pool
//! and no GIL are involved while it runs. Cancelling the awaitable aborts
//! the operation (its buffers are released, a put cut short is revoked or
//! reclaimed).

use crate::errors::to_py;
use crate::ret::Ret;
use crate::runtime::runtime;
use pyo3::prelude::*;
use pyo3::types::PyCFunction;
use std::future::Future;

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
        // At interpreter shutdown nobody is left to tell.
        let _ = Python::try_attach(|py| {
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
        });
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
