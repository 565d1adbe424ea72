//! The audit log made verifiable: how anyone can hold the service to "the log only grew".
//!
//! - `tree`: each ledger is an RFC 9162 Merkle tree over its record hashes; subtrees,
//!   frontier, proof ranges and the proof verifiers.
//! - `note`: checkpoints as C2SP signed notes, the log key, and files of notes.
//! - `commit`: what a checkpoint commits to besides the records (the ledger's revocations,
//!   the fleet's key retirements), so that undoing one is caught like a cut log.
//! - `checkpointer`: signs each grown ledger's checkpoint and serves inclusion and
//!   consistency proofs from stored subtree hashes.
//! - `check`: `agentid audit verify`, which recomputes everything the log claims.
//! - `witness`: `agentid audit witness`, which a receiver or issuer runs on its own machine.
//!
//! `tree`, `note`, `commit` and `witness` are pure (the keys layer); `checkpointer` and `check` read the
//! store (the engine layer). `.ci/layers` holds each file to its layer.

pub mod check;
pub mod checkpointer;
pub mod commit;
pub mod note;
pub mod tree;
pub mod witness;
