//! The fleet's signing keys as recorded (`keys` decides which of them count).

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
        kid: String, public_key: Vec<u8>, created_at: i64, private_key: Option<Vec<u8>>,
        activates_at: Option<i64>, retired_at: Option<i64>, last_expires_at: Option<i64>,
    }
}

impl SigningKeyRow {
    pub(crate) fn into_record(self) -> Result<SigningKeyRecord, StoreError> {
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

pub(crate) const SIGNING_KEYS_SQL: &str =
    "SELECT kid, public_key, created_at, private_key, activates_at, retired_at, \
     last_expires_at FROM signing_keys ORDER BY created_at, kid";

pub(crate) const INSERT_SIGNING_KEY_SQL: &str = "INSERT INTO signing_keys \
     (kid, public_key, created_at, private_key, activates_at, retired_at, last_expires_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7)";
