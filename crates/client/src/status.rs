//! Batch items' statuses as errors: the master answers a batch with one
//! status per item, which callers turn into a `Result` each. A leaf both
//! the client and its lookup batcher use.

use strata_common::{Error, Result};
use strata_proto as pb;

/// An item's status: OK, or its error (its `retryable` flag kept).
pub(crate) fn from_status(s: Option<pb::Status>) -> Result<()> {
    match s {
        Some(s) if s.code != 0 => Err(Error::from_parts(s.code, s.message, s.retryable)),
        _ => Ok(()),
    }
}

/// One item of a `BatchGetReplicas` answer.
pub(crate) fn replicas_of(r: pb::GetReplicasResult) -> Result<pb::GetReplicasResponse> {
    from_status(r.status)?;
    r.replicas
        .ok_or_else(|| Error::internal("missing replicas in batch result"))
}
