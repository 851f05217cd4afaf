//! Data-plane capabilities. The master signs a grant for one range of one
//! segment; the store node verifies it before touching memory, so a client
//! can only read or write what the master handed it.

/// Permission bits carried in a grant.
pub const PERM_READ: u32 = 1;
pub const PERM_WRITE: u32 = 2;
/// Read of an SSD bucket range, served by the owning agent. Distinct from
/// PERM_READ so a DRAM grant can never be replayed against a bucket.
pub const PERM_SSD_READ: u32 = 4;

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

/// The secret shared by the master and its store nodes.
#[derive(Clone)]
pub struct GrantKey([u8; 32]);

impl std::fmt::Debug for GrantKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GrantKey(..)")
    }
}

/// What a grant authorises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrantScope {
    pub perm: u32,
    pub segment_id: u64,
    pub offset: u64,
    pub length: u64,
    pub expires_unix_ms: u64,
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

    pub fn sign(&self, s: &GrantScope) -> [u8; MAC_LEN] {
        let mut msg = [0u8; 36];
        msg[0..4].copy_from_slice(&s.perm.to_le_bytes());
        msg[4..12].copy_from_slice(&s.segment_id.to_le_bytes());
        msg[12..20].copy_from_slice(&s.offset.to_le_bytes());
        msg[20..28].copy_from_slice(&s.length.to_le_bytes());
        msg[28..36].copy_from_slice(&s.expires_unix_ms.to_le_bytes());
        let h = blake3::keyed_hash(&self.0, &msg);
        let mut out = [0u8; MAC_LEN];
        out.copy_from_slice(&h.as_bytes()[..MAC_LEN]);
        out
    }

    /// Constant-time check of `mac` against the scope.
    pub fn verify(&self, s: &GrantScope, mac: &[u8]) -> bool {
        if mac.len() != MAC_LEN {
            return false;
        }
        let want = self.sign(s);
        want.iter().zip(mac).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }
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
        };
        let mac = k.sign(&s);
        assert!(k.verify(&s, &mac));
        assert!(!k.verify(&GrantScope { length: 101, ..s }, &mac));
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
}
