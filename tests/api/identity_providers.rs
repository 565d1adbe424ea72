//! The identity providers an organization trusts: added with their keys inline or where they
//! publish them, listed, removed; at most ten, live mode only, public keys only, each
//! organization's its own.

use serde_json::{json, Value};

use crate::helpers::{spawn_app, Resp, TestApp};

const ED: &str = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo";

impl TestApp {
    async fn add_idp(&self, key: &str, body: Value) -> Resp {
        self.post("/v1/identity-providers", Some(key), Some(&body)).await
    }

    /// The identity providers `key`'s organization trusts.
    async fn trusted(&self, key: &str) -> Vec<Value> {
        let res = self.get("/v1/identity-providers", Some(key)).await;
        assert_eq!(res.status, 200, "{}", res.text());
        res.json()["data"].as_array().unwrap().clone()
    }

    async fn delete(&self, path: &str, key: &str) -> Resp {
        let res = self
            .client
            .delete(self.url(path))
            .insert_header(("Authorization", format!("Bearer {key}")))
            .send()
            .await
            .expect("request");
        crate::helpers::read(res).await
    }
}

fn inline(issuer: &str) -> Value {
    json!({"issuer": issuer, "jwks": {"keys": [{"kty": "OKP", "crv": "Ed25519", "x": ED, "kid": "k1"}]}})
}

#[actix_web::test]
async fn an_organization_trusts_identity_providers_it_names() {
    let app = spawn_app().await;
    let sk = app.secret().to_owned();
    let res = app.add_idp(&sk, inline("https://idp.example")).await;
    assert_eq!(res.status, 201, "{}", res.text());
    let first = res.json();
    assert!(first["id"].as_str().unwrap().starts_with("idp_"), "{first}");
    assert_eq!(first["jwks"]["keys"][0]["x"], ED);
    let res = app
        .add_idp(
            &sk,
            json!({"issuer": "https://login.example/tenant/v2.0", "jwks_uri": "https://login.example/keys"}),
        )
        .await;
    assert_eq!(res.status, 201, "{}", res.text());
    assert_eq!(res.json()["jwks_uri"], "https://login.example/keys");

    let listed = app.get("/v1/identity-providers", Some(&sk)).await;
    assert_eq!(listed.status, 200, "{}", listed.text());
    let issuers: Vec<Value> = listed.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["issuer"].clone())
        .collect();
    assert_eq!(
        issuers,
        [
            json!("https://idp.example"),
            json!("https://login.example/tenant/v2.0")
        ]
    );

    // Trusted already.
    app.add_idp(&sk, inline("https://idp.example"))
        .await
        .assert_error(400, "VALIDATION_ERROR");
    // Removed: gone from the list, and a second removal finds nothing.
    let path = format!("/v1/identity-providers/{}", first["id"].as_str().unwrap());
    assert_eq!(app.delete(&path, &sk).await.status, 204);
    app.delete(&path, &sk).await.assert_error(404, "NOT_FOUND");
    app.delete("/v1/identity-providers/nope", &sk)
        .await
        .assert_error(404, "NOT_FOUND");
    assert_eq!(app.trusted(&sk).await.len(), 1);
}

#[actix_web::test]
async fn only_public_keys_https_issuers_ten_providers_and_live_keys() {
    let app = spawn_app().await;
    let sk = app.secret().to_owned();
    for bad in [
        json!({"issuer": "http://idp.example", "jwks": inline("x")["jwks"]}),
        json!({"issuer": "https://idp.example"}),
        json!({"issuer": "https://idp.example", "jwks": inline("x")["jwks"], "jwks_uri": "https://idp.example/k"}),
        json!({"issuer": "https://idp.example", "jwks_uri": "http://idp.example/k"}),
        json!({"issuer": "https://idp.example", "jwks": {"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}}),
        json!({"issuer": "https://idp.example", "jwks": {"keys": [{"kty": "OKP", "crv": "Ed25519", "x": ED, "d": ED}]}}),
        json!({"issuer": "https://idp.example", "jwks": {"keys": []}}),
        json!({"issuer": "https://idp.example", "jwks_uri": "https://idp.example/k", "extra": 1}),
        // Credentials (stored and shown back), a port that is none; a key no token can be
        // checked with (every exchange would then fail as the service's fault).
        json!({"issuer": "https://idp.example", "jwks_uri": "https://u:hunter2@idp.example/k"}),
        json!({"issuer": "https://idp.example", "jwks_uri": "https://idp.example:70000/k"}),
        json!({"issuer": "https://idp.example", "jwks": {"keys": [{"kty": "RSA", "n": "AQAB", "e": "AQAB"}]}}),
    ] {
        app.add_idp(&sk, bad.clone())
            .await
            .assert_error(400, "VALIDATION_ERROR");
    }
    // Test-mode and publishable keys may not.
    for key in [
        app.org.keys.secret_test.clone(),
        app.org.keys.publishable_live.clone(),
    ] {
        app.add_idp(&key, inline("https://idp.example"))
            .await
            .assert_error(403, "FORBIDDEN");
        app.get("/v1/identity-providers", Some(&key))
            .await
            .assert_error(403, "FORBIDDEN");
    }
    // Ten at most.
    for i in 0..10 {
        let res = app.add_idp(&sk, inline(&format!("https://idp{i}.example"))).await;
        assert_eq!(res.status, 201, "{}", res.text());
    }
    let res = app.add_idp(&sk, inline("https://idp10.example")).await;
    let body = res.assert_error(400, "VALIDATION_ERROR");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("at most 10"),
        "{body}"
    );

    // Another organization of the same service sees none of them and cannot remove one.
    let b = crate::delegation::org_b(&app).await;
    let theirs = b.keys.secret_live.clone();
    let mine = app.get("/v1/identity-providers", Some(&sk)).await.json();
    let id = mine["data"][0]["id"].as_str().unwrap().to_owned();
    assert_eq!(
        app.get("/v1/identity-providers", Some(&theirs)).await.json()["data"],
        json!([])
    );
    app.delete(&format!("/v1/identity-providers/{id}"), &theirs)
        .await
        .assert_error(404, "NOT_FOUND");
    assert_eq!(app.trusted(&sk).await.len(), 10);
}
