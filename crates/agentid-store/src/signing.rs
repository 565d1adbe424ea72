//! The fleet's signing keys as recorded (`keys` decides which of them count).

use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Type};

use super::sql::{Backend, SqlStore};
use super::{SigningKeyRecord, StoreError, StoreFuture};
use agentid_core::domain::Millis;

/// The fleet's signing keys.
pub trait SigningKeyStore {
    /// The signing keys the fleet has recorded (one until keys rotate), oldest first.
    fn signing_keys(&self) -> StoreFuture<'_, Vec<SigningKeyRecord>>;
    /// Records `key` as the fleet's signing key unless one is recorded already (an exclusive
    /// transaction, so instances starting at once agree). Returns what is recorded after.
    fn record_first_signing_key<'a>(
        &'a self,
        key: &'a SigningKeyRecord,
    ) -> StoreFuture<'a, Vec<SigningKeyRecord>>;
    /// Records one more signing key (a rotation).
    fn add_signing_key<'a>(&'a self, key: &'a SigningKeyRecord) -> StoreFuture<'a, ()>;
    /// Retires a key by hand; false when no such key is recorded or it was retired already.
    fn retire_signing_key<'a>(&'a self, kid: &'a str, at: Millis) -> StoreFuture<'a, bool>;
    /// Notes that `kid` signed a token expiring at `expires_at` (kept when later).
    fn note_token_expiry<'a>(&'a self, kid: &'a str, expires_at: Millis) -> StoreFuture<'a, ()>;
}

row! {
    pub(crate) struct SigningKeyRow {
        kid: String,
        public_key: Vec<u8>,
        created_at: i64,
        private_key: Option<Vec<u8>>,
        activates_at: Option<i64>,
        retired_at: Option<i64>,
        last_expires_at: Option<i64>,
    }
}

impl SigningKeyRow {
    fn into_record(self) -> Result<SigningKeyRecord, StoreError> {
        let public_key = self
            .public_key
            .try_into()
            .map_err(|_| StoreError::Corrupt(format!("public key of signing key {}", self.kid)))?;
        Ok(SigningKeyRecord {
            kid: self.kid,
            public_key,
            created_at: Millis(self.created_at),
            sealed: self.private_key,
            activates_at: self.activates_at.map(Millis),
            retired_at: self.retired_at.map(Millis),
            last_expires_at: self.last_expires_at.map(Millis),
        })
    }
}

const SIGNING_KEYS_SQL: &str = "SELECT kid, public_key, created_at, private_key, activates_at, retired_at, \
     last_expires_at FROM signing_keys ORDER BY created_at, kid";

const INSERT_SIGNING_KEY_SQL: &str = "INSERT INTO signing_keys \
     (kid, public_key, created_at, private_key, activates_at, retired_at, last_expires_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7)";

fn insert_signing_key<'q, DB: Database>(
    key: &'q SigningKeyRecord,
) -> sqlx::query::Query<'q, DB, DB::Arguments<'q>>
where
    &'q [u8]: Encode<'q, DB> + Type<DB>,
    &'q str: Encode<'q, DB> + Type<DB>,
    Option<&'q [u8]>: Encode<'q, DB> + Type<DB>,
    i64: Encode<'q, DB> + Type<DB>,
    Option<i64>: Encode<'q, DB> + Type<DB>,
{
    sqlx::query(INSERT_SIGNING_KEY_SQL)
        .bind(key.kid.as_str())
        .bind(&key.public_key[..])
        .bind(key.created_at.0)
        .bind(key.sealed.as_deref())
        .bind(key.activates_at.map(|m| m.0))
        .bind(key.retired_at.map(|m| m.0))
        .bind(key.last_expires_at.map(|m| m.0))
}

impl<DB: Backend> SigningKeyStore for SqlStore<DB>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> &'q [u8]: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> Option<i64>: Encode<'q, DB> + Type<DB>,
    for<'q> Option<&'q [u8]>: Encode<'q, DB> + Type<DB>,
    for<'r> String: Decode<'r, DB> + Type<DB>,
    for<'r> Vec<u8>: Decode<'r, DB> + Type<DB>,
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    for<'r> Option<i64>: Decode<'r, DB> + Type<DB>,
    for<'r> Option<Vec<u8>>: Decode<'r, DB> + Type<DB>,
    for<'r> &'r str: ColumnIndex<DB::Row>,
{
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
            insert_signing_key::<DB>(key).execute(&mut *tx).await?;
            crate::sql::commit(tx).await?;
            Ok(vec![key.clone()])
        }))
    }

    fn add_signing_key<'a>(&'a self, key: &'a SigningKeyRecord) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            insert_signing_key::<DB>(key)
                .execute(&mut *self.conn().await?)
                .await?;
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
