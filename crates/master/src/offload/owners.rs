//! SSD owners: the durable handle → owner_id mapping, fencing epochs, and the
//! live view (capacity, use, liveness) the master places offload by.

use super::queue::OffloadQueue;
use crate::durable::{get_or_create, increment, DurableKv};
use parking_lot::RwLock;
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use strata_common::auth::ProofHash;
use strata_common::grant::GrantKey;
use strata_common::time::unix_ms;
use strata_common::{Code, Error, Result};
use strata_proto as pb;

#[derive(Debug, Clone, serde::Serialize)]
pub struct OwnerEntry {
    pub owner_id: u64,
    pub handle: String,
    pub epoch: u64,
    pub instance: String,
    pub data_addr: String,
    pub capacity: u64,
    /// Disk bytes in use, overhead included.
    pub used: u64,
    /// The owner's index, WAL and logs.
    pub overhead: u64,
    pub buckets: u64,
    pub unknown_files: u64,
    pub quarantined_files: u64,
    pub last_heartbeat_ms: u64,
    /// The secret the registered process proves itself with (not published).
    #[serde(skip)]
    pub proof: Option<ProofHash>,
    /// The key this registration verifies grants with (never published).
    #[serde(skip)]
    pub grant_key: Option<GrantKey>,
}

pub struct OwnerRegistry {
    kv: Arc<dyn DurableKv>,
    owners: RwLock<HashMap<u64, OwnerEntry>>,
    ttl_ms: u64,
}

pub fn validate_handle(h: &str) -> Result<()> {
    let ok = !h.is_empty()
        && h.len() <= 256
        && h.chars()
            .all(|c| c.is_ascii_alphanumeric() || "._:/-".contains(c));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "handle {h:?} must be 1 to 256 characters of A-Z a-z 0-9 . _ : / - (e.g. node-7/nvme0)"
        )))
    }
}

impl OwnerRegistry {
    pub fn new(kv: Arc<dyn DurableKv>, ttl_ms: u64) -> Self {
        OwnerRegistry {
            kv,
            owners: RwLock::new(HashMap::new()),
            ttl_ms,
        }
    }

    pub fn kv_name(&self) -> &'static str {
        self.kv.name()
    }

    /// A late housekeeping sweep (`Cluster::forgive_stall`): the owners'
    /// silence while this master was not looking is not held against them
    /// either (their heartbeats may be waiting unread); each last heartbeat
    /// moves forward by `stall_ms`, never past `now`.
    pub fn forgive(&self, stall_ms: u64, now: u64) {
        for o in self.owners.write().values_mut() {
            o.last_heartbeat_ms = o
                .last_heartbeat_ms
                .saturating_add(stall_ms)
                .min(now)
                .max(o.last_heartbeat_ms);
        }
    }

    fn live(&self, o: &OwnerEntry, now: u64) -> bool {
        o.last_heartbeat_ms + self.ttl_ms >= now
    }

    /// Maps the handle to its durable owner_id (created atomically on first
    /// use), refuses while another live process holds it, and bumps the
    /// fencing epoch. `ping` asks a data-plane address for its instance id.
    pub async fn register<P, Fut>(
        &self,
        req: &pb::RegisterOwnerRequest,
        ping: P,
    ) -> Result<(u64, u64)>
    where
        P: Fn(String) -> Fut,
        Fut: Future<Output = Result<Vec<u8>>>,
    {
        validate_handle(&req.handle)?;
        let proof = ProofHash::of(&req.instance_proof)?;
        if req.data_addr.parse::<std::net::SocketAddr>().is_err() {
            return Err(Error::invalid(format!(
                "data_addr {:?} is not HOST:PORT",
                req.data_addr
            )));
        }
        let kv = self.kv.as_ref();
        let id: u64 = get_or_create(kv, &format!("owners/handle/{}", req.handle), || async {
            Ok(increment(kv, "owners/seq").await?.to_string())
        })
        .await?
        .parse()
        .map_err(|_| {
            Error::internal(format!(
                "durable owner id of {:?} is not a number",
                req.handle
            ))
        })?;

        let holder = self.owners.read().get(&id).cloned();
        if let Some(h) = holder {
            // The registered process itself may register again; anyone else
            // (even one replaying its public instance id) only once it is gone.
            let same = h
                .proof
                .as_ref()
                .is_some_and(|p| p.matches(&req.instance_proof));
            if !same && self.live(&h, unix_ms()) {
                // Live on paper; ask the process itself before fencing it.
                if let Ok(answer) = ping(h.data_addr.clone()).await {
                    if answer == h.instance.as_bytes() {
                        return Err(Error::new(
                            Code::AlreadyExists,
                            format!(
                                "handle {:?} is held by a live process {} serving {}; stop it first or use another --handle",
                                req.handle, h.instance, h.data_addr
                            ),
                        ));
                    }
                }
            }
        }
        let epoch = increment(kv, &format!("owners/epoch/{id}")).await?;
        self.owners.write().insert(
            id,
            OwnerEntry {
                owner_id: id,
                handle: req.handle.clone(),
                epoch,
                instance: req.instance.clone(),
                data_addr: req.data_addr.clone(),
                capacity: req.capacity_bytes,
                used: 0,
                overhead: 0,
                buckets: 0,
                unknown_files: 0,
                quarantined_files: 0,
                last_heartbeat_ms: unix_ms(),
                proof: Some(proof),
                grant_key: None,
            },
        );
        tracing::info!(
            handle = req.handle,
            owner_id = id,
            epoch,
            instance = req.instance,
            "SSD owner registered"
        );
        Ok((id, epoch))
    }

    /// Refuses requests from an older (fenced) or unknown registration, and
    /// from any process but the registered one (`proof`).
    pub fn check_epoch(&self, owner: u64, epoch: u64, proof: &[u8]) -> Result<()> {
        match self.owners.read().get(&owner) {
            Some(o) if o.epoch == epoch => match &o.proof {
                Some(p) if p.matches(proof) => Ok(()),
                _ => Err(Error::new(
                    Code::PermissionDenied,
                    format!(
                        "call for owner {owner} does not come from the process that registered it"
                    ),
                )),
            },
            Some(o) => Err(Error::new(
                Code::PermissionDenied,
                format!(
                    "owner {owner} epoch {epoch} is fenced: epoch {} registered since",
                    o.epoch
                ),
            )),
            None => Err(Error::new(
                Code::NotFound,
                format!("owner {owner} is not registered with this master; register again"),
            )),
        }
    }

    pub fn heartbeat(&self, req: &pb::OwnerHeartbeatRequest) -> Result<()> {
        self.check_epoch(req.owner_id, req.epoch, &req.instance_proof)?;
        let mut g = self.owners.write();
        if let Some(o) = g.get_mut(&req.owner_id) {
            o.used = req.used_bytes;
            o.overhead = req.overhead_bytes.min(req.used_bytes);
            o.buckets = req.buckets;
            o.capacity = req.capacity_bytes;
            o.unknown_files = req.unknown_files;
            o.quarantined_files = req.quarantined_files;
            o.last_heartbeat_ms = unix_ms();
        }
        Ok(())
    }

    /// The live owner with the most free space among those that can take
    /// `size` more bytes. A full owner still qualifies: it evicts its least
    /// recently used buckets to make room, so only what is already queued for
    /// it counts against its capacity.
    pub fn pick_owner(&self, size: u64, now: u64, q: &OffloadQueue) -> Option<u64> {
        let need = size + super::queue::OBJECT_OVERHEAD;
        self.owners
            .read()
            .values()
            .filter(|o| self.live(o, now))
            .filter(|o| o.capacity.saturating_sub(q.pending_bytes(o.owner_id)) >= need)
            .map(|o| {
                let pending = q.pending_bytes(o.owner_id);
                // `used` is the owner's own number: saturate, never wrap.
                (
                    o.capacity.saturating_sub(o.used.saturating_add(pending)),
                    o.owner_id,
                )
            })
            .max()
            .map(|(_, id)| id)
    }

    /// (owner, capacity, used bytes) of each live owner.
    pub fn live_usage(&self, now: u64) -> Vec<(u64, u64, u64)> {
        self.owners
            .read()
            .values()
            .filter(|o| self.live(o, now))
            .map(|o| (o.owner_id, o.capacity, o.used))
            .collect()
    }

    /// Whether `owner` registered with this master.
    pub fn registered(&self, owner: u64) -> bool {
        self.owners.read().contains_key(&owner)
    }

    /// Sets the grant key of registration `epoch` of `owner`.
    pub fn set_key(&self, owner: u64, epoch: u64, key: GrantKey) {
        if let Some(o) = self.owners.write().get_mut(&owner) {
            if o.epoch == epoch {
                o.grant_key = Some(key);
            }
        }
    }

    /// Data address, handle and grant key of a live owner.
    pub fn endpoint(&self, owner: u64, now: u64) -> Option<(String, String, GrantKey)> {
        self.owners
            .read()
            .get(&owner)
            .filter(|o| self.live(o, now))
            .and_then(|o| {
                let k = o.grant_key.clone()?;
                Some((o.data_addr.clone(), o.handle.clone(), k))
            })
    }

    pub fn snapshot(&self) -> Vec<(OwnerEntry, bool)> {
        let now = unix_ms();
        let mut v: Vec<_> = self
            .owners
            .read()
            .values()
            .map(|o| (o.clone(), self.live(o, now)))
            .collect();
        v.sort_by_key(|(o, _)| o.owner_id);
        v
    }
}
