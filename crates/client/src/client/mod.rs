//! [`Client`]: a handle to a cluster, its configuration and connections;
//! puts live in `writes.rs`, gets in `reads.rs`.

mod reads;
mod writes;

use crate::lease_ends::LeaseEnds;
use crate::locations::{spawn_reporter, Locations};
use crate::lookups::Lookups;
use crate::put_steps::PutSteps;
use crate::retry::Backoff;
use std::sync::Arc;
use strata_common::grpc::MasterChannel;
use strata_common::{Code, Error, Result};
use strata_proto as pb;
use strata_proto::master_client::MasterClient;
use strata_transport::tcp::{TcpTransport, TcpTransportConfig};
use strata_transport::{Transport, TransportKind};

/// Objects up to this size declare their checksum at PutStart by default
/// (`ClientConfig::announce_up_to`).
pub const ANNOUNCE_UP_TO: usize = 4 << 20;

/// Default `ClientConfig::max_object_bytes`: far beyond any KV block, far
/// below what would exhaust a host.
pub const MAX_OBJECT_BYTES: u64 = 16 << 30;

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
    /// Tells the master when each read is done, so its lease ends with it
    /// (`lease_ends.rs`): objects just read are evictable again at once,
    /// and eviction keeps its LRU order. Off, every read's lease runs the
    /// master's `--lease-ttl`: objects stay where a reader found them for
    /// that long (unforced removes of them are refused meanwhile), at the
    /// cost of eviction working around them.
    pub end_leases: bool,
    /// The largest object a master's answer may describe: a lookup naming a
    /// larger size (a broken or hostile master) is refused before any
    /// buffer is made for it.
    pub max_object_bytes: u64,
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
            end_leases: true,
            max_object_bytes: MAX_OBJECT_BYTES,
        }
    }

    /// Ends each read's lease when the read is done (`true`, the default)
    /// or leaves it to the master's TTL (`false`).
    pub fn with_end_leases(mut self, on: bool) -> Self {
        self.end_leases = on;
        self
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

/// A handle to a Strata cluster. Cheap to clone; share one per process.
#[derive(Clone)]
pub struct Client {
    transport: Arc<dyn Transport>,
    cfg: Arc<ClientConfig>,
    locations: Option<Arc<Locations>>,
    lookups: Lookups,
    lease_ends: LeaseEnds,
    /// The master, quickly where it allows (`crate::master_calls`).
    calls: crate::MasterCalls,
    steps: Option<Arc<PutSteps>>,
    pub(crate) node_segments: Arc<crate::placement::NodeSegments>,
}

pub use strata_transport::remote_range;

/// A read or write refused by a node because the master's placement went
/// stale under it: the node refused the grant (expired, or signed by a
/// leader deposed meanwhile: the node registered again under a newer term's
/// key), or it no longer serves the segment (it restarted and registered
/// again since the master chose it). Asking the master again (a lookup, a
/// new PutStart) gets a fresh placement, so both are retryable.
pub(super) fn placement_gone_stale(e: Error) -> Error {
    match e.code {
        Code::PermissionDenied | Code::NotFound => e.retry_later(),
        _ => e,
    }
}

/// The master's gRPC client and, where enabled, its quick-call connections
/// (both connect lazily, on the runtime of their first call).
fn master_connections(cfg: &ClientConfig) -> Result<crate::MasterCalls> {
    let (channel, route) =
        strata_common::grpc::master_channel_routed(&cfg.master, cfg.token.as_ref())?;
    let master = MasterClient::new(channel)
        .max_decoding_message_size(strata_common::grpc::MAX_MESSAGE)
        .max_encoding_message_size(strata_common::grpc::MAX_MESSAGE);
    crate::MasterCalls::new(
        master,
        cfg.quick_calls.then_some((route, cfg.token.as_ref())),
    )
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
        let calls = master_connections(&cfg)?;
        let master = calls.grpc();
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
        let lease_ends = if cfg.end_leases {
            LeaseEnds::start(master.clone())
        } else {
            LeaseEnds::off()
        };
        Ok(Client {
            node_segments: Arc::default(),
            steps: cfg.put_steps.then(Arc::default),
            lookups: Lookups::start(calls.clone()),
            lease_ends,
            calls,
            transport,
            cfg: Arc::new(cfg),
            locations,
        })
    }

    /// A client of the same cluster and configuration whose quick-call and
    /// data-plane connections and background tasks belong to the runtime
    /// this is called on, sharing this one's location cache and placement
    /// view. For a caller that drives its own single-threaded runtime (a
    /// Python thread waiting on a call): its sockets wake it directly,
    /// instead of a worker of another runtime waking it, which costs a
    /// thread switch per round trip. Its gRPC calls go through this one's
    /// channel: HTTP/2 connections must answer the master's keep-alive
    /// pings between calls too, and the master drops one left unanswered
    /// for 30 s (an idle thread's next call then failed on a dead
    /// connection, or waited out the call timeout). A UCX client's sibling
    /// shares its engines and routes and has TCP connections of its own
    /// (`Transport::sibling`).
    pub fn sibling(&self) -> Result<Client> {
        let transport = self.transport.sibling().ok_or_else(|| {
            Error::invalid(format!(
                "clients of the {} transport have no siblings",
                self.transport.name()
            ))
        })?;
        let calls = self.calls.sibling();
        Ok(Client {
            node_segments: self.node_segments.clone(),
            steps: self.steps.clone(),
            lookups: Lookups::start(calls.clone()),
            // Ends go from the first client's task: this one's runtime runs
            // only while its caller waits.
            lease_ends: self.lease_ends.clone(),
            calls,
            transport,
            cfg: self.cfg.clone(),
            locations: self.locations.clone(),
        })
    }

    /// Calls (lookups, PutStart, PutEnd) the master answered over a quick
    /// connection instead of gRPC since this client was made: for engines'
    /// own metrics.
    pub fn quick_calls(&self) -> u64 {
        self.calls.answered()
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
        self.calls.grpc()
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

    /// Lists keys with `prefix`, in key order, following pages (each page
    /// asked again on a retryable error, as every read-only call is).
    pub async fn list(&self, prefix: &str, max: usize) -> Result<Vec<pb::ObjectSummary>> {
        let mut out: Vec<pb::ObjectSummary> = Vec::new();
        loop {
            let req = pb::ListRequest {
                prefix: prefix.to_string(),
                limit: (max - out.len()).min(10_000) as u32,
                start_after: out.last().map(|o| o.key.clone()).unwrap_or_default(),
            };
            let r = self
                .cfg
                .backoff
                .run(|| async { Ok(self.m().list(req.clone()).await?.into_inner()) })
                .await?;
            out.extend(r.objects);
            if !r.truncated || out.len() >= max {
                return Ok(out);
            }
        }
    }

    pub async fn stat(&self) -> Result<pb::StatResponse> {
        self.cfg
            .backoff
            .run(|| async { Ok(self.m().stat(pb::StatRequest {}).await?.into_inner()) })
            .await
    }

    pub async fn inspect(&self, key: &str) -> Result<pb::InspectResponse> {
        let req = pb::InspectRequest {
            key: key.to_string(),
        };
        self.cfg
            .backoff
            .run(|| async { Ok(self.m().inspect(req.clone()).await?.into_inner()) })
            .await
    }

    /// Waits (up to `within`) until the master was told of every read this
    /// client finished, so their leases ended: for a process about to exit
    /// or a client being closed (otherwise those leases run their TTL).
    pub async fn flush_lease_ends(&self, within: std::time::Duration) {
        self.lease_ends.flush(within).await;
    }

    /// Raw access to the master API, for tools and tests.
    pub fn master_client(&self) -> MasterClient<MasterChannel> {
        self.m()
    }

    /// The master's batch calls as this client makes them (quick where
    /// the master allows), for tools and benchmarks.
    pub fn master_calls(&self) -> crate::MasterCalls {
        self.calls.clone()
    }

    pub fn transport(&self) -> Arc<dyn Transport> {
        self.transport.clone()
    }
}
