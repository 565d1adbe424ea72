//! `agentid token inspect`: a token decoded and explained without trusting it, for a person
//! debugging one. It needs no database; with `--url` it asks that service whether it knows
//! the token's key and what the token's status list says.

use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use clap::Subcommand;
use serde_json::{json, Map, Value};

use super::printable;
use super::CliResult;
use crate::fetch::get;
use agentid_core::keys::PublicKeys;
use agentid_core::token::{decode, RejectReason};

#[derive(Debug, Subcommand)]
pub(crate) enum TokenCommand {
    /// Decode a token and explain it, without trusting it: its header, its claims, how long
    /// until it expires, and (with --url) whether its signature checks with that service's
    /// keys and what its status list says.
    Inspect {
        /// The token (a compact JWS), or `-` to read it from standard input (out of the
        /// shell's history).
        token: String,
        /// The agentid service that issued it (https://id.example.com): its key set and the
        /// token's status list are read from there (10 s, 1 MiB, no redirect followed).
        #[arg(long)]
        url: Option<String>,
    },
}

pub(super) async fn run(cmd: TokenCommand) -> CliResult {
    let TokenCommand::Inspect { token, url } = cmd;
    let token = if token == "-" {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line)?;
        line.trim().to_owned()
    } else {
        token
    };
    let out = actix_web::rt::task::spawn_blocking(move || inspect(&token, url.as_deref()))
        .await
        .map_err(|e| e.to_string())??;
    println!("{}", printable(&serde_json::to_string_pretty(&out)?));
    Ok(ExitCode::SUCCESS)
}

fn part(s: &str, what: &str) -> Result<Map<String, Value>, String> {
    let bytes = URL_SAFE_NO_PAD
        .decode(s)
        .map_err(|_| format!("the token's {what} is not base64url without padding"))?;
    match serde_json::from_slice(&bytes) {
        Ok(Value::Object(m)) => Ok(m),
        _ => Err(format!("the token's {what} is not a JSON object")),
    }
}

/// What the token says of itself, and what `url`'s service says of it.
fn inspect(token: &str, url: Option<&str>) -> Result<Value, String> {
    let parts: Vec<&str> = token.trim().split('.').collect();
    let [h, c, _] = parts[..] else {
        return Err(format!("not a compact JWS: {} parts, not 3", parts.len()));
    };
    let (header, claims) = (part(h, "header")?, part(c, "claims")?);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let mut out = json!({
        "header": header,
        "claims": claims,
        // A time far out of range (a hostile token's) has no difference to show: null.
        "expires_in_seconds": claims.get("exp").and_then(Value::as_i64).and_then(|exp| exp.checked_sub(now)),
        "issued_seconds_ago": claims.get("iat").and_then(Value::as_i64).and_then(|iat| now.checked_sub(iat)),
    });
    let Some(base) = url.map(|u| u.trim_end_matches('/')) else {
        return Ok(out);
    };
    let agent = crate::fetch::agent(Duration::from_secs(10));
    let jwks: Value = serde_json::from_slice(&get(&agent, &format!("{base}/.well-known/jwks.json"), None)?)
        .map_err(|_| format!("{base}/.well-known/jwks.json is not JSON"))?;
    let kid = header.get("kid").and_then(Value::as_str);
    out["kid_known"] = json!(jwks["keys"]
        .as_array()
        .is_some_and(|keys| keys.iter().any(|k| kid.is_some() && k["kid"].as_str() == kid)));
    // The signature, checked as the service checks it, with the key its kid names there.
    let keys = PublicKeys::from_jwks(&jwks);
    out["signature"] = json!(match (decode(token.trim()), keys) {
        (Ok(unverified), Some(keys)) => match keys.verify(&unverified) {
            Ok(()) => "valid",
            Err(RejectReason::UnknownKey) => "unknown key",
            Err(_) => "invalid",
        },
        (Ok(_), None) => "unknown key",
        (Err(_), _) => "invalid",
    });
    out["status"] = match claims.get("status").map(|s| &s["status_list"]) {
        None => json!(null),
        Some(place) => status(&agent, base, place),
    };
    Ok(out)
}

/// The token's place in its status list, with the list's word on it: `valid` (0), `revoked`
/// (1), or why it could not be read. Only a list of the service at `base` is fetched.
fn status(agent: &ureq::Agent, base: &str, place: &Value) -> Value {
    let (Some(idx), Some(uri)) = (place["idx"].as_u64(), place["uri"].as_str()) else {
        return json!({"error": "a malformed status claim"});
    };
    let mut out = json!({"idx": idx, "uri": uri});
    let read = || -> Result<u8, String> {
        if !uri.starts_with(&format!("{base}/v1/status/")) {
            return Err(format!("the list is not one of {base}: not fetched"));
        }
        let body = get(agent, uri, None)?;
        let jws = std::str::from_utf8(&body).map_err(|_| "the list is not text")?;
        let claims = part(jws.trim().split('.').nth(1).unwrap_or_default(), "status list")?;
        let lst = claims
            .get("status_list")
            .and_then(|s| s["lst"].as_str())
            .ok_or("the list has no lst")?;
        let packed = URL_SAFE_NO_PAD.decode(lst).map_err(|_| "lst is not base64url")?;
        let bits = miniz_oxide::inflate::decompress_to_vec_zlib_with_limit(&packed, 16 << 20)
            .map_err(|_| "lst is not zlib")?;
        let byte = usize::try_from(idx / 8)
            .ok()
            .and_then(|i| bits.get(i))
            .ok_or("the index is outside the list")?;
        Ok((byte >> (idx % 8)) & 1)
    };
    match read() {
        Ok(0) => out["value"] = json!("valid"),
        Ok(_) => out["value"] = json!("revoked"),
        Err(e) => out["error"] = json!(e),
    }
    out
}
