//! Backend-independent planning of one audit batch: revocation re-check, chaining and
//! counter deltas. The backends only do the I/O.

use std::collections::HashMap;

use agentid_core::domain::audit::{AuditEntry, AuditRecord};
use agentid_core::domain::{new_id, IdPrefix, Ledger, VerifyResult};

use super::block::Head;
pub use super::block::Heads;
use agentid_core::domain::audit::revoked_failure_reason;

/// Distinct agent ids of entries that are about to be recorded as `valid`.
pub fn valid_agent_ids(entries: &[AuditEntry]) -> Vec<String> {
    // Sorted and deduplicated as borrows: a batch is mostly a few agents many times over.
    let mut ids: Vec<&str> = entries
        .iter()
        .filter(|e| e.result == VerifyResult::Valid)
        .map(|e| e.agent_id.as_str())
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids.into_iter().map(str::to_owned).collect()
}

/// The lowest revocation epoch the checks of the `valid` entries had seen (`i64::MAX` when
/// there are none): a revocation committed with a higher epoch may be missing from one of
/// their checks, so the store must then re-check them agent by agent.
pub fn revocations_seen(entries: &[AuditEntry]) -> i64 {
    entries
        .iter()
        .filter(|e| e.result == VerifyResult::Valid)
        .map(|e| e.revocations_seen)
        .min()
        .unwrap_or(i64::MAX)
}

/// Turns `valid` entries of agents the store knows as revoked into `revoked` ones. This is
/// what makes a revocation committed by another instance binding before an answer is sent.
pub(crate) fn apply_revocations(entries: &mut [AuditEntry], revoked: &HashMap<String, Option<String>>) {
    if revoked.is_empty() {
        return;
    }
    for e in entries.iter_mut().filter(|e| e.result == VerifyResult::Valid) {
        if let Some(reason) = revoked.get(&e.agent_id) {
            e.result = VerifyResult::Revoked;
            e.failure_reason = Some(revoked_failure_reason(reason.as_deref()));
        }
    }
}

/// Distinct ledgers of a batch, sorted (the lock order on PostgreSQL).
pub fn ledgers(entries: &[AuditEntry]) -> Vec<Ledger> {
    let mut l: Vec<&Ledger> = entries.iter().map(|e| &e.ledger).collect();
    l.sort_unstable();
    l.dedup();
    l.into_iter().cloned().collect()
}

/// Chains the entries after the given heads (a ledger missing from them starts at genesis)
/// and moves each head's `seq` and `hash` past them.
pub fn seal(entries: Vec<AuditEntry>, heads: &mut Heads) -> Vec<AuditRecord> {
    entries
        .into_iter()
        .map(|e| {
            // The ledger is cloned only for the first record of a ledger the heads lack.
            if !heads.contains_key(&e.ledger) {
                heads.insert(e.ledger.clone(), Head::default());
            }
            let head = heads.get_mut(&e.ledger).expect("inserted above");
            let rec = AuditRecord::seal(e, new_id(IdPrefix::Log), head.seq + 1, head.hash);
            head.seq = rec.seq;
            head.hash = rec.hash;
            rec
        })
        .collect()
}

/// Records of a batch that was not written, back as the entries they were sealed from, in
/// order (`seen`: each entry's `revocations_seen`, which a record does not keep). Their ids
/// and places in the chains are dropped: the next round seals them afresh.
pub(crate) fn unseal(records: Vec<AuditRecord>, seen: &[i64]) -> Vec<AuditEntry> {
    debug_assert_eq!(records.len(), seen.len());
    records
        .into_iter()
        .zip(seen)
        .map(|(r, &revocations_seen)| AuditEntry {
            event: r.event,
            ledger: r.ledger,
            agent_id: r.agent_id,
            result: r.result,
            failure_reason: r.failure_reason,
            latency_us: r.latency_us,
            requested_at: r.requested_at,
            revocations_seen,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentid_core::domain::audit::{Event, GENESIS};
    use agentid_core::domain::{KeyMode, Millis};

    fn entry(org: &str, agent: &str, result: VerifyResult) -> AuditEntry {
        AuditEntry {
            event: Event::Verification,
            ledger: Ledger {
                org_id: org.into(),
                mode: KeyMode::Live,
            },
            agent_id: agent.into(),
            result,
            failure_reason: None,
            latency_us: 5,
            requested_at: Millis(1),
            revocations_seen: 0,
        }
    }

    #[test]
    fn seals_interleaved_ledgers_into_separate_chains() {
        let entries = vec![
            entry("o1", "a", VerifyResult::Valid),
            entry("o2", "b", VerifyResult::Invalid),
            entry("o1", "a", VerifyResult::Expired),
        ];
        let mut heads = HashMap::new();
        let recs = seal(entries, &mut heads);
        assert_eq!(recs.iter().map(|r| r.seq).collect::<Vec<_>>(), [1, 1, 2]);
        assert_eq!((recs[0].prev_hash, recs[1].prev_hash), (GENESIS, GENESIS));
        assert_eq!(recs[2].prev_hash, recs[0].hash);
        assert!(recs.iter().all(|r| r.hash == r.compute_hash()));
        assert_eq!(heads.len(), 2);
    }

    #[test]
    fn revocations_turn_valid_into_revoked_only() {
        let mut entries = vec![
            entry("o", "a", VerifyResult::Valid),
            entry("o", "a", VerifyResult::Expired),
        ];
        let revoked = HashMap::from([("a".to_string(), Some("stolen".to_string()))]);
        apply_revocations(&mut entries, &revoked);
        assert_eq!(entries[0].result, VerifyResult::Revoked);
        assert_eq!(
            entries[0].failure_reason.as_deref(),
            Some("agent revoked: stolen")
        );
        assert_eq!(entries[1].result, VerifyResult::Expired);
    }

    #[test]
    fn unsealed_records_are_the_entries_they_were_sealed_from() {
        let mut entries = vec![
            entry("o1", "a", VerifyResult::Valid),
            entry("o2", "b", VerifyResult::Invalid),
            entry("o1", "c", VerifyResult::Revoked),
        ];
        entries[1].failure_reason = Some("bad signature".into());
        for (e, seen) in entries.iter_mut().zip([7, 3, 9]) {
            e.revocations_seen = seen;
        }
        let recs = seal(entries.clone(), &mut HashMap::new());
        assert_eq!(unseal(recs, &[7, 3, 9]), entries);
    }
}
