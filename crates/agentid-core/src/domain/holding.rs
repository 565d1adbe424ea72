//! Who may issue under an issuer domain: the holdings of names, as a list of events (a name
//! held, a holding ended), and the rules of coverage and of a name changing hands.
//!
//! A DNS proof (and an operator's grant) covers the name and every name below it; an HTTPS
//! proof, and a holding carried over from before names were proven, cover exactly the name.
//! At no moment do two organizations cover one name: a proof that would make them does not
//! succeed, or ends the other organization's holdings (and revokes its agents under them).

use serde::Serialize;

use super::{IssuerDomain, Millis, ValidationError};

/// How an organization came to hold a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProofMethod {
    /// A TXT record at `_agentid-challenge.<name>`: the name and every name below it.
    Dns,
    /// A file at `https://<name>/.well-known/agentid-domain-verification`: that host alone.
    Https,
    /// Granted by the operator (`agentid domain approve`): the name and every name below it.
    Operator,
    /// The organization's agents used the name before names were proven, and no other
    /// organization's did: that name alone.
    Existing,
}

impl ProofMethod {
    pub const ALL: [ProofMethod; 4] = [
        ProofMethod::Dns,
        ProofMethod::Https,
        ProofMethod::Operator,
        ProofMethod::Existing,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ProofMethod::Dns => "dns",
            ProofMethod::Https => "https",
            ProofMethod::Operator => "operator",
            ProofMethod::Existing => "existing",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.as_str() == s)
    }

    /// Whether a holding by this method also covers the names below its name.
    pub(crate) fn covers_below(self) -> bool {
        matches!(self, ProofMethod::Dns | ProofMethod::Operator)
    }
}

/// What an event of the holdings list records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// An organization holds the name from now on.
    Hold,
    /// The name's holding ends (released, or taken by another organization).
    Release,
    /// Closes the holdings the migration carried over (unsealed: written in SQL, without
    /// the key file). Nothing unsealed after it counts.
    Migrated,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Hold => "hold",
            EventKind::Release => "release",
            EventKind::Migrated => "migrated",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [EventKind::Hold, EventKind::Release, EventKind::Migrated]
            .into_iter()
            .find(|k| k.as_str() == s)
    }
}

/// One event of the holdings list, as stored. The list is append-only; `seq` runs 1, 2, 3 …
/// A name's holder is the organization of its latest event when that event is a `Hold`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainEvent {
    pub seq: i64,
    pub kind: EventKind,
    /// Empty for `Migrated`.
    pub domain: String,
    /// Empty for `Migrated`.
    pub org_id: String,
    /// For `Hold`.
    pub method: Option<ProofMethod>,
    pub at: Millis,
    /// For `Hold`: when the organization claimed the name (`at` for grants).
    pub claimed_at: Millis,
    /// For `Release`: why.
    pub reason: Option<String>,
    /// HMAC-SHA-256 of [`DomainEvent::canonical`] under a key derived from the key file;
    /// `None` only for what the migration carried over.
    pub mac: Option<[u8; 32]>,
}

/// The members of an event that its MAC covers, in this order (serde keeps it).
#[derive(Serialize)]
struct Canonical<'a> {
    seq: i64,
    kind: &'a str,
    domain: &'a str,
    org_id: &'a str,
    method: Option<&'a str>,
    at: i64,
    claimed_at: i64,
    reason: Option<&'a str>,
}

impl DomainEvent {
    /// A hold of `domain` by `org_id`, not yet numbered nor sealed.
    pub fn hold(domain: &str, org_id: &str, method: ProofMethod, at: Millis, claimed_at: Millis) -> Self {
        DomainEvent {
            seq: 0,
            kind: EventKind::Hold,
            domain: domain.to_owned(),
            org_id: org_id.to_owned(),
            method: Some(method),
            at,
            claimed_at,
            reason: None,
            mac: None,
        }
    }

    /// The end of `org_id`'s holding of `domain`, for `reason`, not yet numbered nor sealed.
    pub fn release(domain: &str, org_id: &str, at: Millis, reason: &str) -> Self {
        DomainEvent {
            seq: 0,
            kind: EventKind::Release,
            domain: domain.to_owned(),
            org_id: org_id.to_owned(),
            method: None,
            at,
            claimed_at: at,
            reason: Some(reason.to_owned()),
            mac: None,
        }
    }

    /// The bytes its MAC is computed over: JSON of every member but the MAC, in a fixed order.
    pub fn canonical(&self) -> Vec<u8> {
        serde_json::to_vec(&Canonical {
            seq: self.seq,
            kind: self.kind.as_str(),
            domain: &self.domain,
            org_id: &self.org_id,
            method: self.method.map(ProofMethod::as_str),
            at: self.at.0,
            claimed_at: self.claimed_at.0,
            reason: self.reason.as_deref(),
        })
        .expect("an event serializes")
    }

    /// The entry a checkpoint's `agentid-domains` list commits to: `<seq> <kind> <domain>
    /// <org_id> <method>` (`-` for what an event lacks), with `at`.
    pub fn commitment_id(&self) -> String {
        commitment_id(
            self.seq,
            self.kind.as_str(),
            &self.domain,
            &self.org_id,
            self.method.map(ProofMethod::as_str),
        )
    }

    /// The holding this event starts, if it is a hold.
    pub fn holding(&self) -> Option<Holding> {
        match (self.kind, self.method) {
            (EventKind::Hold, Some(method)) => Some(Holding {
                seq: self.seq,
                domain: self.domain.clone(),
                org_id: self.org_id.clone(),
                method,
                at: self.at,
                claimed_at: self.claimed_at,
            }),
            _ => None,
        }
    }
}

/// The entry a checkpoint's `agentid-domains` list commits to, of an event's stored columns
/// as they are (an event that does not read is committed to as well: undoing it is caught too).
pub fn commitment_id(seq: i64, kind: &str, domain: &str, org_id: &str, method: Option<&str>) -> String {
    let dash = |s: &str| {
        if s.is_empty() {
            "-".to_owned()
        } else {
            s.to_owned()
        }
    };
    format!(
        "{seq} {} {} {} {}",
        dash(kind),
        dash(domain),
        dash(org_id),
        method.map_or_else(|| "-".to_owned(), dash)
    )
}

/// A stored issuer-domain event that does not read as one the service writes (an unknown
/// kind or method, a MAC of the wrong length): it counts for nothing, and is an alarm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnreadEvent {
    pub seq: i64,
    /// What a checkpoint commits to of it (`commitment_id` of its columns).
    pub commitment_id: String,
    pub at: Millis,
    pub why: String,
}

/// A name an organization holds now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holding {
    /// The event that started it.
    pub seq: i64,
    pub domain: String,
    pub org_id: String,
    pub method: ProofMethod,
    /// When it was proven (or granted).
    pub at: Millis,
    pub claimed_at: Millis,
}

/// The holdings in force, given each name's events in order: a name's latest event, when it
/// is a hold.
pub fn current<'a>(events: impl IntoIterator<Item = &'a DomainEvent>) -> Vec<Holding> {
    let mut latest: std::collections::BTreeMap<&str, &DomainEvent> = std::collections::BTreeMap::new();
    for e in events {
        if e.kind == EventKind::Migrated {
            continue;
        }
        match latest.get(e.domain.as_str()) {
            Some(prev) if prev.seq > e.seq => {}
            _ => {
                latest.insert(&e.domain, e);
            }
        }
    }
    latest.values().filter_map(|e| e.holding()).collect()
}

/// A name to claim or prove: parsed like an issuer domain, lower-cased.
pub fn parse_name(field: &'static str, s: &str) -> Result<IssuerDomain, ValidationError> {
    IssuerDomain::parse(s).map_err(|e| ValidationError::new(field, e.message))
}

/// The name and every name above it: `eu.bank.example`, `bank.example`, `example`.
pub fn name_and_parents(name: &str) -> Vec<String> {
    let mut out = vec![name.to_owned()];
    let mut rest = name;
    while let Some((_, parent)) = rest.split_once('.') {
        out.push(parent.to_owned());
        rest = parent;
    }
    out
}

/// Whether `name` is `ancestor` or below it.
pub(crate) fn is_at_or_below(name: &str, ancestor: &str) -> bool {
    name == ancestor
        || name
            .strip_suffix(ancestor)
            .is_some_and(|head| head.ends_with('.'))
}

/// Whether holding `h` covers `name`.
pub fn covers(h: &Holding, name: &str) -> bool {
    h.domain == name || (h.method.covers_below() && is_at_or_below(name, &h.domain))
}

/// Why an organization may not issue under a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotCovered {
    /// Nothing the organization holds covers it.
    Unproven,
    /// Another organization's holding covers it.
    HeldElsewhere,
}

/// Whether `org` may issue under `name`, given the holdings of `name` and its parents: one
/// of its holdings covers the name, and no other organization's does.
pub fn may_issue(org: &str, name: &str, holdings: &[Holding]) -> Result<(), NotCovered> {
    let mut mine = false;
    for h in holdings.iter().filter(|h| covers(h, name)) {
        if h.org_id != org {
            return Err(NotCovered::HeldElsewhere);
        }
        mine = true;
    }
    if mine {
        Ok(())
    } else {
        Err(NotCovered::Unproven)
    }
}

/// How a name is to be held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// The organization's own fresh proof.
    Proof(ProofMethod),
    /// The operator's grant; `force` takes the name from another organization.
    Operator { force: bool },
}

impl Grant {
    pub fn method(self) -> ProofMethod {
        match self {
            Grant::Proof(m) => m,
            Grant::Operator { .. } => ProofMethod::Operator,
        }
    }
}

/// What holding a name changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoldPlan {
    /// Holdings that end: another organization's that the new one covers, and the
    /// organization's own holding of the name, which the new one replaces.
    pub ends: Vec<Holding>,
    /// Other organizations' agents under these names are revoked: `(name, with the names
    /// below it)`.
    pub revokes: (String, bool),
}

/// Why a name cannot be held as asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HoldRefused {
    #[error(
        "{name} lies below {parent}, which another organization holds by {method}: prove {parent} \
         itself (by DNS) to hold the names below it"
    )]
    UnderParent {
        name: String,
        parent: String,
        method: &'static str,
    },
    #[error(
        "another organization holds {name} by {method}, which covers the names below it too; an \
         HTTPS proof covers one host and cannot take it: prove it by DNS"
    )]
    NeedsDns { name: String, method: &'static str },
    #[error("organization {org} holds {name} (by {method}); --force takes it from them and revokes their agents under it")]
    HeldWithoutForce {
        name: String,
        org: String,
        method: &'static str,
    },
}

/// What `org` holding `name` as `grant` says changes, given every holding of `name`, of its
/// parents and of the names below it; or why it may not.
pub fn plan_hold(org: &str, name: &str, grant: Grant, related: &[Holding]) -> Result<HoldPlan, HoldRefused> {
    let method = grant.method();
    let operator_without_force = matches!(grant, Grant::Operator { force: false });
    let mut ends = Vec::new();
    for h in related {
        let mine = h.org_id == org;
        if h.domain == name {
            if !mine && h.method.covers_below() && method == ProofMethod::Https {
                return Err(HoldRefused::NeedsDns {
                    name: name.to_owned(),
                    method: h.method.as_str(),
                });
            }
            if !mine && operator_without_force {
                return Err(HoldRefused::HeldWithoutForce {
                    name: name.to_owned(),
                    org: h.org_id.clone(),
                    method: h.method.as_str(),
                });
            }
            ends.push(h.clone());
        } else if is_at_or_below(name, &h.domain) {
            // A parent: another organization's subtree holding covers the name, whoever asks.
            if !mine && h.method.covers_below() {
                return Err(HoldRefused::UnderParent {
                    name: name.to_owned(),
                    parent: h.domain.clone(),
                    method: h.method.as_str(),
                });
            }
        } else if is_at_or_below(&h.domain, name) && !mine && method.covers_below() {
            // Below: the new holding covers it.
            if operator_without_force {
                return Err(HoldRefused::HeldWithoutForce {
                    name: h.domain.clone(),
                    org: h.org_id.clone(),
                    method: h.method.as_str(),
                });
            }
            ends.push(h.clone());
        }
    }
    Ok(HoldPlan {
        ends,
        revokes: (name.to_owned(), method.covers_below()),
    })
}

/// The reason other organizations' agents are revoked with when a name they issued under
/// changes hands.
pub const TAKEN_REASON: &str = "issuer domain verified by another organization";

#[cfg(test)]
mod tests {
    use super::*;

    fn h(domain: &str, org: &str, method: ProofMethod) -> Holding {
        Holding {
            seq: 1,
            domain: domain.into(),
            org_id: org.into(),
            method,
            at: Millis(1),
            claimed_at: Millis(1),
        }
    }

    #[test]
    fn names_and_their_parents() {
        assert_eq!(
            name_and_parents("eu.bank.example"),
            ["eu.bank.example", "bank.example", "example"]
        );
        assert!(is_at_or_below("eu.bank.example", "bank.example"));
        assert!(is_at_or_below("bank.example", "bank.example"));
        assert!(!is_at_or_below("evilbank.example", "bank.example"));
        assert!(!is_at_or_below("bank.example", "eu.bank.example"));
    }

    #[test]
    fn what_each_method_covers() {
        let dns = h("bank.example", "a", ProofMethod::Dns);
        let https = h("bank.example", "a", ProofMethod::Https);
        for held in [&dns, &https] {
            assert!(covers(held, "bank.example"));
            assert!(!covers(held, "evilbank.example"));
        }
        assert!(covers(&dns, "eu.bank.example"));
        assert!(!covers(&https, "eu.bank.example"));
        assert!(covers(
            &h("bank.example", "a", ProofMethod::Operator),
            "x.eu.bank.example"
        ));
        assert!(!covers(
            &h("bank.example", "a", ProofMethod::Existing),
            "eu.bank.example"
        ));
    }

    #[test]
    fn only_the_holder_issues() {
        let held = [h("bank.example", "a", ProofMethod::Dns)];
        assert_eq!(may_issue("a", "eu.bank.example", &held), Ok(()));
        assert_eq!(
            may_issue("b", "eu.bank.example", &held),
            Err(NotCovered::HeldElsewhere)
        );
        assert_eq!(may_issue("b", "other.example", &held), Err(NotCovered::Unproven));
        // Two covering holdings of two organizations (a state the rules never make): nobody.
        let both = [
            h("bank.example", "a", ProofMethod::Dns),
            h("eu.bank.example", "b", ProofMethod::Https),
        ];
        assert_eq!(
            may_issue("a", "eu.bank.example", &both),
            Err(NotCovered::HeldElsewhere)
        );
        assert_eq!(
            may_issue("b", "eu.bank.example", &both),
            Err(NotCovered::HeldElsewhere)
        );
    }

    #[test]
    fn a_proof_takes_what_it_covers_from_others() {
        let related = [
            h("bank.example", "a", ProofMethod::Https),
            h("eu.bank.example", "a", ProofMethod::Dns),
            h("us.bank.example", "b", ProofMethod::Https),
        ];
        let plan = plan_hold("b", "bank.example", Grant::Proof(ProofMethod::Dns), &related).unwrap();
        assert_eq!(plan.ends, vec![related[0].clone(), related[1].clone()]);
        assert_eq!(plan.revokes, ("bank.example".to_owned(), true));
        // By HTTPS: that host alone.
        let plan = plan_hold("b", "bank.example", Grant::Proof(ProofMethod::Https), &related).unwrap();
        assert_eq!(plan.ends, vec![related[0].clone()]);
        assert_eq!(plan.revokes, ("bank.example".to_owned(), false));
    }

    #[test]
    fn a_dns_holding_is_taken_only_by_dns() {
        let related = [h("bank.example", "a", ProofMethod::Dns)];
        assert!(matches!(
            plan_hold("b", "bank.example", Grant::Proof(ProofMethod::Https), &related),
            Err(HoldRefused::NeedsDns { .. })
        ));
        assert!(plan_hold("b", "bank.example", Grant::Proof(ProofMethod::Dns), &related).is_ok());
        // Below a DNS-held parent, nothing another organization proves counts.
        for m in [ProofMethod::Dns, ProofMethod::Https] {
            assert!(matches!(
                plan_hold("b", "eu.bank.example", Grant::Proof(m), &related),
                Err(HoldRefused::UnderParent { .. })
            ));
        }
        assert!(matches!(
            plan_hold("b", "eu.bank.example", Grant::Operator { force: true }, &related),
            Err(HoldRefused::UnderParent { .. })
        ));
        // The holder's own proofs below it are its own business.
        assert!(plan_hold("a", "eu.bank.example", Grant::Proof(ProofMethod::Https), &related).is_ok());
    }

    #[test]
    fn the_operator_takes_a_name_only_with_force() {
        let related = [
            h("bank.example", "a", ProofMethod::Https),
            h("eu.bank.example", "c", ProofMethod::Https),
        ];
        assert!(matches!(
            plan_hold(
                "b",
                "bank.example",
                Grant::Operator { force: false },
                &related[..1]
            ),
            Err(HoldRefused::HeldWithoutForce { .. })
        ));
        assert!(matches!(
            plan_hold(
                "b",
                "bank.example",
                Grant::Operator { force: false },
                &related[1..]
            ),
            Err(HoldRefused::HeldWithoutForce { .. })
        ));
        let plan = plan_hold("b", "bank.example", Grant::Operator { force: true }, &related).unwrap();
        assert_eq!(plan.ends.len(), 2);
        // Granting a name nobody else holds needs no force; the holder's own is replaced.
        let mine = [h("bank.example", "b", ProofMethod::Https)];
        let plan = plan_hold("b", "bank.example", Grant::Operator { force: false }, &mine).unwrap();
        assert_eq!(plan.ends, mine.to_vec());
    }

    #[test]
    fn the_latest_event_of_a_name_says_who_holds_it() {
        let ev = |seq, kind, domain: &str, org: &str| DomainEvent {
            seq,
            kind,
            domain: domain.into(),
            org_id: org.into(),
            method: (kind == EventKind::Hold).then_some(ProofMethod::Dns),
            at: Millis(seq),
            claimed_at: Millis(seq),
            reason: None,
            mac: None,
        };
        let events = [
            ev(1, EventKind::Migrated, "", ""),
            ev(2, EventKind::Hold, "a.example", "a"),
            ev(3, EventKind::Hold, "b.example", "a"),
            ev(4, EventKind::Release, "a.example", "a"),
            ev(5, EventKind::Hold, "a.example", "b"),
            ev(6, EventKind::Release, "b.example", "a"),
        ];
        let now = current(&events);
        assert_eq!(now.len(), 1);
        assert_eq!(
            (now[0].domain.as_str(), now[0].org_id.as_str()),
            ("a.example", "b")
        );
        assert_eq!(events[1].commitment_id(), "2 hold a.example a dns");
        assert_eq!(events[0].commitment_id(), "1 migrated - - -");
        // The canonical bytes change with every member.
        let mut other = events[1].clone();
        other.org_id = "b".into();
        assert_ne!(other.canonical(), events[1].canonical());
    }
}
