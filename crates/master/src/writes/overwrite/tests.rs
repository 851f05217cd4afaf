//! Overwrites at the metadata level: the new version is invisible until its
//! PutEnd, replaces the old in one step, and the old one's space outlives
//! its readers' leases only. (End to end under concurrent readers in
//! `python/tests/test_overwrite.py`.)

use crate::cluster::allocator::aligned_len;
use crate::master::{Master, PutSpec};
use crate::tests::{master_with, spec};
use std::time::{Duration, Instant};
use strata_common::time::unix_ms;
use strata_common::Code;

fn overwrite(key: &str, size: u64) -> PutSpec {
    PutSpec {
        overwrite: true,
        ..spec(key, size, 1)
    }
}

/// Starts an overwrite; returns the generation its PutEnd names.
fn start(m: &Master, key: &str, size: u64) -> u64 {
    let r = m.put_start(overwrite(key, size)).unwrap();
    assert_eq!(r.len(), 1);
    r[0].grant.as_ref().unwrap().generation
}

fn end(m: &Master, key: &str, crc: u32, generation: u64) -> strata_common::Result<()> {
    m.put_end_of(key, crc, &[], Some(generation)).map(|_| ())
}

fn committed(m: &Master, key: &str) -> (u64, u32) {
    let r = m.get_replicas(key).unwrap();
    (r.size, r.crc32c)
}

fn put(m: &Master, key: &str, size: u64, crc: u32) {
    m.put_start(spec(key, size, 1)).unwrap();
    m.put_end(key, crc).unwrap();
}

fn aligned(size: u64) -> u64 {
    aligned_len(size).unwrap()
}

#[test]
fn the_new_version_is_invisible_until_its_put_end_then_replaces_the_old() {
    let m = master_with(1, 1 << 20, |_| {});
    put(&m, "k", 100, 1);
    let g = start(&m, "k", 200);
    // Readers still get the old version, whole.
    assert_eq!(committed(&m, "k"), (100, 1));
    assert!(m.exists("k").unwrap());
    assert_eq!(m.committed_size("k").unwrap(), Some(100));
    end(&m, "k", 2, g).unwrap();
    assert_eq!(committed(&m, "k"), (200, 2));
    assert_eq!(m.metrics.keys.get(), 1, "one key, whatever its versions");
    assert_eq!(m.metrics.overwrites.get(), 1);
    // A repeated PutEnd of the same version is answered as done.
    end(&m, "k", 2, g).unwrap();
    assert_eq!(committed(&m, "k"), (200, 2));
}

#[test]
fn the_old_version_keeps_its_space_until_its_read_lease_ends() {
    let m = master_with(1, 1 << 20, |_| {});
    put(&m, "k", 100, 1);
    let lease_until = m.get_replicas("k").unwrap().lease_until_unix_ms;
    assert!(lease_until > unix_ms());
    let g = start(&m, "k", 200);
    end(&m, "k", 2, g).unwrap();
    // A reader that asked before the swap may still be reading the old
    // range: it stays allocated.
    assert_eq!(m.allocated_bytes(), aligned(100) + aligned(200));
    assert_eq!(m.metrics.retired_bytes.get(), aligned(100) as i64);
    assert_eq!(m.free_retired(unix_ms()), 0, "still leased");
    assert_eq!(m.allocated_bytes(), aligned(100) + aligned(200));
    assert_eq!(m.free_retired(lease_until), 1, "its lease is over");
    assert_eq!(m.allocated_bytes(), aligned(200));
    assert_eq!(m.metrics.retired_bytes.get(), 0);
    assert_eq!(m.free_retired(lease_until + 1), 0, "freed once");
}

/// A reader of the replaced version that says it is done (its lease end
/// names that version) frees it with the last such reader, long before
/// the lease TTL; an end naming another version frees nothing.
#[test]
fn the_old_version_is_freed_when_its_last_reader_is_done() {
    let m = master_with(1, 1 << 20, |c| c.lease_ttl = Duration::from_secs(60));
    put(&m, "k", 100, 1);
    let old =
        |r: &strata_proto::GetReplicasResponse| r.replicas[0].grant.as_ref().unwrap().generation;
    let (a, b) = (m.get_replicas("k").unwrap(), m.get_replicas("k").unwrap());
    let g = start(&m, "k", 200);
    end(&m, "k", 2, g).unwrap();
    let ended = |generation| {
        m.report_reads(&strata_proto::ReportReadsRequest {
            ended: vec![strata_proto::LeaseEnd {
                key: "k".into(),
                generation,
            }],
            ..Default::default()
        })
        .unwrap()
    };
    ended(old(&a));
    assert_eq!(m.free_retired(unix_ms()), 0, "one reader left");
    ended(g + 1000); // no such version
    assert_eq!(m.free_retired(unix_ms()), 0, "one reader left");
    ended(old(&b));
    assert_eq!(m.free_retired(unix_ms()), 1, "its last reader is done");
    assert_eq!(m.allocated_bytes(), aligned(200));
    // The ends counted: two ended, one stale.
    let ends = |o: &str| m.metrics.lease_ends.with_label_values(&[o]).get();
    assert_eq!((ends("ended"), ends("stale")), (2, 1));
}

#[test]
fn an_unread_old_version_is_freed_at_the_swap() {
    let m = master_with(1, 1 << 20, |_| {});
    put(&m, "k", 100, 1);
    let g = start(&m, "k", 200);
    assert_eq!(m.allocated_bytes(), aligned(100) + aligned(200));
    end(&m, "k", 2, g).unwrap();
    assert_eq!(m.allocated_bytes(), aligned(200));
    assert_eq!(m.metrics.retired_bytes.get(), 0);
}

#[test]
fn a_plain_put_of_a_present_key_is_still_refused() {
    let m = master_with(1, 1 << 20, |_| {});
    put(&m, "k", 100, 1);
    let e = m.put_start(spec("k", 100, 1)).unwrap_err();
    assert_eq!(e.code, Code::AlreadyExists, "{e}");
    // Removing the key drops an overwrite of it being written too (its
    // nodes may hold it announced: a rebuild would bring the key back after
    // the removal was answered — found by the HA nemesis). Its PutEnd finds
    // nothing, nothing stays allocated, and the key is free for a put.
    let g = start(&m, "k", 200);
    m.remove("k", false).unwrap();
    assert_eq!(end(&m, "k", 2, g).unwrap_err().code, Code::NotFound);
    assert_eq!((m.allocated_bytes(), m.metrics.keys.get()), (0, 0));
    m.put_start(spec("k", 100, 1)).unwrap();
    assert_eq!(m.metrics.keys.get(), 1);
}

#[test]
fn an_overwrite_waits_for_another_write_of_the_key() {
    let m = master_with(1, 1 << 20, |_| {});
    // A plain put still being written.
    m.put_start(spec("k", 100, 1)).unwrap();
    let e = m.put_start(overwrite("k", 100)).unwrap_err();
    assert_eq!(e.code, Code::NotReady, "{e}");
    assert!(e.retryable());
    m.put_end("k", 1).unwrap();
    // Another overwrite in progress.
    let g = start(&m, "k", 100);
    let e = m.put_start(overwrite("k", 300)).unwrap_err();
    assert_eq!(e.code, Code::NotReady, "{e}");
    assert!(e.retryable());
    end(&m, "k", 2, g).unwrap();
    let g = start(&m, "k", 300);
    end(&m, "k", 3, g).unwrap();
    assert_eq!(committed(&m, "k"), (300, 3));
}

#[test]
fn put_end_and_revoke_act_only_on_the_version_they_name() {
    let m = master_with(1, 1 << 20, |_| {});
    put(&m, "k", 100, 1);
    let g = start(&m, "k", 200);
    // Another version's (a late or repeated call of an earlier writer).
    for wrong in [g + 1, g + 1000] {
        assert_eq!(end(&m, "k", 9, wrong).unwrap_err().code, Code::NotFound);
        assert!(m.put_revoke_of("k", Some(wrong)).is_err());
    }
    // Naming the committed version: answered as for it.
    assert_eq!(
        end(&m, "k", 9, g - 1).unwrap_err().code,
        Code::AlreadyExists
    );
    // Without a version, a PutEnd is of the committed key, as before.
    assert_eq!(
        m.put_end("k", 9).unwrap_err().code,
        Code::AlreadyExists,
        "the committed version has another checksum"
    );
    assert_eq!(committed(&m, "k"), (100, 1));
    // Revoking the overwrite keeps the old version and frees the new range.
    m.put_revoke_of("k", Some(g)).unwrap();
    assert_eq!(committed(&m, "k"), (100, 1));
    assert_eq!(m.allocated_bytes(), aligned(100));
    assert_eq!(m.metrics.keys.get(), 1);
    assert_eq!(end(&m, "k", 2, g).unwrap_err().code, Code::NotFound);
    // And the key can be overwritten again.
    let g = start(&m, "k", 300);
    end(&m, "k", 3, g).unwrap();
    assert_eq!(committed(&m, "k"), (300, 3));
}

#[test]
fn an_abandoned_overwrite_is_reclaimed_and_the_old_version_stays() {
    let m = master_with(1, 1 << 20, |c| c.put_timeout = Duration::from_millis(1));
    put(&m, "k", 100, 1);
    let g = start(&m, "k", 200);
    assert_eq!(
        m.reclaim_expired_puts(Instant::now() + Duration::from_secs(1)),
        1
    );
    assert_eq!(committed(&m, "k"), (100, 1));
    assert_eq!(m.allocated_bytes(), aligned(100));
    assert_eq!(m.metrics.keys.get(), 1);
    assert_eq!(end(&m, "k", 2, g).unwrap_err().code, Code::NotFound);
}

#[test]
fn an_overwrite_of_an_absent_key_is_a_put() {
    let m = master_with(1, 1 << 20, |_| {});
    let g = start(&m, "k", 100);
    let e = m.get_replicas("k").unwrap_err();
    assert_eq!(e.code, Code::NotReady, "being written, as any put");
    end(&m, "k", 1, g).unwrap();
    assert_eq!(committed(&m, "k"), (100, 1));
    assert_eq!(m.metrics.overwrites.get(), 0, "nothing was replaced");
}

#[test]
fn a_lost_node_takes_the_overwrite_written_there() {
    let m = master_with(2, 1 << 20, |_| {});
    m.put_start(PutSpec {
        preferred_segment: Some(1),
        ..spec("k", 100, 1)
    })
    .unwrap();
    m.put_end("k", 1).unwrap();
    let seg_of = |r: &[strata_proto::Replica]| r[0].node_id.clone();
    let r = m
        .put_start(PutSpec {
            preferred_segment: Some(2),
            ..overwrite("k", 200)
        })
        .unwrap();
    let (g, node) = (r[0].grant.as_ref().unwrap().generation, seg_of(&r));
    assert_ne!(node, m.get_replicas("k").unwrap().replicas[0].node_id);
    m.drop_node(&node, "test");
    assert_eq!(m.metrics.keys.get(), 1);
    assert_eq!(end(&m, "k", 2, g).unwrap_err().code, Code::NotFound);
    assert_eq!(committed(&m, "k"), (100, 1), "the old version stays");
    // The key takes a new overwrite.
    let g = start(&m, "k", 300);
    end(&m, "k", 3, g).unwrap();
    assert_eq!(committed(&m, "k"), (300, 3));
}

/// After a failover to a master whose clock is behind, an overwrite must
/// still get a newer generation than the version it replaces (a rebuild
/// keeps the newest); a node's absurd claim does not move the counter.
#[test]
fn versions_adopted_from_nodes_raise_the_generations_given_out() {
    let m = master_with(1, 1 << 20, |_| {});
    let ahead = (unix_ms() + 3_600_000) << 16; // an hour ahead of this clock
    let report = |key: &str, offset: u64, generation: u64| {
        let n = m.cluster().node("n0").unwrap();
        m.adopt_node_objects(&strata_proto::ReportNodeObjectsRequest {
            node_id: "n0".into(),
            incarnation: n.incarnation,
            instance_proof: crate::tests::NODE_PROOF.to_vec(),
            objects: vec![m.signed(
                "n0",
                strata_proto::NodeObject {
                    key: key.into(),
                    local_segment: 0,
                    offset,
                    length: 100,
                    crc32c: 1,
                    generation,
                    ..Default::default()
                },
            )],
            last: false,
        })
        .unwrap()
    };
    assert_eq!(report("k", 0, ahead).adopted, 1);
    let g = start(&m, "k", 200);
    assert!(
        g > ahead,
        "the overwrite's generation {g} is older than the adopted {ahead}"
    );
    end(&m, "k", 2, g).unwrap();
    assert_eq!(committed(&m, "k"), (200, 2));
    // A claim beyond a day ahead is adopted but does not drag the counter.
    assert_eq!(report("far", 4096, u64::MAX - 1).adopted, 1);
    assert!(start(&m, "other", 100) < u64::MAX - 1);
}

/// A PutEnd that arrives after its put was reclaimed (--put-timeout) and
/// the key put again by another writer: naming its version, it neither
/// commits nor revokes the other writer's bytes.
#[test]
fn a_late_put_end_never_ends_another_writers_put() {
    let m = master_with(1, 1 << 20, |c| c.put_timeout = Duration::from_millis(1));
    let late = m.put_start(spec("k", 100, 1)).unwrap()[0]
        .grant
        .as_ref()
        .unwrap()
        .generation;
    assert_eq!(
        m.reclaim_expired_puts(Instant::now() + Duration::from_secs(1)),
        1
    );
    let other = m.put_start(spec("k", 100, 1)).unwrap()[0]
        .grant
        .as_ref()
        .unwrap()
        .generation;
    assert_eq!(end(&m, "k", 1, late).unwrap_err().code, Code::NotFound);
    assert!(m.put_revoke_of("k", Some(late)).is_err());
    assert_eq!(
        m.get_replicas("k").unwrap_err().code,
        Code::NotReady,
        "still being written"
    );
    end(&m, "k", 2, other).unwrap();
    assert_eq!(committed(&m, "k"), (100, 2));
}

/// DRAM a replaced version holds for a reader's lease frees when the lease
/// ends: a put that needs it waits for it (`--put-wait`) instead of being
/// refused, and one that no waiting can serve is still refused at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_waits_for_a_replaced_version_its_reader_still_holds() {
    let m = master_with(1, 1 << 20, |c| c.put_wait = Duration::from_secs(10));
    let size = 400 << 10;
    put(&m, "k", size, 1);
    let lease_until = m.get_replicas("k").unwrap().lease_until_unix_ms;
    // The new version is pinned: eviction can free nothing.
    let pinned = PutSpec {
        hard_pin: true,
        ..overwrite("k", size)
    };
    let g = m.put_start(pinned).unwrap()[0]
        .grant
        .as_ref()
        .unwrap()
        .generation;
    end(&m, "k", 2, g).unwrap();
    assert_eq!(m.metrics.retired_bytes.get(), aligned(size) as i64);
    let waiting = {
        let m = m.clone();
        tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            let pinned = PutSpec {
                hard_pin: true,
                ..spec("other", size, 1)
            };
            m.put_start_waiting(pinned, deadline).await
        })
    };
    assert!(
        crate::tests::wait_for(|| m.pressure().waiting() == 1).await,
        "the put waits for the replaced version"
    );
    assert!(!waiting.is_finished());
    assert_eq!(m.free_retired(lease_until), 1);
    let placed = waiting.await.unwrap().unwrap();
    assert_eq!(placed.len(), 1);
    m.put_end("other", 3).unwrap();
    // Nothing left to wait for: refused at once, not after --put-wait.
    let t0 = Instant::now();
    let e = m
        .put_start_waiting(
            spec("third", size, 1),
            Instant::now() + Duration::from_secs(10),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code, Code::NoSpace, "{e}");
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
}
