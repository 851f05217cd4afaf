//! Bad input on every port: forged or out-of-range grants, malformed frames on
//! the data plane, garbage on the gRPC port. Nothing may crash or leak bytes.

use std::time::Duration;
use strata_client::{Code, PutOptions};
use strata_common::grant::{GrantScope, PERM_READ, PERM_WRITE};
use strata_proto as pb;
use strata_tests::{payload, ClusterBuilder};
use strata_transport::frame::{Op, Request, Response, RESP_LEN};
use strata_transport::RemoteRange;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The granted range of `key`'s first replica, as a reader gets it.
async fn granted(cl: &strata_client::Client, key: &str) -> RemoteRange {
    let g = cl
        .master_client()
        .get_replicas(pb::GetReplicasRequest { key: key.into() })
        .await
        .unwrap()
        .into_inner();
    strata_client::remote_range(&g.replicas[0]).unwrap()
}

/// Passes raw bytes as a gRPC message, so tests can send what no generated
/// client would.
#[derive(Clone, Copy, Default)]
struct Raw;

impl tonic::codec::Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl tonic::codec::Encoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        use bytes::BufMut;
        dst.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Decoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        use bytes::Buf;
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

/// Calls `method` of the master with `body` as the message (client token).
async fn raw_call(
    c: &strata_tests::LocalCluster,
    method: &str,
    body: Vec<u8>,
) -> Result<Vec<u8>, tonic::Status> {
    let ch = strata_common::grpc::master_channel(&c.master_addr(), c.credentials().client.as_ref())
        .unwrap();
    let mut g = tonic::client::Grpc::new(ch);
    g.ready().await.unwrap();
    let path: tonic::codegen::http::uri::PathAndQuery =
        format!("/strata.v1.Master/{method}").parse().unwrap();
    g.unary(tonic::Request::new(body), path, Raw)
        .await
        .map(|r| r.into_inner())
}

/// A one-node cluster holding "a" (4096 bytes of `seed`) and its grant.
async fn one_object(
    seed: u64,
) -> (
    strata_tests::LocalCluster,
    strata_client::Client,
    RemoteRange,
) {
    let c = ClusterBuilder::new().store_nodes(1).build().await.unwrap();
    let cl = c.client().await.unwrap();
    cl.put("a", &payload(seed, 4096), &PutOptions::default())
        .await
        .unwrap();
    let good = granted(&cl, "a").await;
    (c, cl, good)
}

/// A raw request of `length` bytes from the start of `grant`.
fn raw(
    req_id: u64,
    op: Op,
    grant: GrantScope,
    mac: [u8; strata_common::grant::MAC_LEN],
    length: u64,
) -> Request {
    Request {
        op,
        req_id,
        grant,
        mac,
        offset: grant.offset,
        length,
        flags: 0,
        trace: None,
        record: None,
    }
}

async fn read_response(s: &mut TcpStream) -> (Response, String) {
    let (r, body) = read_raw(s).await;
    (r, String::from_utf8_lossy(&body).into_owned())
}

/// The node closes the connection (after its answer) without more bytes.
async fn assert_hung_up(s: &mut TcpStream) {
    let mut rest = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap_or(0);
    assert_eq!(n, 0, "the node hung up");
}

async fn read_raw(s: &mut TcpStream) -> (Response, Vec<u8>) {
    let mut h = [0u8; RESP_LEN];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut h))
        .await
        .unwrap()
        .unwrap();
    let r = Response::decode(&h).unwrap();
    let mut body = vec![0u8; r.length as usize];
    s.read_exact(&mut body).await.unwrap();
    (r, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_plane_rejects_access_outside_the_grant() {
    let c = ClusterBuilder::new().store_nodes(1).build().await.unwrap();
    let cl = c.client().await.unwrap();
    cl.put("a", &payload(1, 1000), &PutOptions::default())
        .await
        .unwrap();
    cl.put("b", b"secret neighbour", &PutOptions::default())
        .await
        .unwrap();
    let good = granted(&cl, "a").await;
    let t = cl.transport();
    let mut buf = vec![0u8; 1000];
    t.read(&good, 0, &mut buf).await.unwrap();
    assert_eq!(buf, payload(1, 1000));

    // Stretching the range, moving it, upgrading to write or extending the
    // expiry all break the signature.
    let tamper = [
        GrantScope {
            length: 100_000,
            ..good.scope
        },
        GrantScope {
            offset: good.scope.offset + 64,
            ..good.scope
        },
        GrantScope {
            perm: PERM_READ | PERM_WRITE,
            ..good.scope
        },
        GrantScope {
            expires_unix_ms: good.scope.expires_unix_ms + 60_000,
            ..good.scope
        },
        GrantScope {
            segment_id: good.scope.segment_id + 1,
            ..good.scope
        },
    ];
    for scope in tamper {
        let bad = RemoteRange {
            scope,
            ..good.clone()
        };
        let mut big = vec![0u8; 1000];
        let e = t.read(&bad, 0, &mut big).await.unwrap_err();
        assert_eq!(e.code, Code::PermissionDenied, "{scope:?}: {e}");
    }
    // A read grant does not allow writes.
    let e = t.write(&good, 0, &[0u8; 10]).await.unwrap_err();
    assert_eq!(e.code, Code::PermissionDenied);
    // The client refuses sub-ranges past the grant before sending...
    let e = t.read(&good, 990, &mut [0u8; 20]).await.unwrap_err();
    assert_eq!(e.code, Code::InvalidArgument);
    // ...and the node refuses a hand-made frame that reaches past it.
    let mut s = TcpStream::connect(&good.addr).await.unwrap();
    let req = Request {
        op: Op::Read,
        req_id: 9,
        grant: good.scope,
        mac: good.mac,
        offset: good.scope.offset + 500,
        length: 1000,
        flags: 0,
        trace: None,
        record: None,
    };
    s.write_all(&req.encode()).await.unwrap();
    let (resp, msg) = read_response(&mut s).await;
    assert_eq!(resp.status, Code::PermissionDenied);
    assert!(msg.contains("outside the granted range"), "{msg}");
    // The connection survives a refused request.
    let req = Request {
        op: Op::Read,
        req_id: 10,
        grant: good.scope,
        mac: good.mac,
        offset: good.scope.offset,
        length: 1000,
        flags: 0,
        trace: None,
        record: None,
    };
    s.write_all(&req.encode()).await.unwrap();
    let (resp, body) = read_raw(&mut s).await;
    assert_eq!(resp.status, Code::Ok);
    assert_eq!(body, payload(1, 1000));
    // The neighbour was never readable, and writes outside a grant never land.
    assert_eq!(cl.get("b").await.unwrap(), b"secret neighbour");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_data_plane_frames_do_not_crash_the_node() {
    let c = ClusterBuilder::new().store_nodes(1).build().await.unwrap();
    let cl = c.client().await.unwrap();
    cl.put("k", &payload(3, 70_000), &PutOptions::default())
        .await
        .unwrap();
    let addr = c.nodes[0].data_addr;

    // Garbage header: one error answer naming the protocol, then hang-up.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&[0xAB; 96]).await.unwrap();
    let (resp, msg) = read_response(&mut s).await;
    assert_eq!(resp.status, Code::InvalidArgument);
    assert!(msg.contains("magic"), "{msg}");
    let mut rest = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(n, 0, "server closes after a bad frame");

    // HTTP on the data port.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    s.write_all(&[0u8; 96]).await.unwrap();
    let (resp, _) = read_response(&mut s).await;
    assert_eq!(resp.status, Code::InvalidArgument);

    // Wrong version, unknown op, truncated header then close.
    let good = Request {
        op: Op::Ping,
        req_id: 1,
        grant: GrantScope {
            perm: 0,
            segment_id: 0,
            offset: 0,
            length: 0,
            expires_unix_ms: 0,
            generation: 0,
        },
        mac: [0; 16],
        offset: 0,
        length: 0,
        flags: 0,
        trace: None,
        record: None,
    }
    .encode();
    for patch in [(4usize, 9u8), (5, 77)] {
        let mut f = good;
        f[patch.0] = patch.1;
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(&f).await.unwrap();
        let (resp, _) = read_response(&mut s).await;
        assert_eq!(resp.status, Code::InvalidArgument);
    }
    // Version 2 (extensions): a block over the limit or a malformed one is
    // refused; a traced request is served.
    let mut over = good.header().to_vec();
    over[4] = strata_transport::frame::VERSION_EXT;
    over[6..8].copy_from_slice(&(strata_transport::frame::MAX_EXT_LEN as u16 + 1).to_le_bytes());
    let mut bad_item = over.clone();
    bad_item[6..8].copy_from_slice(&4u16.to_le_bytes());
    bad_item.extend_from_slice(&[1, 25, 0, 0]); // claims 25 bytes, holds 2
    for f in [over, bad_item] {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(&f).await.unwrap();
        let (resp, msg) = read_response(&mut s).await;
        assert_eq!(resp.status, Code::InvalidArgument, "{msg}");
    }
    let traced = Request {
        flags: 0,
        trace: Some(strata_common::telemetry::TraceParent {
            trace_id: [1; 16],
            span_id: [2; 8],
            flags: 1,
        }),
        record: None,
        ..Request::decode(good.header()).unwrap().0.unwrap()
    }
    .encode();
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&traced).await.unwrap();
    let (resp, _) = read_response(&mut s).await;
    assert_eq!(resp.status, Code::Ok);
    // The extension was consumed: the next request on the connection is
    // read from the right place.
    s.write_all(&good).await.unwrap();
    let (resp, _) = read_response(&mut s).await;
    assert_eq!((resp.status, resp.req_id), (Code::Ok, 1));

    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&good[..40]).await.unwrap();
    drop(s);

    // A forged write announcing 1 GiB: refused, connection closed, nothing written.
    let mut s = TcpStream::connect(addr).await.unwrap();
    let w = Request {
        op: Op::Write,
        length: 1 << 30,
        ..Request::decode(good.header()).unwrap().0.unwrap()
    };
    s.write_all(&w.encode()).await.unwrap();
    let (resp, _) = read_response(&mut s).await;
    assert_ne!(resp.status, Code::Ok);

    // Ping still answers and the object is intact.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&good).await.unwrap();
    let (resp, _) = read_response(&mut s).await;
    assert_eq!(resp.status, Code::Ok);
    assert_eq!(cl.get("k").await.unwrap(), payload(3, 70_000));
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_grpc_requests_are_rejected_without_crashing() {
    let c = ClusterBuilder::new().store_nodes(1).build().await.unwrap();
    let cl = c.client().await.unwrap();
    // Raw junk and a half HTTP/2 preface on the gRPC port.
    for junk in [
        &b"\x00\x01garbage garbage garbage\r\n\r\n"[..],
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\xff\xff\xff\xff\xff\xff\xff\xff\xff",
    ] {
        let mut s = TcpStream::connect(c.master_addr).await.unwrap();
        s.write_all(junk).await.unwrap();
        let mut sink = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut sink)).await;
    }
    // A gRPC call whose body is not a valid protobuf message: the status
    // (a trailer) is read by a real gRPC client, so a success would show.
    let st = raw_call(&c, "PutStart", vec![0xff; 5]).await.unwrap_err();
    assert_eq!(st.code(), tonic::Code::Internal, "{st}");
    assert!(st.message().contains("decode"), "{st}");
    // The same path with a valid (empty) message is answered for what it
    // says, both sides of the check.
    let st = raw_call(&c, "PutStart", vec![]).await.unwrap_err();
    assert_eq!(st.code(), tonic::Code::InvalidArgument, "{st}");
    // Semantically invalid requests get InvalidArgument, not a crash.
    let mut m = cl.master_client();
    // Millions of empty keys: refused by count while streaming in, before
    // they are decoded; both sides of the limit.
    let t0 = std::time::Instant::now();
    let flood = pb::BatchGetReplicasRequest {
        keys: vec![String::new(); 2_000_000],
    };
    let e = m.batch_get_replicas(flood).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    assert!(e.message().contains("more than 4096 items"), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(20));
    let at_limit = pb::BatchGetReplicasRequest {
        keys: vec!["nope".into(); 4096],
    };
    let r = m.batch_get_replicas(at_limit).await.unwrap().into_inner();
    assert_eq!(r.results.len(), 4096);
    // A single-key call far larger than any key: refused by size.
    let e = m
        .exists(pb::ExistsRequest {
            key: "k".repeat(1 << 20),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e}");
    assert!(e.message().contains("limit"), "{e}");
    let huge = pb::BatchGetReplicasRequest {
        keys: vec!["k".into(); 5000],
    };
    assert_eq!(
        m.batch_get_replicas(huge).await.unwrap_err().code(),
        tonic::Code::InvalidArgument
    );
    let long = pb::GetReplicasRequest {
        key: "x".repeat(10_000),
    };
    assert_eq!(
        m.get_replicas(long).await.unwrap_err().code(),
        tonic::Code::InvalidArgument
    );
    let reg = pb::RegisterNodeRequest {
        node_id: "evil".into(),
        data_addr: "not an addr".into(),
        segments: vec![],
        ..Default::default()
    };
    // Registration is a member call: the admin token may not make it...
    assert_eq!(
        m.register_node(reg.clone()).await.unwrap_err().code(),
        tonic::Code::PermissionDenied
    );
    // ...and a member's bad registration is refused for what is wrong in it.
    let mut member = strata_proto::master_client::MasterClient::new(
        strata_common::grpc::master_channel(&c.master_addr(), c.credentials().member.as_ref())
            .unwrap(),
    );
    let e = member.register_node(reg).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    assert!(e.message().contains("data_addr"), "{e}");
    // Still serving.
    cl.put("after", b"still alive", &PutOptions::default())
        .await
        .unwrap();
    assert_eq!(cl.get("after").await.unwrap(), b"still alive");
    c.shutdown().await;
}

/// Batch reads (`ReadV`) check every item on its own: a forged item fails
/// alone, a write smuggled into a batch is refused, and an oversized batch is
/// refused whole without the node reading its items.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_reads_check_every_item_and_refuse_oversized_batches() {
    let (c, cl, good) = one_object(3).await;
    let item = |id: u64, op: Op, scope: GrantScope| raw(id, op, scope, good.mac, 4096);
    let forged = GrantScope {
        length: 1 << 20,
        ..good.scope
    };
    let mut frame = item(1, Op::ReadV, good.scope).encode().to_vec();
    frame[80..88].copy_from_slice(&3u64.to_le_bytes()); // three items
    for r in [
        item(2, Op::Read, good.scope),
        item(3, Op::Read, forged),
        item(4, Op::Write, good.scope),
    ] {
        frame.extend_from_slice(&r.encode());
    }
    let mut s = TcpStream::connect(&good.addr).await.unwrap();
    s.write_all(&frame).await.unwrap();
    let mut h = [0u8; RESP_LEN];
    s.read_exact(&mut h).await.unwrap();
    let top = Response::decode(&h).unwrap();
    assert_eq!((top.status, top.length), (Code::Ok, 3));
    let (r, body) = read_raw(&mut s).await;
    assert_eq!((r.status, r.req_id), (Code::Ok, 2));
    assert_eq!(body, payload(3, 4096));
    let (r, msg) = read_response(&mut s).await;
    assert_eq!((r.status, r.req_id), (Code::PermissionDenied, 3), "{msg}");
    let (r, msg) = read_response(&mut s).await;
    assert_eq!(r.status, Code::InvalidArgument, "{msg}");
    assert!(msg.contains("only hold reads"), "{msg}");

    // Traced items (version 2) and a refused item with an extension block
    // (unknown op) keep the items after them in place.
    let tp = strata_common::telemetry::TraceParent {
        trace_id: [1; 16],
        span_id: [2; 8],
        flags: 1,
    };
    let traced = |id: u64, op: Op| Request {
        flags: 0,
        trace: Some(tp),
        ..item(id, op, good.scope)
    };
    let mut frame = traced(6, Op::ReadV).encode().to_vec();
    frame[80..88].copy_from_slice(&3u64.to_le_bytes());
    frame.extend_from_slice(&traced(7, Op::Read).encode());
    let mut unknown = traced(8, Op::Read).encode();
    unknown[5] = 99;
    frame.extend_from_slice(&unknown);
    frame.extend_from_slice(&item(9, Op::Read, good.scope).encode());
    let mut s = TcpStream::connect(&good.addr).await.unwrap();
    s.write_all(&frame).await.unwrap();
    s.read_exact(&mut h).await.unwrap();
    let top = Response::decode(&h).unwrap();
    assert_eq!((top.status, top.length), (Code::Ok, 3));
    let (r, body) = read_raw(&mut s).await;
    assert_eq!((r.status, r.req_id, body), (Code::Ok, 7, payload(3, 4096)));
    let (r, msg) = read_response(&mut s).await;
    assert_eq!(r.status, Code::InvalidArgument, "{msg}");
    let (r, body) = read_raw(&mut s).await;
    assert_eq!((r.status, r.req_id, body), (Code::Ok, 9, payload(3, 4096)));
    // An item whose framing is broken (an extension block over the limit)
    // fails the batch and closes the connection: the items after it cannot
    // be found.
    let mut frame = item(10, Op::ReadV, good.scope).encode().to_vec();
    frame[80..88].copy_from_slice(&2u64.to_le_bytes());
    let mut broken = item(11, Op::Read, good.scope).encode();
    broken[4] = strata_transport::frame::VERSION_EXT;
    broken[6..8].copy_from_slice(&(strata_transport::frame::MAX_EXT_LEN as u16 + 1).to_le_bytes());
    frame.extend_from_slice(&broken);
    frame.extend_from_slice(&item(12, Op::Read, good.scope).encode());
    let mut s = TcpStream::connect(&good.addr).await.unwrap();
    s.write_all(&frame).await.unwrap();
    let (r, msg) = read_response(&mut s).await;
    assert_eq!((r.status, r.req_id), (Code::InvalidArgument, 10), "{msg}");
    assert_hung_up(&mut s).await;

    // An oversized batch: refused at once, connection closed.
    let mut huge = item(5, Op::ReadV, good.scope).encode();
    huge[80..88].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let mut s = TcpStream::connect(&good.addr).await.unwrap();
    s.write_all(&huge).await.unwrap();
    let (r, msg) = read_response(&mut s).await;
    assert_eq!(r.status, Code::InvalidArgument);
    assert!(msg.contains("exceeds the limit"), "{msg}");
    assert_hung_up(&mut s).await;
    // The node still serves.
    assert_eq!(cl.get("a").await.unwrap(), payload(3, 4096));
    c.shutdown().await;
}

/// A range freed for any reason (a revoked put, a forced remove) is reused by
/// the next allocation; grants issued before can neither write nor read it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_die_with_their_range() {
    let c = ClusterBuilder::new().store_nodes(1).build().await.unwrap();
    let cl = c.client().await.unwrap();
    let mut m = cl.master_client();
    let t = cl.transport();
    // A slow writer holds the grant of a put that is then revoked.
    let start = |key: &str| pb::PutStartRequest {
        key: key.into(),
        size: 4096,
        replica_num: 1,
        ..Default::default()
    };
    let old = m
        .put_start(start("old"))
        .await
        .unwrap()
        .into_inner()
        .replicas;
    let old = strata_client::remote_range(&old[0]).unwrap();
    m.put_revoke(pb::PutRevokeRequest {
        key: "old".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    cl.put("new", &payload(7, 4096), &PutOptions::default())
        .await
        .unwrap();
    let new = granted(&cl, "new").await;
    assert_eq!(
        (new.scope.segment_id, new.scope.offset),
        (old.scope.segment_id, old.scope.offset),
        "the freed range was reused"
    );
    assert!(new.scope.generation > old.scope.generation);
    let e = t.write(&old, 0, &[0xEE; 4096]).await.unwrap_err();
    assert_eq!(e.code, Code::PermissionDenied, "{e}");
    assert!(e.message.contains("revoked"), "{e}");
    assert_eq!(cl.get("new").await.unwrap(), payload(7, 4096));

    // A reader's lease outlives a forced remove; its grant does not outlive
    // the next object in the range.
    cl.remove("new", true).await.unwrap();
    cl.put("newer", &payload(8, 4096), &PutOptions::default())
        .await
        .unwrap();
    let newer = granted(&cl, "newer").await;
    assert_eq!(newer.scope.offset, new.scope.offset, "reused again");
    let mut buf = vec![0u8; 4096];
    let e = t.read(&new, 0, &mut buf).await.unwrap_err();
    assert_eq!(e.code, Code::PermissionDenied, "{e}");
    // The current holder is served, both sides of the check.
    t.read(&newer, 0, &mut buf).await.unwrap();
    assert_eq!(buf, payload(8, 4096));
    c.shutdown().await;
}

/// Connections that never present a grant are cut off, and one peer cannot
/// take more than its share of connection slots: a flood of idle sockets
/// from one address does not lock out a client on another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_flood_does_not_lock_out_clients() {
    let c = ClusterBuilder::new().store_nodes(1).build().await.unwrap();
    let cl = c.client().await.unwrap();
    cl.put("k", &payload(1, 10_000), &PutOptions::default())
        .await
        .unwrap();
    let addr = c.nodes[0].data_addr;
    let limit = strata_transport::tcp::ServerLimits::default().max_per_peer;
    let mut idle = Vec::new();
    for _ in 0..limit + 40 {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        idle.push(sock.connect(addr).await.unwrap());
    }
    // A client on another address is served at once.
    assert_eq!(cl.get("k").await.unwrap(), payload(1, 10_000));
    // Every idle socket is closed: the extra ones at once, the rest when
    // the first-grant timeout (5 s) runs out.
    for s in &mut idle {
        let mut b = [0u8; 1];
        let n = tokio::time::timeout(Duration::from_secs(20), s.read(&mut b))
            .await
            .expect("the node closes an idle connection")
            .unwrap_or(0);
        assert_eq!(n, 0);
    }
    // The counters are bumped as the node closes (the socket may report
    // EOF a moment before): wait for them, bounded.
    let admin = c.nodes[0].admin_addr;
    let counts = || async move {
        let (_, body) = strata_tests::http_get(admin, "/metrics").await;
        let refused = strata_tests::metric(&body, "strata_store_node_refused_connections_total");
        let cut = strata_tests::metric(&body, "strata_store_node_cut_off_connections_total");
        (refused, cut)
    };
    let want = (40.0, limit as f64);
    for _ in 0..200 {
        if counts().await == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(counts().await, want, "(refused, cut off)");
    // Still serving.
    assert_eq!(cl.get("k").await.unwrap(), payload(1, 10_000));
    c.shutdown().await;
}

/// Strangers (connections that never present a grant) from 16 addresses,
/// each at its per-address cap, would hold every connection slot of a node
/// for the first-grant timeout; past `max_strangers` each new connection
/// pushes the oldest stranger out instead, so a new reader is served at
/// once and strangers never hold more than their cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_from_many_addresses_cannot_lock_a_node_out() {
    let c = ClusterBuilder::new().store_nodes(1).build().await.unwrap();
    let cl = c.client().await.unwrap();
    cl.put("k", &payload(4, 10_000), &PutOptions::default())
        .await
        .unwrap();
    let addr = c.nodes[0].data_addr;
    let limits = strata_transport::tcp::ServerLimits::default();
    assert_eq!(16 * limits.max_per_peer, limits.max_connections);
    let mut flood = Vec::new();
    for a in 0..16 {
        let ip: std::net::IpAddr = format!("127.0.1.{}", a + 1).parse().unwrap();
        for _ in 0..limits.max_per_peer {
            let sock = tokio::net::TcpSocket::new_v4().unwrap();
            sock.bind((ip, 0).into()).unwrap();
            flood.push(sock.connect(addr).await.unwrap());
        }
    }
    assert_eq!(flood.len(), limits.max_connections);
    // A new reader (its own connection) is served well inside the
    // strangers' first-grant timeout.
    let fresh = c.client().await.unwrap();
    let got = tokio::time::timeout(limits.first_grant_timeout / 2, fresh.get("k"))
        .await
        .expect("served while the strangers' timeout runs");
    assert_eq!(got.unwrap(), payload(4, 10_000));
    // The strangers pushed out are counted as cut off: all but the cap.
    let admin = c.nodes[0].admin_addr;
    let cut = || async move {
        let (_, body) = strata_tests::http_get(admin, "/metrics").await;
        strata_tests::metric(&body, "strata_store_node_cut_off_connections_total")
    };
    let pushed_out = (limits.max_connections - limits.max_strangers) as f64;
    let t0 = std::time::Instant::now();
    while cut().await < pushed_out {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{} cut off",
            cut().await
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(flood);
    c.shutdown().await;
}

/// A stranger's batch read is held to the first-grant timeout while its
/// items trickle in (not the 30 s I/O timeout per item), and its items are
/// checked as they arrive: unsigned ones cut it off before anything is
/// answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strangers_batch_read_is_held_to_its_first_grant_deadline() {
    let (c, cl, good) = one_object(5).await;
    let limits = strata_transport::tcp::ServerLimits::default();
    let item = |id: u64, op: Op, mac| raw(id, op, good.scope, mac, 4096);
    let batch = |n: u64| {
        let mut h = item(1, Op::ReadV, good.mac).encode().to_vec();
        h[80..88].copy_from_slice(&n.to_le_bytes());
        h
    };
    // Items whose grants the master never signed: cut off after the
    // rejection limit, before the batch is answered at all.
    let mut forged = good.mac;
    forged[0] ^= 1;
    let n_items = u64::from(limits.max_rejections) + 8;
    let mut frame = batch(n_items);
    for i in 0..n_items {
        frame.extend_from_slice(&item(2 + i, Op::Read, forged).encode());
    }
    let mut s = TcpStream::connect(&good.addr).await.unwrap();
    let _ = s.write_all(&frame).await;
    let mut rest = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap_or(0);
    assert_eq!(n, 0, "cut off without an answer");

    // A signed first item makes the connection a reader: a forged item after
    // it fails alone.
    let mut frame = batch(2);
    frame.extend_from_slice(&item(2, Op::Read, good.mac).encode());
    frame.extend_from_slice(&item(3, Op::Read, forged).encode());
    let mut s = TcpStream::connect(&good.addr).await.unwrap();
    s.write_all(&frame).await.unwrap();
    let mut h = [0u8; RESP_LEN];
    s.read_exact(&mut h).await.unwrap();
    assert_eq!(Response::decode(&h).unwrap().length, 2);
    let (r, body) = read_raw(&mut s).await;
    assert_eq!((r.status, r.req_id, body), (Code::Ok, 2, payload(5, 4096)));
    let (r, msg) = read_response(&mut s).await;
    assert_eq!((r.status, r.req_id), (Code::PermissionDenied, 3), "{msg}");
    assert_eq!(cl.get("a").await.unwrap(), payload(5, 4096));

    // Declares 1000 items and sends none: cut off at the first-grant
    // deadline.
    let mut s = TcpStream::connect(&good.addr).await.unwrap();
    let t0 = std::time::Instant::now();
    s.write_all(&batch(1000)).await.unwrap();
    let mut rest = Vec::new();
    let n = tokio::time::timeout(limits.io_timeout / 2, s.read_to_end(&mut rest))
        .await
        .expect("cut off well before the I/O timeout")
        .unwrap_or(0);
    assert_eq!(n, 0, "no answer");
    assert!(t0.elapsed() >= limits.first_grant_timeout - Duration::from_millis(100));
    c.shutdown().await;
}

/// A peer that keeps presenting bad grants is cut off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_presenting_bad_grants_is_cut_off() {
    let c = ClusterBuilder::new().store_nodes(1).build().await.unwrap();
    let cl = c.client().await.unwrap();
    cl.put("a", &payload(2, 100), &PutOptions::default())
        .await
        .unwrap();
    let good = granted(&cl, "a").await;
    let mut s = TcpStream::connect(&good.addr).await.unwrap();
    let max = strata_transport::tcp::ServerLimits::default().max_rejections;
    let forged = Request {
        op: Op::Read,
        req_id: 1,
        grant: GrantScope {
            length: 1 << 20,
            ..good.scope
        },
        mac: good.mac,
        offset: good.scope.offset,
        length: 100,
        flags: 0,
        trace: None,
        record: None,
    };
    // Up to the limit each refusal is answered...
    for _ in 0..max {
        s.write_all(&forged.encode()).await.unwrap();
        let (r, _) = read_response(&mut s).await;
        assert_eq!(r.status, Code::PermissionDenied);
    }
    // ...one more and the connection is gone.
    s.write_all(&forged.encode()).await.unwrap();
    let mut rest = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap_or(0);
    assert_eq!(n, 0, "cut off without an answer");
    assert_eq!(cl.get("a").await.unwrap(), payload(2, 100));
    c.shutdown().await;
}

/// Requests the master is receiving share one byte budget
/// (`--max-inflight-bytes`): a call that would take it past is refused,
/// retryable and counted, though within its method's own limit; calls that
/// fit are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_past_the_masters_inflight_budget_are_refused() {
    let c = ClusterBuilder::new()
        .store_nodes(1)
        .master(|m| m.max_inflight_bytes = 1 << 20)
        .build()
        .await
        .unwrap();
    let cl = c.client().await.unwrap();
    let mut m = cl.master_client();
    let keys = |n: usize| (0..n).map(|i| format!("{i:04000}")).collect::<Vec<_>>();
    // ~1.6 MB: within BatchExists' own limit, past the budget.
    let e = m
        .batch_exists(pb::BatchExistsRequest { keys: keys(400) })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e}");
    assert!(e.message().contains("budget is 1048576"), "{e}");
    let (_, body) = strata_tests::http_get(c.master_admin, "/metrics").await;
    assert_eq!(
        strata_tests::metric(&body, "strata_master_inflight_refused_calls_total"),
        1.0
    );
    // ~0.8 MB fits, and so does the next once it is done.
    for _ in 0..2 {
        let r = m
            .batch_exists(pb::BatchExistsRequest { keys: keys(200) })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.results.len(), 200);
        assert!(r.results.iter().all(|x| !x.exists));
    }
    c.shutdown().await;
}

/// Strangers cannot take the master's port: one address holding its share
/// of connections (silent ones, here) gets no more, each refused at once
/// and counted, while members and clients from other addresses are served;
/// slots come back when the connections close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_take_the_masters_port() {
    let c = ClusterBuilder::new()
        .store_nodes(1)
        .master(|m| {
            m.max_connections = 64;
            m.max_connections_per_peer = 8;
        })
        .build()
        .await
        .unwrap();
    let addr: std::net::SocketAddr = c.master_addr().parse().unwrap();
    let stranger = || async {
        let s = tokio::net::TcpSocket::new_v4().unwrap();
        s.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        s.connect(addr).await.unwrap()
    };
    let mut held = Vec::new();
    for _ in 0..8 {
        held.push(stranger().await);
    }
    let metric = |body: &str, name: &str| strata_tests::metric(body, name);
    let open = || async {
        let (_, body) = strata_tests::http_get(c.master_admin, "/metrics").await;
        metric(&body, "strata_master_open_connections")
    };
    let t0 = std::time::Instant::now();
    while open().await < 8.0 {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the stranger's 8 are held"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The 9th is closed at once: end of stream, no answer.
    let mut ninth = stranger().await;
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(5), ninth.read(&mut buf))
        .await
        .expect("closed, not held")
        .unwrap_or(0);
    assert_eq!(n, 0);
    // A client from another address is served meanwhile.
    let cl = c.client().await.unwrap();
    cl.put("k", &payload(1, 1000), &PutOptions::default())
        .await
        .unwrap();
    assert_eq!(cl.get("k").await.unwrap(), payload(1, 1000));
    let (_, body) = strata_tests::http_get(c.master_admin, "/metrics").await;
    assert_eq!(
        metric(
            &body,
            "strata_master_refused_connections_total{reason=\"peer\"}"
        ),
        1.0
    );
    assert_eq!(
        metric(
            &body,
            "strata_master_refused_connections_total{reason=\"total\"}"
        ),
        0.0
    );
    let before = open().await;
    drop(held);
    let t0 = std::time::Instant::now();
    while open().await > before - 8.0 {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "their slots come back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // And the address may connect again.
    let mut again = stranger().await;
    again.write_all(b"x").await.unwrap();
    c.shutdown().await;
}

/// The SSD agent's data plane under hostile frames: a forged grant, a DRAM
/// node's grant (another member's key), a range past the grant, a write, a
/// stage request on a TCP agent and a batch mixing good and forged items
/// are each refused, and garbage ends only its own connection; the object
/// still reads back whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ssd_agents_data_plane_refuses_hostile_frames() {
    let c = ClusterBuilder::new()
        .master(strata_tests::eager)
        .store_nodes(1)
        .ssd_agents(1)
        .build()
        .await
        .unwrap();
    let cl = c.client().await.unwrap();
    let size = 8192u64;
    strata_tests::put_on_ssd_only(&c, &cl, &["s".to_string()], size as usize, 7).await;
    cl.put("d", &payload(8, 4096), &PutOptions::default())
        .await
        .unwrap();
    let ssd = granted(&cl, "s").await;
    let dram = granted(&cl, "d").await;
    assert_eq!(ssd.addr, c.agents[0].data_addr.to_string(), "an SSD grant");
    let mut forged = ssd.mac;
    forged[3] ^= 0x40;
    let exchange = |req: Request| {
        let addr = ssd.addr.clone();
        async move {
            let mut s = TcpStream::connect(&addr).await.unwrap();
            s.write_all(&req.encode()).await.unwrap();
            let r = read_raw(&mut s).await;
            (r, s)
        }
    };
    // A good read, for contrast.
    let ((r, body), _) = exchange(raw(1, Op::Read, ssd.scope, ssd.mac, size)).await;
    assert_eq!((r.status, body), (Code::Ok, payload(7, size as usize)));
    // Forged, another member's grant, past the grant's end.
    for (req, why) in [
        (raw(2, Op::Read, ssd.scope, forged, size), "forged"),
        (
            raw(3, Op::Read, dram.scope, dram.mac, 4096),
            "a node's grant",
        ),
        (
            raw(4, Op::Read, ssd.scope, ssd.mac, size + 1),
            "past the grant",
        ),
        (raw(5, Op::Write, ssd.scope, ssd.mac, 0), "a write"),
    ] {
        let ((r, body), _) = exchange(req).await;
        assert_ne!(r.status, Code::Ok, "{why}");
        assert!(
            matches!(r.status, Code::PermissionDenied | Code::InvalidArgument),
            "{why}: {:?} {}",
            r.status,
            String::from_utf8_lossy(&body)
        );
    }
    // Staging is lent only by a UCX agent.
    let ((r, body), _) = exchange(raw(6, Op::Stage, ssd.scope, ssd.mac, size)).await;
    assert_eq!(
        r.status,
        Code::InvalidArgument,
        "{}",
        String::from_utf8_lossy(&body)
    );
    // A batch of a good item and a forged one: the good one is served.
    let mut frame = raw(10, Op::ReadV, ssd.scope, ssd.mac, 0).encode().to_vec();
    frame[80..88].copy_from_slice(&2u64.to_le_bytes());
    frame.extend_from_slice(&raw(11, Op::Read, ssd.scope, ssd.mac, size).encode());
    frame.extend_from_slice(&raw(12, Op::Read, ssd.scope, forged, size).encode());
    let mut s = TcpStream::connect(&ssd.addr).await.unwrap();
    s.write_all(&frame).await.unwrap();
    let mut h = [0u8; RESP_LEN];
    s.read_exact(&mut h).await.unwrap();
    assert_eq!(Response::decode(&h).unwrap().length, 2);
    let (r, body) = read_raw(&mut s).await;
    assert_eq!(
        (r.status, r.req_id, body),
        (Code::Ok, 11, payload(7, size as usize))
    );
    let (r, _) = read_response(&mut s).await;
    assert_eq!((r.status, r.req_id), (Code::PermissionDenied, 12));
    // Garbage: an error naming the protocol, then a hang-up.
    let mut s = TcpStream::connect(&ssd.addr).await.unwrap();
    s.write_all(&[0xAB; 96]).await.unwrap();
    let (r, msg) = read_response(&mut s).await;
    assert_eq!(r.status, Code::InvalidArgument);
    assert!(msg.contains("magic"), "{msg}");
    assert_hung_up(&mut s).await;
    assert_eq!(cl.get("s").await.unwrap(), payload(7, size as usize));
    c.shutdown().await;
}
