//! SSD reads through lent staging: an agent started with `--transport ucx`
//! reads a piece of an object from disk into a slot of its UCX-registered
//! window and lends it; rdma readers fetch it one-sided and give it back.
//! Everyone else reads the same objects over TCP. In-process cluster, real
//! files, real UCX (over shared memory or loopback tcp) and sockets.

use std::time::Duration;
use strata_client::{Client, ClientConfig, Code, TransportKind};
use strata_common::grant::{PERM_SSD_READ, PERM_STAGE};
use strata_proto as pb;
use strata_tests::{http_get, metric, payload, put_on_ssd_only, ClusterBuilder};
use strata_transport::tcp::{TcpTransport, TcpTransportConfig};

/// An arena of 8 MiB: pieces (and window slots) of 2 MiB.
const ARENA: u64 = 8 << 20;

async fn agent(admin: std::net::SocketAddr) -> (f64, f64, f64) {
    let (_, m) = http_get(admin, "/metrics").await;
    (
        metric(&m, "strata_ssd_agent_read_bytes_total"),
        metric(&m, "strata_ssd_agent_staged_bytes_total"),
        metric(&m, "strata_ssd_agent_staging_remote_leases"),
    )
}

/// The SSD replica of `key` as `cl`'s role sees it.
async fn ssd_replica(cl: &Client, key: &str) -> strata_transport::RemoteRange {
    let r = cl
        .master_client()
        .get_replicas(pb::GetReplicasRequest {
            key: key.to_string(),
        })
        .await
        .unwrap()
        .into_inner();
    let ssd = r
        .replicas
        .iter()
        .find(|r| r.kind == pb::ReplicaKind::Ssd as i32)
        .expect("an SSD replica");
    strata_transport::remote_range(ssd).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdma_readers_read_ssd_objects_through_lent_staging() {
    let c = ClusterBuilder::new()
        .master(strata_tests::eager)
        .store_nodes(1)
        .node_transport(TransportKind::Ucx)
        .ssd_agents(1)
        .ssd(|a| a.staging_bytes = ARENA)
        .build()
        .await
        .unwrap();
    let admin = c.client().await.unwrap();
    // One piece, a piece and a bit, several pieces, and 16 MiB.
    let sizes = [
        4096,
        (64 << 10) + 123,
        (2 << 20) + 1,
        (5 << 20) + 7,
        16 << 20,
    ];
    let keys: Vec<String> = (0..sizes.len()).map(|i| format!("lent-{i}")).collect();
    for (i, (k, size)) in keys.iter().zip(sizes).enumerate() {
        put_on_ssd_only(&c, &admin, std::slice::from_ref(k), size, 10 + i as u64).await;
    }
    let total: usize = sizes.iter().sum();
    let at = c.agents[0].admin_addr;

    // An rdma client: every byte comes through the window, none over the
    // agent's TCP data plane, and every slot is given back.
    let rdma = Client::connect(c.rdma_client_config().with_location_cache(0))
        .await
        .unwrap();
    for (i, (k, size)) in keys.iter().zip(sizes).enumerate() {
        assert_eq!(
            rdma.get(k).await.unwrap(),
            payload(10 + i as u64, size),
            "{k}"
        );
    }
    let (tcp_bytes, staged, _) = agent(at).await;
    assert_eq!(
        tcp_bytes, 0.0,
        "rdma reads bypass the agent's TCP data plane"
    );
    assert_eq!(staged, total as f64);
    let returned = || async {
        for _ in 0..250 {
            if agent(at).await.2 == 0.0 {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    };
    assert!(returned().await, "every lent slot was given back");
    // A batch of them too.
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    for (i, r) in rdma.batch_get(&refs).await.unwrap().into_iter().enumerate() {
        assert_eq!(r.unwrap(), payload(10 + i as u64, sizes[i]));
    }
    assert_eq!(agent(at).await.0, 0.0);
    assert_eq!(agent(at).await.1, 2.0 * total as f64);
    assert!(returned().await, "the batch gave its slots back");

    // A read dropped half way (its caller gave up) gives its slots back at
    // once, not after the agent's 10 s TTL.
    let staged_before = agent(at).await.1;
    let mut wait = Duration::from_millis(1);
    loop {
        let r = tokio::time::timeout(wait, rdma.get(&keys[4])).await;
        if r.is_err() && agent(at).await.1 > staged_before {
            break;
        }
        wait += wait / 2 + Duration::from_millis(1);
        assert!(
            wait < Duration::from_secs(10),
            "no read was cut off mid-way"
        );
    }
    // Settled: nothing lent, and no stage of the dropped read still in
    // flight (it gives its piece back itself), well inside the TTL.
    let t0 = std::time::Instant::now();
    let mut settled = false;
    while !settled && t0.elapsed() < Duration::from_secs(5) {
        let a = agent(at).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let b = agent(at).await;
        settled = a.2 == 0.0 && b.2 == 0.0 && a.1 == b.1;
    }
    assert!(settled, "the dropped read's slots came back within 5 s");

    // A client without the rdma role reads the same objects over TCP, and
    // nothing is staged for it.
    let plain_cfg = ClientConfig::new(c.master_addr())
        .with_token(c.credentials().client.clone())
        .with_transport(TransportKind::Ucx);
    let plain = Client::connect(plain_cfg).await.unwrap();
    let (tcp_before, staged_before, _) = agent(at).await;
    for (i, (k, size)) in keys.iter().zip(sizes).enumerate() {
        assert_eq!(plain.get(k).await.unwrap(), payload(10 + i as u64, size));
    }
    let (tcp_bytes, staged, _) = agent(at).await;
    assert_eq!(tcp_bytes - tcp_before, total as f64);
    assert_eq!(staged, staged_before, "nothing staged for it");

    // Its grants do not allow staging, and the agent refuses to stage them.
    let tcp = TcpTransport::new(TcpTransportConfig::default());
    let mine = ssd_replica(&plain, &keys[0]).await;
    assert_eq!(mine.scope.perm, PERM_SSD_READ);
    let e = tcp.stage(&mine, 0, 4096).await.unwrap_err();
    assert_eq!(e.code, Code::PermissionDenied, "{e}");
    // A grant with the bit set by the client (not the master) is forged.
    let mut forged = mine.clone();
    forged.scope.perm |= PERM_STAGE;
    let e = tcp.stage(&forged, 0, 4096).await.unwrap_err();
    assert_eq!(e.code, Code::PermissionDenied, "{e}");

    // An rdma grant stages; what it lends is that object's bytes, at most
    // one piece, and only its token gives it back, once.
    let theirs = ssd_replica(&rdma, &keys[3]).await;
    assert_eq!(theirs.scope.perm, PERM_SSD_READ | PERM_STAGE);
    let st = tcp.stage(&theirs, 100, theirs.len() - 100).await.unwrap();
    assert_eq!(st.length, 2 << 20, "one piece");
    assert!(st.window_offset + st.length <= st.size && st.size >= ARENA);
    assert_eq!(agent(at).await.2, 1.0);
    let e = tcp
        .give_back(&theirs.addr, st.lease, st.token ^ 1)
        .await
        .unwrap_err();
    assert_eq!(e.code, Code::NotFound, "{e}");
    assert_eq!(agent(at).await.2, 1.0, "a wrong token returns nothing");
    tcp.give_back(&theirs.addr, st.lease, st.token)
        .await
        .unwrap();
    assert_eq!(agent(at).await.2, 0.0);
    let e = tcp
        .give_back(&theirs.addr, st.lease, st.token)
        .await
        .unwrap_err();
    assert_eq!(e.code, Code::NotFound, "given back once");
    // The last byte of the grant stages; one past it does not.
    let st = tcp.stage(&theirs, theirs.len() - 1, 1).await.unwrap();
    assert_eq!(st.length, 1);
    tcp.give_back(&theirs.addr, st.lease, st.token)
        .await
        .unwrap();
    let mut wider = theirs.clone();
    wider.scope.length += 1;
    let e = tcp.stage(&wider, theirs.len(), 1).await.unwrap_err();
    assert_eq!(e.code, Code::PermissionDenied, "{e}");

    // A reader that dies holding a lease asked for with FLAG_HELD (as rdma
    // readers ask) frees its slot as its connection closes, long before
    // the 10 s TTL.
    let disconnected = |m: &str| metric(m, "strata_ssd_agent_staging_remote_disconnected_total");
    let before = disconnected(&http_get(at, "/metrics").await.1);
    assert_eq!(
        before, 0.0,
        "live readers (a dropped one too) gave their slots back"
    );
    let dying = TcpTransport::new(TcpTransportConfig::default());
    let (_, held) = dying.stage_held(&theirs, 0, 4096).await.unwrap();
    assert_eq!(agent(at).await.2, 1.0);
    drop((held, dying));
    let t0 = std::time::Instant::now();
    let mut freed = false;
    while !freed && t0.elapsed() < Duration::from_secs(5) {
        freed = agent(at).await.2 == 0.0;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(freed, "the dead reader's slot came back within 5 s");
    let after = disconnected(&http_get(at, "/metrics").await.1);
    assert_eq!(after, before + 1.0, "taken back, not given back or expired");
    c.shutdown().await;
}

/// An agent that serves TCP only (or predates staging) answers a stage
/// with "read over TCP": rdma readers do, and get the right bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdma_readers_of_a_tcp_only_agent_read_over_tcp() {
    let c = ClusterBuilder::new()
        .master(strata_tests::eager)
        .store_nodes(1)
        .node_transport(TransportKind::Ucx)
        .ssd_agents(1)
        .ssd(|a| {
            a.staging_bytes = ARENA;
            a.transport = TransportKind::Tcp;
        })
        .build()
        .await
        .unwrap();
    let admin = c.client().await.unwrap();
    let keys: Vec<String> = (0..3).map(|i| format!("tcp-{i}")).collect();
    put_on_ssd_only(&c, &admin, &keys, 300 << 10, 5).await;
    let rdma = Client::connect(c.rdma_client_config()).await.unwrap();
    let r = ssd_replica(&rdma, &keys[0]).await;
    assert_eq!(r.scope.perm, PERM_SSD_READ | PERM_STAGE);
    let e = TcpTransport::new(TcpTransportConfig::default())
        .stage(&r, 0, 4096)
        .await
        .unwrap_err();
    assert_eq!(e.code, Code::InvalidArgument, "{e}");
    assert!(e.message.contains("read over TCP"), "{e}");
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(rdma.get(k).await.unwrap(), payload(5 + i as u64, 300 << 10));
    }
    // The agent counts a read's bytes once its last write returned, which
    // may be just after the reader has them all: wait (bounded).
    let want = (3.0 * (300 << 10) as f64, 0.0);
    let t0 = std::time::Instant::now();
    loop {
        let (tcp_bytes, staged, _) = agent(c.agents[0].admin_addr).await;
        if (tcp_bytes, staged) == want || t0.elapsed() > std::time::Duration::from_secs(5) {
            assert_eq!((tcp_bytes, staged), want);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    c.shutdown().await;
}
