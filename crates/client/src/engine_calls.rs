//! What inference engines call beyond a plain put and get: which keys of a
//! prefix are stored (and their sizes) in one round trip, objects made of
//! several buffers (one slice per layer), removal by prefix, and placement
//! on a named node (the engine's own embedded segment).

use crate::client::{Client, PutOptions};
use futures::StreamExt;
use std::borrow::Cow;
use strata_common::{Code, Error, Result};
use strata_proto as pb;

impl Client {
    /// Whether each key is committed, and its size (`None`: absent), in one
    /// request: no lease is taken and nothing is read. An item's error means
    /// the master cannot tell yet (a new leader still rebuilding).
    /// Masters that predate `BatchExists` are asked key by key.
    #[tracing::instrument(name = "strata.batch_exists", skip_all, fields(items = keys.len()))]
    pub async fn batch_sizes(&self, keys: &[&str]) -> Result<Vec<Result<Option<u64>>>> {
        let mut out = Vec::with_capacity(keys.len());
        // The master refuses batches beyond its limit; split well under it.
        for chunk in keys.chunks(1024) {
            out.extend(self.batch_sizes_once(chunk).await?);
        }
        Ok(out)
    }

    /// One chunk: keys whose answer is not known yet (a new leader still
    /// rebuilding) are asked again with the client's backoff, as
    /// [`Client::exists`] retries; what is still unknown at the deadline is
    /// that key's error.
    async fn batch_sizes_once(&self, keys: &[&str]) -> Result<Vec<Result<Option<u64>>>> {
        let b = self.config().backoff;
        let t0 = tokio::time::Instant::now();
        let mut out = self.ask_sizes(keys).await?;
        for attempt in 0..b.attempts {
            let again: Vec<usize> = (0..out.len())
                .filter(|&i| out[i].as_ref().is_err_and(Error::retryable))
                .collect();
            let delay = b.delay(attempt);
            if again.is_empty() || t0.elapsed() + delay >= b.deadline {
                break;
            }
            tokio::time::sleep(delay).await;
            let ask: Vec<&str> = again.iter().map(|&i| keys[i]).collect();
            for (i, r) in again.into_iter().zip(self.ask_sizes(&ask).await?) {
                out[i] = r;
            }
        }
        Ok(out)
    }

    async fn ask_sizes(&self, keys: &[&str]) -> Result<Vec<Result<Option<u64>>>> {
        let req = pb::BatchExistsRequest {
            keys: keys.iter().map(|k| k.to_string()).collect(),
        };
        let answer = self
            .config()
            .backoff
            .run(|| async {
                match self.master_client().batch_exists(req.clone()).await {
                    Ok(r) => Ok(Some(r.into_inner().results)),
                    Err(s) if s.code() == tonic::Code::Unimplemented => Ok(None),
                    Err(s) => Err(Error::from(s)),
                }
            })
            .await?;
        let Some(results) = answer else {
            return Ok(self.sizes_one_by_one(keys).await);
        };
        if results.len() != keys.len() {
            return Err(Error::internal(
                "master answered a batch with the wrong count",
            ));
        }
        Ok(results
            .into_iter()
            .map(|r| match r.status {
                Some(s) if s.code != 0 => Err(Error::from_parts(s.code, s.message, s.retryable)),
                _ => Ok(r.exists.then_some(r.size)),
            })
            .collect())
    }

    /// An older master's way: Exists, then Inspect for the size.
    async fn sizes_one_by_one(&self, keys: &[&str]) -> Vec<Result<Option<u64>>> {
        // Owned keys and clients in the futures: the callers' futures must
        // be Send, which borrowed closures in a stream defeat.
        let futs: Vec<_> = keys
            .iter()
            .map(|k| {
                let (c, k) = (self.clone(), k.to_string());
                async move {
                    if !c.exists(&k).await? {
                        return Ok(None);
                    }
                    match c.inspect(&k).await {
                        Ok(i) => Ok(Some(i.size)),
                        // Removed between the two calls.
                        Err(e) if e.code == Code::NotFound => Ok(None),
                        Err(e) => Err(e),
                    }
                }
            })
            .collect();
        futures::stream::iter(futs)
            .buffered(self.config().batch_concurrency.max(1))
            .collect()
            .await
    }

    /// The committed size of `key` without reading it (`NotFound` when
    /// absent).
    pub async fn size(&self, key: &str) -> Result<u64> {
        match self.batch_sizes(&[key]).await?.pop() {
            Some(Ok(Some(n))) => Ok(n),
            Some(Ok(None)) => Err(Error::not_found(format!("key {key:?} not found"))),
            Some(Err(e)) => Err(e),
            None => Err(Error::internal("master answered a batch with no item")),
        }
    }

    /// [`Client::batch_get_into`] where each object is scattered over parts,
    /// read straight into them (each object exactly as long as its parts
    /// together).
    pub async fn batch_get_into_parts(
        &self,
        items: &mut [(&str, &mut [&mut [u8]])],
    ) -> Result<Vec<Result<usize>>> {
        let keys: Vec<&str> = items.iter().map(|(k, _)| *k).collect();
        let bufs = items
            .iter_mut()
            .map(|(_, parts)| parts.iter_mut().map(|p| &mut **p).collect())
            .collect();
        self.batch_get_into_bufs(&keys, bufs, true).await
    }

    /// Removes each key (leased ones only with `force`); one result per key.
    pub async fn batch_remove(&self, keys: &[&str], force: bool) -> Vec<Result<()>> {
        let futs: Vec<_> = keys
            .iter()
            .map(|k| {
                let (c, k) = (self.clone(), k.to_string());
                async move { c.remove(&k, force).await }
            })
            .collect();
        futures::stream::iter(futs)
            .buffered(self.config().batch_concurrency.max(1))
            .collect()
            .await
    }

    /// Removes every key that starts with `prefix` (leased ones only with
    /// `force`). Returns how many were removed; keys that vanished meanwhile
    /// do not count, and the first other failure is returned after every key
    /// was tried.
    pub async fn remove_prefix(&self, prefix: &str, force: bool) -> Result<u64> {
        self.remove_matching(prefix, force, |_| true).await
    }

    /// Removes the keys under `prefix` that `matches` accepts.
    pub async fn remove_matching(
        &self,
        prefix: &str,
        force: bool,
        matches: impl Fn(&str) -> bool,
    ) -> Result<u64> {
        let keys: Vec<String> = self
            .list(prefix, usize::MAX)
            .await?
            .into_iter()
            .filter(|o| o.complete && matches(&o.key))
            .map(|o| o.key)
            .collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let results = self.batch_remove(&refs, force).await;
        let mut removed = 0;
        let mut first_err = None;
        for r in results {
            match r {
                Ok(()) => removed += 1,
                Err(e) if e.code == Code::NotFound => {}
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(removed),
        }
    }

    /// `opts` with `preferred_node` turned into a segment of that node (the
    /// one with the most free room), when the cluster has that node.
    pub(crate) async fn placed<'a>(&self, opts: &'a PutOptions) -> Cow<'a, PutOptions> {
        match &opts.preferred_node {
            Some(node) if opts.preferred_segment.is_none() => {
                let mut o = opts.clone();
                o.preferred_segment = self.node_segments.segment_of(node, || self.stat()).await;
                Cow::Owned(o)
            }
            _ => Cow::Borrowed(opts),
        }
    }
}
