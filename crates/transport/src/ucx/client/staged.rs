//! SSD reads through an agent's lend window: a `Stage` request over TCP has
//! the agent read a piece into a slot it lends, the piece is read
//! one-sided, and the slot is given back ([`LentPiece`]).

use super::*;

impl UcxTransport {
    /// Whether `r` is an SSD range to read through its agent's lend window:
    /// its grant allows staging (the master gives that to rdma callers
    /// only) and the agent has not refused or failed staging lately.
    pub(super) fn stageable(&self, r: &RemoteRange) -> bool {
        if r.scope.perm & PERM_STAGE == 0 {
            return false;
        }
        let mut no = self.no_stage.lock();
        match no.get(&r.addr) {
            Some(until) if Instant::now() < *until => false,
            Some(_) => {
                no.remove(&r.addr);
                true
            }
            None => true,
        }
    }

    /// Reads of `addr` go over TCP for a while.
    fn stop_staging(&self, addr: &str) {
        let mut no = self.no_stage.lock();
        if no.len() >= MAX_ROUTES {
            no.clear();
        }
        no.insert(addr.to_string(), Instant::now() + self.cfg.retry_after);
    }

    /// The route to the window a `Stage` answer names (cached by its
    /// fingerprint).
    fn window(&self, addr: &str, st: &Staged) -> Arc<Route> {
        let mut w = self.windows.lock();
        if let Some(r) = w.get(&st.fingerprint) {
            if r.base == st.base && r.size == st.size && r.data_addr == addr {
                return r.clone();
            }
        }
        if w.len() >= MAX_ROUTES {
            w.clear();
        }
        let same_host = self.local.is_some() && on_this_host(addr);
        let route = Arc::new(Route {
            local: same_host,
            peer: Peer {
                worker: st.worker.clone().into(),
                rkey: st.rkey.clone().into(),
                same_host,
            },
            base: st.base,
            size: st.size,
            segment_id: 0,
            data_addr: addr.to_string(),
            // A lent slot is the reader's until its TTL: nothing to revoke.
            fence: None,
            attached: None,
        });
        w.insert(st.fingerprint, route.clone());
        route
    }

    /// Asks `src`'s agent to stage up to `want` bytes at `at`; the answer
    /// comes with a guard that gives the piece back when dropped (on every
    /// path, a dropped read included). `Ok(None)`: the agent does not stage.
    async fn stage(
        &self,
        src: &RemoteRange,
        at: u64,
        want: u64,
    ) -> Result<Option<(Staged, LentPiece)>> {
        // On a task of its own: if this read is dropped while the agent
        // answers, the answer (and the guard made from it) is dropped there,
        // and the piece given back.
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (tcp, range, close) = (self.tcp.clone(), src.clone(), self.own_thread);
        let ask = async move {
            let r = tcp.stage_held(&range, at, want).await.map(|(st, held)| {
                let lent = LentPiece {
                    tcp: tcp.clone(),
                    held: Some(held),
                    close,
                };
                (st, lent)
            });
            let _ = tx.send(r);
        };
        tokio::spawn(tracing::Instrument::in_current_span(ask));
        let answer = rx
            .await
            .map_err(|_| Error::internal("the staging request task ended without an answer"))?;
        match answer {
            Ok(lent) => Ok(Some(lent)),
            // An agent that stages nothing (older, TCP only) says so; one
            // that cannot be asked (a broken connection, a malformed or
            // late answer) may still serve over TCP.
            Err(e)
                if matches!(
                    e.code,
                    Code::InvalidArgument | Code::Unavailable | Code::Timeout
                ) =>
            {
                tracing::debug!(node = src.addr, error = %e, "cannot stage on this SSD agent; reading it over TCP for a while");
                self.stop_staging(&src.addr);
                Ok(None)
            }
            // A window whose slots all stayed lent: the agent's TCP path
            // (its own arena) may still serve, this time.
            Err(e) if e.code == Code::ResourceExhausted => {
                tracing::debug!(node = src.addr, error = %e, "lend window busy; reading over TCP");
                Ok(None)
            }
            // The grant or the object: TCP would say the same.
            Err(e) => Err(e),
        }
    }

    /// Reads an SSD range through its agent's lend window, a piece at a
    /// time: the agent stages the piece into a slot it lends, the piece is
    /// read one-sided, and the slot given back. The next piece is staged
    /// while this one is read (a reader holds at most two slots, and gives
    /// the first back without waiting for the second). `None`: the agent
    /// does not stage, its window stayed busy, or UCX failed on it; read
    /// over TCP instead.
    pub(super) async fn read_staged(
        &self,
        src: &RemoteRange,
        at: u64,
        buf: &mut [u8],
        crc: bool,
    ) -> Result<Option<u32>> {
        let Ok(_turn) = self.staged_reads.acquire().await else {
            return Ok(None);
        };
        let total = buf.len() as u64;
        let mut done = 0u64;
        let mut c = 0u32;
        let mut asked = Instant::now();
        let Some(mut piece) = self.stage(src, at, total).await? else {
            return Ok(None);
        };
        loop {
            let (st, lent) = piece;
            let n = st.length;
            let route = self.window(&src.addr, &st);
            // Done well before the agent may reclaim the slot (its TTL runs
            // from after the piece was read, so from `asked` is earlier).
            let ttl = Duration::from_millis(st.ttl_ms).saturating_sub(LEND_MARGIN);
            let deadline = asked + ttl.min(self.cfg.timeout);
            let (engine, deadline) = self.engine_for(&route, n as usize, deadline);
            let ttl = Duration::from_millis(st.ttl_ms);
            let get = async move {
                let got = engine
                    .get_pooled(
                        &route.peer,
                        st.base + st.window_offset,
                        n as usize,
                        deadline,
                    )
                    .await;
                // Bytes read after the agent may have reclaimed the slot
                // (and staged another reader's piece there) are not these
                // bytes.
                let got = got.and_then(|b| match asked.elapsed() < ttl {
                    true => Ok(b),
                    false => Err(Error::new(
                        Code::Timeout,
                        "a lent piece was read after its TTL",
                    )),
                });
                // Given back as soon as it is read, off the reader's path
                // (see `LentPiece`): a reader waiting for its next slot
                // holds none, so readers cannot hold every slot waiting
                // for another.
                drop(lent);
                got
            };
            let rest = total - done - n;
            let next_asked = Instant::now();
            let next = async {
                match rest {
                    0 => Ok(None),
                    _ => self.stage(src, at + done + n, rest).await,
                }
            };
            let (got, next) = futures::join!(get, next);
            match got {
                Ok(bytes) => {
                    let d = done as usize;
                    let piece_crc = copy_crc(&bytes, &mut buf[d..d + n as usize], crc);
                    c = if done == 0 {
                        piece_crc
                    } else {
                        crc32c::crc32c_combine(c, piece_crc, n as usize)
                    };
                    done += n;
                }
                Err(e) => {
                    tracing::warn!(node = src.addr, error = %e, "UCX read of a lent SSD piece failed; reading this agent over TCP for a while");
                    self.stop_staging(&src.addr);
                    return Ok(None);
                }
            }
            if done == total {
                break;
            }
            piece = match next? {
                Some(p) => p,
                None => return Ok(None),
            };
            asked = next_asked;
        }
        self.one_sided.fetch_add(1, Ordering::Relaxed);
        Ok(Some(c))
    }
}

/// A piece an agent lent: given back when dropped, on the connection that
/// staged it, by a task of its own (bounded), so neither the reader's
/// latency nor its cancellation keeps the slot. If the give-back cannot be
/// sent, the connection closes and the agent takes the slot back then
/// (agents that predate held leases: after its TTL).
/// A sibling's pieces (`UcxTransport::own_thread`) close their connection
/// instead: a task on its thread's runtime would run only at its next call.
struct LentPiece {
    tcp: Arc<TcpTransport>,
    held: Option<crate::tcp::HeldLease>,
    close: bool,
}

impl Drop for LentPiece {
    fn drop(&mut self) {
        match self.held.take() {
            Some(held) if !self.close => crate::tcp::spawn_give_back_held(self.tcp.clone(), held),
            _ => {}
        }
    }
}
