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
