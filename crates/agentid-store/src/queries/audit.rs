//! The SQL of `crate::audit` for one backend: `DB` is its database.

use agentid_core::domain::AgentId;
use futures_util::future::BoxFuture;

use crate::block::{self, AgentBlockRow, BlockSealer, FullBlock, StoredBlock};
use crate::sql::{parse_mode, Backend, SqlStore};
use crate::{Appended, BlockSeal, DecodedBlock, LogPage, LogQuery, StoreError, StoreFuture};
use agentid_core::domain::audit::{AuditEntry, AuditRecord};
use agentid_core::domain::{Ledger, Totals};

use crate::audit::{log_blocks_sql, totals_sql, AuditStore, TotalsRow};

use super::DB;

impl AuditStore for SqlStore<DB> {
    fn append_audit(&self, entries: Vec<AuditEntry>, sealer: BlockSealer) -> BoxFuture<'_, Appended> {
        Box::pin(async move {
            assert!(!self.outage.faults.take_panic(), "injected audit flush failure");
            let n = entries.len();
            let (failure, entries) = match DB::append(self, entries, sealer.clone()).await {
                Ok(records) => return Appended::all(records),
                Err(refused) => refused,
            };
            let ledgers = crate::batch::ledgers(&entries);
            if failure.is_unavailable() || ledgers.len() < 2 {
                return Appended::none(n, failure);
            }
            // One ledger's trouble must not fail the other ledgers' records: each alone.
            tracing::warn!(error = %failure, ledgers = ledgers.len(), "audit batch refused; appending its ledgers one by one");
            let mut records: Vec<Option<AuditRecord>> = (0..n).map(|_| None).collect();
            let mut last_failure = None;
            for ledger in &ledgers {
                let (at, part): (Vec<usize>, Vec<AuditEntry>) = entries
                    .iter()
                    .enumerate()
                    .filter(|(_, e)| &e.ledger == ledger)
                    .map(|(i, e)| (i, e.clone()))
                    .unzip();
                match DB::append(self, part, sealer.clone()).await {
                    Ok(written) => {
                        for (i, r) in at.into_iter().zip(written) {
                            records[i] = Some(r);
                        }
                    }
                    Err((e, _)) => last_failure = Some(e),
                }
            }
            Appended {
                records,
                failure: last_failure,
            }
        })
    }

    fn read_log<'a>(&'a self, q: LogQuery<'a>) -> StoreFuture<'a, LogPage> {
        Box::pin(async move {
            let sql = log_blocks_sql(&q, &DB::LOG_PLAN);
            let mut query = sqlx::query_as::<_, StoredBlock>(&sql)
                .bind(q.ledger.org_id.as_str())
                .bind(q.ledger.mode.as_str());
            if let Some(agent) = q.agent_id {
                query = query.bind(agent);
            }
            if let Some(before) = q.before_seq {
                query = query.bind(before);
            }
            let blocks = query
                .bind(i64::from(q.limit) + 2)
                .fetch_all(&mut *self.conn().await?)
                .await?;
            let want = q.limit as usize + 1;
            let mut records = Vec::with_capacity(want);
            for b in &blocks {
                let mut found = block::decode(q.ledger, b, |p| {
                    q.before_seq.is_none_or(|before| p.seq < before)
                        && q.agent_id.is_none_or(|a| p.agent_id == a)
                        && q.result.is_none_or(|r| p.result == r)
                })?;
                found.reverse();
                records.extend(found);
                if records.len() >= want {
                    break;
                }
            }
            let has_more = records.len() > q.limit as usize;
            records.truncate(q.limit as usize);
            let query = sqlx::query_as(totals_sql(q.agent_id.is_some()))
                .bind(q.ledger.org_id.as_str())
                .bind(q.ledger.mode.as_str());
            let totals: Option<TotalsRow> = match q.agent_id {
                Some(agent) => query.bind(agent),
                None => query,
            }
            .fetch_optional(&mut *self.conn().await?)
            .await?;
            let totals: Totals = totals.map_or([0; 4], Into::into);
            Ok(LogPage {
                records,
                has_more,
                total: match q.result {
                    Some(r) => totals[r.index()],
                    None => totals.iter().sum(),
                },
            })
        })
    }

    fn ledgers(&self) -> StoreFuture<'_, Vec<Ledger>> {
        Box::pin(async move {
            let rows: Vec<(String, String)> = sqlx::query_as(
                "SELECT org_id, mode FROM audit_blocks UNION SELECT org_id, mode FROM audit_checkpoints \
                 ORDER BY org_id, mode",
            )
            .fetch_all(&mut *self.conn().await?)
            .await?;
            rows.into_iter()
                .map(|(org_id, mode)| {
                    Ok(Ledger {
                        org_id,
                        mode: parse_mode(&mode)?,
                    })
                })
                .collect()
        })
    }

    fn ledger_size<'a>(&'a self, ledger: &'a Ledger) -> StoreFuture<'a, u64> {
        Box::pin(async move {
            let row: Option<(i64,)> = sqlx::query_as(
                "SELECT last_seq FROM audit_blocks WHERE org_id = $1 AND mode = $2 ORDER BY first_seq DESC LIMIT 1",
            )
            .bind(ledger.org_id.as_str())
            .bind(ledger.mode.as_str())
            .fetch_optional(&mut *self.conn().await?)
            .await?;
            let last = row.map_or(0, |(n,)| n);
            u64::try_from(last).map_err(|_| StoreError::Corrupt(format!("last_seq {last}")))
        })
    }

    fn blocks_before_first<'a>(&'a self, ledger: &'a Ledger) -> StoreFuture<'a, u64> {
        Box::pin(async move {
            let (n,): (i64,) = sqlx::query_as(
                "SELECT COUNT(*) FROM audit_blocks WHERE org_id = $1 AND mode = $2 AND first_seq < 1",
            )
            .bind(ledger.org_id.as_str())
            .bind(ledger.mode.as_str())
            .fetch_one(&mut *self.conn().await?)
            .await?;
            Ok(n.max(0) as u64)
        })
    }

    fn read_blocks<'a>(
        &'a self,
        ledger: &'a Ledger,
        after: i64,
        limit: u32,
    ) -> StoreFuture<'a, Vec<DecodedBlock>> {
        Box::pin(async move {
            let rows: Vec<FullBlock> = sqlx::query_as(
                "SELECT first_seq, last_seq, prev_hash, records, last_hash, results, \
                 n_valid, n_invalid, n_expired, n_revoked, mac FROM audit_blocks \
                 WHERE org_id = $1 AND mode = $2 AND first_seq > $3 ORDER BY first_seq LIMIT $4",
            )
            .bind(ledger.org_id.as_str())
            .bind(ledger.mode.as_str())
            .bind(after)
            .bind(i64::from(limit))
            .fetch_all(&mut *self.conn().await?)
            .await?;
            Ok(rows
                .into_iter()
                .map(|b| DecodedBlock {
                    records: block::decode(ledger, &b.block, |_| true),
                    seal: BlockSeal {
                        first_seq: b.block.first_seq,
                        last_seq: b.block.last_seq,
                        prev_hash: b.block.prev_hash,
                        last_hash: b.last_hash,
                        mac: b.mac,
                    },
                    results: b.results,
                    totals: [b.n_valid, b.n_invalid, b.n_expired, b.n_revoked],
                })
                .collect())
        })
    }

    fn block_seals<'a>(&'a self, ledger: &'a Ledger, from: i64, to: i64) -> StoreFuture<'a, Vec<BlockSeal>> {
        Box::pin(async move {
            let rows: Vec<BlockSeal> = sqlx::query_as(
                "SELECT first_seq, last_seq, prev_hash, last_hash, mac FROM audit_blocks \
                 WHERE org_id = $1 AND mode = $2 AND first_seq <= $4 \
                 AND first_seq >= COALESCE((SELECT first_seq FROM audit_blocks \
                   WHERE org_id = $1 AND mode = $2 AND first_seq < $3 AND mac IS NOT NULL \
                   ORDER BY first_seq DESC LIMIT 1), (SELECT MAX(first_seq) FROM audit_blocks \
                   WHERE org_id = $1 AND mode = $2 AND first_seq <= $3), 0) \
                 ORDER BY first_seq",
            )
            .bind(ledger.org_id.as_str())
            .bind(ledger.mode.as_str())
            .bind(from)
            .bind(to)
            .fetch_all(&mut *self.conn().await?)
            .await?;
            Ok(rows)
        })
    }

    fn agent_rows<'a>(
        &'a self,
        ledger: &'a Ledger,
        agent_id: &'a AgentId,
    ) -> StoreFuture<'a, Vec<AgentBlockRow>> {
        Box::pin(async move {
            Ok(sqlx::query_as(
                "SELECT first_seq, results, n_valid, n_invalid, n_expired, n_revoked FROM audit_block_agents \
                 WHERE agent_id = $1 AND org_id = $2 AND mode = $3 ORDER BY first_seq",
            )
            .bind(agent_id.as_str())
            .bind(ledger.org_id.as_str())
            .bind(ledger.mode.as_str())
            .fetch_all(&mut *self.conn().await?)
            .await?)
        })
    }

    #[cfg(feature = "test-hooks")]
    fn inject_write_fault(&self, fault: crate::WriteFault) -> bool {
        use crate::WriteFault::{LostAck, LostWrite};
        if matches!(fault, LostAck | LostWrite) && !DB::LOSES_CONNECTIONS {
            return false;
        }
        self.outage.faults.set(fault);
        true
    }

    fn agent_row_counts(&self) -> StoreFuture<'_, Vec<(Ledger, String, i64)>> {
        Box::pin(async move {
            let rows: Vec<(String, String, String, i64)> = sqlx::query_as(
                "SELECT org_id, mode, agent_id, COUNT(*) FROM audit_block_agents GROUP BY org_id, mode, agent_id",
            )
            .fetch_all(&mut *self.conn().await?)
            .await?;
            rows.into_iter()
                .map(|(org_id, mode, agent, n)| {
                    Ok((
                        Ledger {
                            org_id,
                            mode: parse_mode(&mode)?,
                        },
                        agent,
                        n,
                    ))
                })
                .collect()
        })
    }
}

/// The heads of `ledgers` (where each one's next record goes), read on `conn`.
pub(crate) async fn ledger_heads(
    conn: &mut <DB as sqlx::Database>::Connection,
    ledgers: impl IntoIterator<Item = Ledger>,
) -> Result<block::Heads, StoreError> {
    let mut heads = block::Heads::new();
    for ledger in ledgers {
        let head = sqlx::query_as(crate::audit::LEDGER_HEAD_SQL)
            .bind(&ledger.org_id)
            .bind(ledger.mode.as_str())
            .fetch_optional(&mut *conn)
            .await?;
        heads.insert(ledger, crate::audit::ledger_head(head)?);
    }
    Ok(heads)
}
