//! `strata._native.Store`: every operation, once. The Python classes
//! `strata.Store` and `strata.AsyncStore` are this type in its two modes:
//! a blocking call (the GIL released while it waits) or an asyncio
//! awaitable.

use crate::buffers::{no_overlaps, pin, Pinned};
use crate::connection::{connect_blocking, Settings, Shared};
use crate::errors::{invalid, IntoPy};
use crate::ret::{Dict, Dicts, Items, NewBytes, Ret, Value};
use crate::thread_io::Local;
use pyo3::prelude::*;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use strata_client::{Client, PutOptions};
use strata_common::{Code, Result};

/// An open connection to a Strata cluster (made by `connect` or
/// `connect_async`), shared by the stores made from it.
#[pyclass(frozen, module = "strata._native")]
pub struct Connection {
    pub(crate) shared: Arc<Shared>,
}

#[pyclass(frozen, subclass, module = "strata._native")]
pub struct Store {
    shared: Arc<Shared>,
    asynchronous: bool,
}

/// The keyword arguments every put takes, checked.
fn put_options(
    py: Python<'_>,
    replicas: u32,
    soft_pin: bool,
    hard_pin: bool,
    preferred: Option<String>,
    overwrite: bool,
) -> PyResult<PutOptions> {
    if replicas == 0 || replicas > 8 {
        return Err(invalid(
            py,
            format!("replicas must be 1 to 8, got {replicas}"),
        ));
    }
    Ok(PutOptions {
        replicas,
        soft_pin,
        hard_pin,
        preferred_node: preferred,
        overwrite,
        ..Default::default()
    })
}

fn same_len(py: Python<'_>, what: &str, a: usize, b: usize) -> PyResult<()> {
    if a != b {
        return Err(invalid(
            py,
            format!("{a} keys but {b} {what}: give one per key"),
        ));
    }
    Ok(())
}

fn pin_all(items: &[Bound<'_, PyAny>], writable: bool) -> PyResult<Vec<Pinned>> {
    items.iter().map(|b| pin(b, writable)).collect()
}

fn pin_parts(parts: &[Vec<Bound<'_, PyAny>>], writable: bool) -> PyResult<Vec<Vec<Pinned>>> {
    parts.iter().map(|p| pin_all(p, writable)).collect()
}

/// Where a blocking operation runs: this thread's runtime, or (`None`) the
/// shared one.
struct On(Option<Arc<Local>>);

impl Store {
    /// The client an operation uses and where it runs: an async store's
    /// on the shared runtime; a blocking one's on this thread's own runtime
    /// where that is on (`crate::thread_io`).
    fn client(&self, py: Python<'_>) -> PyResult<(Client, On)> {
        if self.asynchronous {
            return Ok((self.shared.client().py(py)?, On(None)));
        }
        let (c, local) = self.shared.blocking_client(py).py(py)?;
        Ok((c, On(local)))
    }

    /// Runs an operation: blocking (GIL released) or as an awaitable.
    fn run<T, F>(&self, py: Python<'_>, on: On, fut: F) -> PyResult<Py<PyAny>>
    where
        T: Ret,
        F: Future<Output = Result<T>> + Send + 'static,
    {
        if self.asynchronous {
            return crate::aio::spawn(py, fut);
        }
        let r = match &on.0 {
            Some(local) => crate::runtime::wait_on(py, &local.rt, move || fut),
            None => crate::runtime::wait(py, move || fut),
        };
        // The thread's runtime is released here, after its future is done
        // and outside any async context; if close() ran meanwhile this is
        // its last holder, and shutting it down may wait: not with the GIL.
        if let Some(local) = on.0 {
            if Arc::strong_count(&local) == 1 {
                py.detach(move || drop(local));
            }
        }
        r?.py(py)?.into_py(py)
    }
}

/// The settings of `connect` from its Python arguments.
#[allow(clippy::too_many_arguments)]
fn settings(
    master: Option<String>,
    token_file: Option<PathBuf>,
    transport: String,
    segment_bytes: u64,
    timeout: f64,
    node_id: Option<String>,
    segment_token_file: Option<PathBuf>,
    segment_listen: Option<String>,
    end_leases: bool,
) -> Settings {
    Settings {
        master,
        token_file,
        transport,
        segment_bytes,
        timeout,
        node_id,
        segment_token_file,
        segment_listen,
        end_leases,
    }
}

/// Connects to a cluster (blocking, the GIL released).
#[pyfunction]
#[pyo3(signature = (master=None, *, token_file=None, transport="tcp".to_string(), segment_bytes=0, timeout=20.0, node_id=None, segment_token_file=None, segment_listen=None, end_leases=true))]
#[allow(clippy::too_many_arguments)]
pub fn connect(
    py: Python<'_>,
    master: Option<String>,
    token_file: Option<PathBuf>,
    transport: String,
    segment_bytes: u64,
    timeout: f64,
    node_id: Option<String>,
    segment_token_file: Option<PathBuf>,
    segment_listen: Option<String>,
    end_leases: bool,
) -> PyResult<Connection> {
    let s = settings(
        master,
        token_file,
        transport,
        segment_bytes,
        timeout,
        node_id,
        segment_token_file,
        segment_listen,
        end_leases,
    );
    Ok(Connection {
        shared: Arc::new(connect_blocking(py, s)?),
    })
}

struct Connected(Shared);

impl Ret for Connected {
    fn into_py(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(Py::new(
            py,
            Connection {
                shared: Arc::new(self.0),
            },
        )?
        .into_any())
    }
}

/// Connects to a cluster; an awaitable of the `Connection`.
#[pyfunction]
#[pyo3(signature = (master=None, *, token_file=None, transport="tcp".to_string(), segment_bytes=0, timeout=20.0, node_id=None, segment_token_file=None, segment_listen=None, end_leases=true))]
#[allow(clippy::too_many_arguments)]
pub fn connect_async(
    py: Python<'_>,
    master: Option<String>,
    token_file: Option<PathBuf>,
    transport: String,
    segment_bytes: u64,
    timeout: f64,
    node_id: Option<String>,
    segment_token_file: Option<PathBuf>,
    segment_listen: Option<String>,
    end_leases: bool,
) -> PyResult<Py<PyAny>> {
    let s = settings(
        master,
        token_file,
        transport,
        segment_bytes,
        timeout,
        node_id,
        segment_token_file,
        segment_listen,
        end_leases,
    );
    // On a blocking thread of the runtime: starting an embedded segment
    // (UCX builds) is not a future that may move between threads.
    crate::aio::spawn(py, async move {
        let connected = tokio::task::spawn_blocking(move || {
            tokio::runtime::Handle::current().block_on(crate::connection::connect(s))
        })
        .await
        .map_err(|e| strata_common::Error::internal(format!("connect failed: {e}")))?;
        connected.map(Connected)
    })
}

#[pymethods]
impl Store {
    #[new]
    #[pyo3(signature = (connection, asynchronous=false))]
    fn new(connection: &Bound<'_, Connection>, asynchronous: bool) -> Self {
        Store {
            shared: connection.get().shared.clone(),
            asynchronous,
        }
    }

    /// The master address this store talks to.
    #[getter]
    fn master(&self) -> String {
        self.shared.master.clone()
    }

    /// The embedded segment's node id (`None` without one): what `preferred=`
    /// names to place objects on this process's memory.
    #[getter]
    fn node_id(&self) -> Option<String> {
        self.shared.node_id()
    }

    #[getter]
    fn closed(&self) -> bool {
        self.shared.is_closed()
    }

    /// Stores `data` under `key`; `AlreadyExists` if the key is present,
    /// unless `overwrite` (then it replaces it atomically: readers get the
    /// old bytes or the new, never a mix).
    #[pyo3(signature = (key, data, *, replicas=1, soft_pin=false, hard_pin=false, preferred=None, overwrite=false))]
    #[allow(clippy::too_many_arguments)]
    fn put(
        &self,
        py: Python<'_>,
        key: String,
        data: &Bound<'_, PyAny>,
        replicas: u32,
        soft_pin: bool,
        hard_pin: bool,
        preferred: Option<String>,
        overwrite: bool,
    ) -> PyResult<Py<PyAny>> {
        let opts = put_options(py, replicas, soft_pin, hard_pin, preferred, overwrite)?;
        let (c, on) = self.client(py)?;
        let buf = pin(data, false)?;
        self.run(
            py,
            on,
            async move { c.put(&key, buf.as_slice(), &opts).await },
        )
    }

    /// `put` (every put reads the caller's memory in place; the name is
    /// the seed system's).
    #[pyo3(signature = (key, buffer, *, replicas=1, soft_pin=false, hard_pin=false, preferred=None, overwrite=false))]
    #[allow(clippy::too_many_arguments)]
    fn put_from(
        &self,
        py: Python<'_>,
        key: String,
        buffer: &Bound<'_, PyAny>,
        replicas: u32,
        soft_pin: bool,
        hard_pin: bool,
        preferred: Option<String>,
        overwrite: bool,
    ) -> PyResult<Py<PyAny>> {
        self.put(
            py, key, buffer, replicas, soft_pin, hard_pin, preferred, overwrite,
        )
    }

    /// Stores the concatenation of `parts` under `key`.
    #[pyo3(signature = (key, parts, *, replicas=1, soft_pin=false, hard_pin=false, preferred=None, overwrite=false))]
    #[allow(clippy::too_many_arguments)]
    fn put_parts(
        &self,
        py: Python<'_>,
        key: String,
        parts: Vec<Bound<'_, PyAny>>,
        replicas: u32,
        soft_pin: bool,
        hard_pin: bool,
        preferred: Option<String>,
        overwrite: bool,
    ) -> PyResult<Py<PyAny>> {
        let opts = put_options(py, replicas, soft_pin, hard_pin, preferred, overwrite)?;
        let (c, on) = self.client(py)?;
        let bufs = pin_all(&parts, false)?;
        self.run(py, on, async move {
            let slices: Vec<&[u8]> = bufs.iter().map(Pinned::as_slice).collect();
            c.put_parts(&key, &slices, &opts).await
        })
    }

    /// Puts many objects; one result per key: `None`, or the exception that
    /// key met.
    #[pyo3(signature = (keys, buffers, *, replicas=1, soft_pin=false, hard_pin=false, preferred=None, overwrite=false))]
    #[allow(clippy::too_many_arguments)]
    fn batch_put(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        buffers: Vec<Bound<'_, PyAny>>,
        replicas: u32,
        soft_pin: bool,
        hard_pin: bool,
        preferred: Option<String>,
        overwrite: bool,
    ) -> PyResult<Py<PyAny>> {
        let opts = put_options(py, replicas, soft_pin, hard_pin, preferred, overwrite)?;
        same_len(py, "buffers", keys.len(), buffers.len())?;
        let (c, on) = self.client(py)?;
        let bufs = pin_all(&buffers, false)?;
        self.run(py, on, async move {
            let items: Vec<(&str, &[u8])> = keys
                .iter()
                .zip(&bufs)
                .map(|(k, b)| (k.as_str(), b.as_slice()))
                .collect();
            c.batch_put(&items, &opts).await.map(Items)
        })
    }

    /// Puts many objects, each the concatenation of its parts.
    #[pyo3(signature = (keys, parts, *, replicas=1, soft_pin=false, hard_pin=false, preferred=None, overwrite=false))]
    #[allow(clippy::too_many_arguments)]
    fn batch_put_from_parts(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        parts: Vec<Vec<Bound<'_, PyAny>>>,
        replicas: u32,
        soft_pin: bool,
        hard_pin: bool,
        preferred: Option<String>,
        overwrite: bool,
    ) -> PyResult<Py<PyAny>> {
        let opts = put_options(py, replicas, soft_pin, hard_pin, preferred, overwrite)?;
        same_len(py, "lists of parts", keys.len(), parts.len())?;
        let (c, on) = self.client(py)?;
        let bufs = pin_parts(&parts, false)?;
        self.run(py, on, async move {
            let slices: Vec<Vec<&[u8]>> = bufs
                .iter()
                .map(|p| p.iter().map(Pinned::as_slice).collect())
                .collect();
            let items: Vec<(&str, &[&[u8]])> = keys
                .iter()
                .zip(&slices)
                .map(|(k, p)| (k.as_str(), p.as_slice()))
                .collect();
            c.batch_put_parts(&items, &opts).await.map(Items)
        })
    }

    /// The object under `key` as a new `bytes` (`NotFound` if absent).
    fn get(&self, py: Python<'_>, key: String) -> PyResult<Py<PyAny>> {
        let (c, on) = self.client(py)?;
        self.run(
            py,
            on,
            async move { c.get_with(&key, NewBytes::alloc).await },
        )
    }

    /// Reads `key` into `buffer` (at least the object's size; writable) and
    /// returns the object's size.
    fn get_into(
        &self,
        py: Python<'_>,
        key: String,
        buffer: &Bound<'_, PyAny>,
    ) -> PyResult<Py<PyAny>> {
        let (c, on) = self.client(py)?;
        let buf = pin(buffer, true)?;
        self.run(
            py,
            on,
            async move { c.get_into(&key, buf.as_mut_slice()).await },
        )
    }

    /// Reads `key` scattered over `parts` (their sizes must add up to the
    /// object's); returns the object's size.
    fn get_into_parts(
        &self,
        py: Python<'_>,
        key: String,
        parts: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let (c, on) = self.client(py)?;
        let bufs = pin_all(&parts, true)?;
        no_overlaps(py, &bufs.iter().collect::<Vec<_>>())?;
        self.run(py, on, async move {
            let mut slices: Vec<&mut [u8]> = bufs.iter().map(Pinned::as_mut_slice).collect();
            c.get_into_parts(&key, &mut slices).await
        })
    }

    /// Many objects as `bytes`; `None` for keys not found. Other failures
    /// raise.
    fn batch_get(&self, py: Python<'_>, keys: Vec<String>) -> PyResult<Py<PyAny>> {
        let (c, on) = self.client(py)?;
        self.run(py, on, async move {
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            // Each object read straight into its new bytes.
            let got = c.batch_get_with(&refs, NewBytes::alloc).await?;
            let mut out = Vec::with_capacity(got.len());
            for r in got {
                match r {
                    Ok(b) => out.push(Some(b)),
                    Err(e) if e.code == Code::NotFound => out.push(None),
                    Err(e) => return Err(e),
                }
            }
            Ok(out)
        })
    }

    /// Reads many objects into `buffers` (one per key); one result per key:
    /// the object's size, or the exception that key met.
    fn batch_get_into(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        buffers: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        same_len(py, "buffers", keys.len(), buffers.len())?;
        let (c, on) = self.client(py)?;
        let bufs = pin_all(&buffers, true)?;
        no_overlaps(py, &bufs.iter().collect::<Vec<_>>())?;
        self.run(py, on, async move {
            let mut items: Vec<(&str, &mut [u8])> = keys
                .iter()
                .zip(&bufs)
                .map(|(k, b)| (k.as_str(), b.as_mut_slice()))
                .collect();
            c.batch_get_into(&mut items).await.map(Items)
        })
    }

    /// Reads many objects, each scattered over its parts.
    fn batch_get_into_parts(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        parts: Vec<Vec<Bound<'_, PyAny>>>,
    ) -> PyResult<Py<PyAny>> {
        same_len(py, "lists of parts", keys.len(), parts.len())?;
        let (c, on) = self.client(py)?;
        let bufs = pin_parts(&parts, true)?;
        no_overlaps(py, &bufs.iter().flatten().collect::<Vec<_>>())?;
        self.run(py, on, async move {
            let mut slices: Vec<Vec<&mut [u8]>> = bufs
                .iter()
                .map(|p| p.iter().map(Pinned::as_mut_slice).collect())
                .collect();
            let mut items: Vec<(&str, &mut [&mut [u8]])> = keys
                .iter()
                .zip(slices.iter_mut())
                .map(|(k, p)| (k.as_str(), p.as_mut_slice()))
                .collect();
            c.batch_get_into_parts(&mut items).await.map(Items)
        })
    }

    /// Whether `key` is stored (committed).
    fn exists(&self, py: Python<'_>, key: String) -> PyResult<Py<PyAny>> {
        let (c, on) = self.client(py)?;
        self.run(py, on, async move { c.exists(&key).await })
    }

    /// Whether each key is stored, in one request.
    fn batch_exists(&self, py: Python<'_>, keys: Vec<String>) -> PyResult<Py<PyAny>> {
        let (c, on) = self.client(py)?;
        self.run(py, on, async move {
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            c.batch_sizes(&refs)
                .await?
                .into_iter()
                .map(|r| r.map(|s| s.is_some()))
                .collect::<Result<Vec<bool>>>()
        })
    }

    /// Each key's size (`None` when absent), in one request.
    fn batch_size(&self, py: Python<'_>, keys: Vec<String>) -> PyResult<Py<PyAny>> {
        let (c, on) = self.client(py)?;
        self.run(py, on, async move {
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            c.batch_sizes(&refs)
                .await?
                .into_iter()
                .collect::<Result<Vec<Option<u64>>>>()
        })
    }

    /// The stored object's size, without reading it (`NotFound` if absent).
    fn size(&self, py: Python<'_>, key: String) -> PyResult<Py<PyAny>> {
        let (c, on) = self.client(py)?;
        self.run(py, on, async move { c.size(&key).await })
    }

    /// Removes `key`; refused (`Leased`) while a reader holds it, unless
    /// `force` (admin token).
    #[pyo3(signature = (key, force=false))]
    fn remove(&self, py: Python<'_>, key: String, force: bool) -> PyResult<Py<PyAny>> {
        let (c, on) = self.client(py)?;
        self.run(py, on, async move { c.remove(&key, force).await })
    }

    /// Removes many keys; one result per key: `None` or its exception.
    #[pyo3(signature = (keys, force=false))]
    fn batch_remove(&self, py: Python<'_>, keys: Vec<String>, force: bool) -> PyResult<Py<PyAny>> {
        let (c, on) = self.client(py)?;
        self.run(py, on, async move {
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            Ok(Items(c.batch_remove(&refs, force).await))
        })
    }

    /// Removes every key starting with `prefix`; returns how many.
    #[pyo3(signature = (prefix, force=false))]
    fn remove_prefix(&self, py: Python<'_>, prefix: String, force: bool) -> PyResult<Py<PyAny>> {
        if prefix.is_empty() {
            return Err(invalid(
                py,
                "an empty prefix would remove every key; call remove_all() for that",
            ));
        }
        let (c, on) = self.client(py)?;
        self.run(py, on, async move { c.remove_prefix(&prefix, force).await })
    }

    /// Removes every object (admin token; leased ones only with `force`).
    /// Returns how many were removed.
    #[pyo3(signature = (force=false))]
    fn remove_all(&self, py: Python<'_>, force: bool) -> PyResult<Py<PyAny>> {
        let (c, on) = self.client(py)?;
        self.run(
            py,
            on,
            async move { c.remove_all(force).await.map(|(n, _)| n) },
        )
    }

    /// Keys starting with `prefix`, in key order, at most `limit`: dicts of
    /// `key`, `size` and `replicas`.
    #[pyo3(signature = (prefix="".to_string(), limit=1000))]
    fn list(&self, py: Python<'_>, prefix: String, limit: usize) -> PyResult<Py<PyAny>> {
        let (c, on) = self.client(py)?;
        self.run(py, on, async move {
            let objs = c.list(&prefix, limit).await?;
            Ok(Dicts(
                objs.into_iter()
                    .filter(|o| o.complete)
                    .map(|o| {
                        vec![
                            ("key", Value::Str(o.key)),
                            ("size", Value::Int(o.size)),
                            ("replicas", Value::Int(o.replicas as u64)),
                        ]
                    })
                    .collect(),
            ))
        })
    }

    /// The cluster's summary: keys, capacity, allocation, nodes, segments.
    fn stat(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let (c, on) = self.client(py)?;
        self.run(py, on, async move {
            let s = c.stat().await?;
            Ok(Dict(vec![
                ("keys", Value::Int(s.keys)),
                ("capacity_bytes", Value::Int(s.capacity_bytes)),
                ("allocated_bytes", Value::Int(s.allocated_bytes)),
                ("nodes", Value::Int(s.nodes as u64)),
                ("segments", Value::Int(s.segments as u64)),
                ("evictions", Value::Int(s.evictions)),
                (
                    "segment_info",
                    Value::List(
                        s.segment_info
                            .into_iter()
                            .map(|g| {
                                vec![
                                    ("segment_id", Value::Int(g.segment_id)),
                                    ("node_id", Value::Str(g.node_id)),
                                    ("capacity_bytes", Value::Int(g.capacity_bytes)),
                                    ("allocated_bytes", Value::Int(g.allocated_bytes)),
                                ]
                            })
                            .collect(),
                    ),
                ),
            ]))
        })
    }

    /// How many threads drive their own I/O for this connection (each
    /// thread's first blocking call makes its own; it ends with the thread).
    fn _io_threads(&self) -> usize {
        self.shared.io_threads()
    }

    /// Closes the connection and stops the embedded segment, if any.
    /// Idempotent; later calls raise `Cancelled`.
    fn close(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let shared = self.shared.clone();
        self.run(py, On(None), async move { shared.close().await })
    }
}
