//! Migrations embedded in the binary, one folder per backend under `migrations/`.

use std::borrow::Cow;

use futures_util::future::BoxFuture;
use sqlx::error::BoxDynError;
use sqlx::migrate::{Migration, MigrationSource, MigrationType, Migrator};

/// `(version, description, sql)` of each migration, in order.
type Embedded = &'static [(i64, &'static str, &'static str)];

pub const SQLITE: Embedded = &[
    (
        1,
        "init",
        include_str!("../../../migrations/sqlite/0001_init.sql"),
    ),
    (
        2,
        "counts per result",
        include_str!("../../../migrations/sqlite/0002_counts_per_result.sql"),
    ),
    (
        3,
        "audit blocks",
        include_str!("../../../migrations/sqlite/0003_audit_blocks.sql"),
    ),
    (
        4,
        "revocation epoch",
        include_str!("../../../migrations/sqlite/0004_revocation_epoch.sql"),
    ),
    (
        5,
        "block encoding 2",
        include_str!("../../../migrations/sqlite/0005_block_encoding_2.sql"),
    ),
    (
        6,
        "signing keys",
        include_str!("../../../migrations/sqlite/0006_signing_keys.sql"),
    ),
    (
        7,
        "rate buckets",
        include_str!("../../../migrations/sqlite/0007_rate_buckets.sql"),
    ),
    (
        8,
        "transparency",
        include_str!("../../../migrations/sqlite/0008_transparency.sql"),
    ),
    (
        9,
        "key rotation",
        include_str!("../../../migrations/sqlite/0009_key_rotation.sql"),
    ),
    (
        10,
        "one-way facts",
        include_str!("../../../migrations/sqlite/0010_one_way_facts.sql"),
    ),
    (
        11,
        "status lists",
        include_str!("../../../migrations/sqlite/0011_status_lists.sql"),
    ),
    (12, "ssf", include_str!("../../../migrations/sqlite/0012_ssf.sql")),
    (
        13,
        "issuer domains",
        include_str!("../../../migrations/sqlite/0013_issuer_domains.sql"),
    ),
    (
        14,
        "ssf events in rust",
        include_str!("../../../migrations/sqlite/0014_ssf_events_in_rust.sql"),
    ),
    (
        15,
        "prerelease data",
        include_str!("../../../migrations/sqlite/0015_prerelease_data.sql"),
    ),
    (
        16,
        "ssf bounded outbox",
        include_str!("../../../migrations/sqlite/0016_ssf_bounded_outbox.sql"),
    ),
    (
        17,
        "token binding",
        include_str!("../../../migrations/sqlite/0017_token_binding.sql"),
    ),
    (
        18,
        "oauth clients",
        include_str!("../../../migrations/sqlite/0018_oauth_clients.sql"),
    ),
    (
        19,
        "name moves",
        include_str!("../../../migrations/sqlite/0019_name_moves.sql"),
    ),
    (
        20,
        "key names",
        include_str!("../../../migrations/sqlite/0020_key_names.sql"),
    ),
    (
        21,
        "client secrets",
        include_str!("../../../migrations/sqlite/0021_client_secrets.sql"),
    ),
    (
        22,
        "identity providers",
        include_str!("../../../migrations/sqlite/0022_identity_providers.sql"),
    ),
    (
        23,
        "subject revocations",
        include_str!("../../../migrations/sqlite/0023_subject_revocations.sql"),
    ),
    (
        24,
        "identity provider seals",
        include_str!("../../../migrations/sqlite/0024_identity_provider_seals.sql"),
    ),
    (
        25,
        "agents by issuer and key",
        include_str!("../../../migrations/sqlite/0025_agents_by_issuer_and_key.sql"),
    ),
    (
        26,
        "subject revocations are kept",
        include_str!("../../../migrations/sqlite/0026_subject_revocations_are_kept.sql"),
    ),
    (
        27,
        "name moves are kept",
        include_str!("../../../migrations/sqlite/0027_name_moves_are_kept.sql"),
    ),
    (
        28,
        "identity provider removals",
        include_str!("../../../migrations/sqlite/0028_identity_provider_removals.sql"),
    ),
    (
        29,
        "triggers hold against the service role",
        include_str!("../../../migrations/sqlite/0029_triggers_hold_against_the_service_role.sql"),
    ),
    (
        30,
        "domain events in order",
        include_str!("../../../migrations/sqlite/0030_domain_events_in_order.sql"),
    ),
    (
        31,
        "audit blocks are sealed",
        include_str!("../../../migrations/sqlite/0031_audit_blocks_are_sealed.sql"),
    ),
    (
        32,
        "signing keys are keys",
        include_str!("../../../migrations/sqlite/0032_signing_keys_are_keys.sql"),
    ),
    (
        33,
        "checkpoints within their ledger",
        include_str!("../../../migrations/sqlite/0033_checkpoints_within_their_ledger.sql"),
    ),
    (
        34,
        "streams stay narrowed",
        include_str!("../../../migrations/sqlite/0034_streams_stay_narrowed.sql"),
    ),
    (
        35,
        "signing key expiries only grow",
        include_str!("../../../migrations/sqlite/0035_signing_key_expiries_only_grow.sql"),
    ),
    (
        36,
        "moves owe only earlier agents",
        include_str!("../../../migrations/sqlite/0036_moves_owe_only_earlier_agents.sql"),
    ),
    (
        37,
        "domain attempts outlive claims",
        include_str!("../../../migrations/sqlite/0037_domain_attempts_outlive_claims.sql"),
    ),
    (
        38,
        "one current client secret",
        include_str!("../../../migrations/sqlite/0038_one_current_client_secret.sql"),
    ),
    (
        39,
        "retirements in order",
        include_str!("../../../migrations/sqlite/0039_retirements_in_order.sql"),
    ),
    (
        40,
        "committed rows short and last",
        include_str!("../../../migrations/sqlite/0040_committed_rows_short_and_last.sql"),
    ),
    (
        41,
        "log rows as written",
        include_str!("../../../migrations/sqlite/0041_log_rows_as_written.sql"),
    ),
    (
        42,
        "keys and plans sealed",
        include_str!("../../../migrations/sqlite/0042_keys_and_plans_sealed.sql"),
    ),
    (
        43,
        "agent credentials sealed",
        include_str!("../../../migrations/sqlite/0043_agent_credentials_sealed.sql"),
    ),
    (
        44,
        "every agent binding sealed",
        include_str!("../../../migrations/sqlite/0044_every_agent_binding_sealed.sql"),
    ),
];
pub const POSTGRES: Embedded = &[
    (
        1,
        "init",
        include_str!("../../../migrations/postgres/0001_init.sql"),
    ),
    (
        2,
        "counts per result",
        include_str!("../../../migrations/postgres/0002_counts_per_result.sql"),
    ),
    (
        3,
        "audit blocks",
        include_str!("../../../migrations/postgres/0003_audit_blocks.sql"),
    ),
    (
        4,
        "revocation epoch",
        include_str!("../../../migrations/postgres/0004_revocation_epoch.sql"),
    ),
    (
        5,
        "block encoding 2",
        include_str!("../../../migrations/postgres/0005_block_encoding_2.sql"),
    ),
    (
        6,
        "signing keys",
        include_str!("../../../migrations/postgres/0006_signing_keys.sql"),
    ),
    (
        7,
        "rate buckets",
        include_str!("../../../migrations/postgres/0007_rate_buckets.sql"),
    ),
    (
        8,
        "transparency",
        include_str!("../../../migrations/postgres/0008_transparency.sql"),
    ),
    (
        9,
        "key rotation",
        include_str!("../../../migrations/postgres/0009_key_rotation.sql"),
    ),
    (
        10,
        "one-way facts",
        include_str!("../../../migrations/postgres/0010_one_way_facts.sql"),
    ),
    (
        11,
        "status lists",
        include_str!("../../../migrations/postgres/0011_status_lists.sql"),
    ),
    (
        12,
        "ssf",
        include_str!("../../../migrations/postgres/0012_ssf.sql"),
    ),
    (
        13,
        "issuer domains",
        include_str!("../../../migrations/postgres/0013_issuer_domains.sql"),
    ),
    (
        14,
        "ssf events in rust",
        include_str!("../../../migrations/postgres/0014_ssf_events_in_rust.sql"),
    ),
    (
        15,
        "prerelease data",
        include_str!("../../../migrations/postgres/0015_prerelease_data.sql"),
    ),
    (
        16,
        "ssf bounded outbox",
        include_str!("../../../migrations/postgres/0016_ssf_bounded_outbox.sql"),
    ),
    (
        17,
        "token binding",
        include_str!("../../../migrations/postgres/0017_token_binding.sql"),
    ),
    (
        18,
        "oauth clients",
        include_str!("../../../migrations/postgres/0018_oauth_clients.sql"),
    ),
    (
        19,
        "name moves",
        include_str!("../../../migrations/postgres/0019_name_moves.sql"),
    ),
    (
        20,
        "key names",
        include_str!("../../../migrations/postgres/0020_key_names.sql"),
    ),
    (
        21,
        "client secrets",
        include_str!("../../../migrations/postgres/0021_client_secrets.sql"),
    ),
    (
        22,
        "identity providers",
        include_str!("../../../migrations/postgres/0022_identity_providers.sql"),
    ),
    (
        23,
        "subject revocations",
        include_str!("../../../migrations/postgres/0023_subject_revocations.sql"),
    ),
    (
        24,
        "identity provider seals",
        include_str!("../../../migrations/postgres/0024_identity_provider_seals.sql"),
    ),
    (
        25,
        "agents by issuer and key",
        include_str!("../../../migrations/postgres/0025_agents_by_issuer_and_key.sql"),
    ),
    (
        26,
        "subject revocations are kept",
        include_str!("../../../migrations/postgres/0026_subject_revocations_are_kept.sql"),
    ),
    (
        27,
        "name moves are kept",
        include_str!("../../../migrations/postgres/0027_name_moves_are_kept.sql"),
    ),
    (
        28,
        "identity provider removals",
        include_str!("../../../migrations/postgres/0028_identity_provider_removals.sql"),
    ),
    (
        29,
        "triggers hold against the service role",
        include_str!("../../../migrations/postgres/0029_triggers_hold_against_the_service_role.sql"),
    ),
    (
        30,
        "domain events in order",
        include_str!("../../../migrations/postgres/0030_domain_events_in_order.sql"),
    ),
    (
        31,
        "audit blocks are sealed",
        include_str!("../../../migrations/postgres/0031_audit_blocks_are_sealed.sql"),
    ),
    (
        32,
        "signing keys are keys",
        include_str!("../../../migrations/postgres/0032_signing_keys_are_keys.sql"),
    ),
    (
        33,
        "checkpoints within their ledger",
        include_str!("../../../migrations/postgres/0033_checkpoints_within_their_ledger.sql"),
    ),
    (
        34,
        "streams stay narrowed",
        include_str!("../../../migrations/postgres/0034_streams_stay_narrowed.sql"),
    ),
    (
        35,
        "signing key expiries only grow",
        include_str!("../../../migrations/postgres/0035_signing_key_expiries_only_grow.sql"),
    ),
    (
        36,
        "moves owe only earlier agents",
        include_str!("../../../migrations/postgres/0036_moves_owe_only_earlier_agents.sql"),
    ),
    (
        37,
        "domain attempts outlive claims",
        include_str!("../../../migrations/postgres/0037_domain_attempts_outlive_claims.sql"),
    ),
    (
        38,
        "one current client secret",
        include_str!("../../../migrations/postgres/0038_one_current_client_secret.sql"),
    ),
    (
        39,
        "retirements in order",
        include_str!("../../../migrations/postgres/0039_retirements_in_order.sql"),
    ),
    (
        40,
        "committed rows short and last",
        include_str!("../../../migrations/postgres/0040_committed_rows_short_and_last.sql"),
    ),
    (
        41,
        "log rows as written",
        include_str!("../../../migrations/postgres/0041_log_rows_as_written.sql"),
    ),
    (
        42,
        "keys and plans sealed",
        include_str!("../../../migrations/postgres/0042_keys_and_plans_sealed.sql"),
    ),
    (
        43,
        "agent credentials sealed",
        include_str!("../../../migrations/postgres/0043_agent_credentials_sealed.sql"),
    ),
    (
        44,
        "every agent binding sealed",
        include_str!("../../../migrations/postgres/0044_every_agent_binding_sealed.sql"),
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

/// Whether a PostgreSQL database lacks migrations this binary has (or has ones it does not
/// know, which the migrator then refuses): the service can start under a role that owns
/// nothing and so could not run even `CREATE TABLE IF NOT EXISTS`, once the owner has
/// migrated (`agentid migrate`).
pub(crate) async fn pending_pg(pool: &sqlx::PgPool) -> Result<bool, sqlx::Error> {
    let exists: (bool,) = sqlx::query_as("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
        .fetch_one(pool)
        .await?;
    if !exists.0 {
        return Ok(true);
    }
    let applied: Vec<(i64,)> =
        sqlx::query_as("SELECT version FROM _sqlx_migrations WHERE success ORDER BY version")
            .fetch_all(pool)
            .await?;
    let applied: Vec<i64> = applied.into_iter().map(|(v,)| v).collect();
    let known: Vec<i64> = POSTGRES.iter().map(|(v, _, _)| *v).collect();
    Ok(applied != known)
}

/// The privileges `agentid migrate --grant ROLE` gives the service's role: everything the
/// service does, nothing more. The audit log's tables only take inserts (their triggers
/// refuse the rest even to a role that had more), and nothing grants TRUNCATE, ownership,
/// or the right to create.
pub(crate) fn grants_pg(role: &str) -> Vec<String> {
    let r = format!("\"{role}\"");
    vec![
        format!("GRANT USAGE ON SCHEMA public TO {r}"),
        format!("GRANT SELECT ON ALL TABLES IN SCHEMA public TO {r}"),
        format!(
            "GRANT INSERT, UPDATE, DELETE ON orgs, api_keys, agents, revocation_epoch, signing_keys, \
             rate_buckets, status_lists, ssf_streams, ssf_subjects, ssf_events, domain_claims, \
             domain_attempts, client_assertions, name_moves, client_secrets, identity_providers TO {r}"
        ),
        // A person's revocation is kept (its triggers refuse the rest too).
        format!("GRANT INSERT, UPDATE ON subject_revocations TO {r}"),
        format!("GRANT INSERT ON identity_provider_removals TO {r}"),
        format!(
            "GRANT INSERT ON audit_blocks, audit_block_agents, audit_tree_nodes, audit_checkpoints, \
             domain_events TO {r}"
        ),
        format!("GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {r}"),
    ]
}

/// A role name `grants_pg` accepts: a plain identifier.
pub fn valid_role(role: &str) -> bool {
    let mut chars = role.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && role.len() <= 63
}
