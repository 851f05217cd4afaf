//! Durable KV in etcd, for masters of one cluster sharing their small facts
//! (handle → owner_id, fencing epochs, the grant key). Every key lives under
//! a per-cluster prefix; the compare-and-set is one etcd transaction, so
//! values stay unique under races between masters.

use super::DurableKv;
use etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp};
use futures::future::BoxFuture;
use std::time::Duration;
use strata_common::{Code, Error, Result};

pub struct EtcdKv {
    client: Client,
    /// `/strata/<cluster>/kv/`: what this cluster's masters share.
    prefix: String,
}

fn etcd_err(what: &str, e: etcd_client::Error) -> Error {
    Error::new(Code::Unavailable, format!("etcd {what}: {e}"))
}

impl EtcdKv {
    /// Connects to `endpoints` (`http://HOST:PORT`) for cluster `cluster`.
    pub async fn connect(endpoints: &[String], cluster: &str) -> Result<EtcdKv> {
        if cluster.is_empty() || cluster.contains('/') {
            return Err(Error::invalid(format!(
                "cluster id {cluster:?} must be non-empty and contain no '/'"
            )));
        }
        let opts = etcd_client::ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(3))
            .with_timeout(Duration::from_secs(5));
        let client = Client::connect(endpoints, Some(opts))
            .await
            .map_err(|e| etcd_err(&format!("connect to {endpoints:?}"), e))?;
        Ok(EtcdKv {
            client,
            prefix: format!("/strata/{cluster}/kv/"),
        })
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
            let txn = Txn::new()
                .when([when])
                .and_then([TxnOp::put(k, value, None)]);
            let mut kv = self.client.kv_client();
            let r = kv.txn(txn).await.map_err(|e| etcd_err("txn", e))?;
            Ok(r.succeeded())
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
