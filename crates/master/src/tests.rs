//! Unit tests of the master's API as a whole, and the helpers every owner's
//! tests share (`cluster/tests.rs`, `pressure/tests.rs`, `writes/tests.rs`,
//! …): a master with fake node registrations. The master never talks to
//! nodes, so no sockets are needed here; the same behaviours run end to end
//! in `tests/`.

use crate::config::MasterConfig;
use crate::master::{Master, PutSpec};
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

/// Housekeeping drops no node while its leadership is unsure: a leader
/// resumed from a pause longer than its lease would act on what it saw
/// before (every node silent). A master whose leadership stands drops its
/// silent node meanwhile, on the same ticks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn housekeeping_drops_no_node_while_its_leadership_is_unsure() {
    use crate::election::{Election, MemElection};
    use tokio_util::sync::CancellationToken;
    let ttl = Duration::from_millis(600);
    let lead =
        |e: MemElection| async move { e.campaign("m:1", &CancellationToken::new()).await.unwrap() };
    let (lapsed, standing) = (MemElection::new(0, ttl), MemElection::new(0, ttl));
    let lapsed_l = lead(lapsed.clone()).await;
    let standing_l = lead(standing).await;
    lapsed.expire_lease();
    let t0 = Instant::now();
    while lapsed_l.is_valid() && t0.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!lapsed_l.is_valid(), "the lapsed leadership stays valid");
    assert!(standing_l.is_valid());
    let silent = |m: &Master| {
        m.cluster()
            .node("n0")
            .unwrap()
            .last_heartbeat_ms
            .store(1, std::sync::atomic::Ordering::Relaxed)
    };
    let cfg = |c: &mut MasterConfig| c.node_ttl = Duration::from_millis(200);
    let (unsure, sure) = (master_with(1, 1 << 20, cfg), master_with(1, 1 << 20, cfg));
    silent(&unsure);
    silent(&sure);
    let stop = CancellationToken::new();
    let a = tokio::spawn(super::housekeeping(unsure.clone(), lapsed_l, stop.clone()));
    let b = tokio::spawn(super::housekeeping(sure.clone(), standing_l, stop.clone()));
    let t0 = Instant::now();
    while sure.stat().nodes > 0 && t0.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(sure.stat().nodes, 0, "the sure master keeps a silent node");
    assert_eq!(unsure.stat().nodes, 1, "dropped by an unsure leader");
    stop.cancel();
    a.await.unwrap();
    b.await.unwrap();
}
