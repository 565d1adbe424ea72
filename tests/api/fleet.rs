//! Several instances on one database: one signing key for the fleet, one first organization.

use agentid::app::StartError;
use agentid::engine::admin::AdminError;
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
    agentid::keys::KeyRing::create(&other_key).unwrap();
    let other_kid = agentid::keys::KeyRing::load(&other_key)
        .unwrap()
        .unwrap()
        .kid()
        .to_owned();
    match build(&db, &other_key, false).await {
        Err(e @ StartError::Admin(AdminError::FleetKeyMismatch { .. })) => {
            let said = e.to_string();
            assert!(said.contains(&fleet_kid) && said.contains(&other_kid), "{said}");
        }
        Err(e) => panic!("another error: {e}"),
        Ok(_) => panic!("started with another key"),
    }

    // No key file: refused, and none is made.
    let missing = dir.path().join("missing.pem");
    match build(&db, &missing, false).await {
        Err(e @ StartError::Admin(AdminError::FleetKeyMissing { .. })) => {
            assert!(e.to_string().contains(&fleet_kid), "{e}")
        }
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
    agentid::keys::KeyRing::create(&key).unwrap();
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
        store
            .get_org(&crate::helpers::org_id(&created[0].org_id))
            .await
            .unwrap()
            .unwrap()
            .name,
        "default"
    );
    for app in apps {
        stop(app).await;
    }
}

/// Three instances on one PostgreSQL database; `None` (with a note) on SQLite.
async fn fleet(opts: crate::helpers::Options) -> Option<Vec<crate::helpers::TestApp>> {
    if crate::helpers::postgres_admin_url().is_none() {
        eprintln!("skipped: a fleet shares a PostgreSQL database (AGENTID_TEST_DATABASE_URL)");
        return None;
    }
    Some(crate::helpers::spawn_fleet(3, opts).await)
}

/// A revoke answered by one instance: no instance answers `valid:true` for the agent after.
#[actix_web::test]
async fn a_revoke_on_one_instance_holds_on_every_instance() {
    let Some(apps) = fleet(crate::helpers::Options::unlimited()).await else {
        return;
    };
    let (id, token) = apps[0].agent().await;
    for app in &apps {
        assert_eq!(app.verify_as_receiver(&token).await.json()["valid"], true);
    }
    assert_eq!(apps[1].revoke(&id, Some("fleet")).await.status, 200);
    for app in &apps {
        let answer = app.verify_as_receiver(&token).await.json();
        assert_eq!(
            answer,
            serde_json::json!({"valid": false, "error": "TOKEN_REVOKED"})
        );
    }
}

/// Audit batches that found their ledger's chain moved by another instance, so far in this
/// process (whose instances are all fleets' tests).
fn conflicts() -> u64 {
    agentid::telemetry::metrics_handle()
        .render()
        .lines()
        .find_map(|l| l.strip_prefix("agentid_audit_chain_conflicts_total "))
        .map_or(0, |v| v.parse().unwrap())
}

/// One organization's verifications spread over three instances at once: every one is
/// answered (no 503 from instances contending for the ledger's chain), every answer has its
/// record, the chain verifies, and a log cursor made by one instance pages on another.
#[actix_web::test]
async fn one_ledger_written_by_three_instances_at_once_answers_and_records_everything() {
    let Some(apps) = fleet(crate::helpers::Options::unlimited()).await else {
        return;
    };
    let apps: Vec<std::rc::Rc<crate::helpers::TestApp>> = apps.into_iter().map(std::rc::Rc::new).collect();
    let (id, token) = apps[0].agent().await;
    let conflicts_before = conflicts();
    let rounds = 20;
    let per_round = 48;
    for _ in 0..rounds {
        let calls = (0..per_round).map(|i| {
            let app = apps[i % apps.len()].clone();
            let token = token.clone();
            async move { app.verify_as_receiver(&token).await }
        });
        for res in futures_util::future::join_all(calls).await {
            assert_eq!(res.status, 200, "{}", res.text());
            assert_eq!(res.json()["valid"], true);
        }
    }
    let answered = rounds * per_round;
    let conflicts = conflicts() - conflicts_before;
    assert!(conflicts > 0, "the instances did contend for the chain");
    let log = apps[2].log(&format!("?agent_id={id}&limit=200")).await;
    assert_eq!(
        log["pagination"]["total"], answered,
        "every answer has its record"
    );
    apps[0].log_holds().await;
    // The cursor of one instance's page is good on another.
    let cursor = log["pagination"]["cursor"].as_str().unwrap();
    let next = apps[1]
        .log(&format!("?agent_id={id}&limit=200&cursor={cursor}"))
        .await;
    assert_eq!(next["data"].as_array().unwrap().len(), 200);
}

/// Instances taking turns on one ledger, in runs of one to three calls: a batch meets the
/// ledger either as its instance left it (cached head and agent totals used as they are) or
/// moved by another (a conflict, then the locked path). In every case the running totals
/// stay exact: each agent's and each result's total is what was answered, and the chain
/// verifies.
#[actix_web::test]
async fn instances_taking_turns_on_one_ledger_keep_its_totals_exact() {
    let Some(apps) = fleet(crate::helpers::Options::unlimited()).await else {
        return;
    };
    let (first, first_token) = apps[0].agent().await;
    let (second, second_token) = apps[0].agent().await;
    let conflicts_before = conflicts();
    // Which instance answers next, and how many calls in a row.
    let instance = [0, 1, 0, 2, 2, 0, 1, 1, 0, 2, 1, 0];
    let run_of = [3, 1, 2, 3, 1, 1, 3, 2, 3, 2, 1, 2];
    let mut answered = [0u64; 2];
    for i in 0..36 {
        let (app, run) = (instance[i % 12], run_of[i % 12]);
        for call in 0..run {
            let which = (i + call) % 2;
            let token = [&first_token, &second_token][which];
            let res = apps[app].verify_as_receiver(token).await;
            assert_eq!(res.status, 200, "{}", res.text());
            assert_eq!(res.json()["valid"], true);
            answered[which] += 1;
        }
    }
    assert!(
        conflicts() > conflicts_before,
        "some batches found the chain moved"
    );
    for (app, (id, n)) in apps
        .iter()
        .cycle()
        .zip([(&first, answered[0]), (&second, answered[1])])
    {
        let page = app.log(&format!("?agent_id={id}&limit=1")).await;
        assert_eq!(page["pagination"]["total"], n, "{id}");
        let valid = app.log(&format!("?agent_id={id}&result=valid&limit=1")).await;
        assert_eq!(valid["pagination"]["total"], n, "{id}");
    }
    let all = apps[1].log("?limit=1").await;
    assert_eq!(all["pagination"]["total"], answered[0] + answered[1]);
    apps[0].log_holds().await;
}

/// A plan's limit holds for the fleet: a free organization's 60 other calls a minute are 60
/// however the calls are spread over three instances, and the headers count the fleet's
/// bucket down.
#[actix_web::test]
async fn a_plans_limit_holds_across_the_fleet() {
    let Some(apps) = fleet(crate::helpers::Options {
        plan: agentid::domain::Plan::Free,
        ..Default::default()
    })
    .await
    else {
        return;
    };
    let sk = apps[0].secret().to_owned();
    let mut passed = 0;
    let mut last_remaining = u64::MAX;
    for i in 0..75 {
        let res = apps[i % 3].get("/v1/agents", Some(&sk)).await;
        let remaining: u64 = res.header("x-ratelimit-remaining").unwrap().parse().unwrap();
        assert_eq!(res.header("x-ratelimit-limit").as_deref(), Some("60"));
        match res.status {
            200 => {
                passed += 1;
                assert!(
                    remaining < last_remaining,
                    "call {i}: {remaining} after {last_remaining}"
                );
                last_remaining = remaining;
            }
            429 => {
                res.assert_error(429, "RATE_LIMITED");
                assert!(res.header("retry-after").is_some());
            }
            s => panic!("call {i}: {s} {}", res.text()),
        }
    }
    assert!(
        (60..=63).contains(&passed),
        "{passed} calls passed a fleet limit of 60"
    );
}
