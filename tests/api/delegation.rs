//! Agents acting for people: token exchange (RFC 8693) with a person's token from a trusted
//! identity provider, a task handed on from one agent to another (a nested `act`), ID-JAG
//! (the jwt-bearer grant), what verify and introspection show of the chain, and each way the
//! chain dies: an agent of it revoked, the provider no longer trusted, the person revoked.
//! Every attack is a test here.

use std::net::IpAddr;

use serde_json::{json, Value};

use crate::dns::TestDns;
use crate::domains::{ok, Http, Pki};
use crate::dpop::{b64, now, payload, AgentKey};
use crate::helpers::{spawn_app, spawn_app_with, Options, Resp, TestApp};
use agentid::engine::outbound::OutboundConfig;

const RESOURCE: &str = "https://api.example/mcp";
const IDP: &str = "https://idp.example";
const EXCHANGE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
const JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
const ID_TOKEN: &str = "urn:ietf:params:oauth:token-type:id_token";
const ACCESS_TOKEN: &str = "urn:ietf:params:oauth:token-type:access_token";

/// An identity provider: its issuer and signing key.
struct Idp {
    iss: String,
    key: AgentKey,
    kid: &'static str,
}

impl Idp {
    fn new(iss: &str) -> Idp {
        Idp {
            iss: iss.to_owned(),
            key: AgentKey::es(),
            kid: "k1",
        }
    }

    fn jwks(&self) -> Value {
        let mut jwk = self.key.jwk();
        jwk["kid"] = self.kid.into();
        json!({"keys": [jwk]})
    }

    /// A JWT of this provider with these claims over the usual ones (a null removes one).
    fn sign(&self, typ: &str, extra: Value) -> String {
        let mut claims = json!({"iss": self.iss, "sub": "alice", "iat": now(), "exp": now() + 600,
                                "jti": ulid::Ulid::new().to_string()});
        for (k, v) in extra.as_object().unwrap() {
            if v.is_null() {
                claims.as_object_mut().unwrap().remove(k);
            } else {
                claims[k] = v.clone();
            }
        }
        let header = json!({"alg": self.key.alg(), "kid": self.kid, "typ": typ});
        self.key.proof_with(&header, &claims)
    }

    /// The person's ID token for `client`.
    fn id_token(&self, client: &str) -> String {
        self.sign("JWT", json!({"aud": client}))
    }

    /// An ID-JAG for `client` at `app`, for `resource`.
    fn id_jag(&self, app: &TestApp, client: &str, extra: Value) -> String {
        let mut claims = json!({"aud": app.base, "client_id": client, "resource": RESOURCE,
                                "exp": now() + 300, "scope": "read:docs"});
        for (k, v) in extra.as_object().unwrap() {
            claims[k] = v.clone();
        }
        self.sign("oauth-id-jag+jwt", claims)
    }
}

/// An agent with a client secret: its id and secret.
struct Client {
    id: String,
    secret: String,
}

impl TestApp {
    async fn trust(&self, key: &str, idp: &Idp) -> String {
        let res = self
            .post(
                "/v1/identity-providers",
                Some(key),
                Some(&json!({"issuer": idp.iss, "jwks": idp.jwks()})),
            )
            .await;
        assert_eq!(res.status, 201, "{}", res.text());
        res.json()["id"].as_str().unwrap().to_owned()
    }

    /// Removes provider `id` from `key`'s organization's trust.
    async fn distrust(&self, key: &str, id: &str) {
        let res = self
            .client
            .delete(self.url(&format!("/v1/identity-providers/{id}")))
            .insert_header(("Authorization", format!("Bearer {key}")))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status().as_u16(), 204);
    }

    /// An agent of `key`'s organization with these scopes, and a client secret.
    async fn confidential(&self, key: &str, scopes: &[&str]) -> Client {
        self.confidential_in(key, "example.com", scopes).await
    }

    /// As `confidential`, under `domain`.
    async fn confidential_in(&self, key: &str, domain: &str, scopes: &[&str]) -> Client {
        let a = self
            .register_with(
                key,
                json!({"name": "assistant", "issuer_domain": domain, "scopes": scopes}),
            )
            .await;
        let id = a["agent_id"].as_str().unwrap().to_owned();
        let res = self
            .post(&format!("/v1/agents/{id}/client-secret"), Some(key), None)
            .await;
        assert_eq!(res.status, 201, "{}", res.text());
        Client {
            id,
            secret: res.json()["client_secret"].as_str().unwrap().to_owned(),
        }
    }

    /// A token request by `c` (client_secret_post) with these fields.
    async fn token_for(&self, c: &Client, form: &[(&str, &str)]) -> Resp {
        let mut all = vec![("client_id", c.id.as_str()), ("client_secret", c.secret.as_str())];
        all.extend_from_slice(form);
        self.post_form("/oauth/token", &all, &[]).await
    }

    /// Token exchange by `c` of `subject` (of `kind`) for `resource`, with `extra` fields.
    async fn exchange(
        &self,
        c: &Client,
        subject: &str,
        kind: &str,
        resource: &str,
        extra: &[(&str, &str)],
    ) -> Resp {
        let mut form = vec![
            ("grant_type", EXCHANGE),
            ("subject_token", subject),
            ("subject_token_type", kind),
            ("resource", resource),
        ];
        form.extend_from_slice(extra);
        self.token_for(c, &form).await
    }

    async fn delegated(&self, c: &Client, subject: &str, kind: &str, resource: &str) -> Value {
        let res = self.exchange(c, subject, kind, resource, &[]).await;
        assert_eq!(res.status, 200, "{}", res.text());
        res.json()
    }

    /// `POST /v1/subjects/revoke` of `sub` at [`IDP`], which passes.
    async fn revoke_person(&self, key: &str, sub: &str) {
        let res = self
            .post(
                "/v1/subjects/revoke",
                Some(key),
                Some(&json!({"iss": IDP, "sub": sub})),
            )
            .await;
        assert_eq!(res.status, 200, "{}", res.text());
    }

    async fn introspect(&self, token: &str) -> Value {
        let res = self
            .post_form("/oauth/introspect", &[("token", token)], &[])
            .await;
        assert_eq!(res.status, 200, "{}", res.text());
        res.json()
    }
}

/// A delegated token: an agent's, acting for alice of a provider the test organization trusts
/// (added here, once), for `resource` and `scope`.
pub(crate) struct PersonToken {
    pub(crate) agent: String,
    pub(crate) token: String,
}

pub(crate) async fn person_token(app: &TestApp, resource: &str, scope: &str) -> PersonToken {
    let sk = app.secret().to_owned();
    let idp = Idp::new(IDP);
    app.trust(&sk, &idp).await;
    let a = app.confidential(&sk, &[scope]).await;
    let answer = app.delegated(&a, &idp.id_token(&a.id), ID_TOKEN, resource).await;
    PersonToken {
        agent: a.id,
        token: access(&answer),
    }
}

/// A second organization, B, unlimited in practice, holding `b.example`.
pub(crate) async fn org_b(app: &TestApp) -> agentid::engine::admin::CreatedOrg {
    let b = agentid::engine::admin::create_org(
        &app.store,
        app.engine.keys(),
        "b",
        agentid::domain::Plan::Enterprise,
        agentid::domain::OrgLimits::resolve(
            agentid::domain::Plan::Enterprise,
            Some(1_000_000),
            Some(1_000_000),
            None,
        )
        .unwrap(),
    )
    .await
    .unwrap();
    app.grant(&b.org_id, "b.example", false).await.unwrap();
    b
}

fn refused(res: &Resp, status: u16, code: &str) -> String {
    assert_eq!(res.status, status, "{code}: {}", res.text());
    let body = res.json();
    assert_eq!(body["error"], code, "{body}");
    body["error_description"].as_str().unwrap().to_owned()
}

fn access(answer: &Value) -> String {
    answer["access_token"].as_str().unwrap().to_owned()
}

/// A person's ID token becomes an access token that names the person, who vouched for them
/// and the agent acting; verify and introspection say so; its scope is what every link
/// allows; revoking the person ends it at once, and a new sign-in works again.
#[actix_web::test]
async fn an_agent_acts_for_a_person_its_provider_vouched_for() {
    let app = spawn_app().await;
    let sk = app.secret().to_owned();
    let idp = Idp::new(IDP);
    app.trust(&sk, &idp).await;
    let a = app.confidential(&sk, &["read:docs", "write:docs"]).await;

    let answer = app.delegated(&a, &idp.id_token(&a.id), ID_TOKEN, RESOURCE).await;
    assert_eq!(answer["issued_token_type"], ACCESS_TOKEN, "{answer}");
    assert_eq!(answer["token_type"], "Bearer");
    assert_eq!(answer["scope"], "read:docs write:docs");
    let token = access(&answer);
    let claims = payload(&token);
    assert_eq!(claims["sub"], "alice");
    assert_eq!(claims["client_id"], a.id.as_str());
    assert_eq!(
        claims["sub_id"],
        json!({"format": "iss_sub", "iss": IDP, "sub": "alice"})
    );
    assert_eq!(
        claims["act"],
        json!({"sub": a.id, "issuer_domain": "example.com"})
    );
    assert_eq!(claims["aud"], RESOURCE);
    assert!(
        claims["status"]["status_list"]["uri"].is_string(),
        "the acting agent's place: {claims}"
    );

    let v = app.verify(&token).await;
    assert_eq!(v["valid"], true, "{v}");
    assert_eq!(v["agent_id"], a.id.as_str());
    assert_eq!(v["sub"], "alice");
    assert_eq!(v["sub_id"]["iss"], IDP);
    assert_eq!(v["act"]["sub"], a.id.as_str());
    let i = app.introspect(&token).await;
    assert_eq!(i["active"], true, "{i}");
    assert_eq!(
        (i["sub"].as_str(), i["client_id"].as_str()),
        (Some("alice"), Some(a.id.as_str()))
    );
    assert_eq!(i["act"]["sub"], a.id.as_str());
    assert_eq!(i["sub_id"]["sub"], "alice");

    // The subject token's scope narrows what the agent gets; asking outside it is dropped.
    let narrow = idp.sign("JWT", json!({"aud": a.id, "scope": "read:docs profile"}));
    let answer = app.delegated(&a, &narrow, ID_TOKEN, RESOURCE).await;
    assert_eq!(answer["scope"], "read:docs");
    let res = app
        .exchange(&a, &narrow, ID_TOKEN, RESOURCE, &[("scope", "write:docs")])
        .await;
    refused(&res, 400, "invalid_scope");
    // Never outlives the subject token.
    let short = idp.sign("JWT", json!({"aud": a.id, "exp": now() + 90}));
    let answer = app.delegated(&a, &short, ID_TOKEN, RESOURCE).await;
    assert!(answer["expires_in"].as_i64().unwrap() <= 90, "{answer}");
    assert!(payload(&access(&answer))["exp"].as_i64().unwrap() <= now() + 90);
    // aud may name this issuer instead of the agent.
    app.delegated(
        &a,
        &idp.sign("JWT", json!({"aud": [app.base.clone()]})),
        ID_TOKEN,
        RESOURCE,
    )
    .await;

    // The person revoked: their tokens die at once; an ID token from before buys nothing more
    // (one signed after it, even in the same second, could be a later second's by then).
    let old = idp.id_token(&a.id);
    app.revoke_person(&sk, "alice").await;
    let v = app.verify(&token).await;
    assert_eq!(v["error"], "TOKEN_REVOKED", "{v}");
    assert_eq!(app.introspect(&token).await, json!({"active": false}));
    let res = app.exchange(&a, &old, ID_TOKEN, RESOURCE, &[]).await;
    refused(&res, 400, "invalid_request");
    // A sign-in after the revocation works (a token of the revocation's own second does not:
    // times are whole seconds, and the doubt goes against the token).
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let later = idp.sign("JWT", json!({"aud": a.id, "iat": now() + 2}));
    let fresh = access(&app.delegated(&a, &later, ID_TOKEN, RESOURCE).await);
    assert_eq!(app.verify(&fresh).await["valid"], true);
    // Another person is untouched by alice's revocation.
    let bob = idp.sign("JWT", json!({"aud": a.id, "sub": "bob"}));
    assert_eq!(
        payload(&access(&app.delegated(&a, &bob, ID_TOKEN, RESOURCE).await))["sub"],
        "bob"
    );

    // The revocation's body is checked; a test-mode key may not.
    app.post(
        "/v1/subjects/revoke",
        Some(&sk),
        Some(&json!({"iss": "http://idp.example", "sub": "a"})),
    )
    .await
    .assert_error(400, "VALIDATION_ERROR");
    app.post(
        "/v1/subjects/revoke",
        Some(&sk),
        Some(&json!({"iss": IDP, "sub": ""})),
    )
    .await
    .assert_error(400, "VALIDATION_ERROR");
    app.post(
        "/v1/subjects/revoke",
        Some(&app.org.keys.secret_test),
        Some(&json!({"iss": IDP, "sub": "a"})),
    )
    .await
    .assert_error(403, "FORBIDDEN");
}

/// Agent A hands its task to agent B: B's token nests the chain, narrows the scopes, never
/// outlives A's, and dies with A, with B, with the provider's trust.
#[actix_web::test]
async fn a_two_hop_chain_verifies_and_dies_with_either_link() {
    let app = spawn_app().await;
    let sk = app.secret().to_owned();
    let idp = Idp::new(IDP);
    let idp_id = app.trust(&sk, &idp).await;
    let a = app.confidential(&sk, &["read:docs", "write:docs"]).await;
    let b = app.confidential(&sk, &["read:docs", "admin:all"]).await;

    let chain = |a: &Client, b: &Client| {
        let (app, idp) = (&app, &idp);
        let (a, b) = (
            Client {
                id: a.id.clone(),
                secret: a.secret.clone(),
            },
            Client {
                id: b.id.clone(),
                secret: b.secret.clone(),
            },
        );
        async move {
            let for_b = access(&app.delegated(&a, &idp.id_token(&a.id), ID_TOKEN, &app.base).await);
            let answer = app.delegated(&b, &for_b, ACCESS_TOKEN, RESOURCE).await;
            (for_b, answer)
        }
    };
    let (for_b, answer) = chain(&a, &b).await;
    assert_eq!(answer["scope"], "read:docs", "only what both hold: {answer}");
    let token = access(&answer);
    let claims = payload(&token);
    assert_eq!(claims["sub"], "alice");
    assert_eq!(claims["client_id"], b.id.as_str());
    assert_eq!(
        claims["act"],
        json!({"sub": b.id, "issuer_domain": "example.com",
               "act": {"sub": a.id, "issuer_domain": "example.com"}})
    );
    assert!(claims["exp"].as_i64() <= payload(&for_b)["exp"].as_i64());
    let v = app.verify(&token).await;
    assert_eq!(
        (v["valid"].as_bool(), v["agent_id"].as_str()),
        (Some(true), Some(b.id.as_str())),
        "{v}"
    );
    assert_eq!(v["act"]["act"]["sub"], a.id.as_str());

    // Attack: B asks for a scope A's token lacked (B holds it).
    let res = app
        .exchange(&b, &for_b, ACCESS_TOKEN, RESOURCE, &[("scope", "admin:all")])
        .await;
    refused(&res, 400, "invalid_scope");

    // The inner agent revoked: the outer token dies at once, and hands on nothing more.
    assert_eq!(app.revoke(&a.id, None).await.status, 200);
    assert_eq!(app.verify(&token).await["error"], "TOKEN_REVOKED");
    assert_eq!(app.introspect(&token).await["active"], false);
    let res = app.exchange(&b, &for_b, ACCESS_TOKEN, RESOURCE, &[]).await;
    refused(&res, 400, "invalid_request");

    // The outer agent revoked.
    let a2 = app.confidential(&sk, &["read:docs"]).await;
    let c = app.confidential(&sk, &["read:docs"]).await;
    let (_, answer) = chain(&a2, &c).await;
    let token = access(&answer);
    assert_eq!(app.verify(&token).await["valid"], true);
    assert_eq!(app.revoke(&c.id, None).await.status, 200);
    assert_eq!(app.verify(&token).await["error"], "TOKEN_REVOKED");

    // The provider no longer trusted: every token it vouched for dies.
    let d = app.confidential(&sk, &["read:docs"]).await;
    let (_, answer) = chain(&a2, &d).await;
    let token = access(&answer);
    let direct = access(
        &app.delegated(&a2, &idp.id_token(&a2.id), ID_TOKEN, RESOURCE)
            .await,
    );
    assert_eq!(app.verify(&token).await["valid"], true);
    app.distrust(&sk, &idp_id).await;
    for t in [&token, &direct] {
        let v = app.verify(t).await;
        assert_eq!(v["error"], "TOKEN_REVOKED", "{v}");
    }
    let res = app
        .exchange(&a2, &idp.id_token(&a2.id), ID_TOKEN, RESOURCE, &[])
        .await;
    refused(&res, 400, "invalid_request");
}

/// Removing a provider ends every token it vouched for, and adding its issuer again (new
/// keys, after a leak) revives none of them: the tokens stood on the provider's name alone.
#[actix_web::test]
async fn a_provider_removed_and_added_again_revives_none_of_its_tokens() {
    let app = spawn_app().await;
    let sk = app.secret().to_owned();
    let idp = Idp::new(IDP);
    let idp_id = app.trust(&sk, &idp).await;
    let a = app.confidential(&sk, &["read:docs"]).await;
    let old = access(&app.delegated(&a, &idp.id_token(&a.id), ID_TOKEN, RESOURCE).await);
    app.distrust(&sk, &idp_id).await;
    assert_eq!(app.verify(&old).await["error"], "TOKEN_REVOKED");
    // Past the second the old token was issued in (tokens' times are whole seconds) and the
    // 5 s an instance's clock may run behind another's.
    tokio::time::sleep(std::time::Duration::from_millis(6100)).await;
    let again = Idp::new(IDP);
    app.trust(&sk, &again).await;
    let v = app.verify(&old).await;
    assert_eq!(v["error"], "TOKEN_REVOKED", "{v}");
    let res = app.exchange(&a, &old, ACCESS_TOKEN, RESOURCE, &[]).await;
    assert_eq!(res.status, 400, "{}", res.text());
    let fresh = access(
        &app.delegated(&a, &again.id_token(&a.id), ID_TOKEN, RESOURCE)
            .await,
    );
    assert_eq!(app.verify(&fresh).await["valid"], true);
}

/// Attack: an organization's own provider names an agent's id as its person. A delegated
/// token's `sub` is the person, an agent's own token's its id: a resource server admitting
/// agents by `sub` would take the token for that agent's.
#[actix_web::test]
async fn a_provider_cannot_name_an_agent_as_its_person() {
    let app = spawn_app().await;
    let sk = app.secret().to_owned();
    let idp = Idp::new(IDP);
    app.trust(&sk, &idp).await;
    let a = app.confidential(&sk, &["read:docs"]).await;
    let victim = app.confidential(&sk, &["read:docs"]).await;
    let subject = idp.sign("JWT", json!({"aud": a.id, "sub": victim.id}));
    let why = refused(
        &app.exchange(&a, &subject, ID_TOKEN, RESOURCE, &[]).await,
        400,
        "invalid_request",
    );
    assert!(why.contains("agent's id"), "{why}");
    // An `exp` at the end of time is far off, not a panic.
    let subject = idp.sign("JWT", json!({"aud": a.id, "exp": i64::MAX}));
    let res = app.exchange(&a, &subject, ID_TOKEN, RESOURCE, &[]).await;
    assert_eq!(res.status, 200, "{}", res.text());
}

/// A chain one agent deeper than `--max-delegation-depth` is refused.
#[actix_web::test]
async fn a_chain_deeper_than_the_maximum_is_refused() {
    let app = spawn_app_with(Options {
        tweak: Box::new(|c| c.engine.oauth.max_delegation_depth = 2),
        ..Options::default()
    })
    .await;
    let sk = app.secret().to_owned();
    let idp = Idp::new(IDP);
    app.trust(&sk, &idp).await;
    let [a, b, c] = [
        app.confidential(&sk, &["read:docs"]).await,
        app.confidential(&sk, &["read:docs"]).await,
        app.confidential(&sk, &["read:docs"]).await,
    ];
    let one = access(&app.delegated(&a, &idp.id_token(&a.id), ID_TOKEN, &app.base).await);
    let two = access(&app.delegated(&b, &one, ACCESS_TOKEN, &app.base).await);
    let why = refused(
        &app.exchange(&c, &two, ACCESS_TOKEN, RESOURCE, &[]).await,
        400,
        "invalid_request",
    );
    assert!(why.contains("maximum"), "{why}");
}

/// Attack: a provider's token saying that another party acts for the person (`act`), or that
/// only a named party may (`may_act`), bought a token in which this agent acts for the person,
/// the other party gone from the chain (RFC 8693 §4.1, §4.4).
#[actix_web::test]
async fn a_subject_token_naming_its_actor_binds_the_exchange() {
    let app = spawn_app().await;
    let sk = app.secret().to_owned();
    let idp = Idp::new(IDP);
    app.trust(&sk, &idp).await;
    let a = app.confidential(&sk, &["read:docs"]).await;
    let other = app.confidential(&sk, &["read:docs"]).await;
    for claims in [
        json!({"aud": a.id, "act": {"sub": "bot-x"}}),
        json!({"aud": a.id, "may_act": {"sub": other.id}}),
        json!({"aud": a.id, "may_act": {"sub": a.id, "iss": "https://elsewhere.example"}}),
        json!({"aud": a.id, "may_act": "anyone"}),
    ] {
        let res = app
            .exchange(&a, &idp.sign("JWT", claims), ID_TOKEN, RESOURCE, &[])
            .await;
        let why = refused(&res, 400, "invalid_request");
        assert!(why.contains("act"), "{why}");
    }
    // A may_act that names this agent, here, is honoured.
    let named = json!({"aud": a.id, "may_act": {"sub": a.id, "iss": app.base}});
    let res = app
        .exchange(&a, &idp.sign("JWT", named), ID_TOKEN, RESOURCE, &[])
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
}

/// Every subject token that should buy nothing buys nothing, and says why.
#[actix_web::test]
async fn foreign_forged_stale_and_misaddressed_subject_tokens_are_refused() {
    let app = spawn_app().await;
    let sk = app.secret().to_owned();
    let idp = Idp::new(IDP);
    app.trust(&sk, &idp).await;
    let a = app.confidential(&sk, &["read:docs"]).await;
    let other = app.confidential(&sk, &["read:docs"]).await;
    let ask = |subject: String, kind: &'static str| {
        let (app, a) = (&app, &a);
        async move { app.exchange(a, &subject, kind, RESOURCE, &[]).await }
    };

    // An untrusted issuer, signing with its own key.
    let stranger = Idp::new("https://stranger.example");
    let why = refused(
        &ask(stranger.id_token(&a.id), ID_TOKEN).await,
        400,
        "invalid_request",
    );
    assert!(why.contains("trusts"), "{why}");
    // A provider another organization trusts (not this one's).
    let b_org = org_b(&app).await;
    let theirs = Idp::new("https://theirs.example");
    app.trust(&b_org.keys.secret_live, &theirs).await;
    refused(
        &ask(theirs.id_token(&a.id), ID_TOKEN).await,
        400,
        "invalid_request",
    );
    // A trusted issuer's name on a token signed by another key.
    let forger = Idp {
        iss: IDP.to_owned(),
        key: AgentKey::es(),
        kid: "k1",
    };
    let why = refused(
        &ask(forger.id_token(&a.id), ID_TOKEN).await,
        400,
        "invalid_request",
    );
    assert!(why.contains("signature"), "{why}");
    // For another client; for nobody; expired; without a sub; alg none.
    refused(
        &ask(idp.id_token(&other.id), ID_TOKEN).await,
        400,
        "invalid_request",
    );
    refused(
        &ask(idp.sign("JWT", json!({})), ID_TOKEN).await,
        400,
        "invalid_request",
    );
    let why = refused(
        &ask(
            idp.sign("JWT", json!({"aud": a.id, "exp": now() - 600})),
            ID_TOKEN,
        )
        .await,
        400,
        "invalid_request",
    );
    assert!(why.contains("expired"), "{why}");
    refused(
        &ask(idp.sign("JWT", json!({"aud": a.id, "sub": null})), ID_TOKEN).await,
        400,
        "invalid_request",
    );
    refused(
        &ask(idp.sign("JWT", json!({"aud": a.id, "sub": "al\nice"})), ID_TOKEN).await,
        400,
        "invalid_request",
    );
    // A test-mode agent of the same organization: people are vouched for in live mode only,
    // so it acts for no one, by any grant.
    let test = app
        .confidential(&app.org.keys.secret_test.clone(), &["read:docs"])
        .await;
    let why = refused(
        &app.exchange(&test, &idp.id_token(&test.id), ID_TOKEN, RESOURCE, &[])
            .await,
        400,
        "invalid_request",
    );
    assert!(why.contains("test-mode"), "{why}");
    let jag = idp.id_jag(&app, &test.id, json!({}));
    let res = app
        .token_for(&test, &[("grant_type", JWT_BEARER), ("assertion", &jag)])
        .await;
    let why = refused(&res, 400, "invalid_grant");
    assert!(why.contains("test-mode"), "{why}");
    // An ID-JAG as a subject token: its single use would be bypassed.
    let jag = idp.id_jag(&app, &a.id, json!({}));
    let why = refused(&ask(jag, ID_TOKEN).await, 400, "invalid_request");
    assert!(why.contains("ID-JAG"), "{why}");
    // Bound to a key (a DPoP-bound token, stolen): it is good only with a proof of that key,
    // which an exchange does not take, so it buys nothing (RFC 9449 §6.1).
    let bound = idp.sign(
        "JWT",
        json!({"aud": a.id, "cnf": {"jkt": "0ZcOCORZNYy-DWpqq30jZyJGHTN0d2HglBV3uiguA4I"}}),
    );
    let why = refused(&ask(bound, ID_TOKEN).await, 400, "invalid_request");
    assert!(why.contains("cnf"), "{why}");
    let bound = idp.id_jag(
        &app,
        &a.id,
        json!({"cnf": {"jkt": "0ZcOCORZNYy-DWpqq30jZyJGHTN0d2HglBV3uiguA4I"}}),
    );
    let res = app
        .token_for(&a, &[("grant_type", JWT_BEARER), ("assertion", &bound)])
        .await;
    let why = refused(&res, 400, "invalid_grant");
    assert!(why.contains("cnf"), "{why}");
    let none = format!(
        "{}.{}.",
        b64(&json!({"alg": "none", "kid": "k1"})),
        b64(&json!({"iss": IDP, "sub": "alice", "aud": a.id, "exp": now() + 60}))
    );
    refused(&ask(none, ID_TOKEN).await, 400, "invalid_request");

    // agentid tokens that act for nobody: an agent token, a plain access token for this issuer.
    let (_, agent_token) = app.agent().await;
    refused(&ask(agent_token, ACCESS_TOKEN).await, 400, "invalid_request");
    let plain = app
        .token_for(
            &a,
            &[
                ("grant_type", "client_credentials"),
                ("resource", app.base.as_str()),
            ],
        )
        .await;
    assert_eq!(plain.status, 200, "{}", plain.text());
    let why = refused(
        &ask(access(&plain.json()), ACCESS_TOKEN).await,
        400,
        "invalid_request",
    );
    assert!(why.contains("nobody"), "{why}");
    // A delegated token another organization's agent holds for this issuer.
    let theirs_agent = app
        .confidential_in(&b_org.keys.secret_live, "b.example", &["read:docs"])
        .await;
    let foreign = access(
        &app.delegated(
            &theirs_agent,
            &theirs.id_token(&theirs_agent.id),
            ID_TOKEN,
            &app.base,
        )
        .await,
    );
    let why = refused(&ask(foreign, ACCESS_TOKEN).await, 400, "invalid_request");
    assert!(why.contains("organization"), "{why}");
    // A delegated token for a resource, not for this issuer, handed on.
    let for_api = access(
        &app.delegated(&other, &idp.id_token(&other.id), ID_TOKEN, RESOURCE)
            .await,
    );
    refused(&ask(for_api, ACCESS_TOKEN).await, 400, "invalid_request");
    // A delegated token bound to its holder's key (DPoP), handed on without the key.
    let dpop = AgentKey::ed();
    let proof = dpop.proof_with(
        &dpop.header(),
        &json!({"jti": ulid::Ulid::new().to_string(), "htm": "POST",
                "htu": format!("{}/oauth/token", app.base), "iat": now()}),
    );
    let subject = idp.id_token(&other.id);
    let form = [
        ("client_id", other.id.as_str()),
        ("client_secret", other.secret.as_str()),
        ("grant_type", EXCHANGE),
        ("subject_token", subject.as_str()),
        ("subject_token_type", ID_TOKEN),
        ("resource", app.base.as_str()),
    ];
    let res = app.post_form("/oauth/token", &form, &[("DPoP", &proof)]).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["token_type"], "DPoP");
    let why = refused(
        &ask(access(&res.json()), ACCESS_TOKEN).await,
        400,
        "invalid_request",
    );
    assert!(why.contains("bound"), "{why}");

    // The form: a subject token type not taken, an actor token, another requested type.
    let t = idp.id_token(&a.id);
    for extra in [
        vec![("actor_token", "x")],
        vec![(
            "requested_token_type",
            "urn:ietf:params:oauth:token-type:refresh_token",
        )],
    ] {
        refused(
            &app.exchange(&a, &t, ID_TOKEN, RESOURCE, &extra).await,
            400,
            "invalid_request",
        );
    }
    refused(
        &app.exchange(&a, &t, "urn:x", RESOURCE, &[]).await,
        400,
        "invalid_request",
    );
    let res = app
        .token_for(
            &a,
            &[
                ("grant_type", EXCHANGE),
                ("subject_token_type", ID_TOKEN),
                ("resource", RESOURCE),
            ],
        )
        .await;
    refused(&res, 400, "invalid_request");
    // Without client authentication: no token.
    let res = app
        .post_form(
            "/oauth/token",
            &[
                ("grant_type", EXCHANGE),
                ("subject_token", &t),
                ("subject_token_type", ID_TOKEN),
                ("resource", RESOURCE),
            ],
            &[],
        )
        .await;
    refused(&res, 401, "invalid_client");
}

/// ID-JAG: the provider's assertion for this issuer and this agent buys one token for its
/// resource; replayed, for another client or resource, too long-lived or of another type, none.
#[actix_web::test]
async fn an_id_jag_buys_one_token_for_its_resource() {
    let app = spawn_app().await;
    let sk = app.secret().to_owned();
    let idp = Idp::new(IDP);
    app.trust(&sk, &idp).await;
    let a = app.confidential(&sk, &["read:docs", "write:docs"]).await;
    let other = app.confidential(&sk, &["read:docs"]).await;
    let meta = app
        .get("/.well-known/oauth-authorization-server", None)
        .await
        .json();
    assert_eq!(
        meta["grant_types_supported"],
        json!(["client_credentials", EXCHANGE, JWT_BEARER])
    );
    assert_eq!(
        meta["authorization_grant_profiles_supported"],
        json!(["urn:ietf:params:oauth:grant-profile:id-jag"])
    );

    let jag = idp.id_jag(&app, &a.id, json!({}));
    let res = app
        .token_for(&a, &[("grant_type", JWT_BEARER), ("assertion", &jag)])
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    let answer = res.json();
    assert!(answer.get("issued_token_type").is_none(), "{answer}");
    assert_eq!(answer["scope"], "read:docs");
    assert!(
        answer["expires_in"].as_i64().unwrap() <= 300,
        "never past the ID-JAG: {answer}"
    );
    let claims = payload(&access(&answer));
    assert_eq!(
        (claims["aud"].as_str(), claims["sub"].as_str()),
        (Some(RESOURCE), Some("alice"))
    );
    assert_eq!(claims["act"]["sub"], a.id.as_str());
    assert_eq!(app.verify(&access(&answer)).await["sub"], "alice");

    // Replayed.
    let res = app
        .token_for(&a, &[("grant_type", JWT_BEARER), ("assertion", &jag)])
        .await;
    let why = refused(&res, 400, "invalid_grant");
    assert!(why.contains("used already"), "{why}");
    // Its resource asked again is fine; another resource is not.
    let res = app
        .token_for(
            &a,
            &[
                ("grant_type", JWT_BEARER),
                ("assertion", &idp.id_jag(&app, &a.id, json!({}))),
                ("resource", RESOURCE),
            ],
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    let jag = idp.id_jag(&app, &a.id, json!({}));
    let res = app
        .token_for(
            &a,
            &[
                ("grant_type", JWT_BEARER),
                ("assertion", &jag),
                ("resource", "https://other.example/"),
            ],
        )
        .await;
    refused(&res, 400, "invalid_target");
    // A refused request (here, a scope the ID-JAG does not allow) spends no ID-JAG: the
    // corrected one gets its token.
    let res = app
        .token_for(
            &a,
            &[
                ("grant_type", JWT_BEARER),
                ("assertion", &jag),
                ("scope", "write:docs"),
            ],
        )
        .await;
    refused(&res, 400, "invalid_scope");
    let res = app
        .token_for(&a, &[("grant_type", JWT_BEARER), ("assertion", &jag)])
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    // Nor does one whose token cannot be recorded (503): the retry gets its token.
    let jag = idp.id_jag(&app, &a.id, json!({}));
    assert!(app.store.inject_write_fault(agentid::store::WriteFault::Panic));
    let res = app
        .token_for(&a, &[("grant_type", JWT_BEARER), ("assertion", &jag)])
        .await;
    assert_eq!(res.status, 503, "{}", res.text());
    let res = app
        .token_for(&a, &[("grant_type", JWT_BEARER), ("assertion", &jag)])
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    // For another client (presented by this one).
    let res = app
        .token_for(
            &a,
            &[
                ("grant_type", JWT_BEARER),
                ("assertion", &idp.id_jag(&app, &other.id, json!({}))),
            ],
        )
        .await;
    refused(&res, 400, "invalid_grant");
    // For another audience, or for others too; living too long; of another type; without a
    // jti; without an iat; untrusted; expired a moment ago (within the clock skew a token is
    // checked with).
    for bad in [
        idp.id_jag(&app, &a.id, json!({"exp": now() - 5})),
        idp.id_jag(&app, &a.id, json!({"aud": "https://elsewhere.example"})),
        idp.id_jag(
            &app,
            &a.id,
            json!({"aud": [app.base, "https://elsewhere.example"]}),
        ),
        idp.id_jag(&app, &a.id, json!({"iat": null})),
        idp.id_jag(&app, &a.id, json!({"exp": now() + 3600})),
        idp.sign(
            "JWT",
            json!({"aud": app.base, "client_id": a.id, "resource": RESOURCE, "exp": now() + 200}),
        ),
        idp.id_jag(&app, &a.id, json!({"jti": ""})),
        Idp::new("https://stranger.example").id_jag(&app, &a.id, json!({})),
    ] {
        let res = app
            .token_for(&a, &[("grant_type", JWT_BEARER), ("assertion", &bad)])
            .await;
        refused(&res, 400, "invalid_grant");
    }
    // No assertion.
    refused(
        &app.token_for(&a, &[("grant_type", JWT_BEARER)]).await,
        400,
        "invalid_request",
    );
}

/// A person's token narrows the grant by its `scope` and by its `scp` (Okta's array, Entra's
/// string); a `scope` of another shape is refused, never read as "no limit".
#[actix_web::test]
async fn a_persons_scopes_narrow_the_grant_in_every_form() {
    let app = spawn_app().await;
    let sk = app.secret().to_owned();
    let idp = Idp::new(IDP);
    app.trust(&sk, &idp).await;
    let a = app.confidential(&sk, &["read:docs", "write:docs"]).await;
    for allowed in [
        json!({"scp": ["read:docs"]}),
        json!({"scp": "read:docs"}),
        json!({"scope": "read:docs write:docs", "scp": ["read:docs"]}),
    ] {
        let mut claims = json!({"aud": a.id});
        claims
            .as_object_mut()
            .unwrap()
            .extend(allowed.as_object().unwrap().clone());
        let person = idp.sign("JWT", claims);
        let answer = app.delegated(&a, &person, ID_TOKEN, RESOURCE).await;
        assert_eq!(answer["scope"], "read:docs", "{allowed}");
        let res = app
            .exchange(&a, &person, ID_TOKEN, RESOURCE, &[("scope", "write:docs")])
            .await;
        refused(&res, 400, "invalid_scope");
    }
    for bad in [
        json!({"scope": ["read:docs"]}),
        json!({"scope": 7}),
        json!({"scp": [1]}),
        json!({"scp": {"read:docs": true}}),
    ] {
        let mut claims = json!({"aud": a.id});
        claims
            .as_object_mut()
            .unwrap()
            .extend(bad.as_object().unwrap().clone());
        let res = app
            .exchange(
                &a,
                &idp.sign("JWT", claims),
                ID_TOKEN,
                RESOURCE,
                &[("scope", "write:docs")],
            )
            .await;
        let why = refused(&res, 400, "invalid_request");
        assert!(why.contains("sc"), "{bad}: {why}");
        let jag = idp.id_jag(&app, &a.id, bad.clone());
        let res = app
            .token_for(&a, &[("grant_type", JWT_BEARER), ("assertion", &jag)])
            .await;
        refused(&res, 400, "invalid_grant");
    }
}

/// An ID-JAG is spent within its organization: another one that trusts the same issuer name
/// with keys of its own, spending an ID-JAG with the same `jti` first, takes nothing from it.
#[actix_web::test]
async fn another_organization_cannot_spend_an_id_jag_first() {
    let app = spawn_app().await;
    let sk = app.secret().to_owned();
    let idp = Idp::new(IDP);
    app.trust(&sk, &idp).await;
    let a = app.confidential(&sk, &["read:docs"]).await;
    let b_org = org_b(&app).await;
    let b_sk = b_org.keys.secret_live.clone();
    let spoof = Idp::new(IDP);
    app.trust(&b_sk, &spoof).await;
    let b = app.confidential_in(&b_sk, "b.example", &["read:docs"]).await;
    let jti = json!({"jti": "predictable-1"});
    let res = app
        .token_for(
            &b,
            &[
                ("grant_type", JWT_BEARER),
                ("assertion", &spoof.id_jag(&app, &b.id, jti.clone())),
            ],
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    let res = app
        .token_for(
            &a,
            &[
                ("grant_type", JWT_BEARER),
                ("assertion", &idp.id_jag(&app, &a.id, jti)),
            ],
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
}

/// A person revoked reaches the organization's Shared Signals streams as a CAEP
/// session-revoked event naming them (`iss_sub`).
#[actix_web::test]
async fn a_revoked_person_is_a_session_revoked_event() {
    let app = spawn_app().await;
    let sk = app.secret().to_owned();
    let res = crate::ssf::send(
        &app,
        "POST",
        "/ssf/streams",
        Some(&sk),
        Some(json!({"delivery": {"method": "urn:ietf:rfc:8936"},
                    "events_requested": ["https://schemas.openid.net/secevent/caep/event-type/session-revoked"]})),
    )
    .await;
    assert_eq!(res.status, 201, "{}", res.text());
    let created = res.json();
    let (id, poll_token) = (
        created["stream_id"].as_str().unwrap().to_owned(),
        created["poll_token"].as_str().unwrap().to_owned(),
    );
    app.revoke_person(&sk, "alice").await;
    let polled = crate::ssf::send(
        &app,
        "POST",
        &format!("/ssf/poll/{id}"),
        Some(&poll_token),
        Some(json!({"returnImmediately": true})),
    )
    .await
    .json();
    let sets: Vec<&Value> = polled["sets"].as_object().unwrap().values().collect();
    assert_eq!(sets.len(), 1, "{polled}");
    let claims = crate::ssf::checked_set(&app, sets[0].as_str().unwrap()).await;
    assert_eq!(
        claims["sub_id"],
        json!({"format": "iss_sub", "iss": IDP, "sub": "alice"})
    );
    assert!(
        claims["events"]["https://schemas.openid.net/secevent/caep/event-type/session-revoked"]
            ["event_timestamp"]
            .is_i64(),
        "{claims}"
    );
}

/// A provider's keys published at its jwks_uri: fetched over TLS, kept, asked again with the
/// ETag once a token names a key the set lacks, and a new key found then.
#[actix_web::test]
async fn keys_at_a_jwks_uri_are_fetched_cached_and_refreshed() {
    let (app, tls, _dns) = keys_host().await;
    let sk = app.secret().to_owned();
    let mut idp = Idp::new(IDP);
    let serve = |jwks: &Value, etag: &str| {
        let body = jwks.to_string();
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nETag: \"{etag}\"\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    tls.answer(serve(&idp.jwks(), "v1"));
    let a = trust_keys_host(&app, &sk).await;
    app.delegated(&a, &idp.id_token(&a.id), ID_TOKEN, RESOURCE).await;
    app.delegated(&a, &idp.id_token(&a.id), ID_TOKEN, RESOURCE).await;
    assert_eq!(tls.hits(), 1, "the set is kept");
    assert!(tls.heads()[0].starts_with("GET /jwks "), "{:?}", tls.heads());

    // The provider rotates: a token with the new kid makes the service ask again, with the
    // validator it holds.
    idp.key = AgentKey::ed();
    idp.kid = "k2";
    tls.answer(serve(&idp.jwks(), "v2"));
    app.delegated(&a, &idp.id_token(&a.id), ID_TOKEN, RESOURCE).await;
    assert_eq!(tls.hits(), 2);
    assert!(
        tls.heads()[1]
            .to_ascii_lowercase()
            .contains("if-none-match: \"v1\""),
        "{:?}",
        tls.heads()
    );
    // An unknown kid again within 30 s asks nobody.
    let stranger_kid = Idp {
        iss: IDP.to_owned(),
        key: AgentKey::ed(),
        kid: "k3",
    };
    refused(
        &app.exchange(&a, &stranger_kid.id_token(&a.id), ID_TOKEN, RESOURCE, &[])
            .await,
        400,
        "invalid_request",
    );
    assert_eq!(tls.hits(), 2);
}

/// Attack: a `jwks_uri` answering more keys than a provider may have (each kept, for every
/// URL, for minutes) is refused as unavailable, like any set that cannot be had.
#[actix_web::test]
async fn a_jwks_uri_with_too_many_keys_is_refused() {
    let (app, tls, _dns) = keys_host().await;
    let sk = app.secret().to_owned();
    let idp = Idp::new(IDP);
    let mut jwks = idp.jwks();
    let key = jwks["keys"][0].clone();
    jwks["keys"] = json!(vec![key; 21]);
    let body = jwks.to_string();
    tls.answer(format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ));
    let a = trust_keys_host(&app, &sk).await;
    let res = app
        .exchange(&a, &idp.id_token(&a.id), ID_TOKEN, RESOURCE, &[])
        .await;
    let why = refused(&res, 503, "temporarily_unavailable");
    assert!(why.contains("more than 20 keys"), "{why}");
}

/// A provider removed and added again (its key leaked and rotated at the source) has its
/// `jwks_uri` fetched afresh: the set held for the removed one vouches for no new token.
#[actix_web::test]
async fn a_provider_added_again_fetches_its_keys_afresh() {
    let (app, tls, _dns) = keys_host().await;
    let sk = app.secret().to_owned();
    let leaked = Idp::new(IDP);
    let serve = |jwks: &Value| {
        let body = jwks.to_string();
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    tls.answer(serve(&leaked.jwks()));
    let a = trust_keys_host(&app, &sk).await;
    app.delegated(&a, &leaked.id_token(&a.id), ID_TOKEN, RESOURCE)
        .await;
    let providers = app.get("/v1/identity-providers", Some(&sk)).await.json();
    let id = providers["data"][0]["id"].as_str().unwrap().to_owned();
    // The source's keys rotate; the organization takes the provider out and back in.
    let rotated = Idp {
        iss: IDP.to_owned(),
        key: AgentKey::ed(),
        kid: "k2",
    };
    tls.answer(serve(&rotated.jwks()));
    app.distrust(&sk, &id).await;
    trust_keys_host(&app, &sk).await;
    refused(
        &app.exchange(&a, &leaked.id_token(&a.id), ID_TOKEN, RESOURCE, &[])
            .await,
        400,
        "invalid_request",
    );
    app.delegated(&a, &rotated.id_token(&a.id), ID_TOKEN, RESOURCE)
        .await;
}

/// What a failing `jwks_uri` answers.
const UNAVAILABLE: &str =
    "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";

/// Trusts [`IDP`] with its keys at `https://keys.idp.example/jwks`; a client of the
/// organization.
async fn trust_keys_host(app: &TestApp, sk: &str) -> Client {
    let res = app
        .post(
            "/v1/identity-providers",
            Some(sk),
            Some(&json!({"issuer": IDP, "jwks_uri": "https://keys.idp.example/jwks"})),
        )
        .await;
    assert_eq!(res.status, 201, "{}", res.text());
    app.confidential(sk, &["read:docs"]).await
}

/// A service (local provider keys allowed) that reaches `keys.idp.example` at 127.0.0.1, and
/// the TLS server there (a certificate of the tests' own root), with the DNS server naming it.
async fn keys_host() -> (TestApp, Http, TestDns) {
    let pki = Pki::new("keys.idp.example");
    let tls = Http::start_tls(&pki);
    let dns = TestDns::start().await;
    dns.addr("keys.idp.example", "127.0.0.1".parse::<IpAddr>().unwrap());
    let app = spawn_app_with(Options {
        tweak: Box::new(|c| c.engine.oauth.allow_local_provider_keys = true),
        outbound: OutboundConfig {
            dns_server: Some(dns.addr),
            extra_roots: vec![pki.root.clone()],
            https_port: tls.port,
            http_port: 80,
        },
        ..Options::default()
    })
    .await;
    (app, tls, dns)
}

/// Attack: a provider's `jwks_uri` that fails (or hangs) is asked once, not by every caller
/// in turn: the exchanges that come within 30 s of the failure fail at once, unfetched.
#[actix_web::test]
async fn a_failing_jwks_uri_is_not_asked_again_at_once() {
    let (app, tls, _dns) = keys_host().await;
    let sk = app.secret().to_owned();
    let idp = Idp::new(IDP);
    tls.answer(UNAVAILABLE.into());
    let a = trust_keys_host(&app, &sk).await;
    for _ in 0..3 {
        let res = app
            .exchange(&a, &idp.id_token(&a.id), ID_TOKEN, RESOURCE, &[])
            .await;
        assert_ne!(res.status, 200, "{}", res.text());
        assert!(res.text().contains("503"), "{}", res.text());
    }
    assert_eq!(tls.hits(), 1, "asked once");
}

/// Attack: a token naming a key the set lacks makes the service ask the `jwks_uri` again; when
/// that fetch fails, the set it holds still serves the tokens of the keys it has (anyone can
/// ask for such a refetch: it must take nothing away), and the failure stands for the
/// refetches that follow, unfetched.
#[actix_web::test]
async fn a_failed_refetch_takes_no_key_away() {
    let (app, tls, _dns) = keys_host().await;
    let sk = app.secret().to_owned();
    let idp = Idp::new(IDP);
    tls.answer(ok(&idp.jwks().to_string()));
    let a = trust_keys_host(&app, &sk).await;
    app.delegated(&a, &idp.id_token(&a.id), ID_TOKEN, RESOURCE).await;
    assert_eq!(tls.hits(), 1);

    tls.answer(UNAVAILABLE.into());
    let stranger = Idp {
        iss: IDP.to_owned(),
        key: AgentKey::ed(),
        kid: "k9",
    };
    for _ in 0..2 {
        let res = app
            .exchange(&a, &stranger.id_token(&a.id), ID_TOKEN, RESOURCE, &[])
            .await;
        assert_ne!(res.status, 200, "{}", res.text());
    }
    assert_eq!(tls.hits(), 2, "the refetch is asked once");
    app.delegated(&a, &idp.id_token(&a.id), ID_TOKEN, RESOURCE).await;
    assert_eq!(tls.hits(), 2, "the held set served it");
}

/// A person's revocation cannot be undone in the database: its row deleted, its time set
/// back (by an update, or by SQLite's REPLACE, which deletes without delete triggers), or
/// moved to another person; the revoked tokens stay refused, by a new instance too. Revoked
/// again, the time moves forward.
#[actix_web::test]
async fn a_persons_revocation_cannot_be_undone_in_the_database() {
    let app = spawn_app().await;
    let t = person_token(&app, RESOURCE, "read:docs").await;
    assert_eq!(app.verify(&t.token).await["valid"], true);
    let sk = app.secret().to_owned();
    app.revoke_person(&sk, "alice").await;
    assert_eq!(app.verify(&t.token).await["error"], "TOKEN_REVOKED");

    let mut undo = vec![
        "DELETE FROM subject_revocations".to_owned(),
        "UPDATE subject_revocations SET revoked_at = 0".to_owned(),
        "UPDATE subject_revocations SET sub = 'mallory'".to_owned(),
    ];
    if !app.db.is_postgres() {
        undo.push(
            "INSERT OR REPLACE INTO subject_revocations (org_id, iss, sub, revoked_at) \
             SELECT org_id, iss, sub, 0 FROM subject_revocations"
                .to_owned(),
        );
    } else {
        undo.push("TRUNCATE subject_revocations".to_owned());
    }
    for sql in &undo {
        let err = app.refused(sql).await;
        assert!(err.contains("a person's revocation is kept"), "{sql}: {err}");
    }
    let app = app.restart().await;
    assert_eq!(app.verify(&t.token).await["error"], "TOKEN_REVOKED");

    // Revoked again: the row's time moves forward; an update moving it forward passes.
    let org = crate::helpers::org_id(&app.org.org_id);
    let at = || async {
        let standing = app.store.delegation_standing(&org, IDP, "alice", &[]);
        standing.await.unwrap().subject_revoked_at.unwrap()
    };
    let first = at().await;
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    app.revoke_person(&sk, "alice").await;
    assert!(at().await > first);
    app.raw_execute("UPDATE subject_revocations SET revoked_at = revoked_at + 1")
        .await
        .unwrap();
}

/// Attack, by someone who can write the database: a provider row inserted there (with a MAC
/// copied from a real row, or none), or a trusted provider's keys swapped for theirs. The key
/// file seals each row, so none of these vouches for anyone, and tokens the swapped provider
/// vouched for die online.
#[actix_web::test]
async fn a_provider_written_into_the_database_vouches_for_no_one() {
    let app = spawn_app().await;
    let sk = app.secret().to_owned();
    let idp = Idp::new(IDP);
    app.trust(&sk, &idp).await;
    let a = app.confidential(&sk, &["read:docs"]).await;
    let before = access(&app.delegated(&a, &idp.id_token(&a.id), ID_TOKEN, RESOURCE).await);
    assert_eq!(app.verify(&before).await["valid"], true);

    // An attacker's provider, inserted with the real row's MAC.
    let evil = Idp::new("https://evil.example");
    let quoted = |v: &Value| v.to_string().replace('\'', "''");
    app.raw_execute(&format!(
        "INSERT INTO identity_providers (id, org_id, issuer, jwks, jwks_uri, created_at, mac) \
         SELECT 'idp_01jd0000000000000000000000', org_id, 'https://evil.example', '{}', NULL, created_at, mac \
         FROM identity_providers WHERE issuer = '{IDP}'",
        quoted(&evil.jwks())
    ))
    .await
    .unwrap();
    let why = refused(
        &app.exchange(&a, &evil.id_token(&a.id), ID_TOKEN, RESOURCE, &[])
            .await,
        400,
        "invalid_request",
    );
    assert!(why.contains("trusts"), "{why}");

    // The trusted provider's keys swapped for the attacker's: its name buys nothing, and the
    // tokens it vouched for die at once.
    let forger = Idp {
        iss: IDP.to_owned(),
        key: AgentKey::es(),
        kid: "k1",
    };
    app.raw_execute(&format!(
        "UPDATE identity_providers SET jwks = '{}' WHERE issuer = '{IDP}'",
        quoted(&forger.jwks())
    ))
    .await
    .unwrap();
    refused(
        &app.exchange(&a, &forger.id_token(&a.id), ID_TOKEN, RESOURCE, &[])
            .await,
        400,
        "invalid_request",
    );
    assert_eq!(app.verify(&before).await["error"], "TOKEN_REVOKED");
    let counted = agentid::telemetry::metrics_handle().render();
    assert!(
        counted.contains(r#"agentid_integrity_failures_total{what="identity_provider"}"#),
        "the alarm is counted"
    );
}

/// Attack, by someone who can write the database: a provider the organization removed (its
/// key leaked, say) put back with the row it had, MAC and all. Removal is kept: the row is
/// refused, and the note of the removal is never deleted or changed.
#[actix_web::test]
async fn a_removed_provider_cannot_be_put_back_in_the_database() {
    let app = spawn_app().await;
    let sk = app.secret().to_owned();
    let idp = Idp::new(IDP);
    let idp_id = app.trust(&sk, &idp).await;
    let a = app.confidential(&sk, &["read:docs"]).await;
    app.delegated(&a, &idp.id_token(&a.id), ID_TOKEN, RESOURCE).await;
    app.raw_execute("CREATE TABLE kept_provider AS SELECT * FROM identity_providers")
        .await
        .unwrap();
    app.distrust(&sk, &idp_id).await;

    let mut undo = vec![
        "INSERT INTO identity_providers SELECT * FROM kept_provider".to_owned(),
        "DELETE FROM identity_provider_removals".to_owned(),
        "UPDATE identity_provider_removals SET id = 'idp_01jd0000000000000000000000'".to_owned(),
    ];
    if app.db.is_postgres() {
        undo.push("TRUNCATE identity_provider_removals".to_owned());
    } else {
        undo.push("INSERT OR REPLACE INTO identity_providers SELECT * FROM kept_provider".to_owned());
    }
    for sql in &undo {
        let err = app.refused(sql).await;
        assert!(
            err.contains("a removed identity provider stays removed"),
            "{sql}: {err}"
        );
    }
    if app.db.is_postgres() {
        // A temporary table under the removals' name (any role may make one) hides nothing.
        let err = app
            .raw_session(&[
                "CREATE TEMP TABLE identity_provider_removals (id TEXT, org_id TEXT, removed_at BIGINT)",
                "INSERT INTO identity_providers SELECT * FROM kept_provider",
            ])
            .await
            .expect_err("a temporary table stood in for the removals")
            .to_string();
        assert!(err.contains("a removed identity provider stays removed"), "{err}");
    }
    let why = refused(
        &app.exchange(&a, &idp.id_token(&a.id), ID_TOKEN, RESOURCE, &[])
            .await,
        400,
        "invalid_request",
    );
    assert!(why.contains("trusts"), "{why}");
    // Trusted again through the API, it is a new provider: its removal stays.
    app.trust(&sk, &idp).await;
    app.delegated(&a, &idp.id_token(&a.id), ID_TOKEN, RESOURCE).await;
}
