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
//!   failure reason follows, bits 3–4 the event index: 0 a verification, 1 a token request's
//!   record, 2 the issuer-domain list's growth, `Event::ALL`; other bits must be 0), the `id` as a text, the agent id's table
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

use agentid_core::domain::audit::{AuditRecord, Event};
use agentid_core::domain::{Ledger, Millis, Totals, VerifyResult};

use super::StoreError;

/// Records per block at most. Bounds the work of a filtered page (a page reads at most
/// `limit + 2` blocks) while a block still spreads its row costs over many records.
pub(crate) const BLOCK_MAX: usize = 128;

const V1: u8 = 1;
const V2: u8 = 2;

/// Kinds of a version 2 text (see the module documentation).
const TEXT_RAW: u8 = 0;
const ULID_TEXTS: [(u8, &str); 2] = [(1, "agt_"), (2, "log_")];
/// Version 2 tag bits: the result index, whether a failure reason follows, and the event
/// index (1 was the only other event first: bit 3 alone).
const TAG_RESULT: u8 = 0b0_0011;
const TAG_REASON: u8 = 0b0_0100;
const TAG_EVENT: u8 = 0b1_1000;
const TAG_EVENT_SHIFT: u32 = 3;

/// Where a ledger stands: its last record and its running totals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    pub(crate) seq: i64,
    pub(crate) hash: [u8; 32],
    pub(crate) totals: Totals,
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
pub(crate) struct BlockAgent {
    pub(crate) agent_id: String,
    pub(crate) results: i32,
    /// Records of this agent in this block, per result.
    pub(crate) delta: Totals,
    /// Records of this agent in this batch's blocks of the ledger up to this one: what a
    /// statement that sees only the rows committed before the batch adds to the agent's last
    /// running totals.
    pub(crate) batch_delta: Totals,
}

/// One `audit_blocks` row and its `audit_block_agents` rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    pub(crate) ledger: Ledger,
    pub(crate) first_seq: i64,
    pub(crate) last_seq: i64,
    pub(crate) prev_hash: [u8; 32],
    pub(crate) last_hash: [u8; 32],
    pub(crate) results: i32,
    /// The ledger's running totals after this block.
    pub(crate) totals: Totals,
    pub(crate) records: Vec<u8>,
    pub(crate) agents: Vec<BlockAgent>,
    /// The key file's seal of the block ([`seal`]; zeros until then).
    pub(crate) mac: [u8; 32],
}

/// Seals a block: the key file's MAC of `domain::audit::block_seal_input`, given to the store
/// with every batch by whoever holds the key file (the engine).
pub type BlockSealer = std::sync::Arc<dyn Fn(&[u8]) -> [u8; 32] + Send + Sync>;

/// Seals planned blocks with `sealer`.
pub(crate) fn seal(blocks: &mut [Block], sealer: &BlockSealer) {
    for b in blocks {
        b.mac = sealer(&agentid_core::domain::audit::block_seal_input(
            &b.ledger,
            b.first_seq,
            b.last_seq,
            &b.prev_hash,
            &b.last_hash,
        ));
    }
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
                mac: [0; 32],
            });
            start = end;
        }
    }
    blocks
}

row! {
    /// A stored block as read back: the row's columns the decoding needs.
    #[derive(Debug, Clone)]
    pub(crate) struct StoredBlock {
        first_seq: i64, last_seq: i64, prev_hash: Vec<u8>, records: Vec<u8>,
    }
}

row! {
    /// A block row with every column, as `audit verify` checks it against its records.
    #[derive(Debug, Clone)]
    pub(crate) struct FullBlock {
        #[flatten]
        block: StoredBlock, last_hash: Vec<u8>, results: i32, n_valid: i64, n_invalid: i64,
        n_expired: i64, n_revoked: i64, mac: Option<Vec<u8>>,
    }
}

row! {
    /// One `audit_block_agents` row of an agent.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct AgentBlockRow {
        first_seq: i64, results: i32, n_valid: i64, n_invalid: i64, n_expired: i64, n_revoked: i64,
    }
}

/// What a decoded record is tested against before it is built: `(seq, agent_id, result)`.
pub(crate) struct Probe<'a> {
    pub(crate) seq: i64,
    pub(crate) agent_id: &'a str,
    pub(crate) result: VerifyResult,
}

mod decode;
mod encode;
#[cfg(test)]
mod props;
#[cfg(test)]
mod tests;

#[cfg(test)]
use decode::*;
pub(crate) use decode::{chained_hashes, decode};
pub use encode::encode;
#[cfg(test)]
use encode::*;
