//! The SQL of `crate::holdings` for one backend: `DB` is its database.

use crate::domains::DomainRules;
use crate::StoreError;
use agentid_core::domain::holding::{self, DomainEvent, Holding, NotCovered, ProofMethod};

use crate::holdings::{params, EventRow, EVENT_COLUMNS, MIGRATED_SEQ_SQL};

use super::DB;

/// The holdings in force (as `rules` count the stored events) of the names `names`, and
/// (with `below`) of every name below `below`, read inside the caller's transaction.
pub(crate) async fn holdings_in(
    tx: &mut sqlx::Transaction<'_, DB>,
    rules: &dyn DomainRules,
    names: &[String],
    below: Option<&str>,
) -> Result<Vec<Holding>, StoreError> {
    let (migrated,): (Option<i64>,) = sqlx::query_as(MIGRATED_SEQ_SQL).fetch_one(&mut **tx).await?;
    let mut sql = format!(
        "SELECT {EVENT_COLUMNS} FROM domain_events WHERE domain IN ({})",
        params(1, names.len())
    );
    if below.is_some() {
        // Names are letters, digits, hyphens and dots: nothing LIKE reads as a wildcard.
        sql.push_str(&format!(" OR domain LIKE '%.' || ${}", names.len() + 1));
    }
    sql.push_str(" ORDER BY seq");
    let mut q = sqlx::query_as::<DB, EventRow>(&sql);
    for n in names {
        q = q.bind(n.as_str());
    }
    if let Some(b) = below {
        q = q.bind(b);
    }
    let rows: Vec<_> = q
        .fetch_all(&mut **tx)
        .await?
        .into_iter()
        .map(EventRow::read)
        .collect();
    Ok(rules.holdings(&rows, migrated))
}

/// The holdings in force of organization `org`, read inside the caller's transaction.
pub(crate) async fn org_holdings_in(
    tx: &mut sqlx::Transaction<'_, DB>,
    rules: &dyn DomainRules,
    org: &str,
) -> Result<Vec<Holding>, StoreError> {
    let (migrated,): (Option<i64>,) = sqlx::query_as(MIGRATED_SEQ_SQL).fetch_one(&mut **tx).await?;
    // Every event of every name the organization ever held: a name's latest event says
    // whether it still does.
    let sql = format!(
        "SELECT {EVENT_COLUMNS} FROM domain_events WHERE domain IN \
         (SELECT domain FROM domain_events WHERE org_id = $1) ORDER BY seq"
    );
    let rows: Vec<_> = sqlx::query_as::<DB, EventRow>(&sql)
        .bind(org)
        .fetch_all(&mut **tx)
        .await?
        .into_iter()
        .map(EventRow::read)
        .collect();
    let mut held = rules.holdings(&rows, migrated);
    held.retain(|h| h.org_id.as_str() == org);
    Ok(held)
}

/// Seals `events` (`rules`) and appends them, numbered after the last event; the number of
/// the last one.
pub async fn append(
    tx: &mut sqlx::Transaction<'_, DB>,
    rules: &dyn DomainRules,
    events: Vec<DomainEvent>,
) -> Result<i64, StoreError> {
    let (last,): (Option<i64>,) = sqlx::query_as("SELECT MAX(seq) FROM domain_events")
        .fetch_one(&mut **tx)
        .await?;
    let mut seq = last.unwrap_or(0);
    for mut event in events {
        // A row at the largest number (written with database access alone) must not wrap the
        // numbering round: no name changes hands until the operator removes it.
        seq = seq.checked_add(1).ok_or_else(|| {
            StoreError::Corrupt(
                "issuer-domain events are numbered up to the largest number a row can hold".into(),
            )
        })?;
        event.seq = seq;
        let mac = rules.seal(&event);
        sqlx::query(&format!(
            "INSERT INTO domain_events ({EVENT_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
        ))
        .bind(event.seq)
        .bind(event.kind.as_str())
        .bind(event.domain.as_str())
        .bind(event.org_id.as_str())
        .bind(event.method.map(ProofMethod::as_str))
        .bind(event.at.0)
        .bind(event.claimed_at.0)
        .bind(event.reason.as_deref())
        .bind(&mac[..])
        .execute(&mut **tx)
        .await?;
    }
    Ok(seq)
}

/// Whether `org_id` may issue under `domain` (as `rules` decide), read inside the caller's
/// transaction.
pub(crate) async fn check_issuer(
    tx: &mut sqlx::Transaction<'_, DB>,
    rules: &dyn DomainRules,
    org_id: &str,
    domain: &str,
) -> Result<Result<(), NotCovered>, StoreError> {
    let held = holdings_in(tx, rules, &holding::name_and_parents(domain), None).await?;
    Ok(rules.may_issue(org_id, domain, &held))
}
