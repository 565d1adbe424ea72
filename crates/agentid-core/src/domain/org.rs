//! Organizations, plans and their limits, API key kinds and the test/live split.

use super::ValidationError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Plan {
    Free,
    Developer,
    Growth,
    Enterprise,
}

const DAY: u64 = 86_400;

impl Plan {
    pub const ALL: [Plan; 4] = [Plan::Free, Plan::Developer, Plan::Growth, Plan::Enterprise];

    pub fn as_str(self) -> &'static str {
        match self {
            Plan::Free => "free",
            Plan::Developer => "developer",
            Plan::Growth => "growth",
            Plan::Enterprise => "enterprise",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == s)
    }

    /// The spec's table. Enterprise has no defaults: its limits are set per organization.
    pub fn default_limits(self) -> Option<OrgLimits> {
        let (verify, other, max_expiry) = match self {
            Plan::Free => (500, 60, DAY),
            Plan::Developer => (5_000, 500, 90 * DAY),
            Plan::Growth => (50_000, 2_000, 90 * DAY),
            Plan::Enterprise => return None,
        };
        Some(OrgLimits {
            verify_per_minute: verify,
            other_per_minute: other,
            max_expiry_seconds: max_expiry,
        })
    }

    /// Enterprise's maximum token lifetime: one year.
    pub(crate) const ENTERPRISE_MAX_EXPIRY: u64 = 365 * DAY;

    /// The longest token lifetime the spec's table allows on this plan.
    pub(crate) fn max_expiry_seconds(self) -> u64 {
        self.default_limits()
            .map_or(Self::ENTERPRISE_MAX_EXPIRY, |l| l.max_expiry_seconds)
    }
}

/// The limits an organization runs under (plan defaults, or enterprise custom values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OrgLimits {
    pub verify_per_minute: u32,
    pub other_per_minute: u32,
    pub max_expiry_seconds: u64,
}

impl OrgLimits {
    /// The limits of `plan` with the values an operator named. Only enterprise takes custom
    /// values, as the spec's tables say: it must name both rate limits, and may shorten its
    /// one-year token maximum. On the other plans a named value must be the table's.
    pub fn resolve(
        plan: Plan,
        verify: Option<u32>,
        other: Option<u32>,
        max_expiry: Option<u64>,
    ) -> Result<OrgLimits, ValidationError> {
        if let Some(table) = plan.default_limits() {
            let named = [
                (
                    "verify_limit",
                    verify.map(u64::from),
                    table.verify_per_minute.into(),
                ),
                ("other_limit", other.map(u64::from), table.other_per_minute.into()),
                ("max_expiry_seconds", max_expiry, table.max_expiry_seconds),
            ];
            for (field, value, fixed) in named {
                if value.is_some_and(|v| v != fixed) {
                    return Err(ValidationError::new(
                        field,
                        format!(
                            "the {} plan's is {fixed}; only the enterprise plan takes custom limits",
                            plan.as_str()
                        ),
                    ));
                }
            }
            return Ok(table);
        }
        let verify = verify.ok_or_else(|| {
            ValidationError::new("verify_limit", "the enterprise plan needs a custom verify limit")
        })?;
        let other = other.ok_or_else(|| {
            ValidationError::new(
                "other_limit",
                "the enterprise plan needs a custom limit for other endpoints",
            )
        })?;
        let max_expiry = max_expiry.unwrap_or(Plan::ENTERPRISE_MAX_EXPIRY);
        if verify == 0 || other == 0 {
            return Err(ValidationError::new("limits", "rate limits must be positive"));
        }
        if max_expiry == 0 || max_expiry > Plan::ENTERPRISE_MAX_EXPIRY {
            return Err(ValidationError::new(
                "max_expiry_seconds",
                format!(
                    "must be from 1 to {} (one year, the enterprise plan's maximum)",
                    Plan::ENTERPRISE_MAX_EXPIRY
                ),
            ));
        }
        Ok(OrgLimits {
            verify_per_minute: verify,
            other_per_minute: other,
            max_expiry_seconds: max_expiry,
        })
    }
}

impl OrgLimits {
    /// The limits an organization on `plan` runs under, given what is stored: the spec's
    /// table on every plan but enterprise, and never a token maximum over the plan's (rows
    /// written before custom limits became enterprise-only may hold other values; they are
    /// not enforced).
    pub fn in_force(plan: Plan, stored: OrgLimits) -> OrgLimits {
        plan.default_limits().unwrap_or(OrgLimits {
            max_expiry_seconds: stored.max_expiry_seconds.min(plan.max_expiry_seconds()),
            ..stored
        })
    }

    /// The limits after a change of plan or limits (`agentid org set-limits`): an
    /// enterprise organization that stays enterprise keeps the custom limits it does not
    /// name; any other takes the new plan's (only enterprise has custom ones).
    pub fn change(
        current_plan: Plan,
        current: OrgLimits,
        plan: Option<Plan>,
        verify: Option<u32>,
        other: Option<u32>,
        max_expiry: Option<u64>,
    ) -> Result<(Plan, OrgLimits), ValidationError> {
        let new_plan = plan.unwrap_or(current_plan);
        let keep_custom = new_plan == current_plan && new_plan == Plan::Enterprise;
        fn keep<T>(keep_custom: bool, current: T, named: Option<T>) -> Option<T> {
            named.or(keep_custom.then_some(current))
        }
        let limits = OrgLimits::resolve(
            new_plan,
            keep(keep_custom, current.verify_per_minute, verify),
            keep(keep_custom, current.other_per_minute, other),
            keep(keep_custom, current.max_expiry_seconds, max_expiry),
        )?;
        Ok((new_plan, limits))
    }
}

/// Secret keys act for the issuer; publishable keys only identify a receiver on verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ApiKeyKind {
    Secret,
    Publishable,
}

impl ApiKeyKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ApiKeyKind::Secret => "secret",
            ApiKeyKind::Publishable => "publishable",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "secret" => Some(ApiKeyKind::Secret),
            "publishable" => Some(ApiKeyKind::Publishable),
            _ => None,
        }
    }

    fn letter(self) -> &'static str {
        match self {
            ApiKeyKind::Secret => "sk",
            ApiKeyKind::Publishable => "pk",
        }
    }
}

/// Test and live data never meet: each agent and each log record belongs to one mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KeyMode {
    Live,
    Test,
}

impl KeyMode {
    pub fn as_str(self) -> &'static str {
        match self {
            KeyMode::Live => "live",
            KeyMode::Test => "test",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "live" => Some(KeyMode::Live),
            "test" => Some(KeyMode::Test),
            _ => None,
        }
    }
}

/// The prefix a key of this kind and mode carries (`sk_live_`, `pk_test_`, …).
pub fn key_prefix(kind: ApiKeyKind, mode: KeyMode) -> String {
    format!("{}_{}_", kind.letter(), mode.as_str())
}

/// Parses the prefix of a presented key. The rest is opaque and only ever hashed.
pub fn parse_key_prefix(key: &str) -> Option<(ApiKeyKind, KeyMode)> {
    [ApiKeyKind::Secret, ApiKeyKind::Publishable]
        .into_iter()
        .flat_map(|k| [(k, KeyMode::Live), (k, KeyMode::Test)])
        .find(|(k, m)| key.starts_with(&key_prefix(*k, *m)))
}

/// One hash chain of the audit log: an organization's live or test records, or the
/// service's own chain (`org_id` empty) for tokens that name no known agent.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ledger {
    pub org_id: String,
    pub mode: KeyMode,
}

impl Ledger {
    pub fn service() -> Self {
        Ledger {
            org_id: String::new(),
            mode: KeyMode::Live,
        }
    }

    pub fn is_service(&self) -> bool {
        self.org_id.is_empty()
    }

    /// The name of this ledger in checkpoints: `<host>/agentid/<org_id>/<mode>`, with
    /// `service` for the service's own ledger (no organization id is that word).
    pub fn origin(&self, host: &str) -> String {
        format!("{host}/agentid/{}/{}", self.org_name(), self.mode.as_str())
    }

    /// The ledger a checkpoint origin names, whatever its host.
    pub fn from_origin(origin: &str) -> Option<Ledger> {
        let mut parts = origin.rsplitn(4, '/');
        let (mode, org, app) = (parts.next()?, parts.next()?, parts.next()?);
        if app != "agentid" || parts.next().is_none_or(str::is_empty) || org.is_empty() {
            return None;
        }
        Some(Ledger {
            org_id: if org == "service" {
                String::new()
            } else {
                org.to_owned()
            },
            mode: KeyMode::parse(mode)?,
        })
    }

    fn org_name(&self) -> &str {
        if self.is_service() {
            "service"
        } else {
            &self.org_id
        }
    }
}

impl std::fmt::Display for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.org_name(), self.mode.as_str())
    }
}

/// Why an agent was revoked: optional, at most 512 characters, no control characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevokeReason(String);

impl RevokeReason {
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        if s.chars().count() > super::fields::REVOKE_REASON.max() {
            return Err(ValidationError::new(
                "reason",
                super::fields::REVOKE_REASON.too_long(),
            ));
        }
        if s.chars().any(char::is_control) {
            return Err(ValidationError::new(
                "reason",
                "must not contain control characters",
            ));
        }
        Ok(RevokeReason(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_prefixes_round_trip() {
        for k in [ApiKeyKind::Secret, ApiKeyKind::Publishable] {
            for m in [KeyMode::Live, KeyMode::Test] {
                let key = format!("{}abc", key_prefix(k, m));
                assert_eq!(parse_key_prefix(&key), Some((k, m)));
            }
        }
        assert_eq!(parse_key_prefix("xk_live_abc"), None);
        assert_eq!(key_prefix(ApiKeyKind::Secret, KeyMode::Live), "sk_live_");
    }

    #[test]
    fn plan_limits_follow_the_spec() {
        let free = Plan::Free.default_limits().unwrap();
        assert_eq!(
            (
                free.verify_per_minute,
                free.other_per_minute,
                free.max_expiry_seconds
            ),
            (500, 60, 86_400)
        );
        let growth = Plan::Growth.default_limits().unwrap();
        assert_eq!(
            (growth.verify_per_minute, growth.other_per_minute),
            (50_000, 2_000)
        );
        assert_eq!(growth.max_expiry_seconds, 90 * 86_400);
        let developer = Plan::Developer.default_limits().unwrap();
        assert_eq!(
            (
                developer.verify_per_minute,
                developer.other_per_minute,
                developer.max_expiry_seconds
            ),
            (5_000, 500, 90 * 86_400)
        );
        assert!(OrgLimits::resolve(Plan::Enterprise, None, None, None).is_err());
        let ent = OrgLimits::resolve(Plan::Enterprise, Some(10), Some(5), None).unwrap();
        assert_eq!(ent.max_expiry_seconds, 365 * 86_400);
        assert_eq!(Plan::Enterprise.max_expiry_seconds(), 365 * 86_400);
    }

    /// Only enterprise takes custom values, and never a token longer than a year.
    #[test]
    fn only_enterprise_takes_custom_limits_within_the_spec() {
        let ent = |e| OrgLimits::resolve(Plan::Enterprise, Some(10), Some(5), e);
        assert_eq!(ent(Some(3_600)).unwrap().max_expiry_seconds, 3_600);
        assert_eq!(ent(Some(365 * 86_400)).unwrap().max_expiry_seconds, 365 * 86_400);
        for bad in [0, 365 * 86_400 + 1] {
            let err = ent(Some(bad)).unwrap_err();
            assert!(err.to_string().contains("max_expiry_seconds"), "{err}");
        }
        // The table's own values may be named; any other is refused, by field.
        let table = Plan::Free.default_limits().unwrap();
        assert_eq!(
            OrgLimits::resolve(Plan::Free, Some(500), Some(60), Some(86_400)).unwrap(),
            table
        );
        for (v, o, e, field) in [
            (Some(501), None, None, "verify_limit"),
            (None, Some(1), None, "other_limit"),
            (None, None, Some(2 * 86_400), "max_expiry_seconds"),
            (None, None, Some(3_600), "max_expiry_seconds"),
        ] {
            let err = OrgLimits::resolve(Plan::Free, v, o, e).unwrap_err();
            assert!(err.to_string().contains(field), "{err}");
        }
        for plan in [Plan::Developer, Plan::Growth] {
            assert!(OrgLimits::resolve(plan, None, None, Some(365 * 86_400)).is_err());
            assert_eq!(plan.max_expiry_seconds(), 90 * 86_400);
        }
    }
}
