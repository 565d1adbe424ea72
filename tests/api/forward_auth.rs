//! `/v1/forward-auth`, as a gateway calls it: the agent's token as the request brought it,
//! the guarded request named by the gateway's headers (from a trusted peer only), the
//! receiver's policy in the URL. Every answer a gateway passes on, and every way a caller
//! could try to get a request through.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::dpop::{bound, now, AgentKey};
use crate::helpers::{read, spawn_app, spawn_app_with, Options, Resp, TestApp};

const ORIGIN: &str = "https://api.example";

/// `method url` with these headers.
pub(crate) async fn send(client: &awc::Client, method: &str, url: String, headers: &[(&str, &str)]) -> Resp {
    let mut req = client.request(method.parse().unwrap(), url);
    for (name, value) in headers {
        req = req.append_header((*name, *value));
    }
    read(req.send().await.expect("request")).await
}

impl TestApp {
    /// A gateway's call: `query` is the policy, `headers` what the gateway sends.
    pub(crate) async fn forward(&self, method: &str, query: &str, headers: &[(&str, &str)]) -> Resp {
        let url = self.url(&format!("/v1/forward-auth?{query}"));
        send(&self.client, method, url, headers).await
    }
}

/// A fresh proof by `key` for `htm htu` with `token`.
pub(crate) fn proof(key: &AgentKey, token: &str, htm: &str, htu: &str) -> String {
    key.proof_with(
        &key.header(),
        &json!({"jti": ulid::Ulid::new().to_string(), "htm": htm, "htu": htu, "iat": now(),
                "ath": URL_SAFE_NO_PAD.encode(Sha256::digest(token.as_bytes()))}),
    )
}

/// A pass for an agent token or an agent's signed request sends the headers that name an
/// OAuth client, a person or a third party's signer, empty (a gateway copying them then
/// overwrites a caller's own).
pub(crate) fn agent_token_headers_are_empty(res: &Resp) {
    for empty in [
        "x-agent-client-id",
        "x-agent-subject",
        "x-agent-subject-issuer",
        "x-agent-signature-agent",
    ] {
        assert_eq!(res.header(empty).as_deref(), Some(""), "{empty}");
    }
}

fn refused(res: &Resp, status: u16, code: &str, challenge: &str) {
    assert_eq!(res.status, status, "{}", res.text());
    assert_eq!(res.json()["error"]["code"], code, "{}", res.text());
    let got = res.header("www-authenticate").unwrap_or_default();
    assert!(
        got.starts_with(challenge),
        "{got:?} does not start with {challenge:?}"
    );
    assert!(res.header("x-agent-id").is_none());
}

#[actix_web::test]
async fn a_valid_token_passes_with_the_agents_facts_and_is_recorded() {
    let app = spawn_app().await;
    let (agent, token) = app.agent().await;
    let bearer = format!("Bearer {token}");
    // Any method: NGINX's subrequest carries the guarded request's.
    for method in ["GET", "POST", "DELETE"] {
        let res = app
            .forward(
                method,
                "issuer=example.com&scope=read:docs",
                &[("Authorization", &bearer)],
            )
            .await;
        assert_eq!(res.status, 200, "{method}: {}", res.text());
        assert!(res.body.is_empty());
        assert_eq!(res.header("x-agent-id").as_deref(), Some(agent.as_str()));
        assert_eq!(res.header("x-agent-issuer").as_deref(), Some("example.com"));
        assert_eq!(res.header("x-agent-scopes").as_deref(), Some("read:docs"));
        // Every agent header always, empty where it does not apply.
        agent_token_headers_are_empty(&res);
    }
    let log = app
        .get(&format!("/v1/log?agent_id={agent}"), Some(app.secret()))
        .await
        .json();
    assert_eq!(log["pagination"]["total"], 3, "{log}");
    assert_eq!(log["data"][0]["result"], "valid");
}

#[actix_web::test]
async fn refusals_carry_the_challenge_a_receiver_sends_and_are_recorded() {
    let app = spawn_app().await;
    let (agent, token) = app.agent().await;
    let bearer = format!("Bearer {token}");
    let auth = [("Authorization", bearer.as_str())];

    let res = app.forward("GET", "", &[]).await;
    refused(&res, 401, "TOKEN_INVALID", "Bearer");
    assert!(!res.header("www-authenticate").unwrap().contains("error="));

    // Not for this receiver: an agent token names no audience; an issuer it does not trust.
    let res = app
        .forward("GET", "audience=https%3A%2F%2Fapi.example", &auth)
        .await;
    refused(&res, 401, "TOKEN_INVALID", "Bearer error=\"invalid_token\"");
    let res = app.forward("GET", "issuer=bank.example", &auth).await;
    refused(&res, 401, "TOKEN_INVALID", "Bearer error=\"invalid_token\"");
    let res = app
        .forward("GET", "scope=read:docs&scope=pay:invoices", &auth)
        .await;
    refused(
        &res,
        403,
        "INSUFFICIENT_SCOPE",
        "Bearer error=\"insufficient_scope\", scope=\"read:docs pay:invoices\"",
    );

    let log = app
        .get(
            &format!("/v1/log?agent_id={agent}&result=invalid"),
            Some(app.secret()),
        )
        .await
        .json();
    assert_eq!(log["pagination"]["total"], 3, "{log}");
    assert!(log["data"][0]["failure_reason"]
        .as_str()
        .unwrap()
        .contains("pay:invoices"));

    // A revocation is seen at once.
    assert_eq!(app.revoke(&agent, None).await.status, 200);
    let res = app.forward("GET", "", &auth).await;
    refused(&res, 401, "TOKEN_REVOKED", "Bearer error=\"invalid_token\"");

    let res = app.forward("GET", "", &[("Authorization", "Basic eDp5")]).await;
    refused(&res, 401, "TOKEN_INVALID", "Bearer error=\"invalid_token\"");
    let res = app
        .forward("GET", "", &[("Authorization", "Bearer not.a.token")])
        .await;
    refused(&res, 401, "TOKEN_INVALID", "Bearer error=\"invalid_token\"");
}

#[actix_web::test]
async fn an_access_token_passes_only_the_receiver_it_is_for() {
    let app = spawn_app().await;
    let key = AgentKey::ed();
    let agent = crate::oauth::client(&app, &key).await;
    let issued = crate::oauth::token(&app, &key, &agent, &[("resource", "https://api.example/mcp")]).await;
    let bearer = format!("Bearer {}", issued["access_token"].as_str().unwrap());
    let auth = [("Authorization", bearer.as_str())];
    let res = app
        .forward("GET", "audience=https://api.example/mcp&scope=tools:call", &auth)
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.header("x-agent-client-id").as_deref(), Some(agent.as_str()));
    let res = app
        .forward("GET", "audience=https://other.example/mcp", &auth)
        .await;
    refused(&res, 401, "TOKEN_INVALID", "Bearer error=\"invalid_token\"");
}

#[actix_web::test]
async fn a_bound_token_passes_only_with_a_fresh_proof_for_this_receiver_and_request() {
    let app = spawn_app().await;
    let key = AgentKey::ed();
    let (agent, token) = bound(&app, &key).await;
    let dpop_auth = format!("DPoP {token}");
    let query = format!("origin={ORIGIN}");
    let call = |proof: String, method: &'static str, url: &'static str| {
        let dpop_auth = dpop_auth.clone();
        let query = query.clone();
        let app = &app;
        async move {
            app.forward(
                "GET",
                &query,
                &[
                    ("Authorization", &dpop_auth),
                    ("DPoP", &proof),
                    ("X-Original-Method", method),
                    ("X-Original-URL", url),
                ],
            )
            .await
        }
    };
    let good = proof(&key, &token, "POST", "https://api.example/orders");
    let res = call(good.clone(), "POST", "/orders?id=7").await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.header("x-agent-id").as_deref(), Some(agent.as_str()));

    let res = call(good, "POST", "/orders").await;
    refused(&res, 401, "PROOF_REPLAYED", "DPoP error=\"invalid_dpop_proof\"");
    let foreign = proof(&key, &token, "POST", "https://shop-b.example/orders");
    refused(
        &call(foreign, "POST", "/orders").await,
        401,
        "PROOF_INVALID",
        "DPoP error=\"invalid_dpop_proof\"",
    );
    // The request the proof names, not another one the caller would like.
    let other_method = proof(&key, &token, "POST", "https://api.example/orders");
    refused(
        &call(other_method, "DELETE", "/orders").await,
        401,
        "PROOF_INVALID",
        "DPoP",
    );
    // A forwarded absolute URL counts by its path only: its host is the caller's to choose.
    let fresh = proof(&key, &token, "GET", "https://api.example/orders");
    let res = call(fresh, "GET", "https://shop-b.example/orders").await;
    assert_eq!(res.status, 200, "{}", res.text());

    // One token and one proof: a second copy, which the upstream may read instead of the one
    // checked, is refused.
    for (name, value) in [("DPoP", "x"), ("Authorization", "Bearer x")] {
        let fresh = proof(&key, &token, "GET", "https://api.example/orders");
        let res = app
            .forward(
                "GET",
                &query,
                &[
                    ("Authorization", &dpop_auth),
                    ("DPoP", &fresh),
                    ("X-Original-Method", "GET"),
                    ("X-Original-URL", "/orders"),
                    (name, value),
                ],
            )
            .await;
        let (code, challenge) = match name {
            "DPoP" => ("PROOF_INVALID", "DPoP"),
            _ => ("TOKEN_INVALID", "Bearer"),
        };
        refused(&res, 401, code, challenge);
    }

    // As a bearer token, a bound token is refused.
    let res = app
        .forward("GET", &query, &[("Authorization", &format!("Bearer {token}"))])
        .await;
    refused(&res, 401, "PROOF_INVALID", "DPoP error=\"invalid_token\"");
    // Without an origin in the gateway's URL, no proof can be checked.
    let fresh = proof(&key, &token, "GET", "https://api.example/orders");
    let res = app
        .forward(
            "GET",
            "",
            &[
                ("Authorization", &dpop_auth),
                ("DPoP", &fresh),
                ("X-Original-Method", "GET"),
                ("X-Original-URL", "/orders"),
            ],
        )
        .await;
    refused(&res, 401, "TOKEN_INVALID", "DPoP error=\"invalid_token\"");
}

/// Attack: a gateway that names the request in one family of headers and passes the client's
/// headers on lets the client add the other family; a proof for the client's request (not the
/// one the gateway forwards) passes nothing.
#[actix_web::test]
async fn a_clients_forwarded_headers_cannot_rename_the_request() {
    let app = spawn_app().await;
    let key = AgentKey::ed();
    let (_, token) = bound(&app, &key).await;
    let query = format!("origin={ORIGIN}");
    let dpop_auth = format!("DPoP {token}");
    let lying = proof(&key, &token, "POST", "https://api.example/admin");
    let res = app
        .forward(
            "GET",
            &query,
            &[
                ("Authorization", &dpop_auth),
                ("DPoP", &lying),
                ("X-Original-Method", "GET"),
                ("X-Original-URL", "/orders"),
                ("X-Forwarded-Method", "POST"),
                ("X-Forwarded-Uri", "/admin"),
            ],
        )
        .await;
    refused(&res, 401, "TOKEN_INVALID", "DPoP");
    // Both families naming the same request: that request.
    let fresh = proof(&key, &token, "GET", "https://api.example/orders");
    let res = app
        .forward(
            "GET",
            &query,
            &[
                ("Authorization", &dpop_auth),
                ("DPoP", &fresh),
                ("X-Original-Method", "GET"),
                ("X-Original-URL", "https://api.example/orders"),
                ("X-Forwarded-Method", "GET"),
                ("X-Forwarded-Uri", "/orders"),
            ],
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
}

/// A service listening on `[::]` sees an IPv4 gateway as `::ffff:127.0.0.1`: that is the
/// trusted loopback gateway still, whose forwarded headers name the request.
#[actix_web::test]
async fn a_gateway_reaching_an_ipv6_listener_over_ipv4_is_still_trusted() {
    // A host without IPv6, or whose IPv6 sockets take no IPv4, has no such gateway.
    let dual = std::fs::read_to_string("/proc/sys/net/ipv6/bindv6only").is_ok_and(|v| v.trim() == "0");
    let Some(port) = std::net::TcpListener::bind("[::]:0")
        .ok()
        .filter(|_| dual)
        .and_then(|l| l.local_addr().ok())
        .map(|a| a.port())
    else {
        eprintln!("no dual-stack IPv6 sockets here: the IPv4-mapped gateway test is skipped");
        return;
    };
    let app = spawn_app_with(Options {
        tweak: Box::new(move |c| {
            c.bind = format!("[::]:{port}");
            c.public_url = Some(format!("http://127.0.0.1:{port}"));
        }),
        ..Options::default()
    })
    .await;
    let key = AgentKey::ed();
    let (_, token) = bound(&app, &key).await;
    let fresh = proof(&key, &token, "GET", "https://api.example/orders");
    let url = format!("http://127.0.0.1:{port}/v1/forward-auth?origin={ORIGIN}");
    let dpop_auth = format!("DPoP {token}");
    let headers = [
        ("Authorization", dpop_auth.as_str()),
        ("DPoP", fresh.as_str()),
        ("X-Forwarded-Method", "GET"),
        ("X-Forwarded-Uri", "/orders"),
    ];
    let res = send(&app.client, "GET", url, &headers).await;
    assert_eq!(res.status, 200, "{}", res.text());
}

#[actix_web::test]
async fn forwarded_headers_count_only_from_a_trusted_gateway() {
    let app = spawn_app_with(Options {
        tweak: Box::new(|c| c.forward_auth_trusted_peers = vec!["10.0.0.0/8".parse().unwrap()]),
        ..Options::default()
    })
    .await;
    let key = AgentKey::ed();
    let (_, token) = bound(&app, &key).await;
    let fresh = proof(&key, &token, "GET", "https://api.example/orders");
    let res = app
        .forward(
            "GET",
            &format!("origin={ORIGIN}"),
            &[
                ("Authorization", &format!("DPoP {token}")),
                ("DPoP", &fresh),
                ("X-Forwarded-Method", "GET"),
                ("X-Forwarded-Uri", "/orders"),
            ],
        )
        .await;
    refused(&res, 401, "TOKEN_INVALID", "DPoP error=\"invalid_token\"");
    assert!(res.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("trusted peer"));
    // Nor does Envoy's form name the request, from an untrusted peer.
    let fresh = proof(&key, &token, "GET", "https://api.example/orders");
    let url = app.url("/v1/forward-auth/orders");
    let headers = [
        ("Authorization", format!("DPoP {token}")),
        ("DPoP", fresh),
        ("X-Agentid-Policy", format!("origin={ORIGIN}")),
    ];
    let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
    let res = send(&app.client, "GET", url, &headers).await;
    refused(&res, 401, "TOKEN_INVALID", "DPoP error=\"invalid_token\"");
    // A bearer token needs no forwarded request.
    let (_, plain) = app.agent().await;
    let res = app
        .forward("GET", "", &[("Authorization", &format!("Bearer {plain}"))])
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
}

#[actix_web::test]
async fn the_policy_is_the_gateways_and_a_misspelt_one_is_refused() {
    let app = spawn_app().await;
    let (_, token) = app.agent().await;
    let bearer = format!("Bearer {token}");
    // The guarded URI's query is never read as policy.
    let res = app
        .forward(
            "GET",
            "scope=read:docs",
            &[
                ("Authorization", &bearer),
                ("X-Original-Method", "GET"),
                (
                    "X-Original-URL",
                    "/orders?scope=admin:all&audience=x:y&issuer=evil.example",
                ),
            ],
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    let many_issuers = (0..17)
        .map(|i| format!("issuer=i{i}.example"))
        .collect::<Vec<_>>()
        .join("&");
    for query in [
        "scopes=read:docs",
        "scope=READ",
        "origin=https://a.example/path",
        "audience=nouri",
        "allow_test=yes",
        many_issuers.as_str(),
    ] {
        let res = app.forward("GET", query, &[("Authorization", &bearer)]).await;
        assert_eq!(res.status, 400, "{query}: {}", res.text());
        assert_eq!(res.json()["error"]["code"], "VALIDATION_ERROR");
    }
}

/// A token issued with a test-mode key passes only a gateway whose URL allows test tokens, as
/// the receiver libraries refuse it unless built to take it.
#[actix_web::test]
async fn a_test_mode_token_passes_only_where_the_policy_allows_test_tokens() {
    let app = spawn_app().await;
    let body = json!({"name": "bot", "issuer_domain": "example.com", "scopes": ["read:docs"]});
    let test_key = app.org.keys.secret_test.clone();
    let registered = app.register_with(&test_key, body).await;
    let bearer = format!("Bearer {}", registered["token"].as_str().unwrap());
    for query in ["issuer=example.com", "issuer=example.com&allow_test=false"] {
        let res = app.forward("GET", query, &[("Authorization", &bearer)]).await;
        refused(&res, 401, "TOKEN_INVALID", "Bearer error=\"invalid_token\"");
        assert!(res.text().contains("test-mode"), "{}", res.text());
    }
    let res = app
        .forward(
            "GET",
            "issuer=example.com&allow_test=true",
            &[("Authorization", &bearer)],
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(
        res.header("x-agent-id").as_deref(),
        registered["agent_id"].as_str()
    );
}

/// Attack: a gateway URL with one character too many, `/v1/forward-auth/?scope=…`, was read
/// as Envoy's path form, whose query is the guarded request's and whose policy is a header the
/// gateway did not send: every live agent of every organization passed. The path form without
/// its policy header is refused.
#[actix_web::test]
async fn the_path_form_without_its_policy_header_is_refused() {
    let app = spawn_app().await;
    let (_, token) = app.agent().await; // example.com, read:docs
    for path in [
        "/v1/forward-auth/?scope=write:docs&issuer=a.io",
        "/v1/forward-auth/docs",
    ] {
        let res = read(
            app.client
                .get(app.url(path))
                .insert_header(("Authorization", format!("Bearer {token}")))
                .send()
                .await
                .expect("request"),
        )
        .await;
        res.assert_error(400, "VALIDATION_ERROR");
        assert!(res.text().contains("X-Agentid-Policy"), "{}", res.text());
    }
    // An empty policy header says "no policy" on purpose.
    let res = read(
        app.client
            .get(app.url("/v1/forward-auth/docs"))
            .insert_header(("Authorization", format!("Bearer {token}")))
            .insert_header(("X-Agentid-Policy", ""))
            .send()
            .await
            .expect("request"),
    )
    .await;
    assert_eq!(res.status, 200, "{}", res.text());
}

/// Envoy's `ext_authz` over HTTP calls `path_prefix` + the guarded path and query, with the
/// guarded method, and the headers its configuration adds (the policy) over the caller's.
#[actix_web::test]
async fn envoys_form_names_the_request_in_its_path_and_the_policy_in_a_header() {
    let app = spawn_app().await;
    let key = AgentKey::ed();
    let (agent, token) = bound(&app, &key).await;
    let dpop_auth = format!("DPoP {token}");
    let policy = format!("scope=read:docs&issuer=example.com&origin={ORIGIN}");
    let envoy = |method: &'static str,
                 path: &'static str,
                 proof: String,
                 extra: Vec<(&'static str, &'static str)>| {
        let (dpop_auth, policy, app) = (dpop_auth.clone(), policy.clone(), &app);
        async move {
            let mut headers = vec![
                ("Authorization", dpop_auth.as_str()),
                ("DPoP", proof.as_str()),
                ("X-Agentid-Policy", policy.as_str()),
            ];
            headers.extend(extra);
            let url = app.url(&format!("/v1/forward-auth{path}"));
            send(&app.client, method, url, &headers).await
        }
    };
    // The guarded request's query is the caller's: never policy (this one would let anyone in).
    let good = proof(&key, &token, "POST", "https://api.example/orders/7");
    let res = envoy("POST", "/orders/7?audience=x:y&scope=", good, vec![]).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.header("x-agent-id").as_deref(), Some(agent.as_str()));
    assert_eq!(res.header("x-agent-scopes").as_deref(), Some("read:docs"));
    // The request checked is the call's own: a caller's forwarded headers change nothing.
    let elsewhere = proof(&key, &token, "DELETE", "https://api.example/admin");
    let forged = vec![("X-Forwarded-Method", "DELETE"), ("X-Forwarded-Uri", "/admin")];
    refused(
        &envoy("GET", "/orders/7", elsewhere, forged).await,
        401,
        "PROOF_INVALID",
        "DPoP error=\"invalid_dpop_proof\"",
    );
    // The policy holds: a writer lacks read:docs.
    let writer = app
        .register(json!({"name": "w", "issuer_domain": "example.com", "scopes": ["write:docs"]}))
        .await;
    let res = app
        .client
        .get(app.url("/v1/forward-auth/docs"))
        .insert_header((
            "Authorization",
            format!("Bearer {}", writer["token"].as_str().unwrap()),
        ))
        .insert_header(("X-Agentid-Policy", policy.as_str()))
        .send()
        .await
        .expect("request");
    let res = read(res).await;
    refused(
        &res,
        403,
        "INSUFFICIENT_SCOPE",
        "Bearer error=\"insufficient_scope\"",
    );
    // A misspelt policy is refused, as in the query.
    let res = read(
        app.client
            .get(app.url("/v1/forward-auth/docs"))
            .insert_header(("Authorization", format!("Bearer {token}")))
            .insert_header(("X-Agentid-Policy", "scopes=read:docs"))
            .send()
            .await
            .expect("request"),
    )
    .await;
    assert_eq!(res.status, 400, "{}", res.text());
}

#[actix_web::test]
async fn a_call_that_cannot_be_recorded_is_not_let_through() {
    let app = spawn_app_with(Options::unlimited()).await;
    let (_, token) = app.agent().await;
    let auth = [("Authorization", format!("Bearer {token}"))];
    let auth: Vec<(&str, &str)> = auth.iter().map(|(n, v)| (*n, v.as_str())).collect();
    assert_eq!(app.forward("GET", "", &auth).await.status, 200);
    assert!(app.store.inject_write_fault(agentid::store::WriteFault::Panic));
    let res = app.forward("GET", "", &auth).await;
    res.assert_error(503, "AUDIT_UNAVAILABLE");
    assert_eq!(res.header("retry-after").as_deref(), Some("1"));
    assert!(res.header("x-agent-id").is_none());
    assert_eq!(app.forward("GET", "", &auth).await.status, 200);
}

#[actix_web::test]
async fn a_gateways_publishable_key_moves_it_to_its_organizations_limit() {
    let app = spawn_app().await;
    let (_, token) = app.agent().await;
    let bearer = format!("Bearer {token}");
    let res = app
        .forward(
            "GET",
            "",
            &[
                ("Authorization", &bearer),
                ("X-Agentid-Key", &app.org.keys.publishable_live),
            ],
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    let anonymous = app.forward("GET", "", &[("Authorization", &bearer)]).await;
    assert_ne!(
        res.header("x-ratelimit-limit"),
        anonymous.header("x-ratelimit-limit")
    );
    let res = app
        .forward(
            "GET",
            "",
            &[("Authorization", &bearer), ("X-Agentid-Key", "pk_live_nope")],
        )
        .await;
    assert_eq!(res.status, 401, "{}", res.text());
    assert_eq!(res.json()["error"]["code"], "UNAUTHORIZED");
}
