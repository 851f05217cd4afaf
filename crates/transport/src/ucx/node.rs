//! The serving side of the UCX data plane: a store node's segments
//! registered with a UCX engine, so rdma clients can read and write them
//! one-sided. The node publishes each segment's route (its worker address,
//! packed remote key and base address) through the master.

use super::engine::{Engine, Registered};
use crate::region::Segment;
use std::sync::Arc;
use strata_common::Result;

/// Segments exposed over UCX. Dropping it stops the engine, which
/// unregisters every segment, before the segments themselves may go.
pub struct UcxNode {
    // Field order is drop order: the engine (and its registrations) first.
    engine: Engine,
    routes: Vec<Registered>,
    /// Each segment's published revocations (`published.rs`), read-only
    /// to peers by convention, like the segment itself.
    fences: Vec<Registered>,
    _segments: Vec<Arc<Segment>>,
}

impl Drop for UcxNode {
    /// Its segments' routes stop standing: a co-located reader attached to
    /// this process's memory (`cross_memory.rs`), which outlives the UCX
    /// registrations, fails its revocation check from now on.
    fn drop(&mut self) {
        for s in &self._segments {
            s.published().serve(0);
        }
    }
}

impl UcxNode {
    /// Starts an engine (`tls` as in [`super::api::Context::new`]; `None`
    /// lets `UCX_TLS` decide) and registers `segments` with it, in order.
    pub async fn start(tls: Option<&str>, segments: &[Arc<Segment>]) -> Result<UcxNode> {
        let engine = Engine::start(tls)?;
        let mut routes = Vec::with_capacity(segments.len());
        let mut fences = Vec::with_capacity(segments.len());
        for s in segments {
            // SAFETY: the segment's memory (and its published words, which
            // it owns) lives as long as `_segments`, which this value drops
            // only after the engine has stopped.
            routes.push(unsafe { engine.register(s.as_ptr(), s.len()) }.await?);
            let words = s.published();
            // SAFETY: as above.
            fences.push(unsafe { engine.register(words.as_ptr(), words.byte_len()) }.await?);
        }
        Ok(UcxNode {
            engine,
            routes,
            fences,
            _segments: segments.to_vec(),
        })
    }

    /// The worker address peers connect to.
    pub fn worker_address(&self) -> &[u8] {
        self.engine.address()
    }

    /// Each segment's registration (packed remote key and base address), in
    /// the order of `start`'s `segments`.
    pub fn routes(&self) -> &[Registered] {
        &self.routes
    }

    /// Each segment's published revocations' registration, in the same
    /// order.
    pub fn fence_routes(&self) -> &[Registered] {
        &self.fences
    }
}
