//! An agent's row: the columns an insert writes and a read selects, and how a row becomes
//! an `AgentRecord`.

use super::sql::{decode, parse_mode};
use super::{AgentRecord, StoreError};
use agentid_core::domain::{AgentId, IssuerDomain, ListId, Millis, OrgId, Scopes, StatusPlace};

/// The stored columns of `agents`, in insert order.
pub(crate) const AGENT_INSERT_COLUMNS: &str = "id, org_id, mode, name, issuer_domain, description, scopes, \
    created_at, issued_at, expires_at, revoked_at, revocation_reason, status_list, status_idx, jkt, jwk, key_mac, key_sealed_at";

/// What an agent read selects (`FROM agents`, not aliased): the stored columns, then
/// `verification_count`: the running totals of the agent's newest block row in each mode's
/// ledger (records are counted where they were written), two look-ups on a primary key. The
/// audit batch writes those rows anyway, so counting needs no write to the agent row.
pub(crate) const AGENT_COLUMNS: &str = "id, org_id, mode, name, issuer_domain, description, scopes, \
    created_at, issued_at, expires_at, revoked_at, revocation_reason, status_list, status_idx, jkt, jwk, key_mac, key_sealed_at, \
    COALESCE((SELECT c.n_valid + c.n_invalid + c.n_expired + c.n_revoked FROM audit_block_agents c \
     WHERE c.org_id = agents.org_id AND c.mode = 'live' AND c.agent_id = agents.id \
     ORDER BY c.first_seq DESC LIMIT 1), 0) + \
    COALESCE((SELECT c.n_valid + c.n_invalid + c.n_expired + c.n_revoked FROM audit_block_agents c \
     WHERE c.org_id = agents.org_id AND c.mode = 'test' AND c.agent_id = agents.id \
     ORDER BY c.first_seq DESC LIMIT 1), 0) \
    AS verification_count";

row! {
    /// An agent as `AGENT_COLUMNS` selects it.
    pub(crate) struct AgentRow {
        id: String, org_id: String, mode: String, name: String, issuer_domain: String,
        description: String,
        /// A JSON array of strings.
        scopes: String, created_at: i64, issued_at: i64, expires_at: i64, revoked_at: Option<i64>,
        revocation_reason: Option<String>, status_list: Option<String>, status_idx: Option<i64>,
        jkt: Option<String>, jwk: Option<String>, key_mac: Option<Vec<u8>>, key_sealed_at: Option<i64>,
        verification_count: i64,
    }
}

impl AgentRow {
    pub(crate) fn into_record(self) -> Result<AgentRecord, StoreError> {
        let scopes = serde_json::from_str::<Vec<String>>(&self.scopes)
            .ok()
            .and_then(|v| Scopes::parse(&v).ok())
            .ok_or_else(|| StoreError::Corrupt(format!("scopes of {}", self.id)))?;
        Ok(AgentRecord {
            mode: parse_mode(&self.mode)?,
            id: decode("agent", &self.id, AgentId::parse)?,
            org_id: decode("organization", &self.org_id, OrgId::parse)?,
            name: self.name,
            issuer_domain: decode("issuer domain", &self.issuer_domain, IssuerDomain::read)?,
            description: self.description,
            scopes,
            created_at: Millis(self.created_at),
            issued_at: Millis(self.issued_at),
            expires_at: Millis(self.expires_at),
            revoked_at: self.revoked_at.map(Millis),
            revocation_reason: self.revocation_reason,
            status: place(self.status_list, self.status_idx)?,
            jkt: self.jkt,
            jwk: self.jwk,
            // A MAC of another length vouches for nothing: the engine finds it so.
            key_mac: self.key_mac.and_then(|m| m.as_slice().try_into().ok()),
            key_sealed_at: self.key_sealed_at.map(Millis),
            verification_count: self.verification_count,
        })
    }
}

row! {
    /// An agent right after a revocation, with the epoch the revocation was stamped with.
    pub(crate) struct RevokedAgentRow {
        #[flatten]
        agent: AgentRow, revoked_epoch: Option<i64>,
    }
}

/// A stored status place: both columns or neither.
pub(crate) fn place(list: Option<String>, idx: Option<i64>) -> Result<Option<StatusPlace>, StoreError> {
    match (list, idx) {
        (None, None) => Ok(None),
        (Some(list), Some(idx)) if idx >= 0 => Ok(Some(StatusPlace {
            list: decode("status list", &list, ListId::parse)?,
            idx: idx as u64,
        })),
        (list, idx) => Err(StoreError::Corrupt(format!("status place {list:?} {idx:?}"))),
    }
}

/// The `INSERT` of a new agent, with the last issuer-domain event its registration saw (it
/// runs under the lock every change of who holds what takes): a name's move after it owes it
/// no revocation.
pub(crate) fn insert_agent_sql() -> String {
    format!(
        "INSERT INTO agents ({AGENT_INSERT_COLUMNS}, domain_events_seen) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, \
         (SELECT COALESCE(MAX(seq), 0) FROM domain_events))"
    )
}

pub(crate) fn scopes_json(scopes: &[String]) -> String {
    serde_json::to_string(scopes).expect("strings serialize")
}
