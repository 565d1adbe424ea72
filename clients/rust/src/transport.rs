//! The one way to the service: GETs with no redirect, a timeout and a bounded body, counted
//! fetches, and refreshes that run behind the caller.

use std::future::Future;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::error::unavailable;
use crate::{Error, Verifier, FETCHES, MAX_BODY_BYTES};

/// An answer: its status and headers, and for a 200 its body (at most [`MAX_BODY_BYTES`]).
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) body: Vec<u8>,
    pub(crate) etag: Option<String>,
    pub(crate) max_age: Option<u64>,
}

pub(crate) fn max_age(cache_control: Option<&str>) -> Option<u64> {
    cache_control?.split(',').find_map(|p| {
        let (name, value) = p.trim().split_once('=')?;
        name.eq_ignore_ascii_case("max-age").then(|| value.parse().ok())?
    })
}

/// How long to keep what the service sent with `max-age` (60 s without; a day at most).
pub(crate) fn cache_for(max_age: Option<u64>) -> Duration {
    Duration::from_secs(max_age.unwrap_or(60).min(86_400))
}

/// After a failed fetch following `last` (not before when, failures in a row): not again
/// before 1 s, doubling per failure up to 30 s.
pub(crate) fn failed_again(last: Option<(Instant, u32)>) -> (Instant, u32) {
    let failures = last.map_or(0, |(_, n)| n) + 1;
    let wait = Duration::from_secs(1 << (failures - 1).min(5)).min(Duration::from_secs(30));
    (Instant::now() + wait, failures)
}

/// The TLS of every fetch: the web's roots (webpki-roots), ring's cryptography.
pub(crate) fn tls() -> Arc<rustls::ClientConfig> {
    static TLS: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
    TLS.get_or_init(|| {
        let roots = rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        let config =
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .expect("ring supports the default protocol versions")
                .with_root_certificates(roots)
                .with_no_client_auth();
        Arc::new(config)
    })
    .clone()
}

/// Bytes a fetch may read off its https connection beside the answer's body: the TLS
/// handshake (certificates), the answer's head and the framing of its body.
const HEAD_ALLOWANCE: u64 = 256 * 1024;

/// A client for one fetch: no redirect followed, and all of it within `timeout`. ureq sets its
/// deadline once per buffered read, and one TLS record spans many reads of the connection, so
/// its TLS runs over a connection whose every read and write waits at most until the fetch's
/// deadline: a server dripping a record a byte at a time cannot hold a fetch past it. And
/// ureq reads a chunked body's size line whole, however long, before the body's bound sees a
/// byte: that connection yields at most twice [`MAX_BODY_BYTES`] and [`HEAD_ALLOWANCE`].
fn agent(tls: Arc<rustls::ClientConfig>, timeout: Duration, allow_local: bool) -> ureq::Agent {
    // A timeout past what an `Instant` holds bounds nothing.
    let deadline = Instant::now().checked_add(timeout);
    ureq::AgentBuilder::new()
        .timeout(timeout)
        .redirects(0)
        .resolver(crate::reach::Resolver {
            allow_local,
            deadline,
        })
        .tls_connector(Arc::new(DeadlineTls {
            config: tls,
            deadline,
        }))
        .build()
}

struct DeadlineTls {
    config: Arc<rustls::ClientConfig>,
    deadline: Option<Instant>,
}

impl ureq::TlsConnector for DeadlineTls {
    fn connect(
        &self,
        dns_name: &str,
        io: Box<dyn ureq::ReadWrite>,
    ) -> Result<Box<dyn ureq::ReadWrite>, ureq::Error> {
        let name = dns_name.trim_start_matches('[').trim_end_matches(']');
        let server = rustls::pki_types::ServerName::try_from(name.to_owned())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let mut tls = rustls::ClientConnection::new(self.config.clone(), server).map_err(io::Error::other)?;
        let mut io = Timed {
            io,
            deadline: self.deadline,
            left: 2 * MAX_BODY_BYTES + HEAD_ALLOWANCE,
        };
        tls.complete_io(&mut io)?;
        Ok(Box::new(TlsStream(rustls::StreamOwned::new(tls, io))))
    }
}

/// A connection whose every read and write waits at most until `deadline`, and fails past it,
/// and that yields at most `left` more bytes.
#[derive(Debug)]
struct Timed {
    io: Box<dyn ureq::ReadWrite>,
    deadline: Option<Instant>,
    left: u64,
}

impl Timed {
    fn bound(&self) -> io::Result<()> {
        let Some(deadline) = self.deadline else {
            return Ok(());
        };
        let left = deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| io::Error::new(io::ErrorKind::TimedOut, "timed out"))?;
        if let Some(socket) = self.io.socket() {
            socket.set_read_timeout(Some(left))?;
            socket.set_write_timeout(Some(left))?;
        }
        Ok(())
    }
}

impl Read for Timed {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.bound()?;
        if self.left == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the answer is larger than allowed",
            ));
        }
        let most = usize::try_from(self.left).unwrap_or(usize::MAX).min(buf.len());
        let n = self.io.read(&mut buf[..most])?;
        self.left -= n as u64;
        Ok(n)
    }
}

impl Write for Timed {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.bound()?;
        self.io.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.io.flush()
    }
}

#[derive(Debug)]
struct TlsStream(rustls::StreamOwned<rustls::ClientConnection, Timed>);

impl ureq::ReadWrite for TlsStream {
    fn socket(&self) -> Option<&TcpStream> {
        self.0.get_ref().io.socket()
    }
}

impl Read for TlsStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl Write for TlsStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

impl Verifier {
    /// GETs `url` on a blocking thread: no redirect followed (a 3xx is an answer like any
    /// other), the whole within the timeout, and of a 200 no more than [`MAX_BODY_BYTES`]
    /// read (more is `UNAVAILABLE`).
    pub(crate) async fn send(
        &self,
        url: String,
        accept: &'static str,
        etag: Option<String>,
        key: Option<String>,
    ) -> Result<Answer, Error> {
        if let Some(why) = crate::reach::refusal(&url, self.inner.allow_local) {
            return Err(unavailable(format!("{url} {why}")));
        }
        let agent = agent(self.inner.tls.clone(), self.inner.timeout, self.inner.allow_local);
        tokio::task::spawn_blocking(move || {
            let mut req = agent.get(&url).set("Accept", accept);
            if let Some(e) = &etag {
                req = req.set("If-None-Match", e);
            }
            if let Some(k) = &key {
                req = req.set("Authorization", &format!("Bearer {k}"));
            }
            let res = match req.call() {
                Ok(r) | Err(ureq::Error::Status(_, r)) => r,
                Err(e) => return Err(unavailable(format!("{url}: {e}"))),
            };
            let mut answer = Answer {
                status: res.status(),
                body: Vec::new(),
                etag: res.header("etag").map(str::to_owned),
                max_age: max_age(res.header("cache-control")),
            };
            if answer.status == 200 {
                res.into_reader()
                    .take(MAX_BODY_BYTES + 1)
                    .read_to_end(&mut answer.body)
                    .map_err(|e| unavailable(format!("{url}: {e}")))?;
                if answer.body.len() as u64 > MAX_BODY_BYTES {
                    return Err(unavailable(format!(
                        "{url}: an answer over {MAX_BODY_BYTES} bytes"
                    )));
                }
            }
            Ok(answer)
        })
        .await
        .map_err(|e| unavailable(e.to_string()))?
    }

    /// GETs a document, revalidating with `etag`: its answer, a 200 or (only when `etag` was
    /// sent) a 304. Any other answer is `UNAVAILABLE`. Counted by `document` and result.
    pub(crate) async fn fetch(
        &self,
        url: String,
        document: &'static str,
        accept: &'static str,
        etag: Option<String>,
    ) -> Result<Answer, Error> {
        let revalidating = etag.is_some();
        let answer = self.send(url.clone(), accept, etag, None).await;
        let (result, answer) = match answer {
            Ok(a) if a.status == 200 => ("fetched", Ok(a)),
            Ok(a) if a.status == 304 && revalidating => ("not_modified", Ok(a)),
            Ok(a) => ("failed", Err(unavailable(format!("{url}: {}", a.status)))),
            Err(e) => ("failed", Err(e)),
        };
        metrics::counter!(FETCHES, "document" => document, "result" => result).increment(1);
        answer
    }

    /// Runs `refresh` behind the caller, unless one runs for `url` already or `url` failed
    /// lately (then not before 1 s, doubling per failure up to 30 s): a request holding a
    /// usable answer never waits for the network.
    pub(crate) fn refresh_later(
        &self,
        url: String,
        refresh: impl Future<Output = Result<(), Error>> + Send + 'static,
    ) {
        {
            let mut s = self.inner.state.lock();
            if s.refreshing.contains(&url) || s.retry.get(&url).is_some_and(|(at, _)| *at > Instant::now()) {
                return;
            }
            s.refreshing.insert(url.clone());
        }
        let this = self.clone();
        tokio::spawn(async move {
            let done = refresh.await;
            let mut s = this.inner.state.lock();
            s.refreshing.remove(&url);
            if done.is_ok() {
                s.retry.remove(&url);
            } else {
                let next = failed_again(s.retry.get(&url).copied());
                s.retry.insert(url, next);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A max-age (or a status list's ttl) of a year is held a day; without one, 60 s.
    #[test]
    fn what_the_service_says_to_keep_is_kept_a_day_at_most() {
        assert_eq!(cache_for(Some(31_536_000)), Duration::from_secs(86_400));
        assert_eq!(cache_for(Some(30)), Duration::from_secs(30));
        assert_eq!(cache_for(None), Duration::from_secs(60));
    }

    /// Attack: a server whose chunked answer sends a chunk's size line without end (ureq
    /// reads that line whole before the body's bound sees a byte).
    #[test]
    fn a_connection_yields_no_more_than_its_allowance() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let block = vec![b'0'; 64 * 1024];
            while s.write_all(&block).is_ok() {}
        });
        let mut io = Timed {
            io: Box::new(TcpStream::connect(addr).unwrap()),
            deadline: Instant::now().checked_add(Duration::from_secs(10)),
            left: 100_000,
        };
        let mut read = Vec::new();
        let err = io.read_to_end(&mut read).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert_eq!(read.len(), 100_000);
    }

    /// Attack: a server (the one the verifier is pointed at, or a trusted directory) that
    /// answers the TLS handshake a byte at a time, each byte well within a read's timeout,
    /// would hold a fetch for as long as it drips.
    #[tokio::test]
    async fn an_answer_dripped_a_byte_at_a_time_ends_at_the_timeout() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            // A TLS record's header announcing 16 KiB, then its body one byte at a time.
            let _ = s.write_all(&[0x16, 0x03, 0x03, 0x40, 0x00]);
            for _ in 0..16_000 {
                std::thread::sleep(Duration::from_millis(100));
                if s.write_all(&[0]).is_err() {
                    return;
                }
            }
        });
        let base = format!("https://localhost:{port}");
        let verifier = Verifier::builder(&base)
            .allow_local(true)
            .timeout(Duration::from_secs(1))
            .build()
            .unwrap();
        let started = Instant::now();
        let got = verifier
            .send(
                format!("{base}/.well-known/jwks.json"),
                "application/json",
                None,
                None,
            )
            .await;
        assert!(got.is_err());
        let took = started.elapsed();
        assert!(took < Duration::from_secs(3), "held for {took:?}");
    }
}
