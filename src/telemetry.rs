//! Logs and metrics. Logs: `RUST_LOG` filter, text or JSON lines on stderr (text in colour
//! only on a terminal, and not with `NO_COLOR` set). Metrics: one
//! Prometheus recorder per process, served on its own listener (`AGENTID_METRICS_BIND`),
//! never on the public port. The metric names are listed in docs/operations.md and used by
//! `grafana/dashboards/agentid.json` (a test checks that every series there is exported).

use std::io::IsTerminal;

use actix_web::{web, HttpResponse, HttpServer};
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// The process's Prometheus recorder (the engine installs it).
pub use agentid_engine::recorder::handle as metrics_handle;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Default)]
pub(crate) enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Installs the global subscriber once; later calls (tests) are ignored.
pub(crate) fn init(format: LogFormat) {
    init_at(format, LevelFilter::INFO);
}

/// The subscriber of the commands other than `serve`: warnings and errors only (an integrity
/// alarm that a command's reading of the database raises among them), their output being
/// what they print.
pub(crate) fn init_command() {
    init_at(LogFormat::Text, LevelFilter::WARN);
}

/// `RUST_LOG`'s filter, or `default` for everything. A `RUST_LOG` that does not read is said
/// so on stderr, not silently replaced.
fn filter(default: LevelFilter) -> Targets {
    match std::env::var("RUST_LOG") {
        Ok(v) => match v.parse::<Targets>() {
            Ok(t) => t,
            Err(e) => {
                eprintln!(
                    "agentid: RUST_LOG={v:?} does not read ({e}; e.g. info, or agentid=debug,sqlx=warn): \
                     logging at {default}"
                );
                Targets::new().with_default(default)
            }
        },
        Err(_) => Targets::new().with_default(default),
    }
}

fn init_at(format: LogFormat, default: LevelFilter) {
    let filter = filter(default);
    let colour = colour(std::io::stderr().is_terminal(), std::env::var_os("NO_COLOR"));
    // The builder's own filter lets everything through: `filter` decides.
    let builder = tracing_subscriber::fmt()
        .with_max_level(LevelFilter::TRACE)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.finish().with(filter).try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .finish()
            .with(filter)
            .try_init(),
    };
}

/// Text logs carry colour escapes only for a person at a terminal: a file, a pipe or a log
/// collector would store them as noise. A non-empty `NO_COLOR` turns them off everywhere
/// (no-color.org).
fn colour(stderr_is_terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    stderr_is_terminal && !matches!(no_color, Some(v) if !v.is_empty())
}

/// Serves `GET /metrics` on its own listener. Returns the bound address and the server.
pub(crate) fn serve_metrics(
    listener: std::net::TcpListener,
) -> std::io::Result<(std::net::SocketAddr, actix_web::dev::Server)> {
    let handle = metrics_handle();
    let addr = listener.local_addr()?;
    let server = HttpServer::new(move || {
        actix_web::App::new().route(
            "/metrics",
            web::get().to(move || async move {
                handle.run_upkeep();
                HttpResponse::Ok()
                    .content_type("text/plain; version=0.0.4; charset=utf-8")
                    .body(handle.render())
            }),
        )
    })
    .workers(1)
    .disable_signals()
    .shutdown_timeout(1)
    .listen(listener)?
    .run();
    Ok((addr, server))
}

#[cfg(test)]
mod tests {
    use super::colour;

    #[test]
    fn text_logs_are_in_colour_only_on_a_terminal_without_no_color() {
        assert!(colour(true, None));
        assert!(colour(true, Some("".into())), "an empty NO_COLOR is unset");
        assert!(!colour(true, Some("1".into())));
        assert!(!colour(false, None), "a file or a pipe gets plain text");
        assert!(!colour(false, Some("1".into())));
    }
}
