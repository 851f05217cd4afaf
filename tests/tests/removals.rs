//! Removals stay removed: an object removed while an SSD copy of it sits
//! where the master cannot reach it (agent down, drop notice lost with a
//! master restart, offload report dropped) never comes back. Real processes,
//! SIGKILL, real files.

use std::time::Duration;
use strata_client::{Client, ClientConfig, Code, PutOptions};
use strata_tests::procs::{start_agent, start_node, RestartableMaster};
use strata_tests::{http_get, payload};

async fn json(admin: std::net::SocketAddr, path: &str) -> serde_json::Value {
    let (_, body) = http_get(admin, path).await;
    serde_json::from_str(&body).unwrap_or_default()
}

/// Waits until the master's view of `key` satisfies `f`.
async fn wait_key(admin: std::net::SocketAddr, key: &str, f: impl Fn(&str) -> bool) {
    let t0 = std::time::Instant::now();
    loop {
        let v = json(admin, &format!("/api/v1/keys/{key}"))
            .await
            .to_string();
        if f(&v) {
            return;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "{key}: {v}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

const MASTER_FLAGS: &[&str] = &[
    "--offload-policy",
    "eager",
    "--node-ttl",
    "2s",
    "--offload-task-ttl",
    "1s",
];

/// The reviewer's reproduction: put (eager), wait for the SSD copy, SIGKILL
/// the agent, remove the key, restart the master, restart the agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_removed_while_its_agent_is_down_stays_removed_across_restarts() {
    let (state, dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let m = RestartableMaster::new(state.path(), MASTER_FLAGS);
    let master = m.start().await;
    let (_node, _) = start_node(&m.addr, "n1").await;
    let (agent, _) = start_agent(&m.addr, "h/0", dir.path(), &[], true).await;
    let cl = Client::connect(ClientConfig::new(&m.addr)).await.unwrap();
    for k in ["gone", "kept"] {
        cl.put(k, &payload(1, 50_000), &PutOptions::default())
            .await
            .unwrap();
        wait_key(m.admin, k, |v| v.contains("\"ssd\"")).await;
    }
    drop(agent); // SIGKILL: the drop notice can only wait in master memory
    cl.remove("gone", true).await.unwrap();
    drop(master); // SIGKILL: and now it is lost
    let _master = m.start().await;
    let (_node, _) = start_node(&m.addr, "n2").await;
    let (_agent, _) = start_agent(&m.addr, "h/0", dir.path(), &[], true).await;
    // The agent re-reported its inventory: "kept" is back (SSD only),
    // "gone" is not.
    wait_key(m.admin, "kept", |v| v.contains("\"ssd\"")).await;
    assert_eq!(cl.get("kept").await.unwrap(), payload(1, 50_000));
    let e = cl.get("gone").await.unwrap_err();
    assert_eq!(e.code, Code::NotFound, "{e}");
    let (_, metrics) = http_get(m.admin, "/metrics").await;
    assert!(
        strata_tests::metric(&metrics, "strata_master_tombstoned_copies_total") >= 1.0,
        "{metrics}"
    );
    assert!(strata_tests::metric(&metrics, "strata_master_tombstones") >= 1.0);
}

/// An offload whose report was dropped leaves an orphan copy the master never
/// heard of; removing the key and restarting the agent must not revive it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphan_copy_from_a_dropped_report_does_not_revive_a_removed_key() {
    let (state, dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let m = RestartableMaster::new(state.path(), MASTER_FLAGS);
    let _master = m.start().await;
    let (_node, _) = start_node(&m.addr, "n1").await;
    let (agent, _) = start_agent(
        &m.addr,
        "h/0",
        dir.path(),
        &[("FAILPOINTS", "ssd-agent::drop-offload-report=1*return")],
        true,
    )
    .await;
    let cl = Client::connect(ClientConfig::new(&m.addr)).await.unwrap();
    cl.put("orphaned", &payload(2, 40_000), &PutOptions::default())
        .await
        .unwrap();
    // The first copy's report is dropped; the task expires and a second copy
    // is made and reported.
    wait_key(m.admin, "orphaned", |v| v.contains("\"ssd\"")).await;
    cl.remove("orphaned", true).await.unwrap();
    drop(agent);
    let (_agent, admin) = start_agent(&m.addr, "h/0", dir.path(), &[], true).await;
    let rec = json(admin, "/api/v1/owner").await;
    assert!(
        rec["recovery"]["objects"].as_u64() >= Some(1),
        "the orphan copy is still on disk: {rec}"
    );
    // Give the master the inventory, then check.
    let t0 = std::time::Instant::now();
    loop {
        let (_, metrics) = http_get(m.admin, "/metrics").await;
        if strata_tests::metric(&metrics, "strata_master_tombstoned_copies_total") >= 1.0 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "{metrics}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(cl.get("orphaned").await.unwrap_err().code, Code::NotFound);
    // A new object under the same key with other bytes is kept.
    cl.put("orphaned", &payload(3, 40_000), &PutOptions::default())
        .await
        .unwrap();
    assert_eq!(cl.get("orphaned").await.unwrap(), payload(3, 40_000));
}

/// A store node paused (SIGSTOP) past `--node-ttl` is dropped with its
/// replicas; a key removed meanwhile stays removed when it wakes up, because
/// it comes back clean (its records reset, nothing it held adopted), and
/// it serves new puts. No wrong bytes are read at any point. It wakes while
/// the master is still young (inside its rebuild window, 2 x `--node-ttl`
/// from its start), where a registering node is asked for what it holds:
/// only its first registration of the term may be (seen failing without
/// that, "removed" read back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_paused_past_its_ttl_comes_back_clean_and_a_removed_key_stays_removed() {
    let m = strata_tests::procs::start_master(&["--node-ttl", "3s"]).await;
    let (n1, _, n1_admin) = strata_tests::procs::start_node_admin(&m.addr, "n1", &[]).await;
    let (_n2, _) = start_node(&m.addr, "n2").await;
    let cl = Client::connect(ClientConfig::new(&m.addr).with_location_cache(0))
        .await
        .unwrap();
    let on = |replicas: u32, node: Option<&str>| PutOptions {
        replicas,
        preferred_node: node.map(str::to_string),
        ..Default::default()
    };
    cl.put("removed", &payload(1, 50_000), &on(2, None))
        .await
        .unwrap();
    cl.put("kept", &payload(2, 50_000), &on(2, None))
        .await
        .unwrap();
    cl.put("lost", &payload(3, 50_000), &on(1, Some("n1")))
        .await
        .unwrap();
    // What the node holds: committed, and recorded or announced puts whose
    // commit has not reached it yet (it rides with its next log entry).
    let objects = || async {
        let v = json(n1_admin, "/api/v1/objects").await;
        let n = |f: &str| v[f].as_u64().unwrap_or(u64::MAX / 2);
        n("objects_total") + n("pending_total")
    };
    assert_eq!(objects().await, 3);
    n1.signal(libc::SIGSTOP);
    let nodes = || async { json(m.admin, "/api/v1/nodes").await.to_string() };
    let t0 = std::time::Instant::now();
    while nodes().await.contains("\"n1\"") {
        assert!(t0.elapsed() < Duration::from_secs(20), "n1 never dropped");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cl.remove("removed", false).await.unwrap();
    assert_eq!(cl.get("lost").await.unwrap_err().code, Code::NotFound);
    assert!(cl.get("kept").await.unwrap() == payload(2, 50_000));
    n1.signal(libc::SIGCONT);
    // It learns it was forgotten, starts clean and registers again.
    let t0 = std::time::Instant::now();
    while !(nodes().await.contains("\"n1\"") && objects().await == 0) {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "n1 back clean: {} objects, nodes {}",
            objects().await,
            nodes().await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for key in ["removed", "lost"] {
        assert_eq!(cl.get(key).await.unwrap_err().code, Code::NotFound, "{key}");
    }
    assert!(cl.get("kept").await.unwrap() == payload(2, 50_000));
    // A new client's placement view knows n1's new segment (an older view
    // names the old one for up to 5 s, and the master places elsewhere).
    let fresh = Client::connect(ClientConfig::new(&m.addr)).await.unwrap();
    fresh
        .put("after", &payload(4, 50_000), &on(1, Some("n1")))
        .await
        .unwrap();
    assert!(cl.get("after").await.unwrap() == payload(4, 50_000));
    let t0 = std::time::Instant::now();
    while objects().await != 1 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{} held; {}",
            objects().await,
            json(m.admin, "/api/v1/keys/after").await,
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
