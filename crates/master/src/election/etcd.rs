//! Election through etcd. The leader record (`/strata/<cluster>/election/
//! leader`, JSON address + term) is attached to the winner's lease, and the
//! term key is bumped in the same transaction that creates the record, so
//! terms are unique and only grow. A candidate takes over only when no
//! record exists: when a leader dies its lease (and record) expires after
//! the TTL; a leader that resigns deletes it at once.

use super::{poll_interval, Election, Leadership, Lease};
use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp};
use futures::future::BoxFuture;
use std::time::Duration;
use strata_common::leader::{leader_key, read_leader, term_key, LeaderRecord};
use strata_common::{Code, Error, Result};
use tokio_util::sync::CancellationToken;

pub struct EtcdElection {
    client: Client,
    cluster: String,
    ttl: Duration,
    /// This process, in the records it writes.
    instance: String,
}

fn etcd_err(what: &str, e: etcd_client::Error) -> Error {
    Error::unavailable(format!("etcd {what}: {e}"))
}

/// etcd leases are whole seconds.
fn ttl_secs(ttl: Duration) -> i64 {
    ttl.as_secs_f64().ceil().max(1.0) as i64
}

impl EtcdElection {
    pub fn new(client: Client, cluster: &str, ttl: Duration) -> Result<EtcdElection> {
        strata_common::leader::validate_cluster_id(cluster)?;
        Ok(EtcdElection {
            client,
            cluster: cluster.to_string(),
            ttl,
            instance: format!("{:016x}", rand::random::<u64>()),
        })
    }

    /// One attempt: `Some` if this candidate now leads.
    async fn try_take(&self, addr: &str) -> Result<Option<Leadership>> {
        let (lk, tk) = (leader_key(&self.cluster), term_key(&self.cluster));
        let mut kv = self.client.kv_client();
        let cur = kv
            .get(lk.clone(), None)
            .await
            .map_err(|e| etcd_err("get", e))?;
        if let Some(rec) = cur.kvs().first() {
            let mine =
                serde_json::from_slice::<LeaderRecord>(rec.value()).is_ok_and(|r| r.addr == addr);
            if !mine {
                return Ok(None);
            }
            // Our own record from a leadership we gave up without
            // resigning (etcd was unreachable): clear it, not wait it out.
            let del = Txn::new()
                .when([Compare::mod_revision(
                    lk.clone(),
                    CompareOp::Equal,
                    rec.mod_revision(),
                )])
                .and_then([TxnOp::delete(lk.clone(), None)]);
            kv.txn(del).await.map_err(|e| etcd_err("txn", e))?;
        }
        let t = kv
            .get(tk.clone(), None)
            .await
            .map_err(|e| etcd_err("get", e))?;
        let (last, term_cmp) = match t.kvs().first() {
            None => (0, Compare::create_revision(tk.clone(), CompareOp::Equal, 0)),
            Some(v) => {
                let n = std::str::from_utf8(v.value())
                    .ok()
                    .and_then(|s| s.parse::<u64>().ok())
                    .ok_or_else(|| {
                        Error::new(
                            Code::Corrupted,
                            format!("term key {tk} in etcd does not hold a number"),
                        )
                    })?;
                (
                    n,
                    Compare::mod_revision(tk.clone(), CompareOp::Equal, v.mod_revision()),
                )
            }
        };
        let term = strata_common::term::next_term(last);
        let mut leases = self.client.lease_client();
        let granted = std::time::Instant::now();
        let lease = leases
            .grant(ttl_secs(self.ttl), None)
            .await
            .map_err(|e| etcd_err("lease grant", e))?
            .id();
        let rec = serde_json::to_string(&LeaderRecord {
            addr: addr.to_string(),
            term,
            instance: self.instance.clone(),
        })
        .map_err(|e| Error::internal(e.to_string()))?;
        let txn = Txn::new()
            .when([
                Compare::create_revision(lk.clone(), CompareOp::Equal, 0),
                term_cmp,
            ])
            .and_then([
                TxnOp::put(lk.clone(), rec, Some(PutOptions::new().with_lease(lease))),
                TxnOp::put(tk, term.to_string(), None),
            ]);
        let won = match kv.txn(txn).await {
            Ok(r) => r.succeeded(),
            Err(e) => {
                let _ = leases.revoke(lease).await;
                return Err(etcd_err("txn", e));
            }
        };
        if !won {
            let _ = leases.revoke(lease).await;
            return Ok(None);
        }
        let (keeper, stream) = match leases.keep_alive(lease).await {
            Ok(k) => k,
            Err(e) => {
                // Won but cannot keep it: give it back at once.
                let _ = leases.revoke(lease).await;
                return Err(etcd_err("keep-alive", e));
            }
        };
        Ok(Some(Leadership::keep(
            term,
            self.ttl,
            granted,
            EtcdLease {
                client: self.client.clone(),
                key: lk,
                lease,
                keeper,
                stream,
            },
        )))
    }
}

struct EtcdLease {
    client: Client,
    key: String,
    lease: i64,
    keeper: etcd_client::LeaseKeeper,
    stream: etcd_client::LeaseKeepAliveStream,
}

impl Lease for EtcdLease {
    fn renew(&mut self) -> BoxFuture<'_, Result<bool>> {
        Box::pin(async move {
            self.keeper
                .keep_alive()
                .await
                .map_err(|e| etcd_err("keep-alive", e))?;
            match self.stream.message().await {
                Ok(Some(r)) => Ok(r.ttl() > 0),
                Ok(None) => Err(Error::unavailable("etcd closed the keep-alive stream")),
                Err(e) => Err(etcd_err("keep-alive", e)),
            }
        })
    }

    fn resign(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let del = Txn::new()
                .when([Compare::lease(
                    self.key.clone(),
                    CompareOp::Equal,
                    self.lease,
                )])
                .and_then([TxnOp::delete(self.key.clone(), None)]);
            let mut kv = self.client.kv_client();
            if let Err(e) = kv.txn(del).await {
                tracing::warn!(error = %e, "could not delete the leader record while resigning");
            }
            let _ = self.client.lease_client().revoke(self.lease).await;
        })
    }
}

impl Election for EtcdElection {
    fn campaign<'a>(
        &'a self,
        addr: &'a str,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<Leadership>> {
        Box::pin(async move {
            let mut warned = false;
            loop {
                // Bounded, so a stalled etcd cannot hold the campaign.
                let attempt = tokio::time::timeout(self.ttl, self.try_take(addr));
                tokio::select! {
                    _ = cancel.cancelled() => {
                        return Err(Error::new(Code::Cancelled, "campaign cancelled"));
                    }
                    r = attempt => match r {
                        Ok(Ok(Some(l))) => return Ok(l),
                        Ok(Ok(None)) => warned = false,
                        Ok(Err(e)) if !warned => {
                            tracing::warn!(error = %e, "campaign: etcd unavailable; retrying");
                            warned = true;
                        }
                        Ok(Err(_)) => {}
                        Err(_) if !warned => {
                            tracing::warn!("campaign: etcd did not answer within the election TTL; retrying");
                            warned = true;
                        }
                        Err(_) => {}
                    }
                }
                tokio::select! {
                    _ = cancel.cancelled() => {
                        return Err(Error::new(Code::Cancelled, "campaign cancelled"));
                    }
                    _ = tokio::time::sleep(poll_interval(self.ttl)) => {}
                }
            }
        })
    }

    fn leader(&self) -> BoxFuture<'_, Result<Option<LeaderRecord>>> {
        Box::pin(read_leader(&self.client, &self.cluster))
    }

    fn name(&self) -> &'static str {
        "etcd"
    }
}
