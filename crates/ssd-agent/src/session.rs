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

    /// Reports every copy this owner holds, in pages (each adopted on its
    /// own, so a page is as good as the whole): no request near the
    /// master's body limit, and none that holds its workers for long.
    pub(crate) async fn report_inventory(
        &mut self,
        store: &OwnerStore,
        who: &Registration,
    ) -> Result<u64> {
        let objects: Vec<pb::SsdObject> = store
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
        let mut adopted = 0;
        let pages = inventory_pages(objects);
        let last = pages.len() - 1;
        for (i, page) in pages.into_iter().enumerate() {
            let r = self
                .client
                .report_inventory(pb::ReportInventoryRequest {
                    owner_id: who.owner_id,
                    epoch: who.epoch,
                    objects: page,
                    relocation: false,
                    instance_proof: who.proof.clone(),
                    // The master counts this owner as reported with the
                    // last page only.
                    more: i < last,
                })
                .await
                .map_err(Error::from)?;
            adopted += r.into_inner().adopted;
        }
        Ok(adopted)
    }
}

/// Objects in one inventory page at most...
const PAGE_OBJECTS: usize = 16_384;
/// ...and encoded bytes (keys are up to 4 KiB).
const PAGE_BYTES: usize = 4 << 20;

/// `objects` cut into pages of at most [`PAGE_OBJECTS`] and about
/// [`PAGE_BYTES`] (a page holds at least one object); one empty page when
/// there are none (the report that says so).
fn inventory_pages(objects: Vec<pb::SsdObject>) -> Vec<Vec<pb::SsdObject>> {
    let mut pages = Vec::new();
    let (mut page, mut bytes) = (Vec::new(), 0);
    for o in objects {
        let len = prost::Message::encoded_len(&o) + 4;
        if !page.is_empty() && (page.len() == PAGE_OBJECTS || bytes + len > PAGE_BYTES) {
            pages.push(std::mem::take(&mut page));
            bytes = 0;
        }
        bytes += len;
        page.push(o);
    }
    if !page.is_empty() || pages.is_empty() {
        pages.push(page);
    }
    pages
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(key_len: usize) -> pb::SsdObject {
        pb::SsdObject {
            key: "k".repeat(key_len),
            length: 1,
            ..Default::default()
        }
    }

    #[test]
    fn inventories_go_in_bounded_pages_and_nothing_is_lost() {
        assert_eq!(inventory_pages(vec![]), vec![Vec::new()]);
        for (n, key_len) in [(1, 10), (40_000, 10), (3_000, 4096), (16_384, 10)] {
            let pages = inventory_pages((0..n).map(|_| object(key_len)).collect());
            let total: usize = pages.iter().map(Vec::len).sum();
            assert_eq!(total, n, "{n} objects of {key_len}-byte keys");
            for p in &pages {
                assert!(!p.is_empty() && p.len() <= PAGE_OBJECTS, "{}", p.len());
                let bytes: usize = p.iter().map(prost::Message::encoded_len).sum();
                assert!(bytes <= PAGE_BYTES, "{bytes} bytes in a page");
            }
        }
        assert_eq!(
            inventory_pages((0..40_000).map(|_| object(10)).collect()).len(),
            3
        );
    }
}
