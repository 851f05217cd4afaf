//! A small safe layer over UCP: contexts, workers, endpoints, registered
//! memory, remote keys and one-sided put/get.
//!
//! Threading: a worker is created in single-thread mode, so a worker and
//! everything made from it (endpoints, remote keys, requests) must stay on
//! one thread; the raw pointers inside keep these types `!Send`. The data
//! plane runs each worker on a progress thread of its own.
//!
//! Lifetimes: each object holds a reference to what it was made from, so a
//! worker outlives its endpoints and a context its workers and regions.

use std::cell::Cell;
use std::ffi::{c_void, CStr, CString};
use std::ptr::{null, null_mut};
use std::rc::Rc;
use std::time::{Duration, Instant};
use strata_common::{Code, Error, Result};
use strata_ucx_sys as sys;

/// The message of a UCX status.
fn status_string(st: sys::ucs_status_t) -> String {
    // SAFETY: ucs_status_string returns a static, NUL-terminated string for
    // any value.
    unsafe { CStr::from_ptr(sys::ucs_status_string(st)) }
        .to_string_lossy()
        .into_owned()
}

/// Maps a UCX failure to Strata's codes: a peer that went away or a
/// transport that gave up is retryable (`Unavailable`, `Timeout`); a bad
/// parameter is the caller's bug; anything else is internal.
pub fn ucx_error(st: sys::ucs_status_t, what: &str) -> Error {
    let code = match st {
        sys::UCS_ERR_TIMED_OUT | sys::UCS_ERR_ENDPOINT_TIMEOUT => Code::Timeout,
        sys::UCS_ERR_UNREACHABLE
        | sys::UCS_ERR_CONNECTION_RESET
        | sys::UCS_ERR_REJECTED
        | sys::UCS_ERR_NOT_CONNECTED
        | sys::UCS_ERR_CANCELED
        | sys::UCS_ERR_IO_ERROR
        | sys::UCS_ERR_NO_RESOURCE => Code::Unavailable,
        sys::UCS_ERR_NO_MEMORY | sys::UCS_ERR_EXCEEDS_LIMIT => Code::NoSpace,
        sys::UCS_ERR_INVALID_PARAM | sys::UCS_ERR_INVALID_ADDR => Code::InvalidArgument,
        _ => Code::Internal,
    };
    Error::new(code, format!("{what}: UCX {}", status_string(st)))
}

fn check(st: sys::ucs_status_t, what: &str) -> Result<()> {
    if st == sys::UCS_OK {
        Ok(())
    } else {
        Err(ucx_error(st, what))
    }
}

/// A UCP context: the transports one process uses.
pub struct Context {
    h: sys::ucp_context_h,
}

impl Context {
    /// `tls` restricts the transports (UCX's `UCX_TLS`, e.g. `"tcp"` or
    /// `"sm,self"`); `None` lets UCX choose (and honours `UCX_TLS`).
    pub fn new(tls: Option<&str>) -> Result<Rc<Context>> {
        let mut cfg = null_mut();
        // SAFETY: reads the UCX_* environment into a new config we release.
        check(
            unsafe { sys::ucp_config_read(null(), null(), &mut cfg) },
            "reading the UCX configuration",
        )?;
        let modified = match tls {
            None => Ok(()),
            Some(t) => match CString::new(t) {
                // SAFETY: both strings are NUL-terminated and live across the call.
                Ok(v) => check(
                    unsafe { sys::ucp_config_modify(cfg, c"TLS".as_ptr(), v.as_ptr()) },
                    &format!("UCX transports {t:?}"),
                ),
                Err(_) => Err(Error::invalid("UCX transport list holds a NUL byte")),
            },
        };
        let mut h = null_mut();
        let st = modified.and_then(|()| {
            let params = sys::ucp_params_t {
                field_mask: sys::UCP_PARAM_FIELD_FEATURES as u64,
                features: (sys::UCP_FEATURE_RMA | sys::UCP_FEATURE_WAKEUP) as u64,
                ..Default::default()
            };
            // SAFETY: params and cfg are valid; h receives the context.
            check(
                unsafe {
                    sys::ucp_init_version(
                        sys::UCP_API_MAJOR,
                        sys::UCP_API_MINOR,
                        &params,
                        cfg,
                        &mut h,
                    )
                },
                "starting UCX",
            )
        });
        // SAFETY: cfg came from ucp_config_read and is released once.
        unsafe { sys::ucp_config_release(cfg) };
        st.map(|()| Rc::new(Context { h }))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: every worker and region holds an Rc to us, so none is left.
        unsafe { sys::ucp_cleanup(self.h) }
    }
}

/// Memory registered with a context: what remote peers read and write.
pub struct Region {
    ctx: Rc<Context>,
    memh: sys::ucp_mem_h,
    addr: usize,
}

impl Region {
    /// Registers `[ptr, ptr+len)`.
    ///
    /// # Safety
    /// The memory must stay allocated until the region is dropped; peers
    /// holding its key may write it at any time meanwhile.
    pub unsafe fn map(ctx: &Rc<Context>, ptr: *mut u8, len: usize) -> Result<Region> {
        if len == 0 {
            return Err(Error::invalid("cannot register an empty region"));
        }
        let params = sys::ucp_mem_map_params_t {
            field_mask: (sys::UCP_MEM_MAP_PARAM_FIELD_ADDRESS | sys::UCP_MEM_MAP_PARAM_FIELD_LENGTH)
                as u64,
            address: ptr.cast(),
            length: len,
            ..Default::default()
        };
        let mut memh = null_mut();
        // SAFETY: the caller vouches for the memory; memh receives the handle.
        check(
            unsafe { sys::ucp_mem_map(ctx.h, &params, &mut memh) },
            "registering memory with UCX",
        )?;
        Ok(Region {
            ctx: ctx.clone(),
            memh,
            addr: ptr as usize,
        })
    }

    /// The packed remote key peers need to reach this region.
    pub fn packed_key(&self) -> Result<Vec<u8>> {
        let (mut buf, mut size) = (null_mut(), 0usize);
        // SAFETY: valid context and handle; buf/size receive a UCX buffer.
        check(
            unsafe { sys::ucp_rkey_pack(self.ctx.h, self.memh, &mut buf, &mut size) },
            "packing a UCX remote key",
        )?;
        // SAFETY: UCX returned `size` readable bytes at `buf`.
        let key = unsafe { std::slice::from_raw_parts(buf as *const u8, size) }.to_vec();
        // SAFETY: released once, as ucp_rkey_pack requires.
        unsafe { sys::ucp_rkey_buffer_release(buf) };
        Ok(key)
    }

    pub fn addr(&self) -> u64 {
        self.addr as u64
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: mapped by us, unmapped once.
        unsafe { sys::ucp_mem_unmap(self.ctx.h, self.memh) };
    }
}

/// A UCP worker: one progress engine.
pub struct Worker {
    _ctx: Rc<Context>,
    h: sys::ucp_worker_h,
}

impl Worker {
    pub fn new(ctx: &Rc<Context>) -> Result<Rc<Worker>> {
        let params = sys::ucp_worker_params_t {
            field_mask: sys::UCP_WORKER_PARAM_FIELD_THREAD_MODE as u64,
            thread_mode: sys::UCS_THREAD_MODE_SINGLE,
            ..Default::default()
        };
        let mut h = null_mut();
        // SAFETY: valid context and params; h receives the worker.
        check(
            unsafe { sys::ucp_worker_create(ctx.h, &params, &mut h) },
            "creating a UCX worker",
        )?;
        Ok(Rc::new(Worker {
            _ctx: ctx.clone(),
            h,
        }))
    }

    /// This worker's address, for peers to connect to.
    pub fn address(&self) -> Result<Vec<u8>> {
        let (mut a, mut len) = (null_mut(), 0usize);
        // SAFETY: valid worker; a/len receive a UCX buffer.
        check(
            unsafe { sys::ucp_worker_get_address(self.h, &mut a, &mut len) },
            "getting the UCX worker address",
        )?;
        // SAFETY: UCX returned `len` readable bytes at `a`.
        let out = unsafe { std::slice::from_raw_parts(a as *const u8, len) }.to_vec();
        // SAFETY: released once.
        unsafe { sys::ucp_worker_release_address(self.h, a) };
        Ok(out)
    }

    /// The raw handle, for `ucp_worker_signal` from other threads (the only
    /// call UCX allows there).
    pub fn raw(&self) -> sys::ucp_worker_h {
        self.h
    }

    /// Prepares to sleep in [`Worker::wait`].
    pub fn arm(&self) -> Armed {
        // SAFETY: valid worker, on its own thread.
        match unsafe { sys::ucp_worker_arm(self.h) } {
            sys::UCS_OK => Armed::Yes,
            sys::UCS_ERR_BUSY => Armed::Busy,
            _ => Armed::Unsupported,
        }
    }

    /// Sleeps until a network event or `ucp_worker_signal` (after
    /// [`Worker::arm`] said yes).
    pub fn wait(&self) {
        // SAFETY: valid worker, on its own thread.
        let _ = unsafe { sys::ucp_worker_wait(self.h) };
    }

    /// Advances communication; returns whether anything happened.
    pub fn progress(&self) -> bool {
        // SAFETY: valid worker, used from its own thread only (!Send).
        unsafe { sys::ucp_worker_progress(self.h) != 0 }
    }

    /// Progresses until `done` or `timeout`.
    pub fn progress_until(&self, timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
        let t0 = Instant::now();
        loop {
            if done() {
                return true;
            }
            if t0.elapsed() > timeout {
                return false;
            }
            if !self.progress() {
                std::hint::spin_loop();
            }
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // SAFETY: every endpoint holds an Rc to us, so none is left.
        unsafe { sys::ucp_worker_destroy(self.h) }
    }
}

/// What [`Worker::arm`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Armed {
    /// Nothing pending: wait.
    Yes,
    /// Events pending: progress again.
    Busy,
    /// The transports cannot wake a sleeping worker: poll.
    Unsupported,
}

/// A connection from a worker to a remote worker. Remote keys unpacked on
/// it keep it open (UCX wants keys destroyed before their endpoint).
pub struct Endpoint(Rc<EpInner>);

struct EpInner {
    worker: Rc<Worker>,
    h: sys::ucp_ep_h,
    /// Peer failure handling is on (UCX then reports a dead peer, and a
    /// forced close is allowed).
    peer_errors: bool,
    /// Set by UCX's error callback when the peer fails; boxed so its
    /// address stays fixed.
    failed: Box<Cell<sys::ucs_status_t>>,
    /// Set when the endpoint's close completed (on drop): only then is UCX
    /// done with the buffers of its transfers.
    closed: Rc<Cell<bool>>,
}

unsafe extern "C" fn on_ep_error(arg: *mut c_void, _ep: sys::ucp_ep_h, status: sys::ucs_status_t) {
    // SAFETY: arg is the endpoint's `failed` cell, alive until the endpoint
    // is closed (the callback only runs inside progress on its thread).
    let cell = unsafe { &*(arg as *const Cell<sys::ucs_status_t>) };
    cell.set(status);
}

/// How long closing an endpoint may take before it is forced.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

impl Endpoint {
    /// Connects to the worker whose address is `remote`, with peer failure
    /// handling (operations to a dead peer fail instead of hanging) when the
    /// transports offer it. UCX's shared-memory transports do not: a
    /// same-host peer reachable only through them gets an endpoint without
    /// it, and callers bound their operations with deadlines instead.
    ///
    /// `same_host` peers are connected without peer failure handling first:
    /// asking for it makes UCX pick a network transport over shared memory
    /// even for a co-located peer. (A dead co-located process fails
    /// shared-memory transfers at once: the kernel refuses to copy from it.)
    pub fn connect(worker: &Rc<Worker>, remote: &[u8], same_host: bool) -> Result<Endpoint> {
        let first = !same_host;
        match Self::connect_with(worker, remote, first) {
            Err(e) if e.code == Code::Unavailable => Self::connect_with(worker, remote, !first),
            r => r,
        }
    }

    fn connect_with(worker: &Rc<Worker>, remote: &[u8], peer_errors: bool) -> Result<Endpoint> {
        if remote.is_empty() {
            return Err(Error::invalid("empty UCX worker address"));
        }
        let failed = Box::new(Cell::new(sys::UCS_OK));
        let params = sys::ucp_ep_params_t {
            field_mask: (sys::UCP_EP_PARAM_FIELD_REMOTE_ADDRESS
                | sys::UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE
                | sys::UCP_EP_PARAM_FIELD_ERR_HANDLER) as u64,
            address: remote.as_ptr().cast(),
            err_mode: if peer_errors {
                sys::UCP_ERR_HANDLING_MODE_PEER
            } else {
                sys::UCP_ERR_HANDLING_MODE_NONE
            },
            err_handler: sys::ucp_err_handler_t {
                cb: Some(on_ep_error),
                arg: (&*failed as *const Cell<sys::ucs_status_t>)
                    .cast_mut()
                    .cast(),
            },
            ..Default::default()
        };
        let mut h = null_mut();
        // SAFETY: the address bytes live across the call (UCX copies what it
        // needs); `failed` outlives the endpoint.
        check(
            unsafe { sys::ucp_ep_create(worker.h, &params, &mut h) },
            "connecting a UCX endpoint",
        )?;
        Ok(Endpoint(Rc::new(EpInner {
            worker: worker.clone(),
            h,
            peer_errors,
            failed,
            closed: Rc::new(Cell::new(false)),
        })))
    }

    /// The error the peer failed with, if it did.
    pub fn failure(&self) -> Option<Error> {
        let st = self.0.failed.get();
        (st != sys::UCS_OK).then(|| ucx_error(st, "UCX peer failed"))
    }

    /// Closes without flushing (what is in flight completes with an error);
    /// for a peer that failed or stopped answering. Whether the close
    /// completed: if not (or if remote keys still hold the endpoint), UCX
    /// may still touch the buffers of transfers that were in flight.
    pub fn close_forced(self) -> bool {
        if self.0.failed.get() == sys::UCS_OK {
            self.0.failed.set(sys::UCS_ERR_CANCELED);
        }
        let closed = self.0.closed.clone();
        drop(self);
        closed.get()
    }

    /// Closes (flushing, bounded); whether the close completed.
    pub fn close(self) -> bool {
        let closed = self.0.closed.clone();
        drop(self);
        closed.get()
    }

    /// Unpacks a region's remote key for use on this endpoint.
    pub fn remote_key(&self, packed: &[u8]) -> Result<RemoteKey> {
        if packed.is_empty() {
            return Err(Error::invalid("empty UCX remote key"));
        }
        let mut h = null_mut();
        // SAFETY: the packed bytes are read during the call only.
        check(
            unsafe { sys::ucp_ep_rkey_unpack(self.0.h, packed.as_ptr().cast(), &mut h) },
            "unpacking a UCX remote key",
        )?;
        Ok(RemoteKey {
            h,
            _ep: self.0.clone(),
        })
    }

    /// Starts writing `data` to `remote_addr` of the region `key` names.
    ///
    /// # Safety
    /// `data` must stay valid until the returned request completes, and the
    /// remote range must lie inside the region the key was packed from.
    pub unsafe fn put(&self, data: &[u8], remote_addr: u64, key: &RemoteKey) -> Request {
        let param = sys::ucp_request_param_t::default();
        // SAFETY: per the contract above.
        let p = unsafe {
            sys::ucp_put_nbx(
                self.0.h,
                data.as_ptr().cast(),
                data.len(),
                remote_addr,
                key.h,
                &param,
            )
        };
        Request::from_ptr(p, "UCX put")
    }

    /// Starts reading `buf.len()` bytes from `remote_addr` into `buf`.
    ///
    /// # Safety
    /// As for [`Endpoint::put`]; `buf` must not be touched until completion.
    pub unsafe fn get(&self, buf: &mut [u8], remote_addr: u64, key: &RemoteKey) -> Request {
        let param = sys::ucp_request_param_t::default();
        // SAFETY: per the contract above.
        let p = unsafe {
            sys::ucp_get_nbx(
                self.0.h,
                buf.as_mut_ptr().cast(),
                buf.len(),
                remote_addr,
                key.h,
                &param,
            )
        };
        Request::from_ptr(p, "UCX get")
    }

    /// Completes every put issued on this endpoint at the remote side.
    pub fn flush(&self) -> Request {
        let param = sys::ucp_request_param_t::default();
        // SAFETY: valid endpoint.
        let p = unsafe { sys::ucp_ep_flush_nbx(self.0.h, &param) };
        Request::from_ptr(p, "UCX flush")
    }

    /// Runs `req` to completion on this endpoint's worker, within `timeout`.
    pub fn wait(&self, req: Request, timeout: Duration) -> Result<()> {
        let mut out = None;
        let done = self
            .0
            .worker
            .progress_until(timeout, || match req.status() {
                None => false,
                Some(r) => {
                    out = Some(r);
                    true
                }
            });
        match out {
            Some(r) if done => r,
            _ => Err(Error::new(Code::Timeout, "UCX operation timed out")),
        }
    }
}

impl Drop for EpInner {
    fn drop(&mut self) {
        // A failed peer cannot flush: force the close (valid only under
        // peer error handling). Otherwise a flushing close, bounded.
        let flags = if self.failed.get() != sys::UCS_OK && self.peer_errors {
            sys::UCP_EP_CLOSE_FLAG_FORCE
        } else {
            0
        };
        let param = sys::ucp_request_param_t {
            op_attr_mask: sys::UCP_OP_ATTR_FIELD_FLAGS,
            flags,
            ..Default::default()
        };
        // SAFETY: closed once; the request is waited for, then freed.
        let p = unsafe { sys::ucp_ep_close_nbx(self.h, &param) };
        let req = Request::from_ptr(p, "UCX close");
        let closed = self
            .worker
            .progress_until(CLOSE_TIMEOUT, || req.status().is_some());
        self.closed.set(closed);
        if !closed {
            // UCX may still call the error handler: keep its cell alive.
            Box::leak(std::mem::replace(
                &mut self.failed,
                Box::new(Cell::new(sys::UCS_OK)),
            ));
        }
    }
}

/// A region's remote key, unpacked for one endpoint.
pub struct RemoteKey {
    h: sys::ucp_rkey_h,
    _ep: Rc<EpInner>,
}

impl Drop for RemoteKey {
    fn drop(&mut self) {
        // SAFETY: unpacked by us, destroyed once.
        unsafe { sys::ucp_rkey_destroy(self.h) }
    }
}

/// An operation in flight (or already finished).
pub struct Request {
    state: ReqState,
}

enum ReqState {
    Done(Result<()>),
    InFlight(*mut c_void, &'static str),
}

impl Request {
    fn from_ptr(p: sys::ucs_status_ptr_t, what: &'static str) -> Request {
        let state = if p.is_null() {
            ReqState::Done(Ok(()))
        } else if sys::ucs_ptr_is_err(p) {
            ReqState::Done(Err(ucx_error(sys::ucs_ptr_raw_status(p), what)))
        } else {
            ReqState::InFlight(p, what)
        };
        Request { state }
    }

    /// `None` while in flight; the outcome once done (progress the worker
    /// meanwhile).
    pub fn status(&self) -> Option<Result<()>> {
        match &self.state {
            ReqState::Done(r) => Some(r.clone()),
            ReqState::InFlight(p, what) => {
                // SAFETY: a live request handle (freed only on drop).
                let st = unsafe { sys::ucp_request_check_status(*p) };
                if st == sys::UCS_INPROGRESS {
                    None
                } else {
                    Some(check(st, what))
                }
            }
        }
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        if let ReqState::InFlight(p, _) = self.state {
            // SAFETY: freed once. UCX lets an unfinished request be freed:
            // it completes on its own; callers keep buffers alive until then.
            unsafe { sys::ucp_request_free(p) }
        }
    }
}
