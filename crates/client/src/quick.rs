//! Quick calls: a client's `GetReplicas`, `PutStart` and `PutEnd`, single
//! and batched (`crate::master_calls`), on plain connections to the leader (`strata_common::quick_client`, which says
//! when they fall back to gRPC).

use strata_common::auth::Secret;
use strata_common::leader::LeaderChannel;
use strata_common::quick_client::QuickClient;
use strata_common::quick_wire::Op;
use strata_common::{Code, Result};
use strata_proto as pb;

pub(crate) struct QuickCalls(QuickClient);

impl QuickCalls {
    pub(crate) fn new(route: LeaderChannel, token: Option<&Secret>) -> Result<QuickCalls> {
        QuickClient::new(route, token).map(QuickCalls)
    }

    /// Calls over connections of their own, on the runtime that makes
    /// them, to the leader this one's route knows.
    pub(crate) fn sibling(&self) -> QuickCalls {
        QuickCalls(self.0.sibling())
    }

    /// Calls the master answered this way (for tests and engines' metrics).
    pub(crate) fn answered(&self) -> u64 {
        self.0.answered()
    }

    /// Where `key`'s bytes are, or `None`: ask over gRPC instead.
    pub(crate) async fn get_replicas(&self, key: &str) -> Option<Result<pb::GetReplicasResponse>> {
        let req = pb::GetReplicasRequest {
            key: key.to_string(),
        };
        match self.0.call(Op::GetReplicas, &req).await? {
            // Lost on the way: nothing changed, gRPC asks again.
            Err(e) if e.code == Code::Unavailable => None,
            r => Some(r),
        }
    }

    /// Where each key's bytes are, or `None`: ask over gRPC instead.
    pub(crate) async fn batch_get_replicas(
        &self,
        req: &pb::BatchGetReplicasRequest,
    ) -> Option<Result<pb::BatchGetReplicasResponse>> {
        match self.0.call(Op::BatchGetReplicas, req).await? {
            // Lost on the way: nothing changed, gRPC asks again.
            Err(e) if e.code == Code::Unavailable => None,
            r => Some(r),
        }
    }

    /// Any other call: its answer, or `None` if it was not sent.
    pub(crate) async fn call<Req: prost::Message, Resp: prost::Message + Default>(
        &self,
        op: Op,
        req: &Req,
    ) -> Option<Result<Resp>> {
        self.0.call(op, req).await
    }

    pub(crate) async fn put_start(
        &self,
        req: &pb::PutStartRequest,
    ) -> Option<Result<pb::PutStartResponse>> {
        self.0.call(Op::PutStart, req).await
    }

    pub(crate) async fn put_end(
        &self,
        req: &pb::PutEndRequest,
    ) -> Option<Result<pb::PutEndResponse>> {
        self.0.call(Op::PutEnd, req).await
    }
}
