//! Token Status Lists: the `status` claim, the signed lists, and how soon they show a
//! revocation, on one instance and across a fleet.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use agentid::domain::KeyMode;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde_json::Value;

use crate::helpers::{spawn_app, spawn_app_with, spawn_fleet, Options, Resp, TestApp};

/// A JWT's part `i` (0 header, 1 claims) as JSON.
pub(crate) fn part(jwt: &str, i: usize) -> Value {
    let bytes = URL_SAFE_NO_PAD.decode(jwt.split('.').nth(i).unwrap()).unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

/// The `status.status_list` of a token: (idx, uri).
pub(crate) fn place(token: &str) -> (u64, String) {
    let claims = part(token, 1);
    let list = &claims["status"]["status_list"];
    (
        list["idx"].as_u64().unwrap(),
        list["uri"].as_str().unwrap().to_owned(),
    )
}

/// GET a list by its URI, with extra headers.
pub(crate) async fn fetch(app: &TestApp, uri: &str, headers: &[(&str, &str)]) -> Resp {
    let mut req = app.client.get(uri);
    for (name, value) in headers {
        req = req.insert_header((*name, *value));
    }
    crate::helpers::read(req.send().await.unwrap()).await
}

/// Checks a served list's signature against JWKS and form; returns its claims.
pub(crate) async fn checked_list(app: &TestApp, uri: &str) -> Value {
    let res = fetch(app, uri, &[]).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(
        res.header("content-type").as_deref(),
        Some("application/statuslist+jwt")
    );
    assert_eq!(res.header("cache-control").as_deref(), Some("public, max-age=60"));
    assert!(res.header("etag").is_some());
    let jwt = res.text();
    let (header, claims) = crate::helpers::checked_with_jwks(app, &jwt).await;
    assert_eq!(header["typ"], "statuslist+jwt");
    assert_eq!(claims["iss"], app.base.as_str());
    assert_eq!(claims["sub"], uri);
    assert_eq!(claims["ttl"], 60);
    assert!(claims["exp"].as_i64().unwrap() >= claims["iat"].as_i64().unwrap() + 60);
    assert_eq!(claims["status_list"]["bits"], 1);
    claims
}

/// The status (0 or 1) at `idx` of a list's claims.
pub(crate) fn status_at(claims: &Value, idx: u64) -> u8 {
    let lst = URL_SAFE_NO_PAD
        .decode(claims["status_list"]["lst"].as_str().unwrap())
        .unwrap();
    let bytes = miniz_oxide::inflate::decompress_to_vec_zlib(&lst).expect("zlib");
    (bytes[(idx / 8) as usize] >> (idx % 8)) & 1
}

/// Polls `app`'s list until `idx` reads 1; how long it took.
pub(crate) async fn until_revoked(app: &TestApp, uri: &str, idx: u64) -> Duration {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(5) {
        let claims = part(&fetch(app, uri, &[]).await.text(), 1);
        if status_at(&claims, idx) == 1 {
            return started.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{uri} never showed {idx} revoked");
}

#[actix_web::test]
async fn a_token_names_its_place_and_the_list_shows_its_revocation() {
    let app = spawn_app().await;
    let (agent, token) = app.agent().await;
    let (_, other) = app.agent().await;
    let (idx, uri) = place(&token);
    assert!(uri.starts_with(&format!("{}/v1/status/sl_", app.base)), "{uri}");
    assert_eq!(place(&other).1, uri, "one list while it has room");
    let reissued = app
        .post(
            &format!("/v1/agents/{agent}/issue-token"),
            Some(app.secret()),
            None,
        )
        .await
        .json();
    assert_eq!(
        place(reissued["token"].as_str().unwrap()),
        (idx, uri.clone()),
        "the place is kept"
    );

    let claims = checked_list(&app, &uri).await;
    assert_eq!(status_at(&claims, idx), 0);
    assert_eq!(app.revoke(&agent, None).await.status, 200);
    let took = until_revoked(&app, &uri, idx).await;
    assert!(took < Duration::from_secs(2), "{took:?}");
    let claims = checked_list(&app, &uri).await;
    assert_eq!(status_at(&claims, place(&other).0), 0, "others stay valid");

    // Caching, HEAD, content negotiation, unknown lists; keys ignored, never limited.
    let etag = fetch(&app, &uri, &[]).await.header("etag").unwrap();
    assert_eq!(
        fetch(&app, &uri, &[("If-None-Match", etag.as_str())])
            .await
            .status,
        304
    );
    let head = crate::helpers::read(app.client.head(&uri).send().await.unwrap()).await;
    assert_eq!(head.status, 200);
    assert!(head.text().is_empty());
    for ok in [
        "*/*",
        "application/statuslist+jwt",
        "text/html, application/statuslist+jwt;q=0.9",
    ] {
        assert_eq!(fetch(&app, &uri, &[("Accept", ok)]).await.status, 200, "{ok}");
    }
    fetch(&app, &uri, &[("Accept", "application/json")])
        .await
        .assert_error(406, "NOT_ACCEPTABLE");
    fetch(&app, &format!("{}/v1/status/sl_nope", app.base), &[])
        .await
        .assert_error(404, "NOT_FOUND");
    let auth = format!("Bearer {}", app.org.keys.publishable_live);
    for _ in 0..40 {
        assert_eq!(
            fetch(&app, &uri, &[("Authorization", auth.as_str())])
                .await
                .status,
            200
        );
    }
    let cors = fetch(&app, &uri, &[("Origin", "https://receiver.example")]).await;
    assert_eq!(cors.header("access-control-allow-origin").as_deref(), Some("*"));
    let metrics = agentid::telemetry::metrics_handle().render();
    assert!(
        metrics.contains("agentid_status_list_publish_delay_seconds_count"),
        "{metrics}"
    );
}

/// Places are drawn at random among the free ones, unique, inside the list; a full list
/// (past half its places) gives way to a new one.
#[actix_web::test]
async fn places_are_random_unique_and_lists_open_as_they_fill() {
    let app = spawn_app_with(Options {
        tweak: Box::new(|c| c.engine.status.size = 64),
        ..Options::unlimited()
    })
    .await;
    let mut places = Vec::new();
    for _ in 0..40 {
        places.push(place(&app.agent().await.1));
    }
    let lists: Vec<&String> = places
        .iter()
        .map(|(_, uri)| uri)
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(lists.len(), 2, "32 places of 64, then a new list: {lists:?}");
    assert!(places.iter().all(|(idx, _)| *idx < 64));
    let unique: HashSet<_> = places.iter().collect();
    assert_eq!(unique.len(), places.len(), "{places:?}");
    let first: Vec<u64> = places[..32].iter().map(|(i, _)| *i).collect();
    let mut sorted = first.clone();
    sorted.sort_unstable();
    assert_ne!(
        first, sorted,
        "an index says nothing of the order of registration"
    );
    for uri in lists {
        checked_list(&app, uri).await;
    }
}

/// A list made when the configured size was smaller fills to half of its own size, not of
/// the new one: filled to the last place, its random draws missed more and more often, and
/// each miss failed a registration with a 500.
#[actix_web::test]
async fn a_larger_list_size_leaves_the_older_list_half_free() {
    let mut app = spawn_app_with(Options {
        tweak: Box::new(|c| c.engine.status.size = 64),
        ..Options::unlimited()
    })
    .await;
    // The list's id: a restarted app serves at another port.
    let list = |uri: String| uri.rsplit('/').next().unwrap().to_owned();
    let first = list(place(&app.agent().await.1).1);
    app.config.engine.status.size = 128;
    let app = app.restart().await;
    let mut in_first = 1;
    for _ in 0..63 {
        let (_, token) = app.agent().await;
        let (idx, uri) = place(&token);
        if list(uri) == first {
            in_first += 1;
        } else {
            assert!(idx < 128, "{idx}");
        }
    }
    assert_eq!(in_first, 32, "half of the older list's 64 places");
}

/// Revoked on one instance, shown by the other's list within 2 s; and two instances
/// registering at once never share a place.
#[actix_web::test]
async fn a_fleet_serves_one_revocation_everywhere_and_never_shares_a_place() {
    let fleet = spawn_fleet(2, Options::unlimited()).await;
    let (a, b) = (&fleet[0], &fleet[1]);
    let (from_a, from_b) = futures_util::future::join(register(a), register(b)).await;
    let places: Vec<(u64, String)> = from_a.iter().chain(&from_b).map(|t| place(t)).collect();
    let unique: HashSet<_> = places.iter().collect();
    assert_eq!(unique.len(), 50, "{places:?}");

    let token = &from_a[0];
    let agent = part(token, 1)["sub"].as_str().unwrap().to_owned();
    let (idx, uri) = place(token);
    let on_b = uri.replace(&a.base, &b.base);
    checked_list(b, &on_b).await;
    assert_eq!(a.revoke(&agent, None).await.status, 200);
    let took = until_revoked(b, &on_b, idx).await;
    assert!(took < Duration::from_secs(2), "{took:?}");
}

/// Lists are signed by the key that signs tokens: after a rotation activates a new key,
/// the list carries its kid.
#[actix_web::test]
async fn lists_follow_the_signing_key() {
    let app = spawn_app().await;
    let (_, token) = app.agent().await;
    let (_, uri) = place(&token);
    let root = agentid::keys::KeyRing::load(&app.config.signing_key_file)
        .unwrap()
        .unwrap();
    assert_eq!(part(&fetch(&app, &uri, &[]).await.text(), 0)["kid"], root.kid());
    let rotated = agentid::engine::admin::rotate_signing_key(
        &app.store,
        &root,
        &app.config.signing_key_file,
        Duration::ZERO,
    )
    .await
    .unwrap();
    app.engine.refresh_keys().await.unwrap();
    let started = Instant::now();
    loop {
        let res = fetch(&app, &uri, &[]).await;
        if part(&res.text(), 0)["kid"] == rotated.kid.as_str() {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(2), "still {}", res.text());
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    checked_list(&app, &uri).await;
}

/// 25 registrations on `app`, one after the other: their tokens.
async fn register(app: &TestApp) -> Vec<String> {
    let mut tokens = Vec::new();
    for _ in 0..25 {
        tokens.push(app.agent().await.1);
    }
    tokens
}

/// A receiver written with stock libraries (jose and @sd-jwt/jwt-status-list in Node;
/// PyJWT and zlib in Python) reads the agent's status from the list the token names: valid,
/// then, after the revocation, revoked.
#[actix_web::test]
async fn stock_receivers_read_a_revocation_from_the_list() {
    let app = spawn_app().await;
    let (agent, token) = app.agent().await;
    let dir = tempfile::tempdir().unwrap();
    let (idx, _) = place(&token);
    let receivers = ["status.mjs", "status.py"];
    for name in receivers {
        let seen = crate::readme::run_beside(name, dir.path(), &token, &app.base)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(seen, serde_json::json!({"idx": idx, "status": 0}), "{name}");
    }
    assert_eq!(app.revoke(&agent, None).await.status, 200);
    for name in receivers {
        let started = Instant::now();
        loop {
            let seen = crate::readme::run_beside(name, dir.path(), &token, &app.base)
                .await
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            if seen["status"] == 1 {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(2), "{name}: {seen}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Agents registered before status lists (stored without a place) get one from migration
/// 15: each mode's on a list of their own, full from the start so that no new agent is drawn
/// into it. Their next token carries the place and their revocation sets its bit.
#[actix_web::test]
async fn agents_from_before_lists_are_placed_by_the_migration() {
    let app = spawn_app().await;
    let (agent, _) = app.agent().await;
    let template = app
        .store
        .get_agent(&crate::helpers::agent_id(&agent))
        .await
        .unwrap()
        .unwrap();
    let mut old = Vec::new();
    for mode in [KeyMode::Live, KeyMode::Live, KeyMode::Test] {
        let mut a = template.clone();
        a.id = agentid::domain::AgentId::generate();
        a.mode = mode;
        a.status = None;
        // Its binding sealed, as the first start after seals does.
        a.key_sealed_at = Some(agentid::domain::Millis::now());
        a.key_mac = Some(
            app.engine
                .keys()
                .seal(agentid::keys::Sealed::AgentKey, &a.key_canonical()),
        );
        crate::helpers::insert_agent(&app.db.url, &a).await.unwrap();
        old.push(a.id);
    }
    // As a database the migration has not reached yet.
    app.raw_execute("DELETE FROM _sqlx_migrations WHERE version = 15")
        .await
        .unwrap();
    let app = app.restart().await;

    let mut places = Vec::new();
    for id in &old {
        places.push(
            app.store
                .get_agent(id)
                .await
                .unwrap()
                .unwrap()
                .status
                .expect("placed"),
        );
    }
    let template_list = template.status.unwrap().list;
    let (live, test) = (&places[0].list, &places[2].list);
    assert_eq!(&places[1].list, live, "one list for a mode's agents");
    assert!(live != test && *live != template_list && *test != template_list);
    assert_ne!(places[0].idx, places[1].idx);
    assert!(places.iter().all(|p| p.idx < 2));
    let sizes: std::collections::HashMap<String, u64> =
        app.store.status_lists().await.unwrap().into_iter().collect();
    assert_eq!((sizes[live.as_str()], sizes[test.as_str()]), (8, 8));

    // A new agent goes elsewhere; an old one's next token carries its place.
    let (_, fresh) = app.agent().await;
    assert!(!place(&fresh).1.ends_with(live.as_str()));
    let res = app
        .post(
            &format!("/v1/agents/{}/issue-token", old[0]),
            Some(app.secret()),
            None,
        )
        .await
        .json();
    let (idx, uri) = place(res["token"].as_str().unwrap());
    assert_eq!(idx, places[0].idx);
    assert!(uri.ends_with(live.as_str()), "{uri}");
    assert_eq!(status_at(&checked_list(&app, &uri).await, idx), 0);
    assert_eq!(app.revoke(old[0].as_str(), None).await.status, 200);
    until_revoked(&app, &uri, idx).await;
}

/// Attack, by someone who can write the database: status list rows of their own, one dated in
/// the future (it would stay the newest, and every registration would open a new list beside
/// it), a full one dated just inside the fleet's clocks (the same, for minutes), one of 2
/// places (no instance holds it: an agent placed there would have no list to be revoked in)
/// and one of 2^62 places (every instance would allocate its bits at start). None is used nor
/// held: registrations fill the real list, whose every place is served, and a restart comes up.
#[actix_web::test]
async fn list_rows_written_into_the_database_are_neither_used_nor_held() {
    let app = spawn_app_with(Options {
        tweak: Box::new(|c| c.engine.status.size = 64),
        ..Options::unlimited()
    })
    .await;
    let first = place(&app.agent().await.1).1;
    let future = agentid::domain::Millis::now().0 + 86_400_000;
    let now = agentid::domain::Millis::now().0;
    for (id, size, allocated, at) in [
        ("sl_01jd0000000000000000000000", 64, 0, future),
        ("sl_01jd0000000000000000000001", 1_i64 << 62, 0, 1),
        ("sl_01jd0000000000000000000002", 64, 64, now + 240_000),
        ("sl_01jd0000000000000000000003", 2, 0, now + 200_000),
    ] {
        app.raw_execute(&format!(
            "INSERT INTO status_lists (id, size, allocated, created_at, mode) VALUES ('{id}', {size}, {allocated}, {at}, 'live')"
        ))
        .await
        .unwrap();
    }
    let mut lists = HashSet::new();
    for _ in 0..5 {
        let (_, uri) = place(&app.agent().await.1);
        checked_list(&app, &uri).await;
        lists.insert(uri);
    }
    assert_eq!(lists, HashSet::from([first]), "the real list is filled");
    let app = app.restart().await;
    assert_eq!(app.get("/health", None).await.status, 200);
}

/// A cache keeps a list no longer than its `exp`: `max-age` is the ttl, or what is left of
/// the signed list's life when that is less (a short ttl, whose `iat` is rounded down to the
/// second, or a publisher that fell behind).
#[actix_web::test]
async fn a_list_is_never_cached_past_its_exp() {
    let app = spawn_app_with(Options {
        tweak: Box::new(|c| c.engine.status.ttl = Duration::from_secs(1)),
        ..Options::unlimited()
    })
    .await;
    let (_, uri) = place(&app.agent().await.1);
    for _ in 0..40 {
        let sent = agentid::domain::Millis::now().0;
        let res = fetch(&app, &uri, &[]).await;
        assert_eq!(res.status, 200, "{}", res.text());
        let cache = res.header("cache-control").unwrap();
        let max_age: i64 = cache.strip_prefix("public, max-age=").unwrap().parse().unwrap();
        let exp = part(&res.text(), 1)["exp"].as_i64().unwrap();
        assert!(
            sent + max_age * 1000 <= exp * 1000,
            "sent at {sent} ms, {cache}, exp {exp} s"
        );
        tokio::time::sleep(Duration::from_millis(75)).await;
    }
}
