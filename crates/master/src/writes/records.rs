//! The records store nodes keep of puts: the announcement of a put whose
//! checksum is known at PutStart (`announce`), the record a node makes from
//! the client's write (`put_record`, signed by the master), and the receipt
//! that proves it made one (`receipted`). Why a put waits for its nodes at
//! all: `crate::sync`.

use crate::cluster::Replica;
use crate::metrics::MasterMetrics;
use crate::objects::Announced;
use strata_proto as pb;

/// Tells each replica's node (those that keep pending puts) of a put whose
/// checksum is known, before its bytes are written; with `receipts`, not
/// the nodes that record it from the client's write (`put_record`).
pub(crate) fn announce(
    key: &str,
    size: u64,
    crc32c: u32,
    replicas: &[Replica],
    receipts: bool,
) -> Announced {
    let seqs = replicas
        .iter()
        .filter(|r| r.seg.node.records_pending && !r.seg.node.records_from_write(receipts))
        .map(|r| {
            let seq = r.seg.node.log_object(
                pb::object_log_entry::Op::Pending,
                true,
                key,
                r.seg.id,
                r.offset,
                size,
                crc32c,
                r.generation,
                None,
            );
            (r.seg.id, seq)
        })
        .collect();
    Announced { crc32c, seqs }
}

/// What the node of replica `r` records of a put from its write: signed
/// by the master at PutStart (`Replica.record`), by the node in its receipt.
pub(crate) fn put_record<'a>(
    key: &'a str,
    r: &Replica,
    size: u64,
    crc32c: u32,
) -> strata_common::grant::PutRecord<'a> {
    strata_common::grant::PutRecord {
        key,
        segment_id: r.seg.id,
        offset: r.offset,
        length: size,
        generation: r.generation,
        crc32c,
    }
}

/// Whether PutEnd brought the receipt of replica `r`'s node for these
/// very bytes: the node holds the put in its records (a rebuilding
/// master adopts it from there), so the commit need not be waited for.
/// A receipt that does not verify (another checksum, a node that
/// registered again since, a forgery) only loses that shortcut.
pub(crate) fn receipted(
    metrics: &MasterMetrics,
    key: &str,
    r: &Replica,
    size: u64,
    crc32c: u32,
    receipts: &[pb::PutReceipt],
) -> bool {
    let Some(receipt) = receipts.iter().find(|x| x.segment_id == r.seg.id) else {
        return false;
    };
    let put = put_record(key, r, size, crc32c);
    let ok = r.seg.node.records_receipts && r.seg.node.grant_key.verify_receipt(&put, &receipt.mac);
    if ok {
        metrics.put_receipts_accepted.inc();
    } else {
        metrics.put_receipts_refused.inc();
        // Expected after a failover (the new term's keys are other
        // keys): the metric tells, not a line per put.
        tracing::debug!(
            key,
            segment = r.seg.id,
            "a put's receipt did not verify; waiting for its node instead"
        );
    }
    ok
}
