//! agentid: identity and verification service for AI agents.
//!
//! The crate is split by ownership, in layers that import only downward (see
//! `ARCHITECTURE.md`): `domain` holds validated values; `token` encodes and checks JWTs;
//! `keys` holds the key file's key and the key set in force; `tlog` makes the audit log
//! verifiable; `store` owns persistence; `engine` the in-memory state, the verify path and
//! the rules; `http` speaks HTTP; `app` and `cli` wire and drive it.
#![forbid(unsafe_code)]

pub mod app;
pub mod cli;
pub mod config;
pub mod domain;
pub mod engine;
pub mod http;
pub mod keys;
pub mod store;
pub mod telemetry;
pub mod tlog;
pub mod token;

pub use app::Application;
pub use config::Config;

/// What the unit tests share.
#[cfg(test)]
pub(crate) mod testing {
    /// A proptest configuration with a fixed seed and no failure files: CI runs the same
    /// cases every time.
    pub fn fixed_seed(seed: u64, cases: u32) -> proptest::test_runner::Config {
        proptest::test_runner::Config {
            cases,
            rng_seed: proptest::test_runner::RngSeed::Fixed(seed),
            failure_persistence: None,
            ..Default::default()
        }
    }
}
