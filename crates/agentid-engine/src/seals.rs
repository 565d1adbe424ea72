//! What the key file seals beyond names and signing keys: who may call (API keys, and an
//! organization's plan and limits) and how an agent authenticates (the key it is bound to,
//! its client secrets). A row written with database access alone has no seal that checks:
//! it is an integrity alarm, and grants nothing. The rows from before seals, which their
//! migration marked, are sealed by the first start after it.

use agentid_core::keys::{KeyRing, Sealed};
use agentid_core::records::{agent_key_canonical, api_key_canonical, client_secret_canonical};
use agentid_store::{AgentRecord, KeyRecord, OrgRecord, Seals, SharedStore, StoreError};

use agentid_core::domain::{AgentId, Millis};

/// The organization with the key file's seal of its plan and limits, made now.
pub(crate) fn sealed_org(keys: &KeyRing, mut org: OrgRecord) -> OrgRecord {
    org.sealed_at = Millis::now();
    org.mac = Some(keys.seal(Sealed::Organization, &org.canonical()));
    org
}

/// The agent with the key file's seal of its key binding (a key, or none), made now.
pub(crate) fn sealed_agent_key(keys: &KeyRing, mut agent: AgentRecord) -> AgentRecord {
    seal_agent_key(keys, &mut agent);
    agent
}

/// Seals the agent's key binding (a key, or none) now; returns the MAC and when it was made.
pub(crate) fn seal_agent_key(keys: &KeyRing, agent: &mut AgentRecord) -> ([u8; 32], Millis) {
    let now = Millis::now();
    agent.key_sealed_at = Some(now);
    let mac = keys.seal(Sealed::AgentKey, &agent.key_canonical());
    agent.key_mac = Some(mac);
    (mac, now)
}

/// The key file's seal of an agent's client secret made at `created_at`.
pub(crate) fn client_secret_seal(
    keys: &KeyRing,
    agent: &AgentId,
    secret_hash: &[u8; 32],
    created_at: Millis,
) -> [u8; 32] {
    keys.seal(
        Sealed::ClientSecret,
        &client_secret_canonical(agent, secret_hash, created_at),
    )
}

fn alarm(what: &'static str, message: &str, id: &str) {
    tracing::error!(id, "integrity alarm: {message}");
    metrics::counter!("agentid_integrity_failures_total", "what" => what).increment(1);
}

/// Whether the key file vouches for an organization's plan and limits. One that it does not
/// was written or changed with database access alone: an integrity alarm, and its keys open
/// nothing.
pub(crate) fn org_vouched(keys: &KeyRing, org: &OrgRecord) -> bool {
    let ok = org
        .mac
        .is_some_and(|mac| keys.vouches(Sealed::Organization, &org.canonical(), &mac));
    if !ok {
        alarm(
            "organization",
            "an organization's plan and limits are not sealed by the key file; its keys are refused",
            org.id.as_str(),
        );
    }
    ok
}

/// Whether the key file vouches for a key's row: which key, whose, and what it may do. One
/// that it does not was written with database access alone: an integrity alarm, and refused.
pub(crate) fn key_vouched(keys: &KeyRing, hash: &[u8; 32], stored: &KeyRecord) -> bool {
    let canonical = api_key_canonical(hash, &stored.org.id, stored.kind, stored.mode);
    let ok = stored
        .mac
        .is_some_and(|mac| keys.vouches(Sealed::ApiKey, &canonical, &mac));
    if !ok {
        alarm(
            "api_key",
            "an API key's row is not sealed by the key file; it is refused",
            stored.org.id.as_str(),
        );
    }
    ok
}

/// Whether the key file vouches for the key an agent is bound to, or for its being bound to
/// none. A key written into the agent's row with database access alone authenticates
/// nobody; a key taken out of it would make the agent's next token a bearer token. Either
/// is an integrity alarm.
pub(crate) fn agent_key_vouched(keys: &KeyRing, agent: &AgentRecord) -> bool {
    let ok = agent
        .key_mac
        .is_some_and(|mac| keys.vouches(Sealed::AgentKey, &agent.key_canonical(), &mac));
    if !ok {
        alarm(
            "agent_key",
            "an agent's key binding is not sealed by the key file; it gets no token and authenticates nobody",
            agent.id.as_str(),
        );
    }
    ok
}

/// Whether the key file vouches for a client secret of `agent` as stored (`mac`). One that
/// it does not was written with database access alone: an integrity alarm, and refused.
pub(crate) fn client_secret_vouched(
    keys: &KeyRing,
    agent: &AgentId,
    secret_hash: &[u8; 32],
    (created_at, mac): (Millis, &[u8]),
) -> bool {
    let canonical = client_secret_canonical(agent, secret_hash, created_at);
    let ok = <&[u8; 32]>::try_from(mac).is_ok_and(|mac| keys.vouches(Sealed::ClientSecret, &canonical, mac));
    if !ok {
        alarm(
            "client_secret",
            "an agent's client secret is not sealed by the key file; it is refused",
            agent.as_str(),
        );
    }
    ok
}

/// How many rows of each kind one transaction seals: each batch takes the time of its own
/// seals, well within the minute the database allows, however many rows there are.
const SEAL_BATCH: u32 = 500;

/// Seals the rows from before seals (the migration that brought seals marked them with a
/// one-byte MAC, which the database takes in no row that grants anything): at start, and
/// before `org create`, `org set-limits` and `key create`, in batches, each its own
/// transaction, until none is left. Returns how many rows it found to seal.
pub async fn seal_unsealed(store: &SharedStore, keys: &KeyRing) -> Result<usize, StoreError> {
    let mut sealed = 0;
    loop {
        let found = store.unsealed(SEAL_BATCH).await?;
        let now = Millis::now();
        let seals = Seals {
            orgs: found
                .orgs
                .into_iter()
                .map(|o| {
                    let o = sealed_org(keys, o);
                    (o.id, o.mac.expect("sealed"), o.sealed_at)
                })
                .collect(),
            keys: found
                .keys
                .iter()
                .map(|(hash, org, kind, mode)| {
                    (
                        *hash,
                        keys.seal(Sealed::ApiKey, &api_key_canonical(hash, org, *kind, *mode)),
                    )
                })
                .collect(),
            agent_keys: found
                .agent_keys
                .into_iter()
                .map(|(id, jkt, jwk)| {
                    let canonical = agent_key_canonical(&id, jkt.as_deref(), jwk.as_deref(), Some(now));
                    (id, keys.seal(Sealed::AgentKey, &canonical), now)
                })
                .collect(),
            client_secrets: found
                .client_secrets
                .into_iter()
                .map(|(id, hash, created_at)| {
                    let mac = client_secret_seal(keys, &id, &hash, created_at);
                    (id, hash, mac)
                })
                .collect(),
        };
        let n = seals.orgs.len() + seals.keys.len() + seals.agent_keys.len() + seals.client_secrets.len();
        if n == 0 {
            break;
        }
        // Rows another instance sealed meanwhile are passed over: the next batch goes on.
        store.seal(&seals).await?;
        tracing::info!(
            organizations = seals.orgs.len(),
            api_keys = seals.keys.len(),
            agent_keys = seals.agent_keys.len(),
            client_secrets = seals.client_secrets.len(),
            "sealed rows from before seals"
        );
        sealed += n;
    }
    Ok(sealed)
}
