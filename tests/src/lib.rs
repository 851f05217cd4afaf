//! Helpers shared by the cluster-level tests.

pub use strata_client::{ClusterBuilder, LocalCluster};

/// Deterministic test bytes for `key` of `len` bytes.
pub fn payload(seed: u64, len: usize) -> Vec<u8> {
    use rand::{RngCore, SeedableRng};
    let mut v = vec![0u8; len];
    rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

/// GET on an admin endpoint; returns (status, body).
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let r = reqwest::get(format!("http://{addr}{path}"))
        .await
        .expect("admin endpoint answers");
    let status = r.status().as_u16();
    (status, r.text().await.unwrap_or_default())
}
