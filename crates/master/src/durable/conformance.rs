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
