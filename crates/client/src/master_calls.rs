//! The master's calls on a client's hot paths (`GetReplicas`, `PutStart`,
//! `PutEnd` and their batch forms): on quick-call connections to the leader
//! where the master allows (`strata_common::quick_client`, which says when
//! they fall back), gRPC otherwise. A gRPC call costs several task
//! hand-offs on each side: ~140 us a lookup on two cores against ~10, and
//! for batches of 128 small objects a fifth of the master's metadata work
//! (docs/benchmarks.md, issue #32).

use std::future::Future;
use std::sync::Arc;
use strata_common::auth::Secret;
use strata_common::grpc::MasterChannel;
use strata_common::leader::LeaderChannel;
use strata_common::quick_client::QuickClient;
use strata_common::quick_wire::Op;
use strata_common::{Code, Error, Result};
use strata_proto as pb;
use strata_proto::master_client::MasterClient;

/// A client's way to the master (cheap to clone).
#[derive(Clone)]
pub struct MasterCalls {
    grpc: MasterClient<MasterChannel>,
    quick: Option<Arc<QuickClient>>,
}

impl MasterCalls {
    /// `route` and `token` make the quick connections (`None`: gRPC only).
    pub(crate) fn new(
        grpc: MasterClient<MasterChannel>,
        quick: Option<(LeaderChannel, Option<&Secret>)>,
    ) -> Result<Self> {
        let quick = quick
            .map(|(route, token)| QuickClient::new(route, token))
            .transpose()?
            .map(Arc::new);
        Ok(MasterCalls { grpc, quick })
    }

    /// The same calls over quick connections of their own, made on the
    /// runtime of their first call.
    pub(crate) fn sibling(&self) -> MasterCalls {
        MasterCalls {
            grpc: self.grpc.clone(),
            quick: self.quick.as_ref().map(|q| Arc::new(q.sibling())),
        }
    }

    /// The gRPC client, for calls that have no quick form.
    pub(crate) fn grpc(&self) -> MasterClient<MasterChannel> {
        self.grpc.clone()
    }

    /// Calls the master answered quickly (for tests and engines' metrics).
    pub(crate) fn answered(&self) -> u64 {
        self.quick.as_ref().map_or(0, |q| q.answered())
    }

    /// `req` as a quick call, else over gRPC with `grpc`. A lookup
    /// (`lookup`) lost on the way changed nothing and goes again over gRPC;
    /// another call's loss is the caller's to judge.
    async fn either<Req, Resp, F>(
        &self,
        op: Op,
        req: Req,
        lookup: bool,
        grpc: impl FnOnce(MasterClient<MasterChannel>, Req) -> F,
    ) -> Result<Resp>
    where
        Req: prost::Message,
        Resp: prost::Message + Default,
        F: Future<Output = std::result::Result<tonic::Response<Resp>, tonic::Status>>,
    {
        if let Some(q) = &self.quick {
            match q.call(op, &req).await {
                Some(Err(e)) if lookup && e.code == Code::Unavailable => {}
                Some(r) => return r,
                None => {}
            }
        }
        grpc(self.grpc.clone(), req)
            .await
            .map(tonic::Response::into_inner)
            .map_err(Error::from)
    }

    /// Where `key`'s bytes are.
    pub(crate) async fn get_replicas(&self, key: String) -> Result<pb::GetReplicasResponse> {
        let req = pb::GetReplicasRequest { key };
        self.either(Op::GetReplicas, req, true, |mut m, r| async move {
            m.get_replicas(r).await
        })
        .await
    }

    /// Where each key's bytes are.
    pub async fn batch_get_replicas(
        &self,
        req: pb::BatchGetReplicasRequest,
    ) -> Result<pb::BatchGetReplicasResponse> {
        self.either(Op::BatchGetReplicas, req, true, |mut m, r| async move {
            m.batch_get_replicas(r).await
        })
        .await
    }

    pub(crate) async fn put_start(&self, req: pb::PutStartRequest) -> Result<pb::PutStartResponse> {
        self.either(Op::PutStart, req, false, |mut m, r| async move {
            m.put_start(r).await
        })
        .await
    }

    pub(crate) async fn put_end(&self, req: pb::PutEndRequest) -> Result<pb::PutEndResponse> {
        self.either(Op::PutEnd, req, false, |mut m, r| async move {
            m.put_end(r).await
        })
        .await
    }

    /// Starts each put: its placement, or its own error.
    pub async fn batch_put_start(
        &self,
        req: pb::BatchPutStartRequest,
    ) -> Result<pb::BatchPutStartResponse> {
        self.either(Op::BatchPutStart, req, false, |mut m, r| async move {
            m.batch_put_start(r).await
        })
        .await
    }

    /// Commits each put: a status per item.
    pub async fn batch_put_end(
        &self,
        req: pb::BatchPutEndRequest,
    ) -> Result<pb::BatchStatusResponse> {
        self.either(Op::BatchPutEnd, req, false, |mut m, r| async move {
            m.batch_put_end(r).await
        })
        .await
    }
}
