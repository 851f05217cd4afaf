//! Registration, the agent's first duty: who this process is to the master
//! (owner id, fencing epoch, instance proof), registering (again, when the
//! master forgot it) and reporting the inventory a master adopts.

use crate::store::OwnerStore;
use std::time::Duration;
use strata_common::grpc::MasterChannel;
use strata_common::{Error, Result};
use strata_proto as pb;
use strata_proto::master_client::MasterClient;
use tokio_util::sync::CancellationToken;

/// Who this agent currently is to the master: every call of a registration
/// carries its owner id, fencing epoch and the process's instance proof.
pub struct Registration {
    pub owner_id: u64,
    pub epoch: u64,
    pub proof: Vec<u8>,
}

/// Registration state shared by the worker loop.
pub(crate) struct Session {
    pub(crate) client: MasterClient<MasterChannel>,
    pub(crate) handle: String,
    pub(crate) advertise: String,
    pub(crate) capacity: u64,
    pub(crate) instance: String,
    pub(crate) proof: Vec<u8>,
    /// Highest master term seen: answers from a deposed leader are refused.
    pub(crate) fence: strata_common::term::TermFence,
}

impl Session {
    pub(crate) async fn register(&mut self) -> Result<pb::RegisterOwnerResponse> {
        let req = pb::RegisterOwnerRequest {
            handle: self.handle.clone(),
            data_addr: self.advertise.clone(),
            capacity_bytes: self.capacity,
            instance: self.instance.clone(),
            instance_proof: self.proof.clone(),
        };
        let r = self
            .client
            .register_owner(req)
            .await
            .map_err(Error::from)?
            .into_inner();
        self.fence.admit(r.term)?;
        Ok(r)
    }

    /// Registers, retrying while the master is unreachable.
    pub(crate) async fn register_retrying(
        &mut self,
        shutdown: &CancellationToken,
    ) -> Result<pb::RegisterOwnerResponse> {
        let mut backoff = Duration::from_millis(50);
        loop {
            match self.register().await {
                Ok(r) => return Ok(r),
                Err(e) if e.retryable() => {
                    tracing::warn!(error = %e, retry_in = ?backoff, "cannot register with master");
                    tokio::select! {
                        _ = shutdown.cancelled() => return Err(Error::unavailable("shutting down")),
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
                Err(e) => return Err(e),
            }
        }
    }

    pub(crate) async fn report_inventory(
        &mut self,
        store: &OwnerStore,
        who: &Registration,
    ) -> Result<u64> {
        let objects = store
            .inventory()
            .into_iter()
            .map(|(b, e)| pb::SsdObject {
                key: e.key,
                bucket_id: b,
                offset: e.offset,
                length: e.length,
                crc32c: e.crc32c,
                copy_record: e.record,
            })
            .collect();
        let r = self
            .client
            .report_inventory(pb::ReportInventoryRequest {
                owner_id: who.owner_id,
                epoch: who.epoch,
                objects,
                relocation: false,
                instance_proof: who.proof.clone(),
            })
            .await
            .map_err(Error::from)?;
        Ok(r.into_inner().adopted)
    }
}
