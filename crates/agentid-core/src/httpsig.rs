//! Signed HTTP requests (RFC 9421) as Web Bot Auth uses them
//! (draft-meunier-webbotauth-httpsig-protocol-01): the signature a request carries under a
//! tag, its parameters and times, the `Signature-Agent` that names where its key is
//! published, and the signature base to check it against. Structured fields are read and
//! written by `sfv` (RFC 8941/9651); the signature is checked by `ed25519-dalek`
//! (`verify_strict`) or, for a third party's RSA key, by `ring` (RSASSA-PSS with SHA-512).
//! Pure: the caller finds the key.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ed25519_dalek::{Signature, VerifyingKey};
use ring::signature::{RsaPublicKeyComponents, RSA_PSS_2048_8192_SHA512};
use serde_json::Value;
use sfv::{BareItem, InnerList, Item, List, ListEntry, Parser, SerializeValue};
use sha2::{Digest, Sha256};

use crate::token::dpop::PublicJwk;

/// The longest time a signature may cover (`expires - created`).
pub const MAX_VALIDITY_SECS: i64 = 24 * 60 * 60;
/// The tag of Web Bot Auth signatures.
pub const WEB_BOT_AUTH: &str = "web-bot-auth";
/// The longest field value read.
const MAX_FIELD: usize = 8192;
/// The most components a signature may cover.
const MAX_COMPONENTS: usize = 32;
/// The RFC 7638 thumbprints of RFC 9421's published test keys (Appendix B.1.4, Ed25519;
/// B.1.2, RSA-PSS; B.1.1, RSA), with which the Web Bot Auth drafts' examples are signed:
/// everyone has their private halves, so a signature by one proves nothing.
pub const PUBLISHED_TEST_KEYS: [&str; 3] = [
    "poqkLGiymh_W0uP6PZFw-dvez3QJT5SolqXBCW38r0U",
    "oD0HwocPBSfpNy5W3bpJeyFGY_IQ_YpqxSjQ3Yd-CLA",
    "BHj8s0GPnMEQtkaULIM-PLgEhLBbuGUQ1vMxmBWZzEo",
];
/// The moduli of RFC 9421's RSA test keys (Appendix B.1.2, B.1.1): with their published
/// primes, a key of either modulus and any exponent has a private half anyone can compute.
const PUBLISHED_RSA_MODULI: [&str; 2] = [
    "r4tmm3r20Wd_PbqvP1s2-QEtvpuRaV8Yq40gjUR8y2Rjxa6dpG2GXHbPfvMs8ct-Lh1GH45x28Rw3Ry53mm-oAXjyQ86OnDkZ5N8lYbggD4O3w6M6pAvLkhk95AndTrifbIFPNU8PPMO7OyrFAHqgDsznjPFmTOtCEcN2Z1FpWgchwuYLPL-Wokqltd11nqqzi-bJ9cvSKADYdUAAN5WUtzdpiy6LbTgSxP7ociU4Tn0g5I6aDZJ7A8Lzo0KSyZYoA485mqcO0GVAdVw9lq4aOT9v6d-nb4bnNkQVklLQ3fVAvJm-xdDOp9LCNCN48V2pnDOkFV6-U9nV5oyc6XI2w",
    "hAKYdtoeoy8zcAcR874L8cnZxKzAGwd7v36APp7Pv6Q2jdsPBRrwWEBnez6d0UDKDwGbc6nxfEXAy5mbhgajzrw3MOEt8uA5txSKobBpKDeBLOsdJKFqMGmXCQvEG7YemcxDTRPxAleIAgYYRjTSd_QBwVW9OwNFhekro3RtlinV0a75jfZgkne_YiktSvLG34lw2zqXBDTC5NHROUqGTlML4PlNZS5Ri2U4aCNx2rUPRcKIlE0PuKxI4T-HIaFpv8-rdV6eUgOrB2xeI1dSFFn_nnv5OoZJEIB-VmuKn3DCUcCZSFlQPSXSfBDiUGhwOw76WuSSsf1D4b_vLoJ10w",
];

/// A request as the receiver got it: its method, its absolute target URI, and its header
/// fields (names in any case; a name given twice is one field, its values joined by `, `).
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub method: &'a str,
    pub url: &'a str,
    pub headers: &'a [(String, String)],
}

impl Request<'_> {
    fn field(&self, name: &str) -> Option<String> {
        let values: Vec<&str> = self
            .headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim())
            .collect();
        (!values.is_empty()).then(|| values.join(", "))
    }
}

/// Why a request's signature counts for nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// It carries no signature under the tag asked for.
    Unsigned(String),
    /// It carries one, and it is malformed, out of its time, or covers too little.
    Invalid(String),
}

fn invalid<T>(why: impl Into<String>) -> Result<T, Refusal> {
    Err(Refusal::Invalid(why.into()))
}

/// A signature read from a request, ready to be checked with the key `keyid` names.
#[derive(Debug, Clone)]
pub struct Signed {
    pub label: String,
    /// Where the signer publishes its keys (`Signature-Agent`), when the request names it.
    pub signature_agent: Option<String>,
    pub keyid: String,
    pub tag: String,
    pub created: i64,
    pub expires: i64,
    pub nonce: Option<String>,
    /// The algorithm the signer named (`ed25519` or `rsa-pss-sha512`), if it named one.
    pub alg: Option<String>,
    /// The signature bases it may have been made over: one, or two when a
    /// `"signature-agent";key=…` component may be the dictionary member (draft -01) or the
    /// whole field (as `web-bot-auth` 0.1.3 signs it).
    bases: Vec<Vec<u8>>,
    signature: Vec<u8>,
}

impl Signed {
    /// Whether the signature checks with this key, under the algorithm the signer named (or
    /// the key's, when it named none).
    pub fn verifies_with(&self, key: &SignatureKey) -> bool {
        match (key, self.alg.as_deref()) {
            (SignatureKey::Ed25519(key), None | Some("ed25519")) => {
                let Ok(sig) = Signature::from_slice(&self.signature) else {
                    return false;
                };
                self.bases.iter().any(|b| key.verify_strict(b, &sig).is_ok())
            }
            (SignatureKey::RsaPss { n, e }, None | Some("rsa-pss-sha512")) => {
                let key = RsaPublicKeyComponents { n, e };
                self.bases
                    .iter()
                    .any(|b| key.verify(&RSA_PSS_2048_8192_SHA512, b, &self.signature).is_ok())
            }
            _ => false,
        }
    }

    /// Refuses a signature naming one of RFC 9421's published test keys, out of its time at
    /// `now` (Unix seconds, `max_skew` either way for `created`), or valid for more than a day.
    pub fn check(&self, now: i64, max_skew: i64) -> Result<(), Refusal> {
        if PUBLISHED_TEST_KEYS.contains(&self.keyid.as_str()) {
            return invalid(
                "signed with one of RFC 9421's published test keys, whose private half everyone has",
            );
        }
        let (created, expires) = (self.created, self.expires);
        if expires <= created || expires - created > MAX_VALIDITY_SECS {
            return invalid("expires must come after created, at most 24 h later");
        }
        if created > now + max_skew {
            return invalid("created is in the future");
        }
        if expires <= now {
            return invalid("the signature expired");
        }
        Ok(())
    }
}

/// A key a signature may be checked with: an agent's Ed25519 key, or a third party's RSA key
/// (RSASSA-PSS with SHA-512, RFC 9421 §3.3.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignatureKey {
    Ed25519(VerifyingKey),
    RsaPss { n: Vec<u8>, e: Vec<u8> },
}

impl SignatureKey {
    /// A directory's key (a JWK) and its RFC 7638 thumbprint; `None` for a key of another
    /// type, a malformed one, an RSA modulus under 2048 or over 8192 bits, or one of RFC
    /// 9421's published test keys (an RSA key of a test key's modulus, whatever its exponent;
    /// the Ed25519 test key or its negation).
    pub fn from_jwk(jwk: &Value) -> Option<(String, SignatureKey)> {
        let (kid, key) = match jwk.get("kty")?.as_str()? {
            "OKP" => match PublicJwk::parse(jwk).ok()? {
                PublicJwk::Ed25519 { key, x } => (
                    PublicJwk::Ed25519 { key, x }.thumbprint(),
                    SignatureKey::Ed25519(key),
                ),
                PublicJwk::P256 { .. } => return None,
            },
            "RSA" => {
                let text = |name: &str| jwk.get(name).and_then(Value::as_str);
                let (n64, e64) = (text("n")?, text("e")?);
                let n = URL_SAFE_NO_PAD.decode(n64).ok()?;
                let e = URL_SAFE_NO_PAD.decode(e64).ok()?;
                let minimal = |b: &[u8]| b.first().is_some_and(|&f| f != 0);
                if !minimal(&n) || !minimal(&e) || !(1..=8).contains(&e.len()) {
                    return None;
                }
                let bits = n.len() * 8 - n[0].leading_zeros() as usize;
                let published = PUBLISHED_RSA_MODULI
                    .iter()
                    .any(|m| URL_SAFE_NO_PAD.decode(m).is_ok_and(|m| m == n));
                if !(2048..=8192).contains(&bits) || published {
                    return None;
                }
                (rsa_thumbprint(e64, n64), SignatureKey::RsaPss { n, e })
            }
            _ => return None,
        };
        (!PUBLISHED_TEST_KEYS.contains(&kid.as_str())).then_some((kid, key))
    }
}

/// RFC 7638's thumbprint of an RSA key.
fn rsa_thumbprint(e: &str, n: &str) -> String {
    let canonical = format!(r#"{{"e":"{e}","kty":"RSA","n":"{n}"}}"#);
    URL_SAFE_NO_PAD.encode(Sha256::digest(canonical.as_bytes()))
}

/// Reads the request's signature tagged `tag` and its form; [`Signed::check`] then judges its
/// key and times.
pub fn parse(req: &Request<'_>, tag: &str) -> Result<Signed, Refusal> {
    let (Some(input), Some(signatures)) = (req.field("signature-input"), req.field("signature")) else {
        return Err(Refusal::Unsigned(
            "no Signature-Input and Signature fields".into(),
        ));
    };
    if input.len() > MAX_FIELD || signatures.len() > MAX_FIELD {
        return invalid("a signature field is over 8 KiB");
    }
    let Ok(inputs) = Parser::new(&input).parse_dictionary() else {
        return invalid("Signature-Input is not a structured dictionary");
    };
    let Ok(sigs) = Parser::new(&signatures).parse_dictionary() else {
        return invalid("Signature is not a structured dictionary");
    };
    let found = inputs.iter().find_map(|(label, entry)| match entry {
        ListEntry::InnerList(list) if text_param(list, "tag") == Some(tag) => Some((label, list)),
        _ => None,
    });
    let Some((label, covered)) = found else {
        return Err(Refusal::Unsigned(format!("no signature tagged {tag:?}")));
    };
    let signature = match sigs.get(label.as_str()) {
        Some(ListEntry::Item(Item {
            bare_item: BareItem::ByteSequence(b),
            ..
        })) => b.clone(),
        _ => return invalid(format!("Signature has no byte sequence labelled {label}")),
    };
    let int = |name: &str| {
        covered
            .params
            .get(name)
            .and_then(BareItem::as_integer)
            .map(i64::from)
    };
    let (Some(created), Some(expires)) = (int("created"), int("expires")) else {
        return invalid("created and expires are required");
    };
    let Some(keyid) = text_param(covered, "keyid") else {
        return invalid("keyid is required");
    };
    let alg = match covered
        .params
        .get("alg")
        .map(|a| a.as_string().map(|s| s.as_str()))
    {
        None => None,
        Some(Some(a @ ("ed25519" | "rsa-pss-sha512"))) => Some(a.to_owned()),
        Some(_) => return invalid("alg must be ed25519 or rsa-pss-sha512"),
    };
    let nonce = match covered.params.get("nonce") {
        None => None,
        Some(n) => match n.as_string() {
            Some(n) if !n.as_str().is_empty() => Some(n.as_str().to_owned()),
            _ => return invalid("nonce must be a non-empty string"),
        },
    };
    let (bases, signature_agent) = bases(req, label.as_str(), covered)?;
    Ok(Signed {
        label: label.as_str().to_owned(),
        signature_agent,
        keyid: keyid.to_owned(),
        tag: tag.to_owned(),
        created,
        expires,
        nonce,
        alg,
        bases,
        signature,
    })
}

fn text_param<'a>(list: &'a InnerList, name: &str) -> Option<&'a str> {
    list.params
        .get(name)
        .and_then(BareItem::as_string)
        .map(|s| s.as_str())
}

/// One structured value serialized (an item, or an inner list, with its parameters).
fn serialized(entry: ListEntry) -> String {
    List::from_iter([entry]).serialize_value().unwrap_or_default()
}

/// The signature bases of `covered` over `req`, and the `Signature-Agent` URL.
fn bases(
    req: &Request<'_>,
    label: &str,
    covered: &InnerList,
) -> Result<(Vec<Vec<u8>>, Option<String>), Refusal> {
    let agent_field = req.field("signature-agent");
    if covered.items.len() > MAX_COMPONENTS {
        return invalid(format!(
            "the signature covers more than {MAX_COMPONENTS} components"
        ));
    }
    let mut lines: Vec<Vec<String>> = vec![Vec::new()];
    let mut names = Vec::new();
    let mut agent = None;
    let (mut authority, mut covers_agent) = (false, false);
    for item in &covered.items {
        let Some(name) = item.bare_item.as_string().map(|s| s.as_str().to_owned()) else {
            return invalid("a covered component is not a string");
        };
        let id = serialized(ListEntry::Item(item.clone()));
        if names.contains(&id) {
            return invalid(format!("{name} is covered twice"));
        }
        names.push(id.clone());
        let key = match item.params.iter().next() {
            None => None,
            // RFC 9421 §2.1: `key` names a member of a header's dictionary; a derived component
            // has none (`"@authority";key=…` would read a header named "@authority").
            Some((k, _)) if k.as_str() == "key" && name.starts_with('@') => {
                return invalid(format!("{name} is a derived component: it takes no key"))
            }
            Some((k, v)) if k.as_str() == "key" && item.params.len() == 1 => match v.as_string() {
                Some(s) => Some(s.as_str().to_owned()),
                None => return invalid("a component's key must be a string"),
            },
            Some((k, _)) => return invalid(format!("component parameter {:?} is not supported", k.as_str())),
        };
        authority |= name == "@authority" || name == "@target-uri";
        let values: Vec<String> = if name == "signature-agent" {
            // Once: each reading doubles the bases to try.
            if covers_agent {
                return invalid("Signature-Agent is covered twice");
            }
            covers_agent = true;
            let field = agent_field
                .clone()
                .ok_or_else(|| Refusal::Invalid("covers Signature-Agent, which the request lacks".into()))?;
            let (url, member) = signature_agent(&field, key.as_deref(), label)?;
            agent = Some(url);
            // Draft -01: the member; web-bot-auth 0.1.3: the whole field, even with a key.
            match member {
                Some(m) => vec![m, field],
                None => vec![field],
            }
        } else if let Some(key) = key {
            let field = req
                .field(&name)
                .ok_or_else(|| Refusal::Invalid(format!("covers {name}, which the request lacks")))?;
            let dict = Parser::new(&field)
                .parse_dictionary()
                .map_err(|_| Refusal::Invalid(format!("{name} is not a structured dictionary")))?;
            let member = dict
                .get(key.as_str())
                .ok_or_else(|| Refusal::Invalid(format!("{name} has no member {key}")))?;
            vec![serialized(member.clone())]
        } else {
            vec![component(req, &name)?]
        };
        lines = lines
            .into_iter()
            .flat_map(|done| {
                let id = &id;
                values.iter().map(move |v| {
                    let mut next = done.clone();
                    next.push(format!("{id}: {v}"));
                    next
                })
            })
            .collect();
    }
    if !authority {
        return invalid("the signature covers neither @authority nor @target-uri");
    }
    if agent_field.is_some() && !covers_agent {
        return invalid("the signature does not cover Signature-Agent");
    }
    let params = serialized(ListEntry::InnerList(covered.clone()));
    let bases = lines
        .into_iter()
        .map(|mut l| {
            l.push(format!("\"@signature-params\": {params}"));
            l.join("\n").into_bytes()
        })
        .collect();
    Ok((bases, agent))
}

/// The URL a `Signature-Agent` field names, and the serialized member a `key` picks: a
/// dictionary (draft -01; the member `key`, else the one labelled as the signature, else its
/// only one) or a bare string (the legacy form).
fn signature_agent(field: &str, key: Option<&str>, label: &str) -> Result<(String, Option<String>), Refusal> {
    if field.len() > MAX_FIELD {
        return invalid("Signature-Agent is over 8 KiB");
    }
    if let (Ok(item), None) = (Parser::new(field).parse_item(), key) {
        if let Some(url) = item.bare_item.as_string() {
            return Ok((url.as_str().to_owned(), None));
        }
    }
    let Ok(dict) = Parser::new(field).parse_dictionary() else {
        return invalid("Signature-Agent is neither a string nor a structured dictionary");
    };
    let member = match key {
        Some(k) => dict.get(k),
        None => dict
            .get(label)
            .or_else(|| (dict.len() == 1).then(|| dict.values().next()).flatten()),
    };
    match member {
        Some(ListEntry::Item(item)) => match item.bare_item.as_string() {
            Some(url) => Ok((
                url.as_str().to_owned(),
                key.map(|_| serialized(ListEntry::Item(item.clone()))),
            )),
            None => invalid("the Signature-Agent member is not a string"),
        },
        _ => invalid("Signature-Agent has no member for this signature"),
    }
}

/// A derived component's value (RFC 9421 §2.2), or a header field's.
fn component(req: &Request<'_>, name: &str) -> Result<String, Refusal> {
    let (scheme, rest) = req
        .url
        .split_once("://")
        .ok_or_else(|| Refusal::Invalid("the request's url is not absolute".into()))?;
    let (authority, path_query) = match rest.find(['/', '?']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let (path, query) = match path_query.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (path_query, None),
    };
    let path = if path.is_empty() { "/" } else { path };
    Ok(match name {
        "@method" => req.method.to_owned(),
        "@target-uri" => req.url.to_owned(),
        "@authority" => normalized_authority(scheme, authority),
        "@scheme" => scheme.to_ascii_lowercase(),
        "@path" => path.to_owned(),
        "@query" => format!("?{}", query.unwrap_or("")),
        "@request-target" => match query {
            Some(q) => format!("{path}?{q}"),
            None => path.to_owned(),
        },
        n if n.starts_with('@') => return invalid(format!("component {n} is not supported")),
        n if n != n.to_ascii_lowercase() => return invalid(format!("component {n} is not lower case")),
        n => req
            .field(n)
            .ok_or_else(|| Refusal::Invalid(format!("covers {n}, which the request lacks")))?,
    })
}

/// RFC 9421 §2.2.3: the host lower-cased, without the scheme's default port.
fn normalized_authority(scheme: &str, authority: &str) -> String {
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, h)| h)
        .to_ascii_lowercase();
    let default = match scheme.to_ascii_lowercase().as_str() {
        "https" => ":443",
        "http" => ":80",
        _ => "",
    };
    match host.strip_suffix(default) {
        Some(h) if !default.is_empty() => h.to_owned(),
        _ => host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::STANDARD;
    use ed25519_dalek::{Signer, SigningKey};

    fn headers(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    fn sign(key: &SigningKey, base: &str) -> String {
        STANDARD.encode(key.sign(base.as_bytes()).to_bytes())
    }

    /// The request's signature tagged `tag`, read and checked as the engine does.
    fn read(req: &Request<'_>, tag: &str, now: i64, max_skew: i64) -> Result<Signed, Refusal> {
        let signed = parse(req, tag)?;
        signed.check(now, max_skew)?;
        Ok(signed)
    }

    fn ed(key: &SigningKey) -> SignatureKey {
        SignatureKey::Ed25519(key.verifying_key())
    }

    #[test]
    fn a_signature_over_authority_and_signature_agent_checks() {
        let key = SigningKey::from_bytes(&[3; 32]);
        let now = 1_800_000_000;
        let params = format!(
            "(\"@authority\" \"signature-agent\");created={now};keyid=\"k\";alg=\"ed25519\";expires={};nonce=\"n1\";tag=\"web-bot-auth\"",
            now + 60
        );
        let base = format!(
            "\"@authority\": api.example\n\"signature-agent\": \"https://id.example/d\"\n\"@signature-params\": {params}"
        );
        let h = headers(&[
            ("Signature-Agent", "\"https://id.example/d\""),
            ("Signature-Input", &format!("sig1={params}")),
            ("Signature", &format!("sig1=:{}:", sign(&key, &base))),
        ]);
        let req = Request {
            method: "GET",
            url: "https://API.example:443/x?y=1",
            headers: &h,
        };
        let s = read(&req, WEB_BOT_AUTH, now, 60).unwrap();
        assert_eq!(s.signature_agent.as_deref(), Some("https://id.example/d"));
        assert_eq!((s.keyid.as_str(), s.nonce.as_deref()), ("k", Some("n1")));
        assert!(s.verifies_with(&ed(&key)));
        assert!(!s.verifies_with(&ed(&SigningKey::from_bytes(&[4; 32]))));
        // Another authority, or a changed agent: the base differs.
        let moved = Request {
            url: "https://other.example/x",
            ..req
        };
        assert!(!read(&moved, WEB_BOT_AUTH, now, 60)
            .unwrap()
            .verifies_with(&ed(&key)));
        // Out of time, another tag, nothing signed.
        assert!(matches!(
            read(&req, WEB_BOT_AUTH, now + 61, 60),
            Err(Refusal::Invalid(_))
        ));
        assert!(matches!(
            read(&req, WEB_BOT_AUTH, now - 120, 60),
            Err(Refusal::Invalid(_))
        ));
        assert!(matches!(read(&req, "other", now, 60), Err(Refusal::Unsigned(_))));
        let bare = Request { headers: &[], ..req };
        assert!(matches!(
            read(&bare, WEB_BOT_AUTH, now, 60),
            Err(Refusal::Unsigned(_))
        ));
        // Signature-Agent sent but not covered; a derived component with a `key` (it would read
        // a header named "@authority", which a caller of /v1/verify/request can send).
        for (covered, why) in [
            ("\"@authority\"", "Signature-Agent"),
            ("\"@authority\";key=\"x\" \"signature-agent\"", "derived"),
        ] {
            let input = format!(
                "sig1=({covered});created={now};keyid=\"k\";expires={};tag=\"web-bot-auth\"",
                now + 60
            );
            let h = headers(&[
                ("Signature-Agent", "\"https://id.example/d\""),
                ("@authority", "x=anything"),
                ("Signature-Input", &input),
                ("Signature", "sig1=:AAAA:"),
            ]);
            let refused = read(&Request { headers: &h, ..req }, WEB_BOT_AUTH, now, 60);
            assert!(
                matches!(&refused, Err(Refusal::Invalid(w)) if w.contains(why)),
                "{covered}: {refused:?}"
            );
        }
    }

    #[test]
    fn a_dictionary_signature_agent_is_read_by_its_key() {
        let key = SigningKey::from_bytes(&[5; 32]);
        let now = 1_800_000_000;
        let params = format!(
            "(\"@authority\" \"signature-agent\";key=\"sig2\");created={now};keyid=\"k\";expires={};tag=\"web-bot-auth\"",
            now + 60
        );
        let field = "sig2=\"https://id.example/d\"";
        for member in ["\"https://id.example/d\"", field] {
            let base = format!(
                "\"@authority\": api.example\n\"signature-agent\";key=\"sig2\": {member}\n\"@signature-params\": {params}"
            );
            let h = headers(&[
                ("signature-agent", field),
                ("signature-input", &format!("sig2={params}")),
                ("signature", &format!("sig2=:{}:", sign(&key, &base))),
            ]);
            let req = Request {
                method: "GET",
                url: "https://api.example/",
                headers: &h,
            };
            let s = read(&req, WEB_BOT_AUTH, now, 60).unwrap();
            assert_eq!(s.signature_agent.as_deref(), Some("https://id.example/d"));
            assert!(s.verifies_with(&ed(&key)), "{member}");
        }
    }

    /// Attack: a signature covering Signature-Agent under many keys, each reading of which
    /// would double the bases to try.
    #[test]
    fn signature_agent_is_covered_once() {
        let now = 1_800_000_000;
        let items: Vec<String> = (0..40)
            .map(|i| format!("\"signature-agent\";key=\"k{i}\""))
            .collect();
        let members: Vec<String> = (0..40)
            .map(|i| format!("k{i}=\"https://a.example/{i}\""))
            .collect();
        let input = format!(
            "sig1=(\"@authority\" {});created={now};keyid=\"k\";expires={};tag=\"web-bot-auth\"",
            items.join(" "),
            now + 60
        );
        let h = headers(&[
            ("signature-agent", &members.join(", ")),
            ("signature-input", &input),
            ("signature", "sig1=:AAAA:"),
        ]);
        let req = Request {
            method: "GET",
            url: "https://api.example/",
            headers: &h,
        };
        assert!(matches!(
            read(&req, WEB_BOT_AUTH, now, 60),
            Err(Refusal::Invalid(_))
        ));
        let two = input.replacen(&items[2..].join(" "), "", 1);
        let h = headers(&[
            ("signature-agent", &members.join(", ")),
            ("signature-input", &two),
            ("signature", "sig1=:AAAA:"),
        ]);
        let req = Request { headers: &h, ..req };
        match read(&req, WEB_BOT_AUTH, now, 60) {
            Err(Refusal::Invalid(why)) => assert!(why.contains("twice"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn authorities_are_normalized() {
        assert_eq!(normalized_authority("https", "API.Example:443"), "api.example");
        assert_eq!(normalized_authority("http", "a.example:80"), "a.example");
        assert_eq!(normalized_authority("https", "a.example:8443"), "a.example:8443");
    }

    /// The Web Bot Auth draft's appendix vectors: a GET of `https://example.com/path/to/resource`
    /// signed with RFC 9421's test keys (Signature-Input, Signature, Signature-Agent, key).
    const DRAFT_VECTORS: [(&str, &str, Option<&str>, &str); 4] = [
        (
            "sig1=(\"@authority\");created=1735689600;keyid=\"oD0HwocPBSfpNy5W3bpJeyFGY_IQ_YpqxSjQ3Yd-CLA\";alg=\"rsa-pss-sha512\";expires=4889289600;nonce=\"JojDFWJ90jf+gZhdKeTyJYsu1XvNPZSFAGhvYq5SuV3gneOEUAhq+xl792WGuD1W+Dr6NRmx+m+t06NsYnL4iA==\";tag=\"web-bot-auth\"",
            "sig1=:hWPaj85MWQiRkzU4jnIKvdPQiDfMCPIoxOP8nZveNc3aFQ7r/UmXWCwGNImw588iRvTFey5TR3fVEgnXpcttlyK+u5pN831z9Wlr+IMNfub4uEM3SuO+SKFygJZyLG0pf7OAiRcU4C0gyx1BS/+z9ydQTRzDLr88wCkBBRqwGRrSi8HTwxkqg1jugobh93hcnU6gV8MK1n+VnhRprIgl2RQSO6q5cfbB4OS8C4t/8ndW0lYmP2SWzKZJXnpX5Wrj17PuLqnVW6MO8pJnLAMXNvxUdx32KHeq/cHFrzZazZsua3UOoP+k+niHwoQ8bBWj1Vi4mM1mYJK+fk366cCLsQ==:",
            None,
            "rsa",
        ),
        (
            "sig2=(\"@authority\" \"signature-agent\";key=\"agent2\");created=1735689600;keyid=\"oD0HwocPBSfpNy5W3bpJeyFGY_IQ_YpqxSjQ3Yd-CLA\";alg=\"rsa-pss-sha512\";expires=4889289600;nonce=\"wcfPQPh7SzkvrIVvhD00vNk9PkxJNY2NVbYl2PVBB4zmUoluSwE7W6bPtF60QA3k8g06FU7PPCD+J58YofY1zg==\";tag=\"web-bot-auth\"",
            "sig2=:gHzpLNeHaHIO19NaJH9YMW5dcVSi2s0wOMBr6p18vcofS106sfC4KBIS0/szPlBBd1vIcyQ88B6CTEWIhRAiVrb9zfX0mx1aG12CSGWcYkSirHeyTxhbuJvXd27ed6skWoy4PjXItq38936ivUQjfdIwXh1aX6HxkAC3vRnEdSNfntkLWeEuIQ5BLIOBGE39fSwg27Qjq6OVWYas/9/aFUr3HA34MXWYdp+//cvlEKDp3kRoLOw9ro0AOr6srHrTeEtxon2afcws1aZVSlPdd2fZSEIGmw9HAHLDCEkFTERu1gH2k/zIEqgy7CAYXI9E5slog0cLg/Vc6+f8gih33g==:",
            Some("agent2=\"https://signature-agent.test\""),
            "rsa",
        ),
        (
            "sig1=(\"@authority\");created=1735689600;keyid=\"poqkLGiymh_W0uP6PZFw-dvez3QJT5SolqXBCW38r0U\";alg=\"ed25519\";expires=4889289600;nonce=\"zIW8+cdmA3vdYagbxojpONwa/l0EKJ/O3/wD486VvsQjO/RxPaSt6ZxvQaMcQzNnqKN/mQ6hpGiFro2L2qkz5A==\";tag=\"web-bot-auth\"",
            "sig1=:QKN4fTdIYfh82fvoZCQiQA1weuozfCS/Led2zTMbewMMqH8PI2Wsy/5c4ao6B6D09nraNQdBNOADg8aM1MqfCg==:",
            None,
            "ed",
        ),
        (
            "sig2=(\"@authority\" \"signature-agent\";key=\"agent2\");created=1735689600;keyid=\"poqkLGiymh_W0uP6PZFw-dvez3QJT5SolqXBCW38r0U\";alg=\"ed25519\";expires=4889289600;nonce=\"n9p433xm+NJ3ph3upfBIGmsuwHw387YV7Q/F+6BSpGCVjYCqQw6rznNA8PVVLySrAWsv0hQtFioQb6E1YsauiA==\";tag=\"web-bot-auth\"",
            "sig2=:RdNFx5Bj6au3YgAMQL/RzmUlZE8QZLIaXGRpw985hWnwPfMxT228NMk6ehRS1PSl4e8PhbNZACSanGdhEwYCCg==:",
            Some("agent2=\"https://signature-agent.test\""),
            "ed",
        ),
    ];

    /// The signature bases built here are the draft's: each of its vectors checks with its
    /// key (and not with the other); `read` refuses each for that key.
    #[test]
    fn the_drafts_vectors_check_and_are_refused_for_their_test_key() {
        let rsa = SignatureKey::RsaPss {
            n: URL_SAFE_NO_PAD.decode(PUBLISHED_RSA_MODULI[0]).unwrap(),
            e: vec![1, 0, 1],
        };
        let x = URL_SAFE_NO_PAD
            .decode(crate::token::dpop::RFC_9421_TEST_KEY_X)
            .unwrap();
        let ed25519 = SignatureKey::Ed25519(VerifyingKey::from_bytes(&x.try_into().unwrap()).unwrap());
        assert_eq!(
            rsa_thumbprint("AQAB", PUBLISHED_RSA_MODULI[0]),
            PUBLISHED_TEST_KEYS[1]
        );
        for (input, signature, agent, which) in DRAFT_VECTORS {
            let mut h = headers(&[("Signature-Input", input), ("Signature", signature)]);
            h.extend(agent.map(|a| ("Signature-Agent".to_owned(), a.to_owned())));
            let req = Request {
                method: "GET",
                url: "https://example.com/path/to/resource",
                headers: &h,
            };
            let signed = parse(&req, WEB_BOT_AUTH).unwrap();
            let (key, other) = if which == "rsa" {
                (&rsa, &ed25519)
            } else {
                (&ed25519, &rsa)
            };
            assert!(signed.verifies_with(key), "{input}");
            assert!(!signed.verifies_with(other), "{input}");
            assert!(PUBLISHED_TEST_KEYS.contains(&signed.keyid.as_str()));
            match read(&req, WEB_BOT_AUTH, signed.created, 60) {
                Err(Refusal::Invalid(why)) => assert!(why.contains("test keys"), "{why}"),
                other => panic!("{other:?}"),
            }
        }
        // No test key counts in a directory: not B.1.2's nor B.1.1's modulus, under any
        // exponent, nor the Ed25519 key or its negation (the sign bit flipped).
        for n in PUBLISHED_RSA_MODULI {
            for e in ["AQAB", "Aw", "AQAD"] {
                let jwk = serde_json::json!({"kty": "RSA", "e": e, "n": n});
                assert_eq!(SignatureKey::from_jwk(&jwk), None, "{e}");
            }
        }
        assert_eq!(
            rsa_thumbprint("AQAB", PUBLISHED_RSA_MODULI[1]),
            PUBLISHED_TEST_KEYS[2]
        );
        let mut x = URL_SAFE_NO_PAD
            .decode(crate::token::dpop::RFC_9421_TEST_KEY_X)
            .unwrap();
        for _ in 0..2 {
            let jwk = serde_json::json!({"kty": "OKP", "crv": "Ed25519", "x": URL_SAFE_NO_PAD.encode(&x)});
            assert_eq!(SignatureKey::from_jwk(&jwk), None);
            x[31] ^= 0x80;
        }
    }

    /// A directory's keys: Ed25519 and RSA (2048 to 8192 bits) by thumbprint; others passed over.
    #[test]
    fn directory_keys_are_ed25519_or_rsa_of_a_sound_size() {
        let key = SigningKey::from_bytes(&[7; 32]);
        let x = URL_SAFE_NO_PAD.encode(key.verifying_key().as_bytes());
        let (kid, k) =
            SignatureKey::from_jwk(&serde_json::json!({"kty": "OKP", "crv": "Ed25519", "x": x})).unwrap();
        assert_eq!(k, ed(&key));
        assert_eq!(kid.len(), 43);
        let n = |bytes: usize, first: u8| {
            let mut n = vec![0xc5; bytes];
            n[0] = first;
            URL_SAFE_NO_PAD.encode(n)
        };
        for (jwk, kept) in [
            (
                serde_json::json!({"kty": "RSA", "e": "AQAB", "n": n(256, 0x80)}),
                true,
            ),
            (
                serde_json::json!({"kty": "RSA", "e": "AQAB", "n": n(1024, 0xff)}),
                true,
            ),
            // 2047 bits in 256 bytes; 2040 bits; 8193 bits.
            (
                serde_json::json!({"kty": "RSA", "e": "AQAB", "n": n(256, 0x7f)}),
                false,
            ),
            (
                serde_json::json!({"kty": "RSA", "e": "AQAB", "n": n(255, 0xc5)}),
                false,
            ),
            (
                serde_json::json!({"kty": "RSA", "e": "AQAB", "n": n(1025, 0x01)}),
                false,
            ),
            (
                serde_json::json!({"kty": "RSA", "e": "AAEAAQ", "n": n(256, 0x80)}),
                false,
            ),
            (serde_json::json!({"kty": "RSA", "e": "AQAB"}), false),
            (serde_json::json!({"kty": "oct", "k": "c2VjcmV0"}), false),
            (
                serde_json::json!({"kty": "EC", "crv": "P-256", "x": x, "y": x}),
                false,
            ),
        ] {
            assert_eq!(SignatureKey::from_jwk(&jwk).is_some(), kept, "{jwk}");
        }
    }
}
