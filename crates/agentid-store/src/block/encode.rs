//! Writing a block's records in encoding version 2 (see the module above).

use super::*;

pub(super) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub(super) fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

pub(super) fn unzigzag(v: u64) -> i64 {
    (v >> 1) as i64 ^ -((v & 1) as i64)
}

/// The kind and 16 bytes of `s` when it is a known prefix and a ULID in the form `new_id`
/// writes (26 characters of lower-case Crockford base32, the first at most `7`): each such
/// string is the one text of its 128 bits, so it reads back exactly. `None` keeps any other
/// string (upper case, another alphabet or length) as it is.
pub(super) fn ulid_text(s: &str) -> Option<(u8, [u8; 16])> {
    let (kind, prefix) = ULID_TEXTS.into_iter().find(|(_, p)| s.starts_with(p))?;
    let rest = &s.as_bytes()[prefix.len()..];
    if rest.len() != ulid::ULID_LEN || rest[0] > b'7' {
        return None;
    }
    let mut v: u128 = 0;
    for &c in rest {
        v = v << 5 | u128::from(crockford_digit(c)?);
    }
    Some((kind, v.to_be_bytes()))
}

/// The value of a lower-case Crockford base32 digit (`0-9a-z` without `i l o u`).
pub(super) fn crockford_digit(c: u8) -> Option<u8> {
    match CROCKFORD[usize::from(c)] {
        NOT_A_DIGIT => None,
        v => Some(v),
    }
}

pub(super) const NOT_A_DIGIT: u8 = 0xff;

/// Each byte's digit value, or `NOT_A_DIGIT`. A table, not a `match`: every record's id goes
/// through `ulid_text`, and a match over its random digits was a mispredicted branch or two a
/// character (~0.15 µs a record under hot load, by perf).
pub(super) const CROCKFORD: [u8; 256] = {
    let alphabet = b"0123456789abcdefghjkmnpqrstvwxyz";
    let mut table = [NOT_A_DIGIT; 256];
    let mut i = 0;
    while i < alphabet.len() {
        table[alphabet[i] as usize] = i as u8;
        i += 1;
    }
    table
};

pub(super) fn put_text(out: &mut Vec<u8>, s: &str) {
    match ulid_text(s) {
        Some((kind, bytes)) => {
            out.push(kind);
            out.extend_from_slice(&bytes);
        }
        None => {
            out.push(TEXT_RAW);
            put_varint(out, s.len() as u64);
            out.extend_from_slice(s.as_bytes());
        }
    }
}

/// A block's string table as it is written: each distinct string once, in first-use order.
#[derive(Default)]
pub(super) struct Strings<'r> {
    table: Vec<&'r str>,
    index: HashMap<&'r str, u64>,
}

impl<'r> Strings<'r> {
    fn index(&mut self, s: &'r str) -> u64 {
        *self.index.entry(s).or_insert_with(|| {
            self.table.push(s);
            self.table.len() as u64 - 1
        })
    }
}

/// The `records` bytes (version 2) of consecutive records of one ledger.
pub fn encode(records: &[&AuditRecord]) -> Vec<u8> {
    // Records first, into their own buffer, while the string table fills up.
    let mut strings = Strings::default();
    // The agent of the previous record: a block is mostly runs of one agent.
    let mut last_agent: Option<(&str, u64)> = None;
    let mut body = Vec::with_capacity(records.len() * 56);
    let mut prev_time = 0i64;
    for r in records {
        let reason = r.failure_reason.as_deref();
        let mut tag = r.result.index() as u8;
        if reason.is_some() {
            tag |= TAG_REASON;
        }
        tag |= (r.event.index() as u8) << TAG_EVENT_SHIFT;
        body.push(tag);
        put_text(&mut body, &r.id);
        let agent = match last_agent {
            Some((a, i)) if a == r.agent_id => i,
            _ => strings.index(&r.agent_id),
        };
        last_agent = Some((&r.agent_id, agent));
        put_varint(&mut body, agent);
        if let Some(reason) = reason {
            put_varint(&mut body, strings.index(reason));
        }
        put_varint(&mut body, zigzag(r.latency_us));
        put_varint(&mut body, zigzag(r.requested_at.0.wrapping_sub(prev_time)));
        prev_time = r.requested_at.0;
        body.extend_from_slice(&r.hash);
    }
    let table = strings.table;
    let mut out = Vec::with_capacity(body.len() + 10 + table.iter().map(|s| s.len() + 2).sum::<usize>());
    out.push(V2);
    put_varint(&mut out, table.len() as u64);
    for s in &table {
        put_text(&mut out, s);
    }
    out.extend_from_slice(&body);
    out
}
