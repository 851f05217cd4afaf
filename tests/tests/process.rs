//! Process-level tests of the real binaries: SIGKILL, SIGTERM, restarts and
//! the CLI's exit codes.

use std::process::{Command, Stdio};
use std::time::Duration;
use strata_client::{Client, ClientConfig, Code, PutOptions};
use strata_tests::procs::{start_master, start_node, start_node_with};
use strata_tests::{bin, http_get, payload};

async fn live_nodes(admin: std::net::SocketAddr) -> usize {
    let (_, body) = http_get(admin, "/api/v1/nodes").await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["nodes"].as_array().unwrap().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_store_node_leaves_the_metadata_and_reads_fail_over() {
    let m = start_master(&["--node-ttl", "1s"]).await;
    let (_a, _) = start_node(&m.addr, "node-a").await;
    let (b, _) = start_node(&m.addr, "node-b").await;
    let cl = Client::connect(ClientConfig::new(&m.addr)).await.unwrap();
    for i in 0..8u64 {
        cl.put(
            &format!("dual-{i}"),
            &payload(i, 300_000),
            &PutOptions {
                replicas: 2,
                ..Default::default()
            },
        )
        .await
        .unwrap();
        cl.put(
            &format!("single-{i}"),
            &payload(100 + i, 50_000),
            &PutOptions::default(),
        )
        .await
        .unwrap();
    }
    let mut on_b = Vec::new();
    for i in 0..8u64 {
        let info = cl.inspect(&format!("single-{i}")).await.unwrap();
        if info.replicas[0].node_id == "node-b" {
            on_b.push(i);
        }
    }
    drop(b); // SIGKILL
             // Before the TTL fires, reads of replicated keys fail over to node-a.
    for i in 0..8u64 {
        assert_eq!(
            cl.get(&format!("dual-{i}")).await.unwrap(),
            payload(i, 300_000)
        );
    }
    let mut gone = false;
    for _ in 0..250 {
        if live_nodes(m.admin).await == 1 {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(gone, "node-b must leave the metadata after --node-ttl");
    for i in 0..8u64 {
        assert_eq!(
            cl.get(&format!("dual-{i}")).await.unwrap(),
            payload(i, 300_000)
        );
        assert_eq!(
            cl.inspect(&format!("dual-{i}"))
                .await
                .unwrap()
                .replicas
                .len(),
            1
        );
        let r = cl.get(&format!("single-{i}")).await;
        if on_b.contains(&i) {
            assert_eq!(r.unwrap_err().code, Code::NotFound);
        } else {
            assert_eq!(r.unwrap(), payload(100 + i, 50_000));
        }
    }
    let (_, metrics) = http_get(m.admin, "/metrics").await;
    assert!(metrics.contains("strata_master_nodes 1"), "{metrics}");
    // The node comes back under the same id and remounts.
    let (_b2, _) = start_node(&m.addr, "node-b").await;
    assert_eq!(live_nodes(m.admin).await, 2);
    cl.put(
        "after-restart",
        &payload(7, 1 << 20),
        &PutOptions {
            replicas: 2,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(cl.get("after-restart").await.unwrap(), payload(7, 1 << 20));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_shuts_down_cleanly_with_exit_zero() {
    let mut m = start_master(&[]).await;
    let (mut n, _) = start_node(&m.addr, "n1").await;
    let cl = Client::connect(ClientConfig::new(&m.addr)).await.unwrap();
    cl.put("k", b"v", &PutOptions::default()).await.unwrap();
    n.signal(libc::SIGTERM);
    assert_eq!(n.exit_code(Duration::from_secs(10)).await, Some(0));
    m.proc.signal(libc::SIGTERM);
    assert_eq!(m.proc.exit_code(Duration::from_secs(10)).await, Some(0));
}

fn run_cli(args: &[&str], stdin: Option<&[u8]>) -> (i32, Vec<u8>, String) {
    use std::io::Write;
    let mut child = Command::new(bin("strata"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut sin = child.stdin.take().unwrap();
    if let Some(d) = stdin {
        sin.write_all(d).unwrap();
    }
    drop(sin);
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        out.stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_moves_bytes_and_uses_documented_exit_codes() {
    let m = start_master(&[]).await;
    let (_n, _) = start_node(&m.addr, "n1").await;
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("in.bin");
    let dst = dir.path().join("out.bin");
    std::fs::write(&src, payload(5, 3 << 20)).unwrap();
    let mm = m.addr.as_str();
    let (code, _, err) = run_cli(
        &["--master", mm, "put", "file-key", src.to_str().unwrap()],
        None,
    );
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = run_cli(
        &["--master", mm, "get", "file-key", dst.to_str().unwrap()],
        None,
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(std::fs::read(&dst).unwrap(), payload(5, 3 << 20));
    let (code, _, _) = run_cli(&["--master", mm, "put", "piped", "-"], Some(b"from stdin"));
    assert_eq!(code, 0);
    let (code, out, _) = run_cli(&["--master", mm, "get", "piped"], None);
    assert_eq!((code, out.as_slice()), (0, &b"from stdin"[..]));
    // A present key: refused, unless replaced with --overwrite.
    let (code, _, err) = run_cli(&["--master", mm, "put", "piped", "-"], Some(b"again"));
    assert_eq!(code, 1);
    assert!(err.contains("already exists"), "{err}");
    let (code, _, err) = run_cli(
        &["--master", mm, "put", "--overwrite", "piped", "-"],
        Some(b"replaced"),
    );
    assert_eq!(code, 0, "{err}");
    let (code, out, _) = run_cli(&["--master", mm, "get", "piped"], None);
    assert_eq!((code, out.as_slice()), (0, &b"replaced"[..]));
    let (code, out, _) = run_cli(&["--master", mm, "stat", "file-key", "--json"], None);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["size"], 3 << 20);
    assert_eq!(v["replicas"][0]["kind"], "memory");
    let (code, out, _) = run_cli(&["--master", mm, "ls", "--prefix", "file"], None);
    assert_eq!(code, 0);
    assert!(String::from_utf8_lossy(&out).starts_with("file-key\t"));
    let (code, _, err) = run_cli(&["--master", mm, "get", "missing"], None);
    assert_eq!(code, 1);
    assert!(err.contains("not found"), "{err}");
    // The get above leased the object and ended its lease before exiting
    // (the master's TTL is 5 s): a plain rm works at once.
    let (code, _, err) = run_cli(&["--master", mm, "rm", "piped"], None);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = run_cli(&["--master", mm, "rm", "--force", "file-key"], None);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = run_cli(&["--master", mm, "rm", "piped"], None);
    assert_eq!(code, 1);
    assert!(err.contains("not found"), "{err}");
    let (code, _, _) = run_cli(&["frobnicate"], None);
    assert_eq!(code, 2, "usage errors exit 2");
    let (code, _, _) = run_cli(&["--master", mm, "put"], None);
    assert_eq!(code, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_flags_exit_2_with_a_clear_message() {
    for (b, args, want) in [
        (
            "strata-master",
            vec!["--high-watermark", "2"],
            "--high-watermark",
        ),
        (
            "strata-master",
            vec!["--lease-ttl", "soon"],
            "invalid duration",
        ),
        (
            "strata-master",
            vec!["--offload-policy", "sometimes"],
            "offload policy",
        ),
        (
            "strata-store-node",
            vec!["--capacity", "12XB"],
            "unknown size unit",
        ),
        (
            "strata-store-node",
            vec!["--transport", "rdma"],
            "use tcp or ucx",
        ),
    ] {
        let out = Command::new(bin(b)).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{b} {args:?}: {err}");
        assert!(err.contains(want), "{b} {args:?}: {err}");
    }
    // Env vars work like flags.
    let out = Command::new(bin("strata-master"))
        .env("STRATA_EVICTION_RATIO", "7")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--eviction-ratio"));
}

/// `--check-config` validates and exits without starting: 0 for a valid
/// configuration (both sides of a bound), 2 with the reason otherwise,
/// including an unreadable token file.
#[test]
fn check_config_validates_without_starting() {
    for (b, args, ok) in [
        ("strata-master", vec!["--high-watermark", "1"], true),
        ("strata-master", vec!["--high-watermark", "1.01"], false),
        (
            "strata-master",
            vec!["--member-token-file", "/nonexistent/token"],
            false,
        ),
        ("strata-store-node", vec!["--capacity", "2GiB"], true),
        ("strata-store-node", vec!["--capacity", "2XB"], false),
        (
            "strata-store-node",
            vec![
                "--huge-pages",
                "true",
                "--capacity",
                "4MiB",
                "--segment-size",
                "2MiB",
            ],
            true,
        ),
        (
            "strata-store-node",
            vec!["--huge-pages", "true", "--capacity", "3MiB"],
            false,
        ),
        (
            "strata-ssd-agent",
            vec!["--handle", "node-a/nvme0", "--staging-bytes", "64MiB"],
            true,
        ),
        ("strata-ssd-agent", vec!["--staging-wait", "later"], false),
    ] {
        let out = Command::new(bin(b))
            .arg("--check-config")
            .args(&args)
            .output()
            .unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        if ok {
            assert_eq!(out.status.code(), Some(0), "{b} {args:?}: {stderr}");
            assert!(stdout.contains("configuration OK"), "{b}: {stdout}");
        } else {
            assert_eq!(out.status.code(), Some(2), "{b} {args:?} passed: {stdout}");
            assert!(stderr.contains("error"), "{b} {args:?}: {stderr}");
        }
    }
}

/// The DRAM acceptance check that once lost fresh writes (#32): a reader
/// reads every object of a full tier, then 10 two-replica objects are put.
/// Each read's lease ended with it, so eviction makes room from the
/// objects read, oldest first, and never takes a fresh put; each fresh
/// object then survives the SIGKILL of one of the three nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_puts_into_a_tier_full_of_read_objects_all_stay_and_survive_a_node() {
    let m = start_master(&["--node-ttl", "1s", "--high-watermark", "1"]).await;
    let mut nodes = Vec::new();
    for n in ["n1", "n2", "n3"] {
        nodes.push(start_node_with(&m.addr, n, &["--capacity", "8MiB"]).await.0);
    }
    let t0 = std::time::Instant::now();
    while live_nodes(m.admin).await != 3 {
        assert!(t0.elapsed() < Duration::from_secs(10), "3 nodes register");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cl = Client::connect(ClientConfig::new(&m.addr)).await.unwrap();
    const SIZE: usize = 120_000;
    // 200 objects fill the 24 MiB tier (all but 4 objects' worth).
    for i in 0..200u64 {
        cl.put(
            &format!("old-{i}"),
            &payload(i, SIZE),
            &PutOptions::default(),
        )
        .await
        .unwrap();
    }
    for i in 0..200u64 {
        assert_eq!(cl.get(&format!("old-{i}")).await.unwrap(), payload(i, SIZE));
    }
    let two = PutOptions {
        replicas: 2,
        ..Default::default()
    };
    for i in 0..10u64 {
        cl.put(&format!("fresh-{i}"), &payload(1000 + i, SIZE), &two)
            .await
            .unwrap();
    }
    let stat = cl.stat().await.unwrap();
    assert!(stat.evictions > 0, "the tier was full: room was made");
    for i in 0..10u64 {
        let k = format!("fresh-{i}");
        assert_eq!(cl.inspect(&k).await.unwrap().replicas.len(), 2, "{k}");
    }
    drop(nodes.remove(0)); // SIGKILL
    let t0 = std::time::Instant::now();
    while live_nodes(m.admin).await != 2 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the node is dropped"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for i in 0..10u64 {
        let k = format!("fresh-{i}");
        assert_eq!(cl.get(&k).await.unwrap(), payload(1000 + i, SIZE), "{k}");
    }
}

/// The master keeps its state (the grant key among it) private whatever
/// the umask it was started with: files 0600, its directory 0700, and a
/// directory of its own that others could read is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_masters_state_is_private() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let d = tempfile::tempdir().unwrap();
    let open = d.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
    for dir in [d.path().join("new"), open] {
        let m = start_master(&["--state-dir", dir.to_str().unwrap()]).await;
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700, "{}", dir.display());
        let files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_file())
            .collect();
        assert!(!files.is_empty(), "the master wrote its state");
        for f in &files {
            assert_eq!(mode(f) & 0o077, 0, "{} is {:o}", f.display(), mode(f));
        }
        drop(m);
    }
}

/// `strata bench`'s metadata phase runs on a cluster with and without
/// `--integrity blake3` (whose PutEnds need a digest) and counts every key
/// it was asked for: a failed item stops the run instead of being left out.
#[test]
fn the_benchmark_times_the_metadata_path_with_and_without_integrity() {
    let keys = 1024u64;
    let (code, out, err) = run_cli(
        &[
            "bench",
            "--local",
            "--json",
            "--node-capacity",
            "64MiB",
            "--sizes",
            "4KiB",
            "--bytes",
            "64KiB",
            "--min-ops",
            "8",
            "--max-ops",
            "8",
            "--offload-sizes",
            "",
            "--meta-keys",
            &keys.to_string(),
            "--compare-integrity",
        ],
        None,
    );
    assert_eq!(code, 0, "{err}");
    let report: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let rows: Vec<&serde_json::Value> = report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| {
            r["scenario"]
                .as_str()
                .unwrap()
                .starts_with("master metadata path")
        })
        .collect();
    assert_eq!(rows.len(), 2, "{report}");
    for r in rows {
        assert_eq!(r["ops"].as_u64(), Some(keys), "{r}");
        assert!(r["ops_per_sec"].as_f64().unwrap() > 0.0, "{r}");
    }
}
