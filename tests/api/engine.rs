//! The verify engine under stress: revocation racing verifies, crashes, store outages,
//! a crashing writer, and cold signature checks.

use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use crate::helpers::{spawn_app_with, Options, TestApp};

#[actix_web::test]
async fn after_revoke_answers_no_verification_is_valid() {
    let app = Rc::new(spawn_app_with(Options::unlimited()).await);
    let (id, token) = app.agent().await;
    let revoked = Arc::new(AtomicBool::new(false));
    let violations = Arc::new(AtomicUsize::new(0));
    let after = Arc::new(AtomicUsize::new(0));
    let mut loops = Vec::new();
    for _ in 0..8 {
        let (app, token, revoked, violations, after) = (
            app.clone(),
            token.clone(),
            revoked.clone(),
            violations.clone(),
            after.clone(),
        );
        loops.push(actix_web::rt::spawn(async move {
            let mut since_revoke = 0;
            while since_revoke < 25 {
                // Read the flag before sending: a request sent after revoke answered.
                let sent_after_revoke = revoked.load(Ordering::SeqCst);
                let res = app.verify_as_receiver(&token).await;
                assert_eq!(res.status, 200, "{}", res.text());
                let valid = res.json()["valid"] == true;
                if sent_after_revoke {
                    since_revoke += 1;
                    after.fetch_add(1, Ordering::SeqCst);
                    if valid {
                        violations.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
        }));
    }
    actix_web::rt::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(app.revoke(&id, Some("race")).await.status, 200);
    revoked.store(true, Ordering::SeqCst);
    for l in loops {
        l.await.unwrap();
    }
    assert!(after.load(Ordering::SeqCst) >= 200);
    assert_eq!(
        violations.load(Ordering::SeqCst),
        0,
        "valid:true after revoke answered"
    );
}

/// A token of an agent this instance does not hold in memory (registered through another
/// instance) makes verify read the agent from the store. When that read fails, verify has no
/// outcome to tell: it must not answer `TOKEN_INVALID` for a token that may be valid, nor
/// record one. (A corrupt row stands in for any failed read; an unreachable store answers
/// 503 `AUDIT_UNAVAILABLE` by the same path.)
#[actix_web::test]
async fn a_verify_whose_agent_cannot_be_read_answers_an_error_not_invalid() {
    use agentid::domain::Millis;
    let app = spawn_app_with(Options::unlimited()).await;
    let now = Millis::now();
    let id = format!("agt_{}", ulid::Ulid::new().to_string().to_lowercase());
    let mut remote = crate::store::agent(&id, &app.org.org_id);
    remote.expires_at = Millis(now.0 + 3_600_000);
    // Another instance's registration: straight into the database.
    crate::helpers::insert_agent(&app.db.url, &remote).await.unwrap();
    let token = app.engine.keys().sign(&agentid::token::Claims::agent(
        "example.com",
        &id,
        "j1",
        now.as_secs(),
        now.as_secs() + 3600,
        vec!["read:x".into()],
    ));
    assert!(app.engine.registry().agent(&id).is_none(), "not known here");
    let set_scopes = |v: &str| format!("UPDATE agents SET scopes = '{v}' WHERE id = '{id}'");
    app.raw_execute(&set_scopes("not json")).await.unwrap();
    app.verify_as_receiver(&token)
        .await
        .assert_error(500, "INTERNAL_ERROR");
    let log = app.log("").await;
    assert_eq!(log["pagination"]["total"], 0, "nothing recorded: {log}");

    // Readable again: the same token verifies, and only that verification is recorded.
    app.raw_execute(&set_scopes(r#"["read:x"]"#)).await.unwrap();
    assert_eq!(app.verify_as_receiver(&token).await.json()["valid"], true);
    let log = app.log("").await;
    assert_eq!(log["pagination"]["total"], 1, "{log}");
    assert_eq!(log["data"][0]["agent_id"], id.as_str());
}

/// A forged token naming an agent this instance does not hold (registered through another
/// instance) is recorded in that agent's organization's ledger, as it would be for an agent
/// registered here: the owner sees the forgery attempt.
#[actix_web::test]
async fn a_forgery_naming_an_agent_registered_elsewhere_lands_in_its_owners_ledger() {
    use agentid::domain::Millis;
    let app = spawn_app_with(Options::unlimited()).await;
    let id = format!("agt_{}", ulid::Ulid::new().to_string().to_lowercase());
    let mut remote = crate::store::agent(&id, &app.org.org_id);
    remote.expires_at = Millis(Millis::now().0 + 3_600_000);
    // Another instance's registration: straight into the database.
    crate::helpers::insert_agent(&app.db.url, &remote).await.unwrap();
    assert!(app.engine.registry().agent(&id).is_none(), "not known here");
    let now = Millis::now().as_secs();
    let claims = json!({"iss": "example.com", "sub": id, "jti": "j", "iat": now, "exp": now + 3600, "scopes": ["read:x"]});
    let header = json!({"alg": "EdDSA", "typ": "JWT", "kid": app.engine.keys().kid()});
    let stranger = ed25519_dalek::SigningKey::from_bytes(&[9; 32]);
    let forged = crate::tokens::sign_raw(&stranger, &header.to_string(), &claims.to_string());
    let answer = app.verify_as_receiver(&forged).await.json();
    assert_eq!(answer, json!({"valid": false, "error": "TOKEN_INVALID"}));
    let log = app.log("").await;
    assert_eq!(log["pagination"]["total"], 1, "{log}");
    assert_eq!(log["data"][0]["agent_id"], id.as_str());
    assert_eq!(log["data"][0]["result"], "invalid");
}

/// A revocation this instance did not make (another instance's; an older binary's or a
/// hand-written UPDATE takes the same path) is not in its index, so its checks pass: the
/// audit statement must catch it on the very next verify. The revocation epoch lets batches
/// skip that look-up only while nothing was revoked beyond what the index holds.
#[actix_web::test]
async fn a_revocation_made_elsewhere_is_honoured_on_the_next_verify() {
    // The resync must not learn the revocation between the revoke and the verify: the verify
    // follows a resync that has just run, a whole interval before the next.
    let resync = Duration::from_secs(2);
    let app = spawn_app_with(Options {
        tweak: Box::new(move |c| c.engine.registry_resync = resync),
        ..Options::unlimited()
    })
    .await;
    let registry = app.engine.registry();
    let (local, local_token) = app.agent().await;
    let (remote, remote_token) = app.agent().await;
    let (_, bystander_token) = app.agent().await;
    let (earlier, _) = app.agent().await;
    for t in [&local_token, &remote_token, &bystander_token] {
        assert_eq!(app.verify_as_receiver(t).await.json()["valid"], true);
    }
    assert_eq!(app.revoke(&local, Some("here")).await.status, 200);
    assert_eq!(
        registry.revocations_seen(),
        1,
        "a revoke answers after its epoch is in the watermark"
    );

    let other = agentid::store::connect(&app.db.url, &Default::default())
        .await
        .unwrap();
    let revoke_elsewhere = |id: String, reason: &'static str| {
        let other = &other;
        async move {
            let (_, epoch) = other
                .revoke_agent(
                    &crate::helpers::agent_id(&id),
                    agentid::domain::Millis::now(),
                    Some(reason),
                )
                .await
                .unwrap()
                .unwrap();
            epoch
        }
    };
    // A revocation elsewhere that the resync learns: it has just run when the index has it.
    assert_eq!(revoke_elsewhere(earlier.clone(), "earlier").await, Some(2));
    let waited = std::time::Instant::now();
    while registry.revocations_seen() < 2 {
        assert!(waited.elapsed() < 3 * resync, "the resync never learned it");
        actix_web::rt::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(registry.is_revoked(&earlier));
    assert_eq!(revoke_elsewhere(remote.clone(), "elsewhere").await, Some(3));
    assert!(!registry.is_revoked(&remote), "not known here yet");
    let res = app.verify_as_receiver(&remote_token).await;
    assert_eq!(res.json(), json!({"valid": false, "error": "TOKEN_REVOKED"}));
    assert_eq!(
        app.verify_as_receiver(&bystander_token).await.json()["valid"],
        true
    );
    let log = app
        .get(&format!("/v1/log?agent_id={remote}&limit=1"), Some(app.secret()))
        .await
        .json();
    assert_eq!(log["data"][0]["result"], "revoked");
    assert_eq!(log["data"][0]["failure_reason"], "agent revoked: elsewhere");

    // The resync brings the watermark to the store's epoch; batches skip the look-ups again.
    for _ in 0..50 {
        if registry.revocations_seen() == 3 {
            break;
        }
        actix_web::rt::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(registry.revocations_seen(), 3);
    for t in [&local_token, &remote_token] {
        assert_eq!(app.verify_as_receiver(t).await.json()["valid"], false);
    }
    assert_eq!(
        app.verify_as_receiver(&bystander_token).await.json()["valid"],
        true
    );
    other.close().await;
}

#[actix_web::test]
async fn a_crashing_writer_is_restarted_and_loses_no_acknowledged_record() {
    let app = spawn_app_with(Options::unlimited()).await;
    let (id, token) = app.agent().await;
    let mut answered = 0;
    for _ in 0..3 {
        assert_eq!(app.verify_as_receiver(&token).await.json()["valid"], true);
        answered += 1;
    }
    assert!(app.store.inject_write_fault(agentid::store::WriteFault::Panic));
    // The batch whose flush crashes is answered 503: nothing unrecorded is acknowledged. It
    // says when to try again.
    let res = app.verify_as_receiver(&token).await;
    res.assert_error(503, "AUDIT_UNAVAILABLE");
    assert_eq!(res.header("retry-after").as_deref(), Some("1"));
    // The writer went on; verification works again.
    for _ in 0..3 {
        assert_eq!(app.verify_as_receiver(&token).await.json()["valid"], true);
        answered += 1;
    }
    let log = app.log(&format!("?agent_id={id}")).await;
    assert_eq!(log["pagination"]["total"], answered);
    app.log_holds().await;
}

/// One verification whose flush waits for the write lock (held until the returned lock is
/// released), and one queued behind it whose flush will crash: both still unanswered.
async fn a_crash_behind_a_slow_flush(
    app: &Rc<TestApp>,
    token: &str,
) -> (
    WriteLock,
    impl std::future::Future<Output = Vec<crate::helpers::Resp>>,
    impl std::future::Future<Output = Vec<crate::helpers::Resp>>,
) {
    let lock = WriteLock::take(&app.db).await;
    let (first, first_answered) = verify_burst(app, token, 1);
    actix_web::rt::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(first_answered.get(), 0, "its flush waits for the lock");
    assert!(app.store.inject_write_fault(agentid::store::WriteFault::Panic));
    let (crashing, _) = verify_burst(app, token, 1);
    actix_web::rt::time::sleep(Duration::from_millis(100)).await;
    (lock, first, crashing)
}

/// Entries queued behind a batch whose flush crashes are not lost with it: the restarted
/// writer takes the same queue. With one entry a batch, the first flush waits on the store,
/// the second crashes, and the eight behind them are written after the restart.
#[actix_web::test]
async fn a_writer_restarted_after_a_crash_writes_what_was_queued_behind_it() {
    let app = Rc::new(
        spawn_app_with(Options {
            tweak: Box::new(|c| c.engine.writer.max_batch = 1),
            ..Options::unlimited()
        })
        .await,
    );
    let (id, token) = app.agent().await;
    let (lock, first, crashing) = a_crash_behind_a_slow_flush(&app, &token).await;
    let (behind, _) = verify_burst(&app, &token, 8);
    actix_web::rt::time::sleep(Duration::from_millis(100)).await;
    lock.release().await;

    let first = within("the first verification", first).await;
    assert_eq!(first[0].json()["valid"], true, "{}", first[0].text());
    within("the crashed batch", crashing).await[0].assert_error(503, "AUDIT_UNAVAILABLE");
    for res in within("the queued verifications", behind).await {
        assert_eq!(res.status, 200, "{}", res.text());
        assert_eq!(res.json()["valid"], true);
    }
    let log = app.log(&format!("?agent_id={id}")).await;
    assert_eq!(log["pagination"]["total"], 9, "{log}");
    app.log_holds().await;
}

/// `n` verifications of `token`, sent at once; their answers once all are in.
fn verify_burst(
    app: &Rc<TestApp>,
    token: &str,
    n: usize,
) -> (
    impl std::future::Future<Output = Vec<crate::helpers::Resp>>,
    Rc<std::cell::Cell<usize>>,
) {
    let answered = Rc::new(std::cell::Cell::new(0));
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (app, token, answered) = (app.clone(), token.to_owned(), answered.clone());
            actix_web::rt::spawn(async move {
                let res = app.verify_as_receiver(&token).await;
                answered.set(answered.get() + 1);
                res
            })
        })
        .collect();
    let all = async move {
        let mut answers = Vec::new();
        for t in tasks {
            answers.push(t.await.unwrap());
        }
        answers
    };
    (all, answered)
}

/// `fut`'s output, failing the test if it takes over 20 s (a request left waiting).
async fn within<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    actix_web::rt::time::timeout(Duration::from_secs(20), fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer within 20 s"))
}

/// Another connection's transaction holding the audit log's write lock, until `release`.
enum WriteLock {
    Pg(sqlx::PgConnection),
    Sqlite(sqlx::SqliteConnection),
}

impl WriteLock {
    async fn take(db: &crate::helpers::TestDb) -> WriteLock {
        use sqlx::{Connection, Executor};
        if db.is_postgres() {
            let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
            c.execute("BEGIN").await.unwrap();
            c.execute("LOCK TABLE audit_blocks IN EXCLUSIVE MODE")
                .await
                .unwrap();
            WriteLock::Pg(c)
        } else {
            let mut c = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
            c.execute("BEGIN IMMEDIATE").await.unwrap();
            WriteLock::Sqlite(c)
        }
    }

    async fn release(self) {
        use sqlx::Executor;
        match self {
            WriteLock::Pg(mut c) => c.execute("ROLLBACK").await.map(drop),
            WriteLock::Sqlite(mut c) => c.execute("ROLLBACK").await.map(drop),
        }
        .unwrap();
    }
}

/// A drain (what a graceful stop waits for) that waits for a batch whose flush crashes is
/// answered by the restarted writer once nothing is left to write, not left waiting.
#[actix_web::test]
async fn a_drain_waiting_for_a_crashed_batch_is_answered() {
    let app = Rc::new(spawn_app_with(Options::unlimited()).await);
    let (_, token) = app.agent().await;
    let (lock, first, crashing) = a_crash_behind_a_slow_flush(&app, &token).await;
    let engine = app.engine.clone();
    let drain = actix_web::rt::spawn(async move { engine.drain().await });
    actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    assert!(!drain.is_finished(), "the drain waits for both batches");
    lock.release().await;

    assert_eq!(within("the first", first).await[0].json()["valid"], true);
    within("the crashed batch", crashing).await[0].assert_error(503, "AUDIT_UNAVAILABLE");
    within("the drain", drain).await.unwrap();
    assert_eq!(app.verify_as_receiver(&token).await.json()["valid"], true);
}

/// Group commit and drain: while one flush waits for the store, the verifications that
/// arrive queue behind it and go out together in the next batch; a drain (what a graceful
/// stop waits for) answers only once all of them are committed, and each has its record.
#[actix_web::test]
async fn verifications_queued_behind_a_slow_flush_commit_together_before_a_drain_answers() {
    let app = Rc::new(spawn_app_with(Options::unlimited()).await);
    let (id, token) = app.agent().await;
    assert_eq!(app.verify_as_receiver(&token).await.json()["valid"], true);

    let lock = WriteLock::take(&app.db).await;
    let (first, first_answered) = verify_burst(&app, &token, 1);
    actix_web::rt::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(first_answered.get(), 0, "its flush waits for the lock");
    let (queued, queued_answered) = verify_burst(&app, &token, 30);
    actix_web::rt::time::sleep(Duration::from_millis(200)).await;
    let engine = app.engine.clone();
    let drain = actix_web::rt::spawn(async move { engine.drain().await });
    actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    assert!(!drain.is_finished(), "the drain waits for the flush in flight");
    assert_eq!(queued_answered.get(), 0, "queued behind it");

    lock.release().await;
    within("the drain", drain).await.unwrap();
    let answers = within("the verifications", async { (first.await, queued.await) }).await;
    for res in answers.0.iter().chain(&answers.1) {
        assert_eq!(res.status, 200, "{}", res.text());
        assert_eq!(res.json()["valid"], true);
    }
    let log = app.log(&format!("?agent_id={id}")).await;
    assert_eq!(log["pagination"]["total"], 32, "{log}");
    app.log_holds().await;
}

/// Registers an agent and mints `n` extra tokens for it with issue-token.
async fn cold_tokens(app: &TestApp, n: usize) -> (String, Vec<String>) {
    let (id, first) = app.agent().await;
    let mut tokens = vec![first];
    for _ in 1..n {
        let res = app
            .post(&format!("/v1/agents/{id}/issue-token"), Some(app.secret()), None)
            .await;
        assert_eq!(res.status, 201);
        tokens.push(res.json()["token"].as_str().unwrap().to_owned());
    }
    (id, tokens)
}

/// Cold tokens (the cache off, so each is decoded and checked) verified all at once: exactly
/// the one signed by another key under the service's `kid` is refused.
#[actix_web::test]
async fn among_cold_tokens_exactly_the_forged_one_is_refused() {
    let app = Rc::new(
        spawn_app_with(Options {
            tweak: Box::new(|c| c.engine.token_cache_bytes = 0),
            ..Options::unlimited()
        })
        .await,
    );
    let (_, mut tokens) = cold_tokens(&app, 24).await;
    let key = crate::tokens::server_key(&app);
    let stranger = ed25519_dalek::SigningKey::from_bytes(&[5; 32]);
    let forged_index = 11;
    let original = tokens[forged_index].clone();
    let (h, p) = {
        let mut parts = original.split('.');
        (parts.next().unwrap().to_owned(), parts.next().unwrap().to_owned())
    };
    let header = String::from_utf8(base64_decode(&h)).unwrap();
    let payload = String::from_utf8(base64_decode(&p)).unwrap();
    tokens[forged_index] = crate::tokens::sign_raw(&stranger, &header, &payload);
    assert_ne!(
        crate::tokens::sign_raw(&key, &header, &payload),
        tokens[forged_index]
    );

    let answers = futures_util::future::join_all(tokens.iter().map(|t| {
        let app = app.clone();
        let t = t.clone();
        async move { app.verify_as_receiver(&t).await.json() }
    }))
    .await;
    for (i, answer) in answers.iter().enumerate() {
        if i == forged_index {
            assert_eq!(*answer, json!({"valid": false, "error": "TOKEN_INVALID"}));
        } else {
            assert_eq!(answer["valid"], true, "token {i}: {answer}");
        }
    }
}

fn base64_decode(s: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s)
        .unwrap()
}

#[actix_web::test]
async fn cached_tokens_still_expire_and_are_still_revoked() {
    let app = spawn_app_with(Options::unlimited()).await;
    let a = app
        .register(
            json!({"name": "n", "issuer_domain": "example.com", "scopes": ["read:x"], "expiry_seconds": 2}),
        )
        .await;
    let token = a["token"].as_str().unwrap();
    assert_eq!(app.verify(token).await["valid"], true); // now cached
    actix_web::rt::time::sleep(Duration::from_millis(2100)).await;
    assert_eq!(app.verify(token).await["error"], "TOKEN_EXPIRED");
    let (id, token) = app.agent().await;
    assert_eq!(app.verify(&token).await["valid"], true);
    app.revoke(&id, None).await;
    assert_eq!(app.verify(&token).await["error"], "TOKEN_REVOKED");
}

#[actix_web::test]
async fn a_store_outage_fails_verify_closed_and_recovery_needs_no_restart() {
    let Some((proxy, app)) = crate::proxy::app_behind_proxy().await else {
        return;
    };
    let (id, token) = app.agent().await;
    let mut valid_answers = 0;
    for _ in 0..3 {
        assert_eq!(app.verify_as_receiver(&token).await.json()["valid"], true);
        valid_answers += 1;
    }

    proxy.cut();
    for _ in 0..3 {
        let res = app.verify_as_receiver(&token).await;
        res.assert_error(503, "AUDIT_UNAVAILABLE");
    }

    proxy.restore();
    let mut recovered = false;
    for _ in 0..20 {
        let res = app.verify_as_receiver(&token).await;
        match res.status {
            200 => {
                assert_eq!(res.json()["valid"], true);
                valid_answers += 1;
                recovered = true;
                break;
            }
            503 => {
                res.assert_error(503, "AUDIT_UNAVAILABLE");
                actix_web::rt::time::sleep(Duration::from_millis(250)).await;
            }
            other => panic!("unexpected {other}: {}", res.text()),
        }
    }
    assert!(recovered, "verify did not recover after the store came back");
    let log = app.log(&format!("?agent_id={id}&result=valid")).await;
    assert_eq!(
        log["pagination"]["total"], valid_answers,
        "every valid answer has its record"
    );
}

#[actix_web::test]
async fn kill_9_loses_no_answered_verification_and_chains_hold() {
    let dir = tempfile::tempdir().unwrap();
    let db = crate::helpers::TestDb::new(dir.path()).await;
    let server = crate::cli::start_server(dir.path(), Some(&db.url), &[]);
    let (secret, publishable) = (
        server.printed_key("secret_live"),
        server.printed_key("publishable_live"),
    );
    let client = crate::helpers::client();
    let mut agents = Vec::new();
    for i in 0..3 {
        agents.push(server.register(&secret, &format!("a{i}")).await);
    }

    // Verifiers hammer the server; each counts the answers it got, per agent.
    let stop = Arc::new(AtomicBool::new(false));
    let answered: Vec<Arc<AtomicUsize>> = agents.iter().map(|_| Arc::new(AtomicUsize::new(0))).collect();
    let loops: Vec<_> = (0..12)
        .map(|w| {
            let i = w % agents.len();
            crate::cli::hammer(
                server.base.clone(),
                agents[i].1.clone(),
                publishable.clone(),
                stop.clone(),
                answered[i].clone(),
            )
        })
        .collect();
    actix_web::rt::time::sleep(Duration::from_millis(1500)).await;
    let mut server = server;
    server.child.kill().unwrap(); // SIGKILL: no drain, no goodbye
    server.child.wait().unwrap();
    stop.store(true, Ordering::SeqCst);
    for l in loops {
        let _ = l.await;
    }
    let total: usize = answered.iter().map(|a| a.load(Ordering::SeqCst)).sum();
    assert!(total > 50, "the load ran ({total} answers)");

    // Read the store directly: every answered verification has its record.
    let store = agentid::store::connect(&db.url, &Default::default())
        .await
        .unwrap();
    for (i, (agent_id, _)) in agents.iter().enumerate() {
        let agent = store
            .get_agent(&crate::helpers::agent_id(agent_id))
            .await
            .unwrap()
            .unwrap();
        let page = store
            .read_log(agentid::store::LogQuery {
                ledger: &agent.ledger(),
                agent_id: Some(agent_id),
                result: None,
                before_seq: None,
                limit: 1,
            })
            .await
            .unwrap();
        let got = answered[i].load(Ordering::SeqCst) as i64;
        assert!(
            page.total >= got,
            "agent {i}: {} records for {got} answers",
            page.total
        );
        assert!(agent.verification_count >= got);
    }

    // And the service starts again on the same data, whose log holds.
    let again = crate::cli::start_server(dir.path(), Some(&db.url), &[]);
    let key = crate::helpers::read(
        client
            .get(format!("{}/.well-known/log-key", again.base))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let verifier = agentid::tlog::note::LogVerifier::parse(&key.text()).unwrap();
    let keys = agentid::keys::KeyRing::load(&dir.path().join("data/signing-key.pem")).unwrap();
    assert!(keys.is_some(), "the server's key file");
    let report = crate::helpers::log_holds(&store, &verifier, keys.as_ref()).await;
    assert!(!report.ledgers.is_empty());
    store.close().await;
    let res = crate::helpers::read(
        client
            .get(format!("{}/v1/verify/{}", again.base, agents[0].1))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(res.json()["valid"], true);
}

/// Attack: an issuer registering agents without end, to fill the service's memory. The
/// registry holds agents within its byte budget (here too small for one, and for its
/// overflow cache); one registered past it is not held, and is read from the store at each
/// verification: valid, with its name and description, and revoked at once when revoked,
/// after a restart as before, with the reason given.
#[actix_web::test]
async fn agents_past_the_registrys_budget_are_not_held_and_still_verify() {
    let app = spawn_app_with(Options {
        tweak: Box::new(|c| c.engine.registry_bytes = 1),
        ..Options::unlimited()
    })
    .await;
    let body = json!({"name": "far", "issuer_domain": "example.com", "scopes": ["read:x"],
                      "description": "past the budget"});
    let a = app.register(body).await;
    let (id, token) = (a["agent_id"].as_str().unwrap(), a["token"].as_str().unwrap());
    assert!(app.engine.registry().agent(id).is_none(), "held past the budget");
    for _ in 0..2 {
        let v = app.verify(token).await;
        assert_eq!(v["valid"], true, "{v}");
        assert_eq!(
            (&v["name"], &v["description"]),
            (&json!("far"), &json!("past the budget")),
            "{v}"
        );
    }
    assert!(app.engine.registry().agent(id).is_none(), "held once verified");
    let app = app.restart().await;
    assert!(app.engine.registry().agent(id).is_none(), "held once loaded");
    assert_eq!(app.verify(token).await["valid"], true);
    assert_eq!(app.revoke(id, Some("key leaked")).await.status, 200);
    // Its reason is past the budget too: the store says it, before a restart and after.
    assert_eq!(app.engine.registry().revocation_reason(id), None);
    let mut app = app;
    for restarted in [false, true] {
        if restarted {
            app = app.restart().await;
        }
        assert!(app.engine.registry().is_revoked(id));
        let v = app.verify(token).await;
        assert_eq!(
            (&v["valid"], &v["error"]),
            (&json!(false), &json!("TOKEN_REVOKED")),
            "{v}"
        );
        let log = app.log(&format!("?agent_id={id}&limit=1")).await;
        assert_eq!(
            log["data"][0]["failure_reason"], "agent revoked: key leaked",
            "{log}"
        );
    }
}
