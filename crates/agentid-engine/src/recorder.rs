//! The process's one Prometheus recorder: its buckets, the series it describes, and the
//! rare ones registered at zero so that dashboards see them before the first event. The
//! binary serves it on its own listener; every layer records into it with `metrics::…!`.

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Finer between 5 and 25 ms, where a loaded instance's p99 lies: a quantile within a bucket
/// is interpolated, so with 10 and 25 alone every p99 in between read as "about 24 ms".
const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0,
];
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0];

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// The process's Prometheus recorder, installed on first use.
pub fn handle() -> &'static PrometheusHandle {
    HANDLE.get_or_init(|| {
        let builder = PrometheusBuilder::new()
            .set_buckets(LATENCY_BUCKETS)
            .and_then(|b| {
                b.set_buckets_for_metric(Matcher::Full("agentid_audit_batch_size".into()), BATCH_BUCKETS)
            })
            .expect("bucket lists are non-empty");
        let handle = match builder.install_recorder() {
            Ok(h) => h,
            // Another recorder is installed (an embedding program): keep ours unregistered.
            Err(_) => PrometheusBuilder::new().build_recorder().handle(),
        };
        metrics::gauge!("agentid_build_info", "version" => env!("CARGO_PKG_VERSION")).set(1.0);
        describe();
        register_zeroes();
        handle
    })
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        "agentid_http_requests_total",
        "HTTP requests by route pattern, method and status"
    );
    describe_histogram!(
        "agentid_http_request_duration_seconds",
        Unit::Seconds,
        "HTTP request latency by route pattern"
    );
    describe_counter!("agentid_verify_results_total", "Online verifications by result");
    describe_counter!(
        "agentid_signed_request_results_total",
        "Signed requests checked (Web Bot Auth), by result"
    );
    describe_counter!(
        "agentid_token_cache_requests_total",
        "Verified-token cache lookups by outcome (hit, miss)"
    );
    describe_histogram!("agentid_audit_batch_size", "Audit records per committed batch");
    describe_histogram!(
        "agentid_audit_flush_duration_seconds",
        Unit::Seconds,
        "Time to commit one audit batch"
    );
    describe_gauge!(
        "agentid_audit_queue_depth",
        "Audit records waiting for the writer"
    );
    describe_counter!(
        "agentid_audit_flush_failures_total",
        "Audit batches the store did not take (their verifications answered 503)"
    );
    describe_counter!("agentid_audit_records_total", "Audit records committed");
    describe_counter!(
        "agentid_audit_chain_conflicts_total",
        "Audit batches that found a ledger's chain moved by another instance, and were written again under the ledgers' locks"
    );
    describe_counter!(
        "agentid_audit_unknown_outcomes_total",
        "Audit batches whose connection broke after they were sent, found out by looking their blocks up"
    );
    describe_counter!(
        "agentid_store_outage_retries_total",
        "Tries again at a connection, a transaction or an audit batch during a database outage"
    );
    describe_histogram!(
        "agentid_audit_chain_lock_wait_seconds",
        Unit::Seconds,
        "Time an audit batch waited for its ledgers' locks after a conflict"
    );
    describe_gauge!(
        "agentid_revocation_index_size",
        "Revoked agents in the in-memory index"
    );
    describe_gauge!("agentid_registry_agents", "Agents in the in-memory registry");
    describe_gauge!(
        "agentid_registry_bytes",
        "Bytes the agents and revocation reasons in the in-memory registry take, about (at most --registry-bytes)"
    );
    describe_counter!(
        "agentid_rate_limited_total",
        "Calls refused with 429 by class (verify, verify_publishable, other, key_lookup)"
    );
    describe_counter!(
        "agentid_api_key_lookups_total",
        "Store look-ups of API keys the cache did not hold, by outcome"
    );
    describe_gauge!(
        "agentid_rate_limit_buckets",
        "Rate-limit buckets currently tracked"
    );
    describe_counter!(
        "agentid_rate_limit_leases_total",
        "Leases of rate-limit cells from the buckets a fleet shares, by outcome (granted, empty)"
    );
    describe_gauge!(
        "agentid_store_connections",
        "Database pool connections by pool (main; writer on PostgreSQL) and state (active, idle, max)"
    );
    describe_counter!(
        "agentid_checkpoints_total",
        "Signed checkpoints of the audit log's ledgers stored by this instance"
    );
    describe_histogram!(
        "agentid_checkpoint_duration_seconds",
        Unit::Seconds,
        "Time to make and store one checkpoint (reading its new records included)"
    );
    describe_counter!(
        "agentid_checkpoint_failures_total",
        "Checkpoints that could not be made (tried again at the next tick)"
    );
    describe_gauge!(
        "agentid_checkpoint_lag_records",
        "Most records of a ledger beyond its latest checkpoint (of the ledgers this instance checkpoints)"
    );
    describe_gauge!(
        "agentid_checkpoint_lag_seconds",
        Unit::Seconds,
        "Longest time a ledger has had records beyond its latest checkpoint"
    );
    describe_counter!(
        "agentid_integrity_failures_total",
        "Stored rows the service did not write, by what they are (signing_key, tree_node, checkpoint, revocation, retired_key): each is an alarm"
    );
    describe_histogram!(
        "agentid_status_list_publish_delay_seconds",
        Unit::Seconds,
        "From a revocation's commit to this instance serving a status list that holds it"
    );
    describe_counter!(
        "agentid_status_list_requests_total",
        "Status list requests by outcome (ok, not_modified, not_found, not_acceptable)"
    );
    describe_histogram!(
        "agentid_ssf_delivery_delay_seconds",
        Unit::Seconds,
        "Shared Signals: from a revocation's commit to the receiver's 202 (push) or to the SET handed to a poll"
    );
    describe_counter!(
        "agentid_ssf_deliveries_total",
        "Shared Signals deliveries by outcome (delivered, refused, failed, expired, acknowledged)"
    );
    describe_gauge!(
        "agentid_ssf_pending_events",
        "Shared Signals events owed to streams, not yet delivered"
    );
    describe_gauge!(
        "agentid_ssf_dropped_events",
        "Shared Signals events dropped, oldest first, from streams owed 10,000 already"
    );
    describe_gauge!("agentid_build_info", "Build information (value 1)");
}

/// Series that only move on rare events exist from the start (at zero), so dashboards and
/// alerts see them before the first event.
fn register_zeroes() {
    for result in ["valid", "invalid", "expired", "revoked", "unrecorded"] {
        metrics::counter!("agentid_verify_results_total", "result" => result).increment(0);
    }
    for result in ["verified", "invalid", "unverified"] {
        metrics::counter!("agentid_signed_request_results_total", "result" => result).increment(0);
    }
    for outcome in ["hit", "miss"] {
        metrics::counter!("agentid_token_cache_requests_total", "outcome" => outcome).increment(0);
    }
    for outcome in ["found", "rejected", "throttled"] {
        metrics::counter!("agentid_api_key_lookups_total", "outcome" => outcome).increment(0);
    }
    for class in ["verify", "verify_publishable", "other", "key_lookup"] {
        metrics::counter!("agentid_rate_limited_total", "class" => class).increment(0);
    }
    for outcome in ["granted", "empty"] {
        metrics::counter!("agentid_rate_limit_leases_total", "outcome" => outcome).increment(0);
    }
    metrics::counter!("agentid_audit_flush_failures_total").increment(0);
    metrics::counter!("agentid_audit_records_total").increment(0);
    metrics::counter!("agentid_audit_chain_conflicts_total").increment(0);
    metrics::counter!("agentid_checkpoints_total").increment(0);
    metrics::counter!("agentid_checkpoint_failures_total").increment(0);
    for what in [
        "signing_key",
        "tree_node",
        "checkpoint",
        "revocation",
        "retired_key",
        "domain_event",
    ] {
        metrics::counter!("agentid_integrity_failures_total", "what" => what).increment(0);
    }
    metrics::gauge!("agentid_checkpoint_lag_records").set(0.0);
    for outcome in ["ok", "not_modified", "not_found", "not_acceptable"] {
        metrics::counter!("agentid_status_list_requests_total", "outcome" => outcome).increment(0);
    }
    let _ = metrics::histogram!("agentid_status_list_publish_delay_seconds");
    for outcome in ["delivered", "refused", "failed", "expired", "acknowledged"] {
        metrics::counter!("agentid_ssf_deliveries_total", "outcome" => outcome).increment(0);
    }
    let _ = metrics::histogram!("agentid_ssf_delivery_delay_seconds");
    metrics::gauge!("agentid_ssf_pending_events").set(0.0);
    metrics::gauge!("agentid_ssf_dropped_events").set(0.0);
    metrics::gauge!("agentid_checkpoint_lag_seconds").set(0.0);
    let _ = metrics::histogram!("agentid_checkpoint_duration_seconds");
    // Registered, so that it is exported (with empty buckets) before the first wait.
    let _ = metrics::histogram!("agentid_audit_chain_lock_wait_seconds");
    metrics::gauge!("agentid_audit_queue_depth").set(0.0);
    metrics::gauge!("agentid_rate_limit_buckets").set(0.0);
}

/// How often gauges that are sampled (not pushed) are refreshed.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_secs(5);
