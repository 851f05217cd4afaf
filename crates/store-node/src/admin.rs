//! The node's admin view of the objects it holds (`/api/v1/objects`):
//! key names are for those holding the node's member token (open in
//! protected mode, as every port then is), and the view comes in pages.

use crate::metrics::NodeMetrics;
use crate::records::{Cursor, ObjectRecords};
use axum::extract::Query;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use std::sync::Arc;
use strata_common::admin::{error_response, require};
use strata_common::auth::{Credentials, Role, Secret};
use strata_common::Error;
use strata_proto as pb;

/// Objects per page unless `limit` says otherwise, and at most.
pub const DEFAULT_PAGE: usize = 1000;
pub const MAX_PAGE: usize = 10_000;

#[derive(serde::Deserialize)]
pub struct PageQuery {
    /// `next` of the previous page.
    after: Option<String>,
    limit: Option<usize>,
    /// The announced puts instead of the committed objects.
    #[serde(default)]
    pending: bool,
}

pub struct ObjectsView {
    records: Arc<ObjectRecords>,
    metrics: Arc<NodeMetrics>,
    /// Who may see: the node's own member token.
    creds: Credentials,
}

impl ObjectsView {
    pub fn new(
        records: Arc<ObjectRecords>,
        metrics: Arc<NodeMetrics>,
        token: Option<Secret>,
    ) -> Self {
        ObjectsView {
            records,
            metrics,
            creds: Credentials {
                member: token,
                ..Credentials::default()
            },
        }
    }

    pub fn answer(&self, headers: &HeaderMap, q: Query<PageQuery>) -> Response {
        if let Err(refused) = require(&self.creds, headers, Role::Member) {
            return refused;
        }
        let limit = q.limit.unwrap_or(DEFAULT_PAGE);
        if limit == 0 || limit > MAX_PAGE {
            return error_response(&Error::invalid(format!(
                "limit {limit}: a page holds 1 to {MAX_PAGE} objects"
            )));
        }
        let after = match q.after.as_deref().map(|a| Cursor::parse(a).ok_or(a)) {
            None => None,
            Some(Ok(c)) => Some(c),
            Some(Err(a)) => {
                return error_response(&Error::invalid(format!(
                    "after {a:?} is no cursor: pass the previous page's next"
                )))
            }
        };
        self.metrics.objects.set(self.records.len() as i64);
        let (page, more) = self.records.page(q.pending, after.as_ref(), limit);
        let next = more.then(|| page.last().map(|c| Cursor::of(c).to_string()));
        // Never the checksum (see the master's `describe`).
        let view = |c: &pb::CommittedObject| {
            serde_json::json!({
                "key": c.key, "segment_id": c.segment_id, "offset": c.offset,
                "length": c.length,
            })
        };
        let list = if q.pending { "pending" } else { "objects" };
        Json(serde_json::json!({
            "applied_seq": self.records.applied_seq(),
            "objects_total": self.records.len(),
            "pending_total": self.records.pending_len(),
            list: page.iter().map(view).collect::<Vec<_>>(),
            "next": next.flatten(),
        }))
        .into_response()
    }
}
