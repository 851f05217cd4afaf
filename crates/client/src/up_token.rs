//! The tokens a local `strata up` leaves for the CLI and the Python client
//! on the same machine, and which master they are for: a client uses them
//! only for that master, so a local cluster's admin token never goes to
//! another master it was pointed at.

/// Where `strata up` leaves its admin token for the CLI on the same machine:
/// `$XDG_CONFIG_HOME/strata/up.token` or `~/.config/strata/up.token`; and
/// (`rdma`) its rdma token, `up-rdma.token`, when its nodes serve UCX.
pub fn default_token_file(rdma: bool) -> Option<std::path::PathBuf> {
    Some(up_file(&config_dir()?, rdma))
}

/// `$XDG_CONFIG_HOME/strata` or `~/.config/strata`.
fn config_dir() -> Option<std::path::PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| std::path::PathBuf::from(h).join(".config"))
        })?;
    Some(base.join("strata"))
}

fn up_file(dir: &std::path::Path, rdma: bool) -> std::path::PathBuf {
    dir.join(if rdma { "up-rdma.token" } else { "up.token" })
}

/// The file naming the master a running `strata up` started (its tokens
/// are for that master alone).
pub fn master_file() -> Option<std::path::PathBuf> {
    Some(master_file_in(&config_dir()?))
}

fn master_file_in(dir: &std::path::Path) -> std::path::PathBuf {
    dir.join("up.master")
}

/// The token a running `strata up` left for `master`: only when `master`
/// is the one it started, so the CLI never hands the local cluster's admin
/// token to another master it was pointed at.
pub fn token_for(master: &str, rdma: bool) -> Option<std::path::PathBuf> {
    token_in(&config_dir()?, master, rdma)
}

fn token_in(dir: &std::path::Path, master: &str, rdma: bool) -> Option<std::path::PathBuf> {
    let started = std::fs::read_to_string(master_file_in(dir)).ok()?;
    let (started, master) = (started.trim(), master.trim());
    let same = match (
        started.parse::<std::net::SocketAddr>(),
        master.parse::<std::net::SocketAddr>(),
    ) {
        (Ok(a), Ok(b)) => a == b,
        _ => started == master,
    };
    let p = up_file(dir, rdma);
    (same && p.exists()).then_some(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CLI uses a `strata up` token only for the master that `strata
    /// up` started: never for another address, and not without the file
    /// naming it (a `strata up` that predates it).
    #[test]
    fn an_up_token_goes_only_to_the_master_up_started() {
        let dir = &std::env::temp_dir().join(format!("strata-up-token-{}", std::process::id()));
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(up_file(dir, false), "secret\n").unwrap();
        assert_eq!(
            token_in(dir, "127.0.0.1:7400", false),
            None,
            "no master file"
        );
        std::fs::write(master_file_in(dir), "127.0.0.1:7400\n").unwrap();
        assert_eq!(
            token_in(dir, "127.0.0.1:7400", false),
            Some(up_file(dir, false))
        );
        assert_eq!(
            token_in(dir, " 127.0.0.1:7400 ", false),
            Some(up_file(dir, false))
        );
        for other in [
            "10.0.0.5:7400",
            "127.0.0.1:7401",
            "evil.example:7400",
            "etcd://x/strata",
        ] {
            assert_eq!(token_in(dir, other, false), None, "{other}");
        }
        assert_eq!(token_in(dir, "127.0.0.1:7400", true), None, "no rdma token");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
