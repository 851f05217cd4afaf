//! What this process serves right now. A master process outlives its
//! leadership terms: each term gets a fresh [`Master`] (rebuilt from the
//! members), published here while the term's [`Leadership`] is valid. Every
//! gRPC call and admin read goes through [`Serving::current`], so a follower
//! or a deposed leader answers `NotLeader` (naming the leader when known)
//! instead of serving from metadata it no longer owns.

use crate::election::{Election, Leadership};
use crate::master::Master;
use crate::metrics::MasterMetrics;
use parking_lot::RwLock;
use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use strata_common::leader::LeaderRecord;
use strata_common::limits::LimitedBody;
use strata_common::{Error, Result};
use strata_proto::master_server::MasterServer;

#[derive(Clone)]
struct Term {
    master: Arc<Master>,
    leadership: Leadership,
}

pub struct Serving {
    term: RwLock<Option<Term>>,
    /// Who leads, as last seen (for followers' answers); refreshed by the
    /// campaign loop.
    leader: RwLock<Option<LeaderRecord>>,
    pub metrics: MasterMetrics,
    pub advertise: String,
    pub mode: &'static str,
}

impl Serving {
    pub fn new(metrics: MasterMetrics, advertise: String, mode: &'static str) -> Arc<Serving> {
        Arc::new(Serving {
            term: RwLock::new(None),
            leader: RwLock::new(None),
            metrics,
            advertise,
            mode,
        })
    }

    /// The serving master, or `NotLeader` naming who leads.
    pub fn current(&self) -> Result<Arc<Master>> {
        self.current_term().map(|(m, _)| m)
    }

    pub(crate) fn current_term(&self) -> Result<(Arc<Master>, Leadership)> {
        if let Some(t) = self.term.read().as_ref() {
            if t.leadership.is_valid() {
                return Ok((t.master.clone(), t.leadership.clone()));
            }
        }
        Err(self.not_leader())
    }

    pub(crate) fn not_leader(&self) -> Error {
        Error::not_leader(self.leader.read().as_ref())
    }

    /// The term's master even while its leadership is in doubt (tests and
    /// the local cluster's in-process view).
    pub fn master(&self) -> Option<Arc<Master>> {
        self.term.read().as_ref().map(|t| t.master.clone())
    }

    pub fn is_leader(&self) -> bool {
        self.current().is_ok()
    }

    /// `/ready`: the serving leader, past its rebuild gate.
    pub fn ready(&self) -> bool {
        self.current().is_ok_and(|m| m.accepting_writes())
    }

    pub(crate) fn begin(&self, master: Arc<Master>, leadership: Leadership) {
        *self.leader.write() = Some(LeaderRecord {
            addr: self.advertise.clone(),
            term: leadership.term,
            instance: String::new(),
        });
        self.metrics.term.set(leadership.term as i64);
        *self.term.write() = Some(Term { master, leadership });
        self.metrics.is_leader.set(1);
    }

    /// Ends the term: nothing is served from its metadata afterwards.
    pub(crate) fn end(&self) -> Option<Arc<Master>> {
        self.metrics.is_leader.set(0);
        let t = self.term.write().take();
        let mut l = self.leader.write();
        if l.as_ref().is_some_and(|l| l.addr == self.advertise) {
            *l = None;
        }
        t.map(|t| t.master)
    }

    pub(crate) fn saw_leader(&self, rec: Option<LeaderRecord>) {
        if let Some(r) = &rec {
            self.metrics.term.set(r.term as i64);
        }
        *self.leader.write() = rec;
    }

    /// `/api/v1/leader`.
    pub fn describe(&self) -> serde_json::Value {
        let me = self.is_leader();
        let l = self.leader.read().clone();
        serde_json::json!({
            "leader": l.as_ref().map(|l| l.addr.clone()),
            "term": l.as_ref().map(|l| l.term),
            "is_leader": me,
            "self": self.advertise,
            "mode": self.mode,
        })
    }
}

/// Keeps the leader record of a follower fresh (for its `NotLeader`
/// answers and `/api/v1/leader`) until `stop` fires.
pub(crate) async fn watch_leader(
    serving: Arc<Serving>,
    election: Arc<dyn Election>,
    every: std::time::Duration,
    stop: tokio_util::sync::CancellationToken,
) {
    loop {
        let r = tokio::time::timeout(every * 4, election.leader()).await;
        if let Ok(Ok(rec)) = r {
            serving.saw_leader(rec);
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}

/// The gRPC service in front of whichever term is current: calls reach the
/// term's [`Master`] only while its leadership is valid.
#[derive(Clone)]
pub struct Gate {
    pub serving: Arc<Serving>,
}

impl tonic::server::NamedService for Gate {
    const NAME: &'static str =
        <MasterServer<crate::service::MasterService> as tonic::server::NamedService>::NAME;
}

impl<B> tower_service::Service<http::Request<LimitedBody<B>>> for Gate
where
    B: http_body::Body<Data = bytes::Bytes> + Send + Unpin + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<LimitedBody<B>>) -> Self::Future {
        match self.serving.current_term() {
            Ok((master, leadership)) => {
                let mut svc = MasterServer::new(crate::service::MasterService { master })
                    .max_decoding_message_size(crate::service::MAX_REQUEST)
                    .max_encoding_message_size(strata_common::grpc::MAX_MESSAGE);
                let serving = self.serving.clone();
                Box::pin(async move {
                    let resp = tower_service::Service::call(&mut svc, req).await;
                    // Leadership may have ended while the call ran (a pause,
                    // a lost keep-alive): its answer (grants, a commit) is not
                    // the cluster's. Retryable; a put's retry checks its key.
                    if !leadership.is_valid() {
                        let st: tonic::Status = serving.not_leader().into();
                        return Ok(st.into_http());
                    }
                    resp
                })
            }
            Err(e) => {
                let st: tonic::Status = e.into();
                Box::pin(async move { Ok(st.into_http()) })
            }
        }
    }
}
