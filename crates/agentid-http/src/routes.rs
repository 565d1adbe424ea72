//! The route table: for each route, what the router, the gate and the metrics know of it.
//! The router mounts each route with its facts (`super::app`), the gate reads its rate-limit
//! class and whether it is public, and metrics and logs name the route by its pattern.

use agentid_engine::ratelimit::Class;

/// The facts of one route.
#[derive(Debug)]
pub(crate) struct Route {
    /// As the router matches it, and as metrics and logs name it (never the path: verify
    /// paths hold tokens).
    pub(crate) pattern: &'static str,
    /// The rate-limit bucket its calls count against, or would (see `counted`).
    pub(crate) class: Class,
    /// Its calls take a cell of the bucket. The headers describe the bucket either way.
    pub(crate) counted: bool,
    /// Any origin may call it without a key: CORS `*` (preflight included), also on the
    /// answers the gate makes itself.
    pub(crate) public: bool,
    /// A public document: an `Authorization` header is not even read (no key look-up, no
    /// charge, no error), and the headers describe the address's anonymous bucket.
    pub(crate) keyless: bool,
    /// An OAuth endpoint: its errors, the gate's own included, have RFC 6749's body
    /// (`{"error", "error_description"}`), not the service's.
    pub(crate) oauth: bool,
    /// The header an API key comes in: `Authorization`, except where that header carries
    /// something else (forward auth: the agent's token).
    pub(crate) key_header: &'static str,
}

const AUTHORIZATION: &str = "authorization";

impl Route {
    /// Whether its API key comes as `Authorization: Bearer <key>` (else in `key_header` alone).
    pub(crate) fn key_in_authorization(&self) -> bool {
        self.key_header == AUTHORIZATION
    }
}

const fn other(pattern: &'static str) -> Route {
    Route {
        pattern,
        class: Class::Other,
        counted: true,
        public: false,
        keyless: false,
        oauth: false,
        key_header: AUTHORIZATION,
    }
}

/// A public document, served from memory: never limited and charged to no bucket, so that
/// receivers behind one address, or a co-tenant of theirs, cannot starve each other of keys,
/// and a publishable key cannot spend its organization's calls on them.
const fn document(pattern: &'static str) -> Route {
    Route {
        pattern,
        class: Class::Other,
        counted: false,
        public: true,
        keyless: true,
        oauth: false,
        key_header: AUTHORIZATION,
    }
}

/// Never limited: a balancer's health checks must not spend anyone's calls, nor be refused.
pub(crate) static HEALTH: Route = Route {
    pattern: "/health",
    class: Class::Other,
    counted: false,
    public: true,
    keyless: false,
    oauth: false,
    key_header: AUTHORIZATION,
};
pub(crate) static PUBLIC_KEY: Route = document("/.well-known/public-key.pem");
pub(crate) static JWKS: Route = document("/.well-known/jwks.json");
pub(crate) static LOG_KEY: Route = document("/.well-known/log-key");
pub(crate) static ERROR_DOCS: Route = document("/docs/errors");
pub(crate) static OPENAPI: Route = document("/openapi.json");
/// Token Status Lists: public documents like the keys.
pub(crate) static STATUS_LIST: Route = document("/v1/status/{id}");
/// A verification: verify's own class and limits, callable from any origin, a key optional.
const fn verifying(pattern: &'static str) -> Route {
    Route {
        pattern,
        class: Class::Verify,
        counted: true,
        public: true,
        keyless: false,
        oauth: false,
        key_header: AUTHORIZATION,
    }
}

/// Mounted by its static prefix (`/v1/verify`), with the token as the rest of the path.
pub(crate) static VERIFY: Route = verifying("/v1/verify/{token}");
/// A token with its DPoP proof: verify's own class and limits.
pub(crate) static VERIFY_DPOP: Route = verifying("/v1/verify");
/// A signed request's check: verify's own class and limits.
pub(crate) static VERIFY_REQUEST: Route = verifying("/v1/verify/request");
/// An issuer's signature directory: public, keyless, read from the store, so counted against
/// the caller's address (receivers cache it a minute).
pub(crate) static DIRECTORY: Route = Route {
    pattern: "/v1/directories/{issuer_domain}",
    class: Class::Other,
    counted: true,
    public: true,
    keyless: true,
    oauth: false,
    key_header: AUTHORIZATION,
};
pub(crate) static REGISTER: Route = other("/v1/agents/register");
pub(crate) static AGENTS: Route = other("/v1/agents");
pub(crate) static AGENT: Route = other("/v1/agents/{id}");
pub(crate) static ISSUE_TOKEN: Route = other("/v1/agents/{id}/issue-token");
pub(crate) static CLIENT_SECRET: Route = other("/v1/agents/{id}/client-secret");
pub(crate) static IDENTITY_PROVIDERS: Route = other("/v1/identity-providers");
pub(crate) static IDENTITY_PROVIDER: Route = other("/v1/identity-providers/{id}");
pub(crate) static SUBJECTS_REVOKE: Route = other("/v1/subjects/revoke");
pub(crate) static REVOKE: Route = other("/v1/agents/{id}/revoke");
pub(crate) static DOMAINS: Route = other("/v1/domains");
pub(crate) static DOMAIN: Route = other("/v1/domains/{domain}");
pub(crate) static DOMAIN_VERIFY: Route = other("/v1/domains/{domain}/verify");
pub(crate) static LOG: Route = other("/v1/log");
pub(crate) static LOG_CHECKPOINT: Route = other("/v1/log/checkpoint");
pub(crate) static LOG_COMMITMENTS: Route = other("/v1/log/commitments");
pub(crate) static INCLUSION_PROOF: Route = other("/v1/log/proof/inclusion");
pub(crate) static CONSISTENCY_PROOF: Route = other("/v1/log/proof/consistency");
/// Shared Signals: discovery is a public document; streams are the issuer's (secret keys).
pub(crate) static SSF_CONFIGURATION: Route = document("/.well-known/ssf-configuration");
pub(crate) static SSF_STREAMS: Route = other("/ssf/streams");
pub(crate) static SSF_STATUS: Route = other("/ssf/status");
pub(crate) static SSF_SUBJECTS_ADD: Route = other("/ssf/subjects/add");
pub(crate) static SSF_SUBJECTS_REMOVE: Route = other("/ssf/subjects/remove");
pub(crate) static SSF_VERIFY: Route = other("/ssf/verify");
/// A receiver polls with its stream's poll token, which is no API key: the key is not looked
/// up, and the call counts against the caller's address.
pub(crate) static SSF_POLL: Route = Route {
    pattern: "/ssf/poll/{stream_id}",
    class: Class::Other,
    counted: true,
    public: false,
    keyless: true,
    oauth: false,
    key_header: AUTHORIZATION,
};
/// OAuth 2 (RFC 8414): the authorization server's metadata, a public document. agentid is no
/// OpenID provider: `/.well-known/openid-configuration` is an unknown route (404), and stock
/// clients fall back to this one.
pub(crate) static OAUTH_METADATA: Route = document("/.well-known/oauth-authorization-server");
/// Answers every request `unsupported_response_type`: agents use no browser flow.
pub(crate) static OAUTH_AUTHORIZE: Route = Route {
    pattern: "/oauth/authorize",
    class: Class::Other,
    counted: true,
    public: false,
    keyless: true,
    oauth: true,
    key_header: AUTHORIZATION,
};
/// An agent authenticates with its own key, not an API key: its calls count against its
/// organization's limit once the handler knows who it is, and a failed one against the
/// caller's address (see `oauth::token`).
pub(crate) static OAUTH_TOKEN: Route = Route {
    pattern: "/oauth/token",
    class: Class::Other,
    counted: false,
    public: false,
    keyless: true,
    oauth: true,
    key_header: AUTHORIZATION,
};
/// RFC 7662, limited like verify: per address, or a `pk_` key's organization.
pub(crate) static OAUTH_INTROSPECT: Route = Route {
    pattern: "/oauth/introspect",
    class: Class::Verify,
    counted: true,
    public: false,
    keyless: false,
    oauth: true,
    key_header: AUTHORIZATION,
};
/// A gateway's subrequest (NGINX `auth_request`, Caddy `forward_auth`, …): any method, the
/// agent's token in `Authorization`, so the gateway's own `pk_` key (which lifts the address's
/// limit, as on verify) comes in `X-Agentid-Key`.
pub(crate) static FORWARD_AUTH: Route = Route {
    pattern: "/v1/forward-auth",
    class: Class::Verify,
    counted: true,
    public: false,
    keyless: false,
    oauth: false,
    key_header: "x-agentid-key",
};
/// What a path that no route takes counts as.
pub(crate) static UNMATCHED: Route = other("unmatched");

/// The response headers a browser caller of a public route may read.
pub(crate) const EXPOSED_HEADERS: &str =
    "x-request-id, x-ratelimit-limit, x-ratelimit-remaining, x-ratelimit-reset, retry-after";

/// CORS for the public routes.
pub(crate) fn cors() -> actix_cors::Cors {
    actix_cors::Cors::default()
        .allow_any_origin()
        .send_wildcard()
        .allowed_methods(["GET", "HEAD", "POST"])
        .allow_any_header()
        .expose_headers(EXPOSED_HEADERS.split(", "))
        .max_age(86_400)
}
