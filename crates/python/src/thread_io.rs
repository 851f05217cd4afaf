//! A blocking call's I/O on the Python thread that waits for it.
//!
//! Why: a Python thread blocked on the shared multi-threaded runtime is
//! woken by one of its workers, which was itself woken by the socket: two
//! thread switches per network round trip, where a task on the runtime pays
//! one. On this 2-core machine that was ~35 µs of a 64 KiB get's ~175 µs
//! (measured against the Rust client's own tasks). So each thread that makes
//! blocking calls on a `Store` gets a single-threaded runtime and a
//! sibling client (its own connections, the location cache and placement
//! view shared; over UCX the engines and routes too) and drives them itself
//! while it waits: its sockets wake it directly. Async stores and the
//! embedded segment stay on the shared runtime. `STRATA_THREAD_IO=0` turns
//! this off.
//!
//! Lifetimes: a thread's runtime and client end when the thread exits (a
//! thread-local guard removes them), when the store closes, or when it is
//! dropped. A runtime is never dropped inside an async context (tokio
//! refuses): those drops go to the shared runtime's blocking pool. A forked
//! child never drops what it inherited: the sockets share the parent's
//! epoll set, and closing them there would deregister the parent's.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::thread::ThreadId;
use strata_client::Client;
use strata_common::{Error, Result};
use tokio::runtime::Runtime;

/// One thread's runtime and client (fields drop in order: the client's
/// sockets before the runtime that drives them).
pub struct Local {
    pub client: Client,
    pub rt: Runtime,
}

/// The per-thread I/O of one connection.
pub struct Locals {
    map: Mutex<HashMap<ThreadId, Arc<Local>>>,
    pid: u32,
}

/// Whether blocking calls use per-thread I/O (`STRATA_THREAD_IO`, default on).
pub fn enabled() -> bool {
    std::env::var("STRATA_THREAD_IO").map_or(true, |v| v.trim() != "0")
}

impl Locals {
    pub fn new() -> Arc<Locals> {
        Arc::new(Locals {
            map: Mutex::default(),
            pid: std::process::id(),
        })
    }

    /// This thread's runtime and client, if it has made them.
    pub fn existing(&self) -> Option<Arc<Local>> {
        self.lock().get(&std::thread::current().id()).cloned()
    }

    /// This thread's runtime and client, made on its first call from a
    /// sibling of `base`. Call with the GIL released: making one builds a
    /// runtime (no network I/O: connections are made by the first call).
    pub fn this_thread(self: &Arc<Self>, base: &Client) -> Result<Arc<Local>> {
        let id = std::thread::current().id();
        if let Some(l) = self.lock().get(&id) {
            return Ok(l.clone());
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::internal(format!("cannot make this thread's runtime: {e}")))?;
        // The sibling's background tasks are spawned on this runtime.
        let client = {
            let _in = rt.enter();
            base.sibling()?
        };
        let local = Arc::new(Local { client, rt });
        self.lock().insert(id, local.clone());
        GUARD.with(|g| g.watch(self));
        Ok(local)
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Every thread's runtime and client, taken out (close): the caller
    /// drops them outside any async context.
    pub fn take_all(&self) -> Vec<Arc<Local>> {
        self.lock().drain().map(|(_, l)| l).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ThreadId, Arc<Local>>> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Locals {
    fn drop(&mut self) {
        let all: Vec<_> = self
            .map
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .drain()
            .map(|(_, l)| l)
            .collect();
        dispose(all, self.pid);
    }
}

/// Drops runtimes where that is allowed: on the shared runtime's blocking
/// pool (never in the caller's context, which may be async), and not at all
/// in a forked child.
pub fn dispose(locals: Vec<Arc<Local>>, made_in: u32) {
    if locals.is_empty() {
        return;
    }
    if std::process::id() != made_in {
        std::mem::forget(locals);
        return;
    }
    match crate::runtime::runtime() {
        Ok(rt) => {
            rt.spawn_blocking(move || drop(locals));
        }
        Err(_) => std::mem::forget(locals),
    }
}

/// Removes a thread's entries from every connection it used when it exits.
struct Guard {
    // Taken when the guard is made: `thread::current()` may be gone by the
    // time thread-local destructors run.
    id: ThreadId,
    watched: RefCell<Vec<Weak<Locals>>>,
}

impl Guard {
    fn watch(&self, locals: &Arc<Locals>) {
        let mut w = self.watched.borrow_mut();
        w.retain(|l| l.strong_count() > 0);
        if !w
            .iter()
            .any(|l| std::ptr::eq(l.as_ptr(), Arc::as_ptr(locals)))
        {
            w.push(Arc::downgrade(locals));
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        for w in self.watched.get_mut().drain(..) {
            if let Some(locals) = w.upgrade() {
                if std::process::id() != locals.pid {
                    // A forked child: the map's lock may have been held by
                    // another parent thread at the fork; leave it be.
                    std::mem::forget(locals);
                    continue;
                }
                let mine = locals.lock().remove(&self.id);
                dispose(mine.into_iter().collect(), locals.pid);
            }
        }
    }
}

thread_local! {
    static GUARD: Guard = Guard {
        id: std::thread::current().id(),
        watched: RefCell::default(),
    };
}
