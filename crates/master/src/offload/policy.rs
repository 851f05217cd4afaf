//! SSD admission policies: which objects go to the SSD tier, and when.

use crate::config::OffloadPolicy;
use strata_common::{Error, Result};

/// Decides which committed objects are queued for offload.
pub trait AdmissionPolicy: Send + Sync + 'static {
    fn name(&self) -> String;
    /// Called when a put commits.
    fn on_put_end(&self) -> bool;
}

/// Offload every object as soon as it is committed.
pub struct Eager;

impl AdmissionPolicy for Eager {
    fn name(&self) -> String {
        "eager".into()
    }
    fn on_put_end(&self) -> bool {
        true
    }
}

/// The policy the configuration names. `on-evict` and `reads:N` need hooks in
/// eviction and reads that arrive with the SSD tier's second part; until then
/// they are refused at start instead of silently acting like `eager`.
pub fn from_config(p: OffloadPolicy) -> Result<Box<dyn AdmissionPolicy>> {
    match p {
        OffloadPolicy::Eager => Ok(Box::new(Eager)),
        other => Err(Error::invalid(format!(
            "--offload-policy {other} is not available in this version yet; use eager"
        ))),
    }
}
