//! Durable KV in etcd, for masters of one cluster sharing their small facts
//! (handle → owner_id, fencing epochs, the grant key). Every key lives under
//! a per-cluster prefix; the compare-and-set is one etcd transaction, so
//! values stay unique under races between masters.

use super::DurableKv;
use etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp, TxnOpResponse};
use futures::future::BoxFuture;
use strata_common::{Code, Error, Result};

#[derive(Clone)]
pub struct EtcdKv {
    client: Client,
    /// `/strata/<cluster>/kv/`: what this cluster's masters share.
    prefix: String,
    /// (term key, term): writes apply only while the term key still holds
    /// this leader's term, so a deposed leader can change nothing.
    fence: Option<(String, u64)>,
}

fn etcd_err(what: &str, e: etcd_client::Error) -> Error {
    Error::new(Code::Unavailable, format!("etcd {what}: {e}"))
}

impl EtcdKv {
    /// Connects to `endpoints` (`http://HOST:PORT`) for cluster `cluster`.
    pub async fn connect(endpoints: &[String], cluster: &str) -> Result<EtcdKv> {
        let client = strata_common::leader::etcd_client(endpoints).await?;
        Self::new(client, cluster)
    }

    pub fn new(client: Client, cluster: &str) -> Result<EtcdKv> {
        strata_common::leader::validate_cluster_id(cluster)?;
        Ok(EtcdKv {
            client,
            prefix: format!("/strata/{cluster}/kv/"),
            fence: None,
        })
    }

    /// This store for the leader of `term` of `cluster`: its writes fail
    /// with `NotLeader` once another leader has taken a newer term.
    pub fn fenced(&self, cluster: &str, term: u64) -> EtcdKv {
        EtcdKv {
            fence: Some((strata_common::leader::term_key(cluster), term)),
            ..self.clone()
        }
    }

    fn full(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }
}

fn utf8(b: &[u8], what: &str) -> Result<String> {
    String::from_utf8(b.to_vec())
        .map_err(|_| Error::new(Code::Corrupted, format!("etcd {what} is not UTF-8")))
}

impl DurableKv for EtcdKv {
    fn get(&self, key: String) -> BoxFuture<'_, Result<Option<String>>> {
        Box::pin(async move {
            let mut kv = self.client.kv_client();
            let r = kv
                .get(self.full(&key), None)
                .await
                .map_err(|e| etcd_err("get", e))?;
            r.kvs()
                .first()
                .map(|v| utf8(v.value(), "value"))
                .transpose()
        })
    }

    fn compare_and_set(
        &self,
        key: String,
        expected: Option<String>,
        value: String,
    ) -> BoxFuture<'_, Result<bool>> {
        Box::pin(async move {
            let k = self.full(&key);
            let when = match expected {
                // Absent: never created (or deleted).
                None => Compare::create_revision(k.clone(), CompareOp::Equal, 0),
                Some(v) => Compare::value(k.clone(), CompareOp::Equal, v),
            };
            let mut cmp = vec![when];
            let mut otherwise = Vec::new();
            if let Some((tk, term)) = &self.fence {
                cmp.push(Compare::value(
                    tk.clone(),
                    CompareOp::Equal,
                    term.to_string(),
                ));
                otherwise.push(TxnOp::get(tk.clone(), None));
            }
            let txn = Txn::new()
                .when(cmp)
                .and_then([TxnOp::put(k, value, None)])
                .or_else(otherwise);
            let mut kv = self.client.kv_client();
            let r = kv.txn(txn).await.map_err(|e| etcd_err("txn", e))?;
            if r.succeeded() {
                return Ok(true);
            }
            if let Some((_, term)) = &self.fence {
                let now = r.op_responses().into_iter().find_map(|op| match op {
                    TxnOpResponse::Get(g) => Some(
                        g.kvs()
                            .first()
                            .map(|v| String::from_utf8_lossy(v.value()).into_owned()),
                    ),
                    _ => None,
                });
                if now.flatten().as_deref() != Some(term.to_string().as_str()) {
                    return Err(Error::not_leader(None).with_message(format!(
                        "durable write refused: this master's term {term} is over (another master leads)"
                    )));
                }
            }
            Ok(false)
        })
    }

    fn list(&self, prefix: String) -> BoxFuture<'_, Result<Vec<(String, String)>>> {
        Box::pin(async move {
            let mut kv = self.client.kv_client();
            let r = kv
                .get(self.full(&prefix), Some(GetOptions::new().with_prefix()))
                .await
                .map_err(|e| etcd_err("list", e))?;
            let mut out = Vec::with_capacity(r.kvs().len());
            for v in r.kvs() {
                let k = utf8(v.key(), "key")?;
                let k = k.strip_prefix(&self.prefix).unwrap_or(&k).to_string();
                out.push((k, utf8(v.value(), "value")?));
            }
            // etcd returns keys in byte order already; keep the contract
            // explicit.
            out.sort();
            Ok(out)
        })
    }

    fn name(&self) -> &'static str {
        "etcd"
    }
}
