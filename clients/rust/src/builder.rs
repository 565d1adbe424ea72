//! [`Builder`]: how a [`Verifier`] is made, and what it is told.

use std::collections::HashSet;
use std::sync::{Arc, Once};
use std::time::Duration;

use parking_lot::Mutex;

use crate::{Error, Inner, Verifier, FETCHES, VERIFICATIONS};

/// Whether a verifier without issuers was built already (the warning says so once a process).
static WITHOUT_ISSUERS: Once = Once::new();

/// Warns, the first time `once` sees it, that a verifier without issuers takes every
/// organization's agents.
fn warn_without_issuers(once: &Once, base: &str) -> bool {
    let mut warned = false;
    once.call_once(|| {
        log::warn!(
            "a Verifier without issuers accepts the agents of every organization of {base}: name \
             the issuer domains you trust (.issuers([...]))"
        );
        warned = true;
    });
    warned
}

/// How a [`Verifier`] is made.
pub struct Builder {
    base_url: String,
    issuers: Option<HashSet<String>>,
    leeway: Duration,
    list_grace: Duration,
    fail_open: bool,
    allow_test: bool,
    allow_local: bool,
    kid_refetch: Duration,
    timeout: Duration,
    set_audience: Option<String>,
    dpop_max_skew: Duration,
    on_refusal: Option<RefusalHook>,
    audience: Option<Vec<String>>,
}

/// What [`Builder::on_refusal`] is given.
pub(crate) type RefusalHook = Arc<dyn Fn(&str, &str) + Send + Sync>;

impl Builder {
    /// Accepted `iss` values of tokens, and of the subjects of SETs (`sub_id.iss`); any when
    /// not set.
    pub fn issuers<I: IntoIterator<Item = S>, S: Into<String>>(mut self, issuers: I) -> Self {
        self.issuers = Some(issuers.into_iter().map(Into::into).collect());
        self
    }
    /// Tolerance on `exp` and `iat` (30 s).
    pub fn leeway(mut self, d: Duration) -> Self {
        self.leeway = d;
        self
    }
    /// How long past its `ttl` a status list that cannot be refetched is still used (300 s).
    pub fn list_grace(mut self, d: Duration) -> Self {
        self.list_grace = d;
        self
    }
    /// Judge a token on signature and claims alone when its list cannot be had (false).
    pub fn fail_open(mut self, yes: bool) -> Self {
        self.fail_open = yes;
        self
    }
    /// Accept test-mode tokens (`"livemode": false`, issued with an `sk_test_` key); refused
    /// as `TOKEN_INVALID` otherwise (false).
    pub fn allow_test(mut self, yes: bool) -> Self {
        self.allow_test = yes;
        self
    }
    /// For development and tests: plain `http://` and addresses that are not globally
    /// reachable (loopback, private, link-local, …). Without it (false), every fetch is
    /// `https://` to a host whose every address is globally reachable, and an `http://` base
    /// URL is `MISCONFIGURED` at [`Builder::build`].
    pub fn allow_local(mut self, yes: bool) -> Self {
        self.allow_local = yes;
        self
    }
    /// Least time between refetches of the keys for unknown kids (60 s).
    pub fn kid_refetch_interval(mut self, d: Duration) -> Self {
        self.kid_refetch = d;
        self
    }
    /// The most a request to the service may take, its answer (at most 1 MiB) included (5 s).
    /// Zero is `MISCONFIGURED` at [`Builder::build`].
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = d;
        self
    }
    /// The `aud` of this receiver's Shared Signals stream: what the stream was created with,
    /// by default the push endpoint's origin (push) or the stream id (poll). When set,
    /// [`Verifier::handle_set`] refuses a SET whose `aud` (a string or an array) does not
    /// hold it.
    pub fn set_audience(mut self, aud: impl Into<String>) -> Self {
        self.set_audience = Some(aud.into());
        self
    }
    /// Told of every refusal of [`Verifier::verify_with_scopes`] (and `verify`),
    /// [`Verifier::verify_dpop`] and [`Verifier::verify_online`]: its code and its reason,
    /// whose controls, separators and bidirectional overrides come escaped ([`printable`](crate::printable)).
    pub fn on_refusal(mut self, hook: impl Fn(&str, &str) + Send + Sync + 'static) -> Self {
        self.on_refusal = Some(Arc::new(hook));
        self
    }
    /// How far a DPoP proof's `iat` may be from now, either way (60 s).
    pub fn dpop_max_skew(mut self, d: Duration) -> Self {
        self.dpop_max_skew = d;
        self
    }
    /// This receiver's resource identifier (a URI; call again to add another). When set, a
    /// token is accepted only when its `aud` names one of them: an agent token (which names
    /// none) and an access token for another receiver are `TOKEN_INVALID`.
    pub fn audience(mut self, resource: impl Into<String>) -> Self {
        self.audience.get_or_insert_with(Vec::new).push(resource.into());
        self
    }
    /// The verifier; `MISCONFIGURED` for a base URL that is not https (or http with
    /// [`Builder::allow_local`]) or a zero timeout.
    pub fn build(self) -> Result<Verifier, Error> {
        let base = self.base_url.trim_end_matches('/').to_owned();
        if let Some(why) = crate::reach::refusal(&base, self.allow_local) {
            return Err(Error::Misconfigured(format!("the base URL {base:?} {why}")));
        }
        if self.timeout.is_zero() {
            return Err(Error::Misconfigured("the timeout must be more than zero".into()));
        }
        if self
            .audience
            .as_ref()
            .is_some_and(|a| a.iter().any(String::is_empty))
        {
            return Err(Error::Misconfigured("an audience must be a URI".into()));
        }
        if self.issuers.is_none() {
            warn_without_issuers(&WITHOUT_ISSUERS, &base);
        }
        metrics::describe_counter!(
            VERIFICATIONS,
            "Verifications by outcome: valid, or the refusal's code."
        );
        metrics::describe_counter!(FETCHES, "Fetches of the key set and status lists by result.");
        Ok(Verifier {
            inner: Arc::new(Inner {
                tls: crate::transport::tls(),
                timeout: self.timeout,
                base,
                issuers: self.issuers,
                leeway: i64::try_from(self.leeway.as_secs()).unwrap_or(i64::MAX),
                list_grace: self.list_grace,
                fail_open: self.fail_open,
                allow_test: self.allow_test,
                allow_local: self.allow_local,
                kid_refetch: self.kid_refetch,
                set_audience: self.set_audience,
                dpop_max_skew: i64::try_from(self.dpop_max_skew.as_secs()).unwrap_or(i64::MAX),
                on_refusal: self.on_refusal,
                audience: self.audience,
                state: Mutex::default(),
                fetching_keys: tokio::sync::Mutex::default(),
                fetching_lists: tokio::sync::Mutex::default(),
            }),
        })
    }
}

impl Verifier {
    pub fn builder(base_url: impl Into<String>) -> Builder {
        Builder {
            base_url: base_url.into(),
            issuers: None,
            leeway: Duration::from_secs(30),
            list_grace: Duration::from_secs(300),
            fail_open: false,
            allow_test: false,
            allow_local: false,
            kid_refetch: Duration::from_secs(60),
            timeout: Duration::from_secs(5),
            set_audience: None,
            dpop_max_skew: Duration::from_secs(60),
            on_refusal: None,
            audience: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verifier_without_issuers_is_warned_of_once() {
        let once = Once::new();
        assert!(warn_without_issuers(&once, "http://127.0.0.1:9"));
        assert!(!warn_without_issuers(&once, "http://127.0.0.1:9"));
        // Built with issuers, no warning is due; without, the process-wide one is spent.
        Verifier::builder("https://127.0.0.1:9")
            .issuers(["example.com"])
            .build()
            .unwrap();
        Verifier::builder("https://127.0.0.1:9").build().unwrap();
        assert!(WITHOUT_ISSUERS.is_completed());
    }

    #[test]
    fn plain_http_is_for_development_only() {
        let plain = Verifier::builder("http://id.example.com").issuers(["example.com"]);
        assert_eq!(plain.build().err().map(|e| e.code()), Some("MISCONFIGURED"));
        let local = Verifier::builder("http://127.0.0.1:9")
            .issuers(["example.com"])
            .allow_local(true);
        assert!(local.build().is_ok());
    }
}
