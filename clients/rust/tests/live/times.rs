//! The ends of a time: an `exp` is past from its very second on (without leeway), and a DPoP
//! proof's `iat` is within the skew of now as now is, to the millisecond, as the Python and
//! TypeScript libraries judge them (both read a fractional now).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agentid_verifier::Verifier;
use serde_json::json;

use super::dpop::{bound, Agent, URL};
use super::{claims_of, code, now, proxied, Server};

/// A token, a SET and a status list whose `exp` is this very second, checked within it with
/// no leeway: each is past (the list makes its token's check UNAVAILABLE). They passed until
/// the next second began.
#[tokio::test(flavor = "current_thread")]
async fn an_exp_of_this_very_second_is_past_without_leeway() {
    let (s, p) = proxied();
    let (set, _) = s.polled_set(json!({}));
    let (_, token) = s.register(json!({}));
    let v = Verifier::builder(&p.url)
        .allow_local(true)
        .leeway(Duration::ZERO)
        .build()
        .unwrap();
    assert_eq!(code(v.verify(&token).await), "ok");
    let mut got = Vec::new();

    let mut claims = claims_of(&token);
    claims["exp"] = json!(now());
    got.push(code(v.verify(&s.sign(&claims, "JWT")).await));

    let mut claims = claims_of(&set);
    claims["jti"] = json!("this-very-second");
    claims["exp"] = json!(now());
    got.push(code(v.handle_set(&s.sign(&claims, "secevent+jwt")).await));

    let uri = claims_of(&token)["status"]["status_list"]["uri"]
        .as_str()
        .unwrap()
        .to_owned();
    let path = uri.strip_prefix(&p.url).unwrap().to_owned();
    let list = ureq::get(&format!("{}{path}", s.base))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    let mut claims = claims_of(&list);
    claims["exp"] = json!(now());
    let kind = vec![("content-type".to_owned(), "application/statuslist+jwt".to_owned())];
    p.answer_under(
        "/v1/status/",
        200,
        kind,
        s.sign(&claims, "statuslist+jwt").into_bytes(),
    );
    let cold = Verifier::builder(&p.url)
        .allow_local(true)
        .leeway(Duration::ZERO)
        .build()
        .unwrap();
    got.push(code(cold.verify(&token).await));

    assert_eq!(got, ["TOKEN_EXPIRED", "TOKEN_EXPIRED", "UNAVAILABLE"]);
}

/// A DPoP proof made exactly the skew (60 s) before this second, checked once the second has
/// begun: further from now than the skew, refused. It passed until the next second began.
#[tokio::test(flavor = "current_thread")]
async fn a_proof_just_past_the_skew_is_refused() {
    let s = Server::start();
    let v = Verifier::builder(&s.base).allow_local(true).build().unwrap();
    let agent = Agent::ed();
    let (_, token) = bound(&s, agent.jwk());
    // Warm: the keys and the token's status list held.
    let warm = agent.proof_with(&token, |_, _| {});
    assert_eq!(
        code(v.verify_dpop(&token, Some(&warm), "GET", URL, &[]).await),
        "ok"
    );
    // Within a second's first half (and past its first milliseconds), so the check reads the
    // same second, later than its start.
    let millis = || {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .subsec_millis()
    };
    while !(20..500).contains(&millis()) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let proof = agent.proof_with(&token, |_, c| c["iat"] = json!(now() as i64 - 60));
    assert_eq!(
        code(v.verify_dpop(&token, Some(&proof), "GET", URL, &[]).await),
        "PROOF_INVALID"
    );
    let within = agent.proof_with(&token, |_, c| c["iat"] = json!(now() as i64 - 59));
    assert_eq!(
        code(v.verify_dpop(&token, Some(&within), "GET", URL, &[]).await),
        "ok"
    );
}
