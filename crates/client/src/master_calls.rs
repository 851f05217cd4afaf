//! The master's batch calls on a client's hot paths (`BatchGetReplicas`,
//! `BatchPutStart`, `BatchPutEnd`): quick where the master allows
//! (`crate::quick`), gRPC otherwise. A gRPC call costs several task
//! hand-offs on each side; for a batch of 128 small objects those were a
//! fifth of the master's metadata work (docs/benchmarks.md, issue #32).

use crate::quick::QuickCalls;
use std::sync::Arc;
use strata_common::grpc::MasterChannel;
use strata_common::{Error, Result};
use strata_proto as pb;
use strata_proto::master_client::MasterClient;

/// A client's way to the master for batch calls (cheap to clone).
#[derive(Clone)]
pub struct MasterCalls {
    grpc: MasterClient<MasterChannel>,
    quick: Option<Arc<QuickCalls>>,
}

impl MasterCalls {
    pub(crate) fn new(grpc: MasterClient<MasterChannel>, quick: Option<Arc<QuickCalls>>) -> Self {
        MasterCalls { grpc, quick }
    }

    /// Where `key`'s bytes are (quick where the master allows).
    pub(crate) async fn get_replicas(&self, key: String) -> Result<pb::GetReplicasResponse> {
        if let Some(q) = &self.quick {
            if let Some(r) = q.get_replicas(&key).await {
                return r;
            }
        }
        self.grpc
            .clone()
            .get_replicas(pb::GetReplicasRequest { key })
            .await
            .map(tonic::Response::into_inner)
            .map_err(Error::from)
    }

    /// Where each key's bytes are. A quick call lost on the way changed
    /// nothing and goes again over gRPC.
    pub async fn batch_get_replicas(
        &self,
        req: pb::BatchGetReplicasRequest,
    ) -> Result<pb::BatchGetReplicasResponse> {
        if let Some(q) = &self.quick {
            if let Some(r) = q.batch_get_replicas(&req).await {
                return r;
            }
        }
        self.grpc
            .clone()
            .batch_get_replicas(req)
            .await
            .map(tonic::Response::into_inner)
            .map_err(Error::from)
    }

    /// Starts each put: its placement, or its own error.
    pub async fn batch_put_start(
        &self,
        req: pb::BatchPutStartRequest,
    ) -> Result<pb::BatchPutStartResponse> {
        if let Some(q) = &self.quick {
            if let Some(r) = q
                .call(strata_common::quick_wire::Op::BatchPutStart, &req)
                .await
            {
                return r;
            }
        }
        self.grpc
            .clone()
            .batch_put_start(req)
            .await
            .map(tonic::Response::into_inner)
            .map_err(Error::from)
    }

    /// Commits each put: a status per item.
    pub async fn batch_put_end(
        &self,
        req: pb::BatchPutEndRequest,
    ) -> Result<pb::BatchStatusResponse> {
        if let Some(q) = &self.quick {
            if let Some(r) = q
                .call(strata_common::quick_wire::Op::BatchPutEnd, &req)
                .await
            {
                return r;
            }
        }
        self.grpc
            .clone()
            .batch_put_end(req)
            .await
            .map(tonic::Response::into_inner)
            .map_err(Error::from)
    }
}
