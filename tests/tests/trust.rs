//! Trust boundaries against the real binaries and in-process clusters: calls
//! need the credential of their role, protected mode keeps a credential-less
//! master on loopback, and members cannot take over each other's identity.

use std::time::Duration;
use strata_client::{Client, ClientConfig, Code, PutOptions};
use strata_common::auth::Secret;
use strata_proto as pb;
use strata_proto::master_client::MasterClient;
use strata_tests::procs::{
    free_port, spawn, start_agent, start_master, start_node_with, token_files,
};
use strata_tests::{bin, eager, http_get, payload, ClusterBuilder};

type Mc = MasterClient<strata_common::grpc::MasterChannel>;

fn master_client(addr: &str, token: Option<&Secret>) -> Mc {
    MasterClient::new(strata_common::grpc::master_channel(addr, token).unwrap())
}

fn secret(p: &std::path::Path) -> Secret {
    Secret::from_file(p, "test").unwrap()
}

fn register_req(node_id: &str, data_addr: &str) -> pb::RegisterNodeRequest {
    pb::RegisterNodeRequest {
        node_id: node_id.into(),
        data_addr: data_addr.into(),
        segments: vec![pb::SegmentSpec {
            local_id: 0,
            size: 1 << 20,
            ..Default::default()
        }],
        instance: "intruder".into(),
        instance_proof: strata_common::auth::new_instance_proof(),
        held_objects: 0,
        ..Default::default()
    }
}

async fn json(admin: std::net::SocketAddr, path: &str) -> serde_json::Value {
    let (_, body) = http_get(admin, path).await;
    serde_json::from_str(&body).unwrap()
}

/// Runs the `strata` CLI; returns (exit code, stderr).
fn cli(args: &[&str], token: Option<&std::path::Path>) -> (i32, String) {
    let mut c = std::process::Command::new(bin("strata"));
    c.args(args)
        .env_remove("STRATA_TOKEN_FILE")
        // No `strata up` token file is found by default.
        .env("HOME", "/nonexistent")
        .env_remove("XDG_CONFIG_HOME");
    if let Some(t) = token {
        c.arg("--token-file").arg(t);
    }
    let out = c.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_needs_the_credential_of_its_role() {
    let dir = tempfile::tempdir().unwrap();
    let t = token_files(dir.path());
    let args = t.master_args();
    let m = start_master(&args.iter().map(String::as_str).collect::<Vec<_>>()).await;
    let (member, client, admin) = (t.member, t.client, t.admin);
    let (_node, node_addr) =
        start_node_with(&m.addr, "n1", &["--token-file", member.to_str().unwrap()]).await;
    // The node registered with its member token.
    for _ in 0..250 {
        if json(m.admin, "/api/v1/nodes")
            .await
            .to_string()
            .contains("n1")
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // No token: UNAUTHENTICATED naming the credential.
    let anon = Client::connect(ClientConfig::new(&m.addr)).await.unwrap();
    let e = anon
        .put("k", b"v", &PutOptions::default())
        .await
        .unwrap_err();
    assert_eq!(e.code, Code::Unauthenticated, "{e}");
    assert!(e.message.contains("client token"), "{e}");
    // A token that matches nothing.
    let bogus = Secret::generate();
    let e = master_client(&m.addr, Some(&bogus))
        .exists(pb::ExistsRequest { key: "k".into() })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e}");
    // A member token cannot make client calls, and a client token cannot
    // make member calls.
    let e = master_client(&m.addr, Some(&secret(&member)))
        .exists(pb::ExistsRequest { key: "k".into() })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e}");
    assert!(e.message().contains("member token"), "{e}");
    let e = master_client(&m.addr, Some(&secret(&client)))
        .register_node(register_req("evil", "127.0.0.1:1"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e}");
    assert!(e.message().contains("member role"), "{e}");
    let e = master_client(&m.addr, None)
        .register_node(register_req("evil", "127.0.0.1:1"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e}");

    // The client token puts and gets, but may not force or remove everything.
    let cl = Client::connect(ClientConfig::new(&m.addr).with_token(Some(secret(&client))))
        .await
        .unwrap();
    cl.put("k", &payload(1, 5000), &PutOptions::default())
        .await
        .unwrap();
    assert_eq!(cl.get("k").await.unwrap(), payload(1, 5000));
    let e = cl.remove("k", true).await.unwrap_err();
    assert_eq!(e.code, Code::PermissionDenied, "{e}");
    assert!(e.message.contains("admin role"), "{e}");
    let e = cl
        .master_client()
        .remove_all(pb::RemoveAllRequest { force: false })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e}");
    let e = cl
        .master_client()
        .evict_memory(pb::EvictMemoryRequest {
            keys: vec!["k".into()],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e}");
    assert_eq!(cl.get("k").await.unwrap(), payload(1, 5000), "still there");

    // The CLI: exit 1 with the message; with the token it works.
    let (code, err) = cli(&["--master", &m.addr, "get", "k", "-"], None);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("client token"), "{err}");
    let (code, err) = cli(&["--master", &m.addr, "rm", "--force", "k"], Some(&client));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("admin role"), "{err}");
    let (code, err) = cli(&["--master", &m.addr, "rm", "--force", "k"], Some(&admin));
    assert_eq!(code, 0, "{err}");
    let (code, err) = cli(&["--master", &m.addr, "rm", "--all"], Some(&admin));
    assert_eq!(code, 0, "{err}");
    assert_eq!(cl.get("k").await.unwrap_err().code, Code::NotFound);
    // Admin reads stay open; the node still serves its data plane.
    assert_eq!(http_get(m.admin, "/api/v1/segments").await.0, 200);
    assert!(!node_addr.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protected_mode_keeps_a_master_without_credentials_on_loopback() {
    let p = free_port();
    let run = |args: &[String]| {
        let mut proc = spawn("strata-master", args);
        let t0 = std::time::Instant::now();
        loop {
            if let Some(st) = proc.0.try_wait().unwrap() {
                return Some(st.code().unwrap_or(-1));
            }
            if t0.elapsed() > Duration::from_secs(3) {
                return None; // still running: it started
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let admin = format!("127.0.0.1:{}", free_port());
    // All interfaces without credentials: refused (exit 2).
    let wild = format!("0.0.0.0:{p}");
    let adv = format!("127.0.0.1:{p}");
    let refused = s(&[
        "--listen",
        &wild,
        "--advertise",
        &adv,
        "--admin-addr",
        &admin,
    ]);
    assert_eq!(run(&refused), Some(2));
    // All interfaces without --advertise: refused too.
    let dir = tempfile::tempdir().unwrap();
    let mut no_adv = s(&["--listen", &wild, "--admin-addr", &admin]);
    no_adv.extend(token_files(dir.path()).master_args());
    assert_eq!(run(&no_adv), Some(2));
    // --insecure accepts the risk; loopback needs nothing.
    let mut insecure = refused.clone();
    insecure.push("--insecure".into());
    assert_eq!(run(&insecure), None);
    assert_eq!(run(&s(&["--listen", &adv, "--admin-addr", &admin])), None);
    // The message names the flags to add.
    let out = std::process::Command::new(bin("strata-master"))
        .args(&refused)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--member-token-file") && err.contains("--insecure"),
        "{err}"
    );
    // A store node on all interfaces needs --advertise.
    let out = std::process::Command::new(bin("strata-store-node"))
        .args(["--listen", &format!("0.0.0.0:{}", free_port())])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--advertise"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_node_id_cannot_be_taken_over() {
    let c = ClusterBuilder::new().store_nodes(1).build().await.unwrap();
    let member = c.credentials().member.clone();
    let mut m = master_client(&c.master_addr(), member.as_ref());
    let (id, addr) = (c.nodes[0].node_id.clone(), c.nodes[0].data_addr);
    // Same node_id from another process: refused while the node lives.
    let e = m
        .register_node(register_req(&id, &addr.to_string()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::AlreadyExists, "{e}");
    assert!(e.message().contains("live process"), "{e}");
    // A heartbeat for it from another process: refused, log untouched.
    let e = m
        .heartbeat(pb::HeartbeatRequest {
            node_id: id.clone(),
            incarnation: 1,
            applied_seq: u64::MAX,
            instance_proof: strata_common::auth::new_instance_proof(),
            wait_ms: 0,
            leaving: false,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e}");
    // The node keeps serving and its records still follow.
    let cl = c.client().await.unwrap();
    cl.put("mine", &payload(2, 4096), &PutOptions::default())
        .await
        .unwrap();
    assert_eq!(cl.get("mine").await.unwrap(), payload(2, 4096));
    let recs = c.nodes[0].records.clone();
    let t0 = std::time::Instant::now();
    while !recs.snapshot().iter().any(|r| r.key == "mine") {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "node records the commit"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_cannot_be_taken_over_with_its_published_instance() {
    let c = ClusterBuilder::new()
        .store_nodes(1)
        .ssd_agents(1)
        .build()
        .await
        .unwrap();
    let v = json(c.master_admin, "/api/v1/owners").await;
    let o = &v["owners"][0];
    let req = pb::RegisterOwnerRequest {
        handle: o["handle"].as_str().unwrap().into(),
        data_addr: o["data_addr"].as_str().unwrap().into(),
        capacity_bytes: 1 << 30,
        instance: o["instance"].as_str().unwrap().into(),
        instance_proof: strata_common::auth::new_instance_proof(),
    };
    let epoch = o["epoch"].as_u64().unwrap();
    let member = c.credentials().member.clone();
    let e = master_client(&c.master_addr(), member.as_ref())
        .register_owner(req)
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::AlreadyExists, "{e}");
    // Heartbeats in its name are refused too.
    let e = master_client(&c.master_addr(), member.as_ref())
        .owner_heartbeat(pb::OwnerHeartbeatRequest {
            owner_id: o["owner_id"].as_u64().unwrap(),
            epoch,
            max_tasks: 10,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e}");
    let v = json(c.master_admin, "/api/v1/owners").await;
    assert_eq!(v["owners"][0]["epoch"].as_u64(), Some(epoch), "not fenced");
    c.shutdown().await;
}

/// The grant key lives in `--state-dir`: after a master restart an agent
/// that re-registers still serves what it holds (before, every SSD read then
/// failed its signature check). Under `--integrity blake3` the copy comes
/// back with the writer's digest (its record carries it), so readers still
/// check the agent's bytes against it (before, an adopted copy had none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ssd_reads_survive_a_master_restart() {
    let state = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tokens = tempfile::tempdir().unwrap();
    let t = token_files(tokens.path());
    let (member, admin) = (t.member.clone(), t.admin.clone());
    let mut extra: Vec<String> = [
        "--offload-policy",
        "eager",
        "--node-ttl",
        "2s",
        "--integrity",
        "blake3",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    extra.extend(t.master_args());
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let m = strata_tests::procs::RestartableMaster::new(state.path(), &extra);
    let (addr, admin_addr) = (m.addr.clone(), m.admin);
    let master = m.start().await;
    let (_node, _, node_admin) = strata_tests::procs::start_node_admin(
        &addr,
        "n1",
        &["--token-file", member.to_str().unwrap()],
    )
    .await;
    let (_agent, _) = start_agent(
        &addr,
        "h/0",
        dir.path(),
        &[("STRATA_TOKEN_FILE", member.to_str().unwrap())],
        true,
    )
    .await;
    let cl = Client::connect(ClientConfig::new(&addr).with_token(Some(secret(&admin))))
        .await
        .unwrap();
    cl.put("ssd-only", &payload(4, 100_000), &PutOptions::default())
        .await
        .unwrap();
    // SSD-only from here on: the node's DRAM copy would survive the restart.
    strata_tests::make_ssd_only(&cl, "ssd-only").await;
    // ...once the node has dropped it too (it learns of the eviction from
    // its object log; killed before that, the master would hear of the
    // copy again when the node re-registers).
    let t0 = std::time::Instant::now();
    while strata_tests::http_get_as(node_admin, "/api/v1/objects", Some(&secret(&member)))
        .await
        .1
        .contains("ssd-only")
    {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the node kept its DRAM copy"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(master); // SIGKILL
    let _master = m.start().await;
    // The agent re-registers and re-reports its copy.
    let t0 = std::time::Instant::now();
    let got = loop {
        match cl.get("ssd-only").await {
            Ok(v) => break v,
            Err(e) => {
                assert!(
                    t0.elapsed() < Duration::from_secs(30),
                    "served after the restart: {e}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert_eq!(got, payload(4, 100_000));
    let (_, body) =
        strata_tests::http_get_as(admin_addr, "/api/v1/keys/ssd-only", Some(&secret(&admin))).await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(!v.to_string().contains("\"memory\""), "SSD-only: {v}");
    assert_eq!(v["verified_by"], "blake3", "{v}");
}

/// The in-process harness runs with generated credentials; protected mode
/// (none) works too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_clusters_run_with_and_without_credentials() {
    for on in [true, false] {
        let c = ClusterBuilder::new()
            .store_nodes(1)
            .ssd_agents(1)
            .credentials(on)
            .master(eager)
            .build()
            .await
            .unwrap();
        assert_eq!(c.credentials().is_empty(), !on);
        let cl = c.client().await.unwrap();
        cl.put("x", &payload(5, 3000), &PutOptions::default())
            .await
            .unwrap();
        assert_eq!(cl.get("x").await.unwrap(), payload(5, 3000));
        let anon = Client::connect(ClientConfig::new(c.master_addr()))
            .await
            .unwrap();
        assert_eq!(anon.get("x").await.is_ok(), !on);
        c.shutdown().await;
    }
}

/// Another client cannot end a put it did not start: a bound put (every
/// put of this library) is committed or revoked only with its put token,
/// over gRPC and batched alike; the writer's own PutEnd still commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_client_cannot_end_or_revoke_a_put_it_did_not_start() {
    let c = ClusterBuilder::new().store_nodes(1).build().await.unwrap();
    let cl = c.client().await.unwrap();
    let mut writer = cl.master_client();
    let mut other = c.client().await.unwrap().master_client();
    let started = writer
        .put_start(pb::PutStartRequest {
            key: "victim".into(),
            size: 5,
            replica_num: 1,
            bind: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!started.put_token.is_empty(), "a bound put has a token");
    let g = started.replicas[0].grant.as_ref().unwrap().generation;
    let end = |token: &[u8]| pb::PutEndRequest {
        key: "victim".into(),
        crc32c: crc32c::crc32c(b"hello"),
        generation: Some(g),
        put_token: token.to_vec(),
        ..Default::default()
    };
    let e = other.put_end(end(&[])).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e}");
    let e = other
        .put_revoke(pb::PutRevokeRequest {
            key: "victim".into(),
            generation: Some(g),
            put_token: vec![0; 16],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e}");
    let batch = other
        .batch_put_revoke(pb::BatchPutRevokeRequest {
            keys: vec!["victim".into()],
            generations: vec![g],
            put_tokens: vec![],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(batch.results.len(), 1);
    assert_eq!(batch.results[0].code, Code::PermissionDenied as u32);
    // The writer's bytes and its own PutEnd.
    let range = strata_client::remote_range(&started.replicas[0]).unwrap();
    cl.transport().write(&range, 0, b"hello").await.unwrap();
    writer.put_end(end(&started.put_token)).await.unwrap();
    assert_eq!(cl.get("victim").await.unwrap(), b"hello");
    c.shutdown().await;
}

/// `--integrity blake3`: a member serving bytes other than the writer's,
/// forged to the same crc32c (four chosen bytes), is caught by readers: a
/// good replica serves the read, or it fails `Corrupted`, through every
/// read path (single, into a buffer, batched, and SSD copies made from the
/// forged replica). Under crc32c alone the forgery is served: what the flag
/// is for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_forging_bytes_with_the_same_crc32c_is_caught_with_integrity_blake3() {
    use strata_master::config::Integrity;
    let good = payload(11, 200_000);
    let mut forged = good.clone();
    forged[1000..1010].copy_from_slice(b"not yours!");
    strata_tests::forge_crc32c(&mut forged, 5000, crc32c::crc32c(&good));
    assert_ne!(forged, good);
    for integrity in [Integrity::Crc32c, Integrity::Blake3] {
        let c = ClusterBuilder::new()
            .store_nodes(2)
            .ssd_agents(1)
            .master(move |m| {
                m.integrity = integrity;
                eager(m);
            })
            .build()
            .await
            .unwrap();
        let cl = c.client().await.unwrap();
        let mut m = cl.master_client();
        let keys = ["one-forged-of-two", "only-forged", "ssd-forged"];
        for (key, replicas) in keys.iter().zip([2u32, 1, 1]) {
            // The first replica's node holds the forgery.
            let st = strata_tests::put_start_with_a_bad_first_replica(
                &cl, key, replicas, &forged, &good,
            )
            .await;
            let blake3 = st.integrity == pb::Integrity::Blake3 as i32;
            assert_eq!(blake3, integrity == Integrity::Blake3, "PutStart says so");
            m.put_end(pb::PutEndRequest {
                key: key.to_string(),
                crc32c: crc32c::crc32c(&good),
                blake3: match blake3 {
                    true => strata_transport::parts::blake3(&[&good]).to_vec(),
                    false => Vec::new(),
                },
                ..Default::default()
            })
            .await
            .unwrap();
        }
        // Its SSD copy is made from the forged replica (the agent checks
        // only the crc32c), then its DRAM goes: reads are the agent's.
        strata_tests::make_ssd_only(&cl, "ssd-forged").await;
        let mut buf = vec![0u8; good.len()];
        match integrity {
            Integrity::Crc32c => {
                for key in &keys[1..] {
                    assert_eq!(cl.get(key).await.unwrap(), forged, "{key}");
                }
            }
            Integrity::Blake3 => {
                for _ in 0..3 {
                    assert_eq!(cl.get(keys[0]).await.unwrap(), good);
                }
                for key in &keys[1..] {
                    let e = cl.get(key).await.unwrap_err();
                    assert_eq!(e.code, Code::Corrupted, "{key}: {e}");
                    let e = cl.get_into(key, &mut buf).await.unwrap_err();
                    assert_eq!(e.code, Code::Corrupted, "{key}: {e}");
                }
                let got = cl.batch_get(&keys).await.unwrap();
                assert_eq!(got.len(), keys.len());
                assert_eq!(got[0].as_ref().unwrap(), &good);
                for (key, r) in keys.iter().zip(&got).skip(1) {
                    let e = r.as_ref().unwrap_err();
                    assert_eq!(e.code, Code::Corrupted, "{key}: {e}");
                }
            }
        }
        c.shutdown().await;
    }
}

/// Under `--integrity blake3` the library's own writes send the digest
/// (single, batched, of parts, overwrites) and read back whole; a lookup
/// hands out exactly the BLAKE3 of the bytes written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_under_integrity_blake3_carry_the_digest_readers_check() {
    let c = ClusterBuilder::new()
        .store_nodes(2)
        .master(|m| m.integrity = strata_master::config::Integrity::Blake3)
        .build()
        .await
        .unwrap();
    let cl = c.client().await.unwrap();
    let opts = PutOptions::default();
    let (a, b, p) = (payload(1, 70_000), payload(2, 300), payload(3, 5000));
    cl.put("single", &a, &opts).await.unwrap();
    let r = cl.batch_put(&[("batch", &b[..])], &opts).await.unwrap();
    assert_eq!(r.len(), 1);
    r[0].as_ref().unwrap();
    cl.put_parts("parts", &[&p[..1000], &p[1000..]], &opts)
        .await
        .unwrap();
    let over = PutOptions {
        overwrite: true,
        ..PutOptions::default()
    };
    cl.put("single", &b, &over).await.unwrap();
    let mut m = cl.master_client();
    for (key, bytes) in [("single", &b), ("batch", &b), ("parts", &p)] {
        let info = m
            .get_replicas(pb::GetReplicasRequest { key: key.into() })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            info.blake3,
            strata_transport::parts::blake3(&[bytes]),
            "{key}"
        );
        assert_eq!(&cl.get(key).await.unwrap(), bytes, "{key}");
        let admin = c.credentials().admin.as_ref();
        let path = format!("/api/v1/keys/{key}");
        let (_, view) = strata_tests::http_get_as(c.master_admin, &path, admin).await;
        assert!(view.contains(r#""verified_by":"blake3""#), "{view}");
    }
    let (mut x, mut y) = (vec![0u8; 1000], vec![0u8; 4000]);
    let n = cl
        .get_into_parts("parts", &mut [&mut x[..], &mut y[..]])
        .await
        .unwrap();
    assert_eq!(n, p.len());
    assert_eq!([x, y].concat(), p);
    c.shutdown().await;
}

/// The counter a member's term fence bumps for each answer it refuses.
async fn fenced(admin: std::net::SocketAddr, metric: &str) -> f64 {
    let (_, body) = http_get(admin, "/metrics").await;
    strata_tests::metric(&body, metric)
}

/// A store node refuses the answers of a deposed leader (an older term):
/// one telling it "you are unknown, start over" does not make it drop its
/// segments and re-register, so its objects stay readable. (Failpoint
/// `master::deposed-heartbeat`: the master answers as a deposed one.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_node_refuses_a_deposed_leaders_heartbeat_answers() {
    let c = ClusterBuilder::new().store_nodes(1).build().await.unwrap();
    let cl = c.client().await.unwrap();
    cl.put("kept", &payload(8, 50_000), &PutOptions::default())
        .await
        .unwrap();
    let node = &c.nodes[0];
    let metric = "strata_store_node_fenced_answers_total";
    assert_eq!(fenced(node.admin_addr, metric).await, 0.0);
    fail::cfg("master::deposed-heartbeat", "return").unwrap();
    let t0 = std::time::Instant::now();
    while fenced(node.admin_addr, metric).await < 3.0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "no answer refused");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    fail::remove("master::deposed-heartbeat");
    // Still registered with its segments: nothing was dropped.
    assert!(node.is_registered());
    assert_eq!(cl.get("kept").await.unwrap(), payload(8, 50_000));
    let (_, body) = http_get(node.admin_addr, "/metrics").await;
    assert_eq!(
        strata_tests::metric(&body, "strata_store_node_registrations_total"),
        1.0,
        "registered once, never again"
    );
    c.shutdown().await;
}

/// An SSD agent refuses a deposed leader's heartbeat answers, and with them
/// the removals they carry: the copy stays until the real leader's answer
/// asks for it again. (Failpoint `master::deposed-owner-heartbeat`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ssd_agent_refuses_a_deposed_leaders_removals() {
    let c = ClusterBuilder::new()
        .master(eager)
        .store_nodes(1)
        .ssd_agents(1)
        .build()
        .await
        .unwrap();
    let cl = c.client().await.unwrap();
    let key = "on-ssd".to_string();
    strata_tests::put_on_ssd_only(&c, &cl, std::slice::from_ref(&key), 4096, 9).await;
    let a = &c.agents[0];
    assert!(a.store.location(&key).unwrap().is_some());
    let metric = "strata_ssd_agent_fenced_answers_total";
    assert_eq!(fenced(a.admin_addr, metric).await, 0.0);
    fail::cfg("master::deposed-owner-heartbeat", "return").unwrap();
    let remove = tokio::spawn({
        let (cl, key) = (cl.clone(), key.clone());
        async move { cl.remove(&key, false).await }
    });
    let t0 = std::time::Instant::now();
    while fenced(a.admin_addr, metric).await < 3.0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "no answer refused");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        a.store.location(&key).unwrap().is_some(),
        "a deposed leader's removal was applied"
    );
    fail::remove("master::deposed-owner-heartbeat");
    // The real leader's answer carries the removal again: applied.
    assert!(
        strata_tests::wait_until(Duration::from_secs(10), || a
            .store
            .location(&key)
            .unwrap()
            .is_none())
        .await
    );
    remove.await.unwrap().unwrap();
    assert_eq!(cl.get(&key).await.unwrap_err().code, Code::NotFound);
    c.shutdown().await;
}
