//! Registering with the master: the segments, the objects held (reported to
//! a rebuilding master), and leaving at shutdown.

use super::Agent;
use crate::records::ObjectRecords;
use crate::ucx::ucx_registration;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use strata_common::grant::GrantKey;
use strata_common::{Error, Result};
use strata_proto as pb;
use strata_transport::region::Segment;

/// Objects per ReportNodeObjects call.
const REPORT_BATCH: usize = 4096;

/// How long a leaving node waits for the master's answer.
const LEAVE_WAIT: Duration = Duration::from_secs(2);
/// Tries of one report batch refused retryably, before its last.
const REPORT_TRIES: usize = 5;

impl Agent {
    /// The objects we hold, by local segment index (a new master gives our
    /// segments new ids): committed ones, and announced puts whose bytes
    /// match their checksum (their PutEnd may have been acknowledged).
    async fn held_objects(&self) -> Vec<pb::NodeObject> {
        let local: Arc<HashMap<u64, usize>> = Arc::new(
            self.segment_ids
                .iter()
                .enumerate()
                .map(|(i, &id)| (id, i))
                .collect(),
        );
        let node_object = |c: pb::CommittedObject| {
            Some(pb::NodeObject {
                local_segment: *local.get(&c.segment_id)? as u64,
                key: c.key,
                offset: c.offset,
                length: c.length,
                crc32c: c.crc32c,
                generation: c.generation,
                commit_record: c.commit_record,
                put_record: c.put_record,
                segment_id: c.segment_id,
                blake3: c.blake3,
                term: c.put_record_term,
            })
        };
        let mut held: Vec<pb::NodeObject> = self
            .records
            .snapshot()
            .into_iter()
            .filter_map(node_object)
            .collect();
        let pending = self.records.pending();
        if !pending.is_empty() {
            let (segments, ids) = (self.segments.clone(), local.clone());
            let complete = tokio::task::spawn_blocking(move || {
                ObjectRecords::complete_puts(pending, |p| {
                    let seg = segments.get(*ids.get(&p.segment_id)?)?;
                    seg.slice(p.offset, p.length).ok()
                })
            })
            .await
            .unwrap_or_default();
            held.extend(complete.into_iter().filter_map(node_object));
        }
        held
    }

    /// Reports what we hold to a master rebuilding its metadata; what it
    /// adopts comes back through the object log. A failed report loses those
    /// objects (their memory is free space to the master), never bytes.
    async fn report_objects(&mut self, incarnation: u64, held: Vec<pb::NodeObject>) {
        let (mut adopted, mut refused) = (0, 0);
        let batches = held.len().div_ceil(REPORT_BATCH);
        for (i, chunk) in held.chunks(REPORT_BATCH).enumerate() {
            let req = pb::ReportNodeObjectsRequest {
                node_id: self.node_id.clone(),
                incarnation,
                instance_proof: self.proof.clone(),
                objects: chunk.to_vec(),
                // The master takes writes once every node it remembers
                // sent its last batch.
                last: i + 1 == batches,
            };
            match self.report_batch(req).await {
                Ok(r) => {
                    let r = r.into_inner();
                    adopted += r.adopted;
                    refused += r.refused;
                }
                Err(e) => {
                    tracing::warn!(error = %Error::from(e), objects = chunk.len(), "object report failed; those objects are forgotten");
                    refused += chunk.len() as u64;
                }
            }
        }
        tracing::info!(
            node = self.node_id,
            adopted,
            refused,
            "reported the objects this node holds to a restarted master"
        );
    }

    /// Sends one report batch, again after a retryable refusal (a busy
    /// master's request budget, a moment without a leader): a batch that
    /// fails for good loses its objects.
    async fn report_batch(
        &mut self,
        req: pb::ReportNodeObjectsRequest,
    ) -> std::result::Result<tonic::Response<pb::ReportNodeObjectsResponse>, tonic::Status> {
        let mut wait = Duration::from_millis(100);
        for _ in 0..REPORT_TRIES {
            match self.client.report_node_objects(req.clone()).await {
                Err(e) if Error::from(e.clone()).retryable() => {
                    tracing::debug!(error = %Error::from(e), retry_in = ?wait, "object report refused for now");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(2));
                }
                r => return r,
            }
        }
        self.client.report_node_objects(req).await
    }

    pub(super) async fn register(&mut self) -> Result<(u64, Duration)> {
        let held = self.held_objects().await;
        // Names this registration to one-sided readers: routes of an
        // earlier one (another master's grants) stop reading.
        let stamp = strata_transport::published::new_stamp();
        let (ucx_worker, ucx_segments, ucx_process) = ucx_registration(self.ucx.as_ref(), stamp);
        let req = pb::RegisterNodeRequest {
            ucx_worker,
            ucx_process,
            node_id: self.node_id.clone(),
            data_addr: self.advertise.clone(),
            instance: self.instance.clone(),
            instance_proof: self.proof.clone(),
            held_objects: held.len() as u64,
            records_pending: true,
            records_receipts: true,
            segments: self
                .sizes
                .iter()
                .enumerate()
                .map(|(i, &size)| pb::SegmentSpec {
                    local_id: i as u64,
                    size,
                    ..ucx_segments.get(i).cloned().unwrap_or_default()
                })
                .collect(),
        };
        let resp = self
            .client
            .register_node(req)
            .await
            .map_err(Error::from)?
            .into_inner();
        self.fence.admit(resp.term)?;
        let key = GrantKey::from_bytes(&resp.grant_key)
            .ok_or_else(|| Error::internal("master sent a malformed grant key"))?;
        if resp.segment_ids.len() != self.segments.len() {
            return Err(Error::internal(
                "master returned a wrong number of segment ids",
            ));
        }
        let map: HashMap<u64, Arc<Segment>> = resp
            .segment_ids
            .iter()
            .copied()
            .zip(self.segments.iter().cloned())
            .collect();
        self.records.reset();
        self.table.install(key, map, stamp);
        self.segment_ids = resp.segment_ids.clone();
        if resp.report_objects && !held.is_empty() {
            self.report_objects(resp.incarnation, held).await;
        }
        self.registered.store(true, Ordering::Release);
        self.metrics.registrations.inc();
        tracing::info!(node = self.node_id, segments = ?resp.segment_ids, "registered with master");
        Ok((
            resp.incarnation,
            Duration::from_millis(resp.heartbeat_interval_ms.max(10)),
        ))
    }

    /// Tells the master this node is gone (bounded: a master that does not
    /// answer drops it after --node-ttl instead).
    pub(super) async fn leave(&mut self, incarnation: u64) {
        let req = pb::HeartbeatRequest {
            node_id: self.node_id.clone(),
            incarnation,
            applied_seq: self.records.applied_seq(),
            instance_proof: self.proof.clone(),
            wait_ms: 0,
            leaving: true,
        };
        match tokio::time::timeout(LEAVE_WAIT, self.heartbeat(req)).await {
            Ok(Ok(_)) => tracing::info!(node = self.node_id, "left the cluster"),
            Ok(Err(e)) => {
                tracing::warn!(node = self.node_id, error = %e, "could not leave the cluster; the master drops this node after --node-ttl")
            }
            Err(_) => tracing::warn!(
                node = self.node_id,
                "the master did not answer the leave; it drops this node after --node-ttl"
            ),
        }
    }
}
