//! `agentid`: parse the command line and run it.
#![forbid(unsafe_code)]

use std::process::ExitCode;

/// mimalloc instead of glibc malloc: the verify path allocates on HTTP workers and frees on
/// the audit writer's thread (and back), which cost ~5 µs a hot verify with glibc's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    agentid::cli::main()
}
