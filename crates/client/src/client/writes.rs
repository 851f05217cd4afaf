//! The write side of [`Client`]: puts (single, batched, of parts), their
//! PutStart / PutEnd round trips, replica writes with records and
//! receipts, and the retries of an ambiguous PutEnd.

use super::{Client, PutOptions};
use crate::status::from_status;
use strata_common::{Code, Error, Result};
use strata_proto as pb;
use strata_transport::frame::WriteRecord;
use strata_transport::{parts, remote_range, RemoteRange, WriteItem};

/// The version a PutStart granted (its first replica's generation), which
/// an overwrite's PutEnd and revoke name.
fn version_of(replicas: &[pb::Replica]) -> Option<u64> {
    replicas.first()?.grant.as_ref().map(|g| g.generation)
}

/// An object a put writes: its key, declared checksum (0 when none),
/// where the master placed it, its bytes, and whether its PutStart started.
struct Object<'a> {
    key: &'a str,
    crc32c: u32,
    replicas: &'a [pb::Replica],
    data: &'a [&'a [u8]],
    ok: bool,
}

/// Where an object's replicas go, and the record each carries.
type Plan = (Vec<RemoteRange>, Vec<Option<WriteRecord>>);

/// Whether a PutStart item's status says it started.
fn started_ok(status: &Option<pb::Status>) -> bool {
    status.as_ref().is_none_or(|s| s.code == 0)
}

/// Whether a PutStart's answer asks PutEnd for the object's BLAKE3 digest.
fn wants_digest(integrity: i32) -> bool {
    integrity == pb::Integrity::Blake3 as i32
}

impl Client {
    /// PutStart, quickly where the master allows (the request goes out on
    /// the first poll either way).
    async fn put_start(&self, req: pb::PutStartRequest) -> Result<pb::PutStartResponse> {
        let r = self.put_start_once(req).await;
        // Tests: the master acted, its answer lost (a leadership that lapsed
        // while the call ran answers so).
        fail::fail_point!("client::put-start-answer-lost", |_| Err(
            Error::unavailable("PutStart's answer lost (failpoint)")
        ));
        r
    }

    async fn put_start_once(&self, req: pb::PutStartRequest) -> Result<pb::PutStartResponse> {
        self.calls.put_start(req).await
    }

    /// PutEnd, quickly where the master allows.
    async fn put_end(&self, req: pb::PutEndRequest) -> Result<pb::PutEndResponse> {
        self.calls.put_end(req).await
    }

    /// Stores `data` under `key`. Fails with `AlreadyExists` if the key is
    /// present, `NoSpace` when the cluster cannot make room.
    pub async fn put(&self, key: &str, data: &[u8], opts: &PutOptions) -> Result<()> {
        self.put_parts(key, &[data], opts).await
    }

    /// Stores the concatenation of `parts` under `key` as one object (vLLM
    /// stores a block from one slice per layer), sent from the parts
    /// themselves: they are never joined into one buffer.
    #[tracing::instrument(name = "strata.put", skip_all, fields(key = key, size = parts::total_len(data)))]
    pub async fn put_parts(&self, key: &str, data: &[&[u8]], opts: &PutOptions) -> Result<()> {
        let opts = &*self.placed(opts).await;
        let len = parts::total_len(data);
        // Declared at PutStart when small enough (`announce_up_to`);
        // otherwise worked out while the first PutStart is in flight. Kept
        // for retries.
        let steps = self.steps.as_deref();
        let mark = || steps.map(|_| std::time::Instant::now());
        let before_crc = mark();
        let crc = std::sync::OnceLock::new();
        if len <= self.cfg.announce_up_to {
            let _ = crc.set(parts::crc32c(data));
        }
        let crc_took = before_crc.map(|t| t.elapsed());
        let announced = crc.get().copied();
        let crc = &crc;
        // The writer's BLAKE3 digest, when the master asks for one
        // (`--integrity blake3`); kept for retries like the checksum.
        let digest = std::sync::OnceLock::new();
        let digest = &digest;
        // A PutEnd whose answer was lost (the master died or lost its
        // leadership) may have committed: a retry that then finds the key
        // checks whether it holds these very bytes.
        let unsure = std::sync::atomic::AtomicBool::new(false);
        let unsure = &unsure;
        // A put whose bytes are written and whose PutEnd failed retryably
        // (lost on its way, or its answer lost) is ended by sending that
        // PutEnd again: the master commits a put once and answers a repeat
        // of the same bytes' PutEnd as done. Starting over instead found
        // the key "still being written" by this very put until
        // --put-timeout reclaimed it.
        let pending_end: std::sync::Mutex<Option<pb::PutEndRequest>> = Default::default();
        let pending_end = &pending_end;
        // An earlier attempt started a put of the key whose revoke may not
        // have reached the master (it is best effort): a retry's PutStart
        // then finds the key "being written" by this very call, which is
        // no reason to give up (found by the nemesis, tests/nemesis.rs).
        let started_once = std::sync::atomic::AtomicBool::new(false);
        let started_once = &started_once;
        // Names this put to the master across its retries: a PutStart whose
        // answer was lost, sent again, gets the same put back while it is
        // being written (found by the HA nemesis: a leadership that lapsed
        // while the call ran turned its answer into NotLeader after it had
        // acted, and the retry met the key "being written" by itself).
        let attempt = new_attempt();
        let r = self
            .cfg
            .backoff
            .run(|| async {
                let again = pending_end.lock().unwrap_or_else(|p| p.into_inner()).take();
                if let Some(end) = again {
                    match self.put_end_unless_lost(end.clone()).await {
                        Ok(_) => return Ok(()),
                        Err(e) if e.retryable() => {
                            *pending_end.lock().unwrap_or_else(|p| p.into_inner()) = Some(end);
                            return Err(e);
                        }
                        // The put is gone (its --put-timeout, a new
                        // leader): start over, and a key found committed
                        // is checked for these bytes.
                        Err(_) => {}
                    }
                }
                let req = pb::PutStartRequest {
                    attempt,
                    key: key.to_string(),
                    size: len as u64,
                    replica_num: opts.replicas,
                    preferred_segment: opts.preferred_segment,
                    soft_pin: opts.soft_pin,
                    hard_pin: opts.hard_pin,
                    crc32c: announced,
                    receipts: announced.is_some() && self.receipts_for(key, len),
                    overwrite: opts.overwrite,
                    bind: true,
                };
                let started = mark();
                let start = self.put_start(req);
                let start = match crc.get() {
                    Some(_) => start.await,
                    // The request goes out on its first poll; the checksum
                    // is worked out meanwhile instead of before it.
                    None => {
                        let (r, c) = tokio::join!(start, async { parts::crc32c(data) });
                        let _ = crc.set(c);
                        r
                    }
                };
                let crc = *crc.get().expect("set by the first attempt");
                let (replicas, token, integrity) = match start {
                    Ok(r) => (r.replicas, r.put_token, r.integrity),
                    // Ours, maybe: a committed key with these very bytes is
                    // done; one still being written (NotReady) is retried
                    // until --put-timeout reclaims it; other bytes are the
                    // final AlreadyExists.
                    Err(e)
                        if e.code == Code::AlreadyExists
                            && (unsure.load(std::sync::atomic::Ordering::Relaxed)
                                || started_once.load(std::sync::atomic::Ordering::Relaxed)) =>
                    {
                        return self.same_object(key, len as u64, crc, e).await;
                    }
                    Err(e) => return Err(e),
                };
                started_once.store(true, std::sync::atomic::Ordering::Relaxed);
                // Every put names its version at PutEnd and revoke, so a late
                // or repeated call never ends another writer's put of the
                // key (an overwrite's is found by it, too).
                let generation = version_of(&replicas);
                let put_started = mark();
                let hash = wants_digest(integrity) && digest.get().is_none();
                let (written, d) = self.write_hashing(key, crc, &replicas, data, hash).await;
                if let Some(d) = d {
                    let _ = digest.set(d);
                }
                let wrote = mark();
                let receipts = match written {
                    Ok(r) => r,
                    Err(e) => {
                        self.revoke(key, generation, &token).await;
                        return Err(super::placement_gone_stale(e));
                    }
                };
                let end_req = pb::PutEndRequest {
                    key: key.to_string(),
                    crc32c: crc,
                    receipts,
                    generation,
                    put_token: token.clone(),
                    blake3: match wants_digest(integrity) {
                        true => digest.get().map_or_else(Vec::new, |d| d.to_vec()),
                        false => Vec::new(),
                    },
                };
                let end = self.put_end_unless_lost(end_req.clone()).await;
                if let (Some(s), Some(crc), Some(a), Some(b), Some(c), Some(d)) =
                    (steps, crc_took, started, put_started, wrote, mark())
                {
                    s.record(crc, [a, b, c, d]);
                }
                let end = match end {
                    // The master dropped the put before its end (a node of
                    // it left the cluster, or --put-timeout passed): nothing
                    // was committed, and a new put will do (found by the
                    // nemesis).
                    Err(e) if e.code == Code::NotFound => return Err(e.retry_later()),
                    end => end,
                };
                if end.as_ref().is_err_and(|e| e.retryable()) {
                    unsure.store(true, std::sync::atomic::Ordering::Relaxed);
                    if opts.overwrite {
                        // The retry starts a new version: this one, if its
                        // PutEnd never arrived, must not hold the key
                        // (NotReady) until --put-timeout. A version that
                        // did commit is not touched by a revoke.
                        self.revoke(key, generation, &token).await;
                    } else {
                        *pending_end.lock().unwrap_or_else(|p| p.into_inner()) = Some(end_req);
                    }
                }
                end.map(|_| ())
            })
            .await;
        if opts.overwrite {
            // This client's cached location of the replaced version (its
            // next read asks the master, so it reads its own write).
            self.forget(key);
        }
        r
    }

    /// Revokes this client's put of `key` (an overwrite's by its
    /// `generation`), best effort: what is not revoked, --put-timeout
    /// reclaims.
    async fn revoke(&self, key: &str, generation: Option<u64>, put_token: &[u8]) {
        let _ = self
            .m()
            .put_revoke(pb::PutRevokeRequest {
                key: key.to_string(),
                generation,
                put_token: put_token.to_vec(),
            })
            .await;
    }

    /// `put_end`, through the failpoints (tests) that make its outcome
    /// unknown to the caller: `client::put-end-unsent` (lost on its way)
    /// and `client::put-end-answer-lost` (the master acted, its answer lost).
    async fn put_end_unless_lost(&self, req: pb::PutEndRequest) -> Result<pb::PutEndResponse> {
        fail::fail_point!("client::put-end-unsent", |_| Err(Error::unavailable(
            "PutEnd lost on its way (failpoint)"
        )));
        let end = self.put_end(req).await;
        fail::fail_point!("client::put-end-answer-lost", |_| Err(Error::unavailable(
            "PutEnd's answer lost (failpoint)"
        )));
        end
    }

    /// After an ambiguous PutEnd: the key exists; is it our put?
    async fn same_object(&self, key: &str, size: u64, crc: u32, exists: Error) -> Result<()> {
        // One call: the put's own backoff retries (not a second one inside).
        let r = self
            .m()
            .get_replicas(pb::GetReplicasRequest {
                key: key.to_string(),
            })
            .await
            .map_err(Error::from)?
            .into_inner();
        // Nothing is read: the lookup's lease ends at once.
        drop(self.lease_ends.lease(key, &r));
        if r.size == size && r.crc32c == crc {
            Ok(())
        } else {
            Err(exists)
        }
    }

    /// Whether a put of `len` bytes under `key` can ask for its nodes'
    /// receipts (`ClientConfig::put_receipts`).
    fn receipts_for(&self, key: &str, len: usize) -> bool {
        self.cfg.put_receipts
            && key.len() <= strata_transport::frame::MAX_RECORD_KEY
            && self.transport.records_writes(len)
    }

    /// `write_replicas`, and with `hash` the BLAKE3 digest of `data`,
    /// worked out while the writes wait on their sockets.
    async fn write_hashing(
        &self,
        key: &str,
        crc32c: u32,
        replicas: &[pb::Replica],
        data: &[&[u8]],
        hash: bool,
    ) -> (Result<Vec<pb::PutReceipt>>, Option<[u8; 32]>) {
        let write = self.write_replicas(key, crc32c, replicas, data);
        if !hash {
            return (write.await, None);
        }
        let (w, d) = tokio::join!(write, async { parts::blake3(data) });
        (w, Some(d))
    }

    /// Writes the concatenation of `data` to every replica; those the
    /// master gave a record go with it, and their nodes' receipts come back
    /// for PutEnd.
    async fn write_replicas(
        &self,
        key: &str,
        crc32c: u32,
        replicas: &[pb::Replica],
        data: &[&[u8]],
    ) -> Result<Vec<pb::PutReceipt>> {
        let one = Object {
            key,
            crc32c,
            replicas,
            data,
            ok: true,
        };
        let mut r = self.write_objects(std::slice::from_ref(&one)).await;
        r.pop()
            .unwrap_or_else(|| Err(Error::internal("write lost its object")))
    }

    /// [`Client::write_replicas`] for each object that started (`ok`), in
    /// one call to the transport: one result per such object, in order.
    async fn write_objects(&self, objects: &[Object<'_>]) -> Vec<Result<Vec<pb::PutReceipt>>> {
        // Per started object, its ranges and records, or why it has none.
        let mut plans: Vec<Result<Plan>> = Vec::new();
        for o in objects.iter().filter(|o| o.ok) {
            let ranges = o
                .replicas
                .iter()
                .map(remote_range)
                .collect::<Result<Vec<_>>>()
                .and_then(|r| match r.is_empty() {
                    true => Err(Error::internal("master granted no replica")),
                    false => Ok(r),
                });
            let records = o
                .replicas
                .iter()
                .map(|r| {
                    let mac = r.record.as_slice().try_into().ok()?;
                    Some(WriteRecord {
                        key: o.key.to_string(),
                        crc32c: o.crc32c,
                        mac,
                    })
                })
                .collect();
            plans.push(ranges.map(|r| (r, records)));
        }
        let started: Vec<&Object<'_>> = objects.iter().filter(|o| o.ok).collect();
        let items: Vec<WriteItem<'_>> = plans
            .iter()
            .zip(&started)
            .filter_map(|(p, o)| Some((p.as_ref().ok()?, o)))
            .flat_map(|((ranges, records), o)| {
                ranges.iter().zip(records).map(|(dst, rec)| WriteItem {
                    dst,
                    parts: o.data,
                    record: rec.as_ref(),
                })
            })
            .collect();
        // Every write settles before any result is returned: the caller
        // then revokes a failed put, freeing its ranges, and a one-sided
        // write still in flight could land in their next allocation.
        let mut receipts = self.transport.write_many_parts(items).await.into_iter();
        plans
            .into_iter()
            .map(|p| {
                let (ranges, _) = p?;
                let mut out = Vec::with_capacity(ranges.len());
                let mut first_err = None;
                for r in &ranges {
                    match receipts.next() {
                        Some(Ok(Some(mac))) => out.push(pb::PutReceipt {
                            segment_id: r.scope.segment_id,
                            mac: mac.to_vec(),
                        }),
                        Some(Ok(None)) => {}
                        Some(Err(e)) => {
                            first_err.get_or_insert(e);
                        }
                        None => {
                            first_err.get_or_insert(Error::internal("batch write lost a replica"));
                        }
                    }
                }
                match first_err {
                    Some(e) => Err(e),
                    None => Ok(out),
                }
            })
            .collect()
    }

    /// Puts many objects with one PutStart and one PutEnd round trip.
    /// Returns one result per item, in order. Items that fail retryably (a
    /// failover) are put again, with backoff, up to the client's deadline;
    /// one whose PutEnd answer was lost counts as put if the key then holds
    /// its bytes (as for [`Client::put`]).
    pub async fn batch_put(
        &self,
        items: &[(&str, &[u8])],
        opts: &PutOptions,
    ) -> Result<Vec<Result<()>>> {
        let items: Vec<(&str, &[&[u8]])> = items
            .iter()
            .map(|(k, d)| (*k, std::slice::from_ref(d)))
            .collect();
        self.batch_put_parts(&items, opts).await
    }

    /// [`Client::batch_put`] of objects made of parts (each the concatenation
    /// of its slices, sent from them).
    #[tracing::instrument(name = "strata.batch_put", skip_all, fields(items = items.len()))]
    pub async fn batch_put_parts(
        &self,
        items: &[(&str, &[&[u8]])],
        opts: &PutOptions,
    ) -> Result<Vec<Result<()>>> {
        let opts = &*self.placed(opts).await;
        let b = self.cfg.backoff;
        let t0 = tokio::time::Instant::now();
        let mut out: Vec<Option<Result<()>>> = vec![None; items.len()];
        // Per item: a PutEnd whose outcome is unknown.
        let mut unsure = vec![false; items.len()];
        // Per item: that PutEnd, sent again before anything starts over
        // (as a single put does; the master answers a repeat as done).
        let mut again: Vec<Option<pb::PutEndRequest>> = vec![None; items.len()];
        // Each item's name across rounds (`PutStartRequest.attempt`).
        let attempts: Vec<u64> = items.iter().map(|_| new_attempt()).collect();
        for attempt in 0..b.attempts.max(1) {
            let delay = b.delay(attempt);
            let last_try = attempt + 1 >= b.attempts || t0.elapsed() + delay >= b.deadline;
            self.end_again(&mut again, &mut out, last_try).await;
            let pending: Vec<usize> = (0..items.len())
                .filter(|&i| out[i].is_none() && again[i].is_none())
                .collect();
            if pending.is_empty() && out.iter().all(Option::is_some) {
                break;
            }
            let round: Vec<(&str, &[&[u8]])> = pending.iter().map(|&i| items[i]).collect();
            let round_attempts: Vec<u64> = pending.iter().map(|&i| attempts[i]).collect();
            let started = match round.is_empty() {
                // Only PutEnds sent again this time, none answered yet.
                true => Ok(Vec::new()),
                false => self.batch_put_round(&round, &round_attempts, opts).await,
            };
            match started {
                Ok(results) => {
                    // Overwrites whose PutEnd's outcome is unknown: their
                    // version is revoked (one that committed is untouched)
                    // and the retry starts a new one, as a single put's.
                    let mut revokes = pb::BatchPutRevokeRequest::default();
                    for (&i, (r, ended, end)) in pending.iter().zip(results) {
                        let (key, data) = items[i];
                        let r = match r {
                            Err(e) if e.code == Code::AlreadyExists && unsure[i] => {
                                let crc = parts::crc32c(data);
                                self.same_object(key, parts::total_len(data) as u64, crc, e)
                                    .await
                            }
                            r => r,
                        };
                        out[i] = match r {
                            Err(e) if e.retryable() && !last_try => {
                                unsure[i] |= ended;
                                match end.filter(|_| ended) {
                                    Some(end) if opts.overwrite => {
                                        revokes.keys.push(end.key);
                                        revokes.generations.push(end.generation.unwrap_or(0));
                                        revokes.put_tokens.push(end.put_token);
                                    }
                                    end => again[i] = end,
                                }
                                None
                            }
                            r => Some(r),
                        };
                    }
                    if !revokes.keys.is_empty() {
                        let _ = self.m().batch_put_revoke(revokes).await;
                    }
                }
                // Nothing of this round started (the batch PutStart failed).
                Err(e) if e.retryable() && !last_try => {}
                // The first attempt: nothing of the batch happened.
                Err(e) if attempt == 0 => return Err(e),
                Err(e) => {
                    for &i in &pending {
                        out[i] = Some(Err(e.clone()));
                    }
                }
            }
            if out.iter().any(Option::is_none) {
                tracing::debug!(attempt, "retrying part of a batch put");
                tokio::time::sleep(delay).await;
            }
        }
        if opts.overwrite {
            for (key, _) in items {
                self.forget(key);
            }
        }
        Ok(out
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(Error::unavailable("batch put gave up retrying"))))
            .collect())
    }

    /// Sends again the PutEnds in `again` (outcome unknown): those the
    /// master answers are done, those that failed for good start over (a
    /// key then found committed is checked for its bytes), the rest wait for
    /// the next attempt, or fail on the last.
    async fn end_again(
        &self,
        again: &mut [Option<pb::PutEndRequest>],
        out: &mut [Option<Result<()>>],
        last_try: bool,
    ) {
        let idx: Vec<usize> = (0..again.len()).filter(|&i| again[i].is_some()).collect();
        if idx.is_empty() {
            return;
        }
        let items = idx.iter().filter_map(|&i| again[i].clone()).collect();
        let res = self
            .batch_put_end_unless_lost(pb::BatchPutEndRequest { items })
            .await;
        for (k, &i) in idx.iter().enumerate() {
            let r = match &res {
                Ok(results) if results.len() == idx.len() => from_status(Some(results[k].clone())),
                Ok(_) => Err(Error::internal(
                    "master answered a batch with the wrong count",
                )),
                Err(e) => Err(e.clone()),
            };
            match r {
                Ok(()) => {
                    out[i] = Some(Ok(()));
                    again[i] = None;
                }
                Err(e) if e.retryable() => {
                    if last_try {
                        out[i] = Some(Err(e));
                        again[i] = None;
                    }
                }
                Err(_) => again[i] = None,
            }
        }
    }

    /// `BatchPutEnd`, through the failpoint (tests) that loses it on its
    /// way: `client::batch-put-end-unsent`.
    async fn batch_put_end_unless_lost(
        &self,
        req: pb::BatchPutEndRequest,
    ) -> Result<Vec<pb::Status>> {
        fail::fail_point!("client::batch-put-end-unsent", |_| Err(Error::unavailable(
            "BatchPutEnd lost on its way (failpoint)"
        )));
        Ok(self.calls.batch_put_end(req).await?.results)
    }

    /// One attempt at a batch put: per item, its result, whether it got as
    /// far as PutEnd (a lost answer there leaves the outcome unknown), and
    /// that PutEnd.
    async fn batch_put_round(
        &self,
        items: &[(&str, &[&[u8]])],
        attempts: &[u64],
        opts: &PutOptions,
    ) -> Result<Vec<(Result<()>, bool, Option<pb::PutEndRequest>)>> {
        let lens: Vec<usize> = items.iter().map(|(_, d)| parts::total_len(d)).collect();
        // Declared at PutStart where small enough (`announce_up_to`).
        let crcs: Vec<Option<u32>> = items
            .iter()
            .zip(&lens)
            .map(|((_, d), &n)| (n <= self.cfg.announce_up_to).then(|| parts::crc32c(d)))
            .collect();
        let req = pb::BatchPutStartRequest {
            items: items
                .iter()
                .zip(&crcs)
                .zip(&lens)
                .zip(attempts)
                .map(|((((k, _), crc), &n), &attempt)| pb::PutStartRequest {
                    attempt,
                    key: k.to_string(),
                    size: n as u64,
                    replica_num: opts.replicas,
                    preferred_segment: opts.preferred_segment,
                    soft_pin: opts.soft_pin,
                    hard_pin: opts.hard_pin,
                    crc32c: *crc,
                    receipts: crc.is_some() && self.receipts_for(k, n),
                    overwrite: opts.overwrite,
                    bind: true,
                })
                .collect(),
        };
        let started = self.calls.batch_put_start(req).await?.results;
        if started.len() != items.len() {
            return Err(Error::internal(
                "master answered a batch with the wrong count",
            ));
        }
        // Every object's writes go to the transport at once, which sends
        // those bound for one node back to back (`write_many_parts`).
        let objects: Vec<Object<'_>> = items
            .iter()
            .zip(&started)
            .zip(&crcs)
            .map(|(((key, data), st), crc)| Object {
                key,
                // Records come only with a declared checksum.
                crc32c: crc.unwrap_or_default(),
                replicas: &st.replicas,
                data,
                ok: started_ok(&st.status),
            })
            .collect();
        // Digests are worked out while the writes are on their way (the
        // first poll sends what the sockets take), for started puts only.
        let digests = async {
            started
                .iter()
                .zip(items)
                .map(|(st, (_, data))| {
                    if started_ok(&st.status) && wants_digest(st.integrity) {
                        parts::blake3(data).to_vec()
                    } else {
                        Vec::new()
                    }
                })
                .collect::<Vec<_>>()
        };
        let (written, digests) = tokio::join!(self.write_objects(&objects), digests);
        drop(objects);
        let mut written = written.into_iter();
        type Written = (
            Result<Vec<pb::PutReceipt>>,
            bool,
            Option<u64>,
            Vec<u8>,
            Vec<u8>,
        );
        let mut writes: Vec<Written> = Vec::with_capacity(items.len());
        for (st, digest) in started.into_iter().zip(digests) {
            // Whether this put started: only ours may be revoked (a
            // refused PutStart may be another writer's key in flight).
            if let Err(e) = from_status(st.status) {
                writes.push((Err(e), false, None, Vec::new(), Vec::new()));
                continue;
            }
            let w = written
                .next()
                .unwrap_or_else(|| Err(Error::internal("batch write lost an object")));
            let w = w.map_err(super::placement_gone_stale);
            writes.push((w, true, version_of(&st.replicas), st.put_token, digest));
        }
        let mut ends = Vec::new();
        let mut revokes = pb::BatchPutRevokeRequest::default();
        for (i, (w, started, generation, token, digest)) in writes.iter_mut().enumerate() {
            match w {
                Ok(receipts) => ends.push((
                    i,
                    pb::PutEndRequest {
                        key: items[i].0.to_string(),
                        crc32c: crcs[i].unwrap_or_else(|| parts::crc32c(items[i].1)),
                        receipts: std::mem::take(receipts),
                        generation: *generation,
                        put_token: std::mem::take(token),
                        blake3: std::mem::take(digest),
                    },
                )),
                Err(_) if *started => {
                    revokes.keys.push(items[i].0.to_string());
                    revokes.generations.push(generation.unwrap_or(0));
                    revokes.put_tokens.push(std::mem::take(token));
                }
                Err(_) => {}
            }
        }
        let mut out: Vec<(Result<()>, bool, Option<pb::PutEndRequest>)> = writes
            .into_iter()
            .map(|(w, ..)| (w.map(|_| ()), false, None))
            .collect();
        if !revokes.keys.is_empty() {
            let _ = self.m().batch_put_revoke(revokes).await;
        }
        if !ends.is_empty() {
            let (idx, reqs): (Vec<usize>, Vec<pb::PutEndRequest>) = ends.into_iter().unzip();
            let res = self
                .batch_put_end_unless_lost(pb::BatchPutEndRequest {
                    items: reqs.clone(),
                })
                .await;
            for (k, (i, req)) in idx.into_iter().zip(reqs).enumerate() {
                let (r, ended) = match &res {
                    Ok(res) => (
                        res.get(k).cloned().map_or_else(
                            || {
                                Err(Error::internal(
                                    "master answered a batch with the wrong count",
                                ))
                            },
                            |st| from_status(Some(st)),
                        ),
                        true,
                    ),
                    Err(e) => (Err(e.clone()), true),
                };
                out[i] = (r, ended, Some(req));
            }
        }
        Ok(out)
    }
}

/// A fresh name for one logical put (`PutStartRequest.attempt`): random,
/// never 0 (which means none).
fn new_attempt() -> u64 {
    rand::random::<u64>() | 1
}
