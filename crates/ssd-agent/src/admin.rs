//! The agent's admin endpoints: `/metrics`, `/health`, `/ready` and
//! `/api/v1/owner`.

use crate::metrics::AgentMetrics;
use crate::store::{OwnerStore, RecoveryReport};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub(crate) fn admin_router(
    m: &Arc<AgentMetrics>,
    store: &Arc<OwnerStore>,
    ready: Arc<AtomicBool>,
    recovery: RecoveryReport,
) -> axum::Router {
    let (m2, s2) = (m.clone(), store.clone());
    let refresh = Arc::new(move || {
        let st = s2.stats();
        m2.used.set(st.used as i64);
        m2.overhead.set(st.overhead as i64);
        m2.buckets.set(st.buckets as i64);
        m2.objects.set(st.objects as i64);
        m2.unknown_files.set(st.unknown_files as i64);
        m2.quarantined_files.set(st.quarantined as i64);
    });
    let s3 = store.clone();
    strata_common::admin::base_router(
        m.registry.clone(),
        Arc::new(move || ready.load(Ordering::Acquire)),
        Some(refresh),
    )
    .route(
        "/api/v1/owner",
        axum::routing::get(move || {
            let (s, rec) = (s3.clone(), recovery.clone());
            async move {
                axum::Json(serde_json::json!({
                    "handle": s.handle,
                    "owner_id": s.owner_id,
                    "capacity": s.capacity,
                    "stats": s.stats(),
                    "recovery": rec,
                }))
            }
        }),
    )
}
