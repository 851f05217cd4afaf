//! The gRPC front end: decodes requests, calls [`Master`], records metrics
//! and maps errors to statuses (through `strata_common::Error`).

use crate::cluster::check_data_addr_reachable;
use crate::master::{Master, PutSpec};
use crate::rebuild::members::Member;
use std::sync::Arc;
use std::time::Instant;
use strata_common::auth::{Role, Roles};
use strata_common::grpc::MethodPolicy;
use strata_common::limits::BodyLimit;
use strata_common::{Code, Error, Result};
use strata_proto as pb;
use strata_proto::master_server::Master as MasterRpc;
use tonic::{Request, Response, Status};

/// Largest batch accepted by the Batch* calls.
pub const MAX_BATCH: usize = 4096;
/// Largest request message the master decodes (member reports of a whole
/// SSD inventory); every method has its own, smaller limit (`policy_of`).
pub const MAX_REQUEST: usize = strata_common::grpc::MAX_MESSAGE;
/// Single-key calls and small member calls.
const SMALL_REQUEST: usize = 64 << 10;
/// A batch of MAX_BATCH keys of MAX_KEY_LEN bytes, with framing.
const BATCH_REQUEST: usize = MAX_BATCH * (crate::objects::MAX_KEY_LEN + 64);
/// A store node's rebuild report batch: 4,096 objects (its batch size)
/// of MAX_KEY_LEN-byte keys with their records, and room to spare.
const NODE_REPORT: usize = 32 << 20;
/// An SSD owner's per-heartbeat reports: results of at most 10,000 tasks
/// (or promotions), or the bucket ids it evicts at once.
const OWNER_REPORT: usize = 16 << 20;

/// What each method needs and may send. Client calls are the default. A
/// forced remove additionally needs the admin role, checked once its message
/// is decoded. Batches are refused by item count while they stream in, before
/// any is decoded.
pub fn policy_of(method: &str) -> MethodPolicy {
    let (role, max_bytes, max_items) = match method {
        // Agents send their inventory in pages of at most a few MiB; the
        // full size is for agents that predate paging, which send it whole.
        "ReportInventory" => (Role::Member, MAX_REQUEST, None),
        "ReportOffload" | "ReportPromotion" | "EvictBuckets" => (Role::Member, OWNER_REPORT, None),
        "RegisterNode" => (Role::Member, 1 << 20, None),
        "ReportNodeObjects" => (Role::Member, NODE_REPORT, None),
        "Heartbeat" | "RegisterOwner" | "OwnerHeartbeat" => (Role::Member, SMALL_REQUEST, None),
        "EvictMemory" => (Role::Admin, BATCH_REQUEST, Some(MAX_BATCH)),
        "RemoveAll" => (Role::Admin, SMALL_REQUEST, None),
        "GetUcxRoutes" => (Role::Rdma, SMALL_REQUEST, None),
        "BatchPutStart" | "BatchPutEnd" | "BatchPutRevoke" | "BatchGetReplicas" | "BatchExists"
        | "ReportReads" => (Role::Client, BATCH_REQUEST, Some(MAX_BATCH)),
        "PutStart" | "PutEnd" | "PutRevoke" | "GetReplicas" | "Exists" | "Remove" | "List"
        | "Stat" | "Inspect" => (Role::Client, SMALL_REQUEST, None),
        // A method not placed above (a new rpc, or a name no rpc has) needs
        // the admin role: never open to members or clients by omission.
        _ => (Role::Admin, SMALL_REQUEST, None),
    };
    MethodPolicy {
        role,
        limit: BodyLimit {
            max_bytes,
            max_items,
        },
    }
}
/// Batches up to this many items run on the async worker, not a blocking
/// thread: microseconds of metadata work.
const INLINE_BATCH: usize = 32;
/// Default and maximum page of `List`.
const LIST_DEFAULT: usize = 1000;
const LIST_MAX: usize = 100_000;

#[derive(Clone)]
pub struct MasterService {
    pub master: Arc<Master>,
}

impl MasterService {
    fn done<T>(&self, op: &'static str, t0: Instant, r: Result<T>) -> Result<Response<T>, Status> {
        let m = &self.master.metrics;
        m.request_duration
            .with_label_values(&[op])
            .observe(t0.elapsed().as_secs_f64());
        let code = match &r {
            Ok(_) => Code::Ok,
            Err(e) => e.code,
        };
        m.requests.with_label_values(&[op, code.as_str()]).inc();
        r.map(Response::new).map_err(Status::from)
    }

    /// Checks a role that depends on the message (the method's own role was
    /// checked before decoding, by `strata_common::grpc::Authenticated`).
    fn require<T>(&self, req: &Request<T>, need: Role) -> Result<()> {
        let creds = &self.master.config().credentials;
        let roles = if creds.is_empty() {
            Roles::ALL
        } else {
            req.extensions().get::<Roles>().copied().unwrap_or_default()
        };
        creds.check(roles, need)
    }

    /// Whether the caller has `role` (everyone does without credentials),
    /// for answers that depend on it; no error built.
    fn has_role<T>(&self, req: &Request<T>, role: Role) -> bool {
        self.master.config().credentials.is_empty()
            || req.extensions().get::<Roles>().is_some_and(|r| r.has(role))
    }

    /// Runs a batch call of `n` items (refused beyond MAX_BATCH) off the
    /// async workers: up to MAX_BATCH items of metadata work.
    async fn batch<T: Send + 'static>(
        &self,
        n: usize,
        f: impl FnOnce(&Master) -> T + Send + 'static,
    ) -> Result<T> {
        check_batch(n)?;
        // A small batch costs less than the hand-off to a blocking thread
        // (measured: clients' batched lookups of 2 to 4 keys were slower
        // than single ones through it).
        if n <= INLINE_BATCH {
            return Ok(f(&self.master));
        }
        self.blocking(move |m| Ok(f(m))).await
    }

    /// Runs a call that scans all metadata off the async workers.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Master) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let m = self.master.clone();
        tokio::task::spawn_blocking(move || f(&m))
            .await
            .map_err(|e| Error::internal(format!("metadata task failed: {e}")))?
    }
}

fn status_of(r: Result<()>) -> pb::Status {
    match r {
        Ok(()) => pb::Status::default(),
        Err(e) => pb::Status {
            code: e.code as u32,
            retryable: e.retryable(),
            message: e.message,
        },
    }
}

/// The put token of a started put that asked to be bound (empty if not).
fn put_token(m: &Master, key: &str, bind: bool, replicas: &[pb::Replica]) -> Vec<u8> {
    match replicas.first().and_then(|r| r.grant.as_ref()) {
        Some(g) if bind => m.put_token(key, g.generation),
        _ => Vec::new(),
    }
}

/// What a started put's PutEnd must bring (`--integrity`).
fn integrity(m: &Master) -> pb::Integrity {
    match m.config().integrity {
        crate::config::Integrity::Crc32c => pb::Integrity::Crc32c,
        crate::config::Integrity::Blake3 => pb::Integrity::Blake3,
    }
}

fn put_result(
    m: &Master,
    (key, bind): (String, bool),
    r: Result<Vec<pb::Replica>>,
) -> pb::PutStartResult {
    match r {
        Ok(replicas) => pb::PutStartResult {
            status: Some(pb::Status::default()),
            put_token: put_token(m, &key, bind, &replicas),
            replicas,
            integrity: integrity(m) as i32,
        },
        Err(e) => pb::PutStartResult {
            status: Some(status_of(Err(e))),
            ..Default::default()
        },
    }
}

fn check_batch(n: usize) -> Result<()> {
    if n > MAX_BATCH {
        return Err(Error::invalid(format!(
            "batch of {n} items exceeds the limit of {MAX_BATCH}; split it"
        )));
    }
    Ok(())
}

#[tonic::async_trait]
impl MasterRpc for MasterService {
    async fn put_start(
        &self,
        req: Request<pb::PutStartRequest>,
    ) -> Result<Response<pb::PutStartResponse>, Status> {
        let t0 = Instant::now();
        let deadline = Instant::now() + self.master.config().put_wait;
        let spec = PutSpec::from(req.into_inner());
        let (key, bind) = (spec.key.clone(), spec.bind);
        let r = self
            .master
            .put_start_waiting(spec, deadline)
            .await
            .map(|replicas| pb::PutStartResponse {
                put_token: put_token(&self.master, &key, bind, &replicas),
                replicas,
                integrity: integrity(&self.master) as i32,
            });
        self.done("put_start", t0, r)
    }

    async fn put_end(
        &self,
        req: Request<pb::PutEndRequest>,
    ) -> Result<Response<pb::PutEndResponse>, Status> {
        let t0 = Instant::now();
        let r = req.get_ref();
        let r = self
            .master
            .when_synced(
                self.master
                    .put_end_request(r)
                    .map(|u| (pb::PutEndResponse {}, u)),
                "commit",
            )
            .await;
        self.done("put_end", t0, r)
    }

    async fn put_revoke(
        &self,
        req: Request<pb::PutRevokeRequest>,
    ) -> Result<Response<pb::PutRevokeResponse>, Status> {
        let t0 = Instant::now();
        let r = self
            .master
            .when_synced(
                self.master
                    .put_revoke_proved(
                        &req.get_ref().key,
                        req.get_ref().generation,
                        Some(&req.get_ref().put_token),
                    )
                    .map(|u| (pb::PutRevokeResponse {}, u)),
                "revoke",
            )
            .await;
        self.done("put_revoke", t0, r)
    }

    async fn batch_put_start(
        &self,
        req: Request<pb::BatchPutStartRequest>,
    ) -> Result<Response<pb::BatchPutStartResponse>, Status> {
        let t0 = Instant::now();
        let specs: Vec<PutSpec> = req
            .into_inner()
            .items
            .into_iter()
            .map(PutSpec::from)
            .collect();
        let names: Vec<(String, bool)> = specs.iter().map(|s| (s.key.clone(), s.bind)).collect();
        // One --put-wait for the whole batch; items are placed in order. What
        // need not wait is done off the async workers; the first item that
        // must wait, and every one after it, waits here.
        let deadline = Instant::now() + self.master.config().put_wait;
        let r = match self
            .batch(specs.len(), move |m| m.put_start_batch_now(specs))
            .await
        {
            Err(e) => Err(e),
            Ok((done, rest)) => {
                let mut names = names.into_iter();
                let mut results: Vec<pb::PutStartResult> = done
                    .into_iter()
                    .zip(names.by_ref())
                    .map(|(r, n)| put_result(&self.master, n, r))
                    .collect();
                for (spec, n) in rest.into_iter().zip(names) {
                    let r = self.master.put_start_waiting(spec, deadline).await;
                    results.push(put_result(&self.master, n, r));
                }
                Ok(pb::BatchPutStartResponse { results })
            }
        };
        self.done("batch_put_start", t0, r)
    }

    async fn batch_put_end(
        &self,
        req: Request<pb::BatchPutEndRequest>,
    ) -> Result<Response<pb::BatchStatusResponse>, Status> {
        let t0 = Instant::now();
        let items = req.into_inner().items;
        let r = self
            .batch(items.len(), move |m| {
                let mut all = crate::sync::Unsynced::default();
                let results = items
                    .iter()
                    .map(|it| status_of(m.put_end_request(it).map(|u| all.extend(u))))
                    .collect();
                (pb::BatchStatusResponse { results }, all)
            })
            .await;
        let r = self.master.when_synced(r, "commit").await;
        self.done("batch_put_end", t0, r)
    }

    async fn batch_put_revoke(
        &self,
        req: Request<pb::BatchPutRevokeRequest>,
    ) -> Result<Response<pb::BatchStatusResponse>, Status> {
        let t0 = Instant::now();
        let pb::BatchPutRevokeRequest {
            keys,
            generations,
            put_tokens,
        } = req.into_inner();
        let r = self
            .batch(keys.len(), move |m| {
                let mut all = crate::sync::Unsynced::default();
                let results = keys
                    .iter()
                    .enumerate()
                    .map(|(i, k)| {
                        let generation = generations.get(i).copied().filter(|&g| g > 0);
                        let token = put_tokens.get(i).map(|t| &t[..]);
                        status_of(
                            m.put_revoke_proved(k, generation, token)
                                .map(|u| all.extend(u)),
                        )
                    })
                    .collect();
                (pb::BatchStatusResponse { results }, all)
            })
            .await;
        let r = self.master.when_synced(r, "revoke").await;
        self.done("batch_put_revoke", t0, r)
    }

    async fn get_replicas(
        &self,
        req: Request<pb::GetReplicasRequest>,
    ) -> Result<Response<pb::GetReplicasResponse>, Status> {
        let t0 = Instant::now();
        let stage = self.has_role(&req, Role::Rdma);
        let r = self.master.get_replicas_for(&req.get_ref().key, stage);
        self.done("get_replicas", t0, r)
    }

    async fn batch_get_replicas(
        &self,
        req: Request<pb::BatchGetReplicasRequest>,
    ) -> Result<Response<pb::BatchGetReplicasResponse>, Status> {
        let t0 = Instant::now();
        let stage = self.has_role(&req, Role::Rdma);
        let keys = req.into_inner().keys;
        let r = self
            .batch(keys.len(), move |m| pb::BatchGetReplicasResponse {
                results: keys
                    .iter()
                    .map(|k| match m.get_replicas_for(k, stage) {
                        Ok(v) => pb::GetReplicasResult {
                            status: Some(pb::Status::default()),
                            replicas: Some(v),
                        },
                        Err(e) => pb::GetReplicasResult {
                            status: Some(status_of(Err(e))),
                            replicas: None,
                        },
                    })
                    .collect(),
            })
            .await;
        self.done("batch_get_replicas", t0, r)
    }

    async fn get_ucx_routes(
        &self,
        req: Request<pb::GetUcxRoutesRequest>,
    ) -> Result<Response<pb::GetUcxRoutesResponse>, Status> {
        let t0 = Instant::now();
        let ids = &req.get_ref().segment_ids;
        let r = check_batch(ids.len()).map(|()| pb::GetUcxRoutesResponse {
            routes: self.master.ucx_routes(ids),
        });
        self.done("get_ucx_routes", t0, r)
    }

    async fn report_reads(
        &self,
        req: Request<pb::ReportReadsRequest>,
    ) -> Result<Response<pb::ReportReadsResponse>, Status> {
        let t0 = Instant::now();
        let req = req.into_inner();
        let r = match check_batch(req.reads.len() + req.ended.len()) {
            Ok(()) => self
                .blocking(move |m| m.report_reads(&req))
                .await
                .map(|()| pb::ReportReadsResponse {}),
            Err(e) => Err(e),
        };
        self.done("report_reads", t0, r)
    }

    async fn exists(
        &self,
        req: Request<pb::ExistsRequest>,
    ) -> Result<Response<pb::ExistsResponse>, Status> {
        let t0 = Instant::now();
        let r = self
            .master
            .exists(&req.get_ref().key)
            .map(|exists| pb::ExistsResponse { exists });
        self.done("exists", t0, r)
    }

    async fn batch_exists(
        &self,
        req: Request<pb::BatchExistsRequest>,
    ) -> Result<Response<pb::BatchExistsResponse>, Status> {
        let t0 = Instant::now();
        let keys = req.into_inner().keys;
        let r = self
            .batch(keys.len(), move |m| pb::BatchExistsResponse {
                results: keys
                    .iter()
                    .map(|k| match m.committed_size(k) {
                        Ok(size) => pb::ExistsResult {
                            status: None,
                            exists: size.is_some(),
                            size: size.unwrap_or(0),
                        },
                        Err(e) => pb::ExistsResult {
                            status: Some(status_of(Err(e))),
                            exists: false,
                            size: 0,
                        },
                    })
                    .collect(),
            })
            .await;
        self.done("batch_exists", t0, r)
    }

    async fn remove(
        &self,
        req: Request<pb::RemoveRequest>,
    ) -> Result<Response<pb::RemoveResponse>, Status> {
        let t0 = Instant::now();
        let r = match req.get_ref().force {
            true => self.require(&req, Role::Admin),
            false => Ok(()),
        };
        let r = match r {
            // Off the async workers: a removal may fsync its tombstone.
            Ok(()) => {
                let r = req.into_inner();
                match self
                    .blocking(move |m| m.remove_unsynced(&r.key, r.force))
                    .await
                {
                    Ok(u) => self
                        .master
                        .await_synced(u, "removal")
                        .await
                        .map(|()| pb::RemoveResponse {}),
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        };
        self.done("remove", t0, r)
    }

    async fn remove_all(
        &self,
        req: Request<pb::RemoveAllRequest>,
    ) -> Result<Response<pb::RemoveAllResponse>, Status> {
        let t0 = Instant::now();
        let force = req.get_ref().force;
        let r = self
            .blocking(move |m| {
                let (removed, skipped) = m.remove_all(force);
                Ok(pb::RemoveAllResponse { removed, skipped })
            })
            .await;
        self.done("remove_all", t0, r)
    }

    async fn list(
        &self,
        req: Request<pb::ListRequest>,
    ) -> Result<Response<pb::ListResponse>, Status> {
        let t0 = Instant::now();
        let r = req.into_inner();
        let limit = match r.limit as usize {
            0 => LIST_DEFAULT,
            n => n.min(LIST_MAX),
        };
        let r = self
            .blocking(move |m| {
                let (objects, truncated) = m.list(&r.prefix, &r.start_after, limit);
                Ok(pb::ListResponse { objects, truncated })
            })
            .await;
        self.done("list", t0, r)
    }

    async fn stat(
        &self,
        _req: Request<pb::StatRequest>,
    ) -> Result<Response<pb::StatResponse>, Status> {
        let t0 = Instant::now();
        let r = self.blocking(|m| Ok(m.stat())).await;
        self.done("stat", t0, r)
    }

    async fn inspect(
        &self,
        req: Request<pb::InspectRequest>,
    ) -> Result<Response<pb::InspectResponse>, Status> {
        let t0 = Instant::now();
        let r = self.master.inspect(&req.get_ref().key);
        self.done("inspect", t0, r)
    }

    async fn register_node(
        &self,
        req: Request<pb::RegisterNodeRequest>,
    ) -> Result<Response<pb::RegisterNodeResponse>, Status> {
        let t0 = Instant::now();
        let (peer, local) = (req.remote_addr(), req.local_addr());
        let (peer, local) = (peer.map(|a| a.ip()), local.map(|a| a.ip()));
        let req = req.into_inner();
        let id = req.node_id.clone();
        let r = match check_data_addr_reachable(&req.data_addr, peer, local) {
            Ok(()) => self.master.check_node_takeover(&req).await,
            Err(e) => Err(e),
        };
        let r = match r {
            Ok(()) => self.blocking(move |m| m.register_node(req)).await,
            Err(e) => Err(e),
        };
        let r = match r {
            Ok(resp) => self.master.remember(Member::Node(id)).await.map(|()| resp),
            Err(e) => Err(e),
        };
        self.done("register_node", t0, r)
    }

    async fn heartbeat(
        &self,
        req: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, Status> {
        let t0 = Instant::now();
        let r = if req.get_ref().leaving {
            // Dropping the node scans the object table: off the async workers.
            let req = req.into_inner();
            self.blocking(move |m| m.heartbeat(&req)).await
        } else {
            self.master.heartbeat_wait(req.get_ref()).await
        };
        self.done("heartbeat", t0, r)
    }

    async fn report_node_objects(
        &self,
        req: Request<pb::ReportNodeObjectsRequest>,
    ) -> Result<Response<pb::ReportNodeObjectsResponse>, Status> {
        let t0 = Instant::now();
        let req = req.into_inner();
        let r = self.blocking(move |m| m.adopt_node_objects(&req)).await;
        self.done("report_node_objects", t0, r)
    }

    async fn register_owner(
        &self,
        req: Request<pb::RegisterOwnerRequest>,
    ) -> Result<Response<pb::RegisterOwnerResponse>, Status> {
        let t0 = Instant::now();
        let (peer, local) = (req.remote_addr(), req.local_addr());
        let (peer, local) = (peer.map(|a| a.ip()), local.map(|a| a.ip()));
        let req = req.into_inner();
        let r = match check_data_addr_reachable(&req.data_addr, peer, local) {
            Ok(()) => self.master.register_owner(req).await,
            Err(e) => Err(e),
        };
        self.done("register_owner", t0, r)
    }

    async fn owner_heartbeat(
        &self,
        req: Request<pb::OwnerHeartbeatRequest>,
    ) -> Result<Response<pb::OwnerHeartbeatResponse>, Status> {
        let t0 = Instant::now();
        let r = self.master.owner_heartbeat_wait(req.get_ref()).await;
        self.done("owner_heartbeat", t0, r)
    }

    async fn report_offload(
        &self,
        req: Request<pb::ReportOffloadRequest>,
    ) -> Result<Response<pb::ReportOffloadResponse>, Status> {
        let t0 = Instant::now();
        report_hangs().await;
        // Member calls that walk many objects run off the async workers.
        let req = req.into_inner();
        let r = self
            .blocking(move |m| m.report_offload(req))
            .await
            .map(|_| pb::ReportOffloadResponse {});
        self.done("report_offload", t0, r)
    }

    async fn report_inventory(
        &self,
        req: Request<pb::ReportInventoryRequest>,
    ) -> Result<Response<pb::ReportInventoryResponse>, Status> {
        let t0 = Instant::now();
        let req = req.into_inner();
        let r = self
            .blocking(move |m| m.report_inventory(req))
            .await
            .map(|adopted| pb::ReportInventoryResponse { adopted });
        self.done("report_inventory", t0, r)
    }

    async fn evict_memory(
        &self,
        req: Request<pb::EvictMemoryRequest>,
    ) -> Result<Response<pb::EvictMemoryResponse>, Status> {
        let t0 = Instant::now();
        let keys = req.into_inner().keys;
        let r = self
            .batch(keys.len(), move |m| pb::EvictMemoryResponse {
                results: keys.iter().map(|k| status_of(m.evict_memory(k))).collect(),
            })
            .await;
        self.done("evict_memory", t0, r)
    }

    async fn evict_buckets(
        &self,
        req: Request<pb::EvictBucketsRequest>,
    ) -> Result<Response<pb::EvictBucketsResponse>, Status> {
        let t0 = Instant::now();
        let req = req.into_inner();
        let r = self.blocking(move |m| m.evict_buckets(&req)).await;
        self.done("evict_buckets", t0, r)
    }

    async fn report_promotion(
        &self,
        req: Request<pb::ReportPromotionRequest>,
    ) -> Result<Response<pb::ReportPromotionResponse>, Status> {
        let t0 = Instant::now();
        report_hangs().await;
        let req = req.into_inner();
        let r = self
            .blocking(move |m| m.report_promotion(req))
            .await
            .map(|_| pb::ReportPromotionResponse {});
        self.done("report_promotion", t0, r)
    }
}

/// Failpoint `master::report-hangs`: an SSD agent's report is never
/// answered, as by a leader paused mid-call (the agent's deadline ends it).
async fn report_hangs() {
    #[cfg(feature = "failpoints")]
    if fail::eval("master::report-hangs", |_| ()).is_some() {
        std::future::pending::<()>().await;
    }
}

#[cfg(test)]
mod role_table {
    use super::*;
    use strata_common::auth::{Credentials, Secret};

    /// Every rpc of the Master service and the role it needs.
    const TABLE: &[(&str, Role)] = &[
        ("PutStart", Role::Client),
        ("PutEnd", Role::Client),
        ("PutRevoke", Role::Client),
        ("BatchPutStart", Role::Client),
        ("BatchPutEnd", Role::Client),
        ("BatchPutRevoke", Role::Client),
        ("GetReplicas", Role::Client),
        ("BatchGetReplicas", Role::Client),
        ("GetUcxRoutes", Role::Rdma),
        ("ReportReads", Role::Client),
        ("Exists", Role::Client),
        ("BatchExists", Role::Client),
        ("Remove", Role::Client),
        ("RemoveAll", Role::Admin),
        ("List", Role::Client),
        ("Stat", Role::Client),
        ("Inspect", Role::Client),
        ("RegisterNode", Role::Member),
        ("Heartbeat", Role::Member),
        ("ReportNodeObjects", Role::Member),
        ("RegisterOwner", Role::Member),
        ("OwnerHeartbeat", Role::Member),
        ("ReportOffload", Role::Member),
        ("ReportInventory", Role::Member),
        ("EvictMemory", Role::Admin),
        ("EvictBuckets", Role::Member),
        ("ReportPromotion", Role::Member),
    ];

    /// The rpcs the proto declares, so a new one cannot go unlisted.
    fn rpcs() -> Vec<String> {
        let proto = include_str!("../../proto/proto/strata.proto");
        let service = proto
            .split("service Master {")
            .nth(1)
            .and_then(|s| s.split('}').next())
            .expect("the Master service");
        let names: Vec<String> = service
            .lines()
            .filter_map(|l| l.trim().strip_prefix("rpc "))
            .map(|l| l.split('(').next().unwrap_or_default().trim().to_string())
            .collect();
        assert!(names.len() >= 27, "{names:?}");
        names
    }

    #[test]
    fn every_rpc_is_in_the_table_with_its_role() {
        let mut declared = rpcs();
        let mut listed: Vec<String> = TABLE.iter().map(|(m, _)| m.to_string()).collect();
        declared.sort();
        listed.sort();
        assert_eq!(declared, listed, "the proto's rpcs and this table differ");
        for (method, role) in TABLE {
            assert_eq!(policy_of(method).role, *role, "{method}");
        }
        // Unknown names are admin-only, not the client default.
        assert_eq!(policy_of("NoSuchMethod").role, Role::Admin);
        assert_eq!(policy_of("").role, Role::Admin);
    }

    #[test]
    fn each_token_reaches_exactly_its_methods() {
        let creds = Credentials::generate();
        let token = |r: Role| -> Secret {
            match r {
                Role::Member => creds.member.clone(),
                Role::Client => creds.client.clone(),
                Role::Admin => creds.admin.clone(),
                Role::Rdma => creds.rdma.clone(),
            }
            .expect("generated")
        };
        let mut allowed = 0;
        for (method, need) in TABLE {
            for has in [Role::Member, Role::Client, Role::Admin, Role::Rdma] {
                let t = token(has);
                let roles = creds.roles_of(Some(t.expose().as_bytes())).unwrap();
                let ok = creds.check(roles, *need).is_ok();
                // Admin and rdma tokens may do what a client may; no token
                // does another role's member or admin work.
                let want = has == *need
                    || (*need == Role::Client && matches!(has, Role::Admin | Role::Rdma));
                assert_eq!(ok, want, "{method} with a {} token", has.as_str());
                allowed += usize::from(ok);
            }
            let none = creds.roles_of(None).unwrap();
            assert!(
                creds.check(none, *need).is_err(),
                "{method} without a token"
            );
        }
        // Each client method with 3 tokens, each other method with its own.
        let clients = TABLE.iter().filter(|(_, r)| *r == Role::Client).count();
        assert_eq!(clients, 15);
        assert_eq!(allowed, clients * 3 + (TABLE.len() - clients));
    }
}
