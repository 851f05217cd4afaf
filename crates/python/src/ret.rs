//! What operations return, turned into Python objects once the GIL is held
//! again (by a blocked caller or by an asyncio callback alike).

use crate::errors::to_py_value;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use strata_common::Error;

/// A result the Python side can receive.
pub trait Ret: Send + 'static {
    fn into_py(self, py: Python<'_>) -> PyResult<Py<PyAny>>;
}

impl Ret for () {
    fn into_py(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(py.None())
    }
}

macro_rules! plain {
    ($($t:ty),*) => {$(
        impl Ret for $t {
            fn into_py(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
                Ok(self.into_pyobject(py)?.to_owned().into_any().unbind())
            }
        }
    )*};
}
plain!(bool, u64, usize);

impl Ret for Vec<bool> {
    fn into_py(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(PyList::new(py, self)?.into_any().unbind())
    }
}

impl Ret for Vec<Option<u64>> {
    fn into_py(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(PyList::new(py, self)?.into_any().unbind())
    }
}

/// A new `bytes` object the client read into while the GIL was released.
/// Nobody else holds it until it is returned, so writing it is sound.
pub struct NewBytes {
    obj: Py<PyAny>,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the object is private to the operation until returned; its
// memory does not move.
unsafe impl Send for NewBytes {}

impl NewBytes {
    /// An uninitialised `bytes` of `len` bytes (filled before anyone sees
    /// it). Takes the GIL.
    pub fn alloc(len: usize) -> strata_common::Result<NewBytes> {
        let made = Python::try_attach(|py| {
            let n = isize::try_from(len)
                .map_err(|_| Error::invalid(format!("object of {len} bytes is too large")))?;
            // SAFETY: a NULL source asks CPython for uninitialised contents.
            let raw = unsafe { pyo3::ffi::PyBytes_FromStringAndSize(std::ptr::null(), n) };
            if raw.is_null() {
                let _ = PyErr::take(py);
                return Err(Error::new(
                    strata_common::Code::NoSpace,
                    format!("cannot allocate {len} bytes for the object in this process"),
                ));
            }
            // SAFETY: a new reference we own; a bytes object's buffer.
            let obj = unsafe { Bound::from_owned_ptr(py, raw) };
            let ptr = unsafe { pyo3::ffi::PyBytes_AsString(raw) } as *mut u8;
            Ok(NewBytes {
                obj: obj.unbind(),
                ptr,
                len,
            })
        });
        made.unwrap_or_else(|| {
            Err(Error::new(
                strata_common::Code::Cancelled,
                "the Python interpreter is shutting down",
            ))
        })
    }
}

impl AsMut<[u8]> for NewBytes {
    fn as_mut(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: see the type.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Ret for NewBytes {
    fn into_py(self, _py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(self.obj)
    }
}

impl Ret for Vec<Option<NewBytes>> {
    fn into_py(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let items: Vec<Py<PyAny>> = self
            .into_iter()
            .map(|b| b.map_or_else(|| py.None(), |b| b.obj))
            .collect();
        Ok(PyList::new(py, items)?.into_any().unbind())
    }
}

/// Per-item outcomes of a batch: each item's value, or the exception it
/// met (not raised, so the other items' results are kept).
pub struct Items<T>(pub Vec<strata_common::Result<T>>);

impl<T: Ret> Ret for Items<T> {
    fn into_py(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let items = self
            .0
            .into_iter()
            .map(|r| match r {
                Ok(v) => v.into_py(py),
                Err(e) => Ok(to_py_value(py, e)),
            })
            .collect::<PyResult<Vec<_>>>()?;
        Ok(PyList::new(py, items)?.into_any().unbind())
    }
}

/// A JSON-like value: `stat()` and `list()` answers.
pub struct Dicts(pub Vec<Vec<(&'static str, Value)>>);
pub struct Dict(pub Vec<(&'static str, Value)>);

pub enum Value {
    Str(String),
    Int(u64),
    List(Vec<Vec<(&'static str, Value)>>),
}

fn dict<'py>(py: Python<'py>, fields: Vec<(&'static str, Value)>) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (k, v) in fields {
        match v {
            Value::Str(s) => d.set_item(k, s)?,
            Value::Int(n) => d.set_item(k, n)?,
            Value::List(items) => {
                let l = items
                    .into_iter()
                    .map(|f| dict(py, f))
                    .collect::<PyResult<Vec<_>>>()?;
                d.set_item(k, PyList::new(py, l)?)?
            }
        }
    }
    Ok(d)
}

impl Ret for Dict {
    fn into_py(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(dict(py, self.0)?.into_any().unbind())
    }
}

impl Ret for Dicts {
    fn into_py(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let l = self
            .0
            .into_iter()
            .map(|f| dict(py, f))
            .collect::<PyResult<Vec<_>>>()?;
        Ok(PyList::new(py, l)?.into_any().unbind())
    }
}
