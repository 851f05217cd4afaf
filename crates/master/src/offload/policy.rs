//! SSD admission policies: which objects go to the SSD tier, and when.
//! - `eager`: every object, at PutEnd.
//! - `on-evict`: an object DRAM eviction picks is copied to SSD before its
//!   DRAM is freed; if the SSD tier cannot take it, it is simply dropped.
//! - `reads:N`: an object is queued once it served N demand reads from DRAM
//!   (internal reads such as offload copies do not count).
//!
//! Objects already on SSD or already queued are never queued twice.

use crate::config::OffloadPolicy;
use strata_common::Result;

/// Decides which committed objects are queued for offload.
pub trait AdmissionPolicy: Send + Sync + 'static {
    fn name(&self) -> String;
    /// Queue at PutEnd.
    fn on_put_end(&self) -> bool {
        false
    }
    /// Queue after this many demand reads from DRAM.
    fn reads_to_admit(&self) -> Option<u32> {
        None
    }
    /// Background eviction offloads its victims before freeing them.
    fn on_evict(&self) -> bool {
        false
    }
}

pub struct Eager;

impl AdmissionPolicy for Eager {
    fn name(&self) -> String {
        "eager".into()
    }
    fn on_put_end(&self) -> bool {
        true
    }
}

pub struct OnEvict;

impl AdmissionPolicy for OnEvict {
    fn name(&self) -> String {
        "on-evict".into()
    }
    fn on_evict(&self) -> bool {
        true
    }
}

pub struct Reads(pub u32);

impl AdmissionPolicy for Reads {
    fn name(&self) -> String {
        format!("reads:{}", self.0)
    }
    fn reads_to_admit(&self) -> Option<u32> {
        Some(self.0)
    }
}

/// The policy the configuration names.
pub fn from_config(p: OffloadPolicy) -> Result<Box<dyn AdmissionPolicy>> {
    Ok(match p {
        OffloadPolicy::Eager => Box::new(Eager),
        OffloadPolicy::OnEvict => Box::new(OnEvict),
        OffloadPolicy::Reads(n) => Box::new(Reads(n.max(1))),
    })
}
