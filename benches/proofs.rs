//! Inclusion and consistency proofs in a ledger of 10 million records (set
//! AGENTID_BENCH_RECORDS for another size), on SQLite.
//!
//! The ledger is written once through the store, as the audit writer writes it, and
//! checkpointed as the service does; the file is kept under `target/bench-data/` and reused by
//! later runs (building 10 million records takes a few minutes). Each proof reads one small
//! range per subtree its ranges split into: the count is printed beside the timings.
//!
//!     cargo bench --bench proofs

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentid::domain::audit::{AuditEntry, Event};
use agentid::domain::{KeyMode, Ledger, Millis, VerifyResult};
use agentid::engine::transparency::checkpointer::{Step, Transparency};
use agentid::engine::GrownLedgers;
use agentid::keys::KeyRing;
use agentid::store::{self, BlockSealer, SharedStore, StoreOptions};
use agentid::tlog::tree;
use criterion::{black_box, Criterion};

fn ledger() -> Ledger {
    Ledger {
        org_id: "org_01jd0000000000000000000000".into(),
        mode: KeyMode::Live,
    }
}

fn entry(i: u64) -> AuditEntry {
    AuditEntry {
        event: Event::Verification,
        ledger: ledger(),
        agent_id: format!("agt_01jd{:022}", i % 50),
        result: if i.is_multiple_of(97) {
            VerifyResult::Invalid
        } else {
            VerifyResult::Valid
        },
        failure_reason: i
            .is_multiple_of(97)
            .then(|| "signature does not verify".to_owned()),
        latency_us: 100 + (i % 50) as i64,
        requested_at: Millis(1_795_000_000_000 + (i / 100) as i64),
        revocations_seen: 0,
    }
}

/// The ledger with `n` records, all checkpointed.
async fn build(store: &SharedStore, t: &Transparency, sealer: &BlockSealer, n: u64) {
    let l = ledger();
    let mut have = store.ledger_size(&l).await.unwrap();
    let started = Instant::now();
    while have < n {
        let batch: Vec<AuditEntry> = (have..(have + 512).min(n)).map(entry).collect();
        let k = batch.len() as u64;
        store
            .append_audit(batch, sealer.clone())
            .await
            .into_result()
            .unwrap();
        have += k;
        if have % 1_000_000 < k {
            eprintln!("built {have} records ({:.0?})", started.elapsed());
        }
    }
    let started = Instant::now();
    while t.checkpoint(&l).await.unwrap() == Step::More {}
    let latest = t.latest_signed(&l, n, false).await.unwrap().map_or(0, |c| c.size);
    assert_eq!(latest, n);
    eprintln!("checkpointed {n} records in {:.1?}", started.elapsed());
}

/// Reads one proof needs: one per subtree of each of its ranges, one for the record.
fn reads(ranges: Vec<std::ops::Range<u64>>) -> usize {
    ranges.into_iter().map(|r| tree::subtrees(r).len()).sum()
}

fn main() {
    let n: u64 = std::env::var("AGENTID_BENCH_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000);
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-data");
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}/proofs-{n}.db", dir.display());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = rt
        .block_on(store::connect(&url, &StoreOptions::default()))
        .unwrap();
    let keys = Arc::new(KeyRing::from_signing_key(ed25519_dalek::SigningKey::from_bytes(
        &[7; 32],
    )));
    let sealer: BlockSealer = Arc::new(keys.audit_block_sealer());
    let t = Transparency::new(
        store.clone(),
        keys,
        "bench",
        Duration::ZERO,
        Arc::new(GrownLedgers::default()),
    );
    rt.block_on(build(&store, &t, &sealer, n));

    let l = ledger();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        // xorshift: the same positions in every run
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        1 + x % n
    };
    let sample: Vec<u64> = (0..1000).map(|_| next()).collect();
    let avg =
        |f: &dyn Fn(u64) -> usize| sample.iter().map(|&s| f(s)).sum::<usize>() as f64 / sample.len() as f64;
    eprintln!(
        "reads per proof (mean of 1000 positions): inclusion {:.1}, consistency {:.1}",
        1.0 + avg(&|s| reads(tree::inclusion_ranges(s - 1, n))),
        avg(&|s| reads(tree::consistency_ranges(s, n))),
    );

    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    let mut g = c.benchmark_group(format!("proof in a ledger of {n} records"));
    let mut i = 0;
    g.bench_function("inclusion (random seq, latest size)", |b| {
        b.iter(|| {
            i = (i + 1) % sample.len();
            black_box(rt.block_on(t.inclusion(&l, sample[i], n)).unwrap())
        })
    });
    g.bench_function("consistency (random size to latest)", |b| {
        b.iter(|| {
            i = (i + 1) % sample.len();
            black_box(rt.block_on(t.consistency(&l, sample[i], n)).unwrap())
        })
    });
    g.finish();
    c.final_summary();
}
