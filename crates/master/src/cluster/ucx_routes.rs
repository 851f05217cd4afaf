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
/// Largest host id of a node's process accepted (a boot id and a PID
/// namespace take about 60 bytes).
pub const MAX_HOST_ID: usize = 256;
/// Largest process id Linux hands out (`PID_MAX_LIMIT`).
pub const MAX_PID: u32 = 1 << 22;

/// One segment's UCX route, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UcxRoute {
    pub worker: std::sync::Arc<[u8]>,
    pub rkey: Vec<u8>,
    pub base: u64,
    pub fingerprint: u64,
    /// The segment's published revocations, from nodes that publish them.
    pub fence: Option<FenceRoute>,
    /// The node's process, from nodes that name it (co-located clients'
    /// cross-memory attach).
    pub process: Option<pb::HostProcess>,
}

/// The process a node serving UCX names (`RegisterNodeRequest.ucx_process`),
/// validated: only beside a worker address, a pid Linux could hand out, and
/// a host id of 1 to [`MAX_HOST_ID`] bytes.
pub fn node_process(worker: &[u8], p: Option<&pb::HostProcess>) -> Result<Option<pb::HostProcess>> {
    let Some(p) = p else { return Ok(None) };
    if worker.is_empty() {
        return Err(Error::invalid(
            "a node names its process only when it serves UCX (with its worker address)",
        ));
    }
    if p.pid == 0 || p.pid > MAX_PID || p.host.is_empty() || p.host.len() > MAX_HOST_ID {
        return Err(Error::invalid(format!(
            "a node's process needs a pid from 1 to {MAX_PID} (not {}) and a host id of 1 to \
             {MAX_HOST_ID} bytes (not {})",
            p.pid,
            p.host.len()
        )));
    }
    Ok(Some(p.clone()))
}

/// Where a segment's published revocations are (`UcxRoute.fence_*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceRoute {
    pub rkey: Vec<u8>,
    pub base: u64,
    pub granule: u64,
    /// The node's registration stamp (never 0).
    pub stamp: u64,
}

impl FenceRoute {
    /// The published revocations of a segment of `spec.size` bytes, if the
    /// node publishes them (nodes that predate them send none).
    fn of(spec: &pb::SegmentSpec) -> Result<Option<FenceRoute>> {
        let none = spec.ucx_fence_rkey.is_empty()
            && spec.ucx_fence_base == 0
            && spec.ucx_fence_granule == 0
            && spec.ucx_fence_stamp == 0;
        if none {
            return Ok(None);
        }
        use strata_transport::published::{layout_ok, MAX_GRANULE, MIN_GRANULE};
        if spec.ucx_fence_rkey.is_empty()
            || spec.ucx_fence_rkey.len() > MAX_RKEY
            || !layout_ok(spec.size, spec.ucx_fence_base, spec.ucx_fence_granule)
            || spec.ucx_fence_stamp == 0
        {
            return Err(Error::invalid(format!(
                "a segment's published revocations need a remote key (1 to {MAX_RKEY} bytes, \
                 not {}), a base address whose words fit ({:#x}), a power-of-two granule \
                 from {MIN_GRANULE} to {MAX_GRANULE} bytes (not {}) and a non-zero stamp",
                spec.ucx_fence_rkey.len(),
                spec.ucx_fence_base,
                spec.ucx_fence_granule
            )));
        }
        Ok(Some(FenceRoute {
            rkey: spec.ucx_fence_rkey.clone(),
            base: spec.ucx_fence_base,
            granule: spec.ucx_fence_granule,
            stamp: spec.ucx_fence_stamp,
        }))
    }
}

impl UcxRoute {
    /// The route of a segment of `size` bytes a node registered, if it
    /// registered one. Both halves or neither: a key without a worker (or
    /// the reverse) is refused, as is a segment whose end overflows.
    pub fn of(
        worker: &std::sync::Arc<[u8]>,
        process: Option<&pb::HostProcess>,
        spec: &pb::SegmentSpec,
    ) -> Result<Option<UcxRoute>> {
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
        let fence = FenceRoute::of(spec)?;
        let stamp = fence.as_ref().map_or(0, |f| f.stamp);
        Ok(Some(UcxRoute {
            fence,
            fingerprint: fingerprint(worker, &spec.ucx_rkey, spec.ucx_base, stamp),
            worker: worker.clone(),
            rkey: spec.ucx_rkey.clone(),
            base: spec.ucx_base,
            process: process.cloned(),
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
            fence_rkey: self
                .fence
                .as_ref()
                .map(|f| f.rkey.clone())
                .unwrap_or_default(),
            fence_base: self.fence.as_ref().map_or(0, |f| f.base),
            fence_granule: self.fence.as_ref().map_or(0, |f| f.granule),
            fence_stamp: self.fence.as_ref().map_or(0, |f| f.stamp),
            process: self.process.clone(),
        }
    }
}

/// Names a route (never 0, which means "no route"). Worker addresses hold
/// a per-process unique id, so a restarted node's routes never match; the
/// registration stamp changes with every registration of the same process
/// (grants of an earlier one must not read through the new route).
pub fn fingerprint(worker: &[u8], rkey: &[u8], base: u64, stamp: u64) -> u64 {
    let mut h = blake3::Hasher::new();
    h.update(&(worker.len() as u64).to_le_bytes());
    h.update(worker);
    h.update(&(rkey.len() as u64).to_le_bytes());
    h.update(rkey);
    h.update(&base.to_le_bytes());
    h.update(&stamp.to_le_bytes());
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
            ..Default::default()
        }
    }

    #[test]
    fn routes_are_validated() {
        let w: std::sync::Arc<[u8]> = vec![7u8; 100].into();
        let none: std::sync::Arc<[u8]> = Vec::new().into();
        assert_eq!(UcxRoute::of(&none, None, &spec(b"", 0)).unwrap(), None);
        let r = UcxRoute::of(&w, None, &spec(b"key", 0x1000))
            .unwrap()
            .unwrap();
        assert_eq!((r.base, &r.rkey[..]), (0x1000, &b"key"[..]));
        // Half a route, a null base, an overflowing end, oversized parts.
        assert!(UcxRoute::of(&w, None, &spec(b"", 0x1000)).is_err());
        assert!(UcxRoute::of(&none, None, &spec(b"key", 0x1000)).is_err());
        assert!(UcxRoute::of(&w, None, &spec(b"key", 0)).is_err());
        assert!(UcxRoute::of(&w, None, &spec(b"key", u64::MAX - (1 << 20) + 1)).is_err());
        assert!(UcxRoute::of(&w, None, &spec(b"key", u64::MAX - (1 << 20))).is_ok());
        assert!(UcxRoute::of(&w, None, &spec(&[1; MAX_RKEY + 1], 0x1000)).is_err());
        assert!(UcxRoute::of(&w, None, &spec(&[1; MAX_RKEY], 0x1000)).is_ok());
        let big: std::sync::Arc<[u8]> = vec![7u8; MAX_WORKER_ADDRESS + 1].into();
        assert!(UcxRoute::of(&big, None, &spec(b"key", 0x1000)).is_err());
    }

    #[test]
    fn published_revocations_are_validated() {
        let w: std::sync::Arc<[u8]> = vec![7u8; 100].into();
        let with = |rkey: &[u8], base: u64, granule: u64| pb::SegmentSpec {
            ucx_fence_rkey: rkey.to_vec(),
            ucx_fence_base: base,
            ucx_fence_granule: granule,
            ucx_fence_stamp: 77,
            ..spec(b"key", 0x1000)
        };
        // None (an older node), or all three.
        assert_eq!(
            UcxRoute::of(&w, None, &spec(b"key", 0x1000))
                .unwrap()
                .unwrap()
                .fence,
            None
        );
        let r = UcxRoute::of(&w, None, &with(b"f", 0x9000, 4096))
            .unwrap()
            .unwrap();
        assert_eq!(
            r.fence,
            Some(FenceRoute {
                rkey: b"f".to_vec(),
                base: 0x9000,
                granule: 4096,
                stamp: 77,
            })
        );
        let p = r.to_proto(3, "n:1", 1 << 20);
        assert_eq!(
            (p.fence_rkey, p.fence_base, p.fence_granule, p.fence_stamp),
            (b"f".to_vec(), 0x9000, 4096, 77)
        );
        // Another registration of the same memory is another route.
        let again = pb::SegmentSpec {
            ucx_fence_stamp: 78,
            ..with(b"f", 0x9000, 4096)
        };
        let again = UcxRoute::of(&w, None, &again).unwrap().unwrap();
        assert_ne!(again.fingerprint, r.fingerprint);
        let stampless = pb::SegmentSpec {
            ucx_fence_stamp: 0,
            ..with(b"f", 0x9000, 4096)
        };
        assert!(UcxRoute::of(&w, None, &stampless).is_err());
        for bad in [
            with(b"", 0x9000, 4096),
            with(b"f", 0, 4096),
            with(b"f", 0x9000, 0),
            with(b"f", 0x9000, 4095),
            with(b"f", 0x9000, 32),
            with(b"f", 0x9000, 2 << 30),
            with(&[1; MAX_RKEY + 1], 0x9000, 4096),
            // The words (257 of them) would run past the address space.
            with(b"f", u64::MAX - 8 * 257 + 1, 4096),
        ] {
            assert!(UcxRoute::of(&w, None, &bad).is_err(), "{bad:?}");
        }
        // Just inside each bound.
        for good in [
            with(b"f", 0x9000, 64),
            with(b"f", 0x9000, 1 << 30),
            with(&[1; MAX_RKEY], 0x9000, 4096),
            with(b"f", u64::MAX - 8 * 257, 4096),
        ] {
            assert!(UcxRoute::of(&w, None, &good).is_ok(), "{good:?}");
        }
    }

    #[test]
    fn node_processes_are_validated() {
        let w = [7u8; 100];
        let p = |pid: u32, host: &str| pb::HostProcess {
            pid,
            host: host.to_string(),
            start_time: 7,
        };
        // None (an older node), or beside a worker only.
        assert_eq!(node_process(&w, None).unwrap(), None);
        assert_eq!(node_process(&[], None).unwrap(), None);
        assert!(node_process(&[], Some(&p(42, "boot/pid:[1]"))).is_err());
        // Just inside and just outside each bound.
        for good in [p(1, "h"), p(MAX_PID, "h"), p(42, &"h".repeat(MAX_HOST_ID))] {
            assert_eq!(node_process(&w, Some(&good)).unwrap(), Some(good.clone()));
        }
        for bad in [
            p(0, "h"),
            p(MAX_PID + 1, "h"),
            p(42, ""),
            p(42, &"h".repeat(MAX_HOST_ID + 1)),
        ] {
            assert!(node_process(&w, Some(&bad)).is_err(), "{bad:?}");
        }
        // The route hands it on as registered.
        let r = UcxRoute::of(&w.to_vec().into(), Some(&p(42, "h")), &spec(b"key", 0x1000))
            .unwrap()
            .unwrap();
        assert_eq!(r.to_proto(3, "n:1", 1 << 20).process, Some(p(42, "h")));
    }

    #[test]
    fn fingerprints_tell_routes_apart() {
        let a = fingerprint(b"worker", b"key", 0x1000, 5);
        assert_ne!(a, 0);
        assert_eq!(a, fingerprint(b"worker", b"key", 0x1000, 5));
        assert_ne!(a, fingerprint(b"worker2", b"key", 0x1000, 5));
        assert_ne!(a, fingerprint(b"worker", b"key2", 0x1000, 5));
        assert_ne!(a, fingerprint(b"worker", b"key", 0x2000, 5));
        assert_ne!(a, fingerprint(b"worker", b"key", 0x1000, 6));
        // Length prefixes: moving a byte between the parts changes it.
        assert_ne!(
            fingerprint(b"ab", b"c", 1, 0),
            fingerprint(b"a", b"bc", 1, 0)
        );
    }
}
