//! Time as leash sees it: UTC instants in whole milliseconds, read from an
//! injected [`Clock`] so tests drive time instead of sleeping.
//!
//! Depends on nothing else inside the crate.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

/// A UTC instant, milliseconds since the Unix epoch. Shown as RFC 3339.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(i64);

impl Serialize for Timestamp {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&self.rfc3339())
    }
}

impl<'de> serde::Deserialize<'de> for Timestamp {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Timestamp::parse_rfc3339(&text).map_err(serde::de::Error::custom)
    }
}

impl Timestamp {
    /// The instant `ms` milliseconds after the Unix epoch.
    pub const fn from_unix_ms(ms: i64) -> Self {
        Timestamp(ms)
    }

    /// Milliseconds since the Unix epoch.
    pub const fn unix_ms(self) -> i64 {
        self.0
    }

    /// The current system time.
    pub fn now() -> Self {
        let ms = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0);
        Timestamp(ms)
    }

    /// This instant plus `d` (saturating).
    pub fn plus(self, d: Duration) -> Self {
        Timestamp(self.0.saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)))
    }

    /// This instant minus `d` (saturating).
    pub fn minus(self, d: Duration) -> Self {
        Timestamp(self.0.saturating_sub(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)))
    }

    /// Parse an RFC 3339 instant in UTC (`2026-12-01T09:00:00Z`, with or
    /// without fractional seconds; finer than milliseconds is cut).
    pub fn parse_rfc3339(text: &str) -> Result<Self, String> {
        let time = humantime::parse_rfc3339(text)
            .map_err(|e| format!("{text:?} is not an RFC 3339 UTC time like 2026-12-01T09:00:00Z ({e})"))?;
        let ms = time.duration_since(UNIX_EPOCH).map_err(|_| format!("{text:?} is before 1970"))?.as_millis();
        Ok(Timestamp(i64::try_from(ms).map_err(|_| format!("{text:?} is out of range"))?))
    }

    /// RFC 3339, UTC, millisecond precision: `2026-11-30T06:33:44.123Z`.
    /// Every instant formats: years past 9999 (which RFC 3339 cannot write)
    /// get a sign and as many digits as they need, `+10000-01-01T…`, so a
    /// stored value can never make a read fail.
    pub fn rfc3339(self) -> String {
        self.to_string()
    }
}

/// A duration as a person says it: `14 ms`, `1.3 s`, `41 s`, `2 min 5 s`,
/// `1 h`, `3 h 20 min`, `2 d 4 h`.
pub fn human_duration(d: Duration) -> String {
    let ms = d.as_millis();
    let s = d.as_secs();
    let two = |big: u64, big_unit: &str, small: u64, small_unit: &str| match small {
        0 => format!("{big} {big_unit}"),
        _ => format!("{big} {big_unit} {small} {small_unit}"),
    };
    match s {
        _ if ms < 1000 => format!("{ms} ms"),
        0..10 => format!("{:.1} s", d.as_secs_f64()),
        10..60 => format!("{s} s"),
        60..3600 => two(s / 60, "min", s % 60, "s"),
        3600..86_400 => two(s / 3600, "h", s % 3600 / 60, "min"),
        _ => two(s / 86_400, "d", s % 86_400 / 3600, "h"),
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const MS_PER_DAY: i64 = 86_400_000;
        let days = self.0.div_euclid(MS_PER_DAY);
        let ms = self.0.rem_euclid(MS_PER_DAY);
        let (year, month, day) = civil_from_days(days);
        let (h, m, s, milli) = (ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000);
        if (0..=9999).contains(&year) {
            write!(f, "{year:04}")?;
        } else {
            write!(f, "{year:+}")?;
        }
        write!(f, "-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{milli:03}Z")
    }
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard
/// Hinnant's `civil_from_days`), for every `i64` day count a millisecond
/// timestamp can hold.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Where services read the time.
pub trait Clock: Send + Sync + fmt::Debug {
    /// The current instant.
    fn now(&self) -> Timestamp;
}

/// The system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// A clock that moves only when told to. Clones share the same time.
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    /// A clock stopped at `start`.
    pub fn new(start: Timestamp) -> Self {
        ManualClock(Arc::new(AtomicI64::new(start.unix_ms())))
    }

    /// Move the clock forward by `d`.
    pub fn advance(&self, d: Duration) {
        self.0.fetch_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.0.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_print_as_rfc3339_utc() {
        assert_eq!(Timestamp::from_unix_ms(0).rfc3339(), "1970-01-01T00:00:00.000Z");
        assert_eq!(Timestamp::from_unix_ms(1_764_484_424_123).to_string(), "2025-11-30T06:33:44.123Z");
    }

    #[test]
    fn every_instant_formats_without_failing() {
        assert_eq!(Timestamp::from_unix_ms(951_782_400_000).to_string(), "2000-02-29T00:00:00.000Z");
        assert_eq!(Timestamp::from_unix_ms(253_402_300_799_999).to_string(), "9999-12-31T23:59:59.999Z");
        assert_eq!(Timestamp::from_unix_ms(253_402_300_800_000).to_string(), "+10000-01-01T00:00:00.000Z");
        assert_eq!(Timestamp::from_unix_ms(-1).to_string(), "1969-12-31T23:59:59.999Z");
        for ms in [i64::MAX, i64::MIN, 9_007_199_254_740_992 + 1_764_484_424_123] {
            assert!(Timestamp::from_unix_ms(ms).to_string().ends_with('Z'));
        }
        // Agrees with humantime wherever humantime can format.
        for ms in (0..253_402_300_799_999i64).step_by(7_777_777_777_777) {
            let t = UNIX_EPOCH + Duration::from_millis(ms as u64);
            assert_eq!(Timestamp::from_unix_ms(ms).to_string(), humantime::format_rfc3339_millis(t).to_string());
        }
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::new(Timestamp::from_unix_ms(1000));
        let shared = clock.clone();
        assert_eq!(clock.now().unix_ms(), 1000);
        shared.advance(Duration::from_secs(2));
        assert_eq!(clock.now().unix_ms(), 3000);
    }
}
