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
