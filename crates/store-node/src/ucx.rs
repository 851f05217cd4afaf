//! Serving the segments over UCX (`--transport ucx`): exposing them at
//! start, and the UCX halves of each registration with the master.

use crate::config::StoreNodeConfig;
use std::sync::Arc;
use strata_common::Result;
use strata_proto as pb;
use strata_transport::region::Segment;

/// The segments exposed over UCX (`--transport ucx`): TCP keeps serving
/// every client; rdma clients may also read and write one-sided.
#[cfg(feature = "ucx")]
pub(crate) type Ucx = strata_transport::ucx::UcxNode;
#[cfg(not(feature = "ucx"))]
pub(crate) type Ucx = std::convert::Infallible;

#[cfg(feature = "ucx")]
pub(crate) async fn expose_over_ucx(
    cfg: &StoreNodeConfig,
    segments: &[Arc<Segment>],
) -> Result<Option<Ucx>> {
    if cfg.transport != crate::config::TransportKind::Ucx {
        return Ok(None);
    }
    let node = strata_transport::ucx::UcxNode::start(None, segments)
        .await
        .map_err(|e| e.context("cannot serve --transport ucx"))?;
    tracing::info!(
        worker_address_bytes = node.worker_address().len(),
        segments = segments.len(),
        "segments registered with UCX"
    );
    Ok(Some(node))
}

#[cfg(not(feature = "ucx"))]
pub(crate) async fn expose_over_ucx(
    _: &StoreNodeConfig,
    _: &[Arc<Segment>],
) -> Result<Option<Ucx>> {
    // `validate` refused --transport ucx in this build.
    Ok(None)
}

/// The UCX halves of a registration: the worker address, each segment's
/// (remote key, base address), and this process for co-located clients'
/// cross-memory attach.
#[cfg(feature = "ucx")]
pub(crate) fn ucx_registration(ucx: Option<&Ucx>, stamp: u64) -> UcxRegistration {
    match ucx {
        Some(n) => (
            n.worker_address().to_vec(),
            n.routes()
                .iter()
                .zip(n.fence_routes())
                .map(|(r, f)| pb::SegmentSpec {
                    ucx_rkey: r.rkey.clone(),
                    ucx_base: r.base,
                    ucx_fence_rkey: f.rkey.clone(),
                    ucx_fence_base: f.base,
                    ucx_fence_granule: strata_transport::published::GRANULE,
                    ucx_fence_stamp: stamp,
                    ..Default::default()
                })
                .collect(),
            strata_transport::ucx::cross_memory::this_process().cloned(),
        ),
        None => (Vec::new(), Vec::new(), None),
    }
}

pub(crate) type UcxRegistration = (Vec<u8>, Vec<pb::SegmentSpec>, Option<pb::HostProcess>);

#[cfg(not(feature = "ucx"))]
pub(crate) fn ucx_registration(_: Option<&Ucx>, _: u64) -> UcxRegistration {
    (Vec::new(), Vec::new(), None)
}
