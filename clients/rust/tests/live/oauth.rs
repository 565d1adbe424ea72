//! Access tokens (OAuth 2, RFC 9068) at a receiver: the audience a receiver names, what a
//! verified access token tells, and protected resource metadata (RFC 9728) in the tower
//! layer, against a real server whose token endpoint the agent asks itself.

use agentid_verifier::{ResourceMetadata, Verifier};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ed25519_dalek::{Signer as _, SigningKey};
use serde_json::{json, Value};

use super::{code, now, Server};

const API_A: &str = "https://shop-a.example/mcp";
const API_B: &str = "https://shop-b.example/mcp";

/// An agent bound to a fresh Ed25519 key, as an OAuth client.
fn client(s: &Server, scopes: &[&str]) -> (String, SigningKey) {
    let key = SigningKey::from_bytes(&rand_seed());
    let jwk =
        json!({"kty": "OKP", "crv": "Ed25519", "x": URL_SAFE_NO_PAD.encode(key.verifying_key().as_bytes())});
    let (id, _) = s.register(json!({"scopes": scopes, "jwk": jwk}));
    (id, key)
}

fn rand_seed() -> [u8; 32] {
    let mut seed = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut seed).unwrap();
    seed
}

/// An access token the agent gets itself (client credentials, private_key_jwt).
fn access_token(s: &Server, id: &str, key: &SigningKey, resources: &[&str], scope: Option<&str>) -> String {
    let jti = URL_SAFE_NO_PAD.encode(rand_seed());
    let claims = json!({"iss": id, "sub": id, "aud": s.base, "iat": now(), "exp": now() + 300, "jti": jti});
    let signed = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(json!({"alg": "EdDSA", "typ": "JWT"}).to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let assertion = format!(
        "{signed}.{}",
        URL_SAFE_NO_PAD.encode(key.sign(signed.as_bytes()).to_bytes())
    );
    let mut form = vec![
        ("grant_type", "client_credentials"),
        (
            "client_assertion_type",
            "urn:ietf:params:oauth:client-assertion-type:jwt-bearer",
        ),
        ("client_assertion", assertion.as_str()),
    ];
    form.extend(resources.iter().map(|r| ("resource", *r)));
    if let Some(scope) = scope {
        form.push(("scope", scope));
    }
    let answer: Value = serde_json::from_str(
        &ureq::post(&format!("{}/oauth/token", s.base))
            .send_form(&form)
            .unwrap()
            .into_string()
            .unwrap(),
    )
    .unwrap();
    answer["access_token"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "current_thread")]
async fn a_token_for_one_receiver_fails_at_another() {
    let s = Server::start();
    let (id, key) = client(&s, &["tools:call", "read:docs"]);
    let token = access_token(&s, &id, &key, &[API_A], Some("tools:call"));
    let a = Verifier::builder(&s.base)
        .allow_local(true)
        .issuers(["example.com"])
        .audience(API_A)
        .build()
        .unwrap();
    let agent = a.verify_with_scopes(&token, &["tools:call"]).await.unwrap();
    assert_eq!(agent.agent_id, id);
    assert_eq!(agent.client_id.as_deref(), Some(id.as_str()));
    assert_eq!(agent.audience, [API_A]);
    assert_eq!(agent.scopes, ["tools:call"]);
    assert_eq!(agent.issuer, "example.com");
    assert_eq!(agent.claims["iss"], s.base.as_str());
    let b = Verifier::builder(&s.base)
        .allow_local(true)
        .audience(API_B)
        .build()
        .unwrap();
    assert_eq!(code(b.verify(&token).await), "TOKEN_INVALID");
    assert_eq!(code(b.verify_online(&token, None, &[]).await), "TOKEN_INVALID");
    assert_eq!(
        a.verify_online(&token, None, &[]).await.unwrap().audience,
        [API_A]
    );
    // An agent token names no audience: a receiver that names one refuses it.
    let (_, agent_token) = s.register(json!({}));
    assert_eq!(code(a.verify(&agent_token).await), "TOKEN_INVALID");
    let anyone = Verifier::builder(&s.base).allow_local(true).build().unwrap();
    assert!(anyone.verify(&agent_token).await.unwrap().audience.is_empty());
    // Several resources: any of the receiver's names does.
    let both = access_token(&s, &id, &key, &[API_A, API_B], None);
    assert_eq!(b.verify(&both).await.unwrap().audience, [API_A, API_B]);
    assert_eq!(
        code(
            Verifier::builder(&s.base)
                .allow_local(true)
                .issuers(["other.example"])
                .build()
                .unwrap()
                .verify(&token)
                .await
        ),
        "TOKEN_INVALID"
    );
    // Signed by the service, yet not of this service, or not whole.
    let good = json!({"iss": s.base, "sub": id, "client_id": id, "aud": API_A, "scope": "tools:call",
                      "issuer_domain": "example.com", "iat": now(), "exp": now() + 60, "jti": "x"});
    assert_eq!(code(a.verify(&s.sign(&good, "at+jwt")).await), "ok");
    let mut other_iss = good.clone();
    other_iss["iss"] = json!("https://evil.example");
    let mut other_client = good.clone();
    other_client["client_id"] = json!("agt_other");
    for (claims, typ) in [(&other_iss, "at+jwt"), (&other_client, "at+jwt"), (&good, "JWT")] {
        assert_eq!(
            code(a.verify(&s.sign(claims, typ)).await),
            "TOKEN_INVALID",
            "{claims} {typ}"
        );
    }
}

#[cfg(feature = "tower")]
#[tokio::test(flavor = "current_thread")]
async fn the_tower_layer_names_and_serves_resource_metadata() {
    use agentid_verifier::tower::{AgentIdLayer, ResourceMetadataService};
    use tower_layer::Layer;
    use tower_service::Service;

    let s = Server::start();
    let v = Verifier::builder(&s.base)
        .allow_local(true)
        .audience(API_A)
        .build()
        .unwrap();
    let metadata = ResourceMetadata::new(&v, API_A)
        .unwrap()
        .scopes_supported(["tools:call"]);
    assert_eq!(metadata.path(), "/.well-known/oauth-protected-resource/mcp");
    assert_eq!(
        metadata.url(),
        "https://shop-a.example/.well-known/oauth-protected-resource/mcp"
    );
    let doc = ResourceMetadataService::<String>::new(&metadata)
        .call(http::Request::new(()))
        .await
        .unwrap();
    assert_eq!(doc.headers()["access-control-allow-origin"], "*");
    assert_eq!(
        serde_json::from_str::<Value>(doc.body()).unwrap(),
        json!({"resource": API_A, "authorization_servers": [s.base], "scopes_supported": ["tools:call"],
               "bearer_methods_supported": ["header"], "dpop_signing_alg_values_supported": ["EdDSA", "ES256"]})
    );
    let call = |auth: Option<String>| {
        let mut svc = AgentIdLayer::new(v.clone(), &[])
            .resource_metadata(&metadata)
            .layer(super::ECHO);
        let mut req = http::Request::builder();
        if let Some(a) = auth {
            req = req.header("Authorization", a);
        }
        let req = req.body(()).unwrap();
        async move { svc.call(req).await.unwrap() }
    };
    let bare = call(None).await;
    assert_eq!(bare.status(), 401);
    assert_eq!(
        bare.headers()["www-authenticate"],
        format!(
            "Bearer resource_metadata=\"{}\", DPoP algs=\"EdDSA Ed25519 ES256\"",
            metadata.url()
        )
        .as_str()
    );
    assert_eq!(
        bare.body(),
        r#"{"error":"TOKEN_INVALID","message":"no Authorization header"}"#
    );
    let bad = call(Some("Bearer nope".into())).await;
    assert_eq!(
        bad.headers()["www-authenticate"],
        format!(
            "Bearer error=\"invalid_token\", resource_metadata=\"{}\"",
            metadata.url()
        )
        .as_str()
    );
    let (id, key) = client(&s, &["tools:call"]);
    let ok = call(Some(format!(
        "Bearer {}",
        access_token(&s, &id, &key, &[API_A], None)
    )))
    .await;
    assert_eq!((ok.status().as_u16(), ok.body().as_str()), (200, id.as_str()));
    let other = call(Some(format!(
        "Bearer {}",
        access_token(&s, &id, &key, &[API_B], None)
    )))
    .await;
    assert_eq!(other.status(), 401);
    assert!(ResourceMetadata::new(&v, "api.example/mcp").is_err());
    assert!(ResourceMetadata::new(&v, "https://api.example/mcp#x").is_err());
}
