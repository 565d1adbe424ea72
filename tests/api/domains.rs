//! Issuer domains: claims, DNS and HTTPS proofs against servers the tests run on loopback,
//! one holder per name, and what a name changing hands revokes. Each attack on a name is a
//! test here.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use agentid::domain::{OrgLimits, Plan};
use agentid::engine::admin::{self, CreatedOrg};
use agentid::engine::outbound::OutboundConfig;
use serde_json::{json, Value};

use crate::dns::TestDns;
use crate::helpers::{spawn_app_with, Options, Resp, TestApp};

/// A server, its DNS, and a second organization (B); the test organization is A.
struct World {
    app: TestApp,
    dns: TestDns,
    b: CreatedOrg,
}

/// How the HTTPS check may reach the tests' servers: the ports an https and an http URL
/// connect to, and the root their TLS server's certificate chains to.
#[derive(Default)]
struct Reach {
    insecure: bool,
    doors: TestDoors,
}

#[derive(Default)]
struct TestDoors {
    https_port: Option<u16>,
    http_port: Option<u16>,
    extra_roots: Vec<Vec<u8>>,
}

async fn world_with(reach: Reach) -> World {
    let dns = TestDns::start().await;
    let addr = dns.addr;
    let insecure = reach.insecure;
    let app = spawn_app_with(Options {
        tweak: Box::new(move |c| c.engine.domains.allow_insecure = insecure),
        outbound: OutboundConfig {
            dns_server: Some(addr),
            extra_roots: reach.doors.extra_roots,
            https_port: reach.doors.https_port.unwrap_or(443),
            http_port: reach.doors.http_port.unwrap_or(80),
        },
        ..Options::unlimited()
    })
    .await;
    let limits = OrgLimits::resolve(Plan::Enterprise, Some(1_000_000), Some(1_000_000), None).unwrap();
    let b = admin::create_org(&app.store, app.engine.keys(), "b", Plan::Enterprise, limits)
        .await
        .unwrap();
    World { app, dns, b }
}

async fn world() -> World {
    world_with(Reach::default()).await
}

impl World {
    fn a(&self) -> &str {
        self.app.secret()
    }

    fn b(&self) -> &str {
        &self.b.keys.secret_live
    }

    /// `DELETE /v1/domains/{domain}` with `key`: its status.
    async fn release(&self, key: &str, domain: &str) -> u16 {
        self.app
            .client
            .delete(self.app.url(&format!("/v1/domains/{domain}")))
            .insert_header(("Authorization", format!("Bearer {key}")))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    }

    async fn claim(&self, key: &str, domain: &str) -> Resp {
        self.app
            .post("/v1/domains", Some(key), Some(&json!({ "domain": domain })))
            .await
    }

    async fn verify(&self, key: &str, domain: &str) -> Resp {
        self.app
            .post(&format!("/v1/domains/{domain}/verify"), Some(key), None)
            .await
    }

    /// Claims `domain` and publishes its TXT record; the claim.
    async fn publish_txt(&self, key: &str, domain: &str) -> Value {
        let claim = self.claim(key, domain).await;
        assert!(claim.status == 201 || claim.status == 200, "{}", claim.text());
        let claim = claim.json();
        let dns = &claim["challenge"]["dns"];
        self.dns
            .txt(dns["name"].as_str().unwrap(), &[dns["value"].as_str().unwrap()]);
        claim
    }

    /// Claims, publishes the TXT record and verifies: 200, by DNS.
    async fn hold_by_dns(&self, key: &str, domain: &str) -> Value {
        self.publish_txt(key, domain).await;
        let res = self.verify(key, domain).await;
        assert_eq!(res.status, 200, "{}", res.text());
        let held = res.json();
        assert_eq!(
            (&held["status"], &held["method"]),
            (&json!("verified"), &json!("dns"))
        );
        held
    }

    async fn register(&self, key: &str, domain: &str) -> Resp {
        self.app
            .post(
                "/v1/agents/register",
                Some(key),
                Some(&json!({"name": "n", "issuer_domain": domain, "scopes": ["read:x"]})),
            )
            .await
    }

    /// bank.example granted to B by `store` as a mover that stops right after the move
    /// would leave it: the name is B's, nothing it owes is revoked yet.
    async fn bank_to_b(&self, store: &agentid::store::SharedStore) -> agentid::store::Held {
        let keys = self.app.key_ring();
        let now = agentid::domain::Millis::now();
        store
            .hold_domain(
                &agentid::engine::domains::Rules::new(&keys),
                &crate::helpers::org_id(&self.b.org_id),
                &agentid::domain::IssuerDomain::parse("bank.example").unwrap(),
                agentid::domain::holding::Grant::Operator { force: true },
                now,
                now,
            )
            .await
            .unwrap()
            .unwrap()
    }

    async fn registered(&self, key: &str, domain: &str) -> (String, String) {
        let res = self.register(key, domain).await;
        assert_eq!(res.status, 201, "{}", res.text());
        let a = res.json();
        (
            a["agent_id"].as_str().unwrap().to_owned(),
            a["token"].as_str().unwrap().to_owned(),
        )
    }
}

#[actix_web::test]
async fn a_claim_shows_its_challenge_and_a_dns_proof_holds_the_name() {
    let w = world().await;
    let res = w.claim(w.a(), "bank.example").await;
    assert_eq!(res.status, 201, "{}", res.text());
    let claim = res.json();
    assert_eq!(claim["domain"], "bank.example");
    assert_eq!(claim["status"], "pending");
    assert_eq!(
        (&claim["method"], &claim["verified_at"]),
        (&Value::Null, &Value::Null)
    );
    assert!(claim["created_at"].as_str().unwrap().ends_with('Z'));
    let value = claim["challenge"]["https"]["content"].as_str().unwrap();
    assert!(value.len() >= 40, "unguessable: {value}");
    assert_eq!(
        claim["challenge"],
        json!({"dns": {"name": "_agentid-challenge.bank.example", "type": "TXT",
                       "value": format!("agentid-domain-verification={value}")},
               "https": {"url": "https://bank.example/.well-known/agentid-domain-verification",
                         "content": value}})
    );
    // The same claim again: 200, the same value; the test key reads the same claim (the
    // organization's in both modes), but may not claim, prove or release a name.
    let again = w.claim(w.a(), "Bank.Example").await;
    assert_eq!(again.status, 200);
    assert_eq!(again.json(), claim);
    let test_key = w.app.org.keys.secret_test.clone();
    assert_eq!(
        w.app
            .get("/v1/domains/bank.example", Some(&test_key))
            .await
            .json(),
        claim
    );
    w.claim(&test_key, "bank.example")
        .await
        .assert_error(403, "FORBIDDEN");
    // Another organization's value for the name, and this organization's for another name,
    // differ.
    let other = w.claim(w.b(), "bank.example").await.json();
    assert_ne!(
        other["challenge"]["https"]["content"],
        claim["challenge"]["https"]["content"]
    );
    let elsewhere = w.claim(w.a(), "other.example").await.json();
    assert_ne!(
        elsewhere["challenge"]["https"]["content"],
        claim["challenge"]["https"]["content"]
    );
    // A publishable key may not claim.
    w.app
        .post(
            "/v1/domains",
            Some(&w.app.org.keys.publishable_live),
            Some(&json!({"domain": "x.example"})),
        )
        .await
        .assert_error(403, "FORBIDDEN");

    // Not proven yet: registering under it is refused, and the message says how to verify.
    let refused = w.register(w.a(), "bank.example").await;
    let body = refused.assert_error(403, "ISSUER_DOMAIN_NOT_VERIFIED");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("bank.example") && message.contains("/v1/domains"),
        "{message}"
    );

    // No record yet: 422, naming each lookup and what it found.
    let failed = w.verify(w.a(), "bank.example").await;
    let body = failed.assert_error(422, "DOMAIN_NOT_VERIFIED");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("TXT _agentid-challenge.bank.example: no such name"),
        "{message}"
    );
    assert!(
        message.contains("https://bank.example/.well-known/agentid-domain-verification"),
        "{message}"
    );
    // A record that is not the value: named as such.
    w.dns.txt(
        "_agentid-challenge.bank.example",
        &["v=spf1 -all", "agentid-domain-verification=nope"],
    );
    let body = w
        .verify(w.a(), "bank.example")
        .await
        .assert_error(422, "DOMAIN_NOT_VERIFIED");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!(
            "TXT _agentid-challenge.bank.example: 2 records, none is agentid-domain-verification={value}"
        )),
        "{message}"
    );

    let held = w.hold_by_dns(w.a(), "bank.example").await;
    assert_eq!(held["challenge"], Value::Null);
    assert!(held["verified_at"].as_str().is_some());
    assert_eq!(held["created_at"], claim["created_at"]);
    // Listed, and readable one by one; verify again answers it as it is.
    let list = w.app.get("/v1/domains", Some(w.a())).await.json();
    let names: Vec<&str> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["domain"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"bank.example") && names.contains(&"other.example"),
        "{list}"
    );
    assert_eq!(
        w.app.get("/v1/domains/BANK.example", Some(w.a())).await.json(),
        held
    );
    assert_eq!(w.verify(w.a(), "bank.example").await.json(), held);
    w.app
        .get("/v1/domains/nothing.example", Some(w.a()))
        .await
        .assert_error(404, "DOMAIN_NOT_FOUND");
    w.verify(w.a(), "nothing.example")
        .await
        .assert_error(404, "DOMAIN_NOT_FOUND");

    // The name and every name below it are the organization's now, in live and test mode.
    let (_, token) = w.registered(w.a(), "bank.example").await;
    w.registered(w.a(), "eu.bank.example").await;
    w.registered(&test_key, "pay.eu.bank.example").await;
    let v = w.app.verify(&token).await;
    assert_eq!(
        (&v["valid"], &v["issuer"]),
        (&json!(true), &json!("bank.example"))
    );
}

/// Attack: B registers under a name A holds, in live and in test mode, and under a name
/// below it.
#[actix_web::test]
async fn another_organization_cannot_issue_under_a_held_name() {
    let w = world().await;
    w.hold_by_dns(w.a(), "bank.example").await;
    for key in [w.b(), w.b.keys.secret_test.as_str()] {
        for name in ["bank.example", "eu.bank.example", "BANK.EXAMPLE"] {
            let body = w
                .register(key, name)
                .await
                .assert_error(403, "ISSUER_DOMAIN_NOT_VERIFIED");
            assert!(
                body["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("another organization holds it"),
                "{body}"
            );
        }
    }
    // Nor by proving a name below A's DNS-held one with its own records there.
    w.publish_txt(w.b(), "eu.bank.example").await;
    let body = w
        .verify(w.b(), "eu.bank.example")
        .await
        .assert_error(422, "DOMAIN_NOT_VERIFIED");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("lies below bank.example"), "{message}");
    w.register(w.b(), "eu.bank.example")
        .await
        .assert_error(403, "ISSUER_DOMAIN_NOT_VERIFIED");
}

/// Attack: B copies A's TXT value. A value is the organization's and the name's own.
#[actix_web::test]
async fn a_copied_txt_value_proves_nothing() {
    let w = world().await;
    w.hold_by_dns(w.a(), "bank.example").await;
    // A's record stays published; B claims the name and verifies with it.
    w.claim(w.b(), "bank.example").await;
    let body = w
        .verify(w.b(), "bank.example")
        .await
        .assert_error(422, "DOMAIN_NOT_VERIFIED");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("1 record, none is"), "{message}");
    // B's own value for its own name, published at A's name, proves nothing either.
    let mine = w.claim(w.b(), "b.example").await.json();
    w.dns.txt(
        "_agentid-challenge.bank.example",
        &[mine["challenge"]["dns"]["value"].as_str().unwrap()],
    );
    w.verify(w.b(), "bank.example")
        .await
        .assert_error(422, "DOMAIN_NOT_VERIFIED");
    w.register(w.b(), "bank.example")
        .await
        .assert_error(403, "ISSUER_DOMAIN_NOT_VERIFIED");
}

/// Attack: the name written with a trailing dot, in upper case, or in punycode.
#[actix_web::test]
async fn other_spellings_of_a_held_name_are_the_same_name_or_refused() {
    let w = world().await;
    w.hold_by_dns(w.a(), "bank.example").await;
    w.app
        .grant(&w.app.org.org_id, "xn--bcher-kva.example", false)
        .await
        .unwrap();
    for name in [
        "BANK.EXAMPLE",
        "Bank.Example",
        "XN--BCHER-KVA.EXAMPLE",
        "www.xn--bcher-kva.example",
    ] {
        w.register(w.b(), name)
            .await
            .assert_error(403, "ISSUER_DOMAIN_NOT_VERIFIED");
    }
    for name in [
        "bank.example.",
        "bücher.example",
        "bank..example",
        " bank.example",
    ] {
        w.register(w.b(), name)
            .await
            .assert_error(400, "VALIDATION_ERROR");
        let body = w.claim(w.b(), name).await.assert_error(400, "VALIDATION_ERROR");
        assert!(
            body["error"]["message"].as_str().unwrap().starts_with("domain:"),
            "{body}"
        );
    }
    w.app
        .post("/v1/domains/bank.example./verify", Some(w.b()), None)
        .await
        .assert_error(400, "VALIDATION_ERROR");
    // A claim in upper case is the lower-case name, and B's proof of it must take it by DNS.
    let claim = w.claim(w.b(), "BANK.EXAMPLE").await.json();
    assert_eq!(claim["domain"], "bank.example");
}

/// A proof by B of a name A holds moves it: A's agents under it are revoked with the
/// reason, which the status list and Shared Signals carry; A gets no new token under it.
#[actix_web::test]
async fn a_name_that_changes_hands_revokes_what_the_old_holder_issued_under_it() {
    let w = world().await;
    w.hold_by_dns(w.a(), "bank.example").await;
    let (a1, t1) = w.registered(w.a(), "bank.example").await;
    let (a2, t2) = w.registered(w.a(), "eu.bank.example").await;
    let (a3, t3) = w
        .registered(&w.app.org.keys.secret_test.clone(), "bank.example")
        .await;
    let (keep, t_keep) = w.registered(w.a(), "example.com").await;
    let poll = w
        .app
        .post(
            "/ssf/streams",
            Some(w.a()),
            Some(&json!({"delivery": {"method": "urn:ietf:rfc:8936"},
                         "events_requested": ["https://schemas.openid.net/secevent/caep/event-type/session-revoked"]})),
        )
        .await
        .json();

    // B claims it (pending: A still holds it), then proves it with its own record.
    w.claim(w.b(), "bank.example").await;
    assert_eq!(w.app.verify(&t1).await["valid"], true);
    w.hold_by_dns(w.b(), "bank.example").await;

    let reason = "issuer domain verified by another organization";
    for (id, token, key) in [
        (&a1, &t1, w.a().to_owned()),
        (&a2, &t2, w.a().to_owned()),
        (&a3, &t3, w.app.org.keys.secret_test.clone()),
    ] {
        assert_eq!(
            w.app.verify(token).await,
            json!({"valid": false, "error": "TOKEN_REVOKED"})
        );
        let agent = w.app.get(&format!("/v1/agents/{id}"), Some(&key)).await.json();
        assert_eq!(
            (&agent["status"], &agent["revocation_reason"]),
            (&json!("revoked"), &json!(reason))
        );
        let (idx, uri) = crate::status::place(token);
        crate::status::until_revoked(&w.app, &uri, idx).await;
    }
    // A's other names are untouched.
    assert_eq!(w.app.verify(&t_keep).await["valid"], true);
    let renewed = w
        .app
        .post(&format!("/v1/agents/{keep}/issue-token"), Some(w.a()), None)
        .await;
    assert_eq!(renewed.status, 201, "{}", renewed.text());
    // A's stream got a session-revoked SET for each live agent, with the reason.
    let polled = w
        .app
        .post(
            &format!("/ssf/poll/{}", poll["stream_id"].as_str().unwrap()),
            Some(poll["poll_token"].as_str().unwrap()),
            Some(&json!({"maxEvents": 10, "returnImmediately": true})),
        )
        .await
        .json();
    let sets: Vec<Value> = polled["sets"]
        .as_object()
        .unwrap()
        .values()
        .map(|s| crate::status::part(s.as_str().unwrap(), 1))
        .collect();
    let mut subjects: Vec<&str> = sets
        .iter()
        .map(|s| s["sub_id"]["sub"].as_str().unwrap())
        .collect();
    subjects.sort_unstable();
    let mut expected = vec![a1.as_str(), a2.as_str()];
    expected.sort_unstable();
    assert_eq!(subjects, expected, "{polled}");
    for s in &sets {
        let event = &s["events"]["https://schemas.openid.net/secevent/caep/event-type/session-revoked"];
        assert_eq!(event["reason_admin"]["en"], reason, "{s}");
    }

    // The name is B's: A's claim of it is gone, and A can issue under it no more.
    w.app
        .get("/v1/domains/bank.example", Some(w.a()))
        .await
        .assert_error(404, "DOMAIN_NOT_FOUND");
    for name in ["bank.example", "eu.bank.example"] {
        w.register(w.a(), name)
            .await
            .assert_error(403, "ISSUER_DOMAIN_NOT_VERIFIED");
    }
    w.registered(w.b(), "eu.bank.example").await;
}

/// Attack: B proves by HTTPS a name A holds by DNS.
#[actix_web::test]
async fn an_https_proof_cannot_take_a_name_held_by_dns() {
    let http = Http::start(b"");
    let w = world_with(Reach {
        insecure: true,
        doors: TestDoors {
            https_port: Some(closed_port()),
            http_port: Some(http.port),
            extra_roots: Vec::new(),
        },
    })
    .await;
    w.hold_by_dns(w.a(), "bank.example").await;
    let claim = w.claim(w.b(), "bank.example").await.json();
    http.answer(ok(claim["challenge"]["https"]["content"].as_str().unwrap()));
    w.dns.addr("bank.example", "127.0.0.1".parse().unwrap());
    let body = w
        .verify(w.b(), "bank.example")
        .await
        .assert_error(422, "DOMAIN_NOT_VERIFIED");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("prove it by DNS"), "{message}");
    assert!(http.hits() >= 1, "the file was fetched");
    assert_eq!(
        w.app.get("/v1/domains/bank.example", Some(w.a())).await.json()["method"],
        "dns"
    );
    w.register(w.b(), "bank.example")
        .await
        .assert_error(403, "ISSUER_DOMAIN_NOT_VERIFIED");
}

/// On a development machine the binary tries a proof against a local server through its
/// development ports (only with the insecure flag), and says so at start, a WARN line a setting.
#[actix_web::test]
async fn a_proof_can_be_tried_locally_through_development_ports() {
    let dns = TestDns::start().await;
    dns.addr("shop.example", "127.0.0.1".parse().unwrap());
    let http = Http::start(b"");
    let dir = tempfile::tempdir().unwrap();
    let (resolver, https, plain) = (
        dns.addr.to_string(),
        closed_port().to_string(),
        http.port.to_string(),
    );
    let env = [
        ("AGENTID_DNS_RESOLVER", resolver.as_str()),
        ("AGENTID_DOMAIN_VERIFICATION_HTTPS_PORT", https.as_str()),
        ("AGENTID_DOMAIN_VERIFICATION_HTTP_PORT", plain.as_str()),
    ];
    // Without the insecure flag, the ports are refused.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentid"))
        .arg("serve")
        .current_dir(dir.path())
        .env_remove("DATABASE_URL")
        .envs(env)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("take --domain-verification-allow-insecure"), "{err}");

    let log = dir.path().join("serve.log");
    let mut env = env.to_vec();
    env.push(("AGENTID_DOMAIN_VERIFICATION_ALLOW_INSECURE", "1"));
    env.push(("AGENTID_SSF_ALLOW_INSECURE_ENDPOINTS", "1"));
    let server = crate::cli::start_server_logging(dir.path(), None, &env, &log);
    let key = server.printed_key("secret_live");
    let call = |path: &str, body: Option<Value>| {
        let req = crate::helpers::client()
            .post(format!("{}{path}", server.base))
            .insert_header(("Authorization", format!("Bearer {key}")));
        async move {
            let sent = match body {
                Some(b) => req.send_json(&b).await,
                None => req.send().await,
            };
            crate::helpers::read(sent.unwrap()).await
        }
    };
    let claim = call("/v1/domains", Some(json!({"domain": "shop.example"}))).await;
    assert_eq!(claim.status, 201, "{}", claim.text());
    http.answer(ok(claim.json()["challenge"]["https"]["content"]
        .as_str()
        .unwrap()));
    let proved = call("/v1/domains/shop.example/verify", None).await;
    assert_eq!(proved.status, 200, "{}", proved.text());
    assert_eq!(proved.json()["status"], "verified", "{}", proved.text());
    assert!(
        http.hits() >= 1,
        "the file was fetched through the development port"
    );
    let said = std::fs::read_to_string(&log).unwrap();
    for flag in [
        "--domain-verification-allow-insecure",
        "--domain-verification-https-port",
        "--domain-verification-http-port",
        "--ssf-allow-insecure-endpoints",
    ] {
        assert!(
            said.lines().any(|l| l.contains("WARN") && l.contains(flag)),
            "no WARN line for {flag}: {said}"
        );
    }
}

/// An HTTPS proof over real TLS (a certificate of the tests' own root): that host alone.
#[actix_web::test]
async fn an_https_proof_holds_that_host_alone() {
    let pki = Pki::new("bank.example");
    let tls = Http::start_tls(&pki);
    let w = world_with(Reach {
        insecure: true,
        doors: TestDoors {
            https_port: Some(tls.port),
            http_port: Some(closed_port()),
            extra_roots: vec![pki.root.clone()],
        },
    })
    .await;
    let claim = w.claim(w.a(), "bank.example").await.json();
    tls.answer(ok(&format!(
        "{}\n",
        claim["challenge"]["https"]["content"].as_str().unwrap()
    )));
    w.dns.addr("bank.example", "127.0.0.1".parse().unwrap());
    let res = w.verify(w.a(), "bank.example").await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["method"], "https");
    w.registered(w.a(), "bank.example").await;
    w.register(w.a(), "eu.bank.example")
        .await
        .assert_error(403, "ISSUER_DOMAIN_NOT_VERIFIED");
    // Another host's certificate is refused: the check is TLS, not just a connection.
    let claim = w.claim(w.a(), "other.example").await.json();
    tls.answer(ok(claim["challenge"]["https"]["content"].as_str().unwrap()));
    w.dns.addr("other.example", "127.0.0.1".parse().unwrap());
    let body = w
        .verify(w.a(), "other.example")
        .await
        .assert_error(422, "DOMAIN_NOT_VERIFIED");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("TLS"),
        "{body}"
    );
}

/// Attack: a server whose chunked answer sends a chunk's size line without end. ureq reads
/// that line whole before the body's bound sees a byte: the check held as much as the server
/// could send within its deadline (5 s; gigabytes on a fast link).
#[actix_web::test]
async fn an_answer_whose_chunk_size_never_ends_is_cut_off() {
    let pki = Pki::new("bank.example");
    let config = pki.server_config();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let written = Arc::new(AtomicUsize::new(0));
    let sent = written.clone();
    std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let conn = rustls::ServerConnection::new(config).unwrap();
        let mut s = rustls::StreamOwned::new(conn, stream);
        if read_request(&mut s).is_none() {
            return;
        }
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
        let block = vec![b'0'; 64 * 1024];
        for _ in 0..512 {
            if s.write_all(&block).and_then(|()| s.flush()).is_err() {
                return;
            }
            sent.fetch_add(block.len(), Ordering::SeqCst);
        }
    });
    let w = world_with(Reach {
        insecure: true,
        doors: TestDoors {
            https_port: Some(port),
            http_port: Some(closed_port()),
            extra_roots: vec![pki.root.clone()],
        },
    })
    .await;
    w.claim(w.a(), "bank.example").await;
    w.dns.addr("bank.example", "127.0.0.1".parse().unwrap());
    w.verify(w.a(), "bank.example")
        .await
        .assert_error(422, "DOMAIN_NOT_VERIFIED");
    // What the client read (256 KiB and a little) and what the sockets' buffers took.
    let written = written.load(Ordering::SeqCst);
    assert!(written < 16 << 20, "the client read {written} bytes");
}

/// Attack: an HTTPS check redirected to a loopback address.
#[actix_web::test]
async fn the_https_check_follows_no_redirect() {
    let target = Http::start(b"");
    let redirect = Http::start(b"");
    let w = world_with(Reach {
        insecure: true,
        doors: TestDoors {
            https_port: Some(closed_port()),
            http_port: Some(redirect.port),
            extra_roots: Vec::new(),
        },
    })
    .await;
    let claim = w.claim(w.a(), "bank.example").await.json();
    target.answer(ok(claim["challenge"]["https"]["content"].as_str().unwrap()));
    redirect.answer(format!(
        "HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:{}/.well-known/agentid-domain-verification\r\n\
         Content-Length: 0\r\nConnection: close\r\n\r\n",
        target.port
    ));
    w.dns.addr("bank.example", "127.0.0.1".parse().unwrap());
    let body = w
        .verify(w.a(), "bank.example")
        .await
        .assert_error(422, "DOMAIN_NOT_VERIFIED");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("302, a redirect, which is not followed"),
        "{message}"
    );
    assert!(redirect.hits() >= 1);
    assert_eq!(target.hits(), 0, "the redirect was followed");
}

/// The HTTPS check reads at most 4 KiB and waits at most 5 s.
#[actix_web::test]
async fn the_https_check_is_bounded_in_size_and_time() {
    let big = Http::start(b"");
    let w = world_with(Reach {
        insecure: true,
        doors: TestDoors {
            https_port: Some(closed_port()),
            http_port: Some(big.port),
            extra_roots: Vec::new(),
        },
    })
    .await;
    let claim = w.claim(w.a(), "bank.example").await.json();
    let value = claim["challenge"]["https"]["content"].as_str().unwrap();
    // The value, then padding: 5,000 bytes.
    big.answer(ok(&format!("{value}{}", " ".repeat(5000 - value.len()))));
    w.dns.addr("bank.example", "127.0.0.1".parse().unwrap());
    let body = w
        .verify(w.a(), "bank.example")
        .await
        .assert_error(422, "DOMAIN_NOT_VERIFIED");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("larger than 4096 bytes"),
        "{body}"
    );

    // A server that takes the request and never answers.
    let port = silent_port(4);
    let w = world_with(Reach {
        insecure: true,
        doors: TestDoors {
            https_port: Some(port),
            http_port: Some(port),
            extra_roots: Vec::new(),
        },
    })
    .await;
    w.claim(w.a(), "bank.example").await;
    w.dns.addr("bank.example", "127.0.0.1".parse().unwrap());
    let started = std::time::Instant::now();
    let body = w
        .verify(w.a(), "bank.example")
        .await
        .assert_error(422, "DOMAIN_NOT_VERIFIED");
    let took = started.elapsed();
    assert!(
        body["error"]["message"].as_str().unwrap().contains("timed out"),
        "{body}"
    );
    // HTTPS, then HTTP (the insecure flag): 5 s each at most, well before the server lets go.
    assert!(took < Duration::from_secs(25), "{took:?}");
}

/// Attack: pending claims on names whose servers take the request and never answer, tried
/// all at once. Each fetch holds a thread for its timeout: an organization verifies at most 4
/// names at once (one more is refused at once, and is no attempt), and the proofs of all take
/// at most a quarter of the fetches the service makes at once (16; one past them fails at
/// once), so that names that hang hold neither every other organization's proofs nor every
/// thread status lists, pushes and other fetches run on.
#[actix_web::test]
async fn https_proofs_under_way_at_once_are_bounded() {
    let w = world_with(Reach {
        insecure: true,
        doors: TestDoors {
            https_port: Some(silent_port(21)),
            http_port: Some(closed_port()),
            extra_roots: Vec::new(),
        },
    })
    .await;
    let limits = OrgLimits::resolve(Plan::Enterprise, Some(1_000_000), Some(1_000_000), None).unwrap();
    let mut keys = vec![w.a().to_owned(), w.b().to_owned()];
    for name in ["c", "d", "e"] {
        let org = admin::create_org(&w.app.store, w.app.engine.keys(), name, Plan::Enterprise, limits)
            .await
            .unwrap();
        keys.push(org.keys.secret_live);
    }
    // Four names of each of five organizations, and a fifth of the first.
    let mut tries = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        for j in 0..(if i == 0 { 5 } else { 4 }) {
            let name = format!("hang{i}-{j}.example");
            assert_eq!(w.claim(key, &name).await.status, 201);
            w.dns.addr(&name, "127.0.0.1".parse().unwrap());
            tries.push((key.as_str(), name));
        }
    }
    let tried = futures_util::future::join_all(tries.iter().map(|(key, name)| w.verify(key, name))).await;
    let over = tried.iter().filter(|r| r.status == 429).collect::<Vec<_>>();
    let statuses: Vec<u16> = tried.iter().map(|r| r.status).collect();
    assert_eq!(over.len(), 1, "{statuses:?}");
    over[0].assert_error(429, "RATE_LIMITED");
    assert!(
        over[0].text().contains("at most 4 names at once"),
        "{}",
        over[0].text()
    );
    assert_eq!(over[0].header("retry-after").as_deref(), Some("15"));
    let messages: Vec<String> = tried
        .iter()
        .filter(|r| r.status != 429)
        .map(|r| r.assert_error(422, "DOMAIN_NOT_VERIFIED")["error"]["message"].to_string())
        .collect();
    let busy = messages
        .iter()
        .filter(|m| m.contains("cannot be fetched now"))
        .count();
    let hung = messages.iter().filter(|m| m.contains("timed out")).count();
    assert_eq!((busy, hung), (4, 16), "{messages:#?}");
    // Done, the first organization verifies again.
    let again = w.verify(w.a(), "hang0-0.example").await;
    again.assert_error(422, "DOMAIN_NOT_VERIFIED");
}

/// Attack: a DNS answer points the HTTPS check at 127.0.0.1, without the insecure flag.
#[actix_web::test]
async fn the_https_check_connects_only_to_globally_reachable_addresses() {
    let pki = Pki::new("bank.example");
    let tls = Http::start_tls(&pki);
    let w = world_with(Reach {
        insecure: false,
        doors: TestDoors {
            https_port: Some(tls.port),
            http_port: None,
            extra_roots: vec![pki.root.clone()],
        },
    })
    .await;
    let claim = w.claim(w.a(), "bank.example").await.json();
    tls.answer(ok(claim["challenge"]["https"]["content"].as_str().unwrap()));
    for ip in ["127.0.0.1", "::ffff:127.0.0.1", "10.0.0.1"] {
        w.dns.addr("bank.example", ip.parse().unwrap());
        let body = w
            .verify(w.a(), "bank.example")
            .await
            .assert_error(422, "DOMAIN_NOT_VERIFIED");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("resolves to an address that is not globally reachable"),
            "{ip}: {message}"
        );
        // Which internal address a name resolves to is not told: no map of the network.
        assert!(!message.contains(ip), "{ip}: {message}");
    }
    assert_eq!(tls.hits(), 0, "the check connected to a local address");
}

/// Attack: a TXT record of 64 KiB. Read whole by the resolver (over TCP), repeated in no
/// message.
#[actix_web::test]
async fn a_huge_txt_record_is_answered_with_a_short_message() {
    let w = world().await;
    w.claim(w.a(), "bank.example").await;
    let strings: Vec<Vec<u8>> = (0..255).map(|i| vec![b'a' + (i % 26) as u8; 255]).collect();
    w.dns.txt_strings("_agentid-challenge.bank.example", strings);
    let body = w
        .verify(w.a(), "bank.example")
        .await
        .assert_error(422, "DOMAIN_NOT_VERIFIED");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("1 record, none is"), "{message}");
    assert!(message.len() < 1000, "{} bytes", message.len());
    assert_eq!(w.app.get("/health", None).await.status, 200);
}

/// Attack: 1,000 pending claims from one organization. At most 100 are held.
#[actix_web::test]
async fn pending_claims_are_bounded() {
    let w = world().await;
    let mut created = 0;
    for i in 0..1000 {
        let res = w.claim(w.a(), &format!("n{i}.example")).await;
        match res.status {
            201 => created += 1,
            _ => {
                res.assert_error(409, "TOO_MANY_DOMAINS");
            }
        }
    }
    assert_eq!(created, 100);
    // Releasing one makes room for one.
    assert_eq!(w.release(w.a(), "n0.example").await, 204);
    assert_eq!(w.claim(w.a(), "fresh.example").await.status, 201);
    w.claim(w.a(), "fresher.example")
        .await
        .assert_error(409, "TOO_MANY_DOMAINS");
}

/// Attack: names proved one after another (a zone of one's own answers for any of them),
/// each freeing its pending place. An organization holds and claims at most 1,000 names
/// together; releasing one makes room for one.
#[actix_web::test]
async fn names_held_and_claimed_are_bounded() {
    let w = world().await;
    for i in 0..998 {
        w.app
            .grant(&w.b.org_id, &format!("g{i}.example"), false)
            .await
            .unwrap();
    }
    w.hold_by_dns(w.b(), "proved.example").await;
    assert_eq!(w.claim(w.b(), "last.example").await.status, 201);
    let body = w
        .claim(w.b(), "one-more.example")
        .await
        .assert_error(409, "TOO_MANY_DOMAINS");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("1000"), "{message}");
    // A name held already answers as it is.
    assert_eq!(w.claim(w.b(), "g7.example").await.status, 200);
    assert_eq!(w.release(w.b(), "g0.example").await, 204);
    assert_eq!(w.claim(w.b(), "one-more.example").await.status, 201);
    // The other organization is not held to B's count.
    assert_eq!(w.claim(w.a(), "a-name.example").await.status, 201);
}

#[actix_web::test]
async fn verification_attempts_are_limited_per_domain() {
    let w = world().await;
    w.claim(w.a(), "bank.example").await;
    for _ in 0..10 {
        w.verify(w.a(), "bank.example")
            .await
            .assert_error(422, "DOMAIN_NOT_VERIFIED");
    }
    let res = w.verify(w.a(), "bank.example").await;
    res.assert_error(429, "RATE_LIMITED");
    let retry: u64 = res.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    // Another domain of the organization, and another organization's claim, are not held up.
    w.claim(w.a(), "other.example").await;
    w.verify(w.a(), "other.example")
        .await
        .assert_error(422, "DOMAIN_NOT_VERIFIED");
    w.claim(w.b(), "bank.example").await;
    w.verify(w.b(), "bank.example")
        .await
        .assert_error(422, "DOMAIN_NOT_VERIFIED");
    // Releasing the claim and claiming the name again keeps the count: a loop of claim,
    // verify, release would otherwise have the service look the name up at will.
    assert_eq!(w.release(w.a(), "bank.example").await, 204);
    w.claim(w.a(), "bank.example").await;
    w.verify(w.a(), "bank.example")
        .await
        .assert_error(429, "RATE_LIMITED");
}

/// Released: the agents keep their tokens until they expire, and get no new ones.
#[actix_web::test]
async fn a_released_name_keeps_its_tokens_and_issues_no_more() {
    let w = world().await;
    w.hold_by_dns(w.a(), "bank.example").await;
    let (id, token) = w.registered(w.a(), "bank.example").await;
    assert_eq!(w.release(w.a(), "bank.example").await, 204);
    assert_eq!(w.app.verify(&token).await["valid"], true);
    w.app
        .post(&format!("/v1/agents/{id}/issue-token"), Some(w.a()), None)
        .await
        .assert_error(403, "ISSUER_DOMAIN_NOT_VERIFIED");
    w.register(w.a(), "bank.example")
        .await
        .assert_error(403, "ISSUER_DOMAIN_NOT_VERIFIED");
    w.app
        .get("/v1/domains/bank.example", Some(w.a()))
        .await
        .assert_error(404, "DOMAIN_NOT_FOUND");
    // Once another organization proves it, those tokens are revoked too.
    w.hold_by_dns(w.b(), "bank.example").await;
    assert_eq!(w.app.verify(&token).await["error"], "TOKEN_REVOKED");
}

/// Released: an agent's key signs no request under the name, and its directory lists none.
#[actix_web::test]
async fn a_released_name_signs_no_more_requests() {
    let w = world().await;
    w.hold_by_dns(w.a(), "bank.example").await;
    let (private, public) = crate::signed::keypair();
    let body =
        json!({"name": "crawler", "issuer_domain": "bank.example", "scopes": ["read:docs"], "jwk": public});
    let res = w.app.post("/v1/agents/register", Some(w.a()), Some(&body)).await;
    assert_eq!(res.status, 201, "{}", res.text());
    let directory = format!("{}/v1/directories/bank.example", w.app.base);
    let url = "https://shop.example/products/1";
    let signed = crate::signed::cloudflare_signs(&private, url, &directory, 300).await;
    assert_eq!(w.app.check_request(url, &signed).await["result"], "verified");
    let listed = w.app.directory("bank.example", None).await.json();
    assert_eq!(listed["keys"].as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(w.release(w.a(), "bank.example").await, 204);
    // A holding found is trusted a second at most.
    actix_web::rt::time::sleep(std::time::Duration::from_millis(1100)).await;
    let signed = crate::signed::cloudflare_signs(&private, url, &directory, 300).await;
    let v = w.app.check_request(url, &signed).await;
    assert_eq!(v["result"], "invalid", "{v}");
    assert!(v["reason"].as_str().unwrap().contains("no longer holds"), "{v}");
    assert_eq!(
        w.app.directory("bank.example", None).await.json()["keys"],
        json!([])
    );
}

/// Agents registered while a name changes hands: none of A's stays valid under it after.
#[actix_web::test]
async fn no_two_organizations_issue_under_one_name_at_once() {
    let w = world().await;
    w.hold_by_dns(w.a(), "bank.example").await;
    w.publish_txt(w.b(), "bank.example").await;
    let registering = (0..20).map(|_| w.register(w.a(), "bank.example"));
    let (registered, moved) = tokio::join!(
        futures_util::future::join_all(registering),
        w.verify(w.b(), "bank.example")
    );
    assert_eq!(moved.status, 200, "{}", moved.text());
    for r in registered {
        match r.status {
            201 => {
                let token = r.json()["token"].as_str().unwrap().to_owned();
                assert_eq!(w.app.verify(&token).await["error"], "TOKEN_REVOKED");
            }
            _ => {
                r.assert_error(403, "ISSUER_DOMAIN_NOT_VERIFIED");
            }
        }
    }
}

/// The operator's grant, and taking a name with --force (the CLI's rules, called directly).
#[actix_web::test]
async fn the_operator_grants_names_and_takes_them_only_with_force() {
    let w = world().await;
    let held = w.app.grant(&w.b.org_id, "bank.example", false).await.unwrap();
    assert_eq!(held.holding.method.as_str(), "operator");
    w.registered(w.b(), "eu.bank.example").await;
    let (_, token) = w.registered(w.b(), "bank.example").await;
    let refused = w
        .app
        .grant(&w.app.org.org_id, "bank.example", false)
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("--force"), "{refused}");
    // Nor below it, even with force: the parent must be taken itself.
    let refused = w
        .app
        .grant(&w.app.org.org_id, "eu.bank.example", true)
        .await
        .unwrap_err();
    assert!(
        refused.to_string().contains("lies below bank.example"),
        "{refused}"
    );
    let taken = w
        .app
        .grant(&w.app.org.org_id, "bank.example", true)
        .await
        .unwrap();
    assert_eq!(taken.revoked.len(), 2);
    assert_eq!(w.app.verify(&token).await["error"], "TOKEN_REVOKED");
    w.registered(w.a(), "bank.example").await;
    // A DNS proof takes an operator's grant like any holding that covers the names below it.
    w.hold_by_dns(w.b(), "bank.example").await;
}

/// `open`: today's behaviour, any name (single-tenant and development deployments).
#[actix_web::test]
async fn the_open_policy_lets_anyone_issue_under_any_name() {
    let app = spawn_app_with(Options {
        tweak: Box::new(|c| c.engine.domains.policy = agentid::engine::domains::IssuerPolicy::Open),
        domains: &[],
        ..Options::default()
    })
    .await;
    let res = app
        .post(
            "/v1/agents/register",
            Some(app.secret()),
            Some(&json!({"name": "n", "issuer_domain": "anything.example", "scopes": ["read:x"]})),
        )
        .await;
    assert_eq!(res.status, 201, "{}", res.text());
}

/// The port of a server that takes `connections` and never answers them (for 30 s).
fn silent_port(connections: usize) -> u16 {
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let held: Vec<_> = silent.incoming().take(connections).collect();
        std::thread::sleep(Duration::from_secs(30));
        drop(held);
    });
    port
}

/// A port nothing listens on.
fn closed_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub(crate) fn ok(body: &str) -> String {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// A server on 127.0.0.1 that answers every request with one fixed response (HTTP, or
/// HTTPS with a certificate of the tests' own root), counting connections.
pub(crate) struct Http {
    pub(crate) port: u16,
    response: Arc<std::sync::Mutex<Vec<u8>>>,
    hits: Arc<AtomicUsize>,
    /// The head of each request read, in order.
    heads: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Http {
    pub(crate) fn start(response: &[u8]) -> Http {
        Http::serve(response, None)
    }

    pub(crate) fn start_tls(pki: &Pki) -> Http {
        Http::serve(b"", Some(pki.server_config()))
    }

    fn serve(response: &[u8], tls: Option<Arc<rustls::ServerConfig>>) -> Http {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let response = Arc::new(std::sync::Mutex::new(response.to_vec()));
        let hits = Arc::new(AtomicUsize::new(0));
        let heads = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (r, h, seen) = (response.clone(), hits.clone(), heads.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                h.fetch_add(1, Ordering::SeqCst);
                stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let answer = r.lock().unwrap().clone();
                match &tls {
                    Some(config) => {
                        let conn = rustls::ServerConnection::new(config.clone()).unwrap();
                        let mut s = rustls::StreamOwned::new(conn, stream);
                        if let Some(head) = read_request(&mut s) {
                            seen.lock().unwrap().push(head);
                            let _ = s.write_all(&answer);
                            s.conn.send_close_notify();
                            let _ = s.flush();
                        }
                    }
                    None => {
                        let mut s = stream;
                        if let Some(head) = read_request(&mut s) {
                            seen.lock().unwrap().push(head);
                            let _ = s.write_all(&answer);
                        }
                    }
                }
            }
        });
        Http {
            port,
            response,
            hits,
            heads,
        }
    }

    pub(crate) fn answer(&self, response: String) {
        *self.response.lock().unwrap() = response.into_bytes();
    }

    pub(crate) fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    pub(crate) fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }
}

/// Reads up to the end of a request's head; `None` when the peer went away first.
fn read_request(s: &mut impl Read) -> Option<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return None,
        }
    }
    Some(String::from_utf8_lossy(&head).into_owned())
}

/// A root certificate and a leaf for one host, made with openssl: DER.
pub(crate) struct Pki {
    pub(crate) root: Vec<u8>,
    leaf: Vec<u8>,
    key: Vec<u8>,
}

impl Pki {
    /// A TLS server's configuration with the leaf.
    pub(crate) fn server_config(&self) -> Arc<rustls::ServerConfig> {
        let config =
            rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(
                    vec![rustls::pki_types::CertificateDer::from(self.leaf.clone())],
                    rustls::pki_types::PrivateKeyDer::Pkcs8(self.key.clone().into()),
                )
                .unwrap();
        Arc::new(config)
    }

    pub(crate) fn new(host: &str) -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let run = |args: &[&str]| {
            let out = std::process::Command::new("openssl")
                .args(args)
                .current_dir(dir.path())
                .output()
                .expect("openssl makes the tests' certificates");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        run(&[
            &["req", "-x509"][..],
            &ec,
            &[
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-days",
                "2",
                "-subj",
                "/CN=agentid test root",
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign",
            ],
        ]
        .concat());
        run(&[
            &["req"][..],
            &ec,
            &[
                "-keyout",
                "leaf.key",
                "-out",
                "leaf.csr",
                "-subj",
                &format!("/CN={host}"),
            ],
        ]
        .concat());
        std::fs::write(
            dir.path().join("ext"),
            format!("subjectAltName=DNS:{host}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"),
        )
        .unwrap();
        run(&[
            "x509",
            "-req",
            "-in",
            "leaf.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "leaf.pem",
            "-days",
            "2",
            "-extfile",
            "ext",
        ]);
        run(&["x509", "-in", "ca.pem", "-outform", "DER", "-out", "ca.der"]);
        run(&["x509", "-in", "leaf.pem", "-outform", "DER", "-out", "leaf.der"]);
        run(&[
            "pkcs8",
            "-topk8",
            "-nocrypt",
            "-in",
            "leaf.key",
            "-outform",
            "DER",
            "-out",
            "leaf.key.der",
        ]);
        let read = |f: &str| std::fs::read(Path::new(dir.path()).join(f)).unwrap();
        Pki {
            root: read("ca.der"),
            leaf: read("leaf.der"),
            key: read("leaf.key.der"),
        }
    }
}

/// Attack: a test-mode secret key (handed out more freely than a live one) releases or
/// re-proves a name its organization issues under live: refused, and live issuance goes on.
#[actix_web::test]
async fn a_test_key_cannot_release_or_prove_a_live_name() {
    let w = world().await;
    w.hold_by_dns(w.a(), "bank.example").await;
    let test_key = w.app.org.keys.secret_test.clone();
    assert_eq!(w.release(&test_key, "bank.example").await, 403);
    w.app
        .post("/v1/domains/bank.example/verify", Some(&test_key), None)
        .await
        .assert_error(403, "FORBIDDEN");
    assert_eq!(w.register(w.a(), "bank.example").await.status, 201);
}

/// A database writer cannot stop a moved name's revocations: the move's note is kept while
/// it owes any (deleted, rewritten, or on SQLite replaced), and the next instance finishes
/// them and deletes it.
#[actix_web::test]
async fn a_moves_note_is_kept_while_it_owes_revocations() {
    let mut w = world().await;
    let a = w.app.org.org_id.clone();
    w.app.grant(&a, "bank.example", false).await.unwrap();
    let (_, token) = w.registered(w.a(), "eu.bank.example").await;
    // The move, with no instance running to revoke what it owes.
    w.app.stop().await;
    let store = agentid::store::connect(&w.app.db.url, &Default::default())
        .await
        .unwrap();
    let held = w.bank_to_b(&store).await;
    let m = held.moving.expect("A's agent is owed its revocation");
    let mut undo = vec![
        "DELETE FROM name_moves".to_owned(),
        "UPDATE name_moves SET domain = 'other.example'".to_owned(),
        "UPDATE name_moves SET below = FALSE".to_owned(),
    ];
    if w.app.db.is_postgres() {
        undo.push("TRUNCATE name_moves".to_owned());
    } else {
        undo.push(format!(
            "INSERT OR REPLACE INTO name_moves (seq, org_id, domain, below, at) \
             VALUES ({}, '{}', 'other.example', 0, 0)",
            m.seq, m.org_id
        ));
    }
    for sql in &undo {
        let err = w.app.refused(sql).await;
        assert!(err.contains("a moved name's note"), "{sql}: {err}");
    }
    // The next instance revokes what is owed, and the note goes.
    let app = w.app.restart().await;
    let mut answer = Value::Null;
    for _ in 0..200 {
        answer = app.verify(&token).await;
        if answer["error"] == "TOKEN_REVOKED" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(answer["error"], "TOKEN_REVOKED", "{answer}");
    assert!(app.store.name_moves().await.unwrap().is_empty());
}

/// A name changes hands at once, and what its former holder issued under it is revoked
/// after, in bounded batches outside the lock every change of who holds what takes (which
/// held up every registration in the fleet for as long as the revocations took). Each batch
/// is seen by verify as it commits; the move is noted in the database, so one left
/// unfinished (its mover stopped) is finished by an instance that did not make it.
#[actix_web::test]
async fn a_moved_name_revokes_in_batches_that_outlive_their_mover() {
    let w = world().await;
    let a = w.app.org.org_id.clone();
    w.app.grant(&a, "bank.example", false).await.unwrap();
    let mut tokens = Vec::new();
    for name in [
        "bank.example",
        "eu.bank.example",
        "bank.example",
        "x.eu.bank.example",
        "bank.example",
    ] {
        tokens.push(w.registered(w.a(), name).await.1);
    }
    let (_, kept) = w.registered(w.a(), "example.com").await;
    // The move, as a mover that stops right after it leaves it: the name is B's, nothing
    // is revoked yet.
    let held = w.bank_to_b(&w.app.store).await;
    assert!(held.revoked.is_empty());
    let m = held.moving.expect("A's agents are owed revocations");
    assert_eq!(w.app.store.name_moves().await.unwrap(), std::slice::from_ref(&m));
    w.register(w.a(), "bank.example")
        .await
        .assert_error(403, "ISSUER_DOMAIN_NOT_VERIFIED");
    w.registered(w.b(), "eu.bank.example").await;
    // One batch of two: verify sees those two at once.
    let batch = w.app.store.revoke_moved(&m, 2).await.unwrap();
    assert_eq!((batch.revoked.len(), batch.done), (2, false));
    let mut revoked = 0;
    for t in &tokens {
        if w.app.verify(t).await["error"] == "TOKEN_REVOKED" {
            revoked += 1;
        }
    }
    assert_eq!(revoked, 2);
    // The instance finishes the rest, and the move's note goes.
    for t in &tokens {
        let mut answer = Value::Null;
        for _ in 0..200 {
            answer = w.app.verify(t).await;
            if answer["error"] == "TOKEN_REVOKED" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(answer["error"], "TOKEN_REVOKED", "{answer}");
    }
    assert!(w.app.store.name_moves().await.unwrap().is_empty());
    assert_eq!(w.app.verify(&kept).await["valid"], true);
}

/// A move still revoking when the name changes hands again owes only the agents registered
/// before it: the name's holder after it (here its former holder, given it back) keeps what
/// it registers since. (The move's note went on revoking every agent of another
/// organization under the name, the rightful holder's new ones too.)
#[actix_web::test]
async fn a_move_overtaken_by_another_revokes_none_of_the_later_agents() {
    let w = world().await;
    let a = w.app.org.org_id.clone();
    w.app.grant(&a, "bank.example", false).await.unwrap();
    let (_, before) = w.registered(w.a(), "bank.example").await;
    // To B, as a mover that stops right after the move leaves it: nothing revoked yet.
    let held = w.bank_to_b(&w.app.store).await;
    let first = held.moving.expect("A's agent is owed a revocation");
    // Given straight back to A, which registers under it again.
    w.app.grant(&a, "bank.example", true).await.unwrap();
    let (_, after) = w.registered(w.a(), "bank.example").await;
    // The first move runs to its end.
    for _ in 0..100 {
        if w.app.store.revoke_moved(&first, 100).await.unwrap().done {
            break;
        }
    }
    for _ in 0..100 {
        if w.app.store.name_moves().await.unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(w.app.store.name_moves().await.unwrap().is_empty());
    assert_eq!(w.app.verify(&before).await["error"], "TOKEN_REVOKED");
    assert_eq!(w.app.verify(&after).await["valid"], true);
}
