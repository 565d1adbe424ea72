//! Appending a batch as blocks: one statement over `UNNEST` arrays, the heads it starts
//! from cached per ledger.

use std::collections::HashMap;

use parking_lot::Mutex;
use sqlx::PgConnection;

use crate::block::{self, Block, BlockAgent, BlockSealer};
use crate::sql::{self, may_have_committed, Refused};
use crate::{batch, StoreError};
use agentid_core::domain::audit::{AuditEntry, AuditRecord};
use agentid_core::domain::{Ledger, Totals};

/// A batch as written: its records, and what the writer's cache learns from it.
pub(super) struct Sealed {
    pub(super) records: Vec<AuditRecord>,
    pub(super) learned: Learned,
}

/// What a written batch tells the writer's cache: the heads after it, its blocks, and the
/// agents' running totals it used (`known`) and that the statement returned (`returned`).
pub(super) struct Learned {
    heads: block::Heads,
    blocks: Vec<Block>,
    known: AgentTotals,
    returned: AgentTotals,
}

/// A batch that was not written, or not known to be: why, its entries as they were handed
/// in, and, when the connection broke after the statement was sent, what it sent.
pub(super) struct Unsealed {
    pub(super) error: StoreError,
    pub(super) entries: Vec<AuditEntry>,
    pub(super) sent: Option<Sent>,
}

impl From<Unsealed> for Refused {
    fn from(u: Unsealed) -> Refused {
        (u.error, u.entries)
    }
}

/// A batch sent whose outcome is unknown: its records, and the first block of each of its
/// ledgers with the hash it ends with. The batch is one statement or one transaction, so it
/// committed if and only if those blocks are stored with those hashes; and once another
/// block holds one of their keys, it never will.
pub(super) struct Sent {
    pub(super) records: Vec<AuditRecord>,
    firsts: Vec<(Ledger, i64, [u8; 32])>,
}

impl Sent {
    pub(super) fn of(records: Vec<AuditRecord>, blocks: &[Block]) -> Sent {
        let mut firsts: Vec<(Ledger, i64, [u8; 32])> = Vec::new();
        for b in blocks {
            match firsts.iter_mut().find(|(l, _, _)| *l == b.ledger) {
                Some(f) if f.1 <= b.first_seq => {}
                Some(f) => *f = (b.ledger.clone(), b.first_seq, b.last_hash),
                None => firsts.push((b.ledger.clone(), b.first_seq, b.last_hash)),
            }
        }
        Sent { records, firsts }
    }
}

impl Sealed {
    /// The batch as sent, for when its commit's outcome is not known.
    pub(super) fn sent(&self) -> Sent {
        Sent::of(self.records.clone(), &self.learned.blocks)
    }
}

/// What the store holds at the keys of batches sent with unknown outcomes (all after the
/// same heads, so at the same keys).
pub(super) enum Found {
    /// The `i`th one committed.
    Committed(usize),
    /// Another block holds a key: none of them ever commits.
    Superseded,
    /// Nothing there yet.
    Nothing,
}

/// Looks the first blocks of `sent` up (on the writer's connection).
pub(super) async fn look_up(conn: &mut PgConnection, sent: &[Sent]) -> Result<Found, StoreError> {
    let Some(first) = sent.first() else {
        return Ok(Found::Nothing);
    };
    let (mut orgs, mut modes, mut seqs) = (Vec::new(), Vec::new(), Vec::new());
    for (l, seq, _) in &first.firsts {
        orgs.push(l.org_id.as_str());
        modes.push(l.mode.as_str());
        seqs.push(*seq);
    }
    let rows: Vec<(String, String, i64, Vec<u8>)> = sqlx::query_as(
        "SELECT b.org_id, b.mode, b.first_seq, b.last_hash \
         FROM UNNEST($1::text[], $2::text[], $3::bigint[]) AS k(o, m, s) \
         JOIN audit_blocks b ON b.org_id = k.o AND b.mode = k.m AND b.first_seq = k.s",
    )
    .bind(orgs)
    .bind(modes)
    .bind(seqs)
    .fetch_all(conn)
    .await?;
    if rows.is_empty() {
        return Ok(Found::Nothing);
    }
    let stored = |l: &Ledger, seq: i64| {
        rows.iter()
            .find(|r| r.0 == l.org_id && r.1 == l.mode.as_str() && r.2 == seq)
            .map(|r| r.3.as_slice())
    };
    Ok(sent
        .iter()
        .position(|s| {
            s.firsts
                .iter()
                .all(|(l, seq, h)| stored(l, *seq) == Some(h.as_slice()))
        })
        .map_or(Found::Superseded, Found::Committed))
}

/// A batch as if it had been sent and its connection had broken before it reached the
/// server (fault injection).
pub(super) fn unsent(entries: Vec<AuditEntry>, heads: &block::Heads, sealer: &BlockSealer) -> Unsealed {
    let seen_by_entry: Vec<i64> = entries.iter().map(|e| e.revocations_seen).collect();
    let mut after = heads.clone();
    let records = batch::seal(entries, &mut after);
    let mut blocks = block::plan(&records, &mut after);
    block::seal(&mut blocks, sealer);
    Unsealed {
        error: lost_connection(),
        sent: Some(Sent::of(records.clone(), &blocks)),
        entries: batch::unseal(records, &seen_by_entry),
    }
}

/// The error of a connection that broke (fault injection).
pub(super) fn lost_connection() -> StoreError {
    let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "injected: connection lost");
    StoreError::Unavailable(sqlx::Error::Io(io))
}

/// Seals `entries` after `heads` and writes them with one statement on `conn` (inside its
/// transaction if it is in one). A revocation the statement finds turns those entries into
/// `revoked` ones and writes again after the same heads. On an error the entries come back as
/// they were handed in; nothing was written unless the error says the statement may have
/// committed, and then what it sent comes back too.
pub(super) async fn seal_and_write(
    conn: &mut PgConnection,
    mut entries: Vec<AuditEntry>,
    heads: block::Heads,
    cache: &Mutex<WriterCache>,
    sealer: &BlockSealer,
) -> Result<Sealed, Unsealed> {
    // What each entry's check had seen: the records do not keep it (see `batch::unseal`).
    let seen_by_entry: Vec<i64> = entries.iter().map(|e| e.revocations_seen).collect();
    loop {
        let mut after = heads.clone();
        let seen = batch::revocations_seen(&entries);
        // Sealed by value: a round that does not write turns the records back into entries,
        // so no round clones the batch's strings.
        let records = batch::seal(std::mem::take(&mut entries), &mut after);
        let mut blocks = block::plan(&records, &mut after);
        block::seal(&mut blocks, sealer);
        let known = cache.lock().known_agents(&blocks);
        let written = write_blocks_with(conn, &blocks, seen, &known).await;
        entries = match written {
            Ok(Written::Done(returned)) => {
                return Ok(Sealed {
                    records,
                    learned: Learned {
                        heads: after,
                        blocks,
                        known,
                        returned,
                    },
                })
            }
            Ok(Written::Revoked(revoked)) => {
                let mut entries = batch::unseal(records, &seen_by_entry);
                batch::apply_revocations(&mut entries, &revoked.into_iter().collect());
                entries
            }
            Err(error) => {
                let sent = may_have_committed(&error).then(|| Sent::of(records.clone(), &blocks));
                return Err(Unsealed {
                    error,
                    entries: batch::unseal(records, &seen_by_entry),
                    sent,
                });
            }
        };
    }
}

/// Writes planned blocks in one statement (one round trip; its own transaction unless
/// `conn` is in one), unless an agent with `valid` records in the blocks was revoked in the
/// store and the store's revocation epoch is above `revocations_seen` (the lowest epoch the
/// checks of those records had seen; `i64::MAX`: no re-check), in which case nothing is
/// written and the revoked agents are returned. Two writers can never fork a
/// chain: a block starts right after the head its writer saw and `(org_id, mode,
/// first_seq)` is the primary key, so the second one to extend a head fails with a
/// conflict. Agents in `known` have their running totals computed here; the others are
/// read from their newest row by the statement, which returns what it wrote for them.
async fn write_blocks_with(
    conn: &mut PgConnection,
    blocks: &[Block],
    revocations_seen: i64,
    known: &AgentTotals,
) -> Result<Written, StoreError> {
    let mut b = BlockColumns::default();
    let mut a = AgentColumns::default();
    let mut unknown = Vec::new();
    for blk in blocks {
        b.push(blk);
        for agent in &blk.agents {
            let prior = totals_of(known, &blk.ledger, &agent.agent_id);
            if prior.is_none() {
                unknown.push(agent.agent_id.clone());
            }
            a.push(blk, agent, prior);
        }
    }
    unknown.sort_unstable();
    unknown.dedup();
    let rows: Vec<ReturnedRow> = sqlx::query_as(APPEND)
        .bind(revocations_seen)
        .bind(b.org_id)
        .bind(b.mode)
        .bind(b.first_seq)
        .bind(b.last_seq)
        .bind(b.prev_hash)
        .bind(b.last_hash)
        .bind(b.results)
        .bind(b.totals[0].as_slice())
        .bind(b.totals[1].as_slice())
        .bind(b.totals[2].as_slice())
        .bind(b.totals[3].as_slice())
        .bind(b.records)
        .bind(a.org_id)
        .bind(a.mode)
        .bind(a.agent_id)
        .bind(a.first_seq)
        .bind(a.results)
        .bind(a.delta[0].as_slice())
        .bind(a.delta[1].as_slice())
        .bind(a.delta[2].as_slice())
        .bind(a.delta[3].as_slice())
        .bind(a.known)
        .bind(unknown)
        .bind(b.mac)
        .fetch_all(&mut *conn)
        .await?;
    let mut revoked = Vec::new();
    let mut learned: HashMap<Ledger, HashMap<String, (i64, Totals)>> = HashMap::new();
    for row in rows {
        match row.ledger {
            None => revoked.push((row.agent_id, row.reason)),
            Some((org_id, mode)) => {
                let ledger = Ledger {
                    org_id,
                    mode: sql::parse_mode(&mode)?,
                };
                // An agent's last block of the batch has its totals after it.
                let slot = learned
                    .entry(ledger)
                    .or_default()
                    .entry(row.agent_id)
                    .or_insert((0, [0; 4]));
                if row.first_seq >= slot.0 {
                    let totals = [row.n_valid, row.n_invalid, row.n_expired, row.n_revoked];
                    *slot = (row.first_seq, totals);
                }
            }
        }
    }
    Ok(if revoked.is_empty() {
        let learned = learned
            .into_iter()
            .map(|(l, agents)| (l, agents.into_iter().map(|(a, (_, t))| (a, t)).collect()))
            .collect();
        Written::Done(learned)
    } else {
        Written::Revoked(revoked)
    })
}

/// Takes the locks of the ledgers $1 (org ids) × $2 (modes), in one order so that writers
/// locking several never wait for each other in a circle; they are held to the end of the
/// transaction. The same keys as in `APPEND`.
pub(super) const LOCK_LEDGERS: &str = "
SELECT pg_advisory_xact_lock(k) FROM (
    SELECT DISTINCT hashtextextended(o || '/' || m, 7431004) AS k FROM UNNEST($1::text[], $2::text[]) AS l(o, m)
) keys ORDER BY k";

/// The whole batch append. Data-modifying CTEs all run in one snapshot, taken when the
/// statement starts, which is after every entry of the batch was handed in: a revocation
/// committed before that is seen by `rev`. While the revocation epoch is not above $1 (the
/// lowest epoch the `valid` entries' checks had seen), every committed revocation was in the
/// index those checks read, and `rev` is empty without a look-up: its test of the epoch is a
/// one-time filter above the join (EXPLAIN: an InitPlan; a cold batch names ~100 agents,
/// and their look-ups were ~15 % of PostgreSQL's CPU per record). Otherwise it looks up, by
/// primary key, each agent that has the `valid` bit in its block's agent row ($16, $18: the
/// agents of the batch are sent once, for those rows, not again as a list of ids):
/// written as `id = ANY(…) AND revoked_at IS NOT NULL`, the generic plan was a sequential
/// scan of `agents` per batch while the table had no statistics, and with statistics that
/// show few revocations a walk of every revoked agent (`agents_revoked`); the `OFFSET 0`
/// keeps the revocation test out of the per-id look-up. An agent's running totals are its newest row
/// committed before the statement plus its records in this batch up to the block; for an
/// agent the writer already knows (`known`), the totals come computed and the look-up is
/// skipped. Returns the revoked agents (ledger NULL) or, for the agents in $24, the rows
/// written.
///
/// Before it inserts, the statement takes the locks of the blocks' ledgers (`lk`, as
/// `LOCK_LEDGERS` does; the inserts depend on it), so it waits for a writer that holds them
/// in a transaction. Its snapshot is older than the wait, but its blocks start right after
/// the heads its writer saw: a block another writer committed meanwhile holds the same key,
/// and the insert fails with a conflict instead of forking the chain.
const APPEND: &str = "
WITH lk AS (
    SELECT count(*) AS n FROM (
        SELECT pg_advisory_xact_lock(k) FROM (
            SELECT DISTINCT hashtextextended(o || '/' || m, 7431004) AS k
            FROM UNNEST($2::text[], $3::text[]) AS l(o, m)
        ) keys ORDER BY k
    ) locked
), rev AS (
    SELECT a.id, a.revocation_reason FROM UNNEST($16::text[], $18::int[]) AS v(id, results)
    CROSS JOIN LATERAL (
        SELECT id, revocation_reason, revoked_at FROM agents WHERE agents.id = v.id OFFSET 0
    ) a
    WHERE v.results & 1 <> 0 AND a.revoked_at IS NOT NULL  -- 1: VerifyResult::Valid.bit()
      AND (SELECT epoch FROM revocation_epoch WHERE id = 1) > $1::bigint
), blk AS (
    INSERT INTO audit_blocks (org_id, mode, first_seq, last_seq, prev_hash, last_hash, results,
                              n_valid, n_invalid, n_expired, n_revoked, records, mac)
    SELECT * FROM UNNEST($2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::bytea[], $7::bytea[],
                         $8::int[], $9::bigint[], $10::bigint[], $11::bigint[], $12::bigint[], $13::bytea[],
                         $25::bytea[])
    WHERE NOT EXISTS (SELECT 1 FROM rev) AND (SELECT n FROM lk) >= 0
), agt AS (
    INSERT INTO audit_block_agents (org_id, mode, agent_id, first_seq, results,
                                    n_valid, n_invalid, n_expired, n_revoked)
    SELECT d.org_id, d.mode, d.agent_id, d.first_seq, d.results,
           COALESCE(p.n_valid, 0) + d.v, COALESCE(p.n_invalid, 0) + d.i,
           COALESCE(p.n_expired, 0) + d.e, COALESCE(p.n_revoked, 0) + d.r
    FROM UNNEST($14::text[], $15::text[], $16::text[], $17::bigint[], $18::int[],
                $19::bigint[], $20::bigint[], $21::bigint[], $22::bigint[], $23::bool[])
         AS d(org_id, mode, agent_id, first_seq, results, v, i, e, r, known)
    LEFT JOIN LATERAL (
        SELECT n_valid, n_invalid, n_expired, n_revoked FROM audit_block_agents a
        WHERE NOT d.known AND a.agent_id = d.agent_id AND a.org_id = d.org_id AND a.mode = d.mode
        ORDER BY a.first_seq DESC LIMIT 1
    ) p ON true
    WHERE NOT EXISTS (SELECT 1 FROM rev) AND (SELECT n FROM lk) >= 0
    RETURNING agent_id, org_id, mode, first_seq, n_valid, n_invalid, n_expired, n_revoked
)
SELECT id AS agent_id, revocation_reason AS reason, NULL AS ledger, 0::bigint AS first_seq,
       0::bigint AS n_valid, 0::bigint AS n_invalid, 0::bigint AS n_expired, 0::bigint AS n_revoked FROM rev
UNION ALL
SELECT agent_id, NULL, ROW(org_id, mode), first_seq, n_valid, n_invalid, n_expired, n_revoked
FROM agt WHERE agent_id = ANY($24::text[])";

/// Column arrays of `audit_blocks` rows for one `UNNEST` insert.
#[derive(Default)]
struct BlockColumns {
    org_id: Vec<String>,
    mode: Vec<&'static str>,
    first_seq: Vec<i64>,
    last_seq: Vec<i64>,
    prev_hash: Vec<Vec<u8>>,
    last_hash: Vec<Vec<u8>>,
    results: Vec<i32>,
    totals: [Vec<i64>; 4],
    records: Vec<Vec<u8>>,
    mac: Vec<Vec<u8>>,
}

impl BlockColumns {
    fn push(&mut self, b: &Block) {
        self.org_id.push(b.ledger.org_id.clone());
        self.mode.push(b.ledger.mode.as_str());
        self.first_seq.push(b.first_seq);
        self.last_seq.push(b.last_seq);
        self.prev_hash.push(b.prev_hash.to_vec());
        self.last_hash.push(b.last_hash.to_vec());
        self.results.push(b.results);
        for (col, n) in self.totals.iter_mut().zip(b.totals) {
            col.push(n);
        }
        self.records.push(b.records.clone());
        self.mac.push(b.mac.to_vec());
    }
}

/// Column arrays of `audit_block_agents` rows: each agent's batch delta, or its running
/// totals when its totals before the batch are known.
#[derive(Default)]
struct AgentColumns {
    org_id: Vec<String>,
    mode: Vec<&'static str>,
    agent_id: Vec<String>,
    first_seq: Vec<i64>,
    results: Vec<i32>,
    delta: [Vec<i64>; 4],
    known: Vec<bool>,
}

impl AgentColumns {
    fn push(&mut self, b: &Block, a: &BlockAgent, prior: Option<&Totals>) {
        self.org_id.push(b.ledger.org_id.clone());
        self.mode.push(b.ledger.mode.as_str());
        self.agent_id.push(a.agent_id.clone());
        self.first_seq.push(b.first_seq);
        self.results.push(a.results);
        let base = prior.copied().unwrap_or_default();
        for ((col, n), p) in self.delta.iter_mut().zip(a.batch_delta).zip(base) {
            col.push(n + p);
        }
        self.known.push(prior.is_some());
    }
}

row! {
    /// A row `APPEND` returns: a revoked agent (no ledger), or an agent row it wrote.
    struct ReturnedRow {
        agent_id: String, reason: Option<String>,
        /// `(org_id, mode)` of the agent row written.
        ledger: Option<(String, String)>, first_seq: i64, n_valid: i64, n_invalid: i64,
        n_expired: i64, n_revoked: i64,
    }
}

/// Running totals per agent, per ledger.
type AgentTotals = HashMap<Ledger, HashMap<String, Totals>>;

fn totals_of<'a>(t: &'a AgentTotals, ledger: &Ledger, agent: &str) -> Option<&'a Totals> {
    t.get(ledger)?.get(agent)
}

enum Written {
    /// Committed; the running totals of the agents that were not known.
    Done(AgentTotals),
    /// Nothing written: these agents are revoked in the store.
    Revoked(Vec<(String, Option<String>)>),
}

/// At most this many agents' totals are kept per ledger (a full ledger map is emptied).
const AGENTS_PER_LEDGER: usize = 100_000;

/// What the writer knows of the ledgers it writes, valid while no other instance writes
/// them: each ledger's head, and the running totals of the agents it wrote for since it
/// learned the head. Another instance's write to a ledger makes the next write here
/// conflict (its head is stale), which forgets the ledger, head and agents together.
#[derive(Debug, Default)]
pub(super) struct WriterCache {
    pub(super) heads: block::Heads,
    agents: AgentTotals,
}

impl WriterCache {
    fn known_agents(&self, blocks: &[Block]) -> AgentTotals {
        let mut known = AgentTotals::new();
        for b in blocks {
            for a in &b.agents {
                if let Some(t) = totals_of(&self.agents, &b.ledger, &a.agent_id) {
                    known
                        .entry(b.ledger.clone())
                        .or_default()
                        .insert(a.agent_id.clone(), *t);
                }
            }
        }
        known
    }

    /// After a committed batch: the new heads, and every agent's totals after its last block
    /// (known ones advanced by the batch, the others as the statement returned them).
    pub(super) fn wrote(&mut self, learned: Learned) {
        let Learned {
            heads,
            blocks,
            known,
            returned,
        } = learned;
        let mut after = returned;
        for b in &blocks {
            for a in &b.agents {
                if let Some(prior) = totals_of(&known, &b.ledger, &a.agent_id) {
                    let total = std::array::from_fn(|i| prior[i] + a.batch_delta[i]);
                    after
                        .entry(b.ledger.clone())
                        .or_default()
                        .insert(a.agent_id.clone(), total);
                }
            }
        }
        for (ledger, agents) in after {
            let cached = self.agents.entry(ledger).or_default();
            if cached.len() + agents.len() > AGENTS_PER_LEDGER {
                cached.clear();
            }
            cached.extend(agents);
        }
        self.heads.extend(heads);
    }

    pub(super) fn forget(&mut self, ledgers: &[Ledger]) {
        for l in ledgers {
            self.heads.remove(l);
            self.agents.remove(l);
        }
    }
}
