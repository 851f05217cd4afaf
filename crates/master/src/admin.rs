//! The master's admin JSON API (besides /metrics, /health, /ready).

use crate::master::Master;
use crate::serving::Serving;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;
use std::sync::Arc;
use strata_common::admin::{error_response, require};
use strata_common::auth::Role;
use strata_common::Error;

pub fn api_router(serving: Arc<Serving>) -> Router {
    Router::new()
        .route("/api/v1/keys/{*key}", get(key))
        .route("/api/v1/segments", get(segments))
        .route("/api/v1/nodes", get(nodes))
        .route("/api/v1/owners", get(owners))
        .route("/api/v1/offload", get(offload))
        .route(
            "/api/v1/leader",
            get(|State(s): State<Arc<Serving>>| async move { Json(s.describe()) }),
        )
        .with_state(serving)
}

/// The serving term's metadata; a follower answers 503 `not_leader` naming
/// the leader (its metadata is not the cluster's).
struct Leader(Arc<Master>);

impl FromRequestParts<Arc<Serving>> for Leader {
    type Rejection = Response;

    async fn from_request_parts(
        _parts: &mut Parts,
        s: &Arc<Serving>,
    ) -> Result<Self, Self::Rejection> {
        s.current().map(Leader).map_err(|e| error_response(&e))
    }
}

/// One key's details: its name, size, copies and readers are the
/// admin's to see (`--admin-token-file`; open only in protected mode).
async fn key(Leader(m): Leader, headers: HeaderMap, Path(key): Path<String>) -> Response {
    if let Err(refused) = require(&m.config().credentials, &headers, Role::Admin) {
        return refused;
    }
    match m.describe(&key) {
        Some(v) => Json(v).into_response(),
        None => error_response(&Error::not_found(format!("key {key:?} not found"))),
    }
}

async fn segments(Leader(m): Leader) -> Response {
    let st = tokio::task::spawn_blocking(move || m.stat()).await;
    match st {
        Ok(st) => Json(json!({
            "capacity_bytes": st.capacity_bytes,
            "allocated_bytes": st.allocated_bytes,
            "segments": st.segment_info.iter().map(|s| json!({
                "segment_id": s.segment_id,
                "node": s.node_id,
                "data_addr": s.data_addr,
                "capacity_bytes": s.capacity_bytes,
                "allocated_bytes": s.allocated_bytes,
                "largest_free_bytes": s.largest_free_bytes,
            })).collect::<Vec<_>>(),
        }))
        .into_response(),
        Err(e) => error_response(&Error::internal(e.to_string())),
    }
}

async fn nodes(Leader(m): Leader) -> Response {
    Json(m.describe_nodes()).into_response()
}

async fn owners(Leader(m): Leader) -> Response {
    Json(m.describe_owners()).into_response()
}

/// The offload queue: counts for everyone, the tasks' keys for the admin
/// only (as the key view).
async fn offload(Leader(m): Leader, headers: HeaderMap) -> Response {
    let admin = require(&m.config().credentials, &headers, Role::Admin).is_ok();
    Json(m.describe_offload(admin)).into_response()
}
