//! The cost of a warm offline check: `verify` of a bearer token and `verify_dpop` of a bound
//! token with a fresh proof each time, after one call has fetched the keys and the list.
//! Run by `load/libraries`:
//!
//!     cargo run --release -p agentid-verifier --example warm_verify -- BASE BEARER BODIES
//!
//! BODIES holds one `{"token","dpop","htm","htu"}` per line, each proof good once.
use std::collections::HashMap;
use std::time::Instant;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ed25519_dalek::{Signature, VerifyingKey};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (base, bearer, bodies) = (&args[1], &args[2], &args[3]);
    // Measured against a server on this machine: loopback, plain http.
    let v = agentid_verifier::Verifier::builder(base)
        .allow_local(true)
        .issuers(["libs.example"])
        .build()
        .unwrap();
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(bodies)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    v.verify(bearer).await.unwrap();
    let n = 20_000;
    let t = Instant::now();
    for _ in 0..n {
        v.verify(bearer).await.unwrap();
    }
    let verify = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    let s = |b: &serde_json::Value, k: &str| b[k].as_str().unwrap().to_owned();
    let first = &lines[0];
    v.verify_dpop(
        &s(first, "token"),
        Some(&s(first, "dpop")),
        "GET",
        &s(first, "htu"),
        &[],
    )
    .await
    .unwrap();
    let t = Instant::now();
    for b in &lines[1..] {
        v.verify_dpop(&s(b, "token"), Some(&s(b, "dpop")), "GET", &s(b, "htu"), &[])
            .await
            .unwrap();
    }
    let dpop = t.elapsed().as_secs_f64() * 1e6 / (lines.len() - 1) as f64;

    // The raw checks: ed25519-dalek's verify_strict, the signing input and signature split
    // beforehand, the keys made once.
    let jwks: serde_json::Value = serde_json::from_str(
        &ureq::get(&format!("{base}/.well-known/jwks.json"))
            .call()
            .unwrap()
            .into_string()
            .unwrap(),
    )
    .unwrap();
    let key_of = |jwk: &serde_json::Value| {
        let x: [u8; 32] = b64(jwk["x"].as_str().unwrap()).try_into().unwrap();
        VerifyingKey::from_bytes(&x).unwrap()
    };
    let keys: HashMap<String, VerifyingKey> = jwks["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| (k["kid"].as_str().unwrap().to_owned(), key_of(k)))
        .collect();
    let split = |jws: &str| {
        let header: serde_json::Value = serde_json::from_slice(&b64(jws.split('.').next().unwrap())).unwrap();
        let (signing, sig) = jws.rsplit_once('.').unwrap();
        let sig = Signature::from_slice(&b64(sig)).unwrap();
        (header, signing.as_bytes().to_vec(), sig)
    };
    let (header, signing, sig) = split(bearer);
    let key = keys[header["kid"].as_str().unwrap()];
    let t = Instant::now();
    for _ in 0..n {
        key.verify_strict(&signing, &sig).unwrap();
    }
    let raw = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    let checks: Vec<_> = lines[1..]
        .iter()
        .map(|b| {
            let (th, ts, tsig) = split(&s(b, "token"));
            let (ph, ps, psig) = split(&s(b, "dpop"));
            (
                keys[th["kid"].as_str().unwrap()],
                ts,
                tsig,
                key_of(&ph["jwk"]),
                ps,
                psig,
            )
        })
        .collect();
    let t = Instant::now();
    for (tk, ts, tsig, pk, ps, psig) in &checks {
        tk.verify_strict(ts, tsig).unwrap();
        pk.verify_strict(ps, psig).unwrap();
    }
    let raw_dpop = t.elapsed().as_secs_f64() * 1e6 / checks.len() as f64;
    println!(
        "rust        verify {verify:6.1} us (raw {raw:5.1}, {:.2}x)   verify_dpop {dpop:6.1} us (raw {raw_dpop:5.1}, {:.2}x)   ({} proofs)",
        verify / raw,
        dpop / raw_dpop,
        checks.len()
    );
}

fn b64(s: &str) -> Vec<u8> {
    URL_SAFE_NO_PAD.decode(s).unwrap()
}
