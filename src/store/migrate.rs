//! Migrations embedded in the binary, one folder per backend under `migrations/`.

use std::borrow::Cow;

use futures_util::future::BoxFuture;
use sqlx::error::BoxDynError;
use sqlx::migrate::{Migration, MigrationSource, MigrationType, Migrator};

/// `(version, description, sql)` of each migration, in order.
type Embedded = &'static [(i64, &'static str, &'static str)];

pub const SQLITE: Embedded = &[
    (1, "init", include_str!("../../migrations/sqlite/0001_init.sql")),
    (
        2,
        "counts per result",
        include_str!("../../migrations/sqlite/0002_counts_per_result.sql"),
    ),
    (
        3,
        "audit blocks",
        include_str!("../../migrations/sqlite/0003_audit_blocks.sql"),
    ),
    (
        4,
        "revocation epoch",
        include_str!("../../migrations/sqlite/0004_revocation_epoch.sql"),
    ),
    (
        5,
        "block encoding 2",
        include_str!("../../migrations/sqlite/0005_block_encoding_2.sql"),
    ),
    (
        6,
        "signing keys",
        include_str!("../../migrations/sqlite/0006_signing_keys.sql"),
    ),
    (
        7,
        "rate buckets",
        include_str!("../../migrations/sqlite/0007_rate_buckets.sql"),
    ),
];
pub const POSTGRES: Embedded = &[
    (1, "init", include_str!("../../migrations/postgres/0001_init.sql")),
    (
        2,
        "counts per result",
        include_str!("../../migrations/postgres/0002_counts_per_result.sql"),
    ),
    (
        3,
        "audit blocks",
        include_str!("../../migrations/postgres/0003_audit_blocks.sql"),
    ),
    (
        4,
        "revocation epoch",
        include_str!("../../migrations/postgres/0004_revocation_epoch.sql"),
    ),
    (
        5,
        "block encoding 2",
        include_str!("../../migrations/postgres/0005_block_encoding_2.sql"),
    ),
    (
        6,
        "signing keys",
        include_str!("../../migrations/postgres/0006_signing_keys.sql"),
    ),
    (
        7,
        "rate buckets",
        include_str!("../../migrations/postgres/0007_rate_buckets.sql"),
    ),
];

#[derive(Debug)]
struct Source(Embedded);

impl<'s> MigrationSource<'s> for Source {
    fn resolve(self) -> BoxFuture<'s, Result<Vec<Migration>, BoxDynError>> {
        Box::pin(async move {
            Ok(self
                .0
                .iter()
                .map(|(version, desc, sql)| {
                    Migration::new(
                        *version,
                        Cow::Borrowed(*desc),
                        MigrationType::Simple,
                        Cow::Borrowed(*sql),
                        false,
                    )
                })
                .collect())
        })
    }
}

pub async fn migrator(set: Embedded) -> Result<Migrator, sqlx::migrate::MigrateError> {
    Migrator::new(Source(set)).await
}
