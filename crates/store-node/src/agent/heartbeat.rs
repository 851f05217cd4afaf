//! Heartbeats: over a quick connection where the master allows, else gRPC.

use super::Agent;
use std::time::Duration;
use strata_common::quick_wire::Op;
use strata_common::{Error, Result};
use strata_proto as pb;

/// How long a master that refused a quick heartbeat is heartbeated over
/// gRPC before it is asked again (it may have been upgraded).
const QUICK_RECHECK: Duration = Duration::from_secs(60);

impl Agent {
    /// One heartbeat: quickly where the master allows, else over gRPC. A
    /// heartbeat may be sent twice (it acknowledges what was applied and
    /// asks for what follows), so a quick one lost on the way goes over
    /// gRPC at once. A master that does not serve quick heartbeats (an
    /// older one answers the op `InvalidArgument`) is asked over gRPC for
    /// a while.
    pub(super) async fn heartbeat(
        &mut self,
        req: pb::HeartbeatRequest,
    ) -> Result<pb::HeartbeatResponse> {
        let now = tokio::time::Instant::now();
        if let (Some(q), true) = (&self.quick, self.quick_off_until.is_none_or(|t| t <= now)) {
            match q.call(Op::Heartbeat, &req).await {
                Some(Ok(r)) => {
                    self.metrics.heartbeats_quick.inc();
                    return Ok(r);
                }
                // An older master's refusal of the op itself (its words), not
                // an invalid heartbeat, which gRPC would refuse the same way.
                Some(Err(e))
                    if e.code == strata_common::Code::InvalidArgument
                        && e.message.contains("is not served here") =>
                {
                    tracing::info!(error = %e, "the master does not take quick heartbeats; heartbeating over gRPC");
                    self.quick_off_until = Some(now + QUICK_RECHECK);
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
