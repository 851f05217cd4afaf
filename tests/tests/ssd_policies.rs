//! SSD admission policies and removals, end to end: each policy queues
//! exactly what it promises, and removing a key removes its SSD copy for good.

use std::time::Duration;
use strata_client::{Client, PutOptions};
use strata_master::config::OffloadPolicy;
use strata_proto as pb;
use strata_tests::{
    drained, eager, evict_memory, in_dram, payload, wait_until, ClusterBuilder, LocalCluster,
};

async fn on_ssd(c: &LocalCluster, key: &str) -> bool {
    c.master.inspect(key).is_ok_and(|i| {
        i.replicas
            .iter()
            .any(|r| r.kind == pb::ReplicaKind::Ssd as i32)
    })
}

async fn put_all(cl: &Client, keys: &[String], size: usize) {
    for (i, k) in keys.iter().enumerate() {
        cl.put(k, &payload(i as u64, size), &PutOptions::default())
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_n_offloads_only_objects_read_n_times() {
    let c = ClusterBuilder::new()
        .store_nodes(1)
        .ssd_agents(1)
        .master(|m| m.offload_policy = OffloadPolicy::Reads(2))
        .build()
        .await
        .unwrap();
    let cl = c.client().await.unwrap();
    let keys: Vec<String> = (0..4).map(|i| format!("r-{i}")).collect();
    put_all(&cl, &keys, 4096).await;
    // Read r-0 twice, r-1 once; the others never.
    for k in [&keys[0], &keys[0], &keys[1]] {
        cl.get(k).await.unwrap();
    }
    let mut persisted = false;
    for _ in 0..200 {
        if on_ssd(&c, &keys[0]).await {
            persisted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(persisted, "read twice: offloaded");
    // Nothing else is queued or in flight: the rest were never admitted.
    assert!(wait_until(Duration::from_secs(10), || drained(&c)).await);
    for k in &keys[1..] {
        assert!(!on_ssd(&c, k).await, "{k} was not read twice");
    }
    assert_eq!(c.agents[0].store.stats().objects, 1);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_evict_moves_dram_victims_to_ssd_and_loses_nothing() {
    let size = 256 << 10;
    let c = ClusterBuilder::new()
        .store_nodes(1)
        .node_capacity(4 << 20)
        .ssd_agents(1)
        .master(|m| {
            m.offload_policy = OffloadPolicy::OnEvict;
            m.high_watermark = 0.5;
            m.eviction_ratio = 0.1;
        })
        .build()
        .await
        .unwrap();
    let cl = c.client().await.unwrap();
    let keys: Vec<String> = (0..12).map(|i| format!("v-{i}")).collect();
    put_all(&cl, &keys, size).await;
    let mut moved = 0;
    for _ in 0..200 {
        moved = 0;
        for k in &keys {
            if on_ssd(&c, k).await && !in_dram(&c, k) {
                moved += 1;
            }
        }
        if moved >= 4 && c.master.allocated_bytes() <= 2 << 20 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(moved >= 4, "victims went to SSD: {moved}");
    assert!(
        c.master.allocated_bytes() <= 2 << 20,
        "DRAM back under the watermark"
    );
    assert!(on_ssd(&c, &keys[0]).await, "the oldest went first");
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(cl.get(k).await.unwrap(), payload(i as u64, size), "{k}");
    }
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_a_key_removes_its_ssd_copy_even_across_an_agent_restart() {
    let mut c = ClusterBuilder::new()
        .master(eager)
        .store_nodes(1)
        .ssd_agents(1)
        .ssd(|a| a.sparse_below = 0.6)
        .build()
        .await
        .unwrap();
    let cl = c.client().await.unwrap();
    let keys: Vec<String> = (0..4).map(|i| format!("rm-{i}")).collect();
    cl.batch_put(
        &keys
            .iter()
            .enumerate()
            .map(|(i, k)| (k.as_str(), payload(i as u64, 4096)))
            .collect::<Vec<_>>()
            .iter()
            .map(|(k, v)| (*k, v.as_slice()))
            .collect::<Vec<_>>(),
        &PutOptions::default(),
    )
    .await
    .unwrap();
    let store = c.agents[0].store.clone();
    assert!(wait_until(Duration::from_secs(10), || store.stats().objects == 4).await);
    assert_eq!(store.stats().buckets, 1);
    cl.remove(&keys[0], false).await.unwrap();
    assert!(wait_until(Duration::from_secs(10), || store.stats().objects == 3).await);
    assert_eq!(
        store.stats().buckets,
        1,
        "3 of 4 still live: the bucket stays"
    );
    // After a restart the removed key does not come back from the inventory.
    drop(store); // holds the index open
    c.restart_agent(0).await.unwrap();
    let store = c.agents[0].store.clone();
    assert_eq!(store.stats().objects, 3);
    assert!(!c.master.exists(&keys[0]).unwrap());
    // Below 60% live the bucket is dropped whole; the master forgets the
    // remaining copies first, and the keys live on in DRAM.
    cl.remove(&keys[1], false).await.unwrap();
    assert!(wait_until(Duration::from_secs(10), || store.stats().buckets == 0).await);
    for (i, k) in keys.iter().enumerate().skip(2) {
        assert!(!on_ssd(&c, k).await);
        assert_eq!(cl.get(k).await.unwrap(), payload(i as u64, 4096));
    }
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ssd_hit_is_promoted_back_to_dram_without_waiting_for_it() {
    let c = ClusterBuilder::new()
        .store_nodes(1)
        .ssd_agents(1)
        .master(eager)
        .master(|m| {
            m.promote_on_hit = true;
            m.promote_queue = 4;
        })
        .build()
        .await
        .unwrap();
    let cl = c.client().await.unwrap();
    let keys: Vec<String> = (0..12).map(|i| format!("p-{i}")).collect();
    put_all(&cl, &keys, 64 << 10).await;
    let store = c.agents[0].store.clone();
    assert!(wait_until(Duration::from_secs(10), || store.stats().objects == 12).await);
    evict_memory(&cl, &keys).await;
    // Twelve SSD hits at once: each read is served from SSD at once; at most
    // four promotions queue, the rest are skipped (the queue is bounded).
    let got = cl
        .batch_get(&keys.iter().map(|k| k.as_str()).collect::<Vec<_>>())
        .await
        .unwrap();
    for (i, g) in got.iter().enumerate() {
        assert_eq!(g.as_ref().unwrap(), &payload(i as u64, 64 << 10));
    }
    let mut promoted = Vec::new();
    for _ in 0..200 {
        promoted.clear();
        for k in &keys {
            if in_dram(&c, k) {
                promoted.push(k.clone());
            }
        }
        if promoted.len() >= 4 && c.master.promotion_counts() == (0, 0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    // (An agent heartbeat may drain the queue mid-batch, so "four" is a floor.)
    assert!(
        (4..12).contains(&promoted.len()),
        "the bounded queue promoted some, not all: {promoted:?}"
    );
    assert!(
        c.master
            .metrics
            .promotions
            .with_label_values(&["queue_full"])
            .get()
            >= 1
    );
    for k in &promoted {
        assert!(on_ssd(&c, k).await, "{k} keeps its SSD copy");
        let i: u64 = k.trim_start_matches("p-").parse().unwrap();
        assert_eq!(cl.get(k).await.unwrap(), payload(i, 64 << 10));
    }
    // Promoted ranges are real DRAM replicas the store node knows about
    // (its records come with the object log on its next heartbeat), and no
    // promotion left a pin behind.
    let mut want = promoted.clone();
    want.sort();
    let node = c.nodes[0].records.clone();
    assert!(
        wait_until(Duration::from_secs(5), || {
            node.snapshot()
                .iter()
                .map(|o| o.key.clone())
                .collect::<Vec<_>>()
                == want
        })
        .await,
        "node records {:?}, promoted {want:?}",
        node.snapshot().iter().map(|o| &o.key).collect::<Vec<_>>()
    );
    assert_eq!(c.master.total_pins(), 0);
    c.shutdown().await;
}

/// Reads `keys` in order as an engine would (a miss is recomputed and put);
/// returns the lookups served from SSD.
async fn read_through(cl: &Client, keys: &[String], size: usize) -> u64 {
    let tiers = read_tiers(cl, keys, size).await;
    tiers
        .iter()
        .filter(|t| **t == Some(strata_client::Tier::Ssd))
        .count() as u64
}

/// `read_through`, returning where each key's read was served from (None:
/// a miss, recomputed and put).
async fn read_tiers(cl: &Client, keys: &[String], size: usize) -> Vec<Option<strata_client::Tier>> {
    let mut tiers = Vec::with_capacity(keys.len());
    for (i, k) in keys.iter().enumerate() {
        match cl.batch_get_tiered(&[k.as_str()]).await.unwrap().remove(0) {
            Ok((v, tier)) => {
                assert_eq!(v, payload(i as u64 % 300, size), "{k}");
                tiers.push(Some(tier));
            }
            Err(_) => {
                cl.put(k, &payload(i as u64 % 300, size), &PutOptions::default())
                    .await
                    .unwrap();
                tiers.push(None);
            }
        }
    }
    tiers
}

/// A loop over 3x the SSD (10x DRAM) under `on-evict`: with
/// `--ssd-admission auto` the master notices that admitting every victim
/// serves nothing, switches to keeping what the SSD holds, and the SSD then
/// serves a fixed share of each pass; with `all` every victim is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loop_larger_than_the_tiers_makes_the_ssd_keep_what_it_holds() {
    use strata_master::config::SsdAdmission;
    let (size, dram, ssd) = (16usize << 10, 30u64, 100u64);
    for admission in [SsdAdmission::Auto, SsdAdmission::All] {
        let bucket = 10 * (size as u64 + 96) + 4096;
        let ssd_bytes = ssd * (size as u64 + 96) + bucket;
        let c = ClusterBuilder::new()
            .store_nodes(1)
            .node_capacity(dram * size as u64)
            .ssd_agents(1)
            .ssd_capacity(ssd_bytes)
            .ssd(move |a| {
                a.bucket_bytes = bucket;
                a.bucket_keys = 10;
                a.high_watermark = 1.0;
                a.low_watermark = 1.0 - bucket as f64 / ssd_bytes as f64;
                a.poll_interval = Duration::from_millis(20);
            })
            .master(move |m| {
                m.offload_policy = OffloadPolicy::OnEvict;
                m.ssd_admission = admission;
                m.high_watermark = 0.95;
                m.eviction_ratio = 0.1;
                m.lease_ttl = Duration::from_millis(100);
            })
            .prefault(false)
            .build()
            .await
            .unwrap();
        let cl = c.client().await.unwrap();
        let pass: Vec<String> = (0..300).map(|i| format!("loop/{i}")).collect();
        for _ in 0..3 {
            read_through(&cl, &pass, size).await;
        }
        // What the SSD holds as the last pass starts (no copy in flight),
        // and how each of those keys is then read.
        assert!(wait_until(Duration::from_secs(20), || strata_tests::drained(&c)).await);
        let admitted = || {
            c.master
                .metrics
                .admission
                .decisions
                .with_label_values(&["admitted"])
                .get()
        };
        let admitted_before = admitted();
        let mut held = Vec::new();
        for k in &pass {
            if on_ssd(&c, k).await {
                held.push(k.clone());
            }
        }
        let tiers = read_tiers(&cl, &pass, size).await;
        assert_eq!(tiers.len(), pass.len());
        let served = tiers
            .iter()
            .filter(|t| **t == Some(strata_client::Tier::Ssd))
            .count();
        let admitted = admitted() - admitted_before;
        let held_missed = pass
            .iter()
            .zip(&tiers)
            .filter(|(k, t)| t.is_none() && held.contains(k))
            .count();
        let (_, body) = strata_tests::http_get(c.master_admin, "/metrics").await;
        let mode = strata_tests::metric(&body, "strata_master_ssd_admission_mode");
        let refused = c.master.metrics.admission.refused();
        let (_, body) = strata_tests::http_get(c.master_admin, "/api/v1/offload").await;
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let (enabled, shown) = match admission {
            SsdAdmission::Auto => (true, "keep"),
            SsdAdmission::All => (false, "admit-all"),
        };
        assert_eq!(v["ssd_admission"]["enabled"], enabled, "{body}");
        assert_eq!(v["ssd_admission"]["mode"], shown, "{body}");
        match admission {
            // The mechanism, not a rate (a rate at its edge failed on a
            // busy machine: 79 against a bound of 80). Keeping, what the
            // SSD holds as a pass starts is still there when the pass reads
            // it, but for the buckets the trickle of admissions (one victim
            // in 32) makes the agent evict: at most a bucket (10 keys) per
            // 10 admitted, and one more at the watermark's edge. Admitting
            // all, the victims of the pass push most of it out first. How
            // many the SSD holds is its capacity (100 objects less a
            // bucket's slack), not a timing.
            SsdAdmission::Auto => {
                assert_eq!(mode, 1.0, "switched to keeping");
                assert!(refused > 100, "refused {refused}");
                assert!(held.len() >= 50, "the SSD holds {} of 300", held.len());
                let evictable = 10 * (admitted.div_ceil(10) as usize + 1);
                assert!(
                    held_missed <= evictable,
                    "{held_missed} of {} held keys missed; {admitted} admitted (served {served})",
                    held.len()
                );
            }
            SsdAdmission::All => {
                assert_eq!(mode, 0.0);
                assert_eq!(refused, 0);
                assert!(held.len() >= 50, "the SSD holds {} of 300", held.len());
                assert!(
                    held_missed * 2 > held.len(),
                    "admitting all, {held_missed} of the {} keys held were pushed out first",
                    held.len()
                );
            }
        }
        c.shutdown().await;
    }
}
