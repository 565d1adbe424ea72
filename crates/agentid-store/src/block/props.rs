//! The block decoder never panics, whatever a row holds: arbitrary bytes and sequence
//! ranges, and real blocks with one byte changed or cut short (fixed seed).

use proptest::prelude::*;

use super::*;
use agentid_core::domain::audit::AuditEntry;
use agentid_core::domain::KeyMode;

fn real() -> Vec<u8> {
    let ledger = Ledger {
        org_id: "org_1".into(),
        mode: KeyMode::Live,
    };
    let entries: Vec<AuditEntry> = (0..6)
        .map(|i| AuditEntry {
            event: Event::ALL[i / 3],
            ledger: ledger.clone(),
            agent_id: format!("agt_01jd{:022}", i % 2),
            result: VerifyResult::ALL[i % 4],
            failure_reason: (i % 4 != 0).then(|| "why".to_owned()),
            latency_us: i as i64,
            requested_at: Millis(1_000 + i as i64),
            revocations_seen: 0,
        })
        .collect();
    let mut heads = Heads::new();
    let records = crate::batch::seal(entries, &mut heads);
    plan(&records, &mut heads).remove(0).records
}

fn stored(records: Vec<u8>, first: i64, last: i64, prev: Vec<u8>) -> StoredBlock {
    StoredBlock {
        first_seq: first,
        last_seq: last,
        prev_hash: prev,
        records,
    }
}

proptest! {
    #![proptest_config(agentid_core::testing::fixed_seed(31, 256))]

    #[test]
    fn any_row(
        records in proptest::collection::vec(any::<u8>(), 0..2000),
        first in any::<i64>(),
        len in 0i64..200,
        prev in proptest::collection::vec(any::<u8>(), 0..40),
    ) {
        let ledger = Ledger { org_id: "o".into(), mode: KeyMode::Live };
        let b = stored(records, first, first.saturating_add(len), prev);
        let _ = decode(&ledger, &b, |_| true);
        let _ = chained_hashes(&b, 0..=i64::MAX, &mut Vec::new(), &mut None);
    }

    #[test]
    fn a_real_block_changed_or_cut(at in any::<usize>(), byte in any::<u8>(), cut in any::<bool>()) {
        let ledger = Ledger { org_id: "o".into(), mode: KeyMode::Live };
        let mut r = real();
        let at = at % r.len();
        if cut { r.truncate(at) } else { r[at] = byte }
        let _ = decode(&ledger, &stored(r, 1, 6, vec![0; 32]), |_| true);
    }
}
