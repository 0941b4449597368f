//! Plans: an `execute` job whose successful output becomes the
//! input of an `apply` job, gated by approval unless the plan says `auto`.
//! A plan's status is derived from its phases, never stored.

use std::fmt;
use std::str::FromStr;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use super::{ErrorKind, Job, JobId, JobStatus};
use crate::clock::Timestamp;

/// Format version of the apply phase's input ([`ApplyInput`]).
pub const APPLY_INPUT_VERSION: u32 = 1;

/// How a plan's apply phase starts once its execute phase succeeded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ApplyMode {
    /// It waits for a person's approval (the default).
    #[default]
    Approval,
    /// It is queued at once.
    Auto,
}

impl ApplyMode {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            ApplyMode::Approval => "approval",
            ApplyMode::Auto => "auto",
        }
    }
}

impl FromStr for ApplyMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "approval" => Ok(ApplyMode::Approval),
            "auto" => Ok(ApplyMode::Auto),
            _ => Err(format!("unknown apply mode {s:?}: expected \"approval\" or \"auto\"")),
        }
    }
}

/// A plan's phase, as a decision names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PlanPhase {
    /// The execute job (gated where a policy gates `execute`).
    Execute,
    /// The apply job, once execute has succeeded.
    Apply,
}

impl PlanPhase {
    /// Its name.
    pub fn as_str(self) -> &'static str {
        match self {
            PlanPhase::Execute => "execute",
            PlanPhase::Apply => "apply",
        }
    }
}

impl FromStr for PlanPhase {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "execute" => Ok(PlanPhase::Execute),
            "apply" => Ok(PlanPhase::Apply),
            _ => Err(format!("unknown plan phase {s:?}: expected \"execute\" or \"apply\"")),
        }
    }
}

/// Where a plan is, derived from its phases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PlanStatus {
    /// Its execute phase waits, is queued or runs (or has just succeeded
    /// and its apply phase is being created).
    Planning,
    /// A phase waits for a person's approval.
    AwaitingApproval,
    /// Its apply phase is queued or runs.
    Applying,
    /// Its apply phase succeeded.
    Applied,
    /// A phase failed (or expired); apply never ran, or did not succeed.
    Failed,
    /// A phase was cancelled, or the plan was cancelled between its phases.
    Cancelled,
    /// A phase was rejected.
    Rejected,
}

impl PlanStatus {
    /// The plan's status from its phases: `apply` is `None` until it is
    /// created; `cancelled` says the plan itself was cancelled.
    pub fn of(execute: &Job, apply: Option<&Job>, cancelled: bool) -> PlanStatus {
        let ended = |job: &Job| {
            if job.error_kind == Some(ErrorKind::Rejected) { PlanStatus::Rejected } else { PlanStatus::Cancelled }
        };
        match apply {
            None => match execute.status {
                JobStatus::PendingApproval | JobStatus::Approved => PlanStatus::AwaitingApproval,
                JobStatus::Queued | JobStatus::Running => PlanStatus::Planning,
                JobStatus::Succeeded if cancelled => PlanStatus::Cancelled,
                JobStatus::Succeeded => PlanStatus::Planning,
                JobStatus::Failed => PlanStatus::Failed,
                JobStatus::Cancelled => ended(execute),
            },
            Some(apply) => match apply.status {
                JobStatus::PendingApproval | JobStatus::Approved => PlanStatus::AwaitingApproval,
                JobStatus::Queued | JobStatus::Running => PlanStatus::Applying,
                JobStatus::Succeeded => PlanStatus::Applied,
                JobStatus::Failed => PlanStatus::Failed,
                JobStatus::Cancelled => ended(apply),
            },
        }
    }

    /// True once nothing of the plan will run again.
    pub fn is_terminal(self) -> bool {
        matches!(self, PlanStatus::Applied | PlanStatus::Failed | PlanStatus::Cancelled | PlanStatus::Rejected)
    }

    /// The name as the API shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            PlanStatus::Planning => "planning",
            PlanStatus::AwaitingApproval => "awaiting_approval",
            PlanStatus::Applying => "applying",
            PlanStatus::Applied => "applied",
            PlanStatus::Failed => "failed",
            PlanStatus::Cancelled => "cancelled",
            PlanStatus::Rejected => "rejected",
        }
    }
}

impl fmt::Display for PlanStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A plan as stored: what it was asked for and its phases' job ids.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PlanRecord {
    /// The plan id, a ULID; also its jobs' `plan_id` and concurrency key.
    pub plan_id: String,
    /// How apply starts.
    pub apply_mode: ApplyMode,
    /// The plan's own input, given to both phases.
    #[serde(skip)]
    pub input: Vec<u8>,
    /// When it was created.
    pub created_at: Timestamp,
    /// Its execute job.
    pub execute_job: JobId,
    /// Its apply job, once created.
    pub apply_job: Option<JobId>,
    /// When the plan was cancelled, if it was.
    pub cancelled_at: Option<Timestamp>,
}

/// What an apply phase gets as its input: the plan's input and what its
/// execute phase output, as JSON (each part also parsed when it is JSON).
/// `leash_sdk::plan::ApplyInput` reads it in a guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ApplyInput {
    /// Always [`APPLY_INPUT_VERSION`].
    pub leash_apply: u32,
    /// The plan.
    pub plan_id: String,
    /// The execute job whose output this is.
    pub execute_job_id: JobId,
    /// The plan's input, parsed when it is JSON (else `null`).
    pub input: Option<serde_json::Value>,
    /// The plan's input bytes, base64.
    pub input_base64: String,
    /// What the execute phase output, parsed when it is JSON (else `null`).
    pub execute_output: Option<serde_json::Value>,
    /// The execute phase's output bytes, base64.
    pub execute_output_base64: String,
}

impl ApplyInput {
    /// The apply input of `plan`, whose execute job `execute` produced
    /// `output`.
    pub fn new(plan_id: &str, execute: JobId, input: &[u8], output: &[u8]) -> ApplyInput {
        let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
        ApplyInput {
            leash_apply: APPLY_INPUT_VERSION,
            plan_id: plan_id.to_owned(),
            execute_job_id: execute,
            input: serde_json::from_slice(input).ok(),
            input_base64: b64(input),
            execute_output: serde_json::from_slice(output).ok(),
            execute_output_base64: b64(output),
        }
    }

    /// As bytes, the apply job's input.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("an apply input serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apply_input_carries_both_parts_as_json_and_bytes() {
        let id = JobId::new(Timestamp::from_unix_ms(1));
        let input = ApplyInput::new("plan", id, br#"{"want":1}"#, &[0xff, 0x00]);
        let back: ApplyInput = serde_json::from_slice(&input.to_bytes()).unwrap();
        assert_eq!(back, input);
        assert_eq!(back.input, Some(serde_json::json!({"want": 1})));
        assert_eq!(back.execute_output, None, "binary output is not JSON");
        assert_eq!(base64::engine::general_purpose::STANDARD.decode(back.execute_output_base64).unwrap(), [0xff, 0]);
    }
}
