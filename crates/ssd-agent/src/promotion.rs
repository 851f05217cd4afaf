//! Promotion: copies objects the master asks for (SSD hits) from this
//! owner's buckets into the DRAM ranges it placed, staged through the same
//! arena as reads, piece by piece, checksum verified before reporting.

use crate::staging::Staging;
use crate::store::OwnerStore;
use futures::StreamExt;
use std::sync::Arc;
use strata_common::{Code, Error, Result};
use strata_proto as pb;
use strata_transport::{remote_range, Transport};

/// Promotions copied at once.
const CONCURRENCY: usize = 4;

pub struct Promoter {
    pub store: Arc<OwnerStore>,
    pub staging: Staging,
    pub transport: Arc<dyn Transport>,
    pub checksum_failures: prometheus::IntCounter,
}

impl Promoter {
    pub async fn process(&self, tasks: &[pb::PromoteTask]) -> Vec<pb::PromotionResult> {
        let futs: Vec<_> = tasks
            .iter()
            .map(|t| async move {
                let r = self.copy(t).await;
                if let Err(e) = &r {
                    tracing::debug!(key = t.key, error = %e, "promotion failed");
                }
                pb::PromotionResult {
                    task_id: t.task_id,
                    ok: r.is_ok(),
                    error: r.err().map(|e| e.to_string()).unwrap_or_default(),
                }
            })
            .collect();
        futures::stream::iter(futs)
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await
    }

    async fn copy(&self, t: &pb::PromoteTask) -> Result<()> {
        let dest = t
            .dest
            .as_ref()
            .ok_or_else(|| Error::invalid("promotion without a destination"))?;
        let dest = remote_range(dest)?;
        if dest.len() != t.size {
            return Err(Error::invalid("promotion destination has the wrong size"));
        }
        let _reading = self.store.begin_read(t.bucket_id)?;
        let mut crc = 0u32;
        let mut at = 0u64;
        while at < t.size {
            let n = (t.size - at).min(self.staging.piece_bytes());
            let _staged = self.staging.acquire(n, t.size, None).await?;
            let (store, b, off) = (self.store.clone(), t.bucket_id, t.offset + at);
            let piece = tokio::task::spawn_blocking(move || store.read_piece(b, off, n))
                .await
                .map_err(|e| Error::internal(format!("read task failed: {e}")))??;
            crc = crc32c::crc32c_append(crc, &piece);
            self.transport.write(&dest, at, &piece).await?;
            at += n;
        }
        if crc != t.crc32c {
            self.checksum_failures.inc();
            tracing::error!(
                key = t.key,
                bucket = t.bucket_id,
                "SSD copy failed its checksum on promotion"
            );
            return Err(Error::new(
                Code::Corrupted,
                format!("SSD copy of {:?} failed its checksum; not promoted", t.key),
            ));
        }
        Ok(())
    }
}
