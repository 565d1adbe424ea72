//! `GET /v1/log`: the caller's audit records, newest first, with cursor pagination.

use actix_web::{web, HttpResponse};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::auth::Issuer;
use super::context::AppState;
use super::cursor::{self, CursorScope};
use super::error::{ApiError, ErrorBody, ErrorCode};
use super::input::page_limit;
use super::schema::Timestamp;
use agentid_core::domain::audit::Event;
use agentid_core::domain::{hex, AgentId, Ledger, Millis, ValidationError, VerifyResult};
use agentid_core::records::LogQuery;
use agentid_engine::transparency::ProofRefused;

/// Query parameters, kept as text so that each bad value gets its own clear error.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct LogParams {
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
pub(crate) enum LogResult {
    Valid,
    Invalid,
    Expired,
    Revoked,
}

/// What a record records.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum LogEvent {
    /// A token checked: at verify or introspection.
    Verification,
    /// An agent asked the OAuth token endpoint for an access token: valid when one was
    /// handed out, else why not.
    TokenRequest,
    /// The fleet's issuer-domain list grew: the service's own ledger only, never an
    /// organization's.
    DomainList,
}

/// One verification, or one token request.
#[derive(Serialize, ToSchema)]
pub(crate) struct Record {
    #[schema(pattern = "^log_[0-9a-z]{26}$")]
    id: String,
    /// Its place in the ledger: 1, 2, 3 … (leaf seq − 1 of the ledger's Merkle tree).
    #[schema(minimum = 1)]
    seq: i64,
    /// The record hash (the hash chain's link; its leaf hash is SHA-256(0x00 ‖ hash)).
    #[schema(pattern = "^[0-9a-f]{64}$")]
    hash: String,
    agent_id: String,
    event: LogEvent,
    result: LogResult,
    /// Present on failed verifications, absent on valid ones.
    #[serde(skip_serializing_if = "Option::is_none")]
    failure_reason: Option<String>,
    latency_ms: f64,
    #[schema(value_type = Timestamp)]
    requested_at: Millis,
}

#[derive(Serialize, ToSchema)]
pub(crate) struct Pagination {
    /// Opaque cursor for the next page; null on the last page.
    cursor: Option<String>,
    #[serde(rename = "hasMore")]
    has_more: bool,
    /// Total number of matching records.
    total: i64,
}

#[derive(Serialize, ToSchema)]
pub(crate) struct Page {
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
)]
pub async fn read(
    state: web::Data<AppState>,
    Issuer(caller): Issuer,
    params: web::Query<LogParams>,
) -> Result<HttpResponse, ApiError> {
    let limit = page_limit(params.limit.as_deref())?;
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
            AgentId::parse(a).ok_or_else(|| ValidationError::new("agent_id", "must be an agent id (agt_…)"))
        })
        .transpose()?;
    if let Some(id) = &agent_id {
        state.engine.agents().ensure_owned(&caller, id).await?;
    }
    let agent_id = agent_id.as_ref().map(AgentId::as_str);
    let ledger = Ledger {
        org_id: caller.org.id.as_str().to_owned(),
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
            seq: r.seq,
            hash: hex(&r.hash),
            agent_id: r.agent_id,
            event: match r.event {
                Event::Verification => LogEvent::Verification,
                Event::TokenRequest => LogEvent::TokenRequest,
                Event::DomainList => LogEvent::DomainList,
            },
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

fn caller_ledger(caller: &agentid_engine::Caller) -> Ledger {
    Ledger {
        org_id: caller.org.id.as_str().to_owned(),
        mode: caller.mode,
    }
}

#[utoipa::path(
    get, path = "/v1/log/checkpoint", tag = "audit",
    responses(
        (status = 200, description = "The latest signed checkpoint of the caller's ledger (its organization, this key's mode): a C2SP tlog-checkpoint signed note. Checked with the key at /.well-known/log-key. A ledger not yet checkpointed answers the empty tree's.", content_type = "text/plain", body = String),
    ),
)]
pub(crate) async fn checkpoint(
    state: web::Data<AppState>,
    Issuer(caller): Issuer,
) -> Result<HttpResponse, ApiError> {
    let note = state
        .engine
        .transparency()
        .latest_note(&caller_ledger(&caller))
        .await?;
    Ok(HttpResponse::Ok()
        .content_type("text/plain; charset=utf-8")
        .insert_header((actix_web::http::header::CACHE_CONTROL, "no-store"))
        .body(note))
}

/// Query parameters of the inclusion proof.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct InclusionParams {
    /// The record's `seq`, 1 ≤ seq ≤ tree_size.
    #[param(value_type = u64, minimum = 1)]
    seq: Option<String>,
    /// The tree size the proof is for, at most the latest checkpoint's.
    #[param(value_type = u64, minimum = 1)]
    tree_size: Option<String>,
}

/// An RFC 9162 §2.1.3 inclusion proof.
#[derive(Serialize, ToSchema)]
pub(crate) struct InclusionProof {
    seq: u64,
    tree_size: u64,
    /// The record hash (its leaf hash is SHA-256(0x00 ‖ hash)).
    #[schema(pattern = "^[0-9a-f]{64}$")]
    hash: String,
    /// The audit path, leaf to root, as lowercase hex.
    proof: Vec<String>,
}

/// Query parameters of the consistency proof.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct ConsistencyParams {
    /// The older tree size, 1 ≤ from ≤ to.
    #[param(value_type = u64, minimum = 1)]
    from: Option<String>,
    /// The newer tree size, at most the latest checkpoint's.
    #[param(value_type = u64, minimum = 1)]
    to: Option<String>,
}

/// An RFC 9162 §2.1.4 consistency proof.
#[derive(Serialize, ToSchema)]
pub(crate) struct ConsistencyProof {
    from: u64,
    to: u64,
    /// The proof's hashes as lowercase hex.
    proof: Vec<String>,
}

fn tree_index(field: &'static str, value: Option<&str>) -> Result<u64, ApiError> {
    let value = value.ok_or_else(|| ValidationError::new(field, "is required"))?;
    Ok(value
        .parse::<u64>()
        .ok()
        .filter(|n| (1..=i64::MAX as u64).contains(n))
        .ok_or_else(|| ValidationError::new(field, "must be a positive integer"))?)
}

fn refused(e: ProofRefused, field: &'static str) -> ApiError {
    match e {
        ProofRefused::OutOfRange(msg) => ValidationError::new(field, msg).into(),
        ProofRefused::Store(e) => e.into(),
    }
}

#[utoipa::path(
    get, path = "/v1/log/proof/inclusion", tag = "audit",
    params(InclusionParams),
    responses(
        (status = 200, description = "Proof that record seq is leaf seq − 1 of the caller's ledger's tree of tree_size records", body = InclusionProof),
        (status = 400, description = "VALIDATION_ERROR: a missing parameter, or not 1 ≤ seq ≤ tree_size ≤ the latest checkpoint's size", body = ErrorBody),
    ),
)]
pub(crate) async fn inclusion(
    state: web::Data<AppState>,
    Issuer(caller): Issuer,
    params: web::Query<InclusionParams>,
) -> Result<HttpResponse, ApiError> {
    let seq = tree_index("seq", params.seq.as_deref())?;
    let size = tree_index("tree_size", params.tree_size.as_deref())?;
    let (hash, proof) = state
        .engine
        .transparency()
        .inclusion(&caller_ledger(&caller), seq, size)
        .await
        .map_err(|e| refused(e, "tree_size"))?;
    Ok(HttpResponse::Ok().json(InclusionProof {
        seq,
        tree_size: size,
        hash: hex(&hash),
        proof: proof.iter().map(|h| hex(h)).collect(),
    }))
}

#[utoipa::path(
    get, path = "/v1/log/proof/consistency", tag = "audit",
    params(ConsistencyParams),
    responses(
        (status = 200, description = "Proof that the caller's ledger's tree of `from` records is a prefix of its tree of `to` records", body = ConsistencyProof),
        (status = 400, description = "VALIDATION_ERROR: a missing parameter, or not 1 ≤ from ≤ to ≤ the latest checkpoint's size", body = ErrorBody),
    ),
)]
pub(crate) async fn consistency(
    state: web::Data<AppState>,
    Issuer(caller): Issuer,
    params: web::Query<ConsistencyParams>,
) -> Result<HttpResponse, ApiError> {
    let from = tree_index("from", params.from.as_deref())?;
    let to = tree_index("to", params.to.as_deref())?;
    let proof = state
        .engine
        .transparency()
        .consistency(&caller_ledger(&caller), from, to)
        .await
        .map_err(|e| refused(e, "to"))?;
    Ok(HttpResponse::Ok().json(ConsistencyProof {
        from,
        to,
        proof: proof.iter().map(|h| hex(h)).collect(),
    }))
}

/// Where to start each list of `GET /v1/log/commitments` (default 0: from its first entry).
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct CommitmentParams {
    /// Entries of the revocation list from this index on.
    #[param(value_type = Option<u64>, minimum = 0)]
    revocations_from: Option<String>,
    /// Entries of the retired-key list from this index on.
    #[param(value_type = Option<u64>, minimum = 0)]
    retired_keys_from: Option<String>,
    /// Entries of the issuer-domain list from this index on.
    #[param(value_type = Option<u64>, minimum = 0)]
    domains_from: Option<String>,
}

/// Most entries of each list in one answer.
pub(crate) const COMMITMENT_PAGE: usize = 1000;

/// A page of one list a checkpoint commits to.
#[derive(Serialize, ToSchema)]
pub(crate) struct CommittedList {
    /// Entries the list holds in all.
    total: u64,
    /// The index of `entries[0]`.
    from: u64,
    /// In list order, at most 1000.
    entries: Vec<CommittedEntry>,
}

/// One entry: an agent id and when it was revoked, a kid and when it was retired, or an
/// issuer-domain event (`<seq> <hold|release|migrated> <domain> <org_id> <method>`, `-` for
/// what it lacks) and when it happened.
#[derive(Serialize, ToSchema)]
pub(crate) struct CommittedEntry {
    id: String,
    #[schema(value_type = Timestamp)]
    at: Millis,
}

/// The lists the caller's ledger's checkpoints commit to, as the database holds them now.
#[derive(Serialize, ToSchema)]
pub(crate) struct Committed {
    revocations: CommittedList,
    retired_keys: CommittedList,
    domains: CommittedList,
}

fn list_from(field: &'static str, value: Option<&str>) -> Result<u64, ApiError> {
    match value {
        None => Ok(0),
        Some(v) => Ok(v
            .parse::<u64>()
            .ok()
            .filter(|n| *n <= i64::MAX as u64)
            .ok_or_else(|| ValidationError::new(field, "must be a non-negative integer"))?),
    }
}

fn page(list: &[(String, Millis)], from: u64) -> CommittedList {
    CommittedList {
        total: list.len() as u64,
        from,
        entries: list
            .iter()
            .skip(usize::try_from(from).unwrap_or(usize::MAX))
            .take(COMMITMENT_PAGE)
            .map(|(id, at)| CommittedEntry {
                id: id.clone(),
                at: *at,
            })
            .collect(),
    }
}

#[utoipa::path(
    get, path = "/v1/log/commitments", tag = "audit",
    params(CommitmentParams),
    responses(
        (status = 200, description = "The lists the caller's ledger's checkpoints commit to in their extension lines `agentid-revocations <count> <hash>`, `agentid-retired-keys <count> <hash>` and `agentid-domains <count> <hash>`: the ledger's revocations (in revocation order), the fleet's key retirements (by time) and the fleet's issuer-domain holding events (in order), each a hash chain: h0 = 32 zero bytes, h(i+1) = SHA-256(list name ‖ LF ‖ h(i) ‖ id ‖ LF ‖ at in decimal ms ‖ LF). A witness checks that each new checkpoint's lists extend the ones it saw.", body = Committed),
        (status = 400, description = "VALIDATION_ERROR: an index that is not a non-negative integer", body = ErrorBody),
    ),
)]
pub(crate) async fn commitments(
    state: web::Data<AppState>,
    Issuer(caller): Issuer,
    params: web::Query<CommitmentParams>,
) -> Result<HttpResponse, ApiError> {
    let revocations_from = list_from("revocations_from", params.revocations_from.as_deref())?;
    let retired_from = list_from("retired_keys_from", params.retired_keys_from.as_deref())?;
    let domains_from = list_from("domains_from", params.domains_from.as_deref())?;
    let lists = state
        .engine
        .transparency()
        .committed(&caller_ledger(&caller))
        .await?;
    Ok(HttpResponse::Ok()
        .insert_header((actix_web::http::header::CACHE_CONTROL, "no-store"))
        .json(Committed {
            revocations: page(&lists.revocations, revocations_from),
            retired_keys: page(&lists.retired_keys, retired_from),
            domains: page(&lists.domains, domains_from),
        }))
}
