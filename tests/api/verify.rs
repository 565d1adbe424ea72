use serde_json::json;

use crate::helpers::spawn_app;

#[actix_web::test]
async fn a_valid_token_answers_with_the_agent_identity() {
    let app = spawn_app().await;
    let a = app
        .register(json!({"name": "Scout", "issuer_domain": "scouts.example", "scopes": ["read:maps"], "description": "finds things"}))
        .await;
    let token = a["token"].as_str().unwrap();
    let res = app.get(&format!("/v1/verify/{token}"), None).await;
    assert_eq!(res.status, 200);
    assert_eq!(res.header("cache-control").as_deref(), Some("no-store"));
    let v = res.json();
    let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "agent_id",
            "description",
            "expires_at",
            "issued_at",
            "issuer",
            "livemode",
            "name",
            "scopes",
            "valid",
            "verified_at"
        ]
    );
    assert_eq!(v["valid"], true);
    assert_eq!(v["agent_id"], a["agent_id"]);
    assert_eq!(v["name"], "Scout");
    assert_eq!(v["issuer"], "scouts.example");
    assert_eq!(v["scopes"], json!(["read:maps"]));
    assert_eq!(v["description"], "finds things");
    assert_eq!(v["expires_at"], a["expires_at"]);
    for f in ["issued_at", "expires_at", "verified_at"] {
        let s = v[f].as_str().unwrap();
        assert!(s.len() == 24 && s.ends_with('Z'), "{f}: {s}");
    }
}

#[actix_web::test]
async fn expired_tokens_answer_token_expired_and_revocation_comes_first() {
    let app = spawn_app().await;
    let body =
        json!({"name": "n", "issuer_domain": "example.com", "scopes": ["read:x"], "expiry_seconds": 1});
    let a = app.register(body.clone()).await;
    let b = app.register(body).await;
    let b_id = b["agent_id"].as_str().unwrap();
    assert_eq!(app.revoke(b_id, Some("gone")).await.status, 200);
    tokio::time::sleep(std::time::Duration::from_millis(2100)).await;
    assert_eq!(
        app.verify(a["token"].as_str().unwrap()).await,
        json!({"valid": false, "error": "TOKEN_EXPIRED"})
    );
    assert_eq!(
        app.verify(b["token"].as_str().unwrap()).await,
        json!({"valid": false, "error": "TOKEN_REVOKED"})
    );
    let log = app.log("?result=expired").await;
    assert_eq!(log["pagination"]["total"], 1);
    assert!(log["data"][0]["failure_reason"]
        .as_str()
        .unwrap()
        .contains("expired"));
}

#[actix_web::test]
async fn each_verification_writes_exactly_one_record_and_counts() {
    let app = spawn_app().await;
    let (id, token) = app.agent().await;
    let (other, other_token) = app.agent().await;
    for _ in 0..5 {
        app.verify(&token).await;
    }
    app.verify(&other_token).await;
    let log = app.log("").await;
    assert_eq!(log["pagination"]["total"], 6);
    assert_eq!(log["data"].as_array().unwrap().len(), 6);
    let rec = &log["data"][1];
    assert_eq!(rec["agent_id"], id.as_str());
    assert_eq!(rec["result"], "valid");
    assert!(
        rec.get("failure_reason").is_none(),
        "absent on valid records: {rec}"
    );
    assert!(rec["latency_ms"].as_f64().unwrap() >= 0.0);
    assert!(rec["id"].as_str().unwrap().starts_with("log_"));
    let got = app
        .get(&format!("/v1/agents/{id}"), Some(app.secret()))
        .await
        .json();
    assert_eq!(got["verification_count"], 5);
    let got = app
        .get(&format!("/v1/agents/{other}"), Some(app.secret()))
        .await
        .json();
    assert_eq!(got["verification_count"], 1);
}

#[actix_web::test]
async fn the_audit_table_refuses_updates_and_deletes_and_chains_hold() {
    let app = spawn_app().await;
    let (_, token) = app.agent().await;
    for _ in 0..3 {
        app.verify(&token).await;
    }
    app.verify("garbage").await;
    for sql in [
        "UPDATE audit_blocks SET results = 1",
        "DELETE FROM audit_blocks",
        "UPDATE audit_blocks SET records = prev_hash WHERE first_seq = 1",
        "UPDATE audit_block_agents SET n_valid = 0",
        "DELETE FROM audit_block_agents",
    ] {
        let err = app.raw_execute(sql).await.expect_err(sql);
        assert!(err.to_string().contains("append-only"), "{sql}: {err}");
    }
    if app.db.is_postgres() {
        for table in ["audit_blocks", "audit_block_agents"] {
            let err = app
                .raw_execute(&format!("TRUNCATE {table}"))
                .await
                .expect_err("truncate");
            assert!(err.to_string().contains("append-only"), "{err}");
        }
    }
    let report = app.log_holds().await;
    assert_eq!(
        report.ledgers.len(),
        2,
        "the org's live ledger and the service ledger: {:?}",
        report.ledgers
    );
    for l in &report.ledgers {
        assert!(l.records >= 1, "{l:?}");
    }
}

#[actix_web::test]
async fn verify_fails_closed_when_the_audit_log_cannot_record() {
    let app = spawn_app().await;
    let (_, token) = app.agent().await;
    app.store.close().await;
    let res = app.get(&format!("/v1/verify/{token}"), None).await;
    res.assert_error(503, "AUDIT_UNAVAILABLE");
    assert!(!res.text().contains("\"valid\""));
}
