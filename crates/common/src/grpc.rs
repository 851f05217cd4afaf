//! gRPC plumbing shared by every service and client.

use crate::auth::{bearer, Credentials, Role, Secret};
use crate::limits::{BodyLimit, InflightBudget, LimitedBody};
use crate::{Error, Result};
use futures::future::BoxFuture;
use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;

/// Largest gRPC message a client accepts (heartbeat log pages, batches).
pub const MAX_MESSAGE: usize = 256 << 20;

/// Adds the caller's bearer token (if any) and trace context (if traced) to
/// every call.
#[derive(Clone, Default)]
pub struct BearerToken(Option<MetadataValue<Ascii>>);

impl BearerToken {
    pub fn new(token: Option<&Secret>) -> Result<Self> {
        match token {
            None => Ok(BearerToken(None)),
            Some(t) => format!("Bearer {}", t.expose())
                .parse()
                .map(|v| BearerToken(Some(v)))
                .map_err(|_| Error::invalid("token is not a valid header value")),
        }
    }
}

impl Interceptor for BearerToken {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        crate::telemetry::inject_grpc(req.metadata_mut());
        Ok(req)
    }
}

/// A channel to the master that presents a token and follows the leader.
pub type MasterChannel = InterceptedService<crate::leader::LeaderChannel, BearerToken>;

/// A channel to the master (`addr`: see [`crate::leader::MasterTarget`]),
/// dialled lazily: it reconnects by itself after failures and follows the
/// leader, so callers survive a master restart or failover by retrying.
pub fn master_channel(addr: &str, token: Option<&Secret>) -> Result<MasterChannel> {
    master_channel_routed(addr, token).map(|(c, _)| c)
}

/// [`master_channel`] and its route: `LeaderChannel::current` is the
/// address its calls go to (for protocols beside gRPC on the same port).
pub fn master_channel_routed(
    addr: &str,
    token: Option<&Secret>,
) -> Result<(MasterChannel, crate::leader::LeaderChannel)> {
    let target = crate::leader::MasterTarget::parse(addr)?;
    let route = crate::leader::LeaderChannel::new(target);
    Ok((
        InterceptedService::new(route.clone(), BearerToken::new(token)?),
        route,
    ))
}

/// Wraps a gRPC service so every call is authenticated before its message is
/// decoded: the caller's token is checked against the role the method needs
/// (`role_of` maps the method name), and the proven roles are put in the
/// request's extensions ([`crate::auth::Roles`]) for checks that depend on
/// the message (e.g. a forced remove needs the admin role). A call that
/// carries a trace context is served inside a span that continues it.
#[derive(Clone)]
pub struct Authenticated<S> {
    inner: S,
    creds: Arc<Credentials>,
    policy: fn(&str) -> MethodPolicy,
    budget: Option<Arc<InflightBudget>>,
}

/// What one method needs (a role) and may send (a body limit).
#[derive(Debug, Clone, Copy)]
pub struct MethodPolicy {
    pub role: Role,
    pub limit: BodyLimit,
}

impl<S> Authenticated<S> {
    pub fn new(inner: S, creds: Arc<Credentials>, policy: fn(&str) -> MethodPolicy) -> Self {
        Authenticated {
            inner,
            creds,
            policy,
            budget: None,
        }
    }

    /// Counts every call's request bytes against one budget.
    pub fn with_budget(mut self, budget: Arc<InflightBudget>) -> Self {
        self.budget = Some(budget);
        self
    }
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for Authenticated<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> tower_service::Service<http::Request<B>> for Authenticated<S>
where
    S: tower_service::Service<
            http::Request<LimitedBody<B>>,
            Response = http::Response<tonic::body::Body>,
            Error = Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        let method = req
            .uri()
            .path()
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_string();
        let policy = (self.policy)(&method);
        let need = policy.role;
        let header = req
            .headers()
            .get(http::header::AUTHORIZATION)
            .map(|v| v.as_bytes());
        let checked = self
            .creds
            .roles_of(bearer(header))
            .and_then(|roles| self.creds.check(roles, need).map(|_| roles));
        match checked {
            Ok(roles) => {
                req.extensions_mut().insert(roles);
                let budget = self.budget.clone();
                let req = req.map(|b| LimitedBody::new(b, policy.limit, &method).within(budget));
                // The clone is ready only if polled; swap so the ready one serves.
                let clone = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, clone);
                let span = crate::telemetry::grpc_server_span(req.headers(), req.uri().path());
                let call = async move { inner.call(req).await };
                match span {
                    Some(span) => Box::pin(tracing::Instrument::instrument(call, span)),
                    None => Box::pin(call),
                }
            }
            Err(e) => {
                let st: tonic::Status = e.into();
                Box::pin(async move { Ok(st.into_http()) })
            }
        }
    }
}
