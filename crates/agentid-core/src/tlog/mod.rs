//! The audit log's pure half: what anyone needs to hold the service to "the log only grew".
//!
//! - `tree`: each ledger is an RFC 9162 Merkle tree over its record hashes; subtrees,
//!   frontier, proof ranges and the proof verifiers.
//! - `note`: checkpoints as C2SP signed notes, the log key, and files of notes.
//! - `commit`: what a checkpoint commits to besides the records (the ledger's revocations,
//!   the fleet's key retirements and issuer-domain events), so that undoing one is caught
//!   like a cut log.
//!
//! The checkpointer and `audit verify`, which read the store, are the engine's
//! (`agentid_engine::transparency`); the witness that fetches checkpoints is the binary's.

pub mod commit;
pub mod note;
pub mod tree;
