//! The store's queries (`queries/`) compiled for SQLite. They are written once, against
//! `DB`, and compiled once for each backend, so that no function carries sqlx's bounds.

pub(crate) type DB = sqlx::Sqlite;

#[path = "queries/agent_rows.rs"]
pub(crate) mod agent_rows;
#[path = "queries/agents.rs"]
pub(crate) mod agents;
#[path = "queries/audit.rs"]
pub(crate) mod audit;
#[path = "queries/domains.rs"]
pub(crate) mod domains;
#[path = "queries/holdings.rs"]
pub(crate) mod holdings;
#[path = "queries/orgs.rs"]
pub(crate) mod orgs;
#[path = "queries/places.rs"]
pub(crate) mod places;
#[path = "queries/revoke.rs"]
pub(crate) mod revoke;
#[path = "queries/signing.rs"]
pub(crate) mod signing;
#[path = "queries/sql.rs"]
pub(crate) mod sql;
#[path = "queries/ssf.rs"]
pub(crate) mod ssf;
#[path = "queries/tree.rs"]
pub(crate) mod tree;
