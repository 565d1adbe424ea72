//! Tokens checked offline: the JWS (EdDSA, a kid, its `typ`, the strict signature), the
//! claims of an agent token or an access token, the issuer, the mode, the audience, a
//! revocation and the scopes.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ed25519_dalek::Signature;
use serde_json::Value;

use crate::error::{bound_as_bearer, invalid, printable, sized};
use crate::{now_secs, Agent, Error, Verifier, ACCESS_TOKEN_TYP, MAX_TOKEN_BYTES, VERIFICATIONS};

pub(crate) fn b64_json(part: &str) -> Result<Value, Error> {
    let bytes = URL_SAFE_NO_PAD.decode(part).map_err(|_| invalid("malformed"))?;
    serde_json::from_slice(&bytes).map_err(|_| invalid("malformed"))
}

/// A NumericDate (RFC 7519): a number of seconds from 0 up to 2^53 (the whole numbers every
/// JSON reader holds exactly), a fraction rounded down; `None` for anything else.
pub(crate) fn numeric_date(v: &Value) -> Option<i64> {
    const MOST: f64 = 9_007_199_254_740_992.0;
    let n = v.as_f64()?;
    // `as` is exact here: the value is whole and within 2^53.
    (0.0..MOST).contains(&n).then(|| n.floor() as i64)
}

/// The instant of `secs` since the Unix epoch; `TOKEN_INVALID` past what this system's clock
/// holds (a few thousand years on some).
pub(crate) fn instant_of(secs: i64) -> Result<SystemTime, Error> {
    UNIX_EPOCH
        .checked_add(Duration::from_secs(secs.max(0).unsigned_abs()))
        .ok_or_else(|| invalid("a time past what this system's clock holds"))
}

/// The scopes a token grants: its (or the answer's) `scopes`, an array of strings; none when
/// absent.
pub(crate) fn granted(scopes: Option<&Value>) -> Result<Vec<String>, Error> {
    match scopes {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => a
            .iter()
            .map(|s| s.as_str().map(str::to_owned))
            .collect::<Option<_>>()
            .ok_or_else(|| invalid("malformed scopes")),
        Some(_) => Err(invalid("malformed scopes")),
    }
}

/// What the kind of a token (an agent token, an access token) says of it.
pub(crate) struct Kind {
    issuer: String,
    granted: Vec<String>,
    audience: Vec<String>,
    client_id: Option<String>,
}

/// A JWT's `aud` (absent, a string, or an array of strings) as a list; `None` when malformed.
pub(crate) fn audience_of(aud: Option<&Value>) -> Option<Vec<String>> {
    match aud {
        None | Some(Value::Null) => Some(Vec::new()),
        Some(Value::String(one)) => Some(vec![one.clone()]),
        Some(Value::Array(many)) => many.iter().map(|a| a.as_str().map(str::to_owned)).collect(),
        Some(_) => None,
    }
}

/// `INSUFFICIENT_SCOPE` unless `granted` holds every one of `scopes`.
pub(crate) fn scoped(granted: &[String], scopes: &[&str]) -> Result<(), Error> {
    let missing: Vec<String> = scopes
        .iter()
        .filter(|s| !granted.iter().any(|g| g == *s))
        .map(|s| s.to_string())
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(Error::InsufficientScope(missing))
    }
}

impl Verifier {
    /// Checks a compact JWS's header (EdDSA, a kid, `typ`) and strict signature; its claims.
    pub(crate) async fn decode(&self, jws: &str, typ: &str) -> Result<Value, Error> {
        Ok(self.decode_typed(jws, &[typ]).await?.1)
    }

    /// Checks a compact JWS's header (EdDSA, a kid, a `typ` of `typs`, absent meaning the
    /// first) and strict signature; its `typ` and claims.
    pub(crate) async fn decode_typed<'t>(
        &self,
        jws: &str,
        typs: &[&'t str],
    ) -> Result<(&'t str, Value), Error> {
        let mut parts = jws.split('.');
        let (Some(h), Some(p), Some(s), None) = (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(invalid("malformed"));
        };
        let header = b64_json(h)?;
        // RFC 7515 4.1.11: an extension this verifier must understand, and understands none.
        if header.get("crit").is_some() {
            return Err(invalid("crit names extensions this verifier does not understand"));
        }
        let kid = match (&header["alg"], &header["kid"]) {
            (Value::String(alg), Value::String(kid)) if alg == "EdDSA" => kid.clone(),
            _ => return Err(invalid("only alg EdDSA with a kid")),
        };
        let typ = match header.get("typ") {
            None => typs[0],
            Some(Value::String(t)) => {
                let t = if t == "application/at+jwt" {
                    ACCESS_TOKEN_TYP
                } else {
                    t.as_str()
                };
                *typs
                    .iter()
                    .find(|want| **want == t)
                    .ok_or_else(|| invalid(format!("typ {t} is not one of {typs:?}")))?
            }
            Some(_) => return Err(invalid("malformed typ")),
        };
        let sig: [u8; 64] = URL_SAFE_NO_PAD
            .decode(s)
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| invalid("malformed signature"))?;
        let key = self.key(&kid).await?;
        key.verify_strict(
            &jws.as_bytes()[..h.len() + 1 + p.len()],
            &Signature::from_bytes(&sig),
        )
        .map_err(|_| invalid("signature verification failed"))?;
        let claims = b64_json(p)?;
        if !claims.is_object() {
            return Err(invalid("claims are not an object"));
        }
        Ok((typ, claims))
    }

    /// Verifies `token` offline: signature, claims and revocation.
    pub async fn verify(&self, token: &str) -> Result<Agent, Error> {
        self.verify_with_scopes(token, &[]).await
    }

    /// Verifies `token` offline, and that it grants every one of `scopes`. A token bound to a
    /// key is `PROOF_INVALID` here: it needs [`Verifier::verify_dpop`].
    pub async fn verify_with_scopes(&self, token: &str, scopes: &[&str]) -> Result<Agent, Error> {
        self.told(self.bearer(token, scopes).await)
    }

    /// `result`, counted by outcome and told to the [`Builder::on_refusal`] hook when it is a
    /// refusal.
    pub(crate) fn told<T>(&self, result: Result<T, Error>) -> Result<T, Error> {
        let outcome = result.as_ref().map_or_else(Error::code, |_| "valid");
        metrics::counter!(VERIFICATIONS, "outcome" => outcome).increment(1);
        if let (Err(e), Some(hook)) = (&result, &self.inner.on_refusal) {
            hook(e.code(), &printable(&e.to_string()));
        }
        result
    }

    pub(crate) async fn bearer(&self, token: &str, scopes: &[&str]) -> Result<Agent, Error> {
        let agent = self.checked(token, scopes).await?;
        if agent.claims.get("cnf").is_some() {
            return Err(bound_as_bearer());
        }
        Ok(agent)
    }

    /// The agent of `token`, with its claims, checked offline.
    pub(crate) async fn checked(&self, token: &str, scopes: &[&str]) -> Result<Agent, Error> {
        let (typ, c) = self
            .decode_typed(
                sized(token, MAX_TOKEN_BYTES, "token")?,
                &["JWT", ACCESS_TOKEN_TYP],
            )
            .await?;
        let (Some(sub), Some(_), Some(iat), Some(exp)) = (
            c["sub"].as_str(),
            c["iss"].as_str(),
            numeric_date(&c["iat"]),
            numeric_date(&c["exp"]),
        ) else {
            return Err(invalid("sub, iss, iat and exp are required (NumericDates)"));
        };
        let now = now_secs();
        if crate::expired(exp, self.inner.leeway) {
            return Err(Error::Expired);
        }
        if iat > now.saturating_add(self.inner.leeway) {
            return Err(invalid("issued in the future"));
        }
        match c.get("nbf").map(numeric_date) {
            None => {}
            Some(Some(nbf)) if nbf <= now.saturating_add(self.inner.leeway) => {}
            Some(Some(_)) => return Err(invalid("not valid yet (nbf)")),
            Some(None) => return Err(invalid("nbf must be a NumericDate")),
        }
        let kind = self.kind(typ == ACCESS_TOKEN_TYP, &c)?;
        let (subject, actors) = match kind.client_id {
            Some(_) => crate::delegation::delegation(&c)?,
            None => (None, Vec::new()),
        };
        let agent_id = kind.client_id.clone().unwrap_or_else(|| sub.to_owned());
        let livemode = self.admit(&agent_id, &kind.issuer, c.get("livemode"))?;
        self.admit_chain(subject.as_ref(), &actors, iat)?;
        if let Some(status) = c.get("status") {
            let r = &status["status_list"];
            // A non-negative integer: -1, 1.5, "3" or true are not indices.
            let (Some(idx), Some(uri)) = (r["idx"].as_u64(), r["uri"].as_str()) else {
                return Err(invalid("malformed status claim"));
            };
            if self.status(uri, idx).await? == Some(1) {
                return Err(Error::Revoked);
            }
        }
        scoped(&kind.granted, scopes)?;
        let agent = Agent {
            agent_id,
            issuer: kind.issuer,
            scopes: kind.granted,
            issued_at: instant_of(iat)?,
            expires_at: instant_of(exp)?,
            livemode,
            audience: kind.audience,
            client_id: kind.client_id,
            claims: c,
            subject,
            actors,
        };
        Ok(agent)
    }

    /// The issuer domain, scopes, audience and client of an agent token's or an access
    /// token's claims (an access token is one of this service, for its agent); the audience
    /// held to [`Builder::audience`].
    pub(crate) fn kind(&self, access: bool, c: &Value) -> Result<Kind, Error> {
        // Present, each is what it should be: null is no absence.
        for claim in ["aud", "scopes"] {
            if c.get(claim).is_some_and(Value::is_null) {
                return Err(invalid(format!("malformed {claim}")));
            }
        }
        let audience = audience_of(c.get("aud")).ok_or_else(|| invalid("malformed aud"))?;
        let kind = if access {
            if c["iss"] != self.inner.base.as_str() {
                return Err(invalid(format!(
                    "an access token of {}, not of {}",
                    c["iss"], self.inner.base
                )));
            }
            let (Some(scope), Some(client), Some(domain)) = (
                c["scope"].as_str(),
                c["client_id"].as_str(),
                c["issuer_domain"].as_str(),
            ) else {
                return Err(invalid(
                    "an access token needs scope, client_id and issuer_domain",
                ));
            };
            let delegated = c.get("act").is_some() || c.get("sub_id").is_some();
            if scope.is_empty()
                || audience.is_empty()
                || (!delegated && c["sub"] != client)
                || (delegated && c["act"]["sub"] != client)
            {
                return Err(invalid(
                    "an access token needs aud, scope and client_id (its sub, or its act's)",
                ));
            }
            Kind {
                issuer: domain.to_owned(),
                granted: scope.split(' ').map(str::to_owned).collect(),
                client_id: Some(client.to_owned()),
                audience,
            }
        } else {
            if c.get("client_id").is_some() || c.get("scope").is_some() {
                return Err(invalid("an agent token with an access token's claims"));
            }
            Kind {
                issuer: c["iss"].as_str().unwrap_or_default().to_owned(),
                granted: granted(c.get("scopes"))?,
                client_id: None,
                audience,
            }
        };
        self.held_to_audience(&kind.audience)?;
        Ok(kind)
    }

    /// `TOKEN_INVALID` for a token whose audience names none of [`Builder::audience`] (when
    /// the receiver named one).
    pub(crate) fn held_to_audience(&self, audience: &[String]) -> Result<(), Error> {
        match &self.inner.audience {
            Some(ours) if !audience.iter().any(|a| ours.contains(a)) => {
                Err(invalid(format!("a token for {audience:?}, not for {ours:?}")))
            }
            _ => Ok(()),
        }
    }

    /// What offline and online verification both check: the issuer, the mode, a pushed
    /// revocation (the scopes are checked last, by [`scoped`]). Whether the token is live.
    pub(crate) fn admit(
        &self,
        agent_id: &str,
        issuer: &str,
        livemode: Option<&Value>,
    ) -> Result<bool, Error> {
        if self.inner.issuers.as_ref().is_some_and(|i| !i.contains(issuer)) {
            return Err(invalid(format!("issuer {issuer} is not accepted")));
        }
        let live = self.livemode(livemode)?;
        if self.inner.state.lock().revoked.contains(agent_id) {
            return Err(Error::Revoked);
        }
        Ok(live)
    }

    /// Whether a token is live (no `livemode`, or `true`); a test-mode one is refused
    /// unless `allow_test`.
    pub(crate) fn livemode(&self, value: Option<&Value>) -> Result<bool, Error> {
        match value {
            None | Some(Value::Bool(true)) => Ok(true),
            Some(Value::Bool(false)) if self.inner.allow_test => Ok(false),
            Some(Value::Bool(false)) => Err(invalid(
                "a test-mode token (livemode false); build the Verifier with .allow_test(true) to accept it",
            )),
            Some(_) => Err(invalid("malformed livemode claim")),
        }
    }
}
