//! The store's queries (`queries/`) compiled for SQLite.

pub(crate) type DB = sqlx::Sqlite;

#[path = "queries/mod.rs"]
pub(crate) mod queries;
