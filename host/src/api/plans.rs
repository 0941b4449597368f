//! `/v1/plans`: create a plan (its execute job), show and list plans with
//! their phases and outputs, approve, reject and cancel them.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::Value;

use super::requests::{DecisionBody, Execution, SubmitBody, decision_by};
use crate::api::error::{ApiError, ErrorBody, body_error, parse_body, query_error};
use crate::api::types::{PlanAnswer, PlanPage};
use crate::api::{AppState, DEFAULT_PAGE, MAX_PAGE, ParsedPath, parse_id};
use crate::clock::Timestamp;
use crate::job::{ApplyMode, JobId};
use crate::runtime::{Ceilings, PlanSubmit};

/// The body of `POST /v1/plans`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct PlanBody {
    /// `name` or `name@version` (or a digest); pinned to the digest now.
    #[schema(pattern = "^((sha256:)?[0-9a-f]{64}|[a-z0-9][a-z0-9_-]{0,63}(@[A-Za-z0-9._+-]{1,64})?)$")]
    plugin: String,
    /// The plan's input as JSON (not with `input_base64`); both phases get it.
    input: Option<Value>,
    /// The plan's input as raw bytes, base64.
    #[schema(content_encoding = "base64")]
    input_base64: Option<String>,
    /// `approval` (default): apply waits for a person; `auto`: it runs once
    /// execute succeeds (refused where the plugin's policy gates `apply`).
    #[serde(default)]
    apply: ApplyMode,
    /// Wall-clock limit per attempt of each phase.
    #[schema(minimum = 1, maximum = 86_400_000)]
    timeout_ms: Option<u64>,
    /// Fuel budget per attempt of each phase.
    fuel: Option<u64>,
    /// Memory limit of each phase.
    #[schema(maximum = 1_073_741_824)]
    memory_bytes: Option<u64>,
    /// Output limit of each phase.
    #[schema(maximum = 67_108_864)]
    output_bytes: Option<u64>,
    /// Attempts each phase may use.
    #[schema(minimum = 1, maximum = 100)]
    max_attempts: Option<u32>,
    /// How long each phase may wait in the queue once due.
    #[schema(minimum = 1, maximum = 2_592_000_000u64)]
    queue_ttl_ms: Option<u64>,
}

impl PlanBody {
    fn into_plan(self, now: Timestamp, defaults: &Ceilings) -> Result<PlanSubmit, ApiError> {
        let apply = self.apply;
        let body = SubmitBody {
            plugin: self.plugin,
            phase: None,
            action: None,
            input: self.input,
            input_base64: self.input_base64,
            timeout_ms: self.timeout_ms,
            fuel: self.fuel,
            memory_bytes: self.memory_bytes,
            output_bytes: self.output_bytes,
            max_attempts: self.max_attempts,
            concurrency_key: None,
            plan_id: None,
            queue_ttl_ms: self.queue_ttl_ms,
            run_at: None,
            delay_ms: None,
            backoff_ms: None,
            backoff_cap_ms: None,
            execution: Some(Execution::Async),
            gate: None,
            run_on_approve: None,
        };
        let (job, _) = body.into_submit(now, defaults)?;
        Ok(PlanSubmit { job, apply })
    }
}

/// Create a plan and queue its execute phase. When execute succeeds, the
/// apply phase is created with execute's output (and the plan's input) as
/// its input, waiting for approval unless `apply` is `auto`; a failed or
/// cancelled execute ends the plan.
#[utoipa::path(post, path = "/v1/plans", tag = "plans",
    request_body = PlanBody,
    responses(
        (status = 201, description = "Created: the plan, `planning`", body = PlanAnswer),
        (status = 400, description = "Refused: the message names the field or limit", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 403, description = "`approval_required`: `auto` where the plugin's policy gates `apply`", body = ErrorBody),
        (status = 404, description = "No such plugin", body = ErrorBody),
        (status = 429, description = "The queue is full; retry after a second", body = ErrorBody),
    ))]
pub(super) async fn plan_submit(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body: PlanBody = parse_body(&body.map_err(body_error)?, "plan request")?;
    let plan = body.into_plan(state.runtime.now(), &state.runtime.ceilings())?;
    let view = state.runtime.plan_submit(plan).await?;
    Ok((StatusCode::CREATED, Json(PlanAnswer::from(view))).into_response())
}

/// One plan with both phases and their outputs.
#[utoipa::path(get, path = "/v1/plans/{id}", tag = "plans",
    params(("id" = JobId, Path, description = "The plan id")),
    responses(
        (status = 200, body = PlanAnswer),
        (status = 400, description = "Refused: the message names the field or limit", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 404, description = "No such plan", body = ErrorBody),
    ))]
pub(super) async fn plan_show(
    State(state): State<Arc<AppState>>,
    ParsedPath(id): ParsedPath<JobId>,
) -> Result<Response, ApiError> {
    Ok(Json(PlanAnswer::from(state.runtime.plan(&id.to_string()).await?)).into_response())
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct PlanListQuery {
    /// Only plans older than this one (the previous page's `next_before`).
    #[param(value_type = Option<JobId>)]
    before: Option<String>,
    /// Plans per page (default 50).
    #[param(minimum = 1, maximum = 500)]
    limit: Option<u32>,
}

/// Plans, newest first, paged.
#[utoipa::path(get, path = "/v1/plans", tag = "plans",
    params(PlanListQuery),
    responses(
        (status = 200, body = PlanPage),
        (status = 400, description = "Refused: the message names the field or limit", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
    ))]
pub(super) async fn plan_list(
    State(state): State<Arc<AppState>>,
    query: Result<Query<PlanListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(query_error)?;
    let limit = query.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::bad_request(format!("`limit` must be between 1 and {MAX_PAGE}")));
    }
    let before = query.before.as_deref().map(parse_id).transpose()?.map(|id| id.to_string());
    let views = state.runtime.plans(crate::store::PlanListParams { before, limit }).await?;
    let next = (views.len() == limit as usize).then(|| views.last().map(|v| v.plan.plan_id.clone())).flatten();
    let plans = views.into_iter().map(PlanAnswer::from).collect();
    Ok(Json(PlanPage { plans, next_before: next }).into_response())
}

/// Approve the phase of a plan that waits for approval (apply, or execute
/// where a policy gates it).
#[utoipa::path(post, path = "/v1/plans/{id}/approve", tag = "plans",
    params(("id" = JobId, Path, description = "The plan id")),
    request_body = DecisionBody,
    responses(
        (status = 200, description = "Approved: the plan", body = PlanAnswer),
        (status = 400, description = "Refused: the message names the field or limit", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 404, description = "No such plan", body = ErrorBody),
        (status = 409, description = "Nothing waits for approval: `already_decided`, `already_terminal` \
            or `not_gated` (its execute phase still runs)", body = ErrorBody),
    ))]
pub(super) async fn plan_approve(
    State(state): State<Arc<AppState>>,
    ParsedPath(id): ParsedPath<JobId>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let view = state.runtime.plan_approve(&id.to_string(), decision_by(body)?).await?;
    Ok(Json(PlanAnswer::from(view)).into_response())
}

/// Reject the phase of a plan that waits for approval: the plan ends
/// `rejected` and its apply phase never runs.
#[utoipa::path(post, path = "/v1/plans/{id}/reject", tag = "plans",
    params(("id" = JobId, Path, description = "The plan id")),
    request_body = DecisionBody,
    responses(
        (status = 200, description = "Rejected: the plan", body = PlanAnswer),
        (status = 400, description = "Refused: the message names the field or limit", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 404, description = "No such plan", body = ErrorBody),
        (status = 409, description = "Nothing waits for approval", body = ErrorBody),
    ))]
pub(super) async fn plan_reject(
    State(state): State<Arc<AppState>>,
    ParsedPath(id): ParsedPath<JobId>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let view = state.runtime.plan_reject(&id.to_string(), decision_by(body)?).await?;
    Ok(Json(PlanAnswer::from(view)).into_response())
}

/// Cancel a plan: whichever phase waits or runs is cancelled (a running
/// one by asking its worker), and no apply phase is created after.
#[utoipa::path(post, path = "/v1/plans/{id}/cancel", tag = "plans",
    params(("id" = JobId, Path, description = "The plan id")),
    responses(
        (status = 200, description = "The plan; a running phase ends `cancelled` once its worker stops it",
            body = PlanAnswer),
        (status = 400, description = "Refused: the message names the field or limit", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 404, description = "No such plan", body = ErrorBody),
        (status = 409, description = "It already ended", body = ErrorBody),
    ))]
pub(super) async fn plan_cancel(
    State(state): State<Arc<AppState>>,
    ParsedPath(id): ParsedPath<JobId>,
) -> Result<Response, ApiError> {
    Ok(Json(PlanAnswer::from(state.runtime.plan_cancel(&id.to_string()).await?)).into_response())
}
