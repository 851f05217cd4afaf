//! Fencing by leadership term. Every master answer to a member carries the
//! term of the master that made it; a member keeps the highest term it has
//! seen and refuses anything from a lower one, so a deposed leader that wakes
//! up (a paused process, a partition healing) cannot change what members do.

use crate::{Code, Error, Result};
use std::sync::atomic::{AtomicU64, Ordering};

/// The term after `last`: one more, and never below the wall clock in
/// milliseconds, so terms keep growing even when the durable state that
/// counted them is lost (a master without `--state-dir`, a new etcd), and
/// members that saw an old term still accept the new one.
pub fn next_term(last: u64) -> u64 {
    (last + 1).max(crate::time::unix_ms())
}

#[derive(Debug, Default)]
pub struct TermFence {
    seen: AtomicU64,
    /// Answers refused, for the member's metrics.
    refused: Option<prometheus::IntCounter>,
}

impl TermFence {
    /// A fence that counts the answers it refuses in `refused`.
    pub fn counted(refused: prometheus::IntCounter) -> TermFence {
        TermFence {
            seen: AtomicU64::new(0),
            refused: Some(refused),
        }
    }

    /// Admits an answer from `term` (raising the fence) or refuses it.
    pub fn admit(&self, term: u64) -> Result<()> {
        let seen = self.seen.fetch_max(term, Ordering::AcqRel);
        if term < seen {
            if let Some(c) = &self.refused {
                c.inc();
            }
            return Err(Error::new(
                Code::NotLeader,
                format!(
                    "refused an answer from master term {term}: term {seen} has been seen, so it comes from a deposed leader"
                ),
            ));
        }
        Ok(())
    }

    /// The highest term seen (0: none yet).
    pub fn seen(&self) -> u64 {
        self.seen.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lower_terms_are_refused_once_a_higher_one_is_seen() {
        let f = TermFence::default();
        assert!(f.admit(3).is_ok());
        assert!(f.admit(3).is_ok(), "the same term again");
        let e = f.admit(2).unwrap_err();
        assert_eq!(e.code, Code::NotLeader);
        assert!(f.admit(4).is_ok());
        assert!(f.admit(3).is_err(), "one below");
        assert_eq!(f.seen(), 4);
        let refused = prometheus::IntCounter::new("r", "r").unwrap();
        let f = TermFence::counted(refused.clone());
        assert!(f.admit(5).is_ok() && f.admit(4).is_err() && f.admit(6).is_ok());
        assert_eq!(refused.get(), 1);
    }
}
