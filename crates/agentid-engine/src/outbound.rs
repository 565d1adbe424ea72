//! The one client, and the one rule, for every connection the service opens to an address a
//! caller gave it (Shared Signals push endpoints, issuer-domain checks): names looked up one
//! way ([`Outbound::resolver`]), only globally reachable addresses, no redirects, bounded
//! time and size.
//!
//! "Globally reachable" is the IANA special-purpose address registries' column of that
//! name: an address in a block the registries mark otherwise (loopback, private, shared,
//! link-local, documentation, benchmarking, reserved, discard-only, …) or outside global
//! unicast space (multicast, IPv6 site-local, unallocated) is refused. An IPv4 address
//! carried inside an IPv6 one (IPv4-mapped and -compatible, NAT64 `64:ff9b::/96`, 6to4,
//! Teredo) is taken out and judged itself, so `[64:ff9b::7f00:1]` is 127.0.0.1.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolveHosts, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::TokioResolver;

/// Special-purpose IPv4 blocks and whether each is globally reachable (RFC 6890 and the
/// registry's later entries). The longest matching prefix decides; an address no entry
/// matches is global, unless it is multicast (224/4), which is no unicast destination.
const V4_SPECIAL: &[(&str, bool)] = &[
    ("0.0.0.0/8", false),
    ("10.0.0.0/8", false),
    ("100.64.0.0/10", false),
    ("127.0.0.0/8", false),
    ("169.254.0.0/16", false),
    ("172.16.0.0/12", false),
    ("192.0.0.0/24", false),
    ("192.0.0.9/32", true),
    ("192.0.0.10/32", true),
    ("192.0.2.0/24", false),
    ("192.31.196.0/24", true),
    ("192.52.193.0/24", true),
    ("192.88.99.0/24", false),
    ("192.168.0.0/16", false),
    ("192.175.48.0/24", true),
    ("198.18.0.0/15", false),
    ("198.51.100.0/24", false),
    ("203.0.113.0/24", false),
    ("224.0.0.0/4", false),
    ("240.0.0.0/4", false),
    ("255.255.255.255/32", false),
];

/// Special-purpose IPv6 blocks inside global unicast space (2000::/3) and whether each is
/// globally reachable. Addresses outside 2000::/3 are not (ULA, link-local, site-local,
/// multicast, discard-only, unallocated), except the forms that carry an IPv4 address.
const V6_SPECIAL: &[(&str, bool)] = &[
    ("2001::/23", false),
    ("2001:1::1/128", true),
    ("2001:1::2/128", true),
    ("2001:1::3/128", true),
    ("2001:2::/48", false),
    ("2001:3::/32", true),
    ("2001:4:112::/48", true),
    ("2001:20::/28", true),
    ("2001:30::/28", true),
    ("2001:db8::/32", false),
    ("2620:4f:8000::/48", true),
    ("3fff::/20", false),
];

fn longest_match(ip: IpAddr, table: &[(&str, bool)]) -> Option<bool> {
    table
        .iter()
        .map(|(net, global)| (net.parse::<ipnet::IpNet>().expect("a valid network"), *global))
        .filter(|(net, _)| net.contains(&ip))
        .max_by_key(|(net, _)| net.prefix_len())
        .map(|(_, global)| global)
}

/// The IPv4 address an IPv6 address carries, in the forms that route to it: IPv4-mapped
/// (`::ffff:a.b.c.d`), IPv4-compatible (`::a.b.c.d`), NAT64 (`64:ff9b::a.b.c.d`), 6to4
/// (`2002:AABB:CCDD::`) and Teredo (`2001:0::`, the client's address inverted in the last 32
/// bits).
fn embedded_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = v6.segments();
    let o = v6.octets();
    let tail = Ipv4Addr::new(o[12], o[13], o[14], o[15]);
    if s[..5] == [0; 5] && (s[5] == 0xffff || s[5] == 0) && !(s[5] == 0 && s[6] == 0) {
        return Some(tail);
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return Some(tail);
    }
    if s[0] == 0x2002 {
        return Some(Ipv4Addr::new(o[2], o[3], o[4], o[5]));
    }
    if s[0] == 0x2001 && s[1] == 0 {
        return Some(Ipv4Addr::new(!o[12], !o[13], !o[14], !o[15]));
    }
    None
}

/// Whether the IANA registries call `ip` globally reachable (see the module's text).
pub(crate) fn globally_reachable(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => longest_match(IpAddr::V4(v4), V4_SPECIAL).unwrap_or(true),
        IpAddr::V6(v6) => {
            if let Some(v4) = embedded_v4(v6) {
                return globally_reachable(IpAddr::V4(v4));
            }
            let global_unicast = (v6.segments()[0] & 0xe000) == 0x2000;
            global_unicast && longest_match(IpAddr::V6(v6), V6_SPECIAL).unwrap_or(true)
        }
    }
}

/// Refuses addresses that are not globally reachable, unless `allow_local` (development and
/// tests). At least one address is needed.
pub(crate) fn check_addresses(addrs: &[IpAddr], allow_local: bool) -> Result<(), String> {
    if addrs.is_empty() {
        return Err("resolves to no address".into());
    }
    // Which address, the caller is not told: it would map the service's own network (its
    // resolver's answers for internal names).
    if !allow_local && addrs.iter().any(|a| !globally_reachable(*a)) {
        return Err("resolves to an address that is not globally reachable".into());
    }
    Ok(())
}

/// `https?`, host and port of an `http(s)` URL; `default_port` gives the port of a URL that
/// names none, by whether it is https. A port is 1 to 65535; an IPv6 host is in brackets,
/// with nothing after them but a port.
pub(crate) fn host_port(
    url: &str,
    default_port: impl Fn(bool) -> u16,
) -> Result<(bool, String, u16), String> {
    let (scheme, rest) = url.split_once("://").ok_or("is not an absolute URL")?;
    let https = match scheme {
        "https" => true,
        "http" => false,
        _ => return Err("must be an https:// URL".into()),
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.contains('@') {
        return Err("must not carry credentials".into());
    }
    let default = default_port(https);
    let port = |p: &str| match p.parse::<u16>() {
        Ok(p) if p > 0 => Ok(p),
        _ => Err("has a malformed port"),
    };
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6.split_once(']').ok_or("has a malformed IPv6 host")?;
        let port = match after {
            "" => default,
            _ => port(after.strip_prefix(':').ok_or("has a malformed IPv6 host")?)?,
        };
        (host.to_owned(), port)
    } else {
        match authority.split_once(':') {
            Some((h, p)) => (h.to_owned(), port(p)?),
            None => (authority.to_owned(), default),
        }
    };
    if host.is_empty() {
        return Err("has no host".into());
    }
    Ok((https, host, port))
}

/// How one service's outbound connections go: where names are looked up, which roots TLS
/// trusts beside the web's, and where a URL without a port connects. The production client
/// is `OutboundConfig::default()` with the operator's DNS server; the tests pass their own.
#[derive(Debug, Clone)]
pub struct OutboundConfig {
    /// The DNS server every name is looked up at (`None`: the system's, /etc/resolv.conf).
    pub dns_server: Option<SocketAddr>,
    /// Root certificates (DER) trusted beside the web's.
    pub extra_roots: Vec<Vec<u8>>,
    /// Where an `https://` URL without a port connects (443), and an `http://` one (80).
    pub https_port: u16,
    pub http_port: u16,
}

impl Default for OutboundConfig {
    fn default() -> Self {
        OutboundConfig {
            dns_server: None,
            extra_roots: Vec::new(),
            https_port: 443,
            http_port: 80,
        }
    }
}

/// The service's one client for connections to addresses it was given: issuer-domain proofs
/// and Shared Signals pushes. Made once at start and handed to the engine. Every connection
/// goes only to addresses the caller vetted (`check_addresses`), follows no redirect, and is
/// bounded in time and size.
#[derive(Clone)]
pub struct Outbound {
    dns_server: Option<SocketAddr>,
    https_port: u16,
    http_port: u16,
    tls: Arc<rustls::ClientConfig>,
    /// Fetches of URLs callers name (identity providers' keys, third parties' directories)
    /// under way: each holds a blocking thread for up to its timeout, and distinct URLs that
    /// hang would otherwise take every thread of the pool that status lists, proofs and
    /// pushes run on.
    fetches: Arc<tokio::sync::Semaphore>,
}

/// The most [`Outbound::fetch_revalidated`] fetches under way at once; one more fails at once.
pub(crate) const MAX_FETCHES: usize = 64;

impl std::fmt::Debug for Outbound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbound")
            .field("dns_server", &self.dns_server)
            .field("https_port", &self.https_port)
            .field("http_port", &self.http_port)
            .finish_non_exhaustive()
    }
}

/// What an answer said of caching it: its `ETag`, and its `Cache-Control: max-age` (s).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Caching {
    pub(crate) etag: Option<String>,
    pub(crate) max_age: Option<u64>,
}

/// Why [`Outbound::fetch_revalidated`] brought nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FetchError {
    /// Too many fetches under way: the URL was not asked, and says nothing of it.
    Busy(String),
    /// The URL could not be had: vetted out, or the fetch failed.
    Failed(String),
}

impl std::fmt::Display for FetchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FetchError::Busy(why) | FetchError::Failed(why) => f.write_str(why),
        }
    }
}

/// What a fetch found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fetched {
    /// 200, and its body (at most the bound given).
    Body(Vec<u8>),
    /// 304 to a conditional request: what was held is current.
    NotModified,
    /// Anything else, said in a few words: `answered 404`, `connection refused`, …
    Failed(String),
}

/// How long one DNS query may take, how many tries it gets, and how long a lookup may take in
/// all (its queries over UDP and TCP, A and AAAA together).
const DNS_TIMEOUT: Duration = Duration::from_secs(2);
const DNS_ATTEMPTS: usize = 2;
pub(crate) const LOOKUP_DEADLINE: Duration = Duration::from_secs(5);

impl Outbound {
    pub fn new(cfg: OutboundConfig) -> Outbound {
        let mut roots = rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        for der in &cfg.extra_roots {
            // A root that does not parse fails the TLS it was meant for, nothing else.
            let _ = roots.add(rustls::pki_types::CertificateDer::from(der.clone()));
        }
        let tls =
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .expect("ring supports the default protocol versions")
                .with_root_certificates(roots)
                .with_no_client_auth();
        Outbound {
            dns_server: cfg.dns_server,
            https_port: cfg.https_port,
            http_port: cfg.http_port,
            tls: Arc::new(tls),
            fetches: Arc::new(tokio::sync::Semaphore::new(MAX_FETCHES)),
        }
    }

    /// Where a URL of the scheme without a port connects.
    pub(crate) fn default_port(&self, https: bool) -> u16 {
        if https {
            self.https_port
        } else {
            self.http_port
        }
    }

    /// A resolver for one use: the configured server (or the system's), no cache; the hosts
    /// file read only with `hosts` (a name's proof comes from DNS alone).
    pub(crate) fn resolver(&self, hosts: bool) -> Result<TokioResolver, String> {
        let provider = TokioRuntimeProvider::default();
        let mut builder = match self.dns_server {
            Some(addr) => {
                let connection = |mut c: ConnectionConfig| {
                    c.port = addr.port();
                    c
                };
                let server = NameServerConfig::new(
                    addr.ip(),
                    true,
                    vec![
                        connection(ConnectionConfig::udp()),
                        connection(ConnectionConfig::tcp()),
                    ],
                );
                TokioResolver::builder_with_config(ResolverConfig::from_name_servers(vec![server]), provider)
            }
            None => TokioResolver::builder(provider).map_err(|e| e.to_string())?,
        };
        let o = builder.options_mut();
        o.cache_size = 0;
        o.timeout = DNS_TIMEOUT;
        o.attempts = DNS_ATTEMPTS;
        o.use_hosts_file = if hosts {
            ResolveHosts::Always
        } else {
            ResolveHosts::Never
        };
        builder.build().map_err(|e| e.to_string())
    }

    /// Every address `host` has (an IP literal is itself), within [`LOOKUP_DEADLINE`].
    pub(crate) async fn addresses(resolver: &TokioResolver, host: &str) -> Result<Vec<IpAddr>, String> {
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(vec![ip]);
        }
        match tokio::time::timeout(LOOKUP_DEADLINE, resolver.lookup_ip(format!("{host}."))).await {
            Ok(Ok(l)) => Ok(l.iter().collect()),
            Ok(Err(e)) => Err(dns_failure(&e)),
            Err(_) => Err("the DNS lookup timed out".into()),
        }
    }

    /// The addresses a connection to `url` may use: an https URL (or http with `allow_local`)
    /// whose every address is globally reachable (unless `allow_local`, for development). The
    /// hosts file counts: a push endpoint is named as the operator's system names it.
    pub(crate) async fn vetted(&self, url: &str, allow_local: bool) -> Result<Vec<SocketAddr>, String> {
        let (https, host, port) = host_port(url, |https| self.default_port(https))?;
        if !https && !allow_local {
            return Err("must be an https:// URL".into());
        }
        let resolver = self.resolver(true)?;
        let ips = Self::addresses(&resolver, &host)
            .await
            .map_err(|e| format!("does not resolve ({e})"))?;
        check_addresses(&ips, allow_local)?;
        Ok(ips.into_iter().map(|ip| SocketAddr::new(ip, port)).collect())
    }

    /// A blocking client that connects only to `addrs` (vetted by the caller, so that a DNS
    /// answer that changes in between cannot send the connection elsewhere), follows no
    /// redirect, and gives each request at most `timeout` and about `max_bytes` read off the
    /// connection (see [`Client`]; over https: plain http, which only the development flags
    /// allow, has ureq's own deadline and no byte bound). Run it off the async threads.
    pub(crate) fn agent(&self, mut addrs: Vec<SocketAddr>, timeout: Duration, max_bytes: u64) -> Client {
        // A connection tries the addresses in turn: a name with thousands would have one
        // request knock at thousands of hosts.
        addrs.truncate(MAX_ADDRESSES);
        let allowance = Allowance::new(timeout, max_bytes);
        let tls = Arc::new(DeadlineTls {
            config: self.tls.clone(),
            allowance: allowance.clone(),
        });
        let agent = ureq::AgentBuilder::new()
            .timeout(timeout)
            .timeout_connect(timeout)
            .redirects(0)
            .tls_connector(tls)
            .resolver(move |_: &str| Ok(addrs.clone()))
            .build();
        Client { agent, allowance }
    }

    /// GETs `url` (its addresses vetted: see [`Outbound::vetted`]) revalidating `etag`, on a
    /// blocking thread: what came and what it said of caching it, or why nothing came
    /// ([`FetchError::Busy`] when [`MAX_FETCHES`] are under way: nothing was asked of `url`).
    pub(crate) async fn fetch_revalidated(
        self: &Arc<Self>,
        url: &str,
        allow_local: bool,
        etag: Option<String>,
        timeout: Duration,
        max_bytes: usize,
    ) -> Result<(Fetched, Caching), FetchError> {
        let addrs = self.vetted(url, allow_local).await.map_err(FetchError::Failed)?;
        let Ok(permit) = self.fetches.clone().try_acquire_owned() else {
            return Err(FetchError::Busy(format!(
                "cannot be fetched now: {MAX_FETCHES} other fetches are under way"
            )));
        };
        let (outbound, target) = (self.clone(), url.to_owned());
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            outbound.get_cached(&target, addrs, timeout, max_bytes, etag.as_deref())
        })
        .await
        .map_err(|_| FetchError::Failed("the fetch failed".to_owned()))
    }

    /// [`Outbound::get`] on a blocking thread, as one of the [`MAX_FETCHES`] under way and one
    /// of its caller's `share` of them: past either it fails at once, and nothing is asked of
    /// `url`.
    pub(crate) async fn get_counted(
        self: &Arc<Self>,
        share: &Arc<tokio::sync::Semaphore>,
        url: String,
        addrs: Vec<SocketAddr>,
        timeout: Duration,
        max_bytes: usize,
    ) -> Fetched {
        let (Ok(mine), Ok(all)) = (
            share.clone().try_acquire_owned(),
            self.fetches.clone().try_acquire_owned(),
        ) else {
            return Fetched::Failed("cannot be fetched now: too many other fetches are under way".into());
        };
        let outbound = self.clone();
        tokio::task::spawn_blocking(move || {
            let _permits = (mine, all);
            outbound.get(&url, addrs, timeout, max_bytes)
        })
        .await
        .unwrap_or_else(|e| Fetched::Failed(e.to_string()))
    }

    /// GETs `url` from `addrs` (see [`Outbound::agent`]): a 200's body of at most `max_bytes`,
    /// or what went wrong. Blocking: run it off the async threads.
    pub(crate) fn get(
        &self,
        url: &str,
        addrs: Vec<SocketAddr>,
        timeout: Duration,
        max_bytes: usize,
    ) -> Fetched {
        self.get_cached(url, addrs, timeout, max_bytes, None).0
    }

    /// [`Outbound::get`], conditional on `etag` (`If-None-Match`: a 304 is
    /// [`Fetched::NotModified`]), with what the answer said of caching it.
    pub(crate) fn get_cached(
        &self,
        url: &str,
        addrs: Vec<SocketAddr>,
        timeout: Duration,
        max_bytes: usize,
        etag: Option<&str>,
    ) -> (Fetched, Caching) {
        let mut request = self.agent(addrs, timeout, max_bytes as u64).request().get(url);
        if let Some(tag) = etag {
            request = request.set("If-None-Match", tag);
        }
        let response = match request.call() {
            Ok(r) => r,
            Err(ureq::Error::Status(code, _)) => {
                return (Fetched::Failed(format!("answered {code}")), Caching::default())
            }
            Err(ureq::Error::Transport(t)) => {
                return (Fetched::Failed(transport_failure(&t)), Caching::default())
            }
        };
        let status = response.status();
        let caching = Caching {
            etag: response.header("etag").map(str::to_owned),
            max_age: response.header("cache-control").and_then(|v| {
                v.split(',')
                    .find_map(|d| d.trim().strip_prefix("max-age="))
                    .and_then(|s| s.trim().parse().ok())
            }),
        };
        if status == 304 && etag.is_some() {
            let etag = etag.map(str::to_owned);
            return (Fetched::NotModified, Caching { etag, ..caching });
        }
        if (300..400).contains(&status) {
            return (
                Fetched::Failed(format!("answered {status}, a redirect, which is not followed")),
                Caching::default(),
            );
        }
        if status != 200 {
            return (Fetched::Failed(format!("answered {status}")), Caching::default());
        }
        let mut body = Vec::new();
        let limit = max_bytes as u64 + 1;
        if let Err(e) = response.into_reader().take(limit).read_to_end(&mut body) {
            return (
                Fetched::Failed(format!("reading the answer failed ({})", io_failure(&e))),
                Caching::default(),
            );
        }
        if body.len() > max_bytes {
            return (
                Fetched::Failed(format!("the answer is larger than {max_bytes} bytes")),
                Caching::default(),
            );
        }
        (Fetched::Body(body), caching)
    }
}

/// An [`Outbound::agent`]: a ureq agent, and what the request under way on its connections
/// may still take. Each request starts with [`Client::request`], which renews that allowance,
/// so the connection a pass of pushes keeps alive serves each push its own.
#[derive(Clone)]
pub(crate) struct Client {
    agent: ureq::Agent,
    allowance: Allowance,
}

impl Client {
    /// The agent, for one request: the allowance renewed.
    pub(crate) fn request(&self) -> &ureq::Agent {
        self.allowance.renew();
        &self.agent
    }
}

/// The most addresses of a name a request tries.
const MAX_ADDRESSES: usize = 8;

/// Bytes a request may read off its https connection beside its answer's body: the TLS
/// handshake (certificates), the answer's head and the framing of its body.
const HEAD_ALLOWANCE: u64 = 256 * 1024;

/// Until when, and how many more bytes, the request under way may read off the connection.
/// ureq's own deadline is set afresh for each buffered read, and one TLS record spans many
/// reads of the connection, so a server dripping a record a byte at a time (in the
/// handshake, or in the answer) would hold a call for as long as it dripped; and ureq reads
/// a chunked body's size line whole, however long, before a reader bounded to the body's
/// bytes sees any. Both are held here, beneath TLS, to this allowance.
#[derive(Clone, Debug)]
struct Allowance {
    timeout: Duration,
    bytes: u64,
    left: Arc<Mutex<(Instant, u64)>>,
}

impl Allowance {
    fn new(timeout: Duration, max_bytes: u64) -> Allowance {
        let bytes = max_bytes.saturating_mul(2).saturating_add(HEAD_ALLOWANCE);
        Allowance {
            timeout,
            bytes,
            left: Arc::new(Mutex::new((Instant::now() + timeout, bytes))),
        }
    }

    fn renew(&self) {
        *self.lock() = (Instant::now() + self.timeout, self.bytes);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Instant, u64)> {
        self.left.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The time left, set on `socket`'s reads and writes; an error once it has run out.
    fn bound(&self, socket: Option<&TcpStream>) -> io::Result<()> {
        let deadline = self.lock().0;
        let left = deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| io::Error::new(io::ErrorKind::TimedOut, "timed out"))?;
        if let Some(socket) = socket {
            socket.set_read_timeout(Some(left))?;
            socket.set_write_timeout(Some(left))?;
        }
        Ok(())
    }

    /// The bytes a read may still take; an error once none is left.
    fn readable(&self) -> io::Result<usize> {
        match self.lock().1 {
            0 => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the answer is larger than allowed",
            )),
            n => Ok(usize::try_from(n).unwrap_or(usize::MAX)),
        }
    }

    fn spent(&self, n: usize) {
        let mut left = self.lock();
        left.1 = left.1.saturating_sub(n as u64);
    }
}

/// TLS over a connection whose reads and writes are held to the request's [`Allowance`].
struct DeadlineTls {
    config: Arc<rustls::ClientConfig>,
    allowance: Allowance,
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
            allowance: self.allowance.clone(),
        };
        tls.complete_io(&mut io)?;
        Ok(Box::new(TlsStream(rustls::StreamOwned::new(tls, io))))
    }
}

/// A connection held to an [`Allowance`].
#[derive(Debug)]
struct Timed {
    io: Box<dyn ureq::ReadWrite>,
    allowance: Allowance,
}

impl Read for Timed {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.allowance.bound(self.io.socket())?;
        let most = self.allowance.readable()?.min(buf.len());
        let n = self.io.read(&mut buf[..most])?;
        self.allowance.spent(n);
        Ok(n)
    }
}

impl Write for Timed {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.allowance.bound(self.io.socket())?;
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

/// A failed lookup in a few words.
pub(crate) fn dns_failure(e: &hickory_resolver::net::NetError) -> String {
    if e.is_nx_domain() {
        "no such name (NXDOMAIN)".into()
    } else if e.is_no_records_found() {
        "no record".into()
    } else if matches!(e, hickory_resolver::net::NetError::Timeout) {
        "the DNS lookup timed out".into()
    } else {
        e.to_string()
    }
}

/// A transport failure in a few words, without the URL (the caller names it).
pub(crate) fn transport_failure(t: &ureq::Transport) -> String {
    use std::error::Error as _;
    let mut source = t.source();
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return io_failure(io);
        }
        if let Some(tls) = s.downcast_ref::<rustls::Error>() {
            return format!("TLS failed ({tls})");
        }
        source = s.source();
    }
    match t.kind() {
        ureq::ErrorKind::Dns => "does not resolve".into(),
        ureq::ErrorKind::ConnectionFailed => "connection failed".into(),
        ureq::ErrorKind::Io => "connection failed".into(),
        _ => t.message().map_or_else(|| t.kind().to_string(), str::to_owned),
    }
}

fn io_failure(e: &std::io::Error) -> String {
    use std::io::ErrorKind as K;
    if let Some(tls) = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
        return format!("TLS failed ({tls})");
    }
    match e.kind() {
        K::ConnectionRefused => "connection refused".into(),
        K::TimedOut | K::WouldBlock => "timed out".into(),
        K::ConnectionReset => "connection reset".into(),
        K::HostUnreachable | K::NetworkUnreachable => "unreachable".into(),
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Attack: distinct URLs whose servers never answer, asked for at once, each held a
    /// blocking thread for its whole timeout, until the pool had none left for anything else.
    /// Past [`MAX_FETCHES`] under way, one more fails at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn fetches_past_the_bound_fail_at_once() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        // Accepts, and never answers.
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for s in listener.incoming() {
                held.push(s);
            }
        });
        let outbound = Arc::new(Outbound::new(OutboundConfig::default()));
        let hanging: Vec<_> = (0..MAX_FETCHES)
            .map(|i| {
                let outbound = outbound.clone();
                tokio::spawn(async move {
                    let url = format!("http://127.0.0.1:{port}/{i}");
                    outbound
                        .fetch_revalidated(&url, true, None, Duration::from_secs(3), 1024)
                        .await
                })
            })
            .collect();
        // Every one of them under way.
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while outbound.fetches.available_permits() > 0 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let started = std::time::Instant::now();
        let url = format!("http://127.0.0.1:{port}/one-more");
        let refused = outbound
            .fetch_revalidated(&url, true, None, Duration::from_secs(3), 1024)
            .await;
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "{:?}",
            started.elapsed()
        );
        assert!(matches!(refused, Err(FetchError::Busy(_))), "{refused:?}");
        for h in hanging {
            let _ = h.await;
        }
        assert_eq!(
            outbound.fetches.available_permits(),
            MAX_FETCHES,
            "every permit comes back"
        );
    }

    /// Attack: a server that answers the TLS handshake a byte at a time, each byte well within
    /// a read's timeout, would hold a call for as long as it drips.
    #[test]
    fn an_answer_dripped_a_byte_at_a_time_ends_at_the_timeout() {
        use std::io::Write as _;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
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
        let outbound = Outbound::new(OutboundConfig::default());
        let started = std::time::Instant::now();
        let url = format!("https://localhost:{}/", addr.port());
        let fetched = outbound.get(&url, vec![addr], Duration::from_secs(1), 1024);
        let took = started.elapsed();
        assert!(
            matches!(&fetched, Fetched::Failed(why) if why.contains("timed out")),
            "{fetched:?}"
        );
        assert!(took < Duration::from_secs(3), "held for {took:?}");
    }

    /// A pass of pushes keeps one connection alive: each push starts with the whole of its
    /// time and bytes, however much the ones before it took.
    #[test]
    fn each_request_of_a_client_starts_with_its_whole_allowance() {
        let outbound = Outbound::new(OutboundConfig::default());
        let client = outbound.agent(vec!["127.0.0.1:1".parse().unwrap()], Duration::from_millis(50), 0);
        let allowance = &client.allowance;
        allowance.spent(usize::MAX);
        assert!(allowance.readable().is_err());
        std::thread::sleep(Duration::from_millis(60));
        assert!(allowance.bound(None).is_err());
        let _ = client.request();
        assert!(allowance.bound(None).is_ok());
        assert_eq!(allowance.readable().unwrap(), 256 * 1024);
    }

    /// Attack: a name with thousands of addresses had one request knock at each in turn.
    #[test]
    fn a_request_tries_at_most_eight_of_a_names_addresses() {
        use std::io::Write as _;
        let closed = || {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let open = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for s in listener.incoming() {
                let _ = s
                    .unwrap()
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
            }
        });
        let outbound = Outbound::new(OutboundConfig::default());
        let url = format!("http://example.com:{}/", open.port());
        let fetch = |addrs: Vec<SocketAddr>| outbound.get(&url, addrs, Duration::from_secs(2), 1024);
        let mut addrs: Vec<SocketAddr> = (0..7).map(|_| closed()).collect();
        addrs.push(open);
        assert!(matches!(fetch(addrs.clone()), Fetched::Body(b) if b == b"ok"));
        addrs.insert(0, closed());
        assert!(matches!(fetch(addrs), Fetched::Failed(_)));
    }

    #[test]
    fn only_globally_reachable_addresses_pass() {
        for bad in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "198.18.0.1",
            "240.0.0.1",
            "192.0.0.1",
            "192.0.2.1",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fd00::1",
            "fe80::1",
            "fec0::1",
            "ff02::1",
            "100::1",
            "2001:db8::1",
            "3fff::1",
            // IPv4 inside IPv6: mapped, compatible, NAT64, 6to4, Teredo (client 127.0.0.1).
            "::ffff:192.168.0.1",
            "::7f00:1",
            "64:ff9b::7f00:1",
            // The local-use NAT64 prefix (RFC 8215) is not global, whatever it embeds.
            "64:ff9b:1::5db8:d822",
            "2002:7f00:1::",
            "2001:0:4136:e378:8000:63bf:80ff:fffe",
        ] {
            let ip: IpAddr = bad.parse().unwrap();
            assert!(!globally_reachable(ip), "{bad} passed");
        }
        for good in [
            "93.184.216.34",
            "8.8.8.8",
            "192.0.0.9",
            "192.0.0.10",
            "2606:4700::1111",
            "2001:4860:4860::8888",
            "::ffff:93.184.216.34",
            "64:ff9b::5db8:d822",
            "2002:5db8:d822::1",
            "2001:0:4136:e378:8000:63bf:a247:27dd",
        ] {
            let ip: IpAddr = good.parse().unwrap();
            assert!(globally_reachable(ip), "{good} was refused");
        }
        assert!(check_addresses(&["127.0.0.1".parse().unwrap()], true).is_ok());
        assert!(check_addresses(&[], true).is_err());
        let err = check_addresses(
            &["93.184.216.34".parse().unwrap(), "10.0.0.1".parse().unwrap()],
            false,
        );
        let err = err.unwrap_err();
        assert!(
            err.contains("not globally reachable") && !err.contains("10.0.0.1"),
            "{err}"
        );
    }

    fn web_ports(https: bool) -> u16 {
        if https {
            443
        } else {
            80
        }
    }

    #[test]
    fn urls_name_their_host_and_port() {
        assert_eq!(
            host_port("https://a.example/x", web_ports),
            Ok((true, "a.example".into(), 443))
        );
        assert_eq!(
            host_port("http://[::1]:81/", web_ports),
            Ok((false, "::1".into(), 81))
        );
        assert!(host_port("https://u:p@a.example/", web_ports).is_err());
        assert!(host_port("ftp://a.example/", web_ports).is_err());
        for bad in [
            "https://a.example:0/",
            "https://a.example:/",
            "https://a.example:99999/",
            "https://a.example:1:2/",
            "https://[::1]x/",
            "https://[::1/",
        ] {
            assert!(host_port(bad, web_ports).is_err(), "{bad}");
        }
    }
}
