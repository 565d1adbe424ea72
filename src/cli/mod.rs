//! The command line: `serve`, `migrate`, `org`, `key`, `signing-key`, `domain`, `audit`,
//! `token`. It
//! parses arguments and calls the engine's rules (`engine::admin`); every flag of `serve` has
//! an environment variable behind it, and its default is the one `Config` and the engine use.
//! One file per group of commands: `serve`, `org` (organizations and API keys), `audit`
//! (verify and witness), `operator` (migrations, signing keys, issuer domains), `token` (a
//! token explained, for debugging).

mod audit;
mod operator;
mod org;
mod serve;
mod token;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::config;
use crate::store::{self, SharedStore, StoreOptions};

use audit::AuditCommand;
use operator::{DomainCommand, SigningKeyCommand};
use org::{KeyCommand, OrgCommand};
use serve::ServeArgs;
use token::TokenCommand;

#[derive(Debug, Parser)]
#[command(
    name = "agentid",
    version,
    about = "Identity and verification service for AI agents"
)]
pub struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run the HTTP service.
    Serve(ServeArgs),
    /// Manage organizations.
    #[command(subcommand)]
    Org(OrgCommand),
    /// Manage API keys.
    #[command(subcommand)]
    Key(KeyCommand),
    /// Inspect the audit log, or witness it.
    #[command(subcommand)]
    Audit(AuditCommand),
    /// Rotate the fleet's token signing keys.
    #[command(subcommand)]
    SigningKey(SigningKeyCommand),
    /// Grant, release and list the issuer domains organizations hold.
    #[command(subcommand)]
    Domain(DomainCommand),
    /// Explain a token (no database needed).
    #[command(subcommand)]
    Token(TokenCommand),
    /// Apply the database migrations (as the database owner), and optionally grant a role
    /// that owns nothing what the service needs.
    Migrate {
        #[command(flatten)]
        db: DbArgs,
        /// PostgreSQL role the service runs as: granted exactly what it needs (inserts only
        /// into the audit log's tables, no TRUNCATE, nothing it could own or create).
        #[arg(long)]
        grant: Option<String>,
    },
}

#[derive(Debug, Args)]
pub(crate) struct DbArgs {
    /// sqlite://PATH (embedded) or postgres://USER@HOST:PORT/DB
    // Its value is never shown in `--help`: it may hold a password.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true, default_value = config::DEFAULT_DATABASE_URL)]
    pub(crate) database_url: String,
}

/// The binary's `main`: parses the command line and runs it on actix's runtime. Here rather
/// than in `main.rs`, so that the command's whole future is compiled once, in this crate (a
/// `block_on` in the binary instantiated it again there: ~25 s of every first build).
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    actix_web::rt::System::new().block_on(run(cli))
}

pub async fn run(cli: Cli) -> ExitCode {
    if !matches!(cli.command, Command::Serve(_)) {
        crate::telemetry::init_command();
    }
    let result = match cli.command {
        Command::Serve(args) => serve::serve(args).await,
        Command::Org(cmd) => org::org(cmd).await,
        Command::Key(cmd) => org::key(cmd).await,
        Command::Audit(cmd) => audit::run(cmd).await,
        Command::Migrate { db, grant } => operator::migrate(db, grant).await,
        Command::SigningKey(cmd) => operator::signing_key(cmd).await,
        Command::Domain(cmd) => operator::domain(cmd).await,
        Command::Token(cmd) => token::run(cmd).await,
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("agentid: {}", one_line(&e.to_string()));
            ExitCode::FAILURE
        }
    }
}

/// Text with every character that could act on a terminal written as a `\uXXXX` escape
/// (which JSON reads back as the same character): the controls but a newline, line and
/// paragraph separators and bidirectional overrides. For JSON a token carries (they occur
/// only inside its strings; serde escapes the C0 controls already) and for error messages,
/// which may repeat what a server or a file said.
/// [`printable`] on one line: a newline is escaped too, so that a message repeating what a
/// server said cannot forge a line of its own (an `ok:` in cron mail).
pub(super) fn one_line(text: &str) -> String {
    printable(text).replace('\n', "\\n")
}

pub(super) fn printable(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if c.is_control()
            || matches!(c, '\u{2028}' | '\u{2029}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
        {
            if c == '\n' {
                out.push(c); // the pretty printer's and a message's own lines
            } else {
                out.push_str(&format!("\\u{:04x}", c as u32));
            }
        } else {
            out.push(c);
        }
    }
    out
}

pub(super) type CliResult = Result<ExitCode, Box<dyn std::error::Error>>;

/// The database a command (not `serve`, not `migrate`) works on: it must exist. An
/// operator's command runs its statements without the service's timeout (`audit verify`
/// reads the whole log).
pub(super) async fn open(db: &DbArgs) -> Result<SharedStore, store::StoreError> {
    let opts = StoreOptions {
        create: store::Create::Nothing,
        statement_timeout: std::time::Duration::ZERO,
        ..StoreOptions::default()
    };
    store::connect(&db.database_url, &opts).await
}

/// What `serve` and `migrate` may create: the default database with its folder; a database
/// at a path given, in a folder that exists.
pub(super) fn may_create(url: &str) -> store::Create {
    if url == config::DEFAULT_DATABASE_URL {
        store::Create::FileAndFolder
    } else {
        store::Create::File
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::{Cli, Command, SigningKeyCommand};

    /// A kid is base64url and may begin with '-': it is still the kid, not a flag.
    #[test]
    fn a_kid_that_begins_with_a_dash_is_a_kid() {
        let cli = Cli::try_parse_from(["agentid", "signing-key", "retire", "-3abc_x"]).unwrap();
        match cli.command {
            Command::SigningKey(SigningKeyCommand::Retire { kid, .. }) => assert_eq!(kid, "-3abc_x"),
            other => panic!("{other:?}"),
        }
    }
}
