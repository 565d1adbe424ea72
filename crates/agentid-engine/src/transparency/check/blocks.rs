//! `audit verify` over a ledger's stored blocks: each block's records against the chain, its
//! row's derived values, and the per-agent rows that `GET /v1/log` totals read.

use super::*;
use agentid_core::domain::AgentId;

impl LedgerCheck<'_> {
    pub(super) fn block(
        &mut self,
        b: &DecodedBlock,
        walk: &mut Walk,
        pending: &mut std::iter::Peekable<impl Iterator<Item = Claim>>,
    ) {
        let first = b.seal.first_seq.max(0) as u64;
        let sealed_before = walk.sealed;
        walk.sealed |= b.seal.mac.is_some();
        if self
            .keys
            .is_some_and(|keys| !super::super::block_sealed(keys, &self.ledger, &b.seal, sealed_before))
        {
            self.fail(
                Some(first),
                format!(
                    "records {first}..={}: the key file did not seal their block (written with database access alone)",
                    b.seal.last_seq
                ),
            );
        }
        if first != walk.next {
            if first > walk.next {
                self.fail(
                    Some(walk.next),
                    format!("records {}..{} are missing", walk.next, first - 1),
                );
            } else {
                self.fail(Some(first), "a block overlaps the previous one");
            }
            walk.tree = None;
        }
        let records = match &b.records {
            Ok(r) => r,
            Err(e) => {
                self.fail(
                    Some(first),
                    format!("unreadable block ({e}); checking goes on after it"),
                );
                walk.tree = None;
                walk.next = b.seal.last_seq.max(0) as u64 + 1;
                walk.prev = b.seal.last_hash.as_slice().try_into().unwrap_or([0; 32]);
                walk.totals = b.totals;
                return;
            }
        };
        let mut results = 0;
        let mut in_block: BTreeMap<&str, (i32, Totals)> = BTreeMap::new();
        for r in records {
            let seq = r.seq as u64;
            if r.prev_hash != walk.prev {
                self.fail(
                    Some(seq),
                    "does not follow the previous record's hash (the chain is broken)",
                );
            }
            if r.hash != r.compute_hash() {
                self.fail(
                    Some(seq),
                    "its hash is not the hash of its contents (the record was edited)",
                );
            }
            walk.prev = r.hash;
            results |= r.result.bit();
            walk.totals[r.result.index()] += 1;
            // Records that name no agent (forgeries of unknown agents) have no agent rows.
            if !r.agent_id.is_empty() {
                let agent = in_block.entry(&r.agent_id).or_insert((0, [0; 4]));
                agent.0 |= r.result.bit();
                agent.1[r.result.index()] += 1;
            }
            self.grow_tree(r, walk, pending);
            walk.next = seq + 1;
        }
        let last_hash: Option<Hash> = records.last().map(|r| r.hash);
        if last_hash.as_ref().map(|h| &h[..]) != Some(b.seal.last_hash.as_slice()) {
            self.fail(Some(first), "the block's last_hash is not its last record's hash");
        }
        if results != b.results {
            self.fail(
                Some(first),
                format!(
                    "the block's results are {} but its records hold {results}",
                    b.results
                ),
            );
        }
        let stored_totals = b.totals;
        if stored_totals != walk.totals {
            self.fail(
                Some(first),
                format!(
                    "the block's running totals are {stored_totals:?} but its records count {:?}",
                    walk.totals
                ),
            );
        }
        for (agent, (results, delta)) in in_block {
            let totals = walk.agent_totals.entry(agent.to_owned()).or_insert([0; 4]);
            for i in 0..4 {
                totals[i] += delta[i];
            }
            walk.expected_agent_rows
                .entry(agent.to_owned())
                .or_default()
                .push(AgentBlockRow {
                    first_seq: b.seal.first_seq,
                    results,
                    n_valid: totals[0],
                    n_invalid: totals[1],
                    n_expired: totals[2],
                    n_revoked: totals[3],
                });
        }
    }

    pub(super) async fn compare_agent_rows(
        &mut self,
        expected: HashMap<String, Vec<AgentBlockRow>>,
    ) -> Result<(), StoreError> {
        let mut agents: Vec<_> = expected.into_iter().collect();
        agents.sort_by(|a, b| a.0.cmp(&b.0));
        for (agent, rows) in agents {
            self.stored_agent_rows.remove(&agent);
            let stored = match AgentId::parse_recorded(&agent) {
                Some(id) => self.store.agent_rows(&self.ledger, &id).await?,
                // No agent row can be stored under a name that is no agent's id.
                None => Vec::new(),
            };
            if stored == rows {
                continue;
            }
            let at = rows
                .iter()
                .zip(&stored)
                .find(|(a, b)| a != b)
                .map(|(a, _)| a.first_seq)
                .or_else(|| {
                    rows.get(stored.len())
                        .or(stored.get(rows.len()))
                        .map(|r| r.first_seq)
                });
            self.fail(
                at.map(|s| s.max(0) as u64),
                format!("the per-agent rows of {agent:?} are not what its records say"),
            );
        }
        let mut extra: Vec<_> = self.stored_agent_rows.drain().collect();
        extra.sort();
        for (agent, n) in extra {
            self.fail(
                None,
                format!("{n} per-agent rows of {agent:?}, who has no records here"),
            );
        }
        Ok(())
    }
}
