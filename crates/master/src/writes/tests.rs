//! Unit tests of the commit sync of `Writes` through the master's API: a
//! PutEnd, a revoke or a removal is answered once its nodes applied it.

use crate::master::{Master, PutSpec};
use crate::tests::{master_with, spec, NODE_PROOF};
use futures::FutureExt;
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_common::Code;
use strata_proto as pb;

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

fn bound(key: &str, overwrite: bool) -> PutSpec {
    PutSpec {
        bind: true,
        overwrite,
        ..spec(key, 1000, 1)
    }
}

fn end_req(key: &str, generation: Option<u64>, token: &[u8]) -> pb::PutEndRequest {
    pb::PutEndRequest {
        key: key.into(),
        crc32c: 7,
        receipts: Vec::new(),
        generation,
        put_token: token.to_vec(),
        ..Default::default()
    }
}

/// A bound put (`PutStartRequest.bind`) is ended or revoked only with the
/// put token its PutStart answered: no other client can commit or revoke
/// it by naming its key and (guessable) generation.
#[test]
fn a_bound_put_ends_only_with_its_token() {
    let m = master_with(1, 1 << 20, |_| {});
    for key in ["k", "r"] {
        let r = m.put_start(bound(key, false)).unwrap();
        let g = r[0].grant.as_ref().unwrap().generation;
        let token = m.put_token(key, g);
        let other = m.put_token("another", g);
        for (generation, t) in [
            (None, &[][..]),
            (Some(g), &other[..]),
            (Some(g), &token[..4]),
        ] {
            let e = m
                .put_end_request(&end_req(key, generation, t))
                .err()
                .unwrap();
            assert_eq!(e.code, Code::PermissionDenied, "{e}");
            let e = m.put_revoke_proved(key, generation, Some(t)).err().unwrap();
            assert_eq!(e.code, Code::PermissionDenied, "{e}");
        }
        assert!(!m.exists(key).unwrap(), "still being written");
        if key == "k" {
            m.put_end_request(&end_req(key, Some(g), &token)).unwrap();
            assert_eq!(m.get_replicas(key).unwrap().crc32c, 7);
            // Ended: a repeat of its own PutEnd is still fine.
            m.put_end_request(&end_req(key, Some(g), &token)).unwrap();
        } else {
            m.put_revoke_proved(key, None, Some(&token)).unwrap();
            assert_eq!(m.get_replicas(key).unwrap_err().code, Code::NotFound);
        }
    }
    // An unbound put (a client that predates tokens) needs none.
    m.put_start(spec("old", 1000, 1)).unwrap();
    m.put_end_request(&end_req("old", None, &[])).unwrap();
}

/// The same for an overwrite's new version: its swap and its revoke need
/// the token, and the committed version is untouched meanwhile.
#[test]
fn a_bound_overwrite_ends_only_with_its_token() {
    let m = master_with(1, 1 << 20, |_| {});
    m.put_start(spec("k", 1000, 1)).unwrap();
    m.put_end("k", 1).unwrap();
    // Committed first, then revoked.
    for revoke in [false, true] {
        let before = m.get_replicas("k").unwrap().crc32c;
        let r = m.put_start(bound("k", true)).unwrap();
        let g = r[0].grant.as_ref().unwrap().generation;
        let token = m.put_token("k", g);
        let e = m
            .put_end_request(&end_req("k", Some(g), &[]))
            .err()
            .unwrap();
        assert_eq!(e.code, Code::PermissionDenied, "{e}");
        let e = m.put_revoke_proved("k", Some(g), None).err().unwrap();
        assert_eq!(e.code, Code::PermissionDenied, "{e}");
        assert_eq!(
            m.get_replicas("k").unwrap().crc32c,
            before,
            "the old version"
        );
        if revoke {
            m.put_revoke_proved("k", Some(g), Some(&token)).unwrap();
            assert_eq!(m.get_replicas("k").unwrap().crc32c, before);
            assert!(m.put_end_request(&end_req("k", Some(g), &token)).is_err());
        } else {
            m.put_end_request(&end_req("k", Some(g), &token)).unwrap();
            assert_eq!(m.get_replicas("k").unwrap().crc32c, 7);
        }
    }
}

fn end_with(key: &str, generation: Option<u64>, digest: &[u8]) -> pb::PutEndRequest {
    pb::PutEndRequest {
        blake3: digest.to_vec(),
        ..end_req(key, generation, &[])
    }
}

/// `--integrity blake3`: a PutEnd commits only with a 32-byte digest, and
/// every lookup (of a first put and of an overwrite's new version) hands
/// readers the writer's digest; without the flag a digest sent is still
/// recorded and one is never required.
#[test]
fn integrity_blake3_commits_only_with_the_writers_digest() {
    use crate::config::Integrity;
    let (d1, d2) = ([1u8; 32], [2u8; 32]);
    for integrity in [Integrity::Blake3, Integrity::Crc32c] {
        let m = master_with(1, 1 << 20, |c| c.integrity = integrity);
        let r = m.put_start(spec("k", 1000, 1)).unwrap();
        let g = r[0].grant.as_ref().unwrap().generation;
        for bad in [&d1[..31], &[1u8; 33][..], &[][..]] {
            let refused = m.put_end_request(&end_with("k", Some(g), bad));
            if bad.is_empty() && integrity == Integrity::Crc32c {
                continue;
            }
            let e = refused.err().unwrap();
            assert_eq!(e.code, Code::InvalidArgument, "{e}");
            assert!(!m.exists("k").unwrap(), "committed by {} bytes", bad.len());
        }
        if integrity == Integrity::Crc32c {
            // Committed above without a digest: none is handed out.
            assert!(m.get_replicas("k").unwrap().blake3.is_empty());
            continue;
        }
        m.put_end_request(&end_with("k", Some(g), &d1)).unwrap();
        assert_eq!(m.get_replicas("k").unwrap().blake3, d1);
        // A repeat of the PutEnd with another digest is not these bytes.
        let e = m
            .put_end_request(&end_with("k", Some(g), &d2))
            .err()
            .unwrap();
        assert_eq!(e.code, Code::AlreadyExists, "{e}");
        // An overwrite's new version brings its own.
        let r = m
            .put_start(PutSpec {
                overwrite: true,
                ..spec("k", 1000, 1)
            })
            .unwrap();
        let g2 = r[0].grant.as_ref().unwrap().generation;
        assert!(m.put_end_request(&end_with("k", Some(g2), &[])).is_err());
        assert_eq!(m.get_replicas("k").unwrap().blake3, d1, "the old version");
        m.put_end_request(&end_with("k", Some(g2), &d2)).unwrap();
        assert_eq!(m.get_replicas("k").unwrap().blake3, d2);
    }
}

/// A PutStart sent again by the attempt that started a put still being
/// written (its first answer was lost) gets that put back — the same
/// ranges, nothing allocated twice — while another put of the key, a
/// repeat asked another way, or a repeat after the put ended, is refused;
/// a repeat of a put that lost a copy with its node replaces it.
#[test]
fn a_repeated_put_start_of_the_same_attempt_gets_its_put_back() {
    let m = master_with(2, 1 << 20, |_| {});
    let attempt = |a: u64, size: u64| PutSpec {
        attempt: a,
        ..spec("k", size, 2)
    };
    let first = m.put_start(attempt(7, 100)).unwrap();
    let used = m.allocated_bytes();
    let again = m.put_start(attempt(7, 100)).unwrap();
    assert_eq!(again.len(), 2);
    let range = |r: &[pb::Replica]| -> Vec<(u64, u64)> {
        r.iter().map(|r| (r.segment_id, r.offset)).collect()
    };
    assert_eq!(range(&again), range(&first), "the same put");
    assert_eq!(m.allocated_bytes(), used, "nothing allocated twice");
    // Another put, none named, or the same name asked another way.
    for other in [attempt(8, 100), attempt(0, 100), attempt(7, 200)] {
        let e = m.put_start(other).unwrap_err();
        assert_eq!(e.code, Code::AlreadyExists);
    }
    assert_eq!(m.allocated_bytes(), used);
    // The put loses a copy with its node: the same attempt's repeat drops
    // it and starts afresh (on the node left, with what it can place).
    let lost = &first[0].node_id;
    m.drop_node(lost, "test");
    let again = m.put_start(attempt(7, 100)).unwrap();
    assert_eq!(again.len(), 1);
    assert_ne!(&again[0].node_id, lost);
    assert_eq!(m.metrics.keys.get(), 1);
    m.put_end("k", 0).unwrap();
    assert_eq!(m.get_replicas("k").unwrap().size, 100);
    let e = m.put_start(attempt(7, 100)).unwrap_err();
    assert_eq!(e.code, Code::AlreadyExists, "ended: no longer resumed");
}
