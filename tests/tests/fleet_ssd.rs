//! The SSD tier across hosts (network namespaces, `strata_chaos::fleet`):
//! an SSD agent cut off from the master in the middle of an offload, and a
//! whole host — store node and SSD agent — lost and back with the same
//! node id, handle and disk.

use std::process::Command;
use std::time::{Duration, Instant};
use strata_chaos::fleet::Fleet;
use strata_chaos::procs::{wait_ready, Proc, TokenFiles};
use strata_client::{Client, ClientConfig, Code, PutOptions};
use strata_common::auth::Secret;
use strata_proto as pb;
use strata_tests::payload;

const MASTER: usize = 0;
const CLIENT: usize = 3;
const SIZE: usize = 300_000;
const WITHIN: Duration = Duration::from_secs(30);

/// `strata-ssd-agent` with `handle` on host `h` (data port 7200, admin
/// 7201) registering with the master on host 0, its files in `dir`,
/// `extra` flags; `failpoints` as `FAILPOINTS` (the test binaries' build
/// has them).
fn spawn_agent(
    f: &Fleet,
    h: usize,
    handle: &str,
    dir: &std::path::Path,
    t: &TokenFiles,
    failpoints: Option<&str>,
    extra: &[&str],
) -> Proc {
    let host = f.host(h);
    let master = f.host(MASTER).at(7000);
    let mut cmd = Command::new(
        strata_chaos::procs::bin_dir()
            .unwrap()
            .join("strata-ssd-agent"),
    );
    cmd.args([
        "--master",
        &master,
        "--handle",
        handle,
        "--capacity",
        "256MiB",
    ])
    .arg("--data-dir")
    .arg(dir)
    .args(["--listen", &host.at(7200), "--admin-addr", &host.at(7201)])
    .arg("--token-file")
    .arg(&t.member)
    .args(extra)
    .env("RUST_LOG", "warn");
    if let Some(fp) = failpoints {
        cmd.env("FAILPOINTS", fp);
    }
    f.spawn_command(h, cmd).unwrap()
}

/// A master on host 0 that offloads every put at once (`eager`), requeues
/// an offload task its owner does not finish within `task_ttl` and drops a
/// silent member after 2 s; its durable state (tombstones) in `state`.
fn spawn_master(f: &Fleet, t: &TokenFiles, state: &std::path::Path, task_ttl: &str) -> Proc {
    let state = state.to_str().unwrap();
    let flags = [
        "--offload-policy",
        "eager",
        "--offload-task-ttl",
        task_ttl,
        "--node-ttl",
        "2s",
        "--state-dir",
        state,
    ];
    f.spawn_master(MASTER, t, &flags).unwrap()
}

async fn offload_view(f: &Fleet) -> serde_json::Value {
    let url = format!("http://{}/api/v1/offload", f.host(MASTER).at(7001));
    match tokio::time::timeout(Duration::from_secs(2), reqwest::get(url)).await {
        Ok(Ok(r)) => r.json().await.unwrap_or_default(),
        _ => serde_json::Value::Null,
    }
}

/// Polls the offload view until `done` holds for it, at most `WITHIN`.
async fn offload_until(f: &Fleet, what: &str, done: impl Fn(&serde_json::Value) -> bool) {
    let t0 = Instant::now();
    loop {
        let v = offload_view(f).await;
        if done(&v) {
            return;
        }
        assert!(t0.elapsed() < WITHIN, "{what}: {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn idle(v: &serde_json::Value) -> bool {
    v["queued"] == 0 && v["assigned"] == 0 && v["pins"] == 0
}

/// The owners of `key`'s SSD copies (the admin's view of the key).
async fn ssd_owners(f: &Fleet, t: &TokenFiles, key: &str) -> Vec<serde_json::Value> {
    let token = Secret::from_file(&t.admin, "--token-file").unwrap();
    let admin = f.host(MASTER).at(7001).parse().unwrap();
    let path = format!("/api/v1/keys/{key}");
    let (status, body) = strata_tests::http_get_as(admin, &path, Some(&token)).await;
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let replicas = v["replicas"].as_array().cloned().unwrap_or_default();
    replicas
        .iter()
        .filter(|r| r["kind"] == "ssd")
        .map(|r| r["owner_id"].clone())
        .collect()
}

/// An admin client (eviction of DRAM copies is the admin's).
async fn admin_client(f: &Fleet, t: &TokenFiles) -> Client {
    let token = Secret::from_file(&t.admin, "--token-file").unwrap();
    Client::connect(ClientConfig::new(f.host(MASTER).at(7000)).with_token(Some(token)))
        .await
        .unwrap()
}

/// Drops the DRAM copies of `keys` (each must have one on SSD) and reads
/// them back from SSD: their own bytes.
async fn read_from_ssd(cl: &Client, keys: &[(String, u64)]) {
    let names: Vec<String> = keys.iter().map(|(k, _)| k.clone()).collect();
    // A read a moment ago may still hold its lease: retried (bounded).
    strata_tests::evict_memory_within(cl, &names, WITHIN).await;
    for (k, seed) in keys {
        let b = cl.get(k).await.unwrap();
        assert!(b == payload(*seed, SIZE), "{k}: wrong bytes from SSD");
    }
}

/// One of two SSD agents (host 2; the other on host 4) is cut off from
/// the master while it writes a bucket (stalled halfway by a failpoint), but
/// not from the store node it reads from (host 1). Its tasks expire, go back
/// to the queue, and once the master drops the silent owner they move to
/// the live one, which stores them: every object ends up on SSD and reads
/// back whole from there. Nothing the cut-off agent wrote meanwhile counts
/// as stored while it is cut off; healed, it registers again with no manual
/// step and the tier goes idle.
#[test]
fn an_ssd_agent_cut_off_mid_offload_hands_its_tasks_on_and_nothing_half_adopted() {
    const CUT: usize = 2;
    let f = Fleet::new(5);
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let (disk_a, disk_b) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::create_dir_all(&disk_a).unwrap();
    std::fs::create_dir_all(&disk_b).unwrap();
    let t = TokenFiles::generate(dir.path()).unwrap();
    let master = f.host(MASTER).at(7000);
    // Tasks outlive the test: only the owner's loss can move them on.
    let _m = spawn_master(&f, &t, &state, "60s");
    let _n = f.spawn_node(1, &master, "node-1", &t, &[]).unwrap();
    // Stalled long enough for the second agent to start and the cut to
    // land while it is still mid-bucket.
    let fp = "ssd-agent::bucket-mid-write=sleep(8000)";
    let _a = spawn_agent(&f, CUT, "rack/2", &disk_a, &t, Some(fp), &[]);
    let rt = f.runtime(CLIENT).unwrap();
    rt.block_on(async {
        wait_ready(&f.host(MASTER).at(7001), WITHIN).await.unwrap();
        wait_ready(&f.host(CUT).at(7201), WITHIN).await.unwrap();
        let cl = admin_client(&f, &t).await;
        let keys: Vec<(String, u64)> = (0..5).map(|i| (format!("cut-{i}"), i)).collect();
        put_all(&cl, &keys).await;
        offload_until(&f, "the agent is mid-bucket, its sources pinned", |v| {
            v["assigned"].as_u64() > Some(0) && v["pins"].as_u64() > Some(0)
        })
        .await;
        let cut_owner = offload_view(&f).await["tasks"][0]["owner_id"].clone();
        assert!(cut_owner.is_u64(), "{cut_owner}");
        // The second agent joins now, so the first holds every task.
        let _b = spawn_agent(&f, 4, "rack/4", &disk_b, &t, None, &[]);
        wait_ready(&f.host(4).at(7201), WITHIN).await.unwrap();

        f.partition(CUT, MASTER).unwrap();
        let n = keys.len() as u64;
        offload_until(
            &f,
            "the cut-off agent's tasks move on to the live one",
            |v| idle(v) && v["persisted"].as_u64() >= Some(n),
        )
        .await;
        // The live agent stored each once; the cut-off one's bucket
        // (finished meanwhile: it still reaches the node) is nobody's copy.
        for (k, _) in &keys {
            let owners = ssd_owners(&f, &t, k).await;
            assert_eq!(owners.len(), 1, "{k}: {owners:?}");
            assert_ne!(owners[0], cut_owner, "{k}: stored by the cut-off agent");
        }
        read_from_ssd(&cl, &keys).await;

        f.heal().unwrap();
        wait_ready(&f.host(CUT).at(7201), WITHIN).await.unwrap();
        offload_until(&f, "the tier is idle after healing", idle).await;
        for (k, seed) in &keys {
            assert_eq!(cl.get(k).await.unwrap(), payload(*seed, SIZE), "{k}");
        }
    });
}

/// A whole host — store node and SSD agent — drops off the network past
/// `--node-ttl` and dies there (SIGKILL), then comes back with the same
/// node id, agent handle and disk. Meanwhile a key with a copy on its SSD
/// is removed. Back, the host registers with no manual step; the agent's
/// inventory brings back the SSD copies the master gave it, except the
/// removed key's (its tombstone refuses it); the node starts empty.
#[test]
fn a_host_lost_and_back_with_the_same_handle_brings_back_its_ssd_copies_and_no_removed_key() {
    let f = Fleet::new(4);
    let dir = tempfile::tempdir().unwrap();
    let (state, disk) = (dir.path().join("state"), dir.path().join("disk"));
    std::fs::create_dir_all(&disk).unwrap();
    let t = TokenFiles::generate(dir.path()).unwrap();
    let master = f.host(MASTER).at(7000);
    let _m = spawn_master(&f, &t, &state, "1s");
    // Host 1 runs both; host 2 a second node, so writes go on meanwhile.
    let node = f.spawn_node(1, &master, "node-1", &t, &[]).unwrap();
    let agent = spawn_agent(&f, 1, "rack/1", &disk, &t, None, &[]);
    let _n2 = f.spawn_node(2, &master, "node-2", &t, &[]).unwrap();
    let rt = f.runtime(CLIENT).unwrap();
    rt.block_on(async {
        wait_ready(&f.host(MASTER).at(7001), WITHIN).await.unwrap();
        wait_ready(&f.host(1).at(7201), WITHIN).await.unwrap();
        let cl = admin_client(&f, &t).await;
        let keys: Vec<(String, u64)> = (0..6).map(|i| (format!("host-{i}"), 10 + i)).collect();
        put_all(&cl, &keys).await;
        offload_until(&f, "every put is on SSD", |v| {
            idle(v) && v["persisted"].as_u64() >= Some(keys.len() as u64)
        })
        .await;

        f.isolate(1).unwrap();
        assert!(
            f.wait_live_nodes(MASTER, 1, WITHIN).await,
            "the master drops the lost host's node after --node-ttl"
        );
        // Removed while its SSD copy's owner is unreachable: the removal
        // cannot be confirmed by it, so it may fail retryably, but it
        // stands (the master keeps a tombstone).
        let (removed, kept) = keys.split_first().unwrap();
        if let Err(e) = cl.remove(&removed.0, true).await {
            assert!(e.retryable(), "{e}");
        }
        // SIGKILL, on the lost host.
        drop(node);
        drop(agent);

        f.heal().unwrap();
        let _node = f.spawn_node(1, &master, "node-1", &t, &[]).unwrap();
        let _agent = spawn_agent(&f, 1, "rack/1", &disk, &t, None, &[]);
        assert!(
            f.wait_live_nodes(MASTER, 2, WITHIN).await,
            "the host registers again"
        );
        // The agent's inventory re-attaches its copies (the node came back
        // empty): every kept key reads back whole, the removed one is gone.
        let t0 = Instant::now();
        for (k, seed) in kept {
            let b = loop {
                match cl.get(k).await {
                    Ok(b) => break b,
                    Err(e) => {
                        assert!(
                            (e.retryable() || e.code == Code::NotFound) && t0.elapsed() < WITHIN,
                            "{k}: {e}"
                        );
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            };
            assert!(b == payload(*seed, SIZE), "{k}: wrong bytes");
        }
        assert_eq!(
            cl.get(&removed.0).await.unwrap_err().code,
            Code::NotFound,
            "the removed key stays removed"
        );
        // A key whose DRAM copy lived on host 2 read back before the
        // agent's inventory was in: wait for each copy to be attached
        // again (not a moment's grace) before the DRAM copies go.
        for (k, _) in kept {
            let t0 = Instant::now();
            while ssd_owners(&f, &t, k).await.is_empty() {
                assert!(t0.elapsed() < WITHIN, "{k}: its SSD copy never came back");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        read_from_ssd(&cl, kept).await;
    });
}

/// Puts each key's bytes (`SIZE` from its seed), retrying what is
/// retryable while the cluster comes up (bounded).
async fn put_all(cl: &Client, keys: &[(String, u64)]) {
    for (k, seed) in keys {
        let t0 = Instant::now();
        while let Err(e) = cl
            .put(k, &payload(*seed, SIZE), &PutOptions::default())
            .await
        {
            assert!(e.retryable() && t0.elapsed() < WITHIN, "{k}: {e}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Bytes the agent on host `h` lent through its UCX window.
async fn staged_bytes(f: &Fleet, h: usize) -> f64 {
    let admin = f.host(h).at(7201).parse().unwrap();
    let (_, body) = strata_tests::http_get(admin, "/metrics").await;
    strata_tests::metric(&body, "strata_ssd_agent_staged_bytes_total")
}

/// Reads `key`'s SSD copy through `role`'s own UCX transport (made on the
/// calling host) and returns the transport, to see the path taken.
async fn read_lent(
    f: &Fleet,
    token: &std::path::Path,
    key: &str,
    want: &[u8],
) -> strata_transport::ucx::UcxTransport {
    use strata_transport::Transport;
    let mut m = strata_tests::master_client_as(&f.host(MASTER).at(7000), token);
    let got = m
        .get_replicas(pb::GetReplicasRequest { key: key.into() })
        .await
        .unwrap()
        .into_inner();
    let ssd: Vec<_> = got
        .replicas
        .iter()
        .filter(|r| r.kind == pb::ReplicaKind::Ssd as i32)
        .collect();
    assert_eq!(ssd.len(), 1, "{got:?}");
    let r = strata_transport::remote_range(ssd[0]).unwrap();
    assert!(
        r.scope.perm & strata_common::grant::PERM_STAGE != 0,
        "an rdma grant stages"
    );
    let ucx = strata_tests::ucx_transport(m);
    let mut back = vec![0u8; want.len()];
    ucx.read(&r, 0, &mut back).await.unwrap();
    assert!(back == want, "{key}: wrong bytes lent");
    ucx
}

/// SSD reads lent through an agent's UCX window across hosts: an rdma
/// reader on another host than the agent gets the piece one-sided over
/// UCX's network transports (the agent counts it lent), never through the
/// shared-memory engine, which hosts sharing this machine's kernel would
/// let work here and real hosts would not; a reader on the agent's own host
/// is given that engine.
#[test]
fn ssd_reads_lent_across_hosts_never_take_the_same_host_path() {
    const AGENT: usize = 1;
    const FAR: usize = 2;
    let f = Fleet::new(3);
    let dir = tempfile::tempdir().unwrap();
    let (state, disk) = (dir.path().join("state"), dir.path().join("disk"));
    std::fs::create_dir_all(&disk).unwrap();
    let t = TokenFiles::generate(dir.path()).unwrap();
    let master = f.host(MASTER).at(7000);
    let _m = spawn_master(&f, &t, &state, "30s");
    let _n = f.spawn_node(AGENT, &master, "node-1", &t, &[]).unwrap();
    let ucx = ["--transport", "ucx", "--staging-bytes", "8MiB"];
    let _a = spawn_agent(&f, AGENT, "rack/1", &disk, &t, None, &ucx);
    let bytes = payload(7, SIZE);
    let far = f.runtime(FAR).unwrap();
    far.block_on(async {
        wait_ready(&f.host(MASTER).at(7001), WITHIN).await.unwrap();
        wait_ready(&f.host(AGENT).at(7201), WITHIN).await.unwrap();
        let cl = admin_client(&f, &t).await;
        cl.put("lent", &bytes, &PutOptions::default())
            .await
            .unwrap();
        offload_until(&f, "the put is on SSD", |v| {
            idle(v) && v["persisted"].as_u64() >= Some(1)
        })
        .await;
        read_from_ssd(&cl, &[("lent".to_string(), 7)]).await;
        let before = staged_bytes(&f, AGENT).await;
        let ucx = read_lent(&f, &t.rdma, "lent", &bytes).await;
        assert_eq!(staged_bytes(&f, AGENT).await - before, SIZE as f64, "lent");
        assert!(ucx.one_sided_transfers() >= 1);
        assert_eq!(
            ucx.shared_memory_transfers(),
            0,
            "shared memory across hosts"
        );
    });
    let near = f.runtime(AGENT).unwrap();
    near.block_on(async {
        let ucx = read_lent(&f, &t.rdma, "lent", &bytes).await;
        // Lent and read one-sided (not a TCP fallback), over shared memory.
        assert_eq!(ucx.one_sided_transfers(), 1);
        assert!(
            ucx.shared_memory_transfers() >= 1,
            "no shared memory on one host"
        );
    });
}
