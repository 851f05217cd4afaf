//! Serves reads of this owner's buckets on the data plane. Grants are signed
//! by the master with `PERM_SSD_READ` and name `(owner, bucket)`, so neither a
//! DRAM grant nor another owner's grant can read these files.

use crate::staging::Staging;
use crate::store::OwnerStore;
use futures::future::BoxFuture;
use parking_lot::RwLock;
use std::sync::Arc;
use strata_common::grant::{split_ssd_segment_id, GrantKey, PERM_SSD_READ};
use strata_common::{Code, Error, Result};
use strata_transport::frame::Request;
use strata_transport::region::{verify_grant, DataRegion, ReadSource, Segment};

pub struct BucketRegion {
    /// Installed once registered: grant key and the owner's store.
    state: RwLock<Option<(GrantKey, Arc<OwnerStore>)>>,
    staging: Staging,
    instance: String,
}

impl BucketRegion {
    pub fn new(staging: Staging, instance: String) -> Self {
        BucketRegion {
            state: RwLock::new(None),
            staging,
            instance,
        }
    }

    pub fn install(&self, key: GrantKey, store: Arc<OwnerStore>) {
        *self.state.write() = Some((key, store));
    }
}

impl DataRegion for BucketRegion {
    fn read<'a>(&'a self, req: &'a Request, now_ms: u64) -> BoxFuture<'a, Result<ReadSource>> {
        Box::pin(async move {
            let (key, store) = self
                .state
                .read()
                .clone()
                .ok_or_else(|| Error::unavailable("SSD agent is still starting"))?;
            verify_grant(
                &key,
                &req.grant,
                &req.mac,
                PERM_SSD_READ,
                req.offset,
                req.length,
                now_ms,
            )?;
            let (owner, bucket) = split_ssd_segment_id(req.grant.segment_id);
            if owner != store.owner_id {
                return Err(Error::new(
                    Code::PermissionDenied,
                    format!(
                        "grant is for owner {owner}, this agent serves owner {}",
                        store.owner_id
                    ),
                ));
            }
            let guard = self.staging.acquire(req.length).await?;
            let (offset, length) = (req.offset, req.length);
            let data = tokio::task::spawn_blocking(move || store.read(bucket, offset, length))
                .await
                .map_err(|e| Error::internal(format!("read task failed: {e}")))??;
            Ok(ReadSource::Owned(data, Some(Box::new(guard))))
        })
    }

    fn write_target(&self, _req: &Request, _now_ms: u64) -> Result<Arc<Segment>> {
        Err(Error::new(
            Code::PermissionDenied,
            "SSD agents accept no data-plane writes; objects arrive through offload",
        ))
    }

    fn ping_payload(&self) -> Vec<u8> {
        self.instance.as_bytes().to_vec()
    }
}
