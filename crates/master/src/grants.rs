//! The keys of one leadership term. Members verify grants with keys the
//! master derives from its grant key for each member process and this
//! term, so a grant a deposed leader signs, or one meant for another
//! process, is refused (security.md).

use crate::durable::DurableKv;
use strata_common::auth::ProofHash;
use strata_common::grant::{owner_member, GrantKey, MAC_LEN};
use strata_common::{Code, Error, Result};

/// The term and the master's grant key.
pub struct TermKeys {
    grant_key: GrantKey,
    /// Members refuse answers from a lower term, and member keys are
    /// derived for it.
    term: u64,
}

impl TermKeys {
    pub fn new(grant_key: GrantKey, term: u64) -> TermKeys {
        TermKeys { grant_key, term }
    }

    pub fn term(&self) -> u64 {
        self.term
    }

    /// The grant key of one member process for this term.
    pub fn member_key(&self, member: &str, proof: &ProofHash) -> GrantKey {
        self.member_key_in(member, proof, self.term)
    }

    /// The grant key that member process had in `term` (what signed the
    /// put records it kept then).
    pub fn member_key_in(&self, member: &str, proof: &ProofHash, term: u64) -> GrantKey {
        self.grant_key
            .derive(&format!("{}@term{}", proof.member_name(member), term))
    }

    /// The token that binds a put (`PutStartRequest.bind`) to its starter:
    /// a MAC of the key and the generation its first replica was given, for
    /// this term (a new leader knows no put of the old one as bound).
    pub fn put_token(&self, key: &str, generation: u64) -> [u8; MAC_LEN] {
        let mut h = blake3::Hasher::new_keyed(self.grant_key.as_bytes());
        h.update(b"strata put token v1\0");
        h.update(&self.term.to_le_bytes());
        h.update(&generation.to_le_bytes());
        h.update(key.as_bytes());
        let mut out = [0u8; MAC_LEN];
        out.copy_from_slice(&h.finalize().as_bytes()[..MAC_LEN]);
        out
    }

    /// What signs and checks the SSD tier's copy records.
    pub(crate) fn copy_records(&self) -> CopyRecords {
        CopyRecords(self.grant_key.clone())
    }

    pub(crate) fn commit_records(&self) -> CommitRecords {
        CommitRecords(self.grant_key.clone())
    }

    /// The key the process registered as owner `owner_id` verifies its
    /// grants with (derived for that owner and that process alone).
    pub fn owner_key(&self, owner_id: u64, proof: &ProofHash) -> GrantKey {
        self.member_key(&owner_member(owner_id), proof)
    }
}

/// The records that a master gave a copy of a key (its size and crc32c)
/// to an SSD owner (`OffloadTask.copy_record`). Under the durable grant
/// key, not the term's: an owner's inventory is believed after any restart
/// or failover, and only for copies a master made.
///
/// A copy of an object with the writer's digest (`--integrity blake3`)
/// gets a version-2 record: its MAC covers the digest too, which follows
/// the MAC in the record. The owner keeps the record as it is and reports
/// it back, so a later master adopts the copy with the digest its readers
/// verify, and believes it because its own key signed it. Owners need no
/// change for this: to them a record is opaque bytes.
pub(crate) struct CopyRecords(GrantKey);

/// The digest a version-2 copy record carries after its MAC.
const DIGEST_LEN: usize = 32;

impl CopyRecords {
    pub(crate) fn sign(
        &self,
        key: &str,
        size: u64,
        crc32c: u32,
        digest: Option<&[u8; 32]>,
    ) -> Vec<u8> {
        let mut h = blake3::Hasher::new_keyed(self.0.as_bytes());
        h.update(match digest {
            None => b"strata ssd copy record v1\0",
            Some(_) => b"strata ssd copy record v2\0",
        });
        h.update(&size.to_le_bytes());
        h.update(&crc32c.to_le_bytes());
        if let Some(d) = digest {
            h.update(d);
        }
        h.update(key.as_bytes());
        let mut out = h.finalize().as_bytes()[..MAC_LEN].to_vec();
        if let Some(d) = digest {
            out.extend_from_slice(d);
        }
        out
    }

    /// Whether `record` is this master's record of a copy of `key` with
    /// that size and crc32c: `Some` with the digest it carries (`None` for a
    /// version-1 record), or `None` when it is not.
    pub(crate) fn verify(
        &self,
        key: &str,
        size: u64,
        crc32c: u32,
        record: &[u8],
    ) -> Option<Option<[u8; 32]>> {
        let digest: Option<[u8; 32]> = match record.len() {
            MAC_LEN => None,
            n if n == MAC_LEN + DIGEST_LEN => Some(record[MAC_LEN..].try_into().ok()?),
            _ => return None,
        };
        let want: [u8; MAC_LEN] = self.sign(key, size, crc32c, digest.as_ref())[..MAC_LEN]
            .try_into()
            .ok()?;
        strata_common::grant::same_mac(&want, &record[..MAC_LEN]).then_some(digest)
    }
}

/// The records that a master gave a store node an object
/// (`CommittedObject.commit_record`): a MAC of what the node holds for it,
/// under the durable grant key, so any later master believes a node's
/// report of it (and of nothing it was not given).
#[derive(Clone)]
pub(crate) struct CommitRecords(GrantKey);

/// What a commit record names.
pub(crate) struct Committed<'a> {
    pub(crate) node_id: &'a str,
    pub(crate) key: &'a str,
    pub(crate) offset: u64,
    pub(crate) length: u64,
    pub(crate) crc32c: u32,
    pub(crate) generation: u64,
    pub(crate) digest: Option<&'a [u8]>,
    /// An announced put's entry (before its PutEnd), not a commit's: told
    /// apart in the MAC, so a node cannot pass the announcement (which
    /// carries no digest) off as the commit.
    pub(crate) announced: bool,
}

impl<'a> Committed<'a> {
    /// What a store node's report of `o` says it was given.
    pub(crate) fn reported(node_id: &'a str, o: &'a strata_proto::NodeObject) -> Self {
        Committed {
            node_id,
            key: &o.key,
            offset: o.offset,
            length: o.length,
            crc32c: o.crc32c,
            generation: o.generation,
            digest: (!o.blake3.is_empty()).then_some(&o.blake3[..]),
            announced: false,
        }
    }
}

impl CommitRecords {
    pub(crate) fn sign(&self, c: &Committed) -> [u8; MAC_LEN] {
        let mut h = blake3::Hasher::new_keyed(self.0.as_bytes());
        h.update(if c.announced {
            b"strata announce record v1\0"
        } else {
            b"strata commit record v1\0\0"
        });
        for part in [c.node_id.as_bytes(), c.key.as_bytes()] {
            h.update(&(part.len() as u64).to_le_bytes());
            h.update(part);
        }
        h.update(&c.offset.to_le_bytes());
        h.update(&c.length.to_le_bytes());
        h.update(&c.crc32c.to_le_bytes());
        h.update(&c.generation.to_le_bytes());
        match c.digest {
            Some(d) => {
                h.update(&[1]);
                h.update(d);
            }
            None => {
                h.update(&[0]);
            }
        }
        let mut out = [0u8; MAC_LEN];
        out.copy_from_slice(&h.finalize().as_bytes()[..MAC_LEN]);
        out
    }

    pub(crate) fn verify(&self, c: &Committed, record: &[u8]) -> bool {
        strata_common::grant::same_mac(&self.sign(c), record)
    }
}

/// The master's grant key, created once and kept in the durable state, so
/// that grants and members' derived keys stay valid across a restart.
pub(crate) async fn load_grant_key(kv: &dyn DurableKv) -> Result<GrantKey> {
    const KEY: &str = "grant-key/v1";
    let hex = crate::durable::get_or_create(kv, KEY, || async { Ok(GrantKey::random().to_hex()) })
        .await?;
    GrantKey::from_hex(&hex).ok_or_else(|| {
        Error::new(
            Code::Corrupted,
            format!("durable {KEY} is not 64 hex digits; restore the master's --state-dir"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The term a master's keys are for is the one it was elected with
    /// (heartbeats and fences compare members' terms with it).
    #[test]
    fn term_keys_know_their_term() {
        let k = GrantKey::random();
        assert_eq!(TermKeys::new(k.clone(), 7).term(), 7);
        assert_eq!(TermKeys::new(k, 8).term(), 8);
    }
}
