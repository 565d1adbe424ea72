//! Organization and key administration, shared by the CLI and the first-run bootstrap.

use serde::Serialize;

use crate::domain::{new_id, ApiKeyKind, IdPrefix, KeyMode, Millis, OrgLimits, Plan};
use crate::store::{NewApiKey, OrgRecord, SharedStore, StoreError};

use super::apikeys::generate_key;

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

/// What `agentid org create` prints (DESIGN.md fixes its shape).
#[derive(Debug, Clone, Serialize)]
pub struct CreatedOrg {
    pub org_id: String,
    pub name: String,
    pub plan: &'static str,
    pub keys: OrgKeys,
}

pub async fn create_org(
    store: &SharedStore,
    name: &str,
    plan: Plan,
    limits: OrgLimits,
) -> Result<CreatedOrg, StoreError> {
    let (org, stored, created) = new_org(name, plan, limits);
    store.create_org(&org, &stored).await?;
    Ok(created)
}

/// Creates the organization unless the store has one already: of instances starting at once
/// on an empty store, exactly one creates it (and shows its keys).
pub async fn create_first_org(
    store: &SharedStore,
    name: &str,
    plan: Plan,
    limits: OrgLimits,
) -> Result<Option<CreatedOrg>, StoreError> {
    let (org, stored, created) = new_org(name, plan, limits);
    Ok(store.create_first_org(&org, &stored).await?.then_some(created))
}

/// A new organization with its four keys: as stored, and as shown once.
fn new_org(name: &str, plan: Plan, limits: OrgLimits) -> (OrgRecord, Vec<NewApiKey>, CreatedOrg) {
    let org = OrgRecord {
        id: new_id(IdPrefix::Org),
        name: name.to_owned(),
        plan,
        limits,
        created_at: Millis::now(),
    };
    let mut stored = Vec::with_capacity(4);
    let mut key = |kind, mode| {
        let (k, s) = generate_key(&org.id, kind, mode);
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
        org_id: org.id.clone(),
        name: org.name.clone(),
        plan: plan.as_str(),
        keys,
    };
    (org, stored, created)
}

/// Creates one more key for an organization; returns it (shown once).
pub async fn create_key(
    store: &SharedStore,
    org_id: &str,
    kind: ApiKeyKind,
    mode: KeyMode,
) -> Result<Option<String>, StoreError> {
    if store.get_org(org_id).await?.is_none() {
        return Ok(None);
    }
    let (key, stored) = generate_key(org_id, kind, mode);
    store.insert_key(&stored).await?;
    Ok(Some(key))
}

/// The outcome of recomputing one ledger's chain from genesis.
#[derive(Debug, Clone)]
pub struct ChainReport {
    pub ledger: crate::domain::Ledger,
    /// Records checked, and the break if there is one.
    pub records: i64,
    pub broken: Option<crate::domain::audit::ChainBreak>,
}

/// Recomputes every ledger's hash chain from genesis.
pub async fn verify_chains(store: &SharedStore) -> Result<Vec<ChainReport>, StoreError> {
    let mut reports = Vec::new();
    for ledger in store.ledgers().await? {
        let mut checker = crate::domain::audit::ChainChecker::default();
        let mut broken = None;
        'pages: loop {
            let (after, _) = checker.head();
            let page = store.read_chain(&ledger, after, 1000).await?;
            if page.is_empty() {
                break;
            }
            for rec in &page {
                if let Err(b) = checker.push(rec) {
                    broken = Some(b);
                    break 'pages;
                }
            }
        }
        reports.push(ChainReport {
            records: checker.head().0,
            ledger,
            broken,
        });
    }
    Ok(reports)
}
