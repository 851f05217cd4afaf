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
    let obj = |key: &str, offset: u64, length: u64, crc: u32| {
        m.signed(
            "n0",
            pb::NodeObject {
                key: key.into(),
                local_segment: 0,
                offset,
                length,
                crc32c: crc,
                ..Default::default()
            },
        )
    };
    let report = |objects| report_of(&m, "n0", objects, true);
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

/// Node `id`'s report of `objects` from its current registration.
fn report_of(
    m: &Master,
    id: &str,
    objects: Vec<pb::NodeObject>,
    last: bool,
) -> strata_common::Result<pb::ReportNodeObjectsResponse> {
    let n = m.cluster().node(id).unwrap();
    m.adopt_node_objects(&pb::ReportNodeObjectsRequest {
        node_id: id.into(),
        incarnation: n.incarnation,
        instance_proof: NODE_PROOF.to_vec(),
        objects,
        last,
    })
}

/// Registers node `id` with one 1 MiB segment, saying it holds `held`
/// objects.
fn register(m: &Master, id: &str, held: u64) -> pb::RegisterNodeResponse {
    m.register_node(register_req(id, held)).unwrap()
}

fn register_req(id: &str, held: u64) -> pb::RegisterNodeRequest {
    pb::RegisterNodeRequest {
        node_id: id.into(),
        data_addr: "127.0.0.1:9000".into(),
        segments: vec![pb::SegmentSpec {
            local_id: 0,
            size: 1 << 20,
            ..Default::default()
        }],
        instance: "i".into(),
        instance_proof: NODE_PROOF.to_vec(),
        held_objects: held,
        ..Default::default()
    }
}

/// Past its rebuild window a master no longer asks registering nodes for
/// their objects (a node back from a partition starts clean, so a key
/// removed meanwhile cannot come back).
#[test]
fn only_a_young_master_asks_nodes_for_their_objects() {
    let m = master_with(0, 1 << 20, |c| c.node_ttl = Duration::from_millis(10));
    let reg = |m: &Master, id: &str| register(m, id, 0);
    assert!(reg(&m, "early").report_objects);
    let t0 = Instant::now();
    while m.rebuilding() {
        assert!(t0.elapsed() < Duration::from_secs(5));
        std::thread::yield_now();
    }
    assert!(!reg(&m, "late").report_objects);
}

/// Within the window too, a node this term dropped after it reported (or
/// with replicas on it) is not asked again: a key removed meanwhile must not
/// come back from its report. A registration that never reported (its
/// answer lost, the node registering again) is asked again.
#[test]
fn a_node_registering_again_in_the_same_term_is_not_asked_to_report() {
    let m = master_with(0, 1 << 20, |c| c.node_ttl = Duration::from_secs(60));
    assert!(register(&m, "n1", 3).report_objects);
    assert!(register(&m, "n1", 3).report_objects, "it never reported");
    assert!(m.rebuilding());
    report_of(&m, "n1", vec![], true).unwrap();
    assert!(
        !register(&m, "n1", 3).report_objects,
        "asked again after it reported"
    );
    assert!(register(&m, "n3", 3).report_objects, "others still asked");
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
    let r = register(&again, "n0", 1);
    assert!(!again.accepting_writes(), "its report is still to come");
    let report = |last| pb::ReportNodeObjectsRequest {
        node_id: "n0".into(),
        incarnation: r.incarnation,
        instance_proof: NODE_PROOF.to_vec(),
        objects: vec![again.signed(
            "n0",
            pb::NodeObject {
                key: if last { "a2" } else { "a1" }.into(),
                local_segment: 0,
                offset: if last { 4096 } else { 0 },
                length: 100,
                crc32c: 1,
                ..Default::default()
            },
        )],
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
            report_of(
                &m,
                node,
                vec![m.signed(
                    node,
                    pb::NodeObject {
                        key: "k".into(),
                        local_segment: 0,
                        offset: 0,
                        length: 100,
                        crc32c: crc,
                        generation,
                        ..Default::default()
                    },
                )],
                true,
            )
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

/// A report is adopted only with the record of a master's giving this node
/// the object (its log entry's commit record, which covers the key, the
/// range, the checksum, the generation and the digest): none, a forged
/// one, one for another node or other bytes are refused, and a digest the
/// record covers comes back to readers.
#[test]
fn a_report_is_adopted_only_with_a_masters_record_of_it() {
    let m = master_with(2, 1 << 20, |_| {});
    let report = |objects| report_of(&m, "n0", objects, false).unwrap();
    let obj = |key: &str, offset: u64| pb::NodeObject {
        key: key.into(),
        local_segment: 0,
        offset,
        length: 100,
        crc32c: 7,
        generation: 5,
        ..Default::default()
    };
    let forged = pb::NodeObject {
        commit_record: vec![0x5a; 16],
        ..obj("forged", 0)
    };
    let elsewhere = m.signed("n1", obj("elsewhere", 4096));
    let other_bytes = pb::NodeObject {
        crc32c: 8,
        ..m.signed("n0", obj("other", 8192))
    };
    let uncovered = pb::NodeObject {
        blake3: vec![3; 32],
        ..m.signed("n0", obj("uncovered", 12288))
    };
    let r = report(vec![
        obj("unsigned", 16384),
        forged,
        elsewhere,
        other_bytes,
        uncovered,
    ]);
    assert_eq!((r.adopted, r.refused), (0, 5));
    assert_eq!(m.allocated_bytes(), 0, "nothing reserved");
    let unsigned = m.metrics.rebuilt_objects.with_label_values(&["unsigned"]);
    assert_eq!(unsigned.get(), 5);
    // Signed, with and without the writer's digest.
    let digest = pb::NodeObject {
        blake3: vec![9; 32],
        ..obj("digest", 20480)
    };
    let r = report(vec![
        m.signed("n0", obj("plain", 0)),
        m.signed("n0", digest),
    ]);
    assert_eq!((r.adopted, r.refused), (2, 0));
    assert!(m.get_replicas("plain").unwrap().blake3.is_empty());
    assert_eq!(m.get_replicas("digest").unwrap().blake3, vec![9; 32]);
}

/// Only a registration a rebuilding master asked may report, until its
/// last batch and while the rebuild takes reports: a node registered after
/// the window (its object log moved on without it) is refused, an early
/// one after its last batch, and any once reports are no longer taken.
#[test]
fn only_a_registration_asked_to_report_may_report() {
    // A window of 400 ms: room for a loaded machine to register and
    // report before it closes.
    let m = master_with(0, 1 << 20, |c| c.node_ttl = Duration::from_millis(200));
    let reg = |id: &str| register(&m, id, 1);
    let report = |id: &str| {
        let o = pb::NodeObject {
            key: format!("{id}/k"),
            length: 100,
            crc32c: 1,
            ..Default::default()
        };
        report_of(&m, id, vec![m.signed(id, o)], true)
    };
    let (early, done) = (reg("early"), reg("done"));
    assert!(early.report_objects && done.report_objects);
    assert_eq!(report("done").unwrap().adopted, 1);
    let e = report("done").unwrap_err();
    assert_eq!(e.code, Code::PermissionDenied, "after its last batch: {e}");
    let t0 = Instant::now();
    while m.rebuilding() {
        assert!(t0.elapsed() < Duration::from_secs(5));
        std::thread::yield_now();
    }
    let late = reg("late");
    assert!(!late.report_objects);
    let e = report("late").unwrap_err();
    assert_eq!(e.code, Code::PermissionDenied, "not asked: {e}");
    assert!(!m.exists("late/k").unwrap());
    // An asked one past the window: still taken for a while (big nodes send
    // many batches), then no more.
    while m.taking_reports() {
        assert!(t0.elapsed() < Duration::from_secs(5));
        std::thread::yield_now();
    }
    let e = report("early").unwrap_err();
    assert_eq!(e.code, Code::PermissionDenied, "too late: {e}");
    assert!(!m.exists("early/k").unwrap());
}

/// A report never replaces what this term committed: a node claiming a
/// newer version of a key (a higher generation, signed) is refused once
/// a PutEnd committed the key here; between two reported versions the
/// newer still wins (`the_newest_commit_of_a_key_wins_the_rebuild`).
#[test]
fn a_report_never_replaces_what_this_term_committed() {
    let m = master_with(2, 1 << 20, |_| {});
    let r = m.put_start(spec("k", 100, 1)).unwrap();
    let g = r[0].grant.as_ref().unwrap().generation;
    m.put_end("k", 1).unwrap();
    let newer = pb::NodeObject {
        key: "k".into(),
        local_segment: 0,
        offset: 0,
        length: 100,
        crc32c: 2,
        generation: g + 1_000_000,
        ..Default::default()
    };
    let r = report_of(&m, "n1", vec![m.signed("n1", newer)], true).unwrap();
    assert_eq!((r.adopted, r.refused), (0, 1));
    assert_eq!(m.get_replicas("k").unwrap().crc32c, 1, "this term's commit");
}

/// Under `--integrity blake3` a report is adopted only with the writer's
/// digest that a commit's record covers. An announcement's record (signed
/// as one, so it cannot pass for a commit's) is refused `no_digest`; a
/// digest it does not cover leaves no record at all (`unsigned`). Without
/// the flag the announcement's record is evidence as before.
#[test]
fn under_integrity_blake3_only_a_commits_record_brings_an_object_back() {
    use crate::config::Integrity;
    use strata_proto::object_log_entry::Op;
    for integrity in [Integrity::Crc32c, Integrity::Blake3] {
        let m = master_with(0, 1 << 20, |c| c.integrity = integrity);
        let r = m
            .register_node(pb::RegisterNodeRequest {
                records_pending: true,
                ..register_req("n0", 1)
            })
            .unwrap();
        assert!(r.report_objects);
        let node = m.cluster().node("n0").unwrap();
        m.put_start(crate::master::PutSpec {
            crc32c: Some(7),
            ..spec("k", 100, 1)
        })
        .unwrap();
        let log = node.log_page(0).unwrap();
        let announced = log
            .iter()
            .find_map(|e| match &e.op {
                Some(Op::Pending(c)) => Some(c.clone()),
                _ => None,
            })
            .expect("the put was announced to its node");
        assert!(!announced.commit_record.is_empty());
        let o = pb::NodeObject {
            key: announced.key.clone(),
            offset: announced.offset,
            length: announced.length,
            crc32c: announced.crc32c,
            generation: announced.generation,
            commit_record: announced.commit_record.clone(),
            ..Default::default()
        };
        let report = |o| report_of(&m, "n0", vec![o], false).unwrap();
        let label = |l: &str| m.metrics.rebuilt_objects.with_label_values(&[l]).get();
        report(pb::NodeObject {
            blake3: vec![1; 32],
            ..o.clone()
        });
        assert_eq!(label("unsigned"), 1, "{integrity}");
        report(o);
        match integrity {
            Integrity::Blake3 => assert_eq!(label("no_digest"), 1),
            // Evidence: refused only because the put still holds its range.
            Integrity::Crc32c => assert_eq!((label("no_digest"), label("range_in_use")), (0, 1)),
        }
    }
}

/// A key removed while the rebuild still takes reports stays removed when a
/// member that had not reported yet reports its copy (found by the
/// nemesis: writes open after the gate's bound, reports are taken for
/// longer); a copy of a newer version (a put after the removal) is not
/// refused for it.
#[test]
fn a_late_report_does_not_bring_back_a_key_removed_during_the_rebuild() {
    let m = master_with(2, 1 << 20, |_| {});
    let obj = |node: &str, offset: u64, generation: u64| {
        m.signed(
            node,
            pb::NodeObject {
                key: "k".into(),
                local_segment: 0,
                offset,
                length: 100,
                crc32c: 1,
                generation,
                ..Default::default()
            },
        )
    };
    let r = report_of(&m, "n0", vec![obj("n0", 0, 5)], true).unwrap();
    assert_eq!(r.adopted, 1);
    m.remove("k", false).unwrap();
    assert!(!m.exists("k").unwrap());
    // n1 held the other replica of the same commit and reports it late:
    // each replica has a generation of its own, here a newer one than the
    // removed copy's (found by review: the removed object's own newest
    // generation was not enough).
    let r = report_of(&m, "n1", vec![obj("n1", 0, 6)], false).unwrap();
    assert_eq!((r.adopted, r.refused), (0, 1));
    assert_eq!(m.get_replicas("k").unwrap_err().code, Code::NotFound);
    // A copy allocated after the removal (a newer put of the key) is
    // adopted.
    let later = m.cluster().generation_watermark() + 10;
    let r = report_of(&m, "n1", vec![obj("n1", 4096, later)], true).unwrap();
    assert_eq!((r.adopted, r.refused), (1, 0));
    assert!(m.exists("k").unwrap());
}
