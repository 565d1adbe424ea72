//! `agentid serve`: its flags, each with an environment variable, and the service it starts.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, ValueEnum};

use super::{may_create, CliResult, DbArgs};
use crate::config::{self, Config};
use crate::engine::domains::{DomainConfig, IssuerPolicy};
use crate::engine::oauth::OAuthConfig;
use crate::engine::signed::SignedConfig;
use crate::engine::ssf::SsfConfig;
use crate::engine::status::StatusConfig;
use crate::engine::{EngineConfig, WriterConfig};
use crate::store::StoreOptions;
use crate::telemetry::{self, LogFormat};
use crate::Application;

#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    #[command(flatten)]
    pub(crate) db: DbArgs,
    /// Address to listen on.
    #[arg(long, env = "AGENTID_BIND", default_value = config::DEFAULT_BIND)]
    pub(crate) bind: String,
    /// Public base URL used in verify_url, public_key_url and docs_url, and the OAuth issuer
    /// identifier (the `iss` of access tokens) [default: http://BIND]
    #[arg(long, env = "AGENTID_PUBLIC_URL")]
    pub(crate) public_url: Option<String>,
    /// PKCS#8 PEM Ed25519 signing key; created (mode 0600) when absent.
    #[arg(
        long,
        env = "AGENTID_SIGNING_KEY_FILE",
        default_value = config::DEFAULT_SIGNING_KEY_FILE
    )]
    pub(crate) signing_key_file: PathBuf,
    /// Prometheus metrics listener ("off" disables it).
    #[arg(long, env = "AGENTID_METRICS_BIND", default_value = config::DEFAULT_METRICS_BIND)]
    pub(crate) metrics_bind: String,
    /// Log format on stderr.
    #[arg(long, env = "AGENTID_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub(crate) log_format: LogFormat,
    /// HTTP worker threads, 1 to 512 [default: one per CPU]
    #[arg(long, env = "AGENTID_WORKERS", value_parser = clap::value_parser!(u16).range(1..=512))]
    pub(crate) workers: Option<u16>,
    /// Balancers in front of the service, as CIDRs (e.g. 10.0.0.0/8,::1/128): only a peer in
    /// one of them is believed about the client's address (X-Forwarded-For, Forwarded).
    #[arg(long, env = "AGENTID_TRUSTED_PROXIES", default_value = "")]
    pub(crate) trusted_proxies: String,
    /// Gateways that call /v1/forward-auth, as CIDRs: only from a peer in one of them are
    /// X-Forwarded-Method/-Uri and X-Original-Method/-URL read (the request the call checks).
    #[arg(
        long,
        env = "AGENTID_FORWARD_AUTH_TRUSTED_PEERS",
        default_value = "127.0.0.0/8,::1/128"
    )]
    pub(crate) forward_auth_trusted_peers: String,
    /// After SIGTERM, SIGINT or SIGQUIT: seconds the instance goes on serving while /health
    /// answers 503 "draining" (so that a balancer moves its traffic), before it stops
    /// accepting, finishes what is in flight and exits.
    #[arg(long, env = "AGENTID_SHUTDOWN_DRAIN_SECONDS", default_value_t = Config::new(config::DEFAULT_DATABASE_URL).shutdown_drain.as_secs(),
          value_parser = clap::value_parser!(u64).range(0..=3600))]
    pub(crate) shutdown_drain_seconds: u64,
    /// Most audit records written in one transaction (1 to 65536).
    #[arg(long, env = "AGENTID_AUDIT_BATCH_MAX", default_value_t = WriterConfig::default().max_batch as u64,
          value_parser = clap::value_parser!(u64).range(1..=65_536))]
    pub(crate) audit_batch_max: u64,
    /// How long a partly filled audit batch waits for more records, in milliseconds (at most
    /// 1000: every verification waits as long).
    #[arg(long, env = "AGENTID_AUDIT_LINGER_MS", default_value_t = WriterConfig::default().linger.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(0..=1000))]
    pub(crate) audit_linger_ms: u64,
    /// Database connections (1 to 1000; at least 2 on PostgreSQL, at most 8 on SQLite).
    #[arg(long, env = "AGENTID_DB_MAX_CONNECTIONS", default_value_t = StoreOptions::default().max_connections,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub(crate) db_max_connections: u32,
    /// How long a write waits for the database to take writes again (a failover, a
    /// switchover) before it is answered 503, in seconds (0 to 60).
    #[arg(long, env = "AGENTID_DB_OUTAGE_WAIT_SECONDS", default_value_t = StoreOptions::default().outage_wait.as_secs(),
          value_parser = clap::value_parser!(u64).range(0..=60))]
    pub(crate) db_outage_wait_seconds: u64,
    /// The longest a statement may run on PostgreSQL, a wait for a lock included, before it
    /// is cancelled and its call answered 503, in seconds (0, none, to 3600). Migrations run
    /// without it.
    #[arg(long, env = "AGENTID_DB_STATEMENT_TIMEOUT_SECONDS", default_value_t = StoreOptions::default().statement_timeout.as_secs(),
          value_parser = clap::value_parser!(u64).range(0..=3600))]
    pub(crate) db_statement_timeout_seconds: u64,
    /// A ledger of the audit log that grew gets a new signed checkpoint at most this often,
    /// in milliseconds (1 to 86400000, a day).
    #[arg(long, env = "AGENTID_CHECKPOINT_INTERVAL_MS", default_value_t = EngineConfig::default().checkpoint_interval.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(1..=86_400_000))]
    pub(crate) checkpoint_interval_ms: u64,
    /// Bytes of verified tokens (with their claims and answers) remembered; 0 disables the
    /// cache.
    #[arg(long, env = "AGENTID_TOKEN_CACHE_BYTES", default_value_t = EngineConfig::default().token_cache_bytes)]
    pub(crate) token_cache_bytes: u64,
    /// Bytes the in-memory registry's agents and cached revocation reasons may take, about:
    /// an agent registered past them is read from the database at each verification of its
    /// tokens.
    #[arg(long, env = "AGENTID_REGISTRY_BYTES", default_value_t = EngineConfig::default().registry_bytes)]
    pub(crate) registry_bytes: u64,
    /// How far a DPoP proof's `iat` may be from now, either way, in seconds (1 to 3600); each
    /// instance remembers proofs this long, so replays are refused.
    #[arg(long, env = "AGENTID_DPOP_MAX_SKEW_SECONDS", default_value_t = EngineConfig::default().dpop_max_skew.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub(crate) dpop_max_skew_seconds: u64,
    /// How long an access token from the OAuth token endpoint lives, in seconds (60 to 3600).
    #[arg(long, env = "AGENTID_ACCESS_TOKEN_SECONDS", default_value_t = OAuthConfig::default().access_token_lifetime.as_secs(),
          value_parser = clap::value_parser!(u64).range(60..=3600))]
    pub(crate) access_token_seconds: u64,
    /// The most agents a delegation chain may hold: a person's agent is 1, an agent it hands
    /// the task to 2, and so on (1 to 16).
    #[arg(long, env = "AGENTID_MAX_DELEGATION_DEPTH", default_value_t = OAuthConfig::default().max_delegation_depth as u8,
          value_parser = clap::value_parser!(u8).range(1..=16))]
    pub(crate) max_delegation_depth: u8,
    /// Identity providers' jwks_uri may resolve to loopback and private addresses
    /// (development and tests only: an organization could otherwise reach internal hosts).
    #[arg(long, env = "AGENTID_IDENTITY_PROVIDER_KEYS_ALLOW_LOCAL", value_parser = clap::builder::BoolishValueParser::new(), default_value_t = false)]
    pub(crate) identity_provider_keys_allow_local: bool,
    /// Third parties' signature directories (Web Bot Auth) may be http:// and resolve to
    /// loopback and private addresses (development and tests only).
    #[arg(long, env = "AGENTID_SIGNATURE_DIRECTORIES_ALLOW_LOCAL", value_parser = clap::builder::BoolishValueParser::new(), default_value_t = false)]
    pub(crate) signature_directories_allow_local: bool,
    /// Create no organization on a first start. Without it, a first start on an empty
    /// database creates one and prints its keys (to stdout, which a service manager may keep
    /// in its logs); with it, create organizations with `agentid org create`.
    #[arg(long, env = "AGENTID_NO_DEFAULT_ORG", value_parser = clap::builder::BoolishValueParser::new(), default_value_t = false)]
    pub(crate) no_default_org: bool,
    /// Places of each Token Status List (a multiple of 8, up to 16777216); a new list opens
    /// once half of the newest one's places are taken.
    #[arg(long, env = "AGENTID_STATUS_LIST_SIZE", default_value_t = StatusConfig::default().size,
          value_parser = parse_list_size)]
    pub(crate) status_list_size: u64,
    /// How long receivers may cache a status list, in seconds (its `ttl` and `max-age`).
    #[arg(long, env = "AGENTID_STATUS_LIST_TTL", default_value_t = StatusConfig::default().ttl.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub(crate) status_list_ttl: u64,
    /// Allow Shared Signals push endpoints on http:// and on loopback or private addresses
    /// (development and tests only: a stream's owner could otherwise reach internal hosts).
    #[arg(long, env = "AGENTID_SSF_ALLOW_INSECURE_ENDPOINTS", value_parser = clap::builder::BoolishValueParser::new(), default_value_t = false)]
    pub(crate) ssf_allow_insecure_endpoints: bool,
    /// How long an instance holds a Shared Signals push stream it delivers, in seconds (at
    /// least 17: a pass looks its endpoint up, up to 5 s, before a push, which may take 10);
    /// after a crash its events wait this long.
    #[arg(long, env = "AGENTID_SSF_LEASE_SECONDS", default_value_t = SsfConfig::default().lease.as_secs(),
          value_parser = clap::value_parser!(u64).range(17..=3600))]
    pub(crate) ssf_lease_seconds: u64,
    /// Who may issue under an issuer domain: `verified`, only an organization that proved
    /// the name (or that the operator granted it); `open`, anyone, for single-tenant and
    /// development deployments (a token's issuer then proves nothing).
    #[arg(long, env = "AGENTID_ISSUER_DOMAINS", value_enum, default_value_t = IssuerDomainsArg::Verified)]
    pub(crate) issuer_domains: IssuerDomainsArg,
    /// The DNS server the service looks names up at (issuer-domain checks, Shared Signals push
    /// endpoints), as IP:PORT [default: the system's resolver]
    #[arg(long, env = "AGENTID_DNS_RESOLVER")]
    pub(crate) dns_resolver: Option<std::net::SocketAddr>,
    /// Let issuer-domain checks reach loopback and private addresses, and fetch
    /// http://<domain>/.well-known/agentid-domain-verification (port 80) when HTTPS fails
    /// (development and tests only).
    #[arg(long, env = "AGENTID_DOMAIN_VERIFICATION_ALLOW_INSECURE", value_parser = clap::builder::BoolishValueParser::new(), default_value_t = false)]
    pub(crate) domain_verification_allow_insecure: bool,
    /// The port an https:// URL without one connects to (443), so that an HTTPS domain proof
    /// can be tried on a development machine. Only with --domain-verification-allow-insecure;
    /// Shared Signals push endpoints without a port go there too.
    #[arg(long, env = "AGENTID_DOMAIN_VERIFICATION_HTTPS_PORT")]
    pub(crate) domain_verification_https_port: Option<u16>,
    /// As --domain-verification-https-port, for the http:// fallback (80).
    #[arg(long, env = "AGENTID_DOMAIN_VERIFICATION_HTTP_PORT")]
    pub(crate) domain_verification_http_port: Option<u16>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum IssuerDomainsArg {
    Verified,
    Open,
}

/// A WARN line at start for each setting that is for development only.
fn insecure_warnings(args: &ServeArgs) {
    if args.domain_verification_allow_insecure {
        tracing::warn!(
            "--domain-verification-allow-insecure: domain proofs may reach loopback and private \
             addresses and fall back to http:// (development only)"
        );
    }
    if let Some(port) = args.domain_verification_https_port {
        tracing::warn!(
            port,
            "--domain-verification-https-port: https:// URLs without a port connect here (development only)"
        );
    }
    if let Some(port) = args.domain_verification_http_port {
        tracing::warn!(
            port,
            "--domain-verification-http-port: http:// URLs without a port connect here (development only)"
        );
    }
    if args.ssf_allow_insecure_endpoints {
        tracing::warn!(
            "--ssf-allow-insecure-endpoints: Shared Signals push endpoints may be http:// and on \
             loopback or private addresses (development only)"
        );
    }
    if args.identity_provider_keys_allow_local {
        tracing::warn!(
            "--identity-provider-keys-allow-local: identity providers' jwks_uri may reach loopback and \
             private addresses (development only)"
        );
    }
    if args.signature_directories_allow_local {
        tracing::warn!(
            "--signature-directories-allow-local: third parties' signature directories may be http:// \
             and on loopback and private addresses (development only)"
        );
    }
    // `--issuer-domains open` is warned of by the engine as it starts.
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
fn parse_nets(flag: &str, list: &str) -> Result<Vec<ipnet::IpNet>, String> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<ipnet::IpNet>()
                .or_else(|_| s.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                .map_err(|_| format!("{flag}: {s:?} is not a CIDR network like 10.0.0.0/8, nor an address"))
        })
        .collect()
}

pub(super) async fn serve(args: ServeArgs) -> CliResult {
    telemetry::init(args.log_format);
    let ports = (
        args.domain_verification_https_port,
        args.domain_verification_http_port,
    );
    if ports != (None, None) && !args.domain_verification_allow_insecure {
        return Err(
            "--domain-verification-https-port and --domain-verification-http-port are for \
                    development: they take --domain-verification-allow-insecure too"
                .into(),
        );
    }
    insecure_warnings(&args);
    let metrics_bind = (args.metrics_bind != "off").then_some(args.metrics_bind);
    let cfg = Config {
        bind: args.bind,
        public_url: args.public_url,
        signing_key_file: args.signing_key_file,
        metrics_bind,
        workers: args.workers.map(usize::from),
        trusted_proxies: parse_nets("--trusted-proxies", &args.trusted_proxies)?,
        forward_auth_trusted_peers: parse_nets(
            "--forward-auth-trusted-peers",
            &args.forward_auth_trusted_peers,
        )?,
        dns_resolver: args.dns_resolver,
        outbound_ports: ports,
        engine: EngineConfig {
            writer: WriterConfig {
                max_batch: args.audit_batch_max as usize,
                linger: Duration::from_millis(args.audit_linger_ms),
                // A batch may wait out an outage: the flush outlasts that wait.
                flush_timeout: WriterConfig::default()
                    .flush_timeout
                    .max(Duration::from_secs(args.db_outage_wait_seconds + 2)),
                ..WriterConfig::default()
            },
            token_cache_bytes: args.token_cache_bytes,
            registry_bytes: args.registry_bytes,
            dpop_max_skew: Duration::from_secs(args.dpop_max_skew_seconds),
            oauth: OAuthConfig {
                access_token_lifetime: Duration::from_secs(args.access_token_seconds),
                max_delegation_depth: usize::from(args.max_delegation_depth),
                allow_local_provider_keys: args.identity_provider_keys_allow_local,
            },
            signed: SignedConfig {
                allow_local_directories: args.signature_directories_allow_local,
            },
            checkpoint_interval: Duration::from_millis(args.checkpoint_interval_ms.max(1)),
            status: StatusConfig {
                size: args.status_list_size,
                ttl: Duration::from_secs(args.status_list_ttl),
            },
            ssf: SsfConfig {
                allow_insecure_endpoints: args.ssf_allow_insecure_endpoints,
                lease: Duration::from_secs(args.ssf_lease_seconds),
                ..SsfConfig::default()
            },
            domains: DomainConfig::new(
                match args.issuer_domains {
                    IssuerDomainsArg::Verified => IssuerPolicy::Verified,
                    IssuerDomainsArg::Open => IssuerPolicy::Open,
                },
                args.domain_verification_allow_insecure,
            ),
            ..EngineConfig::default()
        },
        store: StoreOptions {
            max_connections: args.db_max_connections.max(1),
            outage_wait: Duration::from_secs(args.db_outage_wait_seconds),
            statement_timeout: Duration::from_secs(args.db_statement_timeout_seconds),
            create: may_create(&args.db.database_url),
            serve_lock: true,
            ..StoreOptions::default()
        },
        shutdown_drain: Duration::from_secs(args.shutdown_drain_seconds),
        bootstrap: !args.no_default_org,
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
