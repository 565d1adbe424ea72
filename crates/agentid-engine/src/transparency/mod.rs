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

use agentid_core::domain::audit::block_seal_input;
use agentid_core::domain::Ledger;
use agentid_core::keys::KeyRing;
use agentid_store::BlockSeal;

/// Whether the key file vouches for a stored block: its seal checks, or it has none and no
/// block before it in its ledger has one (`sealed_before`): written before blocks were
/// sealed. The database refuses a block without a seal since; one that gets past that (the
/// SQLite file's owner) after a sealed block is caught all the same.
pub(crate) fn block_sealed(keys: &KeyRing, ledger: &Ledger, s: &BlockSeal, sealed_before: bool) -> bool {
    let Some(mac) = &s.mac else {
        return !sealed_before;
    };
    let (Ok(prev), Ok(last)) = (
        <[u8; 32]>::try_from(s.prev_hash.as_slice()),
        <[u8; 32]>::try_from(s.last_hash.as_slice()),
    ) else {
        return false;
    };
    keys.audit_block_vouched(
        &block_seal_input(ledger, s.first_seq, s.last_seq, &prev, &last),
        mac,
    )
}

/// Something stored that the service did not write: logged, and counted by `what`.
pub(crate) fn alarm(what: &'static str, message: &str) {
    tracing::error!(what, "integrity alarm: {message}");
    metrics::counter!("agentid_integrity_failures_total", "what" => what).increment(1);
}
