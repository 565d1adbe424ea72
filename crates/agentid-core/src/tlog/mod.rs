//! The audit log's pure half: what anyone needs to hold the service to "the log only grew".
//!
//! - `tree`: each ledger is an RFC 9162 Merkle tree over its record hashes; subtrees,
//!   frontier, proof ranges and the proof verifiers.
//! - `note`: checkpoints as C2SP signed notes, the log key, and files of notes.
//! - `commit`: what a checkpoint commits to besides the records (the ledger's revocations,
//!   the fleet's key retirements and issuer-domain events), so that undoing one is caught
//!   like a cut log.
//! - `witness`: what a witness concludes from two checkpoints and the log's answers (a
//!   consistency proof, committed entries, its newest record), without I/O.
//!
//! The checkpointer and `audit verify`, which read the store, are in the engine crate;
//! `agentid audit witness`, which fetches and keeps the witness's state folder, is the binary's.

pub mod commit;
pub mod note;
pub mod tree;
pub mod witness;
