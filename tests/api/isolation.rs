//! Organizations never see each other's agents; test and live data never meet.

use agentid::domain::{OrgLimits, Plan};
use agentid::engine::admin;

use crate::helpers::spawn_app;

#[actix_web::test]
async fn another_organization_cannot_see_revoke_or_read_the_log_of_an_agent() {
    let app = spawn_app().await;
    let (id, token) = app.agent().await;
    app.verify(&token).await;
    let limits = OrgLimits::resolve(Plan::Developer, None, None, None).unwrap();
    let other = admin::create_org(&app.store, "other", Plan::Developer, limits)
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
