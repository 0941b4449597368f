//! What the API's clients send, as types: the bodies of `POST /v1/jobs`,
//! `POST /v1/jobs:batch` and the decisions, each turned into what the
//! runtime takes.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use base64::Engine as _;
use serde::Deserialize;
use serde_json::Value;

use crate::api::error::{ApiError, body_error, parse_body};
use crate::clock::Timestamp;
use crate::job::{Backoff, PluginRef, Target};
use crate::runtime::{Ceilings, DecisionBy, PluginSource, Submit};

/// How `POST /v1/jobs` answers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Execution {
    /// Answer with the outcome: the job's timeout, at most the sync
    /// ceiling, covers its queue wait and its run.
    #[default]
    Sync,
    /// Answer 202 at once; poll or wait for the outcome.
    Async,
}

/// Whether a job waits for a person before it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum GateChoice {
    /// It waits in `pending_approval` for `POST /v1/jobs/{id}/approve`.
    Approval,
    /// No gate: refused (403 `approval_required`) if the plugin's policy
    /// gates this target.
    None,
}

/// The body of `POST /v1/jobs`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct SubmitBody {
    /// `name`, `name@version` or a digest; pinned to the digest now.
    #[schema(pattern = "^((sha256:)?[0-9a-f]{64}|[a-z0-9][a-z0-9_-]{0,63}(@[A-Za-z0-9._+-]{1,64})?)$")]
    pub(super) plugin: String,
    /// `execute` (default) or `apply`; not with `action`.
    #[schema(pattern = "^(execute|apply)$")]
    pub(super) phase: Option<String>,
    /// Run this named action instead of a phase.
    #[schema(pattern = "^[a-z0-9_.-]{1,64}$")]
    pub(super) action: Option<String>,
    /// The input as JSON (not with `input_base64`).
    pub(super) input: Option<Value>,
    /// The input as raw bytes, base64.
    #[schema(content_encoding = "base64")]
    pub(super) input_base64: Option<String>,
    /// Wall-clock limit per attempt (ceiling: `GET /v1/health`, default 24 h).
    #[schema(minimum = 1, maximum = 86_400_000)]
    pub(super) timeout_ms: Option<u64>,
    /// Fuel budget per attempt; unlimited when absent.
    pub(super) fuel: Option<u64>,
    /// Memory limit (ceiling: 1 GiB by default).
    #[schema(maximum = 1_073_741_824)]
    pub(super) memory_bytes: Option<u64>,
    /// Output limit (ceiling: 64 MiB by default).
    #[schema(maximum = 67_108_864)]
    pub(super) output_bytes: Option<u64>,
    /// Runs the job may use when workers die under it.
    #[schema(minimum = 1, maximum = 100)]
    pub(super) max_attempts: Option<u32>,
    /// At most one running job per key.
    #[schema(min_length = 1, max_length = 256)]
    pub(super) concurrency_key: Option<String>,
    /// A plan to group jobs by.
    #[schema(max_length = 256)]
    pub(super) plan_id: Option<String>,
    /// How long it may wait in the queue (ceiling: 30 days by default).
    #[schema(minimum = 1, maximum = 2_592_000_000u64)]
    pub(super) queue_ttl_ms: Option<u64>,
    /// Async only: not before this instant (RFC 3339, e.g.
    /// `2026-12-01T09:00:00Z`); the queue TTL counts from then. A past
    /// instant means now. Not with `delay_ms`.
    #[schema(format = DateTime)]
    pub(super) run_at: Option<String>,
    /// Async only: not before this many milliseconds from now.
    #[schema(maximum = 2_592_000_000u64)]
    pub(super) delay_ms: Option<u64>,
    /// The pause before the first retry (doubling after each failure, with
    /// jitter), milliseconds; default 1000.
    #[schema(minimum = 1, maximum = 86_400_000)]
    pub(super) backoff_ms: Option<u64>,
    /// The longest pause before a retry, milliseconds; default 300000.
    #[schema(minimum = 1, maximum = 86_400_000)]
    pub(super) backoff_cap_ms: Option<u64>,
    /// `sync` (default): answer with the outcome, within the sync ceiling;
    /// `async`: answer 202 at once. A gated job answers 202
    /// `pending_approval` either way; the mode is stamped on it and used
    /// when its run is triggered. In a batch: `async` only.
    pub(super) execution: Option<Execution>,
    /// `approval`: wait for a person's approval before running. Absent: the
    /// plugin's approval policy decides. `none` is refused where the policy
    /// gates the target.
    pub(super) gate: Option<GateChoice>,
    /// With a gate: `true` (default) queues the job when approved; `false`
    /// leaves it `approved` until `POST /v1/jobs/{id}/run`.
    pub(super) run_on_approve: Option<bool>,
}

impl SubmitBody {
    pub(super) fn into_submit(self, now: Timestamp, defaults: &Ceilings) -> Result<(Submit, Execution), ApiError> {
        let plugin: PluginRef = self.plugin.parse().map_err(|e| ApiError::bad_request(format!("`plugin`: {e}")))?;
        let target = match (self.phase.as_deref(), self.action) {
            (None | Some("action"), Some(name)) => {
                Target::action(&name).map_err(|e| ApiError::bad_request(e.to_string()))?
            }
            (Some(_), Some(_)) => return Err(ApiError::bad_request("give `phase` or `action`, not both")),
            (Some(phase), None) => {
                phase.parse().map_err(|e: crate::job::ParseTargetError| ApiError::bad_request(e.to_string()))?
            }
            (None, None) => Target::Execute,
        };
        let input = match (self.input, self.input_base64) {
            (Some(_), Some(_)) => return Err(ApiError::bad_request("give `input` or `input_base64`, not both")),
            (Some(value), None) => serde_json::to_vec(&value).map_err(|e| ApiError::bad_request(e.to_string()))?,
            (None, Some(text)) => base64::engine::general_purpose::STANDARD
                .decode(text.as_bytes())
                .map_err(|e| ApiError::bad_request(format!("`input_base64` is not base64: {e}")))?,
            (None, None) => Vec::new(),
        };
        let mut job = Submit::new(PluginSource::Ref(plugin), target, input);
        job.timeout = self.timeout_ms.map(Duration::from_millis);
        job.fuel = self.fuel;
        job.memory_bytes = self.memory_bytes;
        job.output_bytes = self.output_bytes;
        job.max_attempts = self.max_attempts;
        job.concurrency_key = self.concurrency_key;
        job.plan_id = self.plan_id;
        job.queue_ttl = self.queue_ttl_ms.map(Duration::from_millis);
        job.approval = self.gate.map(|g| g == GateChoice::Approval);
        job.run_on_approve = self.run_on_approve.unwrap_or(true);
        job.run_at = match (self.run_at, self.delay_ms) {
            (Some(_), Some(_)) => return Err(ApiError::bad_request("give `run_at` or `delay_ms`, not both")),
            (Some(text), None) => {
                Some(Timestamp::parse_rfc3339(&text).map_err(|e| ApiError::bad_request(format!("`run_at`: {e}")))?)
            }
            (None, Some(ms)) => Some(now.plus(Duration::from_millis(ms))),
            (None, None) => None,
        };
        let execution = self.execution.unwrap_or_default();
        if job.run_at.is_some() && execution == Execution::Sync {
            return Err(ApiError::bad_request(
                "`run_at` and `delay_ms` make a delayed job: send \"execution\": \"async\" with them",
            ));
        }
        if self.backoff_ms.is_some() || self.backoff_cap_ms.is_some() {
            let default = defaults.backoff;
            job.backoff = Some(Backoff {
                base_ms: self.backoff_ms.unwrap_or(default.base_ms),
                cap_ms: self.backoff_cap_ms.unwrap_or(default.cap_ms.max(self.backoff_ms.unwrap_or(0))),
            });
        }
        Ok((job, execution))
    }
}

/// The body of `POST /v1/jobs:batch`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct BatchBody {
    /// 1 to 1,000 jobs, each as `POST /v1/jobs` takes one. They are
    /// queued (async): `execution`, if given, must be `async`.
    #[schema(min_items = 1, max_items = 1000)]
    pub(super) jobs: Vec<SubmitBody>,
}

/// The body of `POST /v1/jobs/{id}/approve` and `/reject`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct DecisionBody {
    /// Who decides, as they name themselves; recorded with the decision.
    #[schema(min_length = 1, max_length = 128)]
    by: String,
    /// Why; recorded with the decision.
    #[schema(max_length = 4096)]
    comment: Option<String>,
}

/// Who decides, read from a decision request's body.
pub(super) fn decision_by(body: Result<Bytes, BytesRejection>) -> Result<DecisionBy, ApiError> {
    let body: DecisionBody = parse_body(&body.map_err(body_error)?, "decision")?;
    Ok(DecisionBy { by: body.by, comment: body.comment })
}
