//! The store nodes a cluster has, kept in the durable state (ids only:
//! small, written once per node and when it is lost), so a new master knows
//! whom to wait for: it takes writes once every remembered node has
//! re-registered and reported what it holds (`rebuild.rs`), or after a bound
//! for nodes that do not come back.

use crate::durable::DurableKv;
use parking_lot::Mutex;
use std::collections::HashSet;
use strata_common::Result;

const PREFIX: &str = "members/nodes/";
const LIVE: &str = "live";
const GONE: &str = "gone";

/// The nodes a term waits for, and those that reported.
#[derive(Default)]
pub struct Members {
    expected: HashSet<String>,
    reported: Mutex<HashSet<String>>,
}

impl Members {
    /// The nodes the durable state remembers as live.
    pub async fn load(kv: &dyn DurableKv) -> Result<Members> {
        let expected = kv
            .list(PREFIX.into())
            .await?
            .into_iter()
            .filter(|(_, v)| v == LIVE)
            .filter_map(|(k, _)| k.strip_prefix(PREFIX).map(String::from))
            .collect();
        Ok(Members {
            expected,
            reported: Mutex::new(HashSet::new()),
        })
    }

    /// `node` re-registered and reported everything it holds.
    pub fn reported(&self, node: &str) {
        self.reported.lock().insert(node.to_string());
    }

    /// Remembered nodes that have not reported yet.
    pub fn missing(&self) -> usize {
        let r = self.reported.lock();
        self.expected.iter().filter(|n| !r.contains(*n)).count()
    }
}

/// Remembers `node` as a member (a no-op when it already is).
pub async fn remember(kv: &dyn DurableKv, node: &str) -> Result<()> {
    let key = format!("{PREFIX}{node}");
    match kv.get(key.clone()).await?.as_deref() {
        Some(LIVE) => Ok(()),
        cur => {
            let cur = cur.map(String::from);
            kv.compare_and_set(key, cur, LIVE.into()).await.map(|_| ())
        }
    }
}

/// Forgets `node` (it missed `--node-ttl`): no new master waits for it.
pub async fn forget(kv: &dyn DurableKv, node: &str) -> Result<()> {
    let key = format!("{PREFIX}{node}");
    kv.compare_and_set(key, Some(LIVE.into()), GONE.into())
        .await
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::durable::MemKv;

    #[tokio::test]
    async fn remembered_nodes_are_expected_until_forgotten() {
        let kv = MemKv::new();
        remember(&kv, "a").await.unwrap();
        remember(&kv, "a").await.unwrap();
        remember(&kv, "b").await.unwrap();
        let m = Members::load(&kv).await.unwrap();
        assert_eq!(m.missing(), 2);
        m.reported("a");
        m.reported("x");
        assert_eq!(m.missing(), 1);
        m.reported("b");
        assert_eq!(m.missing(), 0);
        forget(&kv, "b").await.unwrap();
        assert_eq!(Members::load(&kv).await.unwrap().missing(), 1);
        remember(&kv, "b").await.unwrap();
        assert_eq!(Members::load(&kv).await.unwrap().missing(), 2, "back");
    }
}
