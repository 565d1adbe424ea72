//! Wall-clock time as Unix milliseconds, and its one text form (RFC 3339, milliseconds, `Z`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (UTC). Stored in every table as a 64-bit integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Millis(pub i64);

impl Millis {
    pub fn now() -> Self {
        let d = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        Millis(d.as_millis() as i64)
    }

    pub fn from_secs(secs: i64) -> Self {
        Millis(secs.saturating_mul(1000))
    }

    pub fn as_secs(self) -> i64 {
        self.0.div_euclid(1000)
    }

    pub fn plus_secs(self, secs: i64) -> Self {
        Millis(self.0.saturating_add(secs.saturating_mul(1000)))
    }

    /// `2026-11-22T09:49:06.123Z`. Times before 1970 or past year 9999 are clamped.
    pub fn to_rfc3339(self) -> String {
        let mut s = String::with_capacity(24);
        self.write_rfc3339(&mut s);
        s
    }

    /// The time as its text shows it: within 1970 and the end of year 9999.
    pub fn shown(self) -> Millis {
        Millis(self.0.clamp(0, 253_402_300_799_999))
    }

    /// Appends [`Millis::to_rfc3339`]'s text to `out`.
    pub fn write_rfc3339(self, out: &mut String) {
        use std::fmt::Write;
        let ms = self.shown().0 as u64;
        let t = UNIX_EPOCH + Duration::from_millis(ms);
        write!(out, "{}", humantime::format_rfc3339_millis(t)).expect("writing to a String succeeds");
    }
}

impl serde::Serialize for Millis {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_rfc3339())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_with_millis_and_z() {
        assert_eq!(Millis(0).to_rfc3339(), "1970-01-01T00:00:00.000Z");
        assert_eq!(Millis(1_795_341_346_123).to_rfc3339(), "2026-11-22T09:55:46.123Z");
    }
}
