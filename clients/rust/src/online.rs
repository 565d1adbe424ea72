//! Online verification: the service's own answer, which sees a revocation at once and
//! records the verification, held to the same rules as an offline one.

use serde_json::Value;

use crate::error::{bound_as_bearer, invalid, sized, unavailable};
use crate::tokens::{audience_of, b64_json, granted, scoped};
use crate::{Agent, Error, Verifier, MAX_TOKEN_BYTES};

impl Verifier {
    /// Asks the service (`GET /v1/verify/:token`, with the API `key` if given), which sees
    /// revocation at once and records the verification; then checks the issuer, the mode and
    /// `scopes` as [`Verifier::verify_with_scopes`] does. A `key` the service refuses (401,
    /// 403) is [`Error::Misconfigured`]; any other answer but a 200 is `UNAVAILABLE`.
    pub async fn verify_online(
        &self,
        token: &str,
        key: Option<&str>,
        scopes: &[&str],
    ) -> Result<Agent, Error> {
        self.told(self.online(token, key, scopes).await)
    }

    pub(crate) async fn online(
        &self,
        token: &str,
        key: Option<&str>,
        scopes: &[&str],
    ) -> Result<Agent, Error> {
        if !sized(token, MAX_TOKEN_BYTES, "token")?
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        {
            return Err(invalid("malformed"));
        }
        let url = format!("{}/v1/verify/{token}", self.inner.base);
        let answer = self
            .send(url, "application/json", None, key.map(str::to_owned))
            .await?;
        match answer.status {
            200 => {}
            401 | 403 => {
                return Err(Error::Misconfigured(format!(
                    "the service refused the API key ({})",
                    answer.status
                )))
            }
            status => return Err(unavailable(format!("verify answered {status}"))),
        }
        let malformed = |why: &str| unavailable(format!("verify gave a malformed answer: {why}"));
        let answer: Value = serde_json::from_slice(&answer.body).map_err(|_| malformed("not JSON"))?;
        match answer.get("valid") {
            Some(Value::Bool(true)) => {}
            Some(Value::Bool(false)) => {
                return Err(match answer["error"].as_str() {
                    Some("TOKEN_REVOKED") => Error::Revoked,
                    Some("TOKEN_EXPIRED") => Error::Expired,
                    other => invalid(other.unwrap_or("TOKEN_INVALID")),
                })
            }
            _ => return Err(malformed("no valid")),
        }
        let (Some(agent_id), Some(issuer)) = (answer["agent_id"].as_str(), answer["issuer"].as_str()) else {
            return Err(malformed("no agent_id or issuer"));
        };
        // The answer's times are RFC 3339; the token's own claims (which the service just
        // verified) hold them as seconds.
        let claims = token.split('.').nth(1).and_then(|p| b64_json(p).ok());
        let (Some(iat), Some(exp)) = (
            claims.as_ref().and_then(|c| c["iat"].as_i64()),
            claims.as_ref().and_then(|c| c["exp"].as_i64()),
        ) else {
            return Err(malformed("a valid token without iat and exp"));
        };
        let granted = granted(answer.get("scopes"))?;
        let audience = audience_of(answer.get("aud")).ok_or_else(|| malformed("aud"))?;
        self.held_to_audience(&audience)?;
        let livemode = self.admit(agent_id, issuer, answer.get("livemode"))?;
        let (subject, actors) =
            crate::delegation::delegation(&answer).map_err(|e| malformed(&format!("its chain ({e})")))?;
        if answer.get("cnf").is_some() {
            return Err(bound_as_bearer());
        }
        scoped(&granted, scopes)?;
        Ok(Agent {
            agent_id: agent_id.to_owned(),
            issuer: issuer.to_owned(),
            scopes: granted,
            issued_at: crate::tokens::instant_of(iat)?,
            expires_at: crate::tokens::instant_of(exp)?,
            livemode,
            audience,
            client_id: answer["client_id"].as_str().map(str::to_owned),
            claims: answer.clone(),
            subject,
            actors,
        })
    }
}
