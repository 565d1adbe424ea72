//! A TCP pass-through that can be cut and restored: a database outage without stopping the
//! database that other tests share.

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Proxy {
    pub addr: SocketAddr,
    state: watch::Sender<State>,
}

/// What the proxy does with connections.
#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Up,
    /// New connections are refused, open ones dropped.
    Cut,
    /// Connections, open and new, are held open and carry nothing: a database that stopped
    /// answering (a host gone, a partition), which no error reports.
    Stalled,
}

impl Proxy {
    pub async fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (state, watch_rx) = watch::channel(State::Up);
        tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    return;
                };
                let mut state = watch_rx.clone();
                let now = *state.borrow();
                match now {
                    State::Cut => {
                        drop(client); // refused while down
                        continue;
                    }
                    State::Stalled => {
                        tokio::spawn(async move {
                            let _ = state.wait_for(|s| *s != State::Stalled).await;
                            drop(client);
                        });
                        continue;
                    }
                    State::Up => {}
                }
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(target).await else {
                        return;
                    };
                    let stalled = tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => false,
                        s = state.wait_for(|s| *s != State::Up) => s.is_ok_and(|s| *s == State::Stalled),
                    };
                    // Cut: both sockets drop. Stalled: held, silent, until it ends.
                    if stalled {
                        let _ = state.wait_for(|s| *s != State::Stalled).await.map(|_| ());
                    }
                });
            }
        });
        Proxy { addr, state }
    }

    pub fn cut(&self) {
        self.state.send_replace(State::Cut);
    }

    pub fn stall(&self) {
        self.state.send_replace(State::Stalled);
    }

    pub fn restore(&self) {
        self.state.send_replace(State::Up);
    }
}

/// An app (unlimited organization) whose PostgreSQL connections pass through a proxy that
/// can be cut, with a 1 s pool timeout and no outage wait; `None`, with a note, on SQLite.
pub async fn app_behind_proxy() -> Option<(Proxy, crate::helpers::TestApp)> {
    app_behind_proxy_with(|_| ()).await
}

/// `app_behind_proxy`, with `tweak` applied to its configuration as well.
pub async fn app_behind_proxy_with(
    tweak: impl FnOnce(&mut agentid::config::Config) + 'static,
) -> Option<(Proxy, crate::helpers::TestApp)> {
    let Some(admin) = crate::helpers::postgres_admin_url() else {
        eprintln!("outage tests run against PostgreSQL only (AGENTID_TEST_DATABASE_URL)");
        return None;
    };
    let target: SocketAddr = admin
        .split('@')
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or("127.0.0.1:5432")
        .parse()
        .unwrap();
    let proxy = Proxy::start(target).await;
    let proxy_addr = proxy.addr;
    let app = crate::helpers::spawn_app_with(crate::helpers::Options {
        tweak: Box::new(move |c| {
            c.database_url = c
                .database_url
                .replacen(&target.to_string(), &proxy_addr.to_string(), 1);
            c.store.acquire_timeout = std::time::Duration::from_secs(1);
            // Outages here are answered at once, unless the test waits them out.
            c.store.outage_wait = std::time::Duration::ZERO;
            tweak(c);
        }),
        ..crate::helpers::Options::unlimited()
    })
    .await;
    Some((proxy, app))
}
