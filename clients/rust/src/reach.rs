//! Where a fetch may connect: only to globally reachable addresses, unless the verifier was
//! built with [`Builder::allow_local`](crate::Builder::allow_local) (development and tests).
//!
//! "Globally reachable" is the column of that name in IANA's special-purpose address
//! registries: loopback, private, shared, link-local, documentation, benchmarking, reserved
//! and the like are not, nor is anything outside IPv6's global unicast space (2000::/3). An
//! IPv4 address inside an IPv6 one (IPv4-mapped and -compatible, NAT64, 6to4, Teredo) is
//! judged itself, so `[::ffff:127.0.0.1]` is loopback.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::sync::mpsc;
use std::time::Instant;

/// IPv4 blocks of the registry: network, prefix length, globally reachable. The longest
/// matching prefix decides; an address none matches is global.
const V4: &[([u8; 4], u8, bool)] = &[
    ([0, 0, 0, 0], 8, false),
    ([10, 0, 0, 0], 8, false),
    ([100, 64, 0, 0], 10, false),
    ([127, 0, 0, 0], 8, false),
    ([169, 254, 0, 0], 16, false),
    ([172, 16, 0, 0], 12, false),
    ([192, 0, 0, 0], 24, false),
    ([192, 0, 0, 9], 32, true),
    ([192, 0, 0, 10], 32, true),
    ([192, 0, 2, 0], 24, false),
    ([192, 31, 196, 0], 24, true),
    ([192, 52, 193, 0], 24, true),
    ([192, 88, 99, 0], 24, false),
    ([192, 168, 0, 0], 16, false),
    ([192, 175, 48, 0], 24, true),
    ([198, 18, 0, 0], 15, false),
    ([198, 51, 100, 0], 24, false),
    ([203, 0, 113, 0], 24, false),
    ([224, 0, 0, 0], 4, false),
    ([240, 0, 0, 0], 4, false),
];

/// IPv6 blocks of the registry inside 2000::/3, as for [`V4`].
const V6: &[([u16; 8], u8, bool)] = &[
    ([0x2001, 0, 0, 0, 0, 0, 0, 0], 23, false),
    ([0x2001, 1, 0, 0, 0, 0, 0, 1], 128, true),
    ([0x2001, 1, 0, 0, 0, 0, 0, 2], 128, true),
    ([0x2001, 1, 0, 0, 0, 0, 0, 3], 128, true),
    ([0x2001, 2, 0, 0, 0, 0, 0, 0], 48, false),
    ([0x2001, 3, 0, 0, 0, 0, 0, 0], 32, true),
    ([0x2001, 4, 0x112, 0, 0, 0, 0, 0], 48, true),
    ([0x2001, 0x20, 0, 0, 0, 0, 0, 0], 28, true),
    ([0x2001, 0x30, 0, 0, 0, 0, 0, 0], 28, true),
    ([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32, false),
    ([0x2620, 0x4f, 0x8000, 0, 0, 0, 0, 0], 48, true),
    ([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20, false),
];

/// The verdict of the longest of `blocks` (as bits of `width`) holding `bits`.
fn longest<const N: usize, T: Copy>(
    bits: u128,
    width: u32,
    blocks: &[([T; N], u8, bool)],
    to_bits: impl Fn([T; N]) -> u128,
) -> Option<bool> {
    blocks
        .iter()
        .filter(|(net, len, _)| {
            let shift = width - u32::from(*len);
            shift == width || (bits >> shift) == (to_bits(*net) >> shift)
        })
        .max_by_key(|(_, len, _)| *len)
        .map(|(_, _, global)| *global)
}

/// The IPv4 address an IPv6 one carries where it routes to it.
fn embedded_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = v6.segments();
    let o = v6.octets();
    let tail = Ipv4Addr::new(o[12], o[13], o[14], o[15]);
    let mapped_or_compatible = s[..5] == [0; 5] && (s[5] == 0xffff || (s[5] == 0 && s[6] != 0));
    if mapped_or_compatible || s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return Some(tail);
    }
    match (s[0], s[1]) {
        (0x2002, _) => Some(Ipv4Addr::new(o[2], o[3], o[4], o[5])),
        (0x2001, 0) => Some(Ipv4Addr::new(!o[12], !o[13], !o[14], !o[15])),
        _ => None,
    }
}

/// Whether IANA's registries call `ip` globally reachable.
pub(crate) fn globally_reachable(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => longest(u128::from(u32::from(v4)), 32, V4, |n| {
            u128::from(u32::from(Ipv4Addr::from(n)))
        })
        .unwrap_or(true),
        IpAddr::V6(v6) => match embedded_v4(v6) {
            Some(v4) => globally_reachable(IpAddr::V4(v4)),
            None => {
                (v6.segments()[0] & 0xe000) == 0x2000
                    && longest(u128::from(v6), 128, V6, |n| u128::from(Ipv6Addr::from(n))).unwrap_or(true)
            }
        },
    }
}

/// Why a connection may not be made to `url`: not `https://` (nor `http://` with
/// `allow_local`), the scheme in any case; a host missing; credentials in it.
pub(crate) fn refusal(url: &str, allow_local: bool) -> Option<&'static str> {
    let scheme = |s: &str| url.get(..s.len()).is_some_and(|p| p.eq_ignore_ascii_case(s));
    let rest = if scheme("https://") {
        &url[8..]
    } else if scheme("http://") && allow_local {
        &url[7..]
    } else {
        return Some("is not https:// (http:// only with allow_local, for development)");
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.is_empty() {
        return Some("names no host");
    }
    if authority.contains('@') {
        return Some("carries credentials");
    }
    None
}

/// ureq's resolver for a verifier: the host looked up once, by the fetch's deadline, and with
/// `allow_local` off none of its addresses may be other than globally reachable. ureq
/// connects to what this returns, so a name cannot answer one address here and another at
/// the connection.
pub(crate) struct Resolver {
    pub(crate) allow_local: bool,
    pub(crate) deadline: Option<Instant>,
}

impl Resolver {
    /// The system's answer for `netloc`, waited for until the deadline: the lookup takes no
    /// timeout of its own, so it runs on a thread of its own (left to finish when late).
    fn look_up(&self, netloc: &str) -> io::Result<Vec<SocketAddr>> {
        let Some(deadline) = self.deadline else {
            return Ok(netloc.to_socket_addrs()?.collect());
        };
        let (tx, rx) = mpsc::channel();
        let name = netloc.to_owned();
        std::thread::Builder::new()
            .name("agentid-resolve".into())
            .spawn(move || {
                let _ = tx.send(name.to_socket_addrs().map(Iterator::collect));
            })?;
        let left = deadline.saturating_duration_since(Instant::now());
        rx.recv_timeout(left)
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "timed out looking the name up"))?
    }
}

impl ureq::Resolver for Resolver {
    fn resolve(&self, netloc: &str) -> io::Result<Vec<SocketAddr>> {
        let addrs: Vec<SocketAddr> = self.look_up(netloc)?;
        if addrs.is_empty() {
            return Err(io::Error::new(io::ErrorKind::NotFound, "resolves to no address"));
        }
        if !self.allow_local && addrs.iter().any(|a| !globally_reachable(a.ip())) {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "resolves to an address that is not globally reachable (allow_local for development)",
            ));
        }
        Ok(addrs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_globally_reachable_addresses_pass() {
        let cases = [
            ("10.1.2.3", false),
            ("100.64.0.1", false),
            ("127.0.0.1", false),
            ("169.254.169.254", false),
            ("172.31.255.255", false),
            ("192.0.0.8", false),
            ("192.0.0.9", true),
            ("198.18.0.1", false),
            ("224.0.0.1", false),
            ("255.255.255.255", false),
            ("8.8.8.8", true),
            ("172.32.0.1", true),
            ("::", false),
            ("::1", false),
            ("fe80::1", false),
            ("fc00::1", false),
            ("ff02::1", false),
            ("2001:db8::1", false),
            ("::ffff:10.0.0.1", false),
            ("::ffff:8.8.8.8", true),
            ("::7f00:1", false),
            ("64:ff9b::7f00:1", false),
            ("2002:7f00:1::", false),
            ("2001:0:4136:e378:8000:63bf:80ff:fffe", false),
            ("2606:4700::1", true),
            ("2001:4:112::1", true),
            ("2001:2::1", false),
            ("3fff::1", false),
        ];
        for (ip, global) in cases {
            assert_eq!(globally_reachable(ip.parse().unwrap()), global, "{ip}");
        }
    }

    #[test]
    fn only_https_urls_without_credentials_are_fetched() {
        for url in [
            "https://id.example.com",
            "HTTPS://id.example.com/x",
            "http://127.0.0.1:8080",
        ] {
            assert_eq!(refusal(url, true), None, "{url}");
        }
        assert_eq!(refusal("HTTPS://id.example.com", false), None);
        for url in [
            "http://id.example.com",
            "ftp://id.example.com",
            "https://",
            "https://u:p@id.example.com",
            "https://id.example.com@evil.example/",
        ] {
            assert!(refusal(url, false).is_some(), "{url}");
        }
        assert!(refusal("https://u@id.example.com", true).is_some());
    }

    #[test]
    fn a_name_for_loopback_resolves_to_nothing_without_allow_local() {
        use ureq::Resolver as _;
        let strict = Resolver {
            allow_local: false,
            deadline: Instant::now().checked_add(std::time::Duration::from_secs(5)),
        };
        for netloc in ["localhost:443", "127.0.0.1:443", "[::ffff:127.0.0.1]:443"] {
            let e = strict.resolve(netloc).unwrap_err();
            assert!(e.to_string().contains("not globally reachable"), "{netloc}: {e}");
        }
        let local = Resolver {
            allow_local: true,
            deadline: None,
        };
        assert!(!local.resolve("127.0.0.1:443").unwrap().is_empty());
    }
}
