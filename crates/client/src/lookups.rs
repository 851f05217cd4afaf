//! Lookups batched by default: reads that ask the master while another
//! lookup of this client is in flight ride the next request together
//! (`BatchGetReplicas`), so many concurrent single gets cost few round trips.
//! Nothing waits to fill a batch: a lookup with none in flight goes at once,
//! alone (`GetReplicas`); batches form only from what queued meanwhile.

use std::sync::Arc;
use strata_common::grpc::MasterChannel;
use strata_common::{Error, Result};
use strata_proto as pb;
use strata_proto::master_client::MasterClient;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tracing::Instrument;

/// Keys one request carries at most (well under the master's batch limit).
const MAX_KEYS: usize = 256;
/// Requests in flight at once per client: a second one keeps a slow
/// answer from stalling every lookup behind it.
const IN_FLIGHT: usize = 2;

type Reply = oneshot::Sender<Result<pb::GetReplicasResponse>>;
/// A queued lookup: its key, where to answer, and the caller's span (the
/// request is sent inside it, so a traced get shows its master hop; a
/// batch is sent inside its first caller's).
type Item = (String, Reply, tracing::Span);

/// The queue of lookups; the dispatcher ends when the last handle drops.
#[derive(Clone)]
pub(crate) struct Lookups {
    tx: mpsc::UnboundedSender<Item>,
}

impl Lookups {
    pub(crate) fn start(master: MasterClient<MasterChannel>) -> Lookups {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(dispatch(master, rx));
        Lookups { tx }
    }

    /// Where `key`'s bytes are (one attempt; callers retry with backoff).
    pub(crate) async fn get(&self, key: &str) -> Result<pb::GetReplicasResponse> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send((key.to_string(), reply, tracing::Span::current()))
            .map_err(|_| Error::unavailable("the client is shutting down"))?;
        answer
            .await
            .map_err(|_| Error::unavailable("the lookup was dropped; retry"))?
    }
}

async fn dispatch(master: MasterClient<MasterChannel>, mut rx: mpsc::UnboundedReceiver<Item>) {
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    loop {
        // Wait for a free slot first: what queues meanwhile is the batch.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = rx.recv().await else {
            return;
        };
        let mut batch = vec![first];
        while batch.len() < MAX_KEYS {
            match rx.try_recv() {
                Ok(item) => batch.push(item),
                Err(_) => break,
            }
        }
        let mut m = master.clone();
        let span = batch[0].2.clone();
        tokio::spawn(
            async move {
                send(&mut m, batch).await;
                drop(slot);
            }
            .instrument(span),
        );
    }
}

/// One request for `batch`; every waiter gets its own answer.
async fn send(m: &mut MasterClient<MasterChannel>, mut batch: Vec<Item>) {
    if batch.len() == 1 {
        let (key, reply, _) = batch.pop().expect("one");
        let r = m
            .get_replicas(pb::GetReplicasRequest { key })
            .await
            .map(tonic::Response::into_inner)
            .map_err(Error::from);
        let _ = reply.send(r);
        return;
    }
    let keys = batch.iter().map(|(k, _, _)| k.clone()).collect();
    let answer = m
        .batch_get_replicas(pb::BatchGetReplicasRequest { keys })
        .await
        .map(tonic::Response::into_inner)
        .map_err(Error::from)
        .and_then(|r| {
            if r.results.len() == batch.len() {
                Ok(r.results)
            } else {
                Err(Error::internal(
                    "master answered a batch with the wrong count",
                ))
            }
        });
    match answer {
        Ok(results) => {
            for ((_, reply, _), r) in batch.into_iter().zip(results) {
                let _ = reply.send(crate::client::replicas_of(r));
            }
        }
        Err(e) => {
            for (_, reply, _) in batch {
                let _ = reply.send(Err(e.clone()));
            }
        }
    }
}
