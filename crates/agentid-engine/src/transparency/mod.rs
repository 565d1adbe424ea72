//! The audit log made verifiable, where it reads the store: the checkpointer (signs each
//! grown ledger's checkpoint, serves inclusion and consistency proofs from stored subtree
//! hashes) and `agentid audit verify` (`check`: recomputes everything the log claims). The
//! pure half (tree, notes, commitments) is `agentid_core::tlog`.

pub mod check;
pub mod checkpointer;
mod domain_list;
mod lists;
mod proofs;
mod subtrees;

pub use domain_list::DomainListWatch;
pub use lists::{committed_lists, CommittedLists};
pub use proofs::ProofRefused;

/// Something stored that the service did not write: logged, and counted by `what`.
pub(crate) fn alarm(what: &'static str, message: &str) {
    tracing::error!(what, "integrity alarm: {message}");
    metrics::counter!("agentid_integrity_failures_total", "what" => what).increment(1);
}
