//! The SQL of `crate::agent_rows` for one backend: `DB` is its database.

use crate::AgentRecord;

use super::DB;

/// The `INSERT` of an agent (alone, or inside a placement's transaction).
pub fn insert_agent<'q>(
    sql: &'q str,
    a: &'q AgentRecord,
    scopes: &'q str,
) -> sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments<'q>> {
    sqlx::query(sql)
        .bind(a.id.as_str())
        .bind(a.org_id.as_str())
        .bind(a.mode.as_str())
        .bind(a.name.as_str())
        .bind(a.issuer_domain.as_str())
        .bind(a.description.as_str())
        .bind(scopes)
        .bind(a.created_at.0)
        .bind(a.issued_at.0)
        .bind(a.expires_at.0)
        .bind(a.revoked_at.map(|m| m.0))
        .bind(a.revocation_reason.as_deref())
        .bind(a.status.as_ref().map(|p| p.list.as_str()))
        .bind(a.status.as_ref().map(|p| p.idx as i64))
        .bind(a.jkt.as_deref())
        .bind(a.jwk.as_deref())
        .bind(a.key_mac.map(Vec::from))
        .bind(a.key_sealed_at.map(|m| m.0))
}
