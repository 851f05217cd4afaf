//! The offload task state machine, free of I/O so it can be model-tested.
//!
//! A task is `Queued` (waiting, unpinned) or `Assigned` (handed to an agent
//! with a deadline; its DRAM source is pinned). Every transition out of
//! `Assigned` returns the key to unpin, so pins balance by construction:
//! - report persisted → done (terminal);
//! - report failed → back to `Queued` with backoff, or dropped after
//!   `max_attempts` (terminal, counted with its reason);
//! - deadline passed without a report → back to `Queued` (expired);
//! - the agent re-registered (new epoch) → back to `Queued`.

use std::collections::{HashMap, VecDeque};
use strata_common::{Code, Error, Result};

/// Bucket bytes an object costs beyond its own size (table entry, share of
/// header), rounded up generously.
pub const OBJECT_OVERHEAD: u64 = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskState {
    Queued { not_before_ms: u64 },
    Assigned { deadline_ms: u64, epoch: u64 },
}

#[derive(Debug, Clone)]
pub struct Task {
    pub id: u64,
    pub key: String,
    pub owner: u64,
    pub size: u64,
    pub attempts: u32,
    pub state: TaskState,
    /// A writer waits for this copy: it was moved to the queue's front.
    pub urgent: bool,
    /// The (size, crc32c) of the version handed to the agent when it was
    /// last assigned: its copy belongs to that version only (the key may
    /// be overwritten, or removed and put again, meanwhile).
    pub source: Option<(u64, u32)>,
    /// That version's writer digest, if it has one: an overwrite to other
    /// bytes of the same size and crc32c (which anyone can make) is still
    /// another version.
    pub source_digest: Option<[u8; 32]>,
}

/// What a report did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Persisted,
    Requeued,
    Dropped(&'static str),
}

#[derive(Debug, Default, Clone, Copy)]
pub struct Counters {
    pub persisted: u64,
    pub failed: u64,
    pub expired: u64,
    pub dropped: u64,
}

#[derive(Debug)]
pub struct OffloadQueue {
    next_id: u64,
    tasks: HashMap<u64, Task>,
    queued: HashMap<u64, VecDeque<u64>>,
    /// Kept in step with `tasks` so the hot paths never scan it.
    assigned: usize,
    pending: HashMap<u64, u64>,
    /// Live task ids per key, so admission can skip keys already queued
    /// and a writer waiting for a victim can move its task up.
    keys: HashMap<String, Vec<u64>>,
    pub max_attempts: u32,
    pub backoff_base_ms: u64,
    pub counters: Counters,
}

impl OffloadQueue {
    pub fn new(max_attempts: u32, backoff_base_ms: u64) -> Self {
        OffloadQueue {
            next_id: 1,
            tasks: HashMap::new(),
            queued: HashMap::new(),
            assigned: 0,
            pending: HashMap::new(),
            keys: HashMap::new(),
            max_attempts: max_attempts.max(1),
            backoff_base_ms,
            counters: Counters::default(),
        }
    }

    pub fn enqueue(&mut self, key: &str, owner: u64, size: u64, now_ms: u64) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.tasks.insert(
            id,
            Task {
                id,
                key: key.to_string(),
                owner,
                size,
                attempts: 0,
                urgent: false,
                source: None,
                source_digest: None,
                state: TaskState::Queued {
                    not_before_ms: now_ms,
                },
            },
        );
        self.queued.entry(owner).or_default().push_back(id);
        *self.pending.entry(owner).or_default() += size + OBJECT_OVERHEAD;
        self.keys.entry(key.to_string()).or_default().push(id);
        id
    }

    /// With `urgent` (a writer waits for `key`'s copy), its queued tasks
    /// go to the front of their owner's queue, once (the entry left behind
    /// is skipped when reached, as every entry's state is checked). Returns
    /// None when `key` has no live task, else whether a task moved up now.
    pub fn make_urgent_if(&mut self, key: &str, urgent: bool) -> Option<bool> {
        let ids = self.keys.get(key)?;
        let mut moved = false;
        for id in ids {
            if let Some(t) = self.tasks.get_mut(id) {
                if urgent && !t.urgent && matches!(t.state, TaskState::Queued { .. }) {
                    t.urgent = true;
                    self.queued.entry(t.owner).or_default().push_front(*id);
                    moved = true;
                }
            }
        }
        Some(moved)
    }

    /// Whether `key` has a task queued or in flight.
    pub fn has_key(&self, key: &str) -> bool {
        self.keys.contains_key(key)
    }

    /// Removes a task for good, keeping the counters in step.
    fn forget(&mut self, id: u64) -> Option<Task> {
        let t = self.tasks.remove(&id)?;
        if matches!(t.state, TaskState::Assigned { .. }) {
            self.assigned -= 1;
        }
        if let Some(p) = self.pending.get_mut(&t.owner) {
            *p = p.saturating_sub(t.size + OBJECT_OVERHEAD);
        }
        if let Some(ids) = self.keys.get_mut(&t.key) {
            ids.retain(|&i| i != id);
            if ids.is_empty() {
                self.keys.remove(&t.key);
            }
        }
        Some(t)
    }

    /// Hands up to `n` due tasks of `owner` to the agent at `epoch`. The
    /// caller pins each returned task's source.
    pub fn take(
        &mut self,
        owner: u64,
        epoch: u64,
        n: usize,
        now_ms: u64,
        ttl_ms: u64,
    ) -> Vec<Task> {
        let mut out = Vec::new();
        let Some(q) = self.queued.get_mut(&owner) else {
            return out;
        };
        let mut later = VecDeque::new();
        while out.len() < n {
            let Some(id) = q.pop_front() else { break };
            let Some(t) = self.tasks.get_mut(&id) else {
                continue;
            };
            match t.state {
                TaskState::Queued { not_before_ms } if not_before_ms <= now_ms => {
                    t.urgent = false;
                    t.state = TaskState::Assigned {
                        deadline_ms: now_ms + ttl_ms,
                        epoch,
                    };
                    self.assigned += 1;
                    out.push(t.clone());
                }
                TaskState::Queued { .. } => later.push_back(id),
                TaskState::Assigned { .. } => {}
            }
        }
        // Tasks still backing off keep their place at the front.
        while let Some(id) = later.pop_back() {
            q.push_front(id);
        }
        out
    }

    fn requeue(&mut self, id: u64, not_before_ms: u64) {
        if let Some(t) = self.tasks.get_mut(&id) {
            if matches!(t.state, TaskState::Assigned { .. }) {
                self.assigned -= 1;
            }
            t.state = TaskState::Queued { not_before_ms };
            self.queued.entry(t.owner).or_default().push_back(id);
        }
    }

    /// Applies an agent's report. Errors (task unknown, not assigned to this
    /// owner and epoch) leave the queue unchanged. On success the task's
    /// source must be unpinned.
    pub fn report(
        &mut self,
        owner: u64,
        epoch: u64,
        id: u64,
        persisted: bool,
        now_ms: u64,
    ) -> Result<(Task, Outcome)> {
        self.report_with(owner, epoch, id, persisted, false, now_ms)
    }

    /// Like `report`; `final_failure` drops a failed task at once (the owner
    /// has no room, or the source fails its checksum: retrying cannot help).
    pub fn report_with(
        &mut self,
        owner: u64,
        epoch: u64,
        id: u64,
        persisted: bool,
        final_failure: bool,
        now_ms: u64,
    ) -> Result<(Task, Outcome)> {
        let t = self.tasks.get(&id).ok_or_else(|| {
            Error::not_found(format!(
                "offload task {id} is unknown (expired and reassigned, or done)"
            ))
        })?;
        match t.state {
            TaskState::Assigned { epoch: e, .. } if t.owner == owner && e == epoch => {}
            _ => {
                return Err(Error::new(
                    Code::Leased,
                    format!("offload task {id} is not assigned to owner {owner} epoch {epoch}"),
                ))
            }
        }
        let mut t = self.forget(id).expect("checked above");
        if persisted {
            self.counters.persisted += 1;
            return Ok((t, Outcome::Persisted));
        }
        self.counters.failed += 1;
        t.attempts += 1;
        if final_failure {
            self.counters.dropped += 1;
            return Ok((t, Outcome::Dropped("final_failure")));
        }
        if t.attempts >= self.max_attempts {
            self.counters.dropped += 1;
            return Ok((t, Outcome::Dropped("max_attempts")));
        }
        let backoff = self.backoff_base_ms.saturating_mul(1 << t.attempts.min(10));
        let task = t.clone();
        // Back in, counted as queued again.
        t.state = TaskState::Queued {
            not_before_ms: now_ms + backoff,
        };
        *self.pending.entry(t.owner).or_default() += t.size + OBJECT_OVERHEAD;
        self.keys.entry(t.key.clone()).or_default().push(id);
        self.queued.entry(t.owner).or_default().push_back(id);
        self.tasks.insert(id, t);
        Ok((task, Outcome::Requeued))
    }

    /// Assigned tasks matching `f` go back to the queue. Returns them (to unpin).
    fn requeue_assigned(&mut self, now_ms: u64, f: impl Fn(&Task, u64) -> bool) -> Vec<Task> {
        let out: Vec<Task> = self
            .tasks
            .values()
            .filter(
                |t| matches!(t.state, TaskState::Assigned { deadline_ms, .. } if f(t, deadline_ms)),
            )
            .cloned()
            .collect();
        for t in &out {
            self.requeue(t.id, now_ms);
        }
        out
    }

    /// Tasks whose deadline passed go back to the queue. Returns them (to unpin).
    pub fn expire(&mut self, now_ms: u64) -> Vec<Task> {
        let out = self.requeue_assigned(now_ms, |_, deadline| deadline <= now_ms);
        self.counters.expired += out.len() as u64;
        out
    }

    /// An owner registered again: its assigned tasks return to the queue.
    pub fn release_owner(&mut self, owner: u64, now_ms: u64) -> Vec<Task> {
        self.requeue_assigned(now_ms, |t, _| t.owner == owner)
    }

    /// Owners with tasks waiting in their queue.
    pub fn owners_with_queued(&self) -> Vec<u64> {
        self.queued
            .iter()
            .filter(|(_, q)| !q.is_empty())
            .map(|(o, _)| *o)
            .collect()
    }

    /// Tasks assigned to owners not in `live` go back to the queue (their
    /// owner was lost: cut off or dead, it will not finish them before their
    /// TTL, and their sources stay pinned until then). As with an expiry, a
    /// late report of one is refused. Returns them (to unpin).
    pub fn requeue_of_lost(
        &mut self,
        now_ms: u64,
        live: &std::collections::HashSet<u64>,
    ) -> Vec<Task> {
        self.requeue_assigned(now_ms, |t, _| !live.contains(&t.owner))
    }

    /// Removes every *queued* task of `owner` (it is gone: the caller places
    /// them elsewhere). Assigned ones are first put back in the queue by
    /// `requeue_of_lost` (or by their expiry), so they go here too.
    pub fn take_orphans(&mut self, owner: u64) -> Vec<Task> {
        let ids: Vec<u64> = self.queued.remove(&owner).unwrap_or_default().into();
        let mut out = Vec::new();
        for id in ids {
            match self.tasks.get(&id).map(|t| t.state) {
                Some(TaskState::Queued { .. }) => out.extend(self.forget(id)),
                // Assigned (taken before the owner went away): kept.
                Some(TaskState::Assigned { .. }) | None => {}
            }
        }
        out
    }

    /// Records which version an assigned task copies (`Task::source`).
    pub fn note_source(&mut self, id: u64, size: u64, crc32c: u32, digest: Option<[u8; 32]>) {
        if let Some(t) = self.tasks.get_mut(&id) {
            t.source = Some((size, crc32c));
            t.source_digest = digest;
        }
    }

    /// Drops a task outright (its source is gone). Returns it if it was
    /// assigned (its pin must be released).
    pub fn drop_task(&mut self, id: u64) -> Option<Task> {
        let t = self.forget(id)?;
        self.counters.dropped += 1;
        matches!(t.state, TaskState::Assigned { .. }).then_some(t)
    }

    /// (queued, assigned) task counts.
    pub fn counts(&self) -> (usize, usize) {
        (self.tasks.len() - self.assigned, self.assigned)
    }

    /// Bytes queued or in flight for `owner` (counted against its capacity,
    /// with each object's bucket overhead).
    pub fn pending_bytes(&self, owner: u64) -> u64 {
        self.pending.get(&owner).copied().unwrap_or(0)
    }

    pub fn tasks(&self) -> impl Iterator<Item = &Task> {
        self.tasks.values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[test]
    fn happy_path_and_retries() {
        let mut q = OffloadQueue::new(3, 100);
        let a = q.enqueue("a", 1, 10, 0);
        let t = q.take(1, 1, 10, 0, 1000);
        assert_eq!(t.len(), 1);
        assert_eq!(q.counts(), (0, 1));
        assert!(
            q.report(1, 2, a, true, 0).is_err(),
            "a newer epoch is refused"
        );
        assert!(
            q.report(1, 0, a, true, 0).is_err(),
            "an older (fenced) epoch is refused"
        );
        assert!(
            q.report(2, 1, a, true, 0).is_err(),
            "wrong owner is refused"
        );
        let (_, o) = q.report(1, 1, a, false, 0).unwrap();
        assert_eq!(o, Outcome::Requeued);
        assert!(q.take(1, 1, 10, 50, 1000).is_empty(), "backing off");
        assert_eq!(q.take(1, 1, 10, 200, 1000).len(), 1);
        q.report(1, 1, a, false, 200).unwrap();
        q.take(1, 1, 10, 10_000, 1000);
        let (_, o) = q.report(1, 1, a, false, 10_000).unwrap();
        assert_eq!(o, Outcome::Dropped("max_attempts"));
        assert_eq!(q.counts(), (0, 0));
    }

    #[test]
    fn an_urgent_task_is_taken_first_and_once() {
        let mut q = OffloadQueue::new(3, 100);
        let ids: Vec<u64> = (0..4)
            .map(|i| q.enqueue(&format!("k{i}"), 1, 10, 0))
            .collect();
        assert_eq!(q.make_urgent_if("absent", true), None);
        assert_eq!(q.make_urgent_if("k2", false), Some(false), "only asked");
        assert_eq!(q.make_urgent_if("k2", true), Some(true));
        assert_eq!(q.make_urgent_if("k2", true), Some(false), "moved up once");
        let t = q.take(1, 1, 1, 0, 1000);
        assert_eq!(t[0].id, ids[2], "the urgent task goes first");
        assert_eq!(q.make_urgent_if("k2", true), Some(false), "being copied");
        // The stale entry left in the queue is not handed out again.
        let rest: Vec<u64> = q.take(1, 1, 10, 0, 1000).iter().map(|t| t.id).collect();
        assert_eq!(rest, vec![ids[0], ids[1], ids[3]]);
        assert_eq!(q.counts(), (0, 4));
    }

    #[test]
    fn take_hands_out_at_most_n_and_only_due_tasks() {
        let mut q = OffloadQueue::new(3, 100);
        let a = q.enqueue("a", 1, 10, 0);
        for k in ["b", "c"] {
            q.enqueue(k, 1, 10, 0);
        }
        assert_eq!(q.take(1, 1, 2, 0, 1000).len(), 2);
        assert_eq!(q.counts(), (1, 2));
        // A failed first attempt backs off 100 * 2 ms: due at 200, not 199.
        q.report(1, 1, a, false, 0).unwrap();
        q.take(1, 1, 10, 0, 1000);
        assert!(q.take(1, 1, 10, 199, 1000).is_empty());
        assert_eq!(q.take(1, 1, 10, 200, 1000)[0].id, a);
    }

    /// Each outcome is counted once: persisted, failed (then dropped),
    /// dropped for a full owner, dropped with its source, expired.
    #[test]
    fn outcomes_are_counted_once_each() {
        let mut q = OffloadQueue::new(1, 100);
        let ids: Vec<u64> = ["a", "b", "c", "d", "e"]
            .iter()
            .map(|k| q.enqueue(k, 1, 10, 0))
            .collect();
        assert_eq!(q.take(1, 1, 10, 0, 1000).len(), 5);
        assert_eq!(
            q.report(1, 1, ids[0], true, 0).unwrap().1,
            Outcome::Persisted
        );
        let (_, o) = q.report(1, 1, ids[1], false, 0).unwrap();
        assert_eq!(o, Outcome::Dropped("max_attempts"));
        let (_, o) = q.report_with(1, 1, ids[2], false, true, 0).unwrap();
        assert_eq!(o, Outcome::Dropped("final_failure"));
        assert!(
            q.drop_task(ids[3]).is_some(),
            "assigned: its pin is released"
        );
        assert!(q.expire(999).is_empty(), "not yet due");
        assert_eq!(q.expire(1000)[0].id, ids[4]);
        let c = q.counters;
        assert_eq!((c.persisted, c.failed, c.dropped, c.expired), (1, 2, 3, 1));
    }

    /// An owner that registers again gets its assigned tasks back in the
    /// queue (returned, to unpin); other owners' stay assigned.
    #[test]
    fn release_owner_requeues_only_that_owners_assigned_tasks() {
        let mut q = OffloadQueue::new(3, 100);
        let a = q.enqueue("a", 1, 10, 0);
        let b = q.enqueue("b", 2, 10, 0);
        q.take(1, 1, 10, 0, 1000);
        q.take(2, 1, 10, 0, 1000);
        let back: Vec<u64> = q.release_owner(1, 5).iter().map(|t| t.id).collect();
        assert_eq!(back, vec![a]);
        assert_eq!(q.counts(), (1, 1));
        assert!(
            q.report(1, 1, a, true, 5).is_err(),
            "the old epoch's task is void"
        );
        assert_eq!(q.take(1, 2, 10, 5, 1000)[0].id, a);
        assert!(q.report(2, 1, b, true, 5).is_ok(), "owner 2 is untouched");
    }

    #[test]
    fn owners_with_queued_are_exactly_those_with_waiting_tasks() {
        let mut q = OffloadQueue::new(3, 100);
        q.enqueue("a", 2, 10, 0);
        q.enqueue("b", 3, 10, 0);
        let mut owners = q.owners_with_queued();
        owners.sort();
        assert_eq!(owners, vec![2, 3]);
        q.take(2, 1, 10, 0, 1000);
        assert_eq!(q.owners_with_queued(), vec![3]);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Enqueue(u8),
        Take(u8, u8),
        Report(usize, bool),
        Advance(u16),
        Restart(u8),
        DropSource(usize),
        OwnerGone(u8),
        Urgent(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..8).prop_map(Op::Enqueue),
            (0u8..3, 1u8..5).prop_map(|(o, n)| Op::Take(o, n)),
            (0usize..64, any::<bool>()).prop_map(|(i, ok)| Op::Report(i, ok)),
            (0u16..3000).prop_map(Op::Advance),
            (0u8..3).prop_map(Op::Restart),
            (0usize..64).prop_map(Op::DropSource),
            (0u8..3).prop_map(Op::OwnerGone),
            (0u8..8).prop_map(Op::Urgent),
        ]
    }

    proptest! {
        /// Random interleavings of batches, reports, timeouts and restarts:
        /// pins always equal assigned tasks, every task reaches exactly one
        /// terminal state once the system drains, and nothing is lost.
        #[test]
        fn model(ops in proptest::collection::vec(op(), 1..200)) {
            let mut q = OffloadQueue::new(3, 10);
            let mut now = 0u64;
            let mut epochs = [1u64; 3];
            let mut pins: HashMap<u64, i64> = HashMap::new();
            let mut terminal: HashMap<u64, &'static str> = HashMap::new();
            let mut created = Vec::new();
            let mut assigned: Vec<(u64, u64)> = Vec::new(); // (task, owner) as the agent saw them
            let ttl = 1000;
            let apply_report = |q: &mut OffloadQueue, pins: &mut HashMap<u64, i64>, terminal: &mut HashMap<u64, &'static str>, owner: u64, epoch: u64, id: u64, ok: bool, now: u64| {
                if let Ok((t, o)) = q.report(owner, epoch, id, ok, now) {
                    *pins.entry(t.id).or_default() -= 1;
                    match o {
                        Outcome::Persisted => { prop_assert!(terminal.insert(id, "persisted").is_none()); }
                        Outcome::Dropped(_) => { prop_assert!(terminal.insert(id, "dropped").is_none()); }
                        Outcome::Requeued => {}
                    }
                }
                Ok(())
            };
            for op in ops {
                match op {
                    Op::Enqueue(k) => created.push(q.enqueue(&format!("k{k}"), (k % 3) as u64, 1, now)),
                    Op::Take(o, n) => {
                        for t in q.take(o as u64, epochs[o as usize], n as usize, now, ttl) {
                            *pins.entry(t.id).or_default() += 1;
                            assigned.push((t.id, o as u64));
                        }
                    }
                    Op::Report(i, ok) if !assigned.is_empty() => {
                        let (id, owner) = assigned.swap_remove(i % assigned.len());
                        apply_report(&mut q, &mut pins, &mut terminal, owner, epochs[owner as usize], id, ok, now)?;
                    }
                    Op::Report(..) => {}
                    Op::Advance(ms) => {
                        now += ms as u64;
                        for t in q.expire(now) { *pins.entry(t.id).or_default() -= 1; }
                    }
                    Op::Restart(o) => {
                        epochs[o as usize] += 1;
                        for t in q.release_owner(o as u64, now) { *pins.entry(t.id).or_default() -= 1; }
                    }
                    Op::DropSource(i) if !created.is_empty() => {
                        let id = created[i % created.len()];
                        if q.tasks.contains_key(&id) {
                            if let Some(t) = q.drop_task(id) { *pins.entry(t.id).or_default() -= 1; }
                            prop_assert!(terminal.insert(id, "dropped").is_none());
                        }
                    }
                    Op::DropSource(_) => {}
                    Op::Urgent(k) => {
                        let key = format!("k{k}");
                        let live = q.has_key(&key);
                        prop_assert_eq!(q.make_urgent_if(&key, true).is_some(), live);
                    }
                    Op::OwnerGone(o) => {
                        for t in q.take_orphans(o as u64) {
                            prop_assert!(matches!(t.state, TaskState::Queued { .. }), "only queued tasks move");
                            prop_assert!(terminal.insert(t.id, "moved").is_none());
                        }
                    }
                }
                let (_, a) = q.counts();
                let scanned = q.tasks.values().filter(|t| matches!(t.state, TaskState::Assigned { .. })).count();
                prop_assert_eq!(a, scanned, "assigned counter drifted");
                for o in 0..3u64 {
                    let want: u64 = q.tasks.values().filter(|t| t.owner == o).map(|t| t.size + OBJECT_OVERHEAD).sum();
                    prop_assert_eq!(q.pending_bytes(o), want, "pending bytes drifted");
                }
                for t in q.tasks.values() {
                    prop_assert!(q.has_key(&t.key), "key index lost a live task");
                }
                let live: usize = q.keys.values().map(Vec::len).sum();
                prop_assert_eq!(live, q.tasks.len(), "key index drifted");
                let pinned: i64 = pins.values().sum();
                prop_assert_eq!(pinned, a as i64, "pins must equal assigned tasks");
                prop_assert!(pins.values().all(|&p| p == 0 || p == 1));
            }
            // Drain: agents keep taking and persisting until nothing is left.
            for _ in 0..100 {
                now += 100_000;
                for t in q.expire(now) { *pins.entry(t.id).or_default() -= 1; }
                for o in 0..3u64 {
                    for t in q.take(o, epochs[o as usize], 1000, now, ttl) {
                        *pins.entry(t.id).or_default() += 1;
                        apply_report(&mut q, &mut pins, &mut terminal, o, epochs[o as usize], t.id, true, now)?;
                    }
                }
                if q.counts() == (0, 0) { break; }
            }
            prop_assert_eq!(q.counts(), (0, 0));
            prop_assert!(q.keys.is_empty(), "key index kept a finished task");
            prop_assert!(pins.values().all(|&p| p == 0), "leaked pin");
            for id in created {
                prop_assert!(terminal.contains_key(&id), "task {} never ended", id);
            }
        }
    }
}
