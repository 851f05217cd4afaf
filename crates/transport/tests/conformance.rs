//! The data-plane conformance suite: what every [`Transport`] must do, run
//! against each implementation through [`conformance_suite!`]. A new
//! transport adds a fixture (a server that serves a segment under a grant
//! key, and a client transport) and one macro line; docs/transports.md says
//! what the trait promises.

use futures::future::BoxFuture;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use strata_common::grant::{
    GrantKey, GrantScope, PutRecord, MAC_LEN, PERM_READ, PERM_STAGE, PERM_WRITE,
};
use strata_common::{Code, Result};
use strata_transport::frame::{Request, Staged, WriteRecord};
use strata_transport::lend::{LendMetrics, Lender};
use strata_transport::region::{DataRegion, ReadSource, Segment, SegmentTable, WriteTarget};
use strata_transport::{RemoteRange, Transport, WriteItem};

const SEGMENT: u64 = 7;
const SEGMENT_LEN: usize = 64 << 20;

/// A node serving one segment, and a client transport to it.
struct Fixture {
    transport: Arc<dyn Transport>,
    addr: String,
    key: GrantKey,
    /// Kills the node: connections drop, nothing answers any more.
    kill: Box<dyn FnOnce() + Send>,
    /// The route fingerprint ranges carry (0: none).
    ucx_route: u64,
    /// Whether the node checks each access's grant. One-sided transports
    /// (UCX for rdma clients) cannot: the client checks bounds, permission
    /// and expiry itself, and a forged grant is not caught (the rdma role is
    /// trusted with whole segments; see docs/transports.md).
    checks_signatures: bool,
    /// Transfers that went one-sided so far.
    one_sided: Box<dyn Fn() -> u64 + Send + Sync>,
    /// One-sided reads the node's published revocations turned to TCP.
    unconfirmed: Box<dyn Fn() -> u64 + Send + Sync>,
    /// One-sided reads done by cross-memory attach to the node's process,
    /// and whether the fixture's client should do them.
    attached: Box<dyn Fn() -> u64 + Send + Sync>,
    attaches: bool,
    /// Of those, reads copied from the node's shared segment mapped into
    /// the client, and writes copied into it; whether the fixture's client
    /// should do them.
    mapped: Box<dyn Fn() -> (u64, u64) + Send + Sync>,
    maps: bool,
    /// The node lends staged reads (its transport can read them
    /// one-sided): bytes lent so far, slots lent now, and slots taken back
    /// because their reader's connection closed.
    lent: Box<dyn Fn() -> (u64, usize, u64) + Send + Sync>,
    /// The client reads grants that allow it through lent staging.
    stages: bool,
    /// The node's served segments, as the master's log changes them.
    table: Arc<SegmentTable>,
    segment: Arc<Segment>,
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
            ucx_route: self.ucx_route,
        }
    }
}

impl Fixture {
    /// The put of `bytes` under `key` into `w`, and the record the master
    /// signs for it.
    fn record<'k>(
        &self,
        key: &'k str,
        w: &RemoteRange,
        bytes: &[u8],
    ) -> (PutRecord<'k>, WriteRecord) {
        let put = PutRecord {
            key,
            segment_id: w.scope.segment_id,
            offset: w.scope.offset,
            length: w.scope.length,
            generation: w.scope.generation,
            crc32c: crc32c::crc32c(bytes),
        };
        let record = WriteRecord {
            key: key.into(),
            crc32c: put.crc32c,
            mac: self.key.sign_record(&put),
        };
        (put, record)
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
    // The fixture's path was the one taken: one-sided exactly when the
    // node does not check grants, by cross-memory attach where it should.
    assert_eq!((f.one_sided)() > 0, !f.checks_signatures);
    assert_eq!((f.attached)() > 0, f.attaches);
    let (reads, writes) = (f.mapped)();
    assert_eq!((reads > 0, writes > 0), (f.maps, f.maps));
    (f.kill)();
}

/// A range the grant does not cover, a forged grant and a missing
/// permission are all refused by the node.
async fn out_of_grant_access_is_refused(f: Fixture) {
    let w = f.range(0, 4096, PERM_WRITE | PERM_READ, 1);
    f.transport.write(&w, 0, &data(2, 4096)).await.unwrap();
    if f.checks_signatures {
        forged_grants_are_refused(&f, &w).await;
    }
    // Read-only grants cannot write; write-only ones cannot read.
    let ro = f.range(8192, 4096, PERM_READ, 2);
    let e = f.transport.write(&ro, 0, &[1; 16]).await.unwrap_err();
    assert_eq!(e.code, Code::PermissionDenied, "{e:?}");
    let wo = f.range(0, 4096, PERM_WRITE, 1);
    let e = f.transport.read(&wo, 0, &mut [0u8; 16]).await.unwrap_err();
    assert_eq!(e.code, Code::PermissionDenied, "{e:?}");
    // An expired grant.
    let mut old = f.range(0, 4096, PERM_READ, 1);
    old.scope.expires_unix_ms = 1;
    old.mac = f.key.sign(&old.scope);
    let e = f.transport.read(&old, 0, &mut [0u8; 16]).await.unwrap_err();
    assert_eq!(e.code, Code::PermissionDenied, "{e:?}");
    // None of it touched the granted bytes.
    let mut back = vec![0u8; 4096];
    f.transport.read(&w, 0, &mut back).await.unwrap();
    assert_eq!(back, data(2, 4096));
    (f.kill)();
}

/// Grants die with their range, one-sided reads included: once the node
/// has applied a free, a read under the freed allocation's grant is refused
/// (a one-sided transport checks what the node publishes, and the node's
/// fences decide on a failed check), while other grants still read, one-sided
/// where the transport is; a segment served under a new id (the node
/// registered again) refuses the old id's grants. Locations read this way
/// may be kept past their lookup.
async fn a_freed_range_refuses_its_old_grant(f: Fixture) {
    let rw = PERM_WRITE | PERM_READ;
    let a = f.range(0, 8192, rw, 10);
    let b = f.range(65536, 8192, rw, 11);
    // An older allocation starting in the granule of a newer one.
    let c = f.range(4 * 4096 + 64, 4096, rw, 5);
    let d = f.range(4 * 4096, 64, rw, 12);
    for (i, r) in [&a, &b, &c, &d].into_iter().enumerate() {
        f.transport
            .write(r, 0, &data(i as u64, r.len() as usize))
            .await
            .unwrap();
    }
    let mut buf = vec![0u8; 8192];
    f.transport.read(&a, 0, &mut buf).await.unwrap();
    assert_eq!(buf, data(0, 8192));
    assert!(
        f.transport.refuses_revoked(&a),
        "a fresh route's reads are checked"
    );
    f.table.freed(SEGMENT, 0, 8192, 10);
    f.table.freed(SEGMENT, 4 * 4096, 64, 12);
    let e = f.transport.read(&a, 0, &mut buf).await.unwrap_err();
    assert_eq!(e.code, Code::PermissionDenied, "{e:?}");
    let e = f
        .transport
        .read(&a, 4096, &mut buf[..16])
        .await
        .unwrap_err();
    assert_eq!(e.code, Code::PermissionDenied, "a sub-range too: {e:?}");
    let e = f.transport.read(&d, 0, &mut buf[..64]).await.unwrap_err();
    assert_eq!(e.code, Code::PermissionDenied, "{e:?}");
    // The neighbours still read; the one-sided one without the node.
    let before = (f.one_sided)();
    f.transport.read(&b, 0, &mut buf).await.unwrap();
    assert_eq!(buf, data(1, 8192));
    assert_eq!((f.one_sided)() > before, !f.checks_signatures);
    // The older one in the freed one's granule reads too: the published
    // check cannot tell it apart (one-sided, it is turned to TCP), the
    // node's fences can.
    let turned = (f.unconfirmed)();
    f.transport.read(&c, 0, &mut buf[..4096]).await.unwrap();
    assert_eq!(buf[..4096], data(2, 4096));
    assert_eq!((f.unconfirmed)() > turned, !f.checks_signatures);
    // Registered again, with another master: a new key and stamp, and the
    // same segment id (every master numbers segments afresh). The old
    // grant is refused, one-sided or not.
    f.table.install(
        GrantKey::random(),
        HashMap::from([(SEGMENT, f.segment.clone())]),
        STAMP + 1,
    );
    let e = f.transport.read(&b, 0, &mut buf).await.unwrap_err();
    assert_eq!(e.code, Code::PermissionDenied, "{e:?}");
    (f.kill)();
}

/// A write under a grant that died (its allocation freed, or the node
/// registered again, with another master) does not land, one-sided or not:
/// a one-sided transport checks the node's published words before writing
/// and sends such a write to the node's fenced path, which refuses it.
async fn a_dead_grant_writes_nothing(f: Fixture) {
    let rw = PERM_WRITE | PERM_READ;
    let a = f.range(0, 8192, rw, 10);
    let b = f.range(65536, 8192, rw, 11);
    f.transport.write(&a, 0, &data(1, 8192)).await.unwrap();
    f.transport.write(&b, 0, &data(2, 8192)).await.unwrap();
    f.table.freed(SEGMENT, 0, 8192, 10);
    let e = f.transport.write(&a, 0, &data(3, 8192)).await.unwrap_err();
    assert_eq!(e.code, Code::PermissionDenied, "{e:?}");
    assert!(
        f.segment.slice(0, 8192).unwrap() == data(1, 8192),
        "a freed grant's write landed"
    );
    // The neighbour's grant still writes, one-sided where the transport is.
    let before = (f.one_sided)();
    f.transport.write(&b, 0, &data(4, 8192)).await.unwrap();
    assert_eq!((f.one_sided)() > before, !f.checks_signatures);
    assert!(f.segment.slice(65536, 8192).unwrap() == data(4, 8192));
    // Registered again, with another master: a new key and stamp, and the
    // same segment id. The old registration's grant writes nothing.
    f.table.install(
        GrantKey::random(),
        HashMap::from([(SEGMENT, f.segment.clone())]),
        STAMP + 1,
    );
    let e = f.transport.write(&b, 0, &data(5, 8192)).await.unwrap_err();
    assert_eq!(e.code, Code::PermissionDenied, "{e:?}");
    assert!(
        f.segment.slice(65536, 8192).unwrap() == data(4, 8192),
        "an earlier registration's write landed"
    );
    (f.kill)();
}

/// A write whose grant ends soon still lands, and a one-sided transport
/// sends it through the node's fenced path instead: once the grant has
/// ended, the range may belong to another object.
async fn a_write_near_its_grants_end_is_fenced(f: Fixture) {
    let mut w = f.range(0, 4096, PERM_WRITE | PERM_READ, 1);
    w.scope.expires_unix_ms = strata_common::time::unix_ms() + 1500;
    w.mac = f.key.sign(&w.scope);
    let before = (f.one_sided)();
    f.transport.write(&w, 0, &data(5, 4096)).await.unwrap();
    assert_eq!((f.one_sided)(), before, "a write this late went one-sided");
    // With time to spare (a second past the margin), a one-sided transport
    // writes one-sided.
    let mut later = w.clone();
    later.scope.expires_unix_ms = strata_common::time::unix_ms() + 3_000;
    later.mac = f.key.sign(&later.scope);
    f.transport.write(&later, 0, &data(6, 4096)).await.unwrap();
    assert_eq!((f.one_sided)() > before, !f.checks_signatures);
    let mut back = vec![0u8; 4096];
    f.transport.read(&later, 0, &mut back).await.unwrap();
    assert_eq!(back, data(6, 4096));
    (f.kill)();
}

/// A widened or moved grant (its signature no longer matches) is refused.
async fn forged_grants_are_refused(f: &Fixture, w: &RemoteRange) {
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
    if f.checks_signatures {
        assert_eq!(got[1].as_ref().unwrap_err().code, Code::PermissionDenied);
    } else {
        // What the rdma role is trusted with: nothing checks the signature.
        assert_eq!(got[1], Ok(crc32c::crc32c(&payloads[3])));
    }
    assert_eq!(got[2], Ok(crc32c::crc32c(&payloads[2])));
    // An item past its grant fails alone, whatever the transport.
    let mut short = ranges[4].clone();
    short.scope.length = 100;
    short.mac = f.key.sign(&short.scope);
    let (mut x, mut y) = (vec![0u8; 65536], vec![0u8; 65536]);
    let got = f
        .transport
        .read_many(vec![(&short, &mut x[..]), (&ranges[5], &mut y[..])])
        .await;
    assert_eq!(got[0].as_ref().unwrap_err().code, Code::InvalidArgument);
    assert_eq!(got[1], Ok(crc32c::crc32c(&payloads[5])));
    (f.kill)();
}

/// Cuts `bytes` at `cuts` (ascending, inside it) into parts.
fn cut<'a>(bytes: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
    let mut at = 0;
    let mut out = Vec::new();
    for &c in cuts.iter().chain(std::iter::once(&bytes.len())) {
        out.push(&bytes[at..c]);
        at = c;
    }
    out
}

/// Objects made of parts (scatter-gather): written from uneven parts (an
/// empty one too, larger than a chunk in all), read back into another
/// split, alone or in a batch, with the checksum of the whole; recorded
/// like a whole buffer; parts past the grant are refused.
async fn objects_of_parts(f: Fixture) {
    let len = (5 << 20) + 12_345;
    let bytes = data(11, len);
    let w = f.range(0, len as u64, PERM_WRITE | PERM_READ, 1);
    // The last cut is 3 bytes short of a 4 MiB chunk: a part straddles it.
    let parts = cut(&bytes, &[1, 4096, 4096, 65_543, (4 << 20) - 3]);
    assert_eq!(parts.len(), 6);
    let receipt = f.transport.write_parts(&w, &parts, None).await.unwrap();
    assert_eq!(receipt, None);
    let mut back = vec![0u8; len];
    let crc = f.transport.read_crc32c(&w, 0, &mut back).await.unwrap();
    assert!(back == bytes, "the parts' concatenation landed");
    assert_eq!(crc, crc32c::crc32c(&bytes));
    // Read into another split.
    let mut into = vec![0u8; len];
    let (a, rest) = into.split_at_mut(333_333);
    let (b, c) = rest.split_at_mut(len - 333_333 - 1);
    let crc = f.transport.read_parts(&w, vec![a, b, c]).await.unwrap();
    assert!(into == bytes, "read into the parts in order");
    assert_eq!(crc, crc32c::crc32c(&bytes));
    // A batch: an object of parts beside a whole one.
    let small = f.range(8 << 20, 4096, PERM_WRITE | PERM_READ, 2);
    let other = data(12, 4096);
    f.transport
        .write_parts(&small, &[&other[..]], None)
        .await
        .unwrap();
    let mut into = vec![0u8; len];
    let (a, b) = into.split_at_mut(7);
    let mut one = vec![0u8; 4096];
    let got = f
        .transport
        .read_many_parts(vec![(&w, vec![a, b]), (&small, vec![&mut one[..]])])
        .await;
    assert_eq!(got.len(), 2);
    assert_eq!(got[0], Ok(crc32c::crc32c(&bytes)));
    assert_eq!(got[1], Ok(crc32c::crc32c(&other)));
    assert!(into == bytes && one == other);
    // Hashed with BLAKE3 too when asked (as the bytes land, where the
    // transport streams them): whole objects of one request and of several
    // chunks, into one buffer and into parts.
    let blake3 = |b: &[u8]| Some(*blake3::hash(b).as_bytes());
    let mut into = vec![0u8; len];
    let (a, b) = into.split_at_mut(len / 3);
    let v = f
        .transport
        .read_parts_verified(&w, vec![a, b], true)
        .await
        .unwrap();
    assert!(into == bytes);
    assert_eq!(
        (v.crc32c, v.blake3),
        (crc32c::crc32c(&bytes), blake3(&bytes))
    );
    let mut one = vec![0u8; 4096];
    let v = f
        .transport
        .read_parts_verified(&small, vec![&mut one[..]], true)
        .await
        .unwrap();
    assert_eq!(
        (v.crc32c, v.blake3),
        (crc32c::crc32c(&other), blake3(&other))
    );
    let (mut x, mut y) = (vec![0u8; 1000], vec![0u8; 3096]);
    let v = f
        .transport
        .read_parts_verified(&small, vec![&mut x[..], &mut y[..]], true)
        .await
        .unwrap();
    assert!(x[..] == other[..1000] && y[..] == other[1000..]);
    assert_eq!(v.blake3, blake3(&other));
    let v = f
        .transport
        .read_parts_verified(&small, vec![&mut one[..]], false)
        .await
        .unwrap();
    assert_eq!((v.crc32c, v.blake3), (crc32c::crc32c(&other), None));
    // Parts one byte past the grant: refused, whichever way.
    let (mut x, mut y) = (vec![0u8; 4096], vec![0u8; 1]);
    let e = f
        .transport
        .read_parts(&small, vec![&mut x[..], &mut y[..]])
        .await
        .unwrap_err();
    assert_eq!(e.code, Code::InvalidArgument, "{e}");
    let e = f
        .transport
        .write_parts(&small, &[&other[..], &[1u8][..]], None)
        .await
        .unwrap_err();
    assert_eq!(e.code, Code::InvalidArgument, "{e}");
    // Recorded: the node's receipt for the whole object, as for one buffer.
    let (put, record) = f.record("prefix/parts", &small, &other);
    let receipt = f
        .transport
        .write_parts(&small, &cut(&other, &[100, 2000]), Some(&record))
        .await
        .unwrap();
    if f.transport.records_writes(other.len()) {
        assert!(f.key.verify_receipt(&put, &receipt.expect("a receipt")));
    } else {
        assert_eq!(receipt, None);
    }
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

/// Reads whose grants allow staging (what the master gives rdma callers
/// for SSD objects) get every byte right, whole and in part; a transport
/// that stages reads them through the node's lend window, piece by piece,
/// and gives every slot back. A grant without the bit stages nothing.
async fn reads_through_lent_staging(f: Fixture) {
    let len = (5 << 20) + 3;
    let w = f.range(0, len, PERM_WRITE | PERM_READ, 1);
    let bytes = data(11, len as usize);
    f.transport.write(&w, 0, &bytes).await.unwrap();
    let r = f.range(0, len, PERM_READ | PERM_STAGE, 1);
    let mut back = vec![0u8; len as usize];
    let crc = f.transport.read_crc32c(&r, 0, &mut back).await.unwrap();
    assert!(back == bytes, "read back intact");
    assert_eq!(crc, crc32c::crc32c(&bytes));
    let mut part = vec![0u8; 100];
    f.transport
        .read(&r, (1 << 20) + 5, &mut part)
        .await
        .unwrap();
    assert_eq!(part, bytes[(1 << 20) + 5..(1 << 20) + 105]);
    if f.stages {
        assert_eq!(
            (f.lent)().0,
            len + 100,
            "every byte read came through the window"
        );
    } else {
        assert_eq!((f.lent)().0, 0);
    }
    let mut given_back = false;
    for _ in 0..250 {
        if (f.lent)().1 == 0 {
            given_back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(given_back, "every lent slot was given back");
    // More readers of several pieces each than the window has slots (the
    // UCX fixtures lend 4): each gives a slot back as soon as it has read
    // it, so none holds one while it waits for another, and all finish.
    let size = (2 << 20) + 1;
    let objects: Vec<(RemoteRange, Vec<u8>)> = (0..8u64)
        .map(|i| {
            let off = (8 << 20) + i * (4 << 20);
            (
                f.range(off, size, PERM_WRITE | PERM_READ | PERM_STAGE, 1),
                data(20 + i, size as usize),
            )
        })
        .collect();
    for (r, d) in &objects {
        f.transport.write(r, 0, d).await.unwrap();
    }
    let mut bufs = vec![vec![0u8; size as usize]; objects.len()];
    let reads = objects
        .iter()
        .zip(bufs.iter_mut())
        .map(|((r, _), b)| f.transport.read(r, 0, b));
    for r in futures::future::join_all(reads).await {
        r.unwrap();
    }
    assert!(bufs.iter().zip(&objects).all(|(b, (_, d))| b == d));
    let lent = (f.lent)().0;
    if f.stages {
        assert_eq!(lent, len + 100 + 8 * size);
    }
    // The bit is signed: without it, or added by the client, nothing is
    // staged (a node that lends nothing refuses every stage).
    let tcp = strata_transport::tcp::TcpTransport::new(Default::default());
    let plain = f.range(0, 4096, PERM_READ, 1);
    let mut forged = plain.clone();
    forged.scope.perm |= PERM_STAGE;
    for g in [&plain, &forged] {
        let e = tcp.stage(g, 0, 4096).await.unwrap_err();
        let want = match f.stages {
            true => Code::PermissionDenied,
            false => Code::InvalidArgument,
        };
        assert_eq!(e.code, want, "{e:?}");
    }
    assert_eq!((f.lent)().0, lent);
    if f.stages {
        leases_held_by_a_connection_die_with_it(&f, &r).await;
    }
    (f.kill)();
}

/// Waits (bounded) until the node lends `n` slots.
async fn until_lent(f: &Fixture, n: usize) -> bool {
    for _ in 0..250 {
        if (f.lent)().1 == n {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// A lease staged with `FLAG_HELD` is given back on its own connection, or
/// taken back by the node as soon as that connection closes (a reader that
/// died), long before its TTL; one staged without the flag is not.
async fn leases_held_by_a_connection_die_with_it(f: &Fixture, r: &RemoteRange) {
    use strata_transport::tcp::TcpTransport;
    assert!(until_lent(f, 0).await, "nothing lent to start with");
    let before = (f.lent)().2;
    assert_eq!(before, 0, "live readers gave every slot back themselves");
    // Given back on its connection: nothing is reclaimed, and the
    // connection goes back to the pool (the next stage reuses it).
    let tcp = TcpTransport::new(Default::default());
    let (st, held) = tcp.stage_held(r, 0, 4096).await.unwrap();
    assert_eq!((st.length, (f.lent)().1), (4096, 1));
    tcp.give_back_held(held).await.unwrap();
    assert_eq!(((f.lent)().1, (f.lent)().2), (0, before));
    // An unflagged lease outlives its connection (older readers may give
    // it back on another one)...
    let plain = TcpTransport::new(Default::default());
    let unheld = plain.stage(r, 0, 4096).await.unwrap();
    drop(plain);
    // ...a held one does not: the reader "dies" holding it.
    let dying = TcpTransport::new(Default::default());
    let (_, held) = dying.stage_held(r, 4096, 4096).await.unwrap();
    assert_eq!((f.lent)().1, 2);
    drop(held);
    drop(dying);
    assert!(
        until_lent(f, 1).await,
        "the node took the held lease back when its connection closed"
    );
    assert_eq!((f.lent)().2, before + 1);
    // The unflagged lease was still lent: it gives back once.
    tcp.give_back(&r.addr, unheld.lease, unheld.token)
        .await
        .unwrap();
    assert_eq!((f.lent)().1, 0);
    assert_eq!((f.lent)().2, before + 1, "given back, not reclaimed");
}

/// A write that carries a put's record lands like any other. A transport
/// whose writes reach the node's CPU (`records_writes`) delivers the record
/// and brings back the node's receipt for these very bytes, and a record
/// the master did not sign is refused; one that cannot (one-sided writes)
/// writes plainly and brings none, and so does any transport for a write
/// that does not cover its whole grant. The fixture's node only checks the
/// record's signature (`Lending::record_put`): this is the transport's
/// part; what a store node keeps, and when it refuses, is tested with its
/// region (`strata_store_node::receipts`).
async fn recorded_writes(f: Fixture) {
    let w = f.range(0, 4096, PERM_WRITE | PERM_READ, 1);
    let bytes = data(8, 4096);
    let (put, record) = f.record("prefix/1", &w, &bytes);
    let receipt = f
        .transport
        .write_recorded(&w, &bytes, &record)
        .await
        .unwrap();
    let mut back = vec![0u8; 4096];
    f.transport.read(&w, 0, &mut back).await.unwrap();
    assert_eq!(back, bytes);
    if f.transport.records_writes(bytes.len()) {
        assert!(f.key.verify_receipt(&put, &receipt.expect("a receipt")));
        let forged = WriteRecord {
            key: "victim".into(),
            ..record.clone()
        };
        let e = f
            .transport
            .write_recorded(&w, &bytes, &forged)
            .await
            .unwrap_err();
        assert_eq!(e.code, Code::PermissionDenied, "{e}");
    } else {
        assert_eq!(receipt, None);
    }
    // Part of a grant: written, never recorded.
    let part = f.range(8192, 8192, PERM_WRITE | PERM_READ, 1);
    let receipt = f
        .transport
        .write_recorded(&part, &bytes, &record)
        .await
        .unwrap();
    assert_eq!(receipt, None);
    f.transport.read(&part, 0, &mut back).await.unwrap();
    assert_eq!(back, bytes);
    (f.kill)();
}

/// A batch of writes (`write_many_parts`): objects of one part and of
/// several, of many sizes (one larger than TCP's chunk), most with their
/// put's record. Each lands whole and in place; a recorded one brings back
/// its node's receipt for exactly its bytes where the transport records
/// writes (none where it cannot); and a write that is refused — a grant or
/// a record the master did not sign, bytes past the grant — fails alone,
/// the ones around it (on the same connection, for TCP) still land.
async fn batches_of_writes(f: Fixture) {
    let sizes = [4096usize, 1, 65536, 100_000, 9 << 20, 4096, 12345, 65536];
    let mut ranges = Vec::new();
    let mut bytes = Vec::new();
    let mut off = 0u64;
    for (i, &n) in sizes.iter().enumerate() {
        ranges.push(f.range(off, n as u64, PERM_WRITE | PERM_READ, 1));
        bytes.push(data(40 + i as u64, n));
        off += (n as u64).next_multiple_of(4096);
    }
    // Past its grant: 5,000 bytes for 4,096.
    ranges.push(f.range(off, 4096, PERM_WRITE | PERM_READ, 1));
    bytes.push(data(99, 5000));
    let keys: Vec<String> = (0..bytes.len()).map(|i| format!("batch/{i}")).collect();
    const BAD_MAC: usize = 2;
    const UNRECORDED: usize = 6;
    const FORGED: usize = 5;
    let records: Vec<(PutRecord<'_>, WriteRecord)> = keys
        .iter()
        .zip(&ranges)
        .zip(&bytes)
        .map(|((k, w), b)| f.record(k, w, b))
        .collect();
    let forged = WriteRecord {
        key: "victim".into(),
        ..records[FORGED].1.clone()
    };
    // A grant the node's key did not sign, refused on the wire before its
    // bytes are read (by nodes that check grants at all).
    ranges[BAD_MAC].mac = [0x5a; MAC_LEN];
    let parts: Vec<Vec<&[u8]>> = bytes
        .iter()
        .enumerate()
        .map(|(i, b)| match i {
            3 => cut(b, &[10, 5000, 77_777]),
            4 => cut(b, &[1 << 20, 3 << 20, (4 << 20) + 3]),
            _ => vec![b.as_slice()],
        })
        .collect();
    let items: Vec<WriteItem<'_>> = ranges
        .iter()
        .zip(&parts)
        .zip(&records)
        .enumerate()
        .map(|(i, ((dst, p), (_, rec)))| WriteItem {
            dst,
            parts: p,
            record: match i {
                UNRECORDED => None,
                FORGED => Some(&forged),
                _ => Some(rec),
            },
        })
        .collect();
    let res = f.transport.write_many_parts(items).await;
    assert_eq!(res.len(), bytes.len());
    let past = bytes.len() - 1;
    for (i, r) in res.iter().enumerate() {
        let recorded = f.transport.records_writes(bytes[i].len());
        match i {
            _ if i == past => {
                let e = r.as_ref().unwrap_err();
                assert_eq!(e.code, Code::InvalidArgument, "{e}");
                continue;
            }
            BAD_MAC if f.checks_signatures => {
                let e = r.as_ref().unwrap_err();
                assert_eq!(e.code, Code::PermissionDenied, "{e}");
                continue;
            }
            FORGED if recorded => {
                let e = r.as_ref().unwrap_err();
                assert_eq!(e.code, Code::PermissionDenied, "{e}");
                continue;
            }
            UNRECORDED => assert_eq!(r.as_ref().unwrap(), &None, "object {i}"),
            _ if recorded => {
                let receipt = r.as_ref().unwrap().expect("a receipt");
                assert!(f.key.verify_receipt(&records[i].0, &receipt), "object {i}");
            }
            _ => assert_eq!(r.as_ref().unwrap(), &None, "object {i}"),
        }
        let mut back = vec![0u8; bytes[i].len()];
        f.transport.read(&ranges[i], 0, &mut back).await.unwrap();
        assert!(back == bytes[i], "object {i} read back other bytes");
    }
    (f.kill)();
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
            async fn a_freed_range_refuses_its_old_grant() {
                super::a_freed_range_refuses_its_old_grant($fixture.await).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_dead_grant_writes_nothing() {
                super::a_dead_grant_writes_nothing($fixture.await).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_write_near_its_grants_end_is_fenced() {
                super::a_write_near_its_grants_end_is_fenced($fixture.await).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn concurrent_transfers() {
                super::concurrent_transfers($fixture.await).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn objects_of_parts() {
                super::objects_of_parts($fixture.await).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn large_objects() {
                super::large_objects($fixture.await).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn reads_through_lent_staging() {
                super::reads_through_lent_staging($fixture.await).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn recorded_writes() {
                super::recorded_writes($fixture.await).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn batches_of_writes() {
                super::batches_of_writes($fixture.await).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_dead_node_fails_transfers() {
                super::a_dead_node_fails_transfers($fixture.await).await
            }
        }
    };
}

/// A node serving [`SEGMENT`] over the TCP data plane (and, with `ucx`,
/// over UCX with that transport list too), on a runtime of its own so that
/// killing it drops every connection at once.
struct Node {
    addr: String,
    key: GrantKey,
    /// The UCX route of the segment, when served over UCX.
    route: Option<strata_proto::UcxRoute>,
    /// Lends staged reads (UCX nodes).
    lend: Option<LendMetrics>,
    /// What the node serves (the master's log and registrations change it).
    table: Arc<SegmentTable>,
    segment: Arc<Segment>,
    kill: Box<dyn FnOnce() + Send>,
}

/// A node serving one segment, over TCP and (with `ucx`, its `UCX_TLS`)
/// UCX; `shared`: a segment co-located clients may map (prefaulted, as a
/// store node's is by default).
fn start_node(ucx: Option<&'static str>, shared: bool) -> Node {
    start_node_with(ucx, shared, true)
}

/// [`start_node`], prefaulting a shared segment or not (`--prefault
/// false`: its file has holes).
fn start_node_with(ucx: Option<&'static str>, shared: bool, prefault: bool) -> Node {
    use prometheus::IntCounter;
    use strata_transport::tcp::{serve, ServerMetrics};
    let key = GrantKey::random();
    let table = Arc::new(SegmentTable::new());
    let served = table.clone();
    let segment = Arc::new(match shared {
        true => {
            let s = Segment::new_shared(SEGMENT_LEN, false).unwrap();
            if prefault {
                s.prefault();
            }
            s
        }
        false => Segment::new(SEGMENT_LEN).unwrap(),
    });
    let memory = segment.clone();
    table.install(
        key.clone(),
        HashMap::from([(SEGMENT, segment.clone())]),
        STAMP,
    );
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
            let addr = listener.local_addr().unwrap().to_string();
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
            let (exposed, lender) = match ucx {
                Some(tls) => (Some(ucx_node(tls, &segment).await), Some(lender().await)),
                None => (None, None),
            };
            let lend = lender.as_ref().map(|(_, m)| m.clone());
            let region = Lending {
                table,
                lender: lender.map(|(l, _)| l),
            };
            tokio::spawn(serve(listener, Arc::new(region), metrics, shutdown));
            let route = exposed.as_ref().map(|n| ucx_route(n, &addr));
            addr_tx.send((addr, route, lend)).unwrap();
            let _ = stopped.await;
            // Killed: the UCX worker goes (and its registration) with the
            // node's connections.
            drop(exposed);
        });
        // Dropping the runtime drops every connection task and its socket.
        drop(rt);
    });
    let (addr, route, lend) = addr_rx.recv().unwrap();
    Node {
        addr,
        key,
        route,
        lend,
        table: served,
        segment: memory,
        kill: Box::new(move || {
            let _ = stop.send(());
            node.join().unwrap();
        }),
    }
}

/// The TCP data plane: `tcp::serve` over a [`SegmentTable`].
async fn tcp() -> Fixture {
    use strata_transport::tcp::{TcpTransport, TcpTransportConfig};
    let n = start_node(None, false);
    Fixture {
        transport: Arc::new(TcpTransport::new(TcpTransportConfig::default())),
        addr: n.addr,
        key: n.key,
        kill: n.kill,
        ucx_route: 0,
        checks_signatures: true,
        one_sided: Box::new(|| 0),
        unconfirmed: Box::new(|| 0),
        attached: Box::new(|| 0),
        attaches: false,
        mapped: Box::new(|| (0, 0)),
        maps: false,
        lent: Box::new(|| (0, 0, 0)),
        stages: false,
        table: n.table,
        segment: n.segment,
    }
}

/// Counts allocations of at least [`BIG`] bytes made by threads that opted
/// in ([`WATCHED`]): how a test sees that a transfer joined its parts.
struct CountingAlloc;

const BIG: usize = 1 << 20;
static BIG_ALLOCS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
thread_local! {
    static WATCHED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl CountingAlloc {
    fn note(size: usize) {
        if size >= BIG && WATCHED.try_with(|w| w.get()).unwrap_or(false) {
            BIG_ALLOCS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

// SAFETY: forwards to the system allocator; the counting allocates nothing.
unsafe impl std::alloc::GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
        Self::note(l.size());
        // SAFETY: the caller's contract, passed on.
        unsafe { std::alloc::System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: std::alloc::Layout) -> *mut u8 {
        Self::note(l.size());
        // SAFETY: as for alloc.
        unsafe { std::alloc::System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: std::alloc::Layout, size: usize) -> *mut u8 {
        Self::note(size);
        // SAFETY: as for alloc.
        unsafe { std::alloc::System.realloc(p, l, size) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: std::alloc::Layout) {
        // SAFETY: as for alloc.
        unsafe { std::alloc::System.dealloc(p, l) }
    }
}

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// A transport with only the required methods: parts go through the
/// trait's defaults, which join them.
struct Joining(Arc<dyn Transport>);

impl Transport for Joining {
    fn write<'a>(
        &'a self,
        dst: &'a RemoteRange,
        at: u64,
        data: &'a [u8],
    ) -> BoxFuture<'a, Result<()>> {
        self.0.write(dst, at, data)
    }
    fn read<'a>(
        &'a self,
        src: &'a RemoteRange,
        at: u64,
        buf: &'a mut [u8],
    ) -> BoxFuture<'a, Result<()>> {
        self.0.read(src, at, buf)
    }
    fn name(&self) -> &'static str {
        "joining"
    }
}

/// TCP moves an object of 84 parts straight from and into them: no buffer
/// of the object's size is made on the client (the trait's defaults, which
/// join the parts, are seen making them).
#[test]
fn tcp_moves_parts_without_joining_them() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let f = rt.block_on(tcp());
    let len = 8 << 20;
    let w = f.range(0, len as u64, PERM_WRITE | PERM_READ, 1);
    let bytes = data(13, len);
    // 100,000-byte parts and buffers: chunks end inside parts.
    let parts: Vec<&[u8]> = bytes.chunks(100_000).collect();
    assert_eq!(parts.len(), 84);
    let mut back = vec![0u8; len];
    let joining = Joining(f.transport.clone());
    let mut runs = Vec::new();
    for t in [&*f.transport, &joining as &dyn Transport] {
        back.fill(0);
        let bufs: Vec<&mut [u8]> = back.chunks_mut(100_000).collect();
        let before = BIG_ALLOCS.load(std::sync::atomic::Ordering::Relaxed);
        let crc = rt.block_on(async {
            WATCHED.set(true);
            t.write_parts(&w, &parts, None).await.unwrap();
            let crc = t.read_parts(&w, bufs).await.unwrap();
            WATCHED.set(false);
            crc
        });
        assert_eq!(crc, crc32c::crc32c(&bytes));
        assert!(back == bytes, "{}: read back intact", t.name());
        runs.push(BIG_ALLOCS.load(std::sync::atomic::Ordering::Relaxed) - before);
    }
    assert_eq!(runs[0], 0, "TCP made a buffer of the object's size");
    assert_eq!(
        runs[1], 2,
        "the joining defaults: one buffer to write, one to read"
    );
    (f.kill)();
}

/// A node's segments, and (UCX nodes) a lender that stages their bytes for
/// one-sided readers, as an SSD agent stages its files.
struct Lending {
    table: Arc<SegmentTable>,
    lender: Option<Arc<Lender>>,
}

impl DataRegion for Lending {
    fn read<'a>(&'a self, req: &'a Request, now_ms: u64) -> BoxFuture<'a, Result<ReadSource>> {
        self.table.read(req, now_ms)
    }
    fn write_target(&self, req: &Request, now_ms: u64) -> Result<WriteTarget> {
        self.table.write_target(req, now_ms)
    }
    fn signed(&self, grant: &GrantScope, mac: &[u8]) -> bool {
        self.table.signed(grant, mac)
    }
    fn stage<'a>(&'a self, req: &'a Request, now_ms: u64) -> BoxFuture<'a, Result<Staged>> {
        let Some(lender) = self.lender.clone() else {
            return self.table.stage(req, now_ms);
        };
        let auth = self.table.authorize(
            &req.grant, &req.mac, PERM_STAGE, req.offset, req.length, now_ms,
        );
        let at = req.offset;
        Box::pin(async move {
            let seg = auth?.segment;
            lender
                .stage(req.length, move |dst| {
                    dst.copy_from_slice(seg.slice(at, dst.len() as u64)?);
                    Ok(())
                })
                .await
        })
    }
    fn give_back(&self, lease: u64, token: u64) -> bool {
        self.lender
            .as_ref()
            .is_some_and(|l| l.give_back(lease, token))
    }
    fn reclaim_held(&self, lease: u64, token: u64) -> bool {
        self.lender
            .as_ref()
            .is_some_and(|l| l.reclaim_held(lease, token))
    }
    /// Receipts what the master signed, as a store node does (which also
    /// keeps the put: `strata_store_node::receipts`).
    fn record_put(&self, req: &Request, record: &WriteRecord) -> Option<Result<[u8; MAC_LEN]>> {
        let key = self.table.grant_key()?;
        let put = record.of(&req.grant);
        Some(match key.verify_record(&put, &record.mac) {
            true => Ok(key.sign_receipt(&put)),
            false => Err(strata_common::Error::new(
                Code::PermissionDenied,
                "not the master's record",
            )),
        })
    }
}

/// A lender of 4 slots of 1 MiB over UCX, and its metrics.
#[cfg(feature = "ucx")]
async fn lender() -> (Arc<Lender>, LendMetrics) {
    use prometheus::{IntCounter, IntGauge};
    let m = LendMetrics {
        leases: IntGauge::new("leases", "leases").unwrap(),
        expired: IntCounter::new("expired", "expired").unwrap(),
        disconnected: IntCounter::new("disconnected", "disconnected").unwrap(),
        lent_bytes: IntCounter::new("lent", "lent").unwrap(),
    };
    let cfg = strata_transport::lend::LendConfig {
        slot_bytes: 1 << 20,
        wait: Duration::from_secs(5),
        ttl: strata_transport::lend::LEND_TTL,
        setting: "the fixture's window",
    };
    let l = strata_transport::lend::start_ucx(4 << 20, cfg, m.clone())
        .await
        .unwrap();
    (Arc::new(l), m)
}

#[cfg(not(feature = "ucx"))]
async fn lender() -> (Arc<Lender>, LendMetrics) {
    unreachable!("UCX fixtures need the ucx feature")
}

conformance_suite!(over_tcp, tcp());

#[cfg(feature = "ucx")]
async fn ucx_node(tls: &'static str, segment: &Arc<Segment>) -> strata_transport::ucx::UcxNode {
    strata_transport::ucx::UcxNode::start(Some(tls), std::slice::from_ref(segment))
        .await
        .unwrap()
}

#[cfg(feature = "ucx")]
fn ucx_route(n: &strata_transport::ucx::UcxNode, addr: &str) -> strata_proto::UcxRoute {
    // The node names no process: co-located clients use the engine.
    strata_proto::UcxRoute {
        segment_id: SEGMENT,
        fingerprint: ROUTE,
        data_addr: addr.to_string(),
        worker: n.worker_address().to_vec(),
        rkey: n.routes()[0].rkey.clone(),
        base: n.routes()[0].base,
        size: SEGMENT_LEN as u64,
        fence_rkey: n.fence_routes()[0].rkey.clone(),
        fence_base: n.fence_routes()[0].base,
        fence_granule: strata_transport::published::GRANULE,
        fence_stamp: STAMP,
        process: None,
    }
}

#[cfg(not(feature = "ucx"))]
async fn ucx_node(_: &'static str, _: &Arc<Segment>) -> std::convert::Infallible {
    unreachable!("UCX fixtures need the ucx feature")
}

#[cfg(not(feature = "ucx"))]
fn ucx_route(n: &std::convert::Infallible, _: &str) -> strata_proto::UcxRoute {
    match *n {}
}

/// The route fingerprint UCX fixtures use.
const ROUTE: u64 = 0x5eed;
/// The registration stamp fixtures' nodes serve under.
const STAMP: u64 = 0x57a3;

#[cfg(feature = "ucx")]
mod ucx {
    use super::*;
    use futures::future::BoxFuture;
    use strata_common::{Error, Result};
    use strata_transport::tcp::{TcpTransport, TcpTransportConfig};
    use strata_transport::ucx::{RouteSource, UcxClientConfig, UcxTransport};

    /// The master's answer to `GetUcxRoutes`: the routes it holds (only
    /// the segments asked for), a refusal (a caller without the rdma role,
    /// `routes` None), or an outage (`down`). Counts the calls.
    pub struct Routes {
        pub routes: parking_lot::Mutex<Option<Vec<strata_proto::UcxRoute>>>,
        pub down: std::sync::atomic::AtomicBool,
        pub calls: std::sync::atomic::AtomicUsize,
        /// How long the master takes to answer (a slow or loaded one).
        pub delay_ms: std::sync::atomic::AtomicU64,
    }

    impl RouteSource for Routes {
        fn routes(&self, ids: Vec<u64>) -> BoxFuture<'_, Result<Vec<strata_proto::UcxRoute>>> {
            use std::sync::atomic::Ordering::Relaxed;
            self.calls.fetch_add(1, Relaxed);
            let r = if self.down.load(Relaxed) {
                Err(Error::unavailable("no master"))
            } else {
                match &*self.routes.lock() {
                    Some(v) => Ok(v
                        .iter()
                        .filter(|r| ids.contains(&r.segment_id))
                        .cloned()
                        .collect()),
                    None => Err(Error::new(
                        strata_common::Code::PermissionDenied,
                        "this call needs the rdma role",
                    )),
                }
            };
            let delay = Duration::from_millis(self.delay_ms.load(Relaxed));
            Box::pin(async move {
                tokio::time::sleep(delay).await;
                r
            })
        }
    }

    /// A node serving UCX (over `tls`) and TCP; a UCX client that is
    /// (`rdma`) or is not given the route.
    pub async fn fixture(tls: &'static str, rdma: bool) -> Fixture {
        fixture_with(tls, rdma, None).await.0
    }

    /// A co-located node whose route names its process (this one) and
    /// whose segment is shared: an rdma client maps it and reads it by
    /// cross-memory attach, copying from the mapping.
    pub async fn attached() -> Fixture {
        let (mut f, _) = attached_to(true).await;
        f.maps = true;
        f
    }

    /// [`attached`] to a node whose segment is not shared (e.g. an older
    /// release): the kernel copies each read (`process_vm_readv`).
    pub async fn attached_unshared() -> Fixture {
        attached_to(false).await.0
    }

    /// [`attached`] to a node whose shared segment was not prefaulted (its
    /// file has holes): mapped for reads, never written through the
    /// mapping (the pages a write allocated would be the client's).
    pub async fn attached_with_holes() -> Fixture {
        let me = strata_transport::ucx::cross_memory::this_process().cloned();
        let node = start_node_with(Some("sm,self"), true, false);
        let (mut f, _) = fixture_on(node, "sm,self", true, me);
        f.attaches = true;
        f
    }

    async fn attached_to(shared: bool) -> (Fixture, Arc<Routes>) {
        let me = strata_transport::ucx::cross_memory::this_process().cloned();
        let (mut f, routes) = fixture_on(start_node(Some("sm,self"), shared), "sm,self", true, me);
        f.attaches = true;
        (f, routes)
    }

    /// [`fixture`] whose route names `process`, and the route source its
    /// client asks.
    pub async fn fixture_with(
        tls: &'static str,
        rdma: bool,
        process: Option<strata_proto::HostProcess>,
    ) -> (Fixture, Arc<Routes>) {
        fixture_on(start_node(Some(tls), true), tls, rdma, process)
    }

    fn fixture_on(
        n: Node,
        tls: &'static str,
        rdma: bool,
        process: Option<strata_proto::HostProcess>,
    ) -> (Fixture, Arc<Routes>) {
        let mut route = n.route.clone().expect("a UCX node has a route");
        route.process = process;
        let lend = n.lend.clone().expect("a UCX node lends");
        let cfg = UcxClientConfig {
            tls: Some(tls.to_string()),
            // Bounds a transfer to a dead node over shared memory, which
            // cannot report a failed peer.
            timeout: Duration::from_secs(3),
            ..Default::default()
        };
        let tcp = Arc::new(TcpTransport::new(TcpTransportConfig::default()));
        let source = Arc::new(Routes {
            routes: parking_lot::Mutex::new(rdma.then(|| vec![route])),
            down: Default::default(),
            calls: Default::default(),
            delay_ms: Default::default(),
        });
        let t = Arc::new(UcxTransport::new(cfg, tcp, source.clone()).unwrap());
        let counts = t.clone();
        let refused = t.clone();
        let attached = t.clone();
        let mapped = t.clone();
        let f = Fixture {
            transport: t,
            addr: n.addr,
            key: n.key,
            kill: n.kill,
            ucx_route: ROUTE,
            checks_signatures: !rdma,
            one_sided: Box::new(move || counts.one_sided_transfers()),
            unconfirmed: Box::new(move || refused.unconfirmed_reads()),
            attached: Box::new(move || attached.attached_reads()),
            attaches: false,
            mapped: Box::new(move || (mapped.mapped_reads(), mapped.mapped_writes())),
            maps: false,
            lent: Box::new(move || {
                (
                    lend.lent_bytes.get(),
                    usize::try_from(lend.leases.get()).unwrap_or(0),
                    lend.disconnected.get(),
                )
            }),
            stages: true,
            table: n.table,
            segment: n.segment,
        };
        (f, source)
    }
}

/// A route is used only for the replicas that name it (its fingerprint and
/// node): segment ids are reassigned by a new master, and a restarted node
/// has a new worker, so a route fetched for another registration must never
/// aim a transfer.
#[cfg(feature = "ucx")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_is_used_only_for_the_replicas_that_name_it() {
    let (f, source) = ucx::fixture_with("tcp", true, None).await;
    let w = f.range(0, 4096, PERM_WRITE | PERM_READ, 1);
    f.transport.write(&w, 0, &data(7, 4096)).await.unwrap();
    let one_sided = (f.one_sided)();
    assert!(one_sided > 0);
    let mut back = vec![0u8; 4096];
    // Another registration's fingerprint, and the same one at another
    // node address: neither goes one-sided.
    let mut stale = w.clone();
    stale.ucx_route = ROUTE + 1;
    f.transport.read(&stale, 0, &mut back).await.unwrap();
    assert_eq!(back, data(7, 4096));
    let mut moved = w.clone();
    moved.addr = "127.0.0.1:1".into();
    let e = f.transport.read(&moved, 0, &mut back).await.unwrap_err();
    assert!(e.retryable(), "{e:?}");
    assert_eq!((f.one_sided)(), one_sided);
    // The node registered again with a new master: same worker and key,
    // a new stamp (so a new fingerprint) and a new segment id. The new
    // route is fetched and used; the old one's grants are refused,
    // one-sided or not.
    let renumbered = {
        let mut routes = source.routes.lock();
        let v = routes.as_mut().unwrap();
        v[0].segment_id = SEGMENT + 1;
        v[0].fingerprint = ROUTE + 2;
        v[0].fence_stamp = STAMP + 1;
        v[0].clone()
    };
    f.table.install(
        f.key.clone(),
        HashMap::from([(SEGMENT + 1, f.segment.clone())]),
        STAMP + 1,
    );
    let mut again = f.range(0, 4096, PERM_READ, 1);
    again.scope.segment_id = renumbered.segment_id;
    again.ucx_route = renumbered.fingerprint;
    again.mac = f.key.sign(&again.scope);
    f.transport.read(&again, 0, &mut back).await.unwrap();
    assert_eq!(back, data(7, 4096));
    assert_eq!(
        (f.one_sided)(),
        one_sided + 1,
        "the new registration's route was used"
    );
    let e = f.transport.read(&w, 0, &mut back).await.unwrap_err();
    assert_eq!(e.code, Code::NotFound, "{e:?}");
    assert_eq!((f.one_sided)(), one_sided + 1);
    assert_eq!((f.unconfirmed)(), 1, "read one-sided, turned by the stamp");
    (f.kill)();
}

/// Routes are asked for once per batch, and a master that does not answer
/// is asked again only after a pause (transfers go over TCP meanwhile).
#[cfg(feature = "ucx")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_are_fetched_once_per_batch_and_outages_are_not_hammered() {
    use std::sync::atomic::Ordering::Relaxed;
    let (f, source) = ucx::fixture_with("tcp", true, None).await;
    let ranges: Vec<RemoteRange> = (0..8u64)
        .map(|i| f.range(i * 4096, 4096, PERM_WRITE | PERM_READ, 1))
        .collect();
    source.down.store(true, Relaxed);
    // No master: writes and reads go over TCP, the master asked once.
    for r in &ranges {
        f.transport
            .write(r, 0, &data(r.scope.offset, 4096))
            .await
            .unwrap();
    }
    assert_eq!(source.calls.load(Relaxed), 1);
    assert_eq!((f.one_sided)(), 0);
    source.down.store(false, Relaxed);
    // Within the pause the master is not asked again...
    f.transport
        .write(&ranges[0], 0, &data(0, 4096))
        .await
        .unwrap();
    assert_eq!(source.calls.load(Relaxed), 1);
    // ...after it (what is tested is a time: sleeping is the condition),
    // one batch over the segment it had no answer for and 8 segments it
    // never asked about (the same memory's route under 8 more ids) asks
    // the master once, and goes one-sided.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let ids: Vec<u64> = (0..8).map(|i| SEGMENT + 10 + i).collect();
    {
        let mut routes = source.routes.lock();
        let v = routes.as_mut().unwrap();
        let r0 = v[0].clone();
        v.extend(ids.iter().map(|&id| strata_proto::UcxRoute {
            segment_id: id,
            ..r0.clone()
        }));
    }
    let renamed: Vec<RemoteRange> = ranges
        .iter()
        .zip(&ids)
        .map(|(r, &id)| {
            let mut r = r.clone();
            r.scope.segment_id = id;
            r.mac = f.key.sign(&r.scope);
            r
        })
        .collect();
    let all: Vec<&RemoteRange> = ranges.iter().chain(&renamed).collect();
    let mut bufs = vec![vec![0u8; 4096]; all.len()];
    let items = all
        .iter()
        .copied()
        .zip(bufs.iter_mut().map(|b| &mut b[..]))
        .collect();
    for (r, got) in all.iter().zip(f.transport.read_many(items).await) {
        assert_eq!(got.unwrap(), crc32c::crc32c(&data(r.scope.offset, 4096)));
    }
    assert_eq!(source.calls.load(Relaxed), 2);
    assert_eq!((f.one_sided)(), 16);
    assert_eq!((f.unconfirmed)(), 0);
    (f.kill)();
}

#[cfg(feature = "ucx")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_that_miss_together_share_one_route_fetch() {
    use std::sync::atomic::Ordering::Relaxed;
    let (f, source) = ucx::fixture_with("tcp", true, None).await;
    // A slow master: every transfer below misses while the first fetch is
    // still out.
    source.delay_ms.store(300, Relaxed);
    let ranges: Vec<RemoteRange> = (0..8u64)
        .map(|i| f.range(i * 4096, 4096, PERM_WRITE | PERM_READ, 1))
        .collect();
    let payloads: Vec<Vec<u8>> = ranges.iter().map(|r| data(r.scope.offset, 4096)).collect();
    let writes = ranges
        .iter()
        .zip(&payloads)
        .map(|(r, p)| f.transport.write(r, 0, p));
    for w in futures::future::join_all(writes).await {
        w.unwrap();
    }
    assert_eq!(source.calls.load(Relaxed), 1, "one fetch for the burst");
    assert_eq!((f.one_sided)(), 8, "and every transfer used its answer");
    let mut bufs = vec![vec![0u8; 4096]; ranges.len()];
    let reads = ranges
        .iter()
        .zip(bufs.iter_mut())
        .map(|(r, b)| f.transport.read_crc32c(r, 0, b));
    for (r, got) in ranges.iter().zip(futures::future::join_all(reads).await) {
        assert_eq!(got.unwrap(), crc32c::crc32c(&data(r.scope.offset, 4096)));
    }
    assert_eq!(source.calls.load(Relaxed), 1);
    assert_eq!((f.one_sided)(), 16);
    (f.kill)();
}

// One-sided, for an rdma client, over UCX's tcp and shared-memory
// transports.
#[cfg(feature = "ucx")]
conformance_suite!(over_ucx_tcp, ucx::fixture("tcp", true));
#[cfg(feature = "ucx")]
conformance_suite!(over_ucx_shared_memory, ucx::fixture("sm,self", true));
// A UCX client without the rdma role: served over TCP, every grant checked
// by the node.
#[cfg(feature = "ucx")]
conformance_suite!(ucx_client_without_rdma_role, ucx::fixture("tcp", false));
// One-sided to a co-located node by cross-memory attach to its process.
#[cfg(feature = "ucx")]
conformance_suite!(over_cross_memory_attach, ucx::attached());
// The same to a node whose segment is not shared: the kernel copies.
#[cfg(feature = "ucx")]
conformance_suite!(over_cross_memory_attach_unshared, ucx::attached_unshared());

/// A co-located node the kernel does not let this process attach to (here:
/// a pid no process has) is reached through the shared-memory engine,
/// one-sided still, every byte right.
#[cfg(feature = "ucx")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_attach_goes_through_the_engine() {
    let mut nobody = strata_transport::ucx::cross_memory::this_process()
        .cloned()
        .unwrap();
    nobody.pid = i32::MAX as u32;
    let (f, _) = ucx::fixture_with("sm,self", true, Some(nobody)).await;
    let w = f.range(0, 1 << 20, PERM_WRITE | PERM_READ, 1);
    let bytes = data(5, 1 << 20);
    f.transport.write(&w, 0, &bytes).await.unwrap();
    let mut back = vec![0u8; 1 << 20];
    let crc = f.transport.read_crc32c(&w, 0, &mut back).await.unwrap();
    assert!(back == bytes, "read back intact");
    assert_eq!(crc, crc32c::crc32c(&bytes));
    assert_eq!(((f.one_sided)(), (f.attached)()), (2, 0));
    (f.kill)();
}

/// Writes to a node this client attaches to copy into its mapped segment
/// file when the file has no holes, and go through the engine otherwise
/// (no shared file; a file with holes, whose pages the client's writes
/// would allocate in its own memory cgroup): never through the kernel
/// into the node's process, which names itself (only reads, whose bytes
/// must pass their checks, are). Reads are attached either way.
#[cfg(feature = "ucx")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_go_into_a_mapped_segment_or_through_the_engine() {
    for (name, mapped) in [("shared", true), ("unshared", false), ("holes", false)] {
        let f = match name {
            "shared" => ucx::attached().await,
            "unshared" => ucx::attached_unshared().await,
            _ => ucx::attached_with_holes().await,
        };
        let w = f.range(0, 8192, PERM_WRITE | PERM_READ, 1);
        f.transport.write(&w, 0, &data(1, 8192)).await.unwrap();
        assert_eq!(((f.one_sided)(), (f.attached)()), (1, 0), "{name}");
        assert_eq!((f.mapped)(), (0, u64::from(mapped)), "{name}");
        let mut back = vec![0u8; 8192];
        f.transport.read(&w, 0, &mut back).await.unwrap();
        assert_eq!(back, data(1, 8192));
        assert_eq!(((f.one_sided)(), (f.attached)()), (2, 1), "{name}");
        (f.kill)();
    }
}
