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
        let e = self.endpoint.as_str();
        e.split_once("://").map_or(e, |(_, h)| h)
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
        Self::start_with(None).await
    }

    /// An etcd serving its clients over TLS only, with a certificate for
    /// 127.0.0.1 signed by `tls`'s CA, and admitting only clients whose
    /// certificate that CA signed (`--client-cert-auth`).
    pub async fn start_tls(tls: &TestCerts) -> EtcdServer {
        Self::start_with(Some(tls)).await
    }

    async fn start_with(tls: Option<&TestCerts>) -> EtcdServer {
        let dir = tempfile::tempdir().unwrap();
        let (c, p) = (free_port(), free_port());
        let scheme = if tls.is_some() { "https" } else { "http" };
        let (client, peer) = (
            format!("{scheme}://127.0.0.1:{c}"),
            format!("http://127.0.0.1:{p}"),
        );
        let mut cmd = std::process::Command::new("etcd");
        if let Some(t) = tls {
            cmd.arg("--cert-file")
                .arg(t.file("server.pem"))
                .arg("--key-file")
                .arg(t.file("server.key"))
                .arg("--trusted-ca-file")
                .arg(t.file("ca.pem"))
                .arg("--client-cert-auth");
        }
        let child = cmd
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
        let access = tls.map(TestCerts::client_access).unwrap_or_default();
        // Serving once a read succeeds; bounded.
        let t0 = std::time::Instant::now();
        loop {
            if let Ok(c) =
                crate::leader::etcd_client_with(std::slice::from_ref(&server.endpoint), &access)
                    .await
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

/// A throwaway CA with a server certificate for 127.0.0.1 and a client
/// certificate it signed, made with the `openssl` command (installed by
/// `scripts/install-deps.sh`), PEM files in a directory of their own:
/// `ca.pem`, `server.pem`/`server.key`, `client.pem`/`client.key`.
pub struct TestCerts {
    dir: tempfile::TempDir,
}

impl TestCerts {
    /// Makes them (elliptic-curve keys: fast). `name` tells two CAs apart.
    pub fn new(name: &str) -> TestCerts {
        let dir = tempfile::tempdir().unwrap();
        let run = |args: &[&str]| {
            let out = std::process::Command::new("openssl")
                .args(args)
                .current_dir(dir.path())
                .output()
                .expect("openssl must be installed: scripts/install-deps.sh");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
        let ca_subj = format!("/CN={name} test CA");
        let mut ca = vec!["req", "-x509", "-nodes", "-days", "2"];
        ca.extend(ec);
        ca.extend([
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-subj",
            ca_subj.as_str(),
        ]);
        run(&ca);
        for (who, usage) in [("server", "serverAuth"), ("client", "clientAuth")] {
            let (key, csr, pem, ext) = (
                format!("{who}.key"),
                format!("{who}.csr"),
                format!("{who}.pem"),
                format!("{who}.ext"),
            );
            std::fs::write(
                dir.path().join(&ext),
                format!("subjectAltName=IP:127.0.0.1\nextendedKeyUsage={usage}\n"),
            )
            .unwrap();
            let subj = format!("/CN=strata-{who}");
            let mut req = vec!["req", "-nodes"];
            req.extend(ec);
            req.extend([
                "-keyout",
                key.as_str(),
                "-out",
                csr.as_str(),
                "-subj",
                subj.as_str(),
            ]);
            run(&req);
            run(&[
                "x509",
                "-req",
                "-in",
                csr.as_str(),
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-out",
                pem.as_str(),
                "-extfile",
                ext.as_str(),
            ]);
        }
        TestCerts { dir }
    }

    /// One of its files.
    pub fn file(&self, name: &str) -> std::path::PathBuf {
        self.dir.path().join(name)
    }

    /// What a client presents with these: the CA, and its own certificate.
    pub fn client_access(&self) -> crate::leader::EtcdAccess {
        let (ca, cert, key) = (
            self.file("ca.pem"),
            self.file("client.pem"),
            self.file("client.key"),
        );
        crate::leader::EtcdAccess {
            tls: crate::leader::EtcdTls::from_files(Some(&ca), Some(&cert), Some(&key)).unwrap(),
            ..Default::default()
        }
    }
}
