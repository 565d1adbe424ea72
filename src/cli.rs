//! The command line: `serve`, `org`, `key`, `audit`. Every flag of `serve` has an
//! environment variable behind it (DESIGN.md "Running").

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::Config;
use crate::domain::{ApiKeyKind, KeyMode, Millis, OrgLimits, Plan};
use crate::engine::{admin, hash_key, EngineConfig, WriterConfig};
use crate::store::{self, SharedStore, StoreOptions};
use crate::telemetry::{self, LogFormat};
use crate::Application;

#[derive(Debug, Parser)]
#[command(
    name = "agentid",
    version,
    about = "Identity and verification service for AI agents"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the HTTP service.
    Serve(ServeArgs),
    /// Manage organizations.
    #[command(subcommand)]
    Org(OrgCommand),
    /// Manage API keys.
    #[command(subcommand)]
    Key(KeyCommand),
    /// Inspect the audit log.
    #[command(subcommand)]
    Audit(AuditCommand),
}

#[derive(Debug, Args)]
pub struct DbArgs {
    /// sqlite://PATH (embedded) or postgres://USER@HOST:PORT/DB
    #[arg(long, env = "DATABASE_URL", default_value = "sqlite://./data/agentid.db")]
    pub database_url: String,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// Address to listen on.
    #[arg(long, env = "AGENTID_BIND", default_value = "127.0.0.1:8080")]
    pub bind: String,
    /// Public base URL used in verify_url, public_key_url and docs_url [default: http://BIND]
    #[arg(long, env = "AGENTID_PUBLIC_URL")]
    pub public_url: Option<String>,
    /// PKCS#8 PEM Ed25519 signing key; created (mode 0600) when absent.
    #[arg(
        long,
        env = "AGENTID_SIGNING_KEY_FILE",
        default_value = "./data/signing-key.pem"
    )]
    pub signing_key_file: PathBuf,
    /// Prometheus metrics listener ("off" disables it).
    #[arg(long, env = "AGENTID_METRICS_BIND", default_value = "127.0.0.1:9464")]
    pub metrics_bind: String,
    /// Log format on stderr.
    #[arg(long, env = "AGENTID_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// HTTP worker threads [default: one per CPU]
    #[arg(long, env = "AGENTID_WORKERS")]
    pub workers: Option<usize>,
    /// Balancers in front of the service, as CIDRs (e.g. 10.0.0.0/8,::1/128): only a peer in
    /// one of them is believed about the client's address (X-Forwarded-For, Forwarded).
    #[arg(long, env = "AGENTID_TRUSTED_PROXIES", default_value = "")]
    pub trusted_proxies: String,
    /// After SIGTERM, SIGINT or SIGQUIT: seconds the instance goes on serving while /health
    /// answers 503 "draining" (so that a balancer moves its traffic), before it stops
    /// accepting, finishes what is in flight and exits.
    #[arg(long, env = "AGENTID_SHUTDOWN_DRAIN_SECONDS", default_value_t = 5)]
    pub shutdown_drain_seconds: u64,
    /// Most audit records written in one transaction.
    #[arg(long, env = "AGENTID_AUDIT_BATCH_MAX", default_value_t = 512)]
    pub audit_batch_max: usize,
    /// How long a partly filled audit batch waits for more records, in milliseconds.
    #[arg(long, env = "AGENTID_AUDIT_LINGER_MS", default_value_t = 0)]
    pub audit_linger_ms: u64,
    /// Database connections.
    #[arg(long, env = "AGENTID_DB_MAX_CONNECTIONS", default_value_t = 16)]
    pub db_max_connections: u32,
    /// Verified tokens remembered (0 disables the cache).
    #[arg(long, env = "AGENTID_TOKEN_CACHE_CAPACITY", default_value_t = 65_536)]
    pub token_cache_capacity: usize,
}

/// Comma-separated CIDR networks; a bare address is the network of that address alone.
fn parse_nets(list: &str) -> Result<Vec<ipnet::IpNet>, String> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<ipnet::IpNet>()
                .or_else(|_| s.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                .map_err(|_| {
                    format!("--trusted-proxies: {s:?} is not a CIDR network like 10.0.0.0/8, nor an address")
                })
        })
        .collect()
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum PlanArg {
    Free,
    Developer,
    Growth,
    Enterprise,
}

impl From<PlanArg> for Plan {
    fn from(p: PlanArg) -> Plan {
        match p {
            PlanArg::Free => Plan::Free,
            PlanArg::Developer => Plan::Developer,
            PlanArg::Growth => Plan::Growth,
            PlanArg::Enterprise => Plan::Enterprise,
        }
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum KindArg {
    Secret,
    Publishable,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ModeArg {
    Live,
    Test,
}

#[derive(Debug, Subcommand)]
pub enum OrgCommand {
    /// Create an organization and print it with its four keys (shown once) as JSON.
    Create {
        #[arg(long)]
        name: String,
        #[arg(long, value_enum)]
        plan: PlanArg,
        /// Verify calls per minute (enterprise only, and required there).
        #[arg(long)]
        verify_limit: Option<u32>,
        /// Calls per minute to all other endpoints (enterprise only, and required there).
        #[arg(long)]
        other_limit: Option<u32>,
        /// Longest token lifetime in seconds, at most one year (enterprise only) [default: the plan's]
        #[arg(long)]
        max_expiry_seconds: Option<u64>,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Change an organization's plan or limits (running servers see it within 10 s).
    SetLimits {
        #[arg(long)]
        org: String,
        /// New plan [default: keep the current one]
        #[arg(long, value_enum)]
        plan: Option<PlanArg>,
        /// Verify calls per minute (enterprise only) [default: keep the current one]
        #[arg(long)]
        verify_limit: Option<u32>,
        /// Calls per minute to all other endpoints (enterprise only) [default: keep the current one]
        #[arg(long)]
        other_limit: Option<u32>,
        /// Longest token lifetime in seconds, at most one year (enterprise only) [default: keep the current one]
        #[arg(long)]
        max_expiry_seconds: Option<u64>,
        #[command(flatten)]
        db: DbArgs,
    },
}

#[derive(Debug, Subcommand)]
pub enum KeyCommand {
    /// Create one more key for an organization and print it (shown once).
    Create {
        #[arg(long)]
        org: String,
        #[arg(long, value_enum)]
        kind: KindArg,
        #[arg(long, value_enum)]
        mode: ModeArg,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Disable a key for good. The key is read from standard input, so it stays out of
    /// shell history and process listings.
    Disable {
        #[command(flatten)]
        db: DbArgs,
    },
}

#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Recompute every ledger's hash chain from genesis; exit 1 on any break.
    Verify {
        #[command(flatten)]
        db: DbArgs,
    },
}

pub async fn run(cli: Cli) -> ExitCode {
    let result = match cli.command {
        Command::Serve(args) => serve(args).await,
        Command::Org(cmd) => org(cmd).await,
        Command::Key(cmd) => key(cmd).await,
        Command::Audit(AuditCommand::Verify { db }) => audit_verify(db).await,
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("agentid: {e}");
            ExitCode::FAILURE
        }
    }
}

type CliResult = Result<ExitCode, Box<dyn std::error::Error>>;

async fn open(db: &DbArgs) -> Result<SharedStore, store::StoreError> {
    store::connect(&db.database_url, &StoreOptions::default()).await
}

async fn serve(args: ServeArgs) -> CliResult {
    telemetry::init(args.log_format);
    let metrics_bind = (args.metrics_bind != "off").then_some(args.metrics_bind);
    let cfg = Config {
        bind: args.bind,
        public_url: args.public_url,
        signing_key_file: args.signing_key_file,
        metrics_bind,
        workers: args.workers,
        trusted_proxies: parse_nets(&args.trusted_proxies)?,
        engine: EngineConfig {
            writer: WriterConfig {
                max_batch: args.audit_batch_max.max(1),
                linger: Duration::from_millis(args.audit_linger_ms),
                ..WriterConfig::default()
            },
            token_cache_capacity: args.token_cache_capacity,
            ..EngineConfig::default()
        },
        store: StoreOptions {
            max_connections: args.db_max_connections.max(1),
            ..StoreOptions::default()
        },
        shutdown_drain: Duration::from_secs(args.shutdown_drain_seconds),
        ..Config::new(args.db.database_url)
    };
    tracing::info!(config = ?cfg, "starting");
    let app = Application::build(cfg).await?;
    if app.created_signing_key {
        println!("agentid: created a new signing key");
    }
    if let Some(org) = &app.bootstrapped {
        println!(
            "agentid: created organization {} ({}, plan {}). Its API keys are shown this once and will not be shown again:",
            org.name, org.org_id, org.plan
        );
        println!("  secret_live       {}", org.keys.secret_live);
        println!("  secret_test       {}", org.keys.secret_test);
        println!("  publishable_live  {}", org.keys.publishable_live);
        println!("  publishable_test  {}", org.keys.publishable_test);
        println!(
            "agentid: try: curl -s -X POST {}/v1/agents/register -H 'Authorization: Bearer {}' \
             -H 'Content-Type: application/json' -d '{{\"name\":\"demo\",\"issuer_domain\":\"example.com\",\"scopes\":[\"read:docs\"]}}'",
            app.public_url(),
            org.keys.secret_live
        );
    }
    if let Some(m) = app.metrics_addr() {
        println!("agentid: metrics on http://{m}/metrics");
    }
    // Last: scripts wait for this line.
    println!(
        "agentid: listening on http://{} (public URL {})",
        app.addr(),
        app.public_url()
    );
    app.run_until_stopped().await?;
    Ok(ExitCode::SUCCESS)
}

async fn org(cmd: OrgCommand) -> CliResult {
    match cmd {
        OrgCommand::Create {
            name,
            plan,
            verify_limit,
            other_limit,
            max_expiry_seconds,
            db,
        } => {
            let plan = Plan::from(plan);
            let limits = OrgLimits::resolve(plan, verify_limit, other_limit, max_expiry_seconds)?;
            let name = crate::domain::Name::parse(&name)?;
            let store = open(&db).await?;
            let created = admin::create_org(&store, name.as_str(), plan, limits).await?;
            println!("{}", serde_json::to_string(&created)?);
            Ok(ExitCode::SUCCESS)
        }
        OrgCommand::SetLimits {
            org,
            plan,
            verify_limit,
            other_limit,
            max_expiry_seconds,
            db,
        } => {
            let store = open(&db).await?;
            let Some(mut record) = store.get_org(&org).await? else {
                eprintln!("agentid: no organization {org}");
                return Ok(ExitCode::FAILURE);
            };
            let new_plan = plan.map(Plan::from).unwrap_or(record.plan);
            // An enterprise organization that stays enterprise keeps the custom limits it
            // does not name; any other takes the new plan's (only enterprise has custom ones).
            let keep_custom = new_plan == record.plan && new_plan == Plan::Enterprise;
            fn keep<T>(keep_custom: bool, current: T, named: Option<T>) -> Option<T> {
                named.or(keep_custom.then_some(current))
            }
            record.limits = OrgLimits::resolve(
                new_plan,
                keep(keep_custom, record.limits.verify_per_minute, verify_limit),
                keep(keep_custom, record.limits.other_per_minute, other_limit),
                keep(keep_custom, record.limits.max_expiry_seconds, max_expiry_seconds),
            )?;
            record.plan = new_plan;
            store.update_org(&record).await?;
            println!(
                "{}",
                serde_json::json!({
                    "org_id": record.id, "plan": record.plan.as_str(),
                    "verify_limit": record.limits.verify_per_minute,
                    "other_limit": record.limits.other_per_minute,
                    "max_expiry_seconds": record.limits.max_expiry_seconds,
                })
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn key(cmd: KeyCommand) -> CliResult {
    match cmd {
        KeyCommand::Create { org, kind, mode, db } => {
            let kind = match kind {
                KindArg::Secret => ApiKeyKind::Secret,
                KindArg::Publishable => ApiKeyKind::Publishable,
            };
            let mode = match mode {
                ModeArg::Live => KeyMode::Live,
                ModeArg::Test => KeyMode::Test,
            };
            let store = open(&db).await?;
            match admin::create_key(&store, &org, kind, mode).await? {
                Some(key) => {
                    println!("{key}");
                    Ok(ExitCode::SUCCESS)
                }
                None => {
                    eprintln!("agentid: no organization {org}");
                    Ok(ExitCode::FAILURE)
                }
            }
        }
        KeyCommand::Disable { db } => {
            let mut line = String::new();
            std::io::stdin().read_line(&mut line)?;
            let store = open(&db).await?;
            if store.disable_key(&hash_key(line.trim()), Millis::now()).await? {
                println!("disabled (running servers refuse it within 10 s)");
                Ok(ExitCode::SUCCESS)
            } else {
                eprintln!("agentid: no such key");
                Ok(ExitCode::FAILURE)
            }
        }
    }
}

async fn audit_verify(db: DbArgs) -> CliResult {
    let store = open(&db).await?;
    let mut ok = true;
    for r in admin::verify_chains(&store).await? {
        let name = if r.ledger.is_service() {
            "service".to_owned()
        } else {
            format!("{}/{}", r.ledger.org_id, r.ledger.mode.as_str())
        };
        match r.broken {
            None => println!("ok      {name}: {} records", r.records),
            Some(b) => {
                ok = false;
                println!("BROKEN  {name}: {b} (after {} good records)", r.records);
            }
        }
    }
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
