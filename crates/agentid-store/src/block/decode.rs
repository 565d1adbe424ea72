//! Reading a block's records back, in either encoding, with a filter: only matches are
//! allocated. Never panics, whatever a row holds.

use super::encode::*;
use super::*;

pub(super) struct Reader<'a> {
    pub(super) bytes: &'a [u8],
    pub(super) at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], StoreError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or_else(|| corrupt("truncated"))?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8, StoreError> {
        Ok(self.take(1)?[0])
    }

    fn i64(&mut self) -> Result<i64, StoreError> {
        Ok(i64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    /// A version 1 string: u32 little-endian length, UTF-8 bytes.
    fn str(&mut self) -> Result<&'a str, StoreError> {
        let len = u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes"));
        self.utf8(len as usize)
    }

    fn utf8(&mut self, len: usize) -> Result<&'a str, StoreError> {
        std::str::from_utf8(self.take(len)?).map_err(|_| corrupt("text is not UTF-8"))
    }

    pub(super) fn varint(&mut self) -> Result<u64, StoreError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            if shift == 63 && b > 1 {
                return Err(corrupt("varint overflow"));
            }
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(corrupt("varint overflow"))
    }

    pub(super) fn text(&mut self) -> Result<Text<'a>, StoreError> {
        match self.u8()? {
            TEXT_RAW => {
                let len = usize::try_from(self.varint()?).map_err(|_| corrupt("text length"))?;
                Ok(Text::Raw(self.utf8(len)?))
            }
            kind => {
                let (_, prefix) = ULID_TEXTS
                    .into_iter()
                    .find(|(k, _)| *k == kind)
                    .ok_or_else(|| corrupt("text kind"))?;
                Ok(Text::Ulid(prefix, self.take(16)?.try_into().expect("16 bytes")))
            }
        }
    }

    /// A version 2 table index.
    fn entry<'t>(&mut self, table: &'t [Cow<'a, str>]) -> Result<&'t str, StoreError> {
        let i = usize::try_from(self.varint()?).ok();
        i.and_then(|i| table.get(i))
            .map(|s| s.as_ref())
            .ok_or_else(|| corrupt("string table index"))
    }

    fn hash(&mut self) -> Result<[u8; 32], StoreError> {
        Ok(self.take(32)?.try_into().expect("32 bytes"))
    }

    fn record_v1(&mut self) -> Result<Raw<'a, 'a>, StoreError> {
        let result = result_at(self.u8()?)?;
        let id = Text::Raw(self.str()?);
        let agent_id = self.str()?;
        let failure_reason = match self.u8()? {
            0 => None,
            1 => Some(self.str()?),
            _ => return Err(corrupt("failure reason flag")),
        };
        Ok(Raw {
            event: Event::Verification,
            result,
            id,
            agent_id,
            failure_reason,
            latency_us: self.i64()?,
            requested_at: self.i64()?,
            hash: self.hash()?,
        })
    }

    /// `prev_time`: the previous record's `requested_at` (0 before the first), moved on.
    fn record_v2<'t>(
        &mut self,
        table: &'t [Cow<'a, str>],
        prev_time: &mut i64,
    ) -> Result<Raw<'a, 't>, StoreError> {
        let tag = self.u8()?;
        if tag & !(TAG_RESULT | TAG_REASON | TAG_EVENT) != 0 {
            return Err(corrupt("record tag"));
        }
        let event = *Event::ALL
            .get(((tag & TAG_EVENT) >> TAG_EVENT_SHIFT) as usize)
            .ok_or_else(|| corrupt("record event"))?;
        let result = result_at(tag & TAG_RESULT)?;
        let id = self.text()?;
        let agent_id = self.entry(table)?;
        let failure_reason = match tag & TAG_REASON {
            0 => None,
            _ => Some(self.entry(table)?),
        };
        let latency_us = unzigzag(self.varint()?);
        *prev_time = prev_time.wrapping_add(unzigzag(self.varint()?));
        Ok(Raw {
            event,
            result,
            id,
            agent_id,
            failure_reason,
            latency_us,
            requested_at: *prev_time,
            hash: self.hash()?,
        })
    }
}

pub(super) fn result_at(code: u8) -> Result<VerifyResult, StoreError> {
    VerifyResult::ALL
        .get(code as usize)
        .copied()
        .ok_or_else(|| corrupt("result code"))
}

/// A decoded text, made into a `String` only for the records that are kept.
pub(super) enum Text<'a> {
    Raw(&'a str),
    /// A prefix and a ULID's bytes.
    Ulid(&'static str, [u8; 16]),
}

impl<'a> Text<'a> {
    pub(super) fn to_cow(&self) -> Cow<'a, str> {
        match *self {
            Text::Raw(s) => Cow::Borrowed(s),
            Text::Ulid(prefix, bytes) => {
                let mut buf = [0u8; ulid::ULID_LEN];
                let ulid = ulid::Ulid::from_bytes(bytes).array_to_str(&mut buf);
                ulid.make_ascii_lowercase();
                let mut s = String::with_capacity(prefix.len() + ulid::ULID_LEN);
                s.push_str(prefix);
                s.push_str(ulid);
                Cow::Owned(s)
            }
        }
    }
}

/// One record as read, borrowing from the block (`'a`) and its string table (`'t`).
pub(super) struct Raw<'a, 't> {
    event: Event,
    result: VerifyResult,
    id: Text<'a>,
    agent_id: &'t str,
    failure_reason: Option<&'t str>,
    latency_us: i64,
    requested_at: i64,
    hash: [u8; 32],
}

pub(super) fn corrupt(what: &str) -> StoreError {
    StoreError::Corrupt(format!("audit block: {what}"))
}

/// Decodes a block of `ledger`, in sequence order, keeping the records `keep` accepts (only
/// those are allocated). Fails on any byte that does not fit the format, never panics.
pub fn decode(
    ledger: &Ledger,
    block: &StoredBlock,
    mut keep: impl FnMut(&Probe<'_>) -> bool,
) -> Result<Vec<AuditRecord>, StoreError> {
    let mut out = Vec::new();
    walk(block, |seq, prev_hash, raw| {
        if keep(&Probe {
            seq,
            agent_id: raw.agent_id,
            result: raw.result,
        }) {
            out.push(AuditRecord {
                ledger: ledger.clone(),
                seq,
                id: raw.id.to_cow().into_owned(),
                event: raw.event,
                agent_id: raw.agent_id.to_owned(),
                result: raw.result,
                failure_reason: raw.failure_reason.map(str::to_owned),
                latency_us: raw.latency_us,
                requested_at: Millis(raw.requested_at),
                prev_hash,
                hash: raw.hash,
            });
        }
    })?;
    Ok(out)
}

/// The record hashes of a block whose `seq` lies in `seqs`, in order, appended to `out`
/// (the leaves of the ledger's Merkle tree): nothing else is allocated. The block follows
/// the records `chain` ends with (its last seq and hash, if any, left at the block's last):
/// every record must come next in sequence and name the hash before it as its `prev_hash`,
/// or the blocks do not form one chain (a block written into the database that overlaps, or
/// does not follow, its predecessor) and the read is `Corrupt`.
pub(crate) fn chained_hashes(
    block: &StoredBlock,
    seqs: std::ops::RangeInclusive<i64>,
    out: &mut Vec<[u8; 32]>,
    chain: &mut Option<(i64, [u8; 32])>,
) -> Result<(), StoreError> {
    let mut broken = None;
    walk(block, |seq, prev, raw| {
        if let Some((last, hash)) = *chain {
            if broken.is_none() && (seq != last + 1 || prev != hash) {
                broken = Some(seq);
            }
        }
        *chain = Some((seq, raw.hash));
        if seqs.contains(&seq) {
            out.push(raw.hash);
        }
    })?;
    match broken {
        Some(seq) => Err(StoreError::Corrupt(format!(
            "the chain breaks at seq {seq}: its block overlaps, or does not follow, the one before"
        ))),
        None => Ok(()),
    }
}

/// Reads every record of a block in sequence order: `visit(seq, prev_hash, record)`.
pub(super) fn walk(
    block: &StoredBlock,
    mut visit: impl FnMut(i64, [u8; 32], &Raw<'_, '_>),
) -> Result<(), StoreError> {
    let mut r = Reader {
        bytes: &block.records,
        at: 0,
    };
    let version = r.u8()?;
    let table: Vec<Cow<'_, str>> = match version {
        V1 => Vec::new(),
        V2 => {
            // Every entry takes at least two bytes, so a damaged count ends at the data's end.
            let n = r.varint()?;
            let mut table = Vec::new();
            for _ in 0..n {
                table.push(r.text()?.to_cow());
            }
            table
        }
        _ => return Err(corrupt("unknown version")),
    };
    let mut prev_hash: [u8; 32] = block
        .prev_hash
        .as_slice()
        .try_into()
        .map_err(|_| corrupt("prev_hash length"))?;
    let mut prev_time = 0i64;
    let mut seq = block.first_seq;
    while r.at < r.bytes.len() {
        if seq > block.last_seq {
            return Err(corrupt("more records than its sequence range"));
        }
        let raw = match version {
            V1 => r.record_v1()?,
            _ => r.record_v2(&table, &mut prev_time)?,
        };
        visit(seq, prev_hash, &raw);
        prev_hash = raw.hash;
        seq = seq
            .checked_add(1)
            .ok_or_else(|| corrupt("sequence number overflow"))?;
    }
    if seq.checked_sub(1) != Some(block.last_seq) {
        return Err(corrupt("fewer records than its sequence range"));
    }
    Ok(())
}
