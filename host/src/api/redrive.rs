//! Running ended jobs again (redrive): one job by id, or every ended job
//! a filter matches, a page at a time, with a dry run first. A failed or
//! cancelled job is queued again in place, with a fresh set of attempts;
//! the attempt that ended it stays in its attempt history and the retry in
//! the audit trail.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, State};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use crate::access::Principal;
use crate::api::access::list_scope;
use crate::api::error::{ApiError, ErrorBody, body_error, parse_body};
use crate::api::list::error_text;
use crate::api::types::JobView;
use crate::api::{AppState, ParsedPath, parse_id};
use crate::clock::Timestamp;
use crate::job::{ErrorKind, JobId, JobStatus, PluginRef};
use crate::runtime::RedriveReport;
use crate::store::JobListParams;

/// Retry an ended job: queued again with a fresh set of attempts.
#[utoipa::path(post, path = "/v1/jobs/{id}/retry", tag = "jobs",
    params(("id" = JobId, Path)),
    responses(
        (status = 200, description = "Queued again: the job", body = JobView),
        (status = 400, description = "Refused: the message names the field or limit", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 403, description = "`forbidden` without the `operate` role", body = ErrorBody),
        (status = 404, description = "No such job", body = ErrorBody),
        (status = 409, description = "`not_retryable`: it has not ended, it succeeded, it is a plan's phase, or it \
            waited for approval (a retry would run it without one); the message says which", body = ErrorBody),
    ))]
pub(super) async fn job_retry(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    ParsedPath(id): ParsedPath<JobId>,
) -> Result<Response, ApiError> {
    let runtime = state.runtime.acting_as(&principal.name);
    runtime.retry(id).await?;
    let job = runtime.get(id).await?;
    Ok(Json(JobView::from(job)).into_response())
}

/// The body of `POST /v1/jobs:retry`: which ended jobs to run again. Every
/// field narrows; none names every failed job.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RedriveRequest {
    /// `failed`, `cancelled` or both (default: `failed`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub status: Vec<JobStatus>,
    /// Only jobs of this plugin: a digest, a name or `name@version`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin: Option<String>,
    /// Only jobs that ended with this error kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_kind: Option<ErrorKind>,
    /// Only jobs whose error holds this text (any case; at most 200
    /// characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Only jobs created at or after this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_after: Option<Timestamp>,
    /// Only jobs created before this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_before: Option<Timestamp>,
    /// Only jobs older than this one (the previous answer's `next_before`).
    #[schema(value_type = Option<JobId>)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<String>,
    /// Change nothing: answer what would be retried.
    #[serde(default)]
    pub dry_run: bool,
    /// Most jobs this request takes, newest first (default 100).
    #[schema(minimum = 1, maximum = 1000)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// Retry every ended job a filter matches (a page at a time), or say what
/// would be retried (`dry_run`). Each is queued again in place as `POST
/// /v1/jobs/{id}/retry` does, and audited as `job.retry`; a plan's phase
/// or a job that waited for approval is listed as refused.
#[utoipa::path(post, path = "/v1/jobs:retry", tag = "jobs",
    request_body = RedriveRequest,
    responses(
        (status = 200, description = "What was retried (or, dry, would be) and what was refused; `next_before` \
            when the page was full", body = RedriveReport),
        (status = 400, description = "Refused: the message names the field or limit", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 403, description = "`forbidden` without the `operate` role", body = ErrorBody),
    ))]
pub(super) async fn jobs_retry(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body: RedriveRequest = parse_body(&body.map_err(body_error)?, "retry request")?;
    let params = JobListParams {
        status: body.status,
        plugin: body.plugin.as_deref().map(str::parse::<PluginRef>).transpose().map_err(ApiError::bad_request)?,
        submitted_by: list_scope(&principal, None),
        before: body.before.as_deref().map(parse_id).transpose()?,
        error_contains: error_text(body.error)?,
        error_kind: body.error_kind,
        created_after: body.created_after,
        created_before: body.created_before,
        // Checked by the runtime (1 to MAX_REDRIVE_PAGE).
        limit: body.limit.unwrap_or(100),
        ..JobListParams::default()
    };
    let report = state.runtime.acting_as(&principal.name).retry_matching(params, body.dry_run).await?;
    Ok(Json(report).into_response())
}
