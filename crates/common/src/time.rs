//! Wall-clock helpers. Grants and leases cross processes, so they carry Unix
//! milliseconds; local timeouts use `Instant`.

use std::time::{SystemTime, UNIX_EPOCH};

pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
