//! The job model, shared by every part of leash: what a job targets, how it
//! can fail, how plugins are named, and a job as submitted ([`NewJob`],
//! checked in one place by [`NewJob::check`]) and as stored ([`Job`]).
//!
//! This module depends only on [`crate::clock`], so the store, the sandbox,
//! the runtime and the faces can all speak it; no backend is named here.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

pub mod approval;
mod attempt;
mod effect;
mod event;
pub mod grant;
mod id;
pub mod labels;
pub mod millis;
mod new_job;
pub mod plan;
mod plugin;
pub mod proposal;
pub mod rate;
mod record;
pub mod rule;
pub mod schedule;
mod worker;

pub use approval::{Approval, ApprovalPolicy, Decision, Duties, ExecutionMode, Gate, GateChoice, GateSource, Verdict};
pub use attempt::{Attempt, EARLIER_ATTEMPTS_WITH_LOGS, timeline};
pub use effect::{Effect, EffectOutcome};
pub use event::{Event, EventId, EventKind, JobEvent, WorkerEvent};
pub use grant::Grants;
pub use id::JobId;
pub use new_job::{
    DEFAULT_APPROVAL_TTL, DEFAULT_QUEUE_TTL, LOWEST_PRIORITY, MAX_ATTEMPTS_CEILING, MAX_KEY_BYTES, NewJob,
};
pub use plan::{ApplyInput, ApplyMode, PlanPhase, PlanRecord, PlanStatus};
pub use plugin::{DEFAULT_PLUGIN_VERSION, PluginInfo, PluginName, PluginRef};
pub use proposal::{Proposal, ProposalState, ProposalView};
pub use record::{
    Backoff, Counts, DEFAULT_BACKOFF_BASE, DEFAULT_BACKOFF_CAP, IdempotencyKey, Job, JobLimits, JobLogs, JobProgress,
    JobStatus, KEY_SEPARATOR, LogLine, MAX_IDEMPOTENCY_KEY_BYTES, SCHEMA_VERSION,
};
pub use rule::{ApprovalRule, Remember};
pub use schedule::{Cadence, CatchUp, Firings, JobTemplate, Overlap, Schedule, SchedulePause};
pub use worker::{WorkerRecord, WorkerState};

/// Serialize a type as its `Display` text and deserialize it with its
/// `FromStr`, so the JSON form is the same text people and the store see.
macro_rules! serde_as_text {
    ($ty:ty) => {
        impl serde::Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }

        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                String::deserialize(deserializer)?.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}
pub(crate) use serde_as_text;

serde_as_text!(Target);
serde_as_text!(Digest);

/// Longest action name accepted, in bytes.
pub const MAX_ACTION_NAME_BYTES: usize = 64;

/// What a job asks its plugin to do: a plan phase or a named action.
///
/// Written as `execute`, `apply` or `action:<name>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    /// The plan's execute phase.
    Execute,
    /// The plan's apply phase.
    Apply,
    /// A named action: `[a-z0-9_.-]`, 1 to 64 bytes.
    Action(String),
}

impl Target {
    /// An action target, checking the name.
    pub fn action(name: &str) -> Result<Self, ParseTargetError> {
        let valid_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || "_.-".contains(c);
        if name.is_empty() || name.len() > MAX_ACTION_NAME_BYTES || !name.chars().all(valid_char) {
            return Err(ParseTargetError(format!(
                "invalid action name {name:?}: use 1 to {MAX_ACTION_NAME_BYTES} characters from a-z, 0-9, '_', '.', '-'"
            )));
        }
        Ok(Target::Action(name.to_owned()))
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Execute => f.write_str("execute"),
            Target::Apply => f.write_str("apply"),
            Target::Action(name) => write!(f, "action:{name}"),
        }
    }
}

/// A target string that is not `execute`, `apply` or `action:<name>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ParseTargetError(String);

impl FromStr for Target {
    type Err = ParseTargetError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "execute" => Ok(Target::Execute),
            "apply" => Ok(Target::Apply),
            _ => match s.strip_prefix("action:") {
                Some(name) => Target::action(name),
                None => Err(ParseTargetError(format!(
                    "unknown target {s:?}: expected \"execute\", \"apply\" or \"action:<name>\""
                ))),
            },
        }
    }
}

/// Why a job did not succeed. Stored and reported as its snake_case name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The plugin returned `failed` or `retryable`.
    GuestError,
    /// The plugin rejected its input.
    InvalidInput,
    /// The plugin trapped (panic, stack overflow, bad memory access...).
    Trap,
    /// The job ran past its wall-clock timeout.
    Timeout,
    /// The job used up its fuel budget.
    OutOfFuel,
    /// The job asked for more memory than its limit.
    MemoryLimit,
    /// The job returned more output than its limit, or handed the host more
    /// data in one call than it accepts.
    OutputLimit,
    /// The job needed more of a counted resource than it may have: core
    /// instances, memories, tables, table elements or resource handles.
    ResourceLimit,
    /// The job was cancelled.
    Cancelled,
    /// The worker lost the job's lease (it died or stalled).
    LeaseLost,
    /// The job waited in the queue past its expiry.
    Expired,
    /// A person rejected the job while it waited for approval.
    Rejected,
    /// The worker shut down during the attempt after the attempt's effects
    /// began, and no attempt was left to run it again.
    Interrupted,
    /// leash itself failed to run the job.
    HostError,
    /// The host refused what the job was to do before any of it was done:
    /// a plan's apply phase whose approved effects its plugin's grant no
    /// longer allows, or whose plan changed since it was approved.
    Denied,
    /// Quarantined: the job was running in two processes that died under
    /// it (a crash of the host's own code, or kills), so it is never
    /// claimed again.
    HostCrash,
    /// An outbound request's rate limit gave it a slot after the job's
    /// deadline: the attempt ended there, retryable (from that slot on).
    RateLimited,
}

impl ErrorKind {
    /// Every kind, in declaration order.
    pub const ALL: [ErrorKind; 17] = [
        ErrorKind::GuestError,
        ErrorKind::InvalidInput,
        ErrorKind::Trap,
        ErrorKind::Timeout,
        ErrorKind::OutOfFuel,
        ErrorKind::MemoryLimit,
        ErrorKind::OutputLimit,
        ErrorKind::ResourceLimit,
        ErrorKind::Cancelled,
        ErrorKind::LeaseLost,
        ErrorKind::Expired,
        ErrorKind::Rejected,
        ErrorKind::Interrupted,
        ErrorKind::HostError,
        ErrorKind::HostCrash,
        ErrorKind::Denied,
        ErrorKind::RateLimited,
    ];

    /// The stored name, e.g. `out_of_fuel`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::GuestError => "guest_error",
            ErrorKind::InvalidInput => "invalid_input",
            ErrorKind::Trap => "trap",
            ErrorKind::Timeout => "timeout",
            ErrorKind::OutOfFuel => "out_of_fuel",
            ErrorKind::MemoryLimit => "memory_limit",
            ErrorKind::OutputLimit => "output_limit",
            ErrorKind::ResourceLimit => "resource_limit",
            ErrorKind::Cancelled => "cancelled",
            ErrorKind::LeaseLost => "lease_lost",
            ErrorKind::Expired => "expired",
            ErrorKind::Rejected => "rejected",
            ErrorKind::Interrupted => "interrupted",
            ErrorKind::HostError => "host_error",
            ErrorKind::HostCrash => "host_crash",
            ErrorKind::Denied => "denied",
            ErrorKind::RateLimited => "rate_limited",
        }
    }

    /// True for the kinds that mean a resource limit stopped the job.
    pub fn is_resource_limit(self) -> bool {
        matches!(
            self,
            ErrorKind::OutOfFuel | ErrorKind::MemoryLimit | ErrorKind::OutputLimit | ErrorKind::ResourceLimit
        )
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ErrorKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ErrorKind::ALL.into_iter().find(|k| k.as_str() == s).ok_or_else(|| format!("unknown error kind {s:?}"))
    }
}

/// A plugin's identity: the sha256 of its component bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest([u8; 32]);

impl Digest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Digest(Sha256::digest(bytes).into())
    }

    /// Lowercase hex, without the `sha256:` prefix.
    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for Digest {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let hex_part = s.strip_prefix("sha256:").unwrap_or(s);
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(hex_part, &mut bytes)
            .map_err(|_| format!("invalid digest {s:?}: expected sha256:<64 hex digits>"))?;
        Ok(Digest(bytes))
    }
}

/// Why job `id`, in `status`, may not be run again, if it may not: only a
/// failed or cancelled job may, and never a plan's phase (plans are run
/// again whole) or a job that waited for approval (a retry would run it
/// without one).
pub fn redrive_refusal(id: &str, status: JobStatus, plan_id: Option<&str>, gated: bool) -> Option<String> {
    if !matches!(status, JobStatus::Failed | JobStatus::Cancelled) {
        return Some(format!("job {id} is {status}: only a failed or cancelled job can be retried"));
    }
    if let Some(plan) = plan_id {
        return Some(format!(
            "job {id} is a phase of plan {plan}: a plan is not retried phase by phase; create it again"
        ));
    }
    if gated {
        return Some(format!(
            "job {id} waited for approval: a retry would run it without one; submit it again to ask for approval"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_round_trip_through_their_text_form() {
        for text in ["execute", "apply", "action:export-csv"] {
            assert_eq!(text.parse::<Target>().unwrap().to_string(), text);
        }
    }

    #[test]
    fn bad_targets_are_refused_with_the_reason() {
        assert!("plan".parse::<Target>().unwrap_err().to_string().contains("unknown target"));
        assert!("action:".parse::<Target>().unwrap_err().to_string().contains("invalid action name"));
        assert!("action:Bad Name".parse::<Target>().is_err());
        let long = format!("action:{}", "a".repeat(MAX_ACTION_NAME_BYTES + 1));
        assert!(long.parse::<Target>().is_err());
    }

    #[test]
    fn error_kinds_round_trip() {
        for kind in ErrorKind::ALL {
            assert_eq!(kind.as_str().parse::<ErrorKind>().unwrap(), kind);
            assert_eq!(serde_json::to_string(&kind).unwrap(), format!("\"{kind}\""));
        }
    }

    #[test]
    fn digest_parses_with_or_without_prefix() {
        let d = Digest::of(b"leash");
        assert_eq!(d.to_string().parse::<Digest>().unwrap(), d);
        assert_eq!(d.hex().parse::<Digest>().unwrap(), d);
        assert!("sha256:xyz".parse::<Digest>().is_err());
    }
}
