//! The Shared Signals outbox under a hostile or careless owner: its bound holds for every
//! stream whatever its delivery method and state, the deliverer's look for due streams does
//! not grow with the events waiting, the stream limit holds under concurrency, a receiver's
//! refusal cannot write the service's log, and an event queued while another instance
//! settles its stream stays due.

use std::time::{Duration, Instant};

use actix_web::{web, App, HttpResponse, HttpServer};
use serde_json::json;

use agentid::domain::{KeyMode, Millis};
use agentid::store::StreamRecord;

use crate::helpers::{client, read, spawn_app, TestApp};

const PUSH: &str = "urn:ietf:rfc:8935";
const POLL: &str = "urn:ietf:rfc:8936";

fn stream(app: &TestApp, id: &str, method: &str, status: &str) -> StreamRecord {
    StreamRecord {
        id: crate::helpers::stream_id(id),
        org_id: crate::helpers::org_id(&app.org.org_id),
        mode: KeyMode::Live,
        aud: "a".into(),
        method: method.into(),
        endpoint_url: (method == PUSH).then(|| "https://partner.example/events".into()),
        poll_token_hash: None,
        events_requested: Vec::new(),
        revocations: true,
        description: None,
        status: status.into(),
        created_at: Millis(1),
    }
}

/// Fills stream `id` with `n` events due at once, as `n` writes through the store would
/// (written in one statement: the bound, not the filling, is under test).
async fn fill(app: &TestApp, id: &str, n: i64) {
    let sid = crate::helpers::stream_id(id);
    app.raw_execute(&format!(
        "INSERT INTO ssf_events (stream_id, jti, kind, state, event_at, next_attempt_at) \
         SELECT '{sid}', '{id}-' || CAST(g.n AS TEXT), 'verification', NULL, 1000, 1000 \
         FROM {}",
        if app.db.is_postgres() {
            format!("generate_series(1, {n}) AS g(n)")
        } else {
            format!("(WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < {n}) SELECT n FROM s) g")
        }
    ))
    .await
    .unwrap();
    app.raw_execute(&format!(
        "UPDATE ssf_streams SET pending = pending + {n}, next_due_at = 1000 WHERE id = '{sid}'"
    ))
    .await
    .unwrap();
}

/// A paused push stream and a poll stream nobody polls both stop at 10,000 events: each
/// event past that drops the stream's oldest, and is counted. (Before, only an enabled push
/// stream's deliverer trimmed its queue: these grew without end.)
#[actix_web::test]
async fn every_stream_is_owed_at_most_ten_thousand_events_whatever_its_state() {
    let app = spawn_app().await;
    let s = &app.store;
    for (id, method, status) in [("ssf_paused", PUSH, "paused"), ("ssf_polled", POLL, "enabled")] {
        assert!(s
            .insert_stream(&stream(&app, id, method, status), 10)
            .await
            .unwrap());
        fill(&app, id, 9_998).await;
        for i in 0..5 {
            s.add_verification(
                &crate::helpers::stream_id(id),
                Some(&format!("late {i}")),
                Millis(2000 + i),
            )
            .await
            .unwrap();
        }
        let events = s
            .pending_events(&crate::helpers::stream_id(id), 20_000)
            .await
            .unwrap();
        assert_eq!(events.len(), 10_000, "{id}");
        assert_eq!(
            events[0].jti,
            format!("{id}-4"),
            "{id}: the three oldest went first"
        );
        assert_eq!(events.last().unwrap().state.as_deref(), Some("late 4"), "{id}");
    }
    assert_eq!(s.outbox_totals().await.unwrap(), (20_000, 6));

    // A revocation is written under the same bound.
    let agent = crate::store::agent("agt_01bbbbbbbbbbbbbbbbbbbbbbbb", &app.org.org_id);
    crate::helpers::insert_agent(&app.db.url, &agent).await.unwrap();
    s.revoke_agent(&agent.id, Millis(3000), None).await.unwrap();
    for id in ["ssf_paused", "ssf_polled"] {
        let events = s
            .pending_events(&crate::helpers::stream_id(id), 20_000)
            .await
            .unwrap();
        assert_eq!(events.len(), 10_000, "{id}");
        assert_eq!(
            events.last().unwrap().agent_id.as_deref(),
            Some(agent.id.as_str())
        );
    }
    assert_eq!(s.outbox_totals().await.unwrap(), (20_000, 8));

    // Acknowledged and disabled: deleted, and counted off.
    let acked = s
        .ack_events(
            &crate::helpers::stream_id("ssf_polled"),
            &["ssf_polled-5".into(), "ssf_polled-6".into(), "no such".into()],
        )
        .await
        .unwrap();
    assert_eq!(acked, 2);
    assert!(s
        .set_stream_status(&crate::helpers::stream_id("ssf_paused"), "disabled")
        .await
        .unwrap());
    assert_eq!(s.outbox_totals().await.unwrap(), (9_998, 8));
    assert!(s
        .pending_events(&crate::helpers::stream_id("ssf_paused"), 10)
        .await
        .unwrap()
        .is_empty());
}

/// A disabled stream holds nothing for later: a verification queued as it is disabled (the
/// engine read its status before) is not kept. (It was queued, and sent once the stream was
/// enabled again.)
#[actix_web::test]
async fn a_disabled_stream_takes_no_verification_from_a_late_writer() {
    let app = spawn_app().await;
    let s = &app.store;
    assert!(s
        .insert_stream(&stream(&app, "ssf_off", POLL, "disabled"), 10)
        .await
        .unwrap());
    let id = crate::helpers::stream_id("ssf_off");
    s.add_verification(&id, Some("late"), Millis(2000)).await.unwrap();
    assert!(s.pending_events(&id, 10).await.unwrap().is_empty());
    assert!(s.set_stream_status(&id, "enabled").await.unwrap());
    s.add_verification(&id, Some("now"), Millis(3000)).await.unwrap();
    assert_eq!(s.pending_events(&id, 10).await.unwrap().len(), 1);
}

/// The deliverer's look for due streams reads streams, not events: 10,000 events waiting
/// on a paused stream and on a poll stream make no push stream due, and one enabled push
/// stream is found by its own next due time, which follows its oldest event. The test's
/// times are a day ahead of the clock, so that the app's own deliverer never finds the
/// stream due and takes it first.
#[actix_web::test]
async fn due_streams_are_found_by_their_next_due_time() {
    let app = spawn_app().await;
    let s = &app.store;
    for (id, method, status) in [
        ("ssf_paused", PUSH, "paused"),
        ("ssf_polled", POLL, "enabled"),
        ("ssf_pushed", PUSH, "enabled"),
    ] {
        assert!(s
            .insert_stream(&stream(&app, id, method, status), 10)
            .await
            .unwrap());
    }
    fill(&app, "ssf_paused", 10_000).await;
    fill(&app, "ssf_polled", 10_000).await;
    let base = Millis::now().0 + 86_400_000;
    let t = |ms: i64| Millis(base + ms);
    let (now, until) = (t(5000), t(9000));
    assert!(s.claim_streams(now, until, 16).await.unwrap().is_empty());

    s.add_verification(&crate::helpers::stream_id("ssf_pushed"), None, t(4000))
        .await
        .unwrap();
    s.add_verification(&crate::helpers::stream_id("ssf_pushed"), None, t(4500))
        .await
        .unwrap();
    let claimed = s.claim_streams(now, until, 16).await.unwrap();
    assert_eq!(
        claimed
            .iter()
            .map(|c| c.as_ref().unwrap().id.as_str())
            .collect::<Vec<_>>(),
        [crate::helpers::stream_id("ssf_pushed").as_str()]
    );
    // A release of a lease that is not the one held (it ran out, and another instance took
    // the stream) leaves the holder's.
    s.release_stream(&crate::helpers::stream_id("ssf_pushed"), t(8999), None)
        .await
        .unwrap();
    assert!(s.claim_streams(now, until, 16).await.unwrap().is_empty());
    s.release_stream(&crate::helpers::stream_id("ssf_pushed"), until, None)
        .await
        .unwrap();

    // The oldest failed and waits until 8000: the stream is not due before then, however
    // early the event behind it.
    let events = s
        .pending_events(&crate::helpers::stream_id("ssf_pushed"), 10)
        .await
        .unwrap();
    s.event_retry(
        &crate::helpers::stream_id("ssf_pushed"),
        events[0].seq,
        1,
        t(8000),
    )
    .await
    .unwrap();
    assert!(s.claim_streams(now, until, 16).await.unwrap().is_empty());
    assert_eq!(s.claim_streams(t(8000), until, 16).await.unwrap().len(), 1);
    // A pass cut short goes behind: due again no earlier than the time given.
    s.release_stream(&crate::helpers::stream_id("ssf_pushed"), until, Some(t(8500)))
        .await
        .unwrap();
    assert!(s.claim_streams(t(8400), until, 16).await.unwrap().is_empty());
    assert_eq!(s.claim_streams(t(8500), until, 16).await.unwrap().len(), 1);
    s.release_stream(&crate::helpers::stream_id("ssf_pushed"), until, None)
        .await
        .unwrap();

    // Both delivered: nothing is owed, and nothing is due.
    let seqs: Vec<i64> = events.iter().map(|e| e.seq).collect();
    s.events_done(&crate::helpers::stream_id("ssf_pushed"), &seqs)
        .await
        .unwrap();
    assert!(s
        .claim_streams(Millis(i64::MAX / 2), until, 16)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(s.outbox_totals().await.unwrap(), (20_000, 0));
}

/// An event another instance queues while this one settles the same stream stays due.
/// (Before, the settle waited for the queuing transaction's lock on the stream's row, then
/// set the stream's next due time from the snapshot it had started with, without that
/// event: the stream was not due any more, and the event waited for the stream's next one,
/// for ever if none came.) PostgreSQL: SQLite runs one writer at a time.
#[actix_web::test]
async fn an_event_queued_during_a_settle_stays_due() {
    use sqlx::{Connection as _, Executor as _};
    let app = spawn_app().await;
    if !app.db.is_postgres() {
        return;
    }
    let s = &app.store;
    // Paused, so that the app's own deliverer leaves it alone.
    assert!(s
        .insert_stream(&stream(&app, "ssf_raced", PUSH, "paused"), 10)
        .await
        .unwrap());
    let at = Millis::now().0 + 86_400_000;
    s.add_verification(&crate::helpers::stream_id("ssf_raced"), None, Millis(at))
        .await
        .unwrap();
    let seqs: Vec<i64> = s
        .pending_events(&crate::helpers::stream_id("ssf_raced"), 10)
        .await
        .unwrap()
        .iter()
        .map(|e| e.seq)
        .collect();
    // The other instance queues an event, as `enqueue` does, and holds the row meanwhile.
    let mut other = sqlx::PgConnection::connect(&app.db.url).await.unwrap();
    other.execute("BEGIN").await.unwrap();
    sqlx::query(
        "INSERT INTO ssf_events (stream_id, jti, kind, state, event_at, next_attempt_at) \
         VALUES ('ssf_raced000000000000000000000', 'raced-2', 'verification', NULL, $1, $1)",
    )
    .bind(at + 1000)
    .execute(&mut other)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE ssf_streams SET pending = pending + 1, next_due_at = COALESCE(next_due_at, $1) \
         WHERE id = 'ssf_raced000000000000000000000'",
    )
    .bind(at + 1000)
    .execute(&mut other)
    .await
    .unwrap();
    let commit_later = async {
        actix_web::rt::time::sleep(Duration::from_millis(300)).await;
        other.execute("COMMIT").await.unwrap();
    };
    let raced = crate::helpers::stream_id("ssf_raced");
    let (done, ()) = tokio::join!(s.events_done(&raced, &seqs), commit_later);
    done.unwrap();
    let mut check = sqlx::PgConnection::connect(&app.db.url).await.unwrap();
    let (pending, due): (i64, Option<i64>) = sqlx::query_as(
        "SELECT pending, next_due_at FROM ssf_streams WHERE id = 'ssf_raced000000000000000000000'",
    )
    .fetch_one(&mut check)
    .await
    .unwrap();
    assert_eq!((pending, due), (1, Some(at + 1000)));
}

/// 40 concurrent creations by one organization leave it exactly 10 streams (before: a count
/// then an insert, and 15 of 100 got through).
#[actix_web::test]
async fn the_stream_limit_holds_under_concurrent_creation() {
    let app = spawn_app().await;
    let body = json!({"delivery": {"method": POLL}, "events_requested": []});
    let calls = (0..40).map(|_| {
        app.client
            .post(app.url("/ssf/streams"))
            .insert_header(("Authorization", format!("Bearer {}", app.secret())))
            .send_json(&body)
    });
    let mut created = 0;
    for res in futures_util::future::join_all(calls).await {
        let res = read(res.unwrap()).await;
        match res.status {
            201 => created += 1,
            400 => assert_eq!(res.json()["error"]["code"], "VALIDATION_ERROR", "{}", res.text()),
            other => panic!("{other}: {}", res.text()),
        }
    }
    assert_eq!(created, 10);
    let live = app
        .store
        .list_streams(&crate::helpers::org_id(&app.org.org_id), KeyMode::Live)
        .await
        .unwrap();
    assert_eq!(live.len(), 10);
}

/// A receiver that refuses a SET with a body holding a newline and a terminal escape gets
/// them logged escaped, on the one line of the refusal: it cannot forge a log line or reach
/// an operator's terminal.
#[actix_web::test]
async fn a_receivers_refusal_cannot_forge_a_log_line() {
    const FORGED: &str = "FORGED agentid: all is well";
    let receiver = HttpServer::new(|| {
        App::new().route(
            "/events",
            web::post().to(|| async {
                // The words, then 100 KiB of which at most 300 bytes are read and logged.
                HttpResponse::BadRequest().body(format!(
                    "no\n{FORGED}\n\x1b[2J\x1b[31mred{}",
                    "Z".repeat(100 * 1024)
                ))
            }),
        )
    })
    .workers(1)
    .bind("127.0.0.1:0")
    .unwrap();
    let url = format!("http://{}/events", receiver.addrs()[0]);
    actix_web::rt::spawn(receiver.run());

    let dir = tempfile::tempdir().unwrap();
    let db = crate::helpers::TestDb::new(dir.path()).await;
    let log_file = dir.path().join("stderr.log");
    let server = crate::cli::start_server_logging(
        dir.path(),
        Some(&db.url),
        &[("AGENTID_SSF_ALLOW_INSECURE_ENDPOINTS", "1")],
        &log_file,
    );
    let sk = server.printed_key("secret_live");
    let post = |path: &str, body: serde_json::Value| {
        client()
            .post(format!("{}{path}", server.base))
            .insert_header(("Authorization", format!("Bearer {sk}")))
            .send_json(&body)
    };
    let res = read(
        post(
            "/ssf/streams",
            json!({"delivery": {"method": PUSH, "endpoint_url": url}, "events_requested": []}),
        )
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(res.status, 201, "{}", res.text());
    let stream_id = res.json()["stream_id"].as_str().unwrap().to_owned();
    let res = read(
        post("/ssf/verify", json!({"stream_id": stream_id}))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(res.status, 204, "{}", res.text());

    let started = Instant::now();
    let logs = loop {
        let logs = std::fs::read_to_string(&log_file).unwrap();
        if logs.contains("receiver refused a SET") || started.elapsed() > Duration::from_secs(20) {
            break logs;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    drop(server);
    assert!(logs.contains("receiver refused a SET"), "{logs}");
    assert!(
        !logs.contains('\x1b'),
        "a terminal escape reached the log: {logs:?}"
    );
    assert!(
        !logs.lines().any(|l| l.starts_with(FORGED)),
        "the receiver forged a log line: {logs}"
    );
    assert!(
        logs.contains(FORGED),
        "the refusal's words are logged, escaped: {logs}"
    );
    let tail = logs.matches('Z').count();
    assert!(
        (200..300).contains(&tail),
        "the refusal is logged cut to 300 bytes ({tail} of its 102,400 Zs)"
    );
}

/// An acknowledgement and an event queued at the stream's bound take the stream's row first,
/// both: before, the acknowledgement held the event it deleted and then waited for the
/// stream's row, which the queuing transaction held while it waited to drop that same oldest
/// event, and PostgreSQL ended one of them (a poll, or a revocation, answered 500).
/// PostgreSQL: SQLite runs one writer at a time.
#[actix_web::test]
async fn an_acknowledgement_and_an_event_at_the_bound_do_not_deadlock() {
    use sqlx::{Connection as _, Executor as _};
    let app = spawn_app().await;
    if !app.db.is_postgres() {
        return;
    }
    let s = &app.store;
    let id = crate::helpers::stream_id("ssf_acked");
    assert!(s
        .insert_stream(&stream(&app, "ssf_acked", POLL, "enabled"), 10)
        .await
        .unwrap());
    fill(&app, "ssf_acked", 10_000).await;
    let oldest = s.pending_events(&id, 1).await.unwrap()[0].jti.clone();
    // Another transaction queues an event at the bound, as `enqueue` does: the stream's row,
    // then the oldest event dropped.
    let mut other = sqlx::PgConnection::connect(&app.db.url).await.unwrap();
    other.execute("BEGIN").await.unwrap();
    other
        .execute(format!("UPDATE ssf_streams SET pending = pending + 1 WHERE id = '{id}'").as_str())
        .await
        .unwrap();
    let queue_later = async {
        actix_web::rt::time::sleep(Duration::from_millis(300)).await;
        other
            .execute(
                format!(
                    "DELETE FROM ssf_events WHERE seq IN \
                     (SELECT seq FROM ssf_events WHERE stream_id = '{id}' ORDER BY seq LIMIT 1)"
                )
                .as_str(),
            )
            .await?;
        other.execute("COMMIT").await.map(|_| ())
    };
    let (acked, queued) = tokio::join!(s.ack_events(&id, std::slice::from_ref(&oldest)), queue_later);
    queued.unwrap();
    acked.unwrap();
}

/// A revocation queues its events under each stream's row lock, and only on a stream that is
/// still there and not disabled: a disable, or a delete, committed while it ran leaves nothing
/// queued and fails nothing (before: the event was queued on the disabled stream, to be sent
/// once it was enabled again; on the deleted one, the revocation failed, 500).
/// PostgreSQL: SQLite runs one writer at a time.
#[actix_web::test]
async fn a_revocation_racing_a_disable_or_delete_queues_nothing_and_fails_nothing() {
    use sqlx::{Connection as _, Executor as _};
    let app = spawn_app().await;
    if !app.db.is_postgres() {
        return;
    }
    let s = &app.store;
    for (name, ending) in [
        (
            "ssf_disabled",
            "UPDATE ssf_streams SET status = 'disabled' WHERE id = '{id}'; \
                          DELETE FROM ssf_events WHERE stream_id = '{id}'",
        ),
        (
            "ssf_deleted",
            "DELETE FROM ssf_events WHERE stream_id = '{id}'; \
                         DELETE FROM ssf_streams WHERE id = '{id}'",
        ),
    ] {
        let id = crate::helpers::stream_id(name);
        assert!(s
            .insert_stream(&stream(&app, name, POLL, "enabled"), 10)
            .await
            .unwrap());
        let (agent, _) = app.agent().await;
        let mut other = sqlx::PgConnection::connect(&app.db.url).await.unwrap();
        other.execute("BEGIN").await.unwrap();
        other
            .execute(ending.replace("{id}", id.as_str()).as_str())
            .await
            .unwrap();
        let commit_later = async {
            actix_web::rt::time::sleep(Duration::from_millis(300)).await;
            other.execute("COMMIT").await.unwrap();
        };
        let (revoked, ()) = tokio::join!(app.revoke(&agent, None), commit_later);
        assert_eq!(revoked.status, 200, "{name}: {}", revoked.text());
        assert!(s.pending_events(&id, 10).await.unwrap().is_empty(), "{name}");
    }
}
