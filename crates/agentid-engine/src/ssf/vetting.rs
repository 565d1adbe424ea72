//! Which push endpoints a stream may name, and the client a delivery pass uses: https, and
//! every address the name resolves to globally reachable (`outbound`), checked when a stream
//! is made and again before each pass, whose connections go only to the addresses checked.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};

use super::PUSH_TIMEOUT;
use crate::outbound;

/// The origin (`scheme://host[:port]`) of a URL.
pub(super) fn origin_of(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    (!authority.is_empty()).then(|| format!("{scheme}://{authority}"))
}

/// The addresses a push to `url` may use: all it resolves to, each globally reachable
/// (`outbound`; unless insecure endpoints are allowed, for development).
fn vetted_addresses(url: &str, allow_insecure: bool) -> Result<Vec<SocketAddr>, String> {
    let (https, host, port) = outbound::host_port(url)?;
    if !https && !allow_insecure {
        return Err("must be an https:// URL".into());
    }
    let addrs: Vec<SocketAddr> = (host.as_str(), port)
        .to_socket_addrs()
        .map_err(|e| format!("does not resolve ({e})"))?
        .collect();
    let ips: Vec<IpAddr> = addrs.iter().map(SocketAddr::ip).collect();
    outbound::check_addresses(&ips, allow_insecure)?;
    Ok(addrs)
}

/// Checks a push endpoint: https, and every address it resolves to is public.
pub(crate) fn check_endpoint(url: &str, allow_insecure: bool) -> Result<(), String> {
    vetted_addresses(url, allow_insecure).map(|_| ())
}

/// An HTTP client for one delivery pass to one endpoint: it connects only to the addresses
/// vetted at its making (so a DNS answer that changes in between cannot redirect it), keeps
/// its connection alive between the pass's SETs, and follows no redirect.
pub(super) fn pusher(url: &str, allow_insecure: bool) -> Result<ureq::Agent, String> {
    let addrs = vetted_addresses(url, allow_insecure).map_err(|e| format!("endpoint {e}"))?;
    Ok(ureq::AgentBuilder::new()
        .timeout(PUSH_TIMEOUT)
        .redirects(0)
        .resolver(move |_: &str| Ok(addrs.clone()))
        .build())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_endpoints_must_be_public_https() {
        let local = "not a globally reachable address";
        for (url, why) in [
            ("http://example.com/x", "https"),
            ("ftp://example.com/x", "https"),
            ("https://127.0.0.1/x", local),
            ("https://10.1.2.3/x", local),
            ("https://169.254.169.254/latest", local),
            ("https://[::1]/x", local),
            ("https://[fd00::1]:8443/x", local),
            ("https://0.0.0.0/x", local),
            ("https://user:pw@example.com/x", "credentials"),
            ("https://localhost:9/x", local),
            // Each names a loopback or reserved address in a form the old rule let through.
            ("https://[64:ff9b::7f00:1]/x", local),
            ("https://[::7f00:1]/x", local),
            ("https://[2002:7f00:1::]/x", local),
            ("https://[2001:0:4136:e378:8000:63bf:80ff:fffe]/x", local),
            ("https://[fec0::1]/x", local),
            ("https://[100::1]/x", local),
            ("https://198.18.0.1/x", local),
            ("https://240.0.0.1/x", local),
            ("https://192.0.0.1/x", local),
        ] {
            let err = check_endpoint(url, false).expect_err(url);
            assert!(err.contains(why), "{url}: {err}");
        }
        assert!(check_endpoint("http://127.0.0.1:9/x", true).is_ok());
        assert_eq!(
            origin_of("https://r.example:8443/ssf?x"),
            Some("https://r.example:8443".into())
        );
    }
}
