//! agentid: identity and verification service for AI agents. This package is the binary,
//! `app` (wiring) and `cli` (the command line), on the layers below it, each a crate that
//! can name only the ones beneath it (see `ARCHITECTURE.md`):
//! `agentid-core` (domain values, tokens, keys, the log's pure half, the store's records) ←
//! `agentid-store` ← `agentid-engine` (the use cases) ← `agentid-http`.
//!
//! The layers are re-exported under their old names, for the tests and benchmarks that
//! drive them.
#![forbid(unsafe_code)]

pub mod app;
pub mod cli;
pub mod config;
pub(crate) mod fetch;
pub mod telemetry;
pub(crate) mod witness;

pub use agentid_core::{domain, keys, records, tlog, token};
pub use agentid_engine as engine;
pub use agentid_http as http;
pub use agentid_store as store;
pub use app::Application;
