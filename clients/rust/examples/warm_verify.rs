//! The cost of a warm offline check: `verify` of a bearer token and `verify_dpop` of a bound
//! token with a fresh proof each time, after one call has fetched the keys and the list.
//! Run by `load/libraries`:
//!
//!     cargo run --release -p agentid-verifier --example warm_verify -- BASE BEARER BODIES
//!
//! BODIES holds one `{"token","dpop","htm","htu"}` per line, each proof good once.
use std::time::Instant;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (base, bearer, bodies) = (&args[1], &args[2], &args[3]);
    let v = agentid_verifier::Verifier::builder(base).build().unwrap();
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
    println!(
        "rust        verify {verify:6.1} us   verify_dpop {dpop:6.1} us   ({} proofs)",
        lines.len() - 1
    );
}
