//! Plans and rate limits: the spec's table, exact boundaries per class, headers everywhere.

use std::time::Duration;

use agentid::domain::{OrgLimits, Plan};
use agentid::engine::admin;

use crate::helpers::{spawn_app, spawn_app_with, Options, Resp, TestApp};

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn assert_headers(res: &Resp, limit: u32) -> u32 {
    let num = |h: &str| -> u64 {
        res.header(h)
            .unwrap_or_else(|| panic!("{h} missing on a {} response", res.status))
            .parse()
            .unwrap()
    };
    assert_eq!(
        num("x-ratelimit-limit"),
        u64::from(limit),
        "status {}",
        res.status
    );
    let remaining = num("x-ratelimit-remaining");
    assert!(remaining <= u64::from(limit));
    let reset = num("x-ratelimit-reset");
    assert!(
        reset >= now_secs() && reset <= now_secs() + 61,
        "reset {reset} is Unix seconds within a minute"
    );
    remaining as u32
}

/// Sends `n` calls concurrently (so a bucket cannot refill meanwhile) and returns their statuses.
async fn burst(app: &TestApp, path: &str, key: Option<&str>, n: usize) -> Vec<u16> {
    let calls = (0..n).map(|_| app.get(path, key));
    futures_util::future::join_all(calls)
        .await
        .into_iter()
        .map(|r| r.status)
        .collect()
}

#[actix_web::test]
async fn every_response_carries_rate_limit_headers() {
    let app = spawn_app().await;
    let (id, token) = app.agent().await;
    let sk = Some(app.secret());
    for res in [
        app.get("/v1/agents", sk).await,
        app.get(&format!("/v1/agents/{id}"), sk).await,
        app.get("/v1/agents/agt_00000000000000000000000000", sk).await,
        app.get("/v1/log?limit=0", sk).await,
    ] {
        assert_headers(&res, 500);
    }
    let pk = Some(app.org.keys.publishable_live.as_str());
    assert_headers(&app.get(&format!("/v1/verify/{token}"), pk).await, 5000);
    assert_headers(&app.get(&format!("/v1/verify/{token}"), None).await, 100);
    for res in [
        app.get("/health", None).await,
        app.get("/v1/agents", None).await,
        app.get("/nope", None).await,
        app.get("/.well-known/jwks.json", None).await,
    ] {
        assert_headers(&res, 20);
    }
}

#[actix_web::test]
async fn the_spec_table_sets_each_plans_limits() {
    let app = spawn_app().await;
    let (_, token) = app.agent().await;
    for (plan, verify, other) in [
        (Plan::Free, 500, 60),
        (Plan::Developer, 5_000, 500),
        (Plan::Growth, 50_000, 2_000),
    ] {
        let org = admin::create_org(
            &app.store,
            app.engine.keys(),
            "p",
            plan,
            plan.default_limits().unwrap(),
        )
        .await
        .unwrap();
        let other_res = app.get("/v1/agents", Some(&org.keys.secret_live)).await;
        assert_eq!(other_res.status, 200);
        assert_headers(&other_res, other);
        let verify_res = app
            .get(&format!("/v1/verify/{token}"), Some(&org.keys.publishable_live))
            .await;
        assert_eq!(verify_res.status, 200);
        assert_headers(&verify_res, verify);
    }
    let limits = OrgLimits::resolve(Plan::Enterprise, Some(123_456), Some(7_890), None).unwrap();
    let ent = admin::create_org(&app.store, app.engine.keys(), "e", Plan::Enterprise, limits)
        .await
        .unwrap();
    assert_headers(&app.get("/v1/agents", Some(&ent.keys.secret_live)).await, 7_890);
}

#[actix_web::test]
async fn anonymous_buckets_pass_exactly_the_limit() {
    let app = spawn_app().await;
    // Other endpoints: 20 per minute per address.
    let statuses = burst(&app, "/v1/agents", None, 20).await;
    assert!(statuses.iter().all(|s| *s == 401), "{statuses:?}");
    let refused = app.get("/v1/agents", None).await;
    let body = refused.assert_error(429, "RATE_LIMITED");
    assert!(body["error"]["message"].as_str().unwrap().contains("20"));
    let retry: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=3).contains(&retry), "one cell comes back every 3 s: {retry}");
    assert_eq!(assert_headers(&refused, 20), 0);

    // Verify: 100 per minute per address, a separate bucket.
    let (_, token) = app.agent().await;
    let path = format!("/v1/verify/{token}");
    let statuses = burst(&app, &path, None, 100).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    let refused = app.get(&path, None).await;
    refused.assert_error(429, "RATE_LIMITED");
    assert_eq!(
        refused.header("access-control-allow-origin").as_deref(),
        Some("*"),
        "a browser receiver can read its 429"
    );
    assert_eq!(crate::health::exposed(&refused), crate::health::EXPOSED);

    // A publishable key moves the receiver to its organization's verify bucket.
    let with_pk = app.get(&path, Some(&app.org.keys.publishable_live)).await;
    assert_eq!(with_pk.status, 200);
    assert_headers(&with_pk, 5_000);
}

#[actix_web::test]
async fn organization_buckets_pass_exactly_the_limit_per_class() {
    let app = spawn_app_with(Options {
        plan: Plan::Enterprise,
        verify_limit: Some(12),
        other_limit: Some(8),
        ..Options::default()
    })
    .await;
    let (_, token) = app.agent().await; // 1 "other" call used
    let sk = app.org.keys.secret_live.clone();
    let statuses = burst(&app, "/v1/agents", Some(&sk), 7).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    let refused = app.get("/v1/agents", Some(&sk)).await;
    refused.assert_error(429, "RATE_LIMITED");
    assert!(refused.header("retry-after").is_some());

    let path = format!("/v1/verify/{token}");
    let statuses = burst(&app, &path, Some(&sk), 12).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    app.get(&path, Some(&sk)).await.assert_error(429, "RATE_LIMITED");
    // Test keys share the organization's buckets.
    app.get("/v1/agents", Some(&app.org.keys.secret_test))
        .await
        .assert_error(429, "RATE_LIMITED");
    // Another organization is not affected.
    let limits = OrgLimits::resolve(Plan::Free, None, None, None).unwrap();
    let other = admin::create_org(&app.store, app.engine.keys(), "o", Plan::Free, limits)
        .await
        .unwrap();
    assert_eq!(
        app.get("/v1/agents", Some(&other.keys.secret_live)).await.status,
        200
    );
}

/// Whoever holds an organization's publishable key (it ships inside apps) can spend at most
/// half of its verify limit: the other half stays for its secret-key receivers.
#[actix_web::test]
async fn a_publishable_key_cannot_starve_its_organizations_secret_keys() {
    let app = spawn_app_with(Options {
        plan: Plan::Enterprise,
        verify_limit: Some(20),
        other_limit: Some(100),
        ..Options::default()
    })
    .await;
    let (_, token) = app.agent().await;
    let path = format!("/v1/verify/{token}");
    let pk = app.org.keys.publishable_live.clone();
    let statuses = burst(&app, &path, Some(&pk), 10).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    let refused = app.get(&path, Some(&pk)).await;
    let body = refused.assert_error(429, "RATE_LIMITED");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("publishable"),
        "{body}"
    );
    assert_eq!(refused.header("x-ratelimit-limit").as_deref(), Some("10"));
    // The secret-key receivers still have the rest of the limit.
    let sk = app.org.keys.secret_live.clone();
    let statuses = burst(&app, &path, Some(&sk), 10).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    app.get(&path, Some(&sk)).await.assert_error(429, "RATE_LIMITED");
}

/// Attack: the publishable key (anyone has it) calling the secret-key endpoints, or none at
/// all, to spend the organization's other calls. Each call is refused (403, 404), charged to
/// the caller's address, never to the organization.
#[actix_web::test]
async fn a_publishable_key_spends_none_of_its_organizations_other_calls() {
    let app = spawn_app_with(Options {
        plan: Plan::Enterprise,
        verify_limit: Some(100),
        other_limit: Some(5),
        ..Options::default()
    })
    .await;
    let pk = app.org.keys.publishable_live.clone();
    let statuses = burst(&app, "/v1/agents", Some(&pk), 5).await;
    assert!(statuses.iter().all(|s| *s == 403), "{statuses:?}");
    let statuses = burst(&app, "/nowhere", Some(&pk), 5).await;
    assert!(statuses.iter().all(|s| *s == 404 || *s == 429), "{statuses:?}");
    assert_eq!(app.get("/v1/agents", Some(app.secret())).await.status, 200);
}

#[actix_web::test]
async fn failed_authentication_costs_the_address_a_call() {
    let app = spawn_app().await;
    let bad = format!("sk_live_{}", "x".repeat(40));
    let statuses = burst(&app, "/v1/agents", Some(&bad), 20).await;
    assert!(statuses.iter().all(|s| *s == 401), "{statuses:?}");
    // The address's anonymous bucket is spent: even a call without a key is refused now.
    app.get("/v1/agents", None)
        .await
        .assert_error(429, "RATE_LIMITED");
    let again = crate::helpers::read(
        app.client
            .get(app.url("/v1/agents"))
            .insert_header(("Authorization", format!("Bearer {bad}")))
            .send()
            .await
            .unwrap(),
    )
    .await;
    again.assert_error(429, "RATE_LIMITED");
    // A valid key is on its organization's bucket and still works.
    assert_eq!(app.get("/v1/agents", Some(app.secret())).await.status, 200);
}

#[actix_web::test]
async fn unknown_keys_cost_the_store_at_most_sixty_lookups_a_minute_per_address() {
    let app = spawn_app().await;
    // Registering looked the secret key up once: 59 look-ups are left for this address.
    let (_, token) = app.agent().await;
    let path = format!("/v1/verify/{token}");
    let unknown: Vec<String> = (0..60).map(|i| format!("pk_live_{i:040}")).collect();
    let answers = futures_util::future::join_all(unknown[..59].iter().map(|k| app.get(&path, Some(k)))).await;
    for res in &answers {
        res.assert_error(401, "UNAUTHORIZED");
    }
    // The next unknown key from this address is not looked up.
    let refused = app.get(&path, Some(&unknown[59])).await;
    let body = refused.assert_error(429, "RATE_LIMITED");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unknown API keys"),
        "{body}"
    );
    assert!(refused.header("retry-after").is_some());
    // Keys the cache holds, and calls without a key, are not affected.
    let ok = app.get(&path, Some(app.secret())).await;
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert_eq!(app.get(&path, None).await.status, 200);
}

/// Attack: unknown keys from many addresses (a routed IPv6 /48 holds 65,536 /64s, each with
/// its own budget) flooded the store's pool with look-ups. The service's own budget of
/// look-ups bounds them all together.
#[actix_web::test]
async fn unknown_keys_from_many_addresses_cost_the_store_a_bounded_number_of_lookups() {
    let app = spawn_app_with(Options {
        tweak: Box::new(|c| c.trusted_proxies = vec!["127.0.0.0/8".parse().unwrap()]),
        ..Options::unlimited()
    })
    .await;
    let (_, token) = app.agent().await;
    let path = format!("/v1/verify/{token}");
    let mut refused = 0;
    let mut sent = 0;
    let started = std::time::Instant::now();
    for round in 0..80u32 {
        let calls = (0..50u32).map(|i| {
            let key = format!("pk_live_{round:020}{i:020}");
            let from = format!("2001:db8:0:{:x}::1", round * 50 + i);
            let (app, path) = (&app, &path);
            async move {
                crate::helpers::read(
                    app.client
                        .get(app.url(path))
                        .insert_header(("Authorization", format!("Bearer {key}")))
                        .insert_header(("X-Forwarded-For", from))
                        .send()
                        .await
                        .unwrap(),
                )
                .await
            }
        });
        for res in futures_util::future::join_all(calls).await {
            sent += 1;
            if res.status == 429 {
                refused += 1;
            } else {
                res.assert_error(401, "UNAUTHORIZED");
            }
        }
    }
    assert_eq!(sent, 4000);
    // 3,000 at once, then 50 a second (the registration's look-up among them): however slow
    // the machine, no more passed.
    let passed_at_most = 3000 + 50 * (started.elapsed().as_secs() as usize + 1);
    assert!(
        sent - refused <= passed_at_most,
        "{} of {sent} look-ups from distinct addresses passed (at most {passed_at_most})",
        sent - refused
    );
    assert!(refused > 0, "no look-up was refused");
}

/// `/health` counts against nothing, and looks no unknown key up: a caller cannot spend an
/// address's look-ups there (its valid key, new to the instance, would then be refused).
#[actix_web::test]
async fn health_calls_with_unknown_keys_spend_no_lookups() {
    let app = spawn_app().await;
    for i in 0..70 {
        let res = app.get("/health", Some(&format!("pk_live_{i:040}"))).await;
        assert_eq!(res.status, 200, "{}", res.text());
    }
    let (_, token) = app.agent().await;
    let res = app
        .get(
            &format!("/v1/verify/{token}"),
            Some(&app.org.keys.publishable_live),
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
}

/// A valid key is never refused by the unknown-key budget for being popular: callers that
/// present it at once before the cache holds it share one store look-up, and refreshing the
/// entry when it expires is not a look-up of an unknown key.
#[actix_web::test]
async fn a_valid_key_used_by_many_connections_at_once_is_looked_up_once_and_never_throttled() {
    let app = spawn_app_with(Options {
        // Short: the address's budget refills one look-up per second, and the last assertion
        // holds only while none has come back since the budget was spent.
        tweak: Box::new(|c| c.engine.key_cache_ttl = Duration::from_millis(100)),
        ..Options::unlimited()
    })
    .await;
    let (_, token) = app.agent().await; // one look-up: the secret key
    let path = format!("/v1/verify/{token}");
    // Spend the address's budget (60 a minute) down to a single look-up.
    let unknown: Vec<String> = (0..58).map(|i| format!("pk_live_{i:040}")).collect();
    for res in futures_util::future::join_all(unknown.iter().map(|k| app.get(&path, Some(k)))).await {
        res.assert_error(401, "UNAUTHORIZED");
    }
    // 150 calls at once with the publishable key, which the cache has not seen yet.
    let pk = app.org.keys.publishable_live.clone();
    let burst = || futures_util::future::join_all((0..150).map(|_| app.get(&path, Some(&pk))));
    for res in burst().await {
        assert_eq!(res.status, 200, "{}", res.text());
    }
    // The budget is spent now, yet the expired entry is refreshed for everyone.
    actix_web::rt::time::sleep(Duration::from_millis(150)).await;
    for res in burst().await {
        assert_eq!(res.status, 200, "{}", res.text());
    }
    // An unknown key is still refused without a look-up.
    app.get(&path, Some(&format!("pk_live_{:040}", 99)))
        .await
        .assert_error(429, "RATE_LIMITED");
}

/// A rejected key is cached as rejected, and looking it up again once that entry expires is
/// charged to the address's budget like any unknown key: cycling a few bad keys cannot read
/// the store more than the budget allows.
#[actix_web::test]
async fn a_rejected_key_looked_up_again_after_expiry_is_charged() {
    let app = spawn_app_with(Options {
        tweak: Box::new(|c| c.engine.key_cache_ttl = Duration::from_millis(100)),
        ..Options::unlimited()
    })
    .await;
    let (_, token) = app.agent().await; // one look-up: the secret key
    let path = format!("/v1/verify/{token}");
    let bad: Vec<String> = (0..10).map(|i| format!("pk_live_{i:040}")).collect();
    // Within the cache's life a rejected key costs nothing more.
    for _ in 0..3 {
        for k in &bad {
            app.get(&path, Some(k)).await.assert_error(401, "UNAUTHORIZED");
        }
    }
    // Each round after expiry costs ten look-ups: five more rounds spend the rest of the 60
    // (one went to the secret key, ten to the first round; the budget refills one a second,
    // so a round or two of slack).
    let mut throttled = false;
    for _ in 0..8 {
        actix_web::rt::time::sleep(Duration::from_millis(120)).await;
        for k in &bad {
            let res = app.get(&path, Some(k)).await;
            if res.status == 429 {
                throttled = true;
            } else {
                res.assert_error(401, "UNAUTHORIZED");
            }
        }
    }
    assert!(
        throttled,
        "rejected keys looked up again after expiry were never charged"
    );
}

/// A balancer's health checks are never refused and spend nobody's calls, yet carry the
/// headers of the caller's bucket.
#[actix_web::test]
async fn health_is_never_limited_and_counts_against_no_bucket() {
    let app = spawn_app().await;
    let statuses = burst(&app, "/health", None, 60).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    let health = app.get("/health", None).await;
    assert_eq!(health.status, 200);
    assert_eq!(assert_headers(&health, 20), 20, "nothing was taken");
    // The address's bucket is whole: 20 other calls still pass.
    let statuses = burst(&app, "/nope", None, 20).await;
    assert!(statuses.iter().all(|s| *s == 404), "{statuses:?}");
    // Spent now, and /health says so without being refused.
    let health = app.get("/health", None).await;
    assert_eq!(health.status, 200);
    assert_eq!(assert_headers(&health, 20), 0);
    // With a key the instance knows (health looks no key up): the organization's bucket,
    // untouched by health checks.
    assert_eq!(app.get("/v1/agents", Some(app.secret())).await.status, 200);
    for _ in 0..5 {
        assert_eq!(app.get("/health", Some(app.secret())).await.status, 200);
    }
    assert_eq!(
        assert_headers(&app.get("/health", Some(app.secret())).await, 500),
        499
    );
    // Unknown keys from one address, past what it may look up: health still answers.
    for i in 0..70 {
        let key = format!("sk_live_{i:0>40}");
        let res = app.get("/health", Some(&key)).await;
        assert_eq!(res.status, 200, "{i}: {}", res.text());
    }
}

/// Behind a trusted balancer each client has its own anonymous bucket, by the address the
/// balancer recorded; from a peer that is not trusted, the same header is ignored.
#[actix_web::test]
async fn forwarded_addresses_count_only_from_trusted_proxies() {
    async fn anonymous_call(app: &TestApp, client: &str) -> u16 {
        let res = crate::helpers::read(
            app.client
                .get(app.url("/nope"))
                .insert_header(("X-Forwarded-For", format!("6.6.6.6, {client}")))
                .send()
                .await
                .unwrap(),
        )
        .await;
        res.status
    }
    let trusting = spawn_app_with(Options {
        tweak: Box::new(|c| c.trusted_proxies = vec!["127.0.0.0/8".parse().unwrap()]),
        ..Options::default()
    })
    .await;
    for _ in 0..20 {
        assert_eq!(anonymous_call(&trusting, "198.51.100.1").await, 404);
    }
    assert_eq!(anonymous_call(&trusting, "198.51.100.1").await, 429);
    assert_eq!(
        anonymous_call(&trusting, "198.51.100.2").await,
        404,
        "another client"
    );
    assert_eq!(
        trusting.get("/nope", None).await.status,
        404,
        "the balancer itself"
    );

    let untrusting = spawn_app().await;
    for _ in 0..20 {
        assert_eq!(anonymous_call(&untrusting, "198.51.100.1").await, 404);
    }
    assert_eq!(
        anonymous_call(&untrusting, "198.51.100.2").await,
        429,
        "a client cannot pick its own bucket"
    );
}

/// A client behind a trusted proxy that writes a byte outside visible ASCII into its own
/// `X-Forwarded-For` cannot make the header unreadable and have its `Forwarded` believed:
/// headers are read as bytes, and the hop the proxy appended still names the client.
#[actix_web::test]
async fn an_unreadable_forwarded_for_never_hands_the_choice_to_the_client() {
    let app = spawn_app_with(Options {
        tweak: Box::new(|c| c.trusted_proxies = vec!["127.0.0.0/8".parse().unwrap()]),
        ..Options::default()
    })
    .await;
    let call = |xff: &'static [u8], forwarded: String| {
        let req = app
            .client
            .get(app.url("/nope"))
            .insert_header((
                "X-Forwarded-For",
                actix_web::http::header::HeaderValue::from_bytes(xff).unwrap(),
            ))
            .insert_header(("Forwarded", forwarded));
        async move { crate::helpers::read(req.send().await.unwrap()).await.status }
    };
    // As nginx's `$proxy_add_x_forwarded_for` writes it: the client's own text, then the
    // address nginx saw. Each call claims a fresh `Forwarded` address; all are one client.
    for i in 0..20 {
        assert_eq!(
            call(b"1.2.3.4\xff, 198.51.100.9", format!("for=203.0.113.{i}")).await,
            404
        );
    }
    assert_eq!(
        call(b"1.2.3.4\xff, 198.51.100.9", "for=203.0.113.200".into()).await,
        429,
        "the address the proxy appended is the bucket, not the client's Forwarded"
    );
    // Nothing readable at all: the proxy's own address (here the test's, 127.0.0.1).
    for i in 0..20 {
        assert_eq!(call(b"\xff\xfe", format!("for=192.0.2.{i}")).await, 404);
    }
    assert_eq!(call(b"\xff\xfe", "for=192.0.2.200".into()).await, 429);
    assert_eq!(app.get("/nope", None).await.status, 429, "the proxy's own bucket");
}

/// Public documents are served like /health: never refused, charged to no bucket, and a
/// key sent with them is ignored (a publishable key is charged on verify only), so neither
/// a receiver fleet behind one address nor a co-tenant can starve anyone of them, and a
/// `pk_` key cannot spend its organization's calls.
#[actix_web::test]
async fn public_documents_are_never_limited_and_charge_no_bucket() {
    let app = spawn_app().await;
    let docs = [
        "/.well-known/jwks.json",
        "/.well-known/public-key.pem",
        "/.well-known/log-key",
        "/docs/errors",
        "/openapi.json",
    ];
    for doc in docs {
        let statuses = burst(&app, doc, None, 30).await;
        assert!(statuses.iter().all(|s| *s == 200), "{doc}: {statuses:?}");
        let head = crate::helpers::read(app.client.head(app.url(doc)).send().await.unwrap()).await;
        assert_ne!(head.status, 429, "{doc}");
    }
    let etag = app
        .get("/.well-known/jwks.json", None)
        .await
        .header("etag")
        .unwrap();
    for _ in 0..30 {
        let res = crate::helpers::read(
            app.client
                .get(app.url("/.well-known/jwks.json"))
                .insert_header(("If-None-Match", etag.clone()))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(res.status, 304);
    }
    // The address's anonymous bucket is whole.
    let statuses = burst(&app, "/nope", None, 20).await;
    assert!(statuses.iter().all(|s| *s == 404), "{statuses:?}");

    // Keys are ignored: a publishable key, a secret key, a key that does not exist.
    let pk = app.org.keys.publishable_live.clone();
    let bogus = format!("sk_live_{}", "x".repeat(40));
    for key in [pk.as_str(), app.secret(), bogus.as_str(), "not a bearer token"] {
        for doc in docs {
            let res = app.get(doc, Some(key)).await;
            assert_eq!(res.status, 200, "{doc} with {key:.8}");
        }
    }
    // The organization's "other" bucket (500 a minute here) is untouched.
    let res = app.get("/v1/agents", Some(app.secret())).await;
    assert_eq!(res.status, 200);
    assert_eq!(assert_headers(&res, 500), 499, "only this call was charged");
}

/// Attack: a publishable key (anyone may have one) whose row the store cannot read (an
/// outage of the key read alone, the pool busy) is taken by verify as no key, and such calls
/// were charged nowhere: unlimited recorded verifications. They cost what anonymous ones do.
#[actix_web::test]
async fn verify_calls_with_a_key_the_store_cannot_check_cost_what_anonymous_ones_do() {
    let app = spawn_app_with(Options {
        tweak: Box::new(|c| c.engine.key_cache_ttl = Duration::from_millis(100)),
        ..Options::default()
    })
    .await;
    let (_, token) = app.agent().await;
    let pk = app.org.keys.publishable_live.clone();
    let path = format!("/v1/verify/{token}");
    assert_eq!(app.get(&path, Some(&pk)).await.status, 200);
    app.raw_execute("ALTER TABLE api_keys RENAME TO api_keys_gone")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    let mut statuses = std::collections::BTreeMap::new();
    for _ in 0..150 {
        *statuses
            .entry(app.get(&path, Some(&pk)).await.status)
            .or_insert(0) += 1;
    }
    app.raw_execute("ALTER TABLE api_keys_gone RENAME TO api_keys")
        .await
        .unwrap();
    assert!(statuses.contains_key(&429), "{statuses:?}");
}
