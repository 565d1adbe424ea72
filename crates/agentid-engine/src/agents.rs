//! The issuer's use cases: register an agent (with its status place, under an issuer domain
//! its organization holds), read and list agents, issue a token, revoke for good.

use std::collections::HashMap;
use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;

use agentid_core::domain::{
    new_id, AgentFields, AgentId, IdPrefix, KeyMode, ListId, Millis, OrgId, RevokeReason, StatusPlace,
};
use agentid_core::keys::{KeyRing, SigningKeys};
use agentid_core::token::dpop::PublicJwk;
use agentid_core::token::{Claims, Confirmation};
use agentid_store::{
    AgentRecord, DomainRules, KeyBinding, NewBinding, OrgRecord, PlaceDraw, SharedStore, StoreError,
};

use crate::domains::IssuerCheck;

use crate::apikeys::{hash_key, Caller};
use crate::expiries::NotedExpiries;
use crate::registry::Registry;
use crate::revocations::Revocations;
use crate::seals::{agent_key_vouched, client_secret_seal, seal_agent_key, sealed_agent_key};
use crate::status::StatusLists;
use crate::EngineError;

/// A freshly registered agent and its first token.
#[derive(Clone)]
pub struct Registration {
    pub agent: AgentRecord,
    pub token: String,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("agent", &self.agent)
            .field("token", &"…")
            .finish()
    }
}

/// How a client secret begins (`cs_`, then 256 random bits in base64url).
pub const CLIENT_SECRET_PREFIX: &str = "cs_";

/// Bytes of unpaged agent lists an organization may have held at once on an instance. Each
/// is sent a page at a time as its reader takes it, so a list read slowly (or not at all)
/// holds its connection and its page (up to 1,000 agents, megabytes with long scopes) for as
/// long as its reader likes: the pages held are what is bounded, so that many small lists at
/// once pass and large ones unread do not pile up.
pub const MAX_LISTING_BYTES: usize = 16 * 1024 * 1024;

/// The bytes of the unpaged lists being sent on an instance, by organization.
#[derive(Default)]
pub(crate) struct Listings(parking_lot::Mutex<HashMap<OrgId, usize>>);

/// An unpaged list of an organization's agents being sent: the bytes of its page in hand,
/// counted until the next page or its drop.
pub struct Listing {
    listings: Arc<Listings>,
    org: OrgId,
    held: usize,
}

impl Listing {
    /// Holds a page of `bytes` in place of the one before; refused when the organization's
    /// lists would hold more than [`MAX_LISTING_BYTES`] (a single page always passes alone).
    pub fn hold(&mut self, bytes: usize) -> Result<(), EngineError> {
        let mut open = self.listings.0.lock();
        let total = open.entry(self.org.clone()).or_insert(0);
        let others = *total - self.held;
        if others > 0 && others + bytes > MAX_LISTING_BYTES {
            return Err(EngineError::TooManyListings {
                max: MAX_LISTING_BYTES,
            });
        }
        *total = others + bytes;
        self.held = bytes;
        Ok(())
    }
}

impl Drop for Listing {
    fn drop(&mut self) {
        let mut open = self.listings.0.lock();
        if let Some(n) = open.get_mut(&self.org) {
            *n -= self.held;
            if *n == 0 {
                open.remove(&self.org);
            }
        }
    }
}
/// How long the secret a new one replaces stays valid: time to roll the new one out.
pub const PREVIOUS_SECRET_VALID: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// How often issue-token reads an agent again when another issue-token changed its binding
/// between its read and its write, before it answers 503.
const RENEWAL_ATTEMPTS: usize = 3;

/// The key a new token is bound to (RFC 9449 `cnf.jkt`).
#[derive(Debug, Clone, Copy)]
pub enum Binding<'a> {
    /// The agent's key as it stands: a bound agent stays bound, an unbound one gets a bearer
    /// token.
    Same,
    /// This key, from now on.
    Key(&'a PublicJwk),
    /// None: the agent's tokens become bearer tokens, and the store no longer names a key.
    Dropped,
}

/// A newly issued token.
#[derive(Clone)]
pub struct IssuedToken {
    pub agent_id: AgentId,
    pub token: String,
    pub expires_at: Millis,
}

impl std::fmt::Debug for IssuedToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedToken")
            .field("agent_id", &self.agent_id)
            .field("token", &"…")
            .field("expires_at", &self.expires_at)
            .finish()
    }
}

pub struct Agents {
    /// The key file, which seals the keys agents are bound to and their client secrets.
    pub(crate) keys: Arc<KeyRing>,
    pub(crate) store: SharedStore,
    /// The unpaged lists open on this instance, by organization.
    pub(crate) listings: Arc<Listings>,
    pub(crate) signing: Arc<SigningKeys>,
    pub(crate) registry: Arc<Registry>,
    pub(crate) status: Arc<StatusLists>,
    pub(crate) revocations: Arc<Revocations>,
    /// Under the `verified` issuer-domain policy, registrations and tokens are refused under
    /// names the organization does not hold.
    pub(crate) issuers: IssuerCheck,
    pub(crate) expiries: Arc<NotedExpiries>,
}

impl Agents {
    /// How a new place is drawn: at random (herd privacy), in the newest list of the mode
    /// while half of it is free.
    fn placing(&self, mode: KeyMode) -> PlaceDraw {
        let cfg = self.status.config();
        PlaceDraw {
            mode,
            new_list: ListId::generate(),
            size: cfg.size,
            draws: (0..64).map(|_| rand::random::<u64>()).collect(),
        }
    }

    /// Registers an agent and signs its first token, bound to `key` when one is given.
    pub async fn register(
        &self,
        caller: &Caller,
        fields: AgentFields,
        key: Option<&PublicJwk>,
    ) -> Result<Registration, EngineError> {
        // Asked for, the lifetime must fit the organization's longest; left out, it is the
        // default, or that longest when it is shorter.
        let lifetime = match fields.expiry {
            Some(asked) => {
                check_expiry(&caller.org, asked.get())?;
                asked.get()
            }
            None => agentid_core::domain::ExpirySeconds::DEFAULT
                .get()
                .min(caller.org.limits().max_expiry_seconds),
        };
        let now = Millis::now();
        let issued = Millis::from_secs(now.as_secs());
        let id = AgentId::generate();
        let agent = AgentRecord {
            key_mac: None,
            key_sealed_at: None,
            id,
            org_id: caller.org.id.clone(),
            mode: caller.mode,
            name: fields.name.as_str().to_owned(),
            issuer_domain: fields.issuer_domain,
            description: fields.description.as_str().to_owned(),
            scopes: fields.scopes,
            created_at: now,
            issued_at: issued,
            expires_at: issued.plus_secs(i64::try_from(lifetime).unwrap_or(i64::MAX)),
            revoked_at: None,
            revocation_reason: None,
            status: None,
            jkt: key.map(PublicJwk::thumbprint),
            jwk: key.map(PublicJwk::canonical),
            verification_count: 0,
        };
        let agent = sealed_agent_key(&self.keys, agent);
        // An agent whose token no verifier would accept is not registered: a token with the
        // longest place and URI a list can give, and a key binding (one issue-token may add),
        // is signed first.
        let longest = StatusPlace {
            list: ListId::generate(),
            idx: u64::MAX,
        };
        let thumbprint = "A".repeat(43); // base64url of a SHA-256
        self.sign(
            &AgentRecord {
                status: Some(longest),
                jkt: Some(agent.jkt.clone().unwrap_or(thumbprint)),
                ..agent.clone()
            },
            agent.issued_at,
            agent.expires_at,
        )
        .await?;
        let rules = self.issuers.rules();
        let (place, size) = self
            .store
            .insert_agent_placed(
                &agent,
                &self.placing(caller.mode),
                rules.as_ref().map(|r| r as &dyn DomainRules),
            )
            .await?
            .map_err(|why| EngineError::not_held(agent.issuer_domain.as_str(), why))?;
        self.status.learn_list(place.list.as_str(), size);
        let agent = AgentRecord {
            status: Some(place),
            ..agent
        };
        let token = self.sign(&agent, agent.issued_at, agent.expires_at).await?;
        self.registry.learn(&agent);
        Ok(Registration { agent, token })
    }

    /// The caller's agent, or `AgentNotFound` (also for other organizations' and modes' agents).
    pub async fn get(&self, caller: &Caller, id: &AgentId) -> Result<AgentRecord, EngineError> {
        match self.store.get_agent(id).await? {
            Some(a) if a.org_id == caller.org.id && a.mode == caller.mode => Ok(a),
            _ => Err(EngineError::AgentNotFound),
        }
    }

    /// Succeeds when the agent exists and belongs to the caller's organization and mode.
    pub async fn ensure_owned(&self, caller: &Caller, id: &AgentId) -> Result<(), EngineError> {
        let owner = match self.registry.agent(id.as_str()) {
            Some(a) => Some((a.org_id.clone(), a.mode)),
            None => self.store.get_agent(id).await?.map(|a| (a.org_id, a.mode)),
        };
        match owner {
            Some((org, mode)) if org == caller.org.id && mode == caller.mode => Ok(()),
            _ => Err(EngineError::AgentNotFound),
        }
    }

    /// Opens an unpaged list of the caller's agents, its pages counted among its
    /// organization's on this instance ([`Listing::hold`]; paged lists are not counted).
    pub fn open_listing(&self, caller: &Caller) -> Listing {
        Listing {
            listings: self.listings.clone(),
            org: caller.org.id.clone(),
            held: 0,
        }
    }

    /// The caller's agents, newest first: after the agent `before` when given, up to `limit`
    /// when given.
    pub async fn list(
        &self,
        caller: &Caller,
        before: Option<&AgentId>,
        limit: Option<u32>,
    ) -> Result<Vec<AgentRecord>, EngineError> {
        Ok(self
            .store
            .list_agents(&caller.org.id, caller.mode, before, limit)
            .await?)
    }

    /// Issues a new token. Allowed for expired agents (they become active again), refused
    /// for revoked ones. Earlier tokens stay valid until their own expiry.
    /// A new token for the caller's agent, bound to `key` when one is given (a bearer token
    /// otherwise, whatever the agent's earlier tokens were).
    pub async fn issue_token(
        &self,
        caller: &Caller,
        id: &AgentId,
        binding: Binding<'_>,
    ) -> Result<IssuedToken, EngineError> {
        // A renewal is written only over the binding it read: one that lost a race with
        // another issue-token reads the agent again and binds what it was asked to over that.
        for _ in 0..RENEWAL_ATTEMPTS {
            if let Some(issued) = self.renew_once(caller, id, &binding).await? {
                return Ok(issued);
            }
        }
        Err(EngineError::BindingContended)
    }

    /// One attempt of [`Agents::issue_token`]: `None` when the agent's binding changed
    /// between its read and the write.
    async fn renew_once(
        &self,
        caller: &Caller,
        id: &AgentId,
        binding: &Binding<'_>,
    ) -> Result<Option<IssuedToken>, EngineError> {
        let current = self.get(caller, id).await?;
        if current.revoked_at.is_some() {
            return Err(EngineError::AgentRevoked);
        }
        // A binding written into the row with database access alone (an alarm), a key put in
        // or taken out, is not carried into a new token; the issuer may replace it by name.
        // (One with no MAC at all, which only the database's owner can write, not even so.)
        let vouched = agent_key_vouched(&self.keys, &current);
        let read = match current.key_mac {
            Some(mac) if vouched || !matches!(binding, Binding::Same) => mac,
            _ => {
                return Err(StoreError::Corrupt(format!(
                    "the key binding of agent {} is not sealed by the key file",
                    current.id
                ))
                .into())
            }
        };
        let mut agent = match binding {
            // The binding and its seal stay as they are: renewals of it never race.
            Binding::Same => current,
            Binding::Key(key) => AgentRecord {
                jkt: Some(key.thumbprint()),
                jwk: Some(key.canonical()),
                ..current
            },
            Binding::Dropped => {
                if let Some(jkt) = &current.jkt {
                    tracing::info!(agent_id = %current.id, jkt = %jkt, "key binding dropped");
                }
                AgentRecord {
                    jkt: None,
                    jwk: None,
                    ..current
                }
            }
        };
        let sealed = match binding {
            Binding::Same => None,
            Binding::Key(_) | Binding::Dropped => Some(seal_agent_key(&self.keys, &mut agent)),
        };
        let lifetime = (agent.expires_at.0 - agent.issued_at.0).max(1000) / 1000;
        let lifetime = lifetime.min(caller.org.limits().max_expiry_seconds as i64);
        let issued = Millis::from_secs(Millis::now().as_secs());
        let expires = issued.plus_secs(lifetime);
        let token = self.sign(&agent, issued, expires).await?;
        let rules = self.issuers.rules();
        let new = sealed.as_ref().map(|(mac, sealed_at)| NewBinding {
            jkt: agent.jkt.as_deref(),
            jwk: agent.jwk.as_deref(),
            mac,
            sealed_at: *sealed_at,
        });
        let renewed = self
            .store
            .renew_token(
                &agent.id,
                issued,
                expires,
                KeyBinding { read: &read, new },
                rules.as_ref().map(|r| r as &dyn DomainRules),
            )
            .await?
            .map_err(|why| EngineError::not_held(agent.issuer_domain.as_str(), why))?;
        // Not renewed: revoked meanwhile (the next read says so), or the binding changed.
        Ok(renewed.then_some(IssuedToken {
            agent_id: agent.id,
            token,
            expires_at: expires,
        }))
    }

    /// A new client secret for the agent (shown only here; stored as its SHA-256), with which
    /// it authenticates at the token endpoint (`client_secret_basic`, `client_secret_post`).
    /// The secret it replaces stays valid [`PREVIOUS_SECRET_VALID`] more; older ones end.
    pub async fn new_client_secret(&self, caller: &Caller, id: &AgentId) -> Result<String, EngineError> {
        let agent = self.get(caller, id).await?;
        if agent.revoked_at.is_some() {
            return Err(EngineError::AgentRevoked);
        }
        let mut random = [0u8; 32];
        rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut random);
        let secret = format!("{CLIENT_SECRET_PREFIX}{}", URL_SAFE_NO_PAD.encode(random));
        let hash = hash_key(&secret);
        let now = Millis::now();
        self.store
            .new_client_secret(
                &agent.id,
                &hash,
                &client_secret_seal(&self.keys, &agent.id, &hash, now),
                now,
                now.plus_secs(PREVIOUS_SECRET_VALID.as_secs() as i64),
            )
            .await?;
        tracing::info!(agent_id = %agent.id, "client secret made");
        Ok(secret)
    }

    /// Revokes for good: commit to the store, then memory (`Revocations`), then answer. A
    /// second revoke returns what the first one stored. The agent as stored, and when it was
    /// revoked.
    pub async fn revoke(
        &self,
        caller: &Caller,
        id: &AgentId,
        reason: Option<RevokeReason>,
    ) -> Result<(AgentRecord, Millis), EngineError> {
        let agent = self.get(caller, id).await?;
        let (stored, epoch) = self
            .store
            .revoke_agent(
                &agent.id,
                Millis::now(),
                reason.as_ref().map(RevokeReason::as_str),
            )
            .await?
            .ok_or(EngineError::AgentNotFound)?;
        let at = stored.revoked_at.ok_or_else(|| {
            StoreError::Corrupt(format!("revoked agent {} has no revocation time", stored.id))
        })?;
        self.revocations
            .committed(std::slice::from_ref(&(stored.clone(), epoch)));
        Ok((stored, at))
    }

    /// The agent's token, if it fits what verifiers accept (`MAX_TOKEN_LEN`: a token travels in
    /// a URL path, and proxies commonly refuse request lines past 8 KiB).
    /// The signing key notes the token's expiry, so that it stays in the key set at least
    /// until then after a rotation.
    async fn sign(
        &self,
        agent: &AgentRecord,
        issued: Millis,
        expires: Millis,
    ) -> Result<String, EngineError> {
        let (token, kid) = self.signing.sign(&Claims {
            status: agent.status.as_ref().map(|p| self.status.claim(p)),
            livemode: (agent.mode == KeyMode::Test).then_some(false),
            cnf: agent.jkt.clone().map(|jkt| Confirmation { jkt }),
            ..Claims::agent(
                agent.issuer_domain.as_str(),
                agent.id.as_str(),
                &new_id(IdPrefix::Request)[4..],
                issued.as_secs(),
                expires.as_secs(),
                agent.scopes.to_vec(),
            )
        });
        if token.len() > agentid_core::token::MAX_TOKEN_LEN {
            return Err(EngineError::TokenTooLong {
                len: token.len(),
                max: agentid_core::token::MAX_TOKEN_LEN,
            });
        }
        self.expiries.note(&self.store, &kid, expires).await?;
        Ok(token)
    }
}

fn check_expiry(org: &OrgRecord, requested: u64) -> Result<(), EngineError> {
    let max = org.limits().max_expiry_seconds;
    if requested > max {
        return Err(EngineError::ExpiryTooLong { max });
    }
    Ok(())
}
