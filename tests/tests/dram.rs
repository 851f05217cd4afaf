//! End-to-end behaviour of the DRAM tier on an in-process cluster.

use strata_client::{Code, PutOptions};
use strata_tests::{payload, ClusterBuilder};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_get_round_trip_sizes() {
    let c = ClusterBuilder::new().store_nodes(2).build().await.unwrap();
    let cl = c.client().await.unwrap();
    for (i, size) in [1usize, 100, 4096, 65536, 1 << 20, 9 << 20]
        .into_iter()
        .enumerate()
    {
        let key = format!("obj-{i}");
        let data = payload(i as u64, size);
        cl.put(
            &key,
            &data,
            &PutOptions {
                replicas: 2,
                ..Default::default()
            },
        )
        .await
        .unwrap();
        assert_eq!(cl.get(&key).await.unwrap(), data, "size {size}");
        let mut buf = vec![0u8; size + 10];
        assert_eq!(cl.get_into(&key, &mut buf).await.unwrap(), size);
        assert_eq!(&buf[..size], &data[..]);
        let info = cl.inspect(&key).await.unwrap();
        assert_eq!(info.replicas.len(), 2);
        assert_ne!(info.replicas[0].segment_id, info.replicas[1].segment_id);
    }
    let e = cl.get("nope").await.unwrap_err();
    assert_eq!(e.code, Code::NotFound);
    assert!(e.message.contains("not found"));
    c.shutdown().await;
}
