//! Cross-memory attach to a co-located store node: one-sided reads of its
//! registered segments with `process_vm_readv`, on the caller's thread,
//! straight into the caller's buffer.
//!
//! Why: on one host UCX's shared-memory transports move 1 MiB in well
//! under 0.1 ms, but a read through the engine's progress thread costs
//! thread hand-offs and a copy out of a pooled buffer, which on a small
//! host (2 vCPUs, measured) cost more than the bytes themselves. Here the
//! kernel copies once, and no other thread is involved.
//!
//! It is what UCX's own `cma` transport does, under the same rule: the
//! kernel allows it only to a process that may ptrace the node (the same
//! user, or `CAP_SYS_PTRACE`; Yama's `ptrace_scope` may forbid even that),
//! and a pid means the node only in its PID namespace on its boot, which
//! the [`HostProcess`] the node registers lets a client check. Everything
//! else is as for any one-sided read of the route: the client checks
//! bounds, permission and expiry first, and the node's published
//! revocations after the bytes (a pid another process took fails them, and
//! so does a node that stopped serving). The kernel only ever reads: the
//! node names its process itself, so a node that lied could aim a
//! client's `process_vm_writev` at any memory of another process of the
//! client's user, where a read only brings bytes that must pass the
//! object's checksum. Writes copy into the node's segment file mapped into
//! this process ([`Mapping`]), which only a Strata segment can be, or go
//! through the engine. When the kernel refuses, the route's transfers go
//! through the UCX engine instead.

use parking_lot::Mutex;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use strata_proto::HostProcess;

/// This process, as a node names itself to co-located clients (`None`
/// where /proc does not tell the boot or the PID namespace).
pub fn this_process() -> Option<&'static HostProcess> {
    static ME: OnceLock<Option<HostProcess>> = OnceLock::new();
    ME.get_or_init(|| {
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
        let ns = std::fs::read_link("/proc/self/ns/pid").ok()?;
        let boot = boot.trim();
        let pid = std::process::id();
        (!boot.is_empty()).then(|| HostProcess {
            pid,
            host: format!("{boot}/{}", ns.display()),
            start_time: libc::pid_t::try_from(pid)
                .ok()
                .and_then(start_time)
                .unwrap_or(0),
        })
    })
    .as_ref()
}

/// When process `pid` started, in clock ticks since boot (field 22 of
/// `/proc/<pid>/stat`), or `None` when there is no such process.
pub fn start_time(pid: libc::pid_t) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_start_time(&stat)
}

/// Field 22 of a `/proc/<pid>/stat` line: counted after the command name,
/// which is in parentheses and may hold spaces and parentheses itself.
fn parse_start_time(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    // The fields after the name start at field 3.
    rest.split_ascii_whitespace().nth(22 - 3)?.parse().ok()
}

/// Whether `p` still names the process it named when it registered: the
/// pid's current process started when `p` says (unchecked when `p` does not
/// say, as older nodes do not).
fn same_process(pid: libc::pid_t, started: u64) -> bool {
    started == 0 || start_time(pid) == Some(started)
}

/// A co-located node's process, reachable by cross-memory attach until the
/// kernel refuses once, and one of its segments, mapped into this process
/// when the node shares it.
pub(crate) struct Attached {
    pid: libc::pid_t,
    /// When the node's process started (0: not known).
    start_time: u64,
    /// The segment's address and size in the node's process.
    base: u64,
    size: u64,
    /// The kernel refused (another user, a dead process, unmapped memory):
    /// the route's transfers go through UCX from then on.
    refused: AtomicBool,
    mapping: Mutex<MapState>,
}

enum MapState {
    Untried,
    Mapped(Arc<Mapping>),
    /// The node shares no file for the segment, or it could not be mapped,
    /// or the route was refused: reads copy with `process_vm_readv`.
    Unavailable,
}

impl Attached {
    /// The node's process `p`, if this process can name it (same boot,
    /// same PID namespace, a valid pid), for the segment at `base`.
    pub(crate) fn of(p: &HostProcess, base: u64, size: u64) -> Option<Attached> {
        let me = this_process()?;
        let pid = libc::pid_t::try_from(p.pid).ok().filter(|&pid| pid > 0)?;
        // Another process that took the node's pid is not attached to.
        (p.host == me.host && same_process(pid, p.start_time)).then(|| Attached {
            pid,
            start_time: p.start_time,
            base,
            size,
            refused: AtomicBool::new(false),
            mapping: Mutex::new(MapState::Untried),
        })
    }

    pub(crate) fn usable(&self) -> bool {
        !self.refused.load(Ordering::Relaxed)
    }

    /// The kernel refused a read: say why once (per route), then use UCX.
    /// A mapping of the segment goes too (it may be a dead node's memory,
    /// which only the node's process being readable rules out).
    pub(crate) fn refuse(&self, e: &io::Error) {
        if !self.refused.swap(true, Ordering::Relaxed) {
            tracing::info!(pid = self.pid, error = %e, "cross-memory attach to a co-located node refused; its transfers go through UCX");
        }
        *self.mapping.lock() = MapState::Unavailable;
    }

    /// The segment mapped into this process, mapping it on first use, or
    /// `None` (then reads copy with `process_vm_readv`). Readers hold the
    /// `Arc` while they copy, so a refusal never unmaps under them.
    pub(crate) fn mapped(&self) -> Option<Arc<Mapping>> {
        let mut m = self.mapping.lock();
        match &*m {
            MapState::Mapped(x) => return Some(x.clone()),
            MapState::Unavailable => return None,
            MapState::Untried => {}
        }
        // Once per route; a few system calls (the node's /proc/<pid>/fd).
        // The pid names the node's process before the file is found and
        // after it is mapped, so the file mapped is the node's.
        let node = || match same_process(self.pid, self.start_time) {
            true => Ok(()),
            false => Err(io::Error::other("the node's pid now names another process")),
        };
        let found = node()
            .and_then(|()| Mapping::find(self.pid, self.base, self.size))
            .and_then(|m| node().map(|()| m));
        match found {
            Ok(x) => {
                let x = Arc::new(x);
                *m = MapState::Mapped(x.clone());
                let filled = x.clone();
                let fill = move || {
                    let started = std::time::Instant::now();
                    let r = filled.fill();
                    tracing::debug!(len = filled.len, took_ms = started.elapsed().as_millis() as u64, result = ?r, "filled a co-located segment's page tables");
                };
                if x.resident {
                    if let Err(e) = std::thread::Builder::new()
                        .name("strata-map-fill".into())
                        .spawn(fill)
                    {
                        tracing::debug!(error = %e, "no thread to fill a mapping's page tables; transfers fault instead");
                    }
                }
                Some(x)
            }
            Err(e) => {
                tracing::debug!(pid = self.pid, base = self.base, error = %e, "co-located segment not mapped; reading it with process_vm_readv");
                *m = MapState::Unavailable;
                None
            }
        }
    }

    /// Reads `buf.len()` bytes at `addr` of the node's memory.
    pub(crate) fn read(&self, addr: u64, buf: &mut [u8]) -> io::Result<()> {
        self.transfer(addr, buf.as_mut_ptr(), buf.len())
    }

    /// Reads the two 8-byte words at `a` and `b`, in one call.
    pub(crate) fn read_words(&self, a: u64, b: u64) -> io::Result<[u64; 2]> {
        let mut w = [0u64; 2];
        let local = [
            libc::iovec {
                iov_base: (&mut w[0] as *mut u64).cast(),
                iov_len: 8,
            },
            libc::iovec {
                iov_base: (&mut w[1] as *mut u64).cast(),
                iov_len: 8,
            },
        ];
        let remote = [
            libc::iovec {
                iov_base: a as *mut libc::c_void,
                iov_len: 8,
            },
            libc::iovec {
                iov_base: b as *mut libc::c_void,
                iov_len: 8,
            },
        ];
        // SAFETY: the local iovecs name `w`, alive and writable for the
        // call; the remote ones are only addresses for the kernel to check.
        let n =
            unsafe { libc::process_vm_readv(self.pid, local.as_ptr(), 2, remote.as_ptr(), 2, 0) };
        match n {
            16 => Ok(w),
            n if n < 0 => Err(io::Error::last_os_error()),
            n => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("read {n} of 16 bytes of revocation words"),
            )),
        }
    }

    fn transfer(&self, addr: u64, local: *mut u8, len: usize) -> io::Result<()> {
        let mut done = 0usize;
        // Bounded: each round moves at least one byte or returns.
        while done < len {
            let l = libc::iovec {
                // SAFETY: `done < len`, inside the caller's buffer.
                iov_base: unsafe { local.add(done) }.cast(),
                iov_len: len - done,
            };
            let r = libc::iovec {
                iov_base: (addr + done as u64) as *mut libc::c_void,
                iov_len: len - done,
            };
            // SAFETY: `l` names the rest of the caller's buffer, alive and
            // writable for the call; `r` is only an address for the kernel
            // to check.
            let n = unsafe { libc::process_vm_readv(self.pid, &l, 1, &r, 1, 0) };
            match n {
                n if n < 0 => {
                    let e = io::Error::last_os_error();
                    if e.kind() != io::ErrorKind::Interrupted {
                        return Err(e);
                    }
                }
                0 => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("moved {done} of {len} bytes"),
                    ))
                }
                n => done += n as usize,
            }
        }
        Ok(())
    }
}

/// A co-located node's shared segment (`Segment::new_shared`), mapped into
/// this process: reads copy (and checksum) straight from it, and writes
/// copy straight into it, with no system call and no kernel copy. It may be
/// written by the node while read, as RDMA memory is: what a reader copies
/// passes the object's checksum and the published revocations (read from
/// the node's process after the bytes, which also fails once the node is
/// gone), or is not used. The file is sealed against shrinking, so no
/// access to it faults.
///
/// Writable where the file may be opened for writing (the node's user):
/// a write lands only in a sealed memory file named for the route's
/// segment, bounds-checked against it, never at an address of the node's
/// process, so a lying node can aim it no further than one-sided writes
/// under a remote key already reach (see docs/transports.md).
pub(crate) struct Mapping {
    ptr: *mut u8,
    len: usize,
    writable: bool,
    /// The file has no holes: its page tables may be filled ahead
    /// ([`Mapping::fill`]).
    resident: bool,
}

// SAFETY: a shared mapping owned by this value, accessed only by
// bounds-checked copies.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Finds the memory file the node `pid` shares for its segment at
    /// `base` (by its name in `/proc/<pid>/fd`, which only a process that
    /// may inspect the node can read), checks that it is sealed against
    /// shrinking and holds `len` bytes, and maps it: read-write when the
    /// file opens for writing, else read-only (writes then go through the
    /// engine).
    fn find(pid: libc::pid_t, base: u64, len: u64) -> io::Result<Mapping> {
        use std::os::fd::AsRawFd;
        let want = format!(
            "/memfd:{} (deleted)",
            crate::region::shared_segment_name(base)
        );
        let dir = format!("/proc/{pid}/fd");
        let len = usize::try_from(len).map_err(|_| io::Error::other("segment too large"))?;
        // Bounded: a process has finitely many descriptors; stop at 64 Ki.
        for entry in std::fs::read_dir(&dir)?.take(65_536) {
            let path = entry?.path();
            if std::fs::read_link(&path)
                .ok()
                .and_then(|l| l.to_str().map(|l| l == want))
                != Some(true)
            {
                continue;
            }
            let (file, writable) = match std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
            {
                Ok(f) => (f, true),
                Err(_) => (std::fs::File::open(&path)?, false),
            };
            let fd = file.as_raw_fd();
            // SAFETY: plain queries of a descriptor owned by `file`.
            let (seals, size, blocks) = unsafe {
                let mut st: libc::stat = std::mem::zeroed();
                let seals = libc::fcntl(fd, libc::F_GET_SEALS);
                if seals < 0 || libc::fstat(fd, &mut st) != 0 {
                    return Err(io::Error::last_os_error());
                }
                (seals, st.st_size, st.st_blocks)
            };
            if seals & libc::F_SEAL_SHRINK == 0 {
                return Err(io::Error::other(
                    "the segment's file is not sealed against shrinking",
                ));
            }
            if u64::try_from(size).unwrap_or(0) < len as u64 || len == 0 {
                return Err(io::Error::other(format!(
                    "the segment's file holds {size} bytes, not {len}"
                )));
            }
            let prot = match writable {
                true => libc::PROT_READ | libc::PROT_WRITE,
                false => libc::PROT_READ,
            };
            // A node that prefaulted its segment (the default) has every page
            // of the file in memory, charged to the node: this mapping's page
            // tables are then filled ahead of the data path by
            // [`Mapping::fill`] (a 64 KiB write took 28 µs faulting a page
            // at a time, 11 µs not). Never for a file with holes: filling
            // them here would allocate the node's memory in this process's
            // memory cgroup.
            let resident = u64::try_from(blocks).unwrap_or(0).saturating_mul(512) >= len as u64;
            // SAFETY: a shared mapping of `len` bytes of a file that cannot
            // shrink, at an address the kernel picks.
            let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd, 0) };
            if p == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
            return Ok(Mapping {
                ptr: p.cast(),
                len,
                writable,
                resident,
            });
        }
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no {want} in {dir}"),
        ))
    }

    /// Fills the mapping's page tables from the node's resident file, so
    /// transfers take no page fault; a no-op for a file with holes. Tens
    /// of milliseconds per GiB: on a thread of its own (`Attached::mapped`),
    /// never a runtime's; transfers meanwhile fault as they go.
    pub(crate) fn fill(&self) -> io::Result<()> {
        if !self.resident {
            return Ok(());
        }
        let advice = match self.writable {
            true => libc::MADV_POPULATE_WRITE,
            false => libc::MADV_POPULATE_READ,
        };
        // A chunk at a time: one call holds the process's memory map lock
        // for as long as it runs.
        const CHUNK: usize = 64 << 20;
        for off in (0..self.len).step_by(CHUNK) {
            let len = CHUNK.min(self.len - off);
            // SAFETY: a range of exactly this mapping; populating changes
            // no byte.
            if unsafe { libc::madvise(self.ptr.add(off).cast(), len, advice) } != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }

    /// Whether the node's file has no holes (see [`Mapping::fill`]).
    pub(crate) fn resident(&self) -> bool {
        self.resident
    }

    /// Whether writes may copy into the mapping.
    pub(crate) fn writable(&self) -> bool {
        self.writable
    }

    /// The offset in the mapping of `len` bytes at the node's address
    /// `addr`, where the segment starts at `base`, if they are inside it.
    fn offset(&self, base: u64, addr: u64, len: usize) -> io::Result<usize> {
        addr.checked_sub(base)
            .and_then(|o| usize::try_from(o).ok())
            .filter(|o| o.checked_add(len).is_some_and(|end| end <= self.len))
            .ok_or_else(|| {
                io::Error::other(format!("[{addr:#x}, +{len}) is outside the mapped segment"))
            })
    }

    /// Copies `to.len()` bytes at the node's address `addr` into `to`, and
    /// with `crc` returns their crc32c appended to `c` (else `c`).
    pub(crate) fn read(
        &self,
        base: u64,
        addr: u64,
        to: &mut [u8],
        crc: Option<u32>,
    ) -> io::Result<u32> {
        let off = self.offset(base, addr, to.len())?;
        // SAFETY: in bounds (checked above) of a mapping alive while `self`
        // is; another process may write it meanwhile, which the reader's
        // checks catch (see the type docs).
        let from = unsafe { std::slice::from_raw_parts(self.ptr.add(off), to.len()) };
        Ok(match crc {
            Some(c) => crate::checksum::copy_crc32c(from, to, c),
            None => {
                to.copy_from_slice(from);
                0
            }
        })
    }

    /// Copies `from` to the node's address `addr`, inside the mapping.
    pub(crate) fn write(&self, base: u64, addr: u64, from: &[u8]) -> io::Result<()> {
        if !self.writable {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "the segment is mapped read-only",
            ));
        }
        let off = self.offset(base, addr, from.len())?;
        // SAFETY: in bounds (checked above) of a writable mapping alive
        // while `self` is; raw copies, since others may access the bytes
        // meanwhile (the grant and the object's checksum decide what
        // counts, as for a one-sided write). Streamed: the node's memory is
        // not this process's to keep in its caches.
        unsafe { crate::stream_copy::copy_streaming(from, self.ptr.add(off)) };
        Ok(())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping made in `find`.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_named_by_boot_and_namespace() {
        let me = this_process().expect("/proc tells");
        assert_eq!(me.pid, std::process::id());
        let (boot, ns) = me.host.split_once('/').unwrap();
        assert_eq!(boot.len(), 36, "a boot id: {boot}");
        assert!(ns.starts_with("pid:["), "{ns}");
    }

    #[test]
    fn start_times_are_field_22_after_the_command_name() {
        let tail = "S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 424242 20 21";
        for comm in ["(strata)", "(a b)", "(x) S 9 (y)", "()"] {
            assert_eq!(
                parse_start_time(&format!("123 {comm} {tail}")),
                Some(424_242),
                "{comm}"
            );
        }
        assert_eq!(parse_start_time("123 (short) S 1 2"), None);
        assert_eq!(parse_start_time("no name"), None);
        let me = this_process().unwrap();
        assert!(me.start_time > 0);
        assert_eq!(start_time(me.pid as i32), Some(me.start_time));
        assert_eq!(start_time(i32::MAX), None, "no such process");
    }

    /// A pid another process took since the node registered (its start
    /// time differs) is neither attached to nor mapped; a node that does
    /// not say when it started (an older one) is.
    #[test]
    fn a_reused_pid_is_not_attached_to() {
        let me = this_process().unwrap();
        let later = HostProcess {
            start_time: me.start_time + 1,
            ..me.clone()
        };
        assert!(Attached::of(&later, 0, 1).is_none());
        let unknown = HostProcess {
            start_time: 0,
            ..me.clone()
        };
        assert!(Attached::of(&unknown, 0, 1).is_some());
        let seg = crate::region::Segment::new_shared(1 << 20, false).unwrap();
        let base = seg.as_ptr() as u64;
        assert!(Attached::of(me, base, 1 << 20).unwrap().mapped().is_some());
        let moved = Attached {
            start_time: me.start_time + 1,
            ..Attached::of(me, base, 1 << 20).unwrap()
        };
        assert!(moved.mapped().is_none(), "the pid's process changed");
    }

    #[test]
    fn only_a_process_this_one_can_name_is_attached() {
        let me = this_process().unwrap();
        assert!(Attached::of(me, 0, 1).is_some());
        let elsewhere = HostProcess {
            host: format!("{}x", me.host),
            ..me.clone()
        };
        assert!(
            Attached::of(&elsewhere, 0, 1).is_none(),
            "another boot or namespace"
        );
        for pid in [0, u32::MAX] {
            assert!(Attached::of(&HostProcess { pid, ..me.clone() }, 0, 1).is_none());
        }
    }

    #[test]
    fn reads_memory_and_reports_refusals() {
        let me = Attached::of(this_process().unwrap(), 0, 1).unwrap();
        let src: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        me.read(src.as_ptr() as u64, &mut dst).unwrap();
        assert_eq!(dst, src);
        let words = [11u64, 22, 33];
        let w = me
            .read_words(
                &words[2] as *const u64 as u64,
                &words[0] as *const u64 as u64,
            )
            .unwrap();
        assert_eq!(w, [33, 11]);
        // Unmapped memory, and a process that is not there.
        let e = me.read(8, &mut dst[..16]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EFAULT), "{e}");
        let gone = Attached {
            pid: i32::MAX,
            start_time: 0,
            refused: AtomicBool::new(false),
            ..Attached::of(this_process().unwrap(), 0, 1).unwrap()
        };
        let e = gone.read(src.as_ptr() as u64, &mut dst[..16]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ESRCH), "{e}");
        assert!(gone.usable());
        gone.refuse(&e);
        assert!(!gone.usable());
    }

    /// Of `m`, the KiB mapped into this process (`Rss` in /proc/self/smaps).
    fn mapped_kib(m: &Mapping) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let start = format!("{:x}-", m.ptr as usize);
        // The first `Rss:` after the mapping's header line is its own.
        let block = smaps
            .lines()
            .skip_while(|l| !l.starts_with(&start))
            .find(|l| l.starts_with("Rss:"))
            .expect("the mapping is in smaps");
        block
            .split_whitespace()
            .nth(1)
            .and_then(|k| k.parse().ok())
            .expect("Rss: N kB")
    }

    /// A node's shared segment is found by its address, mapped, read with
    /// its checksum, and bounds-checked; a heap segment, another address,
    /// and an unsealed file of the right name are not mapped; a refusal
    /// drops the mapping.
    #[test]
    fn shared_segments_are_mapped_and_read_in_bounds() {
        use crate::region::Segment;
        let me = this_process().unwrap();
        let seg = Segment::new_shared(1 << 20, false).unwrap();
        assert!(seg.is_shared());
        let base = seg.as_ptr() as u64;
        let bytes: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        // SAFETY: this test is the segment's only user.
        unsafe { seg.slice_mut(4096, bytes.len() as u64) }
            .unwrap()
            .copy_from_slice(&bytes);
        let a = Attached::of(me, base, 1 << 20).unwrap();
        let m = a.mapped().expect("the node's shared segment is mapped");
        // Page tables are filled at once only for a file without holes
        // (a prefaulted segment): never allocating the node's memory here.
        let fresh = Segment::new_shared(1 << 20, false).unwrap();
        let at = fresh.as_ptr() as u64;
        let holes = Mapping::find(me.pid as i32, at, 1 << 20).unwrap();
        assert!(!holes.resident);
        holes.fill().unwrap();
        let in_core = |m: &Mapping| {
            let mut v = vec![0u8; m.len / 4096];
            // SAFETY: a plain query of a mapping this test holds.
            let r = unsafe { libc::mincore(m.ptr.cast(), m.len, v.as_mut_ptr()) };
            assert_eq!(r, 0);
            v.iter().filter(|b| **b & 1 == 1).count()
        };
        assert_eq!(in_core(&holes), 0, "nothing allocated from here");
        fresh.prefault();
        let full = Mapping::find(me.pid as i32, at, 1 << 20).unwrap();
        assert!(full.resident);
        assert_eq!(in_core(&full), 256);
        // Filling maps the pages into this process (its resident set for
        // the mapping goes from nothing to all of it) without touching them.
        assert_eq!(mapped_kib(&full), 0);
        full.fill().unwrap();
        assert_eq!(mapped_kib(&full), 1024);
        let mut got = vec![0u8; bytes.len()];
        let c = m.read(base, base + 4096, &mut got, Some(0)).unwrap();
        assert_eq!(got, bytes);
        assert_eq!(c, crc32c::crc32c(&bytes));
        assert_eq!(m.read(base, base + 4096, &mut got[..8], None).unwrap(), 0);
        // Just inside the end, and one byte past it; below the base.
        let mut one = [0u8; 1];
        m.read(base, base + (1 << 20) - 1, &mut one, None).unwrap();
        m.read(base, base + (1 << 20), &mut one, None).unwrap_err();
        m.read(base, base + (1 << 20) - 1, &mut [0u8; 2], None)
            .unwrap_err();
        m.read(base, base - 1, &mut one, None).unwrap_err();
        // Writes of the node show through the mapping.
        // SAFETY: as above.
        unsafe { seg.slice_mut(0, 1) }.unwrap()[0] = 42;
        m.read(base, base, &mut one, None).unwrap();
        assert_eq!(one, [42]);
        // And writes through the mapping land in the node's segment, in
        // bounds only; a read-only mapping takes none.
        assert!(m.writable(), "the node's user may write its file");
        m.write(base, base + 8192, &bytes[..5000]).unwrap();
        // SAFETY: as above.
        assert_eq!(
            unsafe { seg.slice_mut(8192, 5000) }.unwrap(),
            &bytes[..5000]
        );
        m.write(base, base + (1 << 20) - 1, &[7]).unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { seg.slice_mut((1 << 20) - 1, 1) }.unwrap(), &[7]);
        m.write(base, base + (1 << 20) - 1, &[7, 7]).unwrap_err();
        m.write(base, base - 1, &[7]).unwrap_err();
        let ro = Mapping {
            writable: false,
            ..Mapping::find(me.pid as i32, base, 1 << 20).unwrap()
        };
        let e = ro.write(base, base, &[9]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        m.read(base, base, &mut one, None).unwrap();
        assert_eq!(one, [42], "the refused write changed nothing");
        // A route larger than the file is not mapped.
        assert!(Attached::of(me, base, 2 << 20).unwrap().mapped().is_none());
        // No shared file at another address (a heap segment).
        let heap = Segment::new(1 << 20).unwrap();
        assert!(!heap.is_shared());
        let h = Attached::of(me, heap.as_ptr() as u64, 1 << 20).unwrap();
        assert!(h.mapped().is_none());
        // A file of the right name that could shrink is refused.
        let fake = 0x7000_0000_1000u64;
        let name = std::ffi::CString::new(crate::region::shared_segment_name(fake)).unwrap();
        // SAFETY: plain calls on a descriptor this test owns.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        assert_eq!(unsafe { libc::ftruncate(fd, 1 << 20) }, 0);
        let e = Mapping::find(me.pid as i32, fake, 1 << 20)
            .err()
            .expect("unsealed");
        assert!(e.to_string().contains("sealed"), "{e}");
        // SAFETY: closes the descriptor made above.
        unsafe { libc::close(fd) };
        // A refusal drops the mapping (readers keep theirs until done).
        a.refuse(&io::Error::other("gone"));
        assert!(a.mapped().is_none());
        m.read(base, base, &mut one, None).unwrap();
        drop(m);
        // Huge-page shared segments need whole huge pages.
        assert!(Segment::new_shared(4096, true).is_err());
        assert!(Segment::new_shared(0, false).is_err());
    }
}
