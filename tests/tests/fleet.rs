//! Every service on a host of its own (network namespaces, `strata_tests::
//! fleet`), and the faults real clusters see: partitions between hosts.

use std::time::{Duration, Instant};
use strata_chaos::procs::ready;
use strata_client::{Client, ClientConfig, Code, PutOptions};
use strata_common::auth::Secret;
use strata_tests::fleet::Fleet;
use strata_tests::payload;
use strata_tests::procs::{token_files, wait_ready, Proc, TokenFiles};

const MASTER: usize = 0;
const CLIENT: usize = 3;

/// Hosts 0 (master), 1 and 2 (store nodes `node-1`, `node-2`), 3 (the
/// test's client); the master drops a silent node after `ttl`.
fn cluster(f: &Fleet, t: &TokenFiles, ttl: &str) -> Vec<Proc> {
    let master = f.host(MASTER).at(7000);
    let mut procs = vec![f.spawn_master(MASTER, t, &["--node-ttl", ttl]).unwrap()];
    for h in [1, 2] {
        procs.push(
            f.spawn_node(h, &master, &format!("node-{h}"), t, &[])
                .unwrap(),
        );
    }
    procs
}

/// Each read is the key's bytes or an error, never other bytes.
async fn read_checked(cl: &Client, key: &str, want: &[u8]) -> Result<(), Code> {
    match cl.get(key).await {
        Ok(b) => {
            assert!(b == want, "{key}: wrong bytes served ({} bytes)", b.len());
            Ok(())
        }
        Err(e) => Err(e.code),
    }
}

#[test]
fn hosts_reach_each_other_until_partitioned_and_again_once_healed() {
    let f = Fleet::new(3);
    assert_eq!(f.hosts.len(), 3);
    let server = f.runtime(1).unwrap();
    let client = f.runtime(2).unwrap();
    let addr = f.host(1).at(7000);
    let listener = server
        .block_on(tokio::net::TcpListener::bind(&addr))
        .expect("bind on the host's own address");
    server.spawn(async move { while let Ok((_s, _)) = listener.accept().await {} });
    let connect = |addr: String| {
        client.block_on(async move {
            tokio::time::timeout(
                Duration::from_millis(500),
                tokio::net::TcpStream::connect(addr),
            )
            .await
            .is_ok_and(|r| r.is_ok())
        })
    };
    assert!(connect(addr.clone()), "host 2 reaches host 1");
    f.partition(1, 2).unwrap();
    assert!(
        !connect(addr.clone()),
        "a partition cuts host 2 from host 1"
    );
    f.heal().unwrap();
    assert!(connect(addr.clone()), "healed");
    f.isolate(1).unwrap();
    assert!(
        !connect(addr.clone()),
        "an isolated host is reached by no one"
    );
    f.heal().unwrap();
    assert!(connect(addr), "healed again");
}

/// A store node that clients reach but the master does not, past
/// `--node-ttl`, then healed: no read returns wrong bytes meanwhile; the
/// node's objects are dropped cleanly (NotFound) and stay dropped or come
/// back whole; a key removed meanwhile stays removed; the cluster serves
/// both nodes again with no manual step.
#[test]
fn a_node_cut_off_from_the_master_past_its_ttl_serves_no_wrong_bytes() {
    let f = Fleet::new(4);
    let dir = tempfile::tempdir().unwrap();
    let tokens = token_files(dir.path());
    let _procs = cluster(&f, &tokens, "2s");
    let rt = f.runtime(CLIENT).unwrap();
    rt.block_on(async {
        wait_ready(f.host(MASTER).at(7001).parse().unwrap()).await;
        for h in [1, 2] {
            wait_ready(f.host(h).at(7101).parse().unwrap()).await;
        }
        assert!(f.wait_live_nodes(MASTER, 2, Duration::from_secs(10)).await);
        let token = Secret::from_file(&tokens.client, "--token-file").unwrap();
        let cl =
            Client::connect(ClientConfig::new(f.host(MASTER).at(7000)).with_token(Some(token)))
                .await
                .unwrap();
        let (single, dual): (Vec<String>, Vec<String>) = (
            (0..16).map(|i| format!("single-{i}")).collect(),
            (0..8).map(|i| format!("dual-{i}")).collect(),
        );
        for (i, k) in single.iter().enumerate() {
            cl.put(k, &payload(i as u64, 100_000), &PutOptions::default())
                .await
                .unwrap();
        }
        let two = PutOptions {
            replicas: 2,
            ..Default::default()
        };
        for (i, k) in dual.iter().enumerate() {
            cl.put(k, &payload(100 + i as u64, 100_000), &two)
                .await
                .unwrap();
        }
        let mut on_1 = Vec::new();
        for (i, k) in single.iter().enumerate() {
            let info = cl.inspect(k).await.unwrap();
            assert_eq!(info.replicas.len(), 1);
            if info.replicas[0].node_id == "node-1" {
                on_1.push(i);
            }
        }
        assert!(
            !on_1.is_empty() && on_1.len() < single.len(),
            "placement spreads the keys over both nodes: {on_1:?}"
        );

        f.partition(MASTER, 1).unwrap();
        // While the master still counts node-1 in, its objects are read
        // from it (clients reach it); a removal of one of them cannot be
        // confirmed by node-1, so it either fails retryably or goes through.
        let removed = &single[on_1[0]];
        match cl.remove(removed, false).await {
            Ok(()) => {}
            Err(e) => assert!(e.retryable(), "a removal fails only retryably: {e}"),
        }
        for (i, k) in single.iter().enumerate() {
            let r = read_checked(&cl, k, &payload(i as u64, 100_000)).await;
            if !on_1.contains(&i) {
                assert_eq!(r, Ok(()), "{k} lives on node-2, which the master reaches");
            }
        }
        assert!(
            f.wait_live_nodes(MASTER, 1, Duration::from_secs(15)).await,
            "the master drops node-1 after --node-ttl"
        );
        for (i, k) in single.iter().enumerate() {
            let r = read_checked(&cl, k, &payload(i as u64, 100_000)).await;
            if on_1.contains(&i) {
                // The master forgot it; a read through the client's cached
                // grant may still get node-1's (right) bytes.
                let e = cl.inspect(k).await.unwrap_err();
                assert_eq!(e.code, Code::NotFound, "{k}: cleanly gone with node-1");
                assert!(r == Ok(()) || r == Err(Code::NotFound), "{k}: {r:?}");
            } else {
                assert_eq!(r, Ok(()), "{k}");
            }
        }
        for (i, k) in dual.iter().enumerate() {
            let r = read_checked(&cl, k, &payload(100 + i as u64, 100_000)).await;
            assert_eq!(r, Ok(()), "{k}: its node-2 replica serves it");
        }

        f.heal().unwrap();
        assert!(
            f.wait_live_nodes(MASTER, 2, Duration::from_secs(15)).await,
            "node-1 registers again once healed, with no manual step"
        );
        assert_eq!(
            read_checked(&cl, removed, &payload(on_1[0] as u64, 100_000)).await,
            Err(Code::NotFound),
            "a key removed during the partition stays removed"
        );
        // Both nodes take writes again; node-1's space is handed out anew,
        // over the ranges its forgotten objects held.
        for i in 0..12u64 {
            let k = format!("after-{i}");
            cl.put(&k, &payload(200 + i, 100_000), &two).await.unwrap();
            assert_eq!(cl.inspect(&k).await.unwrap().replicas.len(), 2);
        }
        // Reads of the forgotten objects (through grants the client may
        // still hold, which node-1 then refuses) get their own bytes or
        // NotFound, never the new objects'.
        for (i, k) in single.iter().enumerate() {
            let r = read_checked(&cl, k, &payload(i as u64, 100_000)).await;
            assert!(
                r == Ok(()) || (on_1.contains(&i) && r == Err(Code::NotFound)),
                "{k}: {r:?}"
            );
        }
        for i in 0..12u64 {
            let k = format!("after-{i}");
            assert_eq!(
                read_checked(&cl, &k, &payload(200 + i, 100_000)).await,
                Ok(())
            );
        }
    });
}

/// Two HA masters (hosts 1 and 2, `MASTERS`) electing through etcd (host
/// 0), a store node (host 3) and the test's client (host 4).
struct Ha {
    f: Fleet,
    tokens: TokenFiles,
    /// `HOST:PORT,HOST:PORT` of the masters.
    list: String,
    admins: [String; 2],
    _procs: Vec<Proc>,
    _dir: tempfile::TempDir,
}

const ETCD: usize = 0;
const MASTERS: [usize; 2] = [1, 2];
const HA_NODE: usize = 3;
const HA_CLIENT: usize = 4;

impl Ha {
    fn start() -> Ha {
        let f = Fleet::new(5);
        let dir = tempfile::tempdir().unwrap();
        let tokens = token_files(dir.path());
        let mut procs = vec![f.spawn_etcd(ETCD, dir.path()).unwrap()];
        let list = MASTERS.map(|h| f.host(h).at(7000)).join(",");
        let etcd = f.host(ETCD).at(2379);
        for h in MASTERS {
            let flags = ["--etcd", &etcd, "--cluster-id", "fleet"];
            let ttls = ["--election-ttl", "2s", "--node-ttl", "3s"];
            procs.push(
                f.spawn_master(h, &tokens, &[&flags[..], &ttls[..]].concat())
                    .unwrap(),
            );
        }
        procs.push(f.spawn_node(HA_NODE, &list, "node", &tokens, &[]).unwrap());
        let admins = MASTERS.map(|h| f.host(h).at(7001));
        Ha {
            f,
            tokens,
            list,
            admins,
            _procs: procs,
            _dir: dir,
        }
    }

    /// Which of `MASTERS` leads (0 or 1), once one does; checks the other
    /// does not.
    async fn leader(&self) -> usize {
        let t0 = Instant::now();
        loop {
            for (i, a) in self.admins.iter().enumerate() {
                if ready(a).await == Some(true) {
                    assert_ne!(
                        ready(&self.admins[1 - i]).await,
                        Some(true),
                        "one leader at a time"
                    );
                    return i;
                }
            }
            assert!(t0.elapsed() < Duration::from_secs(30), "no master leads");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A client of both masters, once the node has registered (a put finds
    /// room).
    async fn client(&self) -> Client {
        let token = Secret::from_file(&self.tokens.client, "--token-file").unwrap();
        let cl = Client::connect(ClientConfig::new(&self.list).with_token(Some(token)))
            .await
            .unwrap();
        let t0 = Instant::now();
        while cl.put("probe", b"x", &PutOptions::default()).await.is_err() {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "the node never registered"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        cl
    }
}

/// The leader is cut off from etcd but not from its members or clients:
/// it stops serving before its successor starts (never two leaders), the
/// successor rebuilds from the node and serves every acknowledged object,
/// and once healed the old leader stays a follower.
#[test]
fn a_leader_cut_off_from_etcd_stops_serving_before_its_successor_starts() {
    let ha = Ha::start();
    let (f, admins) = (&ha.f, &ha.admins);
    let rt = f.runtime(HA_CLIENT).unwrap();
    rt.block_on(async {
        let leader = ha.leader().await;
        let follower = 1 - leader;
        let cl = ha.client().await;
        let keys: Vec<String> = (0..10).map(|i| format!("k{i}")).collect();
        for (i, k) in keys.iter().enumerate() {
            cl.put(k, &payload(i as u64, 50_000), &PutOptions::default())
                .await
                .unwrap();
        }

        f.partition(MASTERS[leader], ETCD).unwrap();
        let cut = Instant::now();
        let (mut stopped, mut succeeded) = (None, None);
        while (succeeded.is_none() || stopped.is_none()) && cut.elapsed() < Duration::from_secs(30)
        {
            // The follower first: a successor seen ready while the old
            // leader still answers ready is two leaders at once.
            let f_ready = ready(&admins[follower]).await == Some(true);
            let l_ready = ready(&admins[leader]).await;
            assert!(
                !(f_ready && l_ready == Some(true)),
                "two masters serve at once"
            );
            // Stopped once it says so (the client still reaches it).
            if l_ready == Some(false) && stopped.is_none() {
                stopped = Some(cut.elapsed());
            }
            if f_ready && succeeded.is_none() {
                succeeded = Some(cut.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let (stopped, succeeded) = (
            stopped.expect("the cut-off leader stops serving"),
            succeeded.expect("the follower takes over"),
        );
        assert!(
            stopped <= succeeded,
            "the old leader stopped serving at {stopped:?}, its successor started at {succeeded:?}"
        );
        // The successor serves every acknowledged object (rebuilt from the
        // node's report) and takes writes.
        let t0 = Instant::now();
        for (i, k) in keys.iter().enumerate() {
            loop {
                match cl.get(k).await {
                    Ok(b) => {
                        assert!(b == payload(i as u64, 50_000), "{k}: wrong bytes");
                        break;
                    }
                    Err(e) => {
                        assert!(e.retryable(), "{k}: {e}");
                        assert!(t0.elapsed() < Duration::from_secs(30), "{k}: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        }
        cl.put("after", &payload(99, 50_000), &PutOptions::default())
            .await
            .unwrap();

        f.heal().unwrap();
        // Healed, the old leader finds a live successor and stays a
        // follower.
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(4) {
            assert_ne!(
                ready(&admins[leader]).await,
                Some(true),
                "the old leader came back as a leader"
            );
            assert_ne!(
                ready(&admins[follower]).await,
                Some(false),
                "the successor keeps leading"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert_eq!(cl.get("after").await.unwrap(), payload(99, 50_000));
    });
}

/// A client that reaches only the follower (the leader is cut off from it,
/// not from anyone else): every call ends within its deadline with a
/// retryable error, never a wrong answer; healed, the same client works
/// with no manual step.
#[test]
fn a_client_that_reaches_only_a_follower_gets_retryable_errors_then_recovers() {
    let ha = Ha::start();
    let rt = ha.f.runtime(HA_CLIENT).unwrap();
    rt.block_on(async {
        let leader = ha.leader().await;
        let cl = ha.client().await;
        cl.put("before", &payload(1, 20_000), &PutOptions::default())
            .await
            .unwrap();
        ha.f.partition(MASTERS[leader], HA_CLIENT).unwrap();
        // Past the client's own retry budget (20 s), with room to spare.
        let bound = Duration::from_secs(30);
        let put = tokio::time::timeout(
            bound,
            cl.put("during", &payload(2, 20_000), &PutOptions::default()),
        )
        .await
        .expect("a put ends within its deadline");
        let e = put.expect_err("no leader reachable: the put cannot be acknowledged");
        assert!(e.retryable(), "{e}");
        let get = tokio::time::timeout(bound, cl.get("before"))
            .await
            .expect("a get ends within its deadline");
        match get {
            // Its node is reachable, and a cached location may serve it.
            Ok(b) => assert!(b == payload(1, 20_000), "wrong bytes"),
            Err(e) => assert!(e.retryable(), "{e}"),
        }
        ha.f.heal().unwrap();
        assert_eq!(
            ha.leader().await,
            leader,
            "nobody took over: the leader kept etcd"
        );
        let t0 = Instant::now();
        loop {
            match cl
                .put("after", &payload(3, 20_000), &PutOptions::default())
                .await
            {
                Ok(()) => break,
                Err(e) => {
                    assert!(e.retryable() && t0.elapsed() < bound, "{e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        assert_eq!(cl.get("before").await.unwrap(), payload(1, 20_000));
        assert_eq!(cl.get("after").await.unwrap(), payload(3, 20_000));
    });
}

/// A slow link (50 ms per chunk, 2 MB/s) to a store node, through the
/// fleet's proxy: puts and gets of that node's objects take as long as the
/// link says — they cross it, no same-host shortcut is taken between
/// hosts — and still return the right bytes.
#[test]
fn a_slow_link_to_a_node_slows_its_reads_and_keeps_them_right() {
    let f = Fleet::new(3);
    let dir = tempfile::tempdir().unwrap();
    let t = token_files(dir.path());
    let master = f.host(MASTER).at(7000);
    let _m = f.spawn_master(MASTER, &t, &[]).unwrap();
    let node = f.host(1);
    let _n = f
        .spawn_node(1, &master, "slow", &t, &["--advertise", &node.at(7200)])
        .unwrap();
    let node_rt = f.runtime(1).unwrap();
    let _proxy = strata_chaos::proxy::Proxy::start(
        &node_rt,
        &node.at(7200),
        &node.at(7100),
        Duration::from_millis(50),
        2_000_000,
    )
    .unwrap();
    let rt = f.runtime(2).unwrap();
    rt.block_on(async {
        wait_ready(f.host(MASTER).at(7001).parse().unwrap()).await;
        assert!(f.wait_live_nodes(MASTER, 1, Duration::from_secs(10)).await);
        let token = Secret::from_file(&t.client, "--token-file").unwrap();
        let cl = Client::connect(ClientConfig::new(&master).with_token(Some(token)))
            .await
            .unwrap();
        let data = payload(5, 2 << 20);
        let t0 = Instant::now();
        cl.put("big", &data, &PutOptions::default()).await.unwrap();
        let put = t0.elapsed();
        let t0 = Instant::now();
        let got = cl.get("big").await.unwrap();
        let get = t0.elapsed();
        assert!(got == data, "wrong bytes over the slow link");
        // 2 MiB at 2 MB/s: over a second each way.
        for (what, took) in [("put", put), ("get", get)] {
            assert!(
                took >= Duration::from_millis(1000) && took < Duration::from_secs(20),
                "{what} took {took:?}: not through the slow link"
            );
        }
        let small = payload(6, 1000);
        cl.put("small", &small, &PutOptions::default())
            .await
            .unwrap();
        assert_eq!(cl.get("small").await.unwrap(), small);
    });
}
