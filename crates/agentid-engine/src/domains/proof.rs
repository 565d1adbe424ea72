//! Proving a name: the TXT record first, through the configured resolver (hickory, no
//! cache, no hosts file), then the HTTPS file (globally reachable addresses only, no
//! redirect, 5 s and 4 KiB at most; with the insecure flag, `http://` when HTTPS fails).
//! Every failure says what each lookup found, in a few words and never more than a bounded
//! excerpt of what a server sent.

use std::net::SocketAddr;

use hickory_resolver::proto::rr::RData;
use hickory_resolver::TokioResolver;

use super::{Domains, DNS_LABEL, FETCH_MAX_BYTES, FETCH_TIMEOUT, MESSAGE_MAX, TXT_PREFIX, WELL_KNOWN_PATH};
use crate::outbound::{self, dns_failure, Fetched, Outbound, LOOKUP_DEADLINE};
use agentid_core::domain::holding::ProofMethod;

impl Domains {
    /// Tries the DNS proof, then the HTTPS one: the method that proved the name, and what
    /// each lookup found.
    pub(super) async fn prove(&self, name: &str, value: &str) -> (Option<ProofMethod>, Vec<String>) {
        let mut found = Vec::new();
        let resolver = match self.outbound.resolver(false) {
            Ok(r) => r,
            Err(e) => return (None, vec![format!("no DNS resolver: {e}")]),
        };
        match check_txt(&resolver, name, value).await {
            Ok(()) => return (Some(ProofMethod::Dns), found),
            Err(why) => found.push(why),
        }
        match self.check_https(&resolver, name, value).await {
            Ok(()) => (Some(ProofMethod::Https), found),
            Err(why) => {
                found.extend(why);
                (None, found)
            }
        }
    }

    /// The HTTPS proof: the name's addresses (each globally reachable, unless insecure
    /// checks are allowed), then the file, with no redirect, 5 s and 4 KiB at most. With
    /// insecure checks allowed, `http://` when HTTPS fails.
    async fn check_https(
        &self,
        resolver: &TokioResolver,
        name: &str,
        value: &str,
    ) -> Result<(), Vec<String>> {
        let shown = format!("https://{name}{WELL_KNOWN_PATH}");
        let ips = Outbound::addresses(resolver, name)
            .await
            .map_err(|why| vec![format!("{shown}: {why}")])?;
        if let Err(why) = outbound::check_addresses(&ips, self.cfg.allow_insecure) {
            return Err(vec![format!("{shown}: {name} {why}")]);
        }
        let mut found = Vec::new();
        let mut schemes = vec![("https", self.outbound.default_port(true), 443)];
        if self.cfg.allow_insecure {
            schemes.push(("http", self.outbound.default_port(false), 80));
        }
        for (scheme, port, usual) in schemes {
            let url = if port == usual {
                format!("{scheme}://{name}{WELL_KNOWN_PATH}")
            } else {
                format!("{scheme}://{name}:{port}{WELL_KNOWN_PATH}")
            };
            let addrs: Vec<SocketAddr> = ips.iter().map(|ip| SocketAddr::new(*ip, port)).collect();
            let fetched = self
                .outbound
                .get_counted(&self.proofs, url.clone(), addrs, FETCH_TIMEOUT, FETCH_MAX_BYTES)
                .await;
            match fetched {
                Fetched::Body(body) if body.trim_ascii() == value.as_bytes() => return Ok(()),
                Fetched::Body(body) => found.push(format!(
                    "{url}: the file is not this claim's challenge ({} bytes: {})",
                    body.len(),
                    cut(&String::from_utf8_lossy(&body))
                )),
                Fetched::Failed(why) => found.push(format!("{url}: {why}")),
                // Asked without a validator: never answered so.
                Fetched::NotModified => found.push(format!("{url}: answered 304")),
            }
        }
        Err(found)
    }
}

/// The DNS proof: a TXT record at `_agentid-challenge.<name>` that says
/// `agentid-domain-verification=<value>` (a record's strings joined).
async fn check_txt(resolver: &TokioResolver, name: &str, value: &str) -> Result<(), String> {
    let label = format!("{DNS_LABEL}.{name}");
    let expected = format!("{TXT_PREFIX}{value}");
    let lookup = match tokio::time::timeout(LOOKUP_DEADLINE, resolver.txt_lookup(format!("{label}."))).await {
        Ok(Ok(l)) => l,
        Ok(Err(e)) => return Err(format!("TXT {label}: {}", dns_failure(&e))),
        Err(_) => return Err(format!("TXT {label}: the DNS lookup timed out")),
    };
    let mut records = 0;
    for record in lookup.answers() {
        if let RData::TXT(txt) = &record.data {
            records += 1;
            let joined: Vec<u8> = txt.txt_data.iter().flat_map(|s| s.iter().copied()).collect();
            if joined == expected.as_bytes() {
                return Ok(());
            }
        }
    }
    Err(format!(
        "TXT {label}: {records} record{}, none is {expected}",
        if records == 1 { "" } else { "s" }
    ))
}

/// At most `MESSAGE_MAX` characters of what a server sent, with control characters shown
/// escaped: a message repeats it, and must not carry a line break or a terminal escape.
fn cut(text: &str) -> String {
    let mut out: String = text
        .chars()
        .flat_map(char::escape_debug)
        .take(MESSAGE_MAX)
        .collect();
    if text
        .chars()
        .flat_map(char::escape_debug)
        .nth(MESSAGE_MAX)
        .is_some()
    {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::cut;

    #[test]
    fn what_a_server_sent_is_cut_and_escaped() {
        assert_eq!(cut("plain"), "plain");
        assert_eq!(cut("a\nb\u{1b}[31m"), "a\\nb\\u{1b}[31m");
        let long = "x".repeat(1000);
        assert_eq!(cut(&long).chars().count(), super::MESSAGE_MAX + 1);
    }
}
