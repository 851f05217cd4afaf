//! End-to-end behaviour of the DRAM tier on an in-process cluster (real
//! gRPC and data-plane sockets on 127.0.0.1).

use std::time::Duration;
use strata_client::{Code, PutOptions};
use strata_proto as pb;
use strata_tests::{http_get, payload, wait_until, ClusterBuilder};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_get_round_trip_sizes() {
    let c = ClusterBuilder::new().store_nodes(2).build().await.unwrap();
    let cl = c.client().await.unwrap();
    for (i, size) in [1usize, 100, 4096, 65536, 1 << 20, 9 << 20]
        .into_iter()
        .enumerate()
    {
        let key = format!("obj-{i}");
        let data = payload(i as u64, size);
        cl.put(
            &key,
            &data,
            &PutOptions {
                replicas: 2,
                ..Default::default()
            },
        )
        .await
        .unwrap();
        assert_eq!(cl.get(&key).await.unwrap(), data, "size {size}");
        let mut buf = vec![0u8; size + 10];
        assert_eq!(cl.get_into(&key, &mut buf).await.unwrap(), size);
        assert_eq!(&buf[..size], &data[..]);
        let info = cl.inspect(&key).await.unwrap();
        assert_eq!(info.replicas.len(), 2);
        assert_ne!(info.replicas[0].segment_id, info.replicas[1].segment_id);
    }
    let mut small = [0u8; 10];
    let e = cl.get_into("obj-4", &mut small).await.unwrap_err();
    assert_eq!(e.code, Code::InvalidArgument);
    let e = cl.get("nope").await.unwrap_err();
    assert_eq!(e.code, Code::NotFound);
    assert!(e.message.contains("not found"));
    let e = cl
        .put("obj-0", b"x", &PutOptions::default())
        .await
        .unwrap_err();
    assert_eq!(e.code, Code::AlreadyExists);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filling_far_past_capacity_keeps_every_read_byte_identical() {
    let c = ClusterBuilder::new()
        .store_nodes(2)
        .node_capacity(8 << 20)
        .master(|m| m.lease_ttl = Duration::from_millis(200))
        .build()
        .await
        .unwrap();
    let cl = c.client().await.unwrap();
    let mut stored = Vec::new();
    let (mut ok, mut no_space) = (0, 0);
    for i in 0..240u64 {
        let size = 32 * 1024 + (i as usize * 7919) % (480 * 1024);
        let key = format!("fill-{i}");
        let data = payload(i, size);
        match cl
            .put(
                &key,
                &data,
                &PutOptions {
                    replicas: 2,
                    ..Default::default()
                },
            )
            .await
        {
            Ok(()) => {
                ok += 1;
                // Reading leases some objects, so eviction must work around them.
                if i % 5 == 0 {
                    assert_eq!(cl.get(&key).await.unwrap(), data);
                }
                stored.push((key, i, size));
            }
            Err(e) => {
                assert_eq!(e.code, Code::NoSpace, "unexpected error: {e}");
                no_space += 1;
            }
        }
    }
    assert!(
        ok > 150,
        "eviction should let most puts succeed: {ok} ok, {no_space} no space"
    );
    let st = cl.stat().await.unwrap();
    assert!(st.evictions > 0);
    assert!(st.allocated_bytes <= st.capacity_bytes);
    let mut read_back = 0;
    for (k, seed, size) in &stored {
        match cl.get(k).await {
            Ok(v) => {
                assert_eq!(
                    v,
                    payload(*seed, *size),
                    "{k} must read back byte-identical"
                );
                read_back += 1;
            }
            Err(e) => assert_eq!(e.code, Code::NotFound, "{k}: {e}"),
        }
    }
    assert!(read_back > 0);
    c.shutdown().await;
}

/// A reader's lease ends with its read: with a TTL of a minute, an
/// unforced remove (and remove_all) of what was just read goes through as
/// soon as the reader told the master, whichever read call it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_read_ends_its_lease_long_before_the_ttl() {
    let c = ClusterBuilder::new()
        .store_nodes(1)
        .master(|m| m.lease_ttl = Duration::from_secs(60))
        .build()
        .await
        .unwrap();
    let cl = strata_client::Client::connect(c.client_config().with_location_cache(0))
        .await
        .unwrap();
    for k in ["a", "b", "c", "d"] {
        cl.put(k, b"read bytes", &PutOptions::default())
            .await
            .unwrap();
    }
    cl.get("a").await.unwrap();
    let mut buf = [0u8; 64];
    cl.get_into("b", &mut buf).await.unwrap();
    let got = cl.batch_get(&["c", "d", "missing"]).await.unwrap();
    assert_eq!(got.len(), 3);
    assert!(got[0].is_ok() && got[1].is_ok() && got[2].is_err());
    let t0 = std::time::Instant::now();
    loop {
        match cl.remove("a", false).await {
            Ok(()) => break,
            Err(e) => assert_eq!(e.code, Code::Leased, "{e}"),
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the read's lease ends"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cl.flush_lease_ends(Duration::from_secs(5)).await;
    assert_eq!(cl.remove_all(false).await.unwrap(), (3, 0), "b, c, d");
    let (_, body) = http_get(c.master_admin, "/metrics").await;
    assert_eq!(
        strata_tests::metric(&body, "strata_master_lease_ends_total{outcome=\"ended\"}"),
        4.0
    );
    c.shutdown().await;
}

/// A reader that keeps looking an object up without ever ending its
/// leases holds it for `--max-lease` at most: past that its lookups get no
/// lease (its reads go on), and the remove its lease refused goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_never_ends_its_leases_holds_an_object_for_max_lease_at_most() {
    let c = ClusterBuilder::new()
        .store_nodes(1)
        .master(|m| {
            // A TTL ten lookups long: a busy machine's stall between two
            // lookups (once past 300 ms in a full CI run) does not let the
            // lease lapse before the cap ends it.
            m.lease_ttl = Duration::from_secs(1);
            m.max_lease = Some(Duration::from_secs(2));
        })
        .build()
        .await
        .unwrap();
    let reader = strata_client::Client::connect(
        c.client_config()
            .with_end_leases(false)
            .with_location_cache(0),
    )
    .await
    .unwrap();
    let cl = c.client().await.unwrap();
    cl.put("held", b"hot bytes", &PutOptions::default())
        .await
        .unwrap();
    let t0 = std::time::Instant::now();
    let (mut refused, mut removed_at) = (0, None);
    // The reader looks it up every 100 ms, well inside the 1 s TTL.
    while removed_at.is_none() && t0.elapsed() < Duration::from_secs(8) {
        assert_eq!(reader.get("held").await.unwrap(), b"hot bytes");
        match cl.remove("held", false).await {
            Ok(()) => removed_at = Some(t0.elapsed()),
            Err(e) => {
                assert_eq!(e.code, Code::Leased, "{e}");
                refused += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let at = removed_at.expect("removed once the lease ran --max-lease");
    assert!(
        refused >= 5,
        "refused while the lease ran ({refused} times)"
    );
    // The lease's start is kept in whole seconds: the cap comes 1 to 2 s in.
    assert!(at >= Duration::from_millis(900), "removed at {at:?}");
    let (_, body) = strata_tests::http_get(c.master_admin, "/metrics").await;
    assert!(strata_tests::metric(&body, "strata_master_capped_leases_total") >= 1.0);
    c.shutdown().await;
}

/// A reader whose leases run their TTL (one that ends none, as one that
/// died): its reads keep the objects from unforced removes until then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_blocks_remove_until_it_ends_and_force_works() {
    let c = ClusterBuilder::new()
        .store_nodes(1)
        .master(|m| m.lease_ttl = Duration::from_millis(400))
        .build()
        .await
        .unwrap();
    let cl = strata_client::Client::connect(c.client_config().with_end_leases(false))
        .await
        .unwrap();
    for k in ["a", "b", "c"] {
        cl.put(k, b"leased bytes", &PutOptions::default())
            .await
            .unwrap();
        cl.get(k).await.unwrap();
    }
    let e = cl.remove("a", false).await.unwrap_err();
    assert_eq!(e.code, Code::Leased);
    cl.remove("b", true).await.unwrap();
    assert_eq!(cl.get("b").await.unwrap_err().code, Code::NotFound);
    cl.put("d", b"not leased", &PutOptions::default())
        .await
        .unwrap();
    assert_eq!(
        cl.remove_all(false).await.unwrap(),
        (1, 2),
        "leased a and c are skipped"
    );
    // Refused while the lease lasts, allowed once it ends (a bounded wait
    // on the condition, not a fixed sleep).
    let t0 = std::time::Instant::now();
    loop {
        match cl.remove("a", false).await {
            Ok(()) => break,
            Err(e) => assert_eq!(e.code, Code::Leased, "{e}"),
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "the lease ends");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // "c" was leased a moment after "a": skipped until its lease ends too.
    let mut removed = 0;
    loop {
        let (r, skipped) = cl.remove_all(false).await.unwrap();
        removed += r;
        if skipped == 0 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "the lease of c ends");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(removed, 1, "c, once");
    assert_eq!(cl.stat().await.unwrap().allocated_bytes, 0);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_before_put_end_is_not_ready_and_abandoned_put_is_reclaimed() {
    let c = ClusterBuilder::new()
        .store_nodes(1)
        .master(|m| m.put_timeout = Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    let cl = c.client().await.unwrap();
    let mut m = cl.master_client();
    let started = m
        .put_start(pb::PutStartRequest {
            key: "half".into(),
            size: 4096,
            replica_num: 1,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    // Asked once (the client itself would retry until the put is reclaimed).
    let e: strata_common::Error = m
        .get_replicas(pb::GetReplicasRequest { key: "half".into() })
        .await
        .unwrap_err()
        .into();
    assert_eq!(e.code, Code::NotReady);
    assert!(e.message.contains("not ready"), "{e}");
    assert!(cl.stat().await.unwrap().allocated_bytes > 0);
    // Nobody ends the put: the master reclaims it and frees its space.
    let master = c.master.clone();
    assert!(wait_until(Duration::from_secs(5), || master.allocated_bytes() == 0).await);
    assert_eq!(cl.get("half").await.unwrap_err().code, Code::NotFound);
    assert_eq!(c.master.metrics.reclaimed_puts.get(), 1);
    // The stale write grant died with the put.
    let range = strata_client::remote_range(&started.replicas[0]).unwrap();
    let e = cl
        .transport()
        .write(&range, 0, &[1u8; 4096])
        .await
        .unwrap_err();
    assert_eq!(e.code, Code::PermissionDenied);
    assert!(e.message.contains("expired"), "{e}");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_put_and_get_report_per_item() {
    let c = ClusterBuilder::new().store_nodes(2).build().await.unwrap();
    let cl = c.client().await.unwrap();
    cl.put("dup", b"first", &PutOptions::default())
        .await
        .unwrap();
    let data: Vec<Vec<u8>> = (0..40)
        .map(|i| payload(i, 1000 + i as usize * 100))
        .collect();
    let keys: Vec<String> = (0..40)
        .map(|i| {
            if i == 7 {
                "dup".to_string()
            } else {
                format!("b{i}")
            }
        })
        .collect();
    let items: Vec<(&str, &[u8])> = keys
        .iter()
        .zip(&data)
        .map(|(k, d)| (k.as_str(), d.as_slice()))
        .collect();
    let receipts = |body: &str, outcome: &str| {
        let name = format!("strata_master_put_receipts_total{{outcome=\"{outcome}\"}}");
        strata_tests::metric(body, &name)
    };
    let (_, before) = http_get(c.master_admin, "/metrics").await;
    let res = cl
        .batch_put(
            &items,
            &PutOptions {
                replicas: 2,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(res.len(), 40);
    for (i, r) in res.iter().enumerate() {
        if i == 7 {
            assert_eq!(r.as_ref().unwrap_err().code, Code::AlreadyExists);
        } else {
            r.as_ref().unwrap();
        }
    }
    // Each started object's PutEnd brought its own nodes' receipts for its
    // own bytes (a receipt handed to another object would not verify),
    // around the one that did not start.
    let (_, after) = http_get(c.master_admin, "/metrics").await;
    let accepted = receipts(&after, "accepted") - receipts(&before, "accepted");
    let refused = receipts(&after, "refused") - receipts(&before, "refused");
    assert_eq!((accepted, refused), (78.0, 0.0), "{after}");
    let mut ks: Vec<&str> = keys.iter().map(String::as_str).collect();
    ks.push("missing");
    let got = cl.batch_get(&ks).await.unwrap();
    for (i, g) in got.iter().enumerate() {
        match i {
            7 => assert_eq!(g.as_ref().unwrap(), b"first"),
            40 => assert_eq!(g.as_ref().unwrap_err().code, Code::NotFound),
            _ => assert_eq!(g.as_ref().unwrap(), &data[i]),
        }
    }
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_nodes_record_committed_objects() {
    let c = ClusterBuilder::new().store_nodes(1).build().await.unwrap();
    let cl = c.client().await.unwrap();
    cl.put("rec-a", &payload(1, 5000), &PutOptions::default())
        .await
        .unwrap();
    cl.put("rec-b", &payload(2, 7000), &PutOptions::default())
        .await
        .unwrap();
    cl.remove("rec-a", true).await.unwrap();
    let rec = c.nodes[0].records.clone();
    assert!(
        wait_until(Duration::from_secs(5), || {
            let s = rec.snapshot();
            s.len() == 1 && s[0].key == "rec-b"
        })
        .await,
        "node must learn commits and frees from the master"
    );
    let s = rec.snapshot();
    assert_eq!(
        (s[0].length, s[0].crc32c),
        (7000, crc32c::crc32c(&payload(2, 7000)))
    );
    let member = c.credentials().member.as_ref();
    let (status, body) =
        strata_tests::http_get_as(c.nodes[0].admin_addr, "/api/v1/objects", member).await;
    assert_eq!(status, 200);
    assert!(body.contains("rec-b") && !body.contains("rec-a"), "{body}");
    assert!(!body.contains("crc32c"), "no checksum published: {body}");
    c.shutdown().await;
}

/// A store node's object view names keys, so it wants the node's member
/// token (refused without it and to another role's), and it comes in
/// pages: `limit` objects in key order, `next` to go on, all of them
/// exactly once; bad paging is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_object_view_is_paged_and_wants_its_member_token() {
    let c = ClusterBuilder::new().store_nodes(1).build().await.unwrap();
    let cl = c.client().await.unwrap();
    let keys: Vec<String> = (0..25).map(|i| format!("page/{i:02}")).collect();
    for k in &keys {
        cl.put(k, b"x", &PutOptions::default()).await.unwrap();
    }
    let rec = c.nodes[0].records.clone();
    assert!(wait_until(Duration::from_secs(5), || rec.len() == keys.len()).await);
    let a = c.nodes[0].admin_addr;
    let member = c.credentials().member.as_ref();
    assert_eq!(http_get(a, "/api/v1/objects").await.0, 401);
    let admin = c.credentials().admin.as_ref();
    assert_eq!(
        strata_tests::http_get_as(a, "/api/v1/objects", admin)
            .await
            .0,
        401
    );
    for bad in ["limit=0", "limit=10001", "after=nocursor"] {
        let (st, body) =
            strata_tests::http_get_as(a, &format!("/api/v1/objects?{bad}"), member).await;
        assert_eq!(st, 400, "{bad}: {body}");
    }
    let (mut seen, mut after, mut pages) = (Vec::new(), None::<String>, 0);
    loop {
        let q = match &after {
            Some(n) => format!("?limit=10&after={}", urlencode(n)),
            None => "?limit=10".to_string(),
        };
        let (st, body) = strata_tests::http_get_as(a, &format!("/api/v1/objects{q}"), member).await;
        assert_eq!(st, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["objects_total"], 25, "{v}");
        let page = v["objects"].as_array().unwrap();
        assert!(page.len() <= 10, "{v}");
        seen.extend(page.iter().map(|o| o["key"].as_str().unwrap().to_string()));
        pages += 1;
        match v["next"].as_str() {
            Some(n) => after = Some(n.to_string()),
            None => break,
        }
        assert!(pages < 10, "paging ends");
    }
    assert_eq!(pages, 3);
    assert_eq!(seen, keys, "every object once, in key order");
    c.shutdown().await;
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_endpoints_and_metrics() {
    let c = ClusterBuilder::new().store_nodes(1).build().await.unwrap();
    let cl = c.client().await.unwrap();
    cl.put("adm", b"hello", &PutOptions::default())
        .await
        .unwrap();
    cl.get("adm").await.unwrap();
    let a = c.master_admin;
    assert_eq!(http_get(a, "/health").await.0, 200);
    assert_eq!(http_get(a, "/ready").await.0, 200);
    // Key views are the admin's: refused without the token, and to
    // another role's.
    let admin = c.credentials().admin.as_ref();
    assert_eq!(http_get(a, "/api/v1/keys/adm").await.0, 401);
    let client = c.credentials().client.as_ref();
    assert_eq!(
        strata_tests::http_get_as(a, "/api/v1/keys/adm", client)
            .await
            .0,
        403
    );
    let (st, body) = strata_tests::http_get_as(a, "/api/v1/keys/adm", admin).await;
    assert_eq!(st, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["size"], 5);
    assert!(v.get("crc32c").is_none(), "no checksum published: {v}");
    assert_eq!(v["replicas"][0]["kind"], "memory");
    assert!(v["lease_until"].as_u64().unwrap() > 0);
    assert_eq!(
        strata_tests::http_get_as(a, "/api/v1/keys/absent", admin)
            .await
            .0,
        404
    );
    let (_, body) = http_get(a, "/api/v1/leader").await;
    assert!(body.contains("\"is_leader\":true"), "{body}");
    for p in [
        "/api/v1/segments",
        "/api/v1/owners",
        "/api/v1/offload",
        "/api/v1/nodes",
    ] {
        assert_eq!(http_get(a, p).await.0, 200, "{p}");
    }
    let (_, m) = http_get(a, "/metrics").await;
    for name in [
        "strata_master_keys 1",
        "strata_master_capacity_bytes",
        "strata_master_allocated_bytes",
        "strata_master_requests_total{code=\"ok\",op=\"put_start\"} 1",
        "strata_master_request_duration_seconds",
        "strata_master_evictions_total",
        "strata_master_is_leader 1",
        "strata_master_term",
        // Known label values at zero from the start (a DRAM-only cluster
        // drops, promotes and offloads nothing).
        "strata_master_dropped_objects_total{reason=\"no_owner\"} 0",
        "strata_master_promotions_total{outcome=\"promoted\"} 0",
        "strata_master_offload_results_total{outcome=\"persisted\"} 0",
    ] {
        assert!(m.contains(name), "missing {name} in master metrics");
    }
    let n = c.nodes[0].admin_addr;
    assert_eq!(http_get(n, "/ready").await.0, 200);
    let (_, m) = http_get(n, "/metrics").await;
    for name in [
        "strata_store_node_capacity_bytes",
        "strata_store_node_read_bytes_total 5",
        "strata_store_node_written_bytes_total 5",
    ] {
        assert!(
            m.contains(name),
            "missing {name} in store node metrics:\n{m}"
        );
    }
    c.shutdown().await;
}

/// A replica whose bytes do not match the committed checksum is never
/// served: the reader falls back to a good replica, or fails with
/// `Corrupted` when there is none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_replica_is_never_served() {
    let c = ClusterBuilder::new().store_nodes(2).build().await.unwrap();
    let cl = c.client().await.unwrap();
    let mut m = cl.master_client();
    let good = payload(11, 200_000);
    let mut bad = good.clone();
    bad[123_456] ^= 0x40;
    for (key, replicas) in [("one-bad-of-two", 2u32), ("only-bad", 1)] {
        strata_tests::put_start_with_a_bad_first_replica(&cl, key, replicas, &bad, &good).await;
        m.put_end(pb::PutEndRequest {
            key: key.into(),
            crc32c: crc32c::crc32c(&good),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    for _ in 0..5 {
        assert_eq!(cl.get("one-bad-of-two").await.unwrap(), good);
    }
    let e = cl.get("only-bad").await.unwrap_err();
    assert_eq!(e.code, Code::Corrupted, "{e}");
    let mut buf = vec![0u8; good.len()];
    assert_eq!(
        cl.get_into("only-bad", &mut buf).await.unwrap_err().code,
        Code::Corrupted
    );
    c.shutdown().await;
}

/// A client bounds what it believes of a master's answer: a size over its
/// `max_object_bytes` is refused before a buffer is made for it, in a
/// single get and per item of a batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_refuses_an_answer_over_its_object_limit() {
    let c = ClusterBuilder::new().store_nodes(1).build().await.unwrap();
    let cl = c.client().await.unwrap();
    cl.put("big", &payload(1, 100), &PutOptions::default())
        .await
        .unwrap();
    cl.put("small", &payload(2, 64), &PutOptions::default())
        .await
        .unwrap();
    let mut cfg = c.client_config();
    cfg.max_object_bytes = 64;
    let bounded = strata_client::Client::connect(cfg).await.unwrap();
    let e = bounded.get("big").await.unwrap_err();
    assert!(e.message.contains("max_object_bytes"), "{e}");
    assert_eq!(bounded.get("small").await.unwrap(), payload(2, 64));
    let got = bounded.batch_get(&["small", "big"]).await.unwrap();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].as_ref().unwrap(), &payload(2, 64));
    assert!(got[1]
        .as_ref()
        .unwrap_err()
        .message
        .contains("max_object_bytes"));
    c.shutdown().await;
}

/// The offload queue's view names its tasks' keys to the admin only; the
/// counts stay open to anyone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_offload_view_names_keys_to_the_admin_only() {
    let c = ClusterBuilder::new()
        .store_nodes(1)
        .ssd_agents(1)
        .master(strata_tests::eager)
        .build()
        .await
        .unwrap();
    strata_tests::pause_offloads(&c).await;
    let cl = c.client().await.unwrap();
    cl.put("secret-key-name", b"queued", &PutOptions::default())
        .await
        .unwrap();
    let admin = c.credentials().admin.as_ref();
    let a = c.master_admin;
    let (st, body) = strata_tests::http_get_as(a, "/api/v1/offload", admin).await;
    assert_eq!(st, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let tasks = v["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 1, "{v}");
    assert_eq!(tasks[0]["key"], "secret-key-name");
    let (st, body) = http_get(a, "/api/v1/offload").await;
    assert_eq!(st, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["tasks"].as_array().map(Vec::len), Some(1), "{v}");
    assert_eq!(
        v["queued"].as_u64().unwrap() + v["assigned"].as_u64().unwrap(),
        1
    );
    assert!(!body.contains("secret-key-name"), "{body}");
    c.shutdown().await;
}

/// The client's ambiguous PutEnd, driven deterministically (failpoints):
/// an answer lost after the master committed makes the retry find the key
/// holding these very bytes (success, one object); a PutEnd lost on its
/// way leaves the put in flight, and the retry still ends with the object
/// stored once; an overwrite whose PutEnd was lost revokes its version, so
/// the retry's version is the one kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ambiguous_put_ends_resolve_to_one_stored_object() {
    let c = ClusterBuilder::new().store_nodes(1).build().await.unwrap();
    let cl = c.client().await.unwrap();
    fail::cfg("client::put-end-answer-lost", "1*return").unwrap();
    cl.put("answer-lost", &payload(1, 10_000), &PutOptions::default())
        .await
        .unwrap();
    assert_eq!(cl.get("answer-lost").await.unwrap(), payload(1, 10_000));
    fail::cfg("client::put-end-unsent", "1*return").unwrap();
    cl.put("unsent", &payload(2, 10_000), &PutOptions::default())
        .await
        .unwrap();
    assert_eq!(cl.get("unsent").await.unwrap(), payload(2, 10_000));
    let over = PutOptions {
        overwrite: true,
        ..Default::default()
    };
    fail::cfg("client::put-end-unsent", "1*return").unwrap();
    cl.put("unsent", &payload(3, 10_000), &over).await.unwrap();
    assert_eq!(cl.get("unsent").await.unwrap(), payload(3, 10_000));
    fail::cfg("client::put-end-answer-lost", "1*return").unwrap();
    cl.put("unsent", &payload(4, 20_000), &over).await.unwrap();
    assert_eq!(cl.get("unsent").await.unwrap(), payload(4, 20_000));
    fail::remove("client::put-end-unsent");
    fail::remove("client::put-end-answer-lost");
    // Two objects, nothing left in flight.
    let listed = cl.list("", 10).await.unwrap();
    assert_eq!(listed.len(), 2, "{listed:?}");
    c.shutdown().await;
}

/// A PutStart whose answer was lost after the master started the put (a
/// leadership that lapsed while the call ran answers so; found by the HA
/// nemesis) is sent again and gets its own put back: the put succeeds at
/// once, not AlreadyExists from its own first attempt nor a wait for
/// --put-timeout; the same for an overwrite.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_start_whose_answer_was_lost_resumes_its_own_put() {
    let c = ClusterBuilder::new().store_nodes(1).build().await.unwrap();
    let cl = c.client().await.unwrap();
    let t0 = std::time::Instant::now();
    fail::cfg("client::put-start-answer-lost", "1*return").unwrap();
    cl.put("lost-start", &payload(5, 10_000), &PutOptions::default())
        .await
        .unwrap();
    assert_eq!(cl.get("lost-start").await.unwrap(), payload(5, 10_000));
    let over = PutOptions {
        overwrite: true,
        ..Default::default()
    };
    fail::cfg("client::put-start-answer-lost", "1*return").unwrap();
    cl.put("lost-start", &payload(6, 10_000), &over)
        .await
        .unwrap();
    assert_eq!(cl.get("lost-start").await.unwrap(), payload(6, 10_000));
    fail::remove("client::put-start-answer-lost");
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(10),
        "{:?}",
        t0.elapsed()
    );
    let listed = cl.list("", 10).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    c.shutdown().await;
}

/// A read whose grants a leader deposed since had signed (the nodes took
/// the new term's key meanwhile, so they refuse the signature) asks the
/// master again instead of failing with a final PermissionDenied: the HA
/// nemesis saw such reads fail across a failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_with_grants_a_deposed_leader_signed_asks_again() {
    let c = ClusterBuilder::new().store_nodes(2).build().await.unwrap();
    let cl = c.client().await.unwrap();
    let data = payload(9, 20_000);
    let two = PutOptions {
        replicas: 2,
        ..Default::default()
    };
    cl.put("stale-grant", &data, &two).await.unwrap();
    cl.put("stale-grant-2", &data, &two).await.unwrap();
    fail::cfg("client::grants-from-deposed-leader", "1*return").unwrap();
    let got = cl.get("stale-grant").await;
    fail::remove("client::grants-from-deposed-leader");
    assert_eq!(got.unwrap(), data);
    // Both answers refused (a key not in the location cache): the error
    // says to retry, not "forbidden".
    fail::cfg("client::grants-from-deposed-leader", "2*return").unwrap();
    let err = cl.get("stale-grant-2").await.unwrap_err();
    fail::remove("client::grants-from-deposed-leader");
    assert_eq!(err.code, Code::PermissionDenied, "{err}");
    assert!(err.retryable(), "{err}");
    assert_eq!(cl.get("stale-grant-2").await.unwrap(), data);
    c.shutdown().await;
}

/// A batch put whose BatchPutEnd was lost on its way sends those PutEnds
/// again instead of starting over (which found each key "still being
/// written" by this very batch until the retries gave up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_put_whose_put_end_was_lost_ends_its_puts() {
    let c = ClusterBuilder::new().store_nodes(1).build().await.unwrap();
    let cl = c.client().await.unwrap();
    let keys: Vec<String> = (0..8).map(|i| format!("b{i}")).collect();
    let data: Vec<Vec<u8>> = (0..8).map(|i| payload(i, 5000 + i as usize)).collect();
    let items: Vec<(&str, &[u8])> = keys
        .iter()
        .zip(&data)
        .map(|(k, d)| (k.as_str(), d.as_slice()))
        .collect();
    fail::cfg("client::batch-put-end-unsent", "1*return").unwrap();
    let r = cl.batch_put(&items, &PutOptions::default()).await.unwrap();
    fail::remove("client::batch-put-end-unsent");
    assert_eq!(r.len(), 8);
    for (k, r) in keys.iter().zip(r) {
        r.unwrap_or_else(|e| panic!("{k}: {e}"));
    }
    for (k, d) in keys.iter().zip(&data) {
        assert_eq!(&cl.get(k).await.unwrap(), d, "{k}");
    }
    // Overwrites whose BatchPutEnd was lost revoke that version and start
    // a new one: the new bytes are what is stored.
    let newer: Vec<Vec<u8>> = (0..8).map(|i| payload(100 + i, 3000)).collect();
    let items: Vec<(&str, &[u8])> = keys
        .iter()
        .zip(&newer)
        .map(|(k, d)| (k.as_str(), d.as_slice()))
        .collect();
    let over = PutOptions {
        overwrite: true,
        ..Default::default()
    };
    fail::cfg("client::batch-put-end-unsent", "1*return").unwrap();
    let r = cl.batch_put(&items, &over).await.unwrap();
    fail::remove("client::batch-put-end-unsent");
    assert_eq!(r.len(), 8);
    for (k, r) in keys.iter().zip(r) {
        r.unwrap_or_else(|e| panic!("{k}: {e}"));
    }
    for (k, d) in keys.iter().zip(&newer) {
        assert_eq!(&cl.get(k).await.unwrap(), d, "{k}");
    }
    c.shutdown().await;
}
