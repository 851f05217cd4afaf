//! The UCX data plane between distinct hosts (network namespaces,
//! `strata_tests::fleet`): a client on another host than the node moves
//! bytes one-sided over UCX's network transports, never by the same-host
//! path (cross-memory attach, the shared-memory engine), even though every
//! host here shares one kernel — which is why that path must be chosen by
//! address, not by the kernel's boot id: a wrongly chosen attach would work
//! here and fail on real hosts. A client on the node's own host attaches;
//! clients without the rdma role, and TCP clients, reach the node over TCP
//! from anywhere.

use std::time::Duration;
use strata_client::{Client, ClientConfig, PutOptions, TransportKind};
use strata_common::grpc::MasterChannel;
use strata_proto as pb;
use strata_proto::master_client::MasterClient;
use strata_tests::fleet::Fleet;
use strata_tests::procs::TokenFiles;
use strata_tests::{http_get, metric, payload, ucx_transport};
use strata_transport::ucx::UcxTransport;
use strata_transport::Transport;

const MASTER: usize = 0;
const NODE: usize = 1;
const FAR: usize = 2;

/// Bytes the node's TCP data plane wrote and read.
async fn node_tcp_bytes(f: &Fleet) -> (f64, f64) {
    let admin = f.host(NODE).at(7101).parse().unwrap();
    let (_, body) = http_get(admin, "/metrics").await;
    (
        metric(&body, "strata_store_node_written_bytes_total"),
        metric(&body, "strata_store_node_read_bytes_total"),
    )
}

fn master_client(f: &Fleet, token: &std::path::Path) -> MasterClient<MasterChannel> {
    strata_tests::master_client_as(&f.host(MASTER).at(7000), token)
}

/// Puts `bytes` as `key` through `t` and returns where a reader finds it.
async fn put_through(
    m: &mut MasterClient<MasterChannel>,
    t: &UcxTransport,
    key: &str,
    bytes: &[u8],
) -> strata_transport::RemoteRange {
    let st = m
        .put_start(pb::PutStartRequest {
            key: key.into(),
            size: bytes.len() as u64,
            replica_num: 1,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(st.replicas.len(), 1);
    let w = strata_transport::remote_range(&st.replicas[0]).unwrap();
    t.write(&w, 0, bytes).await.unwrap();
    m.put_end(pb::PutEndRequest {
        key: key.into(),
        crc32c: crc32c::crc32c(bytes),
        put_token: st.put_token,
        ..Default::default()
    })
    .await
    .unwrap();
    let got = m
        .get_replicas(pb::GetReplicasRequest { key: key.into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.replicas.len(), 1);
    strata_transport::remote_range(&got.replicas[0]).unwrap()
}

#[test]
fn ucx_between_hosts_never_takes_the_same_host_path() {
    let f = Fleet::new(3);
    let dir = tempfile::tempdir().unwrap();
    let t = TokenFiles::generate(dir.path()).unwrap();
    let master = f.host(MASTER).at(7000);
    let _m = f.spawn_master(MASTER, &t, &[]).unwrap();
    let _n = f
        .spawn_node(NODE, &master, "ucx-node", &t, &["--transport", "ucx"])
        .unwrap();
    let far = f.runtime(FAR).unwrap();
    let near = f.runtime(NODE).unwrap();
    assert!(far.block_on(f.wait_live_nodes(MASTER, 1, Duration::from_secs(60))));

    // From the far host: one-sided both ways, no byte over the node's TCP
    // data plane, and never by attach.
    let bytes = payload(1, 3 << 20);
    let r = far.block_on(async {
        let mut m = master_client(&f, &t.rdma);
        let ucx = ucx_transport(m.clone());
        let r = put_through(&mut m, &ucx, "far", &bytes).await;
        let mut back = vec![0u8; bytes.len()];
        let crc = ucx.read_crc32c(&r, 0, &mut back).await.unwrap();
        assert!(back == bytes, "read back intact");
        assert_eq!(crc, crc32c::crc32c(&bytes));
        assert_eq!(ucx.one_sided_transfers(), 2, "write and read one-sided");
        assert_eq!(
            (
                ucx.attached_reads(),
                ucx.mapped_reads(),
                ucx.mapped_writes(),
                ucx.shared_memory_transfers()
            ),
            (0, 0, 0, 0),
            "the same-host path taken across hosts"
        );
        assert_eq!(node_tcp_bytes(&f).await, (0.0, 0.0), "no byte over TCP");
        r
    });

    // On the node's own host: the same object is read by attach, and a
    // write copies into the node's segment mapped here.
    near.block_on(async {
        let mut m = master_client(&f, &t.rdma);
        let ucx = ucx_transport(m.clone());
        let mut back = vec![0u8; bytes.len()];
        ucx.read(&r, 0, &mut back).await.unwrap();
        assert!(back == bytes, "read back intact");
        assert_eq!((ucx.attached_reads(), ucx.mapped_reads()), (1, 1));
        let near_bytes = payload(3, 1 << 20);
        let w = put_through(&mut m, &ucx, "near", &near_bytes).await;
        // One-sided (the attached read and the write), the write into the
        // mapping, not through the shared-memory engine.
        assert_eq!(ucx.one_sided_transfers(), 2);
        assert_eq!(
            (ucx.mapped_writes(), ucx.shared_memory_transfers()),
            (1, 0),
            "the write into the mapped segment"
        );
        ucx.read(&w, 0, &mut back[..near_bytes.len()])
            .await
            .unwrap();
        assert!(back[..near_bytes.len()] == near_bytes[..]);
        assert_eq!(node_tcp_bytes(&f).await, (0.0, 0.0), "no byte over TCP");
    });

    // The TCP fallback across hosts: a UCX client without the rdma role and
    // a TCP client read and write the UCX node over its TCP data plane.
    far.block_on(async {
        for kind in [TransportKind::Ucx, TransportKind::Tcp] {
            let cfg = ClientConfig::new(&master)
                .with_token(Some(t.client_secret().unwrap()))
                .with_transport(kind);
            let c = Client::connect(cfg).await.unwrap();
            let (w0, r0) = node_tcp_bytes(&f).await;
            assert!(c.get("far").await.unwrap() == bytes, "{kind:?}");
            let small = payload(2, 4096);
            let key = format!("tcp-{kind:?}");
            c.put(&key, &small, &PutOptions::default()).await.unwrap();
            assert_eq!(c.get(&key).await.unwrap(), small, "{kind:?}");
            let (w1, r1) = node_tcp_bytes(&f).await;
            assert_eq!(w1 - w0, 4096.0, "{kind:?}");
            assert_eq!(r1 - r0, (bytes.len() + 4096) as f64, "{kind:?}");
        }
    });
}
