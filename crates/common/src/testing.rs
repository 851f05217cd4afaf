//! Test support shared by the crates' tests (feature `testing`).

/// A real single-node etcd on loopback (Debian's `etcd-server`, installed by
/// `scripts/install-deps.sh`), killed when dropped.
pub struct EtcdServer {
    child: std::process::Child,
    pub endpoint: String,
    _dir: tempfile::TempDir,
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    crate::ports::unused_loopback_port().expect("a free loopback port")
}

impl EtcdServer {
    /// HOST:PORT of its client URL (for `etcd://HOST:PORT/CLUSTER`).
    pub fn host_port(&self) -> &str {
        self.endpoint.trim_start_matches("http://")
    }

    /// Sends a signal (`-STOP`, `-CONT`) to this etcd's process.
    pub fn signal(&self, sig: &str) {
        let st = std::process::Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(st.success(), "kill {sig}");
    }

    pub async fn start() -> EtcdServer {
        let dir = tempfile::tempdir().unwrap();
        let (c, p) = (free_port(), free_port());
        let (client, peer) = (
            format!("http://127.0.0.1:{c}"),
            format!("http://127.0.0.1:{p}"),
        );
        let child = std::process::Command::new("etcd")
            .args(["--name", "t", "--data-dir"])
            .arg(dir.path())
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &format!("t={peer}")])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("etcd (Debian's etcd-server) must be installed: scripts/install-deps.sh");
        let server = EtcdServer {
            child,
            endpoint: client,
            _dir: dir,
        };
        // Serving once a read succeeds; bounded.
        let t0 = std::time::Instant::now();
        loop {
            if let Ok(c) = crate::leader::etcd_client(std::slice::from_ref(&server.endpoint)).await
            {
                if c.kv_client().get("x", None).await.is_ok() {
                    return server;
                }
            }
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(30),
                "etcd did not start"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}
