//! The SQL of `crate::signing` for one backend: `DB` is its database.

use crate::sql::{Backend, SqlStore};
use crate::{SigningKeyRecord, StoreFuture};
use agentid_core::domain::Millis;

use crate::signing::{SigningKeyRow, SigningKeyStore, INSERT_SIGNING_KEY_SQL, SIGNING_KEYS_SQL};

use super::DB;

fn insert_signing_key<'q>(
    key: &'q SigningKeyRecord,
) -> sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments<'q>> {
    sqlx::query(INSERT_SIGNING_KEY_SQL)
        .bind(key.kid.as_str())
        .bind(&key.public_key[..])
        .bind(key.created_at.0)
        .bind(key.sealed.as_deref())
        .bind(key.activates_at.map(|m| m.0))
        .bind(key.retired_at.map(|m| m.0))
        .bind(key.last_expires_at.map(|m| m.0))
}

impl SigningKeyStore for SqlStore<DB> {
    fn signing_keys(&self) -> StoreFuture<'_, Vec<SigningKeyRecord>> {
        Box::pin(async move {
            let rows: Vec<SigningKeyRow> = sqlx::query_as(SIGNING_KEYS_SQL)
                .fetch_all(&mut *self.conn().await?)
                .await?;
            rows.into_iter().map(SigningKeyRow::into_record).collect()
        })
    }

    fn record_first_signing_key<'a>(
        &'a self,
        key: &'a SigningKeyRecord,
    ) -> StoreFuture<'a, Vec<SigningKeyRecord>> {
        Box::pin(self.outage.ride_out(move || async move {
            let mut tx = self.exclusive().await?;
            let recorded: Vec<SigningKeyRow> = sqlx::query_as(SIGNING_KEYS_SQL).fetch_all(&mut *tx).await?;
            if !recorded.is_empty() {
                return recorded.into_iter().map(SigningKeyRow::into_record).collect();
            }
            insert_signing_key(key).execute(&mut *tx).await?;
            crate::sql::commit(tx).await?;
            Ok(vec![key.clone()])
        }))
    }

    fn add_signing_key<'a>(&'a self, key: &'a SigningKeyRecord) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            insert_signing_key(key).execute(&mut *self.conn().await?).await?;
            Ok(())
        })
    }

    fn retire_signing_key<'a>(&'a self, kid: &'a str, at: Millis) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let done =
                sqlx::query("UPDATE signing_keys SET retired_at = $2 WHERE kid = $1 AND retired_at IS NULL")
                    .bind(kid)
                    .bind(at.0)
                    .execute(&mut *self.conn().await?)
                    .await?;
            Ok(DB::rows_affected(&done) == 1)
        })
    }

    fn note_token_expiry<'a>(&'a self, kid: &'a str, expires_at: Millis) -> StoreFuture<'a, ()> {
        // Only ever raised, so written again after an outage whatever became of the first
        // try: it rides the outage out.
        Box::pin(self.outage.ride_out(move || async move {
            sqlx::query(
                "UPDATE signing_keys SET last_expires_at = $2 \
                 WHERE kid = $1 AND (last_expires_at IS NULL OR last_expires_at < $2)",
            )
            .bind(kid)
            .bind(expires_at.0)
            .execute(&self.pool)
            .await?;
            Ok(())
        }))
    }
}
