//! UCX routes of memory segments: what a store node started with
//! `--transport ucx` registers (its worker address, each segment's packed
//! remote key and base address) and what rdma clients fetch to reach the
//! segments one-sided.
//!
//! A remote key opens a whole segment to its holder, and no node checks a
//! one-sided access, so routes go only to callers with the rdma role
//! (`GetUcxRoutes`); everyone else reaches the same bytes over TCP, where the
//! node checks every grant. Replicas carry only a fingerprint of the route:
//! a client caches routes by fingerprint, so a route can never be confused
//! with another process's or another registration's (segment ids are
//! reassigned by every new master).

use strata_common::{Error, Result};
use strata_proto as pb;

/// Largest worker address accepted (UCX 1.13 packs a few hundred bytes).
pub const MAX_WORKER_ADDRESS: usize = 8192;
/// Largest packed remote key accepted.
pub const MAX_RKEY: usize = 4096;

/// One segment's UCX route, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UcxRoute {
    pub worker: std::sync::Arc<[u8]>,
    pub rkey: Vec<u8>,
    pub base: u64,
    pub fingerprint: u64,
}

impl UcxRoute {
    /// The route of a segment of `size` bytes a node registered, if it
    /// registered one. Both halves or neither: a key without a worker (or
    /// the reverse) is refused, as is a segment whose end overflows.
    pub fn of(worker: &std::sync::Arc<[u8]>, spec: &pb::SegmentSpec) -> Result<Option<UcxRoute>> {
        match (worker.is_empty(), spec.ucx_rkey.is_empty()) {
            (true, true) => return Ok(None),
            (false, false) => {}
            _ => return Err(Error::invalid(
                "a node serving UCX must send its worker address and every segment's remote key",
            )),
        }
        if worker.len() > MAX_WORKER_ADDRESS || spec.ucx_rkey.len() > MAX_RKEY {
            return Err(Error::invalid(format!(
                "UCX worker address ({} bytes) or remote key ({} bytes) too large \
                 (limits {MAX_WORKER_ADDRESS} and {MAX_RKEY})",
                worker.len(),
                spec.ucx_rkey.len()
            )));
        }
        if spec.ucx_base == 0 || spec.ucx_base.checked_add(spec.size).is_none() {
            return Err(Error::invalid(format!(
                "UCX base address {:#x} of a {}-byte segment is not a valid range",
                spec.ucx_base, spec.size
            )));
        }
        Ok(Some(UcxRoute {
            fingerprint: fingerprint(worker, &spec.ucx_rkey, spec.ucx_base),
            worker: worker.clone(),
            rkey: spec.ucx_rkey.clone(),
            base: spec.ucx_base,
        }))
    }

    pub fn to_proto(&self, segment_id: u64, data_addr: &str, size: u64) -> pb::UcxRoute {
        pb::UcxRoute {
            segment_id,
            fingerprint: self.fingerprint,
            data_addr: data_addr.to_string(),
            worker: self.worker.to_vec(),
            rkey: self.rkey.clone(),
            base: self.base,
            size,
        }
    }
}

/// Names a route (never 0, which means "no route"). Worker addresses hold
/// a per-process unique id, so a restarted node's routes never match.
pub fn fingerprint(worker: &[u8], rkey: &[u8], base: u64) -> u64 {
    let mut h = blake3::Hasher::new();
    h.update(&(worker.len() as u64).to_le_bytes());
    h.update(worker);
    h.update(&(rkey.len() as u64).to_le_bytes());
    h.update(rkey);
    h.update(&base.to_le_bytes());
    let b = h.finalize();
    u64::from_le_bytes(b.as_bytes()[..8].try_into().expect("8 bytes")).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(rkey: &[u8], base: u64) -> pb::SegmentSpec {
        pb::SegmentSpec {
            local_id: 0,
            size: 1 << 20,
            ucx_rkey: rkey.to_vec(),
            ucx_base: base,
        }
    }

    #[test]
    fn routes_are_validated() {
        let w: std::sync::Arc<[u8]> = vec![7u8; 100].into();
        let none: std::sync::Arc<[u8]> = Vec::new().into();
        assert_eq!(UcxRoute::of(&none, &spec(b"", 0)).unwrap(), None);
        let r = UcxRoute::of(&w, &spec(b"key", 0x1000)).unwrap().unwrap();
        assert_eq!((r.base, &r.rkey[..]), (0x1000, &b"key"[..]));
        // Half a route, a null base, an overflowing end, oversized parts.
        assert!(UcxRoute::of(&w, &spec(b"", 0x1000)).is_err());
        assert!(UcxRoute::of(&none, &spec(b"key", 0x1000)).is_err());
        assert!(UcxRoute::of(&w, &spec(b"key", 0)).is_err());
        assert!(UcxRoute::of(&w, &spec(b"key", u64::MAX - (1 << 20) + 1)).is_err());
        assert!(UcxRoute::of(&w, &spec(b"key", u64::MAX - (1 << 20))).is_ok());
        assert!(UcxRoute::of(&w, &spec(&[1; MAX_RKEY + 1], 0x1000)).is_err());
        assert!(UcxRoute::of(&w, &spec(&[1; MAX_RKEY], 0x1000)).is_ok());
        let big: std::sync::Arc<[u8]> = vec![7u8; MAX_WORKER_ADDRESS + 1].into();
        assert!(UcxRoute::of(&big, &spec(b"key", 0x1000)).is_err());
    }

    #[test]
    fn fingerprints_tell_routes_apart() {
        let a = fingerprint(b"worker", b"key", 0x1000);
        assert_ne!(a, 0);
        assert_eq!(a, fingerprint(b"worker", b"key", 0x1000));
        assert_ne!(a, fingerprint(b"worker2", b"key", 0x1000));
        assert_ne!(a, fingerprint(b"worker", b"key2", 0x1000));
        assert_ne!(a, fingerprint(b"worker", b"key", 0x2000));
        // Length prefixes: moving a byte between the parts changes it.
        assert_ne!(fingerprint(b"ab", b"c", 1), fingerprint(b"a", b"bc", 1));
    }
}
