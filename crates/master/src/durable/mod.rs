//! Durable key-value state of the master: small, rarely written facts that
//! must survive restarts (handle → owner_id, fencing epochs). Behind a trait
//! so single-master mode uses a local file and HA mode uses etcd; every
//! implementation passes the same conformance suite (`conformance.rs`).

mod etcd;
mod file;
mod memory;

#[cfg(test)]
mod conformance;
#[cfg(test)]
pub(crate) use conformance::EtcdServer;

pub use etcd::EtcdKv;
pub use file::FileKv;
pub use memory::MemKv;

use futures::future::BoxFuture;
use strata_common::Result;

pub trait DurableKv: Send + Sync + 'static {
    fn get(&self, key: String) -> BoxFuture<'_, Result<Option<String>>>;

    /// Sets `key` to `value` only if its current value is `expected`
    /// (`None` = absent). Returns whether it did. This is the one atomic
    /// primitive everything else is built on.
    fn compare_and_set(
        &self,
        key: String,
        expected: Option<String>,
        value: String,
    ) -> BoxFuture<'_, Result<bool>>;

    /// Every `(key, value)` whose key starts with `prefix`, in key order.
    fn list(&self, prefix: String) -> BoxFuture<'_, Result<Vec<(String, String)>>>;

    fn name(&self) -> &'static str;
}

/// Atomically increments the decimal counter at `key` (absent = 0) and
/// returns the new value.
pub async fn increment(kv: &dyn DurableKv, key: &str) -> Result<u64> {
    for _ in 0..1000 {
        let cur = kv.get(key.to_string()).await?;
        let n: u64 = match &cur {
            None => 0,
            Some(v) => v.parse().map_err(|_| {
                strata_common::Error::internal(format!(
                    "durable counter {key} holds {v:?}, not a number"
                ))
            })?,
        };
        if kv
            .compare_and_set(key.to_string(), cur, (n + 1).to_string())
            .await?
        {
            return Ok(n + 1);
        }
    }
    Err(strata_common::Error::unavailable(format!(
        "counter {key} is too contended"
    )))
}

/// Takes the single master's next term (`term::next_term` of the last
/// one) and keeps it durably.
pub async fn advance_term(kv: &dyn DurableKv) -> Result<u64> {
    const KEY: &str = "term";
    for _ in 0..1000 {
        let cur = kv.get(KEY.to_string()).await?;
        let last: u64 = match &cur {
            None => 0,
            Some(v) => v.parse().map_err(|_| {
                strata_common::Error::internal(format!("durable {KEY} holds {v:?}, not a number"))
            })?,
        };
        let next = strata_common::term::next_term(last);
        if kv
            .compare_and_set(KEY.to_string(), cur, next.to_string())
            .await?
        {
            return Ok(next);
        }
    }
    Err(strata_common::Error::unavailable(
        "the term is too contended",
    ))
}

/// Returns the value at `key`, creating it with `make()` if absent; when
/// several callers race, all get the single value that won.
pub async fn get_or_create<F, Fut>(kv: &dyn DurableKv, key: &str, make: F) -> Result<String>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<String>>,
{
    for _ in 0..1000 {
        if let Some(v) = kv.get(key.to_string()).await? {
            return Ok(v);
        }
        let v = make().await?;
        if kv.compare_and_set(key.to_string(), None, v.clone()).await? {
            return Ok(v);
        }
    }
    Err(strata_common::Error::unavailable(format!(
        "key {key} is too contended"
    )))
}

/// The entries of `map` whose key starts with `prefix`, in key order.
pub(crate) fn prefix_entries(
    map: &std::collections::BTreeMap<String, String>,
    prefix: &str,
) -> Vec<(String, String)> {
    map.range(prefix.to_string()..)
        .take_while(|(k, _)| k.starts_with(prefix))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}
