//! `GET /v1/log`: the caller's audit records, newest first, with cursor pagination.

use actix_web::{web, HttpResponse};
use serde::{Deserialize, Serialize};

use super::auth::Issuer;
use super::cursor::{self, CursorScope};
use super::error::{ApiError, ErrorCode};
use super::AppState;
use crate::domain::{AgentId, Ledger, Millis, ValidationError, VerifyResult};
use crate::store::LogQuery;

pub const DEFAULT_LIMIT: u32 = 50;
pub const MAX_LIMIT: u32 = 200;

/// Query parameters, kept as text so that each bad value gets its own clear error.
#[derive(Deserialize)]
pub struct LogParams {
    limit: Option<String>,
    cursor: Option<String>,
    agent_id: Option<String>,
    result: Option<String>,
}

#[derive(Serialize)]
struct Record {
    id: String,
    agent_id: String,
    result: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    failure_reason: Option<String>,
    latency_ms: f64,
    requested_at: Millis,
}

#[derive(Serialize)]
struct Pagination {
    cursor: Option<String>,
    #[serde(rename = "hasMore")]
    has_more: bool,
    total: i64,
}

#[derive(Serialize)]
struct Page {
    data: Vec<Record>,
    pagination: Pagination,
}

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
            result: r.result.as_str(),
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
