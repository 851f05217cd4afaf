//! A UCX worker on a progress thread of its own, driven from async code.
//!
//! UCP objects are single-threaded, so one thread owns the context, the
//! worker, every endpoint, remote key and registered region; callers send it
//! commands and await the answers. The tokio runtime never blocks on UCX:
//! the thread sleeps in `ucp_worker_wait` when idle (network events and
//! `ucp_worker_signal`, which any thread may call, wake it) and spins only
//! while operations are in flight.
//!
//! Operations own their buffers until UCX is done with them, so a caller
//! that gives up (a dropped future, a timeout) can never leave UCX writing
//! into freed memory. A deadline that passes, or a peer that fails, tears its
//! endpoint down (forced close, which completes what was in flight); the
//! next operation to that peer connects again.

use super::api::{Armed, Context, Endpoint, Region, RemoteKey, Request, Worker};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use strata_common::{Code, Error, Result};
use strata_ucx_sys as sys;
use tokio::sync::oneshot;

/// Where a remote region is: its worker's address and its packed key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Peer {
    pub worker: Arc<[u8]>,
    pub rkey: Arc<[u8]>,
    /// The peer runs on this host: connect for shared memory.
    pub same_host: bool,
}

/// A region registered with an engine.
#[derive(Debug, Clone)]
pub struct Registered {
    pub id: u64,
    /// Its packed remote key, for peers.
    pub rkey: Vec<u8>,
    /// The address peers name (the registered memory's virtual address).
    pub base: u64,
}

/// Transfer buffers kept for reuse: a fresh large buffer costs a page fault
/// per 4 KiB on first touch, more than the transfer itself.
#[derive(Default)]
pub struct Pool {
    free: parking_lot::Mutex<Vec<Vec<u8>>>,
}

/// Buffers kept at most, and their total size.
const POOL_BUFFERS: usize = 64;
const POOL_BYTES: usize = 256 << 20;

impl Pool {
    /// A buffer of exactly `len` bytes (contents unspecified: a previous
    /// transfer's, or zeros).
    fn take(&self, len: usize) -> Vec<u8> {
        let mut free = self.free.lock();
        // The smallest that fits and wastes at most half of itself.
        let best = free
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= len && b.capacity() / 2 <= len)
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i);
        match best {
            Some(i) => {
                let mut b = free.swap_remove(i);
                drop(free);
                // Zeroes only what grows past its last length.
                b.resize(len, 0);
                b
            }
            None => vec![0u8; len],
        }
    }

    fn give(&self, b: Vec<u8>) {
        if b.capacity() == 0 {
            return;
        }
        let mut free = self.free.lock();
        let held: usize = free.iter().map(Vec::capacity).sum();
        if free.len() < POOL_BUFFERS && held + b.capacity() <= POOL_BYTES {
            free.push(b);
        }
    }
}

/// A received buffer; it goes back to its engine's pool when dropped.
pub struct Pooled {
    buf: Vec<u8>,
    pool: Arc<Pool>,
}

impl std::ops::Deref for Pooled {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        self.pool.give(std::mem::take(&mut self.buf));
    }
}

enum Cmd {
    Register {
        ptr: usize,
        len: usize,
        done: oneshot::Sender<Result<Registered>>,
    },
    Unregister {
        id: u64,
    },
    Put {
        peer: Peer,
        addr: u64,
        data: Vec<u8>,
        deadline: Instant,
        done: oneshot::Sender<Result<()>>,
    },
    Get {
        peer: Peer,
        addr: u64,
        len: usize,
        deadline: Instant,
        done: oneshot::Sender<Result<Vec<u8>>>,
    },
    GetThen {
        peer: Peer,
        addr: u64,
        len: usize,
        then: Vec<(Peer, u64)>,
        deadline: Instant,
        done: oneshot::Sender<Result<(Vec<u8>, Vec<u64>)>>,
    },
}

/// A handle on the progress thread. Dropping it stops the thread, which
/// closes every endpoint and unregisters every region.
pub struct Engine {
    cmds: mpsc::Sender<Cmd>,
    /// The worker, for `ucp_worker_signal` (valid until the thread exits,
    /// which only `Drop` lets it do).
    worker: usize,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    address: Vec<u8>,
    pool: Arc<Pool>,
}

fn gone() -> Error {
    Error::unavailable("the UCX progress thread has stopped")
}

impl Engine {
    /// Starts a progress thread with its own UCX context (`tls` as in
    /// [`Context::new`]).
    pub fn start(tls: Option<&str>) -> Result<Engine> {
        let (cmds, rx) = mpsc::channel();
        let (ready_tx, ready) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let halt = stop.clone();
        let tls = tls.map(str::to_string);
        let pool = Arc::new(Pool::default());
        let thread_pool = pool.clone();
        let thread = std::thread::Builder::new()
            .name("strata-ucx".into())
            .spawn(move || {
                let state = Context::new(tls.as_deref())
                    .and_then(|ctx| Ok((Worker::new(&ctx)?, ctx)))
                    .and_then(|(w, ctx)| Ok((w.address()?, w, ctx)));
                match state {
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                    Ok((addr, worker, ctx)) => {
                        let _ = ready_tx.send(Ok((addr, worker.raw() as usize)));
                        Progress::new(ctx, worker, thread_pool).run(&rx, &halt);
                    }
                }
            })
            .map_err(|e| Error::internal(format!("cannot start the UCX thread: {e}")))?;
        let (address, worker) = ready.recv().map_err(|_| gone())??;
        Ok(Engine {
            cmds,
            worker,
            stop,
            thread: Some(thread),
            address,
            pool,
        })
    }

    /// This engine's worker address, for peers.
    pub fn address(&self) -> &[u8] {
        &self.address
    }

    fn send(&self, cmd: Cmd) -> Result<()> {
        self.cmds.send(cmd).map_err(|_| gone())?;
        // SAFETY: the worker lives until the thread exits, which happens
        // only after `Drop` (below) has stopped sending.
        unsafe { sys::ucp_worker_signal(self.worker as sys::ucp_worker_h) };
        Ok(())
    }

    /// Sends the command `make` builds around its answer channel and awaits
    /// the answer.
    async fn call<T>(&self, make: impl FnOnce(oneshot::Sender<Result<T>>) -> Cmd) -> Result<T> {
        let (done, rx) = oneshot::channel();
        self.send(make(done))?;
        rx.await.map_err(|_| gone())?
    }

    /// Registers memory for remote access.
    ///
    /// # Safety
    /// `[ptr, ptr+len)` must stay allocated until [`Engine::unregister`]
    /// (or the engine's drop) has returned; peers may write it meanwhile.
    pub async unsafe fn register(&self, ptr: *mut u8, len: usize) -> Result<Registered> {
        let ptr = ptr as usize;
        self.call(|done| Cmd::Register { ptr, len, done }).await
    }

    pub fn unregister(&self, id: u64) {
        let _ = self.send(Cmd::Unregister { id });
    }

    /// Writes `data` at `addr` of the peer's region, visible there once this
    /// returns Ok.
    pub async fn put(
        &self,
        peer: &Peer,
        addr: u64,
        data: Vec<u8>,
        timeout: Duration,
    ) -> Result<()> {
        self.put_by(peer, addr, data, Instant::now() + timeout)
            .await
    }

    /// [`Engine::put`] that must be done by `deadline`: past it the
    /// endpoint is torn down, which ends the transfer.
    async fn put_by(&self, peer: &Peer, addr: u64, data: Vec<u8>, deadline: Instant) -> Result<()> {
        self.call(|done| Cmd::Put {
            peer: peer.clone(),
            addr,
            data,
            deadline,
            done,
        })
        .await
    }

    /// Writes a copy of `data` (in a reused buffer) at `addr`, to be done by
    /// `deadline`.
    pub async fn put_slice(
        &self,
        peer: &Peer,
        addr: u64,
        data: &[u8],
        deadline: Instant,
    ) -> Result<()> {
        let mut buf = self.pool.take(data.len());
        buf.copy_from_slice(data);
        self.put_by(peer, addr, buf, deadline).await
    }

    /// Reads `len` bytes at `addr` of the peer's region into a reused
    /// buffer.
    pub async fn get_pooled(
        &self,
        peer: &Peer,
        addr: u64,
        len: usize,
        deadline: Instant,
    ) -> Result<Pooled> {
        let buf = self.get_by(peer, addr, len, deadline).await?;
        Ok(Pooled {
            buf,
            pool: self.pool.clone(),
        })
    }

    /// Reads `len` bytes at `addr` of the peer's region into a reused
    /// buffer and, once they have landed, the 8-byte words at each of
    /// `then` (answered in that order): one hand-off to the progress thread
    /// instead of two, for readers that must check something after their
    /// bytes. The words must be on the same worker as the bytes.
    pub async fn get_then(
        &self,
        peer: &Peer,
        addr: u64,
        len: usize,
        then: Vec<(Peer, u64)>,
        deadline: Instant,
    ) -> Result<(Pooled, Vec<u64>)> {
        let (buf, words) = self
            .call(|done| Cmd::GetThen {
                peer: peer.clone(),
                addr,
                len,
                then,
                deadline,
                done,
            })
            .await?;
        Ok((
            Pooled {
                buf,
                pool: self.pool.clone(),
            },
            words,
        ))
    }

    /// Reads `len` bytes at `addr` of the peer's region.
    pub async fn get(
        &self,
        peer: &Peer,
        addr: u64,
        len: usize,
        timeout: Duration,
    ) -> Result<Vec<u8>> {
        self.get_by(peer, addr, len, Instant::now() + timeout).await
    }

    /// [`Engine::get`] that must be done by `deadline`.
    async fn get_by(
        &self,
        peer: &Peer,
        addr: u64,
        len: usize,
        deadline: Instant,
    ) -> Result<Vec<u8>> {
        self.call(|done| Cmd::Get {
            peer: peer.clone(),
            addr,
            len,
            deadline,
            done,
        })
        .await
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // SAFETY: as in `send`; the thread is still alive (joined below).
        unsafe { sys::ucp_worker_signal(self.worker as sys::ucp_worker_h) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One operation in flight. Its buffer lives here until UCX is done.
struct InFlight {
    peer: Arc<[u8]>,
    /// The put or get, then (puts) the flush that makes it visible.
    reqs: Vec<Request>,
    deadline: Instant,
    done: Done,
}

enum Done {
    Put(oneshot::Sender<Result<()>>, Vec<u8>),
    Get(oneshot::Sender<Result<Vec<u8>>>, Vec<u8>),
    /// A get, then (once it landed) reads of 8-byte words: `then` until
    /// they are issued, `words` their buffers from then on.
    GetThen {
        tx: oneshot::Sender<Result<(Vec<u8>, Vec<u64>)>>,
        buf: Vec<u8>,
        then: Vec<(Peer, u64)>,
        words: Vec<Vec<u8>>,
    },
}

impl Done {
    /// Answers a transfer that ended early (a failed peer, a deadline, a
    /// stop). Its buffer is reused only if its endpoint's close completed;
    /// otherwise UCX may still write into it or send from it, so it is
    /// leaked rather than freed or handed to another transfer.
    fn settle(self, r: Result<()>, closed: bool, pool: &Pool) {
        if closed {
            return self.finish(r, pool);
        }
        tracing::warn!("a UCX endpoint did not close in time; the buffer of a transfer it had in flight is leaked");
        match self {
            Done::Put(tx, buf) => {
                let _ = tx.send(r);
                std::mem::forget(buf);
            }
            Done::Get(tx, buf) => {
                let _ = tx.send(r.map(|()| Vec::new()));
                std::mem::forget(buf);
            }
            Done::GetThen { tx, buf, words, .. } => {
                let _ = tx.send(r.and(Err(gone())));
                std::mem::forget(buf);
                std::mem::forget(words);
            }
        }
    }

    /// The words still to read after the bytes, if any (taken).
    fn take_then(&mut self) -> Vec<(Peer, u64)> {
        match self {
            Done::GetThen { then, .. } => std::mem::take(then),
            _ => Vec::new(),
        }
    }

    fn finish(self, r: Result<()>, pool: &Pool) {
        match self {
            Done::Put(tx, buf) => {
                let _ = tx.send(r);
                pool.give(buf);
            }
            Done::Get(tx, buf) => {
                let _ = tx.send(r.map(|()| buf));
            }
            Done::GetThen { tx, buf, words, .. } => {
                let r = r.and_then(|()| {
                    words
                        .iter()
                        .map(|w| {
                            w.as_slice()
                                .try_into()
                                .map(u64::from_ne_bytes)
                                .map_err(|_| Error::internal("a word read was not 8 bytes"))
                        })
                        .collect::<Result<Vec<u64>>>()
                });
                let _ = tx.send(r.map(|w| (buf, w)));
            }
        }
    }
}

/// `None` while any request is in flight; then the first error, if any.
fn outcome(reqs: &[Request]) -> Option<Result<()>> {
    let mut out = Ok(());
    for r in reqs {
        match r.status() {
            None => return None,
            Some(Err(e)) if out.is_ok() => out = Err(e),
            Some(_) => {}
        }
    }
    Some(out)
}

/// A connection to one peer worker and the keys unpacked on it.
struct Conn {
    ep: Endpoint,
    keys: HashMap<Arc<[u8]>, RemoteKey>,
}

/// The progress thread's state.
struct Progress {
    ctx: Rc<Context>,
    worker: Rc<Worker>,
    conns: HashMap<Arc<[u8]>, Conn>,
    regions: HashMap<u64, Region>,
    next_region: u64,
    inflight: Vec<InFlight>,
    pool: Arc<Pool>,
}

impl Progress {
    fn new(ctx: Rc<Context>, worker: Rc<Worker>, pool: Arc<Pool>) -> Self {
        Progress {
            ctx,
            worker,
            conns: HashMap::new(),
            regions: HashMap::new(),
            next_region: 1,
            inflight: Vec::new(),
            pool,
        }
    }

    fn run(mut self, rx: &mpsc::Receiver<Cmd>, stop: &AtomicBool) {
        while !stop.load(Ordering::Acquire) {
            while let Ok(cmd) = rx.try_recv() {
                self.start(cmd);
            }
            let busy = self.worker.progress();
            self.reap();
            if !busy && self.inflight.is_empty() {
                // Sleep until a network event or a command's signal.
                match self.worker.arm() {
                    Armed::Yes => self.worker.wait(),
                    Armed::Busy => {}
                    // No wakeup support on these transports: poll gently.
                    Armed::Unsupported => std::thread::sleep(Duration::from_micros(100)),
                }
            }
        }
        // Close the endpoints first (their closes complete what is in
        // flight), then fail what was left and free its buffers: unless a
        // close did not complete, when UCX may still use them (leaked).
        let left = std::mem::take(&mut self.inflight);
        let mut closed = true;
        for (_, Conn { ep, keys }) in self.conns.drain() {
            drop(keys);
            closed &= ep.close();
        }
        for op in left {
            let InFlight { reqs, done, .. } = op;
            drop(reqs);
            done.settle(Err(gone()), closed, &self.pool);
        }
        self.regions.clear();
    }

    fn start(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Register { ptr, len, done } => {
                // SAFETY: the caller of `Engine::register` vouched for it.
                let r = unsafe { Region::map(&self.ctx, ptr as *mut u8, len) }.and_then(|region| {
                    let id = self.next_region;
                    self.next_region += 1;
                    let reg = Registered {
                        id,
                        rkey: region.packed_key()?,
                        base: region.addr(),
                    };
                    self.regions.insert(id, region);
                    Ok(reg)
                });
                let _ = done.send(r);
            }
            Cmd::Unregister { id } => {
                self.regions.remove(&id);
            }
            Cmd::Put {
                peer,
                addr,
                data,
                deadline,
                done,
            } => {
                let issued = self.key(&peer).map(|(ep, key)| {
                    // SAFETY: `data` moves into the in-flight entry below and
                    // stays there until both requests are complete.
                    let put = unsafe { ep.put(&data, addr, key) };
                    vec![put, ep.flush()]
                });
                self.track(peer.worker, issued, deadline, Done::Put(done, data));
            }
            Cmd::Get {
                peer,
                addr,
                len,
                deadline,
                done,
            } => {
                let (buf, issued) = self.get_into_pooled(&peer, addr, len);
                self.track(peer.worker, issued, deadline, Done::Get(done, buf));
            }
            Cmd::GetThen {
                peer,
                addr,
                len,
                then,
                deadline,
                done,
            } => {
                // Timeouts and failures tear down by the data's worker: a
                // word on another worker could outlive its buffer.
                if then.iter().any(|(p, _)| p.worker != peer.worker) {
                    let _ = done.send(Err(Error::invalid(
                        "words read after a get must be on the same worker",
                    )));
                    return;
                }
                let (buf, issued) = self.get_into_pooled(&peer, addr, len);
                let done = Done::GetThen {
                    tx: done,
                    buf,
                    then,
                    words: Vec::new(),
                };
                self.track(peer.worker, issued, deadline, done);
            }
        }
    }

    /// Issues a read of `len` bytes at `addr` into a pooled buffer, which
    /// the caller must keep in the in-flight entry with the request (a
    /// Vec's heap buffer does not move) until it completes.
    fn get_into_pooled(
        &mut self,
        peer: &Peer,
        addr: u64,
        len: usize,
    ) -> (Vec<u8>, Result<Vec<Request>>) {
        let mut buf = self.pool.take(len);
        // SAFETY: see above; the caller keeps `buf` with the request.
        let issued = self
            .key(peer)
            .map(|(ep, key)| vec![unsafe { ep.get(&mut buf, addr, key) }]);
        (buf, issued)
    }

    /// Issues reads of the 8-byte words at `then`, each into a buffer of
    /// its own (returned, to live as long as its request). Every key is
    /// resolved before anything is issued, so an error leaves nothing in
    /// flight.
    fn read_words(&mut self, then: &[(Peer, u64)]) -> Result<(Vec<Request>, Vec<Vec<u8>>)> {
        for (peer, _) in then {
            self.key(peer)?;
        }
        let mut reqs = Vec::with_capacity(then.len());
        let mut bufs = Vec::with_capacity(then.len());
        for (peer, addr) in then {
            let mut b = vec![0u8; 8];
            let conn = &self.conns[&peer.worker];
            // SAFETY: `b` is returned beside its request and kept with it
            // in the in-flight entry until the request is complete.
            reqs.push(unsafe { conn.ep.get(&mut b, *addr, &conn.keys[&peer.rkey]) });
            bufs.push(b);
        }
        Ok((reqs, bufs))
    }

    fn track(
        &mut self,
        peer: Arc<[u8]>,
        issued: Result<Vec<Request>>,
        deadline: Instant,
        done: Done,
    ) {
        match issued {
            Ok(reqs) => self.inflight.push(InFlight {
                peer,
                reqs,
                deadline,
                done,
            }),
            Err(e) => done.finish(Err(e), &self.pool),
        }
    }

    /// The endpoint to `peer` (connected on first use) and its key.
    fn key(&mut self, peer: &Peer) -> Result<(&Endpoint, &RemoteKey)> {
        if !self.conns.contains_key(&peer.worker) {
            let ep = Endpoint::connect(&self.worker, &peer.worker, peer.same_host)?;
            self.conns.insert(
                peer.worker.clone(),
                Conn {
                    ep,
                    keys: HashMap::new(),
                },
            );
        }
        let conn = self.conns.get_mut(&peer.worker).expect("inserted above");
        if !conn.keys.contains_key(&peer.rkey) {
            let key = conn.ep.remote_key(&peer.rkey)?;
            conn.keys.insert(peer.rkey.clone(), key);
        }
        let conn = &self.conns[&peer.worker];
        Ok((&conn.ep, &conn.keys[&peer.rkey]))
    }

    /// Completes finished operations; tears down peers that failed or let
    /// a deadline pass.
    fn reap(&mut self) {
        let now = Instant::now();
        let mut broken: Vec<(Arc<[u8]>, Error)> = Vec::new();
        for (w, c) in &self.conns {
            if let Some(e) = c.ep.failure() {
                broken.push((w.clone(), e));
            }
        }
        let mut i = 0;
        while i < self.inflight.len() {
            let op = &self.inflight[i];
            match outcome(&op.reqs) {
                Some(r) => {
                    let mut op = self.inflight.swap_remove(i);
                    let then = op.done.take_then();
                    if r.is_ok() && !then.is_empty() {
                        // The bytes landed: now the words, in the same
                        // entry (same peer, same deadline). Where UCX reads
                        // with the CPU (shared memory), the words' loads
                        // must not pass the bytes' on weakly ordered CPUs.
                        std::sync::atomic::fence(Ordering::Acquire);
                        match self.read_words(&then) {
                            Ok((reqs, bufs)) => {
                                op.reqs = reqs;
                                if let Done::GetThen { words, .. } = &mut op.done {
                                    *words = bufs;
                                }
                                self.inflight.push(op);
                            }
                            Err(e) => op.done.finish(Err(e), &self.pool),
                        }
                        continue;
                    }
                    op.done.finish(r, &self.pool);
                }
                None if now >= op.deadline => {
                    broken.push((
                        op.peer.clone(),
                        Error::new(Code::Timeout, "UCX transfer timed out"),
                    ));
                    i += 1;
                }
                None => i += 1,
            }
        }
        for (peer, e) in broken {
            self.tear_down(&peer, e);
        }
    }

    /// Fails every operation to `peer` and closes its endpoint (forced), so
    /// UCX completes their requests before their buffers are freed.
    fn tear_down(&mut self, peer: &Arc<[u8]>, e: Error) {
        let Some(conn) = self.conns.remove(peer) else {
            return;
        };
        tracing::warn!(error = %e, "UCX peer failed; its endpoint is closed and made again on next use");
        let (dead, live): (Vec<InFlight>, Vec<InFlight>) = std::mem::take(&mut self.inflight)
            .into_iter()
            .partition(|op| &op.peer == peer);
        self.inflight = live;
        let Conn { ep, keys } = conn;
        drop(keys);
        let closed = ep.close_forced();
        for op in dead {
            let InFlight { reqs, done, .. } = op;
            drop(reqs);
            done.settle(Err(e.clone()), closed, &self.pool);
        }
    }
}

#[cfg(test)]
mod pool_tests {
    use super::{Pool, POOL_BYTES};

    #[test]
    fn buffers_are_reused_within_limits() {
        let pool = Pool::default();
        let b = pool.take(1000);
        assert_eq!(b.len(), 1000);
        let ptr = b.as_ptr();
        pool.give(b);
        // Reused for a size it fits without wasting more than half...
        let b = pool.take(600);
        assert_eq!((b.len(), b.as_ptr()), (600, ptr));
        pool.give(b);
        // ...and not for a much smaller one, nor a larger one.
        let small = pool.take(100);
        assert_ne!(small.as_ptr(), ptr);
        let big = pool.take(1001);
        assert_ne!(big.as_ptr(), ptr);
        assert_eq!(big.len(), 1001);
        // A buffer beyond the pool's byte budget is not kept.
        let huge = vec![0u8; POOL_BYTES + 1];
        pool.give(huge);
        assert!(pool.free.lock().iter().all(|b| b.capacity() <= POOL_BYTES));
    }
}
