use super::*;
use crate::batch;
use agentid_core::domain::audit::{AuditEntry, AuditRecord, GENESIS};
use agentid_core::domain::KeyMode;

fn ledger(org: &str) -> Ledger {
    Ledger {
        org_id: org.into(),
        mode: KeyMode::Live,
    }
}

fn entries(n: usize) -> Vec<AuditEntry> {
    (0..n)
        .map(|i| AuditEntry {
            event: Event::ALL[i / 2 % Event::ALL.len()],
            ledger: ledger(if i % 3 == 0 { "o2" } else { "o1" }),
            agent_id: ["agt_a", "agt_b", ""][i % 3].into(),
            result: VerifyResult::ALL[i % 4],
            failure_reason: (i % 4 != 0).then(|| format!("reason {i} ü")),
            latency_us: i as i64,
            requested_at: Millis(1_000 + i as i64),
            revocations_seen: 0,
        })
        .collect()
}

/// Whether `records` run 1, 2, 3 … from genesis, each linked to and hashing as it should.
fn chained(records: &[AuditRecord]) -> bool {
    let mut head = (0, GENESIS);
    records.iter().all(|r| {
        let ok = r.seq == head.0 + 1 && r.prev_hash == head.1 && r.hash == r.compute_hash();
        head = (r.seq, r.hash);
        ok
    })
}

fn stored(b: &Block) -> StoredBlock {
    StoredBlock {
        first_seq: b.first_seq,
        last_seq: b.last_seq,
        prev_hash: b.prev_hash.to_vec(),
        records: b.records.clone(),
    }
}

#[test]
fn blocks_round_trip_and_keep_every_link() {
    let mut heads = HashMap::new();
    let records = batch::seal(entries(300), &mut heads);
    let mut totals = HashMap::new();
    let blocks = plan(&records, &mut totals);
    // o1 holds 200 records (two blocks), o2 100 (one).
    assert_eq!(blocks.len(), 3);
    assert!(blocks.iter().all(|b| b.last_seq - b.first_seq < BLOCK_MAX as i64));
    for org in ["o1", "o2"] {
        let mut decoded = Vec::new();
        for b in blocks.iter().filter(|b| b.ledger.org_id == org) {
            decoded.extend(decode(&b.ledger, &stored(b), |_| true).unwrap());
        }
        assert!(chained(&decoded));
        let original: Vec<_> = records
            .iter()
            .filter(|r| r.ledger.org_id == org)
            .cloned()
            .collect();
        assert_eq!(decoded, original);
        let counted: i64 = totals[&ledger(org)].totals.iter().sum();
        assert_eq!(counted, original.len() as i64);
    }
}

#[test]
fn running_totals_and_batch_deltas_add_up() {
    let records = batch::seal(entries(300), &mut HashMap::new());
    let mut heads = HashMap::from([(
        ledger("o1"),
        Head {
            totals: [10, 0, 0, 1],
            ..Head::default()
        },
    )]);
    let blocks = plan(&records, &mut heads);
    let o1: Vec<_> = blocks.iter().filter(|b| b.ledger.org_id == "o1").collect();
    assert_eq!(o1[0].totals.iter().sum::<i64>(), 11 + 128);
    assert_eq!(o1[1].totals, heads[&ledger("o1")].totals);
    for second in &o1[1].agents {
        let first = o1[0]
            .agents
            .iter()
            .find(|f| f.agent_id == second.agent_id)
            .unwrap();
        let sum: Totals = std::array::from_fn(|i| first.delta[i] + second.delta[i]);
        assert_eq!(second.batch_delta, sum);
        assert_eq!(first.batch_delta, first.delta);
    }
    assert!(
        blocks
            .iter()
            .flat_map(|b| &b.agents)
            .all(|a| !a.agent_id.is_empty()),
        "records naming no agent count for the ledger only"
    );
}

#[test]
fn a_break_in_the_records_starts_a_new_block() {
    let mut heads = HashMap::new();
    let mut records = batch::seal(entries(9), &mut heads);
    records.retain(|r| r.ledger.org_id == "o1");
    records[3].prev_hash = [7; 32];
    let blocks = plan(&records, &mut HashMap::new());
    assert_eq!(blocks.len(), 2);
    assert_eq!(blocks[1].prev_hash, [7; 32]);
    let decoded: Vec<_> = blocks
        .iter()
        .flat_map(|b| decode(&b.ledger, &stored(b), |_| true).unwrap())
        .collect();
    assert_eq!(decoded.len(), records.len());
    assert!(!chained(&decoded), "the break stays visible");
}

#[test]
fn the_filter_sees_seq_agent_and_result_before_anything_is_built() {
    let mut heads = HashMap::new();
    let records = batch::seal(entries(30), &mut heads);
    let blocks = plan(&records, &mut HashMap::new());
    let b = blocks.iter().find(|b| b.ledger.org_id == "o1").unwrap();
    let got = decode(&b.ledger, &stored(b), |p| p.agent_id == "agt_b" && p.seq < 10).unwrap();
    assert!(!got.is_empty());
    assert!(got.iter().all(|r| r.agent_id == "agt_b" && r.seq < 10));
}

#[test]
fn damaged_bytes_are_an_error_not_a_panic() {
    let mut heads = HashMap::new();
    let records = batch::seal(entries(12), &mut heads);
    let blocks = plan(&records, &mut HashMap::new());
    let good = stored(&blocks[0]);
    for cut in 0..good.records.len() {
        let mut b = good.clone();
        b.records.truncate(cut);
        assert!(decode(&blocks[0].ledger, &b, |_| true).is_err(), "cut at {cut}");
    }
    let mut b = good.clone();
    b.last_seq += 1;
    assert!(decode(&blocks[0].ledger, &b, |_| true).is_err());
    for (first, last) in [
        (i64::MAX, i64::MAX),
        (i64::MAX - 1, i64::MAX),
        (i64::MIN, i64::MIN),
    ] {
        let b = StoredBlock {
            first_seq: first,
            last_seq: last,
            ..good.clone()
        };
        assert!(
            decode(&blocks[0].ledger, &b, |_| true).is_err(),
            "{first}..{last}"
        );
    }
    // Any byte changed: decoded or refused, never a panic.
    let ledger = &blocks[0].ledger;
    for at in 0..good.records.len() {
        for flip in [0x01, 0x80, 0xff] {
            let mut b = good.clone();
            b.records[at] ^= flip;
            let _ = decode(ledger, &b, |_| true);
        }
    }
    // Version 2's own checks: version byte, text kind, record tag, table index.
    let mut b = good.clone();
    b.records[0] = 3;
    assert!(decode(ledger, &b, |_| true).is_err(), "unknown version");
    assert!((1..0x7f).contains(&good.records[1]), "a one-byte table count");
    let mut b = good.clone();
    b.records[2] = 7;
    assert!(decode(ledger, &b, |_| true).is_err(), "text kind");
    let first_record = table_end(&good.records);
    let mut b = good.clone();
    b.records[first_record] |= 0x80;
    assert!(decode(ledger, &b, |_| true).is_err(), "record tag");
    let mut b = good.clone();
    b.records[first_record] |= 0b1_1000;
    assert!(decode(ledger, &b, |_| true).is_err(), "no event has index 3");
    let mut b = good.clone();
    // After the tag and the id (a `log_` ULID: kind and 16 bytes).
    b.records[first_record + 18] = 0x7f;
    assert!(decode(ledger, &b, |_| true).is_err(), "agent index");
    // Version 1 blocks, as earlier builds wrote them.
    let mut b = good;
    b.records = encode_v1(&records.iter().filter(|r| r.ledger == *ledger).collect::<Vec<_>>());
    assert!(decode(ledger, &b, |_| true).is_ok());
    b.records[1] = 9;
    assert!(decode(ledger, &b, |_| true).is_err());
    b.records[1] = 0;
    b.records[3] = 0xff;
    assert!(decode(ledger, &b, |_| true).is_err());
}

/// Where the first record starts in version 2 bytes whose table holds only raw texts
/// and agent ULIDs.
fn table_end(bytes: &[u8]) -> usize {
    let mut r = Reader { bytes, at: 1 };
    for _ in 0..r.varint().unwrap() {
        r.text().unwrap();
    }
    r.at
}

/// Version 1, as builds before version 2 wrote it.
fn encode_v1(records: &[&AuditRecord]) -> Vec<u8> {
    fn put_str(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(&(s.len() as u32).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    }
    let mut out = vec![V1];
    for r in records {
        out.push(r.result.index() as u8);
        put_str(&mut out, &r.id);
        put_str(&mut out, &r.agent_id);
        match &r.failure_reason {
            None => out.push(0),
            Some(reason) => {
                out.push(1);
                put_str(&mut out, reason);
            }
        }
        out.extend_from_slice(&r.latency_us.to_le_bytes());
        out.extend_from_slice(&r.requested_at.0.to_le_bytes());
        out.extend_from_slice(&r.hash);
    }
    out
}

#[test]
fn version_1_blocks_still_decode_to_the_same_records() {
    // Version 1 was written before token requests had records: verifications only.
    let verifications = entries(40)
        .into_iter()
        .map(|e| AuditEntry {
            event: Event::Verification,
            ..e
        })
        .collect();
    let records = batch::seal(verifications, &mut HashMap::new());
    let blocks = plan(&records, &mut HashMap::new());
    for b in &blocks {
        let mine: Vec<&AuditRecord> = records.iter().filter(|r| r.ledger == b.ledger).collect();
        let v1 = StoredBlock {
            records: encode_v1(&mine),
            ..stored(b)
        };
        assert_eq!(
            decode(&b.ledger, &v1, |_| true).unwrap(),
            decode(&b.ledger, &stored(b), |_| true).unwrap()
        );
    }
}

#[test]
fn every_string_and_integer_reads_back_exactly() {
    let upper = format!("log_{}", ulid::Ulid::new());
    let ids = [
        agentid_core::domain::new_id(agentid_core::domain::IdPrefix::Log),
        upper.clone(),
        "log_".into(),
        "log_zzzzzzzzzzzzzzzzzzzzzzzzzz".into(),
        "agt_7zzzzzzzzzzzzzzzzzzzzzzzzz".into(),
        "legacy-id ü".into(),
        String::new(),
    ];
    let agents = [
        "agt_01jd0000000000000000000000",
        "agt_01JD0000000000000000000000",
        "",
        "x",
    ];
    let extremes = [i64::MIN, -1, 0, 1, 127, 128, i64::MAX];
    let entries: Vec<AuditEntry> = (0..ids.len() * extremes.len())
        .map(|i| AuditEntry {
            event: Event::Verification,
            ledger: ledger("o1"),
            agent_id: agents[i % agents.len()].into(),
            result: VerifyResult::ALL[i % 4],
            failure_reason: (i % 4 != 0).then(|| ["", "é \u{0}", "x"][i % 3].to_string()),
            latency_us: extremes[i % extremes.len()],
            requested_at: Millis(extremes[(i / 3) % extremes.len()]),
            revocations_seen: 0,
        })
        .collect();
    let mut records = batch::seal(entries, &mut HashMap::new());
    for (i, r) in records.iter_mut().enumerate() {
        r.id = ids[i % ids.len()].clone();
    }
    let blocks = plan(&records, &mut HashMap::new());
    let decoded: Vec<_> = blocks
        .iter()
        .flat_map(|b| decode(&b.ledger, &stored(b), |_| true).unwrap())
        .collect();
    assert_eq!(decoded, records);
    assert!(
        decoded.iter().any(|r| r.id == upper),
        "an upper-case ULID is kept as written"
    );
}

#[test]
fn ulid_texts_read_back_exactly_and_nothing_else_is_compacted() {
    use rand::RngCore;
    let mut rng = rand::thread_rng();
    for i in 0..2000 {
        let mut bytes = [0u8; 16];
        rng.fill_bytes(&mut bytes);
        if i < 2 {
            bytes = [[0; 16], [0xff; 16]][i];
        }
        let mut buf = [0u8; ulid::ULID_LEN];
        let text = ulid::Ulid::from_bytes(bytes).array_to_str(&mut buf);
        let upper = format!("agt_{text}");
        text.make_ascii_lowercase();
        for (kind, prefix) in ULID_TEXTS {
            let s = format!("{prefix}{text}");
            assert_eq!(ulid_text(&s), Some((kind, bytes)), "{s}");
            assert_eq!(Text::Ulid(prefix, bytes).to_cow(), s);
        }
        if upper[4..] != *text {
            assert_eq!(ulid_text(&upper), None, "{upper}");
        }
    }
    for other in [
        "log_8zzzzzzzzzzzzzzzzzzzzzzzzz",
        "log_01jd000000000000000000000",
        "log_01jd00000000000000000000000",
        "log_01jd000000000000000000000i",
        "req_01jd0000000000000000000000",
        "log_01jd00000000000000000000é",
    ] {
        assert_eq!(ulid_text(other), None, "{other}");
    }
}

#[test]
fn a_full_block_of_one_agent_fits_a_row() {
    // PostgreSQL keeps a row in the table up to `toast_tuple_target` (8160 bytes, set by
    // migration 3) and moves larger values to the TOAST table; a row's other columns take
    // about 150 bytes.
    let entries: Vec<AuditEntry> = (0..BLOCK_MAX)
        .map(|i| AuditEntry {
            event: Event::Verification,
            ledger: ledger("org_01jd0000000000000000000000"),
            agent_id: "agt_01jd0000000000000000000000".into(),
            result: VerifyResult::Valid,
            failure_reason: None,
            latency_us: 1500 + i as i64,
            requested_at: Millis(1_795_000_000_000 + i as i64 / 8),
            revocations_seen: 0,
        })
        .collect();
    let records = batch::seal(entries, &mut HashMap::new());
    let blocks = plan(&records, &mut HashMap::new());
    assert_eq!(blocks.len(), 1);
    let (v2, v1) = (
        blocks[0].records.len(),
        encode_v1(&records.iter().collect::<Vec<_>>()).len(),
    );
    assert!(v2 + 150 < 8160, "{v2} bytes");
    assert!(v2 * 2 < v1, "version 2 {v2} bytes, version 1 {v1}");
}

#[test]
fn a_range_of_records_reads_every_block_that_can_hold_them() {
    // The range query's window is a block's most records: it finds every block holding its
    // first seq (and any row overlapping it).
    assert!(crate::tree::RANGE_BLOCKS_SQL.contains(&format!("first_seq > $3 - {BLOCK_MAX} ")));
}
