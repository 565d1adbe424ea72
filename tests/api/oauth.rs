//! agentid as an OAuth 2 authorization server: metadata (RFC 8414), agents getting their
//! own access tokens (client credentials with `private_key_jwt`, RFC 7523; `resource`, RFC
//! 8707; DPoP, RFC 9449), the tokens (RFC 9068) as verify and introspection (RFC 7662) see
//! them, and each way a client could try to get a token it should not.

use agentid::domain::audit::MAX_FAILURE_REASON;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde_json::{json, Value};

use crate::dpop::{b64, bound, now, payload, thumbprint, AgentKey};
use crate::helpers::{read, spawn_app, spawn_app_with, spawn_fleet, Options, Resp, TestApp};

const RESOURCE: &str = "https://api.example/mcp";
const ASSERTION_TYPE: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";

impl TestApp {
    /// A form POST, with extra headers.
    pub(crate) async fn post_form(
        &self,
        path: &str,
        form: &[(&str, &str)],
        headers: &[(&str, &str)],
    ) -> Resp {
        let mut req = self.client.post(self.url(path));
        for (name, value) in headers {
            req = req.insert_header((*name, *value));
        }
        read(req.send_form(&form).await.expect("request")).await
    }
}

/// A client assertion for `agent`, signed by `key`, for `aud`, with `extra` claims over the
/// usual ones (a null removes one).
fn assertion_with(key: &AgentKey, agent: &str, header: Value, extra: Value) -> String {
    let mut claims = json!({"iss": agent, "sub": agent, "aud": "", "iat": now(), "exp": now() + 300,
                            "jti": ulid::Ulid::new().to_string()});
    for (k, v) in extra.as_object().unwrap() {
        if v.is_null() {
            claims.as_object_mut().unwrap().remove(k);
        } else {
            claims[k] = v.clone();
        }
    }
    let input = format!("{}.{}", b64(&header), b64(&claims));
    format!("{input}.{}", URL_SAFE_NO_PAD.encode(key.sign(&input)))
}

fn assertion(app: &TestApp, key: &AgentKey, agent: &str) -> String {
    assertion_with(
        key,
        agent,
        json!({"alg": key.alg(), "typ": "JWT"}),
        json!({"aud": app.base}),
    )
}

/// A token request by `agent` with `assertion`, and `extra` form fields.
async fn ask(app: &TestApp, assertion: &str, extra: &[(&str, &str)]) -> Resp {
    let mut form = vec![
        ("grant_type", "client_credentials"),
        ("client_assertion_type", ASSERTION_TYPE),
        ("client_assertion", assertion),
    ];
    form.extend_from_slice(extra);
    app.post_form("/oauth/token", &form, &[]).await
}

fn assert_oauth_error(res: &Resp, status: u16, code: &str) -> String {
    assert_eq!(res.status, status, "{code}: {}", res.text());
    let body = res.json();
    assert_eq!(body["error"], code, "{body}");
    assert_eq!(res.header("cache-control").as_deref(), Some("no-store"), "{code}");
    if status == 401 {
        assert!(
            res.header("www-authenticate").is_some(),
            "a 401 challenges: {code}"
        );
    }
    res.assert_rate_limit_headers(code);
    body["error_description"].as_str().unwrap().to_owned()
}

/// An agent bound to `key`, with two scopes.
pub(crate) async fn client(app: &TestApp, key: &AgentKey) -> String {
    let a = app
        .register(json!({"name": "mcp agent", "issuer_domain": "example.com",
                         "scopes": ["tools:call", "read:docs"], "jwk": key.jwk()}))
        .await;
    a["agent_id"].as_str().unwrap().to_owned()
}

pub(crate) async fn token(app: &TestApp, key: &AgentKey, agent: &str, extra: &[(&str, &str)]) -> Value {
    let res = ask(app, &assertion(app, key, agent), extra).await;
    assert_eq!(res.status, 200, "{}", res.text());
    res.json()
}

/// An access token for `resource`, bound to `dpop`'s key (RFC 9449 §5).
pub(crate) async fn bound_token(
    app: &TestApp,
    key: &AgentKey,
    agent: &str,
    resource: &str,
    dpop: &AgentKey,
) -> String {
    let proof = dpop.proof_with(
        &dpop.header(),
        &json!({"jti": ulid::Ulid::new().to_string(), "htm": "POST",
                "htu": format!("{}/oauth/token", app.base), "iat": now()}),
    );
    let assertion = assertion(app, key, agent);
    let form = [
        ("grant_type", "client_credentials"),
        ("client_assertion_type", ASSERTION_TYPE),
        ("client_assertion", assertion.as_str()),
        ("resource", resource),
    ];
    let res = app.post_form("/oauth/token", &form, &[("DPoP", &proof)]).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["token_type"], "DPoP");
    res.json()["access_token"].as_str().unwrap().to_owned()
}

/// A bad key in `Authorization` is answered with the challenge of its scheme; an outage with
/// no word of the store's.
#[actix_web::test]
async fn introspection_refusals_name_their_scheme_and_no_internals() {
    let app = spawn_app().await;
    let (_, token) = app.agent().await;
    let bad = format!("Bearer pk_live_{}", "x".repeat(40));
    let res = app
        .post_form(
            "/oauth/introspect",
            &[("token", &token)],
            &[("Authorization", &bad)],
        )
        .await;
    assert_eq!(res.status, 401, "{}", res.text());
    assert_eq!(res.json()["error"], "invalid_client");
    assert_eq!(res.header("www-authenticate").as_deref(), Some("Bearer"));
    app.store.close().await;
    let res = app
        .post_form("/oauth/introspect", &[("token", &token)], &[])
        .await;
    assert_eq!(res.status, 503, "{}", res.text());
    assert_eq!(res.json()["error"], "temporarily_unavailable");
    let said = res.json()["error_description"].as_str().unwrap().to_lowercase();
    for word in ["store", "pool", "sql", "database"] {
        assert!(!said.contains(word), "{said}");
    }
}

async fn introspect(app: &TestApp, token: &str) -> Value {
    let res = app.post_form("/oauth/introspect", &[("token", token)], &[]).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.header("cache-control").as_deref(), Some("no-store"));
    res.json()
}

#[actix_web::test]
async fn the_metadata_names_the_issuer_and_its_endpoints() {
    let app = spawn_app().await;
    let res = app.get("/.well-known/oauth-authorization-server", None).await;
    assert_eq!(res.status, 200);
    let m = res.json();
    let issuer = app.base.trim_end_matches('/');
    assert_eq!(m["issuer"], issuer);
    assert!(!issuer.ends_with('/'));
    assert_eq!(m["authorization_endpoint"], format!("{issuer}/oauth/authorize"));
    assert_eq!(m["token_endpoint"], format!("{issuer}/oauth/token"));
    assert_eq!(m["introspection_endpoint"], format!("{issuer}/oauth/introspect"));
    assert_eq!(m["jwks_uri"], format!("{issuer}/.well-known/jwks.json"));
    assert_eq!(
        m["grant_types_supported"],
        json!([
            "client_credentials",
            "urn:ietf:params:oauth:grant-type:token-exchange",
            "urn:ietf:params:oauth:grant-type:jwt-bearer"
        ])
    );
    assert_eq!(
        m["token_endpoint_auth_methods_supported"],
        json!(["private_key_jwt", "client_secret_basic", "client_secret_post"])
    );
    assert_eq!(
        m["token_endpoint_auth_signing_alg_values_supported"],
        json!(["EdDSA", "ES256"])
    );
    assert_eq!(m["dpop_signing_alg_values_supported"], json!(["EdDSA", "ES256"]));
    assert!(m["response_types_supported"].is_array());
    // Not an OpenID provider.
    assert_eq!(
        app.get("/.well-known/openid-configuration", None).await.status,
        404
    );
    // No browser flow, and no redirect to whatever the request names.
    for res in [
        app.get(
            "/oauth/authorize?response_type=code&client_id=x&redirect_uri=https://evil.example/cb",
            None,
        )
        .await,
        app.post_form("/oauth/authorize", &[("response_type", "code")], &[])
            .await,
    ] {
        assert_oauth_error(&res, 400, "unsupported_response_type");
        assert!(res.header("location").is_none());
    }
}

#[actix_web::test]
async fn an_agent_gets_an_access_token_for_the_resource_it_names() {
    let app = spawn_app().await;
    for key in [AgentKey::ed(), AgentKey::es()] {
        let agent = client(&app, &key).await;
        let before = now();
        let res = ask(
            &app,
            &assertion(&app, &key, &agent),
            &[("resource", RESOURCE), ("scope", "tools:call")],
        )
        .await;
        assert_eq!(res.status, 200, "{}", res.text());
        assert_eq!(res.header("cache-control").as_deref(), Some("no-store"));
        assert_eq!(res.header("pragma").as_deref(), Some("no-cache"));
        res.assert_rate_limit_headers("token");
        let answer = res.json();
        assert_eq!(answer["token_type"], "Bearer");
        assert_eq!(answer["expires_in"], 900);
        assert_eq!(answer["scope"], "tools:call");
        let token = answer["access_token"].as_str().unwrap();
        let header: Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(token.split('.').next().unwrap()).unwrap())
                .unwrap();
        assert_eq!(header["typ"], "at+jwt");
        assert_eq!(header["alg"], "EdDSA");
        assert!(header["kid"].is_string());
        let c = payload(token);
        assert_eq!(c["iss"], app.base.trim_end_matches('/'));
        assert_eq!(c["sub"], agent);
        assert_eq!(c["client_id"], agent);
        assert_eq!(c["aud"], RESOURCE);
        assert_eq!(c["scope"], "tools:call");
        assert_eq!(c["issuer_domain"], "example.com");
        assert!(c["jti"].is_string() && c["status"]["status_list"]["idx"].is_u64());
        assert!(c.get("livemode").is_none() && c.get("cnf").is_none() && c.get("scopes").is_none());
        let iat = c["iat"].as_i64().unwrap();
        assert!((before..=now()).contains(&iat));
        assert_eq!(c["exp"].as_i64().unwrap() - iat, 900);

        // Verify and introspection see what the token is for.
        let v = app.verify(token).await;
        assert_eq!(v["valid"], true, "{v}");
        assert_eq!(
            (&v["aud"], &v["client_id"], &v["scope"]),
            (&json!(RESOURCE), &json!(agent), &json!("tools:call"))
        );
        assert_eq!(
            (&v["issuer"], &v["scopes"]),
            (&json!("example.com"), &json!(["tools:call"]))
        );
        let i = introspect(&app, token).await;
        assert_eq!(i["active"], true);
        for (k, want) in [
            ("iss", json!(app.base.trim_end_matches('/'))),
            ("sub", json!(agent)),
            ("client_id", json!(agent)),
            ("aud", json!(RESOURCE)),
            ("scope", json!("tools:call")),
            ("token_type", json!("Bearer")),
            ("issuer_domain", json!("example.com")),
            ("exp", c["exp"].clone()),
            ("iat", c["iat"].clone()),
        ] {
            assert_eq!(i[k], want, "{k}: {i}");
        }
    }
    // All the agent's scopes when none is asked for; several resources make an array.
    let key = AgentKey::ed();
    let agent = client(&app, &key).await;
    let answer = token(
        &app,
        &key,
        &agent,
        &[("resource", RESOURCE), ("resource", "https://b.example/")],
    )
    .await;
    assert_eq!(answer["scope"], "tools:call read:docs");
    let c = payload(answer["access_token"].as_str().unwrap());
    assert_eq!(c["aud"], json!([RESOURCE, "https://b.example/"]));
    // Each request is a record of the agent's log.
    let log = app.log(&format!("?agent_id={agent}")).await;
    let records = log["data"].as_array().unwrap();
    assert_eq!(records.len(), 1, "{log}");
    assert_eq!(
        (&records[0]["event"], &records[0]["result"]),
        (&json!("token_request"), &json!("valid"))
    );
    app.log_holds().await;
}

/// What no token must come of: each refused with `invalid_client` (401) and recorded, or
/// with the request's own error (400).
#[actix_web::test]
async fn stolen_forged_replayed_and_foreign_assertions_get_no_token() {
    let app = spawn_app().await;
    let key = AgentKey::ed();
    let agent = client(&app, &key).await;
    let other_key = AgentKey::es();
    let other = client(&app, &other_key).await;
    let ok = [("resource", RESOURCE)];

    // A replayed assertion.
    let once = assertion(&app, &key, &agent);
    assert_eq!(ask(&app, &once, &ok).await.status, 200);
    let why = assert_oauth_error(&ask(&app, &once, &ok).await, 401, "invalid_client");
    assert!(why.contains("used already"), "{why}");

    // Signed by another agent's key, for this agent.
    let forged = assertion_with(
        &other_key,
        &agent,
        json!({"alg": "ES256"}),
        json!({"aud": app.base}),
    );
    assert_oauth_error(&ask(&app, &forged, &ok).await, 401, "invalid_client");
    // alg none, and HS256 keyed with the agent's public key (algorithm confusion).
    let claims =
        json!({"iss": agent, "sub": agent, "aud": app.base, "iat": now(), "exp": now() + 60, "jti": "n1"});
    let none = format!("{}.{}.", b64(&json!({"alg": "none"})), b64(&claims));
    assert_oauth_error(&ask(&app, &none, &ok).await, 401, "invalid_client");
    let input = format!("{}.{}", b64(&json!({"alg": "HS256", "typ": "JWT"})), b64(&claims));
    let secret = key.jwk()["x"].as_str().unwrap().to_owned();
    let mac = {
        use hmac::Mac;
        let mut m = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
        m.update(input.as_bytes());
        m.finalize().into_bytes()
    };
    let hs = format!("{input}.{}", URL_SAFE_NO_PAD.encode(mac));
    let why = assert_oauth_error(&ask(&app, &hs, &ok).await, 401, "invalid_client");
    assert!(why.contains("alg"), "{why}");
    // For another service, expired, too long-lived, for another client.
    for (extra, what) in [
        (json!({"aud": "https://other-as.example"}), "aud"),
        (json!({"aud": [format!("{}/other", app.base)]}), "aud"),
        (json!({"exp": now() - 1}), "expired"),
        (json!({"exp": now() + 3600}), "300 s"),
        (json!({"jti": null}), "jti"),
        (json!({"iss": other}), "iss"),
    ] {
        let mut claims = json!({"aud": app.base});
        for (k, v) in extra.as_object().unwrap() {
            claims[k] = v.clone();
        }
        let a = assertion_with(&key, &agent, json!({"alg": "EdDSA"}), claims);
        let why = assert_oauth_error(&ask(&app, &a, &ok).await, 401, "invalid_client");
        assert!(why.contains(what), "{what}: {why}");
    }
    // The token endpoint's URL is an audience too (authlib signs it so).
    let a = assertion_with(
        &key,
        &agent,
        json!({"alg": "EdDSA"}),
        json!({"aud": format!("{}/oauth/token", app.base)}),
    );
    assert_eq!(ask(&app, &a, &ok).await.status, 200);
    // client_id, when sent, must be the assertion's client.
    let res = ask(
        &app,
        &assertion(&app, &key, &agent),
        &[("resource", RESOURCE), ("client_id", &other)],
    )
    .await;
    assert_oauth_error(&res, 401, "invalid_client");
    // An unknown agent, a garbage assertion.
    let ghost = "agt_01jd0000000000000000000000";
    assert_oauth_error(
        &ask(&app, &assertion(&app, &key, ghost), &ok).await,
        401,
        "invalid_client",
    );
    assert_oauth_error(&ask(&app, "garbage", &ok).await, 401, "invalid_client");
    // An agent bound to no key cannot authenticate.
    let (bearer, _) = app.agent().await;
    let why = assert_oauth_error(
        &ask(&app, &assertion(&app, &key, &bearer), &ok).await,
        401,
        "invalid_client",
    );
    assert!(why.contains("bound to no key"), "{why}");

    // Every refusal of an agent that exists is in its log, with why.
    let log = app.log(&format!("?agent_id={agent}&result=invalid")).await;
    let reasons: Vec<&str> = log["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            assert_eq!(r["event"], "token_request");
            r["failure_reason"].as_str().unwrap()
        })
        .collect();
    assert!(reasons.len() >= 10, "{reasons:?}");
    assert!(reasons.iter().any(|r| r.contains("used already")), "{reasons:?}");
    app.log_holds().await;
}

/// A refusal of an agent that authenticated is recorded in its ledger: whatever text comes
/// with the request (here a scope of 28,000 characters and lines), the record keeps a bounded
/// reason.
#[actix_web::test]
async fn a_refusal_records_a_bounded_reason_whatever_the_caller_sends() {
    let app = spawn_app().await;
    let key = AgentKey::ed();
    let agent = client(&app, &key).await;
    let long = "forged\nline".repeat(2_800);
    let res = ask(
        &app,
        &assertion(&app, &key, &agent),
        &[("scope", long.as_str()), ("resource", RESOURCE)],
    )
    .await;
    assert_oauth_error(&res, 400, "invalid_scope");
    let log = app.get("/v1/log?limit=1", Some(app.secret())).await;
    assert_eq!(log.status, 200, "{}", log.text());
    let record = &log.json()["data"][0];
    assert_eq!(record["agent_id"], agent.as_str());
    let reason = record["failure_reason"].as_str().unwrap();
    assert!(reason.contains("scope \"forged"), "{reason}");
    assert_eq!(reason.chars().count(), MAX_FAILURE_REASON + 1, "{reason}");
    assert!(reason.ends_with('…'), "{reason}");
}

#[actix_web::test]
async fn the_request_must_say_what_it_wants_in_the_standard_form() {
    let app = spawn_app().await;
    let key = AgentKey::ed();
    let agent = client(&app, &key).await;
    let a = || assertion(&app, &key, &agent);
    // resource: required, absolute, no fragment.
    assert_oauth_error(&ask(&app, &a(), &[]).await, 400, "invalid_target");
    for bad in ["/mcp", "api.example", "https://api.example/mcp#x", "https://"] {
        assert_oauth_error(
            &ask(&app, &a(), &[("resource", bad)]).await,
            400,
            "invalid_target",
        );
    }
    // An audience (RFC 8693) that is not a resource asked for would be dropped unseen.
    let why = assert_oauth_error(
        &ask(
            &app,
            &a(),
            &[("resource", RESOURCE), ("audience", "https://other.example/")],
        )
        .await,
        400,
        "invalid_target",
    );
    assert!(why.contains("audience"), "{why}");
    let res = ask(&app, &a(), &[("resource", RESOURCE), ("audience", RESOURCE)]).await;
    assert_eq!(res.status, 200, "{}", res.text());
    // A scope the agent does not hold.
    let why = assert_oauth_error(
        &ask(
            &app,
            &a(),
            &[("resource", RESOURCE), ("scope", "tools:call admin:all")],
        )
        .await,
        400,
        "invalid_scope",
    );
    assert!(why.contains("admin:all"), "{why}");
    // The grant, the client authentication, the form itself.
    let res = app
        .post_form(
            "/oauth/token",
            &[("grant_type", "password"), ("resource", RESOURCE)],
            &[],
        )
        .await;
    assert_oauth_error(&res, 400, "unsupported_grant_type");
    let res = app
        .post_form("/oauth/token", &[("resource", RESOURCE)], &[])
        .await;
    assert_oauth_error(&res, 400, "invalid_request");
    let res = app
        .post_form(
            "/oauth/token",
            &[("grant_type", "client_credentials"), ("resource", RESOURCE)],
            &[],
        )
        .await;
    assert_oauth_error(&res, 401, "invalid_client");
    let res = ask(
        &app,
        &a(),
        &[
            ("resource", RESOURCE),
            ("scope", "read:docs"),
            ("scope", "tools:call"),
        ],
    )
    .await;
    assert!(assert_oauth_error(&res, 400, "invalid_request").contains("more than once"));
    let res = app
        .post(
            "/oauth/token",
            None,
            Some(&json!({"grant_type": "client_credentials"})),
        )
        .await;
    assert_oauth_error(&res, 400, "invalid_request");
    // The gate's own errors have the OAuth shape here too.
    let res = app.get("/oauth/token", None).await;
    assert_eq!(res.status, 405);
    assert_eq!(res.json()["error"], "invalid_request");
    let big = "x".repeat(70 * 1024);
    let res = app.post_form("/oauth/token", &[("grant_type", &big)], &[]).await;
    assert_eq!(res.status, 413);
    assert_eq!(res.json()["error"], "invalid_request");
}

#[actix_web::test]
async fn a_revoked_agent_gets_no_token_and_its_tokens_die_at_once() {
    let app = spawn_app().await;
    let key = AgentKey::es();
    let agent = client(&app, &key).await;
    let answer = token(&app, &key, &agent, &[("resource", RESOURCE)]).await;
    let t = answer["access_token"].as_str().unwrap();
    assert_eq!(introspect(&app, t).await["active"], true);
    assert_eq!(app.revoke(&agent, Some("key leaked")).await.status, 200);
    assert_eq!(introspect(&app, t).await, json!({"active": false}));
    assert_eq!(app.verify(t).await["error"], "TOKEN_REVOKED");
    let why = assert_oauth_error(
        &ask(&app, &assertion(&app, &key, &agent), &[("resource", RESOURCE)]).await,
        401,
        "invalid_client",
    );
    assert!(why.contains("revoked"), "{why}");
    let log = app.log(&format!("?agent_id={agent}&result=revoked")).await;
    let records = log["data"].as_array().unwrap();
    // The introspection, the verification, the token request.
    assert_eq!(records.len(), 3, "{log}");
    assert_eq!(records[0]["event"], "token_request");
    assert_eq!(records[1]["event"], "verification");

    // Revoked through another instance: this one learns it from the store at once.
    let fleet = spawn_fleet(2, Options::default()).await;
    let key = AgentKey::ed();
    let agent = client(&fleet[0], &key).await;
    assert_eq!(fleet[1].revoke(&agent, None).await.status, 200);
    assert_oauth_error(
        &ask(
            &fleet[0],
            &assertion(&fleet[0], &key, &agent),
            &[("resource", RESOURCE)],
        )
        .await,
        401,
        "invalid_client",
    );
}

/// An assertion used at one instance is refused at another: the store remembers it.
#[actix_web::test]
async fn an_assertion_replayed_to_another_instance_is_refused() {
    let fleet = spawn_fleet(2, Options::default()).await;
    let key = AgentKey::ed();
    let agent = client(&fleet[0], &key).await;
    let a = assertion(&fleet[0], &key, &agent);
    assert_eq!(ask(&fleet[0], &a, &[("resource", RESOURCE)]).await.status, 200);
    let res = ask(&fleet[1], &a, &[("resource", RESOURCE)]).await;
    assert_oauth_error(&res, 401, "invalid_client");
}

/// A token request whose token cannot be recorded is answered 503 with Retry-After: the same
/// request, sent again, gets its token. Before, its assertion and its DPoP proof stayed spent,
/// and the retry was refused as a replay.
#[actix_web::test]
async fn a_token_request_answered_503_may_be_sent_again() {
    let app = spawn_app().await;
    let key = AgentKey::ed();
    let agent = client(&app, &key).await;
    let dpop = AgentKey::es();
    let endpoint = format!("{}/oauth/token", app.base);
    let proof = dpop.proof_with(
        &dpop.header(),
        &json!({"jti": ulid::Ulid::new().to_string(), "htm": "POST", "htu": endpoint, "iat": now()}),
    );
    let signed = assertion(&app, &key, &agent);
    let form = [
        ("grant_type", "client_credentials"),
        ("client_assertion_type", ASSERTION_TYPE),
        ("client_assertion", signed.as_str()),
        ("resource", RESOURCE),
    ];
    assert!(app.store.inject_write_fault(agentid::store::WriteFault::Panic));
    let res = app.post_form("/oauth/token", &form, &[("DPoP", &proof)]).await;
    assert_eq!(res.status, 503, "{}", res.text());
    assert!(res.header("retry-after").is_some());
    let res = app.post_form("/oauth/token", &form, &[("DPoP", &proof)]).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["token_type"], "DPoP");
    // Once handed out, both are spent: the assertion, and the proof with a new assertion.
    let res = app.post_form("/oauth/token", &form, &[("DPoP", &proof)]).await;
    assert_oauth_error(&res, 401, "invalid_client");
    let fresh = assertion(&app, &key, &agent);
    let mut again = form;
    again[2] = ("client_assertion", fresh.as_str());
    let res = app.post_form("/oauth/token", &again, &[("DPoP", &proof)]).await;
    assert_oauth_error(&res, 400, "invalid_dpop_proof");
}

#[actix_web::test]
async fn a_dpop_proof_binds_the_access_token_to_its_key() {
    let app = spawn_app().await;
    let key = AgentKey::ed();
    let agent = client(&app, &key).await;
    let dpop = AgentKey::es();
    let endpoint = format!("{}/oauth/token", app.base);
    let proof = |htu: &str, htm: &str| {
        dpop.proof_with(
            &dpop.header(),
            &json!({"jti": ulid::Ulid::new().to_string(), "htm": htm, "htu": htu, "iat": now()}),
        )
    };
    let form = |a: &str| {
        vec![
            ("grant_type".to_owned(), "client_credentials".to_owned()),
            ("client_assertion_type".to_owned(), ASSERTION_TYPE.to_owned()),
            ("client_assertion".to_owned(), a.to_owned()),
            ("resource".to_owned(), RESOURCE.to_owned()),
        ]
    };
    let send = |p: String| {
        let f = form(&assertion(&app, &key, &agent));
        let app = &app;
        async move {
            let pairs: Vec<(&str, &str)> = f.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            app.post_form("/oauth/token", &pairs, &[("DPoP", &p)]).await
        }
    };
    let good = proof(&endpoint, "POST");
    let res = send(good.clone()).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let answer = res.json();
    assert_eq!(answer["token_type"], "DPoP");
    let t = answer["access_token"].as_str().unwrap().to_owned();
    assert_eq!(payload(&t)["cnf"]["jkt"], thumbprint(&dpop.jwk()));
    let i = introspect(&app, &t).await;
    assert_eq!(
        (&i["token_type"], &i["cnf"]["jkt"]),
        (&json!("DPoP"), &json!(thumbprint(&dpop.jwk())))
    );
    // The bound token passes at a receiver only with a proof by that key.
    let htu = "https://api.example/mcp";
    let rs_proof = dpop.proof_with(
        &dpop.header(),
        &json!({"jti": "rs1", "htm": "GET", "htu": htu, "iat": now(),
                "ath": URL_SAFE_NO_PAD.encode(<sha2::Sha256 as sha2::Digest>::digest(t.as_bytes()))}),
    );
    let v = app
        .post(
            "/v1/verify",
            None,
            Some(&json!({"token": t, "dpop": rs_proof, "htm": "GET", "htu": htu})),
        )
        .await
        .json();
    assert_eq!(v["valid"], true, "{v}");
    let v = app
        .post(
            "/v1/verify",
            None,
            Some(&json!({"token": t, "htm": "GET", "htu": htu})),
        )
        .await
        .json();
    assert_eq!(v["error"], "PROOF_INVALID");

    // A proof replayed, for another URL or method, or malformed: no token.
    for p in [
        good,
        proof("https://other.example/oauth/token", "POST"),
        proof(&endpoint, "GET"),
        "x.y.z".to_owned(),
    ] {
        assert_oauth_error(&send(p).await, 400, "invalid_dpop_proof");
    }
}

/// Attack: thousands of `audience` and `resource` fields in one 64 KiB form, each audience
/// matched against every resource before anyone was authenticated (about 30 ms of CPU a
/// request). Audiences are counted first.
#[actix_web::test]
async fn audiences_are_counted_before_they_are_matched() {
    let app = spawn_app().await;
    let mut extra = vec![("audience", "x"); 2000];
    extra.extend(vec![("resource", "y"); 2000]);
    let why = assert_oauth_error(&ask(&app, "x", &extra).await, 400, "invalid_target");
    assert!(why.contains("at most 10 audiences"), "{why}");
}

#[actix_web::test]
async fn token_requests_count_against_the_organizations_limit() {
    let app = spawn_app_with(Options {
        plan: agentid::domain::Plan::Enterprise,
        verify_limit: Some(1000),
        other_limit: Some(3),
        ..Options::default()
    })
    .await;
    let key = AgentKey::ed();
    let agent = client(&app, &key).await;
    // The registration took one call; two tokens follow, then the limit.
    for _ in 0..2 {
        let res = ask(&app, &assertion(&app, &key, &agent), &[("resource", RESOURCE)]).await;
        assert_eq!(res.status, 200, "{}", res.text());
        assert_eq!(res.header("x-ratelimit-limit").as_deref(), Some("3"));
    }
    let res = ask(&app, &assertion(&app, &key, &agent), &[("resource", RESOURCE)]).await;
    assert_eq!(res.status, 429, "{}", res.text());
    assert_eq!(res.json()["error"], "temporarily_unavailable");
    assert!(res.header("retry-after").is_some());
    // Attack: requests past the limit each spent their assertion, a write apiece. They are
    // refused before it now (an UPDATE that changes nothing counts the rows).
    let spent = "UPDATE client_assertions SET expires_at = expires_at";
    let before = app.raw_execute(spent).await.unwrap();
    for _ in 0..5 {
        let res = ask(&app, &assertion(&app, &key, &agent), &[("resource", RESOURCE)]).await;
        assert_eq!(res.status, 429, "{}", res.text());
    }
    assert_eq!(app.raw_execute(spent).await.unwrap(), before);
    // Another organization's calls are its own: failed requests count against the address.
    let app = spawn_app().await;
    for i in 0..25 {
        let res = ask(&app, "garbage", &[("resource", RESOURCE)]).await;
        if res.status == 429 {
            assert!(i >= 20, "limited after {i}");
            return;
        }
        assert_eq!(res.status, 401);
    }
    panic!("failed token requests were never limited");
}

/// Attack: an assertion spent already, replayed (from many addresses) while it lives, to use
/// up its organization's calls. A replay is refused before the organization is charged.
#[actix_web::test]
async fn a_replayed_assertion_costs_its_organization_nothing() {
    let app = spawn_app_with(Options {
        plan: agentid::domain::Plan::Enterprise,
        verify_limit: Some(1000),
        other_limit: Some(3),
        ..Options::default()
    })
    .await;
    let key = AgentKey::ed();
    let agent = client(&app, &key).await; // one call of three
    let spent = assertion(&app, &key, &agent);
    let res = ask(&app, &spent, &[("resource", RESOURCE)]).await;
    assert_eq!(res.status, 200, "{}", res.text());
    for _ in 0..5 {
        let why = assert_oauth_error(
            &ask(&app, &spent, &[("resource", RESOURCE)]).await,
            401,
            "invalid_client",
        );
        assert!(why.contains("used already"), "{why}");
    }
    let res = ask(&app, &assertion(&app, &key, &agent), &[("resource", RESOURCE)]).await;
    assert_eq!(
        res.status,
        200,
        "the third call is the organization's: {}",
        res.text()
    );
}

/// Attack: failed token requests sent all at once each passed the address's look at its
/// bucket before any was charged, so a burst of them got far past its 20 a minute.
#[actix_web::test]
async fn failed_token_requests_sent_at_once_are_limited_as_one_by_one() {
    let app = spawn_app().await;
    let answers =
        futures_util::future::join_all((0..60).map(|_| ask(&app, "garbage", &[("resource", RESOURCE)])))
            .await;
    let failed = answers.iter().filter(|r| r.status == 401).count();
    let limited = answers.iter().filter(|r| r.status == 429).count();
    assert_eq!(failed + limited, 60);
    assert!(failed <= 21, "{failed} failed requests passed at once");
    // A client that authenticates spends nothing of the address's failures.
    let app = spawn_app().await;
    let key = AgentKey::ed();
    let agent = client(&app, &key).await;
    for _ in 0..25 {
        let res = ask(&app, &assertion(&app, &key, &agent), &[("resource", RESOURCE)]).await;
        assert_eq!(res.status, 200, "{}", res.text());
    }
}

/// Attack: a neighbour behind the same address (a NAT, a /64) spending the address's
/// anonymous calls on pages that do not exist shuts no agent out of the token endpoint, whose
/// failed requests have a bucket of their own.
#[actix_web::test]
async fn other_anonymous_calls_from_an_address_leave_its_token_requests_alone() {
    let app = spawn_app().await;
    let key = AgentKey::ed();
    let agent = client(&app, &key).await;
    for path in ["/nope", "/oauth/authorize", "/v1/agents"] {
        for _ in 0..10 {
            app.get(path, None).await;
        }
    }
    assert_eq!(
        app.get("/nope", None).await.status,
        429,
        "the address's calls are spent"
    );
    let res = ask(&app, &assertion(&app, &key, &agent), &[("resource", RESOURCE)]).await;
    assert_eq!(res.status, 200, "{}", res.text());
}

#[actix_web::test]
async fn test_mode_tokens_say_so_and_the_lifetime_is_configured() {
    let app = spawn_app_with(Options {
        tweak: Box::new(|c| c.engine.oauth.access_token_lifetime = std::time::Duration::from_secs(120)),
        ..Options::default()
    })
    .await;
    let key = AgentKey::ed();
    let a = app
        .register_with(
            &app.org.keys.secret_test,
            json!({"name": "t", "issuer_domain": "example.com", "scopes": ["tools:call"], "jwk": key.jwk()}),
        )
        .await;
    let agent = a["agent_id"].as_str().unwrap();
    let answer = token(&app, &key, agent, &[("resource", RESOURCE)]).await;
    assert_eq!(answer["expires_in"], 120);
    let c = payload(answer["access_token"].as_str().unwrap());
    assert_eq!(c["livemode"], false);
    assert_eq!(c["exp"].as_i64().unwrap() - c["iat"].as_i64().unwrap(), 120);
    // Inactive to a receiver's live (or no) key, as forward auth and the libraries refuse it;
    // active to a test-mode key.
    let token = answer["access_token"].as_str().unwrap();
    assert_eq!(introspect(&app, token).await, json!({"active": false}));
    let live = format!("Bearer {}", app.org.keys.publishable_live);
    let res = app
        .post_form(
            "/oauth/introspect",
            &[("token", token)],
            &[("Authorization", &live)],
        )
        .await;
    assert_eq!(res.json(), json!({"active": false}));
    let test = format!("Bearer {}", app.org.keys.publishable_test);
    let res = app
        .post_form(
            "/oauth/introspect",
            &[("token", token)],
            &[("Authorization", &test)],
        )
        .await;
    assert_eq!(
        (res.json()["active"].clone(), res.json()["livemode"].clone()),
        (json!(true), json!(false))
    );
}

/// An organization that no longer holds its agent's name can no more hand it tokens this
/// way than with issue-token.
#[actix_web::test]
async fn no_token_under_a_name_the_organization_released() {
    let app = spawn_app().await;
    let key = AgentKey::ed();
    let (agent, _) = bound(&app, &key).await;
    assert_eq!(
        token(&app, &key, &agent, &[("resource", RESOURCE)]).await["scope"],
        "read:docs"
    );
    let res = app
        .client
        .delete(app.url("/v1/domains/example.com"))
        .insert_header(("Authorization", format!("Bearer {}", app.secret())))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 204);
    // An instance trusts a holding it found for a second.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let why = assert_oauth_error(
        &ask(&app, &assertion(&app, &key, &agent), &[("resource", RESOURCE)]).await,
        401,
        "invalid_client",
    );
    assert!(why.contains("example.com"), "{why}");
}

/// `Authorization: Basic` for a client id and secret (RFC 6749 §2.3.1 form-urlencodes each
/// first, which leaves an agent id and a `cs_` secret as they are).
fn basic(id: &str, secret: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{id}:{secret}"))
    )
}

/// `POST /v1/agents/{id}/client-secret` with `key`.
async fn make_secret(app: &TestApp, id: &str, key: &str) -> Resp {
    app.post(&format!("/v1/agents/{id}/client-secret"), Some(key), None)
        .await
}

/// Attack: rotations at the same time each expired what they saw and added their own, so
/// several new secrets stayed current for good (a leaked one then outlives any rotation).
/// However many run at once, one secret is current.
#[actix_web::test]
async fn rotations_at_once_leave_one_current_secret() {
    let app = spawn_app().await;
    let key = AgentKey::ed();
    let agent = client(&app, &key).await;
    let sk = app.secret().to_owned();
    for _ in 0..3 {
        let rotations = (0..8).map(|_| make_secret(&app, &agent, &sk));
        for res in futures_util::future::join_all(rotations).await {
            assert_eq!(res.status, 201, "{}", res.text());
        }
        let current = app
            .raw_execute(&format!(
                "UPDATE client_secrets SET expires_at = expires_at WHERE agent_id = '{agent}' AND expires_at IS NULL"
            ))
            .await
            .unwrap();
        assert_eq!(current, 1);
    }
}

/// An agent without a key authenticates with a client secret its issuer made, by either
/// method; a new secret leaves the one before it valid (a day) and ends any older; a wrong
/// one, another organization's agent, a revoked agent and two methods at once get nothing.
#[actix_web::test]
async fn an_agent_authenticates_with_a_client_secret() {
    let app = spawn_app().await;
    let (id, _) = app.agent().await;
    let res = make_secret(&app, &id, app.secret()).await;
    assert_eq!(res.status, 201, "{}", res.text());
    assert_eq!(res.header("cache-control").as_deref(), Some("no-store"));
    let made = res.json();
    assert_eq!(made["client_id"], id.as_str());
    let first = made["client_secret"].as_str().unwrap().to_owned();
    assert!(first.starts_with("cs_") && first.len() == 46, "{first}");

    let post = |secret: String, extra: Vec<(&'static str, String)>, headers: Vec<(&'static str, String)>| {
        let (app, id) = (&app, id.clone());
        async move {
            let mut form = vec![
                ("grant_type", "client_credentials".to_owned()),
                ("resource", RESOURCE.to_owned()),
            ];
            if !secret.is_empty() {
                form.push(("client_id", id));
                form.push(("client_secret", secret));
            }
            form.extend(extra);
            let pairs: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            app.post_form("/oauth/token", &pairs, &headers).await
        }
    };
    // client_secret_post.
    let res = post(first.clone(), vec![], vec![]).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let token = res.json()["access_token"].as_str().unwrap().to_owned();
    assert_eq!(
        (
            payload(&token)["sub"].as_str(),
            payload(&token)["client_id"].as_str()
        ),
        (Some(id.as_str()), Some(id.as_str()))
    );
    // client_secret_basic.
    let res = post(String::new(), vec![], vec![("Authorization", basic(&id, &first))]).await;
    assert_eq!(res.status, 200, "{}", res.text());

    // A wrong secret, in the body or by the header: a Basic challenge (RFC 6749 §5.2, and
    // RFC 9110 §15.5.2 for every 401).
    let res = post("cs_wrong".into(), vec![], vec![]).await;
    assert_oauth_error(&res, 401, "invalid_client");
    assert_eq!(
        res.header("www-authenticate").as_deref(),
        Some("Basic realm=\"agentid\"")
    );
    let res = post(
        String::new(),
        vec![],
        vec![("Authorization", basic(&id, "cs_wrong"))],
    )
    .await;
    assert_oauth_error(&res, 401, "invalid_client");
    assert_eq!(
        res.header("www-authenticate").as_deref(),
        Some("Basic realm=\"agentid\"")
    );
    // So is a header that is no Basic credential, or one without a client id.
    for header in ["Basic !!!".to_owned(), basic("", &first)] {
        let res = post(String::new(), vec![], vec![("Authorization", header.clone())]).await;
        assert_oauth_error(&res, 401, "invalid_client");
        assert_eq!(
            res.header("www-authenticate").as_deref(),
            Some("Basic realm=\"agentid\""),
            "{header}"
        );
    }
    // Two ways at once.
    let res = post(first.clone(), vec![], vec![("Authorization", basic(&id, &first))]).await;
    assert_oauth_error(&res, 400, "invalid_request");
    let res = post(
        first.clone(),
        vec![
            ("client_assertion_type", ASSERTION_TYPE.to_owned()),
            ("client_assertion", "a.b.c".to_owned()),
        ],
        vec![],
    )
    .await;
    assert_oauth_error(&res, 400, "invalid_request");

    // Rotation: the one before stays valid, older ones end.
    let second = make_secret(&app, &id, app.secret()).await.json()["client_secret"]
        .as_str()
        .unwrap()
        .to_owned();
    for s in [&first, &second] {
        assert_eq!(post(s.clone(), vec![], vec![]).await.status, 200, "{s}");
    }
    let third = make_secret(&app, &id, app.secret()).await.json()["client_secret"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_oauth_error(&post(first.clone(), vec![], vec![]).await, 401, "invalid_client");
    for s in [&second, &third] {
        assert_eq!(post(s.clone(), vec![], vec![]).await.status, 200, "{s}");
    }

    // Another organization cannot make one for this agent.
    let other = crate::helpers::spawn_app().await;
    make_secret(&other, &id, other.secret())
        .await
        .assert_error(404, "AGENT_NOT_FOUND");
    // A publishable key cannot either.
    make_secret(&app, &id, &app.org.keys.publishable_live.clone())
        .await
        .assert_error(403, "FORBIDDEN");

    // Revoked: no new secret, and the secrets it has get nothing.
    assert_eq!(app.revoke(&id, None).await.status, 200);
    make_secret(&app, &id, app.secret())
        .await
        .assert_error(409, "AGENT_REVOKED");
    assert_oauth_error(&post(third.clone(), vec![], vec![]).await, 401, "invalid_client");
    // A caller without a secret learns nothing of the agent: not that it is revoked.
    let res = post("cs_wrong".into(), vec![], vec![]).await;
    assert_oauth_error(&res, 401, "invalid_client");
    assert!(!res.text().contains("revoked"), "{}", res.text());
}

/// Another instance's clock may run behind this one's: a used assertion (or a signed
/// request's nonce) is kept a minute past its expiry, so that instance still refuses a replay
/// until its own clock passes the expiry. Deleted at once, one prune opened that window.
#[actix_web::test]
async fn used_assertions_are_kept_a_minute_past_their_expiry() {
    use agentid::domain::Millis;
    let app = spawn_app().await;
    let now = Millis::now().0;
    assert!(app
        .store
        .use_assertion("recent", Millis(now - 30_000))
        .await
        .unwrap());
    assert!(app
        .store
        .use_assertion("old", Millis(now - 90_000))
        .await
        .unwrap());
    // A token request prunes what expired.
    let key = AgentKey::ed();
    let agent = client(&app, &key).await;
    let res = ask(&app, &assertion(&app, &key, &agent), &[("resource", RESOURCE)]).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert!(
        !app.store.use_assertion("recent", Millis(now)).await.unwrap(),
        "forgotten within a minute of its expiry"
    );
    assert!(app.store.use_assertion("old", Millis(now)).await.unwrap());
}

/// An access token lives no longer than its organization's longest token: an enterprise
/// organization that shortened it to 5 minutes gets 300 s, not the endpoint's 900.
#[actix_web::test]
async fn an_access_token_lives_no_longer_than_its_organizations_longest_token() {
    let app = spawn_app_with(Options::unlimited()).await;
    let key = AgentKey::ed();
    let agent = client(&app, &key).await;
    let shorter = agentid::engine::admin::LimitChange {
        max_expiry_seconds: Some(300),
        ..Default::default()
    };
    agentid::engine::admin::set_limits(&app.store, app.engine.keys(), &app.org.org_id, shorter)
        .await
        .unwrap();
    let res = ask(&app, &assertion(&app, &key, &agent), &[("resource", RESOURCE)]).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["expires_in"], 300);
}

/// A plan written into the database with database access alone gets the organization's
/// agents no token under it: the key file did not seal it. The refusal is recorded.
#[actix_web::test]
async fn a_plan_written_into_the_database_gets_no_token() {
    let app = spawn_app().await;
    let key = AgentKey::ed();
    let agent = client(&app, &key).await;
    let res = ask(&app, &assertion(&app, &key, &agent), &[("resource", RESOURCE)]).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let richer = format!(
        "UPDATE orgs SET plan = 'enterprise', verify_limit = 1000000000, other_limit = 1000000000, \
         max_expiry_seconds = 31536000 WHERE id = '{}'",
        app.org.org_id
    );
    assert_eq!(app.raw_execute(&richer).await.unwrap(), 1);
    let res = ask(&app, &assertion(&app, &key, &agent), &[("resource", RESOURCE)]).await;
    assert_oauth_error(&res, 401, "invalid_client");

    // The refusal is in the organization's log (read once the plan it was sealed with is
    // back: until then its keys open nothing either).
    let back = format!(
        "UPDATE orgs SET plan = 'developer', verify_limit = 5000, other_limit = 500, \
         max_expiry_seconds = 7776000 WHERE id = '{}'",
        app.org.org_id
    );
    assert_eq!(app.raw_execute(&back).await.unwrap(), 1);
    let log = app.log(&format!("?agent_id={agent}&result=invalid")).await;
    assert_eq!(log["data"][0]["event"], "token_request", "{log}");
    let why = log["data"][0]["failure_reason"].as_str().unwrap();
    assert!(why.contains("may not get tokens"), "{why}");
}

/// Attack: credentials written into the database with database access alone. A key put in
/// an agent's row (its thumbprint beside it), or a client secret's row, authenticates nobody:
/// the key file did not seal them. One sealed by the key file long ago and copied back (a key
/// the agent gave up, a secret that ended) is refused by the database, as is an ended
/// secret's end moved.
#[actix_web::test]
async fn credentials_written_into_the_database_authenticate_nobody() {
    let app = spawn_app().await;
    let key = AgentKey::ed();
    let id = client(&app, &key).await;
    let res = ask(&app, &assertion(&app, &key, &id), &[("resource", RESOURCE)]).await;
    assert_eq!(res.status, 200, "{}", res.text());

    // Another key in the row, with its thumbprint: its assertions get nothing.
    let forger = AgentKey::ed();
    let jwk = format!(
        r#"{{"crv":"Ed25519","kty":"OKP","x":"{}"}}"#,
        forger.jwk()["x"].as_str().unwrap()
    );
    let swap = format!(
        "UPDATE agents SET jwk = '{jwk}', jkt = '{}' WHERE id = '{id}'",
        thumbprint(&forger.jwk())
    );
    assert_eq!(app.raw_execute(&swap).await.unwrap(), 1);
    let res = ask(&app, &assertion(&app, &forger, &id), &[("resource", RESOURCE)]).await;
    assert_oauth_error(&res, 401, "invalid_client");

    // A key sealed by the key file two minutes ago, copied back: refused by the database.
    let keys = app.engine.keys();
    let then = agentid::domain::Millis(agentid::domain::Millis::now().0 - 120_000);
    let agent_id = crate::helpers::agent_id(&id);
    let old = keys.seal(
        agentid::keys::Sealed::AgentKey,
        &agentid::records::agent_key_canonical(
            &agent_id,
            Some(&thumbprint(&forger.jwk())),
            Some(&jwk),
            Some(then),
        ),
    );
    let blob = |b: &[u8]| crate::helpers::blob(&app, b);
    let copied = format!(
        "UPDATE agents SET key_mac = {}, key_sealed_at = {} WHERE id = '{id}'",
        blob(&old),
        then.0
    );
    let err = app.refused(&copied).await;
    assert!(err.contains("sealed"), "{err}");

    // A client secret's row: with a seal of its own making, nothing; sealed long ago and
    // copied back, refused by the database.
    let secret = format!("cs_{}", "s".repeat(43));
    let hash = agentid::engine::hash_key(&secret);
    let row = |mac: &[u8], at: i64| {
        format!(
            "INSERT INTO client_secrets (agent_id, secret_hash, created_at, expires_at, mac) \
             VALUES ('{id}', {}, {at}, NULL, {})",
            blob(&hash),
            blob(mac)
        )
    };
    app.raw_execute(&format!("DELETE FROM client_secrets WHERE agent_id = '{id}'"))
        .await
        .unwrap();
    let now = agentid::domain::Millis::now().0;
    assert_eq!(app.raw_execute(&row(&[7; 32], now)).await.unwrap(), 1);
    let form = [
        ("grant_type", "client_credentials"),
        ("client_id", id.as_str()),
        ("client_secret", secret.as_str()),
        ("resource", RESOURCE),
    ];
    let res = app.post_form("/oauth/token", &form, &[]).await;
    assert_oauth_error(&res, 401, "invalid_client");
    app.raw_execute(&format!("DELETE FROM client_secrets WHERE agent_id = '{id}'"))
        .await
        .unwrap();
    let old = keys.seal(
        agentid::keys::Sealed::ClientSecret,
        &agentid::records::client_secret_canonical(&agent_id, &hash, then),
    );
    let err = app.refused(&row(&old, then.0)).await;
    assert!(err.contains("sealed"), "{err}");

    // A replaced secret's end stays where the rotation put it.
    let sk = app.secret().to_owned();
    assert_eq!(make_secret(&app, &id, &sk).await.status, 201);
    assert_eq!(make_secret(&app, &id, &sk).await.status, 201);
    // A secret stays its agent's: moved to another, refused by the database.
    let moved = format!(
        "UPDATE client_secrets SET agent_id = 'agt_01zzzzzzzzzzzzzzzzzzzzzzzz' WHERE agent_id = '{id}'"
    );
    let err = app.refused(&moved).await;
    assert!(err.contains("sealed"), "{err}");
    let longer = format!(
        "UPDATE client_secrets SET expires_at = NULL WHERE agent_id = '{id}' AND expires_at IS NOT NULL"
    );
    let err = app.refused(&longer).await;
    assert!(err.contains("never moves"), "{err}");
}

/// An agent's key and client secret from before seals (marked so by the migration that
/// brought them), and an agent bound to no key, are sealed by the first start after the
/// upgrade: the agent keeps authenticating with both, and both renew their tokens. An agent's key without a seal (written past the triggers) is
/// not sealed by a later start.
#[actix_web::test]
async fn agent_credentials_from_before_seals_are_sealed_once() {
    let app = spawn_app().await;
    let (key, other_key) = (AgentKey::ed(), AgentKey::ed());
    let id = client(&app, &key).await;
    let other = client(&app, &other_key).await;
    let res = make_secret(&app, &id, app.secret()).await;
    let secret = res.json()["client_secret"].as_str().unwrap().to_owned();
    let plain = app
        .register(json!({"name": "b", "issuer_domain": "example.com", "scopes": ["read:docs"]}))
        .await;
    let plain = plain["agent_id"].as_str().unwrap();
    let mark = if app.db.is_postgres() {
        "'\\x00'::bytea"
    } else {
        "X'00'"
    };
    let past_triggers: &[&str] = if app.db.is_postgres() {
        &["SET session_replication_role = replica"]
    } else {
        &[
            "DROP TRIGGER agents_keys_stay_sealed",
            "DROP TRIGGER client_secrets_stay_sealed",
        ]
    };
    // The database as the upgrade leaves it: every agent's binding (a key or none) and every
    // secret marked as from before seals.
    let (keys, secrets) = (
        format!("UPDATE agents SET key_mac = {mark}, key_sealed_at = NULL"),
        format!("UPDATE client_secrets SET mac = {mark}"),
    );
    let mut sqls = past_triggers.to_vec();
    sqls.extend([keys.as_str(), secrets.as_str()]);
    app.raw_session(&sqls).await.unwrap();
    let app = app.restart().await;
    let res = ask(&app, &assertion(&app, &key, &id), &[("resource", RESOURCE)]).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let form = [
        ("grant_type", "client_credentials"),
        ("client_id", id.as_str()),
        ("client_secret", secret.as_str()),
        ("resource", RESOURCE),
    ];
    let res = app.post_form("/oauth/token", &form, &[]).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let renew = |id: &str| format!("/v1/agents/{id}/issue-token");
    for agent in [plain, id.as_str()] {
        let res = app.post(&renew(agent), Some(app.secret()), None).await;
        assert_eq!(res.status, 201, "{}", res.text());
    }

    // One agent's key unsealed now: a later start leaves it so.
    let unseal = format!("UPDATE agents SET key_mac = NULL, key_sealed_at = NULL WHERE id = '{other}'");
    let mut sqls = if app.db.is_postgres() {
        past_triggers.to_vec()
    } else {
        vec![]
    };
    sqls.push(&unseal);
    app.raw_session(&sqls).await.unwrap();
    let app = app.restart().await;
    let res = ask(
        &app,
        &assertion(&app, &other_key, &other),
        &[("resource", RESOURCE)],
    )
    .await;
    assert_oauth_error(&res, 401, "invalid_client");
    let res = ask(&app, &assertion(&app, &key, &id), &[("resource", RESOURCE)]).await;
    assert_eq!(res.status, 200, "{}", res.text());
}

/// Attack on the log: a client that puts its secret where its client_id goes (the two sent
/// swapped, in the body or by Basic) would have the secret written into the service's ledger,
/// which keeps what it is given for good. The refusal is recorded, without what was sent.
#[actix_web::test]
async fn a_client_id_that_is_no_agent_id_is_not_written_into_the_log() {
    let app = spawn_app().await;
    let (id, _) = app.agent().await;
    let secret = make_secret(&app, &id, app.secret()).await.json()["client_secret"]
        .as_str()
        .unwrap()
        .to_owned();
    let service = agentid::domain::Ledger::service();
    let before = app.store.ledger_size(&service).await.unwrap();
    let swapped = [
        ("grant_type", "client_credentials"),
        ("resource", RESOURCE),
        ("client_id", secret.as_str()),
        ("client_secret", id.as_str()),
    ];
    let res = app.post_form("/oauth/token", &swapped, &[]).await;
    assert_oauth_error(&res, 401, "invalid_client");
    let basic = basic(&secret, &id);
    let form = [("grant_type", "client_credentials"), ("resource", RESOURCE)];
    let res = app
        .post_form("/oauth/token", &form, &[("Authorization", basic.as_str())])
        .await;
    assert_oauth_error(&res, 401, "invalid_client");
    let blocks = app.store.read_blocks(&service, 0, 10_000).await.unwrap();
    let records: Vec<_> = blocks
        .into_iter()
        .flat_map(|b| b.records.unwrap())
        .filter(|r| r.seq > before as i64 && format!("{r:?}").contains("client_id"))
        .collect();
    assert_eq!(records.len(), 2, "both refusals are recorded: {records:?}");
    for r in &records {
        let written = format!("{r:?}");
        assert!(!written.contains(&secret), "{written}");
        assert!(written.contains("not an agent id"), "{written}");
    }
}
