//! The plan rules every backend shares: the apply job a plan's succeeded
//! execute job leads to. Each backend finds the plans to advance and
//! writes the job; what the job is does not depend on the backend.

use std::time::Duration;

use crate::job::{
    ApplyInput, ApplyMode, ApprovalPolicy, ExecutionMode, Gate, GateSource, Job, NewJob, PlanRecord, Target,
};

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
/// ([`ApplyInput`]); gated unless the plan says `auto`, and gated whatever
/// the plan says where its plugin's registration gates `apply` now
/// (`policy`: read in the same transaction, so a policy set while the
/// plan's execute phase ran holds its apply phase too).
pub(crate) fn apply_job(plan: &PlanRow, execute: &Job, policy: &ApprovalPolicy) -> NewJob {
    let record = &plan.record;
    let output = execute.output.as_deref().unwrap_or_default();
    let input = ApplyInput::new(&record.plan_id, execute.id, &record.input, output).to_bytes();
    let source = if record.apply_mode == ApplyMode::Approval {
        Some(GateSource::Plan)
    } else {
        policy.gates(&Target::Apply).then_some(GateSource::Policy)
    };
    let approval = source.map(|source| Gate {
        source,
        run_on_approve: true,
        execution: ExecutionMode::Async,
        deadline: None,
        duties: policy.duties(),
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
        submitted_by: execute.submitted_by.clone(),
        priority: execute.priority,
        schedule_id: execute.schedule_id,
        tags: execute.tags.clone(),
        metadata: execute.metadata.clone(),
        rate_limit: execute.rate_limit.clone(),
        rate_key: execute.rate_key.clone(),
    }
}
