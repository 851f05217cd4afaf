//! Where a UCX client learns its routes: the master's `GetUcxRoutes` (the
//! rdma role), one fetch at a time, cached per segment registration, and
//! demoted to TCP for a while when UCX fails on one.

use super::*;

impl UcxTransport {
    /// `r`'s route, from the cache or (once per segment registration) the
    /// master.
    pub(super) async fn route(&self, r: &RemoteRange) -> Option<Arc<Route>> {
        if let Some(known) = self.cached(r) {
            return known;
        }
        self.fetch_missing(&[r]).await;
        self.cached(r).flatten()
    }

    /// Fetches the routes of those of `ranges` the cache knows nothing of,
    /// one fetch at a time: transfers that miss together wait for the fetch
    /// in flight (bounded like a fetch; past it they go over TCP uncached)
    /// and ask only for what its answer did not hold.
    pub(super) async fn fetch_missing(&self, ranges: &[&RemoteRange]) {
        let Ok(_turn) = tokio::time::timeout(ROUTE_FETCH_TIMEOUT, self.fetching.lock()).await
        else {
            return;
        };
        let missing: Vec<&RemoteRange> = ranges
            .iter()
            .copied()
            .filter(|r| self.cached(r).is_none())
            .collect();
        if !missing.is_empty() {
            self.fetch(&missing).await;
        }
    }

    /// What the cache says of `r`'s route: `None` when the master must be
    /// asked (never asked, or a while of TCP has passed), else the route to
    /// use (`Some(None)`: TCP for now).
    pub(super) fn cached(&self, r: &RemoteRange) -> Option<Option<Arc<Route>>> {
        match self.routes.lock().get(&key_of(r)) {
            Some(Known::Ucx(route)) => Some(route.serves(r).then(|| route.clone())),
            Some(Known::Tcp(until)) if Instant::now() < *until => Some(None),
            _ => None,
        }
    }

    /// Transfers that went one-sided so far.
    pub fn one_sided_transfers(&self) -> u64 {
        self.one_sided.load(Ordering::Relaxed)
    }

    /// Asks the master for the routes of `ranges` (one request) and caches
    /// the answer, a route or (none published, no answer) a while of TCP.
    async fn fetch(&self, ranges: &[&RemoteRange]) {
        let mut ids: Vec<u64> = ranges.iter().map(|r| r.scope.segment_id).collect();
        ids.sort_unstable();
        ids.dedup();
        let demotions = self.demotions.load(Ordering::Acquire);
        let fetched = tokio::time::timeout(ROUTE_FETCH_TIMEOUT, self.source.routes(ids)).await;
        let (routes, retry) = match fetched {
            Ok(Ok(v)) => (v, self.cfg.retry_after),
            Ok(Err(e)) if matches!(e.code, Code::PermissionDenied | Code::Unauthenticated) => {
                let mut d = self.denied_until.lock();
                if d.is_none() {
                    tracing::warn!(error = %e, "the master gives UCX routes to rdma clients only; reading and writing over TCP");
                }
                *d = Some(Instant::now() + self.cfg.retry_after);
                return;
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "cannot fetch UCX routes; these transfers go over TCP");
                (Vec::new(), FETCH_RETRY)
            }
            Err(_) => {
                tracing::debug!(
                    "the master did not answer for UCX routes in time; these transfers go over TCP"
                );
                (Vec::new(), FETCH_RETRY)
            }
        };
        let mut cache = self.routes.lock();
        if cache.len() >= MAX_ROUTES {
            cache.clear();
        }
        // A demotion while the master answered: its TCP pause stands.
        let demoted = self.demotions.load(Ordering::Acquire) != demotions;
        let now = Instant::now();
        for mut x in routes {
            let key = (x.fingerprint, x.segment_id);
            if demoted && matches!(cache.get(&key), Some(Known::Tcp(until)) if *until > now) {
                continue;
            }
            // Only with the shared-memory engine: a same-host peer is
            // connected without peer failure handling.
            let same_host = self.local.is_some() && on_this_host(&x.data_addr);
            let worker: Arc<[u8]> = std::mem::take(&mut x.worker).into();
            let fence = FenceRoute::of(&x, &worker, same_host);
            let route = Route {
                local: same_host,
                attached: x
                    .process
                    .as_ref()
                    .filter(|_| same_host && fence.is_some())
                    .and_then(|p| Attached::of(p, x.base, x.size)),
                fence,
                peer: Peer {
                    worker,
                    rkey: x.rkey.into(),
                    same_host,
                },
                base: x.base,
                size: x.size,
                segment_id: x.segment_id,
                data_addr: x.data_addr,
            };
            cache.insert(key, Known::Ucx(Arc::new(route)));
        }
        // Ranges whose route the answer did not hold (or another one: a
        // newer registration) go over TCP for a while.
        for r in ranges {
            let found = matches!(cache.get(&key_of(r)), Some(Known::Ucx(x)) if x.serves(r));
            if !found {
                cache.insert(key_of(r), Known::Tcp(Instant::now() + retry));
            }
        }
    }

    /// UCX failed on `r`'s route: TCP for a while (the node may have died,
    /// or UCX cannot reach it from here), then the route is fetched and
    /// tried again. The transfer itself is retried over TCP at once, which
    /// fails fast if the node is gone.
    pub(super) fn demote(&self, r: &RemoteRange, e: &Error) {
        tracing::warn!(node = r.addr, error = %e, "UCX transfer failed; using TCP for this segment for a while");
        let mut cache = self.routes.lock();
        cache.insert(key_of(r), Known::Tcp(Instant::now() + self.cfg.retry_after));
        self.demotions.fetch_add(1, Ordering::Release);
    }
}
