//! Lending SSD reads one-sided over UCX (`--transport ucx`).

use crate::config::SsdAgentConfig;
use crate::metrics::AgentMetrics;
use crate::staging;
use std::sync::Arc;
use strata_common::Result;

/// What lends reads one-sided, with `--transport ucx`: a window as large as
/// the arena, in slots of one staging piece, waited for like the arena.
#[cfg(feature = "ucx")]
pub(crate) async fn lender(
    cfg: &SsdAgentConfig,
    staging: &staging::Staging,
    m: &AgentMetrics,
) -> Result<Option<Arc<strata_transport::lend::Lender>>> {
    use strata_transport::lend::{LendConfig, LEND_TTL};
    if cfg.transport != crate::config::TransportKind::Ucx {
        return Ok(None);
    }
    let lend = LendConfig {
        slot_bytes: staging.piece_bytes(),
        wait: cfg.staging_wait,
        ttl: LEND_TTL,
        setting: "--staging-bytes (STRATA_STAGING_BYTES) on this SSD agent",
    };
    let l = strata_transport::lend::start_ucx(cfg.staging_bytes, lend, m.lend.clone())
        .await
        .map_err(|e| e.context("cannot serve --transport ucx"))?;
    tracing::info!(
        window_bytes = l.size(),
        slot_bytes = l.slot_bytes(),
        "SSD reads are lent to rdma readers over UCX"
    );
    Ok(Some(Arc::new(l)))
}

#[cfg(not(feature = "ucx"))]
pub(crate) async fn lender(
    _: &SsdAgentConfig,
    _: &staging::Staging,
    _: &AgentMetrics,
) -> Result<Option<Arc<strata_transport::lend::Lender>>> {
    // `validate` refused --transport ucx in this build.
    Ok(None)
}
