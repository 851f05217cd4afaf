//! Wall-clock helpers. Grants and leases cross processes, so they carry Unix
//! milliseconds; local timeouts use `Instant`.

use std::time::{SystemTime, UNIX_EPOCH};

pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Public id of this process, answered on data-plane pings so the master can
/// tell whether a registered member is still the same live process.
pub fn instance_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!(
        "pid {}@{} started {}",
        std::process::id(),
        host.trim(),
        unix_ms()
    )
}
