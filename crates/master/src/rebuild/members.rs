//! The members a cluster has, kept in the durable state (ids only: small,
//! written once per member and when it is lost), so a new master knows whom
//! to wait for: it takes writes, and answers "not found", once every
//! remembered member re-registered and reported what it holds (store nodes
//! their committed objects, `rebuild.rs`; SSD owners their inventory), or
//! after a bound for members that do not come back.
//!
//! Keys: `members/nodes/<node id>` and `members/owners/<owner id>`, valued
//! `live` or `gone`. A state written before owners were remembered has only
//! nodes; its owners are remembered at their next registration.

use crate::durable::DurableKv;
use parking_lot::Mutex;
use std::collections::HashSet;
use strata_common::Result;

const PREFIX: &str = "members/";
const LIVE: &str = "live";
const GONE: &str = "gone";

/// One member a restarted master waits for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Member {
    /// A store node, by node id.
    Node(String),
    /// An SSD owner, by its durable owner id.
    Owner(u64),
}

impl Member {
    fn key(&self) -> String {
        match self {
            Member::Node(id) => format!("{PREFIX}nodes/{id}"),
            Member::Owner(id) => format!("{PREFIX}owners/{id}"),
        }
    }

    fn parse(key: &str) -> Option<Member> {
        let rest = key.strip_prefix(PREFIX)?;
        if let Some(id) = rest.strip_prefix("nodes/") {
            return Some(Member::Node(id.to_string()));
        }
        rest.strip_prefix("owners/")?
            .parse()
            .ok()
            .map(Member::Owner)
    }
}

impl std::fmt::Display for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Member::Node(id) => write!(f, "store node {id:?}"),
            Member::Owner(id) => write!(f, "SSD owner {id}"),
        }
    }
}

/// The members a term waits for, and those that reported.
#[derive(Default)]
pub struct Members {
    expected: HashSet<Member>,
    reported: Mutex<HashSet<Member>>,
}

impl Members {
    /// The members the durable state remembers as live.
    pub async fn load(kv: &dyn DurableKv) -> Result<Members> {
        let expected = kv
            .list(PREFIX.into())
            .await?
            .into_iter()
            .filter(|(_, v)| v == LIVE)
            .filter_map(|(k, _)| Member::parse(&k))
            .collect();
        Ok(Members {
            expected,
            reported: Mutex::new(HashSet::new()),
        })
    }

    /// `m` re-registered and reported everything it holds.
    pub fn reported(&self, m: Member) {
        self.reported.lock().insert(m);
    }

    /// Remembered members that have not reported yet.
    pub fn missing(&self) -> Vec<Member> {
        let r = self.reported.lock();
        self.expected
            .iter()
            .filter(|m| !r.contains(*m))
            .cloned()
            .collect()
    }
}

/// Remembers `m` as a member (a no-op when it already is).
pub async fn remember(kv: &dyn DurableKv, m: &Member) -> Result<()> {
    let key = m.key();
    match kv.get(key.clone()).await?.as_deref() {
        Some(LIVE) => Ok(()),
        cur => {
            let cur = cur.map(String::from);
            kv.compare_and_set(key, cur, LIVE.into()).await.map(|_| ())
        }
    }
}

/// Forgets `m` (it missed `--node-ttl`): no new master waits for it.
pub async fn forget(kv: &dyn DurableKv, m: &Member) -> Result<()> {
    kv.compare_and_set(m.key(), Some(LIVE.into()), GONE.into())
        .await
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::durable::MemKv;

    fn node(id: &str) -> Member {
        Member::Node(id.into())
    }

    #[tokio::test]
    async fn remembered_members_are_expected_until_forgotten() {
        let kv = MemKv::new();
        remember(&kv, &node("a")).await.unwrap();
        remember(&kv, &node("a")).await.unwrap();
        remember(&kv, &node("b")).await.unwrap();
        remember(&kv, &Member::Owner(7)).await.unwrap();
        let m = Members::load(&kv).await.unwrap();
        assert_eq!(m.missing().len(), 3);
        m.reported(node("a"));
        m.reported(node("x"));
        m.reported(Member::Owner(8));
        assert_eq!(m.missing().len(), 2);
        m.reported(node("b"));
        assert_eq!(m.missing(), vec![Member::Owner(7)], "an owner is a member");
        m.reported(Member::Owner(7));
        assert!(m.missing().is_empty());
        forget(&kv, &node("b")).await.unwrap();
        forget(&kv, &Member::Owner(7)).await.unwrap();
        assert_eq!(Members::load(&kv).await.unwrap().missing(), vec![node("a")]);
        remember(&kv, &node("b")).await.unwrap();
        assert_eq!(Members::load(&kv).await.unwrap().missing().len(), 2, "back");
    }

    #[test]
    fn member_keys_parse_back() {
        for m in [node("n-1/x"), Member::Owner(42)] {
            assert_eq!(Member::parse(&m.key()), Some(m));
        }
        assert_eq!(Member::parse("members/owners/x"), None);
        assert_eq!(Member::parse("members/other/x"), None);
    }
}
