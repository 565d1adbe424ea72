//! Micro-benchmarks of each step of the verify path. `cargo bench --bench engine`;
//! `cargo bench --bench engine -- token/` for one group.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use agentid::domain::audit::{AuditEntry, AuditRecord, Event, GENESIS};
use agentid::domain::{AgentId, IssuerDomain, KeyMode, Ledger, Millis, OrgId, Scopes, VerifyResult};
use agentid::engine::Registry;
use agentid::engine::{AgentEntry, ValidToken, Verification, VerifiedToken};
use agentid::keys::KeyRing;
use agentid::store::AgentRecord;
use agentid::store::{batch, block};
use agentid::token::{decode, Claims};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ed25519_dalek::SigningKey;

fn ring() -> KeyRing {
    KeyRing::from_signing_key(SigningKey::from_bytes(&[7; 32]))
}

fn claims(n: usize) -> Claims {
    Claims::agent(
        "billing.example.com",
        &format!("agt_01jd{n:022}"),
        &format!("01jd{n:022}"),
        1_795_000_000,
        1_795_086_400,
        vec!["read:invoices".into(), "write:invoices".into()],
    )
}

fn tokens(ring: &KeyRing, n: usize) -> Vec<String> {
    (0..n).map(|i| ring.sign(&claims(i))).collect()
}

fn token_paths(c: &mut Criterion) {
    let ring = ring();
    let keys = ring.public().clone();
    let token = ring.sign(&claims(1));
    let mut g = c.benchmark_group("token");
    g.bench_function("decode", |b| b.iter(|| decode(black_box(&token)).unwrap()));
    // What a cold verify does before the registry: decode, then strict verification with
    // the public key.
    g.bench_function("decode+verify", |b| {
        b.iter(|| keys.verify(&decode(black_box(&token)).unwrap()).unwrap())
    });
    // The strict check alone: ours (fixed-base tables), and ed25519-dalek's `verify_strict`
    // whose acceptance it keeps.
    let decoded = decode(&token).unwrap();
    g.bench_function("check", |b| b.iter(|| keys.verify(black_box(&decoded)).unwrap()));
    let key = *keys.get(keys.current_kid()).unwrap();
    g.bench_function("verify_strict", |b| {
        b.iter(|| {
            key.verify_strict(black_box(decoded.signing_input), &decoded.signature)
                .unwrap()
        })
    });
    // The other well-kept Ed25519 implementation (BoringSSL-derived assembly), same token.
    let public = ring::signature::UnparsedPublicKey::new(
        &ring::signature::ED25519,
        keys.get(keys.current_kid()).unwrap().to_bytes(),
    );
    g.bench_function("decode+ring_verify", |b| {
        b.iter(|| {
            let u = decode(black_box(&token)).unwrap();
            public.verify(u.signing_input, &u.signature.to_bytes()).unwrap()
        })
    });
    let cache: quick_cache::sync::Cache<Box<str>, Arc<Claims>> = quick_cache::sync::Cache::new(65_536);
    for t in tokens(&ring, 10_000) {
        let c = decode(&t).unwrap().claims;
        cache.insert(t.into_boxed_str(), Arc::new(c));
    }
    cache.insert(token.clone().into_boxed_str(), Arc::new(claims(1)));
    let now = 1_795_000_100;
    g.bench_function("cache_hit (lookup + expiry check)", |b| {
        b.iter(|| {
            let c = cache.get(black_box(token.as_str())).unwrap();
            assert!(c.exp > now);
        })
    });
    g.finish();
}

fn entry(i: usize) -> AuditEntry {
    AuditEntry {
        event: Event::Verification,
        ledger: Ledger {
            org_id: format!("org_01jd{:022}", i % 3),
            mode: KeyMode::Live,
        },
        agent_id: format!("agt_01jd{:022}", i % 50),
        result: VerifyResult::Valid,
        failure_reason: None,
        latency_us: 120,
        requested_at: Millis(1_795_000_000_000),
        revocations_seen: 0,
    }
}

/// What the audit writer does to a batch before its statement: seal, then cut into blocks
/// (encoding included). Returns the number of records and of blocks.
fn seal_and_plan(entries: Vec<AuditEntry>) -> (usize, usize) {
    let mut heads = std::collections::HashMap::new();
    let recs = batch::seal(entries, &mut heads);
    let blocks = block::plan(&recs, &mut heads);
    (recs.len(), blocks.len())
}

fn audit(c: &mut Criterion) {
    let mut g = c.benchmark_group("audit");
    // The entry and id are made outside the timed part (their `format!`s would be most of
    // what this measures).
    g.bench_function("chain_step (seal one record)", |b| {
        b.iter_batched(
            || (entry(1), String::from("log_01jd0000000000000000000000")),
            |(e, id)| AuditRecord::seal(e, id, 42, GENESIS),
            criterion::BatchSize::SmallInput,
        )
    });
    let entries: Vec<AuditEntry> = (0..512).map(entry).collect();
    g.throughput(Throughput::Elements(512));
    g.bench_function("writer_batch_encode/512 (seal + blocks)", |b| {
        b.iter(|| seal_and_plan(black_box(entries.clone())))
    });
    // A hot batch: one token verified over and over, so one ledger and one agent.
    let hot: Vec<AuditEntry> = (0..512).map(|_| entry(0)).collect();
    g.bench_function("writer_batch_encode/512 one agent (seal + blocks)", |b| {
        b.iter(|| seal_and_plan(black_box(hot.clone())))
    });
    g.bench_function(
        "writer_batch_prepare/512 (ledgers, valid ids, seal, blocks)",
        |b| {
            b.iter(|| {
                let entries = black_box(entries.clone());
                let ledgers = batch::ledgers(&entries);
                let valid = batch::valid_agent_ids(&entries);
                let (recs, blocks) = seal_and_plan(entries);
                (ledgers.len(), valid.len(), recs, blocks)
            })
        },
    );
    g.finish();
}

/// The valid answer's JSON: as a cached token answers (its fixed part rendered by an earlier
/// answer) and as a token seen for the first time answers (all of it serialized).
fn answer(c: &mut Criterion) {
    let agent = Arc::new(AgentEntry {
        org_id: OrgId::parse("org_01jd0000000000000000000000").unwrap(),
        mode: KeyMode::Live,
        name: "invoice-bot".into(),
        description: "Reads and writes invoices for the billing team".into(),
    });
    let verification = |token: Arc<VerifiedToken>| Verification {
        result: VerifyResult::Valid,
        valid: Some(ValidToken {
            token,
            agent: agent.clone(),
        }),
        proof_error: None,
        policy_error: None,
        verified_at: Millis(1_795_000_123_456),
    };
    let cached = verification(Arc::new(VerifiedToken::new(claims(1))));
    agentid::http::verify_answer_body(&cached);
    let mut g = c.benchmark_group("answer");
    g.bench_function("valid (cached token)", |b| {
        b.iter(|| agentid::http::verify_answer_body(black_box(&cached)))
    });
    g.bench_function("valid (first answer of a token)", |b| {
        b.iter_batched(
            || verification(Arc::new(VerifiedToken::new(claims(1)))),
            |v| agentid::http::verify_answer_body(&v),
            criterion::BatchSize::SmallInput,
        )
    });
    g.finish();
}

fn revocation(c: &mut Criterion) {
    let registry = Registry::default();
    let org = OrgId::generate();
    let domain = IssuerDomain::parse("example.com").unwrap();
    let scopes = Scopes::parse(&["read:x"]).unwrap();
    for i in 0..100_000 {
        let id = AgentId::parse(&format!("agt_01jd{i:022}")).unwrap();
        if i % 10 == 0 {
            registry.mark_revoked(&id, Some(Some("rotated")));
        }
        registry.learn(&AgentRecord {
            id,
            org_id: org.clone(),
            mode: KeyMode::Live,
            name: "n".into(),
            issuer_domain: domain.clone(),
            description: String::new(),
            scopes: scopes.clone(),
            created_at: Millis(0),
            issued_at: Millis(0),
            expires_at: Millis(0),
            revoked_at: None,
            revocation_reason: None,
            status: None,
            jkt: None,
            jwk: None,
            key_mac: None,
            key_sealed_at: None,
            verification_count: 0,
        });
    }
    let mut g = c.benchmark_group("registry");
    let hit = format!("agt_01jd{:022}", 500);
    let miss = format!("agt_01jd{:022}", 501);
    g.bench_function("revocation_lookup (revoked)", |b| {
        b.iter(|| registry.is_revoked(black_box(&hit)))
    });
    g.bench_function("revocation_lookup (not revoked)", |b| {
        b.iter(|| registry.is_revoked(black_box(&miss)))
    });
    g.bench_function("agent_lookup", |b| {
        b.iter(|| registry.agent(black_box(&miss)).is_some())
    });
    g.finish();
}

/// The resident memory of this process, from `/proc/self/status` (Linux).
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    Some(kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok()? * 1024)
}

/// A look-up in an index of a million revoked agents; on the way, what the index holds of each,
/// printed: the growth of resident memory over them (their reasons are cached apart, within
/// a budget).
fn revocation_memory(c: &mut Criterion) {
    const N: usize = 1_000_000;
    let mut million: Option<(Registry, String)> = None;
    c.bench_function("registry/revocation_lookup (a million revoked)", |b| {
        let (registry, probe) = million.get_or_insert_with(|| {
            let registry = Registry::default();
            let ids: Vec<AgentId> = (0..N)
                .map(|i| AgentId::parse(&format!("agt_01jd{i:022}")).unwrap())
                .collect();
            let before = resident_bytes();
            for id in &ids {
                registry.mark_revoked(id, None);
            }
            match (before, resident_bytes()) {
                (Some(before), Some(after)) => println!(
                    "registry/revocation_memory: {} bytes a revoked agent (resident memory grown over {N})",
                    after.saturating_sub(before) / N as u64
                ),
                _ => println!("registry/revocation_memory: no /proc/self/status here"),
            }
            (registry, ids[N / 2].to_string())
        });
        b.iter(|| registry.is_revoked(black_box(probe)))
    });
}

fn rate_limit(c: &mut Criterion) {
    use agentid::engine::ratelimit::{Class, RateLimits, RateSubject};
    use futures_util::FutureExt;
    // Organization buckets in memory (one instance); the checks complete without waiting.
    let limits = RateLimits::in_memory();
    let mut g = c.benchmark_group("rate_limit");
    g.bench_function("check (organization bucket)", |b| {
        b.iter(|| {
            limits
                .check(
                    black_box(RateSubject::Org {
                        org_id: "org_01jd0000000000000000000000",
                        per_minute: 1_000_000_000,
                    }),
                    Class::Verify,
                )
                .now_or_never()
                .expect("in memory")
        })
    });
    let mut n = 0u32;
    g.bench_function("check (anonymous, a new address each call)", |b| {
        b.iter(|| {
            n = n.wrapping_add(1);
            limits
                .check(
                    black_box(RateSubject::Anonymous(std::net::IpAddr::from(n.to_be_bytes()))),
                    Class::Verify,
                )
                .now_or_never()
                .expect("in memory")
        })
    });
    g.finish();
}

/// A status list of 1,048,576 places, a share of them revoked at random places: the `lst`
/// encoding's time, and its size on the wire (printed once per share).
fn status_list(c: &mut Criterion) {
    use agentid::domain::StatusBits;
    let mut g = c.benchmark_group("status_list");
    for percent in [0u64, 1, 10] {
        let size = 1 << 20;
        let mut bits = StatusBits::new(size);
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..size * percent / 100 {
            // xorshift: a fixed sequence of random places
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            bits.revoke(x % size);
        }
        eprintln!(
            "status_list: 1048576 places, {percent}% revoked: lst {} bytes",
            bits.lst().len()
        );
        g.bench_function(format!("lst_{percent}pct"), |b| b.iter(|| black_box(&bits).lst()));
    }
    g.finish();
}

/// The DPoP proof check alone (`token::dpop::check_proof`): parse, signature, claims, ath.
fn dpop(c: &mut Criterion) {
    use agentid::token::dpop::{check_proof, Expected};
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine as _;
    use ed25519_dalek::Signer;
    use ring::rand::SystemRandom;
    use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
    use sha2::{Digest, Sha256};

    let token = tokens(&ring(), 1).pop().unwrap();
    let now = 1_795_000_000;
    let b64 = |v: &serde_json::Value| URL_SAFE_NO_PAD.encode(serde_json::to_vec(v).unwrap());
    let claims = serde_json::json!({"jti": "01jd0000000000000000000001", "htm": "GET",
        "htu": "https://api.example/orders", "iat": now,
        "ath": URL_SAFE_NO_PAD.encode(Sha256::digest(token.as_bytes()))});
    let ed = SigningKey::from_bytes(&[9; 32]);
    let header = serde_json::json!({"typ": "dpop+jwt", "alg": "EdDSA", "jwk": {"kty": "OKP", "crv": "Ed25519",
        "x": URL_SAFE_NO_PAD.encode(ed.verifying_key().as_bytes())}});
    let input = format!("{}.{}", b64(&header), b64(&claims));
    let ed_proof = format!(
        "{input}.{}",
        URL_SAFE_NO_PAD.encode(ed.sign(input.as_bytes()).to_bytes())
    );
    let rng = SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    let es = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap();
    let p = es.public_key().as_ref();
    let header = serde_json::json!({"typ": "dpop+jwt", "alg": "ES256", "jwk": {"kty": "EC", "crv": "P-256",
        "x": URL_SAFE_NO_PAD.encode(&p[1..33]), "y": URL_SAFE_NO_PAD.encode(&p[33..])}});
    let input = format!("{}.{}", b64(&header), b64(&claims));
    let sig = es.sign(&rng, input.as_bytes()).unwrap();
    let es_proof = format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig.as_ref()));
    let expected = Expected {
        htm: "GET",
        htu: "https://api.example/orders",
        token: Some(&token),
        now,
        max_skew: 60,
    };
    let mut g = c.benchmark_group("dpop");
    for (name, proof) in [
        ("check_proof (Ed25519)", &ed_proof),
        ("check_proof (ES256)", &es_proof),
    ] {
        check_proof(proof, &expected).unwrap();
        g.bench_function(name, |b| {
            b.iter(|| check_proof(black_box(proof), &expected).unwrap())
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    targets = token_paths, audit, answer, revocation, revocation_memory, rate_limit, status_list, dpop
}
criterion_main!(benches);
