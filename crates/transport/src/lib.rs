//! The data plane. Bytes move between clients and the memory of store nodes
//! through a [`Transport`]: the client names a remote range (a segment, an
//! offset, a length and a grant signed by the master) and reads or writes it,
//! like a one-sided RDMA operation. TCP is the first implementation; a UCX
//! one-sided implementation fits the same shape (registered region = segment,
//! remote descriptor = [`RemoteRange`]).

pub mod checksum;
pub mod fence;
pub mod frame;
pub mod lend;
pub mod parts;
pub mod published;
pub mod region;
pub mod stream_copy;
pub mod tcp;
#[cfg(feature = "ucx")]
pub mod ucx;

use futures::future::BoxFuture;
use strata_common::grant::GrantScope;
use strata_common::Result;

/// How a process moves object bytes (`--transport`): TCP, or UCX (one-sided
/// for rdma clients, with TCP beside it for everyone else).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TransportKind {
    #[default]
    Tcp,
    Ucx,
}

impl std::str::FromStr for TransportKind {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "tcp" => Ok(TransportKind::Tcp),
            "ucx" => Ok(TransportKind::Ucx),
            _ => Err(format!("unknown transport {s:?}; use tcp or ucx")),
        }
    }
}

/// A range of a remote segment and the grant that authorises access to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteRange {
    /// Data-plane address of the node holding the segment.
    pub addr: String,
    pub scope: GrantScope,
    pub mac: [u8; strata_common::grant::MAC_LEN],
    /// Fingerprint of the segment's UCX route, when its node serves UCX (0:
    /// TCP only). Transports that cannot use it ignore it.
    pub ucx_route: u64,
}

impl RemoteRange {
    pub fn len(&self) -> u64 {
        self.scope.length
    }
    pub fn is_empty(&self) -> bool {
        self.scope.length == 0
    }
}

/// Writes [`Transport::write_many_parts`]' default has in flight at once.
const WRITES_AT_ONCE: usize = 16;

/// Runs `writes` with at most [`WRITES_AT_ONCE`] in flight and returns
/// their results in order.
pub(crate) async fn writes_in_order<F: std::future::Future>(writes: Vec<F>) -> Vec<F::Output> {
    use futures::StreamExt;
    futures::stream::iter(writes)
        .buffered(WRITES_AT_ONCE)
        .collect()
        .await
}

/// One object of [`Transport::write_many_parts`]: its bytes (the
/// concatenation of `parts`) for the whole of `dst`, and the put's record
/// when the master gave one.
#[derive(Debug, Clone, Copy)]
pub struct WriteItem<'a> {
    pub dst: &'a RemoteRange,
    pub parts: &'a [&'a [u8]],
    pub record: Option<&'a frame::WriteRecord>,
}

/// What a read found of the bytes it read: their crc32c and, when asked,
/// their BLAKE3 digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verified {
    pub crc32c: u32,
    pub blake3: Option<[u8; 32]>,
}

impl Verified {
    /// A read's crc32c, with the BLAKE3 of the `parts` it filled worked
    /// out afterwards (when `blake3`).
    pub(crate) fn hashed_after(crc32c: u32, parts: &[&mut [u8]], blake3: bool) -> Verified {
        let blake3 = blake3.then(|| parts::blake3(parts));
        Verified { crc32c, blake3 }
    }
}

/// One-sided access to remote memory. `at` is relative to the start of the
/// range; implementations bounds-check and may split large transfers.
pub trait Transport: Send + Sync + 'static {
    fn write<'a>(
        &'a self,
        dst: &'a RemoteRange,
        at: u64,
        data: &'a [u8],
    ) -> BoxFuture<'a, Result<()>>;
    fn read<'a>(
        &'a self,
        src: &'a RemoteRange,
        at: u64,
        buf: &'a mut [u8],
    ) -> BoxFuture<'a, Result<()>>;
    /// Reads like [`Transport::read`] and returns the crc32c of the bytes
    /// read. Streaming transports compute it while the bytes arrive; the
    /// default computes it afterwards.
    fn read_crc32c<'a>(
        &'a self,
        src: &'a RemoteRange,
        at: u64,
        buf: &'a mut [u8],
    ) -> BoxFuture<'a, Result<u32>> {
        Box::pin(async move {
            self.read(src, at, buf).await?;
            Ok(crc32c::crc32c(buf))
        })
    }
    /// Reads several ranges, each into its own buffer, and returns each
    /// read's crc32c (or its error) in order. Transports that can send the
    /// ranges held by one node as one request do; the default reads them one
    /// after another.
    fn read_many<'a>(
        &'a self,
        items: Vec<(&'a RemoteRange, &'a mut [u8])>,
    ) -> BoxFuture<'a, Vec<Result<u32>>> {
        Box::pin(async move {
            let mut out = Vec::with_capacity(items.len());
            for (r, buf) in items {
                out.push(self.read_crc32c(r, 0, buf).await);
            }
            out
        })
    }
    /// Writes a whole object into `dst` and asks its node to record the put
    /// as the bytes land (`record`, signed by the master at PutStart); the
    /// answer is the node's receipt, which PutEnd hands back so the master
    /// need not wait for the node to hear of the commit. `None` where the
    /// node keeps no records (older nodes) or the write cannot carry one
    /// (see [`Transport::records_writes`]): the default writes plainly.
    fn write_recorded<'a>(
        &'a self,
        dst: &'a RemoteRange,
        data: &'a [u8],
        _record: &'a frame::WriteRecord,
    ) -> BoxFuture<'a, Result<Option<[u8; strata_common::grant::MAC_LEN]>>> {
        Box::pin(async move { self.write(dst, 0, data).await.map(|()| None) })
    }

    /// Writes the concatenation of `parts` as a whole object into `dst`,
    /// with its record when given (as [`Transport::write_recorded`] does).
    /// Transports that can send from several buffers do; the default joins
    /// the parts first.
    fn write_parts<'a>(
        &'a self,
        dst: &'a RemoteRange,
        parts: &'a [&'a [u8]],
        record: Option<&'a frame::WriteRecord>,
    ) -> BoxFuture<'a, Result<Option<[u8; strata_common::grant::MAC_LEN]>>> {
        Box::pin(async move {
            let data = parts::joined(parts);
            match record {
                Some(r) => self.write_recorded(dst, &data, r).await,
                None => self.write(dst, 0, &data).await.map(|()| None),
            }
        })
    }

    /// Writes several whole objects, each from its parts and with its record
    /// when given (as [`Transport::write_parts`] does), and returns each
    /// write's receipt or error in order, once every write has settled.
    /// Transports that can send the writes bound for one node back to back
    /// on one connection do; the default writes them side by side.
    fn write_many_parts<'a>(
        &'a self,
        items: Vec<WriteItem<'a>>,
    ) -> BoxFuture<'a, Vec<Result<Option<[u8; strata_common::grant::MAC_LEN]>>>> {
        Box::pin(async move {
            let mut writes = Vec::with_capacity(items.len());
            for w in items {
                writes.push(self.write_parts(w.dst, w.parts, w.record));
            }
            writes_in_order(writes).await
        })
    }

    /// Reads the start of `src` into `parts` in order (as many bytes as they
    /// hold together) and returns the crc32c of the bytes read. Transports
    /// that can receive into several buffers do; the default reads into one
    /// and copies.
    fn read_parts<'a>(
        &'a self,
        src: &'a RemoteRange,
        mut parts: Vec<&'a mut [u8]>,
    ) -> BoxFuture<'a, Result<u32>> {
        Box::pin(async move {
            if parts.len() == 1 {
                let one = parts.pop().expect("one part");
                return self.read_crc32c(src, 0, one).await;
            }
            let mut buf = vec![0u8; parts::total_len(&parts)];
            let crc = self.read_crc32c(src, 0, &mut buf).await?;
            parts::scatter(&buf, &mut parts);
            Ok(crc)
        })
    }

    /// [`Transport::read_parts`] that also hashes the bytes with BLAKE3 when
    /// `blake3` (readers of objects with the writer's digest). Transports
    /// that stream the bytes hash them as they land; the default hashes
    /// them afterwards.
    fn read_parts_verified<'a>(
        &'a self,
        src: &'a RemoteRange,
        mut parts: Vec<&'a mut [u8]>,
        blake3: bool,
    ) -> BoxFuture<'a, Result<Verified>> {
        Box::pin(async move {
            let crc32c = self.read_parts(src, parts::reborrow(&mut parts)).await?;
            Ok(Verified::hashed_after(crc32c, &parts, blake3))
        })
    }

    /// [`Transport::read_many`] where each range lands in several buffers
    /// (see [`Transport::read_parts`]).
    fn read_many_parts<'a>(
        &'a self,
        items: Vec<(&'a RemoteRange, Vec<&'a mut [u8]>)>,
    ) -> BoxFuture<'a, Vec<Result<u32>>> {
        Box::pin(async move {
            let mut joined: Vec<Vec<u8>> = items
                .iter()
                .map(|(_, p)| match p.len() {
                    1 => Vec::new(),
                    _ => vec![0u8; parts::total_len(p)],
                })
                .collect();
            let mut spread = Vec::with_capacity(items.len());
            let mut flat = Vec::with_capacity(items.len());
            for ((r, mut p), j) in items.into_iter().zip(joined.iter_mut()) {
                if p.len() == 1 {
                    flat.push((r, p.pop().expect("one part")));
                    spread.push(Vec::new());
                } else {
                    flat.push((r, j.as_mut_slice()));
                    spread.push(p);
                }
            }
            let res = self.read_many(flat).await;
            for ((r, j), mut p) in res.iter().zip(&joined).zip(spread) {
                if r.is_ok() && !p.is_empty() {
                    parts::scatter(j, &mut p);
                }
            }
            res
        })
    }

    /// Whether a write of `len` bytes can carry a record: the node's own
    /// CPU must receive it, so one-sided writes cannot.
    fn records_writes(&self, _len: usize) -> bool {
        false
    }

    fn name(&self) -> &'static str;

    /// A transport of the same configuration with connections of its own,
    /// sharing what any caller may use (UCX engines, routes), for a caller
    /// that drives a runtime of its own (the Python client's per-thread
    /// I/O: a pooled socket belongs to the runtime that made it, driven only
    /// while its thread waits). `None` where a transport cannot make one.
    fn sibling(&self) -> Option<std::sync::Arc<dyn Transport>> {
        None
    }

    /// Whether a read of `r` is refused once the master has freed its range
    /// (a forced remove, a new leader), so a client may keep `r` past its
    /// lookup (the location cache). TCP nodes check every read against
    /// their fences; one-sided transports must say.
    fn refuses_revoked(&self, _r: &RemoteRange) -> bool {
        true
    }
}

/// The data-plane range (and grant) of a replica the master handed out.
pub fn remote_range(r: &strata_proto::Replica) -> Result<RemoteRange> {
    let g = r
        .grant
        .as_ref()
        .ok_or_else(|| strata_common::Error::internal("master sent a replica without a grant"))?;
    let mac: [u8; strata_common::grant::MAC_LEN] = g
        .mac
        .as_slice()
        .try_into()
        .map_err(|_| strata_common::Error::internal("master sent a malformed grant"))?;
    Ok(RemoteRange {
        addr: r.data_addr.clone(),
        scope: GrantScope {
            perm: g.perm,
            segment_id: r.segment_id,
            offset: r.offset,
            length: r.length,
            expires_unix_ms: g.expires_unix_ms,
            generation: g.generation,
        },
        mac,
        ucx_route: r.ucx_route,
    })
}

/// Checks that `[at, at+len)` lies inside a range of `range_len` bytes.
pub(crate) fn check_sub_range(range_len: u64, at: u64, len: usize) -> Result<()> {
    let end = at.checked_add(len as u64);
    match end {
        Some(end) if end <= range_len => Ok(()),
        _ => Err(strata_common::Error::invalid(format!(
            "transfer of {len} bytes at {at} exceeds the granted range of {range_len} bytes"
        ))),
    }
}
