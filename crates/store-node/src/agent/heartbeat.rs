//! Heartbeats: over a quick connection where the master allows, else gRPC.

use super::Agent;
use strata_common::quick_wire::Op;
use strata_common::{Error, Result};
use strata_proto as pb;

impl Agent {
    /// One heartbeat: quickly where the master allows, else over gRPC. A
    /// heartbeat may be sent twice (it acknowledges what was applied and
    /// asks for what follows), so a quick one lost on the way goes over
    /// gRPC at once. A master that does not serve quick heartbeats (an
    /// older one) is asked over gRPC for a while (`QuickClient` remembers
    /// its refusal).
    pub(super) async fn heartbeat(
        &mut self,
        req: pb::HeartbeatRequest,
    ) -> Result<pb::HeartbeatResponse> {
        if let Some(q) = &self.quick {
            match q.call(Op::Heartbeat, &req).await {
                Some(Ok(r)) => {
                    self.metrics.heartbeats_quick.inc();
                    return Ok(r);
                }
                Some(Err(e)) if e.code == strata_common::Code::Unavailable => {
                    tracing::debug!(error = %e, "quick heartbeat lost; sending it over gRPC");
                }
                Some(Err(e)) => return Err(e),
                None => {}
            }
        }
        let r = self
            .client
            .heartbeat(req)
            .await
            .map(tonic::Response::into_inner)
            .map_err(Error::from)?;
        self.metrics.heartbeats_grpc.inc();
        Ok(r)
    }
}
