use std::collections::HashSet;

use serde_json::Value;

use crate::helpers::spawn_app;

fn ids(page: &Value) -> Vec<String> {
    page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_owned())
        .collect()
}

#[actix_web::test]
async fn pages_run_newest_first_and_stay_stable_while_records_arrive() {
    let app = spawn_app().await;
    let (_, token) = app.agent().await;
    for _ in 0..7 {
        app.verify(&token).await;
    }
    let first = app.log("?limit=3").await;
    assert_eq!(first["pagination"]["total"], 7);
    assert_eq!(first["pagination"]["hasMore"], true);
    let times: Vec<&str> = first["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["requested_at"].as_str().unwrap())
        .collect();
    assert!(times.windows(2).all(|w| w[0] >= w[1]), "newest first: {times:?}");

    // New records arrive between pages: they must not shift or repeat the older ones.
    for _ in 0..4 {
        app.verify(&token).await;
    }
    let mut seen: Vec<String> = ids(&first);
    let mut cursor = first["pagination"]["cursor"].as_str().unwrap().to_owned();
    loop {
        let page = app.log(&format!("?limit=3&cursor={cursor}")).await;
        assert_eq!(
            page["pagination"]["total"], 11,
            "total counts the new records too"
        );
        seen.extend(ids(&page));
        if page["pagination"]["hasMore"] == false {
            assert_eq!(page["pagination"]["cursor"], Value::Null);
            break;
        }
        cursor = page["pagination"]["cursor"].as_str().unwrap().to_owned();
    }
    assert_eq!(
        seen.len(),
        7,
        "exactly the records older than the first page: {seen:?}"
    );
    assert_eq!(seen.iter().collect::<HashSet<_>>().len(), 7);
    let newest = app.log("?limit=200").await;
    assert_eq!(
        ids(&newest)[4..],
        seen[..],
        "the older 7 follow the 4 new ones in order"
    );
}

#[actix_web::test]
async fn filters_have_exact_totals() {
    let app = spawn_app().await;
    let (a, ta) = app.agent().await;
    let (b, tb) = app.agent().await;
    for _ in 0..3 {
        app.verify(&ta).await;
    }
    app.verify(&tb).await;
    // A different, canonical signature character well inside the signature: a bad signature.
    let at = ta.len() - 10;
    let twin = if &ta[at..at + 1] == "A" { "B" } else { "A" };
    let forged = format!("{}{twin}{}", &ta[..at], &ta[at + 1..]);
    app.verify(&forged).await;
    app.revoke(&b, Some("done")).await;
    app.verify(&tb).await;
    app.verify(&tb).await;

    let total = |q: String| {
        let app = &app;
        async move { app.log(&q).await["pagination"]["total"].as_i64().unwrap() }
    };
    assert_eq!(total(String::new()).await, 7);
    assert_eq!(total(format!("?agent_id={a}")).await, 4);
    assert_eq!(total(format!("?agent_id={b}")).await, 3);
    assert_eq!(total("?result=valid".into()).await, 4);
    assert_eq!(total("?result=invalid".into()).await, 1);
    assert_eq!(total("?result=revoked".into()).await, 2);
    assert_eq!(total("?result=expired".into()).await, 0);
    assert_eq!(total(format!("?agent_id={a}&result=valid")).await, 3);
    assert_eq!(total(format!("?agent_id={b}&result=revoked")).await, 2);

    let page = app.log(&format!("?agent_id={b}&result=revoked&limit=1")).await;
    assert_eq!(page["data"].as_array().unwrap().len(), 1);
    assert_eq!(page["data"][0]["failure_reason"], "agent revoked: done");
    let next = page["pagination"]["cursor"].as_str().unwrap();
    let page2 = app
        .log(&format!("?agent_id={b}&result=revoked&limit=1&cursor={next}"))
        .await;
    assert_eq!(page2["data"][0]["result"], "revoked");
    assert_eq!(page2["pagination"]["hasMore"], false);
    let invalid = app.log("?result=invalid").await;
    assert!(invalid["data"][0]["failure_reason"]
        .as_str()
        .unwrap()
        .contains("signature"));
}

#[actix_web::test]
async fn bad_parameters_and_foreign_cursors_are_refused() {
    let app = spawn_app().await;
    let (_, token) = app.agent().await;
    for _ in 0..3 {
        app.verify(&token).await;
    }
    for q in [
        "?limit=0",
        "?limit=201",
        "?limit=abc",
        "?limit=-1",
        "?limit=1.5",
        "?result=bogus",
        "?result=VALID",
        "?agent_id=bob",
    ] {
        app.get(&format!("/v1/log{q}"), Some(app.secret()))
            .await
            .assert_error(400, "VALIDATION_ERROR");
    }
    // A parameter given twice is named (the message said only that the request could not
    // be processed).
    for path in ["/v1/log?limit=1&limit=2", "/v1/agents?cursor=a&cursor=b"] {
        let err = app
            .get(path, Some(app.secret()))
            .await
            .assert_error(400, "VALIDATION_ERROR");
        let message = err["error"]["message"].as_str().unwrap();
        assert!(message.contains("duplicate field"), "{path}: {message}");
    }
    assert_eq!(app.log("?limit=200").await["data"].as_array().unwrap().len(), 3);
    assert_eq!(app.log("?limit=1").await["data"].as_array().unwrap().len(), 1);

    let page = app.log("?limit=1").await;
    let cursor = page["pagination"]["cursor"].as_str().unwrap();
    for bad in [
        "garbage",
        "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        &format!("{cursor}A"),
        &cursor[1..],
    ] {
        app.get(&format!("/v1/log?cursor={bad}"), Some(app.secret()))
            .await
            .assert_error(400, "INVALID_CURSOR");
    }
    // A cursor is only good for the query that issued it.
    app.get(
        &format!("/v1/log?cursor={cursor}&result=valid"),
        Some(app.secret()),
    )
    .await
    .assert_error(400, "INVALID_CURSOR");
    app.get(
        &format!("/v1/log?cursor={cursor}"),
        Some(&app.org.keys.secret_test),
    )
    .await
    .assert_error(400, "INVALID_CURSOR");
    assert_eq!(
        app.log(&format!("?limit=1&cursor={cursor}")).await["data"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

/// Without `limit`, a page holds the spec's default of 50 records.
#[actix_web::test]
async fn a_page_holds_fifty_records_by_default() {
    let app = spawn_app().await;
    let (_, token) = app.agent().await;
    for _ in 0..53 {
        app.verify(&token).await;
    }
    let first = app.log("").await;
    assert_eq!(first["data"].as_array().unwrap().len(), 50);
    assert_eq!(first["pagination"]["total"], 53);
    assert_eq!(first["pagination"]["hasMore"], true);
    let cursor = first["pagination"]["cursor"].as_str().unwrap();
    let rest = app.log(&format!("?cursor={cursor}")).await;
    assert_eq!(rest["data"].as_array().unwrap().len(), 3);
    assert_eq!(rest["pagination"]["hasMore"], false);
}
