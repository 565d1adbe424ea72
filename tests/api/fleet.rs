//! Several instances on one database: one signing key for the fleet, one first organization.

use agentid::app::StartError;
use agentid::Application;

use crate::helpers::{test_config, TestDb};

/// Builds an instance on `db` with the key file `key` (not started).
async fn build(db: &TestDb, key: &std::path::Path, bootstrap: bool) -> Result<Application, StartError> {
    let mut cfg = test_config(&db.url, key.to_path_buf());
    cfg.bootstrap = bootstrap;
    Application::build(cfg).await
}

/// Runs a built instance to its end: stopped at once.
async fn stop(app: Application) {
    let handle = app.handle();
    let run = actix_web::rt::spawn(app.run_until_stopped());
    handle.stop(true).await;
    run.await.unwrap().unwrap();
}

#[actix_web::test]
async fn an_instance_with_another_or_no_key_file_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let db = TestDb::new(dir.path()).await;
    let fleet_key = dir.path().join("fleet.pem");
    let first = build(&db, &fleet_key, false)
        .await
        .expect("the first start records its key");
    assert!(first.created_signing_key);
    let fleet_kid = first.engine().keys().kid().to_owned();
    let recorded = first.engine().store().signing_keys().await.unwrap();
    assert_eq!(recorded.len(), 1);
    assert_eq!(recorded[0].kid, fleet_kid);

    // Another key file: refused, naming both keys.
    let other_key = dir.path().join("other.pem");
    agentid::token::KeyRing::create(&other_key).unwrap();
    let other_kid = agentid::token::KeyRing::load(&other_key)
        .unwrap()
        .unwrap()
        .kid()
        .to_owned();
    match build(&db, &other_key, false).await {
        Err(e @ StartError::FleetKeyMismatch { .. }) => {
            let said = e.to_string();
            assert!(said.contains(&fleet_kid) && said.contains(&other_kid), "{said}");
        }
        Err(e) => panic!("another error: {e}"),
        Ok(_) => panic!("started with another key"),
    }

    // No key file: refused, and none is made.
    let missing = dir.path().join("missing.pem");
    match build(&db, &missing, false).await {
        Err(e @ StartError::FleetKeyMissing { .. }) => assert!(e.to_string().contains(&fleet_kid), "{e}"),
        Err(e) => panic!("another error: {e}"),
        Ok(_) => panic!("started without the fleet's key"),
    }
    assert!(!missing.exists(), "no key is made while the database records one");

    // A copy of the fleet's key file starts, and its tokens verify on the first instance.
    let copy = dir.path().join("copy.pem");
    std::fs::copy(&fleet_key, &copy).unwrap();
    let second = build(&db, &copy, false).await.expect("the fleet's key starts");
    assert!(!second.created_signing_key);
    assert_eq!(second.engine().keys().kid(), fleet_kid);
    assert_eq!(second.engine().store().signing_keys().await.unwrap(), recorded);
    for app in [first, second] {
        stop(app).await;
    }
}

/// Instances started at once on an empty database (with the fleet's key file) create one
/// `default` organization between them, and only the one that created it has its keys.
/// PostgreSQL only: a fleet shares a PostgreSQL database; SQLite serves one instance.
#[actix_web::test]
async fn instances_started_at_once_create_one_first_organization() {
    if crate::helpers::postgres_admin_url().is_none() {
        eprintln!("skipped: several instances share a PostgreSQL database (AGENTID_TEST_DATABASE_URL)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = TestDb::new(dir.path()).await;
    let key = dir.path().join("fleet.pem");
    agentid::token::KeyRing::create(&key).unwrap();
    let apps = futures_util::future::join_all((0..3).map(|_| build(&db, &key, true))).await;
    let apps: Vec<Application> = apps.into_iter().map(|a| a.expect("starts")).collect();
    let created: Vec<_> = apps.iter().filter_map(|a| a.bootstrapped.as_ref()).collect();
    assert_eq!(
        created.len(),
        1,
        "exactly one instance created the first organization"
    );
    let store = apps[0].engine().store();
    assert_eq!(store.count_orgs().await.unwrap(), 1);
    assert_eq!(
        store.get_org(&created[0].org_id).await.unwrap().unwrap().name,
        "default"
    );
    for app in apps {
        stop(app).await;
    }
}
