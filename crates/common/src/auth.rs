//! Who may call what. Three roles with different powers:
//! - *members* (store nodes, SSD agents) register, heartbeat and report;
//! - *clients* (engines, the CLI) put, get, exist, remove and list;
//! - *admins* may do what a client may, and also force removes, remove
//!   everything and evict;
//! - *rdma* clients may do what a client may, and also learn the UCX remote
//!   keys of store nodes' segments: one-sided access that no node checks per
//!   request, so it is a separate credential (see docs/transports.md).
//!
//! Each role has one shared secret (a token file on the master). Callers
//! present theirs as `authorization: Bearer <token>`; the master compares it
//! in constant time and never logs it. With no token files at all the master
//! runs in *protected mode*: every caller has every role, and the master only
//! listens on loopback (see `check_protected_mode`).

use crate::{Code, Error, Result};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

/// A role a call needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Member,
    Client,
    Admin,
    Rdma,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Member => "member",
            Role::Client => "client",
            Role::Admin => "admin",
            Role::Rdma => "rdma",
        }
    }
}

/// Shortest secret accepted: 128 bits of hex.
pub const MIN_SECRET_LEN: usize = 32;
const MAX_SECRET_LEN: usize = 4096;

/// A shared secret (and its hash, for constant-time comparison). Its
/// `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Arc<str>, blake3::Hash);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// 256 random bits, hex-encoded.
    pub fn generate() -> Secret {
        use rand::RngCore;
        let mut b = [0u8; 32];
        rand::thread_rng().fill_bytes(&mut b);
        let s: String = b.iter().map(|x| format!("{x:02x}")).collect();
        Secret::make(&s)
    }

    fn make(s: &str) -> Secret {
        Secret(s.into(), blake3::hash(s.as_bytes()))
    }

    /// Validates a secret: printable ASCII without spaces (it travels in an
    /// HTTP header), at least [`MIN_SECRET_LEN`] characters.
    pub fn new(s: &str) -> Result<Secret> {
        if s.len() < MIN_SECRET_LEN || s.len() > MAX_SECRET_LEN {
            return Err(Error::invalid(format!(
                "a token must be {MIN_SECRET_LEN} to {MAX_SECRET_LEN} characters, got {} \
                 (generate one with `openssl rand -hex 32`)",
                s.len()
            )));
        }
        if !s.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(Error::invalid(
                "a token must be printable ASCII without spaces (generate one with `openssl rand -hex 32`)",
            ));
        }
        Ok(Secret::make(s))
    }

    /// Reads one secret from `path` (trailing whitespace and newline ignored).
    /// `flag` names the setting in errors.
    pub fn from_file(path: &Path, flag: &str) -> Result<Secret> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::invalid(format!("cannot read {flag} {}: {e}", path.display())))?;
        Secret::new(text.trim())
            .map_err(|e| Error::invalid(format!("{flag} {}: {}", path.display(), e.message)))
    }

    /// [`Secret::from_file`] for an optional setting.
    pub fn from_optional_file(path: Option<&Path>, flag: &str) -> Result<Option<Secret>> {
        path.map(|p| Secret::from_file(p, flag)).transpose()
    }

    /// The secret itself, for writing a token file or a header.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Constant-time comparison (both sides hashed to a fixed length first,
    /// so not even the length leaks).
    pub fn matches(&self, presented: &[u8]) -> bool {
        self.matches_hash(&blake3::hash(presented))
    }

    /// [`Secret::matches`] for a token hashed once for several secrets.
    /// blake3::Hash's PartialEq is constant time.
    pub fn matches_hash(&self, presented: &blake3::Hash) -> bool {
        self.1 == *presented
    }

    /// Writes the secret to `path`, readable by its owner only, whatever
    /// file was there before (its mode is reset to 0600). A symlink at
    /// `path` is refused: the secret would land wherever it points.
    pub fn write_file(&self, path: &Path) -> Result<()> {
        use std::io::Write;
        #[cfg(unix)]
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let fail = |e: &dyn std::fmt::Display| {
            Error::internal(format!("cannot write {}: {e}", path.display()))
        };
        let mut o = std::fs::OpenOptions::new();
        o.write(true).create(true).truncate(true);
        // O_NOFOLLOW: opening a symlink fails (ELOOP), named as refused below.
        #[cfg(unix)]
        o.mode(0o600).custom_flags(libc::O_NOFOLLOW);
        let mut f = o.open(path).map_err(|e| {
            match std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
                true => fail(&"it is a symlink; a token is written only to a plain file"),
                false => fail(&e),
            }
        })?;
        // `mode` applies only to a file created now.
        #[cfg(unix)]
        f.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(|e| fail(&e))?;
        f.write_all(self.0.as_bytes())
            .and_then(|_| f.write_all(b"\n"))
            .map_err(|e| fail(&e))
    }
}

/// The roles a caller proved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Roles {
    pub member: bool,
    pub client: bool,
    pub admin: bool,
    pub rdma: bool,
}

impl Roles {
    pub const ALL: Roles = Roles {
        member: true,
        client: true,
        admin: true,
        rdma: true,
    };
    pub fn has(&self, r: Role) -> bool {
        match r {
            Role::Member => self.member,
            Role::Client => self.client,
            Role::Admin => self.admin,
            Role::Rdma => self.rdma,
        }
    }
    pub fn none(&self) -> bool {
        !(self.member || self.client || self.admin || self.rdma)
    }
}

/// The master's secrets, one per role (each optional).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    pub member: Option<Secret>,
    pub client: Option<Secret>,
    pub admin: Option<Secret>,
    pub rdma: Option<Secret>,
}

impl Credentials {
    /// Fresh secrets for every role (`strata up`, test clusters).
    pub fn generate() -> Credentials {
        Credentials {
            member: Some(Secret::generate()),
            client: Some(Secret::generate()),
            admin: Some(Secret::generate()),
            rdma: Some(Secret::generate()),
        }
    }

    /// Refuses one secret given for two roles: a member token that is also
    /// the client token would let every client act as a member (and the
    /// roles a token proves could not be told apart).
    pub fn check_distinct(&self) -> Result<()> {
        let all = [Role::Member, Role::Client, Role::Admin, Role::Rdma];
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                if let (Some(x), Some(y)) = (self.secret(*a), self.secret(*b)) {
                    if x.matches_hash(&y.1) {
                        return Err(Error::invalid(format!(
                            "the {} and {} token files hold the same secret: each role needs its own",
                            a.as_str(),
                            b.as_str()
                        )));
                    }
                }
            }
        }
        Ok(())
    }

    /// No secret at all: protected mode.
    pub fn is_empty(&self) -> bool {
        self.member.is_none()
            && self.client.is_none()
            && self.admin.is_none()
            && self.rdma.is_none()
    }

    fn secret(&self, r: Role) -> Option<&Secret> {
        match r {
            Role::Member => self.member.as_ref(),
            Role::Client => self.client.as_ref(),
            Role::Admin => self.admin.as_ref(),
            Role::Rdma => self.rdma.as_ref(),
        }
    }

    /// The roles `presented` (a bearer token, if any) proves. A token that
    /// matches no secret is refused outright.
    pub fn roles_of(&self, presented: Option<&[u8]>) -> Result<Roles> {
        if self.is_empty() {
            return Ok(Roles::ALL);
        }
        let Some(tok) = presented else {
            return Ok(Roles::default());
        };
        let h = blake3::hash(tok);
        let is = |r: Role| self.secret(r).is_some_and(|s| s.matches_hash(&h));
        let roles = Roles {
            member: is(Role::Member),
            // Admins and rdma clients may do what a client may.
            client: is(Role::Client) || is(Role::Admin) || is(Role::Rdma),
            admin: is(Role::Admin),
            rdma: is(Role::Rdma),
        };
        if roles.none() {
            return Err(Error::new(
                Code::Unauthenticated,
                "the presented token matches none of this master's credentials \
                 (check --token-file / STRATA_TOKEN_FILE against the master's token files)",
            ));
        }
        Ok(roles)
    }

    /// Whether `roles` may make a call that needs `need`; the error names
    /// the missing credential.
    pub fn check(&self, roles: Roles, need: Role) -> Result<()> {
        if roles.has(need) {
            return Ok(());
        }
        let n = need.as_str();
        if self.secret(need).is_none() {
            return Err(Error::new(
                Code::PermissionDenied,
                format!(
                    "this call needs the {n} role, and the master has no --{n}-token-file, \
                     so no caller may make it"
                ),
            ));
        }
        if roles.none() {
            return Err(Error::new(
                Code::Unauthenticated,
                format!(
                    "this call needs the {n} token: pass --token-file (env STRATA_TOKEN_FILE) \
                     holding the master's --{n}-token-file secret"
                ),
            ));
        }
        let have = [Role::Admin, Role::Rdma, Role::Client, Role::Member]
            .into_iter()
            .find(|r| roles.has(*r))
            .map_or("no", Role::as_str);
        Err(Error::new(
            Code::PermissionDenied,
            format!("this call needs the {n} role; the presented token is a {have} token"),
        ))
    }
}

/// A member process's proof of identity: random bytes it chooses at start,
/// sends when it registers and with every later call of that registration.
/// Public ids (node ids, handles, instance strings) prove nothing.
pub fn new_instance_proof() -> Vec<u8> {
    use rand::RngCore;
    let mut b = vec![0u8; 32];
    rand::thread_rng().fill_bytes(&mut b);
    b
}

/// What the master keeps of an instance proof.
#[derive(Clone, PartialEq, Eq)]
pub struct ProofHash(blake3::Hash);

impl std::fmt::Debug for ProofHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProofHash(..)")
    }
}

impl ProofHash {
    pub fn of(proof: &[u8]) -> Result<ProofHash> {
        if !(16..=64).contains(&proof.len()) {
            return Err(Error::invalid(format!(
                "instance_proof must be 16 to 64 bytes, got {} (is the member older than the master?)",
                proof.len()
            )));
        }
        Ok(ProofHash(blake3::hash(proof)))
    }

    /// Constant time (blake3::Hash equality is).
    pub fn matches(&self, proof: &[u8]) -> bool {
        self.0 == blake3::hash(proof)
    }

    /// Names one registering process among members of the same id: grant
    /// keys are derived for (id, process), so another process that registers
    /// the same id never receives the key the first one verifies with.
    pub fn member_name(&self, id: &str) -> String {
        format!("{id}#{}", self.0.to_hex())
    }
}

/// The bearer token in an `authorization` header value.
pub fn bearer(header: Option<&[u8]>) -> Option<&[u8]> {
    header.and_then(|h| h.strip_prefix(b"Bearer "))
}

/// How a master guards its calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Protection {
    /// Token files: every call is authenticated.
    Credentials,
    /// No credentials, every listener on loopback.
    LoopbackOnly,
    /// No credentials, listening beyond loopback (`--insecure`).
    Insecure(String),
}

impl Protection {
    /// Says what an operator must know at start (a WARNING without
    /// credentials).
    pub fn log(&self) {
        match self {
            Protection::Credentials => {
                tracing::info!("every call is authenticated (token files)")
            }
            Protection::LoopbackOnly => tracing::warn!(
                "protected mode: no token files, so every caller may do anything; \
                 serving on loopback only (set --member-token-file, --client-token-file \
                 and --admin-token-file to listen elsewhere)"
            ),
            Protection::Insecure(l) => tracing::warn!(
                listeners = l,
                "--insecure: serving beyond loopback WITHOUT credentials; anyone who \
                 reaches these ports may read, write and remove everything"
            ),
        }
    }
}

/// Protected mode: with no credentials, every listener must be on loopback
/// unless `insecure`. `listeners` are (flag, address) pairs.
pub fn check_protected_mode(
    creds: &Credentials,
    listeners: &[(&str, SocketAddr)],
    insecure: bool,
) -> Result<Protection> {
    if !creds.is_empty() {
        return Ok(Protection::Credentials);
    }
    let exposed: Vec<String> = listeners
        .iter()
        .filter(|(_, a)| !a.ip().is_loopback())
        .map(|(f, a)| format!("{f} {a}"))
        .collect();
    if exposed.is_empty() {
        return Ok(Protection::LoopbackOnly);
    }
    if insecure {
        return Ok(Protection::Insecure(exposed.join(", ")));
    }
    Err(Error::invalid(format!(
        "refusing to listen on {} without credentials: add --member-token-file, \
         --client-token-file and --admin-token-file (see docs/security.md), listen on \
         127.0.0.1, or pass --insecure to accept the risk",
        exposed.join(", ")
    )))
}

/// A listen address on all interfaces needs an explicit advertise address:
/// others cannot dial `0.0.0.0`, and two hosts on defaults would collide.
pub fn check_advertise(
    listen_flag: &str,
    listen: SocketAddr,
    advertise: Option<&str>,
) -> Result<()> {
    if listen.ip().is_unspecified() && advertise.is_none() {
        return Err(Error::invalid(format!(
            "{listen_flag} {listen} listens on every interface, so it needs --advertise \
             HOST:PORT (the address others dial, e.g. the pod IP)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds() -> Credentials {
        Credentials::generate()
    }

    #[test]
    fn secrets_are_validated_and_hidden() {
        assert!(Secret::new("short").is_err());
        assert!(Secret::new(&"a".repeat(MIN_SECRET_LEN - 1)).is_err());
        assert!(Secret::new(&"a".repeat(MIN_SECRET_LEN)).is_ok());
        assert!(Secret::new(&format!("{} b", "a".repeat(40))).is_err());
        let s = Secret::generate();
        assert_eq!(s.expose().len(), 64);
        assert!(!format!("{s:?}").contains(s.expose()));
        assert!(s.matches(s.expose().as_bytes()));
        assert!(!s.matches(&s.expose().as_bytes()[1..]));
        assert!(!s.matches(b""));
    }

    #[test]
    fn one_secret_is_never_accepted_for_two_roles() {
        assert!(Credentials::generate().check_distinct().is_ok());
        assert!(Credentials::default().check_distinct().is_ok());
        let s = Secret::generate();
        let twice = Credentials {
            member: Some(s.clone()),
            admin: Some(s),
            ..Credentials::generate()
        };
        let e = twice.check_distinct().unwrap_err();
        assert_eq!(e.code, Code::InvalidArgument);
        assert!(
            e.message.contains("member") && e.message.contains("admin"),
            "{e}"
        );
    }

    /// A token file is 0600 whatever was there before, and a symlink in
    /// its place is refused (its target left as it was).
    #[cfg(unix)]
    #[test]
    fn token_files_are_owner_only_and_never_written_through_a_symlink() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t");
        std::fs::write(&p, "old\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let s = Secret::generate();
        s.write_file(&p).unwrap();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(Secret::from_file(&p, "--token-file").unwrap(), s);
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "keep\n").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = s.write_file(&link).unwrap_err();
        assert!(e.message.contains("symlink"), "{e}");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep\n");
    }

    #[test]
    fn secret_files_trim_newlines_and_name_the_flag() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t");
        let s = Secret::generate();
        s.write_file(&p).unwrap();
        assert_eq!(Secret::from_file(&p, "--token-file").unwrap(), s);
        std::fs::write(&p, "x\n").unwrap();
        let e = Secret::from_file(&p, "--token-file").unwrap_err();
        assert!(e.message.contains("--token-file"), "{e}");
        let e = Secret::from_file(&dir.path().join("none"), "--admin-token-file").unwrap_err();
        assert!(e.message.contains("--admin-token-file"), "{e}");
    }

    #[test]
    fn roles_by_token() {
        let c = creds();
        let tok = |r: Option<&Secret>| r.unwrap().expose().as_bytes().to_vec();
        let m = c.roles_of(Some(&tok(c.member.as_ref()))).unwrap();
        assert!(m.member && !m.client && !m.admin);
        let cl = c.roles_of(Some(&tok(c.client.as_ref()))).unwrap();
        assert!(cl.client && !cl.member && !cl.admin);
        let a = c.roles_of(Some(&tok(c.admin.as_ref()))).unwrap();
        assert!(a.client && a.admin && !a.member && !a.rdma);
        // An rdma client may do what a client may, and nothing an admin may.
        let r = c.roles_of(Some(&tok(c.rdma.as_ref()))).unwrap();
        assert!(r.client && r.rdma && !r.admin && !r.member);
        assert!(!cl.rdma && !m.rdma);
        let e = c.roles_of(Some(b"not-a-token")).unwrap_err();
        assert_eq!(e.code, Code::Unauthenticated);
        assert_eq!(c.roles_of(None).unwrap(), Roles::default());
        // Protected mode: everyone may do anything.
        assert_eq!(Credentials::default().roles_of(None).unwrap(), Roles::ALL);
    }

    #[test]
    fn check_names_the_missing_credential() {
        let c = creds();
        let e = c.check(Roles::default(), Role::Client).unwrap_err();
        assert_eq!(e.code, Code::Unauthenticated);
        assert!(e.message.contains("client token"), "{e}");
        let member = Roles {
            member: true,
            ..Default::default()
        };
        let e = c.check(member, Role::Client).unwrap_err();
        assert_eq!(e.code, Code::PermissionDenied);
        assert!(e.message.contains("member token"), "{e}");
        let client = Roles {
            client: true,
            ..Default::default()
        };
        assert!(c.check(client, Role::Client).is_ok());
        let e = c.check(client, Role::Admin).unwrap_err();
        assert_eq!(e.code, Code::PermissionDenied);
        assert!(e.message.contains("admin role"), "{e}");
        assert!(c.check(client, Role::Member).is_err());
        let no_admin = Credentials {
            admin: None,
            ..creds()
        };
        let e = no_admin.check(client, Role::Admin).unwrap_err();
        assert!(e.message.contains("no --admin-token-file"), "{e}");
        let e = c.check(client, Role::Rdma).unwrap_err();
        assert_eq!(e.code, Code::PermissionDenied);
        assert!(e.message.contains("rdma role"), "{e}");
        let rdma = Roles {
            client: true,
            rdma: true,
            ..Default::default()
        };
        assert!(c.check(rdma, Role::Rdma).is_ok());
        let no_rdma = Credentials {
            rdma: None,
            ..creds()
        };
        let e = no_rdma.check(client, Role::Rdma).unwrap_err();
        assert!(e.message.contains("no --rdma-token-file"), "{e}");
    }

    #[test]
    fn bearer_tokens_and_partial_credentials() {
        assert_eq!(bearer(Some(b"Bearer abc")), Some(&b"abc"[..]));
        assert_eq!(bearer(Some(b"Basic abc")), None);
        assert_eq!(bearer(None), None);
        for c in [
            Credentials {
                member: Some(Secret::generate()),
                ..Default::default()
            },
            Credentials {
                client: Some(Secret::generate()),
                ..Default::default()
            },
            Credentials {
                admin: Some(Secret::generate()),
                ..Default::default()
            },
            Credentials {
                rdma: Some(Secret::generate()),
                ..Default::default()
            },
        ] {
            assert!(!c.is_empty());
            assert_eq!(c.roles_of(None).unwrap(), Roles::default());
        }
        assert!(Credentials::default().is_empty());
        assert_eq!(format!("{:?}", Secret::generate()), "Secret(..)");
        let p = ProofHash::of(&new_instance_proof()).unwrap();
        assert_eq!(format!("{p:?}"), "ProofHash(..)");
    }

    #[test]
    fn instance_proofs() {
        let p = new_instance_proof();
        let h = ProofHash::of(&p).unwrap();
        assert!(h.matches(&p));
        assert!(!h.matches(&new_instance_proof()));
        assert!(!h.matches(b""));
        assert!(ProofHash::of(&[0; 15]).is_err());
        assert!(ProofHash::of(&[0; 16]).is_ok());
        assert!(ProofHash::of(&[0; 64]).is_ok());
        assert!(ProofHash::of(&[0; 65]).is_err());
    }

    #[test]
    fn protected_mode_and_advertise() {
        let lo: SocketAddr = "127.0.0.1:7400".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:7400".parse().unwrap();
        let none = Credentials::default();
        assert_eq!(
            check_protected_mode(&none, &[("--listen", lo)], false).unwrap(),
            Protection::LoopbackOnly
        );
        let e = check_protected_mode(&none, &[("--listen", lo), ("--admin-addr", any)], false)
            .unwrap_err();
        assert!(e.message.contains("--admin-addr 0.0.0.0:7400"), "{e}");
        assert!(e.message.contains("--insecure"), "{e}");
        assert!(matches!(
            check_protected_mode(&none, &[("--listen", any)], true).unwrap(),
            Protection::Insecure(_)
        ));
        assert_eq!(
            check_protected_mode(&creds(), &[("--listen", any)], false).unwrap(),
            Protection::Credentials
        );
        let e = check_advertise("--listen", any, None).unwrap_err();
        assert!(e.message.contains("--advertise"), "{e}");
        assert!(check_advertise("--listen", any, Some("10.0.0.1:7400")).is_ok());
        assert!(check_advertise("--listen", lo, None).is_ok());
    }
}
