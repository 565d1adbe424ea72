//! The Shared Signals transmitter, against a receiver written here from RFC 8935 and RFC
//! 8417 alone: it takes `application/secevent+jwt` POSTs, answers 202, and the test checks
//! each SET's signature through JWKS.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use parking_lot::Mutex;
use serde_json::{json, Value};

use crate::helpers::{spawn_app, spawn_app_with, Options, Resp, TestApp};

const REVOKED: &str = "https://schemas.openid.net/secevent/caep/event-type/session-revoked";
const VERIFICATION: &str = "https://schemas.openid.net/secevent/ssf/event-type/verification";

/// A push receiver: what it was sent, whether it is up (down: 503), and how long it takes
/// to answer (ms).
#[derive(Clone, Default)]
struct Receiver {
    got: Arc<Mutex<Vec<String>>>,
    down: Arc<AtomicBool>,
    slow: Arc<AtomicU64>,
}

impl Receiver {
    async fn start() -> (Receiver, String) {
        let r = Receiver::default();
        let state = r.clone();
        let server = HttpServer::new(move || {
            let state = state.clone();
            App::new().route(
                "/events",
                web::post().to(move |req: HttpRequest, body: web::Bytes| {
                    let state = state.clone();
                    async move {
                        let slow = state.slow.load(Ordering::SeqCst);
                        actix_web::rt::time::sleep(Duration::from_millis(slow)).await;
                        if state.down.load(Ordering::SeqCst) {
                            return HttpResponse::ServiceUnavailable().finish();
                        }
                        let ct = req.headers().get("content-type").and_then(|v| v.to_str().ok());
                        if ct != Some("application/secevent+jwt") {
                            return HttpResponse::BadRequest()
                                .json(json!({"err": "invalid_request", "description": "content type"}));
                        }
                        state.got.lock().push(String::from_utf8_lossy(&body).into_owned());
                        HttpResponse::Accepted().finish()
                    }
                }),
            )
        })
        .workers(1)
        .bind("127.0.0.1:0")
        .unwrap();
        let addr = server.addrs()[0];
        actix_web::rt::spawn(server.run());
        (r, format!("http://{addr}/events"))
    }

    /// Waits until `n` SETs have arrived; all of them.
    async fn wait_for(&self, n: usize, within: Duration) -> Vec<String> {
        let started = Instant::now();
        loop {
            let got = self.got.lock().clone();
            if got.len() >= n || started.elapsed() > within {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn part(jwt: &str, i: usize) -> Value {
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(jwt.split('.').nth(i).unwrap()).unwrap()).unwrap()
}

/// A SET's claims, once its signature checks with its kid in JWKS and its header is a SET's.
pub(crate) async fn checked_set(app: &TestApp, set: &str) -> Value {
    let (header, claims) = crate::helpers::checked_with_jwks(app, set).await;
    assert_eq!(header["typ"], "secevent+jwt");
    assert_eq!(claims["iss"], app.base.as_str());
    assert!(
        claims.get("sub").is_none() && claims.get("exp").is_none(),
        "{claims}"
    );
    claims
}

pub(crate) async fn send(
    app: &TestApp,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: Option<Value>,
) -> Resp {
    let mut req = app.client.request(method.parse().unwrap(), app.url(path));
    if let Some(k) = key {
        req = req.insert_header(("Authorization", format!("Bearer {k}")));
    }
    let res = match body {
        Some(b) => req.send_json(&b).await,
        None => req.send().await,
    };
    crate::helpers::read(res.unwrap()).await
}

async fn push_stream(app: &TestApp, url: &str) -> String {
    let res = send(
        app,
        "POST",
        "/ssf/streams",
        Some(app.secret()),
        Some(
            json!({"delivery": {"method": "urn:ietf:rfc:8935", "endpoint_url": url},
                    "events_requested": [REVOKED, VERIFICATION, "urn:example:unsupported"],
                    "description": "partner"}),
        ),
    )
    .await;
    assert_eq!(res.status, 201, "{}", res.text());
    res.json()["stream_id"].as_str().unwrap().to_owned()
}

#[actix_web::test]
async fn discovery_and_streams_belong_to_their_organization_and_mode() {
    let app = spawn_app().await;
    let conf = app.get("/.well-known/ssf-configuration", None).await.json();
    assert_eq!(conf["spec_version"], "1_0");
    assert_eq!(conf["issuer"], app.base.as_str());
    assert_eq!(conf["jwks_uri"], format!("{}/.well-known/jwks.json", app.base));
    assert_eq!(
        conf["delivery_methods_supported"],
        json!(["urn:ietf:rfc:8935", "urn:ietf:rfc:8936"])
    );
    assert_eq!(conf["default_subjects"], "ALL");
    for e in [
        "configuration_endpoint",
        "status_endpoint",
        "add_subject_endpoint",
        "remove_subject_endpoint",
        "verification_endpoint",
    ] {
        assert!(conf[e].as_str().unwrap().starts_with(&app.base), "{e}");
    }

    let (_, url) = Receiver::start().await;
    let res = send(&app, "POST", "/ssf/streams", Some(app.secret()),
        Some(json!({"delivery": {"method": "urn:ietf:rfc:8935", "endpoint_url": url}, "events_requested": [REVOKED, "urn:x"]}))).await;
    assert_eq!(res.status, 201, "{}", res.text());
    let created = res.json();
    let id = created["stream_id"].as_str().unwrap().to_owned();
    assert_eq!(created["iss"], app.base.as_str());
    assert_eq!(
        created["aud"],
        url.trim_end_matches("/events"),
        "the push endpoint's origin"
    );
    assert_eq!(created["events_delivered"], json!([REVOKED]));
    assert_eq!(created["events_supported"], json!([REVOKED, VERIFICATION]));

    let q = format!("/ssf/streams?stream_id={id}");
    assert_eq!(
        send(&app, "GET", &q, Some(app.secret()), None).await.json()["stream_id"],
        id.as_str()
    );
    assert_eq!(
        send(&app, "GET", "/ssf/streams", Some(app.secret()), None)
            .await
            .json()
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let patched = send(
        &app,
        "PATCH",
        "/ssf/streams",
        Some(app.secret()),
        Some(json!({"stream_id": id, "description": "d"})),
    )
    .await;
    assert_eq!(patched.json()["description"], "d", "{}", patched.text());
    let put = send(&app, "PUT", "/ssf/streams", Some(app.secret()),
        Some(json!({"stream_id": id, "delivery": {"method": "urn:ietf:rfc:8935", "endpoint_url": url}, "events_requested": [VERIFICATION], "aud": "partner"}))).await;
    assert_eq!(put.json()["aud"], "partner", "{}", put.text());
    let status = send(
        &app,
        "POST",
        "/ssf/status",
        Some(app.secret()),
        Some(json!({"stream_id": id, "status": "paused"})),
    )
    .await;
    assert_eq!(status.json()["status"], "paused");
    assert_eq!(
        send(
            &app,
            "GET",
            &format!("/ssf/status?stream_id={id}"),
            Some(app.secret()),
            None
        )
        .await
        .json()["status"],
        "paused"
    );

    // Who may: no key 401, a publishable key 403, another organization or mode 404.
    send(&app, "GET", &q, None, None)
        .await
        .assert_error(401, "UNAUTHORIZED");
    send(&app, "GET", &q, Some(&app.org.keys.publishable_live), None)
        .await
        .assert_error(403, "FORBIDDEN");
    send(&app, "GET", &q, Some(&app.org.keys.secret_test), None)
        .await
        .assert_error(404, "NOT_FOUND");
    let other = agentid::engine::admin::create_org(
        &app.store,
        app.engine.keys(),
        "other",
        agentid::domain::Plan::Developer,
        agentid::domain::Plan::Developer.default_limits().unwrap(),
    )
    .await
    .unwrap();
    send(&app, "GET", &q, Some(&other.keys.secret_live), None)
        .await
        .assert_error(404, "NOT_FOUND");
    send(&app, "DELETE", &q, Some(&other.keys.secret_live), None)
        .await
        .assert_error(404, "NOT_FOUND");
    assert_eq!(
        send(&app, "GET", "/ssf/streams", Some(&other.keys.secret_live), None)
            .await
            .json(),
        json!([])
    );

    assert_eq!(
        send(&app, "DELETE", &q, Some(app.secret()), None).await.status,
        204
    );
    send(&app, "GET", &q, Some(app.secret()), None)
        .await
        .assert_error(404, "NOT_FOUND");
}

/// A revocation reaches the receiver as one signed SET, as SSF and CAEP say; so does a
/// verification event with its state.
#[actix_web::test]
async fn a_revocation_is_pushed_as_one_signed_set() {
    let app = spawn_app().await;
    let (receiver, url) = Receiver::start().await;
    let stream = push_stream(&app, &url).await;
    let (agent, _) = app.agent().await;
    assert_eq!(app.revoke(&agent, Some("key leaked")).await.status, 200);
    let got = receiver.wait_for(1, Duration::from_secs(3)).await;
    assert_eq!(got.len(), 1, "{got:?}");
    let claims = checked_set(&app, &got[0]).await;
    assert_eq!(claims["aud"], url.trim_end_matches("/events"));
    assert!(claims["jti"].as_str().is_some_and(|j| !j.is_empty()));
    assert_eq!(
        claims["sub_id"],
        json!({"format": "iss_sub", "iss": "example.com", "sub": agent})
    );
    let event = &claims["events"][REVOKED];
    assert!(
        event["event_timestamp"].as_i64().unwrap() > 1_700_000_000,
        "{claims}"
    );
    assert_eq!(event["reason_admin"], json!({"en": "key leaked"}));

    let res = send(
        &app,
        "POST",
        "/ssf/verify",
        Some(app.secret()),
        Some(json!({"stream_id": stream, "state": "s-42"})),
    )
    .await;
    assert_eq!(res.status, 204, "{}", res.text());
    let got = receiver.wait_for(2, Duration::from_secs(3)).await;
    assert_eq!(got.len(), 2);
    let claims = checked_set(&app, &got[1]).await;
    assert_eq!(claims["events"][VERIFICATION]["state"], "s-42");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.got.lock().len(), 2, "each event once");
}

/// A receiver that is down at the revocation gets the event, once, when it is back; events
/// keep their order.
#[actix_web::test]
async fn a_receiver_that_was_down_gets_its_events_in_order_when_back() {
    let app = spawn_app().await;
    let (receiver, url) = Receiver::start().await;
    push_stream(&app, &url).await;
    receiver.down.store(true, Ordering::SeqCst);
    let (a, _) = app.agent().await;
    let (b, _) = app.agent().await;
    assert_eq!(app.revoke(&a, None).await.status, 200);
    assert_eq!(app.revoke(&b, None).await.status, 200);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(receiver.got.lock().is_empty());
    receiver.down.store(false, Ordering::SeqCst);
    let got = receiver.wait_for(2, Duration::from_secs(6)).await;
    assert_eq!(got.len(), 2, "{got:?}");
    let subs: Vec<Value> = got.iter().map(|s| part(s, 1)["sub_id"]["sub"].clone()).collect();
    assert_eq!(subs, [json!(a), json!(b)]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.got.lock().len(), 2);
}

/// `POST /ssf/status` of `stream` to `status`.
async fn set_status(app: &TestApp, stream: &str, status: &str) -> Resp {
    send(
        app,
        "POST",
        "/ssf/status",
        Some(app.secret()),
        Some(json!({"stream_id": stream, "status": status})),
    )
    .await
}

/// Queues `n` verification events on `stream`.
async fn verifications(app: &TestApp, stream: &str, n: usize) {
    for i in 0..n {
        let body = json!({"stream_id": stream, "state": format!("s-{i}")});
        let res = send(app, "POST", "/ssf/verify", Some(app.secret()), Some(body)).await;
        assert_eq!(res.status, 204, "{}", res.text());
    }
}

/// Attack: a receiver that takes its time over every SET, with many queued. Its stream's pass
/// holds up no other stream's events.
#[actix_web::test]
async fn a_slow_receiver_holds_up_only_its_own_stream() {
    let app = spawn_app().await;
    let slow = behind_a_slow_stream(&app, |slow| async move {
        slow.wait_for(1, Duration::from_secs(5)).await;
    })
    .await;
    assert!(slow.got.lock().len() < 8, "the slow stream was done first");
}

/// Two streams: one whose receiver takes 1.5 s a SET, with 8 queued, then (once `started`
/// has waited on its receiver) one SET for the other, which must arrive within 4 s.
async fn behind_a_slow_stream<F: std::future::Future>(
    app: &TestApp,
    started: impl FnOnce(Receiver) -> F,
) -> Receiver {
    let (slow, slow_url) = Receiver::start().await;
    slow.slow.store(1500, Ordering::SeqCst);
    let (other, other_url) = Receiver::start().await;
    let slow_stream = push_stream(app, &slow_url).await;
    let other_stream = push_stream(app, &other_url).await;
    verifications(app, &slow_stream, 8).await;
    started(slow.clone()).await;
    verifications(app, &other_stream, 1).await;
    let t = Instant::now();
    assert_eq!(other.wait_for(1, Duration::from_secs(15)).await.len(), 1);
    let waited = t.elapsed();
    assert!(
        waited < Duration::from_secs(4),
        "waited {waited:?} behind the slow stream"
    );
    slow
}

/// Attack: more slow streams than an instance delivers at once. A pass that the lease cuts
/// short goes behind the streams that waited, so they are not starved.
#[actix_web::test]
async fn a_pass_cut_short_goes_behind_the_streams_that_waited() {
    let app = spawn_app_with(Options {
        tweak: Box::new(|c| {
            c.engine.ssf.streams_at_once = 1;
            // A lease shorter than the service takes (17 s): a pass ends one push after it
            // starts.
            c.engine.ssf.lease = Duration::from_secs(12);
        }),
        ..Options::default()
    })
    .await;
    let slow = behind_a_slow_stream(&app, |_| tokio::time::sleep(Duration::from_millis(300))).await;
    assert!(slow.got.lock().len() < 6, "the slow stream was done first");
    assert_eq!(
        slow.wait_for(8, Duration::from_secs(30)).await.len(),
        8,
        "and it is done in turn"
    );
}

/// An instance that stops gracefully while it pushes ends its pass after that push and gives
/// its stream back: the stream's next events go out at once from the instance that follows,
/// not when the lease runs out.
#[actix_web::test]
async fn a_graceful_stop_gives_the_streams_it_delivers_back() {
    let app = spawn_app().await;
    let (receiver, url) = Receiver::start().await;
    push_stream(&app, &url).await;
    receiver.slow.store(1500, Ordering::SeqCst);
    let (first, _) = app.agent().await;
    assert_eq!(app.revoke(&first, None).await.status, 200);
    // Its push is under way when the stop comes.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let app = app.restart().await;
    receiver.slow.store(0, Ordering::SeqCst);
    let (second, _) = app.agent().await;
    let started = Instant::now();
    assert_eq!(app.revoke(&second, None).await.status, 200);
    let got = receiver.wait_for(2, Duration::from_secs(20)).await;
    assert_eq!(got.len(), 2, "both revocations are pushed");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the stream waited {:?} for a lease the stopped instance held",
        started.elapsed()
    );
}

/// A poll stream of revocations: the answer that created it (its poll token is shown once).
async fn poll_stream(app: &TestApp) -> Value {
    let res = send(
        app,
        "POST",
        "/ssf/streams",
        Some(app.secret()),
        Some(json!({"delivery": {"method": "urn:ietf:rfc:8936"}, "events_requested": [REVOKED]})),
    )
    .await;
    assert_eq!(res.status, 201, "{}", res.text());
    res.json()
}

/// A new poll stream's id, poll token and poll path.
async fn waiting_poll(app: &TestApp) -> (String, String, String) {
    let created = poll_stream(app).await;
    let id = created["stream_id"].as_str().unwrap().to_owned();
    let token = created["poll_token"].as_str().unwrap().to_owned();
    let path = format!("/ssf/poll/{id}");
    (id, token, path)
}

/// Poll delivery (RFC 8936): pending SETs come back until acknowledged, never after.
#[actix_web::test]
async fn poll_returns_sets_until_they_are_acknowledged() {
    let app = spawn_app().await;
    let created = poll_stream(&app).await;
    let id = created["stream_id"].as_str().unwrap().to_owned();
    let token = created["poll_token"].as_str().unwrap().to_owned();
    let poll_url = created["delivery"]["endpoint_url"].as_str().unwrap().to_owned();
    assert_eq!(poll_url, format!("{}/ssf/poll/{id}", app.base));
    assert_eq!(created["aud"], id.as_str());
    assert!(
        send(
            &app,
            "GET",
            &format!("/ssf/streams?stream_id={id}"),
            Some(app.secret()),
            None
        )
        .await
        .json()
        .get("poll_token")
        .is_none(),
        "shown once"
    );
    let path = format!("/ssf/poll/{id}");
    let (agent, _) = app.agent().await;
    assert_eq!(app.revoke(&agent, None).await.status, 200);
    let poll = |ack: Vec<String>| {
        let (path, token) = (path.clone(), token.clone());
        let app = &app;
        async move {
            send(
                app,
                "POST",
                &path,
                Some(&token),
                Some(json!({"returnImmediately": true, "ack": ack})),
            )
            .await
        }
    };
    let first = poll(vec![]).await.json();
    let sets = first["sets"].as_object().unwrap();
    assert_eq!(sets.len(), 1, "{first}");
    let (jti, set) = sets.iter().next().unwrap();
    let claims = checked_set(&app, set.as_str().unwrap()).await;
    assert_eq!(claims["sub_id"]["sub"], agent.as_str());
    assert_eq!(
        poll(vec![]).await.json()["sets"].as_object().unwrap().len(),
        1,
        "not yet acknowledged"
    );
    let after = poll(vec![jti.clone()]).await.json();
    assert_eq!(after["sets"], json!({}), "{after}");
    assert_eq!(after["moreAvailable"], false);
    send(
        &app,
        "POST",
        &path,
        Some("pt_wrong"),
        Some(json!({"returnImmediately": true})),
    )
    .await
    .assert_error(401, "UNAUTHORIZED");
    send(
        &app,
        "POST",
        &path,
        Some(app.secret()),
        Some(json!({"returnImmediately": true})),
    )
    .await
    .assert_error(401, "UNAUTHORIZED");
}

/// Attack: a long poll that began while its stream was enabled went on answering on those
/// terms: a revocation queued after the receiver paused the stream went out within the same
/// poll. The poll reads its stream again while it waits.
#[actix_web::test]
async fn a_long_poll_delivers_nothing_once_its_stream_is_paused() {
    let app = spawn_app().await;
    let (id, token, path) = waiting_poll(&app).await;
    let (agent, _) = app.agent().await;
    let waiting = send(&app, "POST", &path, Some(&token), Some(json!({})));
    let paused_then_revoked = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(set_status(&app, &id, "paused").await.json()["status"], "paused");
        assert_eq!(app.revoke(&agent, None).await.status, 200);
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    tokio::select! {
        res = waiting => panic!("the paused stream's poll answered: {}", res.text()),
        () = paused_then_revoked => {}
    }
    // Enabled again, the revocation is delivered.
    assert_eq!(set_status(&app, &id, "enabled").await.json()["status"], "enabled");
    let res = send(
        &app,
        "POST",
        &path,
        Some(&token),
        Some(json!({"returnImmediately": true})),
    )
    .await;
    assert_eq!(res.json()["sets"].as_object().unwrap().len(), 1, "{}", res.text());
}

/// Attack: long polls opened on one stream without end, each waiting its 30 s and reading
/// the store four times a second. A receiver waits in one poll at a time: a newer poll takes
/// over the wait, and the older answers at once (a client that gave up on its poll is not
/// kept waiting by it either).
#[actix_web::test]
async fn a_newer_long_poll_of_a_stream_takes_over_the_wait() {
    let app = spawn_app().await;
    let (_, token, path) = waiting_poll(&app).await;
    let (agent, _) = app.agent().await;
    let older = send(&app, "POST", &path, Some(&token), Some(json!({})));
    let newer = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        send(&app, "POST", &path, Some(&token), Some(json!({}))).await
    };
    let started = Instant::now();
    tokio::pin!(newer);
    let res = tokio::select! {
        res = older => res,
        res = &mut newer => panic!("the newer poll answered first: {}", res.text()),
    };
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["sets"], json!({}));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // The newer poll waits on, and delivers the next event.
    let revoked = async {
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert_eq!(app.revoke(&agent, None).await.status, 200);
    };
    let (res, ()) = tokio::join!(newer, revoked);
    assert_eq!(res.json()["sets"].as_object().unwrap().len(), 1, "{}", res.text());
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

/// Attack: subjects added without end (every agent of the organization, and more rows a
/// stream would hold). A stream holds at most 10,000; an added one already there answers as
/// before.
#[actix_web::test]
async fn the_subjects_a_stream_holds_are_bounded() {
    let app = spawn_app().await;
    let (_receiver, url) = Receiver::start().await;
    let stream = push_stream(&app, &url).await;
    let (a, _) = app.agent().await;
    let add = |sub: String| {
        send(
            &app,
            "POST",
            "/ssf/subjects/add",
            Some(app.secret()),
            Some(
                json!({"stream_id": stream, "subject": {"format": "iss_sub", "iss": "example.com", "sub": sub}}),
            ),
        )
    };
    assert_eq!(add(a.clone()).await.status, 200);
    app.raw_execute(&format!(
        "INSERT INTO ssf_subjects (stream_id, agent_id) SELECT '{stream}', 'agt_filler' || CAST(g.n AS TEXT) FROM {}",
        if app.db.is_postgres() {
            "generate_series(1, 9999) AS g(n)".to_owned()
        } else {
            "(WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < 9999) SELECT n FROM s) g"
                .to_owned()
        }
    ))
    .await
    .unwrap();
    let (b, _) = app.agent().await;
    add(b).await.assert_error(400, "VALIDATION_ERROR");
    assert_eq!(add(a).await.status, 200);
}

/// Once subjects are added, a stream carries only theirs.
#[actix_web::test]
async fn subjects_narrow_a_stream_to_their_agents() {
    let app = spawn_app().await;
    let (receiver, url) = Receiver::start().await;
    let stream = push_stream(&app, &url).await;
    let (a, _) = app.agent().await;
    let (b, _) = app.agent().await;
    let add = send(
        &app,
        "POST",
        "/ssf/subjects/add",
        Some(app.secret()),
        Some(json!({"stream_id": stream, "subject": {"format": "iss_sub", "iss": "example.com", "sub": a}})),
    )
    .await;
    assert_eq!(add.status, 200, "{}", add.text());
    send(
        &app,
        "POST",
        "/ssf/subjects/add",
        Some(app.secret()),
        Some(
            json!({"stream_id": stream, "subject": {"format": "iss_sub", "iss": "other.example", "sub": b}}),
        ),
    )
    .await
    .assert_error(400, "VALIDATION_ERROR");
    assert_eq!(app.revoke(&b, None).await.status, 200);
    assert_eq!(app.revoke(&a, None).await.status, 200);
    let got = receiver.wait_for(1, Duration::from_secs(3)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let got = if got.len() == 1 {
        receiver.got.lock().clone()
    } else {
        got
    };
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(part(&got[0], 1)["sub_id"]["sub"], a.as_str());
}

/// Push endpoints must be https and public: no loopback, private, link-local or
/// unspecified address (checked at creation, and again before each delivery).
#[actix_web::test]
async fn push_endpoints_must_be_public_https() {
    let app = spawn_app_with(Options {
        tweak: Box::new(|c| c.engine.ssf.allow_insecure_endpoints = false),
        ..Options::default()
    })
    .await;
    for url in [
        "http://example.com/events",
        "https://127.0.0.1/events",
        "https://10.0.0.7/events",
        "https://169.254.169.254/latest/meta-data",
        "https://[::1]/events",
        "https://localhost/events",
    ] {
        let res = send(&app, "POST", "/ssf/streams", Some(app.secret()),
            Some(json!({"delivery": {"method": "urn:ietf:rfc:8935", "endpoint_url": url}, "events_requested": [REVOKED]}))).await;
        let body = res.assert_error(400, "VALIDATION_ERROR");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("delivery.endpoint_url"),
            "{url}: {body}"
        );
    }
}

/// Events are written in the revocation's own transaction: a service killed (SIGKILL)
/// between the revocation and the delivery delivers after its restart.
#[actix_web::test]
async fn an_event_survives_a_kill_between_commit_and_delivery() {
    let dir = tempfile::tempdir().unwrap();
    let db = crate::helpers::TestDb::new(dir.path()).await;
    let migrated = std::process::Command::new(env!("CARGO_BIN_EXE_agentid"))
        .args(["migrate", "--database-url", &db.url])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        migrated.status.success(),
        "{}",
        String::from_utf8_lossy(&migrated.stderr)
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentid"))
        .args([
            "org",
            "create",
            "--name",
            "K",
            "--plan",
            "growth",
            "--database-url",
            &db.url,
        ])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let org = serde_json::from_slice::<Value>(&out.stdout).unwrap();
    let sk = org["keys"]["secret_live"].as_str().unwrap().to_owned();
    // The shortest lease: a pass the kill cut short holds the stream until it runs out.
    let env = [
        ("AGENTID_SSF_ALLOW_INSECURE_ENDPOINTS", "1"),
        ("AGENTID_SSF_LEASE_SECONDS", "17"),
    ];
    let start = || crate::cli::spawn_server(dir.path(), Some(&db.url), &env, std::process::Stdio::null());
    let (receiver, url) = Receiver::start().await;
    receiver.down.store(true, Ordering::SeqCst);
    let client = crate::helpers::client();
    let call = |method: &'static str, base: String, path: &'static str, body: Value| {
        let (client, sk) = (client.clone(), sk.clone());
        async move {
            let res = client
                .request(method.parse().unwrap(), format!("{base}{path}"))
                .insert_header(("Authorization", format!("Bearer {sk}")))
                .send_json(&body)
                .await
                .unwrap();
            crate::helpers::read(res).await.json()
        }
    };
    let mut server = start();
    // Its first start made the key file the grant is sealed with.
    let granted = std::process::Command::new(env!("CARGO_BIN_EXE_agentid"))
        .args([
            "domain",
            "approve",
            "--org",
            org["org_id"].as_str().unwrap(),
            "example.com",
        ])
        .args(["--database-url", &db.url])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        granted.status.success(),
        "{}",
        String::from_utf8_lossy(&granted.stderr)
    );
    call("POST", server.base.clone(), "/ssf/streams",
        json!({"delivery": {"method": "urn:ietf:rfc:8935", "endpoint_url": url}, "events_requested": [REVOKED]})).await;
    let agent = call(
        "POST",
        server.base.clone(),
        "/v1/agents/register",
        json!({"name": "k", "issuer_domain": "example.com", "scopes": ["read:x"]}),
    )
    .await;
    let id = agent["agent_id"].as_str().unwrap().to_owned();
    let res = client
        .post(format!("{}/v1/agents/{id}/revoke", server.base))
        .insert_header(("Authorization", format!("Bearer {sk}")))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    assert!(receiver.got.lock().is_empty());

    receiver.down.store(false, Ordering::SeqCst);
    let mut server = start();
    let got = receiver.wait_for(1, Duration::from_secs(25)).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(part(&got[0], 1)["sub_id"]["sub"], id.as_str());
    server.child.kill().unwrap();
    server.child.wait().unwrap();
}

/// Two instances on one database, revocations on both: every event delivered, none twice.
#[actix_web::test]
async fn a_fleet_delivers_every_event_once() {
    let fleet = crate::helpers::spawn_fleet(2, Options::unlimited()).await;
    let (receiver, url) = Receiver::start().await;
    push_stream(&fleet[0], &url).await;
    let mut agents = Vec::new();
    for i in 0..20 {
        let app = &fleet[i % 2];
        let (id, _) = app.agent().await;
        assert_eq!(app.revoke(&id, None).await.status, 200);
        agents.push(id);
    }
    receiver.wait_for(20, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let got = receiver.got.lock().clone();
    let subs: Vec<String> = got
        .iter()
        .map(|s| part(s, 1)["sub_id"]["sub"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(subs.len(), 20, "{subs:?}");
    let unique: std::collections::HashSet<_> = subs.iter().collect();
    assert_eq!(unique.len(), 20, "a duplicate: {subs:?}");
}

/// Attack: text a database cannot hold (a NUL character; PostgreSQL refuses it in any text
/// column) in each field of the Shared Signals API and a person's revocation. Each is a
/// caller's mistake: 400, never 500; an acknowledgement that cannot name a SET is passed over.
#[actix_web::test]
async fn text_with_a_nul_is_refused_not_a_server_error() {
    let app = spawn_app().await;
    let (_, url) = Receiver::start().await;
    let nul = "a\u{0}b";
    let push = |extra: Value| {
        let mut body = json!({"delivery": {"method": "urn:ietf:rfc:8935", "endpoint_url": url},
                              "events_requested": [REVOKED]});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body
    };
    for body in [
        push(json!({"description": nul})),
        push(json!({"aud": nul})),
        push(json!({"events_requested": [nul]})),
    ] {
        send(&app, "POST", "/ssf/streams", Some(app.secret()), Some(body))
            .await
            .assert_error(400, "VALIDATION_ERROR");
    }
    let stream = push_stream(&app, &url).await;
    send(
        &app,
        "POST",
        "/ssf/verify",
        Some(app.secret()),
        Some(json!({"stream_id": stream, "state": nul})),
    )
    .await
    .assert_error(400, "VALIDATION_ERROR");
    app.post(
        "/v1/subjects/revoke",
        Some(app.secret()),
        Some(&json!({"iss": "https://idp.example", "sub": nul})),
    )
    .await
    .assert_error(400, "VALIDATION_ERROR");
    let created = poll_stream(&app).await;
    let poll = send(
        &app,
        "POST",
        &format!("/ssf/poll/{}", created["stream_id"].as_str().unwrap()),
        created["poll_token"].as_str(),
        Some(json!({"returnImmediately": true, "ack": [nul]})),
    )
    .await;
    assert_eq!(poll.status, 200, "{}", poll.text());
}

async fn subject(app: &TestApp, stream: &str, agent: &str, add: bool) {
    let path = if add {
        "/ssf/subjects/add"
    } else {
        "/ssf/subjects/remove"
    };
    let res = send(
        app,
        "POST",
        path,
        Some(app.secret()),
        Some(json!({"stream_id": stream, "subject": {"format": "iss_sub", "iss": "example.com", "sub": agent}})),
    )
    .await;
    assert_eq!(res.status, if add { 200 } else { 204 }, "{}", res.text());
}

/// Removing a stream's last subject asks for fewer events, not for every agent's: the stream
/// stays narrowed. A person's revocation names no subject of a narrowed stream either. (The
/// verification sent last arrives after anything queued before it: it ends the wait.)
#[actix_web::test]
async fn a_stream_whose_subjects_were_all_removed_carries_none() {
    let app = spawn_app().await;
    let (receiver, url) = Receiver::start().await;
    let stream = push_stream(&app, &url).await;
    let (a, _) = app.agent().await;
    let (b, _) = app.agent().await;
    // Removing from a stream that carries every agent cannot make it carry fewer: refused
    // (SSF §8.1.3.3: 404), as is removing a subject twice.
    let remove =
        json!({"stream_id": stream, "subject": {"format": "iss_sub", "iss": "example.com", "sub": a}});
    let refused = send(
        &app,
        "POST",
        "/ssf/subjects/remove",
        Some(app.secret()),
        Some(remove.clone()),
    );
    refused.await.assert_error(404, "NOT_FOUND");
    subject(&app, &stream, &a, true).await;
    subject(&app, &stream, &a, false).await;
    let again = send(
        &app,
        "POST",
        "/ssf/subjects/remove",
        Some(app.secret()),
        Some(remove),
    );
    again.await.assert_error(404, "NOT_FOUND");
    assert_eq!(app.revoke(&b, None).await.status, 200);
    assert_eq!(app.revoke(&a, None).await.status, 200);
    let res = send(
        &app,
        "POST",
        "/v1/subjects/revoke",
        Some(app.secret()),
        Some(json!({"iss": "https://idp.example", "sub": "alice"})),
    )
    .await;
    assert_eq!(res.status, 200, "{}", res.text());
    let res = send(
        &app,
        "POST",
        "/ssf/verify",
        Some(app.secret()),
        Some(json!({"stream_id": stream, "state": "last"})),
    )
    .await;
    assert_eq!(res.status, 204, "{}", res.text());
    let got = receiver.wait_for(1, Duration::from_secs(5)).await;
    let events: Vec<Value> = got.iter().map(|s| part(s, 1)["events"].clone()).collect();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0][VERIFICATION]["state"], "last", "{events:?}");
}

/// SSF §8.1.2: a disabled stream holds no event for later. A verification asked of it is
/// answered and dropped, not sent when the stream is enabled again.
#[actix_web::test]
async fn a_disabled_stream_holds_no_verification_for_later() {
    let app = spawn_app().await;
    let created = poll_stream(&app).await;
    let id = created["stream_id"].as_str().unwrap();
    let token = created["poll_token"].as_str().unwrap();
    let status = |s: &'static str| {
        send(
            &app,
            "POST",
            "/ssf/status",
            Some(app.secret()),
            Some(json!({"stream_id": id, "status": s})),
        )
    };
    assert_eq!(status("disabled").await.status, 200);
    let res = send(
        &app,
        "POST",
        "/ssf/verify",
        Some(app.secret()),
        Some(json!({"stream_id": id})),
    )
    .await;
    assert_eq!(res.status, 204, "{}", res.text());
    assert_eq!(status("enabled").await.status, 200);
    // The scheme's name is case-insensitive (RFC 9110 §11.1).
    let polled = app
        .client
        .post(app.url(&format!("/ssf/poll/{id}")))
        .insert_header(("Authorization", format!("bearer {token}")))
        .send_json(&json!({"returnImmediately": true}))
        .await
        .unwrap();
    let polled = crate::helpers::read(polled).await;
    assert_eq!(polled.json()["sets"], json!({}), "{}", polled.text());
}

/// A PATCH that moves a push stream to another endpoint moves an `aud` it was given by
/// default (the endpoint's origin) along with it: receivers refuse a SET for another
/// audience (RFC 8935 §2.3), and a refused event is dropped. An `aud` the owner chose stays.
#[actix_web::test]
async fn a_default_audience_follows_the_endpoint_and_a_chosen_one_stays() {
    let app = spawn_app().await;
    let (_, first) = Receiver::start().await;
    let (_, second) = Receiver::start().await;
    let origin = |url: &str| url.trim_end_matches("/events").to_owned();
    let patch = |id: String, url: String| {
        let app = &app;
        async move {
            let res = send(
                app,
                "PATCH",
                "/ssf/streams",
                Some(app.secret()),
                Some(json!({"stream_id": id, "delivery": {"method": "urn:ietf:rfc:8935", "endpoint_url": url}})),
            )
            .await;
            assert_eq!(res.status, 200, "{}", res.text());
            res.json()
        }
    };
    let id = push_stream(&app, &first).await;
    assert_eq!(patch(id.clone(), second.clone()).await["aud"], origin(&second));
    let chosen = send(
        &app,
        "PATCH",
        "/ssf/streams",
        Some(app.secret()),
        Some(json!({"stream_id": id, "aud": "partner"})),
    )
    .await;
    assert_eq!(chosen.json()["aud"], "partner", "{}", chosen.text());
    assert_eq!(patch(id, first).await["aud"], "partner");
}

/// The ten streams an organization may have are counted per mode, as they are listed: a
/// test key's streams, which a live key neither sees nor deletes, leave the live ones free.
#[actix_web::test]
async fn a_test_keys_streams_do_not_use_up_the_live_ones() {
    let app = spawn_app().await;
    let body = json!({"delivery": {"method": "urn:ietf:rfc:8936"}, "events_requested": [REVOKED]});
    for _ in 0..10 {
        let res = send(
            &app,
            "POST",
            "/ssf/streams",
            Some(&app.org.keys.secret_test),
            Some(body.clone()),
        )
        .await;
        assert_eq!(res.status, 201, "{}", res.text());
    }
    send(
        &app,
        "POST",
        "/ssf/streams",
        Some(&app.org.keys.secret_test),
        Some(body.clone()),
    )
    .await
    .assert_error(400, "VALIDATION_ERROR");
    let live = send(&app, "POST", "/ssf/streams", Some(app.secret()), Some(body)).await;
    assert_eq!(live.status, 201, "{}", live.text());
}

/// A configuration written from what was read before a status change (a PATCH racing a
/// disable) leaves the status as it was set: only `POST /ssf/status` changes it.
#[actix_web::test]
async fn a_configuration_written_late_does_not_undo_a_status() {
    let app = spawn_app().await;
    let (_, url) = Receiver::start().await;
    let id = push_stream(&app, &url).await;
    let read = app
        .store
        .get_stream(&crate::helpers::stream_id(&id))
        .await
        .unwrap()
        .unwrap();
    let res = send(
        &app,
        "POST",
        "/ssf/status",
        Some(app.secret()),
        Some(json!({"stream_id": id, "status": "disabled"})),
    )
    .await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert!(app.store.update_stream(&read).await.unwrap());
    let status = send(
        &app,
        "GET",
        &format!("/ssf/status?stream_id={id}"),
        Some(app.secret()),
        None,
    )
    .await;
    assert_eq!(status.json()["status"], "disabled", "{}", status.text());
}

/// A stream row that does not decode (written into the database) is passed over with an
/// alarm: the claim that met it first, every tick after, stopped every stream's delivery.
#[actix_web::test]
async fn a_stream_row_that_does_not_decode_holds_up_no_other_stream() {
    let app = spawn_app().await;
    let (receiver, url) = Receiver::start().await;
    let broken = push_stream(&app, &url).await;
    let mistyped = push_stream(&app, &url).await;
    let fine = push_stream(&app, &url).await;
    app.raw_execute(&format!(
        "UPDATE ssf_streams SET mode = 'x', next_due_at = 1, pending = 1 WHERE id = '{broken}'"
    ))
    .await
    .unwrap();
    // SQLite takes any value in any column: one that is not the column's type fails the
    // row's read itself.
    if !app.db.is_postgres() {
        app.raw_execute(&format!(
            "UPDATE ssf_streams SET created_at = 'x', next_due_at = 1, pending = 1 WHERE id = '{mistyped}'"
        ))
        .await
        .unwrap();
    }
    let res = send(
        &app,
        "POST",
        "/ssf/verify",
        Some(app.secret()),
        Some(json!({"stream_id": fine, "state": "through"})),
    )
    .await;
    assert_eq!(res.status, 204, "{}", res.text());
    let got = receiver.wait_for(1, Duration::from_secs(5)).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(part(&got[0], 1)["events"][VERIFICATION]["state"], "through");
    let counted = agentid::telemetry::metrics_handle().render();
    assert!(
        counted.contains(r#"agentid_integrity_failures_total{what="ssf_stream"}"#),
        "the alarm is counted"
    );
}

/// A pass over a stream stops pushing once the stream is disabled (or paused, deleted, or
/// moved to another endpoint) while it runs: SSF §8.1.2, a disabled stream transmits nothing.
/// Before, the pass pushed every event it had read, for as long as its lease ran.
#[actix_web::test]
async fn a_pass_stops_pushing_once_its_stream_is_disabled() {
    let app = spawn_app().await;
    let (receiver, url) = Receiver::start().await;
    let stream = push_stream(&app, &url).await;
    let status = |s: &'static str| set_status(&app, &stream, s);
    assert_eq!(status("paused").await.status, 200);
    verifications(&app, &stream, 20).await;
    receiver.slow.store(300, Ordering::SeqCst);
    assert_eq!(status("enabled").await.status, 200);
    receiver.wait_for(1, Duration::from_secs(5)).await;
    assert_eq!(status("disabled").await.status, 200);
    let when_disabled = receiver.got.lock().len();
    tokio::time::sleep(Duration::from_secs(4)).await;
    // The push under way when the stream was disabled may land; no other.
    let got = receiver.got.lock().len();
    assert!(
        got <= when_disabled + 1,
        "{got} SETs pushed, {when_disabled} when the stream was disabled"
    );
}

/// Events held while a stream was paused for more than a day get their full day of retries
/// once it is enabled again: the 24 h count from the first failed push, not from the event
/// (before, the first failure after the pause gave each one up at once).
#[actix_web::test]
async fn events_held_over_a_day_get_their_retries_when_the_stream_resumes() {
    let app = spawn_app().await;
    let (receiver, url) = Receiver::start().await;
    let stream = push_stream(&app, &url).await;
    let status = |s: &'static str| set_status(&app, &stream, s);
    assert_eq!(status("paused").await.status, 200);
    verifications(&app, &stream, 1).await;
    app.raw_execute(&format!(
        "UPDATE ssf_events SET event_at = event_at - 90000000 WHERE stream_id = '{stream}'"
    ))
    .await
    .unwrap();
    receiver.down.store(true, Ordering::SeqCst);
    assert_eq!(status("enabled").await.status, 200);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    receiver.down.store(false, Ordering::SeqCst);
    let got = receiver.wait_for(1, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 1, "the held event was given up");
}
