//! The SET of an event, signed when it is sent, and poll delivery (RFC 8936).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use sha2::{Digest, Sha256};

use super::{Ssf, SsfError, POLL_WAIT, SESSION_REVOKED, VERIFICATION};
use agentid_core::domain::{Millis, StreamId};
use agentid_store::{SsfEvent, StreamRecord};

/// The long polls waiting on this instance, by stream: the turn of the newest (polls that
/// began, counted). A receiver waits in one poll at a time (RFC 8936), so a newer poll of the
/// same stream supersedes an older one, which answers at once what is pending: however many
/// polls a stream's token opens, it holds one waiting here, and the store one stream's reads.
/// A receiver whose client gave up on a poll (a shorter timeout than the wait) is not kept
/// from waiting by its own abandoned poll.
#[derive(Default)]
pub(crate) struct Waiting(Mutex<Turns>);

/// The newest poll's turn of each stream, and the next turn to give: never one given before,
/// so a poll whose stream's entry went and came back is not taken for the newest.
#[derive(Default)]
struct Turns {
    newest: HashMap<StreamId, u64>,
    next: u64,
}

/// A poll's turn to wait on its stream, given up when it ends.
struct Turn<'a> {
    waiting: &'a Waiting,
    stream: StreamId,
    turn: u64,
}

impl Waiting {
    fn take(&self, stream: &StreamId) -> Turn<'_> {
        let mut held = self.0.lock();
        let turn = held.next;
        held.next += 1;
        held.newest.insert(stream.clone(), turn);
        Turn {
            waiting: self,
            stream: stream.clone(),
            turn,
        }
    }
}

impl Turn<'_> {
    /// Whether a newer poll of the stream took over.
    fn superseded(&self) -> bool {
        self.waiting.0.lock().newest.get(&self.stream) != Some(&self.turn)
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut held = self.waiting.0.lock();
        if held.newest.get(&self.stream) == Some(&self.turn) {
            held.newest.remove(&self.stream);
        }
    }
}

impl Ssf {
    /// The SET of an event, signed now.
    pub fn sign(&self, stream: &StreamRecord, event: &SsfEvent) -> String {
        let mut claims = serde_json::json!({
            "iss": self.public_url,
            "aud": stream.aud,
            "jti": event.jti,
            "iat": Millis::now().as_secs(),
        });
        match event.kind.as_str() {
            "verification" => {
                claims["sub_id"] = serde_json::json!({"format": "opaque", "id": stream.id});
                let mut body = serde_json::json!({});
                if let Some(state) = &event.state {
                    body["state"] = state.as_str().into();
                }
                claims["events"] = serde_json::json!({ VERIFICATION: body });
            }
            _ => {
                claims["sub_id"] = serde_json::json!({
                    "format": "iss_sub",
                    "iss": event.issuer,
                    "sub": event.agent_id,
                });
                let mut body = serde_json::json!({"event_timestamp": event.event_at.as_secs()});
                if let Some(reason) = event.reason.as_deref().filter(|r| !r.is_empty()) {
                    body["reason_admin"] = serde_json::json!({ "en": reason });
                }
                claims["events"] = serde_json::json!({ SESSION_REVOKED: body });
            }
        }
        self.signing.sign_json("secevent+jwt", &claims).0
    }

    /// A poll (RFC 8936): acknowledges `ack` (and `set_errs`, which the receiver also has
    /// done with), then answers up to `max` pending SETs, waiting for one up to `POLL_WAIT`
    /// unless `immediately`, or until a newer poll of the stream waits instead ([`Waiting`]).
    pub async fn poll(
        &self,
        id: &StreamId,
        token: Option<&str>,
        ack: &[String],
        max: u32,
        immediately: bool,
    ) -> Result<(Vec<(String, String)>, bool), SsfError> {
        let given = token.map(|t| Sha256::digest(t.as_bytes()));
        // The stream as it stands, with the caller's token still its own.
        let current = || async {
            let stream = self.store.get_stream(id).await?.ok_or(SsfError::NotFound)?;
            let expected = stream.poll_token_hash.as_deref().ok_or(SsfError::NotFound)?;
            if given.as_deref() != Some(expected) {
                return Err(SsfError::BadPollToken);
            }
            Ok(stream)
        };
        let mut stream = current().await?;
        // An acknowledgement with a NUL names no SET (and no database takes it as text).
        let ack: Vec<String> = ack.iter().filter(|j| !j.contains('\0')).cloned().collect();
        if !ack.is_empty() {
            let n = self.store.ack_events(id, &ack).await?;
            metrics::counter!("agentid_ssf_deliveries_total", "outcome" => "acknowledged").increment(n);
        }
        let started = Instant::now();
        let turn = (!immediately).then(|| self.waiting.take(id));
        loop {
            let events = if stream.status == "enabled" {
                self.store.pending_events(id, max + 1).await?
            } else {
                Vec::new()
            };
            let done =
                immediately || started.elapsed() >= POLL_WAIT || turn.as_ref().is_some_and(Turn::superseded);
            if !events.is_empty() || done {
                let more = events.len() > max as usize;
                let now = Millis::now();
                let sets = events
                    .iter()
                    .take(max as usize)
                    .map(|e| {
                        if e.attempts == 0 {
                            metrics::histogram!("agentid_ssf_delivery_delay_seconds")
                                .record((now.0 - e.event_at.0).max(0) as f64 / 1000.0);
                        }
                        (e.jti.clone(), self.sign(&stream, e))
                    })
                    .collect();
                return Ok((sets, more));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
            // Read again while the poll waits: a stream paused, moved to another audience or
            // deleted meanwhile gets nothing more on the old terms.
            stream = current().await?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentid_core::domain::{new_id, IdPrefix};

    /// Attack: poll A waits; B takes over and ends at once; C begins. Turns counted again
    /// from the stream's last entry gave C A's turn: both waited, and A's end cut C short.
    #[test]
    fn a_poll_taken_over_stays_taken_over() {
        let waiting = Waiting::default();
        let stream = StreamId::parse(&new_id(IdPrefix::Stream)).unwrap();
        let a = waiting.take(&stream);
        let b = waiting.take(&stream);
        assert!(a.superseded() && !b.superseded());
        drop(b);
        let c = waiting.take(&stream);
        assert!(a.superseded(), "a newer poll waits");
        assert!(!c.superseded());
        drop(a);
        assert!(!c.superseded(), "the older poll's end leaves the newest waiting");
    }
}
