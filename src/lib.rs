//! agentid: identity and verification service for AI agents.
//!
//! The crate is split by ownership (see `ARCHITECTURE.md`):
//! `http` speaks HTTP, `domain` holds validated values, `token` signs and checks JWTs,
//! `engine` owns the in-memory state and the verify path, `store` owns persistence.
#![forbid(unsafe_code)]

pub mod app;
pub mod cli;
pub mod config;
pub mod domain;
pub mod engine;
pub mod http;
pub mod store;
pub mod telemetry;
pub mod token;
pub mod witness;

pub use app::Application;
pub use config::Config;
