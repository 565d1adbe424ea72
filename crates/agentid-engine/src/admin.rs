//! The operator's rules: organizations and their limits, API keys, and the fleet's signing
//! keys (the first key's bootstrap, rotation, retirement). The CLI parses arguments and calls
//! these; `app` calls the bootstrap at start.

use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use agentid_core::domain::{ApiKeyKind, KeyMode, Millis, OrgId, OrgLimits, Plan, ValidationError};
use agentid_core::keys::{
    states, thumbprint, KeyError, KeyRing, KeyState, KeyView, SigningKeyRecord, Unvouched,
};
use agentid_store::{NewApiKey, OrgRecord, SharedStore, StoreError};

use super::apikeys::generate_key;
use super::seals::{org_vouched, seal_unsealed, sealed_org};

/// The four keys an organization starts with, shown once.
#[derive(Clone, Serialize)]
pub struct OrgKeys {
    pub secret_live: String,
    pub secret_test: String,
    pub publishable_live: String,
    pub publishable_test: String,
}

impl std::fmt::Debug for OrgKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OrgKeys { .. }")
    }
}

/// What `agentid org create` prints (scripts rely on its shape).
#[derive(Debug, Clone, Serialize)]
pub struct CreatedOrg {
    pub org_id: String,
    pub name: String,
    pub plan: &'static str,
    pub keys: OrgKeys,
}

pub async fn create_org(
    store: &SharedStore,
    keys: &KeyRing,
    name: &str,
    plan: Plan,
    limits: OrgLimits,
) -> Result<CreatedOrg, StoreError> {
    seal_unsealed(store, keys).await?;
    let (org, stored, created) = new_org(keys, name, plan, limits);
    store.create_org(&org, &stored).await?;
    Ok(created)
}

/// Creates the organization unless the store has one already: of instances starting at once
/// on an empty store, exactly one creates it (and shows its keys).
pub async fn create_first_org(
    store: &SharedStore,
    keys: &KeyRing,
    name: &str,
    plan: Plan,
    limits: OrgLimits,
) -> Result<Option<CreatedOrg>, StoreError> {
    let (org, stored, created) = new_org(keys, name, plan, limits);
    Ok(store.create_first_org(&org, &stored).await?.then_some(created))
}

/// A new organization with its four keys, sealed by the key file: as stored, and as shown once.
fn new_org(
    keys: &KeyRing,
    name: &str,
    plan: Plan,
    limits: OrgLimits,
) -> (OrgRecord, Vec<NewApiKey>, CreatedOrg) {
    let org = sealed_org(
        keys,
        OrgRecord {
            id: OrgId::generate(),
            name: name.to_owned(),
            plan,
            stored_limits: limits,
            created_at: Millis::now(),
            mac: None,
            sealed_at: Millis(0),
        },
    );
    let mut stored = Vec::with_capacity(4);
    let mut key = |kind, mode| {
        let (k, s) = generate_key(keys, &org.id, kind, mode, None);
        stored.push(s);
        k
    };
    let keys = OrgKeys {
        secret_live: key(ApiKeyKind::Secret, KeyMode::Live),
        secret_test: key(ApiKeyKind::Secret, KeyMode::Test),
        publishable_live: key(ApiKeyKind::Publishable, KeyMode::Live),
        publishable_test: key(ApiKeyKind::Publishable, KeyMode::Test),
    };
    let created = CreatedOrg {
        org_id: org.id.as_str().to_owned(),
        name: org.name.clone(),
        plan: plan.as_str(),
        keys,
    };
    (org, stored, created)
}

/// The longest name a key may be given.
const MAX_KEY_NAME: usize = 100;

/// Creates one more key for an organization, named `name` if given; returns it (shown once)
/// and its id.
pub async fn create_key(
    store: &SharedStore,
    keys: &KeyRing,
    org_id: &str,
    kind: ApiKeyKind,
    mode: KeyMode,
    name: Option<&str>,
) -> Result<Option<(String, String)>, AdminError> {
    if let Some(n) = name {
        if n.trim().is_empty() || n.chars().count() > MAX_KEY_NAME || n.chars().any(char::is_control) {
            return Err(ValidationError::new(
                "name",
                format!("must be 1 to {MAX_KEY_NAME} characters, none of them a control character"),
            )
            .into());
        }
    }
    let Some(org_id) = OrgId::parse(org_id) else {
        return Ok(None);
    };
    if store.get_org(&org_id).await?.is_none() {
        return Ok(None);
    }
    seal_unsealed(store, keys).await?;
    let (key, stored) = generate_key(keys, &org_id, kind, mode, name);
    store.insert_key(&stored).await?;
    Ok(Some((key, stored.id)))
}

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("no organization {0} (`agentid org list` shows them)")]
    NoOrg(String),
    #[error("{count} organizations are named {name}: give the org_id (`agentid org list` shows them)")]
    AmbiguousOrg { name: String, count: usize },
    /// An operator's change that the rules refuse: why.
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    #[error("no signing key {0}")]
    NoSigningKey(String),
    #[error(
        "{0} is the only active key; rotate first (agentid signing-key rotate --publish-for 0s), \
         then retire it"
    )]
    OnlyActiveKey(String),
    #[error("{0} is retired already")]
    RetiredAlready(String),
    #[error("no signing key file at {0}")]
    NoKeyFile(String),
    #[error("{path} is not this fleet's key file (its key {kid} is not recorded)")]
    NotFleetKeyFile { path: String, kid: String },
    #[error(
        "the database records the fleet's signing key {fleet_kid}, but the key file {path} does \
         not exist: copy the key file of an instance that runs there (a new key is made only \
         for a database that records none)"
    )]
    FleetKeyMissing { path: String, fleet_kid: String },
    #[error(
        "the signing key file {path} holds key {file_kid}, but the database records the fleet's \
         signing key {fleet_kid}: every instance must start with the same key file"
    )]
    FleetKeyMismatch {
        path: String,
        file_kid: String,
        fleet_kid: String,
    },
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What `agentid org set-limits` sets.
#[derive(Debug, Clone, Copy, Default)]
pub struct LimitChange {
    pub plan: Option<Plan>,
    pub verify_limit: Option<u32>,
    pub other_limit: Option<u32>,
    pub max_expiry_seconds: Option<u64>,
}

/// Changes an organization's plan or limits (`OrgLimits::change`), sealed by the key file;
/// returns it as stored. What the change does not name is kept only when the key file
/// vouches for it: a plan or limits written with database access alone are not carried into
/// a new seal, so then the change must give the plan (and, on enterprise, every limit).
pub async fn set_limits(
    store: &SharedStore,
    keys: &KeyRing,
    org_id: &str,
    change: LimitChange,
) -> Result<OrgRecord, AdminError> {
    seal_unsealed(store, keys).await?;
    let found = match OrgId::parse(org_id) {
        Some(id) => store.get_org(&id).await?,
        None => None,
    };
    let Some(org) = found else {
        return Err(AdminError::NoOrg(org_id.to_owned()));
    };
    let (plan, limits) = if org_vouched(keys, &org) {
        OrgLimits::change(
            org.plan,
            org.limits(),
            change.plan,
            change.verify_limit,
            change.other_limit,
            change.max_expiry_seconds,
        )?
    } else {
        let Some(plan) = change.plan else {
            return Err(AdminError::Refused(format!(
                "the plan and limits stored for {org_id} are not sealed by the key file (written \
                 with database access alone): give --plan (and, on enterprise, every limit)"
            )));
        };
        let limits = OrgLimits::resolve(
            plan,
            change.verify_limit,
            change.other_limit,
            change.max_expiry_seconds,
        )?;
        (plan, limits)
    };
    let org = sealed_org(
        keys,
        OrgRecord {
            plan,
            stored_limits: limits,
            ..org
        },
    );
    if !store.update_org(&org).await? {
        return Err(AdminError::NoOrg(org_id.to_owned()));
    }
    Ok(org)
}

/// The recorded signing keys as the fleet sees them: the states of those the key file `root`
/// vouches for, worked out among them alone, then the others, `unvouched`.
pub async fn signing_keys(store: &SharedStore, root: &KeyRing) -> Result<Vec<KeyView>, StoreError> {
    Ok(views(root, &store.signing_keys().await?, Millis::now()))
}

fn views(root: &KeyRing, keys: &[SigningKeyRecord], now: Millis) -> Vec<KeyView> {
    let (vouched, unvouched) = agentid_core::keys::vouched(root, keys);
    let (st, _) = states(&vouched, now);
    let view = |k: &SigningKeyRecord, state| KeyView {
        kid: k.kid.clone(),
        state,
        created_at: k.created_at,
        activates_at: k.activates_at,
    };
    let mut out: Vec<KeyView> = vouched.iter().zip(st).map(|(k, state)| view(k, state)).collect();
    out.extend(
        keys.iter()
            .filter(|k| unvouched.iter().any(|u| u.kid == k.kid))
            .map(|k| view(k, KeyState::Unvouched)),
    );
    out
}

/// Adds a signing key, sealed under the key file's key (`root`, which must be the fleet's):
/// published at once, signing once `publish_for` has passed.
pub async fn rotate_signing_key(
    store: &SharedStore,
    root: &KeyRing,
    root_path: &Path,
    publish_for: Duration,
) -> Result<KeyView, AdminError> {
    let recorded = store.signing_keys().await?;
    if !recorded.iter().any(|k| k.kid == root.kid()) {
        return Err(AdminError::NotFleetKeyFile {
            path: root_path.display().to_string(),
            kid: root.kid().to_owned(),
        });
    }
    let key = ed25519_dalek::SigningKey::generate(&mut rand::rngs::OsRng);
    let kid = thumbprint(&key.verifying_key());
    let at = Millis(Millis::now().0 + publish_for.as_millis() as i64);
    let sealed = root.seal_key(&kid, at, &key.to_bytes());
    let record = SigningKeyRecord::new(kid.clone(), key.verifying_key().to_bytes(), Some(sealed), at);
    store.add_signing_key(&record).await?;
    let all = store.signing_keys().await?;
    views(root, &all, Millis::now())
        .into_iter()
        .find(|v| v.kid == kid)
        .ok_or(AdminError::NoSigningKey(kid))
}

/// The recorded signing keys that the key file `root` does not vouch for (see
/// [`agentid_core::keys::vouch`]): for `audit verify`.
pub async fn unvouched_signing_keys(
    store: &SharedStore,
    root: &KeyRing,
) -> Result<Vec<Unvouched>, StoreError> {
    Ok(agentid_core::keys::vouched(root, &store.signing_keys().await?).1)
}

/// Retires a signing key now; refused for the only active key among those the key file
/// `root` vouches for (a row written into the database by someone else signs nothing, so it
/// cannot stand in for the signer).
pub async fn retire_signing_key(store: &SharedStore, root: &KeyRing, kid: &str) -> Result<(), AdminError> {
    let keys = store.signing_keys().await?;
    if !keys.iter().any(|k| k.kid == kid) {
        return Err(AdminError::NoSigningKey(kid.to_owned()));
    }
    let (vouched, _) = agentid_core::keys::vouched(root, &keys);
    let (st, _) = states(&vouched, Millis::now());
    let state = |k: &str| vouched.iter().position(|v| v.kid == k).map(|i| st[i]);
    // The signer may go only when another activated key (a replaced one) can sign instead.
    let others = vouched
        .iter()
        .filter(|v| v.kid != kid && matches!(state(&v.kid), Some(KeyState::Active | KeyState::Replaced)))
        .count();
    if state(kid) == Some(KeyState::Active) && others == 0 {
        return Err(AdminError::OnlyActiveKey(kid.to_owned()));
    }
    // Retirements are committed to in the order of their times (`tlog::commit`): a later
    // one never takes an earlier time than one recorded, whatever the clocks of a fleet say.
    let latest = keys
        .iter()
        .filter_map(|k| k.retired_at)
        .max()
        .unwrap_or(Millis(0));
    let at = Millis(Millis::now().0.max(latest.0 + 1));
    if !store.retire_signing_key(kid, at).await? {
        return Err(AdminError::RetiredAlready(kid.to_owned()));
    }
    Ok(())
}

/// The key this instance signs with: the one in its key file, which must be the key the fleet
/// recorded in the database. A database that records none takes this instance's, made now if
/// the file does not exist; otherwise a missing file or another key stops the start. Returns
/// whether the key was made now.
pub async fn fleet_signing_key(store: &SharedStore, path: &Path) -> Result<(KeyRing, bool), AdminError> {
    let recorded = store.signing_keys().await?;
    let (ring, created) = match (KeyRing::load(path)?, recorded.is_empty()) {
        (Some(ring), _) => (ring, false),
        (None, true) => match KeyRing::create(path) {
            Ok(ring) => (ring, true),
            // Another process on this machine made it meanwhile.
            Err(KeyError::Io { source, .. }) if source.kind() == std::io::ErrorKind::AlreadyExists => {
                let ring = KeyRing::load(path)?.ok_or_else(|| KeyError::Format {
                    path: path.display().to_string(),
                })?;
                (ring, false)
            }
            Err(e) => return Err(e.into()),
        },
        (None, false) => {
            return Err(AdminError::FleetKeyMissing {
                path: path.display().to_string(),
                fleet_kid: recorded[0].kid.clone(),
            })
        }
    };
    let recorded = if recorded.is_empty() {
        let ours = SigningKeyRecord {
            activates_at: None,
            ..SigningKeyRecord::new(
                ring.kid().to_owned(),
                ring.public_key_bytes(),
                None,
                Millis::now(),
            )
        };
        store.record_first_signing_key(&ours).await?
    } else {
        recorded
    };
    if recorded
        .iter()
        .any(|r| r.kid == ring.kid() && r.public_key == ring.public_key_bytes())
    {
        return Ok((ring, created));
    }
    if created {
        // Another instance recorded its key first: ours was never used. Leave no stray key
        // behind, so that the next start says the file is missing.
        let _ = std::fs::remove_file(path);
    }
    Err(AdminError::FleetKeyMismatch {
        path: path.display().to_string(),
        file_kid: ring.kid().to_owned(),
        fleet_kid: recorded[0].kid.clone(),
    })
}
