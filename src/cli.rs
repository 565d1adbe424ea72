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
    /// Inspect the audit log, or witness it.
    #[command(subcommand)]
    Audit(AuditCommand),
    /// Rotate the fleet's token signing keys.
    #[command(subcommand)]
    SigningKey(SigningKeyCommand),
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
    /// A ledger of the audit log that grew gets a new signed checkpoint at most this often,
    /// in milliseconds.
    #[arg(long, env = "AGENTID_CHECKPOINT_INTERVAL_MS", default_value_t = 10_000)]
    pub checkpoint_interval_ms: u64,
    /// Bytes of verified tokens (with their claims and answers) remembered; 0 disables the
    /// cache.
    #[arg(long, env = "AGENTID_TOKEN_CACHE_BYTES", default_value_t = 64 << 20)]
    pub token_cache_bytes: u64,
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
            default_value = "./data/signing-key.pem"
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
            default_value = "./data/signing-key.pem"
        )]
        signing_key_file: PathBuf,
        /// The service's public URL (its host names the log key) [default: http://127.0.0.1:8080]
        #[arg(long, env = "AGENTID_PUBLIC_URL")]
        public_url: Option<String>,
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
    },
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
        }) => audit_verify(db, checkpoints, log_key, signing_key_file, public_url).await,
        Command::Audit(AuditCommand::Witness {
            url,
            key,
            state,
            log_key,
        }) => {
            audit_witness(crate::witness::Witness {
                url,
                key,
                state,
                log_key,
            })
            .await
        }
        Command::Migrate { db, grant } => migrate(db, grant).await,
        Command::SigningKey(cmd) => signing_key(cmd).await,
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
            token_cache_bytes: args.token_cache_bytes,
            checkpoint_interval: Duration::from_millis(args.checkpoint_interval_ms.max(1)),
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

async fn audit_verify(
    db: DbArgs,
    checkpoints: Option<PathBuf>,
    log_key: Option<String>,
    signing_key_file: PathBuf,
    public_url: Option<String>,
) -> CliResult {
    use crate::engine::logcheck;
    let verifier = match log_key {
        Some(k) => crate::token::LogVerifier::parse(&k)?,
        None => {
            let Some(keys) = crate::token::KeyRing::load(&signing_key_file)? else {
                return Err(format!(
                    "no signing key file at {} to derive the log key from: give --log-key (as \
                     /.well-known/log-key serves it) or --signing-key-file",
                    signing_key_file.display()
                )
                .into());
            };
            let url = public_url.unwrap_or_else(|| "http://127.0.0.1:8080".to_owned());
            let name = crate::engine::transparency::log_key_name(crate::app::host_of(&url));
            keys.log_key(&name).verifier().clone()
        }
    };
    let given = match &checkpoints {
        Some(path) => read_notes(path)?,
        None => Vec::new(),
    };
    let store = open(&db).await?;
    let report = logcheck::check(&store, &verifier, &given).await?;
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
    Ok(if report.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The signed notes in a file (one or more, each ending after its signature lines) or in
/// every file of a folder.
fn read_notes(
    path: &std::path::Path,
) -> Result<Vec<crate::engine::logcheck::GivenNote>, Box<dyn std::error::Error>> {
    let mut files = Vec::new();
    if path.is_dir() {
        for entry in std::fs::read_dir(path)? {
            let p = entry?.path();
            // A witness's state folder also holds its pinned log key and, briefly, a file
            // being written.
            let skip = p.file_name().is_some_and(|n| n == crate::witness::LOG_KEY_FILE)
                || p.extension().is_some_and(|e| e == "tmp");
            if p.is_file() && !skip {
                files.push(p);
            }
        }
        files.sort();
    } else {
        files.push(path.to_owned());
    }
    let mut notes = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).map_err(|e| format!("{}: {e}", f.display()))?;
        // Notes follow one another: each is its text, an empty line, and signature lines.
        let mut current = String::new();
        let mut in_sigs = false;
        for line in text.split_inclusive('\n') {
            if in_sigs && !line.starts_with('\u{2014}') {
                notes.push(crate::engine::logcheck::GivenNote {
                    source: f.display().to_string(),
                    note: std::mem::take(&mut current),
                });
                in_sigs = false;
            }
            if line == "\n" && !current.is_empty() {
                in_sigs = true;
            }
            if !(current.is_empty() && line.trim().is_empty()) {
                current.push_str(line);
            }
        }
        if !current.trim().is_empty() {
            notes.push(crate::engine::logcheck::GivenNote {
                source: f.display().to_string(),
                note: current,
            });
        }
    }
    Ok(notes)
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
        open(&db).await?.close().await;
    }
    println!(
        "migrated{}",
        grant.map_or(String::new(), |r| format!(
            "; granted role {r} what the service needs"
        ))
    );
    Ok(ExitCode::SUCCESS)
}

async fn signing_key(cmd: SigningKeyCommand) -> CliResult {
    use crate::engine::signing::{states, KeyState, KeyView};
    let views = |keys: &[crate::store::SigningKeyRecord]| -> Vec<KeyView> {
        let (st, _) = states(keys, Millis::now());
        keys.iter()
            .zip(st)
            .map(|(k, state)| KeyView {
                kid: k.kid.clone(),
                state,
                created_at: k.created_at,
                activates_at: k.activates_at,
            })
            .collect()
    };
    match cmd {
        SigningKeyCommand::List { db } => {
            let store = open(&db).await?;
            println!("{}", serde_json::to_string(&views(&store.signing_keys().await?))?);
            Ok(ExitCode::SUCCESS)
        }
        SigningKeyCommand::Rotate {
            db,
            publish_for,
            signing_key_file,
        } => {
            let Some(root) = crate::token::KeyRing::load(&signing_key_file)? else {
                return Err(format!("no signing key file at {}", signing_key_file.display()).into());
            };
            let store = open(&db).await?;
            let recorded = store.signing_keys().await?;
            if !recorded.iter().any(|k| k.kid == root.kid()) {
                return Err(format!(
                    "{} is not this fleet's key file (its key {} is not recorded)",
                    signing_key_file.display(),
                    root.kid()
                )
                .into());
            }
            let key = ed25519_dalek::SigningKey::generate(&mut rand::rngs::OsRng);
            let kid = crate::token::thumbprint(&key.verifying_key());
            let sealed = root.seal_key(&kid, &key.to_bytes());
            let at = Millis(Millis::now().0 + publish_for.as_millis() as i64);
            let record = crate::store::SigningKeyRecord::new(
                kid.clone(),
                key.verifying_key().to_bytes(),
                Some(sealed),
                at,
            );
            store.add_signing_key(&record).await?;
            let all = store.signing_keys().await?;
            let view = views(&all)
                .into_iter()
                .find(|v| v.kid == kid)
                .expect("just added");
            println!("{}", serde_json::to_string(&view)?);
            Ok(ExitCode::SUCCESS)
        }
        SigningKeyCommand::Retire { kid, db } => {
            let store = open(&db).await?;
            let keys = store.signing_keys().await?;
            let (st, _) = states(&keys, Millis::now());
            let Some(i) = keys.iter().position(|k| k.kid == kid) else {
                eprintln!("agentid: no signing key {kid}");
                return Ok(ExitCode::FAILURE);
            };
            let active = st.iter().filter(|s| **s == KeyState::Active).count();
            if st[i] == KeyState::Active && active == 1 {
                eprintln!(
                    "agentid: {kid} is the only active key; rotate first (agentid signing-key rotate \
                     --publish-for 0s), then retire it"
                );
                return Ok(ExitCode::FAILURE);
            }
            if !store.retire_signing_key(&kid, Millis::now()).await? {
                eprintln!("agentid: {kid} is retired already");
                return Ok(ExitCode::FAILURE);
            }
            println!("retired {kid} (running instances refuse its tokens within 10 s)");
            Ok(ExitCode::SUCCESS)
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::{read_notes, Cli, Command, SigningKeyCommand};

    /// A kid is base64url and may begin with '-': it is still the kid, not a flag.
    #[test]
    fn a_kid_that_begins_with_a_dash_is_a_kid() {
        let cli = Cli::try_parse_from(["agentid", "signing-key", "retire", "-3abc_x"]).unwrap();
        match cli.command {
            Command::SigningKey(SigningKeyCommand::Retire { kid, .. }) => assert_eq!(kid, "-3abc_x"),
            other => panic!("{other:?}"),
        }
    }

    /// A file of several signed notes, with or without blank lines between them, gives each.
    #[test]
    fn a_file_of_notes_gives_each_note() {
        let key = crate::token::LogKey::derive("h/agentid", &[1; 32]);
        let note = |size| {
            key.sign(&crate::token::Checkpoint {
                origin: "h/agentid/org_1/live".into(),
                size,
                root: [size as u8; 32],
            })
        };
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("notes");
        std::fs::write(&file, format!("{}{}\n{}", note(1), note(2), note(3))).unwrap();
        let got: Vec<String> = read_notes(&file).unwrap().into_iter().map(|g| g.note).collect();
        assert_eq!(got, vec![note(1), note(2), note(3)]);
        for n in &got {
            key.verifier().open(n).unwrap();
        }
    }
}
