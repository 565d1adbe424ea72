//! Delivering push streams' events: the deliverer leases a stream (no other instance
//! delivers it meanwhile), posts its pending events in order within the lease, each stream
//! beside the others, and on a failure waits and tries again: 1 s, doubling, at most 5 min
//! apart, for 24 h.

use std::io::Read;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::vetting::pusher;
use super::{Ssf, GIVE_UP_AFTER, PUSH_TIMEOUT, REFUSAL_BYTES};
use crate::outbound::Client;
use agentid_core::domain::Millis;
use agentid_store::{StoreError, StreamRecord};

/// What a push came to.
enum Pushed {
    Delivered,
    /// 400: the receiver refused the SET for good (logged, not retried).
    Refused(String),
    Failed(String),
}

/// POSTs a SET (blocking).
fn push(client: &Client, url: &str, set: &str) -> Pushed {
    match client
        .request()
        .post(url)
        .set("Content-Type", "application/secevent+jwt")
        .set("Accept", "application/json")
        .send_string(set)
    {
        Ok(r) if r.status() == 202 => Pushed::Delivered,
        Ok(r) => Pushed::Failed(format!("answered {}", r.status())),
        Err(ureq::Error::Status(400, r)) => Pushed::Refused(refusal(r)),
        Err(ureq::Error::Status(code, _)) => Pushed::Failed(format!("answered {code}")),
        // Without the URL: a receiver's endpoint may carry a secret in its query.
        Err(ureq::Error::Transport(t)) => Pushed::Failed(crate::outbound::transport_failure(&t)),
    }
}

/// What a receiver said with its 400: at most `REFUSAL_BYTES` of its body, read no further.
fn refusal(r: ureq::Response) -> String {
    let mut body = Vec::new();
    let _ = r.into_reader().take(REFUSAL_BYTES).read_to_end(&mut body);
    String::from_utf8_lossy(&body).into_owned()
}

/// When to try an event again after its `attempts`-th failure: 1 s, doubling, at most 5 min.
fn backoff(attempts: i32) -> Duration {
    Duration::from_secs(1u64 << attempts.clamp(1, 10).saturating_sub(1) as u32).min(Duration::from_secs(300))
}

/// How long an event has been retried after `attempts` failed pushes: the waits between them.
/// Counted from its first failure, not from the event: one held while its stream was paused
/// gets its retries once the stream is enabled again.
fn retried_for(attempts: i32) -> Duration {
    // The waits double from 1 s over the first nine, then stay at 5 min ([`backoff`]); in a
    // closed form, so that a count written into the database costs nothing to read.
    let n = attempts.max(0) as u64;
    Duration::from_secs((1u64 << n.min(9)) - 1 + n.saturating_sub(9) * 300)
}

/// Delivers push streams' events for as long as it runs: each leased stream in a task of its
/// own, at most `streams_at_once` of them at a time, so that a slow receiver holds up only its
/// own stream.
pub(crate) async fn deliverer(ssf: Arc<Ssf>) {
    let mut sampled = Instant::now() - Duration::from_secs(60);
    loop {
        if let Err(e) = deliver_due(&ssf).await {
            tracing::warn!(error = %e, "event delivery failed; retrying");
        }
        if sampled.elapsed() >= Duration::from_secs(5) {
            sampled = Instant::now();
            if let Ok((pending, dropped)) = ssf.store.outbox_totals().await {
                metrics::gauge!("agentid_ssf_pending_events").set(pending as f64);
                metrics::gauge!("agentid_ssf_dropped_events").set(dropped as f64);
            }
        }
        let _ = tokio::time::timeout(Duration::from_millis(250), ssf.wake.notified()).await;
    }
}

/// Leases as many streams with an event due as there are free slots, and starts a pass on
/// each; until none is due or no slot is free.
async fn deliver_due(ssf: &Arc<Ssf>) -> Result<(), StoreError> {
    let slots = &ssf.passes;
    loop {
        // A slot held across the claim: a stop (which waits for every slot) cannot end while
        // streams are being leased, and leases none once it has begun.
        let Ok(first) = slots.clone().try_acquire_owned() else {
            return Ok(());
        };
        if ssf.stopping() {
            return Ok(());
        }
        let free = slots.available_permits() + 1;
        let claimed = Instant::now();
        let now = Millis::now();
        let until = Millis(now.0 + ssf.cfg.lease.as_millis() as i64);
        let streams = ssf.store.claim_streams(now, until, free as u32).await?;
        if streams.is_empty() {
            return Ok(());
        }
        if ssf.stopping() {
            // Stopped while leasing: what was leased goes back at once.
            for stream in streams.into_iter().flatten() {
                let _ = ssf.store.release_stream(&stream.id, until, None).await;
            }
            return Ok(());
        }
        let mut first = Some(first);
        for stream in streams {
            let stream = match stream {
                Ok(stream) => stream,
                Err(e) => {
                    // Leased and passed over until its lease runs out: the others go on.
                    crate::transparency::alarm("ssf_stream", &format!("a stream passed over: {e}"));
                    continue;
                }
            };
            // Free: only this loop takes slots, and it claimed no more than were free; but a
            // stop that began meanwhile may be waiting for them, and the stream goes back.
            let slot = match first.take().map_or_else(|| slots.clone().try_acquire_owned(), Ok) {
                Ok(slot) => slot,
                Err(_) => {
                    let _ = ssf.store.release_stream(&stream.id, until, None).await;
                    continue;
                }
            };
            let ssf = ssf.clone();
            tokio::spawn(async move {
                let pass = deliver_stream(&ssf, &stream, claimed + ssf.cfg.lease).await;
                let behind = matches!(pass, Ok(Pass::Cut)).then(Millis::now);
                if let Err(e) = ssf.store.release_stream(&stream.id, until, behind).await {
                    tracing::warn!(stream = %stream.id, error = %e, "releasing a stream failed; its lease runs out");
                }
                if let Err(e) = pass {
                    tracing::warn!(stream = %stream.id, error = %e, "event delivery failed; retrying");
                }
                drop(slot);
            });
        }
    }
}

/// How a pass over a stream ended.
enum Pass {
    /// Every pending event was tried (or the first failure waits for its retry).
    Done,
    /// The lease was running out with events left: the stream goes behind those that waited.
    Cut,
}

/// Posts a leased stream's pending events in order, while a push that times out would still
/// end before the lease does (`lease_ends`); stops at the first that fails.
async fn deliver_stream(
    ssf: &Arc<Ssf>,
    stream: &StreamRecord,
    lease_ends: Instant,
) -> Result<Pass, StoreError> {
    let Some(url) = stream.endpoint_url.clone() else {
        return Ok(Pass::Done);
    };
    // The endpoint is checked again (https, public addresses) before every pass.
    let agent = pusher(&ssf.outbound, &url, ssf.cfg.allow_insecure_endpoints).await;
    // Delivered events are marked done a chunk at a time (one commit, not one per event): a
    // crash between a push and its mark sends that SET again, as at-least-once allows.
    let mut done: Vec<i64> = Vec::new();
    let outcome =
        |o: &'static str| metrics::counter!("agentid_ssf_deliveries_total", "outcome" => o).increment(1);
    let mut pass = Pass::Done;
    for event in ssf.store.pending_events(&stream.id, 500).await? {
        if ssf.stopping() {
            // The instance stops: what is left waits for the next pass, anywhere.
            break;
        }
        // A stream disabled, paused, deleted or moved to another endpoint (or `aud`) while the
        // pass runs gets nothing more from it (SSF §8.1.2); a moved one, its next pass. Looked
        // at before the time left: the look may wait for a connection.
        if !as_leased(ssf, stream).await? {
            break;
        }
        if Instant::now() + PUSH_TIMEOUT + Duration::from_secs(1) >= lease_ends {
            pass = Pass::Cut;
            break;
        }
        let pushed = match &agent {
            Ok(agent) => {
                let set = ssf.sign(stream, &event);
                let (agent, url) = (agent.clone(), url.clone());
                tokio::task::spawn_blocking(move || push(&agent, &url, &set))
                    .await
                    .unwrap_or_else(|e| Pushed::Failed(e.to_string()))
            }
            Err(e) => Pushed::Failed(e.clone()),
        };
        let now = Millis::now();
        match pushed {
            Pushed::Delivered => {
                metrics::histogram!("agentid_ssf_delivery_delay_seconds")
                    .record((now.0 - event.event_at.0).max(0) as f64 / 1000.0);
                outcome("delivered");
                done.push(event.seq);
            }
            Pushed::Refused(body) => {
                outcome("refused");
                // The receiver's words, escaped (`?`) and cut: they cannot forge a log line.
                tracing::warn!(stream = %stream.id, jti = %event.jti, body = ?body, "receiver refused a SET (400); not retried");
                done.push(event.seq);
            }
            Pushed::Failed(why) => {
                if retried_for(event.attempts) >= GIVE_UP_AFTER {
                    outcome("expired");
                    tracing::warn!(stream = %stream.id, jti = %event.jti, "gave up a SET after 24 h of failed pushes");
                    done.push(event.seq);
                    continue;
                }
                outcome("failed");
                let attempts = event.attempts + 1;
                let next = Millis(now.0 + backoff(attempts).as_millis() as i64);
                tracing::info!(stream = %stream.id, jti = %event.jti, attempts, error = %why, "push failed; trying again later");
                ssf.store.events_done(&stream.id, &done).await?;
                ssf.store
                    .event_retry(&stream.id, event.seq, attempts, next)
                    .await?;
                return Ok(Pass::Done);
            }
        }
        if done.len() >= 64 {
            ssf.store.events_done(&stream.id, &done).await?;
            done.clear();
        }
    }
    ssf.store.events_done(&stream.id, &done).await?;
    Ok(pass)
}

/// Whether `stream` is still as it was leased: there, enabled, with the same endpoint and
/// `aud`.
async fn as_leased(ssf: &Ssf, stream: &StreamRecord) -> Result<bool, StoreError> {
    Ok(ssf.store.get_stream(&stream.id).await?.is_some_and(|now| {
        now.status == "enabled" && now.endpoint_url == stream.endpoint_url && now.aud == stream.aud
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_span_a_day_before_an_event_is_given_up() {
        for n in 0..400 {
            assert_eq!(retried_for(n), (1..=n).map(backoff).sum(), "{n}");
        }
        let first = (1..).find(|&n| retried_for(n) >= GIVE_UP_AFTER).unwrap();
        assert_eq!(first, 296);
        assert!(retried_for(i32::MAX) >= GIVE_UP_AFTER);
    }

    #[test]
    fn a_failed_push_names_no_part_of_the_receivers_url() {
        // Nothing listens on port 1: the connection is refused.
        let url = "http://127.0.0.1:1/events?token=S3CRET";
        let client = crate::outbound::Outbound::new(Default::default()).agent(
            vec!["127.0.0.1:1".parse().unwrap()],
            Duration::from_secs(1),
            REFUSAL_BYTES,
        );
        let Pushed::Failed(why) = push(&client, url, "a.b.c") else {
            panic!("a refused connection is a failed push");
        };
        assert!(!why.contains("S3CRET") && !why.contains("/events"), "{why}");
    }

    #[test]
    fn failed_pushes_wait_longer_each_time_up_to_five_minutes() {
        assert_eq!(backoff(1), Duration::from_secs(1));
        assert_eq!(backoff(3), Duration::from_secs(4));
        assert_eq!(backoff(40), Duration::from_secs(300));
    }
}
