//! One-sided transfers over real UCX transports on loopback. Each target
//! runs on a thread of its own that progresses its worker (as a store node's
//! progress thread will): over `tcp`, UCX emulates RMA with the target's CPU.

use super::api::{Context, Endpoint, Region, Worker};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

const T: Duration = Duration::from_secs(10);

/// A registered buffer on its own thread, progressed until stopped.
struct Target {
    addr: Vec<u8>,
    key: Vec<u8>,
    base: u64,
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<u8>>,
}

impl Target {
    fn start(tls: &'static str, len: usize) -> Target {
        let (tx, rx) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let halt = stop.clone();
        let thread = std::thread::spawn(move || {
            let ctx = Context::new(Some(tls)).unwrap();
            let worker = Worker::new(&ctx).unwrap();
            let mut buf = vec![0u8; len];
            // SAFETY: buf outlives the region (dropped first, below).
            let region = unsafe { Region::map(&ctx, buf.as_mut_ptr(), len) }.unwrap();
            tx.send((
                worker.address().unwrap(),
                region.packed_key().unwrap(),
                region.addr(),
            ))
            .unwrap();
            while !halt.load(Ordering::Relaxed) {
                worker.progress();
            }
            drop(region);
            buf
        });
        let (addr, key, base) = rx.recv().unwrap();
        Target {
            addr,
            key,
            base,
            stop,
            thread,
        }
    }

    fn finish(self) -> Vec<u8> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

fn round_trip(tls: &'static str) {
    let target = Target::start(tls, 1 << 20);
    let ctx = Context::new(Some(tls)).unwrap();
    let worker = Worker::new(&ctx).unwrap();
    let ep = Endpoint::connect(&worker, &target.addr, tls.starts_with("sm")).unwrap();
    let key = ep.remote_key(&target.key).unwrap();
    let data: Vec<u8> = (0..65536u32).map(|i| (i * 7 % 251) as u8).collect();
    // SAFETY: `data` lives until the flush below completes.
    let put = unsafe { ep.put(&data, target.base + 4096, &key) };
    ep.wait(put, T).unwrap();
    ep.wait(ep.flush(), T).unwrap();
    let mut back = vec![0u8; data.len()];
    // SAFETY: `back` is not touched until the wait returns.
    let get = unsafe { ep.get(&mut back, target.base + 4096, &key) };
    ep.wait(get, T).unwrap();
    assert_eq!(back, data, "read back over {tls}");
    // A read of a neighbouring range sees what is there (zeros).
    let mut zeros = vec![1u8; 4096];
    // SAFETY: as above.
    let get = unsafe { ep.get(&mut zeros, target.base, &key) };
    ep.wait(get, T).unwrap();
    assert!(zeros.iter().all(|&b| b == 0));
    drop(key);
    drop(ep);
    let mem = target.finish();
    assert_eq!(
        &mem[4096..4096 + data.len()],
        &data[..],
        "landed in the target's memory"
    );
    assert!(
        mem[..4096].iter().all(|&b| b == 0) && mem[4096 + data.len()..].iter().all(|&b| b == 0)
    );
}

#[test]
fn one_sided_put_and_get_over_tcp() {
    round_trip("tcp");
}

#[test]
fn one_sided_put_and_get_over_shared_memory() {
    round_trip("sm,self");
}

#[test]
fn bad_addresses_and_keys_are_errors_not_crashes() {
    let ctx = Context::new(Some("tcp")).unwrap();
    let worker = Worker::new(&ctx).unwrap();
    assert!(Endpoint::connect(&worker, &[], false).is_err());
    assert!(Context::new(Some("no-such-transport")).is_err());
    let target = Target::start("tcp", 4096);
    let ep = Endpoint::connect(&worker, &target.addr, false).unwrap();
    assert!(ep.remote_key(&[]).is_err());
    drop(ep);
    target.finish();
}

#[test]
fn errors_map_to_retryable_codes() {
    use strata_common::Code;
    use strata_ucx_sys as sys;
    let e = super::api::ucx_error(sys::UCS_ERR_CONNECTION_RESET, "get");
    assert_eq!(e.code, Code::Unavailable);
    assert!(e.retryable());
    let e = super::api::ucx_error(sys::UCS_ERR_INVALID_PARAM, "get");
    assert_eq!(e.code, Code::InvalidArgument);
    assert!(!e.retryable());
}

mod engine {
    use super::super::engine::{Engine, Peer};
    use std::time::Duration;

    const T: Duration = Duration::from_secs(10);

    /// `dies`: whether the transports can tell a dead peer (UCX's
    /// shared-memory ones cannot, and in one process the "dead" target's
    /// memory is still there).
    async fn through_engines(tls: &'static str, dies: bool) {
        let target = Engine::start(Some(tls)).unwrap();
        let mut mem = vec![0u8; 1 << 20];
        // SAFETY: `mem` outlives the target engine (dropped first, below).
        let reg = unsafe { target.register(mem.as_mut_ptr(), mem.len()) }
            .await
            .unwrap();
        let client = Engine::start(Some(tls)).unwrap();
        let peer = Peer {
            worker: target.address().into(),
            rkey: reg.rkey.clone().into(),
            same_host: tls.starts_with("sm"),
        };
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
        client
            .put(&peer, reg.base + 100, data.clone(), T)
            .await
            .unwrap();
        let back = client
            .get(&peer, reg.base + 100, data.len(), T)
            .await
            .unwrap();
        assert_eq!(back, data);
        // A read, then words (issued once its bytes have landed, which no
        // test can time; answered in the order asked).
        let w = reg.base + (100 << 12);
        client
            .put(&peer, w, [7u64, 9].map(u64::to_ne_bytes).concat(), T)
            .await
            .unwrap();
        let at = |a: u64| (peer.clone(), a);
        let deadline = std::time::Instant::now() + T;
        let (bytes, words) = client
            .get_then(
                &peer,
                reg.base + 100,
                data.len(),
                vec![at(w + 8), at(w)],
                deadline,
            )
            .await
            .unwrap();
        assert_eq!((&bytes[..], &words[..]), (&data[..], &[9, 7][..]));
        // A word no key opens: an error, nothing left in flight.
        let unkeyed = Peer {
            rkey: Vec::new().into(),
            ..peer.clone()
        };
        let r = client
            .get_then(&peer, reg.base, 16, vec![(unkeyed.clone(), w)], deadline)
            .await;
        assert!(r.is_err(), "a word without a key was read");
        // Bytes no key opens, with words pending: an error.
        let r = client
            .get_then(&unkeyed, reg.base, 16, vec![at(w)], deadline)
            .await;
        assert!(r.is_err(), "bytes without a key were read");
        // Words on another worker than the bytes are refused.
        let elsewhere = Peer {
            worker: client.address().into(),
            ..peer.clone()
        };
        let r = client
            .get_then(&peer, reg.base, 16, vec![(elsewhere, w)], deadline)
            .await;
        assert!(r.is_err(), "a word on another worker was read");
        // The engine still serves after all of them.
        let (bytes, words) = client
            .get_then(&peer, reg.base + 100, 8, vec![at(w)], deadline)
            .await
            .unwrap();
        assert_eq!((&bytes[..], &words[..]), (&data[..8], &[7][..]));
        // Many transfers at once, each to its own range.
        let puts =
            (0..32u64).map(|i| client.put(&peer, reg.base + (i << 12), vec![i as u8 + 1; 4096], T));
        for r in futures::future::join_all(puts).await {
            r.unwrap();
        }
        let gets = (0..32u64).map(|i| client.get(&peer, reg.base + (i << 12), 4096, T));
        for (i, r) in futures::future::join_all(gets)
            .await
            .into_iter()
            .enumerate()
        {
            assert_eq!(r.unwrap(), vec![i as u8 + 1; 4096]);
        }
        assert_eq!(&mem[(5 << 12)..(5 << 12) + 4], &[6, 6, 6, 6]);
        // The target goes away: operations to it fail, retryably, and
        // never hang.
        drop(target);
        if dies {
            let e = client
                .get(&peer, reg.base, 16, Duration::from_secs(5))
                .await
                .unwrap_err();
            assert!(e.retryable(), "{e:?}");
        }
        drop(client);
        drop(mem);
    }

    #[tokio::test]
    async fn engine_transfers_over_tcp() {
        through_engines("tcp", true).await;
    }

    #[tokio::test]
    async fn engine_transfers_over_shared_memory() {
        through_engines("sm,self", false).await;
    }
}
