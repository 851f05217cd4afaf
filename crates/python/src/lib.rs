//! `strata._native`, the extension behind the `strata` Python package
//! (python/strata): the Rust client library and, for embedded segments, a
//! store node, behind one shared runtime. Python classes, docstrings and
//! type stubs live in python/strata; this is what they call.

mod aio;
mod buffers;
mod connection;
mod errors;
mod ret;
mod runtime;
mod store;
mod thread_io;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<store::Connection>()?;
    m.add_class::<store::Store>()?;
    m.add_function(wrap_pyfunction!(store::connect, m)?)?;
    m.add_function(wrap_pyfunction!(store::connect_async, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
