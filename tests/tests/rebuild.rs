//! A master restart keeps the cache: store nodes report the committed
//! objects they hold and the restarted master adopts them (real processes,
//! the master SIGKILLed).

use std::time::Duration;
use strata_client::{Client, ClientConfig, PutOptions};
use strata_common::Code;
use strata_proto as pb;
use strata_tests::procs::{start_node_admin, Proc, RestartableMaster};
use strata_tests::{http_get, metric, payload};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dram_objects_survive_a_master_restart() {
    let state = tempfile::tempdir().unwrap();
    // With --integrity blake3: the writers' digests come back with the
    // nodes' signed records, so readers still check them after the restart.
    let m = RestartableMaster::new(state.path(), &["--node-ttl", "2s", "--integrity", "blake3"]);
    let (addr, admin) = (m.addr.clone(), m.admin);
    let master = m.start().await;
    // Two nodes, two replicas of some objects: both copies are adopted.
    let (_n1, _, n1a) = start_node_admin(&addr, "n1", &[]).await;
    let (_n2, _, n2a) = start_node_admin(&addr, "n2", &[]).await;
    let cl = Client::connect(ClientConfig::new(&addr)).await.unwrap();
    let keys: Vec<(String, u32)> = (0..24).map(|i| (format!("k{i}"), 1 + i % 2)).collect();
    for (i, (k, replicas)) in keys.iter().enumerate() {
        let opts = PutOptions {
            replicas: *replicas,
            ..Default::default()
        };
        cl.put(k, &payload(i as u64, 100_000 + i * 1000), &opts)
            .await
            .unwrap();
    }
    // A node learns of commits with its next heartbeat (the known window:
    // docs/operations.md); the restart comes once they hold every record.
    let want_replicas: u32 = keys.iter().map(|(_, r)| r).sum();
    wait_for_records(&[n1a, n2a], want_replicas as usize).await;
    let master = restart(master, &m, want_replicas as f64).await;
    for (i, (k, replicas)) in keys.iter().enumerate() {
        let got = cl.get(k).await.unwrap_or_else(|e| panic!("{k}: {e}"));
        assert!(got == payload(i as u64, 100_000 + i * 1000), "{k} bytes");
        let (_, body) = http_get(admin, &format!("/api/v1/keys/{k}")).await;
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            v["replicas"].as_array().unwrap().len(),
            *replicas as usize,
            "{v}"
        );
        assert_eq!(v["verified_by"], "blake3", "{v}");
    }
    // The rebuilt ranges are allocated: new puts land beside them, and the
    // old objects still read back intact afterwards.
    for i in 0..24u64 {
        cl.put(
            &format!("new{i}"),
            &payload(100 + i, 100_000),
            &PutOptions::default(),
        )
        .await
        .unwrap();
    }
    for (i, (k, _)) in keys.iter().enumerate() {
        assert!(cl.get(k).await.unwrap() == payload(i as u64, 100_000 + i * 1000));
    }
    // A second restart, once the nodes' records came back through the
    // object log (their /api/v1/objects): everything is adopted again.
    let total = want_replicas as usize + 24;
    wait_for_records(&[n1a, n2a], total).await;
    let _master = restart(master, &m, total as f64).await;
    assert!(cl.get("new3").await.unwrap() == payload(103, 100_000));
    assert!(cl.get("k5").await.unwrap() == payload(5, 105_000));
}

/// A put whose client declared its checksum at PutStart is announced to its
/// node, which reports it to a restarted master only if the bytes it holds
/// match: a put whose bytes arrived whole is kept even though its node never
/// saw a commit (its PutEnd may have been acknowledged), and one whose bytes
/// are torn or were never written is not adopted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn announced_puts_are_adopted_only_when_their_bytes_match() {
    let state = tempfile::tempdir().unwrap();
    let m = RestartableMaster::new(state.path(), &["--node-ttl", "2s"]);
    let addr = m.addr.clone();
    let master = m.start().await;
    let (_n1, _, n1a) = start_node_admin(&addr, "n1", &[]).await;
    let cl = Client::connect(ClientConfig::new(&addr)).await.unwrap();
    let mut mc = cl.master_client();
    let data = payload(1, 200_000);
    for (key, written) in [
        ("whole", data.len()),
        ("torn", data.len() - 1),
        ("unwritten", 0),
    ] {
        let started = mc
            .put_start(pb::PutStartRequest {
                key: key.into(),
                size: data.len() as u64,
                replica_num: 1,
                crc32c: Some(crc32c::crc32c(&data)),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        if written > 0 {
            let range = strata_client::remote_range(&started.replicas[0]).unwrap();
            cl.transport()
                .write(&range, 0, &data[..written])
                .await
                .unwrap();
        }
    }
    // No PutEnd: the node holds three announcements and no commit.
    let t0 = std::time::Instant::now();
    loop {
        let (_, body) = http_get(n1a, "/api/v1/objects?pending=true").await;
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        if v["pending"].as_array().map_or(0, Vec::len) == 3 {
            assert_eq!(v["objects_total"], 0, "{v}");
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "announcements: {v}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _master = restart(master, &m, 1.0).await;
    assert!(cl.get("whole").await.unwrap() == data, "whole: bytes");
    for key in ["torn", "unwritten"] {
        let e = cl.get(key).await.unwrap_err();
        assert_eq!(e.code, Code::NotFound, "{key}: {e}");
    }
    // The adopted put is a committed object in the node's records again.
    wait_for_records(&[n1a], 1).await;
    // Its PutEnd, arriving after the restart, finds it done; a PutEnd of
    // other bytes is refused.
    let crc = crc32c::crc32c(&data);
    let end = |crc32c| pb::PutEndRequest {
        key: "whole".into(),
        crc32c,
        ..Default::default()
    };
    mc.put_end(end(crc)).await.unwrap();
    let e = mc.put_end(end(crc ^ 1)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::AlreadyExists, "{e}");
}

/// A put acknowledged on its node's receipt (the node recorded it as its
/// bytes landed; the master did not wait for the node to hear of the
/// commit) survives a master SIGKILLed right after its PutEnd: the node
/// reports it and the restarted master adopts it. (Its commit reaches the
/// node with a later heartbeat, up to 2 s after, with the `--node-ttl`
/// here, so the kill almost always comes first.) A receipted write whose
/// PutEnd never came is known to its node only by its record (the master
/// announced nothing): adopted too. A write whose record is not the
/// master's (another key) is refused and leaves nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn puts_acknowledged_on_receipts_survive_a_master_killed_at_once() {
    let state = tempfile::tempdir().unwrap();
    let m = RestartableMaster::new(state.path(), &["--node-ttl", "20s"]);
    let (addr, admin) = (m.addr.clone(), m.admin);
    let master = m.start().await;
    let (_n1, _, n1a) = start_node_admin(&addr, "n1", &[]).await;
    let cl = Client::connect(ClientConfig::new(&addr)).await.unwrap();
    for i in 0..3u64 {
        cl.put(
            &format!("r{i}"),
            &payload(i, 70_000),
            &PutOptions::default(),
        )
        .await
        .unwrap();
    }
    let (_, body) = http_get(admin, "/metrics").await;
    let accepted = "strata_master_put_receipts_total{outcome=\"accepted\"}";
    assert_eq!(metric(&body, accepted), 3.0, "{body}");
    let (_, body) = http_get(n1a, "/metrics").await;
    assert_eq!(
        metric(&body, "strata_store_node_recorded_puts_total"),
        3.0,
        "{body}"
    );

    // Receipted writes without a PutEnd: one whose record is the master's,
    // one whose record names another key than it was signed for.
    let mut mc = cl.master_client();
    let data = payload(9, 5000);
    let crc = crc32c::crc32c(&data);
    for (key, recorded) in [("unended", "unended"), ("mine", "victim")] {
        let started = mc
            .put_start(pb::PutStartRequest {
                key: key.into(),
                size: data.len() as u64,
                replica_num: 1,
                crc32c: Some(crc),
                receipts: true,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let replica = &started.replicas[0];
        let range = strata_client::remote_range(replica).unwrap();
        let record = strata_transport::frame::WriteRecord {
            key: recorded.into(),
            crc32c: crc,
            mac: replica.record.as_slice().try_into().unwrap(),
        };
        let written = cl.transport().write_recorded(&range, &data, &record).await;
        if key == recorded {
            assert!(written.unwrap().is_some(), "no receipt");
        } else {
            assert_eq!(written.unwrap_err().code, Code::PermissionDenied);
        }
    }
    let (_, body) = http_get(n1a, "/api/v1/objects").await;
    assert!(!body.contains("victim"), "{body}");

    let _master = restart(master, &m, 4.0).await;
    for i in 0..3u64 {
        let got = cl.get(&format!("r{i}")).await.unwrap();
        assert!(got == payload(i, 70_000), "r{i} bytes");
    }
    assert!(cl.get("unended").await.unwrap() == data, "unended bytes");
    for key in ["mine", "victim"] {
        assert_eq!(cl.get(key).await.unwrap_err().code, Code::NotFound, "{key}");
    }
}

async fn wait_for_records(admins: &[std::net::SocketAddr], want: usize) {
    let t0 = std::time::Instant::now();
    while node_objects(admins).await != want {
        assert!(t0.elapsed() < Duration::from_secs(20), "node records");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Committed objects the nodes hold, by their admin endpoints.
async fn node_objects(admins: &[std::net::SocketAddr]) -> usize {
    let mut n = 0;
    for a in admins {
        let (_, body) = http_get(*a, "/api/v1/objects").await;
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        n += v["objects"].as_array().map_or(0, Vec::len);
    }
    n
}

/// SIGKILLs the master, starts it again, and waits (bounded) until the
/// nodes re-reported and exactly `want` replicas were adopted.
async fn restart(master: Proc, m: &RestartableMaster, want: f64) -> Proc {
    drop(master); // SIGKILL
    let admin = m.admin;
    let master = m.start().await;
    let t0 = std::time::Instant::now();
    loop {
        let (_, m) = http_get(admin, "/metrics").await;
        let adopted = metric(
            &m,
            "strata_master_rebuilt_objects_total{outcome=\"adopted\"}",
        );
        if adopted >= want {
            assert_eq!(adopted, want, "{m}");
            return master;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "adopted {adopted} of {want}: {m}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
