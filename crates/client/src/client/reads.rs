//! The read side of [`Client`]: gets (single, batched, into the caller's
//! buffers or parts), the location cache, lookups at the master and
//! checksum-verified reads that fall back replica by replica.

use super::{Client, Tier, Tiered};
use crate::lease_ends::{Lease, Leases};
use futures::StreamExt;
use std::sync::Arc;
use strata_common::{Code, Error, Result};
use strata_proto as pb;
use strata_transport::parts::reborrow;
use strata_transport::{parts, remote_range, RemoteRange, Verified};

/// A master's answer to a lookup, shared with the location cache (which
/// keeps it without copying its replicas and grants).
type Answer = Arc<pb::GetReplicasResponse>;

/// A batch's replicas, per key, which came from the location cache, and
/// the leases of those the master was asked for (held until the batch's
/// reads are done).
struct Located {
    infos: Vec<Result<Answer>>,
    cached: Vec<bool>,
    leases: Leases,
}

impl Client {
    /// Reads `key` into a new buffer, verifying its checksum.
    #[tracing::instrument(name = "strata.get", skip_all, fields(key = key))]
    pub async fn get(&self, key: &str) -> Result<Vec<u8>> {
        self.get_with(key, |n| Ok(vec![0u8; n])).await
    }

    /// Reads `key` into a buffer that `alloc` makes once the object's size
    /// is known (`alloc(size)` must give exactly `size` bytes): for callers
    /// that own their memory (the Python client reads straight into a new
    /// `bytes`). `alloc` may be called again if the object is replaced by
    /// one of another size meanwhile.
    pub async fn get_with<B: AsMut<[u8]>>(
        &self,
        key: &str,
        mut alloc: impl FnMut(usize) -> Result<B>,
    ) -> Result<B> {
        let mut sized = |n: usize| -> Result<B> {
            let mut b = alloc(n)?;
            if b.as_mut().len() != n {
                return Err(Error::internal("a buffer of the wrong size was made"));
            }
            Ok(b)
        };
        if let Some(info) = self.cached(key) {
            let mut buf = sized(info.size as usize)?;
            if self.read_cached(key, &info, &mut [buf.as_mut()]).await {
                return Ok(buf);
            }
        }
        let (info, _lease) = self.lookup(key).await?;
        let mut buf = sized(info.size as usize)?;
        self.read_verified(key, info, &mut [buf.as_mut()]).await?;
        Ok(buf)
    }

    /// Reads `key` into the caller's buffer (no intermediate copy) and returns
    /// the object's size. The buffer must be at least that large.
    #[tracing::instrument(name = "strata.get", skip_all, fields(key = key))]
    pub async fn get_into(&self, key: &str, buf: &mut [u8]) -> Result<usize> {
        if let Some(info) = self.cached(key) {
            let n = info.size as usize;
            if buf.len() >= n && self.read_cached(key, &info, &mut [&mut buf[..n]]).await {
                return Ok(n);
            }
        }
        let (info, _lease) = self.lookup(key).await?;
        let n = info.size as usize;
        if buf.len() < n {
            return Err(Error::invalid(format!(
                "buffer of {} bytes is smaller than object {key:?} of {n} bytes",
                buf.len()
            )));
        }
        self.read_verified(key, info, &mut [&mut buf[..n]]).await?;
        Ok(n)
    }

    /// Reads `key` into `parts` in order: the object must be exactly as long
    /// as the parts together (an object of another size is an error and
    /// leaves the parts untouched). Returns the object's size. One lookup,
    /// as for [`Client::get_into`].
    pub async fn get_into_parts(&self, key: &str, parts: &mut [&mut [u8]]) -> Result<usize> {
        let have = parts::total_len(parts);
        if let Some(info) = self.cached(key) {
            if info.size as usize == have && self.read_cached(key, &info, parts).await {
                return Ok(have);
            }
        }
        let (info, _lease) = self.lookup(key).await?;
        let n = info.size as usize;
        if have != n {
            return Err(Error::invalid(format!(
                "object {key:?} holds {n} bytes but its parts hold {have}; the parts must add \
                 up to the object's size"
            )));
        }
        self.read_verified(key, info, parts).await?;
        Ok(n)
    }

    /// `key`'s replicas from the location cache, if a lease still covers
    /// them.
    fn cached(&self, key: &str) -> Option<Answer> {
        self.locations.as_ref().and_then(|l| l.get(key))
    }

    /// Asks the master where `key`'s bytes are (and caches the answer),
    /// with the lease to hold until the read is done.
    async fn lookup(&self, key: &str) -> Result<(Answer, Option<Lease>)> {
        self.cfg
            .backoff
            .run(|| async {
                let asked = std::time::Instant::now();
                #[allow(unused_mut)]
                let mut info = self.lookups.get(key).await?;
                // Stands for grants a deposed leader signed: the nodes took
                // a newer term's key since, so they refuse the signature.
                #[cfg(feature = "failpoints")]
                if fail::eval("client::grants-from-deposed-leader", |_| ()).is_some() {
                    for r in &mut info.replicas {
                        if let Some(m) = r.grant.as_mut().and_then(|g| g.mac.first_mut()) {
                            *m ^= 0xff;
                        }
                    }
                }
                let lease = self.lease_ends.lease(key, &info);
                self.check_answer(key, &info)?;
                let info = Arc::new(info);
                if let Some(l) = &self.locations {
                    l.insert(key, &info, asked);
                }
                Ok((info, lease))
            })
            .await
    }

    /// Refuses a master's answer no buffer should be made for: a size over
    /// `max_object_bytes`, or a replica of another length than the object.
    fn check_answer(&self, key: &str, info: &pb::GetReplicasResponse) -> Result<()> {
        if info.size > self.cfg.max_object_bytes {
            return Err(Error::internal(format!(
                "the master says {key:?} holds {} bytes, over this client's limit of {} \
                 (ClientConfig::max_object_bytes); refused",
                info.size, self.cfg.max_object_bytes
            )));
        }
        if let Some(r) = info.replicas.iter().find(|r| r.length != info.size) {
            return Err(Error::internal(format!(
                "the master answered {key:?} with a replica of {} bytes for an object of {}; \
                 refused",
                r.length, info.size
            )));
        }
        if !matches!(info.blake3.len(), 0 | 32) {
            return Err(Error::internal(format!(
                "the master answered {key:?} with a BLAKE3 digest of {} bytes; refused",
                info.blake3.len()
            )));
        }
        Ok(())
    }

    pub(super) fn forget(&self, key: &str) {
        if let Some(l) = &self.locations {
            l.forget(key);
        }
    }

    /// One pass over cached replicas. Any failure (refused: the master
    /// freed the range; other bytes; a dead node) forgets the location,
    /// even when a later replica serves the read, and false sends the
    /// caller to the master, exactly as if nothing had been cached.
    async fn read_cached(
        &self,
        key: &str,
        info: &pb::GetReplicasResponse,
        buf: &mut [&mut [u8]],
    ) -> bool {
        let mut failed = false;
        let mut done = false;
        for r in &info.replicas {
            let Ok(range) = remote_range(r) else {
                failed = true;
                continue;
            };
            let blake3 = !info.blake3.is_empty();
            match self
                .transport
                .read_parts_verified(&range, reborrow(buf), blake3)
                .await
            {
                Ok(v) if matches_writer(info, v) => {
                    done = true;
                    break;
                }
                Ok(_) | Err(_) => failed = true,
            }
        }
        if let Some(l) = &self.locations {
            if failed {
                l.forget(key);
            }
            if done {
                l.hit(key);
            }
        }
        done
    }

    /// Reads `key` into `buf` after a cached location failed: asks the
    /// master, and reads if the object still has `buf`'s size.
    async fn reread(&self, key: &str, buf: &mut [&mut [u8]]) -> Result<()> {
        let (info, _lease) = self.lookup(key).await?;
        if info.size != parts::total_len(buf) as u64 {
            return Err(Error::unavailable(format!(
                "key {key:?} was replaced by an object of another size while being read; read it again"
            )));
        }
        self.read_verified(key, info, buf).await
    }

    /// Tries each replica in turn; a replica that fails or returns bytes with
    /// the wrong checksum is skipped. If every grant expired, asks again once.
    async fn read_verified(&self, key: &str, info: Answer, buf: &mut [&mut [u8]]) -> Result<()> {
        let r = self.read_replicas(key, info, buf).await;
        if r.is_err() {
            self.forget(key);
        }
        r
    }

    async fn read_replicas(
        &self,
        key: &str,
        mut info: Answer,
        buf: &mut [&mut [u8]],
    ) -> Result<()> {
        let mut _again = None;
        for round in 0..2 {
            let mut last = Error::unavailable(format!("key {key:?} has no readable replica"));
            let mut ask_again = false;
            // With the writer's digest the transport hashes the bytes as
            // they land (TCP), not in a second pass afterwards.
            let blake3 = !info.blake3.is_empty();
            for r in &info.replicas {
                let range = remote_range(r)?;
                match self
                    .transport
                    .read_parts_verified(&range, reborrow(buf), blake3)
                    .await
                {
                    Ok(v) if matches_writer(&info, v) => return Ok(()),
                    Ok(_) => {
                        tracing::warn!(
                            key,
                            node = r.node_id,
                            "replica failed its checksum; trying another"
                        );
                        last = Error::new(
                            Code::Corrupted,
                            format!("replica of {key:?} on {} failed its checksum", r.node_id),
                        );
                    }
                    Err(e) => {
                        tracing::debug!(key, node = r.node_id, error = %e, "replica read failed");
                        last = super::placement_gone_stale(e);
                        ask_again |= last.retryable();
                    }
                }
            }
            // A replica that vanished (its SSD bucket was evicted), or whose
            // grant its node refused (expired, or signed by a leader deposed
            // since): ask the master again, once.
            if round == 0 && (ask_again || last.retryable()) {
                self.forget(key);
                (info, _again) = self.lookup(key).await?;
                if parts::total_len(buf) as u64 != info.size {
                    return Err(Error::unavailable(format!(
                        "key {key:?} changed while being read"
                    )));
                }
                continue;
            }
            return Err(last);
        }
        Err(Error::unavailable(format!("key {key:?} could not be read")))
    }

    /// Gets many objects with one GetReplicas round trip.
    pub async fn batch_get(&self, keys: &[&str]) -> Result<Vec<Result<Vec<u8>>>> {
        Ok(self
            .batch_get_tiered(keys)
            .await?
            .into_iter()
            .map(|r| r.map(|(b, _)| b))
            .collect())
    }

    /// Like [`Client::batch_get`], also saying which tier served each object
    /// (DRAM when it had a memory replica, else SSD): for benchmarks and
    /// engines that account cache hits per tier.
    #[tracing::instrument(name = "strata.batch_get", skip_all, fields(items = keys.len()))]
    pub async fn batch_get_tiered(&self, keys: &[&str]) -> Result<Vec<Result<Tiered>>> {
        let Located {
            infos,
            cached,
            leases: _leases,
        } = self.batch_replicas(keys).await?;
        let tiers: Vec<Tier> = infos
            .iter()
            .map(|i| match i {
                Ok(i)
                    if i.replicas
                        .iter()
                        .any(|r| r.kind == pb::ReplicaKind::Memory as i32) =>
                {
                    Tier::Memory
                }
                _ => Tier::Ssd,
            })
            .collect();
        let got = self
            .batch_read_new(keys, infos, &cached, |n| Ok(vec![0u8; n]))
            .await?;
        Ok(got
            .into_iter()
            .zip(tiers)
            .map(|(r, t)| r.map(|b| (b, t)))
            .collect())
    }

    /// [`Client::batch_get`] into buffers that `alloc` makes once each
    /// object's size is known (`alloc(size)` gives exactly `size` bytes): the
    /// Python client reads straight into new `bytes` objects.
    pub async fn batch_get_with<B: AsMut<[u8]>>(
        &self,
        keys: &[&str],
        alloc: impl FnMut(usize) -> Result<B>,
    ) -> Result<Vec<Result<B>>> {
        let Located {
            infos,
            cached,
            leases: _leases,
        } = self.batch_replicas(keys).await?;
        self.batch_read_new(keys, infos, &cached, alloc).await
    }

    /// Reads a located batch into buffers made by `alloc`.
    async fn batch_read_new<B: AsMut<[u8]>>(
        &self,
        keys: &[&str],
        infos: Vec<Result<Answer>>,
        cached: &[bool],
        mut alloc: impl FnMut(usize) -> Result<B>,
    ) -> Result<Vec<Result<B>>> {
        let mut bufs: Vec<Option<B>> = Vec::with_capacity(infos.len());
        for i in &infos {
            let n = i.as_ref().map_or(0, |i| i.size as usize);
            let mut b = alloc(n)?;
            if b.as_mut().len() != n {
                return Err(Error::internal("a buffer of the wrong size was made"));
            }
            bufs.push(Some(b));
        }
        let slices: Vec<Vec<&mut [u8]>> = bufs
            .iter_mut()
            .map(|b| b.as_mut().map_or_else(Vec::new, |b| vec![b.as_mut()]))
            .collect();
        let done = self.batch_read(keys, infos, cached, slices).await;
        Ok(done
            .into_iter()
            .zip(bufs)
            .map(|(r, b)| r.and_then(|_| b.ok_or_else(|| Error::internal("buffer taken twice"))))
            .collect())
    }

    /// Like [`Client::batch_get`] into the caller's buffers (one per key, each
    /// at least the object's size): no allocation, no intermediate copy.
    /// Returns each object's size.
    #[tracing::instrument(name = "strata.batch_get", skip_all, fields(items = items.len()))]
    pub async fn batch_get_into(
        &self,
        items: &mut [(&str, &mut [u8])],
    ) -> Result<Vec<Result<usize>>> {
        let keys: Vec<&str> = items.iter().map(|(k, _)| *k).collect();
        let bufs = items.iter_mut().map(|(_, b)| vec![&mut **b]).collect();
        self.batch_get_into_bufs(&keys, bufs, false).await
    }

    /// Reads each key into its buffers in order (scattered; no intermediate
    /// copy). With `exact`, buffers of any other size together than their
    /// object's are refused before anything is read into them; otherwise
    /// they must be at least that large. Returns each object's size.
    pub(crate) async fn batch_get_into_bufs(
        &self,
        keys: &[&str],
        items: Vec<Vec<&mut [u8]>>,
        exact: bool,
    ) -> Result<Vec<Result<usize>>> {
        if keys.len() != items.len() {
            return Err(Error::internal("a batch read with more keys than buffers"));
        }
        let Located {
            infos,
            cached,
            leases: _leases,
        } = self.batch_replicas(keys).await?;
        let mut sizes = Vec::with_capacity(items.len());
        let mut slices = Vec::with_capacity(items.len());
        let mut infos_ok = Vec::with_capacity(items.len());
        for ((k, bufs), info) in keys.iter().zip(items).zip(infos) {
            let have = parts::total_len(&bufs);
            let info = info.and_then(|info| {
                let n = info.size as usize;
                if have < n {
                    return Err(Error::invalid(format!(
                        "buffer of {have} bytes is smaller than object {k:?} of {n} bytes"
                    )));
                }
                if exact && have != n {
                    return Err(Error::invalid(format!(
                        "object {k:?} holds {n} bytes but its parts hold {have}; the parts \
                         must add up to the object's size"
                    )));
                }
                Ok(info)
            });
            let n = info.as_ref().map_or(0, |i| i.size as usize);
            sizes.push(n);
            slices.push(parts::truncate(bufs, n));
            infos_ok.push(info);
        }
        let done = self.batch_read(keys, infos_ok, &cached, slices).await;
        Ok(done
            .into_iter()
            .zip(sizes)
            .map(|(r, n)| r.map(|_| n))
            .collect())
    }

    /// Reads a batch into `bufs` (each exactly the object's size). Objects
    /// held only on SSD are read with one request per SSD agent; the rest,
    /// and any batched read that failed, go replica by replica.
    async fn batch_read(
        &self,
        keys: &[&str],
        infos: Vec<Result<Answer>>,
        cached: &[bool],
        mut bufs: Vec<Vec<&mut [u8]>>,
    ) -> Vec<Result<()>> {
        let mut pending: Vec<Option<Answer>> = Vec::with_capacity(keys.len());
        let mut out: Vec<Result<()>> = Vec::with_capacity(keys.len());
        for info in infos {
            match info {
                Ok(i) => {
                    pending.push(Some(i));
                    out.push(Ok(()));
                }
                Err(e) => {
                    pending.push(None);
                    out.push(Err(e));
                }
            }
        }
        // SSD-only objects: one batched request per agent.
        let ssd_only = |i: &pb::GetReplicasResponse| {
            !i.replicas.is_empty()
                && i.replicas
                    .iter()
                    .all(|r| r.kind == pb::ReplicaKind::Ssd as i32)
        };
        let mut ranges = Vec::new();
        let mut idx = Vec::new();
        for (i, p) in pending.iter().enumerate() {
            if let Some(info) = p.as_ref().filter(|i| ssd_only(i)) {
                if let Ok(r) = remote_range(&info.replicas[0]) {
                    ranges.push(r);
                    idx.push(i);
                }
            }
        }
        if !ranges.is_empty() {
            let mut slots: Vec<Option<Vec<&mut [u8]>>> =
                bufs.iter_mut().map(|b| Some(reborrow(b))).collect();
            let items: Vec<(&RemoteRange, Vec<&mut [u8]>)> = idx
                .iter()
                .zip(&ranges)
                .filter_map(|(&i, r)| slots[i].take().map(|b| (r, b)))
                .collect();
            let res = self.transport.read_many_parts(items).await;
            for (&i, r) in idx.iter().zip(res) {
                let read = pending[i].as_ref().zip(r.ok());
                if read.is_some_and(|(info, crc)| intact(info, crc, &bufs[i])) {
                    pending[i] = None; // done
                }
            }
        }
        let mut futs = Vec::new();
        let mut which = Vec::new();
        for ((i, p), mut buf) in pending.into_iter().enumerate().zip(bufs) {
            if let Some(info) = p {
                which.push(i);
                let key = keys[i];
                let cached = cached[i];
                futs.push(async move {
                    if !cached {
                        self.read_verified(key, info, &mut buf).await
                    } else if self.read_cached(key, &info, &mut buf).await {
                        Ok(())
                    } else {
                        self.reread(key, &mut buf).await
                    }
                });
            }
        }
        let rest: Vec<Result<()>> = futures::stream::iter(futs)
            .buffered(self.cfg.batch_concurrency.max(1))
            .collect()
            .await;
        for (i, r) in which.into_iter().zip(rest) {
            out[i] = r;
        }
        out
    }

    /// Where each key's bytes are, and whether that came from the location
    /// cache: one BatchGetReplicas for the keys it does not hold.
    async fn batch_replicas(&self, keys: &[&str]) -> Result<Located> {
        let mut infos: Vec<Option<Result<Answer>>> =
            keys.iter().map(|k| self.cached(k).map(Ok)).collect();
        let cached: Vec<bool> = infos.iter().map(Option::is_some).collect();
        let mut leases = Leases::new();
        let missing: Vec<&str> = keys
            .iter()
            .zip(&cached)
            .filter(|(_, &c)| !c)
            .map(|(k, _)| *k)
            .collect();
        if !missing.is_empty() {
            let asked = std::time::Instant::now();
            let ask = missing.iter().map(|k| k.to_string()).collect();
            let mut res = crate::lookups::batch_get(&self.calls, ask)
                .await?
                .into_iter();
            for (slot, key) in infos.iter_mut().zip(keys).filter(|(s, _)| s.is_none()) {
                let info = res.next().expect("one answer per missing key");
                let info = info.and_then(|i| {
                    leases.push(self.lease_ends.lease(key, &i));
                    self.check_answer(key, &i)?;
                    let i = Arc::new(i);
                    if let Some(l) = &self.locations {
                        l.insert(key, &i, asked);
                    }
                    Ok(i)
                });
                *slot = Some(info);
            }
        }
        Ok(Located {
            infos: infos
                .into_iter()
                .map(|i| i.expect("filled above"))
                .collect(),
            cached,
            leases,
        })
    }
}

/// A new list of the same buffers, for one more read into them.
/// Whether bytes read for `info` are the writer's: the crc32c the
/// transfer worked out, and the writer's BLAKE3 digest where the master
/// recorded one (`--integrity blake3`: a member cannot forge that).
fn intact(info: &pb::GetReplicasResponse, crc: u32, buf: &[&mut [u8]]) -> bool {
    let blake3 = (!info.blake3.is_empty()).then(|| parts::blake3(buf));
    matches_writer(
        info,
        Verified {
            crc32c: crc,
            blake3,
        },
    )
}

/// [`intact`] of a read that hashed its bytes itself.
fn matches_writer(info: &pb::GetReplicasResponse, v: Verified) -> bool {
    v.crc32c == info.crc32c
        && (info.blake3.is_empty() || v.blake3.is_some_and(|d| d[..] == info.blake3[..]))
}
