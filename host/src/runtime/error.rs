//! Why a runtime call failed.

use crate::job::{JobId, JobStatus, Target};
use crate::sandbox::SandboxError;
use crate::store::StoreError;

/// Why a runtime call failed.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The queue is full: try again later.
    #[error("backpressure: {queued} jobs are queued (limit {limit}); retry later")]
    Backpressure {
        /// Queued jobs seen.
        queued: u64,
        /// The limit.
        limit: u64,
    },
    /// The plugin bytes are not a usable component.
    #[error("invalid plugin: {0}")]
    InvalidPlugin(#[source] SandboxError),
    /// No plugin with this digest or name is stored.
    #[error("unknown plugin {0}")]
    UnknownPlugin(String),
    /// A limit or field is out of bounds.
    #[error("invalid job: {0}")]
    InvalidJob(String),
    /// A schedule's name, cadence or policy is out of bounds.
    #[error("invalid schedule: {0}")]
    InvalidSchedule(String),
    /// No schedule with this name.
    #[error("no schedule {0:?}")]
    UnknownSchedule(String),
    /// A rate limit's name, rate or burst is out of bounds.
    #[error("invalid rate limit: {0}")]
    InvalidRateLimit(String),
    /// No rate limit with this name.
    #[error("no rate limit {0:?}")]
    UnknownRateLimit(String),
    /// A grant is out of bounds.
    #[error("invalid grant: {0}")]
    InvalidGrant(String),
    /// A principal or token request is out of bounds.
    #[error("{0}")]
    InvalidAccess(String),
    /// No principal with this name is stored.
    #[error("no principal {0:?}")]
    UnknownPrincipal(String),
    /// No job with this id.
    #[error("no job {0}")]
    NotFound(JobId),
    /// No plan with this id.
    #[error("no plan {0}")]
    UnknownPlan(String),
    /// No standing approval rule with this id.
    #[error("no approval rule {0}")]
    UnknownRule(String),
    /// The job already ended; it cannot be cancelled.
    #[error("job {id} already ended ({status})")]
    AlreadyTerminal {
        /// The job.
        id: JobId,
        /// Its terminal status.
        status: JobStatus,
    },
    /// The job may not be run again (see [`crate::store::Jobs::job_redrive`]).
    #[error("{0}")]
    NotRetryable(String),
    /// An approval of a plan's apply phase named a binding digest the plan
    /// no longer has: the approver saw something other than what would run.
    #[error(
        "plan {plan} changed since it was shown: the approval was for {shown}, the plan is now {now}; \
         look at it again before approving"
    )]
    PlanChanged {
        /// The plan.
        plan: String,
        /// The digest the approver sent.
        shown: String,
        /// The plan's digest now.
        now: String,
    },
    /// The idempotency key already belongs to a job created by a different
    /// request.
    #[error("idempotency key {key:?} was used for another request (job {job})")]
    IdempotencyConflict {
        /// The key.
        key: String,
        /// The job it belongs to.
        job: JobId,
    },
    /// The plugin's approval policy gates this target, and the submit
    /// asked for no gate.
    #[error(
        "{plugin}'s approval policy requires approval for {target} jobs: a submit cannot lower it \
         (leave the gate out, or ask for approval)"
    )]
    ApprovalRequired {
        /// The plugin, as named.
        plugin: String,
        /// The gated target.
        target: Target,
    },
    /// A decision the job's state does not allow.
    #[error("job {id} is {status}: {why}")]
    Undecidable {
        /// The job.
        id: JobId,
        /// Its state.
        status: JobStatus,
        /// Why nothing changed.
        why: &'static str,
        /// The reason as a machine-readable code: `not_gated`,
        /// `already_decided`, `not_approved` or `expired` (the one that
        /// changed something: the job failed `expired` as it was asked).
        code: &'static str,
    },
    /// A decision its approver may not make on this job: a rule of the
    /// job's duties forbids it.
    #[error("{by} may not approve job {id}: {why}")]
    DecisionForbidden {
        /// The job.
        id: JobId,
        /// The approver.
        by: String,
        /// The rule, for people.
        why: &'static str,
        /// The rule, as a machine-readable code: `separation_of_duties`
        /// or `distinct_approvers`.
        code: &'static str,
    },
    /// One job of a batch was refused, so none was queued.
    #[error("jobs[{index}]: {error}")]
    InBatch {
        /// Its place in the batch, from 0.
        index: usize,
        /// Why it was refused.
        error: Box<RuntimeError>,
    },
    /// A batch's idempotency key names a batch queued earlier, some of
    /// whose jobs have since been deleted by retention: its answer cannot
    /// be given again, and nothing new was queued.
    #[error(
        "the batch with idempotency key {key:?} was queued earlier, and {missing} of its jobs have since been \
         deleted (retention): nothing new was queued"
    )]
    ReplayIncomplete {
        /// The batch's key.
        key: String,
        /// Its jobs no longer stored.
        missing: usize,
    },
    /// The job did not end within the wait (it keeps running).
    #[error("job {0} did not finish within the wait; it is still running")]
    WaitTimeout(JobId),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The sandbox could not be built.
    #[error(transparent)]
    Sandbox(SandboxError),
}
