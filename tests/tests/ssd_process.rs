//! The SSD agent as a real process: one process per handle, and a SIGKILL
//! in the middle of writing a bucket.

use std::time::Duration;
use strata_client::{Client, ClientConfig, PutOptions};
use strata_tests::procs::{start_agent, start_master, start_node};
use strata_tests::{http_get, payload};

async fn json(admin: std::net::SocketAddr, path: &str) -> serde_json::Value {
    let (_, body) = http_get(admin, path).await;
    serde_json::from_str(&body).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_live_agent_with_the_same_handle_fails_at_start() {
    let state = tempfile::tempdir().unwrap();
    let m = start_master(&[
        "--state-dir",
        state.path().to_str().unwrap(),
        "--offload-policy",
        "eager",
    ])
    .await;
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (_first, _) = start_agent(&m.addr, "node-7/nvme0", d1.path(), &[], true).await;
    // Same directory: the lock file names the holder at once.
    for dir in [d1.path(), d2.path()] {
        let (mut second, _) = start_agent(&m.addr, "node-7/nvme0", dir, &[], false).await;
        let code = second.exit_code(Duration::from_secs(15)).await;
        assert!(
            matches!(code, Some(c) if c != 0),
            "second agent must exit non-zero, got {code:?}"
        );
        let mut err = String::new();
        use std::io::Read;
        second
            .0
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert!(
            err.contains("node-7/nvme0") && err.contains("pid"),
            "{}: {err}",
            dir.display()
        );
    }
    // Another handle on the same directory is fine.
    let (_other, _) = start_agent(&m.addr, "node-7/nvme1", d1.path(), &[], true).await;
    let v = json(m.admin, "/api/v1/owners").await;
    assert_eq!(v["owners"].as_array().unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_bucket_loses_nothing_and_serves_nothing_half_written() {
    let state = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let m = start_master(&[
        "--state-dir",
        state.path().to_str().unwrap(),
        "--offload-policy",
        "eager",
        "--offload-task-ttl",
        "1s",
        "--node-ttl",
        "2s",
    ])
    .await;
    let (_node, _) = start_node(&m.addr, "n1").await;
    // The agent stalls halfway through its first bucket write.
    let (agent, _) = start_agent(
        &m.addr,
        "h/0",
        dir.path(),
        &[("FAILPOINTS", "ssd-agent::bucket-mid-write=sleep(60000)")],
        true,
    )
    .await;
    let cl = Client::connect(ClientConfig::new(&m.addr)).await.unwrap();
    let keys: Vec<String> = (0..5).map(|i| format!("kill-{i}")).collect();
    for (i, k) in keys.iter().enumerate() {
        cl.put(k, &payload(i as u64, 300_000), &PutOptions::default())
            .await
            .unwrap();
    }
    let buckets = dir.path().join("buckets");
    let mut partial = false;
    for _ in 0..500 {
        let v = json(m.admin, "/api/v1/offload").await;
        let files = std::fs::read_dir(&buckets).map(|d| d.count()).unwrap_or(0);
        if v["assigned"].as_u64() > Some(0) && v["pins"].as_u64() > Some(0) && files > 0 {
            partial = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        partial,
        "the agent should be mid-bucket with pinned sources"
    );
    drop(agent); // SIGKILL
                 // Restart without faults: the half-written file is quarantined, the
                 // tasks expire and are requeued, and everything persists.
    let (_agent2, admin2) = start_agent(&m.addr, "h/0", dir.path(), &[], true).await;
    let rec = json(admin2, "/api/v1/owner").await;
    assert_eq!(rec["recovery"]["quarantined"], 1, "{rec}");
    assert_eq!(rec["recovery"]["buckets"], 0, "{rec}");
    let mut done = false;
    for _ in 0..750 {
        let v = json(m.admin, "/api/v1/offload").await;
        if v["persisted"].as_u64() >= Some(5)
            && v["queued"] == 0
            && v["assigned"] == 0
            && v["pins"] == 0
        {
            done = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        done,
        "all tasks persist after the restart: {}",
        json(m.admin, "/api/v1/offload").await
    );
    strata_tests::evict_memory(&cl, &keys).await;
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(cl.get(k).await.unwrap(), payload(i as u64, 300_000), "{k}");
    }
    assert_eq!(
        std::fs::read_dir(dir.path().join("quarantine"))
            .unwrap()
            .count(),
        1
    );
}

/// `STRATA_STAGING_BYTES` sizes the arena of the agent process that reads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_staging_arena_is_sized_by_strata_staging_bytes() {
    let m = start_master(&[]).await;
    let dir = tempfile::tempdir().unwrap();
    for (value, want) in [("3MiB", 3u64 << 20), ("64KiB", 64 << 10)] {
        let (_agent, admin) = start_agent(
            &m.addr,
            &format!("env/{want}"),
            dir.path(),
            &[("STRATA_STAGING_BYTES", value)],
            true,
        )
        .await;
        let (_, body) = http_get(admin, "/metrics").await;
        assert_eq!(
            strata_tests::metric(&body, "strata_ssd_agent_staging_capacity_bytes"),
            want as f64,
            "{value}"
        );
    }
}

/// The burst a new user tried on the release binaries: one store node of
/// 48 MiB, one agent of 256 MiB, four 16 MiB puts back to back. Every key
/// stays readable, byte for byte, under both policies that copy to SSD.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_larger_than_dram_loses_nothing_on_the_real_binaries() {
    for policy in ["eager", "on-evict"] {
        let m = start_master(&["--offload-policy", policy]).await;
        let (_node, _) =
            strata_tests::procs::start_node_with(&m.addr, "n1", &["--capacity", "48MiB"]).await;
        let dir = tempfile::tempdir().unwrap();
        let (_agent, _) = start_agent(&m.addr, "burst/0", dir.path(), &[], true).await;
        let cl = Client::connect(ClientConfig::new(m.addr.clone()))
            .await
            .unwrap();
        for i in 0..4u64 {
            cl.put(
                &format!("b{i}"),
                &payload(i, 16 << 20),
                &PutOptions::default(),
            )
            .await
            .unwrap_or_else(|e| panic!("{policy}: put b{i}: {e}"));
        }
        for i in 0..4u64 {
            let got = cl.get(&format!("b{i}")).await;
            let got = got.unwrap_or_else(|e| panic!("{policy}: b{i} lost: {e}"));
            assert!(got == payload(i, 16 << 20), "{policy}: b{i} bytes");
        }
        let (_, metrics) = http_get(m.admin, "/metrics").await;
        let dropped: Vec<&str> = metrics
            .lines()
            .filter(|l| l.starts_with("strata_master_dropped_objects_total{"))
            .filter(|l| !l.ends_with(" 0"))
            .collect();
        assert!(dropped.is_empty(), "{policy}: {dropped:?}");
    }
}
