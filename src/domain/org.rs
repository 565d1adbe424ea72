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
    pub const ENTERPRISE_MAX_EXPIRY: u64 = 365 * DAY;
}

/// The limits an organization runs under (plan defaults, or enterprise custom values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OrgLimits {
    pub verify_per_minute: u32,
    pub other_per_minute: u32,
    pub max_expiry_seconds: u64,
}

impl OrgLimits {
    /// Plan defaults overridden by explicit values; enterprise must name its rate limits.
    pub fn resolve(
        plan: Plan,
        verify: Option<u32>,
        other: Option<u32>,
        max_expiry: Option<u64>,
    ) -> Result<OrgLimits, ValidationError> {
        let base = plan.default_limits();
        let verify = verify.or(base.map(|b| b.verify_per_minute)).ok_or_else(|| {
            ValidationError::new("verify_limit", "the enterprise plan needs a custom verify limit")
        })?;
        let other = other.or(base.map(|b| b.other_per_minute)).ok_or_else(|| {
            ValidationError::new(
                "other_limit",
                "the enterprise plan needs a custom limit for other endpoints",
            )
        })?;
        let max_expiry = max_expiry
            .or(base.map(|b| b.max_expiry_seconds))
            .unwrap_or(Plan::ENTERPRISE_MAX_EXPIRY);
        if verify == 0 || other == 0 {
            return Err(ValidationError::new("limits", "rate limits must be positive"));
        }
        if max_expiry == 0 {
            return Err(ValidationError::new("max_expiry_seconds", "must be positive"));
        }
        Ok(OrgLimits {
            verify_per_minute: verify,
            other_per_minute: other,
            max_expiry_seconds: max_expiry,
        })
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
}

/// Why an agent was revoked: optional, at most 512 characters, no control characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevokeReason(String);

impl RevokeReason {
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        if s.chars().count() > 512 {
            return Err(ValidationError::new("reason", "must be at most 512 characters"));
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
        assert!(OrgLimits::resolve(Plan::Enterprise, None, None, None).is_err());
        let ent = OrgLimits::resolve(Plan::Enterprise, Some(10), Some(5), None).unwrap();
        assert_eq!(ent.max_expiry_seconds, 365 * 86_400);
    }
}
