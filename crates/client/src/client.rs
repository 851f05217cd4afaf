use crate::locations::{spawn_reporter, Locations};
use crate::lookups::Lookups;
use crate::put_steps::PutSteps;
use crate::retry::Backoff;
use crate::status::from_status;
use futures::StreamExt;
use std::sync::Arc;
use strata_common::grpc::MasterChannel;
use strata_common::{Code, Error, Result};
use strata_proto as pb;
use strata_proto::master_client::MasterClient;
use strata_transport::frame::WriteRecord;
use strata_transport::tcp::{TcpTransport, TcpTransportConfig};
use strata_transport::{parts, RemoteRange, Transport, TransportKind};

/// Objects up to this size declare their checksum at PutStart by default
/// (`ClientConfig::announce_up_to`).
pub const ANNOUNCE_UP_TO: usize = 4 << 20;

/// How to reach the cluster and how hard to try.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Master gRPC address, `HOST:PORT`.
    pub master: String,
    pub transport: TcpTransportConfig,
    pub backoff: Backoff,
    /// Objects moved concurrently by batch calls.
    pub batch_concurrency: usize,
    /// The client (or admin, or rdma) token presented to the master.
    pub token: Option<strata_common::auth::Secret>,
    /// How object bytes move.
    pub data_transport: TransportKind,
    /// Keys whose DRAM locations are cached between reads, inside the read
    /// lease the master gave with them (0: ask the master on every read).
    pub location_cache_keys: usize,
    /// How often reads served from that cache are reported to the master
    /// (for its read-count policies and LRU).
    pub read_report_interval: std::time::Duration,
    /// Puts of objects up to this size declare their checksum at PutStart,
    /// so the master tells their nodes of the put while its bytes are
    /// written and PutEnd does not wait for the nodes again (about one
    /// round trip less). Beyond it the checksum (about 50 us per MiB) costs
    /// more than that round trip, so it is worked out while PutStart is in
    /// flight instead. 0: never declared.
    pub announce_up_to: usize,
    /// Puts whose checksum is declared ask for their nodes' receipts: the
    /// master signs the put's record into each replica, the write carries
    /// it, the node records the put as its bytes land and answers with a
    /// receipt, and PutEnd hands the receipts back instead of waiting for
    /// the nodes to hear of the commit (no node round trip at all, nor the
    /// work of one). Only where the transport's writes reach the node's CPU
    /// (TCP, objects of one chunk) and keys of at most
    /// `frame::MAX_RECORD_KEY` bytes; other puts are announced.
    pub put_receipts: bool,
    /// Single lookups, PutStart and PutEnd go on plain connections to the
    /// leader instead of gRPC when the master serves them (about a tenth of
    /// a gRPC call's latency; gRPC whenever they cannot be sent).
    pub quick_calls: bool,
    /// Times each step of every put (`Client::put_steps`): for benchmarks.
    pub put_steps: bool,
}

impl ClientConfig {
    pub fn new(master: impl Into<String>) -> Self {
        ClientConfig {
            master: master.into(),
            transport: TcpTransportConfig::default(),
            backoff: Backoff::default(),
            batch_concurrency: 16,
            token: None,
            data_transport: TransportKind::Tcp,
            location_cache_keys: 65_536,
            read_report_interval: std::time::Duration::from_millis(500),
            announce_up_to: ANNOUNCE_UP_TO,
            put_receipts: true,
            quick_calls: true,
            put_steps: false,
        }
    }

    /// Times each step of every put (`Client::put_steps`).
    pub fn with_put_steps(mut self, on: bool) -> Self {
        self.put_steps = on;
        self
    }

    /// Calls the master over gRPC only (`false`), or quickly where the
    /// master allows (`true`, the default).
    pub fn with_quick_calls(mut self, on: bool) -> Self {
        self.quick_calls = on;
        self
    }

    /// Declares the checksum at PutStart for objects up to `bytes` (0: never).
    pub fn with_announce_up_to(mut self, bytes: usize) -> Self {
        self.announce_up_to = bytes;
        self
    }

    /// Asks for nodes' receipts on puts that can carry them (`true`, the
    /// default) or announces every declared put (`false`).
    pub fn with_put_receipts(mut self, on: bool) -> Self {
        self.put_receipts = on;
        self
    }

    /// Caches the locations of up to `keys` objects (0 turns it off).
    pub fn with_location_cache(mut self, keys: usize) -> Self {
        self.location_cache_keys = keys;
        self
    }

    /// Moves object bytes over `t`.
    pub fn with_transport(mut self, t: TransportKind) -> Self {
        self.data_transport = t;
        self
    }

    /// Presents `token` to the master.
    pub fn with_token(mut self, token: Option<strata_common::auth::Secret>) -> Self {
        self.token = token;
        self
    }
}

/// Options of a put.
#[derive(Debug, Clone)]
pub struct PutOptions {
    /// Copies on distinct segments (best effort: at least one).
    pub replicas: u32,
    pub preferred_segment: Option<u64>,
    /// Place the first replica on this node (by its node id) when it has
    /// room: an engine's own embedded segment. Ignored when
    /// `preferred_segment` is set or no such node is registered.
    pub preferred_node: Option<String>,
    /// Evicted only after every unpinned object.
    pub soft_pin: bool,
    /// Never evicted (still removable).
    pub hard_pin: bool,
    /// Replace the key if it exists, atomically: readers get the old bytes
    /// or the new, never a mix (without it a present key is
    /// `AlreadyExists`).
    pub overwrite: bool,
}

impl Default for PutOptions {
    fn default() -> Self {
        PutOptions {
            replicas: 1,
            preferred_segment: None,
            preferred_node: None,
            soft_pin: false,
            hard_pin: false,
            overwrite: false,
        }
    }
}

/// The version a PutStart granted (its first replica's generation), which
/// an overwrite's PutEnd and revoke name.
fn version_of(replicas: &[pb::Replica]) -> Option<u64> {
    replicas.first()?.grant.as_ref().map(|g| g.generation)
}

/// A handle to a Strata cluster. Cheap to clone; share one per process.
#[derive(Clone)]
pub struct Client {
    master: MasterClient<MasterChannel>,
    transport: Arc<dyn Transport>,
    cfg: Arc<ClientConfig>,
    locations: Option<Arc<Locations>>,
    lookups: Lookups,
    quick: Option<Arc<crate::quick::QuickCalls>>,
    steps: Option<Arc<PutSteps>>,
    pub(crate) node_segments: Arc<crate::placement::NodeSegments>,
}

pub use strata_transport::remote_range;

/// The master's gRPC client and, where enabled, its quick-call connection
/// (both connect lazily, on the runtime of their first call).
fn master_connections(
    cfg: &ClientConfig,
    keep_alive: bool,
) -> Result<(
    MasterClient<MasterChannel>,
    Option<Arc<crate::quick::QuickCalls>>,
)> {
    let (channel, route) = strata_common::grpc::master_channel_routed_with(
        &cfg.master,
        cfg.token.as_ref(),
        keep_alive,
    )?;
    let quick = cfg
        .quick_calls
        .then(|| crate::quick::QuickCalls::new(route, cfg.token.as_ref()))
        .transpose()?
        .map(Arc::new);
    let master = MasterClient::new(channel)
        .max_decoding_message_size(strata_common::grpc::MAX_MESSAGE)
        .max_encoding_message_size(strata_common::grpc::MAX_MESSAGE);
    Ok((master, quick))
}

/// A batch's replicas, per key, and which came from the location cache.
struct Located {
    infos: Vec<Result<pb::GetReplicasResponse>>,
    cached: Vec<bool>,
}

/// An object's bytes and the tier that served them.
pub type Tiered = (Vec<u8>, Tier);

/// Which tier served a read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    Memory,
    Ssd,
}

impl Client {
    /// Creates a client. The master connection is made lazily and re-made
    /// after failures, so this succeeds even while the master restarts.
    pub async fn connect(cfg: ClientConfig) -> Result<Client> {
        let (master, quick) = master_connections(&cfg, true)?;
        let tcp = Arc::new(TcpTransport::new(cfg.transport.clone()));
        let transport: Arc<dyn Transport> = match cfg.data_transport {
            TransportKind::Tcp => tcp,
            TransportKind::Ucx => crate::ucx::transport(&cfg, master.clone(), tcp)?,
        };
        let locations = (cfg.location_cache_keys > 0).then(|| {
            let t = transport.clone();
            let refuses: crate::locations::Refuses = Arc::new(move |r: &pb::Replica| {
                remote_range(r).is_ok_and(|range| t.refuses_revoked(&range))
            });
            let l = Arc::new(Locations::new(cfg.location_cache_keys, refuses));
            spawn_reporter(Arc::downgrade(&l), master.clone(), cfg.read_report_interval);
            l
        });
        Ok(Client {
            node_segments: Arc::default(),
            steps: cfg.put_steps.then(Arc::default),
            lookups: Lookups::start(master.clone(), quick.clone()),
            quick,
            master,
            transport,
            cfg: Arc::new(cfg),
            locations,
        })
    }

    /// A client of the same cluster and configuration whose connections
    /// (master, quick calls, data plane) and background tasks belong to the
    /// runtime this is called on, sharing this one's location cache and
    /// placement view. For a caller that drives its own single-threaded
    /// runtime (a Python thread waiting on a call): its sockets wake it
    /// directly, instead of a worker of another runtime waking it, which
    /// costs a thread switch per round trip. TCP only: a UCX transport is
    /// one per process.
    pub fn sibling(&self) -> Result<Client> {
        if self.cfg.data_transport != TransportKind::Tcp {
            return Err(Error::invalid(
                "only clients of the TCP transport have siblings",
            ));
        }
        // No keep-alive pings: its connections are driven only while its
        // caller waits (see `LeaderChannel::without_keep_alive`).
        let (master, quick) = master_connections(&self.cfg, false)?;
        Ok(Client {
            node_segments: self.node_segments.clone(),
            steps: self.steps.clone(),
            lookups: Lookups::start(master.clone(), quick.clone()),
            quick,
            master,
            transport: Arc::new(TcpTransport::new(self.cfg.transport.clone())),
            cfg: self.cfg.clone(),
            locations: self.locations.clone(),
        })
    }

    /// Calls (lookups, PutStart, PutEnd) the master answered over a quick
    /// connection instead of gRPC since this client was made: for engines'
    /// own metrics.
    pub fn quick_calls(&self) -> u64 {
        self.quick.as_ref().map_or(0, |q| q.answered())
    }

    /// Reads served from the location cache (no master round trip) since
    /// this client was made: for engines' own metrics.
    pub fn cached_reads(&self) -> u64 {
        self.locations.as_ref().map_or(0, |l| l.hits())
    }

    /// Where its puts spent their time, when made with
    /// `ClientConfig::put_steps`.
    pub fn put_steps(&self) -> Option<&PutSteps> {
        self.steps.as_deref()
    }

    /// The configuration it was made with.
    pub fn config(&self) -> &ClientConfig {
        &self.cfg
    }

    fn m(&self) -> MasterClient<MasterChannel> {
        self.master.clone()
    }

    /// PutStart, quickly where the master allows (the request goes out on
    /// the first poll either way).
    async fn put_start(&self, req: pb::PutStartRequest) -> Result<pb::PutStartResponse> {
        if let Some(q) = &self.quick {
            if let Some(r) = q.put_start(&req).await {
                return r;
            }
        }
        self.m()
            .put_start(req)
            .await
            .map(tonic::Response::into_inner)
            .map_err(Error::from)
    }

    /// PutEnd, quickly where the master allows.
    async fn put_end(&self, req: pb::PutEndRequest) -> Result<pb::PutEndResponse> {
        if let Some(q) = &self.quick {
            if let Some(r) = q.put_end(&req).await {
                return r;
            }
        }
        self.m()
            .put_end(req)
            .await
            .map(tonic::Response::into_inner)
            .map_err(Error::from)
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
        // A PutEnd whose answer was lost (the master died or lost its
        // leadership) may have committed: a retry that then finds the key
        // checks whether it holds these very bytes.
        let unsure = std::sync::atomic::AtomicBool::new(false);
        let unsure = &unsure;
        let r = self
            .cfg
            .backoff
            .run(|| async {
                let req = pb::PutStartRequest {
                    key: key.to_string(),
                    size: len as u64,
                    replica_num: opts.replicas,
                    preferred_segment: opts.preferred_segment,
                    soft_pin: opts.soft_pin,
                    hard_pin: opts.hard_pin,
                    crc32c: announced,
                    receipts: announced.is_some() && self.receipts_for(key, len),
                    overwrite: opts.overwrite,
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
                let replicas = match start {
                    Ok(r) => r.replicas,
                    Err(e)
                        if e.code == Code::AlreadyExists
                            && unsure.load(std::sync::atomic::Ordering::Relaxed) =>
                    {
                        return self.same_object(key, len as u64, crc, e).await;
                    }
                    Err(e) => return Err(e),
                };
                // Every put names its version at PutEnd and revoke, so a late
                // or repeated call never ends another writer's put of the
                // key (an overwrite's is found by it, too).
                let generation = version_of(&replicas);
                let put_started = mark();
                let written = self.write_replicas(key, crc, &replicas, data).await;
                let wrote = mark();
                let receipts = match written {
                    Ok(r) => r,
                    Err(e) => {
                        self.revoke(key, generation).await;
                        // A grant refused by its node came from a leader that
                        // was deposed meanwhile (the node re-registered with a
                        // newer term's key): a new grant will do.
                        return Err(if e.code == Code::PermissionDenied {
                            e.retry_later()
                        } else {
                            e
                        });
                    }
                };
                let end = self
                    .put_end(pb::PutEndRequest {
                        key: key.to_string(),
                        crc32c: crc,
                        receipts,
                        generation,
                    })
                    .await;
                if let (Some(s), Some(crc), Some(a), Some(b), Some(c), Some(d)) =
                    (steps, crc_took, started, put_started, wrote, mark())
                {
                    s.record(crc, [a, b, c, d]);
                }
                if end.as_ref().is_err_and(|e| e.retryable()) {
                    unsure.store(true, std::sync::atomic::Ordering::Relaxed);
                    if opts.overwrite {
                        // The retry starts a new version: this one, if its
                        // PutEnd never arrived, must not hold the key
                        // (NotReady) until --put-timeout. A version that
                        // did commit is not touched by a revoke.
                        self.revoke(key, generation).await;
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
    async fn revoke(&self, key: &str, generation: Option<u64>) {
        let _ = self
            .m()
            .put_revoke(pb::PutRevokeRequest {
                key: key.to_string(),
                generation,
            })
            .await;
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
        let ranges: Vec<RemoteRange> = replicas.iter().map(remote_range).collect::<Result<_>>()?;
        if ranges.is_empty() {
            return Err(Error::internal("master granted no replica"));
        }
        let records: Vec<Option<WriteRecord>> = replicas
            .iter()
            .map(|r| {
                let mac = r.record.as_slice().try_into().ok()?;
                Some(WriteRecord {
                    key: key.to_string(),
                    crc32c,
                    mac,
                })
            })
            .collect();
        // Every write settles before the first error is returned: the
        // caller then revokes the put, freeing its ranges, and a one-sided
        // write still in flight could land in their next allocation.
        let writes = ranges
            .iter()
            .zip(&records)
            .map(|(r, rec)| self.transport.write_parts(r, data, rec.as_ref()));
        let receipts = futures::future::join_all(writes)
            .await
            .into_iter()
            .collect::<Result<Vec<_>>>()?;
        Ok(ranges
            .iter()
            .zip(receipts)
            .filter_map(|(r, receipt)| {
                Some(pb::PutReceipt {
                    segment_id: r.scope.segment_id,
                    mac: receipt?.to_vec(),
                })
            })
            .collect())
    }

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
        let info = self.lookup(key).await?;
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
        let info = self.lookup(key).await?;
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

    /// `key`'s replicas from the location cache, if a lease still covers
    /// them.
    fn cached(&self, key: &str) -> Option<Arc<pb::GetReplicasResponse>> {
        self.locations.as_ref().and_then(|l| l.get(key))
    }

    /// Asks the master where `key`'s bytes are (and caches the answer).
    async fn lookup(&self, key: &str) -> Result<pb::GetReplicasResponse> {
        self.cfg
            .backoff
            .run(|| async {
                let asked = std::time::Instant::now();
                let info = self.lookups.get(key).await?;
                if let Some(l) = &self.locations {
                    l.insert(key, &info, asked);
                }
                Ok(info)
            })
            .await
    }

    fn forget(&self, key: &str) {
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
            match self.transport.read_parts(&range, reborrow(buf)).await {
                Ok(crc) if crc == info.crc32c => {
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
        let info = self.lookup(key).await?;
        if info.size != parts::total_len(buf) as u64 {
            return Err(Error::unavailable(format!(
                "key {key:?} was replaced by an object of another size while being read; read it again"
            )));
        }
        self.read_verified(key, info, buf).await
    }

    /// Tries each replica in turn; a replica that fails or returns bytes with
    /// the wrong checksum is skipped. If every grant expired, asks again once.
    async fn read_verified(
        &self,
        key: &str,
        info: pb::GetReplicasResponse,
        buf: &mut [&mut [u8]],
    ) -> Result<()> {
        let r = self.read_replicas(key, info, buf).await;
        if r.is_err() {
            self.forget(key);
        }
        r
    }

    async fn read_replicas(
        &self,
        key: &str,
        mut info: pb::GetReplicasResponse,
        buf: &mut [&mut [u8]],
    ) -> Result<()> {
        for round in 0..2 {
            let mut last = Error::unavailable(format!("key {key:?} has no readable replica"));
            let mut expired = false;
            for r in &info.replicas {
                let range = remote_range(r)?;
                match self.transport.read_parts(&range, reborrow(buf)).await {
                    Ok(crc) if crc == info.crc32c => return Ok(()),
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
                        expired |=
                            e.code == Code::PermissionDenied && e.message.contains("expired");
                        last = e;
                    }
                }
            }
            // A replica that vanished (its SSD bucket was evicted) or expired:
            // ask the master again, once.
            if round == 0 && (expired || last.retryable() || last.code == Code::NotFound) {
                self.forget(key);
                info = self.lookup(key).await?;
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
        for attempt in 0..b.attempts.max(1) {
            let pending: Vec<usize> = (0..items.len()).filter(|&i| out[i].is_none()).collect();
            if pending.is_empty() {
                break;
            }
            let delay = b.delay(attempt);
            let last_try = attempt + 1 >= b.attempts || t0.elapsed() + delay >= b.deadline;
            let round: Vec<(&str, &[&[u8]])> = pending.iter().map(|&i| items[i]).collect();
            match self.batch_put_round(&round, opts).await {
                Ok(results) => {
                    for (&i, (r, ended)) in pending.iter().zip(results) {
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
                                None
                            }
                            r => Some(r),
                        };
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

    /// One attempt at a batch put: per item, its result and whether it got
    /// as far as PutEnd (a lost answer there leaves the outcome unknown).
    async fn batch_put_round(
        &self,
        items: &[(&str, &[&[u8]])],
        opts: &PutOptions,
    ) -> Result<Vec<(Result<()>, bool)>> {
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
                .map(|(((k, _), crc), &n)| pb::PutStartRequest {
                    key: k.to_string(),
                    size: n as u64,
                    replica_num: opts.replicas,
                    preferred_segment: opts.preferred_segment,
                    soft_pin: opts.soft_pin,
                    hard_pin: opts.hard_pin,
                    crc32c: *crc,
                    receipts: crc.is_some() && self.receipts_for(k, n),
                    overwrite: opts.overwrite,
                })
                .collect(),
        };
        let started = self
            .m()
            .batch_put_start(req)
            .await
            .map_err(Error::from)?
            .into_inner()
            .results;
        if started.len() != items.len() {
            return Err(Error::internal(
                "master answered a batch with the wrong count",
            ));
        }
        let mut futs = Vec::with_capacity(items.len());
        for (((key, data), st), crc) in items.iter().zip(started).zip(&crcs) {
            futs.push(async move {
                // Whether this put started: only ours may be revoked (a
                // refused PutStart may be another writer's key in flight).
                if let Err(e) = from_status(st.status) {
                    return (Err(e), false, None);
                }
                let generation = version_of(&st.replicas);
                // Records come only with a declared checksum.
                let crc = crc.unwrap_or_default();
                let w = self
                    .write_replicas(key, crc, &st.replicas, data)
                    .await
                    .map_err(|e| match e.code {
                        // A grant from a leader deposed meanwhile: a new
                        // grant will do (as for a single put).
                        Code::PermissionDenied => e.retry_later(),
                        _ => e,
                    });
                (w, true, generation)
            });
        }
        type Written = (Result<Vec<pb::PutReceipt>>, bool, Option<u64>);
        let mut writes: Vec<Written> = futures::stream::iter(futs)
            .buffered(self.cfg.batch_concurrency.max(1))
            .collect()
            .await;
        let mut ends = Vec::new();
        let mut revokes = pb::BatchPutRevokeRequest::default();
        for (i, (w, started, generation)) in writes.iter_mut().enumerate() {
            match w {
                Ok(receipts) => ends.push((
                    i,
                    pb::PutEndRequest {
                        key: items[i].0.to_string(),
                        crc32c: crcs[i].unwrap_or_else(|| parts::crc32c(items[i].1)),
                        receipts: std::mem::take(receipts),
                        generation: *generation,
                    },
                )),
                Err(_) if *started => {
                    revokes.keys.push(items[i].0.to_string());
                    revokes.generations.push(generation.unwrap_or(0));
                }
                Err(_) => {}
            }
        }
        let mut out: Vec<(Result<()>, bool)> = writes
            .into_iter()
            .map(|(w, _, _)| (w.map(|_| ()), false))
            .collect();
        if !revokes.keys.is_empty() {
            let _ = self.m().batch_put_revoke(revokes).await;
        }
        if !ends.is_empty() {
            let (idx, reqs): (Vec<usize>, Vec<pb::PutEndRequest>) = ends.into_iter().unzip();
            let res = self
                .m()
                .batch_put_end(pb::BatchPutEndRequest { items: reqs })
                .await
                .map_err(Error::from)
                .map(|r| r.into_inner().results);
            for (k, i) in idx.into_iter().enumerate() {
                out[i] = match &res {
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
            }
        }
        Ok(out)
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
        let Located { infos, cached } = self.batch_replicas(keys).await?;
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
        let Located { infos, cached } = self.batch_replicas(keys).await?;
        self.batch_read_new(keys, infos, &cached, alloc).await
    }

    /// Reads a located batch into buffers made by `alloc`.
    async fn batch_read_new<B: AsMut<[u8]>>(
        &self,
        keys: &[&str],
        infos: Vec<Result<pb::GetReplicasResponse>>,
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
        let Located { infos, cached } = self.batch_replicas(keys).await?;
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
        infos: Vec<Result<pb::GetReplicasResponse>>,
        cached: &[bool],
        mut bufs: Vec<Vec<&mut [u8]>>,
    ) -> Vec<Result<()>> {
        let mut pending: Vec<Option<pb::GetReplicasResponse>> = Vec::with_capacity(keys.len());
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
                let want = pending[i].as_ref().map(|p| p.crc32c);
                if matches!((r, want), (Ok(crc), Some(w)) if crc == w) {
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
        let mut infos: Vec<Option<Result<pb::GetReplicasResponse>>> = keys
            .iter()
            .map(|k| {
                let hit = self.cached(k)?;
                Some(Ok((*hit).clone()))
            })
            .collect();
        let cached: Vec<bool> = infos.iter().map(Option::is_some).collect();
        let missing: Vec<&str> = keys
            .iter()
            .zip(&cached)
            .filter(|(_, &c)| !c)
            .map(|(k, _)| *k)
            .collect();
        if !missing.is_empty() {
            let asked = std::time::Instant::now();
            let ask = missing.iter().map(|k| k.to_string()).collect();
            let mut res = crate::lookups::batch_get(&mut self.m(), ask)
                .await?
                .into_iter();
            for (slot, key) in infos.iter_mut().zip(keys).filter(|(s, _)| s.is_none()) {
                let info = res.next().expect("one answer per missing key");
                if let (Ok(i), Some(l)) = (&info, &self.locations) {
                    l.insert(key, i, asked);
                }
                *slot = Some(info);
            }
        }
        Ok(Located {
            infos: infos
                .into_iter()
                .map(|i| i.expect("filled above"))
                .collect(),
            cached,
        })
    }

    #[tracing::instrument(name = "strata.exists", skip_all, fields(key = key))]
    pub async fn exists(&self, key: &str) -> Result<bool> {
        self.cfg
            .backoff
            .run(|| async {
                let r = self
                    .m()
                    .exists(pb::ExistsRequest {
                        key: key.to_string(),
                    })
                    .await;
                Ok(r.map_err(Error::from)?.into_inner().exists)
            })
            .await
    }

    /// Removes `key`; refused while a reader holds a lease unless `force`.
    /// Retried through a failover: a retry that finds the key gone after
    /// an attempt whose outcome is unknown counts as removed.
    #[tracing::instrument(name = "strata.remove", skip_all, fields(key = key, force = force))]
    pub async fn remove(&self, key: &str, force: bool) -> Result<()> {
        // Before and after: a lookup that raced the remove may have cached
        // the old location meanwhile.
        self.forget(key);
        let r = self.remove_once(key, force).await;
        self.forget(key);
        r
    }

    async fn remove_once(&self, key: &str, force: bool) -> Result<()> {
        let ambiguous = std::sync::atomic::AtomicBool::new(false);
        let ambiguous = &ambiguous;
        self.cfg
            .backoff
            .run(|| async {
                let r = self
                    .m()
                    .remove(pb::RemoveRequest {
                        key: key.to_string(),
                        force,
                    })
                    .await
                    .map_err(Error::from);
                match r {
                    Ok(_) => Ok(()),
                    Err(e)
                        if e.code == Code::NotFound
                            && ambiguous.load(std::sync::atomic::Ordering::Relaxed) =>
                    {
                        Ok(())
                    }
                    Err(e) => {
                        // Not a follower's refusal: the call may have run.
                        if e.retryable() && e.code != Code::NotLeader {
                            ambiguous.store(true, std::sync::atomic::Ordering::Relaxed);
                        }
                        Err(e)
                    }
                }
            })
            .await
    }

    /// Removes every committed object (leased ones unless `force`).
    /// Returns (removed, skipped).
    pub async fn remove_all(&self, force: bool) -> Result<(u64, u64)> {
        if let Some(l) = &self.locations {
            l.clear();
        }
        let r = self
            .m()
            .remove_all(pb::RemoveAllRequest { force })
            .await
            .map_err(Error::from)?
            .into_inner();
        Ok((r.removed, r.skipped))
    }

    /// Lists keys with `prefix`, in key order, following pages.
    pub async fn list(&self, prefix: &str, max: usize) -> Result<Vec<pb::ObjectSummary>> {
        let mut out: Vec<pb::ObjectSummary> = Vec::new();
        loop {
            let page = (max - out.len()).min(10_000) as u32;
            let r = self
                .m()
                .list(pb::ListRequest {
                    prefix: prefix.to_string(),
                    limit: page,
                    start_after: out.last().map(|o| o.key.clone()).unwrap_or_default(),
                })
                .await
                .map_err(Error::from)?
                .into_inner();
            out.extend(r.objects);
            if !r.truncated || out.len() >= max {
                return Ok(out);
            }
        }
    }

    pub async fn stat(&self) -> Result<pb::StatResponse> {
        Ok(self
            .m()
            .stat(pb::StatRequest {})
            .await
            .map_err(Error::from)?
            .into_inner())
    }

    pub async fn inspect(&self, key: &str) -> Result<pb::InspectResponse> {
        let r = self
            .m()
            .inspect(pb::InspectRequest {
                key: key.to_string(),
            })
            .await;
        Ok(r.map_err(Error::from)?.into_inner())
    }

    /// Raw access to the master API, for tools and tests.
    pub fn master_client(&self) -> MasterClient<MasterChannel> {
        self.m()
    }

    pub fn transport(&self) -> Arc<dyn Transport> {
        self.transport.clone()
    }
}

/// A new list of the same buffers, for one more read into them.
fn reborrow<'b>(bufs: &'b mut [&mut [u8]]) -> Vec<&'b mut [u8]> {
    bufs.iter_mut().map(|b| &mut **b).collect()
}
