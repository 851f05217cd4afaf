//! Python memory the client reads from and writes into, without a copy:
//! anything with the buffer protocol (bytes, bytearray, memoryview, numpy
//! arrays), CPU torch tensors (by `data_ptr()`), and `(address, size)`
//! pairs of host memory the caller owns (what engines pass for their
//! registered KV pools).
//!
//! A `Pinned` holds the exporter's buffer view for as long as the client
//! uses the memory: the exporter cannot resize or free it meanwhile (a
//! bytearray refuses to resize while exported), so the GIL can be released.

use crate::errors::invalid;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use std::os::raw::{c_char, c_int, c_void};

/// `Py_buffer` as CPython has laid it out since 3.3. The extension is built
/// for the stable ABI of 3.9, where PyO3 offers no buffer API (the
/// functions joined the limited API in 3.11); the two functions below have
/// been exported by every CPython 3 all along.
#[repr(C)]
struct RawView {
    buf: *mut c_void,
    obj: *mut pyo3::ffi::PyObject,
    len: isize,
    itemsize: isize,
    readonly: c_int,
    ndim: c_int,
    format: *mut c_char,
    shape: *mut isize,
    strides: *mut isize,
    suboffsets: *mut isize,
    internal: *mut c_void,
}

extern "C" {
    fn PyObject_GetBuffer(obj: *mut pyo3::ffi::PyObject, view: *mut RawView, flags: c_int)
        -> c_int;
    fn PyBuffer_Release(view: *mut RawView);
}

/// `PyBUF_SIMPLE`: one contiguous run of bytes (exporters that cannot give
/// one refuse).
const PYBUF_SIMPLE: c_int = 0;
const PYBUF_WRITABLE: c_int = 0x0001;

/// Memory pinned for the client.
pub struct Pinned {
    ptr: *mut u8,
    len: usize,
    /// The buffer view to release, or the object (a tensor) kept alive.
    _hold: Hold,
}

/// Held for its Drop alone, never read.
#[allow(dead_code)]
enum Hold {
    View(View),
    Object(Py<PyAny>),
    Nothing,
}

/// A filled buffer view, released (with the GIL) when dropped: every view
/// taken, kept or only probed, is given back to its exporter.
struct View(Box<RawView>);

impl Drop for View {
    fn drop(&mut self) {
        // At interpreter shutdown there is nothing left to give back to.
        let _ = Python::try_attach(|_| {
            // SAFETY: filled by a successful PyObject_GetBuffer, released
            // once.
            unsafe { PyBuffer_Release(&mut *self.0) }
        });
    }
}

// SAFETY: the memory stays valid and in place while the view (or the
// object owning it) is held, whichever thread holds it; the view is
// released with the GIL (View's Drop).
unsafe impl Send for Pinned {}
unsafe impl Sync for Pinned {}

impl Pinned {
    /// The pinned bytes.
    pub fn as_slice(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: pinned (see the type), `len` bytes from `ptr`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The pinned bytes, to write into (only made from writable memory).
    /// Several `Pinned` may name the same memory (the caller's business, as
    /// with `socket.recv_into`); the client writes each exactly once.
    #[allow(clippy::mut_from_ref)]
    pub fn as_mut_slice(&self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: pinned and writable (checked when pinned).
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

/// Refuses writable memory given twice in one call (two keys, or two
/// parts, over the same bytes): the client would write both at once.
pub fn no_overlaps(py: Python<'_>, pins: &[&Pinned]) -> PyResult<()> {
    let mut ranges: Vec<(usize, usize)> = pins
        .iter()
        .filter(|p| p.len > 0)
        .map(|p| (p.ptr as usize, p.ptr as usize + p.len))
        .collect();
    ranges.sort_unstable();
    if ranges.windows(2).any(|w| w[1].0 < w[0].1) {
        return Err(invalid(
            py,
            "two buffers of this call overlap; give each key (and each part) memory of its own",
        ));
    }
    Ok(())
}

/// Pins `obj` for reading (`writable = false`) or for the client to write
/// into.
pub fn pin(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<Pinned> {
    let py = obj.py();
    if let Ok(t) = obj.cast::<PyTuple>() {
        return pin_address(t);
    }
    let flags = if writable {
        PYBUF_SIMPLE | PYBUF_WRITABLE
    } else {
        PYBUF_SIMPLE
    };
    match view(obj, flags) {
        Ok(v) => {
            let (ptr, len) = (v.0.buf as *mut u8, v.0.len.max(0) as usize);
            return Ok(Pinned {
                ptr,
                len,
                _hold: Hold::View(v),
            });
        }
        Err(e) => {
            if writable && view(obj, PYBUF_SIMPLE).is_ok() {
                return Err(invalid(
                    py,
                    format!(
                        "a {} is read-only; pass writable memory (a bytearray, a numpy array, \
                         a memoryview of one, or an (address, size) pair)",
                        type_name(obj)
                    ),
                ));
            }
            if obj.hasattr("data_ptr")? {
                return pin_tensor(obj);
            }
            if obj.hasattr("__buffer__")? || is_buffer_error(py, &e) {
                // It has a buffer, just not one contiguous run of bytes.
                return Err(invalid(
                    py,
                    format!(
                        "the {} is not one contiguous block of memory ({e}); pass a contiguous \
                         array or copy it first",
                        type_name(obj)
                    ),
                ));
            }
        }
    }
    Err(pyo3::exceptions::PyTypeError::new_err(format!(
        "expected a buffer (bytes, bytearray, memoryview, numpy array), a CPU torch tensor or \
         an (address, size) pair, got {}",
        type_name(obj)
    )))
}

fn is_buffer_error(py: Python<'_>, e: &PyErr) -> bool {
    e.is_instance_of::<pyo3::exceptions::PyBufferError>(py)
        || e.is_instance_of::<pyo3::exceptions::PyValueError>(py)
}

fn view(obj: &Bound<'_, PyAny>, flags: c_int) -> PyResult<View> {
    let mut v = Box::new(RawView {
        buf: std::ptr::null_mut(),
        obj: std::ptr::null_mut(),
        len: 0,
        itemsize: 0,
        readonly: 0,
        ndim: 0,
        format: std::ptr::null_mut(),
        shape: std::ptr::null_mut(),
        strides: std::ptr::null_mut(),
        suboffsets: std::ptr::null_mut(),
        internal: std::ptr::null_mut(),
    });
    // SAFETY: a live object and a view to fill; on failure nothing is held.
    let rc = unsafe { PyObject_GetBuffer(obj.as_ptr(), &mut *v, flags) };
    if rc != 0 {
        return Err(PyErr::fetch(obj.py()));
    }
    Ok(View(v))
}

/// `(address, size)`: host memory the caller owns and keeps alive for the
/// call. Only its shape can be checked.
fn pin_address(t: &Bound<'_, PyTuple>) -> PyResult<Pinned> {
    let py = t.py();
    let pair: PyResult<(usize, i64)> = t.extract();
    let Ok((addr, size)) = pair else {
        return Err(invalid(
            py,
            "a memory range is an (address: int, size: int) pair",
        ));
    };
    if size < 0 || size as u64 > isize::MAX as u64 {
        return Err(invalid(py, format!("size {size} is out of range")));
    }
    if addr == 0 && size > 0 {
        return Err(invalid(
            py,
            "address 0 (a null pointer) with a non-zero size",
        ));
    }
    if addr.checked_add(size as usize).is_none() {
        return Err(invalid(
            py,
            format!("address {addr:#x} + size {size} wraps around"),
        ));
    }
    Ok(Pinned {
        ptr: addr as *mut u8,
        len: size as usize,
        _hold: Hold::Nothing,
    })
}

/// A torch tensor: contiguous, on the CPU; its storage stays alive while
/// the tensor is held.
fn pin_tensor(obj: &Bound<'_, PyAny>) -> PyResult<Pinned> {
    let py = obj.py();
    let device = obj
        .getattr("device")?
        .getattr("type")?
        .extract::<String>()?;
    if device != "cpu" {
        return Err(invalid(
            py,
            format!("a tensor on {device:?}; Strata's Python client moves host (cpu) memory"),
        ));
    }
    if !obj.call_method0("is_contiguous")?.extract::<bool>()? {
        return Err(invalid(
            py,
            "the tensor is not contiguous; call .contiguous() first",
        ));
    }
    let ptr: usize = obj.call_method0("data_ptr")?.extract()?;
    let len: usize = obj.getattr("nbytes")?.extract()?;
    if ptr == 0 && len > 0 {
        return Err(invalid(py, "the tensor has no storage"));
    }
    Ok(Pinned {
        ptr: ptr as *mut u8,
        len,
        _hold: Hold::Object(obj.clone().unbind()),
    })
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "object".into())
}
