//! One conformance suite run against every `Election` implementation: the
//! in-memory one and etcd (a real server on loopback).

use super::{Election, EtcdElection, Leadership, MemElection};
use crate::durable::EtcdServer;
use futures::future::BoxFuture;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

const TTL: Duration = Duration::from_secs(2);

struct Fixture {
    /// One election handle per candidate (separate etcd clients for etcd).
    candidates: Vec<Arc<dyn Election>>,
    /// Makes the store drop the leader's lease (as if it had expired).
    expire: Box<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>,
    _guard: Option<EtcdServer>,
}

async fn mem() -> Fixture {
    let e = MemElection::new(0, TTL);
    let e2 = e.clone();
    Fixture {
        candidates: (0..3)
            .map(|_| Arc::new(e.clone()) as Arc<dyn Election>)
            .collect(),
        expire: Box::new(move || {
            e2.expire_lease();
            Box::pin(async {})
        }),
        _guard: None,
    }
}

async fn etcd() -> Fixture {
    let server = EtcdServer::start().await;
    let mut candidates: Vec<Arc<dyn Election>> = Vec::new();
    for _ in 0..3 {
        let c = strata_common::leader::etcd_client(std::slice::from_ref(&server.endpoint))
            .await
            .unwrap();
        candidates.push(Arc::new(EtcdElection::new(c, "conf", TTL).unwrap()));
    }
    let admin = strata_common::leader::etcd_client(std::slice::from_ref(&server.endpoint))
        .await
        .unwrap();
    Fixture {
        candidates,
        expire: Box::new(move || {
            let admin = admin.clone();
            Box::pin(async move {
                let key = strata_common::leader::leader_key("conf");
                let r = admin.kv_client().get(key, None).await.unwrap();
                let lease = r.kvs().first().expect("a leader record").lease();
                admin.lease_client().revoke(lease).await.unwrap();
            })
        }),
        _guard: Some(server),
    }
}

/// Campaigns of every candidate; returns the first winner's index and
/// leadership, the other campaigns still running.
async fn first_winner(
    f: &Fixture,
    cancel: &CancellationToken,
) -> (
    usize,
    Leadership,
    Vec<tokio::task::JoinHandle<strata_common::Result<Leadership>>>,
) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for (i, e) in f.candidates.iter().enumerate() {
        let (e, tx, cancel) = (e.clone(), tx.clone(), cancel.clone());
        tasks.push(tokio::spawn(async move {
            let l = e.campaign(&format!("m{i}:1"), &cancel).await?;
            let _ = tx.send((i, l.clone()));
            Ok(l)
        }));
    }
    let (i, l) = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("someone wins within 10s")
        .unwrap();
    (i, l, tasks)
}

async fn one_leader_and_it_keeps_leading(f: Fixture) {
    let cancel = CancellationToken::new();
    let (i, l, tasks) = first_winner(&f, &cancel).await;
    assert!(l.is_valid());
    let rec = f.candidates[0].leader().await.unwrap().expect("a record");
    assert_eq!((rec.addr, rec.term), (format!("m{i}:1"), l.term));
    // The winner's task reported before it returned: wait (bounded) for it
    // to end, so only a second winner can make the count below differ.
    let t0 = Instant::now();
    while !tasks[i].is_finished() {
        assert!(t0.elapsed() < TTL, "the winner's campaign never returned");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Past two TTLs the winner still leads (keep-alives work) and nobody
    // else won.
    let until = Instant::now() + TTL * 2;
    while Instant::now() < until {
        assert!(l.is_valid(), "the leader lost its lease while renewing");
        let done = tasks.iter().filter(|t| t.is_finished()).count();
        assert_eq!(done, 1, "a second candidate won while the first leads");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cancel.cancel();
    for t in tasks {
        let _ = t.await.unwrap();
    }
    l.resign().await;
}

async fn resign_hands_over_at_once_with_a_higher_term(f: Fixture) {
    let cancel = CancellationToken::new();
    let (i, l, tasks) = first_winner(&f, &cancel).await;
    let t0 = Instant::now();
    l.resign().await;
    assert!(!l.is_valid() && l.lost().is_cancelled());
    // The next one wins well inside the TTL.
    let next = loop {
        if let Some(r) = f.candidates[0].leader().await.unwrap() {
            if r.addr != format!("m{i}:1") {
                break r;
            }
        }
        assert!(
            t0.elapsed() < TTL,
            "no takeover within the TTL after a resign"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(
        next.term > l.term,
        "terms only grow: {} then {}",
        l.term,
        next.term
    );
    cancel.cancel();
    for t in tasks {
        if let Ok(Ok(l)) = t.await {
            l.resign().await;
        }
    }
}

async fn a_lost_lease_ends_the_leadership(f: Fixture) {
    let cancel = CancellationToken::new();
    let (i, l, tasks) = first_winner(&f, &cancel).await;
    (f.expire)().await;
    tokio::time::timeout(TTL, l.lost().cancelled())
        .await
        .expect("the leader noticed its lost lease within the TTL");
    assert!(!l.is_valid());
    // Another candidate (or the same, campaigning again) takes a newer term.
    let t0 = Instant::now();
    let next = loop {
        if let Some(r) = f.candidates[0].leader().await.unwrap() {
            if r.term > l.term {
                break r;
            }
        }
        assert!(t0.elapsed() < TTL * 2, "no new leader after a lost lease");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_ne!(
        next.addr,
        format!("m{i}:1"),
        "the loser does not campaign again here"
    );
    cancel.cancel();
    for t in tasks {
        if let Ok(Ok(l)) = t.await {
            l.resign().await;
        }
    }
}

async fn a_cancelled_campaign_returns(f: Fixture) {
    let cancel = CancellationToken::new();
    let (_, l, tasks) = first_winner(&f, &cancel).await;
    cancel.cancel();
    for t in tasks {
        let r = tokio::time::timeout(Duration::from_secs(5), t)
            .await
            .expect("a cancelled campaign returns")
            .unwrap();
        if let Err(e) = r {
            assert_eq!(e.code, strata_common::Code::Cancelled);
        }
    }
    l.resign().await;
}

macro_rules! election_conformance {
    ($name:ident, $make:expr) => {
        mod $name {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn one_leader_and_it_keeps_leading() {
                super::one_leader_and_it_keeps_leading($make.await).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn resign_hands_over_at_once_with_a_higher_term() {
                super::resign_hands_over_at_once_with_a_higher_term($make.await).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_lost_lease_ends_the_leadership() {
                super::a_lost_lease_ends_the_leadership($make.await).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_cancelled_campaign_returns() {
                super::a_cancelled_campaign_returns($make.await).await;
            }
        }
    };
}

election_conformance!(memory_election, mem());
election_conformance!(etcd_election, etcd());

/// A fenced durable write from a deposed leader's term is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leaders_durable_writes_are_refused() {
    use crate::durable::{DurableKv, EtcdKv};
    let f = etcd().await;
    let cancel = CancellationToken::new();
    let (_, l, tasks) = first_winner(&f, &cancel).await;
    let ep = std::slice::from_ref(&f._guard.as_ref().unwrap().endpoint);
    let kv = EtcdKv::connect(ep, "conf").await.unwrap();
    let mine = kv.fenced("conf", l.term);
    assert!(mine
        .compare_and_set("a".into(), None, "1".into())
        .await
        .unwrap());
    let old = kv.fenced("conf", l.term - 1);
    let e = old
        .compare_and_set("b".into(), None, "1".into())
        .await
        .expect_err("an older term writes");
    assert_eq!(e.code, strata_common::Code::NotLeader, "{e}");
    assert_eq!(kv.get("b".into()).await.unwrap(), None);
    // A lost race under the right term is still a plain `false`.
    assert!(!mine
        .compare_and_set("a".into(), None, "2".into())
        .await
        .unwrap());
    l.resign().await;
    cancel.cancel();
    for t in tasks {
        if let Ok(Ok(l)) = t.await {
            l.resign().await;
        }
    }
}
