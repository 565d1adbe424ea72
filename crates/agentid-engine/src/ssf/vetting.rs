//! Which push endpoints a stream may name, and the client a delivery pass uses: https, and
//! every address the name resolves to globally reachable (`outbound`), checked when a stream
//! is made and again before each pass, whose connections go only to the addresses checked.

use super::{PUSH_TIMEOUT, REFUSAL_BYTES};
use crate::outbound::{Client, Outbound};

/// The origin (`scheme://host[:port]`) of a URL.
pub(super) fn origin_of(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    (!authority.is_empty()).then(|| format!("{scheme}://{authority}"))
}

/// Checks a push endpoint: https, and every address it resolves to is public.
pub(crate) async fn check_endpoint(
    outbound: &Outbound,
    url: &str,
    allow_insecure: bool,
) -> Result<(), String> {
    outbound.vetted(url, allow_insecure).await.map(|_| ())
}

/// An HTTP client for one delivery pass to one endpoint: it connects only to the addresses
/// vetted at its making (so a DNS answer that changes in between cannot redirect it), keeps
/// its connection alive between the pass's SETs (each with its own time and bytes), and
/// follows no redirect.
pub(super) async fn pusher(outbound: &Outbound, url: &str, allow_insecure: bool) -> Result<Client, String> {
    let addrs = outbound
        .vetted(url, allow_insecure)
        .await
        .map_err(|e| format!("endpoint {e}"))?;
    Ok(outbound.agent(addrs, PUSH_TIMEOUT, REFUSAL_BYTES))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbound::OutboundConfig;

    #[tokio::test]
    async fn push_endpoints_must_be_public_https() {
        let outbound = Outbound::new(OutboundConfig::default());
        let local = "not globally reachable";
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
            let err = check_endpoint(&outbound, url, false).await.expect_err(url);
            assert!(err.contains(why), "{url}: {err}");
        }
        assert!(check_endpoint(&outbound, "http://127.0.0.1:9/x", true)
            .await
            .is_ok());
        assert_eq!(
            origin_of("https://r.example:8443/ssf?x"),
            Some("https://r.example:8443".into())
        );
    }
}
