//! Unit tests of the metadata logic against fake node registrations (the
//! master never talks to nodes, so no sockets are needed here; the same
//! behaviours run end to end in `tests/`).

use crate::config::MasterConfig;
use crate::master::{Master, PutSpec};
use futures::FutureExt;
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_common::Code;
use strata_proto as pb;

/// The instance proof the fake nodes of these tests register with.
pub(crate) const NODE_PROOF: &[u8] = &[9u8; 32];

pub(crate) fn master_with(
    nodes: usize,
    seg: u64,
    f: impl FnOnce(&mut MasterConfig),
) -> Arc<Master> {
    let mut cfg = MasterConfig::local();
    f(&mut cfg);
    let m = Master::new(cfg).unwrap();
    for i in 0..nodes {
        m.register_node(pb::RegisterNodeRequest {
            node_id: format!("n{i}"),
            data_addr: format!("127.0.0.1:{}", 9000 + i),
            segments: vec![pb::SegmentSpec {
                local_id: 0,
                size: seg,
                ..Default::default()
            }],
            instance: format!("i{i}"),
            instance_proof: NODE_PROOF.to_vec(),
            held_objects: 0,
            ..Default::default()
        })
        .unwrap();
    }
    m
}

pub(crate) fn spec(key: &str, size: u64, replicas: u32) -> PutSpec {
    PutSpec {
        key: key.into(),
        size,
        replica_num: replicas,
        ..Default::default()
    }
}

/// Waits (bounded, 5 s) for `f` to hold, letting other tasks run.
pub(crate) async fn wait_for(mut f: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(5) {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    f()
}

pub(crate) fn put(m: &Master, key: &str, size: u64) {
    m.put_start(spec(key, size, 1)).unwrap();
    m.put_end(key, 0).unwrap();
}

#[test]
fn more_replicas_than_segments_gives_fewer_never_two_on_one_segment() {
    let m = master_with(3, 1 << 20, |_| {});
    let r = m.put_start(spec("k", 1000, 5)).unwrap();
    assert_eq!(r.len(), 3);
    let mut segs: Vec<u64> = r.iter().map(|r| r.segment_id).collect();
    segs.sort();
    segs.dedup();
    assert_eq!(segs.len(), 3, "replicas must be on distinct segments");
}

#[test]
fn invalid_put_start_arguments() {
    let m = master_with(1, 1 << 20, |_| {});
    for (s, why) in [
        (spec("k", 0, 1), "size"),
        (spec("k", 10, 0), "replica_num"),
        (spec("", 10, 1), "key"),
        (spec("k", 10, 99), "replica_num"),
    ] {
        let e = m.put_start(s).unwrap_err();
        assert_eq!(e.code, Code::InvalidArgument);
        assert!(e.message.contains(why), "{e}");
    }
    let e = m.put_start(spec("k", 2 << 20, 1)).unwrap_err();
    assert_eq!(e.code, Code::NoSpace);
    assert!(e.message.contains("larger than the largest segment"), "{e}");
}

#[test]
fn get_before_put_end_is_not_ready_and_second_put_refused() {
    let m = master_with(1, 1 << 20, |_| {});
    m.put_start(spec("k", 100, 1)).unwrap();
    let e = m.get_replicas("k").unwrap_err();
    assert_eq!(e.code, Code::NotReady);
    assert!(e.retryable());
    assert!(!m.exists("k").unwrap());
    let e = m.put_start(spec("k", 100, 1)).unwrap_err();
    assert_eq!(e.code, Code::AlreadyExists);
    m.put_end("k", 7).unwrap();
    let g = m.get_replicas("k").unwrap();
    assert_eq!((g.size, g.crc32c), (100, 7));
    assert!(m.exists("k").unwrap());
    // Lookups by tier (the dashboard's hit rates); a put in progress counts
    // as none.
    let lookups = |t: &str| m.metrics.lookups.with_label_values(&[t]).get();
    assert_eq!(
        (lookups("dram"), lookups("ssd"), lookups("miss")),
        (1, 0, 0)
    );
    assert_eq!(m.get_replicas("nope").unwrap_err().code, Code::NotFound);
    assert_eq!(lookups("miss"), 1);
    // A PutEnd of what is committed: the same bytes answer as done (a put
    // a restarted master adopted before its PutEnd came), others are refused.
    m.put_end("k", 7).unwrap();
    assert_eq!(m.put_end("k", 8).unwrap_err().code, Code::AlreadyExists);
    assert_eq!(m.get_replicas("k").unwrap().crc32c, 7);
}

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

#[test]
fn remove_all_skips_leased_and_in_flight() {
    let m = master_with(2, 1 << 20, |c| c.lease_ttl = Duration::from_secs(60));
    for i in 0..10 {
        put(&m, &format!("k{i}"), 100);
    }
    m.get_replicas("k3").unwrap();
    m.get_replicas("k7").unwrap();
    m.put_start(spec("writing", 100, 1)).unwrap();
    let (removed, skipped) = m.remove_all(false);
    assert_eq!((removed, skipped), (8, 3));
    assert!(m.exists("k3").unwrap() && m.exists("k7").unwrap());
    let (removed, skipped) = m.remove_all(true);
    assert_eq!((removed, skipped), (2, 1));
}

#[test]
fn abandoned_put_is_reclaimed_and_space_freed() {
    let m = master_with(1, 1 << 20, |c| c.put_timeout = Duration::from_millis(50));
    m.put_start(spec("k", 4096, 1)).unwrap();
    assert_eq!(m.allocated_bytes(), 4096);
    assert_eq!(m.reclaim_expired_puts(Instant::now()), 0);
    assert_eq!(
        m.reclaim_expired_puts(Instant::now() + Duration::from_millis(60)),
        1
    );
    assert_eq!(m.allocated_bytes(), 0);
    assert_eq!(m.put_end("k", 0).unwrap_err().code, Code::NotFound);
    // A new put of the same key is not reclaimed by the old deadline.
    m.put_start(spec("k", 4096, 1)).unwrap();
    m.put_end("k", 0).unwrap();
    assert_eq!(
        m.reclaim_expired_puts(Instant::now() + Duration::from_secs(1)),
        0
    );
    assert!(m.exists("k").unwrap());
    assert_eq!(m.metrics.reclaimed_puts.get(), 1);
}

#[test]
fn revoke_frees_space() {
    let m = master_with(1, 1 << 20, |_| {});
    m.put_start(spec("k", 4096, 1)).unwrap();
    m.put_revoke("k").unwrap();
    assert_eq!(m.allocated_bytes(), 0);
    assert_eq!(m.put_revoke("k").unwrap_err().code, Code::NotFound);
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
fn expired_node_loses_its_replicas() {
    let m = master_with(2, 1 << 20, |c| c.node_ttl = Duration::from_millis(100));
    m.put_start(spec("both", 100, 2)).unwrap();
    m.put_end("both", 0).unwrap();
    let r = m.put_start(spec("one", 100, 1)).unwrap();
    m.put_end("one", 0).unwrap();
    let dead = r[0].node_id.clone();
    let alive = if dead == "n0" { "n1" } else { "n0" };
    let inc = m.cluster().node(alive).unwrap().incarnation;
    let now = strata_common::time::unix_ms();
    let hb = |node: &str, inc| pb::HeartbeatRequest {
        node_id: node.into(),
        incarnation: inc,
        applied_seq: 0,
        instance_proof: NODE_PROOF.to_vec(),
        wait_ms: 0,
        leaving: false,
    };
    assert!(m.heartbeat(&hb(alive, inc)).unwrap().known);
    m.cluster()
        .node(alive)
        .unwrap()
        .last_heartbeat_ms
        .store(now + 1000, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(m.expire_nodes(now + 500), vec![dead.clone()]);
    assert_eq!(m.get_replicas("one").unwrap_err().code, Code::NotFound);
    assert_eq!(m.get_replicas("both").unwrap().replicas.len(), 1);
    assert!(
        !m.heartbeat(&hb(&dead, 1)).unwrap().known,
        "a dropped node must re-register"
    );
    assert_eq!(m.stat().segments, 1);
}

#[test]
fn committed_size_counts_only_committed_objects() {
    let m = master_with(1, 1 << 20, |_| {});
    put(&m, "done", 300);
    m.put_start(spec("writing", 200, 1)).unwrap();
    assert_eq!(m.committed_size("done").unwrap(), Some(300));
    // A put in progress is not there yet, and neither is an unknown key.
    assert_eq!(m.committed_size("writing").unwrap(), None);
    assert_eq!(m.committed_size("never").unwrap(), None);
    m.put_end("writing", 0).unwrap();
    assert_eq!(m.committed_size("writing").unwrap(), Some(200));
    m.remove("done", true).unwrap();
    assert_eq!(m.committed_size("done").unwrap(), None);
    assert_eq!(
        m.committed_size("").unwrap_err().code,
        Code::InvalidArgument
    );
}

#[test]
fn a_leaving_node_is_dropped_at_once() {
    let m = master_with(2, 1 << 20, |_| {});
    m.put_start(spec("both", 100, 2)).unwrap();
    m.put_end("both", 0).unwrap();
    let r = m.put_start(spec("one", 100, 1)).unwrap();
    m.put_end("one", 0).unwrap();
    let leaving = r[0].node_id.clone();
    let inc = m.cluster().node(&leaving).unwrap().incarnation;
    let hb = |proof: &[u8], leaving_flag| pb::HeartbeatRequest {
        node_id: leaving.clone(),
        incarnation: inc,
        applied_seq: 0,
        instance_proof: proof.to_vec(),
        wait_ms: 0,
        leaving: leaving_flag,
    };
    // Another process's claim that the node leaves changes nothing.
    let e = m.heartbeat(&hb(&[1u8; 32], true)).unwrap_err();
    assert_eq!(e.code, Code::PermissionDenied, "{e}");
    assert!(m.heartbeat(&hb(NODE_PROOF, false)).unwrap().known);
    assert_eq!(m.stat().segments, 2);
    // The node's own: dropped now, not after --node-ttl.
    assert!(!m.heartbeat(&hb(NODE_PROOF, true)).unwrap().known);
    assert_eq!(m.stat().segments, 1);
    assert_eq!(m.get_replicas("one").unwrap_err().code, Code::NotFound);
    assert_eq!(m.get_replicas("both").unwrap().replicas.len(), 1);
    // Housekeeping hands it on to be forgotten durably, once.
    let now = strata_common::time::unix_ms();
    assert_eq!(m.expire_nodes(now), vec![leaving.clone()]);
    assert!(m.expire_nodes(now).is_empty());
}

#[test]
fn nodes_learn_commits_and_frees_through_heartbeats() {
    let m = master_with(1, 1 << 20, |_| {});
    put(&m, "a", 100);
    put(&m, "b", 100);
    m.remove("a", true).unwrap();
    let inc = m.cluster().node("n0").unwrap().incarnation;
    let r = m
        .heartbeat(&pb::HeartbeatRequest {
            node_id: "n0".into(),
            incarnation: inc,
            applied_seq: 0,
            instance_proof: NODE_PROOF.to_vec(),
            wait_ms: 0,
            leaving: false,
        })
        .unwrap();
    let ops: Vec<String> = r
        .log
        .iter()
        .map(|e| match e.op.as_ref().unwrap() {
            pb::object_log_entry::Op::Commit(c) => format!("commit {}", c.key),
            pb::object_log_entry::Op::Free(_) => "free".to_string(),
            pb::object_log_entry::Op::Pending(p) => format!("pending {}", p.key),
        })
        .collect();
    assert_eq!(ops, ["commit a", "commit b", "free"]);
    let last = r.log.last().unwrap().seq;
    let hb = |applied_seq, proof: &[u8]| {
        m.heartbeat(&pb::HeartbeatRequest {
            node_id: "n0".into(),
            incarnation: inc,
            applied_seq,
            instance_proof: proof.to_vec(),
            wait_ms: 0,
            leaving: false,
        })
    };
    // Both sides of each check: another process's proof and a claim beyond
    // what was sent are refused and trim nothing; the real one trims.
    let e = hb(last, &[1u8; 32]).unwrap_err();
    assert_eq!(e.code, Code::PermissionDenied, "{e}");
    let e = hb(last + 1, NODE_PROOF).unwrap_err();
    assert_eq!(e.code, Code::InvalidArgument, "{e}");
    let e = hb(u64::MAX, NODE_PROOF).unwrap_err();
    assert_eq!(e.code, Code::InvalidArgument, "{e}");
    assert_eq!(hb(0, NODE_PROOF).unwrap().log.len(), 3, "nothing trimmed");
    let r = hb(last, NODE_PROOF).unwrap();
    assert!(r.log.is_empty(), "acknowledged entries are trimmed");
}

#[test]
fn allocations_get_increasing_generations_in_their_grants() {
    let m = master_with(1, 1 << 20, |_| {});
    let a = m.put_start(spec("a", 100, 1)).unwrap();
    m.put_revoke("a").unwrap();
    // The same range again: a newer generation, so the node can tell the
    // revoked put's grant from the new one.
    let b = m.put_start(spec("b", 100, 1)).unwrap();
    assert_eq!(
        (a[0].segment_id, a[0].offset),
        (b[0].segment_id, b[0].offset)
    );
    let (ga, gb) = (
        a[0].grant.as_ref().unwrap().generation,
        b[0].grant.as_ref().unwrap().generation,
    );
    assert!(gb > ga && ga > 0, "{ga} then {gb}");
    m.put_end("b", 0).unwrap();
    let r = m.get_replicas("b").unwrap();
    assert_eq!(r.replicas[0].grant.as_ref().unwrap().generation, gb);
}

#[test]
fn preferred_segment_is_used_when_it_fits() {
    let m = master_with(4, 1 << 20, |_| {});
    for target in 1..=4 {
        let r = m
            .put_start(PutSpec {
                preferred_segment: Some(target),
                ..spec(&format!("k{target}"), 10, 1)
            })
            .unwrap();
        assert_eq!(r[0].segment_id, target);
    }
}

#[test]
fn most_free_first_spreads_evenly() {
    let m = master_with(4, 1 << 20, |c| {
        c.alloc_strategy = crate::config::AllocStrategy::MostFreeFirst
    });
    for i in 0..40 {
        m.put_start(spec(&format!("k{i}"), 1024, 1)).unwrap();
    }
    let st = m.stat();
    for s in &st.segment_info {
        assert_eq!(s.allocated_bytes, 10 * 1024, "segment {}", s.segment_id);
    }
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

/// A member's grant key is derived for its id *and* the registering process:
/// the same process registering again keeps its key; another process that
/// registers the same id never receives it.
#[test]
fn member_keys_are_per_process() {
    let m = master_with(0, 1 << 20, |_| {});
    let reg = |proof: &[u8]| {
        m.register_node(pb::RegisterNodeRequest {
            node_id: "x".into(),
            data_addr: "127.0.0.1:9999".into(),
            segments: vec![pb::SegmentSpec {
                local_id: 0,
                size: 1 << 20,
                ..Default::default()
            }],
            instance: "i".into(),
            instance_proof: proof.to_vec(),
            held_objects: 0,
            ..Default::default()
        })
        .unwrap()
        .grant_key
    };
    let a = reg(&[1; 32]);
    assert_eq!(a, reg(&[1; 32]));
    assert_ne!(a, reg(&[2; 32]));
}

/// A restarted master adopts what a node reports only when it is
/// consistent: its exact range free, no other version of the key, well
/// formed, from the node's current registration.
#[test]
fn node_reports_are_adopted_only_when_consistent() {
    let m = master_with(1, 1 << 20, |_| {});
    let node = m.cluster().node("n0").unwrap();
    assert!(
        m.rebuilding(),
        "a young master asks nodes for their objects"
    );
    let obj = |key: &str, offset: u64, length: u64, crc: u32| pb::NodeObject {
        key: key.into(),
        local_segment: 0,
        offset,
        length,
        crc32c: crc,
        generation: 0,
    };
    let report = |objects: Vec<pb::NodeObject>| {
        m.adopt_node_objects(&pb::ReportNodeObjectsRequest {
            node_id: "n0".into(),
            incarnation: node.incarnation,
            instance_proof: NODE_PROOF.to_vec(),
            objects,
            last: true,
        })
    };
    let r = report(vec![
        obj("a", 0, 100, 7),
        obj("b", 64, 10, 8),    // overlaps a's range
        obj("a", 4096, 100, 9), // another version of a
        obj("c", 4096, 100, 1),
        obj("", 8192, 10, 1),     // bad key
        obj("d", 8193, 10, 1),    // misaligned
        obj("e", 1 << 20, 64, 1), // past the segment
    ])
    .unwrap();
    assert_eq!((r.adopted, r.refused), (2, 5));
    assert!(m.exists("a").unwrap() && m.exists("c").unwrap());
    assert!(!m.exists("b").unwrap());
    let ra = m.get_replicas("a").unwrap();
    assert_eq!((ra.size, ra.crc32c), (100, 7));
    assert_eq!(m.allocated_bytes(), 256, "two 128-byte ranges reserved");
    // Not the node's current registration: refused whole.
    let stale = m.adopt_node_objects(&pb::ReportNodeObjectsRequest {
        node_id: "n0".into(),
        incarnation: node.incarnation + 1,
        instance_proof: NODE_PROOF.to_vec(),
        objects: vec![obj("z", 65536, 10, 1)],
        last: true,
    });
    assert_eq!(stale.unwrap_err().code, Code::PermissionDenied);
    assert!(!m.exists("z").unwrap());
    // The adopted object is a normal one: removing it frees its range.
    m.remove("c", true).unwrap();
    assert_eq!(m.allocated_bytes(), 128);
}

/// Past its rebuild window a master no longer asks registering nodes for
/// their objects (a node back from a partition starts clean, so a key
/// removed meanwhile cannot come back).
#[test]
fn only_a_young_master_asks_nodes_for_their_objects() {
    let m = master_with(0, 1 << 20, |c| c.node_ttl = Duration::from_millis(10));
    let reg = |m: &Master, id: &str| {
        m.register_node(pb::RegisterNodeRequest {
            node_id: id.into(),
            data_addr: "127.0.0.1:9000".into(),
            segments: vec![pb::SegmentSpec {
                local_id: 0,
                size: 1 << 20,
                ..Default::default()
            }],
            instance: "i".into(),
            instance_proof: NODE_PROOF.to_vec(),
            held_objects: 0,
            ..Default::default()
        })
        .unwrap()
    };
    assert!(reg(&m, "early").report_objects);
    let t0 = Instant::now();
    while m.rebuilding() {
        assert!(t0.elapsed() < Duration::from_secs(5));
        std::thread::yield_now();
    }
    assert!(!reg(&m, "late").report_objects);
}

/// A master that finds its durable state from an earlier run takes no
/// writes (and is not ready) until every node it remembers re-registered and
/// sent its last report batch, or `--node-ttl` passed; a new one takes them
/// at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_master_takes_writes_only_after_its_nodes_reported() {
    let dir = tempfile::tempdir().unwrap();
    let ttl = |t: Duration| {
        let d = dir.path().to_path_buf();
        move |c: &mut MasterConfig| {
            c.state_dir = Some(d.clone());
            c.node_ttl = t;
        }
    };
    let first = master_with(1, 1 << 20, ttl(Duration::from_secs(60)));
    assert!(first.accepting_writes(), "nothing to wait for");
    first
        .remember(crate::rebuild::members::Member::Node("n0".into()))
        .await
        .unwrap();
    first.put_start(spec("a", 100, 1)).unwrap();
    drop(first);
    let again = master_with(0, 1 << 20, ttl(Duration::from_secs(60)));
    assert!(!again.accepting_writes(), "not ready while n0 is missing");
    let e = again.put_start(spec("b", 100, 1)).unwrap_err();
    assert_eq!(e.code, Code::NotReady);
    assert!(e.retryable(), "{e}");
    assert!(e.message.contains("1 have not reported"), "{e}");
    // n0 comes back holding one object: still waiting for its report.
    let r = again
        .register_node(pb::RegisterNodeRequest {
            node_id: "n0".into(),
            data_addr: "127.0.0.1:9000".into(),
            segments: vec![pb::SegmentSpec {
                local_id: 0,
                size: 1 << 20,
                ..Default::default()
            }],
            instance: "i0".into(),
            instance_proof: NODE_PROOF.to_vec(),
            held_objects: 1,
            ..Default::default()
        })
        .unwrap();
    assert!(!again.accepting_writes(), "its report is still to come");
    let report = |last| pb::ReportNodeObjectsRequest {
        node_id: "n0".into(),
        incarnation: r.incarnation,
        instance_proof: NODE_PROOF.to_vec(),
        objects: vec![pb::NodeObject {
            key: if last { "a2" } else { "a1" }.into(),
            local_segment: 0,
            offset: if last { 4096 } else { 0 },
            length: 100,
            crc32c: 1,
            generation: 0,
        }],
        last,
    };
    again.adopt_node_objects(&report(false)).unwrap();
    assert!(!again.accepting_writes(), "not the last batch");
    again.adopt_node_objects(&report(true)).unwrap();
    assert!(again.accepting_writes(), "every remembered node reported");
    again.put_start(spec("b", 100, 1)).unwrap();
    drop(again);
    // A node that never comes back holds the gate for --node-ttl at most.
    let third = master_with(0, 1 << 20, ttl(Duration::from_millis(200)));
    assert!(!third.accepting_writes());
    let t0 = Instant::now();
    while !third.accepting_writes() {
        assert!(t0.elapsed() < Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A long poll of `node` waiting for its log to grow.
fn parked(
    node: &crate::cluster::NodeEntry,
) -> std::pin::Pin<Box<tokio::sync::futures::Notified<'_>>> {
    let mut p = Box::pin(node.log_grew.notified());
    p.as_mut().enable();
    p
}

/// Asserts that `u` is not answered before `node` applied log entry `seq`
/// (a bounded look, 50 ms), and is once it has.
async fn answered_once_applied(
    m: &Arc<Master>,
    u: crate::sync::Unsynced,
    what: &'static str,
    node: &crate::cluster::NodeEntry,
    seq: u64,
) {
    let m2 = m.clone();
    let mut wait = tokio::spawn(async move { m2.await_synced(u, what).await });
    assert!(
        tokio::time::timeout(Duration::from_millis(50), &mut wait)
            .await
            .is_err(),
        "the {what} was answered before its node applied entry {seq}"
    );
    node.ack(seq);
    wait.await.unwrap().unwrap();
}

/// A PutEnd is answered only once the node holding the object confirmed the
/// commit (its heartbeat acknowledged the log entry); a node that does not
/// within the bound, or a term that ends, makes it a retryable error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_end_waits_for_the_node_to_confirm_the_commit() {
    let m = master_with(1, 1 << 20, |c| c.node_ttl = Duration::from_millis(400));
    let node = m.cluster().node("n0").unwrap();
    m.put_start(spec("a", 100, 1)).unwrap();
    let u = m.put_end_unsynced("a", 7, &[]).unwrap();
    // Not before the node's acknowledgement (the log holds the commit).
    let seq = node.log_page(0).unwrap().last().unwrap().seq;
    answered_once_applied(&m, u, "commit", &node, seq).await;
    // Never confirmed: a retryable error once the bound (node_ttl/2) passes.
    m.put_start(spec("b", 100, 1)).unwrap();
    let u = m.put_end_unsynced("b", 7, &[]).unwrap();
    let e = m.await_synced(u, "commit").await.unwrap_err();
    assert!(e.retryable(), "{e}");
    assert_eq!(m.metrics.unsynced_commits.get(), 1);
    // The term ends while waiting: at once, retryable.
    m.put_start(spec("c", 100, 1)).unwrap();
    let u = m.put_end_unsynced("c", 7, &[]).unwrap();
    m.stop_waiting();
    let t0 = Instant::now();
    let e = m.await_synced(u, "commit").await.unwrap_err();
    assert!(
        e.retryable() && t0.elapsed() < Duration::from_millis(200),
        "{e}"
    );
}

/// Registers node `id` with one 1 MiB segment, its request shaped by `f`
/// (what it keeps of the object log).
fn one_segment_node(
    m: &Master,
    id: &str,
    port: u16,
    f: impl FnOnce(&mut pb::RegisterNodeRequest),
) -> Arc<crate::cluster::NodeEntry> {
    let mut req = pb::RegisterNodeRequest {
        node_id: id.into(),
        data_addr: format!("127.0.0.1:{port}"),
        segments: vec![pb::SegmentSpec {
            local_id: 0,
            size: 1 << 20,
            ..Default::default()
        }],
        instance: id.into(),
        instance_proof: NODE_PROOF.to_vec(),
        ..Default::default()
    };
    f(&mut req);
    m.register_node(req).unwrap();
    m.cluster().node(id).unwrap()
}

/// A put whose client declared its checksum at PutStart is announced to
/// nodes that keep pending puts; its PutEnd then waits for the node to hold
/// the announcement, not for the commit entry. Both sides: a PutEnd with
/// another checksum, and a node that does not keep pending puts, wait for
/// the commit as before; a revoked announced put is freed on its node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_end_of_an_announced_put_waits_for_the_announcement_only() {
    let m = master_with(0, 1 << 20, |c| c.node_ttl = Duration::from_millis(400));
    let keeps = one_segment_node(&m, "keeps", 9000, |r| r.records_pending = true);
    let old = one_segment_node(&m, "old", 9001, |_| {});
    let seg_of = |n: &crate::cluster::NodeEntry| n.segment_ids[0];
    let announced = |key: &str, seg: u64, crc: u32| {
        m.put_start(PutSpec {
            crc32c: Some(crc),
            preferred_segment: Some(seg),
            ..spec(key, 100, 1)
        })
        .unwrap()
    };
    let last = |n: &crate::cluster::NodeEntry| n.log_page(0).unwrap().last().cloned().unwrap();

    // Only what someone waits for wakes a node's parked long poll: an
    // announcement does, the commit of an announced put does not (it rides
    // with the next entry).
    let mut poll = parked(&keeps);
    announced("w", seg_of(&keeps), 40);
    assert!(poll.as_mut().now_or_never().is_some(), "not woken");
    keeps.ack(last(&keeps).seq);
    let mut poll = parked(&keeps);
    drop(m.put_end_unsynced("w", 40, &[]).unwrap());
    assert!(
        poll.as_mut().now_or_never().is_none(),
        "the commit of an announced put woke the poll"
    );

    // Not answered before the node holds the announcement.
    announced("early", seg_of(&keeps), 41);
    let early = last(&keeps);
    let u = m.put_end_unsynced("early", 41, &[]).unwrap();
    answered_once_applied(&m, u, "commit", &keeps, early.seq).await;

    announced("a", seg_of(&keeps), 42);
    let pending = last(&keeps);
    match &pending.op {
        Some(pb::object_log_entry::Op::Pending(p)) => {
            assert_eq!((p.key.as_str(), p.crc32c, p.length), ("a", 42, 100));
        }
        op => panic!("expected an announcement, got {op:?}"),
    }
    keeps.ack(pending.seq);
    // The commit entry is logged but never acknowledged: still answered.
    let u = m.put_end_unsynced("a", 42, &[]).unwrap();
    assert!(matches!(
        last(&keeps).op,
        Some(pb::object_log_entry::Op::Commit(_))
    ));
    tokio::time::timeout(Duration::from_secs(5), m.await_synced(u, "commit"))
        .await
        .expect("answered without the commit's acknowledgement")
        .unwrap();

    // Another checksum at PutEnd: the announcement says nothing of these
    // bytes, so the commit itself must be confirmed.
    announced("b", seg_of(&keeps), 42);
    keeps.ack(last(&keeps).seq);
    let u = m.put_end_unsynced("b", 43, &[]).unwrap();
    let e = m.await_synced(u, "commit").await.unwrap_err();
    assert!(e.retryable(), "{e}");

    // A node that keeps no pending puts is told nothing at PutStart.
    let before = old.log_page(0).unwrap().len();
    announced("c", seg_of(&old), 42);
    assert_eq!(old.log_page(0).unwrap().len(), before, "nothing announced");
    let mut poll = parked(&old);
    let u = m.put_end_unsynced("c", 42, &[]).unwrap();
    assert!(
        poll.as_mut().now_or_never().is_some(),
        "a commit waited for woke nothing"
    );
    answered_once_applied(&m, u, "commit", &old, last(&old).seq).await;

    // A PutEnd of bytes already committed (a put a restarted master adopted
    // before its PutEnd came) logs their commit again, wakes the node and
    // is answered once the node applied it.
    let mut poll = parked(&keeps);
    let u = m.put_end_unsynced("a", 42, &[]).unwrap();
    assert!(poll.as_mut().now_or_never().is_some(), "not woken");
    let commit = last(&keeps);
    assert!(matches!(
        commit.op,
        Some(pb::object_log_entry::Op::Commit(ref c)) if c.key == "a"
    ));
    answered_once_applied(&m, u, "commit", &keeps, commit.seq).await;

    // A revoked announced put is freed on its node, so it never reports
    // it, and the revoke waits for that free as a removal does.
    announced("d", seg_of(&keeps), 42);
    let u = m.put_revoke_unsynced("d").unwrap();
    let free = last(&keeps);
    assert!(
        matches!(free.op, Some(pb::object_log_entry::Op::Free(_))),
        "{free:?}"
    );
    answered_once_applied(&m, u, "revoke", &keeps, free.seq).await;
}

/// A removal is answered only once the node holding the object confirmed
/// the free, so a master dying right after does not leave the object in the
/// records its successor rebuilds from; unconfirmed, it is a retryable error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remove_waits_for_the_node_to_confirm_the_free() {
    let m = master_with(1, 1 << 20, |c| c.node_ttl = Duration::from_millis(400));
    let node = m.cluster().node("n0").unwrap();
    m.put_start(spec("a", 100, 1)).unwrap();
    m.put_end("a", 7).unwrap();
    let u = m.remove_unsynced("a", false).unwrap();
    let free = node.log_page(0).unwrap().last().cloned().unwrap();
    assert!(
        matches!(free.op, Some(pb::object_log_entry::Op::Free(_))),
        "{free:?}"
    );
    answered_once_applied(&m, u, "removal", &node, free.seq).await;
    m.put_start(spec("b", 100, 1)).unwrap();
    m.put_end("b", 7).unwrap();
    let u = m.remove_unsynced("b", false).unwrap();
    let e = m.await_synced(u, "removal").await.unwrap_err();
    assert!(e.retryable() && e.message.contains("removal"), "{e}");
}

/// Two nodes report different versions of one key (a put, a removal whose
/// frees did not reach the first node, a new put elsewhere): the newest
/// commit (highest allocation generation) is kept whichever node reports
/// first; the older one's range is freed and counted.
#[test]
fn the_newest_commit_of_a_key_wins_the_rebuild() {
    for newer_first in [false, true] {
        let m = master_with(2, 1 << 20, |_| {});
        let report = |node: &str, crc: u32, generation: u64| {
            let n = m.cluster().node(node).unwrap();
            m.adopt_node_objects(&pb::ReportNodeObjectsRequest {
                node_id: node.into(),
                incarnation: n.incarnation,
                instance_proof: NODE_PROOF.to_vec(),
                objects: vec![pb::NodeObject {
                    key: "k".into(),
                    local_segment: 0,
                    offset: 0,
                    length: 100,
                    crc32c: crc,
                    generation,
                }],
                last: true,
            })
            .unwrap()
        };
        let (first, second) = if newer_first {
            (report("n1", 2, 9), report("n0", 1, 5))
        } else {
            (report("n0", 1, 5), report("n1", 2, 9))
        };
        assert_eq!(first.adopted, 1);
        assert_eq!(
            (second.adopted, second.refused),
            if newer_first { (0, 1) } else { (1, 0) },
            "newer first: {newer_first}"
        );
        let r = m.get_replicas("k").unwrap();
        assert_eq!((r.crc32c, r.replicas.len()), (2, 1), "the newer version");
        assert_eq!(m.allocated_bytes(), 128, "the older range is free");
    }
}

/// A change dropped from an overflowing queue is never confirmed, even when
/// the member confirms later entries (confirmations are a high-water mark):
/// its waiter gets a retryable error, not a false success.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_lost_from_a_full_queue_is_not_confirmed_by_later_ones() {
    use crate::sync::{Acks, Unsynced};
    let m = master_with(1, 1 << 20, |_| {});
    let acks = Arc::new(Acks::new("SSD owner 1".into()));
    acks.lose(5);
    acks.ack(10);
    let waits = |seq: u64| {
        let mut u = Unsynced::default();
        u.push(acks.clone(), seq);
        u
    };
    let e = m.await_synced(waits(5), "removal").await.unwrap_err();
    assert!(e.retryable() && e.message.contains("overflowed"), "{e}");
    m.await_synced(waits(6), "removal").await.unwrap();
}

/// A put whose client asks for receipts is not announced to a node that
/// records puts from their writes: its replica carries the put's record,
/// signed with that node's key, instead. A PutEnd that brings the node's
/// receipt for these very bytes waits for nothing and wakes no long poll
/// (the commit still goes to the node, with its next entry); a receipt that
/// says anything else (another checksum, another key, a record passed off
/// as a receipt, another node's segment) is refused and the PutEnd waits
/// for the commit as before. A node that does not record puts is announced
/// to, and its replica carries no record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_end_with_the_nodes_receipt_waits_for_nothing() {
    use strata_common::grant::{GrantKey, PutRecord};
    let m = master_with(0, 1 << 20, |c| c.node_ttl = Duration::from_millis(400));
    let node = one_segment_node(&m, "records", 9000, |r| {
        r.records_pending = true;
        r.records_receipts = true;
    });
    let old = one_segment_node(&m, "announced", 9001, |r| r.records_pending = true);
    let start = |key: &str, n: &crate::cluster::NodeEntry, crc: u32| {
        let mut r = m
            .put_start(PutSpec {
                crc32c: Some(crc),
                receipts: true,
                preferred_segment: Some(n.segment_ids[0]),
                ..spec(key, 100, 1)
            })
            .unwrap();
        assert_eq!(r.len(), 1);
        r.remove(0)
    };
    let record_of = |key: &'static str, r: &pb::Replica, crc32c: u32| PutRecord {
        key,
        segment_id: r.segment_id,
        offset: r.offset,
        length: 100,
        generation: r.grant.as_ref().unwrap().generation,
        crc32c,
    };
    let receipt = |put: &PutRecord<'_>| pb::PutReceipt {
        segment_id: put.segment_id,
        mac: node.grant_key.sign_receipt(put).to_vec(),
    };
    let log_len = |n: &crate::cluster::NodeEntry| n.log_page(0).unwrap().len();
    let last = |n: &crate::cluster::NodeEntry| n.log_page(0).unwrap().last().cloned().unwrap();

    let before = log_len(&node);
    let r = start("a", &node, 42);
    assert_eq!(
        log_len(&node),
        before,
        "announced to a node that records it"
    );
    let put = record_of("a", &r, 42);
    assert!(node.grant_key.verify_record(&put, &r.record), "no record");
    let mut poll = parked(&node);
    let u = m.put_end_unsynced("a", 42, &[receipt(&put)]).unwrap();
    assert!(
        poll.as_mut().now_or_never().is_none(),
        "a receipted commit woke the node's poll"
    );
    tokio::time::timeout(Duration::from_secs(5), m.await_synced(u, "commit"))
        .await
        .expect("a receipted PutEnd waited for its node")
        .unwrap();
    assert!(matches!(
        last(&node).op,
        Some(pb::object_log_entry::Op::Commit(ref c)) if c.key == "a" && c.crc32c == 42
    ));
    assert_eq!(m.metrics.put_receipts_accepted.get(), 1);

    // Receipts that do not say "these bytes, here": waited for as before.
    type Forge = fn(PutRecord<'static>, &GrantKey) -> pb::PutReceipt;
    let forgeries: [(&str, Forge); 4] = [
        ("crc", |p, k| pb::PutReceipt {
            segment_id: p.segment_id,
            mac: k.sign_receipt(&PutRecord { crc32c: 43, ..p }).to_vec(),
        }),
        ("key", |p, k| pb::PutReceipt {
            segment_id: p.segment_id,
            mac: k.sign_receipt(&PutRecord { key: "a", ..p }).to_vec(),
        }),
        ("record", |p, k| pb::PutReceipt {
            segment_id: p.segment_id,
            mac: k.sign_record(&p).to_vec(),
        }),
        ("segment", |p, k| pb::PutReceipt {
            segment_id: p.segment_id + 1,
            mac: k
                .sign_receipt(&PutRecord {
                    segment_id: p.segment_id + 1,
                    ..p
                })
                .to_vec(),
        }),
    ];
    for (i, (key, forge)) in forgeries.into_iter().enumerate() {
        let r = start(key, &node, 42);
        let put = record_of(["crc", "key", "record", "segment"][i], &r, 42);
        let u = m
            .put_end_unsynced(key, 42, &[forge(put, &node.grant_key)])
            .unwrap();
        answered_once_applied(&m, u, "commit", &node, last(&node).seq).await;
    }
    // The segment forgery names no replica of the put: nothing to refuse.
    assert_eq!(m.metrics.put_receipts_refused.get(), 3);
    assert_eq!(m.metrics.put_receipts_accepted.get(), 1);

    // A receipted put revoked: answered once its node applied the free
    // (the node may hold the put it recorded from the write).
    let r = start("revoked", &node, 42);
    assert!(!r.record.is_empty());
    let u = m.put_revoke_unsynced("revoked").unwrap();
    assert!(matches!(
        last(&node).op,
        Some(pb::object_log_entry::Op::Free(ref f)) if f.offset == r.offset
    ));
    answered_once_applied(&m, u, "revoke", &node, last(&node).seq).await;
    // More receipts than a put may have replicas: refused; as many: taken.
    let r = start("many", &node, 42);
    let good = receipt(&record_of("many", &r, 42));
    let max = crate::master::MAX_REPLICAS as usize;
    let e = m.put_end_unsynced("many", 42, &vec![good.clone(); max + 1]);
    assert_eq!(e.err().map(|e| e.code), Some(Code::InvalidArgument));
    let u = m.put_end_unsynced("many", 42, &vec![good; max]).unwrap();
    tokio::time::timeout(Duration::from_secs(5), m.await_synced(u, "commit"))
        .await
        .expect("a receipted PutEnd waited for its node")
        .unwrap();

    // A node that does not record puts: announced, no record.
    let before = log_len(&old);
    let r = start("z", &old, 42);
    assert!(r.record.is_empty());
    assert_eq!(log_len(&old), before + 1);
    assert!(matches!(
        last(&old).op,
        Some(pb::object_log_entry::Op::Pending(ref p)) if p.key == "z"
    ));
}
