//! agentid's core: what every layer shares and none of them does I/O for. Validated values
//! of the problem domain (`domain`), tokens (`token`), keys (`keys`), the audit log's pure
//! half (`tlog`: the Merkle tree, signed notes, commitments), and the records the store keeps
//! (`records`). No actix, no sqlx: the crates above hand everything in.
#![forbid(unsafe_code)]

pub mod domain;
pub mod httpsig;
pub mod keys;
pub mod records;
pub mod tlog;
pub mod token;

/// What the crates' unit tests share.
#[cfg(any(test, feature = "test-hooks"))]
pub mod testing {
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
