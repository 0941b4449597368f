//! What the API's clients send, as types: the bodies of `POST /v1/jobs`,
//! `POST /v1/jobs:batch`, `POST /v1/plans` and the decisions, each turned
//! into what the runtime takes. The CLI's client builds the same types, so
//! a renamed field breaks the build, not the wire.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::access::Principal;
use crate::api::error::{ApiError, body_error, parse_body};
use crate::clock::Timestamp;
use crate::job::{ApplyMode, JobId, JobTemplate, PlanPhase, millis};
use crate::runtime::{Ceilings, DecisionBy, PlanPhaseRef, PlanSubmit, Submit};

/// How `POST /v1/jobs` answers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Execution {
    /// Answer with the outcome: the job's timeout, at most the sync
    /// ceiling, covers its queue wait and its run.
    #[default]
    Sync,
    /// Answer 202 at once; poll or wait for the outcome.
    Async,
}

pub use crate::job::GateChoice;

/// The body of `POST /v1/jobs`. Unset fields take the server's defaults.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitRequest {
    /// `name`, `name@version` or a digest; pinned to the digest now.
    #[schema(pattern = "^((sha256:)?[0-9a-f]{64}|[a-z0-9][a-z0-9_-]{0,63}(@[A-Za-z0-9._+-]{1,64})?)$")]
    pub plugin: String,
    /// `execute` (default) or `apply`; not with `action`.
    #[schema(pattern = "^(execute|apply)$")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Run this named action instead of a phase.
    #[schema(pattern = "^[a-z0-9_.-]{1,64}$")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    /// The input as JSON (not with `input_base64`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    /// The input as raw bytes, base64.
    #[schema(content_encoding = "base64")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_base64: Option<String>,
    /// Wall-clock limit per attempt (ceiling: `GET /v1/health`, default 24 h).
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 86_400_000)]
    #[serde(rename = "timeout_ms", default, with = "millis::option", skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    /// Fuel budget per attempt; unlimited when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fuel: Option<u64>,
    /// Memory limit (ceiling: 1 GiB by default).
    #[schema(maximum = 1_073_741_824)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// Output limit (ceiling: 64 MiB by default).
    #[schema(maximum = 67_108_864)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_bytes: Option<u64>,
    /// Runs the job may use when workers die under it.
    #[schema(minimum = 1, maximum = 100)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// At most one running job per key.
    #[schema(min_length = 1, max_length = 256)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency_key: Option<String>,
    /// A plan to group jobs by.
    #[schema(max_length = 256)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan_id: Option<String>,
    /// How long it may wait in the queue (ceiling: 30 days by default).
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 2_592_000_000u64)]
    #[serde(rename = "queue_ttl_ms", default, with = "millis::option", skip_serializing_if = "Option::is_none")]
    pub queue_ttl: Option<Duration>,
    /// Async only: not before this instant (RFC 3339, e.g.
    /// `2026-12-01T09:00:00Z`); the queue TTL counts from then. A past
    /// instant means now. Not with `delay_ms`.
    #[schema(format = DateTime)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_at: Option<String>,
    /// Async only: not before this many milliseconds from now.
    #[schema(value_type = Option<u64>, maximum = 2_592_000_000u64)]
    #[serde(rename = "delay_ms", default, with = "millis::option", skip_serializing_if = "Option::is_none")]
    pub delay: Option<Duration>,
    /// The pause before the first retry (doubling after each failure, with
    /// jitter), milliseconds; default 1000.
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 86_400_000)]
    #[serde(rename = "backoff_ms", default, with = "millis::option", skip_serializing_if = "Option::is_none")]
    pub backoff: Option<Duration>,
    /// The longest pause before a retry, milliseconds; default 300000.
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 86_400_000)]
    #[serde(rename = "backoff_cap_ms", default, with = "millis::option", skip_serializing_if = "Option::is_none")]
    pub backoff_cap: Option<Duration>,
    /// `sync` (default): answer with the outcome, within the sync ceiling;
    /// `async`: answer 202 at once. A gated job answers 202
    /// `pending_approval` either way; the mode is stamped on it and used
    /// when its run is triggered. In a batch: `async` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution: Option<Execution>,
    /// `approval`: wait for a person's approval before running. Absent: the
    /// plugin's approval policy decides. `none` is refused where the policy
    /// gates the target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<GateChoice>,
    /// With a gate: `true` (default) queues the job when approved; `false`
    /// leaves it `approved` until `POST /v1/jobs/{id}/run`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_on_approve: Option<bool>,
    /// Claim order: 0 (first, the default) to 9 (last). Due jobs are
    /// claimed by priority, then earliest due, then oldest; one claimed
    /// job in ten goes to a job due for over a minute, whatever its
    /// priority (see docs/flow-control.md).
    #[schema(minimum = 0, maximum = 9)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u8>,
    /// Tags to find the job by: at most 16, each 1 to 64 of `A-Z a-z 0-9 _
    /// . : / = @ + -` (`GET /v1/jobs?tag=`).
    #[schema(max_items = 16)]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// Metadata to find the job by: at most 16 keys (1 to 64 of `a-z 0-9 _
    /// . -`), each a string (at most 256 bytes), a number or a boolean
    /// (`GET /v1/jobs?meta=`).
    #[schema(value_type = Object)]
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub metadata: serde_json::Map<String, Value>,
    /// A rate limit the job's starts count against (`PUT
    /// /v1/rate-limits/{name}` first): over it, the job waits for its
    /// slot (`rate_slot`) instead of running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<String>,
    /// The job's bucket within its rate limit: text with `{principal}`,
    /// `{plugin}` and `{input.FIELD}` in it, rendered at submit (absent:
    /// the limit's one bucket).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_key: Option<String>,
}

impl SubmitRequest {
    pub(super) fn into_submit(self, now: Timestamp, defaults: &Ceilings) -> Result<(Submit, Execution), ApiError> {
        if self.input.is_some() && self.input_base64.is_some() {
            return Err(ApiError::bad_request("give `input` or `input_base64`, not both"));
        }
        // The fields a schedule's job has too, converted alike.
        let shared = JobTemplate {
            plugin: self.plugin,
            phase: self.phase,
            action: self.action,
            input: self.input,
            timeout: self.timeout,
            fuel: self.fuel,
            memory_bytes: self.memory_bytes,
            output_bytes: self.output_bytes,
            max_attempts: self.max_attempts,
            concurrency_key: self.concurrency_key,
            queue_ttl: self.queue_ttl,
            backoff: self.backoff,
            backoff_cap: self.backoff_cap,
            gate: self.gate,
            priority: self.priority,
            tags: self.tags,
            metadata: self.metadata,
            rate_limit: self.rate_limit,
            rate_key: self.rate_key,
        };
        let mut job = shared.to_submit(defaults.backoff).map_err(ApiError::bad_request)?;
        if let Some(text) = self.input_base64 {
            job.input = base64::engine::general_purpose::STANDARD
                .decode(text.as_bytes())
                .map_err(|e| ApiError::bad_request(format!("`input_base64` is not base64: {e}")))?;
        }
        job.plan_id = self.plan_id;
        job.run_on_approve = self.run_on_approve.unwrap_or(true);
        job.run_at = match (self.run_at, self.delay) {
            (Some(_), Some(_)) => return Err(ApiError::bad_request("give `run_at` or `delay_ms`, not both")),
            (Some(text), None) => {
                Some(Timestamp::parse_rfc3339(&text).map_err(|e| ApiError::bad_request(format!("`run_at`: {e}")))?)
            }
            (None, Some(delay)) => Some(now.plus(delay)),
            (None, None) => None,
        };
        let execution = self.execution.unwrap_or_default();
        if job.run_at.is_some() && execution == Execution::Sync {
            return Err(ApiError::bad_request(
                "`run_at` and `delay_ms` make a delayed job: send \"execution\": \"async\" with them",
            ));
        }
        Ok((job, execution))
    }
}

/// The body of `POST /v1/jobs:batch`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchRequest {
    /// 1 to 1,000 jobs, each as `POST /v1/jobs` takes one. They are
    /// queued (async): `execution`, if given, must be `async`.
    #[schema(min_items = 1, max_items = 1000)]
    pub jobs: Vec<SubmitRequest>,
}

/// The body of `POST /v1/jobs/{id}/approve` and `/reject`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DecisionRequest {
    /// Leave it out: a decision is recorded as the principal whose token
    /// makes it. Sent, it must name that principal (else `403
    /// impersonation`); it is accepted so older clients keep working.
    #[schema(min_length = 1, max_length = 128)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// Why; recorded with the decision.
    #[schema(max_length = 4096)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
    /// Approvals only ("Allow & Remember"): let this approval stand, for a
    /// while, for jobs exactly like this one (same plugin bytes, target,
    /// grants and input; same submitter unless `any_submitter`). The jobs
    /// already waiting that match are approved now, and matching jobs
    /// submitted while it stands are approved on arrival, each recorded as
    /// the rule's decision in this principal's name. The rule's id is the
    /// approval's `remembered`; see `/v1/rules`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remember: Option<RememberRequest>,
}

/// How long a remembered approval stands, and for whose submits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RememberRequest {
    /// How long it approves, milliseconds: one minute to 90 days.
    #[schema(minimum = 60000, maximum = 7776000000_u64)]
    pub ttl_ms: u64,
    /// Approve any principal's matching submits, not only this job's
    /// submitter's (default `false`).
    #[serde(default)]
    pub any_submitter: bool,
}

/// The body of `POST /v1/plans/{id}/approve` and `/reject`: a decision
/// and the phase it decides, named by `phase` or by its job's id (one of
/// the two).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PlanDecisionRequest {
    /// The phase decided: `execute` or `apply`. A decision that names its
    /// phase cannot, resent, decide the phase after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<PlanPhase>,
    /// Or the decided phase's job id.
    #[schema(value_type = Option<JobId>)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
    /// Leave it out: a decision is recorded as the principal whose token
    /// makes it. Sent, it must name that principal (else `403
    /// impersonation`); it is accepted so older clients keep working.
    #[schema(min_length = 1, max_length = 128)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// Why; recorded with the decision.
    #[schema(max_length = 4096)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
    /// Approving the apply phase: the plan's `binding_digest` as it was
    /// shown. The approval is refused (`409 plan_changed`) if the plan's
    /// differs; left out, the digest the plan has now is recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

/// The body of `POST /v1/plans`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PlanRequest {
    /// `name` or `name@version` (or a digest); pinned to the digest now.
    #[schema(pattern = "^((sha256:)?[0-9a-f]{64}|[a-z0-9][a-z0-9_-]{0,63}(@[A-Za-z0-9._+-]{1,64})?)$")]
    pub plugin: String,
    /// The plan's input as JSON (not with `input_base64`); both phases get it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    /// The plan's input as raw bytes, base64.
    #[schema(content_encoding = "base64")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_base64: Option<String>,
    /// `approval` (default): apply waits for a person; `auto`: it runs once
    /// execute succeeds (refused where the plugin's policy gates `apply`).
    #[serde(default)]
    pub apply: ApplyMode,
    /// Wall-clock limit per attempt of each phase.
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 86_400_000)]
    #[serde(rename = "timeout_ms", default, with = "millis::option", skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    /// Fuel budget per attempt of each phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fuel: Option<u64>,
    /// Memory limit of each phase.
    #[schema(maximum = 1_073_741_824)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// Output limit of each phase.
    #[schema(maximum = 67_108_864)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_bytes: Option<u64>,
    /// Attempts each phase may use.
    #[schema(minimum = 1, maximum = 100)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// How long each phase may wait in the queue once due.
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 2_592_000_000u64)]
    #[serde(rename = "queue_ttl_ms", default, with = "millis::option", skip_serializing_if = "Option::is_none")]
    pub queue_ttl: Option<Duration>,
    /// Claim order of both phases: 0 (first, the default) to 9 (last).
    #[schema(minimum = 0, maximum = 9)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u8>,
    /// Tags of both phases' jobs, as `POST /v1/jobs` takes them.
    #[schema(max_items = 16)]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// Metadata of both phases' jobs, as `POST /v1/jobs` takes it.
    #[schema(value_type = Object)]
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub metadata: serde_json::Map<String, Value>,
    /// A rate limit both phases' starts count against, as `POST /v1/jobs`
    /// takes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<String>,
    /// Both phases' bucket within the rate limit, as `POST /v1/jobs`
    /// takes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_key: Option<String>,
}

impl PlanRequest {
    pub(super) fn into_plan(self, now: Timestamp, defaults: &Ceilings) -> Result<PlanSubmit, ApiError> {
        let apply = self.apply;
        let body = SubmitRequest {
            plugin: self.plugin,
            phase: None,
            action: None,
            input: self.input,
            input_base64: self.input_base64,
            timeout: self.timeout,
            fuel: self.fuel,
            memory_bytes: self.memory_bytes,
            output_bytes: self.output_bytes,
            max_attempts: self.max_attempts,
            concurrency_key: None,
            plan_id: None,
            queue_ttl: self.queue_ttl,
            run_at: None,
            delay: None,
            backoff: None,
            backoff_cap: None,
            execution: Some(Execution::Async),
            gate: None,
            run_on_approve: None,
            priority: self.priority,
            tags: self.tags,
            metadata: self.metadata,
            rate_limit: self.rate_limit,
            rate_key: self.rate_key,
        };
        let (job, _) = body.into_submit(now, defaults)?;
        Ok(PlanSubmit { job, apply })
    }
}

/// A decision by `principal`, read from a decision request's body, with
/// the request's idempotency key.
pub(super) fn decision_by(
    principal: &Principal,
    key: Option<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<DecisionBy, ApiError> {
    let body: DecisionRequest = parse_body(&body.map_err(body_error)?, "decision")?;
    decided_as(principal, body.by.as_deref())?;
    let remember = body.remember.map(|r| crate::runtime::RememberFor {
        ttl: std::time::Duration::from_millis(r.ttl_ms),
        any_submitter: r.any_submitter,
    });
    Ok(DecisionBy { by: principal.name.clone(), comment: body.comment, key, remember, digest: None })
}

/// A decision's `by`, if sent, must name the principal making it: no token
/// decides in another's name.
fn decided_as(principal: &Principal, by: Option<&str>) -> Result<(), ApiError> {
    match by {
        Some(by) if by != principal.name => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "impersonation",
            format!(
                "`by` names {by:?}, but this request is principal {:?}'s: a decision is recorded as the principal \
                 whose token makes it; leave `by` out",
                principal.name
            ),
        )),
        _ => Ok(()),
    }
}

/// A plan decision's phase and who decides, from its body.
pub(super) fn plan_decision(
    principal: &Principal,
    key: Option<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(PlanPhaseRef, DecisionBy), ApiError> {
    let body: PlanDecisionRequest = parse_body(&body.map_err(body_error)?, "plan decision")?;
    decided_as(principal, body.by.as_deref())?;
    let phase = match (body.phase, body.job_id) {
        (Some(phase), None) => PlanPhaseRef::Phase(phase),
        (None, Some(id)) => {
            PlanPhaseRef::Job(id.parse().map_err(|e: String| ApiError::bad_request(format!("`job_id`: {e}")))?)
        }
        _ => {
            return Err(ApiError::bad_request(
                "name the phase decided: `phase` (`execute` or `apply`) or its `job_id`, one of the two",
            ));
        }
    };
    let who =
        DecisionBy { by: principal.name.clone(), comment: body.comment, key, remember: None, digest: body.digest };
    Ok((phase, who))
}
