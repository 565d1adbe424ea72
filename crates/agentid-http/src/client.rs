//! Who is calling: the client's address, which anonymous rate limits and the key look-up
//! budget are kept by. Behind a balancer the peer is the balancer; only when the peer is a
//! trusted proxy (`--trusted-proxies`) is the address its proxies recorded believed:
//! `X-Forwarded-For`, else `Forwarded: for=`, read from the right, the first address that is
//! not itself a trusted proxy. A header from an untrusted peer is ignored, so a client cannot
//! choose its own address.

use std::net::{IpAddr, Ipv4Addr};

use actix_web::http::header::HeaderMap;
use ipnet::IpNet;

/// The client's address for a request from `peer` with `headers`.
pub(crate) fn address(peer: Option<IpAddr>, headers: &HeaderMap, trusted: &[IpNet]) -> IpAddr {
    let peer = peer.map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), canonical);
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|net| net.contains(ip));
    if !is_trusted(&peer) {
        return peer;
    }
    let hops = forwarded_for(headers);
    // From the nearest hop outwards: the first that is not a proxy we trust is the client.
    // An entry that is no address (`unknown`, an obfuscated name) ends the search: what is
    // to its left was said by someone we cannot vouch for, so the last known hop stands.
    let mut client = peer;
    for hop in hops.iter().rev() {
        match hop {
            Some(ip) if is_trusted(ip) => client = *ip,
            Some(ip) => return *ip,
            None => return client,
        }
    }
    client
}

/// The addresses the proxies recorded, outermost first: `X-Forwarded-For` when present,
/// else the `for` parameters of `Forwarded` (RFC 7239). `None` for an entry that is not an
/// address. Values are read as bytes: a client behind the proxy writes the left part of
/// `X-Forwarded-For` (nginx's `$proxy_add_x_forwarded_for` appends to it), and a byte that
/// is not visible ASCII there must spoil only its own entry, never make the header count as
/// absent and hand the choice to `Forwarded`, which the client may also have written.
fn forwarded_for(headers: &HeaderMap) -> Vec<Option<IpAddr>> {
    let hops = |name: &'static str| {
        headers
            .get_all(name)
            .flat_map(|v| v.as_bytes().split(|b| *b == b','))
            .map(|entry| std::str::from_utf8(entry).ok().map(str::trim))
    };
    if headers.contains_key("x-forwarded-for") {
        return hops("x-forwarded-for")
            .map(|hop| hop.and_then(parse_node))
            .collect();
    }
    hops("forwarded")
        .filter_map(|element| {
            let Some(element) = element else {
                return Some(None);
            };
            element.split(';').find_map(|pair| {
                let (name, value) = pair.trim().split_once('=')?;
                name.trim()
                    .eq_ignore_ascii_case("for")
                    .then(|| parse_node(value.trim().trim_matches('"')))
            })
        })
        .collect()
}

/// An address as proxies write it: `192.0.2.1`, `192.0.2.1:4711`, `2001:db8::1`,
/// `[2001:db8::1]` or `[2001:db8::1]:4711`.
fn parse_node(s: &str) -> Option<IpAddr> {
    let ip = if let Some(rest) = s.strip_prefix('[') {
        rest.split_once(']')?.0.parse().ok()?
    } else if let Ok(ip) = s.parse::<IpAddr>() {
        ip
    } else {
        let (host, port) = s.rsplit_once(':')?;
        port.parse::<u16>().ok()?;
        host.parse::<Ipv4Addr>().ok()?.into()
    };
    Some(canonical(ip))
}

/// IPv4 addresses that arrive mapped into IPv6 (`::ffff:a.b.c.d`) as IPv4.
pub(crate) fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use actix_web::http::header::{HeaderName, HeaderValue};

    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.append(HeaderName::from_static(name), HeaderValue::from_static(value));
        }
        h
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|n| n.parse().unwrap()).collect()
    }

    #[test]
    fn a_byte_outside_ascii_spoils_only_its_own_entry() {
        let trusted = nets(&["10.0.0.0/8"]);
        let peer = Some(ip("10.0.0.1"));
        let mut h = HeaderMap::new();
        h.append(
            HeaderName::from_static("x-forwarded-for"),
            HeaderValue::from_bytes(b"1.2.3.4\xff, 198.51.100.9").unwrap(),
        );
        h.append(
            HeaderName::from_static("forwarded"),
            HeaderValue::from_static("for=5.6.7.8"),
        );
        assert_eq!(address(peer, &h, &trusted), ip("198.51.100.9"));
        let mut h = HeaderMap::new();
        h.append(
            HeaderName::from_static("x-forwarded-for"),
            HeaderValue::from_bytes(b"\xff\xfe").unwrap(),
        );
        h.append(
            HeaderName::from_static("forwarded"),
            HeaderValue::from_static("for=5.6.7.8"),
        );
        assert_eq!(address(peer, &h, &trusted), ip("10.0.0.1"), "the proxy itself");
        let mut h = HeaderMap::new();
        h.append(
            HeaderName::from_static("forwarded"),
            HeaderValue::from_bytes(b"for=5.6.7.8, for=\"\xff\"").unwrap(),
        );
        assert_eq!(
            address(peer, &h, &trusted),
            ip("10.0.0.1"),
            "an unreadable last hop"
        );
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_claims() {
        let h = headers(&[("x-forwarded-for", "1.2.3.4"), ("forwarded", "for=5.6.7.8")]);
        assert_eq!(address(Some(ip("203.0.113.9")), &h, &[]), ip("203.0.113.9"));
        let trusted = nets(&["10.0.0.0/8"]);
        assert_eq!(address(Some(ip("203.0.113.9")), &h, &trusted), ip("203.0.113.9"));
    }

    #[test]
    fn behind_trusted_proxies_the_rightmost_untrusted_hop_is_the_client() {
        let trusted = nets(&["10.0.0.0/8", "2001:db8:ffff::/48"]);
        let peer = Some(ip("10.0.0.2"));
        // The client put a lie first; the balancer appended what it saw.
        let h = headers(&[("x-forwarded-for", "6.6.6.6, 198.51.100.7")]);
        assert_eq!(address(peer, &h, &trusted), ip("198.51.100.7"));
        // Two trusted hops between the client and us, over two header lines.
        let h = headers(&[
            ("x-forwarded-for", "6.6.6.6, 198.51.100.7"),
            ("x-forwarded-for", "10.1.1.1"),
        ]);
        assert_eq!(address(peer, &h, &trusted), ip("198.51.100.7"));
        // Every hop trusted: the outermost one.
        let h = headers(&[("x-forwarded-for", "10.9.9.9, 10.1.1.1")]);
        assert_eq!(address(peer, &h, &trusted), ip("10.9.9.9"));
        // An entry that is no address stops at the last hop that is known.
        let h = headers(&[("x-forwarded-for", "198.51.100.7, unknown, 10.1.1.1")]);
        assert_eq!(address(peer, &h, &trusted), ip("10.1.1.1"));
        // No header: the peer.
        assert_eq!(address(peer, &HeaderMap::new(), &trusted), ip("10.0.0.2"));
    }

    #[test]
    fn forwarded_is_read_when_there_is_no_x_forwarded_for() {
        let trusted = nets(&["10.0.0.0/8"]);
        let peer = Some(ip("10.0.0.2"));
        let h = headers(&[(
            "forwarded",
            "for=6.6.6.6, for=\"[2001:db8::7]:4711\";proto=https, For=10.3.3.3;by=10.0.0.2",
        )]);
        assert_eq!(address(peer, &h, &trusted), ip("2001:db8::7"));
        let h = headers(&[("forwarded", "for=198.51.100.7:8080")]);
        assert_eq!(address(peer, &h, &trusted), ip("198.51.100.7"));
        let h = headers(&[("forwarded", "for=_hidden")]);
        assert_eq!(address(peer, &h, &trusted), ip("10.0.0.2"));
        // When both are present, X-Forwarded-For.
        let h = headers(&[("forwarded", "for=6.6.6.6"), ("x-forwarded-for", "198.51.100.8")]);
        assert_eq!(address(peer, &h, &trusted), ip("198.51.100.8"));
    }

    #[test]
    fn addresses_are_read_in_every_form_proxies_write() {
        for (text, want) in [
            ("192.0.2.1", "192.0.2.1"),
            ("192.0.2.1:4711", "192.0.2.1"),
            ("2001:db8::1", "2001:db8::1"),
            ("[2001:db8::1]", "2001:db8::1"),
            ("[2001:db8::1]:4711", "2001:db8::1"),
            ("::ffff:192.0.2.1", "192.0.2.1"),
        ] {
            assert_eq!(parse_node(text), Some(ip(want)), "{text}");
        }
        for junk in [
            "",
            "unknown",
            "_hidden",
            "192.0.2.1:x",
            "[2001:db8::1",
            "300.1.1.1",
        ] {
            assert_eq!(parse_node(junk), None, "{junk}");
        }
        let trusted = nets(&["192.0.2.0/24"]);
        let mapped = Some(ip("::ffff:192.0.2.5"));
        let h = headers(&[("x-forwarded-for", "198.51.100.7")]);
        assert_eq!(
            address(mapped, &h, &trusted),
            ip("198.51.100.7"),
            "a mapped peer is IPv4"
        );
    }
}
