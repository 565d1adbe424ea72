//! `GET /v1/log`: the caller's audit records, newest first, with cursor pagination.

use actix_web::{web, HttpResponse};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::auth::Issuer;
use super::context::AppState;
use super::cursor::{self, CursorScope};
use super::error::{ApiError, ErrorBody, ErrorCode};
use crate::domain::{AgentId, Ledger, Millis, ValidationError, VerifyResult};
use crate::store::LogQuery;

pub const DEFAULT_LIMIT: u32 = 50;
pub const MAX_LIMIT: u32 = 200;

/// Query parameters, kept as text so that each bad value gets its own clear error.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct LogParams {
    /// Page size, 1 to 200 (default 50).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 200)]
    limit: Option<String>,
    /// Opaque cursor from the previous page's `pagination.cursor`.
    cursor: Option<String>,
    /// Only records of this agent (agt_…).
    agent_id: Option<String>,
    /// Only records with this result.
    #[param(value_type = Option<LogResult>)]
    result: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum LogResult {
    Valid,
    Invalid,
    Expired,
    Revoked,
}

/// One verification.
#[derive(Serialize, ToSchema)]
pub struct Record {
    #[schema(pattern = "^log_[0-9a-z]{26}$")]
    id: String,
    agent_id: String,
    result: LogResult,
    /// Present on failed verifications, absent on valid ones.
    #[serde(skip_serializing_if = "Option::is_none")]
    failure_reason: Option<String>,
    latency_ms: f64,
    requested_at: Millis,
}

#[derive(Serialize, ToSchema)]
pub struct Pagination {
    /// Opaque cursor for the next page; null on the last page.
    cursor: Option<String>,
    #[serde(rename = "hasMore")]
    has_more: bool,
    /// Total number of matching records.
    total: i64,
}

#[derive(Serialize, ToSchema)]
pub struct Page {
    /// Newest first.
    data: Vec<Record>,
    pagination: Pagination,
}

#[utoipa::path(
    get, path = "/v1/log", tag = "audit",
    params(LogParams),
    responses(
        (status = 200, description = "A page of the caller's audit log (this key's mode)", body = Page),
        (status = 400, description = "VALIDATION_ERROR or INVALID_CURSOR", body = ErrorBody),
        (status = 404, description = "AGENT_NOT_FOUND: agent_id names no agent of the caller", body = ErrorBody),
    ),
    security(("bearer" = [])),
)]
pub async fn read(
    state: web::Data<AppState>,
    Issuer(caller): Issuer,
    params: web::Query<LogParams>,
) -> Result<HttpResponse, ApiError> {
    let limit = match params.limit.as_deref() {
        None => DEFAULT_LIMIT,
        Some(s) => s
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=MAX_LIMIT).contains(n))
            .ok_or_else(|| ValidationError::new("limit", "must be an integer from 1 to 200"))?,
    };
    let result = params
        .result
        .as_deref()
        .map(|r| {
            VerifyResult::parse(r).ok_or_else(|| {
                ValidationError::new("result", "must be one of valid, invalid, expired, revoked")
            })
        })
        .transpose()?;
    let agent_id = params
        .agent_id
        .as_deref()
        .map(|a| {
            AgentId::parse(a)
                .map(|_| a)
                .ok_or_else(|| ValidationError::new("agent_id", "must be an agent id (agt_…)"))
        })
        .transpose()?;
    if let Some(id) = agent_id {
        state.engine.ensure_owned(&caller, id).await?;
    }
    let ledger = Ledger {
        org_id: caller.org.id.clone(),
        mode: caller.mode,
    };
    let scope = CursorScope {
        ledger: &ledger,
        agent_id,
        result,
    };
    let secret = state.engine.keys().mac_secret();
    let before_seq = params
        .cursor
        .as_deref()
        .map(|c| {
            cursor::decode(secret, &scope, c).ok_or_else(|| {
                ApiError::new(ErrorCode::InvalidCursor, "cursor was not issued for this query")
            })
        })
        .transpose()?;
    let page = state
        .engine
        .store()
        .read_log(LogQuery {
            ledger: &ledger,
            agent_id,
            result,
            before_seq,
            limit,
        })
        .await?;
    let next = page
        .records
        .last()
        .filter(|_| page.has_more)
        .map(|r| cursor::encode(secret, &scope, r.seq));
    let data = page
        .records
        .into_iter()
        .map(|r| Record {
            id: r.id,
            agent_id: r.agent_id,
            result: match r.result {
                VerifyResult::Valid => LogResult::Valid,
                VerifyResult::Invalid => LogResult::Invalid,
                VerifyResult::Expired => LogResult::Expired,
                VerifyResult::Revoked => LogResult::Revoked,
            },
            failure_reason: r.failure_reason,
            latency_ms: r.latency_us as f64 / 1000.0,
            requested_at: r.requested_at,
        })
        .collect();
    Ok(HttpResponse::Ok().json(Page {
        data,
        pagination: Pagination {
            cursor: next,
            has_more: page.has_more,
            total: page.total,
        },
    }))
}
