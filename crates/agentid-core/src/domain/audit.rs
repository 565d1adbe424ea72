//! Audit records and their hash chain: `hash = SHA-256(prev_hash ‖ canonical bytes)`,
//! genesis `prev_hash` = 32 zero bytes, sequence numbers 1, 2, 3 … without gaps per ledger.

use std::cell::RefCell;

use sha2::{Digest, Sha256};

use super::{Ledger, Millis, VerifyResult};

pub const GENESIS: [u8; 32] = [0u8; 32];

/// What a record records: a check of a token (at verify, introspection), an agent's
/// request for an access token, which checks the credential it authenticated with, or (in
/// the service's own ledger only) that the fleet's issuer-domain list grew, so that a
/// checkpoint commits to the longer list even when no other record is written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Event {
    #[default]
    Verification,
    TokenRequest,
    DomainList,
}

impl Event {
    /// In the order of [`Event::index`].
    pub const ALL: [Event; 3] = [Event::Verification, Event::TokenRequest, Event::DomainList];

    /// As the log shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            Event::Verification => "verification",
            Event::TokenRequest => "token_request",
            Event::DomainList => "domain_list",
        }
    }

    /// Its place in [`Event::ALL`] (how a stored block writes it).
    pub fn index(self) -> usize {
        self as usize
    }

    /// The value of the record's `event` member in its canonical bytes; a verification has
    /// none (every chain written before token requests existed hashes as it did).
    fn canonical(self) -> Option<&'static str> {
        match self {
            Event::Verification => None,
            e => Some(e.as_str()),
        }
    }
}

/// A verification to be recorded (not yet placed in a chain).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEntry {
    pub ledger: Ledger,
    pub event: Event,
    pub agent_id: String,
    pub result: VerifyResult,
    pub failure_reason: Option<String>,
    pub latency_us: i64,
    pub requested_at: Millis,
    /// The revocation epoch up to which the check knew every revocation (read before it
    /// looked the agent up in the revocation index). Not recorded: it tells the store whether
    /// a `valid` entry must be re-checked against revocations committed since.
    pub revocations_seen: i64,
}

/// The most characters of a failure reason a record keeps (a revocation's reason of 512 and
/// its prefix fit): a longer one, which holds text a caller chose, is cut there and ends in
/// an ellipsis, so that no caller can make a ledger hold more.
pub const MAX_FAILURE_REASON: usize = 1024;

fn bounded(reason: String) -> String {
    match reason.char_indices().nth(MAX_FAILURE_REASON) {
        Some((at, _)) => {
            let mut cut = reason;
            cut.truncate(at);
            cut.push('…');
            cut
        }
        None => reason,
    }
}

/// A record placed in its ledger's chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRecord {
    pub ledger: Ledger,
    pub seq: i64,
    pub id: String,
    pub event: Event,
    pub agent_id: String,
    pub result: VerifyResult,
    pub failure_reason: Option<String>,
    pub latency_us: i64,
    pub requested_at: Millis,
    pub prev_hash: [u8; 32],
    pub hash: [u8; 32],
}

impl AuditRecord {
    /// Places `entry` after a record whose hash is `prev_hash` and sequence number `seq - 1`,
    /// its failure reason bounded by [`MAX_FAILURE_REASON`].
    pub fn seal(entry: AuditEntry, id: String, seq: i64, prev_hash: [u8; 32]) -> Self {
        let mut rec = AuditRecord {
            ledger: entry.ledger,
            seq,
            id,
            event: entry.event,
            agent_id: entry.agent_id,
            result: entry.result,
            failure_reason: entry.failure_reason.map(bounded),
            latency_us: entry.latency_us,
            requested_at: entry.requested_at,
            prev_hash,
            hash: [0; 32],
        };
        rec.hash = rec.compute_hash();
        rec
    }

    /// The bytes the chain hashes, as a vector (the tests' view of `write_canonical`).
    #[cfg(test)]
    pub(crate) fn canonical_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_canonical(&mut out);
        out
    }

    /// Appends the bytes the chain hashes to `out`: JSON, members in lexicographic order, no
    /// white space, strings escaped as `serde_json` escapes them (the form every existing
    /// chain was hashed in; a unit test holds the two together). Written by hand: through
    /// `serde_json` this was most of a record's sealing cost on the writer's thread.
    fn write_canonical(&self, out: &mut Vec<u8>) {
        out.reserve(
            160 + self.agent_id.len()
                + self.id.len()
                + self.ledger.org_id.len()
                + self.failure_reason.as_ref().map_or(0, String::len),
        );
        out.extend_from_slice(b"{\"agent_id\":");
        json_str(out, &self.agent_id);
        if let Some(event) = self.event.canonical() {
            out.extend_from_slice(b",\"event\":");
            json_str(out, event);
        }
        out.extend_from_slice(b",\"failure_reason\":");
        match &self.failure_reason {
            Some(reason) => json_str(out, reason),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"id\":");
        json_str(out, &self.id);
        out.extend_from_slice(b",\"latency_us\":");
        out.extend_from_slice(itoa::Buffer::new().format(self.latency_us).as_bytes());
        out.extend_from_slice(b",\"mode\":");
        json_str(out, self.ledger.mode.as_str());
        out.extend_from_slice(b",\"org_id\":");
        json_str(out, &self.ledger.org_id);
        out.extend_from_slice(b",\"requested_at\":");
        out.extend_from_slice(itoa::Buffer::new().format(self.requested_at.0).as_bytes());
        out.extend_from_slice(b",\"result\":");
        json_str(out, self.result.as_str());
        out.extend_from_slice(b",\"seq\":");
        out.extend_from_slice(itoa::Buffer::new().format(self.seq).as_bytes());
        out.push(b'}');
    }

    pub fn compute_hash(&self) -> [u8; 32] {
        // The canonical bytes go through a buffer the thread keeps, so hashing a record
        // allocates nothing: every record of every batch is hashed on the writer's thread.
        thread_local! {
            static CANONICAL: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
        }
        CANONICAL.with_borrow_mut(|buf| {
            buf.clear();
            self.write_canonical(buf);
            Sha256::new()
                .chain_update(self.prev_hash)
                .chain_update(&buf[..])
                .finalize()
                .into()
        })
    }
}

/// The bytes a block of a ledger's records is sealed over (`KeyRing::audit_block_sealer`): where
/// it sits in its ledger and the chain's hashes at its two ends. The chain ties every record's
/// bytes to `last_hash` (`audit verify` recomputes it), so a block written with database
/// access alone has no seal that checks, and a seal copied from another block names that
/// block's place.
pub fn block_seal_input(
    ledger: &Ledger,
    first_seq: i64,
    last_seq: i64,
    prev_hash: &[u8; 32],
    last_hash: &[u8; 32],
) -> Vec<u8> {
    let org = ledger.org_id.as_bytes();
    let mut out = Vec::with_capacity(32 + org.len() + 8 + 16 + 64);
    out.extend_from_slice(b"agentid audit block v1\n");
    out.extend_from_slice(&(org.len() as u64).to_be_bytes());
    out.extend_from_slice(org);
    out.extend_from_slice(ledger.mode.as_str().as_bytes());
    out.push(b'\n');
    out.extend_from_slice(&first_seq.to_be_bytes());
    out.extend_from_slice(&last_seq.to_be_bytes());
    out.extend_from_slice(prev_hash);
    out.extend_from_slice(last_hash);
    out
}

/// A JSON string. Ids, modes and results never need escaping; a string that does (a
/// revocation reason may hold anything) is written by `serde_json` itself, so the bytes are
/// exactly its bytes.
fn json_str(out: &mut Vec<u8>, s: &str) {
    if s.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\') {
        serde_json::to_writer(&mut *out, s).expect("a string serializes into a Vec");
    } else {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    }
}

/// The text a revoked verification records as its failure reason.
pub fn revoked_failure_reason(reason: Option<&str>) -> String {
    match reason {
        Some(r) if !r.is_empty() => format!("agent revoked: {r}"),
        _ => "agent revoked".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::KeyMode;

    fn entry(agent: &str) -> AuditEntry {
        AuditEntry {
            ledger: Ledger {
                org_id: "org_1".into(),
                mode: KeyMode::Live,
            },
            event: Event::Verification,
            agent_id: agent.into(),
            result: VerifyResult::Valid,
            failure_reason: None,
            latency_us: 12,
            requested_at: Millis(1000),
            revocations_seen: 0,
        }
    }

    /// How the canonical bytes were first defined: `serde_json` of the members in order.
    #[derive(serde::Serialize)]
    struct Reference<'a> {
        agent_id: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        event: Option<&'a str>,
        failure_reason: Option<&'a str>,
        id: &'a str,
        latency_us: i64,
        mode: &'a str,
        org_id: &'a str,
        requested_at: i64,
        result: &'a str,
        seq: i64,
    }

    fn reference(r: &AuditRecord) -> Vec<u8> {
        serde_json::to_vec(&Reference {
            agent_id: &r.agent_id,
            event: r.event.canonical(),
            failure_reason: r.failure_reason.as_deref(),
            id: &r.id,
            latency_us: r.latency_us,
            mode: r.ledger.mode.as_str(),
            org_id: &r.ledger.org_id,
            requested_at: r.requested_at.0,
            result: r.result.as_str(),
            seq: r.seq,
        })
        .unwrap()
    }

    #[test]
    fn a_long_reason_is_cut_at_a_character() {
        let sealed = |reason: String| {
            let mut e = entry("agt_x");
            e.failure_reason = Some(reason);
            AuditRecord::seal(e, "log_1".into(), 1, GENESIS)
                .failure_reason
                .unwrap()
        };
        let kept = "é".repeat(MAX_FAILURE_REASON);
        assert_eq!(sealed(kept.clone()), kept);
        let cut = sealed("é".repeat(MAX_FAILURE_REASON + 1));
        assert_eq!(cut, format!("{kept}…"));
    }

    #[test]
    fn canonical_bytes_are_serde_json_bytes_for_any_string() {
        let odd = [
            "",
            "plain",
            "quote \" and backslash \\",
            "controls \u{0}\u{1}\u{8}\t\n\u{b}\u{c}\r\u{1f} end",
            "del \u{7f}, slash /, unicode é ✓ 😀, escapes \\u0041",
            "\"",
            "\\",
        ];
        let mut n = 0;
        for (i, s) in odd.iter().enumerate() {
            for result in [VerifyResult::Valid, VerifyResult::Invalid, VerifyResult::Revoked] {
                let mut e = entry(s);
                e.ledger.org_id = odd[(i + 1) % odd.len()].into();
                e.ledger.mode = if i % 2 == 0 { KeyMode::Live } else { KeyMode::Test };
                e.result = result;
                e.event = Event::ALL[(i + n) % Event::ALL.len()];
                e.failure_reason = (result != VerifyResult::Valid).then(|| s.to_string());
                e.latency_us = [0, -1, i64::MAX, i64::MIN, 12][i % 5];
                e.requested_at = Millis([1_795_000_000_000, 0, -5][i % 3]);
                let seq = [1, i64::MAX, 987_654_321][i % 3];
                let r = AuditRecord::seal(e, odd[(i + 2) % odd.len()].into(), seq, GENESIS);
                assert_eq!(r.canonical_bytes(), reference(&r), "{r:?}");
                n += 1;
            }
        }
        assert_eq!(n, 21);
    }

    #[test]
    fn canonical_bytes_are_stable() {
        let a = AuditRecord::seal(entry("agt_x"), "log_1".into(), 1, GENESIS);
        assert_eq!(
            String::from_utf8(a.canonical_bytes()).unwrap(),
            r#"{"agent_id":"agt_x","failure_reason":null,"id":"log_1","latency_us":12,"mode":"live","org_id":"org_1","requested_at":1000,"result":"valid","seq":1}"#
        );
        let token = AuditEntry {
            event: Event::TokenRequest,
            ..entry("agt_x")
        };
        let t = AuditRecord::seal(token, "log_1".into(), 1, GENESIS);
        assert_eq!(
            String::from_utf8(t.canonical_bytes()).unwrap(),
            r#"{"agent_id":"agt_x","event":"token_request","failure_reason":null,"id":"log_1","latency_us":12,"mode":"live","org_id":"org_1","requested_at":1000,"result":"valid","seq":1}"#
        );
        assert_ne!(a.hash, t.hash);
        let list = AuditEntry {
            event: Event::DomainList,
            ..entry("")
        };
        let l = AuditRecord::seal(list, "log_1".into(), 1, GENESIS);
        assert!(String::from_utf8(l.canonical_bytes())
            .unwrap()
            .starts_with(r#"{"agent_id":"","event":"domain_list","failure_reason":null,"#));
        assert!(Event::ALL.iter().enumerate().all(|(i, e)| e.index() == i));
    }
}
