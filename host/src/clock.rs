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

    /// RFC 3339, UTC, millisecond precision: `2026-11-30T06:33:44.123Z`.
    pub fn rfc3339(self) -> String {
        let t = UNIX_EPOCH + Duration::from_millis(self.0.max(0) as u64);
        humantime::format_rfc3339_millis(t).to_string()
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.rfc3339())
    }
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
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::new(Timestamp::from_unix_ms(1000));
        let shared = clock.clone();
        assert_eq!(clock.now().unix_ms(), 1000);
        shared.advance(Duration::from_secs(2));
        assert_eq!(clock.now().unix_ms(), 3000);
    }
}
