use crate::helpers::spawn_app;

#[actix_web::test]
async fn revoked_stays_revoked_and_records_survive_a_restart() {
    let app = spawn_app().await;
    let (revoked_id, revoked_token) = app.agent().await;
    let (_, live_token) = app.agent().await;
    app.verify(&live_token).await;
    assert_eq!(app.revoke(&revoked_id, Some("rotated")).await.status, 200);

    let app = app.restart().await;
    assert_eq!(app.verify(&revoked_token).await["error"], "TOKEN_REVOKED");
    assert_eq!(
        app.verify(&live_token).await["valid"],
        true,
        "the registry is rebuilt at start"
    );
    let log = app.log("").await;
    assert_eq!(log["pagination"]["total"], 3);
    app.log_holds().await;
}
