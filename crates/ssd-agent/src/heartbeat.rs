//! The agent's standing duties, driven by its heartbeat: each heartbeat
//! reports the owner's usage and brings back removals to apply (`drops`),
//! promotions to copy into DRAM (`promote`) and offload tasks to write
//! (`offload`); a master that forgot this owner gets it registered again
//! with its inventory (`register_again`). Registration itself:
//! `session.rs`.

use crate::metrics::AgentMetrics;
use crate::session::{Registration, Session};
use crate::{eviction, offload, promotion, serve};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use strata_common::grant::GrantKey;
use strata_common::{Code, Error, Result};
use strata_proto as pb;
use tokio_util::sync::CancellationToken;

/// What the heartbeat loop works with.
pub(crate) struct Member {
    pub(crate) session: Session,
    pub(crate) worker: offload::Worker,
    pub(crate) evictor: eviction::Evictor,
    pub(crate) promoter: promotion::Promoter,
    pub(crate) region: Arc<serve::BucketRegion>,
    pub(crate) metrics: Arc<AgentMetrics>,
    pub(crate) who: Registration,
    /// Offload tasks asked for per heartbeat.
    pub(crate) max_tasks: u32,
    /// At most one heartbeat per `poll`.
    pub(crate) poll: Duration,
    /// Longest a heartbeat may take before the next master is tried
    /// (`leader::heartbeat_deadline` of the registration's interval).
    pub(crate) deadline: Duration,
    /// Drops applied: (the master's term, its sequence number), confirmed
    /// with the next heartbeat.
    pub(crate) drops_applied: (u64, u64),
}

impl Member {
    /// Heartbeats, takes offload batches, writes them, reports. Returns an
    /// error only when this process must stop (fenced by a newer
    /// registration).
    pub(crate) async fn run(mut self, shutdown: &CancellationToken) -> Result<()> {
        loop {
            if let Err(e) = self
                .evictor
                .pass(&mut self.session.client, &self.who, 0)
                .await
            {
                tracing::warn!(error = %e, "bucket eviction pass failed");
            }
            let req = self.report().await;
            let t0 = tokio::time::Instant::now();
            let mut wait = self.poll;
            // A long poll must not hold up shutdown (tasks it would have
            // brought expire on the master and go to the next registration).
            let reply = tokio::select! {
                _ = shutdown.cancelled() => break,
                r = self.session.client.owner_heartbeat(self.with_deadline(req.clone())) => r.map_err(Error::from).and_then(|r| {
                    let r = r.into_inner();
                    self.session.fence.admit(r.term).map(|()| r)
                }),
            };
            match reply {
                Ok(r) => {
                    self.metrics.heartbeats.inc();
                    self.drops(&req, r.drops, r.drops_through, r.term).await;
                    if !r.promotions.is_empty() {
                        self.promote(&r.promotions).await;
                    }
                    if !r.tasks.is_empty() {
                        self.offload(&r.tasks).await;
                        wait = Duration::ZERO;
                    }
                }
                Err(e) if e.code == Code::PermissionDenied => {
                    return Err(Error::new(
                        Code::PermissionDenied,
                        format!(
                            "fenced: another process registered handle {:?} ({})",
                            self.session.handle, e.message
                        ),
                    ));
                }
                Err(e) if e.code == Code::NotFound => self.register_again(shutdown).await?,
                Err(e) => {
                    tracing::warn!(error = %e, "owner heartbeat failed");
                    wait = self.poll.max(Duration::from_millis(200));
                }
            }
            // At most one heartbeat per `poll` (a master that answers at
            // once, e.g. an older one, is not polled in a tight loop).
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep_until(t0 + wait) => {}
            }
        }
        let store = self.worker.store.clone();
        let _ = tokio::task::spawn_blocking(move || store.flush()).await;
        Ok(())
    }

    /// A heartbeat (or a report) the channel gives up on after `deadline`
    /// (a master that hangs), which then sends the next one to the next
    /// master.
    fn with_deadline<T>(&self, req: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(req);
        r.set_timeout(self.deadline);
        r
    }

    /// This heartbeat's report: usage, room for tasks, drops applied.
    async fn report(&self) -> pb::OwnerHeartbeatRequest {
        let (worker, m, who) = (&self.worker, &self.metrics, &self.who);
        let s = worker.store.clone();
        let overhead = tokio::task::spawn_blocking(move || s.refresh_overhead())
            .await
            .unwrap_or_else(|_| worker.store.overhead());
        let st = worker.store.stats();
        m.used.set(st.used as i64);
        m.overhead.set(overhead as i64);
        m.buckets.set(st.buckets as i64);
        let room = st.used < worker.store.bucket_capacity()
            && !worker.store.faults.pause_offload.load(Ordering::Relaxed);
        pb::OwnerHeartbeatRequest {
            owner_id: who.owner_id,
            epoch: who.epoch,
            instance_proof: who.proof.clone(),
            used_bytes: st.used + overhead,
            overhead_bytes: overhead,
            buckets: st.buckets,
            capacity_bytes: worker.store.capacity,
            max_tasks: if room { self.max_tasks } else { 0 },
            unknown_files: st.unknown_files,
            quarantined_files: st.quarantined,
            accepts_promotions: true,
            // Long poll for one poll interval while there is room: urgent
            // offloads (a put waits for the DRAM they free) arrive at once,
            // the rest at the usual cadence. With no room, answer at once.
            wait_ms: if room {
                self.poll.as_millis() as u32
            } else {
                0
            },
            acks_drops: true,
            drops_term: self.drops_applied.0,
            drops_applied: self.drops_applied.1,
        }
    }

    /// Applies removals and confirms them at once, before any batch (which
    /// may take seconds): a removal waits for the confirmation. Bounded:
    /// new drops keep coming only while keys are being removed.
    async fn drops(
        &mut self,
        req: &pb::OwnerHeartbeatRequest,
        mut drops: Vec<pb::SsdObject>,
        mut through: u64,
        mut term: u64,
    ) {
        // The same report, asking for nothing: confirms drops between the
        // main heartbeats.
        let confirm = pb::OwnerHeartbeatRequest {
            max_tasks: 0,
            accepts_promotions: false,
            wait_ms: 0,
            ..req.clone()
        };
        for _ in 0..4 {
            if drops.is_empty() || !self.evictor.apply_drops(drops).await {
                break;
            }
            self.drops_applied = (term, through);
            let ack = pb::OwnerHeartbeatRequest {
                drops_term: term,
                drops_applied: through,
                ..confirm.clone()
            };
            match self
                .session
                .client
                .owner_heartbeat(self.with_deadline(ack))
                .await
            {
                Ok(c) => {
                    let c = c.into_inner();
                    if self.session.fence.admit(c.term).is_err() {
                        break;
                    }
                    (drops, through, term) = (c.drops, c.drops_through, c.term);
                }
                Err(e) => {
                    tracing::warn!(error = %Error::from(e), "could not confirm removals; the next heartbeat will");
                    break;
                }
            }
        }
    }

    /// Copies SSD hits back into DRAM and reports how it went.
    async fn promote(&mut self, promotions: &[pb::PromoteTask]) {
        let results = self.promoter.process(promotions).await;
        let who = &self.who;
        let req = self.with_deadline(pb::ReportPromotionRequest {
            owner_id: who.owner_id,
            epoch: who.epoch,
            results,
            instance_proof: who.proof.clone(),
        });
        if let Err(e) = self.session.client.report_promotion(req).await {
            // The master frees the ranges when they expire.
            tracing::warn!(error = %Error::from(e), "promotion report failed");
        }
    }

    /// Writes a batch of offload tasks into buckets and reports them.
    async fn offload(&mut self, tasks: &[pb::OffloadTask]) {
        // Make room for the batch first (buckets add headers and tables:
        // count a little per object).
        let need: u64 = tasks
            .iter()
            .map(|t| t.size + 128 + t.key.len() as u64)
            .sum();
        if let Err(e) = self
            .evictor
            .pass(&mut self.session.client, &self.who, need)
            .await
        {
            tracing::warn!(error = %e, "could not make room for offloads");
        }
        let results = self.worker.process(tasks).await;
        let who = &self.who;
        let req = self.with_deadline(pb::ReportOffloadRequest {
            owner_id: who.owner_id,
            epoch: who.epoch,
            results,
            instance_proof: who.proof.clone(),
        });
        if self.worker.drop_report() {
            tracing::warn!(
                tasks = req.get_ref().results.len(),
                "injected fault: dropping this offload report"
            );
        } else if let Err(e) = self.session.client.report_offload(req).await {
            // The master expires and requeues the tasks.
            tracing::warn!(error = %Error::from(e), "offload report failed");
        }
    }

    /// The master restarted and forgot us: register again and re-report
    /// what we hold.
    async fn register_again(&mut self, shutdown: &CancellationToken) -> Result<()> {
        tracing::warn!("master no longer knows this owner; registering again");
        let reg = self.session.register_retrying(shutdown).await?;
        if reg.owner_id != self.who.owner_id {
            return Err(Error::new(
                Code::Corrupted,
                format!(
                    "master now maps handle {:?} to owner {} (was {}): it lost its --state-dir",
                    self.session.handle, reg.owner_id, self.who.owner_id
                ),
            ));
        }
        self.who.epoch = reg.epoch;
        // The master may hand out a new key (e.g. it lost its state): verify
        // grants with the one it signs with now.
        match GrantKey::from_bytes(&reg.grant_key) {
            Some(k) => self.region.install(k, self.worker.store.clone()),
            None => tracing::warn!("master sent a malformed grant key"),
        }
        if let Err(e) = self
            .session
            .report_inventory(&self.worker.store, &self.who)
            .await
        {
            tracing::warn!(error = %e, "inventory report failed");
        }
        Ok(())
    }
}
