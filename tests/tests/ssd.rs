//! The SSD tier, part 1: owner identity, bucket storage, offload with task
//! ownership, recovery. In-process clusters with real RocksDB, real files
//! and real sockets; process-level cases live in `ssd_process.rs`.

use std::time::Duration;
use strata_client::{Code, PutOptions};
use strata_proto as pb;
use strata_tests::{
    drained, eager, evict_memory, http_get, in_dram, metric, payload, wait_until, ClusterBuilder,
    LocalCluster,
};

async fn ssd_keys(c: &LocalCluster, keys: &[String]) -> usize {
    let mut n = 0;
    for k in keys {
        if c.master.inspect(k).is_ok_and(|i| {
            i.replicas
                .iter()
                .any(|r| r.kind == pb::ReplicaKind::Ssd as i32)
        }) {
            n += 1;
        }
    }
    n
}

async fn wait_persisted(c: &LocalCluster, keys: &[String], within: Duration) -> bool {
    let t0 = std::time::Instant::now();
    while t0.elapsed() < within {
        if ssd_keys(c, keys).await == keys.len() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    false
}

/// The production failure this prevents: a partial last bucket kept as a
/// bare key list for "later" and never written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tail_of_a_batch_is_written_in_the_same_cycle() {
    let c = ClusterBuilder::new()
        .master(eager)
        .store_nodes(2)
        .ssd_agents(1)
        .ssd(|a| a.bucket_keys = 500)
        .build()
        .await
        .unwrap();
    let cl = c.client().await.unwrap();
    let keys: Vec<String> = (0..11).map(|i| format!("tail-{i}")).collect();
    // Every task queued before the agent's next cycle (a slow machine could
    // otherwise spread the puts over several cycles).
    let pause = &c.agents[0].faults.pause_offload;
    pause.store(true, std::sync::atomic::Ordering::Relaxed);
    for (i, k) in keys.iter().enumerate() {
        cl.put(k, &payload(i as u64, 1 << 20), &PutOptions::default())
            .await
            .unwrap();
    }
    pause.store(false, std::sync::atomic::Ordering::Relaxed);
    assert!(
        wait_persisted(&c, &keys, Duration::from_secs(20)).await,
        "all 11 must reach SSD"
    );
    let st = c.agents[0].store.stats();
    assert!(
        st.buckets <= 2,
        "11 objects under a 500-key limit fit in one cycle's buckets: {st:?}"
    );
    assert_eq!(st.objects, 11);
    evict_memory(&cl, &keys).await;
    for (i, k) in keys.iter().enumerate() {
        let info = cl.inspect(k).await.unwrap();
        assert_eq!(info.replicas.len(), 1);
        assert_eq!(info.replicas[0].kind, pb::ReplicaKind::Ssd as i32);
        assert_eq!(
            cl.get(k).await.unwrap(),
            payload(i as u64, 1 << 20),
            "{k} from SSD"
        );
    }
    assert!(wait_until(Duration::from_secs(5), || drained(&c)).await);
    let (_, m) = http_get(c.agents[0].admin_addr, "/metrics").await;
    assert!(
        m.contains("strata_ssd_agent_offload_tasks_total{outcome=\"persisted\"} 11"),
        "{m}"
    );
    // The gauges say what the store holds (refreshed on scrape).
    let st = c.agents[0].store.stats();
    assert!(st.buckets >= 1);
    assert_eq!(metric(&m, "strata_ssd_agent_buckets"), st.buckets as f64);
    assert_eq!(metric(&m, "strata_ssd_agent_objects"), 11.0);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_small_batches_all_persist_and_leave_no_pin() {
    let c = ClusterBuilder::new()
        .master(eager)
        .store_nodes(1)
        .ssd_agents(1)
        .ssd(|a| a.max_tasks = 3)
        .build()
        .await
        .unwrap();
    let cl = c.client().await.unwrap();
    let keys: Vec<String> = (0..60).map(|i| format!("small-{i}")).collect();
    for (i, k) in keys.iter().enumerate() {
        cl.put(k, &payload(i as u64, 3000 + i * 10), &PutOptions::default())
            .await
            .unwrap();
    }
    assert!(wait_persisted(&c, &keys, Duration::from_secs(30)).await);
    assert!(
        wait_until(Duration::from_secs(5), || drained(&c)).await,
        "queue drains, pins return to zero"
    );
    assert!(
        c.agents[0].store.stats().buckets >= 20,
        "batches of at most 3 make many buckets"
    );
    let (_, body) = http_get(c.master_admin, "/api/v1/offload").await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (
            v["queued"].as_u64(),
            v["assigned"].as_u64(),
            v["pins"].as_u64()
        ),
        (Some(0), Some(0), Some(0))
    );
    assert_eq!(v["persisted"], 60);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_writes_and_lost_reports_are_retried_until_persisted() {
    let c = ClusterBuilder::new()
        .master(eager)
        .store_nodes(1)
        .ssd_agents(1)
        .master(|m| m.offload_task_ttl = Duration::from_millis(800))
        .build()
        .await
        .unwrap();
    let cl = c.client().await.unwrap();
    fail::cfg("ssd-agent::bucket-write", "2*return").unwrap();
    fail::cfg("ssd-agent::drop-offload-report", "1*return").unwrap();
    let keys: Vec<String> = (0..10).map(|i| format!("fault-{i}")).collect();
    for (i, k) in keys.iter().enumerate() {
        cl.put(k, &payload(i as u64, 20_000), &PutOptions::default())
            .await
            .unwrap();
    }
    assert!(wait_persisted(&c, &keys, Duration::from_secs(30)).await);
    assert!(wait_until(Duration::from_secs(10), || drained(&c)).await);
    let (_, m) = http_get(c.master_admin, "/metrics").await;
    assert!(
        m.contains("strata_master_offload_results_total{outcome=\"failed_requeued\"}"),
        "{m}"
    );
    assert!(
        m.contains("strata_master_offload_results_total{outcome=\"expired_requeued\"}"),
        "{m}"
    );
    evict_memory(&cl, &keys).await;
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(cl.get(k).await.unwrap(), payload(i as u64, 20_000));
    }
    c.shutdown().await;
}

/// The agent's heartbeats (answered ones) and its copies written.
async fn agent_counts(c: &LocalCluster) -> (f64, f64) {
    let (_, m) = http_get(c.agents[0].admin_addr, "/metrics").await;
    (
        metric(&m, "strata_ssd_agent_heartbeats_total"),
        metric(
            &m,
            "strata_ssd_agent_offload_tasks_total{outcome=\"persisted\"}",
        ),
    )
}

/// Waits (bounded) until the agent has had three more heartbeats answered:
/// it is not stuck in a call.
async fn three_more_heartbeats(c: &LocalCluster, what: &str) {
    let (from, _) = agent_counts(c).await;
    let t0 = std::time::Instant::now();
    // Each may follow a report that waits out the deadline (1.5 s here).
    while agent_counts(c).await.0 < from + 3.0 {
        assert!(
            t0.elapsed() < Duration::from_secs(12),
            "the agent stopped heartbeating: its {what} report still waits on a leader that never answers"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An SSD agent's offload and promotion reports to a leader that never
/// answers (a paused one; failpoint `master::report-hangs`) give up at the
/// heartbeat deadline, as its heartbeats do, so the agent goes on with its
/// heartbeats meanwhile; once the leader answers again, what the lost
/// reports carried is done again: the copy is persisted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_to_a_leader_that_never_answers_give_up_at_the_heartbeat_deadline() {
    let c = ClusterBuilder::new()
        .master(eager)
        .store_nodes(1)
        .ssd_agents(1)
        .master(|m| {
            m.offload_task_ttl = Duration::from_millis(800);
            m.promote_on_hit = true;
            // Heartbeats every 750 ms, a deadline of 1.5 s: three
            // heartbeats, each after a report that hangs, take seconds.
            m.node_ttl = Duration::from_secs(3);
        })
        .build()
        .await
        .unwrap();
    let cl = c.client().await.unwrap();
    let keys = vec!["reported-to-no-one".to_string()];
    let bytes = payload(7, 30_000);

    // Offload: the copy is written, then its report hangs (and is lost:
    // the task expires on the master and goes back to the queue).
    fail::cfg("master::report-hangs", "return").unwrap();
    cl.put(&keys[0], &bytes, &PutOptions::default())
        .await
        .unwrap();
    let t0 = std::time::Instant::now();
    while agent_counts(&c).await.1 < 1.0 {
        assert!(t0.elapsed() < Duration::from_secs(20), "no copy written");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    three_more_heartbeats(&c, "offload").await;
    let expired = "strata_master_offload_results_total{outcome=\"expired_requeued\"}";
    assert!(
        metric(&http_get(c.master_admin, "/metrics").await.1, expired) >= 1.0,
        "the offload report was not lost"
    );
    fail::remove("master::report-hangs");
    assert!(wait_persisted(&c, &keys, Duration::from_secs(30)).await);

    // Promotion: an SSD hit is copied back into DRAM, then its report hangs
    // (and is lost: the promotion expires).
    evict_memory(&cl, &keys).await;
    let promotions = |outcome: &str| {
        c.master
            .metrics
            .promotions
            .with_label_values(&[outcome])
            .get()
    };
    fail::cfg("master::report-hangs", "return").unwrap();
    assert_eq!(cl.get(&keys[0]).await.unwrap(), bytes);
    assert_eq!(promotions("queued"), 1);
    // The first of these heartbeats hands the promotion over.
    three_more_heartbeats(&c, "promotion").await;
    assert!(
        wait_until(Duration::from_secs(10), || promotions("expired") >= 1).await,
        "the promotion report was not lost"
    );
    assert!(!in_dram(&c, &keys[0]));
    // Answered again, the next hit is promoted.
    fail::remove("master::report-hangs");
    let t0 = std::time::Instant::now();
    while !in_dram(&c, &keys[0]) {
        assert_eq!(cl.get(&keys[0]).await.unwrap(), bytes);
        assert!(t0.elapsed() < Duration::from_secs(20), "never promoted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(cl.get(&keys[0]).await.unwrap(), bytes);
    c.shutdown().await;
}

/// A full owner makes room by evicting its oldest buckets
/// (telling the master first): disk use never passes the capacity, and every
/// key stays readable (from DRAM, where its SSD copy was evicted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_owner_evicts_old_buckets_and_never_exceeds_capacity() {
    let cap = 3 << 20;
    let c = ClusterBuilder::new()
        .master(eager)
        .store_nodes(1)
        .ssd_agents(1)
        .ssd_capacity(cap)
        .ssd(|a| a.bucket_bytes = 1 << 20)
        .build()
        .await
        .unwrap();
    let cl = c.client().await.unwrap();
    let keys: Vec<String> = (0..12).map(|i| format!("full-{i}")).collect();
    for (i, k) in keys.iter().enumerate() {
        cl.put(k, &payload(i as u64, 512 * 1024), &PutOptions::default())
            .await
            .unwrap();
        // One at a time, so the owner always has room for what is queued.
        assert!(wait_until(Duration::from_secs(10), || drained(&c)).await);
        assert!(c.agents[0].store.stats().used <= cap);
    }
    assert!(wait_until(Duration::from_secs(10), || drained(&c)).await);
    let st = c.agents[0].store.stats();
    assert!(st.used <= cap, "used {} > capacity {cap}", st.used);
    let on_ssd = ssd_keys(&c, &keys).await;
    assert!(
        (2..12).contains(&on_ssd),
        "old buckets were evicted: {on_ssd}"
    );
    let (_, metrics) = http_get(c.agents[0].admin_addr, "/metrics").await;
    let evicted = metric(&metrics, "strata_ssd_agent_evicted_buckets_total");
    assert!(evicted >= 1.0, "{metrics}");
    // The master forgot every evicted replica: SSD replicas it lists are
    // exactly the objects the agent holds.
    assert_eq!(on_ssd as u64, c.agents[0].store.stats().objects);
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(cl.get(k).await.unwrap(), payload(i as u64, 512 * 1024));
    }
    let (_, body) = http_get(c.master_admin, "/api/v1/owners").await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["owners"][0]["handle"], "local/ssd-0");
    assert_eq!(v["owners"][0]["capacity"], cap);
    assert!(v["owners"][0]["bytes"].as_u64().unwrap() <= cap);
    c.shutdown().await;
}

/// Eight owners on one directory, started together: no collision; after a
/// restart of all eight each adopts exactly its own buckets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_owners_share_one_directory_and_recover_only_their_own() {
    let mut c = ClusterBuilder::new()
        .master(eager)
        .store_nodes(2)
        .build()
        .await
        .unwrap();
    let starts: Vec<_> = (0..8)
        .map(|i| c.spawn_agent(format!("host-{i}/nvme0")))
        .collect();
    for a in futures::future::join_all(starts).await {
        c.agents.push(a.unwrap());
    }
    let mut ids: Vec<u64> = c.agents.iter().map(|a| a.owner_id).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 8, "eight handles, eight owner ids");
    let cl = c.client().await.unwrap();
    let keys: Vec<String> = (0..64).map(|i| format!("shared-{i}")).collect();
    for (i, k) in keys.iter().enumerate() {
        cl.put(k, &payload(i as u64, 10_000 + i), &PutOptions::default())
            .await
            .unwrap();
    }
    assert!(wait_persisted(&c, &keys, Duration::from_secs(30)).await);
    assert!(wait_until(Duration::from_secs(5), || drained(&c)).await);
    let before: Vec<u64> = c.agents.iter().map(|a| a.store.stats().buckets).collect();
    let total: u64 = before.iter().sum();
    let handles: Vec<String> = c.agents.iter().map(|a| a.handle.clone()).collect();
    let owner_ids: Vec<u64> = c.agents.iter().map(|a| a.owner_id).collect();
    for mut a in c.agents.drain(..) {
        a.stop().await.unwrap();
    }
    let restarts: Vec<_> = handles.iter().map(|h| c.spawn_agent(h.clone())).collect();
    let restarted: Vec<_> = futures::future::join_all(restarts)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    for (i, a) in restarted.iter().enumerate() {
        assert_eq!(a.owner_id, owner_ids[i], "same handle, same owner");
        assert_eq!(
            a.recovery.buckets, before[i],
            "{} adopts exactly its own buckets",
            a.handle
        );
        assert_eq!(
            a.recovery.foreign_files,
            total - before[i],
            "and leaves the others' alone"
        );
        assert_eq!(
            (a.recovery.quarantined, a.recovery.dropped_dangling),
            (0, 0)
        );
    }
    c.agents = restarted;
    evict_memory(&cl, &keys).await;
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(cl.get(k).await.unwrap(), payload(i as u64, 10_000 + i));
    }
    // A second live agent with the same handle is refused, naming the holder.
    let e = c
        .spawn_agent("host-3/nvme0".into())
        .await
        .err()
        .expect("same handle twice");
    assert_eq!(e.code, Code::AlreadyExists);
    assert!(
        e.message.contains("host-3/nvme0") && e.message.contains("pid"),
        "{e}"
    );
    c.shutdown().await;
}

/// Damaged, truncated and foreign files: nothing wrong is served, nothing
/// crashes, other owners' files are untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_and_foreign_files_are_never_served_or_adopted() {
    let mut c = ClusterBuilder::new()
        .master(eager)
        .store_nodes(1)
        .ssd_agents(1)
        .ssd(|a| a.bucket_keys = 1)
        .build()
        .await
        .unwrap();
    let cl = c.client().await.unwrap();
    let keys: Vec<String> = (0..5).map(|i| format!("dmg-{i}")).collect();
    for (i, k) in keys.iter().enumerate() {
        cl.put(k, &payload(i as u64, 50_000), &PutOptions::default())
            .await
            .unwrap();
    }
    assert!(wait_persisted(&c, &keys, Duration::from_secs(20)).await);
    assert!(wait_until(Duration::from_secs(5), || drained(&c)).await);
    evict_memory(&cl, &keys).await;
    let owner = c.agents[0].owner_id;
    let dir = c.ssd_dir.join("buckets");
    let store = c.agents[0].store.clone();
    let loc = |k: &str| store.location(k).unwrap().unwrap();
    let file = |k: &str| dir.join(strata_ssd_agent::bucket::file_name(owner, loc(k).bucket_id));
    // dmg-0: flip a byte of its data (caught lazily, on read).
    let (f0, l0) = (file("dmg-0"), loc("dmg-0"));
    let (f1, f2) = (file("dmg-1"), file("dmg-2"));
    drop(store);
    let mut b = std::fs::read(&f0).unwrap();
    b[l0.offset as usize + 100] ^= 0xff;
    std::fs::write(&f0, &b).unwrap();
    let e = cl.get("dmg-0").await.unwrap_err();
    assert_eq!(e.code, Code::Corrupted, "{e}");
    // Operators see it (the checksum alert fires on this counter).
    let (_, m) = http_get(c.agents[0].admin_addr, "/metrics").await;
    let failures = m
        .lines()
        .find(|l| l.starts_with("strata_ssd_agent_checksum_failures_total{stage=\"read\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok());
    assert!(failures.is_some_and(|n| n >= 1), "{m}");
    c.agents[0].stop().await.unwrap();
    // dmg-1 truncated, dmg-2 header damaged; plus a stray and a foreign file.
    let len = std::fs::metadata(&f1).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&f1)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let mut b = std::fs::read(&f2).unwrap();
    b[3] ^= 0x55;
    std::fs::write(&f2, &b).unwrap();
    std::fs::write(dir.join("notes.txt"), b"operator notes").unwrap();
    let foreign = dir.join(strata_ssd_agent::bucket::file_name(owner + 1000, 1));
    std::fs::write(&foreign, b"another owner's bytes").unwrap();
    c.restart_agent(0).await.unwrap();
    let r = c.agents[0].recovery.clone();
    assert_eq!(r.dropped_dangling, 2, "{r:?}");
    assert_eq!(r.unknown_files, 1, "{r:?}");
    assert_eq!(r.foreign_files, 1, "{r:?}");
    assert_eq!(
        std::fs::read(&foreign).unwrap(),
        b"another owner's bytes",
        "never touched"
    );
    assert!(dir.join("notes.txt").exists());
    for k in ["dmg-1", "dmg-2"] {
        assert_eq!(
            cl.get(k).await.unwrap_err().code,
            Code::NotFound,
            "{k} is gone, not served wrong"
        );
    }
    assert_eq!(cl.get("dmg-0").await.unwrap_err().code, Code::Corrupted);
    for (i, k) in keys.iter().enumerate().skip(3) {
        assert_eq!(cl.get(k).await.unwrap(), payload(i as u64, 50_000));
    }
    let (_, m) = http_get(c.agents[0].admin_addr, "/metrics").await;
    assert!(m.contains("strata_ssd_agent_unknown_files 1"), "{m}");
    let (_, body) = http_get(c.master_admin, "/api/v1/owners").await;
    assert!(
        body.contains("\"unknown_files\":1") || body.contains("\"unknown_files\": 1"),
        "{body}"
    );
    let (_, m) = http_get(c.master_admin, "/metrics").await;
    assert!(
        m.contains("strata_master_ssd_owners{state=\"live\"} 1"),
        "{m}"
    );
    c.shutdown().await;
}
