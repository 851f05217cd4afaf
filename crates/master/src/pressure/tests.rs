//! Unit tests of `Pressure` through the master's API: eviction order and
//! puts that need room.

use crate::config::OffloadPolicy;
use crate::master::PutSpec;
use crate::offload::tests::{
    heartbeat, persist_all, persisted, queued_keys, report, report_results, with_owner, PROOF,
};
use crate::tests::{master_with, put, spec};
use std::sync::Arc;
use std::time::Duration;
use strata_common::Code;
use strata_proto as pb;

#[test]
fn leased_object_cannot_be_removed_or_evicted_until_lease_ends() {
    let m = master_with(1, 1 << 20, |c| c.lease_ttl = Duration::from_millis(300));
    put(&m, "k", 1000);
    m.get_replicas("k").unwrap();
    let e = m.remove("k", false).unwrap_err();
    assert_eq!(e.code, Code::Leased);
    assert!(e.message.contains("force"), "{e}");
    assert_eq!(m.evict(u64::MAX), 0, "leased object must not be evicted");
    std::thread::sleep(Duration::from_millis(350));
    assert!(m.evict(u64::MAX) > 0, "after the lease it can be evicted");
    assert!(!m.exists("k").unwrap());

    put(&m, "f", 1000);
    m.get_replicas("f").unwrap();
    m.remove("f", true).unwrap();
    assert_eq!(m.get_replicas("f").unwrap_err().code, Code::NotFound);
    assert_eq!(m.allocated_bytes(), 0);
}

/// A reader's end of its lease (`ReportReadsRequest.ended`).
fn ended(m: &crate::master::Master, key: &str, generation: u64) {
    m.report_reads(&pb::ReportReadsRequest {
        reads: Vec::new(),
        ended: vec![pb::LeaseEnd {
            key: key.into(),
            generation,
        }],
    })
    .unwrap();
}

/// The generation a lookup's lease end names (as the client does).
fn version(r: &pb::GetReplicasResponse) -> u64 {
    r.replicas
        .iter()
        .find(|r| r.kind == pb::ReplicaKind::Memory as i32)
        .map_or(0, |r| r.grant.as_ref().unwrap().generation)
}

fn lease_ends(m: &crate::master::Master, outcome: &str) -> u64 {
    m.metrics.lease_ends.with_label_values(&[outcome]).get()
}

/// Leases end with their reads: with two readers the object stays leased
/// until both said they are done, then it is evictable and removable at
/// once, long before the TTL. An end with nothing left to end changes
/// nothing.
#[test]
fn a_lease_ends_with_its_last_reader() {
    let m = master_with(1, 1 << 20, |c| c.lease_ttl = Duration::from_secs(60));
    put(&m, "k", 1000);
    let a = m.get_replicas("k").unwrap();
    let b = m.get_replicas("k").unwrap();
    assert_eq!(version(&a), version(&b));
    assert_ne!(version(&a), 0);
    ended(&m, "k", version(&a));
    assert_eq!(m.remove("k", false).unwrap_err().code, Code::Leased);
    assert_eq!(m.evict(u64::MAX), 0, "one reader still reads");
    ended(&m, "k", version(&b));
    assert_eq!(lease_ends(&m, "ended"), 2);
    assert!(m.evict(u64::MAX) > 0, "no reader left: evictable");
    assert!(!m.exists("k").unwrap());

    put(&m, "r", 1000);
    let r = m.get_replicas("r").unwrap();
    ended(&m, "r", version(&r));
    ended(&m, "r", version(&r)); // once too often
    assert_eq!(lease_ends(&m, "stale"), 1);
    m.remove("r", false).unwrap();
    assert_eq!(m.allocated_bytes(), 0);
}

/// A lease end names the version it read: one of a replaced version (which
/// it ends instead), or an SSD read's (generation 0) of an object in DRAM,
/// leaves the current version's lease alone.
#[test]
fn a_lease_end_of_another_version_is_left_alone() {
    let m = master_with(1, 1 << 20, |c| c.lease_ttl = Duration::from_secs(60));
    put(&m, "k", 1000);
    let old = version(&m.get_replicas("k").unwrap());
    let g = m
        .put_start(PutSpec {
            overwrite: true,
            ..spec("k", 2000, 1)
        })
        .unwrap()[0]
        .grant
        .as_ref()
        .unwrap()
        .generation;
    m.put_end_of("k", 0, &[], Some(g)).unwrap();
    let new = m.get_replicas("k").unwrap();
    assert_eq!((version(&new), new.size), (g, 2000));
    // The replaced version's end ends that version's lease (it is then
    // freed), not the current one's.
    ended(&m, "k", old);
    ended(&m, "k", 0);
    ended(&m, "absent", 7);
    assert_eq!((lease_ends(&m, "ended"), lease_ends(&m, "stale")), (1, 2));
    assert_eq!(m.free_retired(strata_common::time::unix_ms()), 1);
    assert_eq!(m.remove("k", false).unwrap_err().code, Code::Leased);
    ended(&m, "k", g);
    assert_eq!(lease_ends(&m, "ended"), 2);
    m.remove("k", false).unwrap();
}

/// A reader that died never ends its lease: the TTL does. Its count is
/// forgotten with the lease, so the next reader's end ends the next lease.
#[test]
fn a_dead_readers_lease_runs_its_ttl_and_is_forgotten() {
    let m = master_with(1, 1 << 20, |c| c.lease_ttl = Duration::from_millis(200));
    put(&m, "k", 1000);
    m.get_replicas("k").unwrap(); // its reader dies
    assert_eq!(m.remove("k", false).unwrap_err().code, Code::Leased);
    let t0 = std::time::Instant::now();
    while m.inspect("k").unwrap().lease_until_unix_ms > strata_common::time::unix_ms() {
        assert!(t0.elapsed() < Duration::from_secs(5), "the TTL ends it");
        std::thread::sleep(Duration::from_millis(10));
    }
    let r = m.get_replicas("k").unwrap();
    ended(&m, "k", version(&r));
    assert_eq!(lease_ends(&m, "ended"), 1);
    m.remove("k", false).unwrap();
}

/// Readers done with their reads leave eviction its LRU order: after 20
/// objects were read (and their leases ended), a full segment makes room
/// for new puts from the oldest objects, never from the newest put.
#[test]
fn after_reads_end_eviction_takes_the_oldest_never_the_fresh_puts() {
    let size = 16 * 1024;
    let m = master_with(1, 24 * size, |c| c.lease_ttl = Duration::from_secs(60));
    for i in 0..24 {
        put(&m, &format!("old{i}"), size);
    }
    std::thread::sleep(Duration::from_millis(2));
    for i in 0..20 {
        let r = m.get_replicas(&format!("old{i}")).unwrap();
        ended(&m, &format!("old{i}"), version(&r));
    }
    assert_eq!(lease_ends(&m, "ended"), 20);
    for i in 0..10 {
        std::thread::sleep(Duration::from_millis(2));
        put(&m, &format!("fresh{i}"), size);
    }
    for i in 0..10 {
        assert!(
            m.exists(&format!("fresh{i}")).unwrap(),
            "fresh{i} was evicted"
        );
    }
    let unread = (20..24).filter(|i| m.exists(&format!("old{i}")).unwrap());
    assert_eq!(unread.count(), 0, "the unread, older objects went first");
}

/// A put of two copies into a full tier gets both, on two nodes: eviction
/// makes room for the second instead of the put being acknowledged with
/// one (which a lost node would take).
#[test]
fn a_full_tier_makes_room_for_every_copy_asked_for() {
    let size = 16 * 1024;
    let m = master_with(2, 8 * size, |_| {});
    for i in 0..16 {
        put(&m, &format!("old{i}"), size);
    }
    assert_eq!(m.allocated_bytes(), 16 * size, "full");
    for i in 0..4 {
        let k = format!("two{i}");
        let r = m.put_start(spec(&k, size, 2)).unwrap();
        assert_eq!(r.len(), 2, "{k}");
        assert_ne!(r[0].node_id, r[1].node_id, "{k}");
        m.put_end(&k, 0).unwrap();
    }
    // Three copies asked of two nodes: two, the most there can be.
    let r = m.put_start(spec("three", size, 3)).unwrap();
    assert_eq!(r.len(), 2);
}

/// A put short of a copy evicts only objects on the nodes it still needs,
/// and only what that copy takes: with the other node full of what cannot
/// be evicted, it settles for one copy and the evictable objects beside
/// its first copy stay.
#[test]
fn a_put_short_of_a_copy_never_drains_the_node_it_has() {
    let size = 16 * 1024;
    let m = master_with(2, 8 * size, |_| {});
    let pinned = |k: &str, replicas, preferred| PutSpec {
        hard_pin: true,
        preferred_segment: preferred,
        ..spec(k, size, replicas)
    };
    let r = m.put_start(pinned("both", 2, None)).unwrap();
    m.put_end("both", 0).unwrap();
    let (a, b) = (r[0].segment_id, r[1].segment_id);
    for i in 0..7 {
        let k = format!("b-pinned{i}");
        let r = m.put_start(pinned(&k, 1, Some(b))).unwrap();
        assert_eq!(r[0].segment_id, b);
        m.put_end(&k, 0).unwrap();
    }
    for i in 0..3 {
        let k = format!("a-old{i}");
        let r = m
            .put_start(PutSpec {
                preferred_segment: Some(a),
                ..spec(&k, size, 1)
            })
            .unwrap();
        assert_eq!(r[0].segment_id, a);
        m.put_end(&k, 0).unwrap();
    }
    let r = m.put_start(spec("two", size, 2)).unwrap();
    assert_eq!(r.len(), 1, "the full node has nothing to give");
    assert_eq!(r[0].segment_id, a);
    for i in 0..3 {
        assert!(
            m.exists(&format!("a-old{i}")).unwrap(),
            "a-old{i} was evicted for nothing"
        );
    }
}

/// Copies go to distinct nodes, not merely distinct segments: two copies
/// in two segments of one node are one node loss from none.
#[test]
fn copies_go_to_distinct_nodes() {
    let m = master_with(1, 1 << 20, |_| {});
    m.register_node(pb::RegisterNodeRequest {
        node_id: "wide".into(),
        data_addr: "127.0.0.1:9100".into(),
        segments: (0..4)
            .map(|i| pb::SegmentSpec {
                local_id: i,
                size: 1 << 20,
                ..Default::default()
            })
            .collect(),
        instance: "w".into(),
        instance_proof: crate::tests::NODE_PROOF.to_vec(),
        ..Default::default()
    })
    .unwrap();
    for i in 0..20 {
        let r = m.put_start(spec(&format!("k{i}"), 1000, 2)).unwrap();
        assert_eq!(r.len(), 2);
        assert_ne!(r[0].node_id, r[1].node_id, "k{i}: {r:?}");
    }
}

#[test]
fn eviction_prefers_old_unpinned_then_soft_pinned_never_hard_pinned() {
    let m = master_with(1, 64 * 1024, |_| {});
    let s = |k: &str, soft, hard| PutSpec {
        soft_pin: soft,
        hard_pin: hard,
        ..spec(k, 16 * 1024, 1)
    };
    for (k, soft, hard) in [
        ("hard", false, true),
        ("soft", true, false),
        ("old", false, false),
    ] {
        m.put_start(s(k, soft, hard)).unwrap();
        m.put_end(k, 0).unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
    put(&m, "new", 16 * 1024);
    // Full: the next put must evict exactly the oldest unpinned object.
    m.put_start(spec("next", 16 * 1024, 1)).unwrap();
    m.put_end("next", 0).unwrap();
    assert!(!m.exists("old").unwrap());
    assert!(m.exists("soft").unwrap() && m.exists("hard").unwrap());
    // Then the other unpinned ones, then the soft-pinned, never the hard.
    assert!(m.evict(u64::MAX) > 0);
    assert!(m.exists("hard").unwrap());
    assert_eq!(
        m.allocated_bytes(),
        16 * 1024,
        "only the hard-pinned object is left"
    );
    assert!(!m.exists("soft").unwrap());
}

#[test]
fn filling_far_past_capacity_succeeds_via_eviction_or_fails_no_space() {
    let m = master_with(2, 1 << 20, |c| c.lease_ttl = Duration::from_secs(60));
    let mut ok = 0;
    for i in 0..500u64 {
        let key = format!("k{i}");
        match m.put_start(spec(&key, 10_000 + (i * 7919) % 50_000, 2)) {
            Ok(r) => {
                assert!(!r.is_empty());
                m.put_end(&key, 0).unwrap();
                ok += 1;
                // Every 10th object gets leased so eviction has to skip it.
                if i % 10 == 0 {
                    m.get_replicas(&key).unwrap();
                }
            }
            Err(e) => assert_eq!(e.code, Code::NoSpace, "{e}"),
        }
        assert!(m.allocated_bytes() <= m.capacity_bytes());
    }
    assert!(
        ok > 100,
        "eviction should keep puts going, only {ok} succeeded"
    );
    assert!(m.metrics.evictions.get() > 0);
}

#[test]
fn eviction_scans_past_its_batch_and_goes_oldest_first() {
    let m = master_with(1, 64 << 20, |_| {});
    for i in 0..10_000 {
        put(&m, &format!("k{i:05}"), 64);
    }
    // Make k00000..k00099 the most recently used.
    for i in 0..100 {
        let key = format!("k{i:05}");
        m.objects()
            .shard(&key)
            .get_mut(&key)
            .unwrap()
            .last_access_ms = u64::MAX / 2;
    }
    let freed = m.evict(9_900 * 64);
    assert_eq!(freed, 9_900 * 64);
    assert_eq!(m.objects().len(), 100);
    assert!((0..100).all(|i| m.exists(&format!("k{i:05}")).unwrap()));
    assert_eq!(m.evict(u64::MAX), 100 * 64);
    assert_eq!(m.metrics.evictions.get(), 10_000);
}

#[tokio::test]
async fn a_put_that_needs_room_queues_its_victims_first_and_drops_none() {
    for policy in [OffloadPolicy::OnEvict, OffloadPolicy::Eager] {
        let (m, owner, epoch) = with_owner(policy, 1 << 20, 0.99).await;
        for i in 0..16 {
            put(&m, &format!("k{i:02}"), 64 << 10);
        }
        // Full, and no victim has its SSD copy yet: a put that cannot wait
        // gets a retryable no_space naming the flag; nothing is dropped.
        let e = m
            .put_start(crate::tests::spec("new", 64 << 10, 1))
            .unwrap_err();
        assert_eq!(e.code, strata_common::Code::NoSpace, "{policy:?}");
        assert!(e.retryable() && e.message.contains("--put-wait"), "{e}");
        assert!(!queued_keys(&m).is_empty());
        // A waiting put gets its room as soon as the copies land.
        let waiting = {
            let m = m.clone();
            tokio::spawn(async move {
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
                m.put_start_waiting(crate::tests::spec("new", 64 << 10, 1), deadline)
                    .await
            })
        };
        assert!(
            crate::tests::wait_for(|| m.pressure().waiting() == 1).await,
            "the put waits"
        );
        assert!(m.metrics.urgent_offloads.get() >= 1, "{policy:?}");
        persist_all(&m, owner, epoch).await;
        waiting.await.unwrap().unwrap();
        assert_eq!(m.metrics.put_waits.get(), 1);
        for i in 0..16 {
            assert!(
                m.exists(&format!("k{i:02}")).unwrap(),
                "{policy:?}: k{i:02} kept"
            );
        }
        let dropped = &m.metrics.dropped_objects;
        for why in ["policy", "admission", "no_owner", "offload_failed"] {
            assert_eq!(dropped.with_label_values(&[why]).get(), 0, "{why}");
        }
    }
}

#[tokio::test]
async fn a_put_whose_wait_runs_out_fails_retryably_and_leaks_nothing() {
    let (m, _, _) = with_owner(OffloadPolicy::Eager, 1 << 20, 0.99).await;
    for i in 0..16 {
        put(&m, &format!("k{i:02}"), 64 << 10);
    }
    let allocated = m.allocated_bytes();
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(100);
    let e = m
        .put_start_waiting(crate::tests::spec("new", 64 << 10, 1), deadline)
        .await
        .unwrap_err();
    assert_eq!(e.code, strata_common::Code::NoSpace);
    assert!(e.retryable() && e.message.contains("--put-wait"), "{e}");
    assert_eq!(m.metrics.put_wait_timeouts.get(), 1);
    assert_eq!(m.pressure().waiting(), 0);
    assert_eq!(m.metrics.put_waiters.get(), 0);
    assert_eq!(m.allocated_bytes(), allocated, "no allocation left behind");
    assert!(!m.exists("new").unwrap());
    assert_eq!(m.total_pins(), 0);
    // A put dropped while waiting (its caller went away) leaks nothing either.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let spec = crate::tests::spec("gone", 64 << 10, 1);
    let fut = m.put_start_waiting(spec, deadline);
    assert!(
        tokio::time::timeout(std::time::Duration::from_millis(50), fut)
            .await
            .is_err()
    );
    assert_eq!(m.pressure().waiting(), 0);
    assert_eq!(m.allocated_bytes(), allocated);
}

#[tokio::test]
async fn waiting_puts_get_their_room_in_arrival_order() {
    let (m, owner, epoch) = with_owner(OffloadPolicy::Eager, 1 << 20, 0.99).await;
    for i in 0..16 {
        put(&m, &format!("k{i:02}"), 64 << 10);
    }
    let order = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..3 {
        let (m2, order) = (m.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            // The first needs two victims' room: the later ones, which
            // would fit sooner, must not overtake it.
            let (key, size) = (format!("w{i}"), if i == 0 { 128 << 10 } else { 64 << 10 });
            m2.put_start_waiting(crate::tests::spec(&key, size, 1), deadline)
                .await
                .unwrap();
            order.lock().push(i);
        }));
        // Each joins the queue before the next arrives.
        assert!(crate::tests::wait_for(|| m.pressure().waiting() == i + 1).await);
    }
    // Copies land one at a time (bounded: 16 victims, at most 2,000 rounds).
    for _ in 0..2000 {
        if order.lock().len() == 3 {
            break;
        }
        if let Some(t) = heartbeat(&m, owner, epoch, 1).tasks.first() {
            report(&m, owner, epoch, t.task_id, t.task_id * 4096).await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(*order.lock(), vec![0, 1, 2]);
}

/// An idle owner's heartbeat waits (long poll) and answers at once when a
/// put makes a victim's copy urgent; with nothing urgent it answers at its
/// deadline, empty.
#[tokio::test]
async fn a_long_polling_owner_gets_urgent_copies_at_once() {
    let (m, owner, epoch) = with_owner(OffloadPolicy::OnEvict, 1 << 20, 0.99).await;
    let poll = |wait_ms: u32| {
        let m = m.clone();
        tokio::spawn(async move {
            let t0 = std::time::Instant::now();
            let r = m
                .owner_heartbeat_wait(&pb::OwnerHeartbeatRequest {
                    instance_proof: PROOF.to_vec(),
                    owner_id: owner,
                    epoch,
                    capacity_bytes: 1 << 30,
                    max_tasks: 100,
                    wait_ms,
                    ..Default::default()
                })
                .await
                .unwrap();
            (r, t0.elapsed())
        })
    };
    // Nothing to do: an empty answer once its (short) wait is over.
    let (r, _) = poll(20).await.unwrap();
    assert!(r.tasks.is_empty());
    for i in 0..16 {
        put(&m, &format!("k{i:02}"), 64 << 10);
    }
    // A poll of up to 1 s is waiting when a put needs a victim's room.
    let waiting = poll(1000);
    let put = {
        let m = m.clone();
        tokio::spawn(async move {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            m.put_start_waiting(crate::tests::spec("new", 64 << 10, 1), deadline)
                .await
        })
    };
    let (r, took) = waiting.await.unwrap();
    assert!(!r.tasks.is_empty(), "the urgent copy is handed out");
    assert!(
        took < std::time::Duration::from_millis(1000),
        "before its deadline: {took:?}"
    );
    report_results(&m, owner, epoch, persisted(&r.tasks)).await;
    put.await.unwrap().unwrap();
}

/// At shutdown a waiting put answers at once, retryably, and leaks nothing.
#[tokio::test]
async fn a_waiting_put_answers_at_shutdown() {
    let (m, _, _) = with_owner(OffloadPolicy::Eager, 1 << 20, 0.99).await;
    for i in 0..16 {
        put(&m, &format!("k{i:02}"), 64 << 10);
    }
    let allocated = m.allocated_bytes();
    let waiting = {
        let m = m.clone();
        tokio::spawn(async move {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            m.put_start_waiting(crate::tests::spec("new", 64 << 10, 1), deadline)
                .await
        })
    };
    assert!(crate::tests::wait_for(|| m.pressure().waiting() == 1).await);
    m.stop_waiting();
    let e = waiting.await.unwrap().unwrap_err();
    assert_eq!(e.code, strata_common::Code::Unavailable, "{e}");
    assert!(e.retryable());
    assert_eq!(m.pressure().waiting(), 0);
    assert_eq!(m.allocated_bytes(), allocated);
}

/// Many replaced versions at once, each still read: each reader's end
/// frees exactly its own version (found by key, not by scanning them all),
/// the DRAM they hold is counted as they come and go, and the rest go when
/// their leases run out.
#[test]
fn replaced_versions_are_freed_one_by_one_as_their_readers_end() {
    let m = master_with(1, 1 << 24, |c| c.lease_ttl = Duration::from_secs(60));
    let n = 50;
    let mut old = Vec::new();
    for i in 0..n {
        let k = format!("k{i}");
        put(&m, &k, 1000);
        old.push(version(&m.get_replicas(&k).unwrap()));
        let g = m
            .put_start(PutSpec {
                overwrite: true,
                ..spec(&k, 1000, 1)
            })
            .unwrap()[0]
            .grant
            .as_ref()
            .unwrap()
            .generation;
        m.put_end_of(&k, 0, &[], Some(g)).unwrap();
    }
    let each = m.metrics.retired_bytes.get() as u64 / n as u64;
    assert!(each >= 1000, "{each} bytes per replaced version");
    let now = strata_common::time::unix_ms;
    assert_eq!(m.free_retired(now()), 0, "all still read");
    for (i, g) in old.iter().enumerate().take(10) {
        ended(&m, &format!("k{i}"), *g);
    }
    // Read after the ends: each made its version due at its own now.
    assert_eq!(m.free_retired(now()), 10);
    assert_eq!(m.metrics.retired_bytes.get() as u64, each * (n as u64 - 10));
    // An end of a version already freed, or of the current one, frees
    // nothing more.
    ended(&m, "k0", old[0]);
    assert_eq!(m.free_retired(now()), 0);
    assert_eq!(
        m.free_retired(now() + 61_000),
        n - 10,
        "the TTL frees the rest"
    );
    assert_eq!(m.metrics.retired_bytes.get(), 0);
    for i in 0..n {
        assert_eq!(m.get_replicas(&format!("k{i}")).unwrap().size, 1000);
    }
}
