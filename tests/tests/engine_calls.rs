//! What engines call beyond put and get (`engine_calls.rs`, the Python
//! package's base): batch existence with sizes, scatter-gather, removal by
//! prefix, placement on a named node, and a store node that leaves.

use std::time::Duration;
use strata_client::{Code, PutOptions};
use strata_tests::{payload, wait_until, ClusterBuilder};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_sizes_answer_each_key_in_one_call() {
    let c = ClusterBuilder::new().store_nodes(2).build().await.unwrap();
    let cl = c.client().await.unwrap();
    cl.put("a", &payload(1, 300), &PutOptions::default())
        .await
        .unwrap();
    cl.put("b", &payload(2, 7), &PutOptions::default())
        .await
        .unwrap();
    let sizes = cl.batch_sizes(&["a", "x", "b", "a"]).await.unwrap();
    assert_eq!(sizes.len(), 4);
    let sizes: Vec<Option<u64>> = sizes.into_iter().map(Result::unwrap).collect();
    assert_eq!(sizes, [Some(300), None, Some(7), Some(300)]);
    assert_eq!(cl.size("b").await.unwrap(), 7);
    assert_eq!(cl.size("x").await.unwrap_err().code, Code::NotFound);
    // Empty, and larger than one request (the client splits it).
    assert!(cl.batch_sizes(&[]).await.unwrap().is_empty());
    let many: Vec<String> = (0..2500).map(|i| format!("k{i}")).collect();
    let refs: Vec<&str> = many.iter().map(String::as_str).collect();
    let r = cl.batch_sizes(&refs).await.unwrap();
    assert_eq!(r.len(), 2500);
    assert!(r.iter().all(|s| matches!(s, Ok(None))));
    // Bad keys are refused per item, not for the whole batch.
    let r = cl.batch_sizes(&["a", ""]).await.unwrap();
    assert_eq!(r[0].as_ref().unwrap(), &Some(300));
    assert_eq!(r[1].as_ref().unwrap_err().code, Code::InvalidArgument);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parts_round_trip_and_must_add_up() {
    let c = ClusterBuilder::new().store_nodes(2).build().await.unwrap();
    let cl = c.client().await.unwrap();
    let parts: Vec<Vec<u8>> = [1usize, 4096, 300, 65536]
        .iter()
        .enumerate()
        .map(|(i, &n)| payload(i as u64, n))
        .collect();
    let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
    cl.put_parts("obj", &refs, &PutOptions::default())
        .await
        .unwrap();
    assert_eq!(cl.get("obj").await.unwrap(), parts.concat());
    let mut outs: Vec<Vec<u8>> = parts.iter().map(|p| vec![0u8; p.len()]).collect();
    {
        let mut slices: Vec<&mut [u8]> = outs.iter_mut().map(Vec::as_mut_slice).collect();
        let n = cl.get_into_parts("obj", &mut slices).await.unwrap();
        assert_eq!(n, parts.iter().map(Vec::len).sum::<usize>());
    }
    assert_eq!(outs, parts);
    // Parts one byte short of the object: refused, left untouched.
    let mut short = vec![7u8; 4096 + 300 + 65536];
    let e = cl
        .get_into_parts("obj", &mut [&mut short[..]])
        .await
        .unwrap_err();
    assert_eq!(e.code, Code::InvalidArgument, "{e}");
    assert!(short.iter().all(|&b| b == 7));
    // Batches: one result per item, in order.
    let p1: [&[u8]; 2] = [b"ab", b"cd"];
    let items = vec![("p0", refs.as_slice()), ("p1", &p1[..])];
    let r = cl
        .batch_put_parts(&items, &PutOptions::default())
        .await
        .unwrap();
    assert_eq!(r.len(), 2);
    assert!(r.iter().all(Result::is_ok));
    let (mut x, mut y) = (vec![0u8; 2], vec![0u8; 2]);
    let mut missing = [0u8; 1];
    let mut p1: Vec<&mut [u8]> = vec![&mut x, &mut y];
    let mut p2: Vec<&mut [u8]> = vec![&mut missing];
    let mut items: Vec<(&str, &mut [&mut [u8]])> = vec![("p1", &mut p1), ("nope", &mut p2)];
    let r = cl.batch_get_into_parts(&mut items).await.unwrap();
    assert_eq!(r.len(), 2);
    assert_eq!(*r[0].as_ref().unwrap(), 4);
    assert_eq!(r[1].as_ref().unwrap_err().code, Code::NotFound);
    assert_eq!((&x[..], &y[..]), (&b"ab"[..], &b"cd"[..]));
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remove_prefix_removes_only_that_prefix() {
    let c = ClusterBuilder::new().store_nodes(1).build().await.unwrap();
    let cl = c.client().await.unwrap();
    for k in ["m/a", "m/b", "m/c", "n/a", "m"] {
        cl.put(k, b"v", &PutOptions::default()).await.unwrap();
    }
    assert_eq!(cl.remove_prefix("m/", false).await.unwrap(), 3);
    let left: Vec<String> = cl
        .list("", 100)
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect();
    assert_eq!(left, ["m", "n/a"]);
    assert_eq!(cl.remove_prefix("m/", false).await.unwrap(), 0);
    let r = cl.batch_remove(&["m", "gone"], false).await;
    assert!(r[0].is_ok());
    assert_eq!(r[1].as_ref().unwrap_err().code, Code::NotFound);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preferred_node_places_the_first_replica_there() {
    let c = ClusterBuilder::new().store_nodes(3).build().await.unwrap();
    let cl = c.client().await.unwrap();
    let stat = cl.stat().await.unwrap();
    let mut nodes: Vec<String> = stat
        .segment_info
        .iter()
        .map(|s| s.node_id.clone())
        .collect();
    nodes.dedup();
    assert_eq!(nodes.len(), 3);
    for (i, node) in nodes.iter().enumerate() {
        for j in 0..4 {
            let key = format!("k{i}-{j}");
            let opts = PutOptions {
                preferred_node: Some(node.clone()),
                ..Default::default()
            };
            cl.put(&key, b"x", &opts).await.unwrap();
            let info = cl.inspect(&key).await.unwrap();
            assert_eq!(info.replicas.len(), 1);
            assert_eq!(&info.replicas[0].node_id, node, "{key}");
        }
    }
    // An unknown node: placed anywhere, not refused.
    let opts = PutOptions {
        preferred_node: Some("no-such-node".into()),
        ..Default::default()
    };
    cl.put("anywhere", b"x", &opts).await.unwrap();
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_node_made_to_leave_is_dropped_at_once() {
    let c = ClusterBuilder::new()
        .store_nodes(1)
        // Long enough that only the leave can explain a quick drop.
        .master(|m| m.node_ttl = Duration::from_secs(30))
        .build()
        .await
        .unwrap();
    let cl = c.client().await.unwrap();
    let mut cfg = strata_store_node::StoreNodeConfig::local(&c.master_addr(), 8 << 20);
    cfg.token = c.credentials().member.clone();
    cfg.node_id = Some("leaver".into());
    cfg.leave_on_shutdown = true;
    let stop = tokio_util::sync::CancellationToken::new();
    let node = strata_store_node::start(cfg, stop.clone()).await.unwrap();
    let flag = node.registered_flag();
    assert!(
        wait_until(Duration::from_secs(10), || flag
            .load(std::sync::atomic::Ordering::Acquire))
        .await
    );
    let opts = PutOptions {
        preferred_node: Some("leaver".into()),
        ..Default::default()
    };
    cl.put("on-leaver", b"bytes", &opts).await.unwrap();
    assert_eq!(
        cl.inspect("on-leaver").await.unwrap().replicas[0].node_id,
        "leaver"
    );
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(10), node.wait())
        .await
        .unwrap();
    // Gone from the master's view right after the node stopped.
    let stat = cl.stat().await.unwrap();
    assert!(stat.segment_info.iter().all(|s| s.node_id != "leaver"));
    assert_eq!(cl.get("on-leaver").await.unwrap_err().code, Code::NotFound);
    c.shutdown().await;
}

/// A restarted master that still waits for a remembered node cannot tell
/// whether a key is absent (`NotReady`): batch existence asks again, as
/// `exists` does, and answers once the master knows (here: when it gives the
/// lost node up after --node-ttl), instead of failing every key at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_sizes_wait_out_a_rebuilding_master() {
    use strata_tests::procs::{start_node_admin, RestartableMaster};
    let state = tempfile::tempdir().unwrap();
    let m = RestartableMaster::new(state.path(), &["--node-ttl", "2s"]);
    let master = m.start().await;
    let (node, _, _) = start_node_admin(&m.addr, "n1", &[]).await;
    let cl = strata_client::Client::connect(strata_client::ClientConfig::new(&m.addr))
        .await
        .unwrap();
    cl.put("present", b"x", &PutOptions::default())
        .await
        .unwrap();
    // The node goes for good and the master restarts remembering it.
    drop(node);
    drop(master);
    let _master = m.start_live().await;
    let t0 = std::time::Instant::now();
    let r = cl.batch_sizes(&["absent"]).await.unwrap();
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].as_ref().unwrap(), &None, "{:?}", r[0]);
    // It was the retry that waited (the gate is --node-ttl), not luck.
    assert!(
        t0.elapsed() > Duration::from_millis(500),
        "{:?}",
        t0.elapsed()
    );
}

/// A sibling client (a Python thread's, on a runtime driven only while the
/// thread waits on a call) stays usable after its thread idles past the
/// master's HTTP/2 keep-alive, and so does everyone sharing its channel
/// after the thread is gone: its gRPC calls go through the base client's
/// channel, whose connections run on the base's runtime even when the
/// sibling dials first. (With a connection of its own, or one living on
/// the thread's runtime, the master dropped it unanswered and the next
/// call failed on it: "broken pipe", or waited out the call timeout.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_siblings_grpc_calls_survive_its_thread_idling_past_the_keep_alive() {
    let c = ClusterBuilder::new()
        .store_nodes(1)
        .master(|m| {
            m.keepalive_interval = Duration::from_millis(100);
            m.keepalive_timeout = Duration::from_millis(100);
        })
        .build()
        .await
        .unwrap();
    // No call yet: the sibling's is the first to dial the master.
    let base = c.client().await.unwrap();
    let sibling_base = base.clone();
    let thread = std::thread::spawn(move || {
        let (rt, sib) = strata_tests::sibling_on_own_runtime(&sibling_base);
        let stat = |sib: &strata_client::Client| {
            rt.block_on(async {
                tokio::time::timeout(
                    Duration::from_secs(5),
                    sib.master_client().stat(strata_proto::StatRequest {}),
                )
                .await
            })
        };
        stat(&sib).expect("answered").expect("first call");
        rt.block_on(sib.put("k", &payload(6, 1000), &PutOptions::default()))
            .unwrap();
        // The thread idles, its runtime undriven, for many keep-alive
        // rounds: nothing of its own may have to answer the master meanwhile.
        std::thread::sleep(Duration::from_secs(2));
        let r = stat(&sib).expect("answered within 5 s");
        let got = rt.block_on(sib.get("k"));
        (r.map(|_| ()), got)
    });
    let (r, got) = thread.join().unwrap();
    r.expect("a gRPC call after the idle time");
    assert_eq!(got.unwrap(), payload(6, 1000));
    // The thread and its runtime are gone; the shared channel still serves.
    let st = tokio::time::timeout(
        Duration::from_secs(5),
        base.master_client().stat(strata_proto::StatRequest {}),
    )
    .await
    .expect("answered within 5 s");
    st.expect("a gRPC call after the sibling's thread ended");
    c.shutdown().await;
}
