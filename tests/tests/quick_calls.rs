//! Quick calls (`strata_common::quick_wire`): a client's lookups, PutStart
//! and PutEnd, single and batched, and store nodes' heartbeats, go on plain
//! connections to the master's gRPC port, answered exactly as over gRPC,
//! behind the same credentials; bad hellos and requests get a clear error;
//! gRPC keeps working on the same port, and nodes use it with a master
//! that does not take quick heartbeats.

use prost::Message;
use strata_client::{Client, Code, PutOptions};
use strata_common::quick_wire::{self as wire, Op};
use strata_proto as pb;
use strata_tests::{ClusterBuilder, LocalCluster};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A client that asks the master on every read.
async fn uncached(c: &LocalCluster, quick: bool) -> Client {
    Client::connect(
        c.client_config()
            .with_location_cache(0)
            .with_quick_calls(quick),
    )
    .await
    .unwrap()
}

/// `f`, or a panic after 10 s (a master that stopped answering).
async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(std::time::Duration::from_secs(10), f)
        .await
        .expect("the master answers")
}

/// A connection that said hello with `token`, and the master's answer.
async fn greet(
    c: &LocalCluster,
    token: Option<&str>,
) -> (TcpStream, Result<Vec<u8>, strata_common::Error>) {
    let mut s = TcpStream::connect(c.master_addr).await.unwrap();
    s.write_all(&wire::hello(token).unwrap()).await.unwrap();
    let a = within(wire::read_answer(&mut s, wire::MAX_ANSWER))
        .await
        .unwrap();
    (s, a)
}

async fn ask(
    s: &mut TcpStream,
    key: &str,
) -> Result<pb::GetReplicasResponse, strata_common::Error> {
    let body = pb::GetReplicasRequest { key: key.into() }.encode_to_vec();
    wire::write_request(s, Op::GetReplicas as u8, &body)
        .await
        .unwrap();
    within(wire::read_answer(s, wire::MAX_ANSWER))
        .await
        .unwrap()
        .map(|b| pb::GetReplicasResponse::decode(b.as_slice()).unwrap())
}

fn calls(c: &LocalCluster, op: &str, code: &str) -> u64 {
    c.master
        .metrics
        .requests
        .with_label_values(&[op, code])
        .get()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn puts_and_first_reads_go_quickly_and_are_answered_as_over_grpc() {
    let c = ClusterBuilder::new().store_nodes(1).build().await.unwrap();
    let cl = uncached(&c, true).await;
    let v = vec![7u8; 64 << 10];
    cl.put("k0", &v, &PutOptions::default()).await.unwrap();
    // The first call may go over gRPC (the leader's address is learnt
    // from one); from then on they go quickly.
    let quick0 = cl.quick_calls();
    let (ok0, starts0, ends0) = (
        calls(&c, "get_replicas", "ok"),
        calls(&c, "put_start", "ok"),
        calls(&c, "put_end", "ok"),
    );
    for i in 1..=3 {
        cl.put(&format!("k{i}"), &v, &PutOptions::default())
            .await
            .unwrap();
    }
    for i in 0..=3 {
        assert_eq!(cl.get(&format!("k{i}")).await.unwrap(), v);
    }
    assert_eq!(cl.get("absent").await.unwrap_err().code, Code::NotFound);
    // Refusals come back as they would over gRPC.
    let e = cl.put("k1", &v, &PutOptions::default()).await.unwrap_err();
    assert_eq!(e.code, Code::AlreadyExists);
    // The master counted each call, as it counts gRPC ones.
    assert_eq!(calls(&c, "get_replicas", "ok") - ok0, 4);
    assert_eq!(calls(&c, "put_start", "ok") - starts0, 3);
    assert_eq!(calls(&c, "put_end", "ok") - ends0, 3);
    // 3 puts (2 calls each), 5 lookups and the refused PutStart.
    assert_eq!(cl.quick_calls() - quick0, 3 * 2 + 5 + 1);

    // Turned off: the same calls, all over gRPC.
    let grpc = uncached(&c, false).await;
    grpc.put("g", &v, &PutOptions::default()).await.unwrap();
    assert_eq!(grpc.get("g").await.unwrap(), v);
    assert_eq!(grpc.get("absent").await.unwrap_err().code, Code::NotFound);
    c.shutdown().await;
}

/// A client's batch puts and gets go quickly too, one call per batch
/// step, answered as over gRPC (a miss among hits is its own error); a
/// batch too long for a quick request goes over gRPC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_puts_and_gets_go_quickly_and_long_batches_over_grpc() {
    let c = ClusterBuilder::new().store_nodes(1).build().await.unwrap();
    let cl = uncached(&c, true).await;
    // The first call may go over gRPC (it learns the leader's address).
    cl.put("warm", b"up", &PutOptions::default()).await.unwrap();
    let batch_calls = || {
        [
            calls(&c, "batch_put_start", "ok"),
            calls(&c, "batch_put_end", "ok"),
            calls(&c, "batch_get_replicas", "ok"),
        ]
    };
    for (n, key_len, quick) in [(8usize, 8usize, true), (300, 250, false)] {
        let keys: Vec<String> = (0..n).map(|i| format!("{i:0key_len$}")).collect();
        let values: Vec<Vec<u8>> = (0..n).map(|i| vec![i as u8; 100 + i]).collect();
        let items: Vec<(&str, &[u8])> = keys
            .iter()
            .zip(&values)
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        let quick0 = cl.quick_calls();
        let before = batch_calls();
        let put = cl.batch_put(&items, &PutOptions::default()).await.unwrap();
        assert_eq!(put.len(), n);
        assert!(put.iter().all(Result::is_ok), "{put:?}");
        let mut ask: Vec<&str> = keys.iter().map(String::as_str).collect();
        ask.push("absent");
        let got = cl.batch_get(&ask).await.unwrap();
        assert_eq!(got.len(), n + 1);
        for (g, v) in got.iter().zip(&values) {
            assert_eq!(g.as_ref().unwrap(), v);
        }
        assert_eq!(got[n].as_ref().unwrap_err().code, Code::NotFound);
        // One call per step, whichever way it went.
        let after = batch_calls();
        for (a, b) in after.iter().zip(&before) {
            assert_eq!(a - b, 1, "{n} keys: {after:?} after {before:?}");
        }
        let quickly = cl.quick_calls() - quick0;
        assert_eq!(
            quickly,
            if quick { 3 } else { 0 },
            "{n} keys of {key_len} bytes"
        );
    }
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hello_needs_a_token_and_each_call_its_role() {
    let c = ClusterBuilder::new()
        .store_nodes(1)
        .credentials(true)
        .build()
        .await
        .unwrap();
    let cr = c.credentials().clone();
    let cl = c.client().await.unwrap();
    cl.put("k", b"value", &PutOptions::default()).await.unwrap();

    let (_, none) = greet(&c, None).await;
    assert!(matches!(
        none.unwrap_err().code,
        Code::PermissionDenied | Code::Unauthenticated
    ));
    let (_, wrong) = greet(&c, Some("not-a-token")).await;
    assert_eq!(wrong.unwrap_err().code, Code::Unauthenticated);
    // A member may say hello (it heartbeats this way) but not look keys
    // up, as over gRPC.
    let (mut m, member) = greet(&c, Some(cr.member.as_ref().unwrap().expose())).await;
    member.unwrap();
    assert_eq!(
        ask(&mut m, "k").await.unwrap_err().code,
        Code::PermissionDenied
    );

    let (mut s, client) = greet(&c, Some(cr.client.as_ref().unwrap().expose())).await;
    client.unwrap();
    // A client may not heartbeat for a node.
    let beat = pb::HeartbeatRequest {
        node_id: c.nodes[0].node_id.clone(),
        ..Default::default()
    };
    wire::write_request(&mut s, Op::Heartbeat as u8, &beat.encode_to_vec())
        .await
        .unwrap();
    let e = within(wire::read_answer(&mut s, wire::MAX_ANSWER))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(e.code, Code::PermissionDenied, "{e}");
    let r = ask(&mut s, "k").await.unwrap();
    assert_eq!((r.size, r.crc32c), (5, crc32c::crc32c(b"value")));
    assert_eq!(r.replicas.len(), 1);
    assert_eq!(
        ask(&mut s, "absent").await.unwrap_err().code,
        Code::NotFound
    );

    // A client with a token that matches nothing is told so (over gRPC)
    // and looks nothing up quickly.
    let bad = Client::connect(
        c.client_config()
            .with_location_cache(0)
            .with_token(Some(strata_common::auth::Secret::generate())),
    )
    .await
    .unwrap();
    for _ in 0..2 {
        assert_eq!(bad.get("k").await.unwrap_err().code, Code::Unauthenticated);
    }
    assert_eq!(bad.quick_calls(), 0);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_hellos_and_requests_get_a_clear_error_and_grpc_still_serves() {
    let c = ClusterBuilder::new().store_nodes(1).build().await.unwrap();
    let cl = c.client().await.unwrap();
    cl.put("k", b"v", &PutOptions::default()).await.unwrap();

    // Another version: refused, naming the one served.
    let mut s = TcpStream::connect(c.master_addr).await.unwrap();
    let mut h = wire::hello(Some("any")).unwrap();
    h[8..10].copy_from_slice(&(wire::VERSION + 1).to_le_bytes());
    s.write_all(&h).await.unwrap();
    let e = wire::read_answer(&mut s, wire::MAX_ANSWER)
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(e.code, Code::InvalidArgument);
    assert!(e.message.contains("version"), "{e}");

    // An undecodable request is answered, and the connection goes on.
    let admin = c.credentials().admin.clone();
    let (mut s, hello) = greet(&c, admin.as_ref().map(|t| t.expose())).await;
    hello.unwrap();
    wire::write_request(&mut s, Op::GetReplicas as u8, &[0xff; 7])
        .await
        .unwrap();
    let e = wire::read_answer(&mut s, wire::MAX_ANSWER)
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(e.code, Code::InvalidArgument);
    // So is an op this master does not serve.
    wire::write_request(&mut s, 0, &[]).await.unwrap();
    let e = wire::read_answer(&mut s, wire::MAX_ANSWER)
        .await
        .unwrap()
        .unwrap_err();
    assert!(
        e.code == Code::InvalidArgument && e.message.contains("op 0"),
        "{e}"
    );
    assert_eq!(ask(&mut s, "k").await.unwrap().size, 1);
    // A key over the master's limit: its error, as over gRPC.
    let long = "x".repeat(strata_master::master::MAX_KEY_LEN + 1);
    assert_eq!(
        ask(&mut s, &long).await.unwrap_err().code,
        Code::InvalidArgument
    );

    // A request at the limit is read; one just over it ends the connection.
    let at = pb::GetReplicasRequest {
        key: "y".repeat(wire::MAX_REQUEST - 4),
    }
    .encode_to_vec();
    assert_eq!(at.len(), wire::MAX_REQUEST);
    wire::write_request(&mut s, Op::GetReplicas as u8, &at)
        .await
        .unwrap();
    let e = wire::read_answer(&mut s, wire::MAX_ANSWER)
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(e.code, Code::InvalidArgument, "the key's own limit");
    s.write_all(&((wire::MAX_REQUEST + 1) as u32).to_le_bytes())
        .await
        .unwrap();
    let e = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        wire::read_answer(&mut s, wire::MAX_ANSWER),
    )
    .await
    .expect("an overlong request is refused at once")
    .unwrap()
    .unwrap_err();
    assert!(e.message.contains("longer than"), "{e}");
    let mut rest = vec![];
    let n = tokio::time::timeout(std::time::Duration::from_secs(5), s.read_to_end(&mut rest))
        .await
        .expect("the master closes the connection")
        .unwrap_or(0);
    assert_eq!(n, 0);

    // gRPC on the same port, untouched.
    assert_eq!(cl.get("k").await.unwrap(), b"v");
    c.shutdown().await;
}

/// One node of 48 MiB holding three 16 MiB objects whose copies to SSD are
/// paused: a fourth 16 MiB PutStart waits for room for `put_wait`.
async fn full_cluster(put_wait: std::time::Duration) -> LocalCluster {
    const MIB: u64 = 1 << 20;
    let c = ClusterBuilder::new()
        .store_nodes(1)
        .node_capacity(48 * MIB)
        .ssd_agents(1)
        .ssd_capacity(256 * MIB)
        .master(move |m| {
            m.offload_policy = strata_master::config::OffloadPolicy::Eager;
            m.put_wait = put_wait;
        })
        .build()
        .await
        .unwrap();
    strata_tests::pause_offloads(&c).await;
    let cl = c.client().await.unwrap();
    for i in 0..3u64 {
        let data = strata_tests::payload(i, 16 << 20);
        cl.put(&format!("k{i}"), &data, &PutOptions::default())
            .await
            .unwrap();
    }
    c
}

/// A quick connection that sent a 16 MiB PutStart of `late`.
async fn start_late_put(c: &LocalCluster) -> TcpStream {
    let admin = c.credentials().admin.clone();
    let (mut s, hello) = greet(c, admin.as_ref().map(|t| t.expose())).await;
    hello.unwrap();
    let req = pb::PutStartRequest {
        key: "late".into(),
        size: 16 << 20,
        replica_num: 1,
        ..Default::default()
    };
    wire::write_request(&mut s, Op::PutStart as u8, &req.encode_to_vec())
        .await
        .unwrap();
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_put_start_says_it_is_busy_and_a_client_that_leaves_ends_it() {
    use std::time::Duration;
    // Waits 2.5 s: busy twice, then the refusal gRPC would give.
    let c = full_cluster(Duration::from_millis(2500)).await;
    let mut s = start_late_put(&c).await;
    let mut busy = 0;
    let answer = loop {
        match within(wire::read_frame(&mut s, wire::MAX_ANSWER))
            .await
            .unwrap()
        {
            None => busy += 1,
            Some(a) => break a,
        }
    };
    let e = answer.unwrap_err();
    assert_eq!(e.code, Code::NoSpace, "{e}");
    assert!(e.retryable() && e.message.contains("--put-wait"), "{e}");
    assert!(busy >= 2, "{busy} busy frames in 2.5 s");

    // Now a 15 s wait, abandoned after its first busy frame: the master
    // ends the call at once, not when the wait runs out nor when a later
    // busy frame fails to go out (a second later, or two).
    c.shutdown().await;
    let c = full_cluster(Duration::from_secs(15)).await;
    let mut s = start_late_put(&c).await;
    assert!(within(wire::read_frame(&mut s, wire::MAX_ANSWER))
        .await
        .unwrap()
        .is_none());
    assert_eq!(c.master.metrics.put_waiters.get(), 1, "the put waits");
    drop(s);
    let waiters = &c.master.metrics.put_waiters;
    assert!(
        strata_tests::wait_until(Duration::from_millis(900), || waiters.get() == 0).await,
        "the abandoned PutStart still waits"
    );
    assert!(!c.master.exists("late").unwrap(), "nothing granted");
    assert_eq!(c.master.metrics.put_waiters.get(), 0);
    c.shutdown().await;
}

/// `strata_store_node_heartbeats_total{path}` of the node at `admin`.
async fn heartbeats(admin: std::net::SocketAddr, path: &str) -> f64 {
    let body = strata_tests::http_get(admin, "/metrics").await.1;
    strata_tests::metric(
        &body,
        &format!("strata_store_node_heartbeats_total{{path=\"{path}\"}}"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_heartbeat_quickly_and_confirm_puts_that_way() {
    use std::time::Duration;
    let c = ClusterBuilder::new()
        .store_nodes(1)
        .credentials(true)
        .build()
        .await
        .unwrap();
    let admin = c.nodes[0].admin_addr;
    // The first heartbeat may go over gRPC (it learns the leader's address).
    let t0 = std::time::Instant::now();
    while heartbeats(admin, "quick").await < 1.0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "no quick heartbeat");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let grpc0 = heartbeats(admin, "grpc").await;
    let (quick0, served0) = (
        heartbeats(admin, "quick").await,
        calls(&c, "heartbeat", "ok"),
    );
    // Announced puts (PutEnd waits for the node to apply the announcement)
    // and unannounced ones (it waits for the node to apply the commit):
    // each waits for a heartbeat, which now comes quickly. (The library's
    // default, a put the node receipts, waits for none.)
    let announced = Client::connect(c.client_config().with_put_receipts(false))
        .await
        .unwrap();
    let unannounced = Client::connect(c.client_config().with_announce_up_to(0))
        .await
        .unwrap();
    let v = vec![5u8; 64 << 10];
    for i in 0..4 {
        let cl = if i % 2 == 0 { &announced } else { &unannounced };
        cl.put(&format!("k{i}"), &v, &PutOptions::default())
            .await
            .unwrap();
    }
    for i in 0..4 {
        assert_eq!(announced.get(&format!("k{i}")).await.unwrap(), v);
    }
    assert_eq!(c.nodes[0].records.len(), 4, "the node records every commit");
    let quick = heartbeats(admin, "quick").await - quick0;
    assert!(quick >= 4.0, "{quick} quick heartbeats for 4 puts");
    assert_eq!(heartbeats(admin, "grpc").await, grpc0, "none over gRPC");
    // The master counted them as it counts gRPC ones.
    assert!(calls(&c, "heartbeat", "ok") - served0 >= quick as u64);
    c.shutdown().await;
}

/// How a stand-in for an older master treats quick connections.
#[derive(Clone, Copy, Debug)]
enum Older {
    /// Its quick calls served clients only: a member's hello is refused.
    RefusesMembers,
    /// It says hello but knows no `Heartbeat` op.
    LacksHeartbeats,
}

/// A master of an older release in front of `master`: gRPC connections
/// are passed through; quick ones are answered as that release did.
/// Returns its address and the number of quick requests it refused.
async fn older_master(
    master: std::net::SocketAddr,
    older: Older,
) -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicU64>,
) {
    use std::sync::atomic::Ordering;
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let refused = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let r = refused.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let r = r.clone();
            tokio::spawn(async move {
                let mut first = [0u8; 8];
                if s.peek(&mut first).await.is_err() {
                    return;
                }
                if &first != wire::MAGIC {
                    let Ok(mut m) = TcpStream::connect(master).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut s, &mut m).await;
                    return;
                }
                s.read_exact(&mut first).await.unwrap();
                let Ok(_) = wire::read_hello(&mut s).await else {
                    return;
                };
                if let Older::RefusesMembers = older {
                    r.fetch_add(1, Ordering::Relaxed);
                    let e = strata_common::Error::new(
                        Code::PermissionDenied,
                        "this call needs the client role; the presented token is a member token",
                    );
                    let _ = wire::write_answer(&mut s, &Err(e)).await;
                    return;
                }
                let _ = wire::write_answer(&mut s, &Ok(vec![])).await;
                while let Ok(Some((op, _))) = wire::read_request(&mut s).await {
                    r.fetch_add(1, Ordering::Relaxed);
                    let e = strata_common::Error::invalid(format!(
                        "quick call op {op} is not served here (version 1)"
                    ));
                    if wire::write_answer(&mut s, &Err(e)).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, refused)
}

/// A store node of 64 MiB, not one of `c`'s, heartbeating the master at
/// `master` with `c`'s member token; registered.
async fn member_node(
    c: &LocalCluster,
    master: std::net::SocketAddr,
    quick_heartbeats: bool,
) -> (
    strata_store_node::StoreNodeHandle,
    tokio_util::sync::CancellationToken,
) {
    let mut cfg = strata_store_node::StoreNodeConfig::local(&master.to_string(), 64 << 20);
    cfg.token = c.credentials().member.clone();
    cfg.quick_heartbeats = quick_heartbeats;
    let stop = tokio_util::sync::CancellationToken::new();
    let node = strata_store_node::start(cfg, stop.clone()).await.unwrap();
    assert!(
        strata_tests::wait_until(std::time::Duration::from_secs(10), || node.is_registered()).await,
        "the node registers"
    );
    (node, stop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_heartbeats_an_older_master_over_grpc() {
    for older in [Older::RefusesMembers, Older::LacksHeartbeats] {
        let c = ClusterBuilder::new()
            .store_nodes(0)
            .credentials(true)
            .build()
            .await
            .unwrap();
        let (front, refused) = older_master(c.master_addr, older).await;
        let (node, stop) = member_node(&c, front, true).await;
        let admin = node.admin_addr;
        // Puts wait for the node's heartbeats to confirm them.
        let cl = Client::connect(c.client_config().with_announce_up_to(0))
            .await
            .unwrap();
        for i in 0..3 {
            cl.put(&format!("k{i}"), b"value", &PutOptions::default())
                .await
                .unwrap();
        }
        assert_eq!(node.records.len(), 3, "{older:?}");
        assert!(heartbeats(admin, "grpc").await >= 3.0, "{older:?}");
        assert_eq!(heartbeats(admin, "quick").await, 0.0, "{older:?}");
        // The refusal is remembered: not every heartbeat tries again.
        let n = refused.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(n, 1, "{older:?}: {n} quick attempts refused");
        stop.cancel();
        node.wait().await;
        c.shutdown().await;
    }
}

/// A client of a master that takes no quick batch calls (an older one
/// refuses the ops) makes them over gRPC, and asks quickly again only
/// after a while: each op is refused once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_makes_batch_calls_to_an_older_master_over_grpc() {
    let c = ClusterBuilder::new().store_nodes(1).build().await.unwrap();
    let (front, refused) = older_master(c.master_addr, Older::LacksHeartbeats).await;
    let mut cfg = c.client_config().with_location_cache(0);
    cfg.master = front.to_string();
    let cl = Client::connect(cfg).await.unwrap();
    for round in 0..3 {
        let keys: Vec<String> = (0..4).map(|i| format!("r{round}/k{i}")).collect();
        let items: Vec<(&str, &[u8])> = keys.iter().map(|k| (k.as_str(), &b"value"[..])).collect();
        let put = cl.batch_put(&items, &PutOptions::default()).await.unwrap();
        assert_eq!(put.len(), 4);
        assert!(put.iter().all(Result::is_ok), "round {round}: {put:?}");
        let ask: Vec<&str> = keys.iter().map(String::as_str).collect();
        let got = cl.batch_get(&ask).await.unwrap();
        assert_eq!(got.len(), 4);
        assert!(
            got.iter().all(|g| g.as_deref() == Ok(&b"value"[..])),
            "round {round}"
        );
    }
    assert_eq!(cl.quick_calls(), 0, "none answered quickly");
    // BatchPutStart, BatchPutEnd and BatchGetReplicas, once each.
    let n = refused.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(n, 3, "{n} quick attempts refused");
    c.shutdown().await;
}

/// A node made with `quick_heartbeats = false` heartbeats over gRPC only,
/// never trying a quick connection, and its puts (announced and not) are
/// confirmed that way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_quick_heartbeats_uses_grpc_only() {
    let c = ClusterBuilder::new()
        .store_nodes(0)
        .credentials(true)
        .build()
        .await
        .unwrap();
    let (node, stop) = member_node(&c, c.master_addr, false).await;
    let admin = node.admin_addr;
    let served0 = calls(&c, "heartbeat", "ok");
    let announced = Client::connect(c.client_config().with_put_receipts(false))
        .await
        .unwrap();
    let unannounced = Client::connect(c.client_config().with_announce_up_to(0))
        .await
        .unwrap();
    for i in 0..4 {
        let cl = if i % 2 == 0 { &announced } else { &unannounced };
        cl.put(&format!("k{i}"), b"value", &PutOptions::default())
            .await
            .unwrap();
    }
    assert_eq!(node.records.len(), 4, "the node records every commit");
    let grpc = heartbeats(admin, "grpc").await;
    assert!(grpc >= 4.0, "{grpc} gRPC heartbeats for 4 puts");
    assert_eq!(heartbeats(admin, "quick").await, 0.0, "no quick heartbeat");
    assert!(calls(&c, "heartbeat", "ok") > served0);
    stop.cancel();
    node.wait().await;
    c.shutdown().await;
}
