//! The database is checked, not trusted: what someone who can write its rows (the SQLite
//! file, or PostgreSQL as the service's own role) tries, and what stops or catches it.
//! The SQL runs on a direct connection as the database's owner, which can do at least what
//! the role `agentid migrate --grant` sets up can (it cannot drop the owner's triggers either).

use agentid::domain::Millis;
use agentid::engine::admin;
use agentid::keys::thumbprint;
use agentid::token::Claims;
use ed25519_dalek::SigningKey;
use std::time::Duration;

use crate::helpers::{blob, spawn_app, TestApp};

/// A token as a forger who holds `key` would make it for `agent`.
fn forge(key: &SigningKey, kid: &str, agent: &str) -> String {
    let now = Millis::now().0 / 1000;
    agentid::token::encode(
        key,
        kid,
        &Claims::agent(
            "evil.example",
            agent,
            "forged",
            now,
            now + 3600,
            vec!["admin:everything".into()],
        ),
    )
}

/// A second organization, B.
async fn second_org(app: &TestApp) -> admin::CreatedOrg {
    let limits =
        agentid::domain::OrgLimits::resolve(agentid::domain::Plan::Developer, None, None, None).unwrap();
    admin::create_org(
        &app.store,
        app.engine.keys(),
        "b",
        agentid::domain::Plan::Developer,
        limits,
    )
    .await
    .unwrap()
}

/// The number of the last issuer-domain event.
async fn last_domain_event(app: &TestApp) -> i64 {
    let (seq,): (i64,) = if app.db.is_postgres() {
        let pool = sqlx::PgPool::connect(&app.db.url).await.unwrap();
        sqlx::query_as("SELECT MAX(seq) FROM domain_events")
            .fetch_one(&pool)
            .await
            .unwrap()
    } else {
        let pool = sqlx::SqlitePool::connect(&app.db.url).await.unwrap();
        sqlx::query_as("SELECT MAX(seq) FROM domain_events")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    seq
}

/// Registering under each of `names` with `key` is refused: 403 `ISSUER_DOMAIN_NOT_VERIFIED`.
async fn refused_names(app: &TestApp, key: &str, names: &[&str]) {
    for name in names {
        app.post(
            "/v1/agents/register",
            Some(key),
            Some(&serde_json::json!({"name": "n", "issuer_domain": name, "scopes": ["read:x"]})),
        )
        .await
        .assert_error(403, "ISSUER_DOMAIN_NOT_VERIFIED");
    }
}

/// `agentid audit verify` on the app's database and key file: exit code and output.
fn audit_verify(app: &TestApp) -> (Option<i32>, String) {
    audit_verify_with(app, &[])
}

/// One INSERT puts a key of the attacker's in `signing_keys`: it is not published, validates
/// no token (online), and is reported, by the instances and by `audit verify`; after a
/// restart too. A valid sealed half copied from a real key does not vouch for another kid.
#[actix_web::test]
async fn a_signing_key_written_into_the_database_validates_nothing() {
    let metrics = agentid::telemetry::metrics_handle();
    let app = spawn_app().await;
    let (agent, token) = app.agent().await;
    let evil = SigningKey::from_bytes(&[66; 32]);
    let kid = thumbprint(&evil.verifying_key());
    let sql = format!(
        "INSERT INTO signing_keys (kid, public_key, created_at, private_key, activates_at, \
         retired_at, last_expires_at) VALUES ('{kid}', {}, 1, NULL, NULL, NULL, 4102444800000)",
        blob(&app, evil.verifying_key().as_bytes())
    );
    app.raw_execute(&sql).await.unwrap();
    // A rotated key's sealed half, copied under the attacker's kid and public key.
    let root = agentid::keys::KeyRing::load(&app.config.signing_key_file)
        .unwrap()
        .unwrap();
    let rotated = admin::rotate_signing_key(&app.store, &root, &app.config.signing_key_file, Duration::ZERO)
        .await
        .unwrap();
    let evil2 = SigningKey::from_bytes(&[67; 32]);
    let kid2 = thumbprint(&evil2.verifying_key());
    app.raw_execute(&format!(
        "INSERT INTO signing_keys (kid, public_key, created_at, private_key, activates_at, \
         retired_at, last_expires_at) SELECT '{kid2}', {}, 1, private_key, activates_at, NULL, \
         4102444800000 FROM signing_keys WHERE kid = '{}'",
        blob(&app, evil2.verifying_key().as_bytes()),
        rotated.kid
    ))
    .await
    .unwrap();
    app.engine.refresh_keys().await.unwrap();

    let jwks = app.get("/.well-known/jwks.json", None).await.text();
    assert!(jwks.contains(&rotated.kid), "the real rotation is published");
    for (key, kid) in [(&evil, &kid), (&evil2, &kid2)] {
        assert!(!jwks.contains(kid.as_str()), "{jwks}");
        let res = app.verify(&forge(key, kid, &agent)).await;
        assert_eq!(res["valid"], false, "{res}");
        assert_eq!(res["error"], "TOKEN_INVALID", "{res}");
    }
    assert_eq!(
        app.verify(&token).await["valid"],
        true,
        "the real key still validates"
    );

    assert!(integrity_failures(metrics, "signing_key") >= 2.0);
    let (code, out) = audit_verify(&app);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains(&format!("FAIL    signing key \"{kid}\"")), "{out}");
    assert!(out.contains(&format!("FAIL    signing key \"{kid2}\"")), "{out}");

    let app = app.restart().await;
    let res = app.verify(&forge(&evil, &kid, &agent)).await;
    assert_eq!(res["error"], "TOKEN_INVALID", "{res}");
}

/// A key written into the database (active now) is listed as unvouched and cannot stand in
/// for the signer: retiring the fleet's only vouched active key is still refused, which would
/// leave the instances no key to sign with.
#[actix_web::test]
async fn a_signing_key_written_into_the_database_cannot_stand_in_for_the_signer() {
    let app = spawn_app().await;
    let evil = SigningKey::from_bytes(&[68; 32]);
    let kid = thumbprint(&evil.verifying_key());
    app.raw_execute(&format!(
        "INSERT INTO signing_keys (kid, public_key, created_at, private_key, activates_at, \
         retired_at, last_expires_at) VALUES ('{kid}', {}, 1, NULL, 1, NULL, 4102444800000)",
        blob(&app, evil.verifying_key().as_bytes())
    ))
    .await
    .unwrap();
    let root = app.key_ring();
    let views = admin::signing_keys(&app.store, &root).await.unwrap();
    let state = |k: &str| views.iter().find(|v| v.kid == k).map(|v| v.state);
    assert_eq!(
        (state(root.kid()), state(&kid)),
        (
            Some(agentid::keys::KeyState::Active),
            Some(agentid::keys::KeyState::Unvouched)
        )
    );
    let refused = admin::retire_signing_key(&app.store, &root, root.kid())
        .await
        .unwrap_err();
    assert!(
        matches!(refused, admin::AdminError::OnlyActiveKey(_)),
        "{refused}"
    );
    // As the operator runs it.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentid"))
        .args(["signing-key", "retire", root.kid()])
        .env("DATABASE_URL", &app.config.database_url)
        .env("AGENTID_SIGNING_KEY_FILE", &app.config.signing_key_file)
        .output()
        .unwrap();
    assert!(!out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    app.engine.refresh_keys().await.unwrap();
    let (_, token) = app.agent().await;
    assert_eq!(app.verify(&token).await["valid"], true);
}

/// Retirements are committed to in the order of their times, and a retirement dated ahead
/// of now would leave its key signing or validating until then: the database records no key
/// retired, no retirement ahead of now and none before the last. Past the triggers, a
/// retirement dated far ahead retires its key at once.
#[actix_web::test]
async fn retirements_are_recorded_in_order_and_never_ahead_of_now() {
    let app = spawn_app().await;
    let root = app.key_ring();
    let file = &app.config.signing_key_file;
    admin::rotate_signing_key(&app.store, &root, file, Duration::ZERO)
        .await
        .unwrap();
    admin::retire_signing_key(&app.store, &root, root.kid())
        .await
        .unwrap();
    app.engine.refresh_keys().await.unwrap();
    let (_, token) = app.agent().await;
    let views = admin::signing_keys(&app.store, &root).await.unwrap();
    let second = views
        .iter()
        .find(|v| v.state == agentid::keys::KeyState::Active)
        .unwrap()
        .kid
        .clone();
    admin::rotate_signing_key(&app.store, &root, file, Duration::ZERO)
        .await
        .unwrap();
    app.engine.refresh_keys().await.unwrap();
    assert_eq!(app.verify(&token).await["valid"], true);
    let junk = SigningKey::from_bytes(&[69; 32]);
    let far = 253_402_300_799_999_i64;
    for sql in [
        format!(
            "INSERT INTO signing_keys (kid, public_key, created_at, retired_at) VALUES ('junk', {}, 1, {far})",
            blob(&app, junk.verifying_key().as_bytes())
        ),
        format!("UPDATE signing_keys SET retired_at = {far} WHERE kid = '{second}'"),
        format!("UPDATE signing_keys SET retired_at = 1 WHERE kid = '{second}'"),
    ] {
        assert!(app.raw_execute(&sql).await.is_err(), "{sql} was let through");
    }
    crate::helpers::tamper(
        &app,
        &format!("UPDATE signing_keys SET retired_at = {far} WHERE kid = '{second}'"),
    )
    .await;
    app.engine.refresh_keys().await.unwrap();
    assert_eq!(app.verify(&token).await["error"], "TOKEN_INVALID");
}

/// What checkpoints commit to (revocations, retirements, issuer-domain events) is only ever
/// added to at its end, and every entry is short: the database records no agent revoked
/// already (it would sort ahead of revocations committed to), and no agent id, kid or
/// issuer-domain event longer than any the service writes (one of megabytes would put every
/// answer of `GET /v1/log/commitments` past what a witness reads).
#[actix_web::test]
async fn committed_rows_are_recorded_short_and_at_the_end() {
    let app = spawn_app().await;
    let org = &app.org.org_id;
    let long = "a".repeat(100_000);
    let seq = last_domain_event(&app).await;
    let mac = blob(&app, &[7u8; 32]);
    // Sealed as far as the database can tell: only what is tried here is refused.
    let now = agentid::domain::Millis::now().0;
    let agent = |id: &str, revoked: &str| {
        format!(
            "INSERT INTO agents (id, org_id, mode, name, issuer_domain, description, scopes, created_at, \
             issued_at, expires_at, revoked_at, key_mac, key_sealed_at) VALUES ('{id}', '{org}', 'live', \
             'n', 'example.com', '', '[\"read:x\"]', 1, 1, 2, {revoked}, {mac}, {now})"
        )
    };
    for sql in [
        agent("agt_01dddddddddddddddddddddd99", "1"),
        agent(&format!("agt_{long}"), "NULL"),
        format!(
            "INSERT INTO signing_keys (kid, public_key, created_at) VALUES ('{long}', {}, 1)",
            blob(&app, &[9u8; 32])
        ),
        format!(
            "INSERT INTO domain_events VALUES ({}, 'hold', '{long}.example', '{org}', 'dns', 1, 1, NULL, {mac})",
            seq + 1
        ),
        format!(
            "INSERT INTO domain_events VALUES ({}, 'release', 'example.com', '{org}', NULL, 1, 1, '{long}', {mac})",
            seq + 1
        ),
    ] {
        assert!(app.raw_execute(&sql).await.is_err(), "{} was let through", &sql[..120]);
    }
}

/// The rows that would undo a retirement or a revocation do not change: a retired key's
/// `retired_at` set back to NULL, an agent renamed so that a fresh row can take its id, the
/// revocation epoch deleted or moved back.
#[actix_web::test]
async fn retirement_and_revocation_cannot_be_undone_in_the_database() {
    let app = spawn_app().await;
    let (agent, token) = app.agent().await;
    let root = agentid::keys::KeyRing::load(&app.config.signing_key_file)
        .unwrap()
        .unwrap();
    admin::rotate_signing_key(&app.store, &root, &app.config.signing_key_file, Duration::ZERO)
        .await
        .unwrap();
    admin::retire_signing_key(&app.store, &root, root.kid())
        .await
        .unwrap();
    app.engine.refresh_keys().await.unwrap();
    assert_eq!(app.verify(&token).await["error"], "TOKEN_INVALID");

    let (other, other_token) = app.agent().await;
    assert_eq!(app.revoke(&other, None).await.status, 200);
    for sql in [
        format!(
            "UPDATE signing_keys SET retired_at = NULL WHERE kid = '{}'",
            root.kid()
        ),
        format!("DELETE FROM signing_keys WHERE kid = '{}'", root.kid()),
        // Lowered, a replaced key counted as retired on the next instance to start, which
        // refused its tokens still in their lifetime.
        "UPDATE signing_keys SET last_expires_at = 0".to_owned(),
        "UPDATE signing_keys SET last_expires_at = NULL".to_owned(),
        format!("UPDATE agents SET id = id || 'x' WHERE id = '{other}'"),
        "DELETE FROM revocation_epoch".to_owned(),
        "UPDATE revocation_epoch SET epoch = 0".to_owned(),
        // Every later revocation would fail past the largest epoch.
        "UPDATE revocation_epoch SET epoch = 9223372036854775807".to_owned(),
        // Set back under what instances have read, a revocation would go unseen by them.
        format!("UPDATE agents SET revoked_epoch = 0 WHERE id = '{other}'"),
        format!("UPDATE agents SET revoked_epoch = NULL WHERE id = '{other}'"),
        format!("UPDATE agents SET revoked_epoch = 1 WHERE id = '{agent}'"),
        // Under another name, a name's move would owe the agent no revocation; nor if it
        // seemed registered after the move.
        format!("UPDATE agents SET issuer_domain = 'x.invalid' WHERE id = '{agent}'"),
        format!("UPDATE agents SET domain_events_seen = 999999 WHERE id = '{agent}'"),
        // Nor deleted to be written again under another name.
        format!("DELETE FROM agents WHERE id = '{agent}'"),
        // A key row that does not read (and cannot be deleted) stopped every instance's start.
        format!(
            "INSERT INTO signing_keys (kid, public_key, created_at) VALUES ('junk', {}, 1)",
            blob(&app, &[0])
        ),
    ] {
        let err = app.refused(&sql).await;
        assert!(
            [
                "never changes",
                "is final",
                "is kept",
                "only grows",
                "32 bytes",
                "signing_keys_are_keys"
            ]
            .iter()
            .any(|m| err.contains(m)),
            "{sql}: {err}"
        );
    }
    // Nothing moved: after a restart (a new instance) the key is retired, the agent revoked.
    let app = app.restart().await;
    assert_eq!(app.verify(&token).await["error"], "TOKEN_INVALID");
    assert_eq!(app.verify(&other_token).await["error"], "TOKEN_REVOKED");
    // The epoch still moves, one revocation at a time.
    assert_eq!(app.revoke(&agent, None).await.status, 200);
}

/// A key disabled "for good" stays disabled: its row's `disabled_at` never goes back.
#[actix_web::test]
async fn a_disabled_key_cannot_be_enabled_in_the_database() {
    let app = spawn_app().await;
    let key = app.org.keys.publishable_test.clone();
    assert_eq!(app.get("/v1/verify/x", Some(&key)).await.status, 200);
    let disable = "UPDATE api_keys SET disabled_at = 1 WHERE kind = 'publishable' AND mode = 'test'";
    assert_eq!(app.raw_execute(disable).await.unwrap(), 1);
    let mut undo = vec![
        "UPDATE api_keys SET disabled_at = NULL WHERE kind = 'publishable' AND mode = 'test'",
        "UPDATE api_keys SET disabled_at = 2 WHERE kind = 'publishable' AND mode = 'test'",
        // Deleted to be written again without `disabled_at`, or moved aside for a fresh row.
        "DELETE FROM api_keys WHERE kind = 'publishable' AND mode = 'test'",
        if app.db.is_postgres() {
            "UPDATE api_keys SET key_hash = '\\x00'::bytea WHERE kind = 'publishable' AND mode = 'test'"
        } else {
            "UPDATE api_keys SET key_hash = X'00' WHERE kind = 'publishable' AND mode = 'test'"
        },
    ];
    if !app.db.is_postgres() {
        undo.push(
            "INSERT OR REPLACE INTO api_keys (key_hash, org_id, kind, mode, hint, created_at, id, mac) \
             SELECT key_hash, org_id, kind, mode, hint, created_at, id, mac FROM api_keys \
             WHERE kind = 'publishable' AND mode = 'test'",
        );
    }
    for sql in undo {
        let err = app.refused(sql).await;
        assert!(
            err.contains("stays disabled") || err.contains("identity never changes"),
            "{sql}: {err}"
        );
    }
}

/// The row of a secret live key `key` of organization `org`, with `mac` (SQL) as its seal.
fn key_row(app: &TestApp, key: &str, id: &str, org: &str, mac: &str) -> String {
    format!(
        "INSERT INTO api_keys (key_hash, org_id, kind, mode, hint, created_at, id, mac) \
         VALUES ({}, '{org}', 'secret', 'live', 'sk_live_…', 1, '{id}', {mac})",
        blob(app, &agentid::engine::hash_key(key))
    )
}

/// Who may call, and under which plan, is the key file's to say: a key row or a plan written
/// with database access alone opens nothing. A row without a seal is refused by the database;
/// one with a seal of its own making, or a real row's seal copied, is refused by the service;
/// and the operator does not carry a forged plan into a new seal.
#[actix_web::test]
async fn an_api_key_or_a_plan_written_into_the_database_opens_nothing() {
    let app = spawn_app().await;
    let org = app.org.org_id.clone();
    assert_eq!(app.get("/v1/agents", Some(app.secret())).await.status, 200);
    // Nor with the mark of a row from before seals, which only their migration writes.
    let unsealed = [blob(&app, &[]), blob(&app, &[0]), blob(&app, &[0; 31])];
    for (i, mac) in unsealed.iter().enumerate() {
        let key = format!("sk_live_{}{i}", "A".repeat(39));
        let err = app
            .refused(&key_row(&app, &key, &format!("key_nomac{i}"), &org, mac))
            .await;
        assert!(err.contains("written sealed"), "{err}");
    }
    let unseal = format!("UPDATE api_keys SET mac = {}", blob(&app, &[]));
    let err = app.refused(&unseal).await;
    assert!(err.contains("written sealed"), "{err}");

    let forged = [
        blob(&app, &[0; 32]),
        format!(
            "(SELECT mac FROM api_keys WHERE key_hash = {})",
            blob(&app, &agentid::engine::hash_key(app.secret()))
        ),
    ];
    for (i, mac) in forged.iter().enumerate() {
        let key = format!("sk_live_{}{i}", "B".repeat(39));
        let row = key_row(&app, &key, &format!("key_forged{i}"), &org, mac);
        assert_eq!(app.raw_execute(&row).await.unwrap(), 1, "{row}");
        let res = app.get("/v1/agents", Some(&key)).await;
        assert_eq!(res.status, 401, "a forged key opened: {}", res.text());
    }

    // A plan written into the database: the organization's keys open nothing under it.
    let richer = format!(
        "UPDATE orgs SET plan = 'enterprise', verify_limit = 1000000000, other_limit = 1000000000 \
         WHERE id = '{org}'"
    );
    assert_eq!(app.raw_execute(&richer).await.unwrap(), 1);
    let res = app.get("/v1/agents", Some(&app.org.keys.secret_test)).await;
    assert_eq!(
        res.status,
        401,
        "a key opened under a forged plan: {}",
        res.text()
    );
    // An earlier plan sealed by the key file, copied back with its seal (here one made two
    // minutes ago): refused by the database.
    let mut earlier = app
        .store
        .get_org(&crate::helpers::org_id(&org))
        .await
        .unwrap()
        .unwrap();
    earlier.plan = agentid::domain::Plan::Enterprise;
    earlier.sealed_at = Millis(Millis::now().0 - 120_000);
    let seal = app
        .engine
        .keys()
        .seal(agentid::keys::Sealed::Organization, &earlier.canonical());
    let copied = format!(
        "UPDATE orgs SET mac = {}, sealed_at = {} WHERE id = '{org}'",
        blob(&app, &seal),
        earlier.sealed_at.0
    );
    let err = app.refused(&copied).await;
    assert!(err.contains("sealed"), "{err}");
    // The operator does not seal it by changing something else; naming the plan does.
    let keep = admin::set_limits(&app.store, app.engine.keys(), &org, Default::default())
        .await
        .expect_err("a forged plan is not carried into a new seal");
    assert!(matches!(keep, admin::AdminError::Refused(_)), "{keep}");
    let developer = admin::LimitChange {
        plan: Some(agentid::domain::Plan::Developer),
        ..Default::default()
    };
    let set = admin::set_limits(&app.store, app.engine.keys(), &org, developer)
        .await
        .unwrap();
    assert_eq!(set.plan, agentid::domain::Plan::Developer);
    let (key, _) = admin::create_key(
        &app.store,
        app.engine.keys(),
        &org,
        agentid::domain::ApiKeyKind::Secret,
        agentid::domain::KeyMode::Live,
        None,
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(app.get("/v1/agents", Some(&key)).await.status, 200);
}

/// Keys and plans from before seals (marked so by the migration that brought them) are sealed
/// by the first start after the upgrade: they keep working. A row written without a seal
/// (past the triggers) is not sealed by a later start: it stays refused.
#[actix_web::test]
async fn keys_and_plans_from_before_seals_are_sealed_once() {
    let app = spawn_app().await;
    let past_triggers: &[&str] = if app.db.is_postgres() {
        &["SET session_replication_role = replica"]
    } else {
        &[
            "DROP TRIGGER api_keys_stay_sealed",
            "DROP TRIGGER api_keys_written_sealed",
            "DROP TRIGGER orgs_stay_sealed",
        ]
    };
    // The database as the upgrade leaves it: every row marked as from before seals.
    let (keys, orgs) = (
        format!("UPDATE api_keys SET mac = {}", blob(&app, &[0])),
        format!("UPDATE orgs SET mac = {}", blob(&app, &[0])),
    );
    let mut sqls = past_triggers.to_vec();
    sqls.extend([keys.as_str(), orgs.as_str()]);
    app.raw_session(&sqls).await.unwrap();
    let app = app.restart().await;
    assert_eq!(app.get("/v1/agents", Some(app.secret())).await.status, 200);

    let key = format!("sk_live_{}", "C".repeat(40));
    let row = key_row(&app, &key, "key_late", &app.org.org_id, &blob(&app, &[]));
    let mut sqls = if app.db.is_postgres() {
        past_triggers.to_vec()
    } else {
        vec![]
    };
    sqls.push(&row);
    app.raw_session(&sqls).await.unwrap();
    let app = app.restart().await;
    let res = app.get("/v1/agents", Some(&key)).await;
    assert_eq!(
        res.status,
        401,
        "a row written unsealed after the upgrade opened: {}",
        res.text()
    );
    assert_eq!(app.get("/v1/agents", Some(app.secret())).await.status, 200);
}

/// Every trigger function finds its tables in its own schema: a temporary table of the same
/// name, which any role may make, never stands in for a real one.
#[actix_web::test]
async fn trigger_functions_see_no_temporary_tables() {
    let app = spawn_app().await;
    if !app.db.is_postgres() {
        return; // SQLite's triggers read their own schema's tables
    }
    let pool = sqlx::PgPool::connect(&app.db.url).await.unwrap();
    let open: Vec<(String,)> = sqlx::query_as(
        "SELECT p.proname::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
         WHERE n.nspname = current_schema() AND p.prorettype = 'trigger'::regtype \
         AND NOT COALESCE(array_to_string(p.proconfig, ',') LIKE 'search_path=pg_catalog, %pg_temp', false)",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    pool.close().await;
    assert!(
        open.is_empty(),
        "trigger functions without a fixed search_path: {open:?}"
    );
}

/// The process's `agentid_integrity_failures_total{what}` (tests share the process).
fn integrity_failures(metrics: &metrics_exporter_prometheus::PrometheusHandle, what: &str) -> f64 {
    let series = format!("agentid_integrity_failures_total{{what=\"{what}\"}} ");
    metrics
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(series.as_str()))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// `n` verifications of one fresh agent's token: `n` records in the caller's live ledger.
async fn records(app: &TestApp, n: usize) {
    let (_, token) = app.agent().await;
    for _ in 0..n {
        assert_eq!(app.verify_as_receiver(&token).await.status, 200);
    }
}

/// The size of the caller's live ledger's latest checkpoint.
async fn checkpointed(app: &TestApp) -> u64 {
    let note = app.get("/v1/log/checkpoint", Some(app.secret())).await.text();
    note.lines().nth(1).unwrap().parse().unwrap()
}

/// Waits until a checkpoint covers `size` records of the caller's live ledger.
async fn covered(app: &TestApp, size: u64) {
    for _ in 0..200 {
        if checkpointed(app).await >= size {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "no checkpoint of {size} records came (the latest holds {})",
        checkpointed(app).await
    );
}

/// Attack: someone who can write the database appends a verification of their own, chained
/// as the service chains records (the chain is SHA-256, which anyone computes: here with the
/// service's own code, but without the key file). Its block's seal does not check: the
/// checkpointer alarms (and goes on: the records after it chain to it), and `audit verify`
/// names its records. A block with no seal at all is refused by the database.
#[actix_web::test]
async fn a_record_appended_without_the_key_file_is_caught() {
    use agentid::domain::audit::{AuditEntry, Event};
    use agentid::domain::{KeyMode, Ledger, VerifyResult};
    let metrics = agentid::telemetry::metrics_handle();
    let app = spawn_app().await;
    records(&app, 3).await;
    covered(&app, 3).await;
    let before = integrity_failures(metrics, "audit_block");
    let (agent, _) = app.agent().await;
    let forged = AuditEntry {
        event: Event::Verification,
        ledger: Ledger {
            org_id: app.org.org_id.clone(),
            mode: KeyMode::Live,
        },
        agent_id: agent,
        result: VerifyResult::Valid,
        failure_reason: None,
        latency_us: 7,
        requested_at: Millis(1_000),
        revocations_seen: i64::MAX,
    };
    let unkeyed: agentid::store::BlockSealer = std::sync::Arc::new(|_: &[u8]| [7u8; 32]);
    let written = app
        .store
        .append_audit(vec![forged.clone()], unkeyed.clone())
        .await
        .into_result()
        .unwrap();
    assert_eq!(written[0].seq, 4);
    records(&app, 2).await;
    covered(&app, 6).await;
    assert!(integrity_failures(metrics, "audit_block") > before);
    // The database refuses a block with no seal.
    let org = &app.org.org_id;
    let unsealed = format!(
        "INSERT INTO audit_blocks (org_id, mode, first_seq, last_seq, prev_hash, last_hash, results, \
         n_valid, n_invalid, n_expired, n_revoked, records) \
         SELECT org_id, mode, last_seq + 100, last_seq + 100, last_hash, last_hash, results, n_valid, \
         n_invalid, n_expired, n_revoked, records FROM audit_blocks \
         WHERE org_id = '{org}' AND mode = 'live' ORDER BY first_seq DESC LIMIT 1"
    );
    let err = app.refused(&unsealed).await;
    assert!(err.contains("sealed by the service"), "{err}");
    // Behind the triggers (the file's owner), one with no seal at all, as the blocks written
    // before seals have: after a sealed block, it is caught as well.
    let written = app
        .store
        .append_audit(vec![forged], unkeyed)
        .await
        .into_result()
        .unwrap();
    assert_eq!(written[0].seq, 7);
    crate::helpers::tamper(
        &app,
        &format!(
            "UPDATE audit_blocks SET mac = NULL WHERE org_id = '{org}' AND mode = 'live' AND first_seq = 7"
        ),
    )
    .await;
    records(&app, 1).await;
    covered(&app, 8).await;
    let (code, out) = audit_verify(&app);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("records 4..=4: the key file did not seal"), "{out}");
    assert!(out.contains("records 7..=7: the key file did not seal"), "{out}");
    // The service's own blocks around them check.
    assert_eq!(out.matches("the key file did not seal").count(), 2, "{out}");
}

/// One row where the checkpointer writes the next subtree hash used to stop every later
/// checkpoint (the no-replace trigger refused them all). Now the checkpoint is made over the
/// records anyway, later ones too, and the row is an integrity alarm and an `audit verify`
/// failure.
#[actix_web::test]
async fn a_junk_subtree_hash_neither_stops_nor_bends_checkpoints() {
    let metrics = agentid::telemetry::metrics_handle();
    let app = spawn_app().await;
    records(&app, 30).await;
    covered(&app, 30).await;
    let latest = checkpointed(&app).await;
    let org = &app.org.org_id;
    app.raw_execute(&format!(
        "INSERT INTO audit_tree_nodes VALUES ('{org}', 'live', 4, {}, {})",
        latest / 16,
        blob(&app, &[0])
    ))
    .await
    .unwrap();
    records(&app, 20).await;
    covered(&app, latest + 20).await;
    records(&app, 20).await;
    covered(&app, latest + 40).await;
    assert!(integrity_failures(metrics, "tree_node") >= 1.0);

    let (code, out) = audit_verify(&app);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains(&format!(
            "the stored hash of subtree 4@{} is not the records'",
            latest / 16
        )),
        "{out}"
    );
    // Every checkpoint's root is the records' root: the junk is the only failure.
    assert_eq!(out.lines().filter(|l| l.starts_with("FAIL ")).count(), 1, "{out}");
}

/// Records that no checkpoint has covered for longer than N checkpoint intervals fail
/// `audit verify` and the witness; within the limit both pass.
#[actix_web::test]
async fn records_left_uncovered_by_checkpoints_are_an_alarm() {
    // A checkpointer that does not come round during the test.
    let app = crate::helpers::spawn_app_with(crate::helpers::Options {
        tweak: Box::new(|c| c.engine.checkpoint_interval = Duration::from_secs(3600)),
        ..Default::default()
    })
    .await;
    records(&app, 3).await;
    assert_eq!(checkpointed(&app).await, 0);
    let (code, out) = audit_verify(&app);
    assert_eq!(code, Some(0), "within 6 intervals of 10 s: {out}");
    tokio::time::sleep(Duration::from_millis(400)).await;
    let strict = ["--checkpoint-interval-ms", "100", "--stale-after-intervals", "3"];
    let (code, out) = audit_verify_with(&app, &strict);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("seq 1: no checkpoint covers the records from here on"),
        "{out}"
    );

    let state = tempfile::tempdir().unwrap();
    let out = crate::helpers::witness(&app, state.path(), &[]).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = crate::helpers::witness(&app, state.path(), &strict).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("ALERT: checkpoints stopped"), "{err}");

    // Busy traffic: the newest record is always fresh, yet records this witness saw
    // uncovered on an earlier run are still uncovered past the limit.
    let state = tempfile::tempdir().unwrap();
    let limit = ["--checkpoint-interval-ms", "500", "--stale-after-intervals", "2"];
    records(&app, 1).await;
    let out = crate::helpers::witness(&app, state.path(), &limit).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    tokio::time::sleep(Duration::from_millis(1100)).await;
    records(&app, 1).await;
    let out = crate::helpers::witness(&app, state.path(), &limit).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("ALERT: checkpoints stopped"), "{err}");

    // A note that does not read is an error, not a note forgotten (which would start the
    // count again).
    std::fs::write(state.path().join("uncovered"), "junk\n").unwrap();
    let out = crate::helpers::witness(&app, state.path(), &[]).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("remove it to start counting again"), "{err}");
}

/// A log row changed so that it no longer reads as the service writes it is the alarm (exit
/// 1, FAIL), not a check that could not be made (exit 2).
#[actix_web::test]
async fn audit_verify_fails_a_log_row_that_does_not_read() {
    let app = spawn_app().await;
    let (_, token) = app.agent().await;
    app.verify(&token).await;
    crate::helpers::tamper(&app, "UPDATE audit_blocks SET mode = 'bogus'").await;
    let (code, out) = audit_verify(&app);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("FAIL"), "{out}");
}

/// `audit verify` given the log key but no key file could check neither seals, signing keys
/// nor issuer-domain events: that is "could not check" (2), never a quieter pass (0), unless
/// asked for knowingly.
#[actix_web::test]
async fn audit_verify_without_its_key_file_says_it_could_not_check() {
    let app = spawn_app().await;
    app.agent().await;
    let log_key = app.get("/.well-known/log-key", None).await.text();
    let run = |extra: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentid"))
            .args(["audit", "verify", "--database-url", &app.db.url])
            .args(["--signing-key-file", "/nonexistent/signing-key.pem"])
            .args(["--log-key", log_key.trim()])
            .args(extra)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = run(&[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--without-key-file"), "{err}");
    let (code, err) = run(&["--without-key-file"]);
    assert_eq!(code, Some(0), "{err}");
}

fn audit_verify_with(app: &TestApp, extra: &[&str]) -> (Option<i32>, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentid"))
        .args(["audit", "verify", "--database-url", &app.db.url])
        .arg("--signing-key-file")
        .arg(&app.config.signing_key_file)
        .args(["--public-url", &app.base])
        .args(extra)
        .output()
        .unwrap();
    (
        out.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Someone who can get past the triggers (the SQLite file's holder, PostgreSQL's owner) puts
/// an agent's row back as it was before its revocation and a key's row as it was before its
/// retirement. A new instance believes the rows (this is detected, not prevented), but every
/// checkpoint made since committed to both lists: `audit verify` fails at it, the instance
/// that makes the next checkpoint alarms, and the witness's next run alerts.
#[actix_web::test]
async fn a_revocation_or_retirement_undone_behind_the_triggers_is_caught() {
    let metrics = agentid::telemetry::metrics_handle();
    let app = spawn_app().await;
    let root = agentid::keys::KeyRing::load(&app.config.signing_key_file)
        .unwrap()
        .unwrap();
    let (_, old_key_token) = app.agent().await;
    admin::rotate_signing_key(&app.store, &root, &app.config.signing_key_file, Duration::ZERO)
        .await
        .unwrap();
    admin::retire_signing_key(&app.store, &root, root.kid())
        .await
        .unwrap();
    app.engine.refresh_keys().await.unwrap();
    let (agent, token) = app.agent().await;
    assert_eq!(app.revoke(&agent, Some("leaked")).await.status, 200);
    records(&app, 3).await;
    covered(&app, 3).await;
    let note = app.get("/v1/log/checkpoint", Some(app.secret())).await.text();
    assert!(note.contains("\nagentid-revocations 1 "), "{note}");
    assert!(note.contains("\nagentid-retired-keys 1 "), "{note}");
    let listed = app.get("/v1/log/commitments", Some(app.secret())).await.json();
    assert_eq!(
        listed["revocations"]["entries"][0]["id"],
        agent.as_str(),
        "{listed}"
    );
    assert_eq!(listed["retired_keys"]["entries"][0]["id"], root.kid(), "{listed}");
    let state = tempfile::tempdir().unwrap();
    let out = crate::helpers::witness(&app, state.path(), &[]).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (code, out) = audit_verify(&app);
    assert_eq!(code, Some(0), "{out}");

    let before = integrity_failures(metrics, "revocation");
    crate::helpers::tamper(
        &app,
        &format!(
            "UPDATE agents SET revoked_at = NULL, revocation_reason = NULL, revoked_epoch = NULL \
             WHERE id = '{agent}'; UPDATE signing_keys SET retired_at = NULL WHERE kid = '{}';",
            root.kid()
        ),
    )
    .await;
    // The instance that saw the revocation and the retirement keeps them.
    app.engine.refresh_keys().await.unwrap();
    assert_eq!(app.verify(&token).await["error"], "TOKEN_REVOKED");
    assert_eq!(app.verify(&old_key_token).await["error"], "TOKEN_INVALID");
    let app = app.restart().await;
    assert_eq!(
        app.verify(&token).await["valid"],
        true,
        "a new instance believes the rows"
    );
    assert_eq!(app.verify(&old_key_token).await["valid"], true);

    let (code, out) = audit_verify(&app);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("a revocation was undone"), "{out}");
    assert!(out.contains("a retirement was undone"), "{out}");

    records(&app, 2).await;
    covered(&app, 3 + 4 + 2).await;
    assert!(integrity_failures(metrics, "revocation") > before);
    assert!(integrity_failures(metrics, "retired_key") >= 1.0);
    let out = crate::helpers::witness(&app, state.path(), &[]).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("ALERT: the log did not only grow"), "{err}");
}

/// Attack: the newest block written in again one record later (the service's role may insert
/// into the log's tables), so that the ledger's head is a copy of records already in it. The
/// blocks no longer form one chain: no checkpoint signs past the copy (the checkpointer's
/// reads refuse it), and `audit verify` reports it.
#[actix_web::test]
async fn a_block_written_over_the_chain_is_never_checkpointed() {
    let app = spawn_app().await;
    records(&app, 10).await;
    covered(&app, 10).await;
    let before = checkpointed(&app).await;
    let org = &app.org.org_id;
    app.raw_execute(&format!(
        "INSERT INTO audit_blocks (org_id, mode, first_seq, last_seq, prev_hash, last_hash, results, \
         n_valid, n_invalid, n_expired, n_revoked, records, mac) \
         SELECT org_id, mode, first_seq + 1, last_seq + 1, prev_hash, last_hash, results, n_valid, \
         n_invalid, n_expired, n_revoked, records, mac FROM audit_blocks \
         WHERE org_id = '{org}' AND mode = 'live' ORDER BY first_seq DESC LIMIT 1"
    ))
    .await
    .unwrap();
    // Verifications after it (the writer may find its next place taken: they need not pass),
    // then several checkpoint intervals.
    let (_, token) = app.agent().await;
    for _ in 0..3 {
        app.verify_as_receiver(&token).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(checkpointed(&app).await, before, "a checkpoint signed the copy");
    let (code, out) = audit_verify(&app);
    assert_eq!(code, Some(1), "{out}");
}

/// Junk checkpoint rows. One past the ledger's records is refused: rows at every size after
/// the latest checkpoint (a million, in one statement) left the checkpointer no size to sign
/// at, for good, and one far beyond the ledger was the latest by size. Rows at every size of
/// the records not yet covered stop checkpoints only until the next record; the note served
/// is the log key's (the witness agrees), and `audit verify` reports the junk.
#[actix_web::test]
async fn junk_checkpoint_rows_neither_stop_nor_stand_in_for_checkpoints() {
    use agentid::domain::{KeyMode, Ledger};
    use agentid::engine::transparency::checkpointer::Step;
    let metrics = agentid::telemetry::metrics_handle();
    // A checkpointer that comes round only when the test asks.
    let app = crate::helpers::spawn_app_with(crate::helpers::Options {
        tweak: Box::new(|c| c.engine.checkpoint_interval = Duration::from_secs(3600)),
        ..Default::default()
    })
    .await;
    records(&app, 10).await;
    assert_eq!(checkpointed(&app).await, 0);
    let org = &app.org.org_id;
    let junk = |size: u64| {
        format!(
            "INSERT INTO audit_checkpoints (org_id, mode, tree_size, root, note, created_at) \
             VALUES ('{org}', 'live', {size}, {}, 'junk', 1)",
            blob(&app, &[1; 32])
        )
    };
    for size in [11, 1_000_000] {
        let err = app.refused(&junk(size)).await;
        assert!(err.contains("its ledger holds"), "{err}");
    }
    for size in 1..=10 {
        app.raw_execute(&junk(size)).await.unwrap();
    }
    let before = integrity_failures(metrics, "checkpoint");
    let ledger = Ledger {
        org_id: org.clone(),
        mode: KeyMode::Live,
    };
    let checkpointer = app.engine.transparency();
    for _ in 0..12 {
        assert_eq!(checkpointer.checkpoint(&ledger).await.unwrap(), Step::More);
    }
    assert_eq!(checkpointed(&app).await, 0);
    assert!(integrity_failures(metrics, "checkpoint") > before);
    records(&app, 1).await;
    assert_eq!(checkpointer.checkpoint(&ledger).await.unwrap(), Step::Done);
    assert_eq!(checkpointed(&app).await, 11);
    let state = tempfile::tempdir().unwrap();
    let out = crate::helpers::witness(&app, state.path(), &[]).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (code, out) = audit_verify(&app);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("stored checkpoint of 10 records"), "{out}");
}

/// Someone who can write the database gives another organization a name: a hold event of
/// their own (no MAC of the key file, a wrong one, or a real event's copied to a new
/// place) counts nowhere; the rows already there cannot be changed or deleted.
#[actix_web::test]
async fn who_holds_a_name_cannot_be_written_into_the_database() {
    let metrics = agentid::telemetry::metrics_handle();
    let app = spawn_app().await;
    let b = second_org(&app).await;
    let before = integrity_failures(metrics, "domain_event");
    let seq = last_domain_event(&app).await;
    let org_b = &b.org_id;
    let forged = blob(&app, &[7u8; 32]);
    for sql in [
        // A hold without a MAC, one with a made-up MAC, and a copy of a real grant's row.
        format!(
            "INSERT INTO domain_events VALUES ({}, 'hold', 'bank.example', '{org_b}', 'dns', 1, 1, NULL, NULL)",
            seq + 1
        ),
        format!(
            "INSERT INTO domain_events VALUES ({}, 'release', 'example.com', '{}', NULL, 1, 1, 'x', {forged})",
            seq + 1,
            app.org.org_id
        ),
        format!(
            "INSERT INTO domain_events VALUES ({}, 'hold', 'example.com', '{org_b}', 'operator', 1, 1, NULL, {forged})",
            seq + 2
        ),
        format!(
            "INSERT INTO domain_events SELECT {}, kind, domain, org_id, method, at, claimed_at, reason, mac \
             FROM domain_events WHERE domain = 'a.io'",
            seq + 3
        ),
    ] {
        // The first is refused by the triggers; the others are rows the service ignores.
        let _ = app.raw_execute(&sql).await;
    }
    refused_names(
        &app,
        &b.keys.secret_live,
        &["bank.example", "example.com", "a.io"],
    )
    .await;
    // The test organization still holds what it was granted.
    app.agent().await;
    assert!(integrity_failures(metrics, "domain_event") > before);
    // The operator's commands say so too, on stderr (with a RUST_LOG that does not read,
    // named rather than dropped).
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentid"))
        .args(["domain", "list", "--database-url", &app.db.url])
        .arg("--signing-key-file")
        .arg(&app.config.signing_key_file)
        .env("RUST_LOG", "agentid=verbose")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("integrity alarm"), "{err}");
    assert!(err.contains("RUST_LOG"), "{err}");
    for sql in [
        "UPDATE domain_events SET org_id = 'org_x' WHERE domain = 'example.com'".to_owned(),
        "DELETE FROM domain_events WHERE domain = 'example.com'".to_owned(),
        format!(
            "INSERT INTO domain_events VALUES ({}, 'hold', 'x.example', '{org_b}', 'dns', 1, 1, NULL, NULL)",
            seq + 10
        ),
        // Sealed or not, an event out of order (before the first, or past a gap) would sort
        // ahead of, or among, what checkpoints committed to: every later one an alarm.
        format!("INSERT INTO domain_events VALUES (0, 'hold', 'x.example', '{org_b}', 'dns', 1, 1, NULL, {forged})"),
        format!(
            "INSERT INTO domain_events VALUES ({}, 'hold', 'x.example', '{org_b}', 'dns', 1, 1, NULL, {forged})",
            seq + 10
        ),
    ] {
        assert!(app.raw_execute(&sql).await.is_err(), "{sql} was let through");
    }
    let (code, out) = audit_verify(&app);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("the key file does not vouch for it"), "{out}");
}

/// Behind the triggers, an unsealed hold numbered ahead of the first event (0 or below) does
/// not pass for one the migration carried over: the forged name counts nowhere.
#[actix_web::test]
async fn a_carried_over_hold_cannot_be_forged_ahead_of_the_first_event() {
    let metrics = agentid::telemetry::metrics_handle();
    let app = spawn_app().await;
    let b = second_org(&app).await;
    let before = integrity_failures(metrics, "domain_event");
    let org_b = &b.org_id;
    crate::helpers::tamper(
        &app,
        &format!(
            "INSERT INTO domain_events VALUES (0, 'hold', 'bank.example', '{org_b}', 'existing', 1, 1, NULL, NULL); \
             INSERT INTO domain_events VALUES (-1, 'hold', 'bank2.example', '{org_b}', 'existing', 1, 1, NULL, NULL)"
        ),
    )
    .await;
    refused_names(&app, &b.keys.secret_live, &["bank.example", "bank2.example"]).await;
    app.agent().await;
    assert!(integrity_failures(metrics, "domain_event") > before);
    let (code, out) = audit_verify(&app);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("the key file does not vouch for it"), "{out}");
}

/// Behind the triggers (the database's owner), a name handed back to its former holder is
/// only detected: the checkpoints committed to the events that moved it, so `audit verify`
/// fails.
#[actix_web::test]
async fn a_name_handed_back_behind_the_triggers_is_caught() {
    let app = spawn_app().await;
    let b = second_org(&app).await;
    // The name moves to B, and a checkpoint commits to that.
    app.grant(&b.org_id, "example.com", true).await.unwrap();
    let registered = app
        .register_with(
            &b.keys.secret_live,
            serde_json::json!({"name": "n", "issuer_domain": "example.com", "scopes": ["read:x"]}),
        )
        .await;
    let token = registered["token"].as_str().unwrap();
    for _ in 0..3 {
        assert_eq!(app.verify(token).await["valid"], true);
    }
    let note = {
        let mut note = String::new();
        for _ in 0..200 {
            note = app
                .get("/v1/log/checkpoint", Some(&b.keys.secret_live))
                .await
                .text();
            if note.lines().nth(1) == Some("3") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        note
    };
    assert!(note.contains("\nagentid-domains "), "{note}");
    // The events that moved the name go.
    crate::helpers::tamper(
        &app,
        "DELETE FROM domain_events WHERE seq > (SELECT MAX(seq) - 2 FROM domain_events)",
    )
    .await;
    let (code, out) = audit_verify(&app);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("who holds a name was rewritten"), "{out}");
}

/// Someone who can write the database plants rows that do not read as issuer-domain events
/// (a MAC of the wrong length, an unknown kind, an unknown proof method): each is ignored for
/// decisions and an alarm, registration under the names and checkpoints go on, and `audit
/// verify` names each as a finding. One at the largest number a row can hold (the next event
/// would be numbered round to a negative number) is refused.
#[actix_web::test]
async fn rows_that_do_not_read_as_domain_events_stop_nothing() {
    let metrics = agentid::telemetry::metrics_handle();
    let app = spawn_app().await;
    let before = integrity_failures(metrics, "domain_event");
    let org = app.org.org_id.clone();
    let (mac, short) = (blob(&app, &[7u8; 32]), blob(&app, &[7u8; 5]));
    let seq = {
        let (_, token) = app.agent().await;
        assert_eq!(app.verify(&token).await["valid"], true);
        covered(&app, 1).await;
        app.store.domain_events().await.unwrap().len() as i64
    };
    for sql in [
        format!("INSERT INTO domain_events VALUES ({}, 'hold', 'example.com', '{org}', 'dns', 1, 1, NULL, {short})", seq + 1),
        format!("INSERT INTO domain_events VALUES ({}, 'seize', 'example.com', '{org}', 'dns', 1, 1, NULL, {mac})", seq + 2),
        format!("INSERT INTO domain_events VALUES ({}, 'hold', 'example.com', '{org}', 'telepathy', 1, 1, NULL, {mac})", seq + 3),
    ] {
        app.raw_execute(&sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    let last = format!(
        "INSERT INTO domain_events VALUES ({}, 'hold', 'a.io', '{org}', 'dns', 1, 1, NULL, {mac})",
        i64::MAX
    );
    assert!(app.raw_execute(&last).await.is_err(), "{last} was let through");
    // Registration under the names, and below them, goes on (it read the rows: 500 before).
    for name in ["example.com", "eu.example.com", "a.io"] {
        app.register(serde_json::json!({"name": "n", "issuer_domain": name, "scopes": ["read:x"]}))
            .await;
    }
    assert!(integrity_failures(metrics, "domain_event") > before);
    // Checkpoints go on (they commit to every row as it is stored).
    let (_, token) = app.agent().await;
    assert_eq!(app.verify(&token).await["valid"], true);
    covered(&app, 2).await;
    // `audit verify` names each row, and aborts on none.
    let (code, out) = audit_verify(&app);
    assert_eq!(code, Some(1), "{out}");
    assert!(!out.contains("corrupt stored value"), "{out}");
    for s in [seq + 1, seq + 2, seq + 3] {
        assert!(out.contains(&format!("issuer-domain event {s} (")), "{s}: {out}");
    }
    assert!(out.contains("none the service writes"), "{out}");
}

/// A name changes hands while nothing else is recorded. The service's own ledger records
/// that the issuer-domain list grew, and its checkpoint commits to the longer list; so when
/// the events that moved the name are deleted, the instance alarms (the list reads shorter
/// than before) and `audit verify` fails. Before, no checkpoint was made without a new
/// record, and both stayed silent.
#[actix_web::test]
async fn a_name_moved_while_nothing_else_is_recorded_cannot_be_handed_back() {
    let metrics = agentid::telemetry::metrics_handle();
    let app = spawn_app().await;
    let b = second_org(&app).await;
    app.grant(&b.org_id, "example.com", true).await.unwrap();
    let rows = app.store.domain_list_size().await.unwrap().rows;
    let service = agentid::domain::Ledger::service();
    let mut committed = false;
    for _ in 0..200 {
        let checkpoints = app.store.checkpoints(&service).await.unwrap();
        if checkpoints
            .iter()
            .any(|c| c.note.contains(&format!("\nagentid-domains {rows} ")))
        {
            committed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        committed,
        "no checkpoint of the service's ledger commits to {rows} events"
    );
    let before = integrity_failures(metrics, "domain_list");
    crate::helpers::tamper(
        &app,
        "DELETE FROM domain_events WHERE seq > (SELECT MAX(seq) - 2 FROM domain_events)",
    )
    .await;
    let mut alarmed = false;
    for _ in 0..200 {
        if integrity_failures(metrics, "domain_list") > before {
            alarmed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(alarmed, "the instance did not see the list go shorter");
    let (code, out) = audit_verify(&app);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("who holds a name was rewritten"), "{out}");
}

/// Attack: log rows as the service never writes them. The database refuses a checkpoint row
/// that does not decode or is dated ahead, and an audit block before seq 1. Past its
/// triggers, a row that does not decode no longer fails every read of the ledger's
/// checkpoints (no checkpoint more, the log's endpoints 500), and a replayed note of the empty
/// tree dated far ahead no longer holds the checkpointer off the ledger.
#[actix_web::test]
async fn log_rows_the_service_never_writes_neither_stop_nor_hide() {
    use agentid::domain::{KeyMode, Ledger};
    use agentid::engine::transparency::checkpointer::Step;
    use base64::Engine as _;
    let app = crate::helpers::spawn_app_with(crate::helpers::Options {
        tweak: Box::new(|c| c.engine.checkpoint_interval = Duration::from_secs(3600)),
        ..Default::default()
    })
    .await;
    let empty = app.get("/v1/log/checkpoint", Some(app.secret())).await.text();
    assert_eq!(empty.lines().nth(1), Some("0"), "{empty}");
    records(&app, 5).await;
    let org = app.org.org_id.clone();
    let row = |size: i64, root: &[u8], note: &str, at: i64| {
        format!(
            "INSERT INTO audit_checkpoints (org_id, mode, tree_size, root, note, created_at) \
             VALUES ('{org}', 'live', {size}, {}, '{note}', {at})",
            blob(&app, root)
        )
    };
    let ahead = Millis::now().0 + 3_600_000;
    for sql in [
        row(3, &[1], "junk", 1),
        row(-1, &[1; 32], "junk", 1),
        row(3, &[1; 32], "junk", ahead),
        row(3, &[1; 32], "junk", -5),
    ] {
        let err = app.refused(&sql).await;
        assert!(err.contains("a checkpoint has"), "{sql}: {err}");
    }
    let block = format!(
        "INSERT INTO audit_blocks (org_id, mode, first_seq, last_seq, prev_hash, last_hash, results, \
         n_valid, n_invalid, n_expired, n_revoked, records, mac) SELECT org_id, mode, -9, -1, \
         prev_hash, last_hash, results, n_valid, n_invalid, n_expired, n_revoked, records, mac \
         FROM audit_blocks WHERE org_id = '{org}' AND mode = 'live' ORDER BY first_seq DESC LIMIT 1"
    );
    let err = app.refused(&block).await;
    assert!(err.contains("from seq 1 on"), "{err}");
    // Past the triggers: a root of one byte, and the empty tree's note, replayed, far ahead.
    let root = base64::engine::general_purpose::STANDARD
        .decode(empty.lines().nth(2).unwrap())
        .unwrap();
    crate::helpers::tamper(&app, &row(3, &[1], "junk", 1)).await;
    crate::helpers::tamper(&app, &row(0, &root, &empty, 9_000_000_000_000_000)).await;
    if !app.db.is_postgres() {
        // SQLite keeps a value of any type: a size that is text, a note that is a blob.
        let typed = format!(
            "INSERT INTO audit_checkpoints (org_id, mode, tree_size, root, note, created_at) \
             VALUES ('{org}', 'live', 'x', {root}, 'junk', 1), ('{org}', 'live', 2, {root}, X'00', 1)",
            root = blob(&app, &[1; 32])
        );
        crate::helpers::tamper(&app, &typed).await;
    }
    let ledger = Ledger {
        org_id: org.clone(),
        mode: KeyMode::Live,
    };
    assert_eq!(
        app.engine.transparency().checkpoint(&ledger).await.unwrap(),
        Step::Done
    );
    assert_eq!(checkpointed(&app).await, 5);
    // A block before seq 1, past the triggers: `audit verify` names it.
    crate::helpers::tamper(&app, &block).await;
    let (code, out) = audit_verify(&app);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("start before record 1"), "{out}");
}

/// The upgrade that brings seals, on a database that holds keys: its migration marks them,
/// the first start seals them, and they keep opening what they opened.
#[actix_web::test]
async fn an_upgrade_seals_the_keys_it_finds() {
    use agentid::engine::outbound::{Outbound, OutboundConfig};
    use agentid::engine::KeyLookup;
    let dir = tempfile::tempdir().unwrap();
    let db = crate::helpers::TestDb::new(dir.path()).await;
    let org = "org_01eeeeeeeeeeeeeeeeeeeeeeee";
    let key = format!("sk_live_{}", "D".repeat(40));
    let hash: String = agentid::engine::hash_key(&key)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let hash = if db.is_postgres() {
        format!("'\\x{hash}'::bytea")
    } else {
        format!("X'{hash}'")
    };
    let stmts = [
        format!(
            "INSERT INTO orgs (id, name, plan, verify_limit, other_limit, max_expiry_seconds, created_at) \
             VALUES ('{org}', 'o', 'developer', 1000, 100, 2592000, 1)"
        ),
        format!(
            "INSERT INTO api_keys (key_hash, org_id, kind, mode, hint, created_at, id) \
             VALUES ({hash}, '{org}', 'secret', 'live', 'sk_live_…DDDD', 1, 'key_before')"
        ),
    ];
    // The schema before seals, and a key in it.
    db.at_schema(41, &stmts).await;
    let config = crate::helpers::test_config(&db.url, dir.path().join("signing-key.pem"));
    let app = agentid::Application::build_with(config, Outbound::new(OutboundConfig::default()))
        .await
        .expect("the upgraded database opens");
    let found = app
        .engine()
        .authenticate(&key, [127, 0, 0, 1].into())
        .await
        .unwrap();
    assert!(matches!(found, KeyLookup::Valid(_)), "{found:?}");
}
