use super::DurableKv;
use futures::future::BoxFuture;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use strata_common::Result;

/// In-memory durable KV, for tests and for a master run without
/// `--state-dir` (nothing survives a restart; the master warns).
#[derive(Default)]
pub struct MemKv {
    map: Mutex<BTreeMap<String, String>>,
}

impl MemKv {
    pub fn new() -> Self {
        Self::default()
    }
}

impl DurableKv for MemKv {
    fn get(&self, key: String) -> BoxFuture<'_, Result<Option<String>>> {
        let v = self.map.lock().get(&key).cloned();
        Box::pin(async move { Ok(v) })
    }

    fn compare_and_set(
        &self,
        key: String,
        expected: Option<String>,
        value: String,
    ) -> BoxFuture<'_, Result<bool>> {
        let mut m = self.map.lock();
        let ok = m.get(&key) == expected.as_ref();
        if ok {
            m.insert(key, value);
        }
        Box::pin(async move { Ok(ok) })
    }

    fn list(&self, prefix: String) -> BoxFuture<'_, Result<Vec<(String, String)>>> {
        let v = super::prefix_entries(&self.map.lock(), &prefix);
        Box::pin(async move { Ok(v) })
    }

    fn name(&self) -> &'static str {
        "memory"
    }
}
