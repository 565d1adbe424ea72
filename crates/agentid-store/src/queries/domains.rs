//! The SQL of `crate::domains` for one backend: `DB` is its database.

use super::holdings::{append, holdings_in, org_holdings_in};
use super::revoke::revoke_in;
use crate::domains::DomainRules;
use crate::holdings::{EventRow, EVENT_COLUMNS, MIGRATED_SEQ_SQL};
use crate::sql::{Backend, SqlStore};
use crate::{Attempt, Claimed, DomainClaim, Held, Moved, NameMove, StoreError, StoreFuture};
use agentid_core::domain::holding::{self, DomainEvent, Grant, HoldRefused, Holding, UnreadEvent};
use agentid_core::domain::Millis;
use agentid_core::domain::{IssuerDomain, OrgId};

use crate::domains::{
    recent_attempts, ClaimRow, DomainListSize, DomainStore, CLAIM_COLUMNS, RELEASED_REASON, REPLACED_REASON,
};

use super::DB;

/// Up to `max` agents (by id) that `m` owes a revocation: other organizations' agents under
/// its name, registered before the move (their registration saw none of its events) and not
/// revoked yet. `take`: locked for this transaction, passing over those another transaction
/// holds (another mover's batch).
async fn owed_revocations(
    tx: &mut sqlx::Transaction<'_, DB>,
    m: &NameMove,
    max: u32,
    take: bool,
) -> Result<Vec<String>, StoreError> {
    let mut select = String::from(
        "SELECT id FROM agents WHERE org_id <> $1 AND revoked_at IS NULL \
         AND COALESCE(domain_events_seen, 0) < $4 AND (issuer_domain = $2",
    );
    if m.below {
        // Names are letters, digits, hyphens and dots: nothing LIKE reads as a wildcard.
        select.push_str(" OR issuer_domain LIKE '%.' || $2");
    }
    select.push_str(") ORDER BY id LIMIT $3");
    if take {
        select.push_str(DB::SKIP_LOCKED_ROWS);
    }
    let ids: Vec<(String,)> = sqlx::query_as(&select)
        .bind(m.org_id.as_str())
        .bind(m.domain.as_str())
        .bind(i64::from(max))
        .bind(m.seq)
        .fetch_all(&mut **tx)
        .await?;
    Ok(ids.into_iter().map(|(id,)| id).collect())
}

impl DomainStore for SqlStore<DB> {
    fn domain_events(&self) -> StoreFuture<'_, Vec<Result<DomainEvent, UnreadEvent>>> {
        Box::pin(async move {
            let rows: Vec<EventRow> =
                sqlx::query_as(&format!("SELECT {EVENT_COLUMNS} FROM domain_events ORDER BY seq"))
                    .fetch_all(&mut *self.conn().await?)
                    .await?;
            Ok(rows.into_iter().map(EventRow::read).collect())
        })
    }

    fn domain_list_size(&self) -> StoreFuture<'_, DomainListSize> {
        Box::pin(async move {
            let (rows, newest): (i64, Option<i64>) =
                sqlx::query_as("SELECT COUNT(*), MAX(seq) FROM domain_events")
                    .fetch_one(&mut *self.conn().await?)
                    .await?;
            Ok(DomainListSize {
                rows: rows.max(0) as u64,
                newest: newest.unwrap_or(0),
            })
        })
    }

    fn holdings<'a>(
        &'a self,
        rules: &'a dyn DomainRules,
        org_id: Option<&'a OrgId>,
    ) -> StoreFuture<'a, Vec<Holding>> {
        Box::pin(async move {
            let mut tx = self.begin().await?;
            let Some(org) = org_id else {
                let (migrated,): (Option<i64>,) =
                    sqlx::query_as(MIGRATED_SEQ_SQL).fetch_one(&mut *tx).await?;
                let rows: Vec<EventRow> =
                    sqlx::query_as(&format!("SELECT {EVENT_COLUMNS} FROM domain_events ORDER BY seq"))
                        .fetch_all(&mut *tx)
                        .await?;
                let rows: Vec<_> = rows.into_iter().map(EventRow::read).collect();
                return Ok(rules.holdings(&rows, migrated));
            };
            org_holdings_in(&mut tx, rules, org.as_str()).await
        })
    }

    fn holdings_over<'a>(
        &'a self,
        rules: &'a dyn DomainRules,
        name: &'a str,
    ) -> StoreFuture<'a, Vec<Holding>> {
        Box::pin(self.outage.ride_out(move || async move {
            let mut tx = self.begin().await?;
            holdings_in(&mut tx, rules, &holding::name_and_parents(name), None).await
        }))
    }

    fn claim_domain<'a>(
        &'a self,
        rules: &'a dyn DomainRules,
        claim: &'a DomainClaim,
        max_pending: u32,
        max_names: u32,
    ) -> StoreFuture<'a, Claimed> {
        Box::pin(self.outage.ride_out(move || async move {
            let mut tx = self.exclusive().await?;
            let held = holdings_in(&mut tx, rules, std::slice::from_ref(&claim.domain), None).await?;
            if let Some(h) = held.into_iter().find(|h| h.org_id == claim.org_id) {
                return Ok(Claimed::Held(h));
            }
            let existing: Option<ClaimRow> = sqlx::query_as(&format!(
                "SELECT {CLAIM_COLUMNS} FROM domain_claims WHERE org_id = $1 AND domain = $2"
            ))
            .bind(claim.org_id.as_str())
            .bind(claim.domain.as_str())
            .fetch_optional(&mut *tx)
            .await?;
            if let Some(row) = existing {
                return Ok(Claimed::Pending(row.into()));
            }
            let (pending,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM domain_claims WHERE org_id = $1")
                .bind(claim.org_id.as_str())
                .fetch_one(&mut *tx)
                .await?;
            if pending >= i64::from(max_pending) {
                return Ok(Claimed::TooMany { max: max_pending });
            }
            let held = org_holdings_in(&mut tx, rules, &claim.org_id).await?.len();
            if i64::try_from(held).unwrap_or(i64::MAX).saturating_add(pending) >= i64::from(max_names) {
                return Ok(Claimed::TooManyNames { max: max_names });
            }
            sqlx::query(
                "INSERT INTO domain_claims (org_id, domain, nonce, created_at) VALUES ($1, $2, $3, $4)",
            )
            .bind(claim.org_id.as_str())
            .bind(claim.domain.as_str())
            .bind(claim.nonce.as_str())
            .bind(claim.created_at.0)
            .execute(&mut *tx)
            .await?;
            crate::sql::commit(tx).await?;
            Ok(Claimed::New(claim.clone()))
        }))
    }

    fn domain_claim<'a>(
        &'a self,
        org_id: &'a OrgId,
        domain: &'a IssuerDomain,
    ) -> StoreFuture<'a, Option<DomainClaim>> {
        Box::pin(async move {
            let row: Option<ClaimRow> = sqlx::query_as(&format!(
                "SELECT {CLAIM_COLUMNS} FROM domain_claims WHERE org_id = $1 AND domain = $2"
            ))
            .bind(org_id.as_str())
            .bind(domain.as_str())
            .fetch_optional(&mut *self.conn().await?)
            .await?;
            Ok(row.map(Into::into))
        })
    }

    fn domain_claims<'a>(&'a self, org_id: &'a OrgId) -> StoreFuture<'a, Vec<DomainClaim>> {
        Box::pin(async move {
            let rows: Vec<ClaimRow> = sqlx::query_as(&format!(
                "SELECT {CLAIM_COLUMNS} FROM domain_claims WHERE org_id = $1 ORDER BY domain"
            ))
            .bind(org_id.as_str())
            .fetch_all(&mut *self.conn().await?)
            .await?;
            Ok(rows.into_iter().map(Into::into).collect())
        })
    }

    fn domain_attempt<'a>(
        &'a self,
        org_id: &'a OrgId,
        domain: &'a IssuerDomain,
        now: Millis,
        per_minute: usize,
    ) -> StoreFuture<'a, Attempt> {
        Box::pin(self.outage.ride_out(move || async move {
            let mut tx = self.exclusive().await?;
            let (claimed,): (bool,) = sqlx::query_as(
                "SELECT EXISTS (SELECT 1 FROM domain_claims WHERE org_id = $1 AND domain = $2)",
            )
            .bind(org_id.as_str())
            .bind(domain.as_str())
            .fetch_one(&mut *tx)
            .await?;
            if !claimed {
                return Ok(Attempt::NoClaim);
            }
            // Kept apart from the claim, so that releasing and claiming again keeps them.
            sqlx::query("DELETE FROM domain_attempts WHERE last_at < $1")
                .bind(now.0 - 60_000)
                .execute(&mut *tx)
                .await?;
            let stored: Option<(String,)> =
                sqlx::query_as("SELECT attempts FROM domain_attempts WHERE org_id = $1 AND domain = $2")
                    .bind(org_id.as_str())
                    .bind(domain.as_str())
                    .fetch_optional(&mut *tx)
                    .await?;
            let mut recent = recent_attempts(stored.as_ref().map_or("", |(s,)| s.as_str()), now);
            if recent.len() >= per_minute {
                let oldest = recent.iter().min().copied().unwrap_or(now.0);
                let wait = (oldest + 60_000 - now.0).max(1);
                return Ok(Attempt::Wait(std::time::Duration::from_millis(wait as u64)));
            }
            recent.push(now.0);
            let stored = recent.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
            sqlx::query(
                "INSERT INTO domain_attempts (org_id, domain, attempts, last_at) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (org_id, domain) DO UPDATE SET attempts = excluded.attempts, \
                 last_at = excluded.last_at",
            )
            .bind(org_id.as_str())
            .bind(domain.as_str())
            .bind(stored.as_str())
            .bind(now.0)
            .execute(&mut *tx)
            .await?;
            crate::sql::commit(tx).await?;
            Ok(Attempt::Allowed)
        }))
    }

    fn hold_domain<'a>(
        &'a self,
        rules: &'a dyn DomainRules,
        org_id: &'a OrgId,
        domain: &'a IssuerDomain,
        grant: Grant,
        claimed_at: Millis,
        now: Millis,
    ) -> StoreFuture<'a, Result<Held, HoldRefused>> {
        Box::pin(self.outage.ride_out(move || async move {
            let mut tx = self.exclusive().await?;
            let names = holding::name_and_parents(domain.as_str());
            let related = holdings_in(&mut tx, rules, &names, Some(domain.as_str())).await?;
            let plan = match rules.plan_hold(org_id.as_str(), domain.as_str(), grant, &related) {
                Ok(p) => p,
                Err(refused) => return Ok(Err(refused)),
            };
            let mut events: Vec<DomainEvent> = plan
                .ends
                .iter()
                .map(|end| {
                    let reason = if org_id == end.org_id.as_str() {
                        REPLACED_REASON
                    } else {
                        holding::TAKEN_REASON
                    };
                    DomainEvent::release(&end.domain, &end.org_id, now, reason)
                })
                .collect();
            let hold = DomainEvent::hold(domain.as_str(), org_id.as_str(), grant.method(), now, claimed_at);
            let mut holding = hold.holding().expect("a hold");
            events.push(hold);
            holding.seq = append(&mut tx, rules, events).await?;
            sqlx::query("DELETE FROM domain_claims WHERE org_id = $1 AND domain = $2")
                .bind(org_id.as_str())
                .bind(domain.as_str())
                .execute(&mut *tx)
                .await?;
            let (name, below) = plan.revokes;
            let m = NameMove {
                seq: holding.seq,
                org_id: org_id.as_str().to_owned(),
                domain: name,
                below,
                at: now,
            };
            // Only when some agent is owed a revocation (one look, bounded by LIMIT 1).
            let owed = !owed_revocations(&mut tx, &m, 1, false).await?.is_empty();
            if owed {
                sqlx::query(
                    "INSERT INTO name_moves (seq, org_id, domain, below, at) VALUES ($1, $2, $3, $4, $5)",
                )
                .bind(m.seq)
                .bind(m.org_id.as_str())
                .bind(m.domain.as_str())
                .bind(m.below)
                .bind(m.at.0)
                .execute(&mut *tx)
                .await?;
            }
            crate::sql::commit(tx).await?;
            Ok(Ok(Held {
                holding,
                ended: plan.ends,
                moving: owed.then_some(m),
                revoked: Vec::new(),
            }))
        }))
    }

    fn name_moves(&self) -> StoreFuture<'_, Vec<NameMove>> {
        Box::pin(async move {
            let rows: Vec<(i64, String, String, bool, i64)> =
                sqlx::query_as("SELECT seq, org_id, domain, below, at FROM name_moves ORDER BY seq")
                    .fetch_all(&mut *self.conn().await?)
                    .await?;
            Ok(rows
                .into_iter()
                .map(|(seq, org_id, domain, below, at)| NameMove {
                    seq,
                    org_id,
                    domain,
                    below,
                    at: Millis(at),
                })
                .collect())
        })
    }

    fn revoke_moved<'a>(&'a self, m: &'a NameMove, max: u32) -> StoreFuture<'a, Moved> {
        // As `revoke_agent`: a batch whose COMMIT broke runs again, and revokes only what the
        // first run did not.
        let run = move || {
            self.outage.ride_out(move || async move {
                let mut tx = self.writing().await?;
                let ids = owed_revocations(&mut tx, m, max, true).await?;
                let revoked = revoke_in(&mut tx, &ids, m.at, Some(holding::TAKEN_REASON)).await?;
                // Fewer than asked: done, unless another transaction holds some (they read
                // as not revoked here until it commits).
                let done =
                    ids.len() < max as usize && owed_revocations(&mut tx, m, 1, false).await?.is_empty();
                if done {
                    sqlx::query("DELETE FROM name_moves WHERE seq = $1")
                        .bind(m.seq)
                        .execute(&mut *tx)
                        .await?;
                }
                self.outage.commit(tx).await?;
                Ok(Moved { revoked, done })
            })
        };
        Box::pin(async move {
            match run().await {
                Err(StoreError::OutcomeUnknown(_)) => run().await,
                other => other,
            }
        })
    }

    fn issuer_domains_in_use<'a>(
        &'a self,
        org_id: Option<&'a OrgId>,
    ) -> StoreFuture<'a, Vec<(String, String)>> {
        Box::pin(async move {
            let rows: Vec<(String, String)> =
                match org_id {
                    Some(org) => {
                        sqlx::query_as(
                            "SELECT DISTINCT issuer_domain, org_id FROM agents WHERE org_id = $1 \
                         ORDER BY issuer_domain, org_id",
                        )
                        .bind(org.as_str())
                        .fetch_all(&mut *self.conn().await?)
                        .await?
                    }
                    None => sqlx::query_as(
                        "SELECT DISTINCT issuer_domain, org_id FROM agents ORDER BY issuer_domain, org_id",
                    )
                    .fetch_all(&mut *self.conn().await?)
                    .await?,
                };
            Ok(rows)
        })
    }

    fn release_domain<'a>(
        &'a self,
        rules: &'a dyn DomainRules,
        org_id: &'a OrgId,
        domain: &'a IssuerDomain,
        now: Millis,
    ) -> StoreFuture<'a, bool> {
        Box::pin(self.outage.ride_out(move || async move {
            let mut tx = self.exclusive().await?;
            let held = holdings_in(&mut tx, rules, &[domain.as_str().to_owned()], None)
                .await?
                .into_iter()
                .any(|h| org_id == h.org_id.as_str());
            if held {
                let event = DomainEvent::release(domain.as_str(), org_id.as_str(), now, RELEASED_REASON);
                append(&mut tx, rules, vec![event]).await?;
            }
            let dropped = sqlx::query("DELETE FROM domain_claims WHERE org_id = $1 AND domain = $2")
                .bind(org_id.as_str())
                .bind(domain.as_str())
                .execute(&mut *tx)
                .await?;
            crate::sql::commit(tx).await?;
            Ok(held || DB::rows_affected(&dropped) > 0)
        }))
    }
}
