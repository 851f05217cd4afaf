//! Puts recorded from their writes. A client that knows its object's
//! checksum at PutStart gets, per replica, the master's signature of what
//! the node is to record of the put (key, range, generation, size,
//! checksum) and sends it with its write. The node keeps the put as it
//! keeps an announced one (reported to a rebuilding master if its bytes
//! match), and answers the write with a receipt signed with its grant key;
//! the master acknowledges PutEnd on that receipt instead of waiting for
//! the node's heartbeat to bring the commit and carry it back.
//!
//! A record can arrive after the master freed its range (a revoke or a
//! timeout racing a slow write): the heartbeat ends the range's fence under
//! the records' lock (`ObjectRecords::apply_freeing`), and a record is kept
//! only if the fence still holds its allocation, checked under that lock
//! too — so a freed put is never reported again.

use crate::records::ObjectRecords;
use futures::future::BoxFuture;
use prometheus::{IntCounter, IntGauge};
use std::sync::Arc;
use strata_common::grant::{GrantScope, MAC_LEN};
use strata_common::{Error, Result};
use strata_proto::CommittedObject;
use strata_transport::frame::{Request, Staged, WriteRecord};
use strata_transport::region::{DataRegion, ReadSource, SegmentTable, WriteTarget};

/// The node's data plane: its segments, and the records writes add to.
pub struct NodeRegion {
    pub table: Arc<SegmentTable>,
    pub records: Arc<ObjectRecords>,
    /// Puts recorded from their writes, and records refused.
    pub recorded: IntCounter,
    pub refused: IntCounter,
    /// Pending puts held (the heartbeat sets it too, as entries end them).
    pub pending: IntGauge,
    /// The term of the registration whose key checks records (kept with
    /// each record, so a rebuilding master knows which key signed it).
    pub fence: Arc<strata_common::term::TermFence>,
}

impl NodeRegion {
    fn record(&self, req: &Request, record: &WriteRecord) -> Result<[u8; MAC_LEN]> {
        let g = &req.grant;
        // A record names a whole allocation: one write of all of it.
        if req.offset != g.offset || req.length != g.length {
            return Err(Error::invalid(
                "a write that records its put must cover its whole grant in one request",
            ));
        }
        let key = self
            .table
            .grant_key()
            .ok_or_else(|| Error::unavailable("node is not registered with a master"))?;
        let put = record.of(g);
        if !key.verify_record(&put, &record.mac) {
            return Err(Error::new(
                strata_common::Code::PermissionDenied,
                "the write's record is not the master's (wrong key, range or checksum)",
            ));
        }
        let kept = self.records.record_put(
            CommittedObject {
                key: record.key.clone(),
                segment_id: g.segment_id,
                offset: g.offset,
                length: g.length,
                crc32c: record.crc32c,
                generation: g.generation,
                put_record: record.mac.to_vec(),
                put_record_term: self.fence.seen(),
                ..Default::default()
            },
            || self.table.is_live(g.segment_id, g.offset, g.generation),
        );
        if !kept {
            return Err(Error::new(
                strata_common::Code::PermissionDenied,
                "grant revoked: the put's range was freed (or committed) before its record \
                 was kept; ask the master for fresh replicas",
            ));
        }
        Ok(key.sign_receipt(&put))
    }
}

impl DataRegion for NodeRegion {
    fn read<'a>(&'a self, req: &'a Request, now_ms: u64) -> BoxFuture<'a, Result<ReadSource>> {
        self.table.read(req, now_ms)
    }

    fn write_target(&self, req: &Request, now_ms: u64) -> Result<WriteTarget> {
        self.table.write_target(req, now_ms)
    }

    fn signed(&self, grant: &GrantScope, mac: &[u8]) -> bool {
        self.table.signed(grant, mac)
    }

    fn ping_payload(&self) -> Vec<u8> {
        self.table.ping_payload()
    }

    fn stage<'a>(&'a self, req: &'a Request, now_ms: u64) -> BoxFuture<'a, Result<Staged>> {
        self.table.stage(req, now_ms)
    }

    fn record_put(&self, req: &Request, record: &WriteRecord) -> Option<Result<[u8; MAC_LEN]>> {
        let r = self.record(req, record);
        match &r {
            Ok(_) => {
                self.recorded.inc();
                self.pending.set(self.records.pending_len() as i64);
            }
            Err(e) => {
                self.refused.inc();
                tracing::debug!(key = record.key, error = %e, "write's record refused");
            }
        }
        Some(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use strata_common::grant::{GrantKey, GrantScope, PutRecord, PERM_WRITE};
    use strata_common::Code;
    use strata_transport::frame::Op;
    use strata_transport::region::Segment;

    const SEG: u64 = 1;

    fn write(key: &GrantKey, offset: u64, length: u64, generation: u64) -> Request {
        let grant = GrantScope {
            perm: PERM_WRITE,
            segment_id: SEG,
            offset,
            length,
            expires_unix_ms: u64::MAX,
            generation,
        };
        Request {
            mac: key.sign(&grant),
            grant,
            offset,
            length,
            ..Request::ungranted(Op::Write, 1, 0, 0)
        }
    }

    fn record(signer: &GrantKey, key: &str, req: &Request) -> WriteRecord {
        let put = PutRecord {
            key,
            segment_id: req.grant.segment_id,
            offset: req.grant.offset,
            length: req.grant.length,
            generation: req.grant.generation,
            crc32c: 7,
        };
        WriteRecord {
            key: key.into(),
            crc32c: 7,
            mac: signer.sign_record(&put),
        }
    }

    fn region(key: &GrantKey) -> NodeRegion {
        let table = Arc::new(SegmentTable::new());
        let seg = Arc::new(Segment::new(1 << 20).unwrap());
        table.install(key.clone(), HashMap::from([(SEG, seg)]), 1);
        NodeRegion {
            table,
            records: Arc::new(ObjectRecords::default()),
            recorded: IntCounter::new("recorded", "recorded").unwrap(),
            refused: IntCounter::new("refused", "refused").unwrap(),
            pending: IntGauge::new("pending", "pending").unwrap(),
            fence: Default::default(),
        }
    }

    fn pending_keys(r: &NodeRegion) -> Vec<String> {
        r.records.pending().into_iter().map(|p| p.key).collect()
    }

    /// A write's record is kept (and receipted, with the node's key) when
    /// the master signed it for this very grant, the write covers all of
    /// it, and the allocation is still live when its bytes have landed.
    #[test]
    fn a_write_records_its_put_only_when_signed_whole_and_live() {
        let key = GrantKey::random();
        let r = region(&key);
        let req = write(&key, 0, 100, 5);
        let lease = r.write_target(&req, 0).unwrap();
        let rec = record(&key, "a", &req);
        let receipt = r.record_put(&req, &rec).unwrap().unwrap();
        drop(lease);
        assert!(key.verify_receipt(&rec.of(&req.grant), &receipt));
        assert!(!key.verify_record(&rec.of(&req.grant), &receipt));
        assert_eq!(pending_keys(&r), ["a"]);
        assert_eq!((r.recorded.get(), r.pending.get()), (1, 1));

        // Not the master's: signed with another key, or altered on the way.
        let req = write(&key, 4096, 100, 6);
        let _lease = r.write_target(&req, 0).unwrap();
        let refused = |rec: &WriteRecord| r.record_put(&req, rec).unwrap().unwrap_err().code;
        assert_eq!(
            refused(&record(&GrantKey::random(), "b", &req)),
            Code::PermissionDenied
        );
        let mut altered = record(&key, "b", &req);
        altered.crc32c = 8;
        assert_eq!(refused(&altered), Code::PermissionDenied);
        let mut renamed = record(&key, "b", &req);
        renamed.key = "victim".into();
        assert_eq!(refused(&renamed), Code::PermissionDenied);
        // Part of the grant only.
        let mut part = req.clone();
        part.length = 99;
        assert_eq!(
            r.record_put(&part, &record(&key, "b", &req))
                .unwrap()
                .unwrap_err()
                .code,
            Code::InvalidArgument
        );
        assert_eq!(pending_keys(&r), ["a"], "a refused record was kept");
        assert_eq!(r.refused.get(), 4);
        // The same write, signed right: kept.
        r.record_put(&req, &record(&key, "b", &req))
            .unwrap()
            .unwrap();
        assert_eq!(pending_keys(&r), ["a", "b"]);
    }

    /// What a kept record says is exactly what the master signed, for the
    /// term the node had seen (a rebuilding master checks each field), and
    /// the region answers for its table (signatures, pings).
    #[test]
    fn a_kept_record_names_the_signed_put_and_the_term() {
        let key = GrantKey::random();
        let r = region(&key);
        r.fence.admit(3).unwrap();
        let req = write(&key, 4096, 100, 9);
        let _lease = r.write_target(&req, 0).unwrap();
        let rec = record(&key, "a", &req);
        r.record_put(&req, &rec).unwrap().unwrap();
        let kept = r.records.pending();
        assert_eq!(kept.len(), 1);
        assert_eq!(
            kept[0],
            CommittedObject {
                key: "a".into(),
                segment_id: SEG,
                offset: 4096,
                length: 100,
                crc32c: 7,
                generation: 9,
                put_record: rec.mac.to_vec(),
                put_record_term: 3,
                ..Default::default()
            }
        );
        assert!(r.signed(&req.grant, &req.mac));
        assert!(!r.signed(&req.grant, &[0; MAC_LEN]));
        r.table.set_ping_payload(b"node-a".to_vec());
        assert_eq!(r.ping_payload(), b"node-a");
    }

    /// The master freed the put's range while its bytes were on the way (a
    /// revoke or a timeout, applied by the heartbeat as the node's log
    /// says): the record is refused and nothing is kept, so no rebuilding
    /// master adopts a put that was given up. An older allocation's free
    /// leaves it alone.
    #[test]
    fn a_record_that_lands_after_its_free_is_not_kept() {
        let key = GrantKey::random();
        let r = region(&key);
        let req = write(&key, 8192, 100, 7);
        let _lease = r.write_target(&req, 0).unwrap();
        let free = strata_proto::FreedRange {
            segment_id: SEG,
            offset: 8192,
            length: 100,
            generation: 7,
        };
        let log = [strata_proto::ObjectLogEntry {
            seq: 1,
            op: Some(strata_proto::object_log_entry::Op::Free(free)),
        }];
        r.records.apply_freeing(log, |f| {
            r.table
                .freed(f.segment_id, f.offset, f.length, f.generation)
        });
        let e = r
            .record_put(&req, &record(&key, "c", &req))
            .unwrap()
            .unwrap_err();
        assert_eq!(e.code, Code::PermissionDenied, "{e}");
        assert!(pending_keys(&r).is_empty());

        let req = write(&key, 16384, 100, 9);
        let _lease = r.write_target(&req, 0).unwrap();
        r.table.freed(SEG, 16384, 100, 8);
        r.record_put(&req, &record(&key, "d", &req))
            .unwrap()
            .unwrap();
        assert_eq!(pending_keys(&r), ["d"]);
        // A registration since (same key: the same master's term), so the
        // segment's fences start afresh: the old grant's record is not kept.
        let seg = Arc::new(Segment::new(1 << 20).unwrap());
        r.table.install(key.clone(), HashMap::from([(SEG, seg)]), 2);
        let e = r
            .record_put(&req, &record(&key, "d", &req))
            .unwrap()
            .unwrap_err();
        assert_eq!(e.code, Code::PermissionDenied, "{e}");
    }
}
