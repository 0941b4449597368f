//! Schedules: one job submitted again and again, at the times of a cron
//! expression in a time zone or at a fixed interval. This module holds the
//! schedule as stored and the rules of its firings (when the next one is,
//! which due firings a catch-up fires); the runtime fires them and the
//! store makes each firing happen once.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{GateChoice, JobId, millis};
use crate::clock::Timestamp;

/// Shortest interval a schedule may fire at.
pub const MIN_EVERY: Duration = Duration::from_secs(1);
/// Longest interval a schedule may fire at.
pub const MAX_EVERY: Duration = Duration::from_secs(366 * 86_400);
/// Most firings one catch-up (`catch_up: all`) submits; older due firings
/// are dropped and counted as missed.
pub const CATCH_UP_MAX: usize = 100;
/// A due firing this recent is on time, not missed: with `catch_up: none`
/// it still fires (a scheduler that ticks late, or a restart of a few
/// seconds, loses nothing).
pub const ON_TIME_WITHIN: Duration = Duration::from_secs(30);
/// Longest schedule name, in bytes.
pub const MAX_SCHEDULE_NAME_BYTES: usize = 64;
/// Most missed firings one catch-up counts exactly; more are reported as
/// this many.
const MISSED_COUNT_LIMIT: usize = 10_000;

/// When a schedule fires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cadence {
    /// At the times a cron expression names, read in a time zone.
    Cron {
        /// The expression as given: 5 fields (minute first), 6 (second
        /// first), or a nickname (`@hourly`, `@daily`, `@weekly`,
        /// `@monthly`, `@yearly`).
        expr: String,
        /// An IANA time zone name (`UTC`, `Europe/Berlin`).
        timezone: String,
    },
    /// Every interval, at whole multiples of it since the Unix epoch (so
    /// `1h` fires on the hour, UTC, on every replica alike).
    Every(Duration),
}

impl Cadence {
    /// A cron cadence, checked: the expression parses and the zone exists.
    pub fn cron(expr: &str, timezone: &str) -> Result<Self, String> {
        let cadence = Cadence::Cron { expr: expr.trim().to_owned(), timezone: timezone.trim().to_owned() };
        cadence.compiled()?;
        Ok(cadence)
    }

    /// An interval cadence, checked against [`MIN_EVERY`] and [`MAX_EVERY`]
    /// (whole milliseconds).
    pub fn every(every: Duration) -> Result<Self, String> {
        let every = Duration::from_millis(millis::of(every));
        if every < MIN_EVERY || every > MAX_EVERY {
            return Err(format!(
                "every {} is out of range: use {} to {}",
                humantime::format_duration(every),
                humantime::format_duration(MIN_EVERY),
                humantime::format_duration(MAX_EVERY)
            ));
        }
        Ok(Cadence::Every(every))
    }

    fn compiled(&self) -> Result<Option<(croner::Cron, jiff::tz::TimeZone)>, String> {
        let Cadence::Cron { expr, timezone } = self else { return Ok(None) };
        let parser = croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Optional)
            .year(croner::parser::Year::Disallowed)
            .build();
        let cron = parser.parse(expr).map_err(|e| format!("cron expression {expr:?}: {e}"))?;
        let zone = jiff::tz::TimeZone::get(timezone)
            .map_err(|_| format!("time zone {timezone:?} is not an IANA zone name like UTC or Europe/Berlin"))?;
        Ok(Some((cron, zone)))
    }

    /// The first firing strictly after `after`. `None`: there is none
    /// (an expression that matches no date to come).
    pub fn next_after(&self, after: Timestamp) -> Result<Option<Timestamp>, String> {
        match self {
            Cadence::Every(every) => {
                let step = millis::column(*every).max(1);
                Ok(after
                    .unix_ms()
                    .div_euclid(step)
                    .checked_add(1)
                    .and_then(|n| n.checked_mul(step))
                    .map(Timestamp::from_unix_ms))
            }
            Cadence::Cron { .. } => {
                let Some((cron, zone)) = self.compiled()? else { return Ok(None) };
                let start = zoned(after, &zone)?;
                Ok(cron
                    .find_next_occurrence(&start, false)
                    .ok()
                    .map(|z| Timestamp::from_unix_ms(z.timestamp().as_millisecond())))
            }
        }
    }

    /// The next `count` firings after `after` (fewer where the cadence
    /// ends), for display.
    pub fn upcoming(&self, after: Timestamp, count: usize) -> Vec<Timestamp> {
        let mut times = Vec::with_capacity(count);
        let mut at = after;
        while times.len() < count {
            match self.next_after(at) {
                Ok(Some(next)) => {
                    times.push(next);
                    at = next;
                }
                _ => break,
            }
        }
        times
    }

    /// Due firings from `first` (itself a firing) through `now`, newest
    /// first, at most `limit`.
    fn due_newest_first(&self, first: Timestamp, now: Timestamp, limit: usize) -> Result<Vec<Timestamp>, String> {
        if first > now {
            return Ok(Vec::new());
        }
        match self {
            Cadence::Every(every) => {
                let step = millis::column(*every).max(1);
                let count = (now.unix_ms() - first.unix_ms()) / step + 1;
                let count = usize::try_from(count).unwrap_or(usize::MAX).min(limit);
                let last = first.unix_ms() + (now.unix_ms() - first.unix_ms()) / step * step;
                Ok((0..count).map(|k| Timestamp::from_unix_ms(last - k as i64 * step)).collect())
            }
            Cadence::Cron { .. } => {
                let Some((cron, zone)) = self.compiled()? else { return Ok(Vec::new()) };
                let mut times = Vec::new();
                let mut at = zoned(now, &zone)?;
                let mut inclusive = true;
                while times.len() < limit {
                    let Ok(previous) = cron.find_previous_occurrence(&at, inclusive) else { break };
                    let time = Timestamp::from_unix_ms(previous.timestamp().as_millisecond());
                    if time < first {
                        break;
                    }
                    times.push(time);
                    at = previous;
                    inclusive = false;
                }
                Ok(times)
            }
        }
    }

    /// What to fire at `now` for a schedule whose next firing was
    /// `due_from`: the firings its catch-up policy keeps (oldest first),
    /// how many it drops, and the next firing after `now`.
    pub fn firings(&self, due_from: Timestamp, now: Timestamp, catch_up: CatchUp) -> Result<Firings, String> {
        let due = self.due_newest_first(due_from, now, MISSED_COUNT_LIMIT)?;
        let keep = match catch_up {
            CatchUp::All => CATCH_UP_MAX,
            CatchUp::Last => 1,
            CatchUp::None => usize::from(due.first().is_some_and(|&t| t >= now.minus(ON_TIME_WITHIN))),
        };
        let mut fire: Vec<Timestamp> = due.iter().copied().take(keep).collect();
        fire.reverse();
        let next = self.next_after(now)?;
        Ok(Firings { missed: (due.len() - fire.len()) as u64, latest: due.first().copied(), fire, next })
    }
}

fn zoned(at: Timestamp, zone: &jiff::tz::TimeZone) -> Result<jiff::Zoned, String> {
    // Cron works in whole seconds: the second `at` falls in.
    let seconds = at.unix_ms().div_euclid(1000);
    jiff::Timestamp::from_second(seconds)
        .map(|t| t.to_zoned(zone.clone()))
        .map_err(|e| format!("{at} is out of the calendar's range: {e}"))
}

impl fmt::Display for Cadence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cadence::Cron { expr, timezone } => write!(f, "cron {expr:?} ({timezone})"),
            Cadence::Every(every) => write!(f, "every {}", humantime::format_duration(*every)),
        }
    }
}

/// The firings a scheduler submits for one due schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Firings {
    /// The firing times to submit a job for, oldest first.
    pub fire: Vec<Timestamp>,
    /// Due firings dropped by the catch-up policy (at most 10,000 are
    /// counted).
    pub missed: u64,
    /// The latest due firing, fired or not (`None`: none was due).
    pub latest: Option<Timestamp>,
    /// The first firing after now (`None`: the cadence has no more).
    pub next: Option<Timestamp>,
}

/// What a firing does while the schedule's previous job has not ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Overlap {
    /// Submit nothing; the firing is counted as skipped (the default).
    #[default]
    Skip,
    /// Submit it; it waits for the previous one to end (the schedule's
    /// jobs share a concurrency key).
    Queue,
    /// Submit it; it may run beside the previous one.
    Allow,
}

/// Which firings missed while no scheduler ran (or the schedule could not
/// fire) are submitted when one runs again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CatchUp {
    /// None: only a firing due within the last 30 s is submitted.
    None,
    /// The latest missed firing, once (the default).
    #[default]
    Last,
    /// Every missed firing, oldest first, up to the 100 latest.
    All,
}

macro_rules! text_enum {
    ($ty:ty, $($variant:ident = $text:literal),+) => {
        impl $ty {
            /// As stored and shown.
            pub fn as_str(self) -> &'static str {
                match self { $(Self::$variant => $text),+ }
            }
        }
        impl FromStr for $ty {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s {
                    $($text => Ok(Self::$variant),)+
                    other => Err(format!("{other:?} is not one of {}", [$($text),+].join(", "))),
                }
            }
        }
    };
}
text_enum!(Overlap, Skip = "skip", Queue = "queue", Allow = "allow");
text_enum!(CatchUp, None = "none", Last = "last", All = "all");

/// The job a schedule submits at each firing: the fields of `POST
/// /v1/jobs` that make sense again and again (no delay, no plan, no
/// idempotency key, always async).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JobTemplate {
    /// `name`, `name@version` or a digest: a name is resolved at each
    /// firing, so a schedule of `name` runs its newest registration.
    #[schema(pattern = "^((sha256:)?[0-9a-f]{64}|[a-z0-9][a-z0-9_-]{0,63}(@[A-Za-z0-9._+-]{1,64})?)$")]
    pub plugin: String,
    /// `execute` (default) or `apply`; not with `action`.
    #[schema(pattern = "^(execute|apply)$")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Run this named action instead of a phase.
    #[schema(pattern = "^[a-z0-9_.-]{1,64}$")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    /// The input as JSON (each job gets the same).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    /// Wall-clock limit per attempt.
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 86_400_000)]
    #[serde(rename = "timeout_ms", default, with = "millis::option", skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    /// Fuel budget per attempt; unlimited when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fuel: Option<u64>,
    /// Memory limit.
    #[schema(maximum = 1_073_741_824)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// Output limit.
    #[schema(maximum = 67_108_864)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_bytes: Option<u64>,
    /// Attempts each job may use.
    #[schema(minimum = 1, maximum = 100)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// At most one running job per key (with `overlap: queue`, absent: the
    /// schedule's own key).
    #[schema(min_length = 1, max_length = 256)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency_key: Option<String>,
    /// How long each job may wait in the queue.
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 2_592_000_000u64)]
    #[serde(rename = "queue_ttl_ms", default, with = "millis::option", skip_serializing_if = "Option::is_none")]
    pub queue_ttl: Option<Duration>,
    /// The pause before the first retry, milliseconds.
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 86_400_000)]
    #[serde(rename = "backoff_ms", default, with = "millis::option", skip_serializing_if = "Option::is_none")]
    pub backoff: Option<Duration>,
    /// The longest pause before a retry, milliseconds.
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 86_400_000)]
    #[serde(rename = "backoff_cap_ms", default, with = "millis::option", skip_serializing_if = "Option::is_none")]
    pub backoff_cap: Option<Duration>,
    /// `approval`: each job waits for a person. Absent: the plugin's
    /// policy decides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<GateChoice>,
    /// Claim order: 0 (first, the default) to 9 (last).
    #[schema(minimum = 0, maximum = 9)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u8>,
    /// Tags to find the job by: at most 16, each 1 to 64 of `A-Z a-z 0-9 _
    /// . : / = @ + -` (`GET /v1/jobs?tag=`).
    #[schema(max_items = 16)]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// Metadata to find the job by: at most 16 keys (1 to 64 of `a-z 0-9 _
    /// . -`), each a string (at most 256 bytes), a number or a boolean
    /// (`GET /v1/jobs?meta=`).
    #[schema(value_type = Object)]
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub metadata: serde_json::Map<String, Value>,
    /// A rate limit the job's starts count against (`PUT
    /// /v1/rate-limits/{name}` first): over it, the job waits for its
    /// slot (`rate_slot`) instead of running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<String>,
    /// The job's bucket within its rate limit: text with `{principal}`,
    /// `{plugin}` and `{input.FIELD}` in it, rendered at submit (absent:
    /// the limit's one bucket).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_key: Option<String>,
}

/// A paused schedule's pause.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SchedulePause {
    /// When it was paused.
    pub at: Timestamp,
    /// Who paused it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// Why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A schedule as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    /// Its id (a ULID, like a job's): the jobs it submits carry it.
    pub id: JobId,
    /// Its unique name (lower-case letters, digits, `-` and `_`).
    pub name: String,
    /// When it fires.
    pub cadence: Cadence,
    /// While the previous job runs.
    pub overlap: Overlap,
    /// After missed firings.
    pub catch_up: CatchUp,
    /// The job it submits.
    pub job: JobTemplate,
    /// Set while paused: no firing submits anything, and resuming does
    /// not catch up the firings the pause covered.
    pub paused: Option<SchedulePause>,
    /// The next firing not yet taken (`None`: the cadence has no more).
    pub next_fire_at: Option<Timestamp>,
    /// The last firing taken (fired, skipped or failed to submit).
    pub last_fired_at: Option<Timestamp>,
    /// What the last firing did, in words.
    pub last_outcome: Option<String>,
    /// Jobs submitted by firings (triggers not counted).
    pub fired: u64,
    /// Firings that submitted nothing: skipped for an active previous
    /// job, dropped by the catch-up policy, or refused by a check.
    pub skipped: u64,
    /// Who created it: its jobs are submitted as this principal.
    pub created_by: Option<String>,
    /// When.
    pub created_at: Timestamp,
    /// Bumped by every change but a firing: a firing prepared against an
    /// older revision is not taken.
    pub revision: i64,
}

/// Check a schedule name: 1 to 64 of `a-z`, `0-9`, `-`, `_`, starting with
/// a letter or digit.
pub fn check_schedule_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_SCHEDULE_NAME_BYTES
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        && name.bytes().next().is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "schedule name {name:?} is not valid: use 1 to {MAX_SCHEDULE_NAME_BYTES} of a-z, 0-9, - and _, starting \
             with a letter or digit"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Timestamp {
        Timestamp::parse_rfc3339(text).unwrap()
    }

    #[test]
    fn an_interval_fires_at_multiples_of_itself_since_the_epoch() {
        let hourly = Cadence::every(Duration::from_secs(3600)).unwrap();
        assert_eq!(hourly.next_after(at("2026-12-05T10:20:00Z")).unwrap(), Some(at("2026-12-05T11:00:00Z")));
        assert_eq!(hourly.next_after(at("2026-12-05T11:00:00Z")).unwrap(), Some(at("2026-12-05T12:00:00Z")));
        assert!(Cadence::every(Duration::from_millis(999)).is_err());
        assert!(Cadence::every(MAX_EVERY + Duration::from_secs(1)).is_err());
    }

    #[test]
    fn cron_takes_five_or_six_fields_nicknames_and_a_time_zone() {
        let five = Cadence::cron("30 9 * * MON-FRI", "Europe/Berlin").unwrap();
        // Friday 4 December 2026, 09:30 in Berlin is 08:30 UTC (winter).
        assert_eq!(five.next_after(at("2026-12-04T00:00:00Z")).unwrap(), Some(at("2026-12-04T08:30:00Z")));
        // The next weekday after Friday's is Monday's.
        assert_eq!(five.next_after(at("2026-12-04T08:30:00Z")).unwrap(), Some(at("2026-12-07T08:30:00Z")));
        let six = Cadence::cron("*/15 * * * * *", "UTC").unwrap();
        assert_eq!(six.next_after(at("2026-12-04T00:00:00.500Z")).unwrap(), Some(at("2026-12-04T00:00:15Z")));
        let hourly = Cadence::cron("@hourly", "UTC").unwrap();
        assert_eq!(hourly.next_after(at("2026-12-04T00:59:59Z")).unwrap(), Some(at("2026-12-04T01:00:00Z")));
        assert!(Cadence::cron("61 * * * *", "UTC").unwrap_err().contains("cron expression"));
        assert!(Cadence::cron("* * * * *", "Mars/Olympus").unwrap_err().contains("time zone"));
        assert!(Cadence::cron("* * * * * * *", "UTC").is_err(), "a year field is refused");
    }

    #[test]
    fn a_daily_time_in_a_zone_follows_its_daylight_saving_changes() {
        let daily = Cadence::cron("0 9 * * *", "America/New_York").unwrap();
        // 09:00 EDT (UTC-4) before 1 November 2026, 09:00 EST (UTC-5) after.
        assert_eq!(daily.next_after(at("2026-10-30T14:00:00Z")).unwrap(), Some(at("2026-10-31T13:00:00Z")));
        assert_eq!(daily.next_after(at("2026-10-31T14:00:00Z")).unwrap(), Some(at("2026-11-01T14:00:00Z")));
        // 02:30 does not exist on 8 March 2026 there: it fires as the gap ends.
        let gap = Cadence::cron("30 2 * * *", "America/New_York").unwrap();
        assert_eq!(gap.next_after(at("2026-03-08T05:00:00Z")).unwrap(), Some(at("2026-03-08T07:00:00Z")));
        // 01:30 happens twice on 1 November 2026 there (EDT, then EST): it
        // fires once, at the first.
        let fold = Cadence::cron("30 1 * * *", "America/New_York").unwrap();
        assert_eq!(fold.next_after(at("2026-11-01T04:00:00Z")).unwrap(), Some(at("2026-11-01T05:30:00Z")));
        assert_eq!(fold.next_after(at("2026-11-01T05:30:00Z")).unwrap(), Some(at("2026-11-02T06:30:00Z")));
    }

    #[test]
    fn catch_up_decides_which_missed_firings_fire() {
        let minutely = Cadence::every(Duration::from_secs(60)).unwrap();
        // Down from 12:00 to 12:03:40: firings at 12:00, :01, :02, :03 are due.
        let (from, now) = (at("2026-12-05T12:00:00Z"), at("2026-12-05T12:03:40Z"));
        let all = minutely.firings(from, now, CatchUp::All).unwrap();
        assert_eq!(all.fire, ["12:00", "12:01", "12:02", "12:03"].map(|m| at(&format!("2026-12-05T{m}:00Z"))));
        assert_eq!((all.missed, all.next), (0, Some(at("2026-12-05T12:04:00Z"))));
        let last = minutely.firings(from, now, CatchUp::Last).unwrap();
        assert_eq!((last.fire, last.missed), (vec![at("2026-12-05T12:03:00Z")], 3));
        let none = minutely.firings(from, now, CatchUp::None).unwrap();
        assert_eq!((none.fire, none.missed), (vec![], 4), "12:03 is 40 s late: missed");
        // On time (within 30 s): even `none` fires it.
        let on_time = minutely.firings(at("2026-12-05T12:03:00Z"), at("2026-12-05T12:03:02Z"), CatchUp::None).unwrap();
        assert_eq!((on_time.fire, on_time.missed), (vec![at("2026-12-05T12:03:00Z")], 0));
        // Nothing due yet.
        let early = minutely.firings(at("2026-12-05T12:04:00Z"), now, CatchUp::All).unwrap();
        assert_eq!((early.fire.len(), early.next), (0, Some(at("2026-12-05T12:04:00Z"))));
    }

    #[test]
    fn catch_up_all_keeps_the_latest_hundred() {
        let secondly = Cadence::cron("* * * * * *", "UTC").unwrap();
        let from = at("2026-12-05T12:00:00Z");
        let fired = secondly.firings(from, from.plus(Duration::from_secs(149)), CatchUp::All).unwrap();
        assert_eq!(fired.fire.len(), CATCH_UP_MAX);
        assert_eq!(fired.missed, 50);
        assert_eq!(fired.fire[0], from.plus(Duration::from_secs(50)));
        assert_eq!(fired.fire[99], from.plus(Duration::from_secs(149)));
    }

    #[test]
    fn names_and_policies_parse() {
        assert!(check_schedule_name("nightly-sync_2").is_ok());
        for bad in ["", "Nightly", "-x", "a b", &"x".repeat(65)] {
            assert!(check_schedule_name(bad).is_err(), "{bad:?}");
        }
        assert_eq!("queue".parse::<Overlap>(), Ok(Overlap::Queue));
        assert_eq!("all".parse::<CatchUp>(), Ok(CatchUp::All));
        assert!("sometimes".parse::<CatchUp>().unwrap_err().contains("none, last, all"));
    }
}
