//! Wiring: key ring, store, engine and HTTP server. Tests build the same application on
//! port 0 with their own database.

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_web::dev::{Server, ServerHandle};
use actix_web::{web, HttpServer};

use crate::config::Config;
use crate::domain::Plan;
use crate::engine::admin::{self, AdminError, CreatedOrg};
use crate::engine::outbound::{Outbound, OutboundConfig};
use crate::engine::{Engine, EngineConfig};
use crate::http::{self, AppState};
use crate::keys::KeyError;
use crate::store::{self, StoreError};

/// Connections the kernel completes and queues for the server before it accepts them (the
/// kernel caps it at `net.core.somaxconn`; actix-server's own default). The standard
/// library's 128 made a burst of new connections (a load balancer's, or a load test's ~170
/// at once) lose SYNs, and those clients waited a full second for their retransmit.
pub(crate) const LISTEN_BACKLOG: i32 = 2048;

/// Binds `addr` and listens with [`LISTEN_BACKLOG`].
fn listen(addr: &str) -> std::io::Result<TcpListener> {
    let listener = TcpListener::bind(addr)?;
    // On Linux, listening again on a listening socket only changes its backlog.
    socket2::SockRef::from(&listener).listen(LISTEN_BACKLOG)?;
    Ok(listener)
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Key(#[from] KeyError),
    /// The fleet's signing key does not match the key file (`AdminError::FleetKey…`).
    #[error(transparent)]
    Admin(AdminError),
    #[error("cannot open the database: {0}")]
    Store(#[from] StoreError),
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
    #[error("cannot handle signals: {source}")]
    Signals { source: std::io::Error },
    /// Listening on every address with no public URL: the service would name itself
    /// `http://0.0.0.0:…` in every answer, as its OAuth issuer and in its log key's name.
    #[error(
        "listening on every address ({addr}) needs --public-url (AGENTID_PUBLIC_URL): the URL \
         clients reach the service at, which verify_url, the OAuth issuer and the log key's \
         name are made of"
    )]
    NoPublicUrl { addr: std::net::SocketAddr },
}

/// The bootstrap's key and store errors read as the start's own.
impl From<AdminError> for StartError {
    fn from(e: AdminError) -> Self {
        match e {
            AdminError::Key(e) => StartError::Key(e),
            AdminError::Store(e) => StartError::Store(e),
            other => StartError::Admin(other),
        }
    }
}

/// The stop signals: SIGTERM, SIGINT and SIGQUIT (handlers installed when this is made, not
/// at the first poll). All three stop gracefully: the framework's own handlers stopped at
/// once on SIGQUIT, but a verify in flight is cheap to finish and its answer is recorded.
struct StopSignals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
}

impl StopSignals {
    fn install() -> std::io::Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(StopSignals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            quit: signal(SignalKind::quit())?,
        })
    }

    /// The next stop signal's name.
    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
            _ = self.quit.recv() => "SIGQUIT",
        }
    }

    /// Resolves when the instance should stop accepting: `drain` after the first signal, in
    /// which the instance goes on serving while `/health` says it is draining (so that a
    /// balancer stops sending it new calls), or at a second signal.
    async fn drained(mut self, draining: Arc<AtomicBool>, drain: Duration) {
        let first = self.next().await;
        draining.store(true, Ordering::SeqCst);
        tracing::info!("{first}: draining for {drain:?}, then stopping gracefully");
        tokio::select! {
            _ = tokio::time::sleep(drain) => {}
            second = self.next() => tracing::info!("{second}: stopping now"),
        }
        // The handlers stay installed for the life of the process: without this, every signal
        // from here on went unheard, and an operator could not stop an instance whose graceful
        // stop hung (a database gone) but with SIGKILL. What was answered was recorded first.
        actix_web::rt::spawn(async move {
            let last = self.next().await;
            tracing::warn!("{last}: exiting at once, without finishing what is under way");
            std::process::exit(1);
        });
    }
}

/// The default organization, made when `cfg` asks for one and the store has none.
async fn bootstrap(cfg: &Config, engine: &Engine) -> Result<Option<CreatedOrg>, StartError> {
    if !cfg.bootstrap || engine.store().count_orgs().await? != 0 {
        return Ok(None);
    }
    let plan = Plan::Developer;
    let limits = plan.default_limits().expect("developer has defaults");
    Ok(admin::create_first_org(engine.store(), engine.keys(), "default", plan, limits).await?)
}

pub struct Application {
    addr: SocketAddr,
    metrics: Option<(SocketAddr, ServerHandle)>,
    public_url: String,
    server: Server,
    engine: Arc<Engine>,
    /// Set when this start created the signing key.
    pub created_signing_key: bool,
    /// Set when this start created the default organization (its keys are shown once).
    pub bootstrapped: Option<CreatedOrg>,
}

impl Application {
    /// Opens everything and starts accepting connections. Must run inside an actix system.
    pub async fn build(cfg: Config) -> Result<Application, StartError> {
        let defaults = OutboundConfig::default();
        let outbound = Outbound::new(OutboundConfig {
            dns_server: cfg.dns_resolver,
            https_port: cfg.outbound_ports.0.unwrap_or(defaults.https_port),
            http_port: cfg.outbound_ports.1.unwrap_or(defaults.http_port),
            ..defaults
        });
        Self::build_with(cfg, outbound).await
    }

    /// As [`Application::build`], with the outbound client given (the tests' resolver, roots
    /// and ports).
    pub async fn build_with(cfg: Config, outbound: Outbound) -> Result<Application, StartError> {
        crate::telemetry::metrics_handle();
        // Both addresses first: a port in use (say, a second instance) must fail before a
        // default organization is created (its keys would never be shown) or any actor starts.
        let bind_err = |addr: &str| {
            let addr = addr.to_owned();
            move |source| StartError::Bind { addr, source }
        };
        let listener = listen(&cfg.bind).map_err(bind_err(&cfg.bind))?;
        let addr = listener.local_addr().map_err(bind_err(&cfg.bind))?;
        if cfg.public_url.is_none() && addr.ip().is_unspecified() {
            return Err(StartError::NoPublicUrl { addr });
        }
        let metrics_listener = match &cfg.metrics_bind {
            Some(bind) => Some((bind, listen(bind).map_err(bind_err(bind))?)),
            None => None,
        };
        let store = store::connect(&cfg.database_url, &cfg.store).await?;
        let (keys, created_signing_key) = admin::fleet_signing_key(&store, &cfg.signing_key_file).await?;
        let public_url = cfg
            .public_url
            .clone()
            .unwrap_or_else(|| format!("http://{addr}"))
            .trim_end_matches('/')
            .to_owned();
        let engine_cfg = EngineConfig {
            log_host: host_of(&public_url).to_owned(),
            public_url: public_url.clone(),
            ..cfg.engine.clone()
        };
        let engine = Arc::new(Engine::start(store, Arc::new(keys), engine_cfg, outbound).await?);
        let draining = Arc::new(AtomicBool::new(false));
        let state = web::Data::new(AppState {
            engine: engine.clone(),
            public_url: public_url.clone(),
            trusted_proxies: cfg.trusted_proxies.clone(),
            forward_auth_peers: cfg.forward_auth_trusted_peers.clone(),
            draining: draining.clone(),
        });
        let mut server = HttpServer::new(move || http::app(state.clone()))
            .shutdown_timeout(cfg.shutdown_timeout.as_secs())
            .listen(listener)
            .map_err(bind_err(&cfg.bind))?;
        if let Some(n) = cfg.workers {
            server = server.workers(n.max(1));
        }
        server = if cfg.handle_signals {
            let signals = StopSignals::install().map_err(|source| StartError::Signals { source })?;
            // Graceful, after the drain: accepting stops, the workers finish their requests,
            // then stop.
            server.shutdown_signal(signals.drained(draining, cfg.shutdown_drain))
        } else {
            server.disable_signals()
        };
        let metrics = match metrics_listener {
            Some((bind, listener)) => {
                let (addr, server) = crate::telemetry::serve_metrics(listener).map_err(bind_err(bind))?;
                let handle = server.handle();
                // A server runs only while its future is polled.
                actix_web::rt::spawn(server);
                Some((addr, handle))
            }
            None => None,
        };
        // Last of what can fail: a default organization made before a step that fails would
        // have keys no one was shown, and the next start makes none.
        let bootstrapped = match bootstrap(&cfg, &engine).await {
            Ok(made) => made,
            Err(e) => {
                // Nothing runs on: the metrics listener stops with the start that failed.
                if let Some((_, handle)) = &metrics {
                    handle.stop(false).await;
                }
                return Err(e);
            }
        };
        let server = server.run();
        Ok(Application {
            addr,
            metrics,
            public_url,
            server,
            engine,
            created_signing_key,
            bootstrapped,
        })
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where `GET /metrics` is served, when it is.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(|m| m.0)
    }

    pub fn public_url(&self) -> &str {
        &self.public_url
    }

    pub fn handle(&self) -> ServerHandle {
        self.server.handle()
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// Serves until stopped (signal or handle), then commits every pending audit record
    /// and closes the store.
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let result = self.server.await;
        self.engine.stop().await;
        self.engine.store().close().await;
        if let Some((_, metrics)) = self.metrics {
            metrics.stop(true).await;
        }
        tracing::info!("stopped");
        result
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpStream;
    use std::time::Duration;

    /// Nothing accepts here, so every connection that completes waits in the accept queue.
    /// With a backlog of 128, connection 130 or so would lose its SYN and wait a second
    /// for the retransmit, far past the timeout.
    #[test]
    fn a_burst_of_connections_is_queued_before_any_is_accepted() {
        let cap = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok());
        if cap.is_some_and(|c| c < 600) {
            eprintln!("skipped: the kernel caps every backlog at net.core.somaxconn = {cap:?}");
            return;
        }
        let listener = super::listen("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let queued: Vec<TcpStream> = (0..600)
            .map(|i| {
                TcpStream::connect_timeout(&addr, Duration::from_millis(500))
                    .unwrap_or_else(|e| panic!("connection {i} was not queued: {e}"))
            })
            .collect();
        assert_eq!(queued.len(), 600);
    }
}

/// The host of a URL: no scheme, user, port or path (`https://id.example.com:8443/x` →
/// `id.example.com`; an IPv6 address keeps its brackets).
pub fn host_of(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if host.starts_with('[') {
        return host.split_inclusive(']').next().unwrap_or(host);
    }
    host.split(':').next().unwrap_or(host)
}

#[cfg(test)]
mod host_tests {
    #[test]
    fn hosts_of_public_urls() {
        for (url, host) in [
            ("https://id.example.com", "id.example.com"),
            ("https://id.example.com:8443/base", "id.example.com"),
            ("http://user:pw@127.0.0.1:8080", "127.0.0.1"),
            ("http://[::1]:8080/", "[::1]"),
            ("id.example.com", "id.example.com"),
        ] {
            assert_eq!(super::host_of(url), host, "{url}");
        }
    }
}
