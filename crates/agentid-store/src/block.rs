//! Audit blocks: how sealed records are stored. One row per (batch, ledger), at most
//! [`BLOCK_MAX`] records, holding the records themselves in a compact binary form, instead of
//! one row (and two index entries) per record: PostgreSQL's per-row cost was the largest
//! item of a verify.
//!
//! A block row carries what reads need without decoding: its sequence range, the hash the
//! first record follows and the last record's hash (the ledger head), which results occur in
//! it, and the ledger's running totals per result after it. Beside it, one row per distinct
//! agent of the block (`audit_block_agents`) with the same two facts for that agent: a page
//! filtered by agent or result walks only blocks holding a match, and every total is the
//! running count of the newest such row.
//!
//! The encoding of `records` starts with its version byte. Version 2 (written since schema
//! 5) stores a hot block in well under half the bytes of version 1, so a full
//! block of one agent (~7 kB) stays in its row instead of going to the TOAST table (whose
//! chunks, index entries and bytes were ~15 % of PostgreSQL's CPU per hot batch, by perf),
//! and the audit log takes less than half the disk:
//! - a string table: a varint count, then each distinct agent id and failure reason of the
//!   block once, in first-use order, as a *text*;
//! - per record in sequence order: a tag byte (bits 0–1 the result index, bit 2 set when a
//!   failure reason follows; other bits must be 0), the `id` as a text, the agent id's table
//!   index (varint), the failure reason's table index (varint, only with bit 2),
//!   `latency_us` (zigzag varint), `requested_at` as a zigzag varint of its difference from
//!   the previous record's (the first's from 0, wrapping), and `hash` (32 bytes).
//!
//! A *text* is a kind byte: 1 = `agt_` and 2 = `log_` followed by the 16 bytes of a ULID
//! whose lower-case form is the rest of the string (checked when written, so every text
//! reads back byte for byte), 0 = a varint length and that many UTF-8 bytes (any other
//! string). Varints are LEB128, at most 10 bytes.
//!
//! Version 1 (still read): per record, result (u8), then `id`, `agent_id` (u32 little-endian
//! length, UTF-8 bytes), failure reason (u8 0 = none, 1 = a length-prefixed string follows),
//! `latency_us` and `requested_at` (i64 little-endian), `hash` (32 bytes).
//!
//! In both, org, mode and `seq` come from the row; a record's `prev_hash` is the previous
//! record's `hash` (the block's `prev_hash` for the first), so a block stores every link of
//! its chain once and an edited record still breaks the chain at the next one.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

use agentid_core::domain::audit::AuditRecord;
use agentid_core::domain::{Ledger, Millis, Totals, VerifyResult};

use super::StoreError;

/// Records per block at most. Bounds the work of a filtered page (a page reads at most
/// `limit + 2` blocks) while a block still spreads its row costs over many records.
pub const BLOCK_MAX: usize = 128;

const V1: u8 = 1;
const V2: u8 = 2;

/// Kinds of a version 2 text (see the module documentation).
const TEXT_RAW: u8 = 0;
const ULID_TEXTS: [(u8, &str); 2] = [(1, "agt_"), (2, "log_")];
/// Version 2 tag bits: the result index, and whether a failure reason follows.
const TAG_RESULT: u8 = 0b011;
const TAG_REASON: u8 = 0b100;

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
            hash: agentid_core::domain::audit::GENESIS,
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
/// the previous hash: sealed batches hold none, and a block must keep any such break
/// visible). `heads` holds each ledger's running totals before the records and
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
                let i = r.result.index();
                running[i] += 1;
                results |= r.result.bit();
                if !r.agent_id.is_empty() {
                    let a = agents.entry(&r.agent_id).or_default();
                    a.0 |= r.result.bit();
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
                records: encode(chunk),
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

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    (v >> 1) as i64 ^ -((v & 1) as i64)
}

/// The kind and 16 bytes of `s` when it is a known prefix and a ULID in the form `new_id`
/// writes (26 characters of lower-case Crockford base32, the first at most `7`): each such
/// string is the one text of its 128 bits, so it reads back exactly. `None` keeps any other
/// string (upper case, another alphabet or length) as it is.
fn ulid_text(s: &str) -> Option<(u8, [u8; 16])> {
    let (kind, prefix) = ULID_TEXTS.into_iter().find(|(_, p)| s.starts_with(p))?;
    let rest = &s.as_bytes()[prefix.len()..];
    if rest.len() != ulid::ULID_LEN || rest[0] > b'7' {
        return None;
    }
    let mut v: u128 = 0;
    for &c in rest {
        v = v << 5 | u128::from(crockford_digit(c)?);
    }
    Some((kind, v.to_be_bytes()))
}

/// The value of a lower-case Crockford base32 digit (`0-9a-z` without `i l o u`).
fn crockford_digit(c: u8) -> Option<u8> {
    match CROCKFORD[usize::from(c)] {
        NOT_A_DIGIT => None,
        v => Some(v),
    }
}

const NOT_A_DIGIT: u8 = 0xff;

/// Each byte's digit value, or `NOT_A_DIGIT`. A table, not a `match`: every record's id goes
/// through `ulid_text`, and a match over its random digits was a mispredicted branch or two a
/// character (~0.15 µs a record under hot load, by perf).
const CROCKFORD: [u8; 256] = {
    let alphabet = b"0123456789abcdefghjkmnpqrstvwxyz";
    let mut table = [NOT_A_DIGIT; 256];
    let mut i = 0;
    while i < alphabet.len() {
        table[alphabet[i] as usize] = i as u8;
        i += 1;
    }
    table
};

fn put_text(out: &mut Vec<u8>, s: &str) {
    match ulid_text(s) {
        Some((kind, bytes)) => {
            out.push(kind);
            out.extend_from_slice(&bytes);
        }
        None => {
            out.push(TEXT_RAW);
            put_varint(out, s.len() as u64);
            out.extend_from_slice(s.as_bytes());
        }
    }
}

/// A block's string table as it is written: each distinct string once, in first-use order.
#[derive(Default)]
struct Strings<'r> {
    table: Vec<&'r str>,
    index: HashMap<&'r str, u64>,
}

impl<'r> Strings<'r> {
    fn index(&mut self, s: &'r str) -> u64 {
        *self.index.entry(s).or_insert_with(|| {
            self.table.push(s);
            self.table.len() as u64 - 1
        })
    }
}

/// The `records` bytes (version 2) of consecutive records of one ledger.
pub fn encode(records: &[&AuditRecord]) -> Vec<u8> {
    // Records first, into their own buffer, while the string table fills up.
    let mut strings = Strings::default();
    // The agent of the previous record: a block is mostly runs of one agent.
    let mut last_agent: Option<(&str, u64)> = None;
    let mut body = Vec::with_capacity(records.len() * 56);
    let mut prev_time = 0i64;
    for r in records {
        let reason = r.failure_reason.as_deref();
        body.push(r.result.index() as u8 | if reason.is_some() { TAG_REASON } else { 0 });
        put_text(&mut body, &r.id);
        let agent = match last_agent {
            Some((a, i)) if a == r.agent_id => i,
            _ => strings.index(&r.agent_id),
        };
        last_agent = Some((&r.agent_id, agent));
        put_varint(&mut body, agent);
        if let Some(reason) = reason {
            put_varint(&mut body, strings.index(reason));
        }
        put_varint(&mut body, zigzag(r.latency_us));
        put_varint(&mut body, zigzag(r.requested_at.0.wrapping_sub(prev_time)));
        prev_time = r.requested_at.0;
        body.extend_from_slice(&r.hash);
    }
    let table = strings.table;
    let mut out = Vec::with_capacity(body.len() + 10 + table.iter().map(|s| s.len() + 2).sum::<usize>());
    out.push(V2);
    put_varint(&mut out, table.len() as u64);
    for s in &table {
        put_text(&mut out, s);
    }
    out.extend_from_slice(&body);
    out
}

/// A stored block as read back: the row's columns the decoding needs.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct StoredBlock {
    pub first_seq: i64,
    pub last_seq: i64,
    pub prev_hash: Vec<u8>,
    pub records: Vec<u8>,
}

/// A block row with every column, as `audit verify` checks it against its records.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct FullBlock {
    #[sqlx(flatten)]
    pub block: StoredBlock,
    pub last_hash: Vec<u8>,
    pub results: i32,
    pub n_valid: i64,
    pub n_invalid: i64,
    pub n_expired: i64,
    pub n_revoked: i64,
}

/// One `audit_block_agents` row of an agent.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct AgentBlockRow {
    pub first_seq: i64,
    pub results: i32,
    pub n_valid: i64,
    pub n_invalid: i64,
    pub n_expired: i64,
    pub n_revoked: i64,
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

    /// A version 1 string: u32 little-endian length, UTF-8 bytes.
    fn str(&mut self) -> Result<&'a str, StoreError> {
        let len = u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes"));
        self.utf8(len as usize)
    }

    fn utf8(&mut self, len: usize) -> Result<&'a str, StoreError> {
        std::str::from_utf8(self.take(len)?).map_err(|_| corrupt("text is not UTF-8"))
    }

    fn varint(&mut self) -> Result<u64, StoreError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            if shift == 63 && b > 1 {
                return Err(corrupt("varint overflow"));
            }
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(corrupt("varint overflow"))
    }

    fn text(&mut self) -> Result<Text<'a>, StoreError> {
        match self.u8()? {
            TEXT_RAW => {
                let len = usize::try_from(self.varint()?).map_err(|_| corrupt("text length"))?;
                Ok(Text::Raw(self.utf8(len)?))
            }
            kind => {
                let (_, prefix) = ULID_TEXTS
                    .into_iter()
                    .find(|(k, _)| *k == kind)
                    .ok_or_else(|| corrupt("text kind"))?;
                Ok(Text::Ulid(prefix, self.take(16)?.try_into().expect("16 bytes")))
            }
        }
    }

    /// A version 2 table index.
    fn entry<'t>(&mut self, table: &'t [Cow<'a, str>]) -> Result<&'t str, StoreError> {
        let i = usize::try_from(self.varint()?).ok();
        i.and_then(|i| table.get(i))
            .map(|s| s.as_ref())
            .ok_or_else(|| corrupt("string table index"))
    }

    fn hash(&mut self) -> Result<[u8; 32], StoreError> {
        Ok(self.take(32)?.try_into().expect("32 bytes"))
    }

    fn record_v1(&mut self) -> Result<Raw<'a, 'a>, StoreError> {
        let result = result_at(self.u8()?)?;
        let id = Text::Raw(self.str()?);
        let agent_id = self.str()?;
        let failure_reason = match self.u8()? {
            0 => None,
            1 => Some(self.str()?),
            _ => return Err(corrupt("failure reason flag")),
        };
        Ok(Raw {
            result,
            id,
            agent_id,
            failure_reason,
            latency_us: self.i64()?,
            requested_at: self.i64()?,
            hash: self.hash()?,
        })
    }

    /// `prev_time`: the previous record's `requested_at` (0 before the first), moved on.
    fn record_v2<'t>(
        &mut self,
        table: &'t [Cow<'a, str>],
        prev_time: &mut i64,
    ) -> Result<Raw<'a, 't>, StoreError> {
        let tag = self.u8()?;
        if tag & !(TAG_RESULT | TAG_REASON) != 0 {
            return Err(corrupt("record tag"));
        }
        let result = result_at(tag & TAG_RESULT)?;
        let id = self.text()?;
        let agent_id = self.entry(table)?;
        let failure_reason = match tag & TAG_REASON {
            0 => None,
            _ => Some(self.entry(table)?),
        };
        let latency_us = unzigzag(self.varint()?);
        *prev_time = prev_time.wrapping_add(unzigzag(self.varint()?));
        Ok(Raw {
            result,
            id,
            agent_id,
            failure_reason,
            latency_us,
            requested_at: *prev_time,
            hash: self.hash()?,
        })
    }
}

fn result_at(code: u8) -> Result<VerifyResult, StoreError> {
    VerifyResult::ALL
        .get(code as usize)
        .copied()
        .ok_or_else(|| corrupt("result code"))
}

/// A decoded text, made into a `String` only for the records that are kept.
enum Text<'a> {
    Raw(&'a str),
    /// A prefix and a ULID's bytes.
    Ulid(&'static str, [u8; 16]),
}

impl<'a> Text<'a> {
    fn to_cow(&self) -> Cow<'a, str> {
        match *self {
            Text::Raw(s) => Cow::Borrowed(s),
            Text::Ulid(prefix, bytes) => {
                let mut buf = [0u8; ulid::ULID_LEN];
                let ulid = ulid::Ulid::from_bytes(bytes).array_to_str(&mut buf);
                ulid.make_ascii_lowercase();
                let mut s = String::with_capacity(prefix.len() + ulid::ULID_LEN);
                s.push_str(prefix);
                s.push_str(ulid);
                Cow::Owned(s)
            }
        }
    }
}

/// One record as read, borrowing from the block (`'a`) and its string table (`'t`).
struct Raw<'a, 't> {
    result: VerifyResult,
    id: Text<'a>,
    agent_id: &'t str,
    failure_reason: Option<&'t str>,
    latency_us: i64,
    requested_at: i64,
    hash: [u8; 32],
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
    let mut out = Vec::new();
    walk(block, |seq, prev_hash, raw| {
        if keep(&Probe {
            seq,
            agent_id: raw.agent_id,
            result: raw.result,
        }) {
            out.push(AuditRecord {
                ledger: ledger.clone(),
                seq,
                id: raw.id.to_cow().into_owned(),
                agent_id: raw.agent_id.to_owned(),
                result: raw.result,
                failure_reason: raw.failure_reason.map(str::to_owned),
                latency_us: raw.latency_us,
                requested_at: Millis(raw.requested_at),
                prev_hash,
                hash: raw.hash,
            });
        }
    })?;
    Ok(out)
}

/// The record hashes of a block whose `seq` lies in `seqs`, in order, appended to `out`
/// (the leaves of the ledger's Merkle tree): nothing else is allocated.
pub fn record_hashes(
    block: &StoredBlock,
    seqs: std::ops::RangeInclusive<i64>,
    out: &mut Vec<[u8; 32]>,
) -> Result<(), StoreError> {
    walk(block, |seq, _, raw| {
        if seqs.contains(&seq) {
            out.push(raw.hash);
        }
    })
}

/// Reads every record of a block in sequence order: `visit(seq, prev_hash, record)`.
fn walk(block: &StoredBlock, mut visit: impl FnMut(i64, [u8; 32], &Raw<'_, '_>)) -> Result<(), StoreError> {
    let mut r = Reader {
        bytes: &block.records,
        at: 0,
    };
    let version = r.u8()?;
    let table: Vec<Cow<'_, str>> = match version {
        V1 => Vec::new(),
        V2 => {
            // Every entry takes at least two bytes, so a damaged count ends at the data's end.
            let n = r.varint()?;
            let mut table = Vec::new();
            for _ in 0..n {
                table.push(r.text()?.to_cow());
            }
            table
        }
        _ => return Err(corrupt("unknown version")),
    };
    let mut prev_hash: [u8; 32] = block
        .prev_hash
        .as_slice()
        .try_into()
        .map_err(|_| corrupt("prev_hash length"))?;
    let mut prev_time = 0i64;
    let mut seq = block.first_seq;
    while r.at < r.bytes.len() {
        if seq > block.last_seq {
            return Err(corrupt("more records than its sequence range"));
        }
        let raw = match version {
            V1 => r.record_v1()?,
            _ => r.record_v2(&table, &mut prev_time)?,
        };
        visit(seq, prev_hash, &raw);
        prev_hash = raw.hash;
        seq = seq
            .checked_add(1)
            .ok_or_else(|| corrupt("sequence number overflow"))?;
    }
    if seq.checked_sub(1) != Some(block.last_seq) {
        return Err(corrupt("fewer records than its sequence range"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch;
    use agentid_core::domain::audit::{AuditEntry, ChainChecker};
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
        let records = batch::seal(entries(40), &mut HashMap::new());
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
}

/// The block decoder never panics, whatever a row holds: arbitrary bytes and sequence
/// ranges, and real blocks with one byte changed or cut short (fixed seed).
#[cfg(test)]
mod props {
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
            let _ = record_hashes(&b, 0..=i64::MAX, &mut Vec::new());
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
}
