//! Durations as whole milliseconds: the one form a [`Duration`] takes on
//! the wire (a field named `…_ms`) and in a column. Rust code holds a
//! `Duration`; `#[serde(with = "crate::job::millis")]` (or
//! [`millis::option`](option) for an `Option<Duration>`) reads and writes
//! the number.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serializer};

/// Whole milliseconds, saturating at `u64::MAX`.
pub fn of(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Whole milliseconds as a signed 64-bit column, saturating.
pub fn column(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// A duration read back from a milliseconds column (a negative one, which
/// the schema never writes, as zero).
pub fn from_column(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// Write a duration as its milliseconds.
pub fn serialize<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_u64(of(*duration))
}

/// Read milliseconds as a duration.
pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    u64::deserialize(deserializer).map(Duration::from_millis)
}

/// The same for an `Option<Duration>` (`null` or absent is `None`; pair
/// with `#[serde(default)]`).
pub mod option {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    /// Write `Some` as its milliseconds, `None` as `null`.
    pub fn serialize<S: Serializer>(duration: &Option<Duration>, serializer: S) -> Result<S::Ok, S::Error> {
        match duration {
            Some(duration) => serializer.serialize_u64(super::of(*duration)),
            None => serializer.serialize_none(),
        }
    }

    /// Read milliseconds (or `null`) as a duration.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(deserializer)?.map(Duration::from_millis))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde::{Deserialize, Serialize};

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Wire {
        #[serde(rename = "wait_ms", with = "super")]
        wait: Duration,
        #[serde(rename = "delay_ms", default, with = "super::option", skip_serializing_if = "Option::is_none")]
        delay: Option<Duration>,
    }

    #[test]
    fn a_duration_is_whole_milliseconds_on_the_wire() {
        let wire = Wire { wait: Duration::from_micros(2_500_900), delay: Some(Duration::from_secs(3)) };
        assert_eq!(serde_json::to_string(&wire).unwrap(), r#"{"wait_ms":2500,"delay_ms":3000}"#);
        let read: Wire = serde_json::from_str(r#"{"wait_ms":7}"#).unwrap();
        assert_eq!(read, Wire { wait: Duration::from_millis(7), delay: None });
        assert!(serde_json::from_str::<Wire>(r#"{"wait_ms":-1}"#).is_err(), "a negative duration is refused");
        assert_eq!(super::of(Duration::MAX), u64::MAX, "saturates");
        assert_eq!(super::column(Duration::MAX), i64::MAX, "saturates");
    }
}
