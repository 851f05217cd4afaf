//! Strata under faults, on one machine (issue #33): simulated hosts as
//! network namespaces (`fleet`), the real binaries run inside them
//! (`procs`), a TCP proxy that slows a link (`proxy`), and the nemesis that
//! attacks a cluster for minutes while checking every answer (`nemesis`).
//! The tests crate's scenarios and `strata bench chaos` both build on it.
//!
//! Everything here needs root (network namespaces) and iproute2, and fails
//! with a message saying so otherwise.

pub mod fleet;
pub mod nemesis;
pub mod procs;
pub mod proxy;
