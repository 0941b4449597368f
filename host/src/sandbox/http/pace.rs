//! Rate limits on outbound requests, as a run meets them: before a granted
//! request leaves, the runtime's [`EgressLimits`] gives it a slot under
//! every limit that applies to it (see [`crate::job::rate`]'s egress
//! rules), and the request waits for it inside the attempt. A slot past
//! the job's deadline is not taken: the run ends there, `rate_limited`
//! and retryable, through its [`RateTrip`].

use std::sync::OnceLock;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use crate::job::rate::Outbound;

/// When an outbound request may leave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pace {
    /// At once: no limit applies, or its slot is now.
    Now,
    /// After waiting this long, for the limits named.
    After(Duration, Vec<String>),
    /// Its slot is this far off, past the latest it may wait for; no slot
    /// was taken.
    TooLate(Duration, Vec<String>),
}

/// The runtime's side of egress rate limits (a run without one, as
/// `leash run`'s, is not limited).
#[async_trait::async_trait]
pub trait EgressLimits: Send + Sync + std::fmt::Debug {
    /// Take `request`'s slot under every limit that applies to it, unless
    /// it is more than `at_most` away; `Err` says why no slot could be
    /// given (the store could not be reached), and the request is not
    /// sent.
    async fn pace(&self, request: &Outbound<'_>, at_most: Duration) -> Result<Pace, String>;
}

/// Why a run's rate limits ended it: the message its failure carries, and
/// how long until the slot it may run again from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RateLimited {
    pub(crate) message: String,
    pub(crate) after: Duration,
}

/// Set when a request's slot is past the deadline: it ends the run.
#[derive(Debug, Default)]
pub(crate) struct RateTrip {
    tripped: OnceLock<RateLimited>,
    notify: tokio::sync::Notify,
    /// Whether a wait has been logged (the first only: a job pacing
    /// a thousand requests would fill its log).
    pub(super) wait_logged: AtomicBool,
}

impl RateTrip {
    /// End the run: a slot `after` from now, for `limits`, is past its
    /// deadline.
    pub(super) fn trip(&self, after: Duration, limits: &[String], shown: &str) {
        let message = format!(
            "RateLimited: {shown}: rate limit {} gives it a slot in {:.1} s, after the job's deadline; \
             it runs again from then",
            limits.join(", "),
            after.as_secs_f64()
        );
        if self.tripped.set(RateLimited { message, after }).is_ok() {
            self.notify.notify_one();
        }
    }

    /// Whether the run is to end.
    pub(crate) fn is_tripped(&self) -> bool {
        self.tripped.get().is_some()
    }

    /// Wait until the run is to end.
    pub(crate) async fn tripped(&self) {
        if !self.is_tripped() {
            self.notify.notified().await;
        }
    }

    /// Why the run was ended, once tripped.
    pub(crate) fn limited(&self) -> Option<RateLimited> {
        self.tripped.get().cloned()
    }
}
