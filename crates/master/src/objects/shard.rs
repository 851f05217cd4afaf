//! One shard of the object table, laid out for millions of objects: the
//! master keeps every cached object's metadata in memory, so bytes per object
//! decide how large a cluster one master can hold.
//!
//! - Objects live in fixed-size chunks of slots (no doubling slack, no move
//!   of the whole table when it grows); freed slots are reused.
//! - Keys live in a byte arena (no allocation per key); removed keys leave
//!   garbage that is compacted once it outweighs the live keys.
//! - The index is a hash table of 4-byte slot numbers; it hashes the key
//!   bytes in the arena when it grows.

use super::Object;
use hashbrown::HashTable;
use std::hash::BuildHasher;

/// Slots per chunk: one chunk is about 384 KiB, allocated (and touched)
/// only as it fills.
const CHUNK_SLOTS: usize = 4096;
/// Bytes per key chunk; a key is at most `MAX_KEY_LEN` (4 KiB) long.
const KEY_CHUNK: usize = 64 * 1024;
/// Compaction waits for at least this much garbage, so that a small table
/// that churns does not rewrite its keys on every removal (less in tests,
/// so that short runs compact).
#[cfg(not(test))]
const MIN_GARBAGE: usize = 4 * KEY_CHUNK;
#[cfg(test)]
const MIN_GARBAGE: usize = KEY_CHUNK / 4;

/// Where a key's bytes are in the arena.
#[derive(Clone, Copy)]
struct KeyRef {
    chunk: u32,
    off: u16,
    len: u16,
}

#[derive(Default)]
struct KeyArena {
    chunks: Vec<Vec<u8>>,
    live: usize,
    garbage: usize,
}

impl KeyArena {
    fn push(&mut self, key: &[u8]) -> KeyRef {
        debug_assert!(key.len() <= KEY_CHUNK && key.len() <= u16::MAX as usize);
        let fits = self
            .chunks
            .last()
            .is_some_and(|c| KEY_CHUNK - c.len() >= key.len());
        if !fits {
            self.chunks.push(Vec::with_capacity(KEY_CHUNK));
        }
        let chunk = self.chunks.len() - 1;
        let buf = &mut self.chunks[chunk];
        let off = buf.len();
        buf.extend_from_slice(key);
        self.live += key.len();
        KeyRef {
            chunk: chunk as u32,
            off: off as u16,
            len: key.len() as u16,
        }
    }

    fn get(&self, r: KeyRef) -> &[u8] {
        let off = usize::from(r.off);
        &self.chunks[r.chunk as usize][off..off + usize::from(r.len)]
    }

    fn forget(&mut self, r: KeyRef) {
        self.live -= usize::from(r.len);
        self.garbage += usize::from(r.len);
    }

    fn wants_compaction(&self) -> bool {
        self.garbage >= MIN_GARBAGE && self.garbage > self.live
    }
}

struct Entry {
    key: KeyRef,
    obj: Object,
}

/// Objects by key. The API is the subset of `HashMap<String, Object>` the
/// master uses, so the layout can change without touching its callers.
pub struct Shard {
    index: HashTable<u32>,
    chunks: Vec<Vec<Option<Entry>>>,
    free: Vec<u32>,
    keys: KeyArena,
    hasher: std::collections::hash_map::RandomState,
    len: usize,
    /// Overwrites in progress (`PutStartRequest.overwrite`): the new version
    /// of a committed key, kept beside it until its PutEnd swaps it in.
    /// Few at a time, so a plain map; in the key's shard, so the swap is
    /// one critical section.
    overwrites: std::collections::HashMap<String, Object>,
}

impl Default for Shard {
    fn default() -> Self {
        Shard {
            index: HashTable::new(),
            chunks: Vec::new(),
            free: Vec::new(),
            keys: KeyArena::default(),
            // Each shard has its own hash keys: the table picks a shard by
            // hashing too, and a shared hasher would leave every key of a
            // shard with the same low bits.
            hasher: Default::default(),
            len: 0,
            overwrites: Default::default(),
        }
    }
}

fn split(slot: u32) -> (usize, usize) {
    (slot as usize / CHUNK_SLOTS, slot as usize % CHUNK_SLOTS)
}

impl Shard {
    fn slot(&self, slot: u32) -> Option<&Entry> {
        let (c, i) = split(slot);
        self.chunks.get(c)?.get(i)?.as_ref()
    }

    fn slot_mut(&mut self, slot: u32) -> Option<&mut Entry> {
        let (c, i) = split(slot);
        self.chunks.get_mut(c)?.get_mut(i)?.as_mut()
    }

    fn find(&self, key: &str) -> Option<u32> {
        let hash = self.hasher.hash_one(key.as_bytes());
        self.index
            .find(hash, |&s| {
                self.slot(s)
                    .is_some_and(|e| self.keys.get(e.key) == key.as_bytes())
            })
            .copied()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.find(key).is_some()
    }

    pub fn get(&self, key: &str) -> Option<&Object> {
        let s = self.find(key)?;
        self.slot(s).map(|e| &e.obj)
    }

    pub fn get_mut(&mut self, key: &str) -> Option<&mut Object> {
        let s = self.find(key)?;
        self.slot_mut(s).map(|e| &mut e.obj)
    }

    /// Inserts or replaces; returns the object it replaced.
    pub fn insert(&mut self, key: &str, obj: Object) -> Option<Object> {
        if let Some(e) = self.find(key).and_then(|s| self.slot_mut(s)) {
            return Some(std::mem::replace(&mut e.obj, obj));
        }
        let entry = Entry {
            key: self.keys.push(key.as_bytes()),
            obj,
        };
        let slot = match self.free.pop() {
            Some(s) => {
                let (c, i) = split(s);
                self.chunks[c][i] = Some(entry);
                s
            }
            None => {
                if self.chunks.last().is_none_or(|c| c.len() == CHUNK_SLOTS) {
                    self.chunks.push(Vec::with_capacity(CHUNK_SLOTS));
                }
                let c = self.chunks.len() - 1;
                let chunk = &mut self.chunks[c];
                chunk.push(Some(entry));
                (c * CHUNK_SLOTS + chunk.len() - 1) as u32
            }
        };
        let hash = self.hasher.hash_one(key.as_bytes());
        let Shard {
            index,
            chunks,
            keys,
            hasher,
            ..
        } = self;
        index.insert_unique(hash, slot, |&s| {
            let (c, i) = split(s);
            let k = chunks[c][i].as_ref().map_or(&[][..], |e| keys.get(e.key));
            hasher.hash_one(k)
        });
        self.len += 1;
        None
    }

    pub fn remove(&mut self, key: &str) -> Option<Object> {
        let hash = self.hasher.hash_one(key.as_bytes());
        let Shard {
            index,
            chunks,
            keys,
            ..
        } = self;
        let found = index.find_entry(hash, |&s| {
            let (c, i) = split(s);
            chunks[c][i]
                .as_ref()
                .is_some_and(|e| keys.get(e.key) == key.as_bytes())
        });
        let slot = found.ok()?.remove().0;
        let obj = self.vacate(slot);
        self.maybe_compact();
        obj
    }

    /// Empties a slot the index no longer points to.
    fn vacate(&mut self, slot: u32) -> Option<Object> {
        let (c, i) = split(slot);
        let e = self.chunks[c][i].take()?;
        self.keys.forget(e.key);
        self.free.push(slot);
        self.len -= 1;
        Some(e.obj)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Object)> {
        self.chunks.iter().flatten().flatten().map(|e| {
            // Keys enter the arena as `&str`, so this never falls back.
            let k = std::str::from_utf8(self.keys.get(e.key)).unwrap_or_default();
            (k, &e.obj)
        })
    }

    pub fn values(&self) -> impl Iterator<Item = &Object> {
        self.chunks.iter().flatten().flatten().map(|e| &e.obj)
    }

    /// Keeps the objects `keep` returns true for.
    pub fn retain(&mut self, mut keep: impl FnMut(&str, &mut Object) -> bool) {
        for slot in 0..self.chunks.iter().map(Vec::len).sum::<usize>() as u32 {
            let (c, i) = split(slot);
            let Some(e) = self.chunks[c][i].as_mut() else {
                continue;
            };
            let key = self.keys.get(e.key);
            if keep(std::str::from_utf8(key).unwrap_or_default(), &mut e.obj) {
                continue;
            }
            let hash = self.hasher.hash_one(key);
            if let Ok(found) = self.index.find_entry(hash, |&s| s == slot) {
                found.remove();
            }
            self.vacate(slot);
        }
        self.maybe_compact();
    }

    /// The overwrite of `key` in progress, if any.
    pub fn overwrite(&self, key: &str) -> Option<&Object> {
        self.overwrites.get(key)
    }

    /// Records the new version of `key` being written; the caller checked
    /// that none is in progress.
    pub fn insert_overwrite(&mut self, key: &str, obj: Object) {
        let old = self.overwrites.insert(key.to_string(), obj);
        debug_assert!(old.is_none(), "one overwrite of a key at a time");
    }

    /// Takes the overwrite of `key` out if `which` says it is the one.
    pub fn take_overwrite_if(
        &mut self,
        key: &str,
        which: impl FnOnce(&Object) -> bool,
    ) -> Option<Object> {
        if which(self.overwrites.get(key)?) {
            self.overwrites.remove(key)
        } else {
            None
        }
    }

    /// Keeps the overwrites in progress `keep` returns true for; returns
    /// the others.
    pub fn retain_overwrites(
        &mut self,
        mut keep: impl FnMut(&str, &mut Object) -> bool,
    ) -> Vec<(String, Object)> {
        let gone: Vec<String> = self
            .overwrites
            .iter_mut()
            .filter_map(|(k, o)| (!keep(k, o)).then(|| k.clone()))
            .collect();
        gone.into_iter()
            .filter_map(|k| self.overwrites.remove_entry(&k))
            .collect()
    }

    /// Overwrites in progress.
    pub fn overwrites_len(&self) -> usize {
        self.overwrites.len()
    }

    /// Rewrites the live keys into a fresh arena once garbage outweighs
    /// them: amortised O(1) per removal, and the arena stays within twice
    /// the live keys.
    fn maybe_compact(&mut self) {
        if !self.keys.wants_compaction() {
            return;
        }
        let mut fresh = KeyArena::default();
        for e in self.chunks.iter_mut().flatten().flatten() {
            e.key = fresh.push(self.keys.get(e.key));
        }
        self.keys = fresh;
    }

    #[cfg(test)]
    fn key_bytes(&self) -> (usize, usize) {
        (self.keys.live, self.keys.garbage)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn obj(size: u64) -> Object {
        Object::committed(size, size as u32, Vec::new(), Vec::new())
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u16, u64),
        Remove(u16),
        RetainOdd,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u16..600, 1u64..1000).prop_map(|(k, v)| Op::Insert(k, v)),
            3 => (0u16..600).prop_map(Op::Remove),
            1 => Just(Op::RetainOdd),
        ]
    }

    // Long keys make the arena fill chunks and compact within a short run.
    fn key(k: u16) -> String {
        format!("{k:05}-{}", "x".repeat(usize::from(k) * 5 % 3000))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// The shard behaves as a `HashMap<String, Object>` across inserts,
        /// replacements, removals, retains, slot reuse and arena compaction.
        #[test]
        fn shard_matches_a_hashmap(ops in proptest::collection::vec(op(), 1..400)) {
            let mut s = Shard::default();
            let mut model: HashMap<String, u64> = HashMap::new();
            for op in ops {
                match op {
                    Op::Insert(k, v) => {
                        let old = s.insert(&key(k), obj(v)).map(|o| o.size);
                        prop_assert_eq!(old, model.insert(key(k), v));
                    }
                    Op::Remove(k) => {
                        let old = s.remove(&key(k)).map(|o| o.size);
                        prop_assert_eq!(old, model.remove(&key(k)));
                    }
                    Op::RetainOdd => {
                        s.retain(|_, o| o.size % 2 == 1);
                        model.retain(|_, v| *v % 2 == 1);
                    }
                }
                prop_assert_eq!(s.len(), model.len());
            }
            for (k, v) in &model {
                prop_assert_eq!(s.get(k).map(|o| o.size), Some(*v));
            }
            let mut listed: Vec<(String, u64)> =
                s.iter().map(|(k, o)| (k.to_string(), o.size)).collect();
            listed.sort();
            let mut expected: Vec<(String, u64)> = model.into_iter().collect();
            expected.sort();
            prop_assert_eq!(listed, expected);
        }
    }

    #[test]
    fn removed_keys_are_compacted_and_slots_reused() {
        let mut s = Shard::default();
        let long = |i: usize| format!("{i:08}{}", "k".repeat(4000));
        for i in 0..200 {
            assert!(s.insert(&long(i), obj(i as u64)).is_none());
        }
        let slots = s.chunks[0].len();
        for i in 0..150 {
            assert_eq!(s.remove(&long(i)).map(|o| o.size), Some(i as u64));
        }
        let (live, garbage) = s.key_bytes();
        assert_eq!(live, 50 * 4008);
        assert!(
            garbage < MIN_GARBAGE.max(live) + 4008,
            "garbage {garbage} not compacted"
        );
        for i in 0..50 {
            s.insert(&format!("new{i}"), obj(1));
        }
        assert_eq!(s.chunks[0].len(), slots, "freed slots are reused");
        for i in 150..200 {
            assert_eq!(s.get(&long(i)).map(|o| o.size), Some(i as u64));
        }
        assert!(s.get(&long(3)).is_none());
    }
}
