//! `/v1/plans`: create a plan (its execute job), show and list plans with
//! their phases and outputs, approve, reject and cancel them.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Extension, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::requests::{PlanDecisionRequest, PlanRequest, plan_decision};
use crate::access::Principal;
use crate::api::access::{list_scope, may_read};
use crate::api::error::{ApiError, ErrorBody, body_error, parse_body, query_error};
use crate::api::jobs::{IDEMPOTENT_REPLAYED, decision_key, idempotency_key};
use crate::api::types::{PlanAnswer, PlanPage};
use crate::api::{AppState, DEFAULT_PAGE, MAX_PAGE, ParsedPath, parse_id};
use crate::job::JobId;

/// Create a plan and queue its execute phase. When execute succeeds, the
/// apply phase is created with execute's output (and the plan's input) as
/// its input, waiting for approval unless `apply` is `auto`; a failed or
/// cancelled execute ends the plan.
#[utoipa::path(post, path = "/v1/plans", tag = "plans",
    params(("Idempotency-Key" = Option<String>, Header, description = "Makes a retry of this request safe")),
    request_body = PlanRequest,
    responses(
        (status = 201, description = "Created: the plan, `planning`; or, the same request (same \
            `Idempotency-Key` and body) having come before, the plan it created as it is now, with \
            `Idempotent-Replayed: true`", body = PlanAnswer),
        (status = 409, description = "`idempotency_conflict`: the key was used for another request", body = ErrorBody),
        (status = 400, description = "Refused: the message names the field or limit", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 403, description = "`approval_required`: `auto` where the plugin's policy gates `apply`", body = ErrorBody),
        (status = 404, description = "No such plugin", body = ErrorBody),
        (status = 429, description = "The queue is full; retry after a second", body = ErrorBody),
    ))]
pub(super) async fn plan_submit(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let bytes = body.map_err(body_error)?;
    let body: PlanRequest = parse_body(&bytes, "plan request")?;
    let mut plan = body.into_plan(state.runtime.now(), &state.runtime.ceilings())?;
    plan.job.idempotency = idempotency_key(&headers, &bytes)?;
    plan.job.submitted_by = Some(principal.name);
    let created = state.runtime.plan_submit(plan).await?;
    let mut response = (StatusCode::CREATED, Json(PlanAnswer::from(created.view))).into_response();
    if created.replayed {
        response.headers_mut().insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    }
    Ok(response)
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
    Extension(principal): Extension<Principal>,
    ParsedPath(id): ParsedPath<JobId>,
) -> Result<Response, ApiError> {
    let view = state.runtime.plan(&id.to_string()).await?;
    // A plan is its submitter's to read, as its jobs are.
    may_read(&principal, &view.execute)?;
    Ok(Json(PlanAnswer::from(view)).into_response())
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct PlanListQuery {
    /// Only plans older than this one (the previous page's `next_before`).
    #[param(value_type = Option<JobId>)]
    before: Option<String>,
    /// Only plans this principal submitted (a principal with only the
    /// `submit` role always sees only its own).
    submitted_by: Option<String>,
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
    Extension(principal): Extension<Principal>,
    query: Result<Query<PlanListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(query_error)?;
    let limit = query.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::bad_request(format!("`limit` must be between 1 and {MAX_PAGE}")));
    }
    let before = query.before.as_deref().map(parse_id).transpose()?.map(|id| id.to_string());
    let submitted_by = list_scope(&principal, query.submitted_by);
    let views = state.runtime.plans(crate::store::PlanListParams { before, submitted_by, limit }).await?;
    let next = (views.len() == limit as usize).then(|| views.last().map(|v| v.plan.plan_id.clone())).flatten();
    let plans = views.into_iter().map(PlanAnswer::from).collect();
    Ok(Json(PlanPage { plans, next_before: next }).into_response())
}

/// Approve the phase the body names, where it waits for approval (apply,
/// or execute where a policy gates it). Resent, it is refused
/// (`already_decided` or `already_terminal`): it never approves the phase
/// after it.
#[utoipa::path(post, path = "/v1/plans/{id}/approve", tag = "plans",
    params(("id" = JobId, Path, description = "The plan id"),
        ("Idempotency-Key" = Option<String>, Header,
            description = "The same decision sent again with this key is answered as made, not refused")),
    request_body = PlanDecisionRequest,
    responses(
        (status = 200, description = "Approved: the plan", body = PlanAnswer),
        (status = 400, description = "Refused: the message names the field or limit", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 404, description = "No such plan", body = ErrorBody),
        (status = 403, description = "`impersonation`, `separation_of_duties` or `distinct_approvers`, as for \
            jobs; or `forbidden` without the `approve` role", body = ErrorBody),
        (status = 409, description = "The phase named does not wait for approval: `already_decided`, \
            `already_terminal`, `expired`, or `not_gated` (never gated, or no apply phase yet)", body = ErrorBody),
    ))]
pub(super) async fn plan_approve(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    ParsedPath(id): ParsedPath<JobId>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let (phase, who) = plan_decision(&principal, decision_key(&headers)?, body)?;
    let view = state.runtime.plan_approve(&id.to_string(), phase, who).await?;
    Ok(Json(PlanAnswer::from(view)).into_response())
}

/// Reject the phase the body names, where it waits for approval: the plan
/// ends `rejected` and its apply phase never runs.
#[utoipa::path(post, path = "/v1/plans/{id}/reject", tag = "plans",
    params(("id" = JobId, Path, description = "The plan id"),
        ("Idempotency-Key" = Option<String>, Header,
            description = "The same decision sent again with this key is answered as made, not refused")),
    request_body = PlanDecisionRequest,
    responses(
        (status = 200, description = "Rejected: the plan", body = PlanAnswer),
        (status = 400, description = "Refused: the message names the field or limit", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 404, description = "No such plan", body = ErrorBody),
        (status = 403, description = "`impersonation` (a `by` naming another principal); or `forbidden` \
            without the `approve` role", body = ErrorBody),
        (status = 409, description = "The phase named does not wait for approval", body = ErrorBody),
    ))]
pub(super) async fn plan_reject(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    ParsedPath(id): ParsedPath<JobId>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let (phase, who) = plan_decision(&principal, decision_key(&headers)?, body)?;
    let view = state.runtime.plan_reject(&id.to_string(), phase, who).await?;
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
    Extension(principal): Extension<Principal>,
    ParsedPath(id): ParsedPath<JobId>,
) -> Result<Response, ApiError> {
    Ok(Json(PlanAnswer::from(state.runtime.acting_as(&principal.name).plan_cancel(&id.to_string()).await?))
        .into_response())
}
