//! Registered memory: the DRAM segments a store node contributes, addressed by
//! the cluster-wide segment id the master assigned. A one-sided transport
//! (UCX) would register the same buffers with the NIC.

use crate::fence::SegmentFences;
use crate::frame::{Request, Staged, WriteRecord};
use futures::future::BoxFuture;
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::Arc;
use strata_common::grant::{GrantKey, GrantScope, MAC_LEN, PERM_READ, PERM_WRITE};
use strata_common::{Code, Error, Result};

/// One contiguous DRAM buffer. Pages are allocated zeroed and lazily by the
/// OS, so a large segment costs nothing until written.
///
/// Concurrency: the master hands out disjoint ranges, and a range is only
/// reused after every lease on it has ended; like RDMA-registered memory, the
/// buffer is shared without a lock. A client that races a forced remove may
/// read torn bytes, which its checksum check rejects.
pub struct Segment {
    ptr: *mut u8,
    len: usize,
    /// Mapped from the kernel's huge page pool (`new_huge`, or `new_shared`
    /// with huge pages).
    huge: bool,
    /// How the memory was obtained, so drop gives it back the same way.
    backing: Backing,
    /// What one-sided readers check their grants against (`published.rs`).
    published: crate::published::FenceWords,
}

enum Backing {
    /// `alloc_zeroed` with the layout of `len` bytes, alignment 16.
    Heap,
    /// An anonymous mapping of `len` bytes.
    Mapped,
    /// A shared mapping of a sealed memory file, kept open (never read
    /// here) so a co-located client finds and maps it too (`new_shared`).
    Shared { _file: std::os::fd::OwnedFd },
}

/// The name a shared segment's memory file carries in `/proc/<pid>/fd`
/// (as `/memfd:<name> (deleted)`): a co-located client finds the file of
/// the segment its route names by the segment's address.
pub fn shared_segment_name(base: u64) -> String {
    format!("strata-segment-{base:x}")
}

/// The huge page size `new_huge` maps (the x86-64 and arm64 default).
pub const HUGE_PAGE: usize = 2 << 20;

// SAFETY: the buffer is a plain heap allocation owned by the segment; access is
// through raw-pointer copies of granted, bounds-checked ranges (see above).
unsafe impl Send for Segment {}
unsafe impl Sync for Segment {}

impl Segment {
    pub fn new(len: usize) -> Result<Segment> {
        if len == 0 {
            return Err(Error::invalid("segment size must be positive"));
        }
        // With the default alignment alloc_zeroed maps fresh zero pages
        // lazily (glibc's calloc, and mimalloc's, which the binaries use:
        // a 4 GiB node measured 23 MB resident with --prefault false), so
        // a large segment is not resident until written. (A larger
        // alignment would make Rust zero it eagerly.)
        let layout = std::alloc::Layout::from_size_align(len, 16)
            .map_err(|_| Error::invalid(format!("segment size {len} is too large")))?;
        // SAFETY: the layout has a non-zero size (checked above).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(Error::new(
                Code::NoSpace,
                format!("cannot allocate a DRAM segment of {len} bytes; lower --capacity"),
            ));
        }
        Ok(Segment {
            ptr,
            len,
            huge: false,
            backing: Backing::Heap,
            published: crate::published::FenceWords::new(len as u64)?,
        })
    }

    /// A segment of 2 MiB huge pages from the kernel's reserved pool
    /// (`vm.nr_hugepages`): fewer TLB misses on large pools, and memory the
    /// kernel never swaps or compacts. The pages are reserved when mapped, so
    /// a node without enough of them fails here, at start, not under load.
    pub fn new_huge(len: usize) -> Result<Segment> {
        if len == 0 || !len.is_multiple_of(HUGE_PAGE) {
            return Err(Error::invalid(format!(
                "a huge-page segment must be a positive multiple of 2MiB, not {len} bytes"
            )));
        }
        // SAFETY: an anonymous private mapping of `len` bytes at an address
        // the kernel picks; no file descriptor or existing memory involved.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            let e = std::io::Error::last_os_error();
            return Err(Error::new(
                Code::NoSpace,
                format!(
                    "cannot map {} MiB of 2MiB huge pages ({e}): reserve at least {} of them (sysctl vm.nr_hugepages; HugePages_Free in /proc/meminfo) or drop --huge-pages",
                    len >> 20,
                    len / HUGE_PAGE
                ),
            ));
        }
        Ok(Segment {
            ptr: ptr.cast(),
            len,
            huge: true,
            backing: Backing::Mapped,
            published: crate::published::FenceWords::new(len as u64)?,
        })
    }

    /// A segment whose memory is a memory file (`memfd`), sealed against
    /// shrinking, that a co-located client of the same user may map
    /// read-only and copy from without a system call per read (it finds the
    /// file by [`shared_segment_name`]; see `ucx/cross_memory.rs`). With
    /// `huge`, of 2 MiB huge pages as [`Segment::new_huge`]. Zeroed and
    /// lazily backed, as the others.
    pub fn new_shared(len: usize, huge: bool) -> Result<Segment> {
        let page = if huge { HUGE_PAGE } else { 4096 };
        if len == 0 || (huge && !len.is_multiple_of(HUGE_PAGE)) {
            return Err(Error::invalid(format!(
                "a shared{} segment must be a positive{} size, not {len} bytes",
                if huge { " huge-page" } else { "" },
                if huge { " multiple of 2MiB" } else { "" }
            )));
        }
        let os = |what: &str| {
            let e = std::io::Error::last_os_error();
            Error::new(
                Code::NoSpace,
                format!("cannot set up a shared DRAM segment of {len} bytes ({what}: {e})"),
            )
        };
        // The address first (a reservation, aligned for huge pages), so the
        // file can be named after it.
        let span = len.next_multiple_of(page) + page;
        // SAFETY: an anonymous inaccessible reservation the kernel places.
        let res = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                span,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if res == libc::MAP_FAILED {
            return Err(os("reserving its addresses"));
        }
        let base = (res as usize).next_multiple_of(page);
        let name = std::ffi::CString::new(shared_segment_name(base as u64))
            .map_err(|_| Error::internal("segment name has a NUL"))?;
        let flags =
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING | if huge { libc::MFD_HUGETLB } else { 0 };
        // SAFETY: a valid C string; the kernel creates a new file.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), flags) };
        let fd = if fd < 0 {
            let e = os("memfd_create");
            // SAFETY: the reservation made above, unused.
            unsafe { libc::munmap(res, span) };
            return Err(e);
        } else {
            // SAFETY: a new descriptor this function owns.
            unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) }
        };
        use std::os::fd::AsRawFd;
        let raw = fd.as_raw_fd();
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: plain calls on the descriptor owned above; the fixed
        // mapping lands inside the reservation made above, which it replaces.
        let mapped = unsafe {
            if libc::ftruncate(raw, len as libc::off_t) != 0 {
                Err(os("sizing its memory file"))
            } else if libc::fcntl(raw, libc::F_ADD_SEALS, seals) != 0 {
                Err(os("sealing its memory file"))
            } else {
                let p = libc::mmap(
                    base as *mut libc::c_void,
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    raw,
                    0,
                );
                if p == libc::MAP_FAILED {
                    Err(os(if huge {
                        "mapping huge pages: reserve them with sysctl vm.nr_hugepages"
                    } else {
                        "mapping its memory file"
                    }))
                } else {
                    Ok(())
                }
            }
        };
        // The reservation around the segment goes back either way.
        // SAFETY: parts of the reservation made above outside the segment
        // (or all of it, when the segment was not mapped).
        unsafe {
            let head = base - res as usize;
            let tail = span - head - len;
            match mapped {
                Ok(()) => {
                    if head > 0 {
                        libc::munmap(res, head);
                    }
                    if tail > 0 {
                        libc::munmap((base + len) as *mut libc::c_void, tail);
                    }
                }
                Err(_) => {
                    libc::munmap(res, span);
                }
            }
        }
        mapped?;
        Ok(Segment {
            ptr: base as *mut u8,
            len,
            huge,
            backing: Backing::Shared { _file: fd },
            published: crate::published::FenceWords::new(len as u64)?,
        })
    }

    /// Whether co-located clients may map the segment (`new_shared`).
    pub fn is_shared(&self) -> bool {
        matches!(self.backing, Backing::Shared { .. })
    }

    /// Whether the segment is backed by huge pages.
    pub fn is_huge(&self) -> bool {
        self.huge
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Touches every page so the memory is resident before the first put:
    /// no page faults on the data path, and a node that cannot get its
    /// memory fails at start rather than under load.
    pub fn prefault(&self) {
        const PAGE: usize = 4096;
        for off in (0..self.len).step_by(PAGE) {
            // SAFETY: in bounds; runs before the segment is served.
            unsafe { self.ptr.add(off).write_volatile(0) };
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first byte, for registering the segment with a network stack
    /// (UCX) that lets peers access it directly.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// The revocations one-sided readers of this segment check.
    pub fn published(&self) -> &crate::published::FenceWords {
        &self.published
    }

    fn check(&self, off: u64, len: u64) -> Result<(usize, usize)> {
        match off.checked_add(len) {
            Some(end) if end <= self.len as u64 => Ok((off as usize, len as usize)),
            _ => Err(Error::invalid(format!(
                "range [{off}, +{len}) is outside the segment of {} bytes",
                self.len
            ))),
        }
    }

    /// Read access to a bounds-checked range.
    pub fn slice(&self, off: u64, len: u64) -> Result<&[u8]> {
        let (o, l) = self.check(off, len)?;
        // SAFETY: bounds checked above; see the type docs on sharing.
        Ok(unsafe { std::slice::from_raw_parts(self.ptr.add(o), l) })
    }

    /// Write access to a bounds-checked range.
    ///
    /// # Safety
    /// The caller must hold a write grant for exactly this range, so no other
    /// writer holds an overlapping one (the master never grants overlaps).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut(&self, off: u64, len: u64) -> Result<&mut [u8]> {
        let (o, l) = self.check(off, len)?;
        // SAFETY: bounds checked; exclusivity is the caller's contract.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr.add(o), l) })
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        match self.backing {
            // SAFETY: ptr and len are exactly the mapping made in
            // `new_huge` or `new_shared` (whose file closes after this).
            Backing::Mapped | Backing::Shared { .. } => unsafe {
                libc::munmap(self.ptr.cast(), self.len);
            },
            // SAFETY: ptr was allocated in `new` with exactly this layout.
            Backing::Heap => unsafe {
                std::alloc::dealloc(
                    self.ptr,
                    std::alloc::Layout::from_size_align_unchecked(self.len, 16),
                );
            },
        }
    }
}

/// Bytes a granted read is served from.
pub enum ReadSource {
    /// Registered memory, sent straight from the segment.
    Segment(Arc<Segment>),
    /// Bytes loaded for this read (e.g. from an SSD bucket), with a guard
    /// (e.g. staging space) released once they are sent.
    Owned(Vec<u8>, Option<Box<dyn std::any::Any + Send + Sync>>),
    /// Bytes produced piece by piece (e.g. an SSD read staged through a
    /// bounded arena in chunks); the pieces add up to the requested length.
    Stream(Box<dyn ChunkStream>),
}

/// One piece of a streamed read and whatever must live until it is sent
/// (its staging space).
pub struct Chunk {
    pub data: Vec<u8>,
    pub guard: Option<Box<dyn std::any::Any + Send + Sync>>,
}

/// A read served in pieces. The server asks for the next piece only after it
/// sent (and dropped) the previous one, so at most one piece per reader is
/// staged at a time.
pub trait ChunkStream: Send {
    /// The next piece, or `None` once every byte was produced.
    fn next_chunk(&mut self) -> BoxFuture<'_, Result<Option<Chunk>>>;
    /// Hands a sent piece's buffer back for reuse (no fresh pages per piece).
    fn recycle(&mut self, _buf: Vec<u8>) {}
}

/// Where a granted write lands, and the fence lease that keeps the range's
/// next allocation out until the write is done.
pub struct WriteTarget {
    pub segment: Arc<Segment>,
    pub lease: Option<crate::fence::WriteLease>,
}

/// What a data-plane server serves: it authorises each request and supplies
/// or receives the bytes. DRAM segments and SSD buckets both implement it.
pub trait DataRegion: Send + Sync + 'static {
    fn read<'a>(&'a self, req: &'a Request, now_ms: u64) -> BoxFuture<'a, Result<ReadSource>>;
    /// Memory a granted write lands in.
    fn write_target(&self, req: &Request, now_ms: u64) -> Result<WriteTarget>;
    /// Whether `grant` carries the signature of the master this region
    /// serves (nothing else checked): how a stranger's batch items are
    /// vetted as they arrive, before any is served.
    fn signed(&self, grant: &GrantScope, mac: &[u8]) -> bool;
    /// Answer to a ping: identifies the serving process (empty by default).
    fn ping_payload(&self) -> Vec<u8> {
        Vec::new()
    }
    /// Copies a granted range (at most one piece of it) into memory lent to
    /// the caller, who reads it one-sided and gives it back. Regions whose
    /// memory peers reach directly, or that serve no one-sided readers,
    /// refuse.
    fn stage<'a>(&'a self, _req: &'a Request, _now_ms: u64) -> BoxFuture<'a, Result<Staged>> {
        Box::pin(async {
            Err(Error::invalid(
                "this node does not stage reads; read over TCP",
            ))
        })
    }
    /// Returns space a `stage` lent; false when the lease is unknown (given
    /// back already, reclaimed, or a wrong token).
    fn give_back(&self, _lease: u64, _token: u64) -> bool {
        false
    }
    /// Takes back a lease whose connection closed before its reader gave it
    /// back (`FLAG_HELD`); false when it is gone already.
    fn reclaim_held(&self, lease: u64, token: u64) -> bool {
        self.give_back(lease, token)
    }
    /// Keeps the put a write carried (`Request::record`) once its bytes
    /// landed, while the write still holds its range, and returns the
    /// receipt the client hands to the master at PutEnd. `None`: this
    /// region keeps no records, and the write is answered without one.
    fn record_put(&self, _req: &Request, _record: &WriteRecord) -> Option<Result<[u8; MAC_LEN]>> {
        None
    }
}

/// Checks a grant's signature, expiry, permission and that
/// `[offset, offset+length)` lies inside it.
pub fn verify_grant(
    key: &GrantKey,
    grant: &GrantScope,
    mac: &[u8],
    want_perm: u32,
    offset: u64,
    length: u64,
    now_ms: u64,
) -> Result<()> {
    if !key.verify(grant, mac) {
        return Err(Error::new(
            Code::PermissionDenied,
            "grant signature does not verify (forged, altered or from another master)",
        ));
    }
    if grant.expires_unix_ms < now_ms {
        return Err(Error::new(
            Code::PermissionDenied,
            "grant expired; ask the master for fresh replicas",
        ));
    }
    if grant.perm & want_perm == 0 {
        return Err(Error::new(
            Code::PermissionDenied,
            "grant does not allow this operation",
        ));
    }
    let inside = offset >= grant.offset
        && offset
            .checked_add(length)
            .zip(grant.offset.checked_add(grant.length))
            .is_some_and(|(end, gend)| end <= gend);
    if !inside {
        return Err(Error::new(
            Code::PermissionDenied,
            format!(
                "access [{offset}, +{length}) is outside the granted range [{}, +{})",
                grant.offset, grant.length
            ),
        ));
    }
    Ok(())
}

/// The segments a node serves and the key that authenticates grants for them.
/// Both change when the node (re)registers with the master.
#[derive(Default)]
pub struct SegmentTable {
    inner: RwLock<TableInner>,
}

#[derive(Default)]
struct TableInner {
    key: Option<GrantKey>,
    segments: HashMap<u64, Arc<Segment>>,
    /// Per segment: the newest allocation generation seen on each range.
    fences: HashMap<u64, Arc<SegmentFences>>,
    /// Segments served until the node lost its registration (`clear`), with
    /// their fences: the next registration's fences keep those of the same
    /// memory while their writes are in flight.
    retired: Vec<(Arc<Segment>, Arc<SegmentFences>)>,
    /// Answer to pings: the serving process's public instance id.
    ping: Vec<u8>,
}

impl SegmentTable {
    pub fn new() -> Self {
        Self::default()
    }

    /// Replaces the served segments and grant key atomically; `stamp`
    /// names this registration to one-sided readers (`published.rs`).
    pub fn install(&self, key: GrantKey, segments: HashMap<u64, Arc<Segment>>, stamp: u64) {
        let mut g = self.inner.write();
        // Routes of earlier registrations fail one-sided checks from now on.
        // (Old ones first: the same memory may come back under a new id.)
        for seg in g.segments.values() {
            seg.published().serve(0);
        }
        for seg in segments.values() {
            seg.published().serve(stamp);
        }
        g.key = Some(key);
        // The same memory may come back under a new id while a write
        // admitted under the old one is still copying in: its fences carry
        // over until it is done (`fence.rs`), or its bytes could land on the
        // next object the master places there.
        let mut earlier = std::mem::take(&mut g.retired);
        earlier.extend(
            g.segments
                .iter()
                .filter_map(|(id, s)| Some((s.clone(), g.fences.get(id)?.clone()))),
        );
        g.fences = segments
            .iter()
            .map(|(id, seg)| {
                // The newest registration's fences of this memory (they
                // lead to older ones still in use).
                let f = match earlier.iter().rfind(|(s, _)| Arc::ptr_eq(s, seg)) {
                    Some((_, before)) => SegmentFences::after(before.clone()),
                    None => SegmentFences::new(),
                };
                (*id, f)
            })
            .collect();
        // Memory this registration does not serve keeps its fences, while
        // written, for the next one that does.
        earlier.retain(|(s, f)| f.busy() && !segments.values().any(|seg| Arc::ptr_eq(s, seg)));
        g.retired = earlier;
        g.segments = segments;
    }

    /// The master freed a range (object log): grants of the allocations in
    /// it die now.
    pub fn freed(&self, segment_id: u64, offset: u64, length: u64, generation: u64) {
        let g = self.inner.read();
        if let Some(f) = g.fences.get(&segment_id) {
            f.freed(offset, length, generation);
        }
        if let Some(seg) = g.segments.get(&segment_id) {
            seg.published().freed(offset, generation);
        }
    }

    /// Whether allocation `generation` at `offset` of `segment_id` is live
    /// under the current registration (admitted, not freed).
    pub fn is_live(&self, segment_id: u64, offset: u64, generation: u64) -> bool {
        let g = self.inner.read();
        g.fences
            .get(&segment_id)
            .is_some_and(|f| f.is_live(offset, generation))
    }

    /// The key grants are verified with now (none before registering).
    pub fn grant_key(&self) -> Option<GrantKey> {
        self.inner.read().key.clone()
    }

    /// What pings are answered with (the process's instance id).
    pub fn set_ping_payload(&self, payload: Vec<u8>) {
        self.inner.write().ping = payload;
    }

    /// Stops serving everything (node lost its registration).
    pub fn clear(&self) {
        let mut g = self.inner.write();
        g.key = None;
        for seg in g.segments.values() {
            seg.published().serve(0);
        }
        let TableInner {
            segments,
            fences,
            retired,
            ..
        } = &mut *g;
        for (id, seg) in segments.drain() {
            if let Some(f) = fences.remove(&id) {
                retired.push((seg, f));
            }
        }
        fences.clear();
    }

    pub fn segment_ids(&self) -> Vec<u64> {
        self.inner.read().segments.keys().copied().collect()
    }

    /// Checks the grant (signature, expiry, permission, bounds, and that no
    /// newer allocation took its range) for an access of
    /// `[offset, offset+length)` and returns the segment to perform it on.
    pub fn authorize(
        &self,
        grant: &GrantScope,
        mac: &[u8],
        want_perm: u32,
        offset: u64,
        length: u64,
        now_ms: u64,
    ) -> Result<WriteTarget> {
        let g = self.inner.read();
        let key = g
            .key
            .as_ref()
            .ok_or_else(|| Error::unavailable("node is not registered with a master"))?;
        verify_grant(key, grant, mac, want_perm, offset, length, now_ms)?;
        let seg = g.segments.get(&grant.segment_id).cloned().ok_or_else(|| {
            Error::not_found(format!(
                "segment {} is not served by this node",
                grant.segment_id
            ))
        })?;
        seg.check(offset, length)?;
        seg.check(grant.offset, grant.length)?;
        let lease = match g.fences.get(&grant.segment_id) {
            Some(f) => f.admit(
                grant.offset,
                grant.offset + grant.length,
                grant.generation,
                want_perm == PERM_WRITE,
            )?,
            None => None,
        };
        Ok(WriteTarget {
            segment: seg,
            lease,
        })
    }
}

impl DataRegion for SegmentTable {
    fn signed(&self, grant: &GrantScope, mac: &[u8]) -> bool {
        let g = self.inner.read();
        g.key.as_ref().is_some_and(|k| k.verify(grant, mac))
    }

    fn read<'a>(&'a self, req: &'a Request, now_ms: u64) -> BoxFuture<'a, Result<ReadSource>> {
        let r = self
            .authorize(
                &req.grant, &req.mac, PERM_READ, req.offset, req.length, now_ms,
            )
            .map(|t| ReadSource::Segment(t.segment));
        Box::pin(async move { r })
    }

    fn write_target(&self, req: &Request, now_ms: u64) -> Result<WriteTarget> {
        self.authorize(
            &req.grant, &req.mac, PERM_WRITE, req.offset, req.length, now_ms,
        )
    }

    fn ping_payload(&self) -> Vec<u8> {
        self.inner.read().ping.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write admitted under one registration keeps its range from the
    /// next registration's grants of the same memory, whatever their ids and
    /// generations, until it is done: its bytes must not land on the object
    /// placed there next. Also across a lost registration (`clear`), and not
    /// for other memory.
    #[test]
    fn a_write_in_flight_keeps_its_memory_from_the_next_registration() {
        let seg = Arc::new(Segment::new(1 << 20).unwrap());
        let other = Arc::new(Segment::new(1 << 20).unwrap());
        let t = SegmentTable::new();
        let access = |key: &GrantKey, id: u64, generation: u64, perm: u32| {
            let g = GrantScope {
                perm: PERM_READ | PERM_WRITE,
                segment_id: id,
                offset: 4096,
                length: 4096,
                expires_unix_ms: u64::MAX,
                generation,
            };
            t.authorize(&g, &key.sign(&g), perm, 4096, 4096, 0)
        };
        for lost in [false, true] {
            let k1 = GrantKey::random();
            t.install(k1.clone(), HashMap::from([(1, seg.clone())]), 1);
            let writing = access(&k1, 1, 100, PERM_WRITE).unwrap();
            assert!(writing.lease.is_some());
            if lost {
                t.clear();
            }
            let k2 = GrantKey::random();
            t.install(
                k2.clone(),
                HashMap::from([(2, seg.clone()), (3, other.clone())]),
                2,
            );
            for perm in [PERM_WRITE, PERM_READ] {
                let e = access(&k2, 2, 1, perm).err().unwrap();
                assert_eq!(e.code, Code::Unavailable, "lost {lost}: {e}");
            }
            assert!(
                access(&k2, 3, 1, PERM_WRITE).is_ok(),
                "other memory waits for nothing"
            );
            drop(writing);
            assert!(access(&k2, 2, 1, PERM_WRITE).is_ok(), "lost {lost}");
        }
        // A registration that leaves the memory out passes its fences on.
        let k = GrantKey::random();
        t.install(k.clone(), HashMap::from([(5, seg.clone())]), 3);
        let writing = access(&k, 5, 100, PERM_WRITE).unwrap();
        t.install(GrantKey::random(), HashMap::from([(6, other.clone())]), 4);
        let k = GrantKey::random();
        t.install(k.clone(), HashMap::from([(7, seg.clone())]), 5);
        assert_eq!(
            access(&k, 7, 1, PERM_READ).err().unwrap().code,
            Code::Unavailable
        );
        drop(writing);
        assert!(access(&k, 7, 1, PERM_READ).is_ok());
    }

    /// More huge pages than any machine reserves: refused at once with what
    /// to do (no SIGBUS later); a size that is not whole huge pages is
    /// refused before asking the kernel.
    #[test]
    fn huge_pages_that_are_not_reserved_fail_at_start_with_the_remedy() {
        let e = Segment::new_huge(1 << 40).err().unwrap();
        assert_eq!(e.code, Code::NoSpace, "{e}");
        assert!(e.message.contains("vm.nr_hugepages"), "{e}");
        let e = Segment::new_huge(HUGE_PAGE + 4096).err().unwrap();
        assert_eq!(e.code, Code::InvalidArgument, "{e}");
    }

    /// With pages reserved (scripts/install-deps.sh reserves some), a
    /// huge-page segment holds bytes like any other and gives its pages
    /// back when dropped.
    #[test]
    fn a_huge_page_segment_holds_bytes_and_returns_its_pages() {
        let free = || {
            std::fs::read_to_string("/proc/meminfo")
                .unwrap()
                .lines()
                .find_map(|l| l.strip_prefix("HugePages_Free:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0)
        };
        let before = free();
        assert!(
            before >= 2,
            "2 free huge pages needed ({before}): run scripts/install-deps.sh (sysctl vm.nr_hugepages)"
        );
        let s = Segment::new_huge(2 * HUGE_PAGE).unwrap();
        assert!(s.is_huge());
        // SAFETY: in bounds, exclusive in this test.
        unsafe {
            s.ptr.write_volatile(7);
            s.ptr.add(2 * HUGE_PAGE - 1).write_volatile(9);
            assert_eq!(s.ptr.read_volatile(), 7);
            assert_eq!(s.ptr.add(2 * HUGE_PAGE - 1).read_volatile(), 9);
        }
        assert!(free() < before, "the pages in use come from the pool");
        drop(s);
        assert_eq!(free(), before, "dropped: the pages are back");
    }
}
