//! Finding the serving master. `--master` takes one address, a comma-separated
//! list of masters, or `etcd://HOST:PORT[,HOST:PORT…]/CLUSTER` (the leader
//! record the masters keep in etcd). [`LeaderChannel`] is a gRPC channel that
//! follows the leader as it moves: a follower's "not leader" answer names the
//! leader, a dead address is dropped, and etcd is asked again after any
//! failure, so no caller follows a stale record for longer than one call.

use crate::{Code, Error, Result};
use futures::future::BoxFuture;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tonic::transport::Channel;

pub use crate::etcd::{etcd_client, etcd_client_with, EtcdAccess, EtcdAuth, EtcdTls};

/// Response metadata a follower's "not leader" error carries: the leader's
/// advertised address (defined with the other error headers).
pub use crate::error::LEADER_HEADER;

/// What the leader publishes in etcd (and `/api/v1/leader` answers).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderRecord {
    /// gRPC address members and clients dial.
    pub addr: String,
    pub term: u64,
    /// The leading process (random per process): two masters given the
    /// same address never take each other's record for their own.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub instance: String,
}

/// The error a master that does not lead answers (here, beside the record
/// it names, so `error.rs` needs nothing of leadership).
impl Error {
    /// This master does not lead; `leader` is who does, if known.
    pub fn not_leader(leader: Option<&LeaderRecord>) -> Self {
        let message = match leader {
            Some(l) => format!(
                "this master is not the leader; the leader is {} (term {}): retry there",
                l.addr, l.term
            ),
            None => "this master is not the leader and no leader is known yet (an election is under way); retry".to_string(),
        };
        Error {
            leader: leader.map(|l| l.addr.clone()),
            ..Error::new(Code::NotLeader, message)
        }
    }
}

/// etcd key of a cluster's leader record (attached to the leader's lease).
pub fn leader_key(cluster: &str) -> String {
    format!("/strata/{cluster}/election/leader")
}

/// etcd key of a cluster's last term (never deleted; only grows).
pub fn term_key(cluster: &str) -> String {
    format!("/strata/{cluster}/election/term")
}

/// Checks a `--cluster-id`: it names etcd keys, so a safe, short token.
pub fn validate_cluster_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 63
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "cluster id {id:?} must be 1 to 63 characters of letters, digits, '-', '_' or '.'"
        )))
    }
}

/// Where the master is found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MasterTarget {
    /// Masters to try in turn (one for a single master).
    Addrs(Vec<String>),
    /// The leader record of `cluster` in etcd.
    Etcd {
        endpoints: Vec<String>,
        cluster: String,
    },
}

impl MasterTarget {
    pub fn parse(s: &str) -> Result<MasterTarget> {
        let s = s.trim();
        if let Some(rest) = s.strip_prefix("etcd://") {
            let (hosts, cluster) = rest.split_once('/').ok_or_else(|| {
                Error::invalid(format!(
                    "master address {s:?}: expected etcd://HOST:PORT[,HOST:PORT…]/CLUSTER"
                ))
            })?;
            validate_cluster_id(cluster)?;
            // Bare HOST:PORT: the scheme follows this process's etcd TLS
            // settings when it connects.
            let endpoints = split_list(hosts);
            if endpoints.is_empty() {
                return Err(Error::invalid(format!(
                    "master address {s:?} names no etcd endpoint"
                )));
            }
            return Ok(MasterTarget::Etcd {
                endpoints,
                cluster: cluster.to_string(),
            });
        }
        let addrs = split_list(s);
        if addrs.is_empty() {
            return Err(Error::invalid(
                "master address is empty: give HOST:PORT, a comma-separated list, or etcd://HOST:PORT/CLUSTER",
            ));
        }
        for a in &addrs {
            http::Uri::try_from(uri_of(a))
                .map_err(|e| Error::invalid(format!("bad master address {a:?}: {e}")))?;
        }
        Ok(MasterTarget::Addrs(addrs))
    }
}

fn split_list(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(String::from)
        .collect()
}

fn uri_of(addr: &str) -> String {
    if addr.starts_with("http://") || addr.starts_with("https://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    }
}

/// Reads a cluster's leader record from etcd (`None`: no leader now).
pub async fn read_leader(
    client: &etcd_client::Client,
    cluster: &str,
) -> Result<Option<LeaderRecord>> {
    let mut kv = client.kv_client();
    let r = tokio::time::timeout(Duration::from_secs(3), kv.get(leader_key(cluster), None))
        .await
        .map_err(|_| Error::unavailable("etcd did not answer a leader lookup within 3s"))?
        .map_err(|e| Error::unavailable(format!("etcd leader lookup: {e}")))?;
    match r.kvs().first() {
        None => Ok(None),
        Some(v) => serde_json::from_slice(v.value()).map(Some).map_err(|e| {
            Error::new(
                Code::Corrupted,
                format!("leader record of cluster {cluster:?} in etcd is not valid: {e}"),
            )
        }),
    }
}

/// A gRPC channel to whichever master leads (see the module doc).
#[derive(Clone)]
pub struct LeaderChannel {
    route: Arc<Route>,
}

struct Route {
    target: MasterTarget,
    channels: Mutex<HashMap<String, Channel>>,
    /// The address believed to lead, if known.
    current: Mutex<Option<String>>,
    /// Next list entry to try when no leader is known.
    next: Mutex<usize>,
    etcd: tokio::sync::Mutex<Option<etcd_client::Client>>,
    /// The runtime the route was made on: its connections' tasks run there,
    /// whichever caller (another runtime's) dials first.
    home: Option<tokio::runtime::Handle>,
}

/// Longest a member's heartbeat (a store node's, an SSD owner's) may
/// take: the master's long poll (at most an interval), then as long again,
/// and never less than `HEARTBEAT_SLACK` more (a loaded master answering
/// a little late, or a long log page, is not a hung one). A master that
/// holds it longer hangs (paused, cut off), and the member must try the
/// next one well within `--node-ttl` (four intervals from 80 ms on): a
/// new leader waits that long for its members' reports, then answers for
/// their keys without them. Left to the connections' own
/// timeouts (3 s of silence on a quick one, then gRPC's keep-alive on the
/// same master), a node stayed with a paused leader for seconds, and its
/// successor, having given up on it, answered its keys NotFound.
pub fn heartbeat_deadline(interval: Duration) -> Duration {
    interval + interval.max(HEARTBEAT_SLACK)
}

/// The least time a heartbeat's answer may take beyond the long poll.
const HEARTBEAT_SLACK: Duration = Duration::from_millis(200);

/// Spawns a channel's tasks on one runtime.
#[derive(Clone)]
struct OnRuntime(tokio::runtime::Handle);

impl<F> hyper::rt::Executor<F> for OnRuntime
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, fut: F) {
        self.0.spawn(fut);
    }
}

impl LeaderChannel {
    /// Its connections run on the runtime this is called on (keep-alive
    /// pings both ways), whichever caller dials first: make it on a runtime
    /// that always runs, never on one driven only while its caller waits
    /// (the master drops a connection whose pings go unanswered for 30 s).
    pub fn new(target: MasterTarget) -> LeaderChannel {
        LeaderChannel {
            route: Arc::new(Route {
                target,
                channels: Mutex::new(HashMap::new()),
                current: Mutex::new(None),
                next: Mutex::new(0),
                etcd: tokio::sync::Mutex::new(None),
                home: tokio::runtime::Handle::try_current().ok(),
            }),
        }
    }

    /// The address calls go to now, if one is known.
    pub fn current(&self) -> Option<String> {
        self.route.current.lock().clone()
    }

    /// `addr` did not answer in time (a caller's own deadline ran out):
    /// the next call picks again, as after a failed one, instead of
    /// waiting on a master that hangs (paused, cut off).
    pub fn forget(&self, addr: &str) {
        self.route.forget(addr);
    }
}

impl Route {
    async fn pick(&self) -> Result<String> {
        if let Some(a) = self.current.lock().clone() {
            return Ok(a);
        }
        let addr = match &self.target {
            MasterTarget::Addrs(list) => {
                let mut n = self.next.lock();
                let a = list[*n % list.len()].clone();
                *n = n.wrapping_add(1);
                a
            }
            MasterTarget::Etcd { endpoints, cluster } => {
                let mut guard = self.etcd.lock().await;
                if guard.is_none() {
                    let access = EtcdAccess::from_env()?;
                    let endpoints = endpoints.clone();
                    let connect = async move { etcd_client_with(&endpoints, &access).await };
                    // Its connections live on the route's home runtime.
                    let client = match &self.home {
                        Some(h) => h.spawn(connect).await.map_err(|e| {
                            Error::unavailable(format!("connecting to etcd failed: {e}"))
                        })??,
                        None => connect.await?,
                    };
                    *guard = Some(client);
                }
                let client = guard.as_ref().expect("just set");
                match read_leader(client, cluster).await {
                    Ok(Some(rec)) => rec.addr,
                    Ok(None) => {
                        return Err(Error::unavailable(format!(
                            "no master of cluster {cluster:?} leads now (no leader record in etcd); retry"
                        )))
                    }
                    Err(e) => {
                        // Reconnect next time: the endpoints may have moved.
                        *guard = None;
                        return Err(e);
                    }
                }
            }
        };
        *self.current.lock() = Some(addr.clone());
        Ok(addr)
    }

    fn channel(&self, addr: &str) -> Result<Channel> {
        let mut chans = self.channels.lock();
        if let Some(c) = chans.get(addr) {
            return Ok(c.clone());
        }
        // A master that hangs (paused, partitioned) fails its calls in a few
        // seconds, not at the 30 s call timeout.
        let ep = tonic::transport::Endpoint::from_shared(uri_of(addr))
            .map_err(|e| Error::invalid(format!("bad master address {addr:?}: {e}")))?
            .connect_timeout(Duration::from_secs(3))
            .timeout(Duration::from_secs(30))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(1))
            .keep_alive_timeout(Duration::from_secs(2))
            .keep_alive_while_idle(true);
        let ch = match &self.home {
            Some(h) => ep.executor(OnRuntime(h.clone())),
            None => ep,
        }
        .connect_lazy();
        chans.insert(addr.to_string(), ch.clone());
        Ok(ch)
    }

    /// `addr` failed or does not lead: pick again on the next call, and
    /// from a list, another address first (a master that hangs would
    /// otherwise be picked again every other time by turns).
    fn forget(&self, addr: &str) {
        // Lock order: `current`, then `next` (so no pick slips between
        // forgetting and moving on).
        let mut cur = self.current.lock();
        if cur.as_deref() == Some(addr) {
            *cur = None;
        }
        if let MasterTarget::Addrs(list) = &self.target {
            let mut n = self.next.lock();
            if list.len() > 1 && list[*n % list.len()] == addr {
                *n = n.wrapping_add(1);
            }
        }
    }

    /// Moves to the leader a master's answer named, if it may be believed
    /// (`redirect_ok`); otherwise looks again next call. True if it moved.
    fn follow(&self, leader: &str) -> bool {
        if !redirect_ok(&self.target, leader) {
            tracing::debug!(
                leader,
                "a master named a leader not followed; looking again"
            );
            *self.current.lock() = None;
            return false;
        }
        *self.current.lock() = Some(leader.to_string());
        true
    }
}

/// Whether a "not leader" answer's leader may be dialled: a plain
/// `HOST:PORT` (no scheme, path or user part; a port; bounded length), and
/// only where the masters are given as addresses. With etcd, the leader
/// record there is the truth: the answer only says to read it again. A
/// master cannot send a client (and its token) anywhere it likes.
fn redirect_ok(target: &MasterTarget, leader: &str) -> bool {
    if matches!(target, MasterTarget::Etcd { .. }) || leader.len() > 262 {
        return false;
    }
    let Some((host, port)) = leader.rsplit_once(':') else {
        return false;
    };
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let host_ok = !host.is_empty()
        && (host.parse::<std::net::IpAddr>().is_ok()
            || host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.'));
    host_ok && port.parse::<u16>().is_ok_and(|p| p != 0)
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower_service::Service<http::Request<tonic::body::Body>> for LeaderChannel {
    type Response = http::Response<tonic::body::Body>;
    type Error = BoxError;
    type Future = BoxFuture<'static, std::result::Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<std::result::Result<(), BoxError>> {
        // Readiness is checked on the chosen channel inside the call.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let route = self.route.clone();
        Box::pin(async move {
            let as_status = |e: Error| -> BoxError { Box::new(tonic::Status::from(e)) };
            let addr = route.pick().await.map_err(as_status)?;
            let mut ch = route.channel(&addr).map_err(as_status)?;
            // A master that cannot be reached is worth another try (the
            // next address, or the leader etcd names by then): retryable.
            let unreachable = |e: &dyn std::fmt::Display| {
                as_status(Error::unavailable(format!("master {addr}: {e}")))
            };
            if let Err(e) = futures::future::poll_fn(|cx| ch.poll_ready(cx)).await {
                route.forget(&addr);
                return Err(unreachable(&error_chain(&e)));
            }
            match ch.call(req).await {
                Ok(resp) => {
                    let h = resp.headers();
                    if let Some(leader) = h.get(LEADER_HEADER).and_then(|v| v.to_str().ok()) {
                        if leader != addr {
                            let _ = route.follow(leader);
                        } else {
                            // It names itself but does not serve (it just
                            // stepped down): look again next time.
                            route.forget(&addr);
                        }
                    } else if h
                        .get(crate::error::CODE_HEADER)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.parse::<u32>().ok())
                        == Some(Code::NotLeader as u32)
                    {
                        // A follower that knows no leader yet.
                        route.forget(&addr);
                    }
                    Ok(resp)
                }
                Err(e) => {
                    route.forget(&addr);
                    Err(unreachable(&error_chain(&e)))
                }
            }
        })
    }
}

/// An error and its sources, for a message that says what failed.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_not_leader_error_carries_the_leader_through_a_status() {
        let rec = LeaderRecord {
            addr: "10.0.0.7:7400".into(),
            term: 4,
            instance: String::new(),
        };
        let back: Error = tonic::Status::from(Error::not_leader(Some(&rec))).into();
        assert_eq!(back.code, Code::NotLeader);
        assert!(back.retryable());
        assert_eq!(back.leader.as_deref(), Some("10.0.0.7:7400"));
        assert!(back.message.contains("term 4"), "{back}");
        let back: Error = tonic::Status::from(Error::not_leader(None)).into();
        assert_eq!((back.code, back.leader), (Code::NotLeader, None));
    }

    #[test]
    fn targets_parse_and_bad_ones_are_refused() {
        assert_eq!(
            MasterTarget::parse("127.0.0.1:7400").unwrap(),
            MasterTarget::Addrs(vec!["127.0.0.1:7400".into()])
        );
        assert_eq!(
            MasterTarget::parse("a:1, b:2").unwrap(),
            MasterTarget::Addrs(vec!["a:1".into(), "b:2".into()])
        );
        assert_eq!(
            MasterTarget::parse("etcd://e1:2379,e2:2379/prod").unwrap(),
            MasterTarget::Etcd {
                endpoints: vec!["e1:2379".into(), "e2:2379".into()],
                cluster: "prod".into()
            }
        );
        for bad in [
            "",
            " , ",
            "etcd://e1:2379",
            "etcd:///prod",
            "etcd://e1:2379/",
            "etcd://e1:2379/a/b",
            "bad host:1",
        ] {
            assert!(MasterTarget::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn cluster_ids_are_checked() {
        assert!(validate_cluster_id("prod-eu.1_a").is_ok());
        assert!(validate_cluster_id(&"a".repeat(63)).is_ok());
        assert!(validate_cluster_id(&"a".repeat(64)).is_err());
        assert!(validate_cluster_id("").is_err());
        assert!(validate_cluster_id("a/b").is_err());
    }

    #[test]
    fn a_not_leader_answer_moves_the_channel_and_a_failure_forgets() {
        let ch = LeaderChannel::new(MasterTarget::Addrs(vec!["a:1".into(), "b:2".into()]));
        let r = &ch.route;
        let a = futures::executor::block_on(r.pick()).unwrap();
        assert_eq!(a, "a:1");
        assert_eq!(futures::executor::block_on(r.pick()).unwrap(), "a:1");
        assert!(r.follow("b:2"));
        assert_eq!(ch.current().as_deref(), Some("b:2"));
        r.forget("a:1");
        assert_eq!(ch.current().as_deref(), Some("b:2"), "forgetting another");
        r.forget("b:2");
        assert_eq!(ch.current(), None);
        // The forgotten one is not picked again first (by turns it would
        // have been: a hung master, again and again).
        assert_eq!(futures::executor::block_on(r.pick()).unwrap(), "a:1");
        ch.forget("a:1");
        assert_eq!(futures::executor::block_on(r.pick()).unwrap(), "b:2");
        ch.forget("b:2");
        assert_eq!(futures::executor::block_on(r.pick()).unwrap(), "a:1");
    }

    /// A master's redirect is followed only to a plain HOST:PORT, and never
    /// where etcd names the leader: anything else sends the next call to
    /// look again, not to the named place.
    #[test]
    fn only_plain_redirects_are_followed_and_never_past_etcd() {
        let ch = LeaderChannel::new(MasterTarget::Addrs(vec!["a:1".into()]));
        let r = &ch.route;
        for good in ["10.0.0.7:7400", "[fe80::1]:7400", "master-1.ns.svc:7400"] {
            assert!(r.follow(good), "{good}");
            assert_eq!(ch.current().as_deref(), Some(good));
        }
        for bad in [
            "evil.example:80/steal",
            "user@host:1",
            "http://host:1",
            "host:0",
            "host",
            ":7400",
            "host:99999",
            &format!("{}:1", "a".repeat(300)),
        ] {
            assert!(!r.follow(bad), "{bad:?} followed");
            assert_eq!(ch.current(), None, "{bad:?}");
        }
        let etcd = LeaderChannel::new(MasterTarget::Etcd {
            endpoints: vec!["e:2379".into()],
            cluster: "c".into(),
        });
        assert!(!etcd.route.follow("10.0.0.7:7400"));
        assert_eq!(etcd.current(), None);
    }
}
