//! Wire format of the TCP data plane (versions 1 and 2). Fixed-size
//! little-endian headers so the server can validate a request before touching
//! its payload.
//!
//! Request (96 bytes), then `length` payload bytes for a write:
//! ```text
//!  0 magic u32 "STRD" | 4 version u8 | 5 op u8 | 6 reserved u16
//!  8 request id u64   | 16 segment id u64
//! 24 grant offset u64 | 32 grant length u64 | 40 grant perm u32 | 44 flags u32
//! 48 grant expiry (unix ms) u64 | 56 grant mac [16]
//! 72 offset u64 (absolute in segment) | 80 length u64 | 88 grant generation u64
//! (the generation and the flags were reserved zeros before; old peers send
//! 0, and servers that predate a flag ignore it)
//! ```
//! Version 2 is version 1 plus extensions: the u16 at offset 6 is the
//! length (at most [`MAX_EXT_LEN`]) of an extension block that follows the
//! header (before any payload). The block is a sequence of
//! `type u8 | length u8 | value` items; unknown types are skipped, so later
//! versions can add items. Type 1 is a trace context: trace id [16], parent
//! span id [8], flags u8 (W3C `traceparent`). Clients send version 2 only
//! when they have something to put there (a traced request), so untraced
//! traffic is byte-for-byte version 1, which older nodes read. Type 2 is a
//! put's record, on a `Write` of a whole granted range: crc32c u32, the
//! master's signature of the record [16], the key (at most
//! [`MAX_RECORD_KEY`] bytes); the node records the put as its bytes land
//! and answers with a receipt (a 16-byte body on the OK response) that the
//! client hands to the master at PutEnd. A node that predates it skips the
//! item and answers with no body: no receipt. Responses are always
//! version 1.
//! Response (24 bytes), then `length` bytes: the data of a read, or a UTF-8
//! error message when status != 0.
//!
//! A batch read (`ReadV`, added in version 1 without changing the layout):
//! a header whose `length` is the number N of items, followed by N read
//! requests; the answer is a header whose `length` is N, followed by one
//! complete response (header + data or error message) per item, in order.
//! One item failing does not fail the others.
//!
//! Staging (`Stage`, `GiveBack`, added in version 1 without changing the
//! layout; servers that predate them refuse them as unknown ops): a `Stage`
//! is a read request whose range the server copies into a window of its
//! memory that peers read one-sided, and it answers with a [`Staged`]
//! descriptor instead of the bytes. A `GiveBack` returns that space: its
//! `offset` is the lease and its `length` the lease's token; its grant
//! fields are unused (zero). A `Stage` with [`FLAG_HELD`] asks that its
//! lease live no longer than the connection it was asked on: the server
//! gives back what a connection still holds when it closes (the reader died
//! or gave up on it), so a lent slot waits for its TTL only when a server
//! predates the flag.
//! ```text
//!  0 magic u32 "STRR" | 4 version u8 | 5 status u8 (Code) | 6 reserved u16
//!  8 request id u64   | 16 length u64
//! ```

use strata_common::grant::{GrantScope, PutRecord, MAC_LEN};
use strata_common::telemetry::TraceParent;
use strata_common::{Code, Error, Result};

pub const REQ_MAGIC: u32 = u32::from_le_bytes(*b"STRD");
pub const RESP_MAGIC: u32 = u32::from_le_bytes(*b"STRR");
/// The version of responses, and of requests without extensions.
pub const VERSION: u8 = 1;
/// Requests followed by an extension block.
pub const VERSION_EXT: u8 = 2;
pub const REQ_LEN: usize = 96;
pub const RESP_LEN: usize = 24;
/// Longest extension block a server accepts.
pub const MAX_EXT_LEN: usize = 256;
const EXT_TRACE: u8 = 1;
const TRACE_LEN: usize = 16 + 8 + 1;
const EXT_RECORD: u8 = 2;
/// A record's fixed part: crc32c and signature.
const RECORD_FIXED: usize = 4 + MAC_LEN;
/// Longest key a write's record carries (with a trace item beside it, the
/// block stays within [`MAX_EXT_LEN`]); puts of longer keys are not
/// recorded by their writes.
pub const MAX_RECORD_KEY: usize = 200;
/// The longest request head this version writes: header + trace item +
/// record item.
const MAX_HEAD: usize = REQ_LEN + 2 + TRACE_LEN + 2 + RECORD_FIXED + MAX_RECORD_KEY;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    Write = 1,
    Read = 2,
    Ping = 3,
    ReadV = 4,
    Stage = 5,
    GiveBack = 6,
}

/// `Request::flags`: this `Stage`'s lease dies with its connection (the
/// reader gives it back on that connection, or the server does when the
/// connection closes).
pub const FLAG_HELD: u32 = 1;

/// Most items one batch read may carry.
pub const MAX_READV_ITEMS: u64 = 4096;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub op: Op,
    pub req_id: u64,
    pub grant: GrantScope,
    pub mac: [u8; MAC_LEN],
    pub offset: u64,
    pub length: u64,
    /// `FLAG_*` bits; unknown bits are ignored.
    pub flags: u32,
    /// The caller's span, for tracing across processes (version 2).
    pub trace: Option<TraceParent>,
    /// What the node records of the put this write completes (version 2).
    pub record: Option<WriteRecord>,
}

/// A put's record as a write carries it: the rest (segment, range,
/// generation) is the write's grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteRecord {
    pub key: String,
    pub crc32c: u32,
    /// The master's signature (`GrantKey::sign_record`).
    pub mac: [u8; MAC_LEN],
}

impl WriteRecord {
    /// The record as signed, for the grant `g` the write carries.
    pub fn of<'a>(&'a self, g: &GrantScope) -> PutRecord<'a> {
        PutRecord {
            key: &self.key,
            segment_id: g.segment_id,
            offset: g.offset,
            length: g.length,
            generation: g.generation,
            crc32c: self.crc32c,
        }
    }
}

/// An encoded request head: the header and its extensions.
#[derive(Debug, Clone, Copy)]
pub struct Head {
    buf: [u8; MAX_HEAD],
    len: usize,
}

impl Head {
    /// The fixed-size header, without extensions.
    pub fn header(&self) -> &[u8; REQ_LEN] {
        self.buf[..REQ_LEN]
            .try_into()
            .expect("a head holds a header")
    }
}

impl std::ops::Deref for Head {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl std::ops::DerefMut for Head {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.buf[..self.len]
    }
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

impl Request {
    /// A request that carries no grant (pings, give-backs): zero grant
    /// fields, untraced.
    pub fn ungranted(op: Op, req_id: u64, offset: u64, length: u64) -> Request {
        Request {
            op,
            req_id,
            grant: GrantScope::default(),
            mac: [0; MAC_LEN],
            offset,
            length,
            flags: 0,
            trace: None,
            record: None,
        }
    }

    /// Encodes the request head. A record whose key is longer than
    /// [`MAX_RECORD_KEY`] is left out (callers check first).
    pub fn encode(&self) -> Head {
        let mut buf = [0u8; MAX_HEAD];
        let b = &mut buf[..REQ_LEN];
        b[0..4].copy_from_slice(&REQ_MAGIC.to_le_bytes());
        b[4] = VERSION;
        b[5] = self.op as u8;
        b[8..16].copy_from_slice(&self.req_id.to_le_bytes());
        b[16..24].copy_from_slice(&self.grant.segment_id.to_le_bytes());
        b[24..32].copy_from_slice(&self.grant.offset.to_le_bytes());
        b[32..40].copy_from_slice(&self.grant.length.to_le_bytes());
        b[40..44].copy_from_slice(&self.grant.perm.to_le_bytes());
        b[44..48].copy_from_slice(&self.flags.to_le_bytes());
        b[48..56].copy_from_slice(&self.grant.expires_unix_ms.to_le_bytes());
        b[56..72].copy_from_slice(&self.mac);
        b[72..80].copy_from_slice(&self.offset.to_le_bytes());
        b[80..88].copy_from_slice(&self.length.to_le_bytes());
        b[88..96].copy_from_slice(&self.grant.generation.to_le_bytes());
        let mut len = REQ_LEN;
        if let Some(t) = &self.trace {
            let e = &mut buf[len..len + 2 + TRACE_LEN];
            e[0] = EXT_TRACE;
            e[1] = TRACE_LEN as u8;
            e[2..18].copy_from_slice(&t.trace_id);
            e[18..26].copy_from_slice(&t.span_id);
            e[26] = t.flags;
            len += e.len();
        }
        if let Some(r) = self
            .record
            .as_ref()
            .filter(|r| r.key.len() <= MAX_RECORD_KEY)
        {
            let n = RECORD_FIXED + r.key.len();
            let e = &mut buf[len..len + 2 + n];
            e[0] = EXT_RECORD;
            e[1] = n as u8;
            e[2..6].copy_from_slice(&r.crc32c.to_le_bytes());
            e[6..6 + MAC_LEN].copy_from_slice(&r.mac);
            e[6 + MAC_LEN..].copy_from_slice(r.key.as_bytes());
            len += e.len();
        }
        if len > REQ_LEN {
            buf[4] = VERSION_EXT;
            buf[6..8].copy_from_slice(&((len - REQ_LEN) as u16).to_le_bytes());
        }
        Head { buf, len }
    }

    /// Parses a header. The outer error means the framing itself is wrong
    /// (magic, version, extension length): the stream cannot be read any
    /// further. Otherwise it returns the length of the extension block that
    /// follows the header, which the reader must consume (and pass to
    /// [`Request::read_extensions`]) whether or not the request itself
    /// parsed (the inner result: e.g. an unknown op).
    pub fn decode(b: &[u8; REQ_LEN]) -> Result<(Result<Request>, usize)> {
        let magic = u32_at(b, 0);
        if magic != REQ_MAGIC {
            return Err(Error::invalid(format!(
                "bad frame magic {magic:#010x}: this port speaks the Strata data-plane protocol"
            )));
        }
        let ext = match b[4] {
            VERSION => 0,
            VERSION_EXT => u16::from_le_bytes([b[6], b[7]]) as usize,
            v => {
                return Err(Error::invalid(format!(
                    "unsupported data-plane protocol version {v} (this node speaks {VERSION} and {VERSION_EXT})"
                )))
            }
        };
        if ext > MAX_EXT_LEN {
            return Err(Error::invalid(format!(
                "data-plane extension block of {ext} bytes exceeds {MAX_EXT_LEN}"
            )));
        }
        let op = match b[5] {
            1 => Op::Write,
            2 => Op::Read,
            3 => Op::Ping,
            4 => Op::ReadV,
            5 => Op::Stage,
            6 => Op::GiveBack,
            o => {
                return Ok((
                    Err(Error::invalid(format!("unknown data-plane op {o}"))),
                    ext,
                ))
            }
        };
        let mut mac = [0u8; MAC_LEN];
        mac.copy_from_slice(&b[56..72]);
        Ok((
            Ok(Request {
                op,
                req_id: u64_at(b, 8),
                grant: GrantScope {
                    segment_id: u64_at(b, 16),
                    offset: u64_at(b, 24),
                    length: u64_at(b, 32),
                    perm: u32_at(b, 40),
                    expires_unix_ms: u64_at(b, 48),
                    generation: u64_at(b, 88),
                },
                mac,
                offset: u64_at(b, 72),
                length: u64_at(b, 80),
                flags: u32_at(b, 44),
                trace: None,
                record: None,
            }),
            ext,
        ))
    }

    /// Applies the extension block read after the header. A malformed block
    /// is an error (the request is refused; the block was consumed, so the
    /// stream stays framed); unknown items are skipped.
    pub fn read_extensions(&mut self, mut e: &[u8]) -> Result<()> {
        while !e.is_empty() {
            let (kind, len) = match e {
                [k, l, ..] => (*k, *l as usize),
                _ => return Err(Error::invalid("truncated data-plane extension item")),
            };
            let value = e
                .get(2..2 + len)
                .ok_or_else(|| Error::invalid("data-plane extension item overruns its block"))?;
            if kind == EXT_TRACE && len == TRACE_LEN {
                let mut t = TraceParent {
                    trace_id: [0; 16],
                    span_id: [0; 8],
                    flags: value[24],
                };
                t.trace_id.copy_from_slice(&value[..16]);
                t.span_id.copy_from_slice(&value[16..24]);
                self.trace = Some(t);
            }
            if kind == EXT_RECORD {
                self.record = Some(read_record(value)?);
            }
            e = &e[2 + len..];
        }
        Ok(())
    }
}

fn read_record(value: &[u8]) -> Result<WriteRecord> {
    let key = value
        .get(RECORD_FIXED..)
        .filter(|k| !k.is_empty())
        .ok_or_else(|| Error::invalid("a write's record names no key"))?;
    let key = std::str::from_utf8(key)
        .map_err(|_| Error::invalid("a write's record has a key that is not UTF-8"))?;
    let mut mac = [0u8; MAC_LEN];
    mac.copy_from_slice(&value[4..RECORD_FIXED]);
    Ok(WriteRecord {
        key: key.to_string(),
        crc32c: u32_at(value, 0),
        mac,
    })
}

/// Where a `Stage` put the bytes asked for, and how to reach them: the body
/// of a successful `Stage` response.
/// ```text
///  0 version u8 (1) | 1 reserved [7]
///  8 lease u64 | 16 token u64 | 24 window offset u64 | 32 length u64
/// 40 ttl ms u64 | 48 route fingerprint u64 | 56 window base u64
/// 64 window size u64 | 72 worker length u32 | 76 key length u32
/// 80 worker address | packed remote key
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Staged {
    /// Names the space lent, with `token` (a secret only the stager
    /// learns), for `GiveBack`.
    pub lease: u64,
    pub token: u64,
    /// Where in the window the bytes are.
    pub window_offset: u64,
    /// Bytes staged: the start of the range asked for, at most one piece.
    pub length: u64,
    /// The space is reclaimed this long after it was lent if not given
    /// back; the reader must be done well before.
    pub ttl_ms: u64,
    /// The window's route: fingerprint (never 0; a new one per process),
    /// base address, size, the serving worker's address and the packed
    /// remote key.
    pub fingerprint: u64,
    pub base: u64,
    pub size: u64,
    pub worker: Vec<u8>,
    pub rkey: Vec<u8>,
}

const STAGED_VERSION: u8 = 1;
const STAGED_HEAD: usize = 80;
/// Largest `Staged` body a client accepts.
pub const MAX_STAGED_LEN: usize = STAGED_HEAD + 16384;

impl Staged {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; STAGED_HEAD];
        b[0] = STAGED_VERSION;
        for (at, v) in [
            (8, self.lease),
            (16, self.token),
            (24, self.window_offset),
            (32, self.length),
            (40, self.ttl_ms),
            (48, self.fingerprint),
            (56, self.base),
            (64, self.size),
        ] {
            b[at..at + 8].copy_from_slice(&v.to_le_bytes());
        }
        b[72..76].copy_from_slice(&(self.worker.len() as u32).to_le_bytes());
        b[76..80].copy_from_slice(&(self.rkey.len() as u32).to_le_bytes());
        b.extend_from_slice(&self.worker);
        b.extend_from_slice(&self.rkey);
        b
    }

    /// Parses a `Stage` answer for a request of `asked` bytes; anything
    /// inconsistent is refused (a server is not trusted to stay in bounds).
    pub fn decode(b: &[u8], asked: u64) -> Result<Staged> {
        let bad = |why: &str| {
            Error::new(
                Code::Unavailable,
                format!("malformed staging answer: {why}"),
            )
        };
        if b.len() < STAGED_HEAD || b.len() > MAX_STAGED_LEN {
            return Err(bad("wrong size"));
        }
        if b[0] != STAGED_VERSION {
            return Err(bad("unknown version"));
        }
        let (wl, kl) = (u32_at(b, 72) as usize, u32_at(b, 76) as usize);
        if STAGED_HEAD + wl + kl != b.len() || wl == 0 || kl == 0 {
            return Err(bad("route lengths do not add up"));
        }
        let s = Staged {
            lease: u64_at(b, 8),
            token: u64_at(b, 16),
            window_offset: u64_at(b, 24),
            length: u64_at(b, 32),
            ttl_ms: u64_at(b, 40),
            fingerprint: u64_at(b, 48),
            base: u64_at(b, 56),
            size: u64_at(b, 64),
            worker: b[STAGED_HEAD..STAGED_HEAD + wl].to_vec(),
            rkey: b[STAGED_HEAD + wl..].to_vec(),
        };
        let end = s.window_offset.checked_add(s.length);
        if s.length == 0 || s.length > asked || end.is_none_or(|e| e > s.size) {
            return Err(bad("staged range outside the window or the request"));
        }
        if s.fingerprint == 0 || s.base == 0 || s.base.checked_add(s.size).is_none() {
            return Err(bad("invalid window route"));
        }
        Ok(s)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Response {
    pub status: Code,
    pub req_id: u64,
    pub length: u64,
}

impl Response {
    pub fn encode(&self) -> [u8; RESP_LEN] {
        let mut b = [0u8; RESP_LEN];
        b[0..4].copy_from_slice(&RESP_MAGIC.to_le_bytes());
        b[4] = VERSION;
        b[5] = self.status as u32 as u8;
        b[8..16].copy_from_slice(&self.req_id.to_le_bytes());
        b[16..24].copy_from_slice(&self.length.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; RESP_LEN]) -> Result<Response> {
        if u32_at(b, 0) != RESP_MAGIC || b[4] != VERSION {
            return Err(Error::new(
                Code::Unavailable,
                "malformed data-plane response (bad magic or version)",
            ));
        }
        Ok(Response {
            status: Code::from_u32(b[5] as u32),
            req_id: u64_at(b, 8),
            length: u64_at(b, 16),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_round_trip_and_bad_frames() {
        let r = Response {
            status: Code::PermissionDenied,
            req_id: 77,
            length: 1 << 33,
        };
        let b = r.encode();
        assert_eq!(&b[0..4], b"STRR");
        let back = Response::decode(&b).unwrap();
        assert_eq!(
            (back.status, back.req_id, back.length),
            (r.status, r.req_id, r.length)
        );
        // A wrong magic or a wrong version is refused, each on its own.
        let mut bad = b;
        bad[0] ^= 1;
        assert!(Response::decode(&bad).is_err());
        let mut bad = b;
        bad[4] = VERSION + 1;
        assert!(Response::decode(&bad).is_err());
    }

    #[test]
    fn request_round_trip() {
        let r = Request {
            op: Op::Read,
            req_id: 7,
            grant: GrantScope {
                perm: 1,
                segment_id: 2,
                offset: 3,
                length: 4,
                expires_unix_ms: 5,
                generation: 6,
            },
            mac: [9; MAC_LEN],
            offset: 3,
            length: 1,
            flags: FLAG_HELD | 8,
            trace: None,
            record: None,
        };
        // Untraced: exactly the version 1 header.
        let head = r.encode();
        assert_eq!((head.len(), head[4]), (REQ_LEN, VERSION));
        assert_eq!(Request::decode(head_of(&head)), Ok((Ok(r.clone()), 0)));
    }

    fn head_of(h: &Head) -> &[u8; REQ_LEN] {
        h.header()
    }

    fn traced() -> Request {
        Request {
            op: Op::Write,
            req_id: 9,
            grant: GrantScope {
                perm: 2,
                segment_id: 1,
                offset: 0,
                length: 10,
                expires_unix_ms: 5,
                generation: 1,
            },
            mac: [3; MAC_LEN],
            offset: 0,
            length: 10,
            flags: 0,
            trace: Some(TraceParent {
                trace_id: [7; 16],
                span_id: [8; 8],
                flags: 1,
            }),
            record: None,
        }
    }

    #[test]
    fn traced_request_round_trip() {
        let r = traced();
        let head = r.encode();
        assert_eq!(head[4], VERSION_EXT);
        let (back, ext) = Request::decode(head_of(&head)).unwrap();
        let mut back = back.unwrap();
        assert_eq!(ext, head.len() - REQ_LEN);
        assert_eq!(back.trace, None, "the trace arrives with the extensions");
        back.read_extensions(&head[REQ_LEN..]).unwrap();
        assert_eq!(back, r);
    }

    fn decoded(head: &Head) -> Result<Request> {
        let (r, ext) = Request::decode(head_of(head)).unwrap();
        assert_eq!(ext, head.len() - REQ_LEN);
        let mut r = r.unwrap();
        r.read_extensions(&head[REQ_LEN..])?;
        Ok(r)
    }

    /// A record travels alone or beside a trace; the longest key it may
    /// carry still fits the block a node accepts, one byte more is left out.
    #[test]
    fn recorded_writes_round_trip_within_the_block_limit() {
        let record = |key: String| WriteRecord {
            key,
            crc32c: 0xabcd_0123,
            mac: [5; MAC_LEN],
        };
        for trace in [None, traced().trace] {
            let mut r = traced();
            r.trace = trace;
            r.record = Some(record("k".repeat(MAX_RECORD_KEY)));
            let head = r.encode();
            assert_eq!(head[4], VERSION_EXT);
            assert!(head.len() - REQ_LEN <= MAX_EXT_LEN, "{}", head.len());
            assert_eq!(decoded(&head), Ok(r.clone()));
            r.record = Some(record("k".repeat(MAX_RECORD_KEY + 1)));
            let head = r.encode();
            assert_eq!(decoded(&head).unwrap().record, None);
        }
        let mut r = traced();
        r.trace = None;
        r.record = Some(record("prefix/1".into()));
        assert_eq!(decoded(&r.encode()), Ok(r.clone()));
        // A record names a key, in UTF-8.
        let bad = |key: &[u8]| {
            let mut block = vec![EXT_RECORD, (RECORD_FIXED + key.len()) as u8];
            block.extend_from_slice(&[0; RECORD_FIXED]);
            block.extend_from_slice(key);
            traced().read_extensions(&block)
        };
        assert!(bad(b"k").is_ok());
        assert!(bad(b"").is_err());
        assert!(bad(&[0xff, 0xfe]).is_err());
        let mut short = vec![EXT_RECORD, 3];
        short.extend_from_slice(&[0; 3]);
        assert!(traced().read_extensions(&short).is_err());
    }

    #[test]
    fn extension_blocks_are_checked() {
        let head = traced().encode();
        let mut r = Request::decode(head_of(&head)).unwrap().0.unwrap();
        // Unknown items are skipped, before or after the trace.
        let mut block = vec![200, 3, 1, 2, 3];
        block.extend_from_slice(&head[REQ_LEN..]);
        block.extend_from_slice(&[201, 0]);
        r.read_extensions(&block).unwrap();
        assert_eq!(r.trace, traced().trace);
        // Truncated items are refused.
        let mut r = Request::decode(head_of(&head)).unwrap().0.unwrap();
        assert!(r.read_extensions(&head[REQ_LEN..head.len() - 1]).is_err());
        assert!(r.read_extensions(&[1]).is_err());
        // A block longer than the limit is refused at the header; at the
        // limit it is accepted.
        let mut h = *head.header();
        h[6..8].copy_from_slice(&(MAX_EXT_LEN as u16 + 1).to_le_bytes());
        assert!(Request::decode(&h).is_err());
        h[6..8].copy_from_slice(&(MAX_EXT_LEN as u16).to_le_bytes());
        assert_eq!(Request::decode(&h).unwrap().1, MAX_EXT_LEN);
        // An unknown op is refused but keeps the framing: the reader still
        // learns how many extension bytes to consume.
        h[5] = 99;
        let (r, ext) = Request::decode(&h).unwrap();
        assert!(r.is_err());
        assert_eq!(ext, MAX_EXT_LEN);
        // Unknown versions are refused.
        h[4] = VERSION_EXT + 1;
        assert!(Request::decode(&h).is_err());
    }

    fn staged() -> Staged {
        Staged {
            lease: 3,
            token: 0xfeed,
            window_offset: 8192,
            length: 4096,
            ttl_ms: 10_000,
            fingerprint: 77,
            base: 0x10_0000,
            size: 1 << 20,
            worker: vec![1; 300],
            rkey: vec![2; 40],
        }
    }

    #[test]
    fn staged_round_trip_and_bounds() {
        let s = staged();
        let b = s.encode();
        assert_eq!(Staged::decode(&b, 4096), Ok(s.clone()));
        // More than was asked for, or past the window's end, is refused;
        // exactly at the end is not.
        assert!(Staged::decode(&b, 4095).is_err());
        let at = |off: u64, len: u64| {
            let mut x = staged();
            x.window_offset = off;
            x.length = len;
            Staged::decode(&x.encode(), 1 << 30)
        };
        assert!(at((1 << 20) - 4096, 4096).is_ok());
        assert!(at((1 << 20) - 4095, 4096).is_err());
        assert!(at(u64::MAX, 2).is_err());
        assert!(at(0, 0).is_err(), "nothing staged is no answer");
        // Truncated, padded, other versions, no route.
        assert!(Staged::decode(&b[..b.len() - 1], 4096).is_err());
        let mut longer = b.clone();
        longer.push(0);
        assert!(Staged::decode(&longer, 4096).is_err());
        let mut v2 = b.clone();
        v2[0] = 2;
        assert!(Staged::decode(&v2, 4096).is_err());
        let mut x = staged();
        x.fingerprint = 0;
        assert!(Staged::decode(&x.encode(), 4096).is_err());
        let mut x = staged();
        x.rkey.clear();
        assert!(Staged::decode(&x.encode(), 4096).is_err());
    }

    proptest::proptest! {
        #[test]
        fn staged_garbage_never_panics(v in proptest::collection::vec(proptest::num::u8::ANY, 0..400)) {
            let _ = Staged::decode(&v, u64::MAX);
        }

        #[test]
        fn decode_garbage_never_panics(v in proptest::collection::vec(proptest::num::u8::ANY, REQ_LEN)) {
            let mut b = [0u8; REQ_LEN];
            b.copy_from_slice(&v);
            let _ = Request::decode(&b);
        }
    }
}
