//! Rate limits on outbound requests. A limit may name host rules and
//! secrets besides (or instead of) being named by jobs: then every granted
//! request, of any job, that matches one of its host rules, or carries one
//! of its secrets, takes a slot from it before it leaves the host, and
//! waits for the slot inside its attempt.
//!
//! An upstream's quota is usually per credential, so each secret a limit
//! names is a bucket of its own (`egress:secret:NAME`): two tokens, two
//! quotas. Its host rules share one bucket (`egress:hosts`): list hosts
//! together when they share a quota, and give each its own limit when
//! they don't. A request that several buckets apply to (of one limit or
//! of several) takes one slot in each at the same time, the latest any of
//! them gives, or none at all.

use std::collections::HashMap;

use super::RateLimit;
use crate::clock::Timestamp;
use crate::job::grant::{HttpScheme, SecretName};

/// The bucket a limit's host rules share.
pub const HOSTS_BUCKET: &str = "egress:hosts";
/// The prefix of a secret's bucket: `egress:secret:NAME`.
pub const SECRET_BUCKET_PREFIX: &str = "egress:secret:";

/// Most host rules, and most secrets, one limit may name.
pub const MAX_EGRESS_RULES: usize = 64;

/// An outbound request as egress limits match it: what the grant matched,
/// and the secrets the host put into its headers.
#[derive(Debug, Clone, Copy)]
pub struct Outbound<'a> {
    /// Upper-case method.
    pub method: &'a str,
    /// Scheme.
    pub scheme: HttpScheme,
    /// Host, lowercase, no trailing dot.
    pub host: &'a str,
    /// Port.
    pub port: u16,
    /// The secrets its headers carry.
    pub secrets: &'a [SecretName],
}

impl RateLimit {
    /// Whether it applies to outbound requests at all.
    pub fn limits_egress(&self) -> bool {
        !self.hosts.is_empty() || !self.secrets.is_empty()
    }

    /// The buckets of this limit `request` takes a slot from (none: it
    /// does not apply).
    pub fn egress_buckets(&self, request: &Outbound<'_>) -> Vec<String> {
        let mut buckets = Vec::new();
        if self.hosts.iter().any(|rule| rule.allows(request.method, request.scheme, request.host, request.port)) {
            buckets.push(HOSTS_BUCKET.to_owned());
        }
        for secret in request.secrets.iter().filter(|s| self.secrets.contains(s)) {
            let bucket = format!("{SECRET_BUCKET_PREFIX}{secret}");
            if !buckets.contains(&bucket) {
                buckets.push(bucket);
            }
        }
        buckets
    }

    /// The limit's egress rules, checked: at most [`MAX_EGRESS_RULES`]
    /// host rules and secrets, none twice.
    pub fn check_egress(&self) -> Result<(), String> {
        if self.hosts.len() > MAX_EGRESS_RULES || self.secrets.len() > MAX_EGRESS_RULES {
            return Err(format!("a limit names at most {MAX_EGRESS_RULES} hosts and {MAX_EGRESS_RULES} secrets"));
        }
        let mut hosts: Vec<String> = self.hosts.iter().map(ToString::to_string).collect();
        hosts.sort();
        if let Some(twice) = hosts.windows(2).find(|w| w[0] == w[1]) {
            return Err(format!("host {} is named twice", twice[0]));
        }
        let mut secrets: Vec<&SecretName> = self.secrets.iter().collect();
        secrets.sort();
        if let Some(twice) = secrets.windows(2).find(|w| w[0] == w[1]) {
            return Err(format!("secret {} is named twice", twice[0]));
        }
        Ok(())
    }
}

/// The `(limit, bucket)` pairs of every limit in `limits` that `request`
/// takes a slot from, in key order (the order the store locks them in).
pub fn egress_buckets(limits: &[RateLimit], request: &Outbound<'_>) -> Vec<(String, String)> {
    let mut buckets: Vec<(String, String)> = limits
        .iter()
        .flat_map(|limit| limit.egress_buckets(request).into_iter().map(|b| (limit.name.clone(), b)))
        .collect();
    buckets.sort();
    buckets
}

/// A bucket: a limit's name and the bucket's key within it.
pub type Bucket = (String, String);

/// When a request may leave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reservation {
    /// At this time (now or later): the slot is taken in every bucket.
    At(Timestamp),
    /// Not before this time, which is past the latest the request could
    /// wait for: nothing is taken.
    TooLate(Timestamp),
}

/// Take one request's slot in every one of `buckets` together, reading
/// their TATs from `tats` (absent: never used): the slot is the latest any
/// of them gives, and each bucket's TAT moves as if the request came then.
/// A slot after `latest` takes nothing. A bucket whose limit is gone
/// limits nothing. Returns the reservation and the TATs to store.
pub fn reserve_together(
    buckets: &[(String, String)],
    limits: &HashMap<String, RateLimit>,
    tats: &HashMap<(String, String), i64>,
    now: Timestamp,
    latest: Timestamp,
) -> (Reservation, Vec<(Bucket, i64)>) {
    let now_us = now.unix_ms().saturating_mul(1000);
    let live: Vec<(&(String, String), &RateLimit)> =
        buckets.iter().filter_map(|b| limits.get(&b.0).map(|limit| (b, limit))).collect();
    let slot_us = live.iter().map(|(b, limit)| limit.reserve(tats.get(*b).copied(), now_us).0).max().unwrap_or(now_us);
    // Never before the reservation: a slot inside a millisecond rounds up.
    let slot = Timestamp::from_unix_ms((slot_us + 999).div_euclid(1000).max(now.unix_ms()));
    if slot > latest {
        return (Reservation::TooLate(slot), Vec::new());
    }
    let taken =
        live.into_iter().map(|(b, limit)| (b.clone(), limit.reserve(tats.get(b).copied(), slot_us).1)).collect();
    (Reservation::At(slot), taken)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(name: &str, rate: &str, hosts: &[&str], secrets: &[&str]) -> RateLimit {
        let mut limit = RateLimit::new(name, rate.parse().unwrap(), 1, None, Timestamp::from_unix_ms(0)).unwrap();
        limit.hosts = hosts.iter().map(|h| h.parse().unwrap()).collect();
        limit.secrets = secrets.iter().map(|s| s.parse().unwrap()).collect();
        limit
    }

    fn to<'a>(method: &'a str, host: &'a str, secrets: &'a [SecretName]) -> Outbound<'a> {
        Outbound { method, scheme: HttpScheme::Https, host, port: 443, secrets }
    }

    #[test]
    fn hosts_share_a_bucket_and_each_secret_has_its_own() {
        let github =
            limit("github", "5000/h", &["https://api.github.com", "https://uploads.github.com"], &["GH_A", "GH_B"]);
        let a: Vec<SecretName> = vec!["GH_A".parse().unwrap()];
        let b: Vec<SecretName> = vec!["GH_B".parse().unwrap(), "OTHER".parse().unwrap()];
        assert_eq!(github.egress_buckets(&to("GET", "api.github.com", &[])), ["egress:hosts"]);
        assert_eq!(
            github.egress_buckets(&to("POST", "uploads.github.com", &a)),
            ["egress:hosts", "egress:secret:GH_A"]
        );
        assert_eq!(github.egress_buckets(&to("GET", "example.com", &b)), ["egress:secret:GH_B"]);
        assert!(github.egress_buckets(&to("GET", "example.com", &[])).is_empty());
        let only_get = limit("reads", "1/s", &["GET https://*.example.com"], &[]);
        assert!(only_get.egress_buckets(&to("POST", "api.example.com", &[])).is_empty(), "the rule's methods count");
        let all = egress_buckets(&[only_get, github], &to("GET", "api.example.com", &a));
        assert_eq!(all, [("github".into(), "egress:secret:GH_A".into()), ("reads".into(), "egress:hosts".into())]);
    }

    #[test]
    fn a_request_takes_the_latest_slot_of_its_buckets_or_nothing() {
        let slow = limit("slow", "1/s", &["https://a.example"], &[]);
        let fast = limit("fast", "10/s", &[], &["KEY"]);
        let limits = HashMap::from([("slow".to_owned(), slow), ("fast".to_owned(), fast)]);
        let buckets =
            [("fast".to_owned(), "egress:secret:KEY".to_owned()), ("slow".to_owned(), HOSTS_BUCKET.to_owned())];
        let at = Timestamp::from_unix_ms;
        let mut tats = HashMap::new();
        let mut slots = Vec::new();
        for _ in 0..3 {
            let (reservation, taken) = reserve_together(&buckets, &limits, &tats, at(1000), at(10_000));
            slots.push(reservation);
            tats.extend(taken);
        }
        assert_eq!(slots, [Reservation::At(at(1000)), Reservation::At(at(2000)), Reservation::At(at(3000))]);
        // The fast bucket was moved as if each request came at its slot.
        assert_eq!(tats[&buckets[0]], 3_100_000);
        // Past the latest it may wait, nothing is taken.
        let (late, taken) = reserve_together(&buckets, &limits, &tats, at(1000), at(3999));
        assert_eq!((late, taken.len()), (Reservation::TooLate(at(4000)), 0));
        // A limit that is gone limits nothing.
        let (gone, taken) = reserve_together(&[("gone".into(), HOSTS_BUCKET.into())], &limits, &tats, at(5), at(5));
        assert_eq!((gone, taken.len()), (Reservation::At(at(5)), 0));
    }

    #[test]
    fn egress_rules_are_checked() {
        assert!(limit("a", "1/s", &["https://x.com"], &["K"]).check_egress().is_ok());
        let twice = limit("a", "1/s", &["https://x.com", "https://X.com"], &[]).check_egress().unwrap_err();
        assert!(twice.contains("named twice"), "{twice}");
        assert!(limit("a", "1/s", &[], &["K", "K"]).check_egress().unwrap_err().contains("secret K"));
    }
}
