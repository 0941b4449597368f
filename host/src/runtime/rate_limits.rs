//! Named rate limits: set, list, remove. A job that names one starts no
//! faster than it allows, and a granted request that matches one's host
//! rules or carries one of its secrets leaves no faster, across every
//! process sharing the store (see [`crate::job::rate`]).

use crate::job::grant::{HostRule, SecretName};
use crate::job::rate::{Rate, RateLimit, check_limit_name};
use crate::runtime::{Runtime, RuntimeError};
use crate::store::RateLimitRemoveParams;

/// The outbound requests a limit applies to: those a host rule matches
/// (one bucket for them all), and those carrying a secret (a bucket for
/// each secret).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressRules {
    /// Host rules, in the grant syntax (`[METHODS ]SCHEME://HOST[:PORT]`).
    pub hosts: Vec<HostRule>,
    /// Secret names.
    pub secrets: Vec<SecretName>,
}

impl Runtime {
    /// Create the limit `name` or change it: at most `rate`, `burst` of
    /// them back to back (default 1: evenly spaced), for the jobs that
    /// name it and for the outbound requests of any job that match
    /// `egress`. A change applies from the next slot given; slots already
    /// given stand; other processes apply a change to requests within
    /// a second. Audited as `rate_limit.set`.
    pub async fn rate_limit_set(
        &self,
        name: &str,
        rate: Rate,
        burst: Option<u32>,
        egress: EgressRules,
    ) -> Result<RateLimit, RuntimeError> {
        let limit = RateLimit::new(name, rate, burst.unwrap_or(1), self.actor(), self.now())
            .and_then(|limit| limit.with_egress(egress.hosts, egress.secrets))
            .map_err(RuntimeError::InvalidRateLimit)?;
        Ok(self.inner.store.rate_limit_set(limit).await?)
    }

    /// The limit `name`.
    pub async fn rate_limit(&self, name: &str) -> Result<RateLimit, RuntimeError> {
        check_limit_name(name).map_err(RuntimeError::InvalidRateLimit)?;
        self.inner.store.rate_limit_get(name).await?.ok_or_else(|| RuntimeError::UnknownRateLimit(name.to_owned()))
    }

    /// Every limit, by name.
    pub async fn rate_limits(&self) -> Result<Vec<RateLimit>, RuntimeError> {
        Ok(self.inner.store.rate_limits().await?)
    }

    /// Remove the limit `name`: jobs that name it start unlimited from now
    /// on (and new ones naming it are refused). Audited as
    /// `rate_limit.remove`.
    pub async fn rate_limit_remove(&self, name: &str) -> Result<(), RuntimeError> {
        check_limit_name(name).map_err(RuntimeError::InvalidRateLimit)?;
        let params = RateLimitRemoveParams { name: name.to_owned(), actor: self.actor(), now: self.now() };
        if !self.inner.store.rate_limit_remove(params).await? {
            return Err(RuntimeError::UnknownRateLimit(name.to_owned()));
        }
        // Jobs that waited on it may be claimable now.
        self.nudge();
        Ok(())
    }
}
