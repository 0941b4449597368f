//! The plan rules every backend shares: the apply job a plan's succeeded
//! execute job leads to. Each backend finds the plans to advance and
//! writes the job; what the job is does not depend on the backend.

use std::time::Duration;

use crate::job::{ApplyInput, ApplyMode, ExecutionMode, Gate, GateSource, Job, NewJob, PlanRecord, Target};

/// A plan row with what its apply job needs besides the execute job.
pub(crate) struct PlanRow {
    /// The plan as the API shows it.
    pub(crate) record: PlanRecord,
    /// The apply job's queue TTL, pinned at plan creation.
    pub(crate) queue_ttl: Duration,
    /// The apply job's approval TTL, pinned at plan creation.
    pub(crate) approval_ttl: Duration,
}

/// The apply job of `plan`, whose execute job `execute` succeeded: the same
/// plugin, limits, grants and attempts, the plan's id as its concurrency
/// key, and as input the plan's input with the execute output
/// ([`ApplyInput`]); gated unless the plan says `auto`.
pub(crate) fn apply_job(plan: &PlanRow, execute: &Job) -> NewJob {
    let record = &plan.record;
    let output = execute.output.as_deref().unwrap_or_default();
    let input = ApplyInput::new(&record.plan_id, execute.id, &record.input, output).to_bytes();
    let approval = (record.apply_mode == ApplyMode::Approval).then_some(Gate {
        source: GateSource::Plan,
        run_on_approve: true,
        execution: ExecutionMode::Async,
        deadline_ms: None,
    });
    NewJob {
        plugin: execute.plugin,
        plugin_name: execute.plugin_name.clone(),
        target: Target::Apply,
        input,
        limits: execute.limits.clone(),
        grants: execute.grants.clone(),
        max_attempts: execute.max_attempts,
        free_rerun_limit: execute.free_rerun_limit,
        concurrency_key: Some(record.plan_id.clone()),
        plan_id: Some(record.plan_id.clone()),
        queue_ttl: plan.queue_ttl,
        idempotency: None,
        run_at: None,
        deadline: None,
        backoff: execute.backoff,
        approval,
        approval_ttl: plan.approval_ttl,
    }
}

/// The plan columns both backends read, in this order.
pub(crate) const PLAN_COLUMNS: &str =
    "plan_id, apply_mode, input, queue_ttl_ms, approval_ttl_ms, created_at, execute_job_id, apply_job_id, cancelled_at";

/// The condition retention adds for a finished job in `jobs`: it is not
/// the execute job of a plan that still needs it (its apply job is not
/// created yet, or has not ended), so a plan's phases are deleted
/// together, after the last one ends.
pub(crate) const NOT_HELD_BY_A_PLAN: &str = "NOT EXISTS (SELECT 1 FROM plans p WHERE p.execute_job_id = jobs.job_id \
     AND ((p.apply_job_id IS NULL AND p.cancelled_at IS NULL AND jobs.status = 'succeeded') \
       OR EXISTS (SELECT 1 FROM jobs a WHERE a.job_id = p.apply_job_id AND a.finished_at IS NULL)))";

/// Delete the plans none of whose jobs are left.
pub(crate) const DELETE_EMPTY_PLANS: &str = "DELETE FROM plans WHERE NOT EXISTS \
     (SELECT 1 FROM jobs WHERE jobs.job_id = plans.execute_job_id) \
     AND (apply_job_id IS NULL OR NOT EXISTS (SELECT 1 FROM jobs WHERE jobs.job_id = plans.apply_job_id))";
