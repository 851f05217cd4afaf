//! A debug-build check of the lock order written in `master.rs`: the locks
//! the order keeps apart — an object-table shard, the offload queue and the
//! cluster's maps (`nodes`, `segments`) — note on their thread while they
//! are held, and taking one of them while a lock it must never meet is held
//! panics, naming both. Every unit and integration test runs in a debug
//! build, so every path they drive is checked; release builds compile the
//! bookkeeping away (the guards are plain lock guards there).
//!
//! The rules checked: never a shard and the offload queue together, never
//! a shard and a cluster map together, never `nodes` and `segments`
//! together (each either way round). The other edges
//! of the order (shard → node log, shard → tombstone map, …) are leaves
//! taken in one direction only, which the module docs of their owners say.

use parking_lot::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::ops::{Deref, DerefMut};

/// A lock the order keeps apart from others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lock {
    Shard,
    OffloadQueue,
    Nodes,
    Segments,
}

impl Lock {
    /// The locks that must not be held when this one is taken.
    #[cfg(debug_assertions)]
    fn never_with(self) -> &'static [Lock] {
        match self {
            Lock::Shard => &[Lock::OffloadQueue, Lock::Nodes, Lock::Segments],
            Lock::OffloadQueue => &[Lock::Shard],
            Lock::Nodes => &[Lock::Shard, Lock::Segments],
            Lock::Segments => &[Lock::Shard, Lock::Nodes],
        }
    }
}

#[cfg(debug_assertions)]
thread_local! {
    /// How many of each `Lock` this thread holds (a shard scan may hold one
    /// shard at a time; read guards of one map may nest).
    static HELD: std::cell::Cell<[u32; 4]> = const { std::cell::Cell::new([0; 4]) };
}

/// This thread holds `lock` until the token drops.
pub(crate) struct Held {
    #[cfg(debug_assertions)]
    lock: Lock,
}

impl Held {
    /// Notes that `lock` is taken now; panics (debug builds) if the order
    /// forbids it under a lock this thread holds.
    pub(crate) fn take(lock: Lock) -> Held {
        #[cfg(debug_assertions)]
        HELD.with(|h| {
            let mut held = h.get();
            for other in lock.never_with() {
                assert!(
                    held[*other as usize] == 0,
                    "lock order (master.rs): {lock:?} taken while {other:?} is held"
                );
            }
            held[lock as usize] += 1;
            h.set(held);
        });
        #[cfg(not(debug_assertions))]
        let _ = lock;
        Held {
            #[cfg(debug_assertions)]
            lock,
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        #[cfg(debug_assertions)]
        HELD.with(|h| {
            let mut held = h.get();
            held[self.lock as usize] -= 1;
            h.set(held);
        });
    }
}

/// A mutex that takes part in the check.
pub(crate) struct OrderedMutex<T> {
    lock: Lock,
    inner: Mutex<T>,
}

impl<T> OrderedMutex<T> {
    pub(crate) fn new(lock: Lock, value: T) -> Self {
        OrderedMutex {
            lock,
            inner: Mutex::new(value),
        }
    }

    pub(crate) fn lock(&self) -> Guard<MutexGuard<'_, T>> {
        let held = Held::take(self.lock);
        Guard {
            guard: self.inner.lock(),
            _held: held,
        }
    }
}

/// A read-write lock that takes part in the check.
pub(crate) struct OrderedRwLock<T> {
    lock: Lock,
    inner: RwLock<T>,
}

impl<T> OrderedRwLock<T> {
    pub(crate) fn new(lock: Lock, value: T) -> Self {
        OrderedRwLock {
            lock,
            inner: RwLock::new(value),
        }
    }

    pub(crate) fn read(&self) -> Guard<RwLockReadGuard<'_, T>> {
        let held = Held::take(self.lock);
        Guard {
            guard: self.inner.read(),
            _held: held,
        }
    }

    pub(crate) fn write(&self) -> Guard<RwLockWriteGuard<'_, T>> {
        let held = Held::take(self.lock);
        Guard {
            guard: self.inner.write(),
            _held: held,
        }
    }
}

/// A lock guard and the note that its lock is held (released in that
/// order: fields drop in declaration order).
pub struct Guard<G> {
    guard: G,
    _held: Held,
}

impl<G: Deref> Deref for Guard<G> {
    type Target = G::Target;
    fn deref(&self) -> &G::Target {
        &self.guard
    }
}

impl<G: DerefMut> DerefMut for Guard<G> {
    fn deref_mut(&mut self) -> &mut G::Target {
        &mut self.guard
    }
}

#[cfg(all(test, debug_assertions))]
mod tests {
    use super::*;

    #[test]
    #[should_panic(expected = "OffloadQueue taken while Shard is held")]
    fn the_queue_under_a_shard_panics() {
        let (shard, queue) = (
            OrderedMutex::new(Lock::Shard, ()),
            OrderedMutex::new(Lock::OffloadQueue, ()),
        );
        let _s = shard.lock();
        let _q = queue.lock();
    }

    #[test]
    #[should_panic(expected = "Shard taken while Nodes is held")]
    fn a_shard_under_a_cluster_map_panics() {
        let (nodes, shard) = (
            OrderedRwLock::new(Lock::Nodes, ()),
            OrderedMutex::new(Lock::Shard, ()),
        );
        let _n = nodes.read();
        let _s = shard.lock();
    }

    #[test]
    #[should_panic(expected = "Segments taken while Nodes is held")]
    fn segments_under_nodes_panics() {
        let (nodes, segments) = (
            OrderedRwLock::new(Lock::Nodes, ()),
            OrderedRwLock::new(Lock::Segments, ()),
        );
        let _n = nodes.write();
        let _s = segments.read();
    }

    #[test]
    fn one_after_the_other_is_fine_and_nesting_of_one_kind_counts() {
        let (shard, queue) = (
            OrderedMutex::new(Lock::Shard, ()),
            OrderedMutex::new(Lock::OffloadQueue, ()),
        );
        drop(shard.lock());
        let q = queue.lock();
        drop(q);
        let (a, b) = (
            OrderedRwLock::new(Lock::Segments, ()),
            OrderedRwLock::new(Lock::Segments, ()),
        );
        {
            let _a = a.read();
            let _b = b.read();
        }
        // Both released: a shard may be taken again.
        let _s = shard.lock();
    }
}
