//! Unit tests of `RebuildGate` through the master's API: adopting what
//! nodes report, the rebuild window and the gate on writes.

use crate::config::MasterConfig;
use crate::master::Master;
use crate::tests::{master_with, spec, NODE_PROOF};
use std::time::{Duration, Instant};
use strata_common::Code;
use strata_proto as pb;

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
