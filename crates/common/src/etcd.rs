//! How a process reaches etcd: who it is there (a user and password, for an
//! etcd with authentication on) and how the connection is protected (TLS:
//! the CA that signed etcd's certificate, and this process's own certificate
//! when etcd asks for one). The masters take both from flags; processes that
//! find the leader through `etcd://…` from the same-named environment
//! variables.

use crate::{Error, Result};
use std::path::Path;
use std::time::Duration;

/// An etcd user and its password, for an etcd with authentication on.
#[derive(Clone)]
pub struct EtcdAuth {
    pub user: String,
    pub password: crate::auth::Secret,
}

impl std::fmt::Debug for EtcdAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EtcdAuth({:?}, <password>)", self.user)
    }
}

impl EtcdAuth {
    /// From a user name and a password file (both or neither).
    pub fn from_parts(
        user: Option<String>,
        password_file: Option<&Path>,
    ) -> Result<Option<EtcdAuth>> {
        match (user.filter(|u| !u.is_empty()), password_file) {
            (None, None) => Ok(None),
            (Some(user), Some(f)) => Ok(Some(EtcdAuth {
                user,
                password: crate::auth::Secret::from_file(f, "--etcd-password-file")?,
            })),
            _ => Err(Error::invalid(
                "etcd authentication needs both a user (--etcd-user, STRATA_ETCD_USER) \
                 and a password file (--etcd-password-file, STRATA_ETCD_PASSWORD_FILE)",
            )),
        }
    }
}

/// TLS to etcd: the CA certificates etcd's own certificate must chain to,
/// and, for an etcd that checks its clients (`--client-cert-auth`), this
/// process's certificate and key. Only PEM files; read and checked once, at
/// start.
#[derive(Clone)]
pub struct EtcdTls {
    ca: Vec<u8>,
    /// Certificate and key (PEM); the key never shows in `Debug`.
    identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let who = if self.identity.is_some() {
            "a client certificate"
        } else {
            "no client certificate"
        };
        write!(f, "EtcdTls(a CA, {who})")
    }
}

/// Largest PEM file taken (a CA bundle of a few hundred certificates).
const MAX_PEM: u64 = 1 << 20;

/// Reads a PEM file for `flag`, refusing anything without a `kind` block.
fn read_pem(path: &Path, flag: &str, kind: &str) -> Result<Vec<u8>> {
    use std::io::Read;
    let fail = |e: &dyn std::fmt::Display| {
        Error::invalid(format!("cannot read {flag} {}: {e}", path.display()))
    };
    let f = std::fs::File::open(path).map_err(|e| fail(&e))?;
    let mut buf = Vec::new();
    f.take(MAX_PEM + 1)
        .read_to_end(&mut buf)
        .map_err(|e| fail(&e))?;
    if buf.len() as u64 > MAX_PEM {
        return Err(fail(&format!("larger than {MAX_PEM} bytes")));
    }
    // Parsed here (as the TLS stack will at connect) so a bad file fails at
    // start: an unreadable CA would leave an empty trust store otherwise.
    use rustls_pki_types::pem::PemObject;
    let ok = match kind {
        "CERTIFICATE" => {
            let certs: Vec<_> = rustls_pki_types::CertificateDer::pem_slice_iter(&buf).collect();
            !certs.is_empty() && certs.iter().all(Result::is_ok)
        }
        _ => rustls_pki_types::PrivateKeyDer::from_pem_slice(&buf).is_ok(),
    };
    if !ok {
        return Err(fail(&format!(
            "not a PEM file with a {kind} (-----BEGIN …{kind}----- and base64 after it)"
        )));
    }
    Ok(buf)
}

impl EtcdTls {
    /// From the CA file and, optionally, a client certificate and its key
    /// (those two together). No CA, no certificate: no TLS.
    pub fn from_files(
        ca: Option<&Path>,
        cert: Option<&Path>,
        key: Option<&Path>,
    ) -> Result<Option<EtcdTls>> {
        let Some(ca) = ca else {
            return match (cert, key) {
                (None, None) => Ok(None),
                _ => Err(Error::invalid(
                    "a client certificate for etcd (--etcd-cert-file, --etcd-key-file) needs \
                     the CA that signed etcd's certificate too (--etcd-ca-file, STRATA_ETCD_CA_FILE)",
                )),
            };
        };
        let ca = read_pem(ca, "--etcd-ca-file", "CERTIFICATE")?;
        let identity = match (cert, key) {
            (None, None) => None,
            (Some(cert), Some(key)) => {
                let cert = read_pem(cert, "--etcd-cert-file", "CERTIFICATE")?;
                let key = read_pem(key, "--etcd-key-file", "PRIVATE KEY")?;
                Some((cert, key))
            }
            _ => {
                return Err(Error::invalid(
                    "a client certificate for etcd needs both --etcd-cert-file and \
                     --etcd-key-file (STRATA_ETCD_CERT_FILE, STRATA_ETCD_KEY_FILE)",
                ))
            }
        };
        Ok(Some(EtcdTls { ca, identity }))
    }

    fn options(&self) -> etcd_client::TlsOptions {
        let mut o = etcd_client::TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(&self.ca));
        if let Some((cert, key)) = &self.identity {
            o = o.identity(etcd_client::Identity::from_pem(cert, key));
        }
        o
    }
}

/// Everything a process needs to reach etcd beyond its endpoints.
#[derive(Clone, Debug, Default)]
pub struct EtcdAccess {
    pub auth: Option<EtcdAuth>,
    pub tls: Option<EtcdTls>,
}

impl EtcdAccess {
    /// From the masters' flags: user and password file, CA, certificate
    /// and key files (each pair both or neither).
    pub fn from_parts(
        user: Option<String>,
        password_file: Option<&Path>,
        ca: Option<&Path>,
        cert: Option<&Path>,
        key: Option<&Path>,
    ) -> Result<EtcdAccess> {
        Ok(EtcdAccess {
            auth: EtcdAuth::from_parts(user, password_file)?,
            tls: EtcdTls::from_files(ca, cert, key)?,
        })
    }

    /// What a process that finds its master through etcd (`etcd://…`)
    /// presents: `STRATA_ETCD_USER`, `STRATA_ETCD_PASSWORD_FILE`,
    /// `STRATA_ETCD_CA_FILE`, `STRATA_ETCD_CERT_FILE`, `STRATA_ETCD_KEY_FILE`.
    pub fn from_env() -> Result<EtcdAccess> {
        let file = |name: &str| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(std::path::PathBuf::from)
        };
        Self::from_parts(
            std::env::var("STRATA_ETCD_USER").ok(),
            file("STRATA_ETCD_PASSWORD_FILE").as_deref(),
            file("STRATA_ETCD_CA_FILE").as_deref(),
            file("STRATA_ETCD_CERT_FILE").as_deref(),
            file("STRATA_ETCD_KEY_FILE").as_deref(),
        )
    }

    /// Whether any setting is given (they are for HA mode only).
    pub fn is_set(&self) -> bool {
        self.auth.is_some() || self.tls.is_some()
    }

    /// `endpoints` as URLs: a bare `HOST:PORT` gets `https://` with TLS
    /// and `http://` without. A scheme that contradicts the settings is
    /// refused rather than followed: an `http://` endpoint would send the
    /// password in the clear, an `https://` one without a CA could not
    /// check whom it talks to.
    pub fn urls(&self, endpoints: &[String]) -> Result<Vec<String>> {
        let tls = self.tls.is_some();
        endpoints
            .iter()
            .map(|e| {
                let (scheme, host) = match e.split_once("://") {
                    Some((s, h)) => (Some(s), h),
                    None => (None, e.as_str()),
                };
                // A trailing '/' as in `http://e:2379/` was always taken.
                let host = host.trim_end_matches('/');
                if host.is_empty() || host.contains('/') {
                    return Err(Error::invalid(format!(
                        "etcd endpoint {e:?} must look like HOST:PORT (or http(s)://HOST:PORT)"
                    )));
                }
                match (scheme, tls) {
                    (None, true) | (Some("https"), true) => Ok(format!("https://{host}")),
                    (None, false) | (Some("http"), false) => Ok(format!("http://{host}")),
                    (Some("http"), true) => Err(Error::invalid(format!(
                        "etcd endpoint {e:?} is http:// but TLS to etcd is set \
                         (--etcd-ca-file): give https:// or HOST:PORT"
                    ))),
                    (Some("https"), false) => Err(Error::invalid(format!(
                        "etcd endpoint {e:?} is https:// but no CA to check it is given \
                         (--etcd-ca-file, STRATA_ETCD_CA_FILE)"
                    ))),
                    (Some(s), _) => Err(Error::invalid(format!(
                        "etcd endpoint {e:?}: unknown scheme {s:?} (http or https)"
                    ))),
                }
            })
            .collect()
    }
}

/// Connects an etcd client with no user and no TLS (lazily dialled,
/// bounded timeouts).
pub async fn etcd_client(endpoints: &[String]) -> Result<etcd_client::Client> {
    etcd_client_with(endpoints, &EtcdAccess::default()).await
}

/// [`etcd_client`] as `access` says: its user (an etcd with authentication
/// on) and its TLS settings.
pub async fn etcd_client_with(
    endpoints: &[String],
    access: &EtcdAccess,
) -> Result<etcd_client::Client> {
    let urls = access.urls(endpoints)?;
    let mut opts = etcd_client::ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(3))
        .with_timeout(Duration::from_secs(5))
        .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2));
    if let Some(a) = &access.auth {
        // Tokens expire (and die with an etcd restart): log in again then.
        opts = opts
            .with_user(a.user.clone(), a.password.expose().to_string())
            .with_auto_token_refresh(true);
    }
    if let Some(t) = &access.tls {
        opts = opts.with_tls(t.options());
    }
    etcd_client::Client::connect(&urls, Some(opts))
        .await
        .map_err(|e| Error::unavailable(format!("cannot reach etcd at {urls:?}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    const CERT: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
    const KEY: &str = "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n";
    /// The right header and footer around what is not base64.
    const JUNK_CERT: &str = "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n";

    #[test]
    fn endpoints_take_the_scheme_of_the_settings_and_contradictions_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ca = write(dir.path(), "ca.pem", CERT);
        let plain = EtcdAccess::default();
        let tls = EtcdAccess {
            tls: EtcdTls::from_files(Some(&ca), None, None).unwrap(),
            ..Default::default()
        };
        let eps = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            plain
                .urls(&eps(&["e1:2379", "http://e2:2379", "http://e3:2379/"]))
                .unwrap(),
            ["http://e1:2379", "http://e2:2379", "http://e3:2379"]
        );
        assert_eq!(
            tls.urls(&eps(&["e1:2379", "https://e2:2379"])).unwrap(),
            ["https://e1:2379", "https://e2:2379"]
        );
        for (access, bad) in [
            (&tls, "http://e:2379"),
            (&plain, "https://e:2379"),
            (&plain, "ftp://e:2379"),
            (&plain, ""),
            (&plain, "e:2379/x"),
            (&plain, "http:///"),
        ] {
            let err = access.urls(&eps(&[bad])).unwrap_err();
            assert_eq!(err.code, crate::Code::InvalidArgument, "{bad:?}");
        }
    }

    #[test]
    fn tls_files_are_checked_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (ca, cert, key) = (
            write(d, "ca.pem", CERT),
            write(d, "c.pem", CERT),
            write(d, "k.pem", KEY),
        );
        let junk = write(d, "junk.pem", "not a certificate\n");
        let junk_body = write(d, "junk-body.pem", JUNK_CERT);
        let missing = d.join("missing.pem");
        assert!(EtcdTls::from_files(None, None, None).unwrap().is_none());
        let t = EtcdTls::from_files(Some(&ca), Some(&cert), Some(&key)).unwrap();
        assert!(t.unwrap().identity.is_some());
        assert!(EtcdTls::from_files(Some(&ca), None, None)
            .unwrap()
            .unwrap()
            .identity
            .is_none());
        type Files<'a> = (Option<&'a Path>, Option<&'a Path>, Option<&'a Path>);
        let refused: [(Files, &str); 8] = [
            ((Some(&junk_body), None, None), "--etcd-ca-file"),
            ((None, Some(&cert), Some(&key)), "--etcd-ca-file"),
            ((Some(&ca), Some(&cert), None), "both"),
            ((Some(&ca), None, Some(&key)), "both"),
            ((Some(&junk), None, None), "--etcd-ca-file"),
            ((Some(&ca), Some(&junk), Some(&key)), "--etcd-cert-file"),
            // A certificate is not a key.
            ((Some(&ca), Some(&cert), Some(&cert)), "--etcd-key-file"),
            ((Some(&missing), None, None), "--etcd-ca-file"),
        ];
        for ((ca, cert, key), says) in refused {
            let e = EtcdTls::from_files(ca, cert, key).unwrap_err();
            assert_eq!(e.code, crate::Code::InvalidArgument);
            assert!(e.message.contains(says), "{says}: {}", e.message);
        }
        let big = write(
            d,
            "big.pem",
            &format!("{CERT}{}", "x".repeat(MAX_PEM as usize)),
        );
        let e = EtcdTls::from_files(Some(&big), None, None).unwrap_err();
        assert!(e.message.contains("larger than"), "{}", e.message);
        // The key never shows in logs.
        let t = EtcdTls::from_files(Some(&ca), Some(&cert), Some(&key)).unwrap();
        assert!(!format!("{t:?}").contains("MIIE"));
    }
}
