//! High availability with real processes: masters elected through a real
//! etcd (Debian's etcd-server), SIGKILLed, SIGTERMed and SIGSTOPped under a
//! put/get load; etcd itself stalled; a single master restarted under load.

use std::time::{Duration, Instant};
use strata_client::{Client, ClientConfig, PutOptions};
use strata_common::testing::{EtcdServer, TestCerts};
use strata_common::Code;
use strata_proto as pb;
use strata_proto::master_client::MasterClient;
use strata_tests::load::Load;
use strata_tests::procs::{start_agent, start_node_admin, wait_leader, Proc, RestartableMaster};
use strata_tests::{http_get, payload};
use strata_transport::Transport;

/// The election TTL of these tests (a dead leader is replaced within it).
const TTL: Duration = Duration::from_secs(3);
const HA_FLAGS: &[&str] = &["--election-ttl", "3s", "--node-ttl", "2s"];
/// Their `--node-ttl`: how long a new leader waits for its members.
const NODE_TTL: Duration = Duration::from_secs(2);

struct Ha {
    etcd: EtcdServer,
    cluster: String,
    masters: Vec<RestartableMaster>,
    procs: Vec<Option<Proc>>,
}

impl Ha {
    async fn start(n: usize, cluster: &str) -> Ha {
        Self::start_with(n, cluster, &[]).await
    }

    async fn start_with(n: usize, cluster: &str, extra: &[&str]) -> Ha {
        let etcd = EtcdServer::start().await;
        let flags: Vec<&str> = HA_FLAGS.iter().chain(extra).copied().collect();
        let masters: Vec<_> = (0..n)
            .map(|_| RestartableMaster::ha(&etcd.endpoint, cluster, &flags))
            .collect();
        let mut procs = Vec::new();
        for m in &masters {
            procs.push(Some(m.start_live().await));
        }
        Ha {
            etcd,
            cluster: cluster.into(),
            masters,
            procs,
        }
    }

    /// Every master's address, comma-separated (a `--master` list).
    fn list(&self) -> String {
        let v: Vec<_> = self.masters.iter().map(|m| m.addr.clone()).collect();
        v.join(",")
    }

    fn etcd_url(&self) -> String {
        format!("etcd://{}/{}", self.etcd.host_port(), self.cluster)
    }

    /// The serving leader among the masters still running.
    async fn leader(&self, within: Duration) -> Option<usize> {
        let live: Vec<(usize, &RestartableMaster)> = self
            .masters
            .iter()
            .enumerate()
            .filter(|(i, _)| self.procs[*i].is_some())
            .collect();
        let refs: Vec<&RestartableMaster> = live.iter().map(|(_, m)| *m).collect();
        wait_leader(&refs, within).await.map(|j| live[j].0)
    }

    fn proc(&self, i: usize) -> &Proc {
        self.procs[i].as_ref().expect("running")
    }
}

/// The client library retries retryable errors through a failover (up to
/// 20 s, well past the pause), so the load sees none at all, single puts,
/// batches and gets alike.
fn assert_no_errors(errors: &[strata_common::Error]) {
    assert!(
        errors.is_empty(),
        "the load saw {} errors: {errors:?}",
        errors.len()
    );
}

/// Three masters, one leader; the leader is SIGKILLed under a put/get load
/// from three clients: a new leader serves within 2× the TTL, every
/// acknowledged put reads back byte-identical (an SSD-only one too), a key
/// removed just before stays removed, and the load saw no error (its
/// clients retried through the failover).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_is_replaced_and_loses_nothing() {
    let mut ha = Ha::start_with(3, "kill", &["--offload-policy", "eager"]).await;
    let leader = ha.leader(Duration::from_secs(30)).await.expect("a leader");
    // Members find the leader through etcd; clients through the list.
    let (_n1, _, _) = start_node_admin(&ha.etcd_url(), "n1", &[]).await;
    let (_n2, _, _) = start_node_admin(&ha.list(), "n2", &[]).await;
    let ssd = tempfile::tempdir().unwrap();
    let (_agent, _) = start_agent(&ha.etcd_url(), "kill/0", ssd.path(), &[], true).await;
    let cl = Client::connect(ClientConfig::new(ha.list())).await.unwrap();
    // An object only the SSD tier holds.
    cl.put("on-ssd", &payload(9, 50_000), &PutOptions::default())
        .await
        .unwrap();
    strata_tests::make_ssd_only(&cl, "on-ssd").await;
    // And one removed just before the kill: its removal was confirmed by
    // the agent, so the new leader does not adopt it from the inventory.
    cl.put("removed", &payload(10, 50_000), &PutOptions::default())
        .await
        .unwrap();
    strata_tests::make_ssd_only(&cl, "removed").await;
    let load = Load::start(&ha.list(), 3, "k").await;
    load.progress(60, Duration::from_secs(30)).await;
    cl.remove("removed", true).await.unwrap();
    let t_kill = Instant::now();
    ha.procs[leader] = None; // SIGKILL
                             // A batch put sent while no master leads completes once one does.
    let during: Vec<(String, Vec<u8>)> = (0..8u64)
        .map(|j| (format!("during-{j}"), payload(100 + j, 10_000)))
        .collect();
    let items: Vec<(&str, &[u8])> = during
        .iter()
        .map(|(k, d)| (k.as_str(), d.as_slice()))
        .collect();
    let r = cl.batch_put(&items, &PutOptions::default()).await.unwrap();
    assert!(r.iter().all(Result::is_ok), "{r:?}");
    let next = ha.leader(TTL * 4).await.expect("a new leader");
    assert_ne!(next, leader);
    load.progress(60, Duration::from_secs(30)).await;
    let stats = load.stop().await;
    // The pause: the longest gap between acknowledged puts from the kill on
    // (so a put the old leader answered as it died does not count).
    let pause = stats.longest_pause_after(t_kill);
    assert!(
        pause < TTL * 2,
        "puts paused {pause:?} after the kill (TTL {TTL:?})"
    );
    assert_no_errors(&stats.errors);
    stats.verify(&cl).await;
    assert!(stats.acked.len() >= 120, "{} puts", stats.acked.len());
    // The agent re-registered with the new leader and re-reported.
    assert!(cl.get("on-ssd").await.unwrap() == payload(9, 50_000));
    assert!(
        !cl.exists("removed").await.unwrap(),
        "a removed key came back"
    );
    for (k, d) in &during {
        assert!(&cl.get(k).await.unwrap() == d, "{k}");
    }
    // The CLI finds the leader through etcd too.
    let out = std::process::Command::new(strata_tests::bin("strata"))
        .args(["--master", &ha.etcd_url(), "stat"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The survivors tell the truth about who leads.
    let v = ha.masters[next].leader_view().await.unwrap();
    assert_eq!(v["is_leader"], true, "{v}");
    let other = (0..3).find(|&i| i != leader && i != next).unwrap();
    let w = ha.masters[other].leader_view().await.unwrap();
    assert_eq!(w["is_leader"], false, "{w}");
    assert_eq!(w["leader"], serde_json::json!(ha.masters[next].addr), "{w}");
    assert!(v["term"].as_u64() > Some(1), "a newer term: {v}");
}

/// A graceful stop resigns: the successor takes over well inside the TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_leader_hands_over_inside_the_ttl() {
    let mut ha = Ha::start(2, "term").await;
    let leader = ha.leader(Duration::from_secs(30)).await.expect("a leader");
    let other = 1 - leader;
    let t0 = Instant::now();
    ha.proc(leader).signal(libc::SIGTERM);
    let t0_ok = loop {
        let v = ha.masters[other].leader_view().await;
        if v.is_some_and(|v| v["is_leader"] == true) {
            break t0.elapsed();
        }
        assert!(t0.elapsed() < TTL * 2, "no takeover");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(t0_ok < TTL * 2 / 3, "takeover took {t0_ok:?} (TTL {TTL:?})");
    let mut p = ha.procs[leader].take().unwrap();
    assert_eq!(p.exit_code(Duration::from_secs(10)).await, Some(0));
}

/// A leader paused (SIGSTOP) past its TTL is replaced; when it wakes up it
/// serves nothing, and a grant it signed before is refused by the node that
/// re-registered with the new leader (fencing by term).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_leader_that_wakes_up_cannot_act() {
    let ha = Ha::start(2, "stop").await;
    let leader = ha.leader(Duration::from_secs(30)).await.expect("a leader");
    let (_n1, _, _) = start_node_admin(&ha.etcd_url(), "n1", &[]).await;
    let old_addr = ha.masters[leader].addr.clone();
    let mut old = MasterClient::new(strata_common::grpc::master_channel(&old_addr, None).unwrap());
    // A grant from the leader, before its pause.
    let stale = old
        .put_start(pb::PutStartRequest {
            key: "stale".into(),
            size: 4096,
            replica_num: 1,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .replicas;
    let range = strata_transport::remote_range(&stale[0]).unwrap();
    // A client that knows only this leader and calls it quickly.
    let early = Client::connect(ClientConfig::new(&old_addr).with_location_cache(0))
        .await
        .unwrap();
    early
        .put("early", &payload(3, 4096), &PutOptions::default())
        .await
        .unwrap();
    assert!(early.get("early").await.unwrap() == payload(3, 4096));
    // (Its first call learns the leader over gRPC.)
    let quick_before = early.quick_calls();
    assert!(
        quick_before >= 2,
        "{quick_before} quick calls to the leader"
    );
    ha.proc(leader).signal(libc::SIGSTOP);
    // The other master, not whichever answers first: right after `kill`
    // returns, the paused one may still answer ready once (seen in a full
    // run on 2 busy cores: the stop reaches its threads asynchronously).
    let next = 1 - leader;
    assert!(
        wait_leader(&[&ha.masters[next]], TTL * 4).await.is_some(),
        "a new leader"
    );
    // A put through the new leader: the node has re-registered with it.
    let cl = Client::connect(ClientConfig::new(ha.list())).await.unwrap();
    cl.put("fresh", &payload(1, 4096), &PutOptions::default())
        .await
        .unwrap();
    let tcp = strata_transport::tcp::TcpTransport::new(Default::default());
    let e = tcp
        .write(&range, 0, &payload(2, 4096))
        .await
        .expect_err("a deposed leader's grant was honoured");
    assert_eq!(e.code, Code::PermissionDenied, "{e}");
    // Refused for its key (derived per term), not only because the range
    // was reused meanwhile.
    assert!(e.message.contains("signature does not verify"), "{e}");
    ha.proc(leader).signal(libc::SIGCONT);
    // Awake, it answers "not leader" (naming the new one) and is not ready.
    let e: strata_common::Error =
        MasterClient::new(strata_common::grpc::master_channel(&old_addr, None).unwrap())
            .put_start(pb::PutStartRequest {
                key: "after-wake".into(),
                size: 4096,
                replica_num: 1,
                ..Default::default()
            })
            .await
            .unwrap_err()
            .into();
    assert_eq!(e.code, Code::NotLeader, "{e}");
    assert!(!ha.masters[leader].is_ready().await);
    assert!(
        ha.masters[next].is_ready().await,
        "the new leader still leads"
    );
    assert!(cl.get("fresh").await.unwrap() == payload(1, 4096));
    assert_eq!(cl.get("stale").await.unwrap_err().code, Code::NotFound);
    // The early client, which knew only the old leader (now a follower),
    // follows the new one: its quick call to the follower is refused
    // before acting and goes over gRPC, which learns the leader the
    // follower names (seen failing with that fallback removed); from then
    // on its calls go quickly to the new leader.
    assert!(early.get("fresh").await.unwrap() == payload(1, 4096));
    let quick_after = early.quick_calls();
    for _ in 0..3 {
        assert!(early.get("early").await.unwrap() == payload(3, 4096));
    }
    assert_eq!(
        early.quick_calls(),
        quick_after + 3,
        "every later lookup went quickly to the new leader"
    );
}

/// Members given both masters (two store nodes, an SSD agent) heartbeat
/// the leader when it is paused (SIGSTOP), and it stays paused: they find
/// its successor within the successor's rebuild bound (`--node-ttl`) and
/// report what they hold, so no acknowledged key (in DRAM or only on SSD)
/// reads as missing, then or later. Seen failing without a heartbeat
/// deadline (`leader::heartbeat_deadline`) in the store node's agent, and
/// in the SSD agent's: the members waited on the paused leader for seconds
/// (a quick call's silence, then gRPC's keep-alive), the successor gave up
/// on them and answered their keys NotFound (the HA nemesis's seed
/// 5258620981834010071 found it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_of_a_paused_leader_report_to_its_successor_in_time() {
    let ha = Ha::start_with(2, "paused-members", &["--offload-policy", "eager"]).await;
    let leader = ha.leader(Duration::from_secs(30)).await.expect("a leader");
    let (_n1, _, _) = start_node_admin(&ha.list(), "n1", &[]).await;
    let (_n2, _, _) = start_node_admin(&ha.list(), "n2", &[]).await;
    let ssd = tempfile::tempdir().unwrap();
    let (_agent, _) = start_agent(&ha.list(), "paused/0", ssd.path(), &[], true).await;
    let cl = Client::connect(ClientConfig::new(ha.list()).with_location_cache(0))
        .await
        .unwrap();
    let two = PutOptions {
        replicas: 2,
        ..Default::default()
    };
    let mut keys: Vec<String> = (0..16).map(|i| format!("k{i}")).collect();
    for (i, k) in keys.iter().enumerate() {
        cl.put(k, &payload(i as u64, 4096), &two).await.unwrap();
    }
    // And one only the SSD tier holds.
    keys.push("on-ssd".into());
    let on_ssd = payload(keys.len() as u64 - 1, 4096);
    cl.put("on-ssd", &on_ssd, &PutOptions::default())
        .await
        .unwrap();
    strata_tests::make_ssd_only(&cl, "on-ssd").await;
    ha.proc(leader).signal(libc::SIGSTOP);
    let next = 1 - leader;
    // It leads, then is ready once every member reported (or once it gave
    // up on them, after --node-ttl: not so here).
    let t0 = Instant::now();
    let leads = loop {
        let v = ha.masters[next].leader_view().await;
        if v.is_some_and(|v| v["is_leader"] == true) {
            break Instant::now();
        }
        assert!(t0.elapsed() < TTL * 4, "no new leader");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(
        wait_leader(&[&ha.masters[next]], TTL * 4).await.is_some(),
        "a new leader"
    );
    let waited = leads.elapsed();
    assert!(
        waited < NODE_TTL,
        "the successor waited {waited:?} for its members: it gave up on them"
    );
    // Right away (through the successor alone: this client waits on no
    // paused master), and past the successor's report window (twice
    // --node-ttl), while the old leader stays paused: every read finds
    // every key.
    let succ = Client::connect(ClientConfig::new(&ha.masters[next].addr).with_location_cache(0))
        .await
        .unwrap();
    let until = Instant::now() + Duration::from_secs(5);
    let mut rounds = 0;
    while Instant::now() < until {
        for (i, k) in keys.iter().enumerate() {
            match succ.get(k).await {
                Ok(v) => assert!(v == payload(i as u64, 4096), "{k} read wrong bytes"),
                Err(e) => panic!("{k}, round {rounds}: {e}"),
            }
        }
        rounds += 1;
    }
    assert!(rounds >= 2, "only {rounds} rounds of reads");
    // The client that put them knows the paused leader: its first lookup
    // waits out that master's silence (3 s), then moves on; it does not
    // wait on it again over gRPC (gRPC's keep-alive: 3 s more).
    let t = Instant::now();
    assert!(cl.get("k0").await.unwrap() == payload(0, 4096));
    let took = t.elapsed();
    assert!(took < Duration::from_millis(4500), "the read took {took:?}");
    ha.proc(leader).signal(libc::SIGCONT);
}

/// etcd stalls (SIGSTOP) past the TTL: the leader stops serving; once etcd
/// is back the cluster recovers on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_etcd_stops_the_leader_and_the_cluster_recovers() {
    let ha = Ha::start(2, "stall").await;
    ha.leader(Duration::from_secs(30)).await.expect("a leader");
    let (_n1, _, _) = start_node_admin(&ha.list(), "n1", &[]).await;
    let cl = Client::connect(ClientConfig::new(ha.list())).await.unwrap();
    cl.put("before", &payload(1, 8192), &PutOptions::default())
        .await
        .unwrap();
    ha.etcd.signal("-STOP");
    let t0 = Instant::now();
    // Within the TTL nobody serves: the leader's keep-alive failed.
    loop {
        let mut any = false;
        for m in &ha.masters {
            any |= m.is_ready().await;
        }
        if !any {
            break;
        }
        assert!(
            t0.elapsed() < TTL,
            "a master kept serving with etcd stalled"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Past the TTL, then etcd is back.
    while t0.elapsed() < TTL + Duration::from_secs(1) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ha.etcd.signal("-CONT");
    ha.leader(Duration::from_secs(30))
        .await
        .expect("a leader again without manual action");
    cl.put("after", &payload(2, 8192), &PutOptions::default())
        .await
        .unwrap();
    assert!(cl.get("before").await.unwrap() == payload(1, 8192));
    assert!(cl.get("after").await.unwrap() == payload(2, 8192));
}

/// Two agents with one new handle register through two masters while they
/// elect a leader: one owner id for the handle, one agent owns it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_agents_racing_for_one_handle_get_one_owner_id() {
    let etcd = EtcdServer::start().await;
    let ms: Vec<_> = (0..2)
        .map(|_| RestartableMaster::ha(&etcd.endpoint, "race", HA_FLAGS))
        .collect();
    let _p: Vec<Proc> = vec![ms[0].start_live().await, ms[1].start_live().await];
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (mut a1, h1) = start_agent(&ms[0].addr, "race/0", d1.path(), &[], false).await;
    let (mut a2, h2) = start_agent(&ms[1].addr, "race/0", d2.path(), &[], false).await;
    let refs: Vec<&RestartableMaster> = ms.iter().collect();
    let l = wait_leader(&refs, Duration::from_secs(30))
        .await
        .expect("a leader");
    // One of them owns the handle; the other is refused (a live owner).
    let t0 = Instant::now();
    let owners = loop {
        let (_, body) = http_get(ms[l].admin, "/api/v1/owners").await;
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let owners: Vec<serde_json::Value> = v["owners"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|o| o["handle"] == "race/0")
            .cloned()
            .collect();
        if owners.iter().any(|o| o["live"] == true) {
            break owners;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no owner registered: {v}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(owners.len(), 1, "{owners:?}");
    let id = owners[0]["owner_id"].as_u64().unwrap();
    let kv = strata_common::leader::etcd_client(std::slice::from_ref(&etcd.endpoint))
        .await
        .unwrap();
    let r = kv
        .kv_client()
        .get("/strata/race/kv/owners/handle/race/0", None)
        .await
        .unwrap();
    assert_eq!(r.kvs()[0].value_str().unwrap(), id.to_string());
    // In the end exactly one agent serves and the other has exited: refused
    // at registration (a live owner answered its ping) or, if it took the
    // handle over from one not serving yet, the fenced one exits at its next
    // heartbeat (its epoch is stale; its grant key was never the new one).
    let ready = |a: std::net::SocketAddr| async move {
        reqwest::get(format!("http://{a}/ready"))
            .await
            .is_ok_and(|r| r.status().is_success())
    };
    let t0 = Instant::now();
    loop {
        let (r1, r2) = (ready(h1).await, ready(h2).await);
        let (x1, x2) = (
            a1.0.try_wait().unwrap().is_some(),
            a2.0.try_wait().unwrap().is_some(),
        );
        if (r1 && x2) || (r2 && x1) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "ready {r1} {r2}, exited {x1} {x2}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The single master (with `--state-dir`) SIGKILLed and restarted under a
/// put/get load: every acknowledged object, in DRAM and on SSD, reads back
/// byte-identical, an SSD-only object is still served, and a key removed
/// right before the crash stays removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_master_restart_under_load_keeps_every_acknowledged_object() {
    let state = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let m = RestartableMaster::new(
        state.path(),
        &["--node-ttl", "2s", "--offload-policy", "eager"],
    );
    let master = m.start().await;
    let (_node, _, _) = start_node_admin(&m.addr, "n1", &["--capacity", "32MiB"]).await;
    let (_agent, _) = start_agent(&m.addr, "h/0", dir.path(), &[], true).await;
    let cl = Client::connect(ClientConfig::new(&m.addr)).await.unwrap();
    cl.put("ssd-only", &payload(7, 100_000), &PutOptions::default())
        .await
        .unwrap();
    strata_tests::make_ssd_only(&cl, "ssd-only").await;
    let load = Load::start(&m.addr, 3, "r").await;
    load.progress(60, Duration::from_secs(30)).await;
    // A removal acknowledged just before the crash stays removed: its node
    // confirmed the free, so the rebuild does not bring it back.
    cl.put("gone", &payload(8, 50_000), &PutOptions::default())
        .await
        .unwrap();
    cl.remove("gone", true).await.unwrap();
    drop(master); // SIGKILL
    let _master = m.start().await;
    load.progress(60, Duration::from_secs(30)).await;
    let stats = load.stop().await;
    assert_no_errors(&stats.errors);
    stats.verify(&cl).await;
    assert!(cl.get("ssd-only").await.unwrap() == payload(7, 100_000));
    assert!(!cl.exists("gone").await.unwrap(), "a removed key came back");
    let (_, body) = http_get(m.admin, "/api/v1/keys/ssd-only").await;
    assert!(!body.contains("\"memory\""), "served from SSD: {body}");
}

/// A client's pooled quick connections die with the master: after a
/// SIGKILL and a restart on the same port, none of its calls is spent on a
/// connection the old process held (each would have fallen back to gRPC).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_calls_go_quickly_again_after_a_master_restart() {
    let state = tempfile::tempdir().unwrap();
    let m = RestartableMaster::new(state.path(), &["--node-ttl", "2s"]);
    let master = m.start().await;
    let (_node, _, _) = start_node_admin(&m.addr, "n1", &["--capacity", "32MiB"]).await;
    let cl = Client::connect(ClientConfig::new(&m.addr).with_location_cache(0))
        .await
        .unwrap();
    cl.put("k", &payload(1, 10_000), &PutOptions::default())
        .await
        .unwrap();
    for _ in 0..3 {
        assert_eq!(cl.get("k").await.unwrap(), payload(1, 10_000));
    }
    assert!(cl.quick_calls() >= 3, "{} quick calls", cl.quick_calls());
    drop(master); // SIGKILL
    let _master = m.start().await;
    // Another client waits until the restarted master serves the key.
    let probe = Client::connect(ClientConfig::new(&m.addr).with_location_cache(0))
        .await
        .unwrap();
    let t0 = Instant::now();
    while probe.get("k").await.is_err() {
        assert!(t0.elapsed() < Duration::from_secs(30), "never served again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The client's own gRPC channel (its lease ends go there) finds the
    // new process first, so the count below is of quick calls alone.
    let t0 = Instant::now();
    while cl.stat().await.is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "never reached again"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before = cl.quick_calls();
    for _ in 0..5 {
        assert_eq!(cl.get("k").await.unwrap(), payload(1, 10_000));
    }
    assert_eq!(cl.quick_calls() - before, 5, "every lookup went quickly");
}

/// etcd with authentication on: a master given `--etcd-user` and
/// `--etcd-password-file` leads and serves, and a CLI that finds it through
/// `etcd://…` does so with `STRATA_ETCD_USER` / `STRATA_ETCD_PASSWORD_FILE`;
/// without them etcd refuses it, and the CLI says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn masters_and_clients_authenticate_to_an_etcd_with_auth_on() {
    let etcd = EtcdServer::start().await;
    let ep = std::slice::from_ref(&etcd.endpoint);
    let password = "0123456789abcdef0123456789abcdef";
    let mut auth = strata_common::leader::etcd_client(ep)
        .await
        .unwrap()
        .auth_client();
    auth.user_add("root", password, None).await.unwrap();
    auth.user_grant_role("root", "root").await.unwrap();
    auth.auth_enable().await.unwrap();
    let anon = strata_common::leader::etcd_client(ep).await.unwrap();
    assert!(
        anon.kv_client().get("x", None).await.is_err(),
        "etcd refuses strangers"
    );
    let dir = tempfile::tempdir().unwrap();
    let pw = dir.path().join("etcd.password");
    std::fs::write(&pw, format!("{password}\n")).unwrap();
    let pw_arg = pw.to_str().unwrap();
    let flags: Vec<&str> = HA_FLAGS
        .iter()
        .copied()
        .chain(["--etcd-user", "root", "--etcd-password-file", pw_arg])
        .collect();
    let m = RestartableMaster::ha(&etcd.endpoint, "authed", &flags);
    let _p = m.start().await; // ready: it leads
    let url = format!("etcd://{}/authed", etcd.host_port());
    let cli = |with_auth: bool| {
        let mut c = std::process::Command::new(strata_tests::bin("strata"));
        c.args(["--master", &url, "stat"])
            .env_remove("STRATA_ETCD_USER")
            .env_remove("STRATA_ETCD_PASSWORD_FILE");
        if with_auth {
            c.env("STRATA_ETCD_USER", "root")
                .env("STRATA_ETCD_PASSWORD_FILE", &pw);
        }
        c
    };
    let run =
        |mut c: std::process::Command| tokio::task::spawn_blocking(move || c.output().unwrap());
    let ok = tokio::time::timeout(Duration::from_secs(60), run(cli(true)))
        .await
        .unwrap()
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let refused = tokio::time::timeout(Duration::from_secs(60), run(cli(false)))
        .await
        .unwrap()
        .unwrap();
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("etcd"), "{err}");
}

/// etcd serving TLS only and checking client certificates: a master given
/// the CA and its certificate leads; a CLI finding it through `etcd://`
/// with the same settings in its environment reads the leader, and without
/// them, or trusting another CA, is refused with an error naming etcd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn masters_and_clients_reach_an_etcd_over_tls() {
    let certs = TestCerts::new("strata");
    let etcd = EtcdServer::start_tls(&certs).await;
    assert!(etcd.endpoint.starts_with("https://"), "{}", etcd.endpoint);
    let plain = strata_common::leader::etcd_client(&[etcd.host_port().to_string()]).await;
    let plain_read = match plain {
        Ok(c) => c.kv_client().get("x", None).await.is_ok(),
        Err(_) => false,
    };
    assert!(!plain_read, "etcd answers plain http");
    let file = |n: &str| certs.file(n).to_str().unwrap().to_string();
    let (ca, cert, key) = (file("ca.pem"), file("client.pem"), file("client.key"));
    let tls_flags = [
        "--etcd-ca-file",
        &ca,
        "--etcd-cert-file",
        &cert,
        "--etcd-key-file",
        &key,
    ];
    let flags: Vec<&str> = HA_FLAGS.iter().copied().chain(tls_flags).collect();
    // A bare HOST:PORT: https:// follows from the CA.
    let m = RestartableMaster::ha(etcd.host_port(), "tls", &flags);
    let _p = m.start().await; // ready: it leads
    let url = format!("etcd://{}/tls", etcd.host_port());
    let other = TestCerts::new("other");
    let other_ca = other.file("ca.pem");
    let cli = |ca: Option<&std::path::Path>| {
        let mut c = std::process::Command::new(strata_tests::bin("strata"));
        c.args(["--master", &url, "stat", "--json"]);
        for v in [
            "STRATA_ETCD_CA_FILE",
            "STRATA_ETCD_CERT_FILE",
            "STRATA_ETCD_KEY_FILE",
        ] {
            c.env_remove(v);
        }
        if let Some(ca) = ca {
            c.env("STRATA_ETCD_CA_FILE", ca)
                .env("STRATA_ETCD_CERT_FILE", certs.file("client.pem"))
                .env("STRATA_ETCD_KEY_FILE", certs.file("client.key"));
        }
        c
    };
    let run = |mut c: std::process::Command| async move {
        tokio::time::timeout(
            Duration::from_secs(60),
            tokio::task::spawn_blocking(move || c.output().unwrap()),
        )
        .await
        .unwrap()
        .unwrap()
    };
    let ok = run(cli(Some(&certs.file("ca.pem")))).await;
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(
        String::from_utf8_lossy(&ok.stdout).contains("\"nodes\""),
        "{ok:?}"
    );
    for (ca, why) in [(None, "no TLS"), (Some(other_ca.as_path()), "another CA")] {
        let refused = run(cli(ca)).await;
        assert!(!refused.status.success(), "{why}: accepted");
        let err = String::from_utf8_lossy(&refused.stderr);
        assert!(err.contains("etcd"), "{why}: {err}");
    }
}
