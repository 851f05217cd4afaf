//! Strata's errors as Python exceptions: the class for each code comes from
//! `Code::python` (the one mapping), the classes from `strata.errors`.

use pyo3::prelude::*;
use pyo3::types::PyType;
use strata_common::{Code, Error};

/// The `strata.errors` exception for `e`, with its `.code` and `.retryable`.
pub fn to_py(py: Python<'_>, e: Error) -> PyErr {
    let retryable = e.retryable();
    let class = py
        .import("strata.errors")
        .and_then(|m| m.getattr(e.code.python()))
        .and_then(|c| c.cast_into::<PyType>().map_err(PyErr::from));
    match class {
        Ok(class) => PyErr::from_type(class, (e.message, e.code.as_str(), retryable)),
        // The package is broken (strata.errors missing): still say what failed.
        Err(_) => pyo3::exceptions::PyRuntimeError::new_err(format!("{}: {}", e.code, e.message)),
    }
}

/// The exception object itself, for batch results that report per item.
pub fn to_py_value(py: Python<'_>, e: Error) -> Py<PyAny> {
    to_py(py, e).into_value(py).into_any()
}

/// An `InvalidArgument` for bad input found on the Python side.
pub fn invalid(py: Python<'_>, message: impl Into<String>) -> PyErr {
    to_py(py, Error::new(Code::InvalidArgument, message.into()))
}

/// Converts a Strata result, raising its exception.
pub trait IntoPy<T> {
    fn py(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> IntoPy<T> for Result<T, Error> {
    fn py(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| to_py(py, e))
    }
}
