//! The fleet's signing keys and their rotation.
//!
//! The key file holds the fleet's first key (the root: it also seals the others, and derives
//! the cursor MAC secret and the log key, so neither changes with a rotation). Keys added by
//! `agentid signing-key rotate` are stored in the database, their private halves sealed under
//! the root. Each key is, at a given time:
//! - `next`: published in JWKS, not signing yet (`activates_at` is ahead);
//! - `active`: the one key that signs (the newest activated one); it validates tokens;
//! - `replaced`: a newer key signs, but tokens this one signed have not all expired: it still
//!   validates them;
//! - `retired`: retired by hand, or replaced and past the expiry of the last token it signed.
//!   Its tokens no longer verify and it leaves JWKS.
//!
//! Every instance reads the keys every few seconds (the engine hands them in), so a rotation or a
//! retirement reaches the fleet with no file copied anywhere.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use ed25519_dalek::{SigningKey, VerifyingKey};
use parking_lot::RwLock;
use serde::Serialize;

use super::{KeyError, KeyRing, PublicKeys};
use crate::domain::Millis;
use crate::token::Claims;

/// A signing key as the fleet records it.
#[derive(Clone, PartialEq, Eq)]
pub struct SigningKeyRecord {
    /// RFC 7638 thumbprint.
    pub kid: String,
    pub public_key: [u8; 32],
    pub created_at: Millis,
    /// The private half sealed under the key file ([`KeyRing::seal_key`]); `None` for the key
    /// file's own key.
    pub sealed: Option<Vec<u8>>,
    /// When it starts signing (`None`: at `created_at`).
    pub activates_at: Option<Millis>,
    /// Retired by hand: its tokens no longer verify.
    pub retired_at: Option<Millis>,
    /// The latest expiry of a token it signed.
    pub last_expires_at: Option<Millis>,
}

impl SigningKeyRecord {
    /// A key recorded now, signing from `activates_at`.
    pub fn new(kid: String, public_key: [u8; 32], sealed: Option<Vec<u8>>, activates_at: Millis) -> Self {
        SigningKeyRecord {
            kid,
            public_key,
            created_at: Millis::now(),
            sealed,
            activates_at: Some(activates_at),
            retired_at: None,
            last_expires_at: None,
        }
    }

    pub(crate) fn activates(&self) -> Millis {
        self.activates_at.unwrap_or(self.created_at)
    }
}

impl fmt::Debug for SigningKeyRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SigningKeyRecord")
            .field("kid", &self.kid)
            .field("activates_at", &self.activates_at)
            .field("retired_at", &self.retired_at)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyState {
    Next,
    Active,
    Replaced,
    Retired,
    /// A row the key file does not vouch for (written into the database by someone else): it
    /// counts nowhere, and [`states`] never gives it.
    Unvouched,
}

/// One key as `agentid signing-key list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyView {
    pub kid: String,
    pub state: KeyState,
    pub created_at: Millis,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub activates_at: Option<Millis>,
}

/// Each recorded key's state at `now`, and the index of the key that signs (the newest
/// active one), if any is active.
pub fn states(keys: &[SigningKeyRecord], now: Millis) -> (Vec<KeyState>, Option<usize>) {
    // Not retired by hand. A retirement counts whatever its time: the service dates one now,
    // so a time ahead was written past the database's rules, and would keep the key alive.
    let live = |k: &SigningKeyRecord| k.retired_at.is_none();
    let signer = keys
        .iter()
        .enumerate()
        .filter(|(_, k)| live(k) && k.activates() <= now)
        .max_by_key(|(_, k)| (k.activates(), k.created_at))
        .map(|(i, _)| i);
    let states = keys
        .iter()
        .enumerate()
        .map(|(i, k)| {
            if !live(k) {
                KeyState::Retired
            } else if k.activates() > now {
                KeyState::Next
            } else if Some(i) == signer {
                KeyState::Active
            } else if k.last_expires_at.is_some_and(|e| e > now) {
                // Replaced, but tokens it signed are still valid.
                KeyState::Replaced
            } else {
                KeyState::Retired
            }
        })
        .collect();
    (states, signer)
}

/// The key set in force: who signs, and what validates.
pub struct KeySet {
    kid: String,
    signer: SigningKey,
    public: Arc<PublicKeys>,
    /// The kids of the validating keys and the signer, to tell whether a refresh changed
    /// anything.
    fingerprint: String,
    /// The vouched-for keys that were retired at `now`.
    retired: Vec<String>,
}

/// A recorded key that does not count, and why.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Unvouched {
    pub kid: String,
    pub why: &'static str,
}

impl fmt::Display for Unvouched {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "signing key {:?} is not vouched for by the key file: {}",
            self.kid, self.why
        )
    }
}

/// Whether the key file (`root`) vouches for a recorded key. Its `kid` must be the RFC 7638
/// thumbprint of its public key, and either it is the key file's own key, or its sealed
/// private half opens under the key file (bound to its `kid` and activation time) and
/// derives exactly its public key. A row written with database access alone (no private
/// half, or one sealed under another key file), a public key swapped under a sealed half,
/// or an activation time moved, never counts.
pub fn vouch(root: &KeyRing, key: &SigningKeyRecord) -> Result<(), Unvouched> {
    let refuse = |why| {
        Err(Unvouched {
            kid: key.kid.clone(),
            why,
        })
    };
    let Ok(public) = VerifyingKey::from_bytes(&key.public_key) else {
        return refuse("its public key is not an Ed25519 point");
    };
    if super::thumbprint(&public) != key.kid {
        return refuse("its kid is not the thumbprint of its public key");
    }
    match &key.sealed {
        None if key.public_key == root.public_key_bytes() => Ok(()),
        None => refuse("it has no private half, and it is not the key file's key"),
        Some(sealed) => match root.open_key(&key.kid, key.activates(), sealed) {
            Some(private) if private.verifying_key().to_bytes() == key.public_key => Ok(()),
            Some(_) => refuse("its sealed private half belongs to another public key"),
            None => refuse(
                "its sealed private half does not open under the key file for its kid and \
                 activation time",
            ),
        },
    }
}

/// The recorded keys the key file vouches for, and the others.
pub fn vouched(root: &KeyRing, keys: &[SigningKeyRecord]) -> (Vec<SigningKeyRecord>, Vec<Unvouched>) {
    let mut good = Vec::with_capacity(keys.len());
    let mut bad = Vec::new();
    for k in keys {
        match vouch(root, k) {
            Ok(()) => good.push(k.clone()),
            Err(u) => bad.push(u),
        }
    }
    (good, bad)
}

impl KeySet {
    /// The key set of the recorded keys at `now`, of those the key file vouches for (see
    /// [`vouch`]), with every key in `retired` retired whatever its row now says. A key the
    /// root cannot open is no key: every instance must be able to sign with the active key.
    pub fn build(
        root: &KeyRing,
        keys: &[SigningKeyRecord],
        retired: &HashSet<String>,
        now: Millis,
    ) -> Result<(KeySet, Vec<Unvouched>), KeyError> {
        let (mut keys, unvouched) = vouched(root, keys);
        for k in keys.iter_mut().filter(|k| retired.contains(&k.kid)) {
            k.retired_at = Some(Millis(i64::MIN));
        }
        let (states, signer) = states(&keys, now);
        let signer = signer.ok_or_else(|| {
            KeyError::Recorded(if unvouched.is_empty() {
                "no active signing key is recorded".into()
            } else {
                format!(
                    "no active signing key is recorded that the key file vouches for ({})",
                    unvouched
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("; ")
                )
            })
        })?;
        let record = &keys[signer];
        let signing = match &record.sealed {
            None => root.signing_key().clone(),
            Some(sealed) => root
                .open_key(&record.kid, record.activates(), sealed)
                .expect("a vouched-for key opens"),
        };
        let mut validating = Vec::new();
        let mut retired_now = Vec::new();
        let mut fingerprint = format!("{}:", record.kid);
        for (k, state) in keys.iter().zip(&states) {
            if *state == KeyState::Retired {
                retired_now.push(k.kid.clone());
            } else {
                let key = VerifyingKey::from_bytes(&k.public_key).expect("a vouched-for key is a point");
                validating.push(key);
                fingerprint.push_str(&k.kid);
                fingerprint.push(',');
            }
        }
        Ok((
            KeySet {
                kid: record.kid.clone(),
                public: Arc::new(PublicKeys::new(&signing.verifying_key(), &validating)),
                signer: signing,
                fingerprint,
                retired: retired_now,
            },
            unvouched,
        ))
    }

    pub fn public(&self) -> &Arc<PublicKeys> {
        &self.public
    }
}

/// The key set this instance uses, replaced when the recorded keys change. It never goes
/// back: a key it has once seen retired stays retired here whatever the database says later
/// (a `retired_at` set back to NULL, a replaced key's `last_expires_at` pushed out).
pub struct SigningKeys {
    root: Arc<KeyRing>,
    current: RwLock<Arc<KeySet>>,
    /// Every key this instance has seen retired.
    retired: RwLock<HashSet<String>>,
    /// The unvouched keys already reported, so that each is reported once.
    reported: RwLock<HashSet<Unvouched>>,
}

/// What a refresh of the key set found.
#[derive(Default)]
pub struct Refreshed {
    /// The new public keys, when the key set changed.
    pub changed: Option<Arc<PublicKeys>>,
    /// Recorded keys the key file does not vouch for, not reported before.
    pub unvouched: Vec<Unvouched>,
}

impl SigningKeys {
    /// The key set of `keys` at `now`, and the keys the key file does not vouch for.
    pub fn new(
        root: Arc<KeyRing>,
        keys: &[SigningKeyRecord],
        now: Millis,
    ) -> Result<(Self, Vec<Unvouched>), KeyError> {
        let (first, unvouched) = KeySet::build(&root, keys, &HashSet::new(), now)?;
        let signing = SigningKeys {
            root,
            retired: RwLock::new(first.retired.iter().cloned().collect()),
            reported: RwLock::new(unvouched.iter().cloned().collect()),
            current: RwLock::new(Arc::new(first)),
        };
        Ok((signing, unvouched))
    }

    pub fn current(&self) -> Arc<KeySet> {
        self.current.read().clone()
    }

    /// Signs with the active key; returns the token and the key's `kid`.
    pub fn sign(&self, claims: &Claims) -> (String, String) {
        let set = self.current();
        (
            crate::token::encode(&set.signer, &set.kid, claims),
            set.kid.clone(),
        )
    }

    /// Signs a JSON payload as a JWS of type `typ` with the active key; returns it and the kid.
    pub fn sign_json(&self, typ: &str, payload: &serde_json::Value) -> (String, String) {
        let set = self.current();
        (
            crate::token::encode_json(&set.signer, &set.kid, typ, payload),
            set.kid.clone(),
        )
    }

    /// The kid of the active key.
    pub fn signing_kid(&self) -> String {
        self.current().kid.clone()
    }

    /// Builds the key set of `keys` at `now`, and replaces the current one when it differs.
    pub fn update(&self, keys: &[SigningKeyRecord], now: Millis) -> Result<Refreshed, KeyError> {
        let (next, unvouched) = KeySet::build(&self.root, keys, &self.retired.read(), now)?;
        self.retired.write().extend(next.retired.iter().cloned());
        let unvouched = {
            let mut reported = self.reported.write();
            unvouched
                .into_iter()
                .filter(|u| reported.insert(u.clone()))
                .collect()
        };
        if next.fingerprint == self.current.read().fingerprint {
            return Ok(Refreshed {
                changed: None,
                unvouched,
            });
        }
        let public = next.public.clone();
        *self.current.write() = Arc::new(next);
        Ok(Refreshed {
            changed: Some(public),
            unvouched,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(kid: &str, created: i64, activates: Option<i64>) -> SigningKeyRecord {
        SigningKeyRecord {
            kid: kid.into(),
            public_key: [0; 32],
            created_at: Millis(created),
            sealed: None,
            activates_at: activates.map(Millis),
            retired_at: None,
            last_expires_at: None,
        }
    }

    #[test]
    fn states_follow_activation_replacement_expiry_and_retirement() {
        let mut a = key("a", 0, None);
        a.last_expires_at = Some(Millis(500));
        let b = key("b", 100, Some(200));
        let keys = vec![a.clone(), b.clone()];
        use KeyState::*;
        assert_eq!(states(&keys, Millis(150)), (vec![Active, Next], Some(0)));
        // b signs from 200; a validates until its last token expires at 500.
        assert_eq!(states(&keys, Millis(300)), (vec![Replaced, Active], Some(1)));
        assert_eq!(states(&keys, Millis(600)), (vec![Retired, Active], Some(1)));
        // Retired by hand: at once.
        let mut a2 = a.clone();
        a2.retired_at = Some(Millis(250));
        assert_eq!(
            states(&[a2, b.clone()], Millis(300)),
            (vec![Retired, Active], Some(1))
        );
        // A retirement dated ahead counts at once.
        let mut a3 = a.clone();
        a3.retired_at = Some(Millis(i64::MAX));
        assert_eq!(
            states(&[a3, b.clone()], Millis(300)),
            (vec![Retired, Active], Some(1))
        );
        // Retiring the newer one puts the older back to signing.
        let mut b2 = b;
        b2.retired_at = Some(Millis(250));
        assert_eq!(states(&[a, b2], Millis(300)), (vec![Active, Retired], Some(0)));
    }
}
