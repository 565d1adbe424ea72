//! The one integration-test binary: each test gets its own database and, most of them, a
//! real server they drive over HTTP; the rest call the engine, the store or the binary.
//! Backend: SQLite by default; PostgreSQL when AGENTID_TEST_DATABASE_URL=postgres://… .

mod dns;
mod helpers;

mod admin;
mod agents;
mod auth;
pub mod cli;
mod delegation;
mod domains;
mod dpop;
mod engine;
mod errors;
mod failover;
mod fleet;
mod forward_auth;
pub mod gateways;
mod health;
mod identity_providers;
mod integrity;
mod isolation;
mod limits;
mod log;
mod oauth;
mod offline;
mod ops;
mod outbox;
mod persistence;
mod proxy;
pub mod readme;
mod rotation;
mod signed;
mod ssf;
pub mod status;
pub mod store;
mod tokens;
mod transparency;
mod verify;
