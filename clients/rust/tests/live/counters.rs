//! The counters, read through a recorder of this thread's own (tests run side by side).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentid_verifier::Verifier;
use metrics::{Counter, CounterFn, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use serde_json::json;

use super::{code, proxied, until};

/// Counters by name and labels (`name{a=x,b=y}`).
#[derive(Clone, Default)]
struct Counts(Arc<Mutex<BTreeMap<String, Arc<AtomicU64>>>>);

struct Count(Arc<AtomicU64>);

impl CounterFn for Count {
    fn increment(&self, value: u64) {
        self.0.fetch_add(value, Ordering::Relaxed);
    }
    fn absolute(&self, value: u64) {
        self.0.store(value, Ordering::Relaxed);
    }
}

impl Counts {
    fn get(&self, key: &str) -> u64 {
        self.0
            .lock()
            .unwrap()
            .get(key)
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }
}

impl Recorder for Counts {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        let count = self.0.lock().unwrap().entry(name).or_default().clone();
        Counter::from_arc(Arc::new(Count(count)))
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

/// Each verification is counted by outcome and each fetch by document and result.
#[tokio::test(flavor = "current_thread")]
async fn verifications_and_fetches_are_counted() {
    let counts = Counts::default();
    let _on_this_thread = metrics::set_default_local_recorder(&counts);
    let (s, p) = proxied();
    let (_, token) = s.register(json!({}));
    let (_, other) = s.register(json!({}));
    let v = Verifier::builder(&p.url).allow_local(true).build().unwrap();
    assert_eq!(code(v.verify(&token).await), "ok");
    assert_eq!(code(v.verify_with_scopes(&token, &["read:orders"]).await), "ok");
    assert_eq!(
        code(v.verify_with_scopes(&token, &["write:orders"]).await),
        "INSUFFICIENT_SCOPE"
    );
    assert_eq!(code(v.verify("x").await), "TOKEN_INVALID");
    p.answer_under("/v1/status/", 503, Vec::new(), Vec::new());
    tokio::time::sleep(Duration::from_millis(2200)).await; // the list (ttl 2 s) is stale
    assert_eq!(code(v.verify(&other).await), "ok"); // it serves while one refresh fails behind
    let failed = "agentid_verifier_fetches_total{document=status_list,result=failed}";
    until("1", Duration::from_secs(5), || {
        let n = counts.get(failed);
        async move {
            if n == 1 {
                "1"
            } else {
                "not yet"
            }
        }
    })
    .await;
    p.pass();
    let verifications = "agentid_verifier_verifications_total";
    assert_eq!(counts.get(&format!("{verifications}{{outcome=valid}}")), 3);
    assert_eq!(
        counts.get(&format!("{verifications}{{outcome=INSUFFICIENT_SCOPE}}")),
        1
    );
    assert_eq!(
        counts.get(&format!("{verifications}{{outcome=TOKEN_INVALID}}")),
        1
    );
    let fetches = "agentid_verifier_fetches_total";
    assert_eq!(
        counts.get(&format!("{fetches}{{document=jwks,result=fetched}}")),
        1
    );
    assert_eq!(
        counts.get(&format!("{fetches}{{document=status_list,result=fetched}}")),
        1
    );
    assert_eq!(
        counts.get(&format!("{fetches}{{document=jwks,result=not_modified}}")),
        0
    );
}
