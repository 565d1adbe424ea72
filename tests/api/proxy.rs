//! A TCP pass-through that can be cut and restored: a database outage without stopping the
//! database that other tests share.

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Proxy {
    pub addr: SocketAddr,
    up: watch::Sender<bool>,
}

impl Proxy {
    pub async fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (up, watch_rx) = watch::channel(true);
        tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    return;
                };
                let mut state = watch_rx.clone();
                if !*state.borrow() {
                    drop(client); // refused while down
                    continue;
                }
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = state.wait_for(|up| !*up) => {} // cut: both sockets drop
                    }
                });
            }
        });
        Proxy { addr, up }
    }

    pub fn cut(&self) {
        self.up.send_replace(false);
    }

    pub fn restore(&self) {
        self.up.send_replace(true);
    }
}
