//! Job ids.

use std::fmt;
use std::str::FromStr;

use crate::clock::Timestamp;

/// A job's id: a ULID, so ids sort by creation time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JobId(ulid::Ulid);

impl JobId {
    /// A fresh id for a job created at `now`.
    pub fn new(now: Timestamp) -> Self {
        JobId(ulid::Ulid::from_parts(now.unix_ms().max(0) as u64, rand_u128()))
    }
}

impl JobId {
    /// The least id a job created at `at` can have: ids from it on are of
    /// jobs created then or later.
    pub fn first_at(at: Timestamp) -> Self {
        JobId(ulid::Ulid::from_parts(at.unix_ms().max(0) as u64, 0))
    }
}

fn rand_u128() -> u128 {
    ulid::Ulid::generate().random()
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl FromStr for JobId {
    type Err = String;

    /// Only the canonical form: 26 upper-case Crockford base32 characters
    /// whose value fits 128 bits. Anything else (a first character above
    /// `7`, lower case, the look-alike letters decoders map to digits)
    /// would alias another id.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let refused = || format!("invalid job id {s:?}: expected a 26-character ULID (0-9, A-Z, first character 0-7)");
        let id = ulid::Ulid::from_string(s).map_err(|_| refused())?;
        if s.len() != ulid::ULID_LEN || !s.starts_with(|c: char| ('0'..='7').contains(&c)) || id.to_string() != s {
            return Err(refused());
        }
        Ok(JobId(id))
    }
}

super::serde_as_text!(JobId);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_canonical_job_ids_parse() {
        let id = JobId::new(Timestamp::from_unix_ms(1_764_484_424_123));
        let text = id.to_string();
        assert_eq!(text.parse::<JobId>().unwrap(), id);
        let aliases = [
            format!("8{}", &text[1..]),
            "ZZZZZZZZZZZZZZZZZZZZZZZZZZ".to_owned(),
            text.to_lowercase(),
            text.replace('1', "I"),
            format!("{text}0"),
            text[1..].to_owned(),
        ];
        for alias in aliases {
            assert!(alias.parse::<JobId>().is_err(), "{alias} must be refused");
        }
        assert!("7ZZZZZZZZZZZZZZZZZZZZZZZZZ".parse::<JobId>().is_ok(), "the largest ULID");
    }
}
