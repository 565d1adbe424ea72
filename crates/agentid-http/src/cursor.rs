//! Opaque, tamper-proof cursors for `GET /v1/log`: the last sequence number seen, bound by an
//! HMAC to the ledger and filters of the query that issued it. Any instance sharing the
//! signing key accepts them.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use agentid_core::domain::{Ledger, VerifyResult};

/// What a cursor is valid for.
pub(crate) struct CursorScope<'a> {
    pub(crate) ledger: &'a Ledger,
    pub(crate) agent_id: Option<&'a str>,
    pub(crate) result: Option<VerifyResult>,
}

const MAC_LEN: usize = 16;

fn mac(secret: &[u8; 32], scope: &CursorScope<'_>, seq: i64) -> Hmac<Sha256> {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC takes any key length");
    for part in [
        b"agentid log cursor v1".as_slice(),
        scope.ledger.org_id.as_bytes(),
        scope.ledger.mode.as_str().as_bytes(),
        scope.agent_id.unwrap_or("").as_bytes(),
        scope.result.map_or("", |r| r.as_str()).as_bytes(),
    ] {
        m.update(&(part.len() as u32).to_be_bytes());
        m.update(part);
    }
    m.update(&seq.to_be_bytes());
    m
}

pub fn encode(secret: &[u8; 32], scope: &CursorScope<'_>, seq: i64) -> String {
    let mut raw = Vec::with_capacity(8 + MAC_LEN);
    raw.extend_from_slice(&seq.to_be_bytes());
    raw.extend_from_slice(&mac(secret, scope, seq).finalize().into_bytes()[..MAC_LEN]);
    URL_SAFE_NO_PAD.encode(raw)
}

/// The sequence number a cursor stands for, or `None` if this service did not issue it
/// for this query.
pub fn decode(secret: &[u8; 32], scope: &CursorScope<'_>, cursor: &str) -> Option<i64> {
    if cursor.len() > 64 {
        return None;
    }
    let raw = URL_SAFE_NO_PAD.decode(cursor).ok()?;
    if raw.len() != 8 + MAC_LEN {
        return None;
    }
    let seq = i64::from_be_bytes(raw[..8].try_into().ok()?);
    let ok = mac(secret, scope, seq).verify_truncated_left(&raw[8..]).is_ok();
    (ok && seq > 0).then_some(seq)
}

/// A cursor of `GET /v1/agents`: the last agent id of a page, bound by an HMAC to the
/// organization and mode that listed it.
pub(crate) fn encode_agent(secret: &[u8; 32], ledger: &Ledger, agent_id: &str) -> String {
    let mut raw = agent_id.as_bytes().to_vec();
    raw.extend_from_slice(&agent_mac(secret, ledger, agent_id).finalize().into_bytes()[..MAC_LEN]);
    URL_SAFE_NO_PAD.encode(raw)
}

/// The agent id a `GET /v1/agents` cursor stands for, or `None` if this service did not issue
/// it for this organization and mode.
pub(crate) fn decode_agent(secret: &[u8; 32], ledger: &Ledger, cursor: &str) -> Option<String> {
    if cursor.len() > 128 {
        return None;
    }
    let raw = URL_SAFE_NO_PAD.decode(cursor).ok()?;
    let (id, tag) = raw.split_at(raw.len().checked_sub(MAC_LEN)?);
    let id = std::str::from_utf8(id).ok()?;
    agent_mac(secret, ledger, id)
        .verify_truncated_left(tag)
        .is_ok()
        .then(|| id.to_owned())
}

fn agent_mac(secret: &[u8; 32], ledger: &Ledger, agent_id: &str) -> Hmac<Sha256> {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC takes any key length");
    for part in [
        b"agentid agents cursor v1".as_slice(),
        ledger.org_id.as_bytes(),
        ledger.mode.as_str().as_bytes(),
        agent_id.as_bytes(),
    ] {
        m.update(&(part.len() as u32).to_be_bytes());
        m.update(part);
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentid_core::domain::KeyMode;

    #[test]
    fn cursors_are_bound_to_their_query() {
        let secret = [9u8; 32];
        let ledger = Ledger {
            org_id: "org_a".into(),
            mode: KeyMode::Live,
        };
        let scope = CursorScope {
            ledger: &ledger,
            agent_id: None,
            result: None,
        };
        let c = encode(&secret, &scope, 42);
        assert_eq!(decode(&secret, &scope, &c), Some(42));
        let other = Ledger {
            org_id: "org_b".into(),
            mode: KeyMode::Live,
        };
        let other_scope = CursorScope {
            ledger: &other,
            agent_id: None,
            result: None,
        };
        assert_eq!(decode(&secret, &other_scope, &c), None);
        let filtered = CursorScope {
            ledger: &ledger,
            agent_id: None,
            result: Some(VerifyResult::Valid),
        };
        assert_eq!(decode(&secret, &filtered, &c), None);
        assert_eq!(decode(&[1u8; 32], &scope, &c), None);
        assert_eq!(decode(&secret, &scope, "garbage"), None);
        let mut tampered = URL_SAFE_NO_PAD.decode(&c).unwrap();
        tampered[7] ^= 1;
        assert_eq!(decode(&secret, &scope, &URL_SAFE_NO_PAD.encode(tampered)), None);
    }
}

/// The cursor decoder never panics, whatever it is given (fixed seed).
#[cfg(test)]
mod props {
    use proptest::prelude::*;

    use super::*;
    use agentid_core::domain::KeyMode;

    proptest! {
        #![proptest_config(agentid_core::testing::fixed_seed(31, 256))]

        #[test]
        fn any_text_and_changed_cursors(s in "\\PC{0,200}", at in any::<usize>(), byte in any::<u8>()) {
            let ledger = Ledger { org_id: "org_1".into(), mode: KeyMode::Live };
            let scope = CursorScope { ledger: &ledger, agent_id: None, result: None };
            let _ = decode(&[9; 32], &scope, &s);
            let mut b = encode(&[9; 32], &scope, 12345).into_bytes();
            let at = at % b.len();
            b[at] = byte;
            let _ = decode(&[9; 32], &scope, &String::from_utf8_lossy(&b));
        }
    }
}
