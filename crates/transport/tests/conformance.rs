//! The data-plane conformance suite: what every [`Transport`] must do, run
//! against each implementation through [`conformance_suite!`]. A new
//! transport adds a fixture (a server that serves a segment under a grant
//! key, and a client transport) and one macro line; docs/transports.md says
//! what the trait promises.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use strata_common::grant::{GrantKey, GrantScope, PERM_READ, PERM_WRITE};
use strata_common::Code;
use strata_transport::region::{Segment, SegmentTable};
use strata_transport::{RemoteRange, Transport};

const SEGMENT: u64 = 7;
const SEGMENT_LEN: usize = 64 << 20;

/// A node serving one segment, and a client transport to it.
struct Fixture {
    transport: Arc<dyn Transport>,
    addr: String,
    key: GrantKey,
    /// Kills the node: connections drop, nothing answers any more.
    kill: Box<dyn FnOnce() + Send>,
}

impl Fixture {
    /// A signed range of the served segment.
    fn range(&self, offset: u64, length: u64, perm: u32, generation: u64) -> RemoteRange {
        let scope = GrantScope {
            perm,
            segment_id: SEGMENT,
            offset,
            length,
            expires_unix_ms: u64::MAX,
            generation,
        };
        RemoteRange {
            addr: self.addr.clone(),
            mac: self.key.sign(&scope),
            scope,
        }
    }
}

fn data(seed: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (i.wrapping_mul(31).wrapping_add(seed) % 251) as u8)
        .collect()
}

/// Writes and reads inside a grant; sub-ranges; refuses transfers past it.
async fn ranges_and_bounds(f: Fixture) {
    let w = f.range(4096, 8192, PERM_WRITE | PERM_READ, 1);
    let bytes = data(1, 8192);
    f.transport.write(&w, 0, &bytes).await.unwrap();
    let mut back = vec![0u8; 8192];
    f.transport.read(&w, 0, &mut back).await.unwrap();
    assert_eq!(back, bytes);
    // A sub-range, at an offset inside the grant.
    let mut part = vec![0u8; 100];
    f.transport.read(&w, 8000, &mut part).await.unwrap();
    assert_eq!(part, bytes[8000..8100]);
    // The last byte is inside, one more is not.
    let mut last = [0u8; 1];
    f.transport.read(&w, 8191, &mut last).await.unwrap();
    assert_eq!(last[0], bytes[8191]);
    let e = f.transport.read(&w, 8191, &mut [0u8; 2]).await.unwrap_err();
    assert_eq!(e.code, Code::InvalidArgument);
    let e = f.transport.write(&w, 8192, &[1]).await.unwrap_err();
    assert_eq!(e.code, Code::InvalidArgument);
    // The checksum a read reports is that of the bytes read.
    let crc = f.transport.read_crc32c(&w, 0, &mut back).await.unwrap();
    assert_eq!(crc, crc32c::crc32c(&bytes));
    (f.kill)();
}

/// A range the grant does not cover, a forged grant and a missing
/// permission are all refused by the node.
async fn out_of_grant_access_is_refused(f: Fixture) {
    let w = f.range(0, 4096, PERM_WRITE | PERM_READ, 1);
    f.transport.write(&w, 0, &data(2, 4096)).await.unwrap();
    // Widening a signed grant breaks its signature.
    let mut wide = w.clone();
    wide.scope.length = 1 << 20;
    let e = f
        .transport
        .read(&wide, 0, &mut vec![0u8; 8192])
        .await
        .unwrap_err();
    assert_eq!(e.code, Code::PermissionDenied, "{e:?}");
    // A neighbour's range under this grant's signature.
    let mut moved = w.clone();
    moved.scope.offset = 4096;
    let e = f
        .transport
        .read(&moved, 0, &mut [0u8; 16])
        .await
        .unwrap_err();
    assert_eq!(e.code, Code::PermissionDenied, "{e:?}");
    // Read-only grants cannot write; write-only ones cannot read.
    let ro = f.range(8192, 4096, PERM_READ, 2);
    let e = f.transport.write(&ro, 0, &[1; 16]).await.unwrap_err();
    assert_eq!(e.code, Code::PermissionDenied, "{e:?}");
    let wo = f.range(0, 4096, PERM_WRITE, 1);
    let e = f.transport.read(&wo, 0, &mut [0u8; 16]).await.unwrap_err();
    assert_eq!(e.code, Code::PermissionDenied, "{e:?}");
    // None of it touched the granted bytes.
    let mut back = vec![0u8; 4096];
    f.transport.read(&w, 0, &mut back).await.unwrap();
    assert_eq!(back, data(2, 4096));
    (f.kill)();
}

/// Many transfers at once, each to its own range, all land intact; a batch
/// read returns each item's checksum, and a bad item fails alone.
async fn concurrent_transfers(f: Fixture) {
    let ranges: Vec<RemoteRange> = (0..32u64)
        .map(|i| f.range(i * 65536, 65536, PERM_WRITE | PERM_READ, 1))
        .collect();
    let payloads: Vec<Vec<u8>> = (0..32).map(|i| data(i, 65536)).collect();
    let writes = ranges
        .iter()
        .zip(&payloads)
        .map(|(r, d)| f.transport.write(r, 0, d));
    for r in futures::future::join_all(writes).await {
        r.unwrap();
    }
    let mut bufs: Vec<Vec<u8>> = vec![vec![0u8; 65536]; 32];
    let reads = ranges
        .iter()
        .zip(bufs.iter_mut())
        .map(|(r, b)| f.transport.read(r, 0, b));
    for r in futures::future::join_all(reads).await {
        r.unwrap();
    }
    assert!(bufs.iter().zip(&payloads).all(|(b, d)| b == d));
    let mut forged = ranges[3].clone();
    forged.mac[0] ^= 1;
    let mut out: Vec<Vec<u8>> = vec![vec![0u8; 65536]; 3];
    let [a, b, c] = &mut out[..] else {
        unreachable!()
    };
    let items = vec![
        (&ranges[1], &mut a[..]),
        (&forged, &mut b[..]),
        (&ranges[2], &mut c[..]),
    ];
    let got = f.transport.read_many(items).await;
    assert_eq!(got[0], Ok(crc32c::crc32c(&payloads[1])));
    assert_eq!(got[1].as_ref().unwrap_err().code, Code::PermissionDenied);
    assert_eq!(got[2], Ok(crc32c::crc32c(&payloads[2])));
    (f.kill)();
}

/// Objects of 16 MiB go through whole (transports may split them).
async fn large_objects(f: Fixture) {
    let r = f.range(1 << 20, 16 << 20, PERM_WRITE | PERM_READ, 1);
    let bytes = data(9, 16 << 20);
    f.transport.write(&r, 0, &bytes).await.unwrap();
    let mut back = vec![0u8; 16 << 20];
    let crc = f.transport.read_crc32c(&r, 0, &mut back).await.unwrap();
    assert!(back == bytes, "16 MiB read back intact");
    assert_eq!(crc, crc32c::crc32c(&bytes));
    (f.kill)();
}

/// A node that dies fails transfers to it, retryably, within the
/// transport's timeouts: never a hang, never a success.
async fn a_dead_node_fails_transfers(f: Fixture) {
    let r = f.range(0, 16 << 20, PERM_WRITE | PERM_READ, 1);
    f.transport.write(&r, 0, &data(4, 16 << 20)).await.unwrap();
    (f.kill)();
    let mut back = vec![0u8; 16 << 20];
    let res = tokio::time::timeout(Duration::from_secs(60), f.transport.read(&r, 0, &mut back))
        .await
        .expect("a read from a dead node must end");
    let e = res.unwrap_err();
    assert!(e.retryable(), "{e:?}");
}

macro_rules! conformance_suite {
    ($name:ident, $fixture:expr) => {
        mod $name {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn ranges_and_bounds() {
                super::ranges_and_bounds($fixture.await).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn out_of_grant_access_is_refused() {
                super::out_of_grant_access_is_refused($fixture.await).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn concurrent_transfers() {
                super::concurrent_transfers($fixture.await).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn large_objects() {
                super::large_objects($fixture.await).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_dead_node_fails_transfers() {
                super::a_dead_node_fails_transfers($fixture.await).await
            }
        }
    };
}

/// The TCP data plane: `tcp::serve` over a [`SegmentTable`], on a runtime
/// of its own so that killing it drops every connection at once.
async fn tcp() -> Fixture {
    use prometheus::IntCounter;
    use strata_transport::tcp::{serve, ServerMetrics, TcpTransport, TcpTransportConfig};
    let key = GrantKey::random();
    let table = SegmentTable::new();
    let segment = Arc::new(Segment::new(SEGMENT_LEN).unwrap());
    table.install(key.clone(), HashMap::from([(SEGMENT, segment)]));
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let node = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            addr_tx
                .send(listener.local_addr().unwrap().to_string())
                .unwrap();
            let c = |n: &str| IntCounter::new(n, n).unwrap();
            let metrics = ServerMetrics {
                requests: c("requests"),
                read_bytes: c("read_bytes"),
                written_bytes: c("written_bytes"),
                rejected: c("rejected"),
                refused_connections: c("refused_connections"),
                cut_off: c("cut_off"),
            };
            let shutdown = tokio_util::sync::CancellationToken::new();
            tokio::spawn(serve(listener, Arc::new(table), metrics, shutdown));
            let _ = stopped.await;
        });
        // Dropping the runtime drops every connection task and its socket.
        drop(rt);
    });
    let addr = addr_rx.recv().unwrap();
    Fixture {
        transport: Arc::new(TcpTransport::new(TcpTransportConfig::default())),
        addr,
        key,
        kill: Box::new(move || {
            let _ = stop.send(());
            node.join().unwrap();
        }),
    }
}

conformance_suite!(over_tcp, tcp());
