//! One conformance suite run against every `DurableKv` implementation.

use super::{get_or_create, increment, DurableKv, EtcdKv, FileKv, MemKv};
use std::sync::Arc;

async fn basic(kv: &dyn DurableKv) {
    assert_eq!(kv.get("a".into()).await.unwrap(), None);
    assert!(kv
        .compare_and_set("a".into(), None, "1".into())
        .await
        .unwrap());
    assert!(
        !kv.compare_and_set("a".into(), None, "2".into())
            .await
            .unwrap(),
        "create-if-absent twice"
    );
    assert!(!kv
        .compare_and_set("a".into(), Some("9".into()), "2".into())
        .await
        .unwrap());
    assert!(kv
        .compare_and_set("a".into(), Some("1".into()), "2".into())
        .await
        .unwrap());
    assert_eq!(kv.get("a".into()).await.unwrap().as_deref(), Some("2"));
    kv.compare_and_set("p/x".into(), None, "x".into())
        .await
        .unwrap();
    kv.compare_and_set("p/y".into(), None, "y".into())
        .await
        .unwrap();
    kv.compare_and_set("q".into(), None, "q".into())
        .await
        .unwrap();
    let l = kv.list("p/".into()).await.unwrap();
    assert_eq!(
        l,
        vec![("p/x".into(), "x".into()), ("p/y".into(), "y".into())]
    );
    assert_eq!(increment(kv, "ctr").await.unwrap(), 1);
    assert_eq!(increment(kv, "ctr").await.unwrap(), 2);
}

/// Many tasks racing to create one key all see the same single winner, and
/// racing increments never hand out the same number twice.
async fn races(kv: Arc<dyn DurableKv>) {
    let mut tasks = Vec::new();
    for i in 0..16 {
        let kv = kv.clone();
        tasks.push(tokio::spawn(async move {
            let v = get_or_create(
                kv.as_ref(),
                "handle",
                || async move { Ok(format!("id-{i}")) },
            )
            .await
            .unwrap();
            let n = increment(kv.as_ref(), "seq").await.unwrap();
            (v, n)
        }));
    }
    let mut vals = Vec::new();
    let mut nums = Vec::new();
    for t in tasks {
        let (v, n) = t.await.unwrap();
        vals.push(v);
        nums.push(n);
    }
    vals.dedup();
    assert_eq!(vals.len(), 1, "one handle, one id");
    nums.sort();
    assert_eq!(nums, (1..=16).collect::<Vec<u64>>());
}

macro_rules! kv_conformance {
    ($name:ident, $make:expr) => {
        mod $name {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn basic_ops() {
                let (kv, _guard) = $make.await;
                basic(kv.as_ref()).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn racing_creates_and_increments() {
                let (kv, _guard) = $make.await;
                races(kv).await;
            }
        }
    };
}

async fn mem() -> (Arc<dyn DurableKv>, ()) {
    (Arc::new(MemKv::new()), ())
}

async fn file() -> (Arc<dyn DurableKv>, tempfile::TempDir) {
    let d = tempfile::tempdir().unwrap();
    (Arc::new(FileKv::open(d.path()).unwrap()), d)
}

pub(crate) use strata_common::testing::EtcdServer;

async fn etcd() -> (Arc<dyn DurableKv>, EtcdServer) {
    let server = EtcdServer::start().await;
    let kv = EtcdKv::connect(std::slice::from_ref(&server.endpoint), "c1")
        .await
        .unwrap();
    (Arc::new(kv), server)
}

kv_conformance!(memory_kv, mem());
kv_conformance!(file_kv, file());
kv_conformance!(etcd_kv, etcd());

/// Two clusters sharing one etcd never see each other's keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_kv_keeps_clusters_apart() {
    let server = EtcdServer::start().await;
    let ep = std::slice::from_ref(&server.endpoint);
    let (a, b) = (
        EtcdKv::connect(ep, "a").await.unwrap(),
        EtcdKv::connect(ep, "b").await.unwrap(),
    );
    assert!(a
        .compare_and_set("k".into(), None, "1".into())
        .await
        .unwrap());
    assert_eq!(b.get("k".into()).await.unwrap(), None);
    assert!(b
        .compare_and_set("k".into(), None, "2".into())
        .await
        .unwrap());
    assert_eq!(
        a.list(String::new()).await.unwrap(),
        vec![("k".into(), "1".into())]
    );
    assert!(
        EtcdKv::connect(ep, "x/y").await.is_err(),
        "a '/' in the cluster id"
    );
}

#[tokio::test]
async fn file_kv_survives_reopen_and_refuses_damage() {
    let d = tempfile::tempdir().unwrap();
    {
        let kv = FileKv::open(d.path()).unwrap();
        assert!(kv
            .compare_and_set("handles/a".into(), None, "7".into())
            .await
            .unwrap());
        let e = FileKv::open(d.path())
            .err()
            .expect("second master on the same dir");
        assert!(e.message.contains("in use by another strata-master"), "{e}");
    }
    let kv = FileKv::open(d.path()).unwrap();
    assert_eq!(
        kv.get("handles/a".into()).await.unwrap().as_deref(),
        Some("7")
    );
    drop(kv);
    let f = d.path().join("master-state.json");
    let text = std::fs::read_to_string(&f)
        .unwrap()
        .replace("\"7\"", "\"8\"");
    std::fs::write(&f, text).unwrap();
    let e = FileKv::open(d.path()).err().expect("tampered state");
    assert!(e.message.contains("checksum"), "{e}");
    std::fs::write(&f, b"{not json").unwrap();
    let e = FileKv::open(d.path()).err().expect("garbage state");
    assert!(e.message.contains("not valid master state"), "{e}");
}

/// Each change is one appended line, not a rewrite of every entry: the
/// snapshot stays as it is until the log outgrows it. A change cut short
/// by a crash (the log's last line) is dropped on reopen; damage before
/// it, or a state from a newer master, is refused; a state written before
/// the log (format 1) is read.
#[tokio::test]
async fn file_kv_appends_each_change_and_drops_only_a_torn_last_one() {
    let d = tempfile::tempdir().unwrap();
    let (snap, log) = (
        d.path().join("master-state.json"),
        d.path().join("master-state.log"),
    );
    {
        let kv = FileKv::open(d.path()).unwrap();
        let before = std::fs::read(&snap).unwrap();
        for i in 0..200 {
            assert!(kv
                .compare_and_set(format!("members/nodes/n{i}"), None, "live".into())
                .await
                .unwrap());
        }
        assert_eq!(
            std::fs::read(&snap).unwrap(),
            before,
            "the snapshot was rewritten"
        );
        assert_eq!(kv.compactions(), 0);
        let lines = std::fs::read_to_string(&log).unwrap().lines().count();
        assert_eq!(lines, 200);
    }
    // A crash in the middle of an append.
    let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
    std::io::Write::write_all(&mut f, b"{\"k\":\"x\",\"v").unwrap();
    drop(f);
    {
        let kv = FileKv::open(d.path()).unwrap();
        let all = kv.list("members/".into()).await.unwrap();
        assert_eq!(all.len(), 200);
        assert_eq!(kv.get("x".into()).await.unwrap(), None);
        for k in ["a", "b", "c"] {
            kv.compare_and_set(k.into(), None, "1".into())
                .await
                .unwrap();
        }
    }
    // Damage before the last line: refused, not skipped.
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(text.lines().count(), 3, "{text}");
    std::fs::write(&log, text.replacen("\"1\"", "\"2\"", 1)).unwrap();
    let e = FileKv::open(d.path()).err().expect("a damaged change");
    assert_eq!(e.code, strata_common::Code::Corrupted);
    assert!(e.message.contains("damaged change"), "{e}");
    // The same damage on the last line is a torn write: dropped.
    let lines: Vec<&str> = text.lines().collect();
    let damaged_last = format!(
        "{}\n{}\n{}\n",
        lines[0],
        lines[1],
        lines[2].replace("\"1\"", "\"2\"")
    );
    std::fs::write(&log, damaged_last).unwrap();
    let kv = FileKv::open(d.path()).unwrap();
    assert_eq!(kv.get("b".into()).await.unwrap().as_deref(), Some("1"));
    assert_eq!(kv.get("c".into()).await.unwrap(), None);
    drop(kv);

    // A format-1 state (a master from before the log) is read, and
    // rewritten as format 2 so that master would refuse it now.
    let d = tempfile::tempdir().unwrap();
    let snap = d.path().join("master-state.json");
    let entries = "\"handles/a\": \"7\"";
    let mut crc = crc32c::crc32c_append(0, b"handles/a\0");
    crc = crc32c::crc32c_append(crc, b"7\0");
    std::fs::write(
        &snap,
        format!("{{\"version\": 1, \"crc32c\": {crc}, \"entries\": {{{entries}}}}}"),
    )
    .unwrap();
    let kv = FileKv::open(d.path()).unwrap();
    assert_eq!(
        kv.get("handles/a".into()).await.unwrap().as_deref(),
        Some("7")
    );
    drop(kv);
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&snap).unwrap()).unwrap();
    assert_eq!(v["version"], 2);
    let newer = std::fs::read_to_string(&snap)
        .unwrap()
        .replace("\"version\": 2", "\"version\": 3");
    std::fs::write(&snap, newer).unwrap();
    let e = FileKv::open(d.path()).err().expect("a newer format");
    assert!(e.message.contains("format version 3"), "{e}");
}

/// The log is folded into the snapshot once it outgrows it (and 1 MiB):
/// a few times over thousands of changes, never per change, and nothing is
/// lost across the folds.
#[tokio::test]
async fn file_kv_folds_its_log_rarely_and_loses_nothing() {
    let d = tempfile::tempdir().unwrap();
    let value = "v".repeat(8 << 10);
    {
        let kv = FileKv::open(d.path()).unwrap();
        for i in 0..600 {
            assert!(kv
                .compare_and_set(format!("k{i}"), None, value.clone())
                .await
                .unwrap());
        }
        let n = kv.compactions();
        assert!((1..=4).contains(&n), "{n} compactions over 600 changes");
    }
    let kv = FileKv::open(d.path()).unwrap();
    let all = kv.list("k".into()).await.unwrap();
    assert_eq!(all.len(), 600);
    assert!(all.iter().all(|(_, v)| *v == value));
}
