//! Unit tests of `Cluster` through the master's API: placement, node
//! membership, heartbeats and the keys members get.

use crate::master::PutSpec;
use crate::tests::{master_with, put, spec, NODE_PROOF};
use std::time::Duration;
use strata_common::Code;
use strata_proto as pb;

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

/// A node silent for half the TTL (often about to be dropped, with any copy
/// just placed there) gets new copies only when the others are short.
#[test]
fn quiet_nodes_are_placed_on_last() {
    let m = master_with(3, 1 << 20, |c| c.node_ttl = Duration::from_millis(10_000));
    let now = strata_common::time::unix_ms();
    m.cluster()
        .node("n0")
        .unwrap()
        .last_heartbeat_ms
        .store(now - 6_000, std::sync::atomic::Ordering::Relaxed);
    for i in 0..20 {
        let r = m.put_start(spec(&format!("k{i}"), 100, 2)).unwrap();
        assert_eq!(r.len(), 2);
        assert!(r.iter().all(|r| r.node_id != "n0"), "{r:?}");
    }
    let r = m.put_start(spec("three", 100, 3)).unwrap();
    let mut nodes: Vec<&str> = r.iter().map(|r| r.node_id.as_str()).collect();
    nodes.sort();
    assert_eq!(nodes, ["n0", "n1", "n2"]);
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

/// A sweep that comes late (this master was paused past `--node-ttl`: its
/// nodes' heartbeats wait unread in its sockets) does not drop them; a node
/// that stays silent for a whole TTL of sweeps on time still goes.
#[test]
fn a_late_sweep_does_not_count_its_lateness_against_the_nodes() {
    let m = master_with(2, 1 << 20, |c| c.node_ttl = Duration::from_millis(1000));
    let now = strata_common::time::unix_ms();
    let set = |node: &str, ms: u64| {
        m.cluster()
            .node(node)
            .unwrap()
            .last_heartbeat_ms
            .store(ms, std::sync::atomic::Ordering::Relaxed)
    };
    set("n0", now);
    set("n1", now);
    assert!(m.expire_nodes(now + 100).is_empty());
    // Paused for 5 s: both look 5 s silent, neither is dropped.
    assert!(
        m.expire_nodes(now + 5100).is_empty(),
        "dropped after a stall"
    );
    assert_eq!(m.stat().nodes, 2);
    // Back to sweeps on time: n0 heartbeats, n1 stays silent past the TTL.
    let mut t = now + 5100;
    let mut dropped = Vec::new();
    for _ in 0..20 {
        t += 200;
        set("n0", t);
        dropped.extend(m.expire_nodes(t));
    }
    assert_eq!(dropped, vec!["n1".to_string()]);
    assert_eq!(m.stat().nodes, 1);
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

/// A node's numbers are bounded when it registers (segment count and size),
/// and the sums over every node saturate: 17 nodes of the largest
/// registration hold more than `u64::MAX` bytes between them.
#[test]
fn registered_sizes_are_bounded_and_their_sums_never_wrap() {
    use crate::cluster::registration::{MAX_SEGMENTS_PER_NODE, MAX_SEGMENT_BYTES};
    let m = master_with(0, 1 << 20, |_| {});
    let reg = |id: &str, n: usize, size: u64| {
        m.register_node(pb::RegisterNodeRequest {
            node_id: id.into(),
            data_addr: "127.0.0.1:9999".into(),
            segments: (0..n)
                .map(|i| pb::SegmentSpec {
                    local_id: i as u64,
                    size,
                    ..Default::default()
                })
                .collect(),
            instance: "i".into(),
            instance_proof: NODE_PROOF.to_vec(),
            ..Default::default()
        })
    };
    let refused = [
        reg("big", 1, MAX_SEGMENT_BYTES + 1),
        reg("many", MAX_SEGMENTS_PER_NODE + 1, 1 << 20),
    ];
    for r in refused {
        assert_eq!(r.unwrap_err().code, Code::InvalidArgument);
    }
    assert_eq!(m.capacity_bytes(), 0, "nothing of a refused node is kept");
    for i in 0..17 {
        reg(&format!("n{i}"), MAX_SEGMENTS_PER_NODE, MAX_SEGMENT_BYTES).unwrap();
    }
    assert_eq!(m.capacity_bytes(), u64::MAX);
    let stat = m.stat();
    assert_eq!((stat.nodes, stat.capacity_bytes), (17, u64::MAX));
    m.refresh_gauges();
    assert_eq!(m.metrics.capacity_bytes.get(), i64::MAX);
}

/// A loopback data address is refused only from a member that connected
/// from another host (others could not reach it there); a member that
/// dialled this host's own address, or IPv4 loopback through a dual-stack
/// socket, is on this host.
#[test]
fn a_loopback_data_addr_is_refused_from_another_host() {
    use crate::cluster::check_data_addr_reachable as check;
    let ip = |s: &str| Some(s.parse::<std::net::IpAddr>().unwrap());
    let master = ip("10.0.0.5");
    let e = check("127.0.0.1:7500", ip("10.0.0.7"), master).unwrap_err();
    assert_eq!(e.code, Code::InvalidArgument);
    assert!(e.message.contains("10.0.0.7"), "{e}");
    assert!(check("[::1]:7500", ip("10.0.0.7"), master).is_err());
    assert!(check("[::ffff:127.0.0.1]:7500", ip("10.0.0.7"), master).is_err());
    assert!(check("127.0.0.1:7500", ip("127.0.0.1"), master).is_ok());
    assert!(check("127.0.0.1:7500", ip("::ffff:127.0.0.1"), master).is_ok());
    assert!(
        check("127.0.0.1:7500", ip("10.0.0.5"), master).is_ok(),
        "same host"
    );
    assert!(check("10.0.0.7:7500", ip("10.0.0.7"), master).is_ok());
    assert!(
        check("127.0.0.1:7500", None, master).is_ok(),
        "no peer known"
    );
}

/// A node that stops applying its object log costs the master a bounded
/// amount of memory: past `max_node_log_bytes` the entry is dropped unsent,
/// whoever waits for it is told at once, and the node's next heartbeat
/// drops it (it registers again). One that applies its log never hits it.
#[tokio::test]
async fn a_node_that_stops_applying_its_object_log_is_dropped_at_the_bound() {
    let bound = 4096;
    let hb = |inc, applied_seq| pb::HeartbeatRequest {
        node_id: "n0".into(),
        incarnation: inc,
        applied_seq,
        instance_proof: NODE_PROOF.to_vec(),
        wait_ms: 0,
        leaving: false,
    };
    // Applying its log: many times the bound goes through.
    let m = master_with(1, 1 << 30, |c| c.max_node_log_bytes = bound);
    let node = m.cluster().node("n0").unwrap();
    let mut applied = 0;
    for i in 0..1000 {
        put(&m, &format!("applied-{i}"), 100);
        let r = m.heartbeat(&hb(node.incarnation, applied)).unwrap();
        assert!(r.known);
        if let Some(e) = r.log.last() {
            applied = e.seq;
        }
    }
    assert!(!node.log_overflowed());
    assert!(m.heartbeat(&hb(node.incarnation, applied)).unwrap().known);
    assert_eq!(m.metrics.node_log_overflows.get(), 0);

    // Not applying it: the log fills up to the bound and no further.
    let m = master_with(1, 1 << 30, |c| c.max_node_log_bytes = bound);
    let node = m.cluster().node("n0").unwrap();
    let (mut n, mut last) = (0, None);
    while !node.log_overflowed() {
        let k = format!("k{n}");
        m.put_start(spec(&k, 100, 1)).unwrap();
        last = Some(m.put_end_unsynced(&k, 0, &[]).unwrap());
        n += 1;
        assert!(n < 1000, "no overflow after {n} puts");
    }
    assert!(n > 20, "only {n} entries fit in {bound} bytes");
    let held = node.log_backlog();
    assert_eq!(held, n - 1, "the entry past the bound is kept");
    assert_eq!(
        m.metrics.node_log_overflows.get(),
        1,
        "counted as it happens"
    );
    // Nothing more is placed there (it could never be confirmed)...
    assert_eq!(
        m.put_start(spec("late", 100, 1)).unwrap_err().code,
        Code::NoSpace
    );
    // ...and whoever waits for the dropped entry is told at once.
    let unsynced = last.unwrap();
    let t0 = std::time::Instant::now();
    let e = unsynced
        .wait(
            t0 + Duration::from_secs(30),
            &tokio_util::sync::CancellationToken::new(),
            &prometheus::IntCounter::new("t", "t").unwrap(),
            "put",
        )
        .await
        .unwrap_err();
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "waited {:?}",
        t0.elapsed()
    );
    assert_eq!(e.code, Code::Unavailable);
    assert!(e.message.contains("never sent"), "{e}");
    assert_eq!(node.log_backlog(), held, "the log grew past its bound");
    // Its next heartbeat drops it, with what it held.
    assert!(!m.heartbeat(&hb(node.incarnation, 0)).unwrap().known);
    assert_eq!(m.metrics.node_log_overflows.get(), 1);
    assert_eq!(m.stat().segments, 0);
    assert_eq!(m.get_replicas("k0").unwrap_err().code, Code::NotFound);
}
