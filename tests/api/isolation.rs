//! Organizations never see each other's agents; test and live data never meet.

use agentid::domain::{OrgLimits, Plan};
use agentid::engine::admin;

use serde_json::json;

use crate::helpers::spawn_app;

#[actix_web::test]
async fn another_organization_cannot_see_revoke_or_read_the_log_of_an_agent() {
    let app = spawn_app().await;
    let (id, token) = app.agent().await;
    app.verify(&token).await;
    let limits = OrgLimits::resolve(Plan::Developer, None, None, None).unwrap();
    let other = admin::create_org(&app.store, app.engine.keys(), "other", Plan::Developer, limits)
        .await
        .unwrap();
    let key = Some(other.keys.secret_live.as_str());

    app.get(&format!("/v1/agents/{id}"), key)
        .await
        .assert_error(404, "AGENT_NOT_FOUND");
    app.post(&format!("/v1/agents/{id}/revoke"), key, None)
        .await
        .assert_error(404, "AGENT_NOT_FOUND");
    app.post(&format!("/v1/agents/{id}/issue-token"), key, None)
        .await
        .assert_error(404, "AGENT_NOT_FOUND");
    app.get(&format!("/v1/log?agent_id={id}"), key)
        .await
        .assert_error(404, "AGENT_NOT_FOUND");
    let list = app.get("/v1/agents", key).await.json();
    assert_eq!(list.as_array().unwrap().len(), 0);
    let log = app.get("/v1/log", key).await.json();
    assert_eq!(log["pagination"]["total"], 0);

    // The agent is untouched.
    assert_eq!(app.verify(&token).await["valid"], true);
}

#[actix_web::test]
async fn test_and_live_data_are_separate() {
    let app = spawn_app().await;
    let test_key = app.org.keys.secret_test.clone();
    let t = app
        .register_with(
            &test_key,
            serde_json::json!({"name": "t", "issuer_domain": "example.com", "scopes": ["read:x"]}),
        )
        .await;
    let test_id = t["agent_id"].as_str().unwrap();
    let (live_id, live_token) = app.agent().await;
    assert_eq!(app.verify(t["token"].as_str().unwrap()).await["valid"], true);
    app.verify(&live_token).await;

    let live = Some(app.secret());
    let test = Some(test_key.as_str());
    app.get(&format!("/v1/agents/{test_id}"), live)
        .await
        .assert_error(404, "AGENT_NOT_FOUND");
    app.get(&format!("/v1/agents/{live_id}"), test)
        .await
        .assert_error(404, "AGENT_NOT_FOUND");
    app.post(&format!("/v1/agents/{test_id}/revoke"), live, None)
        .await
        .assert_error(404, "AGENT_NOT_FOUND");
    let live_list = app.get("/v1/agents", live).await.json();
    let test_list = app.get("/v1/agents", test).await.json();
    assert_eq!(live_list.as_array().unwrap().len(), 1);
    assert_eq!(test_list.as_array().unwrap().len(), 1);
    assert_eq!(test_list[0]["id"], test_id);

    let live_log = app.get("/v1/log", live).await.json();
    let test_log = app.get("/v1/log", test).await.json();
    assert_eq!(live_log["pagination"]["total"], 1);
    assert_eq!(test_log["pagination"]["total"], 1);
    assert_eq!(test_log["data"][0]["agent_id"], test_id);
}

/// A test-mode token says so (`livemode: false`, which live tokens never carry), online
/// verification says which it is, and test agents' places are in lists of their own: a test
/// revocation changes no list that live tokens point at.
#[actix_web::test]
async fn test_mode_tokens_say_so_and_keep_to_lists_of_their_own() {
    use crate::status::{checked_list, part, place, status_at, until_revoked};
    let app = spawn_app().await;
    let test_key = app.org.keys.secret_test.clone();
    let t = app
        .register_with(
            &test_key,
            serde_json::json!({"name": "t", "issuer_domain": "example.com", "scopes": ["read:x"]}),
        )
        .await;
    let (test_id, test_token) = (t["agent_id"].as_str().unwrap(), t["token"].as_str().unwrap());
    let (_, live_token) = app.agent().await;
    assert_eq!(part(test_token, 1)["livemode"], false);
    assert!(
        part(&live_token, 1).get("livemode").is_none(),
        "{}",
        part(&live_token, 1)
    );
    let test_answer = app.verify(test_token).await;
    assert_eq!(
        (&test_answer["valid"], &test_answer["livemode"]),
        (&json!(true), &json!(false))
    );
    assert_eq!(app.verify(&live_token).await["livemode"], true);
    // A token that claims `livemode: true` is not one the service wrote.
    let mut forged = part(&live_token, 1);
    forged["livemode"] = json!(true);
    let signed = app.engine.keys().sign(&serde_json::from_value(json!({
        "iss": forged["iss"], "sub": forged["sub"], "jti": "j", "iat": forged["iat"], "exp": forged["exp"],
        "scopes": forged["scopes"]
    })).unwrap());
    assert_eq!(
        app.verify(&signed).await["valid"],
        true,
        "the same claims without it pass"
    );
    let (h, _, sig) = {
        let mut parts = signed.split('.');
        (
            parts.next().unwrap().to_owned(),
            parts.next(),
            parts.next().unwrap().to_owned(),
        )
    };
    use base64::Engine as _;
    let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(forged.to_string());
    assert_eq!(
        app.verify(&format!("{h}.{payload}.{sig}")).await["error"],
        "TOKEN_INVALID"
    );

    let (test_idx, test_uri) = place(test_token);
    let (live_idx, live_uri) = place(&live_token);
    assert_ne!(test_uri, live_uri, "test and live agents share a list");
    let live_before = checked_list(&app, &live_uri).await;
    app.post(&format!("/v1/agents/{test_id}/revoke"), Some(&test_key), None)
        .await;
    until_revoked(&app, &test_uri, test_idx).await;
    let live_after = checked_list(&app, &live_uri).await;
    assert_eq!(live_after["status_list"], live_before["status_list"]);
    assert_eq!(status_at(&live_after, live_idx), 0);
}
