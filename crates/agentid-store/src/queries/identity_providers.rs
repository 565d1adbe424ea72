//! The SQL of `crate::identity_providers` for one backend.

use crate::identity_providers::{IdentityProviderRow, IdentityProviderStore, IdpAdded, Standing};
use crate::sql::{Backend, SqlStore};
use crate::ssf::NewEvent;
use crate::{IdentityProviderRecord, StoreError, StoreFuture};
use agentid_core::domain::{AgentId, IdpId, KeyMode, Millis, OrgId};

use super::DB;

impl IdentityProviderStore for SqlStore<DB> {
    fn add_identity_provider<'a>(
        &'a self,
        idp: &'a IdentityProviderRecord,
        max: i64,
    ) -> StoreFuture<'a, IdpAdded> {
        Box::pin(async move {
            let mut tx = self.exclusive().await?;
            let issuers: Vec<(String,)> =
                sqlx::query_as("SELECT issuer FROM identity_providers WHERE org_id = $1")
                    .bind(idp.org_id.as_str())
                    .fetch_all(&mut *tx)
                    .await?;
            if issuers.iter().any(|(i,)| *i == idp.issuer) {
                return Ok(IdpAdded::Exists);
            }
            if issuers.len() as i64 >= max {
                return Ok(IdpAdded::Full);
            }
            sqlx::query(&format!(
                "INSERT INTO identity_providers ({}) VALUES ($1, $2, $3, $4, $5, $6, $7)",
                IdentityProviderRow::COLUMNS
            ))
            .bind(idp.id.as_str())
            .bind(idp.org_id.as_str())
            .bind(idp.issuer.as_str())
            .bind(idp.jwks.as_deref())
            .bind(idp.jwks_uri.as_deref())
            .bind(idp.created_at.0)
            .bind(idp.mac.map(|m| m.to_vec()))
            .execute(&mut *tx)
            .await?;
            crate::sql::commit(tx).await?;
            Ok(IdpAdded::Added)
        })
    }

    fn identity_providers<'a>(&'a self, org_id: &'a OrgId) -> StoreFuture<'a, Vec<IdentityProviderRecord>> {
        Box::pin(async move {
            let rows: Vec<IdentityProviderRow> = sqlx::query_as(&format!(
                "SELECT {} FROM identity_providers WHERE org_id = $1 ORDER BY created_at, id",
                IdentityProviderRow::COLUMNS
            ))
            .bind(org_id.as_str())
            .fetch_all(&mut *self.conn().await?)
            .await?;
            rows.into_iter().map(IdentityProviderRow::into_record).collect()
        })
    }

    fn remove_identity_provider<'a>(&'a self, org_id: &'a OrgId, id: &'a IdpId) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            // With its note of the removal, in one transaction: the row can never be put
            // back (migration 0028).
            let mut tx = self.begin().await?;
            let done = sqlx::query("DELETE FROM identity_providers WHERE org_id = $1 AND id = $2")
                .bind(org_id.as_str())
                .bind(id.as_str())
                .execute(&mut *tx)
                .await?;
            if DB::rows_affected(&done) != 1 {
                return Ok(false);
            }
            sqlx::query(
                "INSERT INTO identity_provider_removals (id, org_id, removed_at) VALUES ($1, $2, $3)",
            )
            .bind(id.as_str())
            .bind(org_id.as_str())
            .bind(Millis::now().0)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok(true)
        })
    }

    fn revoke_subject<'a>(
        &'a self,
        org_id: &'a OrgId,
        iss: &'a str,
        sub: &'a str,
        at: Millis,
    ) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            // It reads before it writes: on SQLite a deferred transaction could not take the
            // write lock once another writer committed meanwhile.
            let mut tx = self.writing().await?;
            // The time only moves forward (the table's triggers refuse the rest): revoked
            // again, it is the later of the two.
            let held = subject_revoked_at(&mut tx, org_id, iss, sub).await?;
            let at = held.map_or(at, |t| Millis(t.0.max(at.0)));
            sqlx::query(
                "INSERT INTO subject_revocations (org_id, iss, sub, revoked_at) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (org_id, iss, sub) DO UPDATE SET revoked_at = excluded.revoked_at \
                 WHERE excluded.revoked_at > subject_revocations.revoked_at",
            )
            .bind(org_id.as_str())
            .bind(iss)
            .bind(sub)
            .bind(at.0)
            .execute(&mut *tx)
            .await?;
            let streams: Vec<(String,)> = sqlx::query_as(
                "SELECT id FROM ssf_streams WHERE org_id = $1 AND mode = $2 AND revocations \
                 AND NOT narrowed AND status IN ('enabled', 'paused') ORDER BY id",
            )
            .bind(org_id.as_str())
            .bind(KeyMode::Live.as_str())
            .fetch_all(&mut *tx)
            .await?;
            let event = NewEvent {
                kind: "subject-revoked",
                agent_id: Some(sub),
                issuer: Some(iss),
                reason: None,
                state: None,
                at,
            };
            for (stream,) in streams {
                super::ssf::enqueue(&mut tx, &stream, &event).await?;
            }
            crate::sql::commit(tx).await
        })
    }

    fn delegation_standing<'a>(
        &'a self,
        org_id: &'a OrgId,
        iss: &'a str,
        sub: &'a str,
        chain: &'a [AgentId],
    ) -> StoreFuture<'a, Standing> {
        Box::pin(async move {
            let mut conn = self.conn().await?;
            let provider: Option<IdentityProviderRow> = sqlx::query_as(&format!(
                "SELECT {} FROM identity_providers WHERE org_id = $1 AND issuer = $2",
                IdentityProviderRow::COLUMNS
            ))
            .bind(org_id.as_str())
            .bind(iss)
            .fetch_optional(&mut *conn)
            .await?;
            let provider = provider.map(IdentityProviderRow::into_record).transpose()?;
            let revoked_at = subject_revoked_at(&mut conn, org_id, iss, sub).await?;
            let mut revoked = Vec::new();
            for id in chain {
                let (gone,): (bool,) = sqlx::query_as(
                    "SELECT EXISTS (SELECT 1 FROM agents WHERE id = $1 AND revoked_at IS NOT NULL)",
                )
                .bind(id.as_str())
                .fetch_one(&mut *conn)
                .await?;
                if gone {
                    revoked.push(id.clone());
                }
            }
            Ok(Standing {
                provider,
                subject_revoked_at: revoked_at,
                revoked,
            })
        })
    }
}

/// When the organization last revoked the person, read on `conn`.
async fn subject_revoked_at(
    conn: &mut <DB as sqlx::Database>::Connection,
    org_id: &OrgId,
    iss: &str,
    sub: &str,
) -> Result<Option<Millis>, StoreError> {
    let at: Option<(i64,)> = sqlx::query_as(
        "SELECT revoked_at FROM subject_revocations WHERE org_id = $1 AND iss = $2 AND sub = $3",
    )
    .bind(org_id.as_str())
    .bind(iss)
    .bind(sub)
    .fetch_optional(conn)
    .await?;
    Ok(at.map(|(t,)| Millis(t)))
}
