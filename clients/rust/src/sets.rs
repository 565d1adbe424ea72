//! Security Event Tokens pushed to (or polled by) the receiver: a revocation marks its
//! agent revoked at once and drops its issuer's signature directory; a person's revokes their
//! delegated tokens issued until then.

use serde_json::Value;

use crate::error::{invalid, sized};
use crate::tokens::numeric_date;
use crate::{Error, Verifier, MAX_SET_BYTES, SEEN_SETS, SESSION_REVOKED};

impl Verifier {
    /// Takes a Security Event Token the service pushed (or a poll gave): verified through the
    /// JWKS; issued by this service (`iss` is the base URL); for this receiver (its `aud`
    /// holds [`Builder::set_audience`](crate::Builder::set_audience), when set); not seen before (its `jti` is not one of the
    /// last [`SEEN_SETS`] taken); of a subject of an accepted issuer (`sub_id.iss` is one of
    /// [`Builder::issuers`](crate::Builder::issuers), when set). A revocation marks its agent revoked at once, and
    /// drops what is held of its issuer's signature directory (the next signed request fetches
    /// it anew, without the agent's key); a person's (`sub_id.iss` an identity provider's https
    /// URL) revokes every delegated token for them issued until the event. Every refusal is
    /// `TOKEN_INVALID`.
    pub async fn handle_set(&self, set_jwt: &str) -> Result<(), Error> {
        let c = self
            .decode(sized(set_jwt, MAX_SET_BYTES, "SET")?, "secevent+jwt")
            .await?;
        if c["iss"] != self.inner.base.as_str() {
            return Err(invalid(format!(
                "a SET of {}, not of {}",
                c["iss"], self.inner.base
            )));
        }
        // Present, `aud` is a string or an array of strings (never null), whether or not it is
        // asked for; absent, it holds no audience.
        let audience = match c.get("aud") {
            Some(Value::Null) => None,
            aud => crate::tokens::audience_of(aud),
        }
        .ok_or_else(|| invalid("malformed aud"))?;
        if let Some(want) = &self.inner.set_audience {
            if !audience.contains(want) {
                return Err(invalid(format!("a SET for {}, not for {want}", c["aud"])));
            }
        }
        let (Some(jti), Some(iat), Some(events)) = (
            c["jti"].as_str(),
            numeric_date(&c["iat"]),
            c["events"].as_object(),
        ) else {
            return Err(invalid("a SET needs jti, iat and events"));
        };
        let now = crate::now_secs();
        if iat > now.saturating_add(self.inner.leeway) {
            return Err(invalid("a SET issued in the future"));
        }
        match c.get("exp").map(numeric_date) {
            None => {}
            Some(Some(exp)) if !crate::expired(exp, self.inner.leeway) => {}
            Some(Some(_)) => return Err(Error::Expired),
            Some(None) => return Err(invalid("a SET's exp must be a NumericDate")),
        }
        let mut person = None;
        // Present, a revocation's time is a NumericDate, whoever it revokes.
        let stamped = match events.get(SESSION_REVOKED).and_then(|e| e.get("event_timestamp")) {
            None => None,
            Some(t) => Some(numeric_date(t).ok_or_else(|| invalid("event_timestamp must be a NumericDate"))?),
        };
        let revoked = if events.contains_key(SESSION_REVOKED) {
            let s = &c["sub_id"];
            let (Some("iss_sub"), Some(iss), Some(sub)) =
                (s["format"].as_str(), s["iss"].as_str(), s["sub"].as_str())
            else {
                return Err(invalid("a revocation without an iss_sub subject"));
            };
            if iss.starts_with("https://") {
                let at = stamped.unwrap_or(iat);
                person = Some((iss, sub, at));
                None
            } else if self.inner.issuers.as_ref().is_some_and(|i| !i.contains(iss)) {
                return Err(invalid(format!(
                    "a revocation of an agent of {iss}, not an accepted issuer"
                )));
            } else {
                Some((iss, sub))
            }
        } else {
            None
        };
        let mut s = self.inner.state.lock();
        if !s.seen_sets.insert(jti.to_owned()) {
            return Err(invalid(format!("SET {jti} was taken already (a replay)")));
        }
        s.seen_order.push_back(jti.to_owned());
        if s.seen_order.len() > SEEN_SETS {
            if let Some(oldest) = s.seen_order.pop_front() {
                s.seen_sets.remove(&oldest);
            }
        }
        if let Some((iss, sub)) = revoked {
            s.revoked.insert(sub.to_owned());
            // Its key leaves the issuer's directory at once: what is held of it is stale.
            s.directories
                .drop_url(format!("{}/v1/directories/{iss}", self.inner.base));
            s.directories.drop_url(format!(
                "https://{iss}/.well-known/http-message-signatures-directory"
            ));
        }
        drop(s);
        if let Some((iss, sub, at)) = person {
            self.person_revoked(iss, sub, at);
        }
        Ok(())
    }
}
