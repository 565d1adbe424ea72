//! The store's queries, written once against `DB` and compiled once for each backend
//! (`for_sqlite`, `for_postgres` name this file with their own `DB`), so that no function
//! carries sqlx's bounds.

pub(crate) use super::DB;

pub(crate) mod agent_rows;
pub(crate) mod agents;
pub(crate) mod audit;
pub(crate) mod domains;
pub(crate) mod holdings;
pub(crate) mod identity_providers;
pub(crate) mod orgs;
pub(crate) mod places;
pub(crate) mod revoke;
pub(crate) mod signing;
pub(crate) mod sql;
pub(crate) mod ssf;
pub(crate) mod tree;
