//! Settings of `agentid serve`: defaults, environment variables and flags meet here (see
//! `cli/serve.rs` for the names). Secrets in URLs are never printed.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::engine::EngineConfig;
use crate::store::StoreOptions;

/// Defaults of `serve` (its flags name these, so each is written once).
pub(crate) const DEFAULT_BIND: &str = "127.0.0.1:8080";
pub(crate) const DEFAULT_DATABASE_URL: &str = "sqlite://./data/agentid.db";
pub(crate) const DEFAULT_SIGNING_KEY_FILE: &str = "./data/signing-key.pem";
pub(crate) const DEFAULT_METRICS_BIND: &str = "127.0.0.1:9464";

#[derive(Clone)]
pub struct Config {
    /// Address to listen on, e.g. `127.0.0.1:8080` (port 0 picks a free port).
    pub bind: String,
    pub database_url: String,
    /// `{base_url}`; defaults to `http://` + the bound address.
    pub public_url: Option<String>,
    pub signing_key_file: PathBuf,
    /// Prometheus listener; `None` disables it.
    pub metrics_bind: Option<String>,
    /// HTTP worker threads; `None` means one per CPU.
    pub workers: Option<usize>,
    /// Peers (balancers) whose `X-Forwarded-For` / `Forwarded` name the client.
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// Gateways whose `X-Forwarded-Method`/`-Uri` and `X-Original-Method`/`-URL` name the
    /// request a forward-auth call checks (read on that route only).
    pub forward_auth_trusted_peers: Vec<ipnet::IpNet>,
    /// Audit writer, verified-token cache, registry resync.
    pub engine: EngineConfig,
    /// The DNS server outbound connections look names up at (`None`: the system's).
    pub dns_resolver: Option<std::net::SocketAddr>,
    /// Where an outbound `https://` / `http://` URL without a port connects (`None`: 443 and
    /// 80). For trying domain proofs on a development machine; `serve` allows them only with
    /// `--domain-verification-allow-insecure`.
    pub outbound_ports: (Option<u16>, Option<u16>),
    pub store: StoreOptions,
    /// Create a default organization when the store has none.
    pub bootstrap: bool,
    /// Stop gracefully on SIGTERM / SIGINT (off in tests, which run many servers).
    pub handle_signals: bool,
    pub(crate) shutdown_timeout: Duration,
    /// After a stop signal: how long the instance goes on serving, `/health` answering 503
    /// `draining`, before it stops accepting.
    pub(crate) shutdown_drain: Duration,
}

/// 127.0.0.0/8 and ::1: a gateway on the same machine.
pub(crate) fn loopback() -> Vec<ipnet::IpNet> {
    vec![
        "127.0.0.0/8".parse().expect("a network"),
        "::1/128".parse().expect("a network"),
    ]
}

impl Config {
    /// The defaults, for the given database.
    pub fn new(database_url: impl Into<String>) -> Self {
        Config {
            bind: DEFAULT_BIND.into(),
            database_url: database_url.into(),
            public_url: None,
            signing_key_file: PathBuf::from(DEFAULT_SIGNING_KEY_FILE),
            metrics_bind: Some(DEFAULT_METRICS_BIND.into()),
            workers: None,
            trusted_proxies: Vec::new(),
            forward_auth_trusted_peers: loopback(),
            engine: EngineConfig::default(),
            dns_resolver: None,
            outbound_ports: (None, None),
            store: StoreOptions::default(),
            bootstrap: true,
            handle_signals: true,
            shutdown_timeout: Duration::from_secs(10),
            shutdown_drain: Duration::from_secs(5),
        }
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("bind", &self.bind)
            .field("database_url", &redact_url(&self.database_url))
            .field("public_url", &self.public_url)
            .field("signing_key_file", &self.signing_key_file)
            .field("metrics_bind", &self.metrics_bind)
            .field("workers", &self.workers)
            .field("trusted_proxies", &self.trusted_proxies)
            .field("forward_auth_trusted_peers", &self.forward_auth_trusted_peers)
            .field("engine", &self.engine)
            .field("dns_resolver", &self.dns_resolver)
            .field("outbound_ports", &self.outbound_ports)
            .finish_non_exhaustive()
    }
}

/// The URL with any password replaced by `***`: in the user part (`user:pass@`) and in the
/// query string (`?password=…`, `sslpassword=…`, any parameter whose name holds "password").
pub(crate) fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, path) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{user}:***@{host}"),
            None => authority.to_owned(),
        },
        None => authority.to_owned(),
    };
    let path = match path.split_once('?') {
        Some((path, query)) => {
            let params: Vec<String> = query
                .split('&')
                .map(|p| match p.split_once('=') {
                    Some((k, _)) if k.to_ascii_lowercase().contains("password") => format!("{k}=***"),
                    _ => p.to_owned(),
                })
                .collect();
            format!("{path}?{}", params.join("&"))
        }
        None => path.to_owned(),
    };
    format!("{scheme}://{authority}{path}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_print() {
        assert_eq!(
            redact_url("postgres://u:secret@db:5432/x"),
            "postgres://u:***@db:5432/x"
        );
        assert_eq!(redact_url("postgres://u@db/x"), "postgres://u@db/x");
        assert_eq!(redact_url("sqlite://./data/a.db"), "sqlite://./data/a.db");
        assert_eq!(
            redact_url("postgres://db/x?user=u&password=hunter2&sslmode=require"),
            "postgres://db/x?user=u&password=***&sslmode=require"
        );
        assert_eq!(
            redact_url("postgres://u:a@db?sslpassword=b&PassWord=c"),
            "postgres://u:***@db?sslpassword=***&PassWord=***"
        );
        let cfg = Config::new("postgres://u:hunter2@h/d");
        assert!(!format!("{cfg:?}").contains("hunter2"));
        let cfg = Config::new("postgres://u@h/d?password=hunter2");
        assert!(!format!("{cfg:?}").contains("hunter2"));
    }
}
