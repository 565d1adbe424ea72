//! `agentid`: parse the command line and run it.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;

#[actix_web::main]
async fn main() -> ExitCode {
    agentid::cli::run(agentid::cli::Cli::parse()).await
}
