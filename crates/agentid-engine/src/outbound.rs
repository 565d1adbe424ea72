//! The one rule for every connection the service opens to an address a caller gave it
//! (Shared Signals push endpoints, issuer-domain checks): only globally reachable addresses,
//! no redirects, bounded time and size.
//!
//! "Globally reachable" is the IANA special-purpose address registries' column of that
//! name: an address in a block the registries mark otherwise (loopback, private, shared,
//! link-local, documentation, benchmarking, reserved, discard-only, …) or outside global
//! unicast space (multicast, IPv6 site-local, unallocated) is refused. An IPv4 address
//! carried inside an IPv6 one (IPv4-mapped and -compatible, NAT64 `64:ff9b::/96`, 6to4,
//! Teredo) is taken out and judged itself, so `[64:ff9b::7f00:1]` is 127.0.0.1.

use std::io::Read;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

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
    if !allow_local {
        if let Some(bad) = addrs.iter().find(|a| !globally_reachable(**a)) {
            return Err(format!(
                "resolves to {bad}, which is not a globally reachable address"
            ));
        }
    }
    Ok(())
}

/// `https?`, host and port of an `http(s)` URL.
pub(crate) fn host_port(url: &str) -> Result<(bool, String, u16), String> {
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
    let default = if https { 443 } else { 80 };
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6.split_once(']').ok_or("has a malformed IPv6 host")?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().map_err(|_| "has a malformed port")?,
            None => default,
        };
        (host.to_owned(), port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_owned(), p.parse().map_err(|_| "has a malformed port")?),
            None => (authority.to_owned(), default),
        }
    };
    if host.is_empty() {
        return Err("has no host".into());
    }
    Ok((https, host, port))
}

/// How the service's own HTTP fetches go: at most `max_bytes` read, `timeout` in all, no
/// redirect followed, TLS checked against the web's roots (and, in tests, theirs).
#[derive(Clone)]
pub(crate) struct Fetcher {
    pub(crate) timeout: Duration,
    pub(crate) max_bytes: usize,
    tls: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for Fetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fetcher")
            .field("timeout", &self.timeout)
            .field("max_bytes", &self.max_bytes)
            .finish_non_exhaustive()
    }
}

/// What a fetch found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fetched {
    /// 200, and its body (at most `max_bytes`).
    Body(Vec<u8>),
    /// Anything else, said in a few words: `answered 404`, `connection refused`, …
    Failed(String),
}

impl Fetcher {
    /// A fetcher that trusts the web's roots and `extra_roots` (DER certificates).
    pub fn new(timeout: Duration, max_bytes: usize, extra_roots: &[Vec<u8>]) -> Fetcher {
        let mut roots = rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        for der in extra_roots {
            // A test's root that does not parse fails that test's TLS, nothing else.
            let _ = roots.add(rustls::pki_types::CertificateDer::from(der.clone()));
        }
        let tls =
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .expect("ring supports the default protocol versions")
                .with_root_certificates(roots)
                .with_no_client_auth();
        Fetcher {
            timeout,
            max_bytes,
            tls: Arc::new(tls),
        }
    }

    /// GETs `url`, connecting only to `addrs` (checked by the caller, so that a DNS answer
    /// that changes in between cannot send the connection elsewhere). Blocking: run it off
    /// the async threads.
    pub fn get(&self, url: &str, addrs: Vec<SocketAddr>) -> Fetched {
        let agent = ureq::AgentBuilder::new()
            .timeout(self.timeout)
            .redirects(0)
            .tls_config(self.tls.clone())
            .resolver(move |_: &str| Ok(addrs.clone()))
            .build();
        let response = match agent.get(url).call() {
            Ok(r) => r,
            Err(ureq::Error::Status(code, _)) => return Fetched::Failed(format!("answered {code}")),
            Err(ureq::Error::Transport(t)) => return Fetched::Failed(transport_failure(&t)),
        };
        let status = response.status();
        if (300..400).contains(&status) {
            return Fetched::Failed(format!("answered {status}, a redirect, which is not followed"));
        }
        if status != 200 {
            return Fetched::Failed(format!("answered {status}"));
        }
        let mut body = Vec::new();
        let limit = self.max_bytes as u64 + 1;
        if let Err(e) = response.into_reader().take(limit).read_to_end(&mut body) {
            return Fetched::Failed(format!("reading the answer failed ({})", io_failure(&e)));
        }
        if body.len() > self.max_bytes {
            return Fetched::Failed(format!("the answer is larger than {} bytes", self.max_bytes));
        }
        Fetched::Body(body)
    }
}

/// A transport failure in a few words, without the URL (the caller names it).
fn transport_failure(t: &ureq::Transport) -> String {
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
        assert!(err.unwrap_err().contains("10.0.0.1"));
    }

    #[test]
    fn urls_name_their_host_and_port() {
        assert_eq!(
            host_port("https://a.example/x"),
            Ok((true, "a.example".into(), 443))
        );
        assert_eq!(host_port("http://[::1]:81/"), Ok((false, "::1".into(), 81)));
        assert!(host_port("https://u:p@a.example/").is_err());
        assert!(host_port("ftp://a.example/").is_err());
    }
}
