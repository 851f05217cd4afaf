//! gRPC plumbing shared by every service and client.

use crate::{Error, Result};
use std::time::Duration;
use tonic::transport::Channel;

/// Largest gRPC message either side accepts (heartbeat log pages, batches).
pub const MAX_MESSAGE: usize = 256 << 20;

/// A channel to the master, dialled lazily: it reconnects by itself after
/// failures, so callers survive a master restart.
pub fn master_channel(addr: &str) -> Result<Channel> {
    let uri = if addr.starts_with("http://") || addr.starts_with("https://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    };
    Ok(tonic::transport::Endpoint::from_shared(uri)
        .map_err(|e| Error::invalid(format!("bad master address {addr:?}: {e}")))?
        .connect_timeout(Duration::from_secs(3))
        .timeout(Duration::from_secs(30))
        .tcp_nodelay(true)
        .connect_lazy())
}
