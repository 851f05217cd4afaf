//! The admin HTTP endpoint every service serves: `/metrics`, `/health`,
//! `/ready`, plus whatever JSON API routes the service adds.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use prometheus::{Encoder, Registry, TextEncoder};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Answers whether the service can do its job right now.
pub type ReadyFn = Arc<dyn Fn() -> bool + Send + Sync>;
/// Updates gauges that are computed at scrape time.
pub type RefreshFn = Arc<dyn Fn() + Send + Sync>;

#[derive(Clone)]
struct BaseState {
    registry: Registry,
    ready: ReadyFn,
    refresh: Option<RefreshFn>,
}

/// `/metrics`, `/health` and `/ready` routes.
pub fn base_router(registry: Registry, ready: ReadyFn, refresh: Option<RefreshFn>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/health", get(|| async { "ok\n" }))
        .route("/ready", get(readiness))
        .with_state(BaseState {
            registry,
            ready,
            refresh,
        })
}

async fn metrics(State(s): State<BaseState>) -> Response {
    if let Some(r) = &s.refresh {
        r();
    }
    let mut buf = Vec::new();
    match TextEncoder::new().encode(&s.registry.gather(), &mut buf) {
        Ok(()) => (
            [(
                axum::http::header::CONTENT_TYPE,
                "text/plain; version=0.0.4",
            )],
            buf,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

async fn readiness(State(s): State<BaseState>) -> Response {
    if (s.ready)() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n").into_response()
    }
}

/// Admits a request to a guarded admin route (one that names keys):
/// its `Authorization: Bearer` token must prove `role` under `creds`. A
/// service without credentials (protected mode, loopback only) admits
/// every request, as its gRPC port does.
#[allow(clippy::result_large_err)] // a Response is what the route returns
pub fn require(
    creds: &crate::auth::Credentials,
    headers: &axum::http::HeaderMap,
    role: crate::auth::Role,
) -> Result<(), Response> {
    let presented = headers
        .get(axum::http::header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    creds
        .roles_of(crate::auth::bearer(presented))
        .and_then(|roles| creds.check(roles, role))
        .map_err(|e| {
            error_response(&crate::Error::new(
                e.code,
                format!("{} (over HTTP: `Authorization: Bearer TOKEN`)", e.message),
            ))
        })
}

/// Renders a Strata error as JSON with the HTTP status its code maps to.
pub fn error_response(e: &crate::Error) -> Response {
    let status = StatusCode::from_u16(e.code.http()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = format!(
        "{{\"error\":{},\"code\":\"{}\",\"retryable\":{}}}",
        json_string(&e.message),
        e.code,
        e.retryable()
    );
    (
        status,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Binds `addr` and serves `router` until `shutdown` fires. Returns the bound
/// address (useful with port 0) and the server task.
pub async fn serve(
    addr: SocketAddr,
    router: Router,
    shutdown: CancellationToken,
) -> crate::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| crate::Error::invalid(format!("cannot bind admin address {addr}: {e}")))?;
    let local = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let res = axum::serve(listener, router)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
        if let Err(e) = res {
            tracing::warn!(error = %e, "admin server stopped with an error");
        }
    });
    Ok((local, task))
}
