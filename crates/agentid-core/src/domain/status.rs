//! Token Status Lists (draft-ietf-oauth-status-list): a token names its place in a list of
//! one-bit statuses that the service publishes; 1 is revoked (INVALID), 0 valid.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;

/// An agent's place in a status list, for all its tokens.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StatusPlace {
    pub list: crate::domain::ListId,
    pub idx: u64,
}

/// The sizes of the lists the service makes (`--status-list-size`): whole bytes, and at most
/// 16 Mi places (2 MiB). A list of another size is none of its own.
pub const MIN_LIST_SIZE: u64 = 8;
pub const MAX_LIST_SIZE: u64 = 1 << 24;

/// Whether a list of `size` places with `taken` of them taken gives a new agent its place:
/// while half of it is free, so a random draw finds a free place at the first try at least
/// half the time. Half of the list's own size: a list made when the configured size was
/// smaller fills no further than its half either.
pub fn takes_new_places(size: u64, taken: u64) -> bool {
    taken < size / 2
}

/// The bits of one list: the status of index `i` is bit `i mod 8` of byte `i / 8`, counting
/// from the least significant bit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusBits(Vec<u8>);

impl StatusBits {
    /// `size` places, all valid.
    pub fn new(size: u64) -> Self {
        StatusBits(vec![
            0;
            usize::try_from(size.div_ceil(8))
                .expect("a list fits in memory")
        ])
    }

    pub fn size(&self) -> u64 {
        self.0.len() as u64 * 8
    }

    /// Marks `idx` revoked; false when it is outside the list.
    pub fn revoke(&mut self, idx: u64) -> bool {
        match usize::try_from(idx / 8).ok().and_then(|i| self.0.get_mut(i)) {
            Some(byte) => {
                *byte |= 1 << (idx % 8);
                true
            }
            None => false,
        }
    }

    pub fn is_revoked(&self, idx: u64) -> bool {
        usize::try_from(idx / 8)
            .ok()
            .and_then(|i| self.0.get(i))
            .is_some_and(|b| b & (1 << (idx % 8)) != 0)
    }

    /// The `lst` member: the bytes compressed with DEFLATE in a zlib container (RFC 1950,
    /// best compression), base64url without padding.
    pub fn lst(&self) -> String {
        URL_SAFE_NO_PAD.encode(miniz_oxide::deflate::compress_to_vec_zlib(&self.0, 9))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The draft's example: statuses 1,0,0,1,1,1,0,1,1,1,0,0,0,1,0,1 are bytes B9 A3 and
    /// `lst` eNrbuRgAAhcBXQ.
    #[test]
    fn the_drafts_test_vector() {
        let mut bits = StatusBits::new(16);
        for (i, s) in [1, 0, 0, 1, 1, 1, 0, 1, 1, 1, 0, 0, 0, 1, 0, 1]
            .iter()
            .enumerate()
        {
            if *s == 1 {
                assert!(bits.revoke(i as u64));
            }
        }
        assert_eq!(bits.0, [0xB9, 0xA3]);
        assert_eq!(bits.lst(), "eNrbuRgAAhcBXQ");
        assert!(bits.is_revoked(0) && !bits.is_revoked(1));
        assert!(!bits.revoke(16), "outside the list");
        assert!(!bits.is_revoked(u64::MAX));
    }
}
