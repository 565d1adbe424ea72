//! The SQL of `crate::orgs` for one backend: `DB` is its database.

use crate::sql::{decode, parse_mode, Backend, SqlStore};
use crate::{KeyRecord, NewApiKey, OrgRecord, StoreError, StoreFuture};
use agentid_core::domain::{AgentId, OrgId};
use agentid_core::domain::{ApiKeyKind, Millis};

use crate::orgs::{
    KeyListing, KeyRow, ListedKeyRow, OrgRow, OrgStore, Seals, Unsealed, UnsealedAgentKeyRow, UnsealedKeyRow,
    UnsealedSecretRow, ORG_COLUMNS,
};

use super::DB;

/// Inserts an organization and its keys inside the caller's transaction.
async fn insert_org(
    tx: &mut sqlx::Transaction<'_, DB>,
    org: &OrgRecord,
    keys: &[NewApiKey],
) -> Result<(), StoreError> {
    let sql = format!("INSERT INTO orgs ({ORG_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)");
    sqlx::query(&sql)
        .bind(org.id.as_str())
        .bind(org.name.as_str())
        .bind(org.plan.as_str())
        .bind(i64::from(org.stored_limits.verify_per_minute))
        .bind(i64::from(org.stored_limits.other_per_minute))
        .bind(org.stored_limits.max_expiry_seconds as i64)
        .bind(org.created_at.0)
        .bind(org.mac.map(Vec::from).unwrap_or_default())
        .bind(org.sealed_at.0)
        .execute(&mut **tx)
        .await?;
    for key in keys {
        insert_key(key).execute(&mut **tx).await?;
    }
    Ok(())
}

/// The `INSERT` of one API key (used alone and inside `create_org`'s transaction).
fn insert_key<'q>(key: &'q NewApiKey) -> sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments<'q>> {
    sqlx::query(
        "INSERT INTO api_keys (key_hash, org_id, kind, mode, hint, created_at, disabled_at, id, name, mac) \
         VALUES ($1, $2, $3, $4, $5, $6, NULL, $7, $8, $9)",
    )
    .bind(&key.key_hash[..])
    .bind(key.org_id.as_str())
    .bind(key.kind.as_str())
    .bind(key.mode.as_str())
    .bind(key.hint.as_str())
    .bind(key.created_at.0)
    .bind(key.id.as_str())
    .bind(key.name.as_deref())
    .bind(&key.mac[..])
}

impl OrgStore for SqlStore<DB> {
    fn count_orgs(&self) -> StoreFuture<'_, i64> {
        Box::pin(async move {
            let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM orgs")
                .fetch_one(&mut *self.conn().await?)
                .await?;
            Ok(n)
        })
    }

    fn create_first_org<'a>(&'a self, org: &'a OrgRecord, keys: &'a [NewApiKey]) -> StoreFuture<'a, bool> {
        Box::pin(self.outage.ride_out(move || async move {
            let mut tx = self.exclusive().await?;
            let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM orgs")
                .fetch_one(&mut *tx)
                .await?;
            if n > 0 {
                return Ok(false);
            }
            insert_org(&mut tx, org, keys).await?;
            crate::sql::commit(tx).await?;
            Ok(true)
        }))
    }

    fn create_org<'a>(&'a self, org: &'a OrgRecord, keys: &'a [NewApiKey]) -> StoreFuture<'a, ()> {
        Box::pin(self.outage.ride_out(move || async move {
            let mut tx = self.begin().await?;
            insert_org(&mut tx, org, keys).await?;
            crate::sql::commit(tx).await?;
            Ok(())
        }))
    }

    fn update_org<'a>(&'a self, org: &'a OrgRecord) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let done = sqlx::query(
                "UPDATE orgs SET plan = $2, verify_limit = $3, other_limit = $4, \
                 max_expiry_seconds = $5, mac = $6, sealed_at = $7 WHERE id = $1",
            )
            .bind(org.id.as_str())
            .bind(org.plan.as_str())
            .bind(i64::from(org.stored_limits.verify_per_minute))
            .bind(i64::from(org.stored_limits.other_per_minute))
            .bind(org.stored_limits.max_expiry_seconds as i64)
            .bind(org.mac.map(Vec::from).unwrap_or_default())
            .bind(org.sealed_at.0)
            .execute(&mut *self.conn().await?)
            .await?;
            Ok(DB::rows_affected(&done) == 1)
        })
    }

    fn get_org<'a>(&'a self, id: &'a OrgId) -> StoreFuture<'a, Option<OrgRecord>> {
        Box::pin(async move {
            let sql = format!("SELECT {ORG_COLUMNS} FROM orgs WHERE id = $1");
            let row: Option<OrgRow> = sqlx::query_as(&sql)
                .bind(id.as_str())
                .fetch_optional(&mut *self.conn().await?)
                .await?;
            row.map(OrgRow::into_record).transpose()
        })
    }

    fn insert_key<'a>(&'a self, key: &'a NewApiKey) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            insert_key(key).execute(&mut *self.conn().await?).await?;
            Ok(())
        })
    }

    fn find_key<'a>(&'a self, key_hash: &'a [u8; 32]) -> StoreFuture<'a, Option<KeyRecord>> {
        Box::pin(async move {
            let row: Option<KeyRow> = sqlx::query_as(&format!(
                "SELECT {} FROM api_keys WHERE key_hash = $1",
                KeyRow::COLUMNS
            ))
            .bind(&key_hash[..])
            .fetch_optional(&mut *self.conn().await?)
            .await?;
            let Some(row) = row else { return Ok(None) };
            let org = self
                .get_org(&decode("organization", &row.org_id, OrgId::parse)?)
                .await?
                .ok_or_else(|| StoreError::Corrupt(format!("key of missing organization {}", row.org_id)))?;
            Ok(Some(KeyRecord {
                org,
                kind: ApiKeyKind::parse(&row.kind)
                    .ok_or_else(|| StoreError::Corrupt(format!("key kind {}", row.kind)))?,
                mode: parse_mode(&row.mode)?,
                disabled: row.disabled_at.is_some(),
                last_used_at: row.last_used_at.map(Millis),
                mac: row.mac.as_slice().try_into().ok(),
            }))
        })
    }

    fn list_orgs(&self) -> StoreFuture<'_, Vec<OrgRecord>> {
        Box::pin(async move {
            let sql = format!("SELECT {ORG_COLUMNS} FROM orgs ORDER BY created_at, id");
            let rows: Vec<OrgRow> = sqlx::query_as(&sql).fetch_all(&mut *self.conn().await?).await?;
            rows.into_iter().map(OrgRow::into_record).collect()
        })
    }

    fn list_keys<'a>(&'a self, org_id: &'a OrgId) -> StoreFuture<'a, Vec<KeyListing>> {
        Box::pin(async move {
            let rows: Vec<ListedKeyRow> = sqlx::query_as(&format!(
                "SELECT {} FROM api_keys WHERE org_id = $1 ORDER BY created_at, hint",
                ListedKeyRow::COLUMNS
            ))
            .bind(org_id.as_str())
            .fetch_all(&mut *self.conn().await?)
            .await?;
            rows.into_iter()
                .map(|r| {
                    Ok(KeyListing {
                        kind: ApiKeyKind::parse(&r.kind)
                            .ok_or_else(|| StoreError::Corrupt(format!("key kind {}", r.kind)))?
                            .as_str(),
                        mode: parse_mode(&r.mode)?.as_str(),
                        id: r.id,
                        name: r.name,
                        key: r.hint,
                        created_at: Millis(r.created_at),
                        last_used_at: r.last_used_at.map(Millis),
                        disabled: r.disabled_at.is_some(),
                    })
                })
                .collect()
        })
    }

    fn disable_key<'a>(&'a self, key_hash: &'a [u8; 32], at: Millis) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let done = sqlx::query(
                "UPDATE api_keys SET disabled_at = COALESCE(disabled_at, $2) WHERE key_hash = $1",
            )
            .bind(&key_hash[..])
            .bind(at.0)
            .execute(&mut *self.conn().await?)
            .await?;
            Ok(DB::rows_affected(&done) == 1)
        })
    }

    fn disable_key_id<'a>(&'a self, id: &'a str, at: Millis) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let done =
                sqlx::query("UPDATE api_keys SET disabled_at = COALESCE(disabled_at, $2) WHERE id = $1")
                    .bind(id)
                    .bind(at.0)
                    .execute(&mut *self.conn().await?)
                    .await?;
            Ok(DB::rows_affected(&done) == 1)
        })
    }

    fn note_key_used<'a>(&'a self, key_hash: &'a [u8; 32], at: Millis, every: Millis) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            sqlx::query(
                "UPDATE api_keys SET last_used_at = $2 WHERE key_hash = $1 \
                 AND (last_used_at IS NULL OR last_used_at <= $3)",
            )
            .bind(&key_hash[..])
            .bind(at.0)
            .bind(at.0 - every.0)
            .execute(&mut *self.conn().await?)
            .await?;
            Ok(())
        })
    }

    fn unsealed(&self, limit: u32) -> StoreFuture<'_, Unsealed> {
        Box::pin(async move {
            let mut conn = self.conn().await?;
            let limit = i64::from(limit);
            let mut found = Unsealed::default();
            // Marked by the migration that brought seals (a MAC of one byte): rows a database
            // access alone cannot mark, since every row written since carries 32 bytes. A row
            // that does not decode is left unsealed: it stays refused where it is read.
            let sql = format!("SELECT {ORG_COLUMNS} FROM orgs WHERE length(mac) = 1 ORDER BY id LIMIT $1");
            let rows: Vec<OrgRow> = sqlx::query_as(&sql).bind(limit).fetch_all(&mut *conn).await?;
            found.orgs = rows.into_iter().filter_map(|r| r.into_record().ok()).collect();
            let sql = format!(
                "SELECT {} FROM api_keys WHERE length(mac) = 1 ORDER BY key_hash LIMIT $1",
                UnsealedKeyRow::COLUMNS
            );
            let rows: Vec<UnsealedKeyRow> = sqlx::query_as(&sql).bind(limit).fetch_all(&mut *conn).await?;
            found.keys = rows
                .into_iter()
                .filter_map(|k| {
                    Some((
                        k.key_hash.as_slice().try_into().ok()?,
                        OrgId::parse(&k.org_id)?,
                        ApiKeyKind::parse(&k.kind)?,
                        parse_mode(&k.mode).ok()?,
                    ))
                })
                .collect();
            let sql = format!(
                "SELECT {} FROM agents WHERE length(key_mac) = 1 ORDER BY id LIMIT $1",
                UnsealedAgentKeyRow::COLUMNS
            );
            let rows: Vec<UnsealedAgentKeyRow> =
                sqlx::query_as(&sql).bind(limit).fetch_all(&mut *conn).await?;
            found.agent_keys = rows
                .into_iter()
                .filter_map(|a| Some((AgentId::parse(&a.id)?, a.jkt, a.jwk)))
                .collect();
            let sql = format!(
                "SELECT {} FROM client_secrets WHERE length(mac) = 1 ORDER BY agent_id, secret_hash LIMIT $1",
                UnsealedSecretRow::COLUMNS
            );
            let rows: Vec<UnsealedSecretRow> = sqlx::query_as(&sql).bind(limit).fetch_all(&mut *conn).await?;
            found.client_secrets = rows
                .into_iter()
                .filter_map(|c| {
                    Some((
                        AgentId::parse(&c.agent_id)?,
                        c.secret_hash.as_slice().try_into().ok()?,
                        Millis(c.created_at),
                    ))
                })
                .collect();
            Ok(found)
        })
    }

    fn seal<'a>(&'a self, seals: &'a Seals) -> StoreFuture<'a, u64> {
        Box::pin(self.outage.ride_out(move || async move {
            let mut tx = self.begin().await?;
            let mut sealed = 0;
            for (id, mac, at) in &seals.orgs {
                sqlx::query("UPDATE orgs SET mac = $2, sealed_at = $3 WHERE id = $1 AND length(mac) = 1")
                    .bind(id.as_str())
                    .bind(&mac[..])
                    .bind(at.0)
                    .execute(&mut *tx)
                    .await
                    .map(|d| sealed += DB::rows_affected(&d))?;
            }
            for (hash, mac) in &seals.keys {
                sqlx::query("UPDATE api_keys SET mac = $2 WHERE key_hash = $1 AND length(mac) = 1")
                    .bind(&hash[..])
                    .bind(&mac[..])
                    .execute(&mut *tx)
                    .await
                    .map(|d| sealed += DB::rows_affected(&d))?;
            }
            for (id, mac, at) in &seals.agent_keys {
                sqlx::query(
                    "UPDATE agents SET key_mac = $2, key_sealed_at = $3 WHERE id = $1 AND length(key_mac) = 1",
                )
                .bind(id.as_str())
                .bind(&mac[..])
                .bind(at.0)
                .execute(&mut *tx)
                .await
                .map(|d| sealed += DB::rows_affected(&d))?;
            }
            for (id, hash, mac) in &seals.client_secrets {
                sqlx::query(
                    "UPDATE client_secrets SET mac = $3 WHERE agent_id = $1 AND secret_hash = $2 \
                     AND length(mac) = 1",
                )
                .bind(id.as_str())
                .bind(&hash[..])
                .bind(&mac[..])
                .execute(&mut *tx)
                .await
                .map(|d| sealed += DB::rows_affected(&d))?;
            }
            crate::sql::commit(tx).await?;
            Ok(sealed)
        }))
    }
}
