//! Data-plane capabilities. The master signs a grant for one range of one
//! segment; the store node verifies it before touching memory, so a client
//! can only read or write what the master handed it.

/// Permission bits carried in a grant.
pub const PERM_READ: u32 = 1;
pub const PERM_WRITE: u32 = 2;
/// Read of an SSD bucket range, served by the owning agent. Distinct from
/// PERM_READ so a DRAM grant can never be replayed against a bucket.
pub const PERM_SSD_READ: u32 = 4;
/// An SSD range may also be staged into the agent's lent window and read
/// one-sided (UCX). The window's remote key opens every slot of it, so the
/// master sets this bit only for rdma callers, like segment routes.
pub const PERM_STAGE: u32 = 8;

/// The "segment id" a grant names for an SSD bucket: owner in the high bits,
/// so one owner's grant cannot address another owner's bucket.
pub fn ssd_segment_id(owner_id: u64, bucket_id: u64) -> u64 {
    (owner_id << 40) | (bucket_id & ((1 << 40) - 1))
}

/// Inverse of [`ssd_segment_id`]: (owner_id, bucket_id).
pub fn split_ssd_segment_id(id: u64) -> (u64, u64) {
    (id >> 40, id & ((1 << 40) - 1))
}

pub const MAC_LEN: usize = 16;

/// The member name a store node's grant key is derived for.
pub fn node_member(node_id: &str) -> String {
    format!("node/{node_id}")
}

/// The member name an SSD owner's grant key is derived for.
pub fn owner_member(owner_id: u64) -> String {
    format!("owner/{owner_id}")
}

/// The secret shared by the master and its store nodes.
#[derive(Clone)]
pub struct GrantKey([u8; 32]);

impl std::fmt::Debug for GrantKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GrantKey(..)")
    }
}

/// What a grant authorises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GrantScope {
    pub perm: u32,
    pub segment_id: u64,
    pub offset: u64,
    pub length: u64,
    pub expires_unix_ms: u64,
    /// The allocation the range belongs to (0 for SSD buckets, which are
    /// never reused): nodes refuse a grant whose range a newer allocation
    /// has taken (`strata_transport::fence`).
    pub generation: u64,
}

impl GrantKey {
    pub fn random() -> Self {
        use rand::RngCore;
        let mut k = [0u8; 32];
        rand::thread_rng().fill_bytes(&mut k);
        GrantKey(k)
    }

    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        <[u8; 32]>::try_from(b).ok().map(GrantKey)
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The key one member (see [`node_member`], [`owner_member`]) verifies
    /// grants with. Members get only their own, so a compromised node can
    /// forge grants for nobody else's memory.
    pub fn derive(&self, member: &str) -> GrantKey {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        h.update(b"strata member grant key v1\0");
        h.update(member.as_bytes());
        GrantKey(*h.finalize().as_bytes())
    }

    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    pub fn from_hex(s: &str) -> Option<Self> {
        if s.len() != 64 || !s.is_ascii() {
            return None;
        }
        let mut k = [0u8; 32];
        for (i, b) in k.iter_mut().enumerate() {
            *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(GrantKey(k))
    }

    pub fn sign(&self, s: &GrantScope) -> [u8; MAC_LEN] {
        let mut msg = [0u8; 44];
        msg[0..4].copy_from_slice(&s.perm.to_le_bytes());
        msg[4..12].copy_from_slice(&s.segment_id.to_le_bytes());
        msg[12..20].copy_from_slice(&s.offset.to_le_bytes());
        msg[20..28].copy_from_slice(&s.length.to_le_bytes());
        msg[28..36].copy_from_slice(&s.expires_unix_ms.to_le_bytes());
        msg[36..44].copy_from_slice(&s.generation.to_le_bytes());
        let h = blake3::keyed_hash(&self.0, &msg);
        let mut out = [0u8; MAC_LEN];
        out.copy_from_slice(&h.as_bytes()[..MAC_LEN]);
        out
    }

    /// Signs what a store node records of a put as its bytes land (an
    /// object log `Pending` entry, delivered with the write instead of the
    /// node's heartbeat): the master hands it out at PutStart, so a client
    /// holding a write grant cannot make the node record another key or
    /// checksum there.
    pub fn sign_record(&self, r: &PutRecord<'_>) -> [u8; MAC_LEN] {
        self.sign_put(b"strata put record v1\0", r)
    }

    /// Signs a node's receipt for a put it recorded: the master acknowledges
    /// the put on it without waiting for the node's heartbeat. Another
    /// domain than [`GrantKey::sign_record`], so a record is no receipt.
    pub fn sign_receipt(&self, r: &PutRecord<'_>) -> [u8; MAC_LEN] {
        self.sign_put(b"strata put receipt v1\0", r)
    }

    pub fn verify_record(&self, r: &PutRecord<'_>, mac: &[u8]) -> bool {
        same_mac(&self.sign_record(r), mac)
    }

    pub fn verify_receipt(&self, r: &PutRecord<'_>, mac: &[u8]) -> bool {
        same_mac(&self.sign_receipt(r), mac)
    }

    fn sign_put(&self, domain: &[u8], r: &PutRecord<'_>) -> [u8; MAC_LEN] {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        h.update(domain);
        h.update(&r.segment_id.to_le_bytes());
        h.update(&r.offset.to_le_bytes());
        h.update(&r.length.to_le_bytes());
        h.update(&r.generation.to_le_bytes());
        h.update(&r.crc32c.to_le_bytes());
        h.update(r.key.as_bytes());
        let mut out = [0u8; MAC_LEN];
        out.copy_from_slice(&h.finalize().as_bytes()[..MAC_LEN]);
        out
    }

    /// Constant-time check of `mac` against the scope.
    pub fn verify(&self, s: &GrantScope, mac: &[u8]) -> bool {
        same_mac(&self.sign(s), mac)
    }
}

/// Constant-time comparison of a MAC with the one expected.
pub fn same_mac(want: &[u8; MAC_LEN], mac: &[u8]) -> bool {
    mac.len() == MAC_LEN && want.iter().zip(mac).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

/// What a store node records of a put whose bytes it received (the object
/// log's `CommittedObject` fields): signed by the master as a record, and
/// by the node as a receipt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PutRecord<'a> {
    pub key: &'a str,
    pub segment_id: u64,
    pub offset: u64,
    pub length: u64,
    pub generation: u64,
    pub crc32c: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_verify() {
        let k = GrantKey::random();
        let s = GrantScope {
            perm: PERM_READ,
            segment_id: 3,
            offset: 4096,
            length: 100,
            expires_unix_ms: 99,
            generation: 7,
        };
        let mac = k.sign(&s);
        assert!(k.verify(&s, &mac));
        assert!(!k.verify(&GrantScope { length: 101, ..s }, &mac));
        assert!(!k.verify(&GrantScope { generation: 6, ..s }, &mac));
        assert!(!k.verify(
            &GrantScope {
                perm: PERM_WRITE,
                ..s
            },
            &mac
        ));
        assert!(!GrantKey::random().verify(&s, &mac));
        assert!(!k.verify(&s, &mac[..8]));
    }

    /// A record and a receipt cover every field, and neither stands in
    /// for the other (nor for another node's).
    #[test]
    fn put_records_and_receipts_cover_every_field_and_differ() {
        let k = GrantKey::random();
        let r = PutRecord {
            key: "prefix/7",
            segment_id: 3,
            offset: 4096,
            length: 100,
            generation: 9,
            crc32c: 0xdead_beef,
        };
        let rec = k.sign_record(&r);
        let receipt = k.sign_receipt(&r);
        assert!(k.verify_record(&r, &rec));
        assert!(k.verify_receipt(&r, &receipt));
        assert!(!k.verify_receipt(&r, &rec), "a record is no receipt");
        assert!(!k.verify_record(&r, &receipt), "a receipt is no record");
        assert!(!GrantKey::random().verify_receipt(&r, &receipt));
        assert!(!k.verify_receipt(&r, &receipt[..8]));
        let changed = [
            PutRecord {
                key: "prefix/8",
                ..r
            },
            PutRecord { segment_id: 4, ..r },
            PutRecord { offset: 0, ..r },
            PutRecord { length: 101, ..r },
            PutRecord { generation: 8, ..r },
            PutRecord { crc32c: 1, ..r },
        ];
        for c in changed {
            assert!(!k.verify_record(&c, &rec), "{c:?}");
            assert!(!k.verify_receipt(&c, &receipt), "{c:?}");
        }
    }

    #[test]
    fn ssd_segment_ids_keep_owners_apart() {
        let id = ssd_segment_id(7, 42);
        assert_eq!(split_ssd_segment_id(id), (7, 42));
        assert_ne!(ssd_segment_id(8, 42), id);
        assert_ne!(ssd_segment_id(7, 43), id);
        // A bucket id beyond 40 bits never spills into the owner.
        let big = ssd_segment_id(1, (1 << 40) + 5);
        assert_eq!(split_ssd_segment_id(big), (1, 5));
        assert_eq!(node_member("a"), "node/a");
        assert_eq!(owner_member(3), "owner/3");
    }

    #[test]
    fn keys_parse_only_from_exact_input_and_stay_hidden() {
        assert!(GrantKey::from_bytes(&[1; 32]).is_some());
        assert!(GrantKey::from_bytes(&[1; 31]).is_none());
        assert!(GrantKey::from_hex(&"a".repeat(62)).is_none());
        assert!(GrantKey::from_hex(&"é".repeat(32)).is_none());
        let k = GrantKey::random();
        assert_eq!(format!("{k:?}"), "GrantKey(..)");
        // Two flipped bits in two bytes do not cancel out.
        let s = GrantScope::default();
        let mut mac = k.sign(&s);
        mac[0] ^= 1;
        mac[1] ^= 1;
        assert!(!k.verify(&s, &mac));
    }

    #[test]
    fn derived_keys_are_per_member_and_stable() {
        let k = GrantKey::random();
        let a = k.derive(&node_member("a"));
        assert_eq!(a.as_bytes(), k.derive(&node_member("a")).as_bytes());
        assert_ne!(a.as_bytes(), k.derive(&node_member("b")).as_bytes());
        assert_ne!(a.as_bytes(), k.as_bytes());
        assert_ne!(
            k.derive(&owner_member(1)).as_bytes(),
            GrantKey::random().derive(&owner_member(1)).as_bytes()
        );
        let back = GrantKey::from_hex(&k.to_hex()).unwrap();
        assert_eq!(back.as_bytes(), k.as_bytes());
        assert!(GrantKey::from_hex("zz").is_none());
        assert!(GrantKey::from_hex(&"g".repeat(64)).is_none());
    }
}
