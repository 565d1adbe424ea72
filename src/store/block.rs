//! Audit blocks: how sealed records are stored. One row per (batch, ledger), at most
//! [`BLOCK_MAX`] records, holding the records themselves in a compact binary form, instead of
//! one row (and two index entries) per record: PostgreSQL's per-row cost was the largest
//! item of a verify (see `load/README.md`).
//!
//! A block row carries what reads need without decoding: its sequence range, the hash the
//! first record follows and the last record's hash (the ledger head), which results occur in
//! it, and the ledger's running totals per result after it. Beside it, one row per distinct
//! agent of the block (`audit_block_agents`) with the same two facts for that agent: a page
//! filtered by agent or result walks only blocks holding a match, and every total is the
//! running count of the newest such row.
//!
//! The encoding of `records` (version 1), per record in sequence order: result (u8), then
//! `id`, `agent_id` (u32 little-endian length, UTF-8 bytes), failure reason (u8 0 = none,
//! 1 = a length-prefixed string follows), `latency_us` and `requested_at` (i64 little-endian),
//! `hash` (32 bytes). Org, mode and `seq` come from the row; a record's `prev_hash` is the
//! previous record's `hash` (the block's `prev_hash` for the first), so a block stores every
//! link of its chain once and an edited record still breaks the chain at the next one.

use std::collections::{BTreeMap, HashMap};

use crate::domain::audit::AuditRecord;
use crate::domain::{Ledger, Millis, VerifyResult};

use super::StoreError;

/// Records per block at most. Bounds the work of a filtered page (a page reads at most
/// `limit + 2` blocks) while a block still spreads its row costs over many records.
pub const BLOCK_MAX: usize = 128;

const VERSION: u8 = 1;

/// Running totals of a ledger or an agent, indexed by [`result_index`].
pub type Totals = [i64; 4];

pub fn result_index(r: VerifyResult) -> usize {
    match r {
        VerifyResult::Valid => 0,
        VerifyResult::Invalid => 1,
        VerifyResult::Expired => 2,
        VerifyResult::Revoked => 3,
    }
}

/// The bit of a result in a block's `results` set.
pub fn result_bit(r: VerifyResult) -> i32 {
    1 << result_index(r)
}

/// Where a ledger stands: its last record and its running totals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    pub seq: i64,
    pub hash: [u8; 32],
    pub totals: Totals,
}

impl Default for Head {
    fn default() -> Self {
        Head {
            seq: 0,
            hash: crate::domain::audit::GENESIS,
            totals: [0; 4],
        }
    }
}

/// The head of each ledger a batch touches.
pub type Heads = HashMap<Ledger, Head>;

/// One agent's share of a block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockAgent {
    pub agent_id: String,
    pub results: i32,
    /// Records of this agent in this block, per result.
    pub delta: Totals,
    /// Records of this agent in this batch's blocks of the ledger up to this one: what a
    /// statement that sees only the rows committed before the batch adds to the agent's last
    /// running totals.
    pub batch_delta: Totals,
}

/// One `audit_blocks` row and its `audit_block_agents` rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    pub ledger: Ledger,
    pub first_seq: i64,
    pub last_seq: i64,
    pub prev_hash: [u8; 32],
    pub last_hash: [u8; 32],
    pub results: i32,
    /// The ledger's running totals after this block.
    pub totals: Totals,
    pub records: Vec<u8>,
    pub agents: Vec<BlockAgent>,
}

/// Cuts sealed records into blocks: per ledger, in sequence order, at most [`BLOCK_MAX`]
/// each, and a new block wherever the records do not link (a gap or a `prev_hash` that is not
/// the previous hash: only a legacy table being converted can hold such a break, and a block
/// must keep it visible). `heads` holds each ledger's running totals before the records and
/// is advanced past them (only the totals: sealing moved the rest); a ledger missing from it
/// starts at zero.
pub fn plan(records: &[AuditRecord], heads: &mut Heads) -> Vec<Block> {
    let mut by_ledger: BTreeMap<&Ledger, Vec<&AuditRecord>> = BTreeMap::new();
    for r in records {
        by_ledger.entry(&r.ledger).or_default().push(r);
    }
    let mut blocks = Vec::new();
    for (ledger, mut recs) in by_ledger {
        recs.sort_by_key(|r| r.seq);
        let running = &mut heads.entry(ledger.clone()).or_default().totals;
        let mut batch_agents: BTreeMap<&str, Totals> = BTreeMap::new();
        let mut start = 0;
        while start < recs.len() {
            let mut end = start + 1;
            while end < recs.len()
                && end - start < BLOCK_MAX
                && recs[end - 1].seq.checked_add(1) == Some(recs[end].seq)
                && recs[end].prev_hash == recs[end - 1].hash
            {
                end += 1;
            }
            let chunk = &recs[start..end];
            let mut results = 0;
            let mut agents: BTreeMap<&str, (i32, Totals)> = BTreeMap::new();
            for r in chunk {
                let i = result_index(r.result);
                running[i] += 1;
                results |= result_bit(r.result);
                if !r.agent_id.is_empty() {
                    let a = agents.entry(&r.agent_id).or_default();
                    a.0 |= result_bit(r.result);
                    a.1[i] += 1;
                    batch_agents.entry(&r.agent_id).or_default()[i] += 1;
                }
            }
            blocks.push(Block {
                ledger: ledger.clone(),
                first_seq: chunk[0].seq,
                last_seq: chunk[chunk.len() - 1].seq,
                prev_hash: chunk[0].prev_hash,
                last_hash: chunk[chunk.len() - 1].hash,
                results,
                totals: *running,
                records: encode(chunk.iter().copied()),
                agents: agents
                    .into_iter()
                    .map(|(agent_id, (results, delta))| BlockAgent {
                        agent_id: agent_id.to_owned(),
                        results,
                        delta,
                        batch_delta: batch_agents[agent_id],
                    })
                    .collect(),
            });
            start = end;
        }
    }
    blocks
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// The `records` bytes of consecutive records of one ledger.
pub fn encode<'a>(records: impl Iterator<Item = &'a AuditRecord>) -> Vec<u8> {
    let mut out = Vec::with_capacity(BLOCK_MAX * 96);
    out.push(VERSION);
    for r in records {
        out.push(result_index(r.result) as u8);
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

/// A stored block as read back: the row's columns the decoding needs.
#[derive(Debug, Clone)]
pub struct StoredBlock {
    pub first_seq: i64,
    pub last_seq: i64,
    pub prev_hash: Vec<u8>,
    pub records: Vec<u8>,
}

/// `first_seq, last_seq, prev_hash, records`, as selected.
pub type StoredBlockRow = (i64, i64, Vec<u8>, Vec<u8>);

impl From<StoredBlockRow> for StoredBlock {
    fn from((first_seq, last_seq, prev_hash, records): StoredBlockRow) -> Self {
        StoredBlock {
            first_seq,
            last_seq,
            prev_hash,
            records,
        }
    }
}

/// What a decoded record is tested against before it is built: `(seq, agent_id, result)`.
pub struct Probe<'a> {
    pub seq: i64,
    pub agent_id: &'a str,
    pub result: VerifyResult,
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], StoreError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or_else(|| corrupt("truncated"))?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8, StoreError> {
        Ok(self.take(1)?[0])
    }

    fn i64(&mut self) -> Result<i64, StoreError> {
        Ok(i64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    fn str(&mut self) -> Result<&'a str, StoreError> {
        let len = u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes"));
        std::str::from_utf8(self.take(len as usize)?).map_err(|_| corrupt("text is not UTF-8"))
    }
}

fn corrupt(what: &str) -> StoreError {
    StoreError::Corrupt(format!("audit block: {what}"))
}

/// Decodes a block of `ledger`, in sequence order, keeping the records `keep` accepts (only
/// those are allocated). Fails on any byte that does not fit the format, never panics.
pub fn decode(
    ledger: &Ledger,
    block: &StoredBlock,
    mut keep: impl FnMut(&Probe<'_>) -> bool,
) -> Result<Vec<AuditRecord>, StoreError> {
    let mut r = Reader {
        bytes: &block.records,
        at: 0,
    };
    if r.u8()? != VERSION {
        return Err(corrupt("unknown version"));
    }
    let mut prev_hash: [u8; 32] = block
        .prev_hash
        .as_slice()
        .try_into()
        .map_err(|_| corrupt("prev_hash length"))?;
    let mut out = Vec::new();
    let mut seq = block.first_seq;
    while r.at < r.bytes.len() {
        if seq > block.last_seq {
            return Err(corrupt("more records than its sequence range"));
        }
        let result = *VerifyResult::ALL
            .get(r.u8()? as usize)
            .ok_or_else(|| corrupt("result code"))?;
        let id = r.str()?;
        let agent_id = r.str()?;
        let failure_reason = match r.u8()? {
            0 => None,
            1 => Some(r.str()?),
            _ => return Err(corrupt("failure reason flag")),
        };
        let latency_us = r.i64()?;
        let requested_at = r.i64()?;
        let hash: [u8; 32] = r.take(32)?.try_into().expect("32 bytes");
        if keep(&Probe {
            seq,
            agent_id,
            result,
        }) {
            out.push(AuditRecord {
                ledger: ledger.clone(),
                seq,
                id: id.to_owned(),
                agent_id: agent_id.to_owned(),
                result,
                failure_reason: failure_reason.map(str::to_owned),
                latency_us,
                requested_at: Millis(requested_at),
                prev_hash,
                hash,
            });
        }
        prev_hash = hash;
        seq = seq
            .checked_add(1)
            .ok_or_else(|| corrupt("sequence number overflow"))?;
    }
    if seq.checked_sub(1) != Some(block.last_seq) {
        return Err(corrupt("fewer records than its sequence range"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::audit::{AuditEntry, ChainChecker};
    use crate::domain::KeyMode;
    use crate::store::batch;

    fn ledger(org: &str) -> Ledger {
        Ledger {
            org_id: org.into(),
            mode: KeyMode::Live,
        }
    }

    fn entries(n: usize) -> Vec<AuditEntry> {
        (0..n)
            .map(|i| AuditEntry {
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
            let mut checker = ChainChecker::default();
            let mut decoded = Vec::new();
            for b in blocks.iter().filter(|b| b.ledger.org_id == org) {
                decoded.extend(decode(&b.ledger, &stored(b), |_| true).unwrap());
            }
            for r in &decoded {
                checker.push(r).unwrap();
            }
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
        let mut checker = ChainChecker::default();
        let decoded: Vec<_> = blocks
            .iter()
            .flat_map(|b| decode(&b.ledger, &stored(b), |_| true).unwrap())
            .collect();
        assert!(
            decoded.iter().any(|r| checker.push(r).is_err()),
            "the break stays visible"
        );
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
        let mut b = good.clone();
        b.records[1] = 9;
        assert!(decode(&blocks[0].ledger, &b, |_| true).is_err());
        let mut b = good;
        b.records[3] = 0xff;
        assert!(decode(&blocks[0].ledger, &b, |_| true).is_err());
    }
}
