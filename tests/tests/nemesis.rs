//! The nemesis (`strata_chaos::nemesis`) for a CI-sized stretch: clients
//! put, overwrite, get and remove across a fleet of hosts while store nodes
//! are partitioned, paused, killed and slowed, and two masters elect
//! through etcd while the leader is killed, paused and cut from etcd
//! (`STRATA_NEMESIS_HA=0`: one master); the checker must find no anomaly.
//!
//! `STRATA_NEMESIS_SECS` (default 120) sets how long it runs,
//! `STRATA_NEMESIS_SEED` replays a run's choices; a failing run names its
//! history file. `strata bench chaos` runs the same for longer.

use std::time::Duration;
use strata_chaos::nemesis::{self, Config};

#[test]
fn clients_see_no_anomaly_while_a_nemesis_attacks_the_cluster() {
    let secs: u64 = std::env::var("STRATA_NEMESIS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(120);
    let seed: u64 = std::env::var("STRATA_NEMESIS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    println!("nemesis: {secs} s, seed {seed} (STRATA_NEMESIS_SEED replays it)");
    let mut cfg = Config::new(Duration::from_secs(secs), seed);
    // Two masters electing through etcd, with leader faults, as `strata
    // bench chaos` runs by default; STRATA_NEMESIS_HA=0 keeps one master.
    cfg.ha = std::env::var("STRATA_NEMESIS_HA").map_or(true, |v| v != "0");
    let r = nemesis::run(cfg).expect("the nemesis runs");
    println!("{r}");
    let total: u64 = r.ops.values().sum();
    assert!(total > 100, "too few operations to judge: {total}");
    let injected: u64 = r.faults.values().map(|i| i.injected).sum();
    assert!(injected >= secs / 10, "only {injected} faults in {secs} s");
    assert!(r.final_check.checked > 0, "no acknowledged key checked");
    assert!(
        r.anomalies.is_empty(),
        "{} anomalies (seed {seed}, history {:?}): {:#?}",
        r.anomalies.len(),
        r.history,
        &r.anomalies[..r.anomalies.len().min(20)]
    );
}
