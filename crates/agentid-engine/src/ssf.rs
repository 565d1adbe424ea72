//! An OpenID Shared Signals (SSF 1.0) transmitter: an organization's streams to its
//! receivers, and the delivery of a CAEP `session-revoked` Security Event Token (RFC 8417)
//! for each revocation, pushed (RFC 8935) or polled (RFC 8936).
//!
//! A revocation writes its stream's events in its own transaction (a trigger), so they
//! survive a crash. The deliverer leases one push stream at a time (no other instance
//! delivers it meanwhile), posts its pending events in order, and on a failure waits and
//! tries again: 1 s, doubling, at most 5 min apart, for 24 h. SETs are signed at delivery
//! with the key that signs tokens.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tokio::sync::Notify;

use super::outbound;
use agentid_core::domain::{new_id, IdPrefix, KeyMode, Millis};
use agentid_core::keys::SigningKeys;
use agentid_store::{SharedStore, SsfEvent, StoreError, StreamRecord};

pub const PUSH: &str = "urn:ietf:rfc:8935";
pub const POLL: &str = "urn:ietf:rfc:8936";
pub const SESSION_REVOKED: &str = "https://schemas.openid.net/secevent/caep/event-type/session-revoked";
pub const VERIFICATION: &str = "https://schemas.openid.net/secevent/ssf/event-type/verification";
pub const EVENTS_SUPPORTED: [&str; 2] = [SESSION_REVOKED, VERIFICATION];

/// Streams an organization may have.
pub const MAX_STREAMS: i64 = 10;
/// Events a stream may be owed; past this the oldest are dropped (and counted).
pub const MAX_PENDING: u32 = 10_000;
/// Bounds of what a stream's owner sends.
const MAX_EVENTS_REQUESTED: usize = 16;
const MAX_TEXT: usize = 512;
/// A push that takes longer failed.
const PUSH_TIMEOUT: Duration = Duration::from_secs(10);
/// Attempts stop this long after the event.
const GIVE_UP_AFTER: Duration = Duration::from_secs(24 * 3600);
/// How long a poll with `returnImmediately: false` waits for an event.
pub const POLL_WAIT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
pub struct SsfConfig {
    /// Allow `http://` and loopback or private push endpoints (development and tests).
    pub allow_insecure_endpoints: bool,
    /// How long an instance holds a push stream it delivers: after a crash, the stream's
    /// events wait this long for another instance (or the restarted one).
    pub lease: Duration,
}

impl Default for SsfConfig {
    fn default() -> Self {
        SsfConfig {
            allow_insecure_endpoints: false,
            lease: Duration::from_secs(30),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SsfError {
    #[error("{field}: {message}")]
    Invalid { field: &'static str, message: String },
    #[error("no such stream")]
    NotFound,
    #[error("an organization has at most {MAX_STREAMS} streams")]
    TooMany,
    #[error("poll token missing or not this stream's")]
    BadPollToken,
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn invalid(field: &'static str, message: impl Into<String>) -> SsfError {
    SsfError::Invalid {
        field,
        message: message.into(),
    }
}

/// What a stream's owner sends to create or replace it.
#[derive(Debug, Clone, Default)]
pub struct StreamInput {
    pub method: String,
    pub endpoint_url: Option<String>,
    pub events_requested: Vec<String>,
    pub description: Option<String>,
    pub aud: Option<String>,
}

pub struct Ssf {
    store: SharedStore,
    signing: Arc<SigningKeys>,
    /// The public URL: SETs' `iss`, and the base of poll URLs.
    public_url: String,
    cfg: SsfConfig,
    /// Woken when an event is queued on this instance.
    wake: Notify,
}

impl Ssf {
    pub fn new(store: SharedStore, signing: Arc<SigningKeys>, public_url: &str, cfg: SsfConfig) -> Self {
        Ssf {
            store,
            signing,
            public_url: public_url.trim_end_matches('/').to_owned(),
            cfg,
            wake: Notify::new(),
        }
    }

    pub fn public_url(&self) -> &str {
        &self.public_url
    }

    /// Where a poll stream's receiver polls.
    pub fn poll_url(&self, stream_id: &str) -> String {
        format!("{}/ssf/poll/{stream_id}", self.public_url)
    }

    /// New events may be due: deliver now rather than at the next tick.
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Checks a push endpoint (https, every address public), resolving it off the async
    /// threads.
    async fn vet(&self, input: &StreamInput) -> Result<(), SsfError> {
        let Some(url) = input.endpoint_url.clone().filter(|_| input.method == PUSH) else {
            return Ok(());
        };
        if url.len() > MAX_TEXT {
            return Err(invalid(
                "delivery.endpoint_url",
                format!("at most {MAX_TEXT} characters"),
            ));
        }
        let allow = self.cfg.allow_insecure_endpoints;
        tokio::task::spawn_blocking(move || check_endpoint(&url, allow))
            .await
            .map_err(|e| invalid("delivery.endpoint_url", e.to_string()))?
            .map_err(|m| invalid("delivery.endpoint_url", m))
    }

    /// A stream built from `input` (its endpoint vetted), keeping `base`'s identity.
    fn build(&self, base: StreamRecord, input: StreamInput) -> Result<StreamRecord, SsfError> {
        let (endpoint_url, default_aud) = match input.method.as_str() {
            PUSH => {
                let url = input
                    .endpoint_url
                    .ok_or_else(|| invalid("delivery.endpoint_url", "is required for push delivery"))?;
                let origin =
                    origin_of(&url).ok_or_else(|| invalid("delivery.endpoint_url", "is not a URL"))?;
                (Some(url), origin)
            }
            POLL => (None, base.id.clone()),
            other => {
                return Err(invalid(
                    "delivery.method",
                    format!("{other:?} is not {PUSH} (push) or {POLL} (poll)"),
                ))
            }
        };
        if input.events_requested.len() > MAX_EVENTS_REQUESTED
            || input
                .events_requested
                .iter()
                .any(|e| e.is_empty() || e.len() > MAX_TEXT)
        {
            return Err(invalid(
                "events_requested",
                format!("at most {MAX_EVENTS_REQUESTED} event type URIs of 1 to {MAX_TEXT} characters"),
            ));
        }
        for (field, text) in [("description", &input.description), ("aud", &input.aud)] {
            if text.as_ref().is_some_and(|t| t.is_empty() || t.len() > MAX_TEXT) {
                return Err(invalid(field, format!("must be 1 to {MAX_TEXT} characters")));
            }
        }
        Ok(StreamRecord {
            aud: input.aud.unwrap_or(default_aud),
            method: input.method,
            endpoint_url,
            revocations: input.events_requested.iter().any(|e| e == SESSION_REVOKED),
            events_requested: input.events_requested,
            description: input.description,
            ..base
        })
    }

    /// Creates a stream of the organization's, in its key's mode. For poll delivery, also the
    /// poll token (shown this once; only its hash is kept).
    pub async fn create(
        &self,
        org_id: &str,
        mode: KeyMode,
        input: StreamInput,
    ) -> Result<(StreamRecord, Option<String>), SsfError> {
        if self.store.count_streams(org_id).await? >= MAX_STREAMS {
            return Err(SsfError::TooMany);
        }
        self.vet(&input).await?;
        let base = StreamRecord {
            id: new_id(IdPrefix::Stream),
            org_id: org_id.to_owned(),
            mode,
            aud: String::new(),
            method: String::new(),
            endpoint_url: None,
            poll_token_hash: None,
            events_requested: Vec::new(),
            revocations: false,
            description: None,
            status: "enabled".to_owned(),
            created_at: Millis::now(),
        };
        let poll = input.method == POLL;
        let mut stream = self.build(base, input)?;
        let token = poll.then(|| {
            use base64::Engine as _;
            let token = format!(
                "pt_{}",
                base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(rand::random::<[u8; 32]>())
            );
            stream.poll_token_hash = Some(Sha256::digest(token.as_bytes()).to_vec());
            token
        });
        self.store.insert_stream(&stream).await?;
        Ok((stream, token))
    }

    /// The caller's stream: another organization's, or another mode's, is not found.
    pub async fn get(&self, org_id: &str, mode: KeyMode, id: &str) -> Result<StreamRecord, SsfError> {
        match self.store.get_stream(id).await? {
            Some(s) if s.org_id == org_id && s.mode == mode => Ok(s),
            _ => Err(SsfError::NotFound),
        }
    }

    pub async fn list(&self, org_id: &str, mode: KeyMode) -> Result<Vec<StreamRecord>, SsfError> {
        Ok(self.store.list_streams(org_id, mode).await?)
    }

    /// Replaces what the owner may change. The delivery method stays what it was.
    pub async fn replace(
        &self,
        org_id: &str,
        mode: KeyMode,
        id: &str,
        input: StreamInput,
    ) -> Result<StreamRecord, SsfError> {
        let current = self.get(org_id, mode, id).await?;
        if input.method != current.method {
            return Err(invalid(
                "delivery.method",
                "a stream's delivery method does not change",
            ));
        }
        self.vet(&input).await?;
        let stream = self.build(current, input)?;
        if !self.store.update_stream(&stream).await? {
            return Err(SsfError::NotFound);
        }
        Ok(stream)
    }

    pub async fn delete(&self, org_id: &str, mode: KeyMode, id: &str) -> Result<(), SsfError> {
        self.get(org_id, mode, id).await?;
        self.store.delete_stream(id).await?;
        Ok(())
    }

    pub async fn set_status(
        &self,
        org_id: &str,
        mode: KeyMode,
        id: &str,
        status: &str,
    ) -> Result<StreamRecord, SsfError> {
        if !matches!(status, "enabled" | "paused" | "disabled") {
            return Err(invalid("status", "must be enabled, paused or disabled"));
        }
        let mut stream = self.get(org_id, mode, id).await?;
        stream.status = status.to_owned();
        self.store.update_stream(&stream).await?;
        self.wake();
        Ok(stream)
    }

    /// Adds (or removes) an agent of the stream's organization and mode to what it carries.
    pub async fn subject(
        &self,
        org_id: &str,
        mode: KeyMode,
        id: &str,
        iss: &str,
        sub: &str,
        add: bool,
    ) -> Result<(), SsfError> {
        let stream = self.get(org_id, mode, id).await?;
        let agent = self.store.get_agent(sub).await?;
        if !agent.is_some_and(|a| a.org_id == org_id && a.mode == mode && a.issuer_domain == iss) {
            return Err(invalid(
                "subject",
                "names no agent of this organization and mode (iss is its issuer_domain, sub its agent_id)",
            ));
        }
        if add {
            self.store.add_subject(&stream.id, sub).await?;
        } else {
            self.store.remove_subject(&stream.id, sub).await?;
        }
        Ok(())
    }

    /// Queues a verification event carrying `state` (SSF §8.1.4).
    pub async fn verify(
        &self,
        org_id: &str,
        mode: KeyMode,
        id: &str,
        state: Option<&str>,
    ) -> Result<(), SsfError> {
        if state.is_some_and(|s| s.len() > MAX_TEXT) {
            return Err(invalid("state", format!("at most {MAX_TEXT} characters")));
        }
        let stream = self.get(org_id, mode, id).await?;
        let jti = new_id(IdPrefix::Event);
        self.store
            .add_verification(&stream.id, &jti, state, Millis::now())
            .await?;
        self.wake();
        Ok(())
    }

    /// The SET of an event, signed now.
    pub fn sign(&self, stream: &StreamRecord, event: &SsfEvent) -> String {
        let mut claims = serde_json::json!({
            "iss": self.public_url,
            "aud": stream.aud,
            "jti": event.jti,
            "iat": Millis::now().as_secs(),
        });
        match event.kind.as_str() {
            "verification" => {
                claims["sub_id"] = serde_json::json!({"format": "opaque", "id": stream.id});
                let mut body = serde_json::json!({});
                if let Some(state) = &event.state {
                    body["state"] = state.as_str().into();
                }
                claims["events"] = serde_json::json!({ VERIFICATION: body });
            }
            _ => {
                claims["sub_id"] = serde_json::json!({
                    "format": "iss_sub",
                    "iss": event.issuer,
                    "sub": event.agent_id,
                });
                let mut body = serde_json::json!({"event_timestamp": event.event_at.as_secs()});
                if let Some(reason) = event.reason.as_deref().filter(|r| !r.is_empty()) {
                    body["reason_admin"] = serde_json::json!({ "en": reason });
                }
                claims["events"] = serde_json::json!({ SESSION_REVOKED: body });
            }
        }
        self.signing.sign_json("secevent+jwt", &claims).0
    }

    /// A poll (RFC 8936): acknowledges `ack` (and `set_errs`, which the receiver also has
    /// done with), then answers up to `max` pending SETs, waiting for one up to `POLL_WAIT`
    /// unless `immediately`.
    pub async fn poll(
        &self,
        id: &str,
        token: Option<&str>,
        ack: &[String],
        max: u32,
        immediately: bool,
    ) -> Result<(Vec<(String, String)>, bool), SsfError> {
        let stream = self.store.get_stream(id).await?.ok_or(SsfError::NotFound)?;
        let expected = stream.poll_token_hash.as_deref().ok_or(SsfError::NotFound)?;
        let given = token.map(|t| Sha256::digest(t.as_bytes()));
        if given.as_deref() != Some(expected) {
            return Err(SsfError::BadPollToken);
        }
        if !ack.is_empty() {
            let n = self.store.ack_events(id, ack, Millis::now()).await?;
            metrics::counter!("agentid_ssf_deliveries_total", "outcome" => "acknowledged").increment(n);
        }
        let started = Instant::now();
        loop {
            let events = if stream.status == "enabled" {
                self.store.pending_events(id, max + 1).await?
            } else {
                Vec::new()
            };
            if !events.is_empty() || immediately || started.elapsed() >= POLL_WAIT {
                let more = events.len() > max as usize;
                let now = Millis::now();
                let sets = events
                    .iter()
                    .take(max as usize)
                    .map(|e| {
                        if e.attempts == 0 {
                            metrics::histogram!("agentid_ssf_delivery_delay_seconds")
                                .record((now.0 - e.event_at.0).max(0) as f64 / 1000.0);
                        }
                        (e.jti.clone(), self.sign(&stream, e))
                    })
                    .collect();
                return Ok((sets, more));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// The origin (`scheme://host[:port]`) of a URL.
fn origin_of(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    (!authority.is_empty()).then(|| format!("{scheme}://{authority}"))
}

/// The addresses a push to `url` may use: all it resolves to, each globally reachable
/// (`outbound`; unless insecure endpoints are allowed, for development).
fn vetted_addresses(url: &str, allow_insecure: bool) -> Result<Vec<SocketAddr>, String> {
    let (https, host, port) = outbound::host_port(url)?;
    if !https && !allow_insecure {
        return Err("must be an https:// URL".into());
    }
    let addrs: Vec<SocketAddr> = (host.as_str(), port)
        .to_socket_addrs()
        .map_err(|e| format!("does not resolve ({e})"))?
        .collect();
    let ips: Vec<IpAddr> = addrs.iter().map(SocketAddr::ip).collect();
    outbound::check_addresses(&ips, allow_insecure)?;
    Ok(addrs)
}

/// Checks a push endpoint: https, and every address it resolves to is public.
pub fn check_endpoint(url: &str, allow_insecure: bool) -> Result<(), String> {
    vetted_addresses(url, allow_insecure).map(|_| ())
}

/// What a push came to.
enum Pushed {
    Delivered,
    /// 400: the receiver refused the SET for good (logged, not retried).
    Refused(String),
    Failed(String),
}

/// An HTTP client for one delivery pass to one endpoint: it connects only to the addresses
/// vetted at its making (so a DNS answer that changes in between cannot redirect it), keeps
/// its connection alive between the pass's SETs, and follows no redirect.
fn pusher(url: &str, allow_insecure: bool) -> Result<ureq::Agent, String> {
    let addrs = vetted_addresses(url, allow_insecure).map_err(|e| format!("endpoint {e}"))?;
    Ok(ureq::AgentBuilder::new()
        .timeout(PUSH_TIMEOUT)
        .redirects(0)
        .resolver(move |_: &str| Ok(addrs.clone()))
        .build())
}

/// POSTs a SET (blocking).
fn push(agent: &ureq::Agent, url: &str, set: &str) -> Pushed {
    match agent
        .post(url)
        .set("Content-Type", "application/secevent+jwt")
        .set("Accept", "application/json")
        .send_string(set)
    {
        Ok(r) if r.status() == 202 => Pushed::Delivered,
        Ok(r) => Pushed::Failed(format!("answered {}", r.status())),
        Err(ureq::Error::Status(400, r)) => {
            Pushed::Refused(r.into_string().unwrap_or_default().chars().take(300).collect())
        }
        Err(ureq::Error::Status(code, _)) => Pushed::Failed(format!("answered {code}")),
        Err(e) => Pushed::Failed(e.to_string()),
    }
}

/// When to try an event again after its `attempts`-th failure: 1 s, doubling, at most 5 min.
fn backoff(attempts: i32) -> Duration {
    Duration::from_secs(1u64 << attempts.clamp(1, 10).saturating_sub(1) as u32).min(Duration::from_secs(300))
}

/// Delivers push streams' events for as long as it runs.
pub async fn deliverer(ssf: Arc<Ssf>) {
    let mut sampled = Instant::now() - Duration::from_secs(60);
    loop {
        if let Err(e) = deliver_due(&ssf).await {
            tracing::warn!(error = %e, "event delivery failed; retrying");
        }
        if sampled.elapsed() >= Duration::from_secs(5) {
            sampled = Instant::now();
            if let Ok(n) = ssf.store.pending_count().await {
                metrics::gauge!("agentid_ssf_pending_events").set(n as f64);
            }
        }
        let _ = tokio::time::timeout(Duration::from_millis(250), ssf.wake.notified()).await;
    }
}

/// One pass: every push stream with an event due, one after the other.
async fn deliver_due(ssf: &Arc<Ssf>) -> Result<(), StoreError> {
    loop {
        let now = Millis::now();
        let until = Millis(now.0 + ssf.cfg.lease.as_millis() as i64);
        let streams = ssf.store.claim_streams(now, until, 16).await?;
        if streams.is_empty() {
            return Ok(());
        }
        for stream in streams {
            let result = deliver_stream(ssf, &stream).await;
            ssf.store.release_stream(&stream.id).await?;
            result?;
        }
    }
}

/// Posts a leased stream's pending events in order; stops at the first that fails.
async fn deliver_stream(ssf: &Arc<Ssf>, stream: &StreamRecord) -> Result<(), StoreError> {
    let dropped = ssf
        .store
        .drop_excess(&stream.id, MAX_PENDING, Millis::now())
        .await?;
    if dropped > 0 {
        metrics::counter!("agentid_ssf_deliveries_total", "outcome" => "dropped").increment(dropped);
        tracing::warn!(stream = %stream.id, dropped, "stream owed too many events; the oldest were dropped");
    }
    let Some(url) = stream.endpoint_url.clone() else {
        return Ok(());
    };
    let started = Instant::now();
    // The endpoint is checked again (https, public addresses) before every pass.
    let (url2, allow) = (url.clone(), ssf.cfg.allow_insecure_endpoints);
    let agent = tokio::task::spawn_blocking(move || pusher(&url2, allow))
        .await
        .unwrap_or_else(|e| Err(e.to_string()));
    // Delivered events are marked done a chunk at a time (one commit, not one per event): a
    // crash between a push and its mark sends that SET again, as at-least-once allows.
    let mut done: Vec<i64> = Vec::new();
    let outcome =
        |o: &'static str| metrics::counter!("agentid_ssf_deliveries_total", "outcome" => o).increment(1);
    for event in ssf.store.pending_events(&stream.id, 500).await? {
        // A pass ends while a push that times out would still end within the lease.
        if started.elapsed() + PUSH_TIMEOUT >= ssf.cfg.lease.saturating_sub(Duration::from_secs(1)) {
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
                tracing::warn!(stream = %stream.id, jti = %event.jti, body = %body, "receiver refused a SET (400); not retried");
                done.push(event.seq);
            }
            Pushed::Failed(why) => {
                if now.0 - event.event_at.0 > GIVE_UP_AFTER.as_millis() as i64 {
                    outcome("expired");
                    tracing::warn!(stream = %stream.id, jti = %event.jti, "gave up a SET after 24 h of failed pushes");
                    done.push(event.seq);
                    continue;
                }
                outcome("failed");
                let attempts = event.attempts + 1;
                let next = Millis(now.0 + backoff(attempts).as_millis() as i64);
                tracing::info!(stream = %stream.id, jti = %event.jti, attempts, error = %why, "push failed; trying again later");
                ssf.store.events_done(&done, now).await?;
                ssf.store.event_retry(event.seq, attempts, next).await?;
                return Ok(());
            }
        }
        if done.len() >= 64 {
            ssf.store.events_done(&done, now).await?;
            done.clear();
        }
    }
    ssf.store.events_done(&done, Millis::now()).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_endpoints_must_be_public_https() {
        let local = "not a globally reachable address";
        for (url, why) in [
            ("http://example.com/x", "https"),
            ("ftp://example.com/x", "https"),
            ("https://127.0.0.1/x", local),
            ("https://10.1.2.3/x", local),
            ("https://169.254.169.254/latest", local),
            ("https://[::1]/x", local),
            ("https://[fd00::1]:8443/x", local),
            ("https://0.0.0.0/x", local),
            ("https://user:pw@example.com/x", "credentials"),
            ("https://localhost:9/x", local),
            // Each names a loopback or reserved address in a form the old rule let through.
            ("https://[64:ff9b::7f00:1]/x", local),
            ("https://[::7f00:1]/x", local),
            ("https://[2002:7f00:1::]/x", local),
            ("https://[2001:0:4136:e378:8000:63bf:80ff:fffe]/x", local),
            ("https://[fec0::1]/x", local),
            ("https://[100::1]/x", local),
            ("https://198.18.0.1/x", local),
            ("https://240.0.0.1/x", local),
            ("https://192.0.0.1/x", local),
        ] {
            let err = check_endpoint(url, false).expect_err(url);
            assert!(err.contains(why), "{url}: {err}");
        }
        assert!(check_endpoint("http://127.0.0.1:9/x", true).is_ok());
        assert_eq!(
            origin_of("https://r.example:8443/ssf?x"),
            Some("https://r.example:8443".into())
        );
        assert_eq!(backoff(1), Duration::from_secs(1));
        assert_eq!(backoff(3), Duration::from_secs(4));
        assert_eq!(backoff(40), Duration::from_secs(300));
    }
}
