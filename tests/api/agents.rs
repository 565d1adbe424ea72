use serde_json::{json, Value};

use crate::helpers::{spawn_app, spawn_app_with, Options, TestApp};
use agentid::domain::Plan;

fn ts_ms(v: &Value) -> i64 {
    let s = v.as_str().unwrap_or_else(|| panic!("not a timestamp: {v}"));
    assert!(
        s.len() == 24 && s.ends_with('Z') && s.as_bytes()[19] == b'.',
        "{s}"
    );
    let t = humantime::parse_rfc3339(s).unwrap();
    t.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

#[actix_web::test]
async fn register_returns_the_agent_and_a_token_once() {
    let app = spawn_app().await;
    let res = app
        .post(
            "/v1/agents/register",
            Some(app.secret()),
            Some(&json!({
                "name": "Billing bot", "issuer_domain": "Billing.Example.COM",
                "scopes": ["read:invoices", "write:invoices"], "description": "pays bills",
            })),
        )
        .await;
    assert_eq!(res.status, 201, "{}", res.text());
    assert_eq!(res.header("cache-control").as_deref(), Some("no-store"));
    let a = res.json();
    let id = a["agent_id"].as_str().unwrap();
    assert!(id.starts_with("agt_") && id.len() == 30, "{id}");
    assert_eq!(a["name"], "Billing bot");
    assert_eq!(a["issuer"], "billing.example.com");
    assert_eq!(a["scopes"], json!(["read:invoices", "write:invoices"]));
    let token = a["token"].as_str().unwrap();
    assert_eq!(a["verify_url"], format!("{}/v1/verify/{token}", app.base));
    assert_eq!(
        a["public_key_url"],
        format!("{}/.well-known/public-key.pem", app.base)
    );
    let lifetime = ts_ms(&a["expires_at"]) - crate::tokens::now_ms();
    assert!(
        (86_390_000..=86_400_000).contains(&lifetime),
        "default lifetime is 24h: {lifetime}"
    );
    let keys: Vec<&String> = a.as_object().unwrap().keys().collect();
    assert_eq!(keys.len(), 8, "exactly the spec's fields: {keys:?}");

    let v = app.verify(token).await;
    assert_eq!(v["valid"], true);
    assert_eq!(v["description"], "pays bills");
}

#[actix_web::test]
async fn register_rejects_each_broken_field_by_name() {
    let app = spawn_app().await;
    let base = json!({"name": "n", "issuer_domain": "example.com", "scopes": ["read:x"]});
    let cases: Vec<(&str, Value, &str)> = vec![
        ("name", json!(null), "name"),
        ("name", json!(""), "name"),
        ("name", json!("x".repeat(129)), "name"),
        ("name", json!("bad\u{1}name"), "name"),
        ("name", json!(42), "name"),
        ("issuer_domain", json!(null), "issuer_domain"),
        ("issuer_domain", json!("not a domain"), "issuer_domain"),
        ("issuer_domain", json!("-x.com"), "issuer_domain"),
        ("scopes", json!(null), "scopes"),
        ("scopes", json!([]), "scopes"),
        ("scopes", json!("read:x"), "scopes"),
        ("scopes", json!(["read"]), "scopes"),
        ("scopes", json!(["READ:x"]), "scopes"),
        ("scopes", json!(["read:x", "read:x"]), "scopes"),
        ("scopes", json!([1]), "scopes"),
        ("scopes", json!([format!("a:{}", "b".repeat(127))]), "scopes"),
        (
            "scopes",
            Value::Array((0..65).map(|i| json!(format!("read:r{i}"))).collect()),
            "scopes",
        ),
        ("description", json!("d".repeat(1025)), "description"),
        ("description", json!(["x"]), "description"),
        ("expiry_seconds", json!(0), "expiry_seconds"),
        ("expiry_seconds", json!(-5), "expiry_seconds"),
        ("expiry_seconds", json!(1.5), "expiry_seconds"),
        ("expiry_seconds", json!(-0.0), "expiry_seconds"),
        ("expiry_seconds", json!(0.5), "expiry_seconds"),
        ("expiry_seconds", json!("60"), "expiry_seconds"),
        ("admin", json!(true), "admin"),
    ];
    for (field, value, named) in cases {
        let mut body = base.clone();
        if value.is_null() {
            body.as_object_mut().unwrap().remove(field);
        } else {
            body[field] = value.clone();
        }
        let res = app
            .post("/v1/agents/register", Some(app.secret()), Some(&body))
            .await;
        let err = res.assert_error(400, "VALIDATION_ERROR");
        let msg = err["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains(named),
            "{field}={value}: message {msg:?} should name {named}"
        );
    }
    // At the limits a scope passes: 128 characters in all, however they are split between
    // action and resource (the OpenAPI schema's pattern and maxLength, checked in ops.rs,
    // once refused the first two).
    let edges = [
        format!("{}:b", "a".repeat(126)),
        format!("a:{}", "b".repeat(126)),
        format!("{}:{}", "a".repeat(64), "b".repeat(63)),
    ];
    let mut body = base.clone();
    body["scopes"] = json!(edges);
    let res = app
        .post("/v1/agents/register", Some(app.secret()), Some(&body))
        .await;
    assert_eq!(res.status, 201, "{}", res.text());
    assert_eq!(res.json()["scopes"], json!(edges));
}

#[actix_web::test]
async fn register_rejects_bodies_that_are_not_json_objects() {
    let app = spawn_app().await;
    let send = |ct: Option<&'static str>, body: Vec<u8>| {
        let mut req = app
            .client
            .post(app.url("/v1/agents/register"))
            .insert_header(("Authorization", format!("Bearer {}", app.secret())));
        if let Some(ct) = ct {
            req = req.insert_header(("Content-Type", ct));
        }
        req.send_body(body)
    };
    let json = Some("application/json");
    for body in [&b"{not json"[..], b"", b"[1,2]", b"\"s\"", b"null"] {
        let res = crate::helpers::read(send(json, body.to_vec()).await.unwrap()).await;
        res.assert_error(400, "INVALID_REQUEST");
    }
    let res = crate::helpers::read(send(Some("text/plain"), b"{}".to_vec()).await.unwrap()).await;
    res.assert_error(415, "INVALID_REQUEST");
    let res = crate::helpers::read(send(None, b"{}".to_vec()).await.unwrap()).await;
    res.assert_error(415, "INVALID_REQUEST");
    let res = crate::helpers::read(
        send(
            Some("application/json; charset=utf-8"),
            br#"{"name":"n","issuer_domain":"a.io","scopes":["r:x"]}"#.to_vec(),
        )
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(res.status, 201, "{}", res.text());
    let big = format!(
        r#"{{"name":"n","issuer_domain":"a.io","scopes":["r:x"],"description":"{}"}}"#,
        "x".repeat(70_000)
    );
    let res = crate::helpers::read(send(json, big.into_bytes()).await.unwrap()).await;
    res.assert_error(413, "PAYLOAD_TOO_LARGE");
}

/// A body sent a byte at a time holds its call no longer than the body's time (10 s): the call
/// ends with a 400 that says so, and a body of a stated length its connection too (a chunked
/// one actix reads to its end, however slowly it comes: docs/operations.md).
#[actix_web::test]
async fn a_body_that_comes_too_slowly_ends_the_call() {
    let app = spawn_app().await;
    let (sized, chunked) = tokio::join!(
        slow_body(&app, "Content-Length: 1000\r\n\r\n{", b" ", true),
        slow_body(
            &app,
            "Transfer-Encoding: chunked\r\n\r\n1\r\n{\r\n",
            b"1\r\n \r\n",
            false
        ),
    );
    for answer in [sized, chunked] {
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
        assert!(answer.contains("did not arrive within 10 s"), "{answer}");
    }
}

/// A register call whose head ends with `head_end`, then `more` every half second: its answer,
/// read whole (and with `closed`, until the server closes the connection), within 15 s.
async fn slow_body(app: &TestApp, head_end: &str, more: &[u8], closed: bool) -> String {
    use actix_web::rt::net::TcpStream;
    use std::time::{Duration, Instant};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let addr = app.base.trim_start_matches("http://");
    let mut conn = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/agents/register HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\n{head_end}",
        app.secret()
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    let started = Instant::now();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    let whole = |a: &[u8]| a.windows(4).any(|w| w == b"\r\n\r\n") && a.ends_with(b"}");
    while closed || !whole(&answer) {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "no answer, or the connection still open, after 15 s: {}",
            String::from_utf8_lossy(&answer)
        );
        match actix_web::rt::time::timeout(Duration::from_millis(500), conn.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => answer.extend_from_slice(&buf[..n]),
            Err(_) => {
                let _ = conn.write_all(more).await;
            }
        }
    }
    String::from_utf8_lossy(&answer).into_owned()
}

#[actix_web::test]
async fn expiry_is_capped_by_the_plan() {
    let app = spawn_app_with(Options {
        plan: Plan::Free,
        ..Options::default()
    })
    .await;
    // A custom maximum stored for a free organization (older versions took one, and the
    // upgrade sealed it as it was) is not enforced: the plan's table is.
    let id = crate::helpers::org_id(&app.org.org_id);
    let mut org = app.store.get_org(&id).await.unwrap().unwrap();
    org.stored_limits.max_expiry_seconds = 31_536_000;
    org.sealed_at = agentid::domain::Millis::now();
    let seal: String = app
        .engine
        .keys()
        .seal(agentid::keys::Sealed::Organization, &org.canonical())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let seal = if app.db.is_postgres() {
        format!("'\\x{seal}'::bytea")
    } else {
        format!("X'{seal}'")
    };
    let legacy = format!(
        "UPDATE orgs SET max_expiry_seconds = 31536000, mac = {seal}, sealed_at = {} WHERE id = '{}'",
        org.sealed_at.0, app.org.org_id
    );
    assert_eq!(app.raw_execute(&legacy).await.unwrap(), 1);
    let body = |s: u64| json!({"name": "n", "issuer_domain": "example.com", "scopes": ["read:x"], "expiry_seconds": s});
    let res = app
        .post("/v1/agents/register", Some(app.secret()), Some(&body(86_401)))
        .await;
    let err = res.assert_error(400, "EXPIRY_TOO_LONG");
    assert!(err["error"]["message"].as_str().unwrap().contains("86400"));
    let ok = app.register(body(86_400)).await;
    let ok2 = app.register(body(60)).await;
    let lifetime = ts_ms(&ok2["expires_at"]) - crate::tokens::now_ms();
    assert!((50_000..=60_000).contains(&lifetime), "{lifetime}");
    assert!(ok["token"].is_string());
    let res = app
        .post("/v1/agents/register", Some(app.secret()), Some(&body(u64::MAX)))
        .await;
    res.assert_error(400, "EXPIRY_TOO_LONG");
    // A whole number however written is one (JSON Schema's integer: a Python client's
    // `timedelta(days=1).total_seconds()` sends 86400.0); one past u64 is too long, not a
    // wrong type.
    for (written, ok) in [(86_400.0, true), (60.0, true), (1e23, false)] {
        let body = json!({"name": "n", "issuer_domain": "example.com", "scopes": ["read:x"],
                          "expiry_seconds": written});
        let res = app
            .post("/v1/agents/register", Some(app.secret()), Some(&body))
            .await;
        if ok {
            assert_eq!(res.status, 201, "{written}: {}", res.text());
        } else {
            res.assert_error(400, "EXPIRY_TOO_LONG");
        }
    }
}

/// An organization whose longest token is shorter than the default day registers an agent
/// without `expiry_seconds`: the token lives that longest, never refused for a lifetime the
/// caller never asked for.
#[actix_web::test]
async fn leaving_the_lifetime_out_gives_the_organizations_longest_when_shorter() {
    let app = spawn_app_with(Options::unlimited()).await;
    let shorter = agentid::engine::admin::LimitChange {
        max_expiry_seconds: Some(300),
        ..Default::default()
    };
    agentid::engine::admin::set_limits(&app.store, app.engine.keys(), &app.org.org_id, shorter)
        .await
        .unwrap();
    let a = app
        .register(json!({"name": "n", "issuer_domain": "example.com", "scopes": ["read:x"]}))
        .await;
    let lifetime = ts_ms(&a["expires_at"]) - crate::tokens::now_ms();
    assert!((290_000..=300_000).contains(&lifetime), "{lifetime}");
    // Asked for, a longer one is still refused.
    let res = app
        .post(
            "/v1/agents/register",
            Some(app.secret()),
            Some(
                &json!({"name": "n", "issuer_domain": "example.com", "scopes": ["read:x"],
                         "expiry_seconds": 301}),
            ),
        )
        .await;
    res.assert_error(400, "EXPIRY_TOO_LONG");
}

/// Attack on the agent's owner: registered without a key, with a token close to the size
/// limit, an agent could never be bound to one (the binding's `cnf` pushed its token past
/// 4096 bytes, and scopes cannot change). Registration leaves room for the binding.
#[actix_web::test]
async fn every_agent_registered_can_be_bound_to_a_key() {
    let app = spawn_app_with(Options::unlimited()).await;
    // Scopes of `chars` characters in all, at most 128 each.
    let scopes = |chars: usize| {
        let mut out = Vec::new();
        let mut left = chars;
        while left > 0 {
            let prefix = format!("s{}:", out.len());
            let body = (left.saturating_sub(prefix.len())).clamp(1, 128 - prefix.len());
            left = left.saturating_sub(prefix.len() + body);
            out.push(format!("{prefix}{}", "x".repeat(body)));
        }
        out
    };
    let key = crate::dpop::AgentKey::ed();
    let mut registered = 0;
    for chars in (2400..3400).step_by(3) {
        let body = json!({"name": "n", "issuer_domain": "example.com", "scopes": scopes(chars)});
        let res = app
            .post("/v1/agents/register", Some(app.secret()), Some(&body))
            .await;
        if res.status == 400 {
            break;
        }
        assert_eq!(res.status, 201, "{}", res.text());
        registered += 1;
        let id = res.json()["agent_id"].as_str().unwrap().to_owned();
        let bound = app
            .post(
                &format!("/v1/agents/{id}/issue-token"),
                Some(app.secret()),
                Some(&json!({"jwk": key.jwk()})),
            )
            .await;
        assert_eq!(
            bound.status,
            201,
            "{chars} characters of scopes: {}",
            bound.text()
        );
    }
    assert!(registered > 0, "none registered");
}

/// Attack: an organization of millions of agents asking for its whole list made an instance
/// hold every one of them, as rows, summaries and JSON at once. The unpaged list is sent as
/// it is read, a page at a time (chunked, no Content-Length), and is still the whole list,
/// newest first.
#[actix_web::test]
async fn the_whole_list_is_sent_as_it_is_read() {
    let app = spawn_app_with(Options::unlimited()).await;
    let body = json!({"name": "n", "issuer_domain": "example.com", "scopes": ["read:x"]});
    for _ in 0..41 {
        let batch = (0..25).map(|_| app.post("/v1/agents/register", Some(app.secret()), Some(&body)));
        for res in futures_util::future::join_all(batch).await {
            assert_eq!(res.status, 201, "{}", res.text());
        }
    }
    let res = app.get("/v1/agents", Some(app.secret())).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert!(res.header("content-length").is_none(), "sent whole");
    let ids: Vec<String> = res
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 1025);
    assert!(ids.windows(2).all(|w| w[0] > w[1]), "newest first, each once");
    // None: an empty list is an empty array.
    let other = crate::delegation::org_b(&app).await;
    let res = app.get("/v1/agents", Some(&other.keys.secret_live)).await;
    assert_eq!(res.json(), json!([]));
}

/// Attack: unpaged lists asked for and never read. Each is sent as its reader takes it, so
/// it held its connection and a page of up to 1,000 agents (megabytes, with long scopes) for
/// as long as the reader liked, and an organization could open one per call it may make. The
/// pages an organization's lists hold at once on an instance are bounded (16 MiB); paged
/// lists are not counted, and a list closed frees what it held.
#[actix_web::test]
async fn the_pages_unread_lists_hold_are_bounded() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let app = spawn_app_with(Options::unlimited()).await;
    // 800 agents of 64 scopes of 120 characters (written straight into the store: no token
    // holds that many), about 6.5 MB of JSON: more than the connection's buffers take unread,
    // and three of them more than an organization's lists may hold.
    let scopes = serde_json::to_string(
        &(0..64)
            .map(|i| format!("s{i:02}:{}", "x".repeat(116)))
            .collect::<Vec<_>>(),
    )
    .unwrap();
    let (mac, now) = (
        crate::helpers::blob(&app, &[7; 32]),
        agentid::domain::Millis::now().0,
    );
    let rows = |id: &str| {
        format!(
            "INSERT INTO agents (id, org_id, mode, name, issuer_domain, description, scopes, created_at, \
             issued_at, expires_at, key_mac, key_sealed_at) SELECT {id}, '{org}', 'live', 'bulk', \
             'example.com', '', '{scopes}', 1, 1, 4102444800000, {mac}, {now}",
            org = app.org.org_id
        )
    };
    let insert = if app.db.is_postgres() {
        rows("'agt_01jd' || lpad(i::text, 22, '0')") + " FROM generate_series(1, 800) AS i"
    } else {
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 800) ".to_owned()
            + &rows("'agt_01jd' || substr('0000000000000000000000' || i, -22)")
            + " FROM n"
    };
    assert_eq!(app.raw_execute(&insert).await.unwrap(), 800);
    let addr = app.base.trim_start_matches("http://").to_owned();
    let ask = format!(
        "GET /v1/agents HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\n\r\n",
        app.secret()
    );
    // Unread lists: each connection reads the answer's first bytes, then nothing more.
    let mut unread = Vec::new();
    for _ in 0..2 {
        let mut c = tokio::net::TcpStream::connect(&addr).await.unwrap();
        c.write_all(ask.as_bytes()).await.unwrap();
        let mut head = [0u8; 12];
        c.read_exact(&mut head).await.unwrap();
        assert_eq!(&head, b"HTTP/1.1 200", "{}", String::from_utf8_lossy(&head));
        unread.push(c);
    }
    let res = app.get("/v1/agents", Some(app.secret())).await;
    res.assert_error(429, "RATE_LIMITED");
    assert!(res.header("retry-after").is_some());
    let paged = app.get("/v1/agents?limit=5", Some(app.secret())).await;
    assert_eq!(paged.status, 200, "{}", paged.text());
    // Another organization's lists are its own.
    let other = crate::delegation::org_b(&app).await;
    assert_eq!(
        app.get("/v1/agents", Some(&other.keys.secret_live)).await.status,
        200
    );
    // One reader gone: its place is free once the instance sees it go.
    drop(unread.pop());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let res = app.get("/v1/agents", Some(app.secret())).await;
        if res.status == 200 {
            assert!(res.json().as_array().unwrap().len() >= 800);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no place freed: {}",
            res.text()
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

#[actix_web::test]
async fn list_and_get_show_the_spec_fields() {
    let app = spawn_app().await;
    let (id, token) = app.agent().await;
    app.verify(&token).await;
    app.verify(&token).await;

    let list = app.get("/v1/agents", Some(app.secret())).await;
    assert_eq!(list.status, 200);
    let list = list.json();
    let item = &list.as_array().unwrap()[0];
    let mut keys: Vec<&str> = item.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "created_at",
            "expires_at",
            "id",
            "issuer_domain",
            "name",
            "scopes",
            "status",
            "verification_count"
        ]
    );
    assert_eq!(item["id"], id.as_str());
    assert_eq!(item["status"], "active");
    assert_eq!(item["verification_count"], 2);

    let full = app.get(&format!("/v1/agents/{id}"), Some(app.secret())).await;
    assert_eq!(full.status, 200);
    let full = full.json();
    let mut keys: Vec<&str> = full.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "created_at",
            "description",
            "expires_at",
            "id",
            "issuer_domain",
            "jkt",
            "name",
            "revocation_reason",
            "revoked_at",
            "scopes",
            "status",
            "verification_count"
        ]
    );
    assert_eq!(full["revoked_at"], Value::Null);
    assert_eq!(full["revocation_reason"], Value::Null);
    assert_eq!(full["jkt"], Value::Null, "a bearer token");
    assert_eq!(full["description"], "");
    ts_ms(&full["created_at"]);

    app.get(&format!("/v1/agents/agt_{}", "0".repeat(26)), Some(app.secret()))
        .await
        .assert_error(404, "AGENT_NOT_FOUND");
    app.get("/v1/agents/not-an-id", Some(app.secret()))
        .await
        .assert_error(404, "AGENT_NOT_FOUND");
}

#[actix_web::test]
async fn issue_token_gives_a_new_token_and_keeps_the_old_one_valid() {
    let app = spawn_app().await;
    let (id, old) = app.agent().await;
    let res = app
        .post(&format!("/v1/agents/{id}/issue-token"), Some(app.secret()), None)
        .await;
    assert_eq!(res.status, 201, "{}", res.text());
    let t = res.json();
    assert_eq!(t["agent_id"], id.as_str());
    let new = t["token"].as_str().unwrap();
    assert_ne!(new, old);
    assert_eq!(t["verify_url"], format!("{}/v1/verify/{new}", app.base));
    ts_ms(&t["expires_at"]);
    assert_eq!(app.verify(new).await["valid"], true);
    assert_eq!(app.verify(&old).await["valid"], true);

    app.post(
        "/v1/agents/agt_00000000000000000000000000/issue-token",
        Some(app.secret()),
        None,
    )
    .await
    .assert_error(404, "AGENT_NOT_FOUND");
}

#[actix_web::test]
async fn issue_token_revives_an_expired_agent_but_not_a_revoked_one() {
    let app = spawn_app().await;
    let a = app
        .register(
            json!({"name": "n", "issuer_domain": "example.com", "scopes": ["read:x"], "expiry_seconds": 2}),
        )
        .await;
    let id = a["agent_id"].as_str().unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(3100)).await;
    assert_eq!(
        app.verify(a["token"].as_str().unwrap()).await["error"],
        "TOKEN_EXPIRED"
    );
    let got = app
        .get(&format!("/v1/agents/{id}"), Some(app.secret()))
        .await
        .json();
    assert_eq!(got["status"], "expired");

    let res = app
        .post(&format!("/v1/agents/{id}/issue-token"), Some(app.secret()), None)
        .await;
    assert_eq!(res.status, 201);
    let fresh = res.json()["token"].as_str().unwrap().to_owned();
    assert_eq!(app.verify(&fresh).await["valid"], true);
    assert_eq!(
        app.get(&format!("/v1/agents/{id}"), Some(app.secret()))
            .await
            .json()["status"],
        "active"
    );

    assert_eq!(app.revoke(id, None).await.status, 200);
    app.post(&format!("/v1/agents/{id}/issue-token"), Some(app.secret()), None)
        .await
        .assert_error(409, "AGENT_REVOKED");
}

#[actix_web::test]
async fn revoke_is_immediate_permanent_and_idempotent() {
    let app = spawn_app().await;
    let (id, token) = app.agent().await;
    let res = app.revoke(&id, Some("key leaked")).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let r = res.json();
    assert_eq!(r["revoked"], true);
    assert_eq!(r["agent_id"], id.as_str());
    assert_eq!(r["reason"], "key leaked");
    ts_ms(&r["revoked_at"]);

    let v = app.verify(&token).await;
    assert_eq!(v, json!({"valid": false, "error": "TOKEN_REVOKED"}));

    let again = app.revoke(&id, Some("another reason")).await;
    assert_eq!(again.status, 200);
    let again = again.json();
    assert_eq!(again["revoked_at"], r["revoked_at"]);
    assert_eq!(again["reason"], "key leaked");

    let got = app
        .get(&format!("/v1/agents/{id}"), Some(app.secret()))
        .await
        .json();
    assert_eq!(got["status"], "revoked");
    assert_eq!(got["revocation_reason"], "key leaked");
    assert_eq!(got["revoked_at"], r["revoked_at"]);

    let log = app.log("?result=revoked").await;
    assert_eq!(log["data"][0]["failure_reason"], "agent revoked: key leaked");
}

#[actix_web::test]
async fn revoke_takes_an_optional_reason_and_checks_it() {
    let app = spawn_app().await;
    let (id, _) = app.agent().await;
    let bad = json!({"reason": 5});
    app.post(&format!("/v1/agents/{id}/revoke"), Some(app.secret()), Some(&bad))
        .await
        .assert_error(400, "VALIDATION_ERROR");
    let unknown = json!({"why": "x"});
    app.post(
        &format!("/v1/agents/{id}/revoke"),
        Some(app.secret()),
        Some(&unknown),
    )
    .await
    .assert_error(400, "VALIDATION_ERROR");
    let res = app.revoke(&id, None).await;
    assert_eq!(res.status, 200);
    assert_eq!(res.json()["reason"], Value::Null);
    app.revoke("agt_00000000000000000000000000", None)
        .await
        .assert_error(404, "AGENT_NOT_FOUND");
}

/// `GET /v1/agents` gives the whole array by default, and pages with `limit`: a `Link:
/// <…>; rel="next"` header leads through every agent once, newest first; a cursor is bound
/// to its organization and mode.
#[actix_web::test]
async fn the_agent_list_pages_with_a_link_to_the_next() {
    let app = crate::helpers::spawn_app_with(crate::helpers::Options::unlimited()).await;
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(app.agent().await.0);
    }
    ids.reverse(); // newest first
    let all = app.get("/v1/agents", Some(app.secret())).await;
    assert!(all.header("link").is_none());
    let listed: Vec<String> = all
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(listed, ids);

    let mut seen = Vec::new();
    let mut path = "/v1/agents?limit=2".to_owned();
    loop {
        let res = app.get(&path, Some(app.secret())).await;
        assert_eq!(res.status, 200, "{}", res.text());
        seen.extend(
            res.json()
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a["id"].as_str().unwrap().to_owned()),
        );
        let Some(link) = res.header("link") else { break };
        assert!(link.ends_with(r#">; rel="next""#), "{link}");
        let url = link.trim_start_matches('<').split('>').next().unwrap();
        path = url.strip_prefix(&app.base).unwrap().to_owned();
    }
    assert_eq!(seen, ids, "every agent once, newest first");

    let page = app.get("/v1/agents?limit=2", Some(app.secret())).await;
    let link = page.header("link").unwrap();
    let cursor = link
        .split("cursor=")
        .nth(1)
        .unwrap()
        .split('>')
        .next()
        .unwrap()
        .to_owned();
    app.get(&format!("/v1/agents?cursor={cursor}x"), Some(app.secret()))
        .await
        .assert_error(400, "INVALID_CURSOR");
    app.get(
        &format!("/v1/agents?cursor={cursor}"),
        Some(&app.org.keys.secret_test),
    )
    .await
    .assert_error(400, "INVALID_CURSOR");
    for bad in ["0", "201", "x"] {
        app.get(&format!("/v1/agents?limit={bad}"), Some(app.secret()))
            .await
            .assert_error(400, "VALIDATION_ERROR");
    }
}

/// Renewals of one agent at once all get their token: one that keeps the agent's key binding
/// writes only the token's times, over the binding it read, so none spoils another's; one
/// that binds a new key at the same time is written over what it read too, and the agent
/// ends on one of the keys asked for.
#[actix_web::test]
async fn renewals_at_once_all_get_their_token() {
    let app = spawn_app_with(Options::unlimited()).await;
    let (id, _) = app.agent().await;
    let path = format!("/v1/agents/{id}/issue-token");
    let keys: Vec<Value> = (0..2).map(|_| crate::dpop::AgentKey::ed().jwk()).collect();
    let bodies: Vec<Option<Value>> = (0..10)
        .map(|i| (i % 5 == 0).then(|| json!({"jwk": keys[i / 5]})))
        .collect();
    let answers = futures_util::future::join_all(
        bodies
            .iter()
            .map(|body| app.post(&path, Some(app.secret()), body.as_ref())),
    )
    .await;
    for res in &answers {
        assert_eq!(res.status, 201, "{}", res.text());
    }
    let agent = app
        .get(&format!("/v1/agents/{id}"), Some(app.secret()))
        .await
        .json();
    assert!(agent["jkt"].is_string(), "{agent}");
}
