//! Model test of the election and fencing rules (`MemElectionCore`,
//! `TermFence`, and the validity rule `Leadership` serves by:
//! `valid_until_ms`, `leads`), driven step by step on an explicit clock: candidates
//! acquire, renew on their own schedule, resign and stall; a member admits
//! what believed leaders send; durable writes are conditioned on the term.

use super::{leads, valid_until_ms, MemElectionCore};
use proptest::prelude::*;
use strata_common::term::TermFence;

const TTL: u64 = 300;

#[derive(Debug, Clone)]
enum Op {
    Acquire(usize),
    Renew(usize),
    Resign(usize),
    Advance(u64),
    Send(usize),
    Write(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..3usize).prop_map(Op::Acquire),
        (0..3usize).prop_map(Op::Renew),
        (0..3usize).prop_map(Op::Resign),
        (1..400u64).prop_map(Op::Advance),
        (0..3usize).prop_map(Op::Send),
        (0..3usize).prop_map(Op::Write),
    ]
}

#[derive(Debug, Clone, Default)]
struct Cand {
    lease: Option<u64>,
    term: u64,
    valid_until: u64,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]
    #[test]
    fn at_most_one_leader_and_deposed_ones_change_nothing(ops in proptest::collection::vec(op(), 1..120)) {
        let mut core = MemElectionCore::starting_after(0);
        let mut now = 0u64;
        let mut c = vec![Cand::default(); 3];
        let fence = TermFence::default();
        let mut last_term = 0u64;
        let mut member_terms = Vec::new();
        for op in ops {
            match op {
                Op::Acquire(i) => {
                    if let Some((term, lease)) = core.try_acquire(&format!("m{i}"), TTL, now) {
                        prop_assert!(term > last_term, "terms only grow");
                        last_term = term;
                        c[i] = Cand { lease: Some(lease), term, valid_until: valid_until_ms(now, TTL) };
                    }
                }
                Op::Renew(i) => {
                    if let Some(lease) = c[i].lease {
                        if core.renew(lease, TTL, now) {
                            c[i].valid_until = c[i].valid_until.max(valid_until_ms(now, TTL));
                        } else {
                            c[i] = Cand::default();
                        }
                    }
                }
                Op::Resign(i) => {
                    if let Some(lease) = c[i].lease.take() {
                        core.resign(lease);
                        c[i] = Cand::default();
                    }
                }
                Op::Advance(ms) => now += ms,
                Op::Send(i) => {
                    // Only a leader that believes it leads sends; a member
                    // admits only terms not older than what it has seen.
                    if c[i].lease.is_some()
                        && leads(now, c[i].valid_until, false)
                        && fence.admit(c[i].term).is_ok()
                    {
                        member_terms.push(c[i].term);
                    }
                }
                Op::Write(i) => {
                    // Only the holder of the newest term handed out writes;
                    // a deposed one (whatever it believes) is fenced.
                    if core.write_allowed(c[i].term) && c[i].lease.is_some() {
                        prop_assert_eq!(c[i].term, last_term, "a write from an old term");
                    }
                    if c[i].lease.is_some() && c[i].term < last_term {
                        prop_assert!(!core.write_allowed(c[i].term), "a deposed leader wrote");
                    }
                }
            }
            let believers = c.iter().filter(|x| x.lease.is_some() && leads(now, x.valid_until, false)).count();
            prop_assert!(believers <= 1, "two masters believe they lead at {}", now);
            if let Some(l) = core.leader(now) {
                prop_assert_eq!(l.term, core.term());
            }
            prop_assert!(member_terms.windows(2).all(|w| w[0] <= w[1]), "a member went back a term");
        }
    }
}
