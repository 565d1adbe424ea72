//! The database fails over under the service: writes wait out a short outage, and an audit
//! batch whose commit outcome is unknown is found out: answered as written only when it was,
//! never written twice. PostgreSQL only (SQLite runs in the process: there is no connection
//! to lose, and the fault hook says so).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::helpers::{spawn_app_with, Options, TestApp};
use agentid::store::WriteFault;

/// The agent's records: `n`, each once, in a chain that verifies.
async fn recorded_once(app: &TestApp, agent_id: &str, n: usize) {
    let log = app.log(&format!("?agent_id={agent_id}")).await;
    assert_eq!(log["pagination"]["total"], n, "{log}");
    let ids: HashSet<_> = log["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), n);
    app.log_holds().await;
}

async fn valid(app: &TestApp, token: &str) {
    let res = app.verify_as_receiver(token).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["valid"], true);
}

/// Three verifications, the second's batch met by `fault`: each answered valid, each
/// recorded once.
async fn three_verifications_across(fault: WriteFault) {
    let app = spawn_app_with(Options::unlimited()).await;
    let (id, token) = app.agent().await;
    valid(&app, &token).await;
    if !app.store.inject_write_fault(fault) {
        return;
    }
    valid(&app, &token).await;
    valid(&app, &token).await;
    recorded_once(&app, &id, 3).await;
}

/// The batch commits and its connection breaks before the answer: the writer looks its
/// blocks up, finds them, and answers the verification as written, once.
#[actix_web::test]
async fn a_commit_of_unknown_outcome_is_found_out_and_answered_as_written() {
    three_verifications_across(WriteFault::LostAck).await;
}

/// The connection breaks before the batch reaches the server: the writer finds nothing at
/// its keys and writes it there again, once.
#[actix_web::test]
async fn a_batch_lost_on_its_way_is_written_again_once() {
    three_verifications_across(WriteFault::LostWrite).await;
}

/// With no outage wait the writer has no time to find out: the request is answered 503,
/// never as written, and the batch is not written again (here it had committed: the log
/// holds it once, and the chain goes on after it).
#[actix_web::test]
async fn an_outcome_not_found_out_in_time_fails_and_is_written_once() {
    let app = spawn_app_with(Options {
        tweak: Box::new(|c| c.store.outage_wait = Duration::ZERO),
        ..Options::unlimited()
    })
    .await;
    let (id, token) = app.agent().await;
    valid(&app, &token).await;
    if !app.store.inject_write_fault(WriteFault::LostAck) {
        return;
    }
    app.verify_as_receiver(&token)
        .await
        .assert_error(503, "AUDIT_UNAVAILABLE");
    valid(&app, &token).await;
    valid(&app, &token).await;
    recorded_once(&app, &id, 4).await;
}

/// A batch that committed without its answer is checkpointed all the same, with no record
/// after it to bring its ledger back to the checkpointer: else the records it holds stay
/// outside every checkpoint until the next verification.
#[actix_web::test]
async fn a_batch_of_unknown_outcome_is_checkpointed() {
    let app = spawn_app_with(Options {
        tweak: Box::new(|c| c.store.outage_wait = Duration::ZERO),
        ..Options::unlimited()
    })
    .await;
    let (_, token) = app.agent().await;
    valid(&app, &token).await;
    if !app.db.is_postgres() {
        return;
    }
    checkpointed(&app, "1").await;
    assert!(app.store.inject_write_fault(WriteFault::LostAck));
    app.verify_as_receiver(&token)
        .await
        .assert_error(503, "AUDIT_UNAVAILABLE");
    checkpointed(&app, "2").await;
}

/// Waits for the caller's ledger to be checkpointed at `size` records (checkpoints come
/// every 200 ms here: 40 intervals).
async fn checkpointed(app: &TestApp, size: &str) {
    let deadline = Instant::now() + Duration::from_secs(8);
    loop {
        let note = app.get("/v1/log/checkpoint", Some(app.secret())).await.text();
        if note.lines().nth(1) == Some(size) {
            return;
        }
        assert!(Instant::now() < deadline, "the ledger stayed at {note}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// While no database takes connections (a failover's gap), a registration, a revocation and
/// a verification wait for it, and are answered as if nothing had happened once it is back.
#[actix_web::test]
async fn writes_wait_out_a_short_outage() {
    let Some((proxy, app)) = crate::proxy::app_behind_proxy_with(|c| {
        c.store.outage_wait = Duration::from_secs(8);
    })
    .await
    else {
        return;
    };
    let (id, token) = app.agent().await;
    let (other, other_token) = app.agent().await;
    valid(&app, &token).await;
    proxy.cut();
    let body = serde_json::json!({"name": "n", "issuer_domain": "example.com", "scopes": ["read:x"]});
    let (registered, verified, revoked, ()) = tokio::join!(
        app.post("/v1/agents/register", Some(app.secret()), Some(&body)),
        app.verify_as_receiver(&token),
        app.revoke(&other, None),
        async {
            actix_web::rt::time::sleep(Duration::from_millis(700)).await;
            proxy.restore();
        }
    );
    assert_eq!(registered.status, 201, "{}", registered.text());
    assert_eq!(verified.status, 200, "{}", verified.text());
    assert_eq!(verified.json()["valid"], true);
    assert_eq!(revoked.status, 200, "{}", revoked.text());
    assert_eq!(
        app.verify_as_receiver(&other_token).await.json()["error"],
        "TOKEN_REVOKED"
    );
    recorded_once(&app, &id, 2).await;
}

/// The wait is bounded, per outage rather than per call: a registration (two calls that
/// wait) is answered 503 after about the wait, and once the outage is older than the wait,
/// a verification is answered 503 at once.
#[actix_web::test]
async fn an_outage_longer_than_the_wait_is_answered_503() {
    let wait = Duration::from_secs(2);
    let Some((proxy, app)) = crate::proxy::app_behind_proxy_with(move |c| c.store.outage_wait = wait).await
    else {
        return;
    };
    let (_, token) = app.agent().await;
    proxy.cut();
    let started = Instant::now();
    let body = serde_json::json!({"name": "n", "issuer_domain": "example.com", "scopes": ["read:x"]});
    app.post("/v1/agents/register", Some(app.secret()), Some(&body))
        .await
        .assert_error(503, "SERVICE_UNAVAILABLE");
    let registered = started.elapsed();
    app.verify_as_receiver(&token)
        .await
        .assert_error(503, "AUDIT_UNAVAILABLE");
    let verified = started.elapsed() - registered;
    proxy.restore();
    assert!(
        registered >= wait / 2,
        "{registered:?}: the registration did not wait"
    );
    // A wait per call would add up: 2 s for each of the registration's two calls, 2 s more
    // for the verification's batch.
    assert!(
        registered < wait + wait / 2 && verified < wait / 2,
        "registration {registered:?}, verification {verified:?}"
    );
}

/// Sends `request` while its transaction's INSERT into `table` waits behind a lock, and ends
/// that session meanwhile (as a node shutting down ends it): the transaction wrote nothing,
/// and runs again. The request's answer.
async fn cut_before_commit(
    app: &TestApp,
    table: &str,
    request: impl std::future::Future<Output = crate::helpers::Resp>,
) -> crate::helpers::Resp {
    use sqlx::{Connection as _, Executor as _};
    let mut holder = sqlx::PgConnection::connect(&app.db.url).await.unwrap();
    let mut killer = sqlx::PgConnection::connect(&app.db.url).await.unwrap();
    holder
        .execute(format!("BEGIN; LOCK TABLE {table} IN EXCLUSIVE MODE").as_str())
        .await
        .unwrap();
    let cut = async {
        loop {
            let ended: Vec<(bool,)> = sqlx::query_as(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE datname = current_database() AND wait_event_type = 'Lock' \
                 AND query LIKE 'INSERT INTO ' || $1 || '%'",
            )
            .bind(table)
            .fetch_all(&mut killer)
            .await
            .unwrap();
            if !ended.is_empty() {
                break;
            }
            actix_web::rt::time::sleep(Duration::from_millis(20)).await;
        }
        holder.execute("ROLLBACK").await.unwrap();
    };
    tokio::join!(request, cut).0
}

/// A registration and a Shared Signals stream whose transactions are cut before their COMMIT
/// are answered 201, and stored once.
#[actix_web::test]
async fn a_transaction_cut_before_its_commit_runs_again() {
    let app = spawn_app_with(Options::unlimited()).await;
    if !app.db.is_postgres() {
        return;
    }
    let body = serde_json::json!({"name": "cut", "issuer_domain": "example.com", "scopes": ["read:x"]});
    let register = app.post("/v1/agents/register", Some(app.secret()), Some(&body));
    let res = cut_before_commit(&app, "agents", register).await;
    assert_eq!(res.status, 201, "{}", res.text());
    let id = res.json()["agent_id"].as_str().unwrap().to_owned();
    let got = app.get(&format!("/v1/agents/{id}"), Some(app.secret())).await;
    assert_eq!(got.status, 200, "{}", got.text());
    let stream = serde_json::json!({"delivery": {"method": "urn:ietf:rfc:8936"}});
    let create = app.post("/ssf/streams", Some(app.secret()), Some(&stream));
    let res = cut_before_commit(&app, "ssf_streams", create).await;
    assert_eq!(res.status, 201, "{}", res.text());
    let listed = app.get("/ssf/streams", Some(app.secret())).await.json();
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
}

/// The batch's keys are taken by another instance's block (this writer's cached head was
/// stale, and its write was lost on the way): the look-up finds a block that is not the
/// batch's, so the batch never commits, and its record goes after the new head, once.
#[actix_web::test]
async fn a_lost_batch_whose_keys_another_instance_took_is_appended_anew() {
    let fleet = crate::helpers::spawn_fleet(2, Options::unlimited()).await;
    let (id, token) = fleet[0].agent().await;
    valid(&fleet[0], &token).await;
    // The other instance extends the ledger: the first one's cached head is now stale.
    valid(&fleet[1], &token).await;
    if !fleet[0].store.inject_write_fault(WriteFault::LostWrite) {
        return;
    }
    valid(&fleet[0], &token).await;
    recorded_once(&fleet[0], &id, 3).await;
}

/// A registration whose COMMIT went through but whose answer was lost is found out by the
/// agent's id: answered 201 with the place it was given, stored once, its token valid.
#[actix_web::test]
async fn a_registration_of_unknown_outcome_is_found_out() {
    let app = spawn_app_with(Options::unlimited()).await;
    assert!(app.store.inject_write_fault(WriteFault::LostCommitAck));
    let (id, token) = app.agent().await;
    valid(&app, &token).await;
    let agents = app.get("/v1/agents", Some(app.secret())).await.json();
    let ids: Vec<&str> = agents
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [id.as_str()]);
}

/// A revocation whose COMMIT went through but whose answer was lost runs again: answered
/// 200, the agent revoked, its Shared Signals event queued once.
#[actix_web::test]
async fn a_revocation_of_unknown_outcome_runs_again_once() {
    let app = spawn_app_with(Options::unlimited()).await;
    let stream = serde_json::json!({
        "delivery": {"method": "urn:ietf:rfc:8936"},
        "events_requested": ["https://schemas.openid.net/secevent/caep/event-type/session-revoked"],
    });
    let created = app.post("/ssf/streams", Some(app.secret()), Some(&stream)).await;
    assert_eq!(created.status, 201, "{}", created.text());
    let created = created.json();
    let (id, token) = app.agent().await;
    assert!(app.store.inject_write_fault(WriteFault::LostCommitAck));
    let res = app.revoke(&id, None).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(
        app.verify_as_receiver(&token).await.json()["error"],
        "TOKEN_REVOKED"
    );
    let poll = app
        .post(
            &format!("/ssf/poll/{}", created["stream_id"].as_str().unwrap()),
            created["poll_token"].as_str(),
            Some(&serde_json::json!({"returnImmediately": true})),
        )
        .await
        .json();
    assert_eq!(poll["sets"].as_object().map(|s| s.len()), Some(1), "{poll}");
}

/// Attack: a database too busy (or down) to lease rate-limit cells let every call of an
/// organization through, a second at a time, while verify itself (which needs no connection
/// of the API's pool) went on working: a flood that filled the pool switched the limit off.
/// The instance now holds the organization to its limit alone until the store leases again.
#[actix_web::test]
async fn an_organization_stays_limited_while_the_database_cannot_lease() {
    let Some((proxy, app)) = crate::proxy::app_behind_proxy_with(|c| {
        c.engine.writer.flush_timeout = Duration::from_secs(1);
    })
    .await
    else {
        return;
    };
    let limits =
        agentid::domain::OrgLimits::resolve(agentid::domain::Plan::Enterprise, Some(5), Some(1000), None)
            .unwrap();
    let org = agentid::engine::admin::create_org(
        &app.store,
        app.engine.keys(),
        "small",
        agentid::domain::Plan::Enterprise,
        limits,
    )
    .await
    .unwrap();
    let key = org.keys.secret_live.clone();
    let (_, token) = app.agent().await;
    let path = format!("/v1/verify/{token}");
    assert_eq!(app.get(&path, Some(&key)).await.json()["valid"], true);
    proxy.stall();
    let calls = (0..12).map(|_| app.get(&path, Some(&key)));
    let answered = tokio::time::timeout(Duration::from_secs(20), futures_util::future::join_all(calls))
        .await
        .expect("every call is answered");
    let limited = answered.iter().filter(|r| r.status == 429).count();
    assert!(
        limited >= 6,
        "{limited} of 12 calls were held to a limit of 5 a minute"
    );
    proxy.restore();
}

/// Calls of an organization whose leased rate-limit cells ran out, while the database has
/// stopped answering: one asks the store for more and gets no connection, and it and the
/// calls of the next second go to the instance's own bucket without asking (to be answered
/// for the outage by their own work). Each used to ask in turn, one pool timeout after
/// another: the twelfth waited twelve.
#[actix_web::test]
async fn a_database_that_stops_answering_holds_no_call_at_the_rate_limit() {
    let Some((proxy, app)) = crate::proxy::app_behind_proxy_with(|c| {
        c.engine.writer.flush_timeout = Duration::from_secs(1);
    })
    .await
    else {
        return;
    };
    let limits = agentid::domain::OrgLimits::resolve(agentid::domain::Plan::Free, None, None, None).unwrap();
    let org = agentid::engine::admin::create_org(
        &app.store,
        app.engine.keys(),
        "free",
        agentid::domain::Plan::Free,
        limits,
    )
    .await
    .unwrap();
    let key = org.keys.secret_live.clone();
    let (_, token) = app.agent().await;
    let path = format!("/v1/verify/{token}");
    // Free: 500 verifications a minute, leased 5 cells at a time. Use up a lease.
    for _ in 0..5 {
        assert_eq!(app.get(&path, Some(&key)).await.json()["valid"], true);
    }
    proxy.stall();
    let started = Instant::now();
    let calls = (0..12).map(|_| app.get(&path, Some(&key)));
    let answered = tokio::time::timeout(Duration::from_secs(20), futures_util::future::join_all(calls))
        .await
        .expect("every call is answered");
    let took = started.elapsed();
    for res in &answered {
        res.assert_error(503, "AUDIT_UNAVAILABLE");
    }
    // One pool timeout (1 s here) for the lease, one flush timeout for the record: not twelve.
    assert!(took < Duration::from_secs(8), "{took:?}");
    proxy.restore();
}

/// A lock held elsewhere on PostgreSQL (a migration, a `LOCK TABLE`, a session stuck in its
/// transaction) holds a statement no longer than the statement timeout: the request is
/// answered 503, not never, and its connection serves again once the lock is gone. A
/// verification waits no more than its record's write (fail closed), and is answered too.
#[actix_web::test]
async fn a_statement_held_up_by_a_lock_is_answered_not_held_forever() {
    let app = spawn_app_with(Options {
        tweak: Box::new(|c| {
            c.store.statement_timeout = Duration::from_secs(1);
            c.store.outage_wait = Duration::from_secs(1);
        }),
        ..Options::unlimited()
    })
    .await;
    let (_, token) = app.agent().await;
    if !app.db.is_postgres() {
        return;
    }
    let pool = sqlx::PgPool::connect(&app.db.url).await.unwrap();
    let mut holder = pool.begin().await.unwrap();
    for table in ["agents", "audit_blocks"] {
        sqlx::query(&format!("LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"))
            .execute(&mut *holder)
            .await
            .unwrap();
    }
    let agent = serde_json::json!({"name": "a", "issuer_domain": "example.com", "scopes": ["read:x"]});
    let register = || app.post("/v1/agents/register", Some(app.secret()), Some(&agent));
    let answered = tokio::time::timeout(Duration::from_secs(30), register())
        .await
        .expect("answered while the lock is held");
    answered.assert_error(503, "SERVICE_UNAVAILABLE");
    let answered = tokio::time::timeout(Duration::from_secs(30), app.verify_as_receiver(&token))
        .await
        .expect("answered while the lock is held");
    answered.assert_error(503, "AUDIT_UNAVAILABLE");
    holder.rollback().await.unwrap();
    pool.close().await;
    assert_eq!(register().await.status, 201);
    valid(&app, &token).await;
}
