//! The SQL of `crate::identity_providers` for one backend.

use crate::identity_providers::{IdentityProviderRow, IdentityProviderStore, IdpAdded};
use crate::sql::{Backend, SqlStore};
use crate::{IdentityProviderRecord, StoreFuture};
use agentid_core::domain::{IdpId, OrgId};

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
                "INSERT INTO identity_providers ({}) VALUES ($1, $2, $3, $4, $5, $6)",
                IdentityProviderRow::COLUMNS
            ))
            .bind(idp.id.as_str())
            .bind(idp.org_id.as_str())
            .bind(idp.issuer.as_str())
            .bind(idp.jwks.as_deref())
            .bind(idp.jwks_uri.as_deref())
            .bind(idp.created_at.0)
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
            let done = sqlx::query("DELETE FROM identity_providers WHERE org_id = $1 AND id = $2")
                .bind(org_id.as_str())
                .bind(id.as_str())
                .execute(&mut *self.conn().await?)
                .await?;
            Ok(DB::rows_affected(&done) == 1)
        })
    }
}
