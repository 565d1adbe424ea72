//! An OpenID Shared Signals (SSF 1.0) transmitter: an organization's streams to its
//! receivers, and the delivery of a CAEP `session-revoked` Security Event Token (RFC 8417)
//! for each revocation, pushed (RFC 8935) or polled (RFC 8936).
//!
//! A revocation writes its stream's events in its own transaction, so they survive a crash;
//! a stream is owed at most `agentid_store::MAX_PENDING` events, whatever its delivery
//! method and state (past it the oldest are dropped, and counted). The deliverer leases one
//! push stream at a time (no other instance delivers it meanwhile), posts its pending events
//! in order, and on a failure waits and tries again: 1 s, doubling, at most 5 min apart, for
//! 24 h. SETs are signed at delivery with the key that signs tokens.
//!
//! Here: the stream rules (what an owner may create and change). `vetting`: which push
//! endpoints may be reached; `delivery`: the deliverer; `poll`: SETs signed and polled.

mod delivery;
mod poll;
mod vetting;

use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::sync::Notify;

use crate::outbound::Outbound;
use agentid_core::domain::{AgentId, KeyMode, Millis, OrgId, StreamId};
use agentid_core::keys::SigningKeys;
use agentid_store::{SharedStore, StoreError, StreamRecord};

pub(crate) use delivery::deliverer;
pub(crate) use vetting::check_endpoint;
use vetting::origin_of;

pub const PUSH: &str = "urn:ietf:rfc:8935";
pub const POLL: &str = "urn:ietf:rfc:8936";
pub(crate) const SESSION_REVOKED: &str =
    "https://schemas.openid.net/secevent/caep/event-type/session-revoked";
pub const VERIFICATION: &str = "https://schemas.openid.net/secevent/ssf/event-type/verification";
pub const EVENTS_SUPPORTED: [&str; 2] = [SESSION_REVOKED, VERIFICATION];

/// Streams an organization may have.
pub(crate) const MAX_STREAMS: i64 = 10;
/// Bounds of what a stream's owner sends.
const MAX_EVENTS_REQUESTED: usize = 16;
/// Subjects a stream may hold.
pub(crate) const MAX_SUBJECTS: i64 = 10_000;
const MAX_TEXT: usize = 512;
/// A push that takes longer failed.
pub(crate) const PUSH_TIMEOUT: Duration = Duration::from_secs(10);
/// The most of a receiver's refusal that is read and logged.
const REFUSAL_BYTES: u64 = 300;
/// Attempts stop this long after the event.
const GIVE_UP_AFTER: Duration = Duration::from_secs(24 * 3600);
/// How long a poll with `returnImmediately: false` waits for an event.
pub(crate) const POLL_WAIT: Duration = Duration::from_secs(30);

/// Text a stream keeps: 1 to `MAX_TEXT` characters, none of them NUL (which no database
/// column of text holds: PostgreSQL refuses it).
fn stored_text(t: &str) -> bool {
    !t.is_empty() && t.len() <= MAX_TEXT && !t.contains('\0')
}

#[derive(Debug, Clone)]
pub struct SsfConfig {
    /// Allow `http://` and loopback or private push endpoints (development and tests).
    pub allow_insecure_endpoints: bool,
    /// How long an instance holds a push stream it delivers: after a crash, the stream's
    /// events wait this long for another instance (or the restarted one).
    pub lease: Duration,
    /// How many streams an instance delivers at once, each in its own pass.
    pub streams_at_once: usize,
}

impl Default for SsfConfig {
    fn default() -> Self {
        SsfConfig {
            allow_insecure_endpoints: false,
            lease: Duration::from_secs(30),
            streams_at_once: 16,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SsfError {
    #[error("{field}: {message}")]
    Invalid { field: &'static str, message: String },
    #[error("no such stream")]
    NotFound,
    /// A subject to remove that is not one of the stream's (SSF §8.1.3.3: 404).
    #[error("the subject is not one of the stream's subjects")]
    NoSuchSubject,
    #[error(
        "an organization has at most {MAX_STREAMS} streams in each mode (test and live keys count their own)"
    )]
    TooMany,
    #[error("a stream holds at most {MAX_SUBJECTS} subjects")]
    TooManySubjects,
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

/// The `aud` a stream gets when its owner names none: a push stream's endpoint origin (none
/// when the endpoint is not a URL), a poll stream's id.
fn default_aud(method: &str, endpoint_url: Option<&str>, id: &StreamId) -> Option<String> {
    match method {
        PUSH => endpoint_url.and_then(origin_of),
        _ => Some(id.to_string()),
    }
}

/// What a PATCH changes; each field left out keeps its value.
pub struct StreamChange {
    /// The delivery method and endpoint, together.
    pub delivery: Option<(String, Option<String>)>,
    pub events_requested: Option<Vec<String>>,
    pub description: Option<String>,
    pub aud: Option<String>,
}

pub struct Ssf {
    store: SharedStore,
    signing: Arc<SigningKeys>,
    /// The public URL: SETs' `iss`, and the base of poll URLs.
    public_url: String,
    cfg: SsfConfig,
    /// Push endpoints are vetted and reached through it.
    outbound: Arc<Outbound>,
    /// Woken when an event is queued on this instance.
    wake: Notify,
    /// The passes over leased streams that may run at once (`streams_at_once`), each holding
    /// one while it runs.
    passes: Arc<tokio::sync::Semaphore>,
    /// The instance is stopping: no stream is leased, and a pass ends after its current push.
    stopping: std::sync::atomic::AtomicBool,
    /// The long polls waiting on this instance: the turn of each stream's newest one
    /// ([`poll::Waiting`]).
    waiting: poll::Waiting,
}

impl Ssf {
    pub(crate) fn new(
        store: SharedStore,
        signing: Arc<SigningKeys>,
        public_url: &str,
        cfg: SsfConfig,
        outbound: Arc<Outbound>,
    ) -> Self {
        Ssf {
            store,
            signing,
            public_url: public_url.trim_end_matches('/').to_owned(),
            passes: Arc::new(tokio::sync::Semaphore::new(cfg.streams_at_once.max(1))),
            outbound,
            wake: Notify::new(),
            stopping: std::sync::atomic::AtomicBool::new(false),
            waiting: poll::Waiting::default(),
            cfg,
        }
    }

    /// Stops delivering, for the instance's graceful stop: leases no stream more, ends each
    /// pass after its current push, and waits (at most `within`) for the passes to release
    /// their streams, so that another instance (or this one started again) delivers them at
    /// once rather than when their leases run out.
    pub(crate) async fn stop(&self, within: Duration) {
        self.stopping.store(true, std::sync::atomic::Ordering::SeqCst);
        let all = u32::try_from(self.cfg.streams_at_once.max(1)).unwrap_or(u32::MAX);
        if tokio::time::timeout(within, self.passes.acquire_many(all))
            .await
            .is_err()
        {
            tracing::warn!("a push stream's delivery did not end in time; its lease runs out");
        }
    }

    fn stopping(&self) -> bool {
        self.stopping.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn public_url(&self) -> &str {
        &self.public_url
    }

    /// Where a poll stream's receiver polls.
    pub fn poll_url(&self, stream_id: &str) -> String {
        format!("{}/ssf/poll/{stream_id}", self.public_url)
    }

    /// New events may be due: deliver now rather than at the next tick.
    pub(crate) fn wake(&self) {
        self.wake.notify_one();
    }

    /// Checks a push endpoint (https, every address public).
    async fn vet(&self, input: &StreamInput) -> Result<(), SsfError> {
        let Some(url) = input.endpoint_url.clone().filter(|_| input.method == PUSH) else {
            return Ok(());
        };
        if url.len() > MAX_TEXT || url.contains('\0') {
            return Err(invalid(
                "delivery.endpoint_url",
                format!("at most {MAX_TEXT} characters, none of them NUL"),
            ));
        }
        check_endpoint(&self.outbound, &url, self.cfg.allow_insecure_endpoints)
            .await
            .map_err(|m| invalid("delivery.endpoint_url", m))
    }

    /// A stream built from `input` (its endpoint vetted), keeping `base`'s identity.
    fn build(&self, base: StreamRecord, input: StreamInput) -> Result<StreamRecord, SsfError> {
        let endpoint_url = match input.method.as_str() {
            PUSH => Some(
                input
                    .endpoint_url
                    .ok_or_else(|| invalid("delivery.endpoint_url", "is required for push delivery"))?,
            ),
            POLL => None,
            other => {
                return Err(invalid(
                    "delivery.method",
                    format!("{other:?} is not {PUSH} (push) or {POLL} (poll)"),
                ))
            }
        };
        let default_aud = default_aud(&input.method, endpoint_url.as_deref(), &base.id)
            .ok_or_else(|| invalid("delivery.endpoint_url", "is not a URL"))?;
        if input.events_requested.len() > MAX_EVENTS_REQUESTED
            || input.events_requested.iter().any(|e| !stored_text(e))
        {
            return Err(invalid(
                "events_requested",
                format!(
                    "at most {MAX_EVENTS_REQUESTED} event type URIs of 1 to {MAX_TEXT} characters, none NUL"
                ),
            ));
        }
        for (field, text) in [("description", &input.description), ("aud", &input.aud)] {
            if text.as_ref().is_some_and(|t| !stored_text(t)) {
                return Err(invalid(
                    field,
                    format!("must be 1 to {MAX_TEXT} characters, none NUL"),
                ));
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
        org_id: &OrgId,
        mode: KeyMode,
        input: StreamInput,
    ) -> Result<(StreamRecord, Option<String>), SsfError> {
        self.vet(&input).await?;
        let base = StreamRecord {
            id: StreamId::generate(),
            org_id: org_id.clone(),
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
        if !self.store.insert_stream(&stream, MAX_STREAMS).await? {
            return Err(SsfError::TooMany);
        }
        Ok((stream, token))
    }

    /// The caller's stream: another organization's, or another mode's, is not found.
    pub async fn get(&self, org_id: &OrgId, mode: KeyMode, id: &StreamId) -> Result<StreamRecord, SsfError> {
        match self.store.get_stream(id).await? {
            Some(s) if s.org_id == *org_id && s.mode == mode => Ok(s),
            _ => Err(SsfError::NotFound),
        }
    }

    pub async fn list(&self, org_id: &OrgId, mode: KeyMode) -> Result<Vec<StreamRecord>, SsfError> {
        Ok(self.store.list_streams(org_id, mode).await?)
    }

    /// Replaces what the owner may change. The delivery method stays what it was.
    pub async fn replace(
        &self,
        org_id: &OrgId,
        mode: KeyMode,
        id: &StreamId,
        input: StreamInput,
    ) -> Result<StreamRecord, SsfError> {
        let current = self.get(org_id, mode, id).await?;
        self.rewrite(current, input).await
    }

    /// Changes what `change` gives and keeps the rest. An `aud` the stream was given by
    /// default (its endpoint's origin) follows a new endpoint; one the owner chose stays.
    pub async fn patch(
        &self,
        org_id: &OrgId,
        mode: KeyMode,
        id: &StreamId,
        change: StreamChange,
    ) -> Result<StreamRecord, SsfError> {
        let current = self.get(org_id, mode, id).await?;
        let defaulted = default_aud(&current.method, current.endpoint_url.as_deref(), &current.id)
            .is_some_and(|d| d == current.aud);
        let (method, endpoint_url) = change
            .delivery
            .unwrap_or_else(|| (current.method.clone(), current.endpoint_url.clone()));
        let input = StreamInput {
            method,
            endpoint_url,
            events_requested: change
                .events_requested
                .unwrap_or_else(|| current.events_requested.clone()),
            description: change.description.or_else(|| current.description.clone()),
            aud: change.aud.or_else(|| (!defaulted).then(|| current.aud.clone())),
        };
        self.rewrite(current, input).await
    }

    /// `current` as `input` makes it, written.
    async fn rewrite(&self, current: StreamRecord, input: StreamInput) -> Result<StreamRecord, SsfError> {
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

    pub async fn delete(&self, org_id: &OrgId, mode: KeyMode, id: &StreamId) -> Result<(), SsfError> {
        self.get(org_id, mode, id).await?;
        self.store.delete_stream(id).await?;
        Ok(())
    }

    pub async fn set_status(
        &self,
        org_id: &OrgId,
        mode: KeyMode,
        id: &StreamId,
        status: &str,
    ) -> Result<StreamRecord, SsfError> {
        if !matches!(status, "enabled" | "paused" | "disabled") {
            return Err(invalid("status", "must be enabled, paused or disabled"));
        }
        let mut stream = self.get(org_id, mode, id).await?;
        // The status alone is written: a configuration changed meanwhile stays as changed.
        if !self.store.set_stream_status(&stream.id, status).await? {
            return Err(SsfError::NotFound);
        }
        stream.status = status.to_owned();
        self.wake();
        Ok(stream)
    }

    /// Adds (or removes) an agent of the stream's organization and mode to what it carries.
    pub async fn subject(
        &self,
        org_id: &OrgId,
        mode: KeyMode,
        id: &StreamId,
        iss: &str,
        sub: &str,
        add: bool,
    ) -> Result<(), SsfError> {
        let stream = self.get(org_id, mode, id).await?;
        let agent = match AgentId::parse(sub) {
            Some(sub) => self.store.get_agent(&sub).await?,
            None => None,
        };
        let Some(agent) =
            agent.filter(|a| a.org_id == *org_id && a.mode == mode && a.issuer_domain.as_str() == iss)
        else {
            return Err(invalid(
                "subject",
                "names no agent of this organization and mode (iss is its issuer_domain, sub its agent_id)",
            ));
        };
        if add {
            match self
                .store
                .add_subject(&stream.id, &agent.id, MAX_SUBJECTS)
                .await?
            {
                Some(true) => {}
                Some(false) => return Err(SsfError::TooManySubjects),
                None => return Err(SsfError::NotFound),
            }
        } else if !self.store.remove_subject(&stream.id, &agent.id).await? {
            // Answered, not passed over: a stream that carries every agent (none added) would
            // go on carrying this one.
            return Err(SsfError::NoSuchSubject);
        }
        Ok(())
    }

    /// Queues a verification event carrying `state` (SSF §8.1.4).
    pub async fn verify(
        &self,
        org_id: &OrgId,
        mode: KeyMode,
        id: &StreamId,
        state: Option<&str>,
    ) -> Result<(), SsfError> {
        if state.is_some_and(|s| s.len() > MAX_TEXT || s.contains('\0')) {
            return Err(invalid(
                "state",
                format!("at most {MAX_TEXT} characters, none NUL"),
            ));
        }
        let stream = self.get(org_id, mode, id).await?;
        // A disabled stream holds no event for later (SSF §8.1.2): the request is answered as
        // any other, and the store queues nothing on it.
        self.store
            .add_verification(&stream.id, state, Millis::now())
            .await?;
        self.wake();
        Ok(())
    }
}
