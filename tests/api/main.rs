//! The one integration-test binary (see STYLE.md): every test drives a real server over HTTP.
//! Backend: SQLite by default; PostgreSQL when AGENTID_TEST_DATABASE_URL=postgres://… .

mod helpers;

mod agents;
mod auth;
mod cli;
mod engine;
mod errors;
mod fleet;
mod health;
mod isolation;
mod limits;
mod log;
mod offline;
mod ops;
mod persistence;
mod proxy;
mod rotation;
mod store;
mod tokens;
mod transparency;
mod verify;
