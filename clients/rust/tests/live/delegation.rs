//! Agents acting for people at a receiver: a delegated token's person and chain, offline and
//! online; a person's revocation pushed as a Shared Signals event; the tower layer's
//! `delegated`; against a real server.

use agentid_verifier::{Actor, Subject, Verifier};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ed25519_dalek::SigningKey;
use serde_json::{json, Value};

use super::{code, now, Server};

const API: &str = "https://api.example/mcp";
const IDP: &str = "https://idp.example";
const ID_TOKEN: &str = "urn:ietf:params:oauth:token-type:id_token";

/// A stand-in identity provider's key, trusted by the server's organization.
fn trusted_idp(s: &Server) -> SigningKey {
    let key = SigningKey::from_bytes(&[42; 32]);
    let jwk = json!({"kty": "OKP", "crv": "Ed25519", "kid": "e1",
                     "x": URL_SAFE_NO_PAD.encode(key.verifying_key().as_bytes())});
    s.call(
        "POST",
        "/v1/identity-providers",
        Some(json!({"issuer": IDP, "jwks": {"keys": [jwk]}})),
        None,
    );
    key
}

fn id_token(idp: &SigningKey, sub: &str, aud: &str) -> String {
    let header = json!({"alg": "EdDSA", "kid": "e1", "typ": "JWT"});
    let claims = json!({"iss": IDP, "sub": sub, "aud": aud, "iat": now(), "exp": now() + 600});
    super::jws(idp, &header, &claims)
}

/// An agent with a client secret: its id and secret.
fn confidential(s: &Server, scopes: &[&str]) -> (String, String) {
    let (id, _) = s.register(json!({"scopes": scopes}));
    let secret = s.call("POST", &format!("/v1/agents/{id}/client-secret"), None, None);
    (id, secret["client_secret"].as_str().unwrap().to_owned())
}

fn exchange(
    s: &Server,
    (id, secret): &(String, String),
    subject: &str,
    resource: &str,
    kind: &str,
) -> String {
    let res = ureq::post(&format!("{}/oauth/token", s.base))
        .send_form(&[
            ("grant_type", "urn:ietf:params:oauth:grant-type:token-exchange"),
            ("client_id", id),
            ("client_secret", secret),
            ("subject_token", subject),
            ("subject_token_type", kind),
            ("resource", resource),
        ])
        .unwrap()
        .into_string()
        .unwrap();
    let res: Value = serde_json::from_str(&res).unwrap();
    res["access_token"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "current_thread")]
async fn a_delegated_token_names_the_person_and_the_chain() {
    let s = Server::start();
    let idp = trusted_idp(&s);
    let a = confidential(&s, &["tools:call", "read:docs"]);
    let b = confidential(&s, &["tools:call"]);
    let v = Verifier::builder(&s.base)
        .allow_local(true)
        .issuers(["example.com"])
        .audience(API)
        .build()
        .unwrap();
    let direct = v
        .verify(&exchange(&s, &a, &id_token(&idp, "alice", &a.0), API, ID_TOKEN))
        .await
        .unwrap();
    assert_eq!(direct.agent_id, a.0);
    let alice = Subject {
        sub: "alice".into(),
        iss: IDP.into(),
    };
    assert_eq!(direct.subject.as_ref(), Some(&alice));
    assert_eq!(
        alice.sub_id(),
        json!({"format": "iss_sub", "iss": IDP, "sub": "alice"})
    );
    assert_eq!(
        direct.actors,
        [Actor {
            agent_id: a.0.clone(),
            issuer: "example.com".into()
        }]
    );

    let for_b = exchange(&s, &a, &id_token(&idp, "alice", &a.0), &s.base, ID_TOKEN);
    let handed = exchange(
        &s,
        &b,
        &for_b,
        API,
        "urn:ietf:params:oauth:token-type:access_token",
    );
    let agent = v.verify(&handed).await.unwrap();
    assert_eq!(agent.agent_id, b.0);
    let chain: Vec<&str> = agent.actors.iter().map(|x| x.agent_id.as_str()).collect();
    assert_eq!(chain, [b.0.as_str(), a.0.as_str()]);
    let online = v.verify_online(&handed, None, &[]).await.unwrap();
    assert_eq!(online.subject, Some(alice));
    assert_eq!(online.actors, agent.actors);

    // A token that acts for nobody has no subject; the layer's `delegated` refuses it.
    let (_, plain) = s.register(json!({"scopes": ["tools:call"]}));
    let anyone = Verifier::builder(&s.base).allow_local(true).build().unwrap();
    assert!(!anyone.verify(&plain).await.unwrap().delegated());
    #[cfg(feature = "tower")]
    {
        use agentid_verifier::tower::AgentIdLayer;
        use tower_layer::Layer;
        use tower_service::Service;
        let call = |token: String| {
            let mut svc = AgentIdLayer::new(anyone.clone(), &[])
                .delegated()
                .layer(super::ECHO);
            let req = http::Request::builder()
                .header("Authorization", format!("Bearer {token}"))
                .body(())
                .unwrap();
            async move { svc.call(req).await.unwrap() }
        };
        assert_eq!(call(plain.clone()).await.status(), 401);
        let ok = call(handed.clone()).await;
        assert_eq!((ok.status().as_u16(), ok.body().as_str()), (200, b.0.as_str()));
    }

    // Online, the inner agent's revocation ends the outer token at once.
    s.revoke(&a.0);
    assert_eq!(code(v.verify_online(&handed, None, &[]).await), "TOKEN_REVOKED");
}

#[tokio::test(flavor = "current_thread")]
async fn a_person_revoked_by_a_pushed_event_is_refused_offline() {
    let s = Server::start();
    let idp = trusted_idp(&s);
    let a = confidential(&s, &["tools:call"]);
    let v = Verifier::builder(&s.base)
        .allow_local(true)
        .audience(API)
        .build()
        .unwrap();
    let token = exchange(&s, &a, &id_token(&idp, "carol", &a.0), API, ID_TOKEN);
    assert!(v.verify(&token).await.unwrap().delegated());
    let stream = s.set_stream(json!({}));
    s.call(
        "POST",
        "/v1/subjects/revoke",
        Some(json!({"iss": IDP, "sub": "carol"})),
        None,
    );
    v.handle_set(&s.the_set(&stream)).await.unwrap();
    assert_eq!(code(v.verify(&token).await), "TOKEN_REVOKED");
    let dave = exchange(&s, &a, &id_token(&idp, "dave", &a.0), API, ID_TOKEN);
    assert_eq!(v.verify(&dave).await.unwrap().subject.unwrap().sub, "dave");
}

/// Attack: an organization whose stream reaches the receiver floods it with revocations of
/// people of its own, to push another's revocation of carol out of memory. Past the bound the
/// earliest goes, but every person's token from before it stays refused; a token from after
/// the flood is taken.
#[tokio::test(flavor = "current_thread")]
async fn a_flood_of_person_revocations_brings_no_revoked_token_back() {
    let s = Server::start();
    let idp = trusted_idp(&s);
    let a = confidential(&s, &["tools:call"]);
    let v = Verifier::builder(&s.base)
        .allow_local(true)
        .audience(API)
        .build()
        .unwrap();
    let token = exchange(&s, &a, &id_token(&idp, "carol", &a.0), API, ID_TOKEN);
    let stream = s.set_stream(json!({}));
    s.call(
        "POST",
        "/v1/subjects/revoke",
        Some(json!({"iss": IDP, "sub": "carol"})),
        None,
    );
    let set = s.the_set(&stream);
    v.handle_set(&set).await.unwrap();
    assert_eq!(code(v.verify(&token).await), "TOKEN_REVOKED");
    let mut claims = super::claims_of(&set);
    // Each revoked after carol: hers is the earliest.
    let events = claims["events"].as_object_mut().unwrap();
    for event in events.values_mut() {
        event["event_timestamp"] = json!(event["event_timestamp"].as_i64().unwrap() + 1);
    }
    for i in 0..agentid_verifier::SEEN_SETS {
        claims["jti"] = json!(format!("flood-{i}"));
        claims["sub_id"]["sub"] = json!(format!("p{i}"));
        v.handle_set(&s.sign(&claims, "secevent+jwt")).await.unwrap();
    }
    assert_eq!(code(v.verify(&token).await), "TOKEN_REVOKED");
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let later = exchange(&s, &a, &id_token(&idp, "dave", &a.0), API, ID_TOKEN);
    assert_eq!(v.verify(&later).await.unwrap().subject.unwrap().sub, "dave");
}
