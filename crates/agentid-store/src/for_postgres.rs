//! The store's queries (`queries/`) compiled for PostgreSQL.

pub(crate) type DB = sqlx::Postgres;

#[path = "queries/mod.rs"]
pub(crate) mod queries;
