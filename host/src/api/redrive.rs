//! Running ended jobs again (redrive): one job by id. A failed or
//! cancelled job is queued again in place, with a fresh set of attempts;
//! the attempt that ended it stays in its attempt history and the retry in
//! the audit trail.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Extension, State};
use axum::response::{IntoResponse, Response};

use crate::access::Principal;
use crate::api::error::{ApiError, ErrorBody};
use crate::api::types::JobView;
use crate::api::{AppState, ParsedPath};
use crate::job::JobId;

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
