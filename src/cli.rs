//! The command line: `serve`, `migrate`, `org`, `key`, `signing-key`, `audit`. It parses
//! arguments and calls the engine's rules (`engine::admin`); every flag of `serve` has an
//! environment variable behind it, and its default is the one `Config` and the engine use.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::{self, Config};
use crate::domain::{ApiKeyKind, KeyMode, Millis, OrgLimits, Plan};
use crate::engine::domains::{DomainConfig, IssuerPolicy};
use crate::engine::ssf::SsfConfig;
use crate::engine::status::StatusConfig;
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
    /// Inspect the audit log, or witness it.
    #[command(subcommand)]
    Audit(AuditCommand),
    /// Rotate the fleet's token signing keys.
    #[command(subcommand)]
    SigningKey(SigningKeyCommand),
    /// Grant, release and list the issuer domains organizations hold.
    #[command(subcommand)]
    Domain(DomainCommand),
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
pub struct DbArgs {
    /// sqlite://PATH (embedded) or postgres://USER@HOST:PORT/DB
    #[arg(long, env = "DATABASE_URL", default_value = config::DEFAULT_DATABASE_URL)]
    pub database_url: String,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// Address to listen on.
    #[arg(long, env = "AGENTID_BIND", default_value = config::DEFAULT_BIND)]
    pub bind: String,
    /// Public base URL used in verify_url, public_key_url and docs_url [default: http://BIND]
    #[arg(long, env = "AGENTID_PUBLIC_URL")]
    pub public_url: Option<String>,
    /// PKCS#8 PEM Ed25519 signing key; created (mode 0600) when absent.
    #[arg(
        long,
        env = "AGENTID_SIGNING_KEY_FILE",
        default_value = config::DEFAULT_SIGNING_KEY_FILE
    )]
    pub signing_key_file: PathBuf,
    /// Prometheus metrics listener ("off" disables it).
    #[arg(long, env = "AGENTID_METRICS_BIND", default_value = config::DEFAULT_METRICS_BIND)]
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
    #[arg(long, env = "AGENTID_SHUTDOWN_DRAIN_SECONDS", default_value_t = Config::new(config::DEFAULT_DATABASE_URL).shutdown_drain.as_secs())]
    pub shutdown_drain_seconds: u64,
    /// Most audit records written in one transaction.
    #[arg(long, env = "AGENTID_AUDIT_BATCH_MAX", default_value_t = WriterConfig::default().max_batch)]
    pub audit_batch_max: usize,
    /// How long a partly filled audit batch waits for more records, in milliseconds.
    #[arg(long, env = "AGENTID_AUDIT_LINGER_MS", default_value_t = WriterConfig::default().linger.as_millis() as u64)]
    pub audit_linger_ms: u64,
    /// Database connections.
    #[arg(long, env = "AGENTID_DB_MAX_CONNECTIONS", default_value_t = StoreOptions::default().max_connections)]
    pub db_max_connections: u32,
    /// A ledger of the audit log that grew gets a new signed checkpoint at most this often,
    /// in milliseconds.
    #[arg(long, env = "AGENTID_CHECKPOINT_INTERVAL_MS", default_value_t = EngineConfig::default().checkpoint_interval.as_millis() as u64)]
    pub checkpoint_interval_ms: u64,
    /// Bytes of verified tokens (with their claims and answers) remembered; 0 disables the
    /// cache.
    #[arg(long, env = "AGENTID_TOKEN_CACHE_BYTES", default_value_t = EngineConfig::default().token_cache_bytes)]
    pub token_cache_bytes: u64,
    /// Places of each Token Status List (a multiple of 8, up to 16777216); a new list opens
    /// once half of the newest one's places are taken.
    #[arg(long, env = "AGENTID_STATUS_LIST_SIZE", default_value_t = StatusConfig::default().size,
          value_parser = parse_list_size)]
    pub status_list_size: u64,
    /// How long receivers may cache a status list, in seconds (its `ttl` and `max-age`).
    #[arg(long, env = "AGENTID_STATUS_LIST_TTL", default_value_t = StatusConfig::default().ttl.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub status_list_ttl: u64,
    /// Allow Shared Signals push endpoints on http:// and on loopback or private addresses
    /// (development and tests only: a stream's owner could otherwise reach internal hosts).
    #[arg(long, env = "AGENTID_SSF_ALLOW_INSECURE_ENDPOINTS", value_parser = clap::builder::BoolishValueParser::new(), default_value_t = false)]
    pub ssf_allow_insecure_endpoints: bool,
    /// How long an instance holds a Shared Signals push stream it delivers, in seconds (at
    /// least 12: a push may take 10); after a crash its events wait this long.
    #[arg(long, env = "AGENTID_SSF_LEASE_SECONDS", default_value_t = SsfConfig::default().lease.as_secs(),
          value_parser = clap::value_parser!(u64).range(12..=3600))]
    pub ssf_lease_seconds: u64,
    /// Who may issue under an issuer domain: `verified`, only an organization that proved
    /// the name (or that the operator granted it); `open`, anyone, for single-tenant and
    /// development deployments (a token's issuer then proves nothing).
    #[arg(long, env = "AGENTID_ISSUER_DOMAINS", value_enum, default_value_t = IssuerDomainsArg::Verified)]
    pub issuer_domains: IssuerDomainsArg,
    /// The DNS server issuer-domain checks ask, as IP:PORT [default: the system's resolver]
    #[arg(long, env = "AGENTID_DNS_RESOLVER")]
    pub dns_resolver: Option<std::net::SocketAddr>,
    /// Let issuer-domain checks reach loopback and private addresses, and fetch
    /// http://<domain>/.well-known/agentid-domain-verification (port 80) when HTTPS fails
    /// (development and tests only).
    #[arg(long, env = "AGENTID_DOMAIN_VERIFICATION_ALLOW_INSECURE", value_parser = clap::builder::BoolishValueParser::new(), default_value_t = false)]
    pub domain_verification_allow_insecure: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum IssuerDomainsArg {
    Verified,
    Open,
}

fn parse_list_size(s: &str) -> Result<u64, String> {
    let n: u64 = s.parse().map_err(|_| format!("{s:?} is not a whole number"))?;
    if !(StatusConfig::MIN_SIZE..=StatusConfig::MAX_SIZE).contains(&n) || !n.is_multiple_of(8) {
        return Err(format!(
            "a status list holds a multiple of 8 places, from {} to {}",
            StatusConfig::MIN_SIZE,
            StatusConfig::MAX_SIZE
        ));
    }
    Ok(n)
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
    /// Print every organization as JSON: org_id, name, plan, created_at.
    List {
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
    /// Print an organization's keys as JSON: kind, mode, the key's prefix and last four
    /// characters (never the key), created_at, disabled.
    List {
        #[arg(long)]
        org: String,
        #[command(flatten)]
        db: DbArgs,
    },
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
    /// shell history and process listings: `echo "$KEY" | agentid key disable`.
    Disable {
        #[command(flatten)]
        db: DbArgs,
        /// Not taken: a key given here would be in the shell's history (read from stdin).
        #[arg(hide = true)]
        key: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum SigningKeyCommand {
    /// Print every signing key as JSON: kid, state (next, active, retired), created_at,
    /// activates_at.
    List {
        #[command(flatten)]
        db: DbArgs,
    },
    /// Add a signing key: in JWKS at once, signing once --publish-for has passed. The key it
    /// replaces keeps validating until its last token expires. Running instances follow
    /// within 10 s. The private key is stored sealed under the signing key file.
    Rotate {
        #[command(flatten)]
        db: DbArgs,
        /// How long the new key is published before it signs (0s: at once; receivers that
        /// cached JWKS then meet a kid they have not seen).
        #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
        publish_for: Duration,
        /// The key file every instance starts with (it seals the new key).
        #[arg(
            long,
            env = "AGENTID_SIGNING_KEY_FILE",
            default_value = config::DEFAULT_SIGNING_KEY_FILE
        )]
        signing_key_file: PathBuf,
    },
    /// Retire a key now: every token it signed is TOKEN_INVALID online, and it leaves JWKS.
    /// Refused for the only active key.
    Retire {
        /// The key's kid (a kid may begin with '-', which is read as the kid, not a flag).
        #[arg(allow_hyphen_values = true)]
        kid: String,
        #[command(flatten)]
        db: DbArgs,
    },
}

#[derive(Debug, Subcommand)]
pub enum DomainCommand {
    /// Grant an organization an issuer domain with no challenge (`method: operator`: the
    /// name and every name below it). A name another organization holds needs --force, and
    /// then revokes that organization's agents under it.
    Approve {
        /// The organization: its org_id, or a name only it has.
        #[arg(long)]
        org: String,
        domain: String,
        /// Take the name from the organization that holds it.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        keys: KeyFileArgs,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Print who holds which name as JSON: held names (with their method), pending claims (with
    /// --org), and names agents use that none of their organizations holds (`unheld`).
    List {
        #[arg(long)]
        org: Option<String>,
        #[command(flatten)]
        keys: KeyFileArgs,
        #[command(flatten)]
        db: DbArgs,
    },
    /// End an organization's holding (or claim) of a name. Its agents keep their tokens until
    /// they expire, and get no new ones.
    Release {
        #[arg(long)]
        org: String,
        domain: String,
        #[command(flatten)]
        keys: KeyFileArgs,
        #[command(flatten)]
        db: DbArgs,
    },
}

/// The key file every instance starts with: it seals (and vouches for) who holds a name.
#[derive(Debug, Args)]
pub struct KeyFileArgs {
    #[arg(
        long,
        env = "AGENTID_SIGNING_KEY_FILE",
        default_value = config::DEFAULT_SIGNING_KEY_FILE
    )]
    pub signing_key_file: PathBuf,
}

#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Recompute everything the audit log claims from its records: every hash chain, the
    /// derived columns and per-agent rows, the Merkle trees, and the root at every stored
    /// checkpoint (and their signatures), and at every checkpoint in --checkpoints. Prints each
    /// failure with its ledger and seq; exit 0 only when everything holds.
    Verify {
        #[command(flatten)]
        db: DbArgs,
        /// A file of signed checkpoints (one or more notes, as `GET /v1/log/checkpoint` answers
        /// them), or a folder of such files (a witness's state folder, say).
        #[arg(long)]
        checkpoints: Option<PathBuf>,
        /// The log key (as `/.well-known/log-key` serves it) [default: derived from the
        /// signing key file and the public URL]
        #[arg(long)]
        log_key: Option<String>,
        /// The service's signing key file, from which the log key is derived.
        #[arg(
            long,
            env = "AGENTID_SIGNING_KEY_FILE",
            default_value = config::DEFAULT_SIGNING_KEY_FILE
        )]
        signing_key_file: PathBuf,
        /// The service's public URL (its host names the log key) [default: http://127.0.0.1:8080]
        #[arg(long, env = "AGENTID_PUBLIC_URL")]
        public_url: Option<String>,
        #[command(flatten)]
        staleness: StalenessArgs,
    },
    /// Check, from your own machine, that the service's log of your ledger only grows: fetch
    /// its checkpoint, verify it, verify a consistency proof from the one saved last time, save
    /// it. Run it from cron. Exit 1 when the log shrank, forked or cannot prove it only grew;
    /// 2 when the check could not be made.
    Witness {
        /// The service's base URL.
        #[arg(long)]
        url: String,
        /// A secret key of your organization (its mode picks the ledger).
        #[arg(long, env = "AGENTID_WITNESS_KEY", hide_env_values = true)]
        key: String,
        /// Folder that keeps the last checkpoint and the pinned log key (one per ledger).
        #[arg(long)]
        state: PathBuf,
        /// The log key [default: /.well-known/log-key at the first run, pinned after]
        #[arg(long)]
        log_key: Option<String>,
        #[command(flatten)]
        staleness: StalenessArgs,
    },
}

/// When records that no checkpoint covers are an alarm.
#[derive(Debug, Clone, clap::Args)]
pub struct StalenessArgs {
    /// The service's checkpoint interval, in milliseconds (as `serve` takes it).
    #[arg(long, env = "AGENTID_CHECKPOINT_INTERVAL_MS", default_value_t = EngineConfig::default().checkpoint_interval.as_millis() as u64)]
    pub checkpoint_interval_ms: u64,
    /// Fail when a record has gone uncovered by any checkpoint for more than this many
    /// checkpoint intervals (the checkpointer stopped, or was stopped).
    #[arg(long, env = "AGENTID_STALE_AFTER_INTERVALS", default_value_t = 6)]
    pub stale_after_intervals: u32,
}

impl StalenessArgs {
    fn limit(&self) -> Duration {
        Duration::from_millis(self.checkpoint_interval_ms.max(1)) * self.stale_after_intervals.max(1)
    }
}

pub async fn run(cli: Cli) -> ExitCode {
    let result = match cli.command {
        Command::Serve(args) => serve(args).await,
        Command::Org(cmd) => org(cmd).await,
        Command::Key(cmd) => key(cmd).await,
        Command::Audit(AuditCommand::Verify {
            db,
            checkpoints,
            log_key,
            signing_key_file,
            public_url,
            staleness,
        }) => {
            audit_verify(
                db,
                checkpoints,
                log_key,
                signing_key_file,
                public_url,
                staleness.limit(),
            )
            .await
        }
        Command::Audit(AuditCommand::Witness {
            url,
            key,
            state,
            log_key,
            staleness,
        }) => {
            audit_witness(crate::witness::Witness {
                url,
                key,
                state,
                log_key,
                stale_after: staleness.limit(),
            })
            .await
        }
        Command::Migrate { db, grant } => migrate(db, grant).await,
        Command::SigningKey(cmd) => signing_key(cmd).await,
        Command::Domain(cmd) => domain(cmd).await,
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

/// The database a command (not `serve`, not `migrate`) works on: it must exist.
async fn open(db: &DbArgs) -> Result<SharedStore, store::StoreError> {
    let opts = StoreOptions {
        create: store::Create::Nothing,
        ..StoreOptions::default()
    };
    store::connect(&db.database_url, &opts).await
}

/// What `serve` and `migrate` may create: the default database with its folder; a database
/// at a path given, in a folder that exists.
fn may_create(url: &str) -> store::Create {
    if url == config::DEFAULT_DATABASE_URL {
        store::Create::FileAndFolder
    } else {
        store::Create::File
    }
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
            token_cache_bytes: args.token_cache_bytes,
            checkpoint_interval: Duration::from_millis(args.checkpoint_interval_ms.max(1)),
            status: StatusConfig {
                size: args.status_list_size,
                ttl: Duration::from_secs(args.status_list_ttl),
            },
            ssf: SsfConfig {
                allow_insecure_endpoints: args.ssf_allow_insecure_endpoints,
                lease: Duration::from_secs(args.ssf_lease_seconds),
            },
            domains: DomainConfig::new(
                match args.issuer_domains {
                    IssuerDomainsArg::Verified => IssuerPolicy::Verified,
                    IssuerDomainsArg::Open => IssuerPolicy::Open,
                },
                args.dns_resolver,
                args.domain_verification_allow_insecure,
            ),
            ..EngineConfig::default()
        },
        store: StoreOptions {
            max_connections: args.db_max_connections.max(1),
            create: may_create(&args.db.database_url),
            serve_lock: true,
            ..StoreOptions::default()
        },
        shutdown_drain: Duration::from_secs(args.shutdown_drain_seconds),
        ..Config::new(args.db.database_url)
    };
    let database = crate::config::redact_url(&cfg.database_url);
    tracing::debug!(config = ?cfg, "starting");
    let app = Application::build(cfg).await?;
    tracing::info!(
        listening = %app.addr(),
        public_url = app.public_url(),
        %database,
        "serving"
    );
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
        if app.engine().domains().policy() == IssuerPolicy::Verified {
            println!(
                "agentid: try it: an organization issues under names it holds. Grant it one (from this \
                 folder), then register an agent under it:"
            );
            println!("  agentid domain approve --org {} demo.example", org.org_id);
        } else {
            println!("agentid: try it:");
        }
        println!(
            "  curl -s -X POST {}/v1/agents/register -H 'Authorization: Bearer {}' \
             -H 'Content-Type: application/json' -d '{{\"name\":\"demo\",\"issuer_domain\":\"demo.example\",\"scopes\":[\"read:docs\"]}}'",
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
        OrgCommand::List { db } => {
            let store = open(&db).await?;
            let orgs: Vec<serde_json::Value> = store
                .list_orgs()
                .await?
                .into_iter()
                .map(|o| {
                    serde_json::json!({
                        "org_id": o.id, "name": o.name, "plan": o.plan.as_str(), "created_at": o.created_at,
                    })
                })
                .collect();
            println!("{}", serde_json::to_string(&orgs)?);
            Ok(ExitCode::SUCCESS)
        }
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
            let change = admin::LimitChange {
                plan: plan.map(Plan::from),
                verify_limit,
                other_limit,
                max_expiry_seconds,
            };
            let record = admin::set_limits(&store, &org, change).await?;
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
        KeyCommand::List { org, db } => {
            let store = open(&db).await?;
            if store.get_org(&org).await?.is_none() {
                eprintln!("agentid: no organization {org} (`agentid org list` shows them)");
                return Ok(ExitCode::FAILURE);
            }
            println!("{}", serde_json::to_string(&store.list_keys(&org).await?)?);
            Ok(ExitCode::SUCCESS)
        }
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
        KeyCommand::Disable { db, key } => {
            if key.is_some() {
                return Err(
                    "the key is read from standard input, not from the command line (where \
                     shell history and process listings would keep it): \
                     echo \"$KEY\" | agentid key disable"
                        .into(),
                );
            }
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

async fn audit_verify(
    db: DbArgs,
    checkpoints: Option<PathBuf>,
    log_key: Option<String>,
    signing_key_file: PathBuf,
    public_url: Option<String>,
    stale_after: Duration,
) -> CliResult {
    use agentid_engine::transparency::check as logcheck;
    let root = crate::keys::KeyRing::load(&signing_key_file)?;
    let verifier = match log_key {
        Some(k) => crate::tlog::note::LogVerifier::parse(&k)?,
        None => {
            let Some(keys) = &root else {
                return Err(format!(
                    "no signing key file at {} to derive the log key from: give --log-key (as \
                     /.well-known/log-key serves it) or --signing-key-file",
                    signing_key_file.display()
                )
                .into());
            };
            let url = public_url.unwrap_or_else(|| "http://127.0.0.1:8080".to_owned());
            let name = agentid_engine::transparency::checkpointer::log_key_name(crate::app::host_of(&url));
            keys.log_key(&name).verifier().clone()
        }
    };
    let given = match &checkpoints {
        Some(path) => crate::witness::notes_in(path)?,
        None => Vec::new(),
    };
    let store = open(&db).await?;
    let report = logcheck::check(&store, &verifier, &given, stale_after).await?;
    for l in &report.ledgers {
        let failed = report.failures.iter().filter(|f| f.ledger == l.ledger).count();
        let status = if failed == 0 { "ok     " } else { "FAILED " };
        println!(
            "{status} {}: {} records, {} checkpoints recomputed{}",
            l.ledger,
            l.records,
            l.checkpoints,
            if failed == 0 {
                String::new()
            } else {
                format!(", {failed} failures")
            }
        );
    }
    for f in &report.failures {
        println!("FAIL    {f}");
    }
    if !given.is_empty() {
        println!(
            "checked {} given checkpoints from {}",
            given.len(),
            checkpoints
                .as_ref()
                .map_or(String::new(), |p| p.display().to_string())
        );
    }
    // The signing keys: every recorded key must be one the key file vouches for.
    let unvouched = match &root {
        Some(root) => {
            let unvouched = admin::unvouched_signing_keys(&store, root).await?;
            if unvouched.is_empty() {
                println!("ok      signing keys: every recorded key is vouched for by the key file");
            }
            for u in &unvouched {
                println!("FAIL    {u}");
            }
            unvouched.len()
        }
        None => {
            println!(
                "skipped signing keys: no key file at {} to check them with",
                signing_key_file.display()
            );
            0
        }
    };
    // Who holds which issuer domain: every event vouched for, none missing, one holder a name.
    let holdings = match &root {
        Some(root) => {
            let failures = crate::engine::grants::check_holdings(&store, root).await?;
            if failures.is_empty() {
                println!("ok      issuer domains: every holding event is vouched for by the key file");
            }
            for f in &failures {
                println!("FAIL    {f}");
            }
            failures.len()
        }
        None => 0,
    };
    Ok(if report.ok() && unvouched == 0 && holdings == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

async fn audit_witness(w: crate::witness::Witness) -> CliResult {
    use crate::witness::WitnessError;
    match tokio::task::spawn_blocking(move || w.run()).await? {
        Ok(seen) => {
            match seen.previous {
                Some(p) => println!(
                    "ok: {} holds {} records, and extends the {p} seen before",
                    seen.origin, seen.size
                ),
                None => println!(
                    "ok: {} holds {} records (first checkpoint saved)",
                    seen.origin, seen.size
                ),
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(WitnessError::Log(m)) => {
            eprintln!("agentid audit witness: ALERT: {m}");
            Ok(ExitCode::from(1))
        }
        Err(WitnessError::Check(m)) => {
            eprintln!("agentid audit witness: cannot check: {m}");
            Ok(ExitCode::from(2))
        }
    }
}

async fn migrate(db: DbArgs, grant: Option<String>) -> CliResult {
    let url = &db.database_url;
    if url.starts_with("postgres:") || url.starts_with("postgresql:") {
        if let Some(role) = &grant {
            if !store::valid_role(role) {
                return Err(format!("--grant: {role:?} is not a plain role name").into());
            }
        }
        store::PgStore::migrate(url, grant.as_deref()).await?;
    } else {
        if grant.is_some() {
            return Err("--grant is for PostgreSQL (SQLite has no roles)".into());
        }
        let opts = StoreOptions {
            create: may_create(url),
            ..StoreOptions::default()
        };
        store::connect(url, &opts).await?.close().await;
    }
    println!(
        "migrated{}",
        grant.map_or(String::new(), |r| format!(
            "; granted role {r} what the service needs"
        ))
    );
    Ok(ExitCode::SUCCESS)
}

/// What every `agentid domain` command starts from: the database, the fleet's key file
/// (which seals and vouches for who holds a name) and, when named, the organization.
async fn operator(
    db: &DbArgs,
    keys: &KeyFileArgs,
    org: Option<&str>,
) -> Result<(SharedStore, crate::keys::KeyRing, Option<crate::store::OrgRecord>), Box<dyn std::error::Error>>
{
    use crate::engine::grants;
    let store = open(db).await?;
    let root = grants::fleet_key_file(&store, &keys.signing_key_file).await?;
    let org = match org {
        Some(o) => Some(grants::find_org(&store, o).await?),
        None => None,
    };
    Ok((store, root, org))
}

async fn domain(cmd: DomainCommand) -> CliResult {
    use crate::engine::grants;
    match cmd {
        DomainCommand::Approve {
            org,
            domain,
            force,
            keys,
            db,
        } => {
            let (store, root, org) = operator(&db, &keys, Some(&org)).await?;
            let org = org.expect("named");
            let held = grants::approve(&store, &root, &org, &domain, force).await?;
            println!(
                "{}",
                serde_json::json!({
                    "domain": held.holding.domain, "org_id": org.id, "method": held.holding.method.as_str(),
                    "verified_at": held.holding.at,
                    "taken_from": held.ended.iter().filter(|h| h.org_id != org.id)
                        .map(|h| serde_json::json!({"domain": h.domain, "org_id": h.org_id})).collect::<Vec<_>>(),
                    "revoked_agents": held.revoked.len(),
                })
            );
        }
        DomainCommand::List { org, keys, db } => {
            let (store, root, org) = operator(&db, &keys, org.as_deref()).await?;
            let listed = grants::list(&store, &root, org.as_ref()).await?;
            println!("{}", serde_json::to_string(&listed)?);
        }
        DomainCommand::Release {
            org,
            domain,
            keys,
            db,
        } => {
            let (store, root, org) = operator(&db, &keys, Some(&org)).await?;
            grants::release(&store, &root, &org.expect("named"), &domain).await?;
            println!("released (its agents keep their tokens until they expire, and get no new ones)");
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn signing_key(cmd: SigningKeyCommand) -> CliResult {
    match cmd {
        SigningKeyCommand::List { db } => {
            let store = open(&db).await?;
            println!("{}", serde_json::to_string(&admin::signing_keys(&store).await?)?);
        }
        SigningKeyCommand::Rotate {
            db,
            publish_for,
            signing_key_file,
        } => {
            let Some(root) = crate::keys::KeyRing::load(&signing_key_file)? else {
                return Err(admin::AdminError::NoKeyFile(signing_key_file.display().to_string()).into());
            };
            let store = open(&db).await?;
            let view = admin::rotate_signing_key(&store, &root, &signing_key_file, publish_for).await?;
            println!("{}", serde_json::to_string(&view)?);
        }
        SigningKeyCommand::Retire { kid, db } => {
            let store = open(&db).await?;
            admin::retire_signing_key(&store, &kid).await?;
            println!("retired {kid} (running instances refuse its tokens within 10 s)");
        }
    }
    Ok(ExitCode::SUCCESS)
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
