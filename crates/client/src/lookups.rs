//! Lookups batched by default: while a few lookups of this client are in
//! flight, each goes at once, alone, from the caller's task (`GetReplicas`:
//! the cheapest request, no hand-off). Beyond that, lookups queue and ride
//! the next request together (`BatchGetReplicas`, one at a time), so many
//! concurrent single gets cost few round trips. Nothing ever waits to fill
//! a batch: batches form only from what queued meanwhile.

use crate::MasterCalls;
use std::sync::Arc;
use strata_common::{Error, Result};
use strata_proto as pb;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tracing::Instrument;

/// Keys one request carries at most (well under the master's batch limit).
const MAX_KEYS: usize = 256;
/// Single lookups in flight at once per client before lookups queue into
/// batches (measured across processes, 4 KiB gets: batching every lookup
/// through a dispatcher task cost a quarter of the rate at 4 concurrent
/// readers and gained a sixth at 16).
const IN_FLIGHT: usize = 4;

type Reply = oneshot::Sender<Result<pb::GetReplicasResponse>>;
/// A queued lookup: its key, where to answer, and the caller's span (the
/// request is sent inside it, so a traced get shows its master hop; a
/// batch is sent inside its first caller's).
type Item = (String, Reply, tracing::Span);

/// The queue of lookups; the dispatcher ends when the last handle drops.
#[derive(Clone)]
pub(crate) struct Lookups {
    calls: MasterCalls,
    singles: Arc<Semaphore>,
    tx: mpsc::UnboundedSender<Item>,
}

impl Lookups {
    pub(crate) fn start(calls: MasterCalls) -> Lookups {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(dispatch(calls.clone(), rx));
        Lookups {
            calls,
            singles: Arc::new(Semaphore::new(IN_FLIGHT)),
            tx,
        }
    }

    /// Where `key`'s bytes are (one attempt; callers retry with backoff).
    pub(crate) async fn get(&self, key: &str) -> Result<pb::GetReplicasResponse> {
        if let Ok(_single) = self.singles.try_acquire() {
            return self.calls.get_replicas(key.to_string()).await;
        }
        let (reply, answer) = oneshot::channel();
        self.tx
            .send((key.to_string(), reply, tracing::Span::current()))
            .map_err(|_| Error::unavailable("the client is shutting down"))?;
        answer
            .await
            .map_err(|_| Error::unavailable("the lookup was dropped; retry"))?
    }
}

/// Sends what queued, one request at a time: while one is out, the next
/// batch gathers.
async fn dispatch(master: MasterCalls, mut rx: mpsc::UnboundedReceiver<Item>) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < MAX_KEYS {
            match rx.try_recv() {
                Ok(item) => batch.push(item),
                Err(_) => break,
            }
        }
        let span = batch[0].2.clone();
        send(&master, batch).instrument(span).await;
    }
}

/// One request for `batch`; every waiter gets its own answer.
async fn send(m: &MasterCalls, mut batch: Vec<Item>) {
    if batch.len() == 1 {
        let (key, reply, _) = batch.pop().expect("one");
        let _ = reply.send(m.get_replicas(key).await);
        return;
    }
    let keys = batch.iter().map(|(k, _, _)| k.clone()).collect();
    match batch_get(m, keys).await {
        Ok(results) => {
            for ((_, reply, _), r) in batch.into_iter().zip(results) {
                let _ = reply.send(r);
            }
        }
        Err(e) => {
            for (_, reply, _) in batch {
                let _ = reply.send(Err(e.clone()));
            }
        }
    }
}

/// One `BatchGetReplicas`: each key's replicas or its own error, in order.
pub(crate) async fn batch_get(
    m: &MasterCalls,
    keys: Vec<String>,
) -> Result<Vec<Result<pb::GetReplicasResponse>>> {
    let n = keys.len();
    let results = m
        .batch_get_replicas(pb::BatchGetReplicasRequest { keys })
        .await?
        .results;
    if results.len() != n {
        return Err(Error::internal(
            "master answered a batch with the wrong count",
        ));
    }
    Ok(results
        .into_iter()
        .map(crate::status::replicas_of)
        .collect())
}
