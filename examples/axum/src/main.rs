//! An axum service whose `/orders` route only a verified agent with the `read:orders` scope
//! may call. `AGENTID_URL` names the agentid service; `AGENTID_ISSUERS` the issuer domains whose
//! agents may call (comma-separated: any organization can register agents, only the issuer says
//! whose they are); `PORT` the port to listen on (3000). Test-mode tokens are refused.

use agentid_verifier::{tower::AgentIdLayer, Agent, Verifier};
use axum::{routing::get, Extension, Json, Router};
use serde_json::{json, Value};

async fn orders(Extension(agent): Extension<Agent>) -> Json<Value> {
    Json(json!({"agent_id": agent.agent_id, "issuer": agent.issuer}))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("AGENTID_URL").map_err(|_| "AGENTID_URL names the agentid service")?;
    let port: u16 = std::env::var("PORT").unwrap_or_else(|_| "3000".into()).parse()?;
    let issuers = std::env::var("AGENTID_ISSUERS").map_err(|_| "AGENTID_ISSUERS names the issuers")?;
    // AGENTID_ALLOW_LOCAL=1: a service on this machine or a private network (development).
    let allow_local = std::env::var("AGENTID_ALLOW_LOCAL").is_ok_and(|v| v == "1");
    let verifier = Verifier::builder(&url)
        .issuers(issuers.split(','))
        .allow_local(allow_local)
        .build()?;
    let app = Router::new()
        .route(
            "/orders",
            get(orders).layer(AgentIdLayer::new(verifier, &["read:orders"])),
        )
        .route("/health", get(|| async { Json(json!({"ok": true})) })); // open: no layer
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    axum::serve(listener, app).await?;
    Ok(())
}
