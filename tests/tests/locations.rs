//! The client's location cache: repeat reads inside a read lease skip the
//! master, are reported to it, never outlive the lease, and a location the
//! master revoked (forced remove, replaced object) is never served.

use std::time::{Duration, Instant};
use strata_client::{Client, Code, PutOptions};
use strata_tests::{ClusterBuilder, LocalCluster};

fn dram_lookups(c: &LocalCluster) -> u64 {
    c.master.metrics.lookups.with_label_values(&["dram"]).get()
}

/// One store node; reads leased for `lease`.
async fn cluster(lease: Duration) -> LocalCluster {
    ClusterBuilder::new()
        .store_nodes(1)
        .master(|m| m.lease_ttl = lease)
        .build()
        .await
        .unwrap()
}

/// A client that asks the master on every read.
async fn uncached(c: &LocalCluster) -> Client {
    Client::connect(c.client_config().with_location_cache(0))
        .await
        .unwrap()
}

async fn wait_until(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < within {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    f()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeat_reads_inside_a_lease_skip_the_master_and_are_reported() {
    let c = cluster(Duration::from_secs(60)).await;
    let cl = c.client().await.unwrap();
    let keys: Vec<String> = (0..4).map(|i| format!("k{i}")).collect();
    for k in &keys {
        cl.put(k, k.as_bytes(), &PutOptions::default())
            .await
            .unwrap();
    }
    let before = dram_lookups(&c);
    for _ in 0..10 {
        assert_eq!(cl.get("k0").await.unwrap(), b"k0");
    }
    assert_eq!(
        dram_lookups(&c) - before,
        1,
        "one lookup, nine cached reads"
    );
    assert_eq!(cl.cached_reads(), 9);
    // A batch asks only for the keys it does not hold.
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    for (k, v) in keys.iter().zip(cl.batch_get(&refs).await.unwrap()) {
        assert_eq!(v.unwrap(), k.as_bytes());
    }
    assert_eq!(dram_lookups(&c) - before, 4, "k1..k3 looked up once");
    assert_eq!(cl.cached_reads(), 10);
    for (k, v) in keys.iter().zip(cl.batch_get(&refs).await.unwrap()) {
        assert_eq!(v.unwrap(), k.as_bytes());
    }
    assert_eq!(dram_lookups(&c) - before, 4);
    assert_eq!(cl.cached_reads(), 14);
    // The master hears of every cached read (for its read-count policies).
    let m = c.master.clone();
    assert!(
        wait_until(Duration::from_secs(10), || m.metrics.cached_reads.get()
            == 14)
        .await,
        "reported {}",
        m.metrics.cached_reads.get()
    );

    // Without the cache, every read asks.
    let plain = uncached(&c).await;
    let before = dram_lookups(&c);
    for _ in 0..5 {
        plain.get("k0").await.unwrap();
    }
    assert_eq!(dram_lookups(&c) - before, 5);
    assert_eq!(plain.cached_reads(), 0);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_location_never_outlives_its_lease() {
    let c = cluster(Duration::from_secs(3)).await;
    let reader = c.client().await.unwrap();
    let other = uncached(&c).await;
    other
        .put("k", b"leased", &PutOptions::default())
        .await
        .unwrap();
    reader.get("k").await.unwrap();
    reader.get("k").await.unwrap();
    assert_eq!(reader.cached_reads(), 1);
    // An unforced remove succeeds only once the master's lease ended...
    let t0 = Instant::now();
    loop {
        match other.remove("k", false).await {
            Ok(()) => break,
            Err(e) => assert_eq!(e.code, Code::Leased, "{e}"),
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "the lease ends");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // ...and by then the reader's cache no longer serves the location.
    assert_eq!(reader.get("k").await.unwrap_err().code, Code::NotFound);
    assert_eq!(reader.cached_reads(), 1, "no read served past the lease");
    c.shutdown().await;
}

/// Reads `key` until it answers `want`, checking every answer on the way is
/// `old` (a lease still covers it) or `want`.
async fn converges(cl: &Client, key: &str, old: &[u8], want: Result<&[u8], Code>) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(10) {
        match (cl.get(key).await, want) {
            (Ok(v), Ok(w)) if v == w => return true,
            (Err(e), Err(code)) if e.code == code => return true,
            (Ok(v), _) => assert_eq!(v, old, "only the old or the new bytes"),
            (Err(e), _) => panic!("unexpected error {e}"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_location_the_master_revokes_is_not_served() {
    // Leases far longer than the test: only revocation can end them.
    let c = cluster(Duration::from_secs(120)).await;
    let reader = c.client().await.unwrap();
    let admin = uncached(&c).await;
    let (old, new) = (vec![1u8; 64 << 10], vec![2u8; 64 << 10]);
    for k in ["gone", "replaced"] {
        admin.put(k, &old, &PutOptions::default()).await.unwrap();
        assert_eq!(reader.get(k).await.unwrap(), old);
    }
    // A forced remove frees the range: the reader sees the key gone.
    admin.remove("gone", true).await.unwrap();
    assert!(converges(&reader, "gone", &old, Err(Code::NotFound)).await);
    // Removed and put again with other bytes (likely in the same range):
    // the reader gets the new bytes, never a mix.
    admin.remove("replaced", true).await.unwrap();
    admin
        .put("replaced", &new, &PutOptions::default())
        .await
        .unwrap();
    assert!(converges(&reader, "replaced", &old, Ok(&new)).await);
    // And again at another size: a cached size is no promise either.
    admin.remove("replaced", true).await.unwrap();
    admin
        .put("replaced", &old[..1000], &PutOptions::default())
        .await
        .unwrap();
    // Read into a buffer sized for the old object: the new size comes back.
    let mut buf = vec![0u8; 64 << 10];
    let t0 = Instant::now();
    loop {
        let n = reader.get_into("replaced", &mut buf).await.unwrap();
        if n == 1000 {
            assert_eq!(&buf[..n], &old[..1000]);
            break;
        }
        assert_eq!(
            (n, &buf[..n]),
            (new.len(), &new[..]),
            "old or new bytes only"
        );
        assert!(t0.elapsed() < Duration::from_secs(10), "revoked in time");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(converges(&reader, "replaced", &new, Ok(&old[..1000])).await);
    c.shutdown().await;
}

/// Bytes the node served over its TCP data plane.
async fn node_tcp_reads(c: &LocalCluster) -> f64 {
    let (_, body) = strata_tests::http_get(c.nodes[0].admin_addr, "/metrics").await;
    strata_tests::metric(&body, "strata_store_node_read_bytes_total")
}

/// An rdma client keeps locations too: its repeat reads go one-sided,
/// past both the master and the node's CPU, and once a forced remove has
/// returned, the revocation the node published turns the cached read away
/// at once (a removed key is gone, a replaced one reads new).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sided_reads_keep_locations_the_master_can_revoke() {
    let c = ClusterBuilder::new()
        .store_nodes(1)
        .node_transport(strata_client::TransportKind::Ucx)
        .master(|m| m.lease_ttl = Duration::from_secs(120))
        .build()
        .await
        .unwrap();
    let reader = Client::connect(c.rdma_client_config()).await.unwrap();
    let admin = uncached(&c).await;
    let (old, new) = (vec![1u8; 64 << 10], vec![2u8; 64 << 10]);
    for k in ["kept", "gone", "replaced"] {
        admin.put(k, &old, &PutOptions::default()).await.unwrap();
        assert_eq!(reader.get(k).await.unwrap(), old);
    }
    let (lookups, tcp) = (dram_lookups(&c), node_tcp_reads(&c).await);
    for _ in 0..10 {
        for k in ["kept", "gone", "replaced"] {
            assert_eq!(reader.get(k).await.unwrap(), old);
        }
    }
    assert_eq!(reader.cached_reads(), 30);
    assert_eq!(dram_lookups(&c), lookups, "no read asked the master");
    assert_eq!(node_tcp_reads(&c).await, tcp, "no byte came over TCP");
    admin.remove("gone", true).await.unwrap();
    let r = reader.get("gone").await;
    assert!(
        matches!(&r, Err(e) if e.code == Code::NotFound),
        "a removed key read back: {:?}",
        r.map(|v| (v.len(), v[0]))
    );
    admin.remove("replaced", true).await.unwrap();
    admin
        .put("replaced", &new, &PutOptions::default())
        .await
        .unwrap();
    assert!(
        reader.get("replaced").await.unwrap() == new,
        "old bytes read"
    );
    assert!(reader.get("kept").await.unwrap() == old);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_forgets_what_it_removes() {
    let c = cluster(Duration::from_secs(120)).await;
    let cl = c.client().await.unwrap();
    cl.put("k", b"first", &PutOptions::default()).await.unwrap();
    assert_eq!(cl.get("k").await.unwrap(), b"first");
    cl.remove("k", true).await.unwrap();
    // Its own remove: no cached read at all afterwards.
    assert_eq!(cl.get("k").await.unwrap_err().code, Code::NotFound);
    cl.put("k", b"second", &PutOptions::default())
        .await
        .unwrap();
    assert_eq!(cl.get("k").await.unwrap(), b"second");
    assert_eq!(cl.get("k").await.unwrap(), b"second");
    assert_eq!(cl.cached_reads(), 1);
    assert_eq!(cl.remove_all(true).await.unwrap().0, 1);
    assert_eq!(cl.get("k").await.unwrap_err().code, Code::NotFound);
    assert_eq!(cl.cached_reads(), 1);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_location_with_a_failed_replica_is_asked_for_again() {
    let mut c = ClusterBuilder::new()
        .store_nodes(2)
        .master(|m| m.lease_ttl = Duration::from_secs(120))
        .build()
        .await
        .unwrap();
    let cl = c.client().await.unwrap();
    let opts = PutOptions {
        replicas: 2,
        ..Default::default()
    };
    cl.put("k", b"two copies", &opts).await.unwrap();
    assert_eq!(cl.get("k").await.unwrap(), b"two copies");
    let first = cl
        .master_client()
        .get_replicas(strata_proto::GetReplicasRequest { key: "k".into() })
        .await
        .unwrap()
        .into_inner()
        .replicas[0]
        .node_id
        .clone();
    let node = c.nodes.iter_mut().find(|n| n.node_id == first).unwrap();
    node.stop().await;
    let before = dram_lookups(&c);
    // The first replica fails, the second serves the read...
    assert_eq!(cl.get("k").await.unwrap(), b"two copies");
    assert_eq!(cl.cached_reads(), 1);
    assert_eq!(dram_lookups(&c), before, "served from the cache");
    // ...and the location that failed once is not used again.
    assert_eq!(cl.get("k").await.unwrap(), b"two copies");
    assert_eq!(dram_lookups(&c), before + 1, "asked the master again");
    c.shutdown().await;
}

fn master_calls(c: &LocalCluster, op: &str) -> u64 {
    ["ok", "not_found"]
        .iter()
        .map(|code| {
            c.master
                .metrics
                .requests
                .with_label_values(&[op, code])
                .get()
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_lookups_ride_one_request() {
    let c = cluster(Duration::from_secs(60)).await;
    let cl = uncached(&c).await;
    let keys: Vec<String> = (0..32).map(|i| format!("k{i}")).collect();
    for k in &keys[..24] {
        cl.put(k, k.as_bytes(), &PutOptions::default())
            .await
            .unwrap();
    }
    let calls =
        |c: &LocalCluster| master_calls(c, "get_replicas") + master_calls(c, "batch_get_replicas");
    let before = calls(&c);
    let gets = keys.iter().map(|k| cl.get(k));
    let got = futures::future::join_all(gets).await;
    for (i, (k, r)) in keys.iter().zip(got).enumerate() {
        match r {
            Ok(v) => assert!(i < 24 && v == k.as_bytes(), "{k}"),
            // Each key gets its own answer: the absent ones alone fail.
            Err(e) => assert!(i >= 24 && e.code == Code::NotFound, "{k}: {e}"),
        }
    }
    let made = calls(&c) - before;
    assert!(made < 16, "32 concurrent lookups took {made} master calls");
    assert!(master_calls(&c, "batch_get_replicas") > 0);
    c.shutdown().await;
}
