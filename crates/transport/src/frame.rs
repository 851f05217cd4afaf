//! Wire format of the TCP data plane (version 1). Fixed-size little-endian
//! headers so the server can validate a request before touching its payload.
//!
//! Request (96 bytes), then `length` payload bytes for a write:
//! ```text
//!  0 magic u32 "STRD" | 4 version u8 | 5 op u8 | 6 reserved u16
//!  8 request id u64   | 16 segment id u64
//! 24 grant offset u64 | 32 grant length u64 | 40 grant perm u32 | 44 reserved u32
//! 48 grant expiry (unix ms) u64 | 56 grant mac [16]
//! 72 offset u64 (absolute in segment) | 80 length u64 | 88 grant generation u64
//! (the generation was a reserved zero before; old peers send 0)
//! ```
//! Response (24 bytes), then `length` bytes: the data of a read, or a UTF-8
//! error message when status != 0.
//!
//! A batch read (`ReadV`, added in version 1 without changing the layout):
//! a header whose `length` is the number N of items, followed by N read
//! requests; the answer is a header whose `length` is N, followed by one
//! complete response (header + data or error message) per item, in order.
//! One item failing does not fail the others.
//! ```text
//!  0 magic u32 "STRR" | 4 version u8 | 5 status u8 (Code) | 6 reserved u16
//!  8 request id u64   | 16 length u64
//! ```

use strata_common::grant::{GrantScope, MAC_LEN};
use strata_common::{Code, Error, Result};

pub const REQ_MAGIC: u32 = u32::from_le_bytes(*b"STRD");
pub const RESP_MAGIC: u32 = u32::from_le_bytes(*b"STRR");
pub const VERSION: u8 = 1;
pub const REQ_LEN: usize = 96;
pub const RESP_LEN: usize = 24;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    Write = 1,
    Read = 2,
    Ping = 3,
    ReadV = 4,
}

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
    pub fn encode(&self) -> [u8; REQ_LEN] {
        let mut b = [0u8; REQ_LEN];
        b[0..4].copy_from_slice(&REQ_MAGIC.to_le_bytes());
        b[4] = VERSION;
        b[5] = self.op as u8;
        b[8..16].copy_from_slice(&self.req_id.to_le_bytes());
        b[16..24].copy_from_slice(&self.grant.segment_id.to_le_bytes());
        b[24..32].copy_from_slice(&self.grant.offset.to_le_bytes());
        b[32..40].copy_from_slice(&self.grant.length.to_le_bytes());
        b[40..44].copy_from_slice(&self.grant.perm.to_le_bytes());
        b[48..56].copy_from_slice(&self.grant.expires_unix_ms.to_le_bytes());
        b[56..72].copy_from_slice(&self.mac);
        b[72..80].copy_from_slice(&self.offset.to_le_bytes());
        b[80..88].copy_from_slice(&self.length.to_le_bytes());
        b[88..96].copy_from_slice(&self.grant.generation.to_le_bytes());
        b
    }

    /// Parses a header. Errors here mean the stream is not speaking our
    /// protocol, so the server answers once and closes the connection.
    pub fn decode(b: &[u8; REQ_LEN]) -> Result<Request> {
        let magic = u32_at(b, 0);
        if magic != REQ_MAGIC {
            return Err(Error::invalid(format!(
                "bad frame magic {magic:#010x}: this port speaks the Strata data-plane protocol"
            )));
        }
        if b[4] != VERSION {
            return Err(Error::invalid(format!(
                "unsupported data-plane protocol version {} (this node speaks {VERSION})",
                b[4]
            )));
        }
        let op = match b[5] {
            1 => Op::Write,
            2 => Op::Read,
            3 => Op::Ping,
            4 => Op::ReadV,
            o => return Err(Error::invalid(format!("unknown data-plane op {o}"))),
        };
        let mut mac = [0u8; MAC_LEN];
        mac.copy_from_slice(&b[56..72]);
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
        })
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
        };
        assert_eq!(Request::decode(&r.encode()), Ok(r));
    }

    proptest::proptest! {
        #[test]
        fn decode_garbage_never_panics(v in proptest::collection::vec(proptest::num::u8::ANY, REQ_LEN)) {
            let mut b = [0u8; REQ_LEN];
            b.copy_from_slice(&v);
            let _ = Request::decode(&b);
        }
    }
}
