//! The one error type that crosses service boundaries, and the one place that
//! maps its codes to gRPC and HTTP statuses.

use std::fmt;

/// Stable numeric error codes. They travel in gRPC metadata (`x-strata-code`)
/// and in batch results, so never renumber them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Code {
    Ok = 0,
    InvalidArgument = 1,
    NotFound = 2,
    NotReady = 3,
    AlreadyExists = 4,
    NoSpace = 5,
    Leased = 6,
    Unavailable = 7,
    PermissionDenied = 8,
    Timeout = 9,
    Corrupted = 10,
    Internal = 11,
    Cancelled = 12,
    ResourceExhausted = 13,
    /// No (valid) credential was presented for a call that needs one.
    Unauthenticated = 14,
    /// This master does not lead (a follower, or a deposed leader); the
    /// error names the leader when it knows one. Retryable.
    NotLeader = 15,
}

impl Code {
    pub fn from_u32(v: u32) -> Code {
        use Code::*;
        match v {
            0 => Ok,
            1 => InvalidArgument,
            2 => NotFound,
            3 => NotReady,
            4 => AlreadyExists,
            5 => NoSpace,
            6 => Leased,
            7 => Unavailable,
            8 => PermissionDenied,
            9 => Timeout,
            10 => Corrupted,
            12 => Cancelled,
            13 => ResourceExhausted,
            14 => Unauthenticated,
            15 => NotLeader,
            _ => Internal,
        }
    }

    /// Whether a client may retry the same request after backing off.
    pub fn retryable(self) -> bool {
        matches!(
            self,
            Code::NotReady
                | Code::Unavailable
                | Code::Timeout
                | Code::ResourceExhausted
                | Code::NotLeader
        )
    }

    pub fn as_str(self) -> &'static str {
        use Code::*;
        match self {
            Ok => "ok",
            InvalidArgument => "invalid_argument",
            NotFound => "not_found",
            NotReady => "not_ready",
            AlreadyExists => "already_exists",
            NoSpace => "no_space",
            Leased => "leased",
            Unavailable => "unavailable",
            PermissionDenied => "permission_denied",
            Timeout => "timeout",
            Corrupted => "corrupted",
            Internal => "internal",
            Cancelled => "cancelled",
            ResourceExhausted => "resource_exhausted",
            Unauthenticated => "unauthenticated",
            NotLeader => "not_leader",
        }
    }

    pub fn grpc(self) -> tonic::Code {
        use Code::*;
        match self {
            Ok => tonic::Code::Ok,
            InvalidArgument => tonic::Code::InvalidArgument,
            NotFound => tonic::Code::NotFound,
            NotReady => tonic::Code::Unavailable,
            AlreadyExists => tonic::Code::AlreadyExists,
            NoSpace => tonic::Code::ResourceExhausted,
            Leased => tonic::Code::FailedPrecondition,
            Unavailable => tonic::Code::Unavailable,
            PermissionDenied => tonic::Code::PermissionDenied,
            Timeout => tonic::Code::DeadlineExceeded,
            Corrupted => tonic::Code::DataLoss,
            Internal => tonic::Code::Internal,
            Cancelled => tonic::Code::Cancelled,
            ResourceExhausted => tonic::Code::ResourceExhausted,
            Unauthenticated => tonic::Code::Unauthenticated,
            NotLeader => tonic::Code::Unavailable,
        }
    }

    pub fn http(self) -> u16 {
        use Code::*;
        match self {
            Ok => 200,
            InvalidArgument => 400,
            NotFound => 404,
            NotReady | Unavailable | NotLeader => 503,
            AlreadyExists | Leased => 409,
            NoSpace | ResourceExhausted => 507,
            PermissionDenied => 403,
            Unauthenticated => 401,
            Timeout => 504,
            Corrupted | Internal => 500,
            Cancelled => 499,
        }
    }

    /// The Python exception class (in `strata.errors`, all under
    /// `StrataError`) that the Python package raises for this code.
    pub fn python(self) -> &'static str {
        use Code::*;
        match self {
            Ok | Internal => "StrataError",
            InvalidArgument => "InvalidArgument",
            NotFound => "NotFound",
            AlreadyExists => "AlreadyExists",
            NoSpace => "NoSpace",
            Leased => "Leased",
            NotReady | Unavailable | NotLeader | ResourceExhausted => "Unavailable",
            Timeout => "Timeout",
            PermissionDenied | Unauthenticated => "PermissionDenied",
            Corrupted => "Corrupted",
            Cancelled => "Cancelled",
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A Strata error: a stable code and a message for humans that says what was
/// wrong and, where it can, what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct Error {
    pub code: Code,
    pub message: String,
    /// Retrying may succeed though the code alone does not say so (e.g. a
    /// put that ran out of `--put-wait` while copies to SSD were landing).
    pub retry_later: bool,
    /// With `NotLeader`: the leader's address, if known (sent in the
    /// `x-strata-leader` metadata so clients follow it).
    pub leader: Option<String>,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) const CODE_HEADER: &str = "x-strata-code";
/// Where a master that does not lead names the one that does (clients and
/// members follow it).
pub const LEADER_HEADER: &str = "x-strata-leader";
const RETRY_HEADER: &str = "x-strata-retryable";

impl Error {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Error {
            code,
            message: message.into(),
            retry_later: false,
            leader: None,
        }
    }
    /// Marks the error retryable whatever its code.
    pub fn retry_later(mut self) -> Self {
        self.retry_later = true;
        self
    }
    /// An error from a batch item's status (its `retryable` flag kept).
    pub fn from_parts(code: u32, message: String, retryable: bool) -> Self {
        let e = Error::new(Code::from_u32(code), message);
        Error {
            retry_later: retryable && !e.code.retryable(),
            ..e
        }
    }
    /// The same error with another message.
    pub fn with_message(mut self, m: impl Into<String>) -> Self {
        self.message = m.into();
        self
    }
    /// The same error, its message prefixed with what was being done.
    pub fn context(self, doing: &str) -> Self {
        let m = format!("{doing}: {}", self.message);
        self.with_message(m)
    }
    pub fn invalid(m: impl Into<String>) -> Self {
        Self::new(Code::InvalidArgument, m)
    }
    pub fn not_found(m: impl Into<String>) -> Self {
        Self::new(Code::NotFound, m)
    }
    pub fn unavailable(m: impl Into<String>) -> Self {
        Self::new(Code::Unavailable, m)
    }
    pub fn internal(m: impl Into<String>) -> Self {
        Self::new(Code::Internal, m)
    }
    pub fn retryable(&self) -> bool {
        self.code.retryable() || self.retry_later
    }
}

impl From<Error> for tonic::Status {
    fn from(e: Error) -> Self {
        let mut st = tonic::Status::new(e.code.grpc(), e.message);
        if let Ok(v) = (e.code as u32).to_string().parse() {
            st.metadata_mut().insert(CODE_HEADER, v);
        }
        if let Some(v) = e.leader.as_deref().and_then(|l| l.parse().ok()) {
            st.metadata_mut().insert(LEADER_HEADER, v);
        }
        if e.retry_later {
            st.metadata_mut().insert(
                RETRY_HEADER,
                tonic::metadata::MetadataValue::from_static("1"),
            );
        }
        st
    }
}

impl From<tonic::Status> for Error {
    fn from(st: tonic::Status) -> Self {
        let code = st
            .metadata()
            .get(CODE_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u32>().ok())
            .map(Code::from_u32)
            .unwrap_or(match st.code() {
                tonic::Code::InvalidArgument | tonic::Code::OutOfRange => Code::InvalidArgument,
                tonic::Code::NotFound => Code::NotFound,
                tonic::Code::AlreadyExists => Code::AlreadyExists,
                tonic::Code::ResourceExhausted => Code::ResourceExhausted,
                tonic::Code::FailedPrecondition => Code::Leased,
                tonic::Code::PermissionDenied => Code::PermissionDenied,
                tonic::Code::Unauthenticated => Code::Unauthenticated,
                tonic::Code::DeadlineExceeded => Code::Timeout,
                tonic::Code::Unavailable => Code::Unavailable,
                tonic::Code::Cancelled => Code::Cancelled,
                tonic::Code::DataLoss => Code::Corrupted,
                _ => Code::Internal,
            });
        let retry_later = st.metadata().get(RETRY_HEADER).is_some();
        let leader = st
            .metadata()
            .get(LEADER_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(String::from);
        Error {
            retry_later,
            leader,
            ..Error::new(code, st.message().to_string())
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        use std::io::ErrorKind::*;
        let code = match e.kind() {
            ConnectionRefused | ConnectionReset | ConnectionAborted | BrokenPipe
            | UnexpectedEof | NotConnected => Code::Unavailable,
            TimedOut => Code::Timeout,
            InvalidInput | InvalidData => Code::InvalidArgument,
            _ => Code::Internal,
        };
        Error::new(code, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_later_survives_a_status_and_a_batch_item() {
        let e = Error::new(Code::NoSpace, "full");
        assert!(!e.retryable());
        let back: Error = tonic::Status::from(e.clone()).into();
        assert!(!back.retryable(), "not retryable unless marked");
        let back: Error = tonic::Status::from(e.retry_later()).into();
        assert!(back.retryable() && back.code == Code::NoSpace);
        assert!(Error::from_parts(5, "x".into(), true).retryable());
        assert!(!Error::from_parts(5, "x".into(), false).retryable());
        assert!(Error::from_parts(7, "x".into(), false).retryable());
    }

    #[test]
    fn status_round_trip_keeps_code() {
        for c in [
            Code::NotReady,
            Code::NoSpace,
            Code::Leased,
            Code::Corrupted,
            Code::Unauthenticated,
        ] {
            let st: tonic::Status = Error::new(c, "x").into();
            let back: Error = st.into();
            assert_eq!(back.code, c);
            assert_eq!(back.message, "x");
        }
    }

    #[test]
    fn retryable_codes() {
        assert!(Code::NotReady.retryable());
        assert!(!Code::NotFound.retryable());
        assert!(!Code::InvalidArgument.retryable());
    }
}
