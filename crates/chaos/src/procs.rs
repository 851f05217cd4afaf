//! The real binaries as child processes: where they are, their credentials,
//! signals, and waiting for them to serve.

use anyhow::Context;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

/// A child process killed (SIGKILL) and reaped when dropped.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Proc {
    /// Sends `sig` (`libc::SIGSTOP`, …); a process already gone is not an
    /// error (it may have died of the fault being injected).
    pub fn signal(&self, sig: libc::c_int) {
        // SAFETY: a plain syscall on our own child's pid.
        unsafe { libc::kill(self.0.id() as libc::pid_t, sig) };
    }

    /// Waits (bounded) for the process to exit and returns its code.
    pub async fn exit_code(&mut self, within: Duration) -> Option<i32> {
        let t0 = Instant::now();
        while t0.elapsed() < within {
            if let Ok(Some(st)) = self.0.try_wait() {
                return st.code();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }
}

/// Token files for every role.
pub struct TokenFiles {
    pub member: PathBuf,
    pub client: PathBuf,
    pub admin: PathBuf,
    pub rdma: PathBuf,
}

impl TokenFiles {
    /// Fresh secrets for every role, written (0600) into `dir`.
    pub fn generate(dir: &Path) -> anyhow::Result<TokenFiles> {
        let c = strata_common::auth::Credentials::generate();
        let f = |name: &str, s: &Option<strata_common::auth::Secret>| -> anyhow::Result<PathBuf> {
            let p = dir.join(name);
            s.as_ref()
                .context("generated credentials name every role")?
                .write_file(&p)?;
            Ok(p)
        };
        Ok(TokenFiles {
            member: f("member.token", &c.member)?,
            client: f("client.token", &c.client)?,
            admin: f("admin.token", &c.admin)?,
            rdma: f("rdma.token", &c.rdma)?,
        })
    }

    /// The master flags that load them.
    pub fn master_args(&self) -> Vec<String> {
        let mut v = Vec::new();
        for (flag, p) in [
            ("--member-token-file", &self.member),
            ("--client-token-file", &self.client),
            ("--admin-token-file", &self.admin),
            ("--rdma-token-file", &self.rdma),
        ] {
            v.push(flag.to_string());
            v.push(p.to_string_lossy().into_owned());
        }
        v
    }

    /// The client secret, for `ClientConfig::with_token`.
    pub fn client_secret(&self) -> anyhow::Result<strata_common::auth::Secret> {
        Ok(strata_common::auth::Secret::from_file(
            &self.client,
            "--token-file",
        )?)
    }
}

/// The directory holding `strata-master`, `strata-store-node`, …:
/// `STRATA_BIN_DIR` when set, else beside the running executable (the
/// `strata` CLI) or one level up (a test binary in `target/<profile>/deps`).
pub fn bin_dir() -> anyhow::Result<PathBuf> {
    if let Some(d) = std::env::var_os("STRATA_BIN_DIR") {
        return Ok(PathBuf::from(d));
    }
    let exe = std::env::current_exe().context("the running executable's path")?;
    let mut dir = exe.parent();
    while let Some(d) = dir {
        if d.join("strata-master").exists() {
            return Ok(d.to_path_buf());
        }
        // Beside the executable, or its parent; no further.
        if Some(d) != exe.parent() {
            break;
        }
        dir = d.parent();
    }
    anyhow::bail!(
        "strata-master is not beside {} (build the workspace's binaries: \
         `cargo build --workspace --bins`, or set STRATA_BIN_DIR)",
        exe.display()
    )
}

/// Whether `GET http://{admin}/ready` answers 200 within a second: Some(true)
/// serving, Some(false) answering but not serving (a follower, still
/// starting), None no answer (a busy machine, or a host cut off).
pub async fn ready(admin: &str) -> Option<bool> {
    let get = reqwest::get(format!("http://{admin}/ready"));
    match tokio::time::timeout(Duration::from_secs(1), get).await {
        Ok(Ok(r)) => Some(r.status().is_success()),
        _ => None,
    }
}

/// Waits until `admin`'s `/ready` answers 200, at most `within`.
pub async fn wait_ready(admin: &str, within: Duration) -> anyhow::Result<()> {
    let t0 = Instant::now();
    while t0.elapsed() < within {
        if ready(admin).await == Some(true) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    anyhow::bail!("{admin} was not ready within {within:?}")
}
