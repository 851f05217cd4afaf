//! Who may hold the master's port: every accepted connection (gRPC or
//! quick calls) takes a slot, at most `--max-connections` in all and
//! `--max-connections-per-peer` from one address, and gives it back when
//! it closes. A peer over its share is closed at once, so one host (or a
//! few) opening connections and never sending cannot lock members and
//! clients out; members and clients hold a handful each.
//!
//! Locks: `per_peer` is a leaf lock, held for a map update only.

use crate::metrics::MasterMetrics;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// The slots of the master's port.
pub(crate) struct Connections {
    max: usize,
    max_per_peer: usize,
    open: AtomicUsize,
    per_peer: Mutex<HashMap<IpAddr, usize>>,
    metrics: MasterMetrics,
}

impl Connections {
    pub(crate) fn new(max: usize, max_per_peer: usize, metrics: MasterMetrics) -> Arc<Self> {
        Arc::new(Connections {
            max,
            max_per_peer,
            open: AtomicUsize::new(0),
            per_peer: Mutex::new(HashMap::new()),
            metrics,
        })
    }

    /// A slot for a connection from `peer`, or why there is none.
    pub(crate) fn admit(self: &Arc<Self>, peer: IpAddr) -> Result<Slot, &'static str> {
        if self.open.fetch_add(1, Ordering::AcqRel) >= self.max {
            self.open.fetch_sub(1, Ordering::AcqRel);
            return Err(self.refused("total"));
        }
        {
            let mut per = self.per_peer.lock();
            let n = per.entry(peer).or_insert(0);
            if *n >= self.max_per_peer {
                drop(per);
                self.open.fetch_sub(1, Ordering::AcqRel);
                return Err(self.refused("peer"));
            }
            *n += 1;
        }
        self.metrics.open_connections.inc();
        Ok(Slot {
            of: self.clone(),
            peer,
        })
    }

    fn refused(&self, why: &'static str) -> &'static str {
        self.metrics
            .refused_connections
            .with_label_values(&[why])
            .inc();
        why
    }

    /// Connections open now (all, and from `peer`).
    #[cfg(test)]
    pub(crate) fn open(&self, peer: IpAddr) -> (usize, usize) {
        (
            self.open.load(Ordering::Acquire),
            self.per_peer.lock().get(&peer).copied().unwrap_or(0),
        )
    }
}

/// One open connection's slot, given back when dropped.
pub(crate) struct Slot {
    of: Arc<Connections>,
    peer: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut per = self.of.per_peer.lock();
        if let Some(n) = per.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                per.remove(&self.peer);
            }
        }
        drop(per);
        self.of.open.fetch_sub(1, Ordering::AcqRel);
        self.of.metrics.open_connections.dec();
    }
}

/// A gRPC connection with its slot: the slot is given back when the
/// server drops the connection.
pub(crate) struct Held {
    stream: TcpStream,
    _slot: Slot,
}

impl Held {
    pub(crate) fn new(stream: TcpStream, slot: Slot) -> Held {
        Held {
            stream,
            _slot: slot,
        }
    }
}

impl AsyncRead for Held {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Held {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// The peer and local addresses the service reads from each request
/// (`check_data_addr_reachable`) are the socket's, as for a bare stream.
impl tonic::transport::server::Connected for Held {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    /// Both caps hold, slots come back when dropped, and every refusal is
    /// counted by its reason.
    #[test]
    fn slots_are_capped_in_all_and_per_peer_and_come_back() {
        let m = MasterMetrics::new();
        let c = Connections::new(4, 2, m.clone());
        let a1 = c.admit(ip(1)).unwrap();
        let _a2 = c.admit(ip(1)).unwrap();
        assert_eq!(c.admit(ip(1)).err(), Some("peer"));
        let _b1 = c.admit(ip(2)).unwrap();
        let _b2 = c.admit(ip(2)).unwrap();
        assert_eq!(c.admit(ip(3)).err(), Some("total"));
        assert_eq!(c.open(ip(1)), (4, 2));
        drop(a1);
        assert_eq!(c.open(ip(1)), (3, 1));
        let _c1 = c.admit(ip(3)).unwrap();
        assert_eq!(c.open(ip(3)), (4, 1));
        let refused = |why: &str| m.refused_connections.with_label_values(&[why]).get();
        assert_eq!((refused("peer"), refused("total")), (1, 1));
        assert_eq!(m.open_connections.get(), 4);
    }
}
