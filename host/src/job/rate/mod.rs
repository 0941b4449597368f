//! Rate limits: named limits of *N per interval*, and the jobs that name
//! one start no faster than it allows, across every process sharing the
//! store.
//!
//! A limit is a generic cell rate (GCRA, the leaky bucket as a meter): its
//! emission interval is `per / count`, and up to `burst` starts may come
//! back to back. Each bucket (a limit and a key) keeps one number, its
//! theoretical arrival time (TAT). A job that asks for a start at `now`
//! gets the slot `max(now, tat − (burst − 1) × interval)` and moves the
//! TAT to `max(tat, now) + interval`: a reservation, so a job over the
//! limit is not refused but given the time it may run, and keeps that
//! place. The decisions are here, with no SQL; each backend keeps the
//! buckets and applies them as it claims.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::job::grant::{HostRule, SecretName};

mod egress;

pub use self::egress::{
    Bucket, HOSTS_BUCKET, MAX_EGRESS_RULES, Outbound, Reservation, SECRET_BUCKET_PREFIX, egress_buckets,
    reserve_together,
};

/// Longest limit name, in bytes.
pub const MAX_LIMIT_NAME_BYTES: usize = 64;
/// Longest rendered rate key, in bytes.
pub const MAX_RATE_KEY_BYTES: usize = 256;
/// Largest burst a limit may allow.
pub const MAX_BURST: u32 = 100_000;
/// Shortest and longest interval a limit may count over.
pub const MIN_PER: Duration = Duration::from_millis(1);
/// Longest interval a limit may count over (a day).
pub const MAX_PER: Duration = Duration::from_secs(86_400);
/// Most starts a limit may allow per interval.
pub const MAX_COUNT: u32 = 1_000_000;

/// How long after its slot a reserved job may still start on that
/// reservation. Past it (its process was down, or every worker busy) the
/// slot is spent and the job is given a new one, so starts that were held
/// up never arrive all at once: in any window, starts are at most the
/// limit's count for the window plus this long's worth, plus the burst.
pub const RESERVATION_GRACE: Duration = Duration::from_secs(2);

/// Most due jobs a PostgreSQL claim gives slots to, before its claim
/// statement (SQLite gives each picked job its slot as it claims).
pub const ADMIT_PER_CLAIM: u32 = 512;

/// A named limit: at most `count` starts per `per`, `burst` of them back
/// to back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RateLimit {
    /// Its name, which jobs give as `rate_limit`.
    pub name: String,
    /// Starts per interval.
    pub count: u32,
    /// The interval, milliseconds.
    pub per_ms: u64,
    /// Starts that may come back to back (1: evenly spaced).
    pub burst: u32,
    /// `count/per` as text (`50/s`, `1000/h`, `30/10s`).
    pub rate: String,
    /// When it was last set.
    pub updated_at: Timestamp,
    /// Who last set it (absent: an embedder's own call).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_by: Option<String>,
    /// Host rules (`[METHODS ]SCHEME://HOST[:PORT]`): every granted
    /// request of any job one matches takes a slot from it, all of them
    /// from one bucket (`egress:hosts`).
    #[schema(value_type = Vec<String>)]
    pub hosts: Vec<HostRule>,
    /// Secret names: every request carrying one takes a slot from it, each
    /// secret from a bucket of its own (`egress:secret:NAME`).
    #[schema(value_type = Vec<String>)]
    pub secrets: Vec<SecretName>,
}

/// How a limit's host rules and secrets are stored: one JSON column,
/// `NULL` when it names neither.
#[derive(Serialize, Deserialize)]
struct EgressColumn {
    hosts: Vec<HostRule>,
    secrets: Vec<SecretName>,
}

impl RateLimit {
    /// A limit of `rate`, checked: a name of `[a-z0-9_.-]`, 1 to 64
    /// bytes, and a burst of 1 to [`MAX_BURST`].
    pub fn new(name: &str, rate: Rate, burst: u32, updated_by: Option<String>, now: Timestamp) -> Result<Self, String> {
        check_limit_name(name)?;
        if !(1..=MAX_BURST).contains(&burst) {
            return Err(format!("burst {burst} is out of range: use 1 to {MAX_BURST}"));
        }
        Ok(RateLimit {
            name: name.to_owned(),
            count: rate.count,
            per_ms: rate.per.as_millis() as u64,
            burst,
            rate: rate.to_string(),
            updated_at: now,
            updated_by,
            hosts: Vec::new(),
            secrets: Vec::new(),
        })
    }

    /// The same limit applied to outbound requests matching `hosts` or
    /// carrying `secrets`, checked (see [`RateLimit::check_egress`]).
    pub fn with_egress(mut self, hosts: Vec<HostRule>, secrets: Vec<SecretName>) -> Result<Self, String> {
        self.hosts = hosts;
        self.secrets = secrets;
        self.check_egress()?;
        Ok(self)
    }

    /// Its host rules and secrets as stored (`None`: neither).
    pub fn egress_column(&self) -> Option<String> {
        let column = EgressColumn { hosts: self.hosts.clone(), secrets: self.secrets.clone() };
        self.limits_egress().then(|| serde_json::to_string(&column).expect("rules and names serialize"))
    }

    /// A limit read back from its columns.
    pub fn from_columns(
        name: String,
        count: u32,
        per_ms: u64,
        burst: u32,
        updated_at: Timestamp,
        updated_by: Option<String>,
        egress: Option<String>,
    ) -> Self {
        let rate = Rate { count, per: Duration::from_millis(per_ms) }.to_string();
        // Written by `egress_column`; a column that will not read (written
        // by hand) limits no request rather than failing every read.
        let EgressColumn { hosts, secrets } = egress
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or(EgressColumn { hosts: Vec::new(), secrets: Vec::new() });
        RateLimit { name, count, per_ms, burst, rate, updated_at, updated_by, hosts, secrets }
    }

    /// Its emission interval, microseconds (at least 1).
    pub fn interval_us(&self) -> i64 {
        ((self.per_ms as i64).saturating_mul(1000) / i64::from(self.count.max(1))).max(1)
    }

    /// The bucket's slot for a start asked for at `now_us` with its TAT at
    /// `tat_us` (`None`: never used), and the TAT after it; microseconds.
    pub fn reserve(&self, tat_us: Option<i64>, now_us: i64) -> (i64, i64) {
        let interval = self.interval_us();
        let tat = tat_us.unwrap_or(now_us);
        let tolerance = interval.saturating_mul(i64::from(self.burst.saturating_sub(1)));
        let slot = now_us.max(tat.saturating_sub(tolerance));
        (slot, tat.max(now_us).saturating_add(interval))
    }
}

/// Check a limit name: `[a-z0-9_.-]`, 1 to [`MAX_LIMIT_NAME_BYTES`] bytes.
pub fn check_limit_name(name: &str) -> Result<(), String> {
    let fine = !name.is_empty()
        && name.len() <= MAX_LIMIT_NAME_BYTES
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_.-".contains(&b));
    if fine {
        Ok(())
    } else {
        Err(format!(
            "rate limit name {name:?} is not valid: use 1 to {MAX_LIMIT_NAME_BYTES} of a-z, 0-9, '_', '.', '-'"
        ))
    }
}

/// A rate: `count` per `per`. Written `50/s`, `1000/h`, `30/10s`, `5/min`
/// (units `ms`, `s`, `m` or `min`, `h`, `d`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Starts per interval.
    pub count: u32,
    /// The interval.
    pub per: Duration,
}

impl FromStr for Rate {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("rate {s:?} is not valid: write COUNT/INTERVAL, as 50/s, 1000/h, 30/10s or 5/min");
        let (count, per) = s.trim().split_once('/').ok_or_else(bad)?;
        let count: u32 = count.trim().parse().map_err(|_| bad())?;
        let per = per.trim();
        let digits = per.bytes().take_while(u8::is_ascii_digit).count();
        let times: u64 = if digits == 0 { 1 } else { per[..digits].parse().map_err(|_| bad())? };
        let unit = match &per[digits..] {
            "ms" => Duration::from_millis(1),
            "s" | "sec" | "second" => Duration::from_secs(1),
            "m" | "min" | "minute" => Duration::from_secs(60),
            "h" | "hour" => Duration::from_secs(3600),
            "d" | "day" => Duration::from_secs(86_400),
            _ => return Err(bad()),
        };
        let per = unit.checked_mul(u32::try_from(times).map_err(|_| bad())?).ok_or_else(bad)?;
        if !(1..=MAX_COUNT).contains(&count) {
            return Err(format!("rate {s:?}: the count must be 1 to {MAX_COUNT}"));
        }
        if !(MIN_PER..=MAX_PER).contains(&per) {
            return Err(format!("rate {s:?}: the interval must be 1ms to 1d"));
        }
        Ok(Rate { count, per })
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.per.as_millis() as u64;
        let (n, unit) = [(86_400_000, "d"), (3_600_000, "h"), (60_000, "min"), (1000, "s")]
            .into_iter()
            .find(|(size, _)| ms.is_multiple_of(*size))
            .map_or((ms, "ms"), |(size, unit)| (ms / size, unit));
        if n == 1 { write!(f, "{}/{unit}", self.count) } else { write!(f, "{}/{n}{unit}", self.count) }
    }
}

/// What a rate key template is rendered from at submit.
#[derive(Debug, Clone, Copy)]
pub struct KeySource<'a> {
    /// The submitting principal.
    pub principal: Option<&'a str>,
    /// The plugin's registry name.
    pub plugin: Option<&'a str>,
    /// The job's input.
    pub input: &'a [u8],
}

/// Render a rate key template: text with `{principal}`, `{plugin}` and
/// `{input.FIELD}` (a top-level string, number or boolean of the JSON
/// input) in it. A field the input lacks is an error, not an empty key:
/// jobs would share a bucket they were meant not to.
pub fn render_key(template: &str, from: KeySource<'_>) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = template;
    let mut input: Option<serde_json::Value> = None;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let close = rest[open..].find('}').ok_or_else(|| format!("rate_key {template:?}: a '{{' is not closed"))?;
        let name = &rest[open + 1..open + close];
        match name {
            "principal" => out.push_str(from.principal.unwrap_or("")),
            "plugin" => out.push_str(from.plugin.unwrap_or("")),
            _ => {
                let field = name.strip_prefix("input.").ok_or_else(|| {
                    format!("rate_key {template:?}: {{{name}}} is not known: use {{principal}}, {{plugin}} or {{input.FIELD}}")
                })?;
                let value = input.get_or_insert_with(|| serde_json::from_slice(from.input).unwrap_or_default());
                match value.get(field) {
                    Some(serde_json::Value::String(s)) => out.push_str(s),
                    Some(v @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_))) => {
                        out.push_str(&v.to_string())
                    }
                    _ => {
                        return Err(format!(
                            "rate_key {template:?}: the input has no string, number or boolean field {field:?}"
                        ));
                    }
                }
            }
        }
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    if out.len() > MAX_RATE_KEY_BYTES {
        return Err(format!("rate_key is {} bytes rendered, over {MAX_RATE_KEY_BYTES}", out.len()));
    }
    Ok(out)
}

/// A due job that names a limit and holds no live reservation.
#[derive(Debug, Clone)]
pub struct Candidate<Id> {
    /// The job.
    pub id: Id,
    /// The limit it names.
    pub limit: String,
    /// Its bucket within the limit.
    pub key: String,
}

/// What admission decided: each job's slot, and each bucket's new TAT.
#[derive(Debug, Default)]
pub struct Admission<Id> {
    /// `(job, slot)`: the job may start at its slot (now or later).
    pub slots: Vec<(Id, Timestamp)>,
    /// `((limit, key), tat µs)` to store.
    pub buckets: Vec<((String, String), i64)>,
}

/// Give each candidate, in order, its slot under its limit, reading each
/// bucket's TAT from `tats` (absent: never used). A limit that is gone
/// (removed after the job was submitted) limits nothing: the job's slot is
/// now.
pub fn admit<Id: Clone>(
    candidates: &[Candidate<Id>],
    limits: &HashMap<String, RateLimit>,
    mut tats: HashMap<(String, String), i64>,
    now: Timestamp,
) -> Admission<Id> {
    let now_us = now.unix_ms().saturating_mul(1000);
    let mut admission = Admission { slots: Vec::with_capacity(candidates.len()), buckets: Vec::new() };
    let mut touched = std::collections::BTreeSet::new();
    for c in candidates {
        let Some(limit) = limits.get(&c.limit) else {
            admission.slots.push((c.id.clone(), now));
            continue;
        };
        let bucket = (c.limit.clone(), c.key.clone());
        let (slot, tat) = limit.reserve(tats.get(&bucket).copied(), now_us);
        tats.insert(bucket.clone(), tat);
        touched.insert(bucket);
        // A slot inside this millisecond is now; a later one rounds up,
        // so the job never starts before its reservation.
        let slot_ms = (slot + 999).div_euclid(1000);
        admission.slots.push((c.id.clone(), Timestamp::from_unix_ms(slot_ms.max(now.unix_ms()))));
    }
    // In key order: the order every backend locks them in.
    admission.buckets = touched
        .into_iter()
        .map(|b| {
            let tat = tats[&b];
            (b, tat)
        })
        .collect();
    admission
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(rate: &str, burst: u32) -> RateLimit {
        RateLimit::new("api", rate.parse().unwrap(), burst, None, Timestamp::from_unix_ms(0)).unwrap()
    }

    #[test]
    fn rates_read_and_print_in_their_units() {
        for (text, count, ms, shown) in [
            ("50/s", 50, 1000, "50/s"),
            ("1000/h", 1000, 3_600_000, "1000/h"),
            ("30/10s", 30, 10_000, "30/10s"),
            ("5/min", 5, 60_000, "5/min"),
            ("5/m", 5, 60_000, "5/min"),
            ("7/250ms", 7, 250, "7/250ms"),
            ("1/d", 1, 86_400_000, "1/d"),
        ] {
            let rate: Rate = text.parse().unwrap();
            assert_eq!((rate.count, rate.per.as_millis() as u64), (count, ms), "{text}");
            assert_eq!(rate.to_string(), shown);
        }
        for bad in ["50", "0/s", "50/", "50/x", "50/2d", "-1/s", "50/0s", "2000000/s"] {
            assert!(bad.parse::<Rate>().is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn names_are_checked() {
        assert!(check_limit_name("github.api-v3_x").is_ok());
        for bad in ["", "GitHub", "a b", "a/b", &"x".repeat(65)] {
            assert!(check_limit_name(bad).is_err(), "{bad:?}");
        }
        assert!(RateLimit::new("a", "1/s".parse().unwrap(), 0, None, Timestamp::from_unix_ms(0)).is_err());
    }

    #[test]
    fn evenly_spaced_slots_without_a_burst() {
        let l = limit("50/s", 1);
        let mut tat = None;
        let mut slots = Vec::new();
        for _ in 0..5 {
            let (slot, next) = l.reserve(tat, 0);
            slots.push(slot);
            tat = Some(next);
        }
        assert_eq!(slots, [0, 20_000, 40_000, 60_000, 80_000]);
        // An idle bucket forgets: a start long after is at once.
        assert_eq!(l.reserve(tat, 10_000_000).0, 10_000_000);
    }

    #[test]
    fn a_burst_comes_at_once_then_the_rate() {
        let l = limit("10/s", 3);
        let mut tat = None;
        let slots: Vec<i64> = (0..5)
            .map(|_| {
                let (slot, next) = l.reserve(tat, 0);
                tat = Some(next);
                slot
            })
            .collect();
        assert_eq!(slots, [0, 0, 0, 100_000, 200_000]);
    }

    #[test]
    fn admission_spaces_each_bucket_on_its_own_and_lets_a_removed_limit_go() {
        let limits = HashMap::from([("api".to_owned(), limit("2/s", 1))]);
        let now = Timestamp::from_unix_ms(1_000);
        let c = |id: u32, limit: &str, key: &str| Candidate { id, limit: limit.into(), key: key.into() };
        let admission = admit(
            &[c(1, "api", "a"), c(2, "api", "a"), c(3, "api", "b"), c(4, "gone", ""), c(5, "api", "a")],
            &limits,
            HashMap::new(),
            now,
        );
        let at = |ms| Timestamp::from_unix_ms(ms);
        assert_eq!(admission.slots, [(1, at(1000)), (2, at(1500)), (3, at(1000)), (4, at(1000)), (5, at(2000))]);
        assert_eq!(
            admission.buckets,
            [(("api".into(), "a".into()), 2_500_000), (("api".into(), "b".into()), 1_500_000)]
        );
    }

    #[test]
    fn keys_render_from_the_principal_the_plugin_and_input_fields() {
        let from = KeySource { principal: Some("ci"), plugin: Some("github"), input: br#"{"org":"acme","n":3}"# };
        assert_eq!(render_key("{plugin}:{principal}:{input.org}/{input.n}", from).unwrap(), "github:ci:acme/3");
        assert_eq!(render_key("fixed", from).unwrap(), "fixed");
        assert!(render_key("{input.missing}", from).unwrap_err().contains("no string, number or boolean field"));
        assert!(render_key("{who}", from).unwrap_err().contains("not known"));
        assert!(render_key("{plugin", from).unwrap_err().contains("not closed"));
    }
}
