//! Nothing lost under pressure: puts that outrun the SSD tier wait for the
//! copies (bounded by `--put-wait`) instead of the cache dropping objects
//! the SSD could take.

use std::sync::atomic::Ordering;
use std::time::Duration;
use strata_client::{Code, PutOptions};
use strata_master::config::OffloadPolicy;
use strata_tests::{drained, http_get, metric, payload, wait_until, ClusterBuilder, LocalCluster};

const MIB: u64 = 1 << 20;

/// One store node of 48 MiB and one agent of 256 MiB.
async fn cluster(policy: OffloadPolicy, put_wait: Duration) -> LocalCluster {
    ClusterBuilder::new()
        .store_nodes(1)
        .node_capacity(48 * MIB)
        .ssd_agents(1)
        .ssd_capacity(256 * MIB)
        .master(move |m| {
            m.offload_policy = policy;
            m.put_wait = put_wait;
        })
        .build()
        .await
        .unwrap()
}

/// Puts `k0`.. `k{n-1}`, 16 MiB each.
async fn put_16mib(cl: &strata_client::Client, n: u64) {
    for i in 0..n {
        let data = payload(i, 16 << 20);
        cl.put(&format!("k{i}"), &data, &PutOptions::default())
            .await
            .unwrap();
    }
}

fn dropped(c: &LocalCluster) -> u64 {
    c.master.metrics.dropped()
}

/// Four 16 MiB puts back to back into 48 MiB of DRAM: the last needs room
/// that only copies to SSD can free. Every key stays readable, byte for byte.
async fn burst(policy: OffloadPolicy) {
    for rep in 0..20u64 {
        let c = cluster(policy, Duration::from_secs(5)).await;
        let cl = c.client().await.unwrap();
        for i in 0..4 {
            let k = format!("burst-{i}");
            cl.put(&k, &payload(rep * 10 + i, 16 << 20), &PutOptions::default())
                .await
                .unwrap_or_else(|e| panic!("{policy:?} rep {rep}: put {k}: {e}"));
        }
        for i in 0..4 {
            let k = format!("burst-{i}");
            let got = cl
                .get(&k)
                .await
                .unwrap_or_else(|e| panic!("{policy:?} rep {rep}: get {k}: {e}"));
            assert!(
                got == payload(rep * 10 + i, 16 << 20),
                "{policy:?} rep {rep}: {k} bytes"
            );
        }
        assert_eq!(dropped(&c), 0, "{policy:?} rep {rep}: nothing dropped");
        // Copies still in flight end, leaving no pin.
        assert!(wait_until(Duration::from_secs(10), || drained(&c)).await);
        c.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_larger_than_dram_loses_nothing_under_eager() {
    burst(OffloadPolicy::Eager).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_larger_than_dram_loses_nothing_under_on_evict() {
    burst(OffloadPolicy::OnEvict).await;
}

/// The SSD tier takes nothing (paused): a put that needs DRAM held by
/// objects waiting for their copies fails with a retryable no_space naming
/// the flag, leaves no allocation, pin or waiter behind, and drops nothing.
/// Once the tier resumes, the same put succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_whose_wait_runs_out_fails_retryably_and_leaks_nothing() {
    let c = cluster(OffloadPolicy::Eager, Duration::from_millis(200)).await;
    strata_tests::pause_offloads(&c).await;
    let cl = c.client().await.unwrap();
    put_16mib(&cl, 3).await;
    let allocated = c.master.allocated_bytes();
    let e = cl
        .put("late", &payload(9, 16 << 20), &PutOptions::default())
        .await
        .unwrap_err();
    assert_eq!(e.code, Code::NoSpace, "{e}");
    assert!(e.retryable(), "{e}");
    assert!(e.message.contains("--put-wait"), "{e}");
    assert!(c.master.metrics.put_wait_timeouts.get() >= 1);
    assert_eq!(c.master.metrics.put_waiters.get(), 0);
    assert_eq!(c.master.allocated_bytes(), allocated, "no allocation left");
    assert_eq!(c.master.total_pins(), 0);
    assert!(!c.master.exists("late").unwrap());
    assert_eq!(dropped(&c), 0);
    // The tier resumes: the put waits for one copy and lands. (Reads come
    // after it: a read leases its object, and leased objects are not
    // evicted.)
    c.agents[0]
        .faults
        .pause_offload
        .store(false, Ordering::Relaxed);
    let t0 = std::time::Instant::now();
    loop {
        // Retryable while the copies land (a 200 ms --put-wait), bounded.
        match cl
            .put("late", &payload(9, 16 << 20), &PutOptions::default())
            .await
        {
            Ok(()) => break,
            Err(e) if e.retryable() && t0.elapsed() < Duration::from_secs(30) => {}
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(cl.get("late").await.unwrap(), payload(9, 16 << 20));
    for i in 0..3 {
        assert_eq!(
            cl.get(&format!("k{i}")).await.unwrap(),
            payload(i, 16 << 20)
        );
    }
    assert_eq!(dropped(&c), 0);
    let (_, m) = http_get(c.master_admin, "/metrics").await;
    assert!(
        metric(&m, "strata_master_urgent_offloads_total") >= 1.0,
        "{m}"
    );
    assert!(metric(&m, "strata_master_put_waits_total") >= 2.0, "{m}");
    c.shutdown().await;
}

/// With no SSD tier at all nothing waits: a full DRAM evicts (drops, counted
/// as `no_owner`) at once, as a cache does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_ssd_tier_puts_never_wait_and_drops_are_counted() {
    let c = ClusterBuilder::new()
        .store_nodes(1)
        .node_capacity(48 * MIB)
        .build()
        .await
        .unwrap();
    let cl = c.client().await.unwrap();
    put_16mib(&cl, 4).await;
    assert!(wait_until(Duration::from_secs(5), || dropped(&c) >= 1).await);
    let d = &c.master.metrics.dropped_objects;
    assert_eq!(d.with_label_values(&["no_owner"]).get(), dropped(&c));
    assert_eq!(c.master.metrics.put_waits.get(), 0);
    assert_eq!(cl.get("k3").await.unwrap(), payload(3, 16 << 20));
    c.shutdown().await;
}

/// An agent of 64 MiB fed 1 MiB objects four times over: its directory (what
/// `du` counts, preallocation included: bucket files, index, WAL, logs) never
/// holds more than the capacity plus one bucket, and it reports the index's
/// share as overhead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_disk_use_stays_within_its_capacity() {
    let dir = tempfile::tempdir().unwrap();
    let (cap, bucket) = (64 * MIB, 8 * MIB);
    let c = ClusterBuilder::new()
        .store_nodes(1)
        .node_capacity(32 * MIB)
        .ssd_agents(1)
        .ssd_capacity(cap)
        .ssd_dir(dir.path())
        .ssd(move |a| a.bucket_bytes = bucket)
        .master(|m| m.offload_policy = OffloadPolicy::Eager)
        .build()
        .await
        .unwrap();
    let cl = c.client().await.unwrap();
    let du = || strata_ssd_agent::store::allocated_bytes(dir.path(), 8);
    let mut most = 0;
    for i in 0..256u64 {
        cl.put(
            &format!("o{i}"),
            &payload(i, 1 << 20),
            &PutOptions::default(),
        )
        .await
        .unwrap();
        most = most.max(du());
    }
    assert!(wait_until(Duration::from_secs(20), || drained(&c)).await);
    most = most.max(du());
    eprintln!("agent directory: at most {most} bytes (capacity {cap}, bucket {bucket})");
    assert!(
        most <= cap + bucket,
        "the agent's directory held {most} bytes, over {cap} + one bucket of {bucket}"
    );
    // The index's share is reported and counted in what is used.
    let store = &c.agents[0].store;
    assert!(store.refresh_overhead() > 0);
    let (_, body) = http_get(c.master_admin, "/api/v1/owners").await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let o = &v["owners"][0];
    assert!(o["overhead_bytes"].as_u64().unwrap() > 0, "{o}");
    assert_eq!(
        o["object_bytes"].as_u64().unwrap() + o["overhead_bytes"].as_u64().unwrap(),
        o["bytes"].as_u64().unwrap(),
        "{o}"
    );
    // Recent objects are still served.
    assert_eq!(cl.get("o255").await.unwrap(), payload(255, 1 << 20));
    c.shutdown().await;
}
