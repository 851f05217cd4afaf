//! The SSD tier, part 2: reads through the agent's shared staging arena,
//! batch reads, and bucket eviction racing readers. In-process clusters with
//! real files, RocksDB and sockets.

use std::time::Duration;
use strata_client::Code;
use strata_proto as pb;
use strata_tests::{
    eager, http_get, metric, payload, put_on_ssd_only, wait_until, ClusterBuilder, LocalCluster,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_readers_each_four_times_the_arena_all_read_correct_bytes() {
    let arena = 256 << 10;
    let c = ClusterBuilder::new()
        .master(eager)
        .store_nodes(1)
        .ssd_agents(1)
        .ssd(move |a| a.staging_bytes = arena)
        .build()
        .await
        .unwrap();
    let cl = c.client().await.unwrap();
    let size = 4 * arena as usize;
    let keys: Vec<String> = (0..8).map(|i| format!("big-{i}")).collect();
    put_on_ssd_only(&c, &cl, &keys, size, 100).await;
    let reads: Vec<_> = keys
        .iter()
        .map(|k| {
            let cl = cl.clone();
            let k = k.clone();
            tokio::spawn(async move { cl.get(&k).await })
        })
        .collect();
    for (i, r) in reads.into_iter().enumerate() {
        let got = r
            .await
            .unwrap()
            .expect("a read larger than the arena streams through it");
        assert!(
            got == payload(100 + i as u64, size),
            "reader {i} got wrong bytes"
        );
    }
    // The agent drops a piece's staging once it is sent, which may be just
    // after the reader has every byte.
    let staging = &c.agents[0].staging;
    assert!(
        wait_until(Duration::from_secs(5), || staging.in_use() == 0).await,
        "every piece released"
    );
    let (_, m) = http_get(c.agents[0].admin_addr, "/metrics").await;
    assert_eq!(
        metric(&m, "strata_ssd_agent_staging_capacity_bytes"),
        arena as f64
    );
    assert_eq!(metric(&m, "strata_ssd_agent_staging_in_use_bytes"), 0.0);
    assert_eq!(metric(&m, "strata_ssd_agent_staging_waiters"), 0.0);
    assert!(
        metric(&m, "strata_ssd_agent_staging_wait_seconds_count") >= 8.0,
        "{m}"
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_arena_times_out_readers_with_the_setting_named_and_recovers_when_freed() {
    let arena: u64 = 128 << 10;
    let c = ClusterBuilder::new()
        .master(eager)
        .store_nodes(1)
        .ssd_agents(1)
        .ssd(move |a| {
            a.staging_bytes = arena;
            a.staging_wait = Duration::from_millis(200);
        })
        .build()
        .await
        .unwrap();
    let cl = c.client().await.unwrap();
    let keys: Vec<String> = (0..3).map(|i| format!("held-{i}")).collect();
    put_on_ssd_only(&c, &cl, &keys, 64 << 10, 7).await;
    let staging = c.agents[0].staging.clone();
    // A reader that holds all of it far longer than the wait.
    let held = staging.acquire(arena, arena, None).await.unwrap();
    let tries: Vec<_> = keys
        .iter()
        .map(|k| {
            let (cl, k) = (cl.clone(), k.clone());
            tokio::spawn(async move { cl.get(&k).await })
        })
        .collect();
    for t in tries {
        let e = t.await.unwrap().expect_err("the arena is full");
        assert_eq!(e.code, Code::ResourceExhausted, "{e}");
        assert!(e.retryable());
        for part in [
            "65536 bytes",
            "arena 131072",
            "131072 in use",
            "--staging-bytes",
            "STRATA_STAGING_BYTES",
        ] {
            assert!(
                e.message.contains(part),
                "{part:?} missing from: {}",
                e.message
            );
        }
    }
    let (_, m) = http_get(c.agents[0].admin_addr, "/metrics").await;
    assert!(
        metric(&m, "strata_ssd_agent_staging_timeouts_total") >= 3.0,
        "{m}"
    );
    // A reader cancelled while it waits leaves nothing behind.
    let cancelled = tokio::time::timeout(Duration::from_millis(50), cl.get(&keys[0])).await;
    assert!(cancelled.is_err());
    drop(held);
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(cl.get(k).await.unwrap(), payload(7 + i as u64, 64 << 10));
    }
    assert!(wait_until(Duration::from_secs(5), || staging.in_use() == 0).await);
    let (_, m) = http_get(c.agents[0].admin_addr, "/metrics").await;
    assert_eq!(metric(&m, "strata_ssd_agent_staging_waiters"), 0.0);
    c.shutdown().await;
}

/// A cluster (agent set up by `agent`) holding one 64 MiB object, "big"
/// (`seed`), only on SSD, and a grant for reading it there.
async fn big_object_on_ssd(
    agent: impl Fn(&mut strata_ssd_agent::SsdAgentConfig) + Send + Sync + 'static,
    seed: u64,
) -> (
    LocalCluster,
    strata_client::Client,
    strata_transport::RemoteRange,
) {
    let c = ClusterBuilder::new()
        .store_nodes(1)
        .node_capacity(256 << 20)
        .ssd_agents(1)
        .master(eager)
        .ssd(agent)
        .build()
        .await
        .unwrap();
    let cl = c.client().await.unwrap();
    put_on_ssd_only(&c, &cl, &["big".to_string()], 64 << 20, seed).await;
    let g = cl
        .master_client()
        .get_replicas(pb::GetReplicasRequest { key: "big".into() })
        .await
        .unwrap()
        .into_inner();
    let r = strata_client::remote_range(&g.replicas[0]).unwrap();
    (c, cl, r)
}

/// A raw request for all of `r`'s range, as a reader sends it.
fn whole_read(r: &strata_transport::RemoteRange) -> strata_transport::frame::Request {
    strata_transport::frame::Request {
        op: strata_transport::frame::Op::Read,
        req_id: 1,
        grant: r.scope,
        mac: r.mac,
        offset: r.scope.offset,
        length: r.scope.length,
        flags: 0,
        trace: None,
        record: None,
    }
}

/// (bytes served, data-plane requests) per agent.
async fn agent_metrics(c: &LocalCluster) -> Vec<(f64, f64)> {
    let mut out = Vec::new();
    for a in &c.agents {
        let (_, m) = http_get(a.admin_addr, "/metrics").await;
        out.push((
            metric(&m, "strata_ssd_agent_read_bytes_total"),
            metric(&m, "strata_ssd_agent_data_plane_requests_total"),
        ));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_ssd_keys_is_one_request_per_agent() {
    let c = ClusterBuilder::new()
        .master(eager)
        .store_nodes(1)
        .ssd_agents(2)
        .build()
        .await
        .unwrap();
    let cl = c.client().await.unwrap();
    let keys: Vec<String> = (0..40).map(|i| format!("batch-{i}")).collect();
    put_on_ssd_only(&c, &cl, &keys, 8 << 10, 500).await;
    let refs: Vec<&str> = keys.iter().map(|k| k.as_str()).collect();
    let mut with_missing = refs.clone();
    with_missing.push("batch-absent");
    let before = agent_metrics(&c).await;
    let got = cl.batch_get(&with_missing).await.unwrap();
    for (i, r) in got.iter().take(40).enumerate() {
        assert_eq!(r.as_ref().unwrap(), &payload(500 + i as u64, 8 << 10));
    }
    assert_eq!(got[40].as_ref().unwrap_err().code, Code::NotFound);
    // An agent counts a read's bytes once they are sent, which can be just
    // after the client has them: wait (bounded) for the count to settle.
    let want = (40 * (8 << 10)) as f64;
    let t0 = std::time::Instant::now();
    let (bytes, requests, agents_used) = loop {
        let after = agent_metrics(&c).await;
        let (mut bytes, mut requests, mut agents_used) = (0.0, 0.0, 0);
        for (a, b) in after.iter().zip(&before) {
            bytes += a.0 - b.0;
            requests += a.1 - b.1;
            agents_used += usize::from(a.1 > b.1);
        }
        if bytes >= want || t0.elapsed() > Duration::from_secs(5) {
            break (bytes, requests, agents_used);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(bytes, want);
    assert!(agents_used >= 1);
    assert_eq!(
        requests, agents_used as f64,
        "one request per agent holding keys"
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_waits_for_readers_of_a_bucket_and_then_refuses_new_ones() {
    let c = ClusterBuilder::new()
        .master(eager)
        .store_nodes(1)
        .ssd_agents(1)
        .build()
        .await
        .unwrap();
    let cl = c.client().await.unwrap();
    let keys = vec!["ev-0".to_string()];
    put_on_ssd_only(&c, &cl, &keys, 4096, 1).await;
    let store = c.agents[0].store.clone();
    let bucket = store.location("ev-0").unwrap().unwrap().bucket_id;
    let reading = store.begin_read(bucket).unwrap();
    store.begin_evict(&[bucket]);
    let e = store.delete_bucket(bucket).unwrap_err();
    assert_eq!(e.code, Code::Leased, "a bucket being read is never deleted");
    assert!(
        store.begin_read(bucket).is_err(),
        "no new reader once evicting"
    );
    drop(reading);
    assert!(store.delete_bucket(bucket).unwrap() > 0);
    assert_eq!(store.stats().buckets, 0);
    c.shutdown().await;
}

/// A cluster whose one SSD owner holds 1 MiB in buckets of `bucket_bytes`
/// and evicts down to `low_watermark`.
async fn small_owner(bucket_bytes: u64, low_watermark: f64) -> LocalCluster {
    ClusterBuilder::new()
        .master(eager)
        .store_nodes(1)
        .ssd_agents(1)
        .ssd_capacity(1 << 20)
        .ssd(move |a| {
            a.bucket_bytes = bucket_bytes;
            a.low_watermark = low_watermark;
        })
        .build()
        .await
        .unwrap()
}

/// Puts `keys` (object i = payload(seed + i, size)), waits for the offload
/// queue to drain and drops the DRAM copies of those that reached the SSD.
/// On an owner this small, a forced bucket eviction can take an object's
/// SSD copy before its DRAM copy goes; the master then refuses to drop the
/// DRAM copy (`NotReady`), and the object stays readable from DRAM.
async fn put_then_evict_memory(
    c: &LocalCluster,
    cl: &strata_client::Client,
    keys: &[String],
    size: usize,
    seed: u64,
) {
    strata_tests::put_and_drain(c, cl, keys, size, seed).await;
    let r = cl
        .master_client()
        .evict_memory(pb::EvictMemoryRequest {
            keys: keys.to_vec(),
        })
        .await
        .unwrap()
        .into_inner();
    for (k, s) in keys.iter().zip(r.results) {
        assert!(
            s.code == 0 || s.code == Code::NotReady as u32,
            "{k}: {}",
            s.message
        );
    }
}

/// Readers race continuous offload and bucket eviction on a small owner:
/// every read returns the right bytes or a clean "not found", never wrong
/// bytes, a checksum failure or a crash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_racing_bucket_eviction_get_right_bytes_or_not_found() {
    let size = 32 << 10;
    let c = small_owner(128 << 10, 0.5).await;
    let cl = c.client().await.unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let written = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let readers: Vec<_> = (0..3)
        .map(|r| {
            let (cl, stop, written) = (cl.clone(), stop.clone(), written.clone());
            tokio::spawn(async move {
                let (mut ok, mut gone) = (0u64, 0u64);
                let mut i = r;
                while !stop.is_cancelled() {
                    let n = written.load(std::sync::atomic::Ordering::Acquire);
                    if n == 0 {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    }
                    let k = i % n;
                    i = i.wrapping_mul(31).wrapping_add(7);
                    match cl.get(&format!("race-{k}")).await {
                        Ok(v) => {
                            assert!(v == payload(k, size), "race-{k}: wrong bytes served");
                            ok += 1;
                        }
                        Err(e) if e.code == Code::NotFound => gone += 1,
                        Err(e) => panic!("race-{k}: {e}"),
                    }
                }
                (ok, gone)
            })
        })
        .collect();
    for round in 0..12u64 {
        let keys: Vec<String> = (round * 6..round * 6 + 6)
            .map(|i| format!("race-{i}"))
            .collect();
        put_then_evict_memory(&c, &cl, &keys, size, round * 6).await;
        written.store(round * 6 + 6, std::sync::atomic::Ordering::Release);
        // Capacity plus at most one bucket (compaction writes the objects
        // it keeps before the emptied buckets go).
        assert!(c.agents[0].store.stats().used <= (1 << 20) + (160 << 10));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.cancel();
    let (mut ok, mut gone) = (0, 0);
    for r in readers {
        let (o, g) = r.await.expect("no reader crashed");
        ok += o;
        gone += g;
    }
    let (_, m) = http_get(c.agents[0].admin_addr, "/metrics").await;
    assert!(
        metric(&m, "strata_ssd_agent_evicted_buckets_total") >= 1.0,
        "{m}"
    );
    // Exported (how often eviction had to drop read objects depends on timing).
    assert!(
        metric(&m, "strata_ssd_agent_forced_evictions_total") >= 0.0,
        "{m}"
    );
    assert!(
        ok > 0 && gone > 0,
        "both outcomes happened: ok {ok}, not found {gone}"
    );
    c.shutdown().await;
}

/// Objects read since their bucket was written survive its eviction: they
/// are rewritten into a new bucket and the master learns their new place;
/// the unread ones go with the bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_keeps_recently_read_objects_and_drops_the_rest() {
    let size = 64 << 10;
    let c = small_owner(256 << 10, 0.6).await;
    let cl = c.client().await.unwrap();
    let first: Vec<String> = (0..4).map(|i| format!("old-{i}")).collect();
    put_on_ssd_only(&c, &cl, &first, size, 0).await;
    let store = c.agents[0].store.clone();
    let old_bucket = store.location("old-1").unwrap().unwrap().bucket_id;
    // Read one of them from SSD.
    assert_eq!(cl.get("old-1").await.unwrap(), payload(1, size));
    // Fill the owner until the first bucket is evicted.
    for round in 0..6u64 {
        let keys: Vec<String> = (0..4).map(|i| format!("new-{round}-{i}")).collect();
        put_on_ssd_only(&c, &cl, &keys, size, 100 + round * 4).await;
        if store.location("old-0").unwrap().is_none() {
            break;
        }
    }
    let (_, m) = http_get(c.agents[0].admin_addr, "/metrics").await;
    assert!(
        metric(&m, "strata_ssd_agent_kept_objects_total") >= 1.0,
        "{m}"
    );
    let kept = store.location("old-1").unwrap().expect("old-1 kept");
    assert_ne!(kept.bucket_id, old_bucket, "moved to a new bucket");
    let info = c.master.inspect("old-1").unwrap();
    assert!(info
        .replicas
        .iter()
        .any(|r| r.kind == pb::ReplicaKind::Ssd as i32));
    assert_eq!(cl.get("old-1").await.unwrap(), payload(1, size));
    for k in ["old-0", "old-2", "old-3"] {
        assert_eq!(
            cl.get(k).await.unwrap_err().code,
            Code::NotFound,
            "{k} went with its bucket"
        );
    }
    c.shutdown().await;
}

/// A reader that never reads its socket is cut off after `--io-timeout`: its
/// staging is released and its bucket's reader count drops, so eviction can
/// delete the bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_never_reads_is_cut_off_and_releases_its_bucket() {
    use tokio::io::AsyncWriteExt;
    let (c, cl, r) = big_object_on_ssd(
        |a| {
            a.io_timeout = Duration::from_secs(1);
            a.staging_bytes = 4 << 20;
        },
        3,
    )
    .await;
    let size = 64 << 20;
    let (_, bucket) = strata_common::grant::split_ssd_segment_id(r.scope.segment_id);
    let req = whole_read(&r);
    let mut s = tokio::net::TcpStream::connect(&r.addr).await.unwrap();
    s.write_all(&req.encode()).await.unwrap();
    // The read starts (a reader on the bucket, staging in use)...
    let a = &c.agents[0];
    assert!(wait_until(Duration::from_secs(10), || a.store.readers(bucket) == 1).await);
    // ...and, never read, is cut off: all released.
    assert!(
        wait_until(Duration::from_secs(20), || a.store.readers(bucket) == 0
            && a.staging.in_use() == 0)
        .await,
        "readers {} staging {}",
        a.store.readers(bucket),
        a.staging.in_use()
    );
    drop(s);
    // A well-behaved reader still gets the object.
    assert_eq!(cl.get("big").await.unwrap(), payload(3, size));
    c.shutdown().await;
}

/// Readers that stop reading their sockets hold their staging until
/// `--io-timeout` cuts them off; from one address they hold no more than
/// its share of the arena (a quarter), so a reader elsewhere is served
/// meanwhile instead of timing out for staging space.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_readers_from_one_address_leave_room_for_others() {
    use tokio::io::AsyncWriteExt;
    let (c, cl, r) = big_object_on_ssd(
        |a| {
            a.staging_bytes = 4 << 20;
            a.staging_wait = Duration::from_millis(500);
        },
        6,
    )
    .await;
    let size = 64 << 20;
    let a = &c.agents[0];
    assert_eq!(a.staging.peer_share(), 1 << 20);
    let req = whole_read(&r);
    let addr: std::net::SocketAddr = r.addr.parse().unwrap();
    let mut stalled = Vec::new();
    for _ in 0..8 {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind("127.0.1.9:0".parse().unwrap()).unwrap();
        let mut s = sock.connect(addr).await.unwrap();
        s.write_all(&req.encode()).await.unwrap();
        stalled.push(s);
    }
    // One of them holds the address's share; the other seven time out
    // waiting for it (each cut off, holding nothing).
    let timeouts = || async {
        let (_, m) = http_get(a.admin_addr, "/metrics").await;
        metric(&m, "strata_ssd_agent_staging_timeouts_total")
    };
    let t0 = std::time::Instant::now();
    while timeouts().await < 7.0 {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "{} timed out, {} bytes staged",
            timeouts().await,
            a.staging.in_use()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(a.staging.in_use() <= a.staging.peer_share());
    // A reader on another address reads all 64 MiB through the rest.
    assert_eq!(cl.get("big").await.unwrap(), payload(6, size));
    drop(stalled);
    assert!(wait_until(Duration::from_secs(10), || a.staging.in_use() == 0).await);
    c.shutdown().await;
}
