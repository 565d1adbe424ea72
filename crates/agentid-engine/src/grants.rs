//! The operator's issuer domains (`agentid domain …`): grant a name to an organization with
//! no challenge, release it, and list who holds what. A grant follows the rules of a proof
//! (`domain::holding::plan_hold`): taking a name from another organization needs `force`,
//! and revokes that organization's agents under it.

use std::path::Path;

use serde::Serialize;

use super::admin::AdminError;
use agentid_core::domain::holding::{parse_name, Grant, HoldRefused};
use agentid_core::domain::{Millis, OrgId};
use agentid_core::keys::KeyRing;
use agentid_store::{Held, OrgRecord, SharedStore};

use crate::domains::Rules;

/// The key file a grant is sealed with: it must be the fleet's (an event sealed under
/// another key counts nowhere).
pub async fn fleet_key_file(store: &SharedStore, path: &Path) -> Result<KeyRing, AdminError> {
    let Some(root) = KeyRing::load(path)? else {
        return Err(AdminError::NoKeyFile(path.display().to_string()));
    };
    if !store.signing_keys().await?.iter().any(|k| k.kid == root.kid()) {
        return Err(AdminError::NotFleetKeyFile {
            path: path.display().to_string(),
            kid: root.kid().to_owned(),
        });
    }
    Ok(root)
}

/// The organization an operator names: by id, or by a name exactly one organization has.
pub async fn find_org(store: &SharedStore, id_or_name: &str) -> Result<OrgRecord, AdminError> {
    if let Some(id) = OrgId::parse(id_or_name) {
        if let Some(org) = store.get_org(&id).await? {
            return Ok(org);
        }
    }
    let mut named: Vec<OrgRecord> = store
        .list_orgs()
        .await?
        .into_iter()
        .filter(|o| o.name == id_or_name)
        .collect();
    match named.len() {
        1 => Ok(named.remove(0)),
        0 => Err(AdminError::NoOrg(id_or_name.to_owned())),
        n => Err(AdminError::AmbiguousOrg {
            name: id_or_name.to_owned(),
            count: n,
        }),
    }
}

/// Grants `domain` to `org` (`method: operator`: the name and every name below it).
pub async fn approve(
    store: &SharedStore,
    keys: &KeyRing,
    org: &OrgRecord,
    domain: &str,
    force: bool,
) -> Result<Held, AdminError> {
    let name = parse_name("domain", domain)?;
    let now = Millis::now();
    let mut held = store
        .hold_domain(
            &Rules::new(keys),
            &org.id,
            &name,
            Grant::Operator { force },
            now,
            now,
        )
        .await?
        .map_err(|e: HoldRefused| AdminError::Refused(e.to_string()))?;
    // The former holders' agents, revoked before the grant returns (batch by batch: the
    // fleet goes on meanwhile). Cut short, the service's instances finish it.
    if let Some(m) = &held.moving {
        let mut revoked = Vec::new();
        crate::domains::moves::follow(store, m, None, |r| revoked.extend_from_slice(r)).await?;
        held.revoked = revoked;
    }
    Ok(held)
}

/// Ends `org`'s holding (or claim) of `domain`; its agents keep their tokens until they
/// expire.
pub async fn release(
    store: &SharedStore,
    keys: &KeyRing,
    org: &OrgRecord,
    domain: &str,
) -> Result<(), AdminError> {
    let name = parse_name("domain", domain)?;
    if store
        .release_domain(&Rules::new(keys), &org.id, &name, Millis::now())
        .await?
    {
        Ok(())
    } else {
        Err(AdminError::Refused(format!(
            "organization {} neither holds nor claims {}",
            org.id,
            name.as_str()
        )))
    }
}

/// One line of `agentid domain list`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Listed {
    pub domain: String,
    /// `verified` (held: the word `/v1/domains` uses), `pending` (claimed, not proven), or
    /// `unverified`: agents of these organizations
    /// use the name and none of them holds it (a name two organizations used before names
    /// were proven, one released, or one taken by another organization).
    pub status: &'static str,
    /// The holder (`verified`), the claimant (`pending`), or those organizations (`unverified`).
    pub org_ids: Vec<String>,
    /// `verified`: dns, https, operator or existing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) method: Option<&'static str>,
    /// `verified`: since when; `pending`: when claimed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) since: Option<Millis>,
}

/// Who holds which name, what is pending, and which names agents use that nobody holds: of
/// every organization, or of one.
pub async fn list(
    store: &SharedStore,
    keys: &KeyRing,
    org: Option<&OrgRecord>,
) -> Result<Vec<Listed>, AdminError> {
    let org_id = org.map(|o| &o.id);
    let mut out: Vec<Listed> = store
        .holdings(&Rules::new(keys), org_id)
        .await?
        .into_iter()
        .map(|h| Listed {
            domain: h.domain,
            status: "verified",
            org_ids: vec![h.org_id],
            method: Some(h.method.as_str()),
            since: Some(h.at),
        })
        .collect();
    if let Some(org) = org {
        for c in store.domain_claims(&org.id).await? {
            out.push(Listed {
                domain: c.domain,
                status: "pending",
                org_ids: vec![c.org_id],
                method: None,
                since: Some(c.created_at),
            });
        }
    }
    // Names in use that no holding covers for the organizations using them.
    let all = store.holdings(&Rules::new(keys), None).await?;
    let mut unheld: Vec<Listed> = Vec::new();
    for (domain, user) in store.issuer_domains_in_use(org_id).await? {
        let covered = all
            .iter()
            .any(|h| h.org_id == user && agentid_core::domain::holding::covers(h, &domain));
        if covered {
            continue;
        }
        match unheld.iter_mut().find(|l| l.domain == domain) {
            Some(l) => l.org_ids.push(user),
            None => unheld.push(Listed {
                domain,
                status: "unverified",
                org_ids: vec![user],
                method: None,
                since: None,
            }),
        }
    }
    out.extend(unheld);
    out.sort_by(|a, b| (&a.domain, a.status).cmp(&(&b.domain, b.status)));
    Ok(out)
}

/// `audit verify`'s check of the issuer-domain holdings: events numbered 1, 2, 3 … with no
/// gap, each vouched for by the key file (or carried over by the migration, before the event
/// that closed what it carried over), and at no point two organizations covering one name.
/// Each failure, in words.
pub async fn check_holdings(store: &SharedStore, keys: &KeyRing) -> Result<Vec<String>, AdminError> {
    use agentid_core::domain::holding::{self, EventKind};
    let events = store.domain_events().await?;
    let migrated = events
        .iter()
        .flatten()
        .find(|e| e.kind == EventKind::Migrated && e.seq >= 1)
        .map(|e| e.seq);
    let mut failures = Vec::new();
    let mut held: Vec<holding::Holding> = Vec::new();
    for (i, e) in events.iter().enumerate() {
        let e = match e {
            Ok(e) => e,
            Err(u) => {
                failures.push(format!(
                    "issuer-domain event {} ({}): {}; it counts for nothing",
                    u.seq, u.commitment_id, u.why
                ));
                continue;
            }
        };
        if Some(e.seq) != i64::try_from(i).ok().and_then(|i| i.checked_add(1)) {
            failures.push(format!(
                "issuer-domain event {}: expected {} (an event is missing)",
                e.seq,
                i + 1
            ));
        }
        if !keys.vouches_for_domain_event(e, migrated) {
            failures.push(format!(
                "issuer-domain event {} ({}): the key file does not vouch for it (written with \
                 database access alone, or altered); it counts for nothing",
                e.seq,
                e.commitment_id()
            ));
            continue;
        }
        held.retain(|h| h.domain != e.domain);
        if let Some(h) = e.holding() {
            if let Some(other) = held.iter().find(|o| {
                o.org_id != h.org_id && (holding::covers(o, &h.domain) || holding::covers(&h, &o.domain))
            }) {
                failures.push(format!(
                    "issuer-domain event {}: {} held by {} while {} holds {}",
                    e.seq, h.domain, h.org_id, other.org_id, other.domain
                ));
            }
            held.push(h);
        }
    }
    Ok(failures)
}
