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
//! so does a node that stopped serving). Only reads: the node names its
//! process itself, so a node that lied could aim a client's writes at
//! another process of the client's user, where a read only brings bytes
//! that must pass the object's checksum. When the kernel refuses, the
//! route's reads go through the UCX engine instead.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use strata_proto::HostProcess;

/// This process, as a node names itself to co-located clients (`None`
/// where /proc does not tell the boot or the PID namespace).
pub fn this_process() -> Option<&'static HostProcess> {
    static ME: OnceLock<Option<HostProcess>> = OnceLock::new();
    ME.get_or_init(|| {
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
        let ns = std::fs::read_link("/proc/self/ns/pid").ok()?;
        let boot = boot.trim();
        (!boot.is_empty()).then(|| HostProcess {
            pid: std::process::id(),
            host: format!("{boot}/{}", ns.display()),
        })
    })
    .as_ref()
}

/// A co-located node's process, reachable by cross-memory attach until the
/// kernel refuses once.
pub(crate) struct Attached {
    pid: libc::pid_t,
    /// The kernel refused (another user, a dead process, unmapped memory):
    /// the route's transfers go through UCX from then on.
    refused: AtomicBool,
}

impl Attached {
    /// The node's process `p`, if this process can name it: same boot,
    /// same PID namespace, a valid pid.
    pub(crate) fn of(p: &HostProcess) -> Option<Attached> {
        let me = this_process()?;
        let pid = libc::pid_t::try_from(p.pid).ok().filter(|&pid| pid > 0)?;
        (p.host == me.host).then(|| Attached {
            pid,
            refused: AtomicBool::new(false),
        })
    }

    pub(crate) fn usable(&self) -> bool {
        !self.refused.load(Ordering::Relaxed)
    }

    /// The kernel refused a read: say why once (per route), then use UCX.
    pub(crate) fn refuse(&self, e: &io::Error) {
        if !self.refused.swap(true, Ordering::Relaxed) {
            tracing::info!(pid = self.pid, error = %e, "cross-memory attach to a co-located node refused; its transfers go through UCX");
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
    fn only_a_process_this_one_can_name_is_attached() {
        let me = this_process().unwrap();
        assert!(Attached::of(me).is_some());
        let elsewhere = HostProcess {
            host: format!("{}x", me.host),
            ..me.clone()
        };
        assert!(
            Attached::of(&elsewhere).is_none(),
            "another boot or namespace"
        );
        for pid in [0, u32::MAX] {
            assert!(Attached::of(&HostProcess { pid, ..me.clone() }).is_none());
        }
    }

    #[test]
    fn reads_memory_and_reports_refusals() {
        let me = Attached::of(this_process().unwrap()).unwrap();
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
            refused: AtomicBool::new(false),
        };
        let e = gone.read(src.as_ptr() as u64, &mut dst[..16]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ESRCH), "{e}");
        assert!(gone.usable());
        gone.refuse(&e);
        assert!(!gone.usable());
    }
}
