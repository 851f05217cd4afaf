//! Serves reads of this owner's buckets on the data plane. Grants are signed
//! by the master with `PERM_SSD_READ` and name `(owner, bucket)`, so neither a
//! DRAM grant nor another owner's grant can read these files. With a lend
//! window (`--transport ucx`) grants that also carry `PERM_STAGE` (rdma
//! callers) may stage a piece into it for a one-sided read.

use crate::staging::Staging;
use crate::store::{BucketReadGuard, OwnerStore};
use futures::future::BoxFuture;
use parking_lot::RwLock;
use std::sync::Arc;
use strata_common::grant::{split_ssd_segment_id, GrantKey, GrantScope, PERM_SSD_READ, PERM_STAGE};
use strata_common::{Code, Error, Result};
use strata_transport::frame::{Request, Staged};
use strata_transport::lend::Lender;
use strata_transport::region::{
    verify_grant, Chunk, ChunkStream, DataRegion, ReadSource, WriteTarget,
};

pub struct BucketRegion {
    /// Installed once registered: grant key and the owner's store.
    state: RwLock<Option<(GrantKey, Arc<OwnerStore>)>>,
    staging: Staging,
    /// Where reads are lent to one-sided readers (`--transport ucx`).
    lender: Option<Arc<Lender>>,
    instance: String,
    checksum_failures: prometheus::IntCounter,
}

impl BucketRegion {
    pub fn new(
        staging: Staging,
        lender: Option<Arc<Lender>>,
        instance: String,
        checksum_failures: prometheus::IntCounter,
    ) -> Self {
        BucketRegion {
            state: RwLock::new(None),
            staging,
            lender,
            instance,
            checksum_failures,
        }
    }

    pub fn install(&self, key: GrantKey, store: Arc<OwnerStore>) {
        *self.state.write() = Some((key, store));
    }
}

impl BucketRegion {
    /// Checks `req`'s grant for `perm` on this owner's buckets: the store
    /// and the bucket it names.
    fn authorize(&self, req: &Request, perm: u32, now_ms: u64) -> Result<(Arc<OwnerStore>, u64)> {
        let (key, store) = self
            .state
            .read()
            .clone()
            .ok_or_else(|| Error::unavailable("SSD agent is still starting"))?;
        verify_grant(
            &key, &req.grant, &req.mac, perm, req.offset, req.length, now_ms,
        )?;
        let (owner, bucket) = split_ssd_segment_id(req.grant.segment_id);
        if owner != store.owner_id {
            return Err(Error::new(
                Code::PermissionDenied,
                format!(
                    "grant is for owner {owner}, this agent serves owner {}",
                    store.owner_id
                ),
            ));
        }
        Ok((store, bucket))
    }

    /// Stages the first piece of `req`'s range into a lent window slot.
    async fn stage_piece(&self, req: &Request, now_ms: u64) -> Result<Staged> {
        let lender = self.lender.as_ref().ok_or_else(|| {
            Error::invalid(
                "this SSD agent lends no staging (it runs --transport tcp); read over TCP",
            )
        })?;
        if req.grant.perm & PERM_SSD_READ == 0 {
            return Err(Error::new(
                Code::PermissionDenied,
                "grant does not allow this operation",
            ));
        }
        let (store, bucket) = self.authorize(req, PERM_STAGE, now_ms)?;
        let at = req.offset;
        let object = store.object_at(bucket, at);
        let failures = self.checksum_failures.clone();
        lender
            .stage(req.length, move |dst| {
                // Taken once a slot is: waiting for one must not hold off
                // the bucket's eviction. It stays while the piece is read.
                let _read = store.begin_read(bucket)?;
                store.read_piece_into(bucket, at, dst)?;
                let n = dst.len() as u64;
                if let Some((len, want)) = object.filter(|(len, _)| *len == n) {
                    if crc32c::crc32c(dst) != want {
                        failures.inc();
                        tracing::error!(bucket, offset = at, "object failed its checksum on read");
                        return Err(Error::new(
                            Code::Corrupted,
                            format!("object at bucket {bucket} offset {at} ({len} bytes) failed its checksum"),
                        ));
                    }
                }
                if object.is_some() {
                    store.mark_read(bucket, at);
                }
                Ok(())
            })
            .await
    }
}

impl DataRegion for BucketRegion {
    fn stage<'a>(&'a self, req: &'a Request, now_ms: u64) -> BoxFuture<'a, Result<Staged>> {
        Box::pin(self.stage_piece(req, now_ms))
    }

    fn give_back(&self, lease: u64, token: u64) -> bool {
        self.lender
            .as_ref()
            .is_some_and(|l| l.give_back(lease, token))
    }

    fn reclaim_held(&self, lease: u64, token: u64) -> bool {
        self.lender
            .as_ref()
            .is_some_and(|l| l.reclaim_held(lease, token))
    }

    fn read<'a>(&'a self, req: &'a Request, now_ms: u64) -> BoxFuture<'a, Result<ReadSource>> {
        Box::pin(async move {
            let (store, bucket) = self.authorize(req, PERM_SSD_READ, now_ms)?;
            let read = store.begin_read(bucket)?;
            let expect = store
                .object_at(bucket, req.offset)
                .filter(|(len, _)| *len == req.length)
                .map(|(_, crc)| crc);
            if expect.is_some() {
                store.mark_read(bucket, req.offset);
            }
            Ok(ReadSource::Stream(Box::new(SsdRead {
                store,
                staging: self.staging.clone(),
                bucket,
                next: req.offset,
                remaining: req.length,
                requested: req.length,
                peer: strata_transport::tcp::current_peer(),
                expect,
                crc: 0,
                checksum_failures: self.checksum_failures.clone(),
                _read: read,
            })))
        })
    }

    fn write_target(&self, _req: &Request, _now_ms: u64) -> Result<WriteTarget> {
        Err(Error::new(
            Code::PermissionDenied,
            "SSD agents accept no data-plane writes; objects arrive through offload",
        ))
    }

    fn ping_payload(&self) -> Vec<u8> {
        self.instance.as_bytes().to_vec()
    }

    fn signed(&self, grant: &GrantScope, mac: &[u8]) -> bool {
        let state = self.state.read();
        state
            .as_ref()
            .is_some_and(|(key, _)| key.verify(grant, mac))
    }
}

/// One SSD read, staged through the shared arena a piece at a time. The
/// bucket cannot be deleted while it runs; when the range is exactly one
/// object its checksum is checked before the last piece leaves, so damaged
/// bytes never complete a response.
struct SsdRead {
    store: Arc<OwnerStore>,
    staging: Staging,
    bucket: u64,
    next: u64,
    remaining: u64,
    requested: u64,
    /// Whose share of the arena the pieces count against.
    peer: Option<std::net::IpAddr>,
    expect: Option<u32>,
    crc: u32,
    checksum_failures: prometheus::IntCounter,
    _read: BucketReadGuard,
}

impl ChunkStream for SsdRead {
    fn recycle(&mut self, buf: Vec<u8>) {
        self.staging.recycle(buf);
    }

    fn next_chunk(&mut self) -> BoxFuture<'_, Result<Option<Chunk>>> {
        Box::pin(async move {
            if self.remaining == 0 {
                return Ok(None);
            }
            let n = self.remaining.min(self.staging.piece_bytes());
            let guard = self.staging.acquire(n, self.requested, self.peer).await?;
            let (store, bucket, at) = (self.store.clone(), self.bucket, self.next);
            let mut buf = self.staging.buffer(n as usize);
            let data = tokio::task::spawn_blocking(move || {
                store.read_piece_into(bucket, at, &mut buf).map(|_| buf)
            })
            .await
            .map_err(|e| Error::internal(format!("read task failed: {e}")))??;
            self.next += n;
            self.remaining -= n;
            if self.expect.is_some() {
                self.crc = crc32c::crc32c_append(self.crc, &data);
            }
            if let (0, Some(want)) = (self.remaining, self.expect) {
                if self.crc != want {
                    self.checksum_failures.inc();
                    tracing::error!(
                        bucket = self.bucket,
                        offset = self.next - self.requested,
                        "object failed its checksum on read"
                    );
                    return Err(Error::new(
                        Code::Corrupted,
                        format!(
                            "object at bucket {} offset {} failed its checksum",
                            self.bucket,
                            self.next - self.requested
                        ),
                    ));
                }
            }
            Ok(Some(Chunk {
                data,
                guard: Some(Box::new(guard)),
            }))
        })
    }
}
