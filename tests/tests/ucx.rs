//! The UCX data plane end to end, against the real binaries: a store node
//! started with `--transport ucx` next to a TCP-only one (a mixed cluster).
//! rdma clients move bytes one-sided to the UCX node (its TCP data plane
//! sees none of them) and over TCP to the other; clients without the rdma
//! role, and TCP clients, reach the UCX node's bytes over TCP, where every
//! grant is checked.

use std::sync::Arc;
use std::time::Duration;
use strata_client::{Client, ClientConfig, Code, PutOptions, TransportKind};
use strata_common::auth::Secret;
use strata_proto as pb;
use strata_tests::procs::{start_master, start_node_admin, token_files};
use strata_tests::{http_get, metric, payload, MasterRoutes};

async fn node_bytes(admin: std::net::SocketAddr) -> (f64, f64) {
    let (_, body) = http_get(admin, "/metrics").await;
    (
        metric(&body, "strata_store_node_written_bytes_total"),
        metric(&body, "strata_store_node_read_bytes_total"),
    )
}

async fn nodes_registered(admin: std::net::SocketAddr, n: usize) -> bool {
    for _ in 0..500 {
        let (_, body) = http_get(admin, "/api/v1/nodes").await;
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        if v["nodes"].as_array().is_some_and(|a| a.len() == n) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

fn client(master: &str, token: &std::path::Path, t: TransportKind) -> ClientConfig {
    ClientConfig::new(master)
        .with_token(Some(Secret::from_file(token, "test").unwrap()))
        .with_transport(t)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_cluster_serves_ucx_and_tcp_clients() {
    let dir = tempfile::tempdir().unwrap();
    let t = token_files(dir.path());
    let args = t.master_args();
    let m = start_master(&args.iter().map(String::as_str).collect::<Vec<_>>()).await;
    let member = t.member.to_str().unwrap();
    let (_ucx, _, ucx_admin) = start_node_admin(
        &m.addr,
        "ucx-node",
        &["--token-file", member, "--transport", "ucx"],
    )
    .await;
    let (_tcp, _, tcp_admin) =
        start_node_admin(&m.addr, "tcp-node", &["--token-file", member]).await;
    assert!(nodes_registered(m.admin, 2).await);

    // Routes go to the rdma role only.
    let mc = |tok: &std::path::Path| strata_tests::master_client_as(&m.addr, tok);
    let ask = pb::GetUcxRoutesRequest {
        segment_ids: (0..16).collect(),
    };
    for tok in [&t.client, &t.admin] {
        let e = mc(tok).get_ucx_routes(ask.clone()).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e}");
        assert!(e.message().contains("rdma role"), "{e}");
    }
    let routes = mc(&t.rdma)
        .get_ucx_routes(ask)
        .await
        .unwrap()
        .into_inner()
        .routes;
    // One segment, on the UCX node only.
    assert_eq!(routes.len(), 1, "{routes:?}");
    assert!(!routes[0].worker.is_empty() && !routes[0].rkey.is_empty());

    // An rdma client over UCX: objects land on both nodes; the UCX node's
    // TCP data plane moves none of their bytes.
    let rdma = Client::connect(client(&m.addr, &t.rdma, TransportKind::Ucx))
        .await
        .unwrap();
    let objs: Vec<(String, Vec<u8>)> = (0..24u64)
        .map(|i| (format!("k{i}"), payload(i, 1000 + 7919 * i as usize)))
        .collect();
    for (k, v) in &objs {
        rdma.put(k, v, &PutOptions::default()).await.unwrap();
    }
    for (k, v) in &objs {
        assert_eq!(&rdma.get(k).await.unwrap(), v, "{k}");
    }
    let keys: Vec<&str> = objs.iter().map(|(k, _)| k.as_str()).collect();
    for (r, (_, v)) in rdma.batch_get(&keys).await.unwrap().into_iter().zip(&objs) {
        assert_eq!(&r.unwrap(), v);
    }
    let (w, r) = node_bytes(ucx_admin).await;
    assert_eq!(
        (w, r),
        (0.0, 0.0),
        "one-sided transfers bypass the node's TCP data plane"
    );
    let (w, r) = node_bytes(tcp_admin).await;
    assert!(w > 0.0 && r > 0.0, "the TCP node served its share over TCP");

    // Siblings (Python threads' clients, each on a runtime its thread
    // drives only while it waits) share the UCX engines and routes and
    // have TCP connections of their own: two threads read every object,
    // one-sided from the UCX node (whose TCP data plane still moves
    // nothing) and over TCP from the other, the second while the first
    // waits on something else with its runtime undriven.
    let tcp_read_before = node_bytes(tcp_admin).await.1;
    let sibling_reads = |base: Client, objs: Vec<(String, Vec<u8>)>| {
        move |done: std::sync::mpsc::Sender<()>, hold: std::sync::mpsc::Receiver<()>| {
            let (rt, sib) = strata_tests::sibling_on_own_runtime(&base);
            rt.block_on(async {
                for (k, v) in &objs {
                    let got = tokio::time::timeout(Duration::from_secs(5), sib.get(k)).await;
                    assert_eq!(&got.expect("a sibling's read ends").unwrap(), v, "{k}");
                }
            });
            done.send(()).unwrap();
            let _ = hold.recv();
        }
    };
    let (first_done, first_read) = std::sync::mpsc::channel();
    let (release, first_hold) = std::sync::mpsc::channel();
    let first = std::thread::spawn({
        let f = sibling_reads(rdma.clone(), objs.clone());
        move || f(first_done, first_hold)
    });
    first_read
        .recv()
        .expect("the first sibling read every object");
    let (second_done, second_read) = std::sync::mpsc::channel();
    let (keep_second, second_hold) = std::sync::mpsc::channel();
    let second = std::thread::spawn({
        let f = sibling_reads(rdma.clone(), objs.clone());
        move || f(second_done, second_hold)
    });
    let second_ok = second_read.recv().is_ok();
    release.send(()).unwrap();
    first.join().unwrap();
    drop(keep_second);
    let joined = second.join();
    assert!(
        second_ok && joined.is_ok(),
        "the second sibling read every object"
    );
    assert_eq!(node_bytes(ucx_admin).await, (0.0, 0.0));
    assert!(node_bytes(tcp_admin).await.1 > tcp_read_before);
    for (k, v) in &objs {
        let got = tokio::time::timeout(Duration::from_secs(10), rdma.get(k)).await;
        assert_eq!(&got.expect("the base's read ends").unwrap(), v, "{k}");
    }

    // A TCP client, and a UCX client without the rdma role, read the same
    // objects; the UCX node serves them over TCP, checking their grants.
    for cfg in [
        client(&m.addr, &t.client, TransportKind::Tcp),
        client(&m.addr, &t.client, TransportKind::Ucx),
    ] {
        let before = node_bytes(ucx_admin).await.1;
        let c = Client::connect(cfg).await.unwrap();
        for (k, v) in &objs {
            assert_eq!(&c.get(k).await.unwrap(), v, "{k}");
        }
        assert!(node_bytes(ucx_admin).await.1 > before);
    }
    // And writes: a client without the role puts over TCP.
    let plain = Client::connect(client(&m.addr, &t.client, TransportKind::Ucx))
        .await
        .unwrap();
    let before = node_bytes(ucx_admin).await.0 + node_bytes(tcp_admin).await.0;
    for i in 0..8u64 {
        plain
            .put(&format!("p{i}"), &payload(i, 4096), &PutOptions::default())
            .await
            .unwrap();
    }
    let after = node_bytes(ucx_admin).await.0 + node_bytes(tcp_admin).await.0;
    assert_eq!(after - before, 8.0 * 4096.0);
    // rdma reads what the TCP writer put, one-sided.
    for i in 0..8u64 {
        assert_eq!(rdma.get(&format!("p{i}")).await.unwrap(), payload(i, 4096));
    }
    let e = rdma.get("missing").await.unwrap_err();
    assert_eq!(e.code, Code::NotFound);
}

/// A UCX node killed (SIGKILL) under an rdma client: its transfers fail
/// retryably and never hang; restarted on the same address (a new process,
/// so a new worker and new routes), it is reached one-sided again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rdma_client_rides_out_a_ucx_node_killed_and_restarted() {
    use strata_tests::procs::{free_port, spawn, wait_ready};
    let dir = tempfile::tempdir().unwrap();
    let t = token_files(dir.path());
    let mut args = t.master_args();
    args.extend(["--node-ttl".to_string(), "2s".to_string()]);
    let m = start_master(&args.iter().map(String::as_str).collect::<Vec<_>>()).await;
    let (d, a) = (free_port(), free_port());
    let admin: std::net::SocketAddr = format!("127.0.0.1:{a}").parse().unwrap();
    let node_args: Vec<String> = [
        "--master",
        &m.addr,
        "--listen",
        &format!("127.0.0.1:{d}"),
        "--admin-addr",
        &admin.to_string(),
        "--node-id",
        "n1",
        "--capacity",
        "64MiB",
        "--transport",
        "ucx",
        "--token-file",
        t.member.to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let node = spawn("strata-store-node", &node_args);
    wait_ready(admin).await;
    assert!(nodes_registered(m.admin, 1).await);
    let (_, body) = http_get(admin, "/metrics").await;
    assert_eq!(
        metric(&body, "strata_store_node_ucx_exposed_bytes"),
        64.0 * 1048576.0
    );

    let mut cfg = client(&m.addr, &t.rdma, TransportKind::Ucx);
    cfg.backoff.deadline = Duration::from_secs(5);
    let rdma = Client::connect(cfg).await.unwrap();
    for i in 0..8u64 {
        rdma.put(&format!("a{i}"), &payload(i, 65536), &PutOptions::default())
            .await
            .unwrap();
        assert_eq!(rdma.get(&format!("a{i}")).await.unwrap(), payload(i, 65536));
    }
    drop(node); // SIGKILL
    let t0 = std::time::Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(60), rdma.get("a0"))
        .await
        .expect("a read from a killed node ends");
    let e = r.unwrap_err();
    assert!(e.retryable() || e.code == Code::NotFound, "{e:?}");
    // Within the client's retry budget (5 s) and a shared-memory transfer's
    // bound, not a 30 s transfer timeout.
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());

    let _node = spawn("strata-store-node", &node_args);
    wait_ready(admin).await;
    for i in 0..8u64 {
        let k = format!("b{i}");
        let v = payload(100 + i, 65536);
        let t0 = std::time::Instant::now();
        // The master may still hold the old registration for a moment.
        while let Err(e) = rdma.put(&k, &v, &PutOptions::default()).await {
            assert!(
                e.retryable() && t0.elapsed() < Duration::from_secs(30),
                "{e:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(rdma.get(&k).await.unwrap(), v);
    }
    // One-sided again: the new process's TCP data plane moved none of it.
    assert_eq!(node_bytes(admin).await, (0.0, 0.0));
}

/// A store-node process on this host names itself in its routes, and an
/// rdma client here reads its segment by cross-memory attach (the node's
/// TCP data plane moves no byte); killed by SIGKILL, the node is no longer
/// attached to (the kernel finds no such process) and reads of it fail
/// retryably.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_co_located_node_process_is_attached_to() {
    use strata_transport::tcp::{TcpTransport, TcpTransportConfig};
    use strata_transport::ucx::{UcxClientConfig, UcxTransport};
    use strata_transport::Transport;
    let dir = tempfile::tempdir().unwrap();
    let t = token_files(dir.path());
    let args = t.master_args();
    let m = start_master(&args.iter().map(String::as_str).collect::<Vec<_>>()).await;
    let member = t.member.to_str().unwrap();
    let (node, _, admin) = start_node_admin(
        &m.addr,
        "ucx-node",
        &["--token-file", member, "--transport", "ucx"],
    )
    .await;
    assert!(nodes_registered(m.admin, 1).await);
    let mut master = strata_tests::master_client_as(&m.addr, &t.rdma);
    let routes = master
        .get_ucx_routes(pb::GetUcxRoutesRequest {
            segment_ids: (0..16).collect(),
        })
        .await
        .unwrap()
        .into_inner()
        .routes;
    let me = strata_transport::ucx::cross_memory::this_process().unwrap();
    let named = routes[0]
        .process
        .as_ref()
        .expect("the node names its process");
    assert_eq!(named.host, me.host);
    assert_ne!(named.pid, me.pid);

    let tcp = Arc::new(TcpTransport::new(TcpTransportConfig::default()));
    let cfg = UcxClientConfig {
        timeout: Duration::from_secs(3),
        ..Default::default()
    };
    let ucx = UcxTransport::new(cfg, tcp, Arc::new(MasterRoutes(master.clone()))).unwrap();
    let bytes = payload(3, 3 << 20);
    let replicas = master
        .put_start(pb::PutStartRequest {
            key: "attached".into(),
            size: bytes.len() as u64,
            replica_num: 1,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .replicas;
    let w = strata_transport::remote_range(&replicas[0]).unwrap();
    ucx.write(&w, 0, &bytes).await.unwrap();
    master
        .put_end(pb::PutEndRequest {
            key: "attached".into(),
            crc32c: crc32c::crc32c(&bytes),
            ..Default::default()
        })
        .await
        .unwrap();
    let got = master
        .get_replicas(pb::GetReplicasRequest {
            key: "attached".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let r = strata_transport::remote_range(&got.replicas[0]).unwrap();
    let mut back = vec![0u8; bytes.len()];
    let crc = ucx.read_crc32c(&r, 0, &mut back).await.unwrap();
    assert!(back == bytes, "read back intact");
    assert_eq!(crc, got.crc32c);
    // The write copied into the node's shared segment mapped into this
    // process, the read by attach, copied from the same mapping.
    assert_eq!((ucx.attached_reads(), ucx.one_sided_transfers()), (1, 2));
    assert_eq!((ucx.mapped_reads(), ucx.mapped_writes()), (1, 1));
    assert_eq!(node_bytes(admin).await, (0.0, 0.0), "no byte over TCP");
    // A sibling, from a thread driving a runtime of its own, reads through
    // the same route and mapping, counted with this transport's.
    let sib = ucx.sibling().expect("UCX makes siblings");
    let (r2, want) = (r.clone(), bytes.clone());
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut back = vec![0u8; want.len()];
        rt.block_on(sib.read(&r2, 0, &mut back)).unwrap();
        assert!(back == want, "the sibling read it back intact");
    })
    .join()
    .unwrap();
    assert_eq!((ucx.attached_reads(), ucx.mapped_reads()), (2, 2));

    // The mapping outlives the node (its memory file stays while mapped),
    // but the node's words, read from its process, do not: a write into
    // the dead node's file is not taken (first, while the route is still
    // attached and mapped), and a dead node's bytes are never served.
    drop(node); // SIGKILL
    let res = tokio::time::timeout(Duration::from_secs(60), ucx.write(&w, 0, &bytes))
        .await
        .expect("a write to a killed node ends");
    assert!(res.unwrap_err().retryable());
    assert_eq!(ucx.mapped_writes(), 1);
    let res = tokio::time::timeout(Duration::from_secs(60), ucx.read(&r, 0, &mut back))
        .await
        .expect("a read from a killed node ends");
    let e = res.unwrap_err();
    assert!(e.retryable(), "{e:?}");
    assert_eq!(ucx.attached_reads(), 2);
}
