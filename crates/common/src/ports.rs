//! Loopback ports for child processes that must be told their port up front
//! (test harnesses, `strata bench`'s failover scenario).
//!
//! Binding port 0 and handing the number to a child races: between the probe
//! and the child's bind, any outgoing connection on the host may be given the
//! same ephemeral port, and a parallel test process may pick it too. So ports
//! come from below the kernel's ephemeral range (outgoing connections never
//! use those), and each one is claimed with an advisory lock file held for the
//! life of this process, so concurrent processes never hand out the same one.

use std::fs::File;
use std::hash::{BuildHasher, RandomState};
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::Mutex;

/// Lowest port handed out: clear of well-known service ports.
const FLOOR: u16 = 10_000;
/// Candidates tried before falling back to an ephemeral port.
const ATTEMPTS: usize = 512;

/// Lock files this process holds (dropping one would release its port).
static HELD: Mutex<Vec<File>> = Mutex::new(Vec::new());

/// A loopback TCP port nobody listens on, that no outgoing connection will be
/// given and that no other process using this function will get.
pub fn unused_loopback_port() -> std::io::Result<u16> {
    let ceiling = ephemeral_start().max(FLOOR + 1);
    let span = u64::from(ceiling - FLOOR);
    let seed = RandomState::new();
    for attempt in 0..ATTEMPTS {
        let port = FLOOR + (seed.hash_one((attempt, std::process::id())) % span) as u16;
        if let Some(lock) = claim(port) {
            if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                HELD.lock().unwrap_or_else(|e| e.into_inner()).push(lock);
                return Ok(port);
            }
        }
    }
    // Everything below the ephemeral range is taken: the old way still
    // works most of the time.
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// First port of the kernel's ephemeral range (Linux default 32768).
fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

fn claim(port: u16) -> Option<File> {
    let dir: PathBuf = std::env::temp_dir().join("strata-ports");
    std::fs::create_dir_all(&dir).ok()?;
    let f = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(format!("{port}.lock")))
        .ok()?;
    f.try_lock().ok()?;
    Some(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_bindable_and_below_the_ephemeral_range() {
        let ports: Vec<u16> = (0..20).map(|_| unused_loopback_port().unwrap()).collect();
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ports.len(), "{ports:?}");
        for p in ports {
            assert!((FLOOR..ephemeral_start()).contains(&p), "{p}");
            TcpListener::bind(("127.0.0.1", p)).unwrap();
        }
    }

    #[test]
    fn a_claimed_port_is_not_claimed_again() {
        let p = unused_loopback_port().unwrap();
        assert!(claim(p).is_none(), "a second lock on {p} must fail");
    }
}
