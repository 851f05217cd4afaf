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
