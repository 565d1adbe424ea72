//! Agents acting for people: the token endpoint's two delegation grants, and what a delegated
//! token stands on.
//!
//! - Token exchange (RFC 8693): the agent, authenticated as a client, presents a person's
//!   token from an identity provider its organization trusts (an ID token, a JWT or an access
//!   token whose `aud` names the agent or this issuer), or a delegated agentid token whose
//!   `aud` names this issuer (another agent of the organization handing it the task).
//! - ID-JAG (draft-ietf-oauth-identity-assertion-authz-grant, the jwt-bearer grant): the
//!   provider signs an assertion (`typ: oauth-id-jag+jwt`) for this issuer, naming the agent
//!   (`client_id`) and the resource; each is used once and lives at most 5 minutes.
//!
//! A delegated token's `sub` is the person's, `sub_id` says who vouched for them (RFC 9493
//! `iss_sub`), and `act` is the chain of agents, the one acting outermost. Its scopes are
//! what was asked of what the agent holds and what every link allowed; it never outlives a
//! link. Online, it is refused once any agent of its chain is revoked, the organization stops
//! trusting the provider, or the organization revokes the person ([`Verdict`]).

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use agentid_core::domain::{AgentId, KeyMode, Millis, OrgId};
use agentid_core::keys::KeyRing;
use agentid_core::records::IdentityProviderRecord;
use agentid_core::token::foreign::{self, Foreign};
use agentid_core::token::{Actor, Claims, SubjectId};
use agentid_store::{AgentRecord, SharedStore, Standing};

use crate::kept::{Keeping, Kept};
use crate::oauth::request::{OAuthError, TokenRequest, ID_JAG_TYP, JWT_BEARER_GRANT, TOKEN_EXCHANGE};
use crate::outbound::Outbound;
use crate::registry::Registry;
use crate::verifier::TokenVerifier;

/// The longest an ID-JAG may live ahead of now.
pub const MAX_ID_JAG_LIFETIME_SECS: i64 = 300;
/// The longest person's `sub` taken.
const MAX_SUB_LEN: usize = 255;

/// What a delegation grant establishes: for whom, through which agents before this one, and
/// what the links allow.
#[derive(Debug, Clone)]
pub(crate) struct Delegated {
    pub sub_id: SubjectId,
    /// The agents that handed the task on, the nearest outermost (a nested exchange).
    pub inner: Option<Actor>,
    /// The scopes the subject token allowed, where it says.
    pub allowed: Option<Vec<String>>,
    /// The latest the token may live to (Unix s): the subject token's (or the ID-JAG's) `exp`.
    pub exp_cap: Option<i64>,
    /// The ID-JAG's resource: the token's audience.
    pub resource: Option<String>,
    /// The ID-JAG's single use (its key, and until when it is kept), spent once every other
    /// check of the request passed and its token is made, before its record: a refused
    /// request leaves it for a corrected one.
    pub single_use: Option<(String, Millis)>,
}

/// How far behind another instance's clock an instance's may run, for a provider's removal.
const PROVIDER_CLOCK_SKEW_SECS: i64 = 5;

/// Whether the key file vouches for a provider's row (its MAC checks). One that it does not
/// was written or changed with database access alone: an integrity alarm, and trusted by no
/// one.
pub(crate) fn vouched(keys: &KeyRing, idp: &IdentityProviderRecord) -> bool {
    let ok = idp
        .mac
        .is_some_and(|mac| keys.identity_provider_vouched(&idp.canonical(), &mac));
    if !ok {
        tracing::error!(idp = %idp.id, org_id = %idp.org_id,
            "integrity alarm: an identity provider's row is not sealed by the key file; it is not trusted");
        metrics::counter!("agentid_integrity_failures_total", "what" => "identity_provider").increment(1);
    }
    ok
}

/// Why a delegated token no longer stands, when it does not.
pub(crate) fn verdict(keys: &KeyRing, claims: &Claims, standing: &Standing) -> Option<String> {
    let id = claims.sub_id.as_ref()?;
    let Some(provider) = standing.provider.as_ref().filter(|p| vouched(keys, p)) else {
        return Some(format!(
            "the agent's organization no longer trusts the identity provider {} that vouched for the person",
            id.iss
        ));
    };
    // Removing a provider ends every token it vouched for: adding the issuer again (with new
    // keys, after a leak) brings none of them back. Tokens' times are whole seconds, and the
    // instance that issued one may run a little behind the one that added the provider.
    if claims
        .iat
        .saturating_add(1 + PROVIDER_CLOCK_SKEW_SECS)
        .saturating_mul(1000)
        <= provider.created_at.0
    {
        return Some(format!(
            "the identity provider {} that vouched for the person was removed and added again since",
            id.iss
        ));
    }
    if let Some(at) = standing.subject_revoked_at {
        if claims.iat.saturating_mul(1000) <= at.0 {
            return Some(format!(
                "the organization revoked the person's delegation at {}",
                at.to_rfc3339()
            ));
        }
    }
    standing
        .revoked
        .first()
        .map(|a| format!("agent {a} of the token's chain is revoked"))
}

/// The agent ids of a chain, parsed; `None` when one is not an agent id.
pub(crate) fn chain_ids(act: &Actor) -> Option<Vec<AgentId>> {
    act.chain().iter().map(|a| AgentId::parse(&a.sub)).collect()
}

/// Identity providers' key sets published at a `jwks_uri`: fetched under the outbound rule
/// (https, globally reachable addresses unless the development flag allows local ones, no
/// redirect, 5 s, 64 KiB), kept 5 minutes and then asked again with the `ETag` it came
/// with; fetched again at once when a token names a key the set lacks (at most every 30 s);
/// a failed fetch not repeated for 30 s ([`Kept`]).
pub(crate) struct ProviderKeys(Kept<Value>);

const PROVIDER_KEYS: Keeping = Keeping {
    fresh_for: Duration::from_secs(300),
    max_age: None,
    failure_for: Duration::from_secs(30),
    refetch_after: Duration::from_secs(30),
    timeout: Duration::from_secs(5),
    max_bytes: 64 * 1024,
};

impl ProviderKeys {
    pub(crate) fn new(outbound: Arc<Outbound>, allow_local: bool) -> Self {
        ProviderKeys(Kept::new(outbound, allow_local, PROVIDER_KEYS))
    }

    /// The provider's key set: its stored one, or the one at its `jwks_uri`, fetched anew
    /// when `refresh` (a token names a key it lacks) and the one held is older than 30 s.
    async fn key_set(&self, idp: &IdentityProviderRecord, refresh: bool) -> Result<Arc<Value>, String> {
        if let Some(inline) = &idp.jwks {
            return serde_json::from_str(inline)
                .map(Arc::new)
                .map_err(|_| "its stored key set is not JSON".to_owned());
        }
        let Some(url) = &idp.jwks_uri else {
            return Err("it has no keys".into());
        };
        // Held per provider row as well as URL: a provider removed and added again (after a
        // leak, its keys rotated at the source) fetches its set afresh, not in 5 minutes.
        self.0
            .get_as(&format!("{} {url}", idp.id), url, refresh, fetched_key_set)
            .await
            .map_err(|e| format!("its jwks_uri {e}"))
    }
}

/// The members of a JWK that checking a signature reads.
const KEY_MEMBERS: [&str; 9] = ["kty", "kid", "use", "alg", "crv", "x", "y", "n", "e"];

/// A fetched key set as it is kept: at most [`MAX_KEYS`](crate::identity_providers::MAX_KEYS)
/// keys, each with only its [`KEY_MEMBERS`] of text. Whatever else the document held (a
/// hostile one: 64 KiB of nested padding, several megabytes parsed) is not kept, for every
/// provider's URL, for minutes.
fn fetched_key_set(body: &[u8]) -> Result<Value, String> {
    use crate::identity_providers::MAX_KEYS;
    let v: Value = serde_json::from_slice(body).map_err(|_| "answered no JSON".to_owned())?;
    let Some(keys) = v.get("keys").and_then(Value::as_array) else {
        return Err("answered no key set".to_owned());
    };
    if keys.len() > MAX_KEYS {
        return Err(format!("answered more than {MAX_KEYS} keys"));
    }
    let keys: Vec<Value> = keys
        .iter()
        .filter_map(Value::as_object)
        .map(|key| {
            KEY_MEMBERS
                .iter()
                .filter_map(|m| Some((m.to_string(), Value::String(key.get(*m)?.as_str()?.to_owned()))))
                .collect::<serde_json::Map<_, _>>()
                .into()
        })
        .collect();
    Ok(serde_json::json!({ "keys": keys }))
}

/// The token endpoint's delegation grants, with what they read: the store, the registry's
/// revocations, agentid's own tokens, identity providers' keys and the key file that vouches
/// for providers' rows.
pub(crate) struct Delegation {
    pub(crate) store: SharedStore,
    pub(crate) registry: Arc<Registry>,
    /// Checks agentid's own tokens handed on as subject tokens.
    pub(crate) tokens: Arc<TokenVerifier>,
    pub(crate) provider_keys: ProviderKeys,
    /// The key file: it vouches for identity providers' rows.
    pub(crate) keys: Arc<KeyRing>,
    /// The issuer identifier (the service's public URL).
    pub(crate) issuer: String,
    pub(crate) max_skew_secs: i64,
    /// The most agents a chain may hold.
    pub(crate) max_delegation_depth: usize,
}

impl Delegation {
    /// What a delegation grant in `req` establishes for `agent`, or why it establishes
    /// nothing. `req`'s form was checked (`OAuth::check_request`).
    pub(crate) async fn grant(
        &self,
        agent: &AgentRecord,
        req: &TokenRequest<'_>,
        now: Millis,
    ) -> Result<Option<Delegated>, OAuthError> {
        if agent.mode == KeyMode::Test {
            // People are vouched for in live mode only (identity providers, revocations): a
            // test-mode token never acts for one.
            let why = "a test-mode agent acts for no person: delegation is live mode's".to_owned();
            match req.grant_type {
                Some(TOKEN_EXCHANGE) => return Err(OAuthError::InvalidRequest(why)),
                Some(JWT_BEARER_GRANT) => return Err(OAuthError::InvalidGrant(why)),
                _ => {}
            }
        }
        match req.grant_type {
            Some(TOKEN_EXCHANGE) => {
                let token = req.subject_token.unwrap_or_default();
                let delegated = if foreign::unverified_issuer(token).as_deref() == Some(self.issuer.as_str())
                {
                    self.handed_on(agent, token, now).await?
                } else {
                    self.vouched_for(agent, token, now).await?
                };
                Ok(Some(delegated))
            }
            Some(JWT_BEARER_GRANT) => Ok(Some(
                self.id_jag(agent, req.assertion.unwrap_or_default(), now).await?,
            )),
            _ => Ok(None),
        }
    }

    /// The provider of the agent's organization that issued `token`, and the token checked
    /// with its keys (fetched again once if it names a key the set lacks).
    async fn provider_token(
        &self,
        org: &OrgId,
        token: &str,
        now: Millis,
        what: &str,
        refusal: fn(String) -> OAuthError,
    ) -> Result<(IdentityProviderRecord, Foreign), OAuthError> {
        let Some(iss) = foreign::unverified_issuer(token) else {
            return Err(refusal(format!("{what} is not a JWT with an iss")));
        };
        let providers = self.store.identity_providers(org).await?;
        let Some(idp) = providers
            .into_iter()
            .find(|p| p.issuer == iss && vouched(&self.keys, p))
        else {
            return Err(refusal(format!(
                "{what}: {iss:?} is not an identity provider the agent's organization trusts \
                 (POST /v1/identity-providers)"
            )));
        };
        let skew = self.max_skew_secs;
        let mut refreshed = false;
        loop {
            let keys = self
                .provider_keys
                .key_set(&idp, refreshed)
                .await
                .map_err(|e| OAuthError::Unavailable(format!("the keys of {iss} cannot be had: {e}")))?;
            match foreign::verify(token, &keys, now.as_secs(), skew) {
                // RFC 9449 §6.1: a token bound to a key is good only with a proof of that key,
                // which neither grant takes: a stolen one must buy nothing.
                Ok(checked) if checked.claims.contains_key("cnf") => {
                    return Err(refusal(format!(
                        "{what} is bound to a key (cnf): present a token of the person that is not"
                    )))
                }
                Ok(checked) => return Ok((idp, checked)),
                Err(e) if e.unknown_key && idp.jwks_uri.is_some() && !refreshed => refreshed = true,
                Err(e) => return Err(refusal(format!("{what}: {}", e.reason))),
            }
        }
    }

    /// A person's token from a trusted provider, for this agent or this issuer.
    async fn vouched_for(
        &self,
        agent: &AgentRecord,
        token: &str,
        now: Millis,
    ) -> Result<Delegated, OAuthError> {
        let (idp, t) = self
            .provider_token(
                &agent.org_id,
                token,
                now,
                "subject_token",
                OAuthError::InvalidRequest,
            )
            .await?;
        if t.typ
            .as_deref()
            .is_some_and(|typ| typ.to_ascii_lowercase().contains("id-jag"))
        {
            // Its single use is the jwt-bearer grant's to enforce: never a subject token.
            return Err(OAuthError::InvalidRequest(
                "subject_token is an ID-JAG: present it with the jwt-bearer grant".into(),
            ));
        }
        if !t.audience_is_one_of(&[agent.id.as_str(), self.issuer.as_str()]) {
            return Err(OAuthError::InvalidRequest(format!(
                "subject_token's aud names neither the agent ({}) nor this issuer ({})",
                agent.id, self.issuer
            )));
        }
        // RFC 8693 §4.1, §4.4: a token that names an actor already would lose that actor
        // here, and one that names who may act for the person binds that choice.
        if t.claims.contains_key("act") {
            return Err(OAuthError::InvalidRequest(
                "subject_token names an actor already (act): present the person's own token".into(),
            ));
        }
        if let Some(may) = t.claims.get("may_act") {
            let named = may.get("sub").and_then(serde_json::Value::as_str) == Some(agent.id.as_str());
            let here = may
                .get("iss")
                .is_none_or(|iss| iss.as_str() == Some(self.issuer.as_str()));
            if !named || !here {
                return Err(OAuthError::InvalidRequest(format!(
                    "subject_token's may_act does not name this agent ({}, issuer {})",
                    agent.id, self.issuer
                )));
            }
        }
        let sub = person(&t, OAuthError::InvalidRequest)?;
        self.not_revoked(
            &agent.org_id,
            &idp.issuer,
            &sub,
            t.int("iat"),
            OAuthError::InvalidRequest,
        )
        .await?;
        Ok(Delegated {
            sub_id: SubjectId::iss_sub(&idp.issuer, &sub),
            inner: None,
            allowed: person_scope(&t, OAuthError::InvalidRequest)?,
            exp_cap: t.int("exp"),
            resource: None,
            single_use: None,
        })
    }

    /// A delegated agentid token that another agent of the organization got for this issuer
    /// to hand its task on.
    async fn handed_on(
        &self,
        agent: &AgentRecord,
        token: &str,
        now: Millis,
    ) -> Result<Delegated, OAuthError> {
        let refuse = |why: &str| Err(OAuthError::InvalidRequest(format!("subject_token: {why}")));
        let parent = match self.tokens.check(token).0 {
            Ok(t) => t,
            Err(rej) => return refuse(rej.reason.describe()),
        };
        let c = &parent.claims;
        let (Some(act), Some(sub_id)) = (&c.act, &c.sub_id) else {
            return refuse(
                "it is an agentid token that acts for nobody: hand on a delegated token (one with act)",
            );
        };
        if !c.aud.as_ref().is_some_and(|a| a.contains(&self.issuer)) {
            return refuse(&format!(
                "its aud does not include this issuer ({}): ask for it with resource={}",
                self.issuer, self.issuer
            ));
        }
        if c.exp <= now.as_secs() {
            return refuse("it expired");
        }
        if c.cnf.is_some() {
            // Its holder's key stays with the agent that asked for it: a bound token cannot be
            // handed on, and one that could would pass without its proof.
            return refuse("it is bound to a key (cnf): a token to hand on is asked for without DPoP");
        }
        let Some(ids) = chain_ids(act) else {
            return refuse("its chain names something that is not an agent");
        };
        let acting = match self.store.get_agent(&ids[0]).await? {
            Some(a) => a,
            None => return refuse("its agent is unknown"),
        };
        if acting.org_id != agent.org_id {
            return refuse("it is another organization's: a task is handed on within an organization");
        }
        if ids.iter().any(|id| self.registry.is_revoked(id.as_str())) {
            return refuse("an agent of its chain is revoked");
        }
        let standing = self
            .store
            .delegation_standing(&agent.org_id, &sub_id.iss, &sub_id.sub, &ids)
            .await?;
        if let Some(why) = verdict(&self.keys, c, &standing) {
            return refuse(&why);
        }
        let depth = ids.len() + 1;
        if depth > self.max_delegation_depth {
            return refuse(&format!(
                "the chain would hold {depth} agents, over this service's maximum of {}",
                self.max_delegation_depth
            ));
        }
        Ok(Delegated {
            sub_id: sub_id.clone(),
            inner: Some(act.clone()),
            allowed: Some(split_scope(c.scope.as_deref().unwrap_or(""))),
            exp_cap: Some(c.exp),
            resource: None,
            single_use: None,
        })
    }

    /// An ID-JAG: from a trusted provider, for this issuer and this agent, used once.
    async fn id_jag(
        &self,
        agent: &AgentRecord,
        assertion: &str,
        now: Millis,
    ) -> Result<Delegated, OAuthError> {
        let grant = OAuthError::InvalidGrant;
        let (idp, t) = self
            .provider_token(&agent.org_id, assertion, now, "assertion", grant)
            .await?;
        let typ = t.typ.as_deref().unwrap_or("");
        if !typ.eq_ignore_ascii_case(ID_JAG_TYP) && !typ.eq_ignore_ascii_case("application/oauth-id-jag+jwt")
        {
            return Err(grant(format!("assertion: its typ is {typ:?}, not {ID_JAG_TYP}")));
        }
        // This issuer alone: one that other servers take too could be spent at each of them.
        let only_here = match t.claims.get("aud") {
            Some(Value::String(a)) => *a == self.issuer,
            Some(Value::Array(all)) => {
                !all.is_empty() && all.iter().all(|a| a.as_str() == Some(self.issuer.as_str()))
            }
            _ => false,
        };
        if !only_here {
            return Err(grant(format!(
                "assertion: its aud is not this issuer ({}) alone",
                self.issuer
            )));
        }
        if t.int("iat").is_none() {
            return Err(grant("assertion: iat is required".into()));
        }
        if t.text("client_id") != Some(agent.id.as_str()) {
            return Err(grant(format!(
                "assertion: its client_id is not the authenticated client ({})",
                agent.id
            )));
        }
        let exp = t.int("exp").unwrap_or_default();
        if exp > now.as_secs() + MAX_ID_JAG_LIFETIME_SECS + self.max_skew_secs {
            return Err(grant(format!(
                "assertion: it lives more than {MAX_ID_JAG_LIFETIME_SECS} s ahead"
            )));
        }
        let Some(jti) = t.text("jti").filter(|j| !j.is_empty() && j.len() <= 255) else {
            return Err(grant("assertion: jti is required".into()));
        };
        let resource = match t.claims.get("resource") {
            None => None,
            Some(Value::String(r)) if agentid_core::token::absolute_uri(r).is_ok() => Some(r.clone()),
            Some(_) => return Err(grant("assertion: its resource is not an absolute URI".into())),
        };
        let sub = person(&t, grant)?;
        self.not_revoked(&agent.org_id, &idp.issuer, &sub, t.int("iat"), grant)
            .await?;
        // Spent within the organization: another one trusting the same issuer name (with
        // keys of its own) cannot spend this one's ID-JAGs by guessing their jti.
        let key = crate::once::used_key(&["id-jag", agent.org_id.as_str(), &idp.issuer, jti]);
        Ok(Delegated {
            sub_id: SubjectId::iss_sub(&idp.issuer, &sub),
            inner: None,
            allowed: person_scope(&t, grant)?,
            // Every link bounds the token's life, the ID-JAG's too.
            exp_cap: Some(exp),
            resource,
            single_use: Some((key, Millis::from_secs(exp))),
        })
    }

    /// Refuses a person the organization revoked since `iat` (a token without `iat` counts as
    /// issued before).
    async fn not_revoked(
        &self,
        org: &OrgId,
        iss: &str,
        sub: &str,
        iat: Option<i64>,
        refusal: fn(String) -> OAuthError,
    ) -> Result<(), OAuthError> {
        let standing = self.store.delegation_standing(org, iss, sub, &[]).await?;
        match standing.subject_revoked_at {
            Some(at) if iat.unwrap_or(0).saturating_mul(1000) <= at.0 => Err(refusal(format!(
                "the organization revoked this person's delegation at {}: the person signs in again",
                at.to_rfc3339()
            ))),
            _ => Ok(()),
        }
    }
}

/// The person a provider's token names (`sub`, 1 to 255 bytes, no agent's id).
fn person(t: &Foreign, refusal: fn(String) -> OAuthError) -> Result<String, OAuthError> {
    match t.text("sub") {
        // A delegated token's `sub` is the person, where an agent's own token has its id: a
        // provider (any organization may add one) naming an agent's id would make a token a
        // resource server that admits agents by `sub` takes for that agent's.
        Some(s) if AgentId::parse(s).is_some() => Err(refusal(
            "the token's sub is an agent's id, which names no person".to_owned(),
        )),
        // Printable: it goes into headers (forward auth's X-Agent-Subject) and logs.
        Some(s) if !s.is_empty() && s.len() <= MAX_SUB_LEN && !s.chars().any(char::is_control) => {
            Ok(s.to_owned())
        }
        _ => Err(refusal(format!(
            "the token's sub must be 1 to {MAX_SUB_LEN} bytes, without control characters"
        ))),
    }
}

/// The scopes a provider's token allows the agent: its `scope` (a space-separated string,
/// RFC 8693 and RFC 9068) and its `scp` (a string or an array of strings, as Okta and Entra
/// write it), each one present narrowing the grant; `None` when it carries neither. A claim
/// of another shape is refused: read as absent, it would allow everything the agent holds.
fn person_scope(t: &Foreign, refusal: fn(String) -> OAuthError) -> Result<Option<Vec<String>>, OAuthError> {
    let mut allowed: Option<Vec<String>> = None;
    for name in ["scope", "scp"] {
        let these = match t.claims.get(name) {
            None => continue,
            Some(Value::String(s)) => split_scope(s),
            Some(Value::Array(items)) if name == "scp" => items
                .iter()
                .map(|v| v.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| refusal("the token's scp holds something that is not a string".into()))?,
            Some(_) => {
                return Err(refusal(format!(
                    "the token's {name} is not {}",
                    if name == "scope" {
                        "a string"
                    } else {
                        "a string or an array of strings"
                    }
                )))
            }
        };
        allowed = Some(match allowed {
            None => these,
            Some(before) => before.into_iter().filter(|s| these.contains(s)).collect(),
        });
    }
    Ok(allowed)
}

fn split_scope(s: &str) -> Vec<String> {
    s.split(' ')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key set padded to its 64 KiB bound is kept as its keys' members alone; more keys
    /// than a provider may have is refused.
    #[test]
    fn a_fetched_key_set_is_kept_as_its_keys_alone() {
        let key = serde_json::json!({"kty": "OKP", "crv": "Ed25519", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo", "kid": "k1", "x5c": ["AAAA"], "d": "secret"});
        let pad: Vec<Value> = (0..8000).map(|_| serde_json::json!({"a": 0})).collect();
        let body = serde_json::json!({"keys": [key], "pad": pad}).to_string();
        assert!(body.len() > 60_000);
        let kept = fetched_key_set(body.as_bytes()).unwrap();
        assert_eq!(
            kept,
            serde_json::json!({"keys": [{"kty": "OKP", "crv": "Ed25519", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo", "kid": "k1"}]})
        );
        let many = serde_json::json!({"keys": vec![key; crate::identity_providers::MAX_KEYS + 1]});
        assert!(fetched_key_set(many.to_string().as_bytes()).is_err());
        assert!(fetched_key_set(b"{\"keys\": {}}").is_err());
    }
}
