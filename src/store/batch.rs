//! Backend-independent planning of one audit batch: revocation re-check, chaining and
//! counter deltas. The backends only do the I/O.

use std::collections::{BTreeMap, HashMap};

use crate::domain::audit::{AuditEntry, AuditRecord};
use crate::domain::{new_id, IdPrefix, Ledger, VerifyResult};

use super::revoked_failure_reason;

/// Distinct agent ids of entries that are about to be recorded as `valid`.
pub fn valid_agent_ids(entries: &[AuditEntry]) -> Vec<String> {
    let mut ids: Vec<String> = entries
        .iter()
        .filter(|e| e.result == VerifyResult::Valid)
        .map(|e| e.agent_id.clone())
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// Turns `valid` entries of agents the store knows as revoked into `revoked` ones. This is
/// what makes a revocation committed by another instance binding before an answer is sent.
pub fn apply_revocations(entries: &mut [AuditEntry], revoked: &HashMap<String, Option<String>>) {
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
    let mut l: Vec<Ledger> = entries.iter().map(|e| e.ledger.clone()).collect();
    l.sort_unstable();
    l.dedup();
    l
}

/// `(seq, hash)` of each ledger's last record: what the next record follows.
pub type Heads = HashMap<Ledger, (i64, [u8; 32])>;

/// Chains the entries after the given heads.
pub fn seal(entries: Vec<AuditEntry>, heads: &mut Heads) -> Vec<AuditRecord> {
    entries
        .into_iter()
        .map(|e| {
            let head = heads
                .entry(e.ledger.clone())
                .or_insert((0, crate::domain::audit::GENESIS));
            let rec = AuditRecord::seal(e, new_id(IdPrefix::Log), head.0 + 1, head.1);
            *head = (rec.seq, rec.hash);
            rec
        })
        .collect()
}

/// One row of `audit_counts` to add `n` to. An empty `agent_id` means "any agent".
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct CountDelta {
    pub org_id: String,
    pub mode: &'static str,
    pub agent_id: String,
    pub result: &'static str,
    pub n: i64,
}

/// Counter increments for a batch: every record bumps (any agent, result) and (agent, result)
/// of its ledger (a record naming no agent only the first). Totals over results, and an
/// agent's `verification_count`, are sums of at most four rows at read time: a batch writes
/// one counter row per distinct (agent, result), not two, and never the agent row.
/// Sorted, so concurrent writers lock rows in one order.
pub fn count_deltas(records: &[AuditRecord]) -> Vec<CountDelta> {
    let mut map: BTreeMap<(&str, &'static str, &str, &'static str), i64> = BTreeMap::new();
    for r in records {
        let (org, mode, agent, result) = (
            r.ledger.org_id.as_str(),
            r.ledger.mode.as_str(),
            r.agent_id.as_str(),
            r.result.as_str(),
        );
        *map.entry((org, mode, "", result)).or_default() += 1;
        if !agent.is_empty() {
            *map.entry((org, mode, agent, result)).or_default() += 1;
        }
    }
    map.into_iter()
        .map(|((org, mode, agent, result), n)| CountDelta {
            org_id: org.to_owned(),
            mode,
            agent_id: agent.to_owned(),
            result,
            n,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::audit::ChainChecker;
    use crate::domain::{KeyMode, Millis};

    fn entry(org: &str, agent: &str, result: VerifyResult) -> AuditEntry {
        AuditEntry {
            ledger: Ledger {
                org_id: org.into(),
                mode: KeyMode::Live,
            },
            agent_id: agent.into(),
            result,
            failure_reason: None,
            latency_us: 5,
            requested_at: Millis(1),
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
        let mut c = ChainChecker::default();
        c.push(&recs[0]).unwrap();
        c.push(&recs[2]).unwrap();
        let deltas = count_deltas(&recs);
        let total_o1: i64 = deltas
            .iter()
            .filter(|d| d.org_id == "o1" && d.agent_id.is_empty())
            .map(|d| d.n)
            .sum();
        assert_eq!(total_o1, 2);
        assert_eq!(deltas.len(), 4 + 2); // o1: (any|a) × (valid|expired); o2: (any|b) × invalid

        let nameless = seal(vec![entry("", "", VerifyResult::Invalid)], &mut heads);
        let d = count_deltas(&nameless);
        assert_eq!(d.len(), 1, "a record naming no agent counts once: {d:?}");
        assert_eq!((d[0].agent_id.as_str(), d[0].result, d[0].n), ("", "invalid", 1));
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
}
