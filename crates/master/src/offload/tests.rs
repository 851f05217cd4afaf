//! Admission policies and SSD removals at the metadata level: each policy
//! queues exactly what it promises. (The same run end to end in
//! `tests/tests/ssd_policies.rs`.)

use crate::config::OffloadPolicy;
use crate::master::Master;
use crate::tests::{master_with, put};
use std::sync::Arc;
use strata_proto as pb;

pub(crate) async fn with_owner(
    policy: OffloadPolicy,
    seg: u64,
    hw: f64,
) -> (Arc<Master>, u64, u64) {
    let m = master_with(1, seg, |c| {
        c.offload_policy = policy;
        c.high_watermark = hw;
        c.eviction_ratio = 0.0;
        c.lease_ttl = std::time::Duration::from_millis(1);
    });
    let r = register(&m, "h/nvme0").await;
    (m, r.owner_id, r.epoch)
}

/// The instance proof the fake agent of these tests registers with.
pub(crate) const PROOF: &[u8] = &[7u8; 32];

/// A 100-byte copy of `key` an owner reports in its inventory.
fn obj(key: &str, crc32c: u32, copy_record: Vec<u8>) -> pb::SsdObject {
    pb::SsdObject {
        key: key.into(),
        bucket_id: 3,
        offset: 64,
        length: 100,
        crc32c,
        copy_record,
    }
}

/// Puts 100 bytes at `key` (an overwrite when `overwrite`) whose writer
/// declared digest `d` (`--integrity blake3`).
fn put_with_digest(m: &Master, key: &str, overwrite: bool, d: [u8; 32]) {
    let spec = crate::master::PutSpec {
        overwrite,
        ..crate::tests::spec(key, 100, 1)
    };
    let g = m.put_start(spec).unwrap()[0]
        .grant
        .as_ref()
        .unwrap()
        .generation;
    m.put_end_request(&pb::PutEndRequest {
        key: key.into(),
        generation: Some(g),
        blake3: d.to_vec(),
        ..Default::default()
    })
    .unwrap();
}

/// A whole inventory (one page) of `owner`.
fn inventory(owner: u64, epoch: u64, objects: Vec<pb::SsdObject>) -> pb::ReportInventoryRequest {
    pb::ReportInventoryRequest {
        instance_proof: PROOF.to_vec(),
        owner_id: owner,
        epoch,
        objects,
        relocation: false,
        more: false,
    }
}

/// Registers an SSD owner of 1 GiB under `handle`.
pub(crate) async fn register(m: &Master, handle: &str) -> pb::RegisterOwnerResponse {
    m.register_owner(pb::RegisterOwnerRequest {
        instance_proof: PROOF.to_vec(),
        handle: handle.into(),
        data_addr: "127.0.0.1:1".into(),
        capacity_bytes: 1 << 30,
        instance: "i".into(),
    })
    .await
    .unwrap()
}

pub(crate) fn queued_keys(m: &Master) -> Vec<String> {
    let mut v: Vec<String> = m
        .ssd()
        .queued_tasks()
        .into_iter()
        .map(|t| t.key.clone())
        .collect();
    v.sort();
    v
}

/// An agent's heartbeat taking up to `max_tasks` tasks.
pub(crate) fn heartbeat(
    m: &Master,
    owner: u64,
    epoch: u64,
    max_tasks: u32,
) -> pb::OwnerHeartbeatResponse {
    m.owner_heartbeat(&pb::OwnerHeartbeatRequest {
        instance_proof: PROOF.to_vec(),
        owner_id: owner,
        epoch,
        capacity_bytes: 1 << 30,
        max_tasks,
        ..Default::default()
    })
    .unwrap()
}

/// Takes every task and reports it persisted, as an agent would.
pub(crate) async fn persist_all(m: &Master, owner: u64, epoch: u64) -> usize {
    let tasks = heartbeat(m, owner, epoch, 1000).tasks;
    let n = tasks.len();
    report_results(m, owner, epoch, persisted(&tasks)).await;
    n
}

/// Each task persisted, at its own offset of bucket 1.
pub(crate) fn persisted(tasks: &[pb::OffloadTask]) -> Vec<pb::OffloadResult> {
    tasks
        .iter()
        .enumerate()
        .map(|(i, t)| pb::OffloadResult {
            task_id: t.task_id,
            persisted: true,
            bucket_id: 1,
            offset: i as u64 * 4096,
            ..Default::default()
        })
        .collect()
}

/// Reports one task persisted at `offset` of bucket 1.
pub(crate) async fn report(m: &Master, owner: u64, epoch: u64, task_id: u64, offset: u64) {
    let r = pb::OffloadResult {
        task_id,
        persisted: true,
        bucket_id: 1,
        offset,
        ..Default::default()
    };
    report_results(m, owner, epoch, vec![r]).await;
}

pub(crate) async fn report_results(
    m: &Master,
    owner: u64,
    epoch: u64,
    results: Vec<pb::OffloadResult>,
) {
    m.report_offload(pb::ReportOffloadRequest {
        instance_proof: PROOF.to_vec(),
        owner_id: owner,
        epoch,
        results,
    })
    .unwrap();
}

pub(crate) fn on_ssd(m: &Master, key: &str) -> bool {
    m.objects()
        .shard(key)
        .get(key)
        .is_some_and(|o| !o.ssd().is_empty())
}

#[tokio::test]
async fn eager_queues_every_object_at_put_end() {
    let (m, _, _) = with_owner(OffloadPolicy::Eager, 1 << 20, 0.9).await;
    put(&m, "a", 100);
    put(&m, "b", 100);
    assert_eq!(queued_keys(&m), ["a", "b"]);
}

#[tokio::test]
async fn reads_n_queues_after_n_dram_reads_once_and_never_objects_on_ssd() {
    let (m, owner, epoch) = with_owner(OffloadPolicy::Reads(2), 1 << 20, 0.9).await;
    put(&m, "k", 100);
    assert!(queued_keys(&m).is_empty(), "a put alone does not admit");
    m.get_replicas("k").unwrap();
    assert!(queued_keys(&m).is_empty(), "one read is not enough");
    m.get_replicas("k").unwrap();
    assert_eq!(queued_keys(&m), ["k"]);
    m.get_replicas("k").unwrap();
    assert_eq!(queued_keys(&m), ["k"], "already queued: not queued twice");
    assert_eq!(persist_all(&m, owner, epoch).await, 1);
    assert!(on_ssd(&m, "k"));
    for _ in 0..5 {
        m.get_replicas("k").unwrap();
    }
    assert!(
        queued_keys(&m).is_empty(),
        "already on SSD: never queued again"
    );
    // Internal reads (offload copies) never pass through GetReplicas, and
    // reads of an SSD-only object are not DRAM reads.
    put(&m, "s", 100);
    std::thread::sleep(std::time::Duration::from_millis(5)); // read leases end
    m.evict_memory("k").unwrap();
    for _ in 0..3 {
        m.get_replicas("k").unwrap();
    }
    assert!(queued_keys(&m).is_empty());
}

#[tokio::test]
async fn on_evict_offloads_victims_before_freeing_and_drops_what_ssd_cannot_take() {
    // 1 MiB of DRAM, background eviction above half of it.
    let (m, owner, epoch) = with_owner(OffloadPolicy::OnEvict, 1 << 20, 0.5).await;
    for i in 0..12 {
        put(&m, &format!("k{i:02}"), 64 << 10);
    }
    assert!(queued_keys(&m).is_empty(), "nothing is queued at put time");
    let before = m.allocated_bytes();
    assert_eq!(m.evict_to_watermark(), 0, "victims wait for their SSD copy");
    let victims = queued_keys(&m);
    assert!(!victims.is_empty());
    assert_eq!(victims[0], "k00", "oldest first");
    assert_eq!(m.allocated_bytes(), before);
    // A second pass does not queue more: the queued bytes already count.
    m.evict_to_watermark();
    assert_eq!(queued_keys(&m), victims);
    assert_eq!(persist_all(&m, owner, epoch).await, victims.len());
    for k in &victims {
        assert!(on_ssd(&m, k), "{k} has its SSD copy");
        let o = m.objects().shard(k);
        assert!(
            o.get(k).unwrap().replicas().is_empty(),
            "{k}'s DRAM was freed"
        );
    }
    assert!(m.allocated_bytes() <= (1 << 20) / 2);
    assert_eq!(m.objects().len(), 12, "nothing was lost");

    // With no owner able to take them, victims are simply dropped.
    let m2 = master_with(1, 1 << 20, |c| {
        c.offload_policy = OffloadPolicy::OnEvict;
        c.high_watermark = 0.5;
        c.eviction_ratio = 0.0;
    });
    for i in 0..12 {
        put(&m2, &format!("k{i:02}"), 64 << 10);
    }
    assert!(m2.evict_to_watermark() > 0);
    assert!(m2.objects().len() < 12);
    assert!(m2.ssd().queued_tasks().into_iter().next().is_none());
}

#[tokio::test]
async fn removing_a_key_tells_its_owner_to_drop_the_ssd_copy() {
    let (m, owner, epoch) = with_owner(OffloadPolicy::Eager, 1 << 20, 0.9).await;
    put(&m, "k", 100);
    persist_all(&m, owner, epoch).await;
    m.remove("k", false).unwrap();
    let hb = heartbeat(&m, owner, epoch, 0);
    assert_eq!(hb.drops.len(), 1);
    assert_eq!((hb.drops[0].key.as_str(), hb.drops[0].bucket_id), ("k", 1));
    let again = heartbeat(&m, owner, epoch, 0);
    assert!(again.drops.is_empty(), "delivered once");
    // Evicting a bucket forgets its replicas before the agent deletes it.
    put(&m, "e", 100);
    persist_all(&m, owner, epoch).await;
    m.evict_memory("e").unwrap();
    let r = m
        .evict_buckets(&pb::EvictBucketsRequest {
            instance_proof: PROOF.to_vec(),
            owner_id: owner,
            epoch,
            bucket_ids: vec![1],
        })
        .unwrap();
    assert_eq!(r.replicas_dropped, 1);
    assert!(!m.exists("e").unwrap(), "no replica left: the key is gone");
    let stale = m.evict_buckets(&pb::EvictBucketsRequest {
        instance_proof: PROOF.to_vec(),
        owner_id: owner,
        epoch: epoch + 1,
        bucket_ids: vec![1],
    });
    assert!(stale.is_err(), "a newer, unknown epoch cannot evict");
    // The owner registers again: its previous epoch is now fenced.
    let again = register(&m, "h/nvme0").await;
    assert_eq!(again.epoch, epoch + 1);
    let older = m.evict_buckets(&pb::EvictBucketsRequest {
        instance_proof: PROOF.to_vec(),
        owner_id: owner,
        epoch,
        bucket_ids: vec![1],
    });
    let e = older.unwrap_err();
    assert_eq!(e.code, strata_common::Code::PermissionDenied, "{e}");
    assert!(e.message.contains("fenced"), "{e}");
}

#[tokio::test]
async fn a_relocation_moves_a_live_copy_and_never_revives_a_removed_key() {
    let (m, owner, epoch) = with_owner(OffloadPolicy::Eager, 1 << 20, 0.9).await;
    put(&m, "live", 100);
    put(&m, "gone", 100);
    persist_all(&m, owner, epoch).await;
    m.remove("gone", false).unwrap();
    let moved = |key: &str| pb::SsdObject {
        key: key.into(),
        bucket_id: 7,
        offset: 64,
        length: 100,
        crc32c: 0,
        copy_record: m.copy_record(key, 100, 0),
    };
    let report = |relocation| pb::ReportInventoryRequest {
        instance_proof: PROOF.to_vec(),
        owner_id: owner,
        epoch,
        objects: vec![moved("live"), moved("gone")],
        relocation,
        more: false,
    };
    m.report_inventory(report(true)).unwrap();
    let live = m
        .objects()
        .shard("live")
        .get("live")
        .unwrap()
        .ssd()
        .to_vec();
    assert_eq!(live.len(), 1, "one copy per owner");
    assert_eq!(
        (live[0].bucket_id, live[0].offset),
        (7, 64),
        "its new place"
    );
    assert!(
        !m.exists("gone").unwrap(),
        "a relocation never revives a removed key"
    );
    let drops = m
        .ssd()
        .take_drops(&pb::OwnerHeartbeatRequest {
            owner_id: owner,
            ..Default::default()
        })
        .0;
    assert!(
        drops.iter().any(|d| d.key == "gone" && d.bucket_id == 7),
        "the owner is told to drop the moved copy: {drops:?}"
    );
    // A restart's inventory, unlike a relocation, may create SSD-only keys,
    // but never one that was removed (its tombstone), whatever restarts.
    m.report_inventory(report(false)).unwrap();
    assert!(!m.exists("gone").unwrap(), "tombstoned");
    let fresh = pb::ReportInventoryRequest {
        objects: vec![moved("fresh")],
        ..report(false)
    };
    m.report_inventory(fresh).unwrap();
    assert!(m.exists("fresh").unwrap());
}

/// A victim whose offload is given up (no room, or refused) while a reader
/// holds it is not left waiting for a copy that will never come: once the
/// lease ends, a later pass decides again.
#[tokio::test]
async fn a_victim_whose_offload_fails_while_leased_is_decided_again() {
    let m = master_with(1, 1 << 20, |c| {
        c.offload_policy = OffloadPolicy::OnEvict;
        c.high_watermark = 0.5;
        c.eviction_ratio = 0.0;
        c.lease_ttl = std::time::Duration::from_millis(200);
    });
    let r = register(&m, "h/nvme0").await;
    for i in 0..12 {
        put(&m, &format!("k{i:02}"), 64 << 10);
    }
    m.evict_to_watermark();
    let victim = queued_keys(&m)[0].clone();
    m.get_replicas(&victim).unwrap();
    let tasks = heartbeat(&m, r.owner_id, r.epoch, 1000).tasks;
    let results = tasks
        .iter()
        .map(|t| pb::OffloadResult {
            task_id: t.task_id,
            code: strata_common::Code::NoSpace as u32,
            error: "disk full".into(),
            ..Default::default()
        })
        .collect();
    m.report_offload(pb::ReportOffloadRequest {
        instance_proof: PROOF.to_vec(),
        owner_id: r.owner_id,
        epoch: r.epoch,
        results,
    })
    .unwrap();
    {
        let s = m.objects().shard(&victim);
        let o = s.get(&victim).expect("leased: not dropped");
        assert!(!o.offload_then_free(), "no longer waiting for a copy");
    }
    // Once its lease ends the victim is decided again (before the fix it
    // stayed "waiting" and was skipped): a full owner is no fault of the
    // object, so it is queued for a copy again.
    assert!(
        crate::tests::wait_for(|| {
            m.evict(u64::MAX);
            queued_keys(&m).contains(&victim)
        })
        .await
    );
    let failed = m
        .objects()
        .shard(&victim)
        .get(&victim)
        .map(|o| o.offload_failed());
    assert_eq!(failed, Some(false));
}

/// Tasks queued for an owner that stopped heartbeating go to a live owner;
/// with none left they are dropped, and `on-evict` victims leave DRAM
/// instead of waiting for a copy forever.
#[tokio::test]
async fn tasks_of_an_owner_that_went_away_move_to_a_live_one_or_are_dropped() {
    let m = master_with(1, 8 << 20, |c| {
        c.offload_policy = OffloadPolicy::Eager;
        c.node_ttl = std::time::Duration::from_millis(50);
    });
    let a = register(&m, "a/nvme0").await.owner_id;
    for i in 0..4 {
        put(&m, &format!("k{i}"), 4096);
    }
    assert!(m.ssd().queued_tasks().into_iter().all(|t| t.owner == a));
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let b = register(&m, "b/nvme0").await.owner_id;
    assert_eq!(m.reassign_orphaned_tasks(strata_common::time::unix_ms()), 4);
    assert_eq!(queued_keys(&m), vec!["k0", "k1", "k2", "k3"]);
    assert!(
        m.ssd().queued_tasks().into_iter().all(|t| t.owner == b),
        "moved to b"
    );
    assert_eq!(m.ssd().pending_bytes(a), 0);

    // No live owner at all: dropped; on-evict victims leave DRAM.
    let m = master_with(1, 1 << 20, |c| {
        c.offload_policy = OffloadPolicy::OnEvict;
        c.high_watermark = 0.5;
        c.eviction_ratio = 0.0;
        c.node_ttl = std::time::Duration::from_millis(50);
    });
    register(&m, "a/nvme0").await;
    for i in 0..12 {
        put(&m, &format!("k{i:02}"), 64 << 10);
    }
    m.evict_to_watermark();
    let victims = queued_keys(&m);
    assert!(!victims.is_empty());
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert_eq!(m.reassign_orphaned_tasks(strata_common::time::unix_ms()), 0);
    assert!(queued_keys(&m).is_empty());
    for k in &victims {
        assert!(!m.exists(k).unwrap(), "{k} left DRAM");
    }
    assert!(m.allocated_bytes() <= (1 << 20) / 2);
}

/// Tasks an owner took before it went silent go back to the queue and on
/// to a live owner as soon as it is counted lost, their sources unpinned —
/// not only when --offload-task-ttl runs out (found by the fleet tests: an
/// agent cut off mid-offload held its sources pinned until then).
#[tokio::test]
async fn tasks_a_lost_owner_had_taken_move_on_without_waiting_for_their_ttl() {
    let m = master_with(1, 8 << 20, |c| {
        c.offload_policy = OffloadPolicy::Eager;
        c.node_ttl = std::time::Duration::from_millis(50);
        c.offload_task_ttl = std::time::Duration::from_secs(600);
    });
    let r = register(&m, "a/nvme0").await;
    for i in 0..3 {
        put(&m, &format!("k{i}"), 4096);
    }
    assert_eq!(heartbeat(&m, r.owner_id, r.epoch, 10).tasks.len(), 3);
    assert_eq!(m.total_pins(), 3, "taken: sources pinned");
    // Still heartbeating: nothing moves.
    assert_eq!(m.reassign_orphaned_tasks(strata_common::time::unix_ms()), 0);
    assert_eq!(m.total_pins(), 3);
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let b = register(&m, "b/nvme0").await.owner_id;
    assert_eq!(m.reassign_orphaned_tasks(strata_common::time::unix_ms()), 3);
    assert_eq!(m.total_pins(), 0, "unpinned");
    assert_eq!(queued_keys(&m), vec!["k0", "k1", "k2"]);
    assert!(m.ssd().queued_tasks().into_iter().all(|t| t.owner == b));
}

/// A copy whose source fails its checksum is not retried (the object's own
/// bytes are bad); a failed read is.
#[tokio::test]
async fn a_corrupted_source_is_dropped_at_once_and_a_failed_read_retried() {
    let (m, owner, epoch) = with_owner(OffloadPolicy::Eager, 1 << 20, 0.99).await;
    put(&m, "bad", 100);
    put(&m, "flaky", 100);
    let tasks = heartbeat(&m, owner, epoch, 10).tasks;
    assert_eq!(tasks.len(), 2);
    let results = tasks
        .iter()
        .map(|t| pb::OffloadResult {
            task_id: t.task_id,
            code: if t.key == "bad" {
                strata_common::Code::Corrupted
            } else {
                strata_common::Code::Unavailable
            } as u32,
            error: "x".into(),
            ..Default::default()
        })
        .collect();
    report_results(&m, owner, epoch, results).await;
    assert_eq!(
        queued_keys(&m),
        vec!["flaky".to_string()],
        "only the read is retried"
    );
    let failed = m
        .objects()
        .shard("bad")
        .get("bad")
        .map(|o| o.offload_failed());
    assert_eq!(failed, Some(true));
    assert_eq!(m.total_pins(), 0);
}

/// The store node of `master_with` confirms everything it was sent.
pub(crate) fn node_confirms_all(m: &Master) {
    let node = m.cluster().node("n0").unwrap();
    if let Some(last) = node.log_page(0).unwrap().last() {
        node.ack(last.seq);
    }
}

/// A removal waits for the SSD owner to confirm it dropped its copy (a new
/// leader would otherwise adopt the copy from the owner's inventory again).
/// Drops are resent until confirmed; a confirmation from another term, or of
/// more than was sent, counts for nothing; an older agent's drops count as
/// done once sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removal_waits_for_the_owner_to_drop_its_copy() {
    let (m, owner, epoch) = with_owner(OffloadPolicy::Eager, 1 << 20, 0.9).await;
    let hb = |applied: u64, term: u64, acks_drops: bool| {
        m.owner_heartbeat(&pb::OwnerHeartbeatRequest {
            instance_proof: PROOF.to_vec(),
            owner_id: owner,
            epoch,
            capacity_bytes: 1 << 30,
            acks_drops,
            drops_applied: applied,
            drops_term: term,
            ..Default::default()
        })
        .unwrap()
    };
    put(&m, "a", 100);
    persist_all(&m, owner, epoch).await;
    let u = m.remove_unsynced("a", false).unwrap();
    node_confirms_all(&m);
    let m2 = m.clone();
    let mut wait = tokio::spawn(async move { m2.await_synced(u, "removal").await });
    let r = hb(0, 0, true);
    assert_eq!(r.drops.len(), 1, "{r:?}");
    let through = r.drops_through;
    assert!(through > 0);
    assert_eq!(hb(0, 0, true).drops.len(), 1, "resent until confirmed");
    assert_eq!(
        hb(through, m.term() + 1, true).drops.len(),
        1,
        "another term"
    );
    assert_eq!(hb(through + 1, m.term(), true).drops.len(), 1, "never sent");
    assert!(
        tokio::time::timeout(std::time::Duration::from_millis(50), &mut wait)
            .await
            .is_err(),
        "answered before the owner confirmed"
    );
    assert!(hb(through, m.term(), true).drops.is_empty());
    wait.await.unwrap().unwrap();
    // Unconfirmed: a retryable error once the bound passes.
    put(&m, "b", 100);
    persist_all(&m, owner, epoch).await;
    let u = m.remove_unsynced("b", false).unwrap();
    node_confirms_all(&m);
    let e = m.await_synced(u, "removal").await.unwrap_err();
    assert!(e.retryable() && e.message.contains("SSD owner"), "{e}");
    // An older agent that does not confirm: each drop once, done when sent.
    put(&m, "c", 100);
    persist_all(&m, owner, epoch).await;
    let u = m.remove_unsynced("c", false).unwrap();
    node_confirms_all(&m);
    // (b's drop already went with persist_all's heartbeat, an older one's.)
    assert_eq!(hb(0, 0, false).drops.len(), 1);
    assert!(hb(0, 0, false).drops.is_empty());
    m.await_synced(u, "removal").await.unwrap();
}

#[tokio::test]
async fn reads_served_from_client_caches_count_towards_admission_but_extend_no_lease() {
    let (m, _, _) = with_owner(OffloadPolicy::Reads(3), 1 << 20, 0.9).await;
    put(&m, "k", 100);
    put(&m, "other", 100);
    let r = m.get_replicas("k").unwrap();
    assert!(
        r.lease_ms > 0 && r.lease_ms <= 1,
        "time left: {}",
        r.lease_ms
    );
    let read = |key: &str, count| pb::KeyReads {
        key: key.into(),
        count,
    };
    let reads = |r: &[pb::KeyReads]| pb::ReportReadsRequest {
        reads: r.to_vec(),
        ended: Vec::new(),
    };
    // One lookup plus one cached read: two of three.
    m.report_reads(&reads(&[read("k", 1), read("gone", 5), read("other", 0)]))
        .unwrap();
    assert!(queued_keys(&m).is_empty());
    m.report_reads(&reads(&[read("k", 1)])).unwrap();
    assert_eq!(queued_keys(&m), ["k"]);
    assert_eq!(
        m.metrics.cached_reads.get(),
        2,
        "unknown keys are not counted"
    );
    // Counting never leases: the object stays evictable.
    std::thread::sleep(std::time::Duration::from_millis(5));
    m.report_reads(&reads(&[read("other", 100)])).unwrap();
    assert!(m.inspect("other").unwrap().lease_until_unix_ms == 0);
    // A bad key fails the whole report, before anything is counted.
    let e = m
        .report_reads(&reads(&[read("other", 1), read("", 1)]))
        .unwrap_err();
    assert_eq!(e.code, strata_common::Code::InvalidArgument);
    assert_eq!(m.metrics.cached_reads.get(), 102);
}

/// A restarted master calls a key absent only once every SSD owner it
/// remembers re-reported its inventory (before, a key only on SSD would be
/// "not found" for a moment: retry instead). An owner that never comes back
/// holds the gate for `--node-ttl` at most and is then forgotten, once; one
/// that registered but has not reported yet is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_master_waits_for_its_ssd_owners_before_calling_keys_absent() {
    use crate::rebuild::members::Member;
    use strata_common::Code;
    let dir = tempfile::tempdir().unwrap();
    let cfg = |ttl: std::time::Duration| {
        let d = dir.path().to_path_buf();
        move |c: &mut crate::config::MasterConfig| {
            c.state_dir = Some(d.clone());
            c.node_ttl = ttl;
        }
    };
    let long = std::time::Duration::from_secs(60);
    let first = master_with(0, 1 << 20, cfg(long));
    let owner = register(&first, "h/0").await.owner_id;
    let other = register(&first, "h/1").await.owner_id;
    drop(first);

    let again = master_with(0, 1 << 20, cfg(long));
    let e = again.exists("on-ssd").unwrap_err();
    assert_eq!(e.code, Code::NotReady, "{e}");
    assert!(e.retryable());
    assert_eq!(
        again
            .put_start(crate::tests::spec("p", 100, 1))
            .unwrap_err()
            .code,
        Code::NotReady
    );
    let r = register(&again, "h/0").await;
    assert_eq!(r.owner_id, owner, "durable owner id");
    assert_eq!(
        again.exists("on-ssd").unwrap_err().code,
        Code::NotReady,
        "registered, inventory to come"
    );
    let obj = pb::SsdObject {
        key: "on-ssd".into(),
        bucket_id: 1,
        offset: 0,
        length: 100,
        crc32c: 9,
        copy_record: again.copy_record("on-ssd", 100, 9),
    };
    again
        .report_inventory(inventory(owner, r.epoch, vec![obj]))
        .unwrap();
    assert_eq!(
        again.exists("unknown").unwrap_err().code,
        Code::NotReady,
        "h/1 still to report"
    );
    assert_eq!(again.gate().missing(), vec![Member::Owner(other)]);
    let r1 = register(&again, "h/1").await;
    // An inventory in pages: reported with its last page only.
    let first_page = pb::ReportInventoryRequest {
        more: true,
        ..inventory(other, r1.epoch, vec![])
    };
    again.report_inventory(first_page).unwrap();
    assert_eq!(
        again.exists("unknown").unwrap_err().code,
        Code::NotReady,
        "h/1 has more pages to send"
    );
    assert_eq!(again.gate().missing(), vec![Member::Owner(other)]);
    again
        .report_inventory(inventory(other, r1.epoch, vec![]))
        .unwrap();
    assert!(again.exists("on-ssd").unwrap(), "reported");
    assert!(
        !again.exists("unknown").unwrap(),
        "every member reported: absent"
    );
    assert!(
        again.lost_members().is_empty(),
        "restarted master within its bound"
    );
    drop(again);

    // h/1 never comes back; h/0 registers but has not reported when the
    // bound passes: only h/1 is lost, and only once.
    let short = std::time::Duration::from_millis(200);
    let third = master_with(0, 1 << 20, cfg(short));
    register(&third, "h/0").await;
    assert!(third.lost_members().is_empty(), "before the bound");
    let t0 = std::time::Instant::now();
    while !third.accepting_writes() {
        assert!(t0.elapsed() < std::time::Duration::from_secs(5));
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(third.lost_members(), vec![Member::Owner(other)]);
    assert!(third.lost_members().is_empty(), "once");
}

/// An overwrite while an agent copies the old version: that copy is never
/// taken for the new version (same size, other bytes), the old range stays
/// allocated while the copier may read it, and pins balance.
#[tokio::test]
async fn a_copy_of_an_overwritten_version_is_never_taken_for_the_new_one() {
    let (m, owner, epoch) = with_owner(OffloadPolicy::Eager, 1 << 20, 0.9).await;
    put(&m, "k", 100);
    let tasks = heartbeat(&m, owner, epoch, 10).tasks;
    assert_eq!(tasks.len(), 1);
    assert_eq!(m.total_pins(), 1);
    let r = m
        .put_start(crate::master::PutSpec {
            overwrite: true,
            ..crate::tests::spec("k", 100, 1)
        })
        .unwrap();
    let g = r[0].grant.as_ref().unwrap().generation;
    m.put_end_of("k", 5, &[], Some(g)).unwrap();
    assert_eq!(m.get_replicas("k").unwrap().crc32c, 5);
    // The copier may still read the old range until its task's deadline.
    let both = 2 * crate::cluster::allocator::aligned_len(100).unwrap();
    assert_eq!(m.allocated_bytes(), both);
    report_results(&m, owner, epoch, persisted(&tasks)).await;
    assert!(
        !on_ssd(&m, "k"),
        "the old bytes' copy is not the new version's"
    );
    assert_eq!(m.total_pins(), 0, "the copier's pin is released");
    let hb = heartbeat(&m, owner, epoch, 0);
    assert_eq!(hb.drops.len(), 1, "the owner drops the stale copy");
    assert_eq!(hb.drops[0].key, "k");
    // Its copier reported: the old range waits for nobody now (not the
    // task TTL).
    assert_eq!(m.free_retired(strata_common::time::unix_ms()), 1);
    assert_eq!(m.allocated_bytes(), both / 2);
    // The new version's own copy is taken.
    let n = persist_all(&m, owner, epoch).await;
    assert_eq!(n, 1, "the new version was queued at its PutEnd");
    assert!(on_ssd(&m, "k"));
}

/// An owner's reported use is its own number: one reporting nearly
/// `u64::MAX` bytes used neither overflows the master's sums (debug builds
/// panicked) nor wraps into looking like the freest owner (release builds
/// steered offloads to it).
#[tokio::test]
async fn an_owner_reporting_absurd_use_is_never_preferred() {
    let m = master_with(1, 8 << 20, |c| c.offload_policy = OffloadPolicy::Eager);
    let liar = register(&m, "a/nvme0").await;
    put(&m, "first", 4096);
    assert_eq!(m.ssd().queued_tasks().len(), 1, "queued for the only owner");
    let honest = register(&m, "b/nvme0").await;
    for (r, used) in [(&liar, u64::MAX - 100), (&honest, 1 << 20)] {
        m.owner_heartbeat(&pb::OwnerHeartbeatRequest {
            instance_proof: PROOF.to_vec(),
            owner_id: r.owner_id,
            epoch: r.epoch,
            capacity_bytes: 1 << 30,
            used_bytes: used,
            ..Default::default()
        })
        .unwrap();
    }
    for i in 0..4 {
        put(&m, &format!("k{i}"), 4096);
    }
    let tasks = m.ssd().queued_tasks();
    assert_eq!(tasks.len(), 5);
    let to_honest = tasks.iter().filter(|t| t.owner == honest.owner_id).count();
    assert_eq!(to_honest, 4, "every later copy goes to the honest owner");
}

/// An owner's inventory is believed only for copies a master gave it: a
/// copy reported without the master's record of it, or with a record of
/// other bytes, is neither attached to a live object with that size and
/// crc32c (both public) nor made into an SSD-only object; it is counted and
/// the owner told to drop it. With its record, the same report is adopted.
#[tokio::test]
async fn only_copies_a_master_recorded_are_adopted_from_an_inventory() {
    let (m, owner, epoch) = with_owner(OffloadPolicy::OnEvict, 1 << 20, 0.9).await;
    put(&m, "live", 100);
    let crc = m.inspect("live").unwrap().crc32c;
    let report = |objects| inventory(owner, epoch, objects);
    let forged = vec![
        obj("live", crc, Vec::new()),
        obj("live", crc, m.copy_record("live", 100, crc ^ 1)),
        obj("absent", 5, vec![0; 16]),
        obj("absent", 5, m.copy_record("other", 100, 5)),
    ];
    assert_eq!(m.report_inventory(report(forged)).unwrap(), 0);
    assert!(m
        .objects()
        .shard("live")
        .get("live")
        .unwrap()
        .ssd()
        .is_empty());
    assert!(!m.exists("absent").unwrap(), "no SSD-only object made");
    assert_eq!(m.metrics.unrecorded_copies.get(), 4);
    let recorded = vec![
        obj("live", crc, m.copy_record("live", 100, crc)),
        obj("absent", 5, m.copy_record("absent", 100, 5)),
    ];
    assert_eq!(m.report_inventory(report(recorded)).unwrap(), 2);
    assert_eq!(
        m.objects().shard("live").get("live").unwrap().ssd().len(),
        1
    );
    assert!(m.exists("absent").unwrap());
}

/// A lookup answered "no live replica" leaves no lease behind: a reader
/// retrying it does not keep the object leased (it has nothing to read).
#[tokio::test]
async fn a_lookup_with_nothing_to_read_leaves_no_lease() {
    let m = master_with(1, 1 << 20, |c| {
        c.node_ttl = std::time::Duration::from_millis(50);
        c.lease_ttl = std::time::Duration::from_secs(60);
    });
    let r = register(&m, "h/nvme0").await;
    let obj = pb::SsdObject {
        key: "k".into(),
        bucket_id: 1,
        offset: 64,
        length: 100,
        crc32c: 5,
        copy_record: m.copy_record("k", 100, 5),
    };
    let report = pb::ReportInventoryRequest {
        instance_proof: PROOF.to_vec(),
        owner_id: r.owner_id,
        epoch: r.epoch,
        objects: vec![obj],
        relocation: false,
        more: false,
    };
    assert_eq!(m.report_inventory(report).unwrap(), 1);
    // Its only owner stops heartbeating: the copy cannot be served (seen
    // without a lookup, which would lease it).
    let t0 = std::time::Instant::now();
    while !m.inspect("k").unwrap().replicas.is_empty() {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(5),
            "owner gone"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    for _ in 0..3 {
        let e = m.get_replicas("k").unwrap_err();
        assert_eq!(e.code, strata_common::Code::Unavailable, "{e}");
    }
    let lease = m.inspect("k").unwrap().lease_until_unix_ms;
    assert!(
        lease <= strata_common::time::unix_ms(),
        "a lease of {lease} left"
    );
}

/// `--integrity blake3`: an offload task's record carries the writer's
/// digest, and a later master adopts an SSD copy only from such a record,
/// with that digest (which its readers then verify): not from a record
/// without one (a member could then serve any bytes of that crc32c), nor
/// one whose digest was changed, nor a copy of other bytes than a live
/// object's. Without the flag, records without a digest are still taken.
#[tokio::test]
async fn with_integrity_blake3_ssd_copies_are_adopted_only_with_the_writers_digest() {
    use crate::config::Integrity;
    let (d1, d2) = ([1u8; 32], [2u8; 32]);
    let m = master_with(1, 1 << 20, |c| {
        c.integrity = Integrity::Blake3;
        c.offload_policy = OffloadPolicy::Eager;
    });
    let r = register(&m, "h/nvme0").await;
    put_with_digest(&m, "k", false, d1);
    let tasks = heartbeat(&m, r.owner_id, r.epoch, 10).tasks;
    assert_eq!(tasks.len(), 1);
    let rec = &tasks[0].copy_record;
    assert_eq!(rec.len(), 16 + 32, "a record with the digest after its MAC");
    assert_eq!(rec[16..], d1);
    let crc = tasks[0].crc32c;

    let report = |objects| inventory(r.owner_id, r.epoch, objects);
    let mut changed = m.copy_record_with_digest("b", 100, 5, &d1);
    changed[16..].copy_from_slice(&d2);
    let refused = vec![
        // A record without a digest.
        obj("a", 5, m.copy_record("a", 100, 5)),
        // The digest after the MAC changed.
        obj("b", 5, changed),
        // A live object's key with another digest: other bytes.
        obj("k", crc, m.copy_record_with_digest("k", 100, crc, &d2)),
    ];
    assert_eq!(m.report_inventory(report(refused)).unwrap(), 0);
    assert!(!m.exists("a").unwrap() && !m.exists("b").unwrap());
    assert!(m.objects().shard("k").get("k").unwrap().ssd().is_empty());
    assert_eq!(m.metrics.unrecorded_copies.get(), 2);

    // A record without a digest (made before the flag) still joins a live
    // object that has one: readers check the copy against it.
    let taken = vec![
        obj("b", 5, m.copy_record_with_digest("b", 100, 5, &d2)),
        obj("k", crc, m.copy_record("k", 100, crc)),
    ];
    assert_eq!(m.report_inventory(report(taken)).unwrap(), 2);
    assert_eq!(
        m.get_replicas("b").unwrap().blake3,
        d2,
        "adopted with its digest"
    );
    assert_eq!(m.objects().shard("k").get("k").unwrap().ssd().len(), 1);
    assert_eq!(m.get_replicas("k").unwrap().blake3, d1);
    let again = vec![obj("k", crc, tasks[0].copy_record.clone())];
    assert_eq!(m.report_inventory(report(again)).unwrap(), 1);
    assert_eq!(m.objects().shard("k").get("k").unwrap().ssd().len(), 1);
    assert_eq!(m.metrics.unrecorded_copies.get(), 2);

    // crc32c mode: a record without a digest is a master's record still,
    // and tasks get version-1 records even for objects with a digest (a
    // master that predates version 2, after a rollback, refuses those).
    let m2 = master_with(1, 1 << 20, |c| c.offload_policy = OffloadPolicy::Eager);
    let r2 = register(&m2, "h/nvme0").await;
    put_with_digest(&m2, "k", false, d1);
    let tasks = heartbeat(&m2, r2.owner_id, r2.epoch, 10).tasks;
    assert_eq!(tasks.len(), 1);
    assert_eq!(tasks[0].copy_record.len(), 16, "a version-1 record");
    let (m, owner, epoch) = with_owner(OffloadPolicy::OnEvict, 1 << 20, 0.9).await;
    let plain = inventory(owner, epoch, vec![obj("a", 5, m.copy_record("a", 100, 5))]);
    assert_eq!(m.report_inventory(plain).unwrap(), 1);
    assert!(m.get_replicas("a").unwrap().blake3.is_empty());
}

/// An overwrite to other bytes of the same size and crc32c (which anyone
/// can make: crc32c is linear) while the old version is being copied: with
/// the writers' digests the copy is still of another version, never taken
/// for the new one.
#[tokio::test]
async fn a_copy_of_a_replaced_version_with_the_same_crc32c_is_not_taken_for_the_new_one() {
    use crate::config::Integrity;
    let m = master_with(1, 1 << 20, |c| {
        c.integrity = Integrity::Blake3;
        c.offload_policy = OffloadPolicy::Eager;
    });
    let r = register(&m, "h/nvme0").await;
    put_with_digest(&m, "k", false, [1u8; 32]);
    let tasks = heartbeat(&m, r.owner_id, r.epoch, 10).tasks;
    assert_eq!(tasks.len(), 1);
    put_with_digest(&m, "k", true, [2u8; 32]);
    assert_eq!(
        m.inspect("k").unwrap().crc32c,
        tasks[0].crc32c,
        "same crc32c"
    );
    report_results(&m, r.owner_id, r.epoch, persisted(&tasks)).await;
    let o = m.objects().shard("k").get("k").unwrap().ssd().len();
    assert_eq!(o, 0, "the old version's copy was taken for the new one");
    assert_eq!(m.get_replicas("k").unwrap().blake3, [2u8; 32]);
}

/// A late housekeeping sweep (this master was paused) does not count its
/// lateness against the SSD owners either: an owner silent only while the
/// master was not looking stays live (its tasks stay its own).
#[tokio::test]
async fn a_late_sweep_does_not_count_its_lateness_against_the_owners() {
    let (m, owner, _) = with_owner(OffloadPolicy::Eager, 1 << 20, 0.9).await;
    let ttl = m.config().node_ttl.as_millis() as u64;
    let now = strata_common::time::unix_ms();
    let live = |at: u64| {
        m.ssd()
            .owners()
            .live_usage(at)
            .iter()
            .any(|&(id, _, _)| id == owner)
    };
    assert!(!live(now + 5 * ttl), "silent for five TTLs");
    m.expire_nodes(now);
    m.expire_nodes(now + 5 * ttl);
    assert!(
        live(now + 5 * ttl),
        "a stalled master's pause held against the owner"
    );
    // Silent for a TTL of sweeps on time after that: lost.
    let mut t = now + 5 * ttl;
    for _ in 0..8 {
        t += ttl / 4;
        m.expire_nodes(t);
    }
    assert!(!live(t));
}
