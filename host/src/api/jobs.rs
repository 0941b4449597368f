//! `/v1/jobs`: submit (async or sync, idempotent, gated), list, show,
//! logs, output, cancel, and the decisions on gated jobs: approve,
//! reject, run.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::access::{Principal, Role};
use crate::api::access::{read_job, readable};
use crate::api::error::{ApiError, ErrorBody, body_error, parse_body};
use crate::api::requests::{BatchRequest, DecisionRequest, Execution, SubmitRequest, decision_by};
use crate::api::types::{Accepted, AttemptList, CancelAnswer, EffectList, Finished, JobView};
use crate::api::{AppState, ParsedPath};
use crate::job::{Digest, ExecutionMode, IdempotencyKey, Job, JobId, JobStatus, MAX_IDEMPOTENCY_KEY_BYTES};
use crate::runtime::{Called, Cancelled, Ceilings, Runtime, RuntimeError};

/// The header a client names its create request with, so a retry after a
/// lost answer returns the first request's job instead of queueing another.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// The header marking an answer as a replay of an earlier request's.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// A decision's `Idempotency-Key` header, if sent.
pub(super) fn decision_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(key) = headers.get(IDEMPOTENCY_KEY) else { return Ok(None) };
    let key = key.to_str().map_err(|_| ApiError::bad_request("`Idempotency-Key`: use printable ASCII"))?;
    IdempotencyKey::new(key, String::new())
        .map(|k| Some(k.key))
        .map_err(|e| ApiError::bad_request(format!("`Idempotency-Key`: {e}")))
}

/// The request's idempotency key, bound to a digest of its JSON body as
/// parsed (so whitespace and key order do not make two bodies differ).
pub(super) fn idempotency_key(headers: &HeaderMap, body: &[u8]) -> Result<Option<IdempotencyKey>, ApiError> {
    let Some(key) = headers.get(IDEMPOTENCY_KEY) else { return Ok(None) };
    let key = key.to_str().map_err(|_| ApiError::bad_request("`Idempotency-Key`: use printable ASCII"))?;
    let body: Value = parse_body(body, "job request")?;
    let digest = Digest::of(body.to_string().as_bytes()).to_string();
    IdempotencyKey::new(key, digest).map(Some).map_err(|e| ApiError::bad_request(format!("`Idempotency-Key`: {e}")))
}

/// Validate and queue a job; `sync` waits for its outcome.
#[utoipa::path(post, path = "/v1/jobs", tag = "jobs",
    params(("Idempotency-Key" = Option<String>, Header, description = "Makes a retry of this request safe")),
    request_body = SubmitRequest,
    responses(
        (status = 200, description = "Sync: the finished job and its output", body = Finished<JobView>),
        (status = 202, description = "Async: `accepted` (queued); sync or async: `pending_approval` \
            when the job waits for a person", body = Accepted),
        (status = 400, description = "Refused: the message names the field or limit; \
            `sync_ceiling` for a sync timeout over the ceiling", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 403, description = "`approval_required`: the plugin's policy gates this target and \
            the body said `\"gate\": \"none\"`", body = ErrorBody),
        (status = 404, description = "No such plugin", body = ErrorBody),
        (status = 409, description = "The idempotency key was used for another request", body = ErrorBody),
        (status = 413, description = "Body over the size cap", body = ErrorBody),
        (status = 429, description = "The queue is full; retry after a second", body = ErrorBody),
        (status = 503, description = "The database is busy", body = ErrorBody),
        (status = 504, description = "Sync: the job had not ended shortly after its deadline \
            (its worker stopped); it never starts again", body = ErrorBody),
    ))]
pub(super) async fn job_submit(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body.map_err(body_error)?;
    let idempotency = idempotency_key(&headers, &body)?;
    let body: SubmitRequest = parse_body(&body, "job request")?;
    let ceilings = state.runtime.ceilings();
    let (mut job, execution) = body.into_submit(state.runtime.now(), &ceilings)?;
    job.idempotency = idempotency;
    job.submitted_by = Some(principal.name);
    let mark = |mut response: Response, replayed: bool| {
        if replayed {
            response.headers_mut().insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
        }
        response
    };
    if execution == Execution::Async {
        let submitted = state.runtime.submit_once(job).await?;
        // A gated job answers as itself: waiting on a person is not the
        // same as queued.
        let status = if submitted.status.is_gated() { submitted.status.as_str() } else { "accepted" };
        let accepted = Accepted { status: status.to_owned(), job_id: submitted.id };
        return Ok(mark((StatusCode::ACCEPTED, Json(accepted)).into_response(), submitted.replayed));
    }
    let deadline = sync_deadline(job.timeout, state.config.sync_ceiling, &ceilings)?;
    match state.runtime.call(job, deadline).await.map_err(sync_error)? {
        Called::Finished { job, replayed } => Ok(mark(finished(*job), replayed)),
        Called::Waiting { id, status, replayed } => {
            let accepted = Accepted { status: status.as_str().to_owned(), job_id: id };
            Ok(mark((StatusCode::ACCEPTED, Json(accepted)).into_response(), replayed))
        }
    }
}

/// A sync job's deadline: its timeout, within the sync ceiling (a longer
/// one is refused), or the default timeout cut to the ceiling. It covers
/// the queue wait and the run.
fn sync_deadline(timeout: Option<Duration>, ceiling: Duration, ceilings: &Ceilings) -> Result<Duration, ApiError> {
    match timeout {
        Some(asked) if asked > ceiling => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "sync_ceiling",
            format!(
                "timeout_ms {} is over the sync ceiling of {} ms: a sync call must end within it. \
                 Send \"execution\": \"async\" to queue a longer job and poll GET /v1/jobs/{{id}}",
                asked.as_millis(),
                ceiling.as_millis()
            ),
        )),
        Some(asked) => Ok(asked),
        None => Ok(ceilings.default_timeout.min(ceiling)),
    }
}

/// Most jobs one `POST /v1/jobs:batch` queues.
pub const MAX_BATCH_JOBS: usize = 1_000;

/// `202` to a batch: every job, in the batch's order.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BatchAccepted {
    /// Each job's id and state: `accepted` (queued) or `pending_approval`.
    pub jobs: Vec<Accepted>,
}

/// Validate and queue up to 1,000 jobs in one transaction: all or none.
#[utoipa::path(post, path = "/v1/jobs:batch", tag = "jobs",
    params(("Idempotency-Key" = Option<String>, Header,
        description = "Makes a retry of this request safe (at most 251 characters here)")),
    request_body = BatchRequest,
    responses(
        (status = 202, description = "Every job queued (or waiting for approval), in order", body = BatchAccepted),
        (status = 400, description = "Refused, and nothing queued: the message names the job \
            (`jobs[3]: …`) and its field or limit", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 403, description = "`approval_required` for one of the jobs; nothing queued", body = ErrorBody),
        (status = 404, description = "One of the jobs names no stored plugin; nothing queued", body = ErrorBody),
        (status = 409, description = "The idempotency key was used for another request, or names an \
            earlier batch some of whose jobs retention has deleted", body = ErrorBody),
        (status = 413, description = "Body over the size cap", body = ErrorBody),
        (status = 429, description = "The queue has no room for the whole batch; retry after a second",
            body = ErrorBody),
        (status = 503, description = "The database is busy", body = ErrorBody),
    ))]
pub(super) async fn job_batch(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body.map_err(body_error)?;
    let idempotency = idempotency_key(&headers, &body)?;
    let batch: BatchRequest = parse_body(&body, "batch")?;
    if batch.jobs.is_empty() || batch.jobs.len() > MAX_BATCH_JOBS {
        return Err(ApiError::bad_request(format!(
            "`jobs`: a batch holds 1 to {MAX_BATCH_JOBS} jobs, not {}",
            batch.jobs.len()
        )));
    }
    // Room for a separator and `999` after the key, whatever the batch's size.
    const MAX_BATCH_KEY_BYTES: usize = MAX_IDEMPOTENCY_KEY_BYTES - 4;
    if idempotency.as_ref().is_some_and(|k| k.key.len() > MAX_BATCH_KEY_BYTES) {
        return Err(ApiError::bad_request(format!(
            "`Idempotency-Key`: a batch's key may be at most {MAX_BATCH_KEY_BYTES} characters"
        )));
    }
    let ceilings = state.runtime.ceilings();
    let now = state.runtime.now();
    let mut jobs = Vec::with_capacity(batch.jobs.len());
    for (index, body) in batch.jobs.into_iter().enumerate() {
        if body.execution == Some(Execution::Sync) {
            return Err(ApiError::bad_request(format!(
                "jobs[{index}].execution: a batch queues its jobs: leave `execution` out or send \"async\""
            )));
        }
        let (mut job, _) = body.into_submit(now, &ceilings).map_err(|e| e.within(&format!("jobs[{index}]")))?;
        // Each job keeps its own key, bound to the whole batch's body.
        if let Some(batch_key) = &idempotency {
            job.idempotency = Some(IdempotencyKey::in_batch(batch_key, index));
        }
        job.submitted_by = Some(principal.name.clone());
        jobs.push(job);
    }
    let submitted = state.runtime.submit_batch(jobs).await?;
    let replayed = submitted.iter().all(|s| s.replayed);
    let jobs = submitted
        .into_iter()
        .map(|s| {
            let status = if s.status.is_gated() { s.status.as_str().to_owned() } else { "accepted".to_owned() };
            Accepted { status, job_id: s.id }
        })
        .collect();
    let mut response = (StatusCode::ACCEPTED, Json(BatchAccepted { jobs })).into_response();
    if replayed {
        response.headers_mut().insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    }
    Ok(response)
}

/// A sync wait's error: past the deadline and its settle time, 504.
fn sync_error(error: RuntimeError) -> ApiError {
    match error {
        RuntimeError::WaitTimeout(id) => ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            "sync_deadline",
            format!(
                "job {id} had not ended shortly after its deadline (its worker may have stopped); \
                 it cannot start again: GET /v1/jobs/{id} shows how it ends"
            ),
        ),
        other => other.into(),
    }
}

/// A finished job with its output.
fn finished(mut job: Job) -> Response {
    let output = job.output.take();
    Json(Finished::new(JobView::from(job), output.as_deref())).into_response()
}

/// One job.
#[utoipa::path(get, path = "/v1/jobs/{id}", tag = "jobs",
    params(("id" = JobId, Path)),
    responses(
        (status = 200, body = JobView),
        (status = 400, description = "Refused: the message names the field or limit", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 404, description = "No such job", body = ErrorBody),
    ))]
pub(super) async fn job_show(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    ParsedPath(id): ParsedPath<JobId>,
) -> Result<Response, ApiError> {
    let job = read_job(&state, &principal, id).await?;
    Ok(Json(JobView::from(job)).into_response())
}

/// What a job's last attempt logged.
#[utoipa::path(get, path = "/v1/jobs/{id}/logs", tag = "jobs",
    params(("id" = JobId, Path)),
    responses(
        (status = 200, body = crate::job::JobLogs),
        (status = 400, description = "Refused: the message names the field or limit", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 404, description = "No such job", body = ErrorBody),
    ))]
pub(super) async fn job_logs(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    ParsedPath(id): ParsedPath<JobId>,
) -> Result<Response, ApiError> {
    readable(&state, &principal, id).await?;
    Ok(Json(state.runtime.logs(id).await?).into_response())
}

/// Why the job is where it is: one sentence and its evidence, from the
/// store (what holds a queued job: a pause, its due time, its rate limit,
/// its concurrency key, or the jobs ahead of it and the workers' slots; a
/// gated job's approval; a running job's worker, heartbeat and lease; how
/// an ended job ended). The pool's figures (the jobs ahead, the workers'
/// slots) are given to the `operate` role only, as `GET /v1/workers`.
#[utoipa::path(get, path = "/v1/jobs/{id}/why", tag = "jobs",
    params(("id" = JobId, Path)),
    responses(
        (status = 200, body = crate::runtime::Why),
        (status = 400, description = "Refused: the message names the field or limit", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 404, description = "No such job", body = ErrorBody),
    ))]
pub(super) async fn job_why(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    ParsedPath(id): ParsedPath<JobId>,
) -> Result<Response, ApiError> {
    readable(&state, &principal, id).await?;
    // The pool's figures are the `operate` role's, as `GET /v1/workers`.
    Ok(Json(state.runtime.why(id, principal.may(Role::Operate)).await?).into_response())
}

/// A job's attempts, oldest first: each run's worker, start and end, how
/// it ended (`running`, `succeeded`, `failed`, `cancelled`, `retried`,
/// `released`, `lease_lost`, `process_died`), its error and what it
/// logged. The five latest earlier attempts keep their logs; older ones
/// are marked `logs_cut`.
#[utoipa::path(get, path = "/v1/jobs/{id}/attempts", tag = "jobs",
    params(("id" = JobId, Path)),
    responses(
        (status = 200, body = AttemptList),
        (status = 400, description = "Refused: the message names the field or limit", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 404, description = "No such job", body = ErrorBody),
    ))]
pub(super) async fn job_attempts(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    ParsedPath(id): ParsedPath<JobId>,
) -> Result<Response, ApiError> {
    let job = read_job(&state, &principal, id).await?;
    let attempts = state.runtime.attempts(&job).await?;
    Ok(Json(AttemptList { attempts }).into_response())
}

/// A job's effect ledger: every effectful request (any method its grant
/// does not mark safe; by default all but `GET` and `HEAD`) its attempts
/// made, recorded before it was sent, with its outcome once known.
#[utoipa::path(get, path = "/v1/jobs/{id}/effects", tag = "jobs",
    params(("id" = JobId, Path)),
    responses(
        (status = 200, body = EffectList),
        (status = 400, description = "Refused: the message names the field or limit", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 404, description = "No such job", body = ErrorBody),
    ))]
pub(super) async fn job_effects(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    ParsedPath(id): ParsedPath<JobId>,
) -> Result<Response, ApiError> {
    readable(&state, &principal, id).await?;
    Ok(Json(EffectList { effects: state.runtime.effects(id).await? }).into_response())
}

/// A succeeded job's output bytes.
#[utoipa::path(get, path = "/v1/jobs/{id}/output", tag = "jobs",
    params(("id" = JobId, Path)),
    responses(
        (status = 200, content_type = "application/octet-stream", body = inline(crate::api::types::OctetStream)),
        (status = 400, description = "Refused: the message names the field or limit", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 404, description = "No such job", body = ErrorBody),
        (status = 409, description = "The job did not succeed", body = ErrorBody),
    ))]
pub(super) async fn job_output(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    ParsedPath(id): ParsedPath<JobId>,
) -> Result<Response, ApiError> {
    let job = read_job(&state, &principal, id).await?;
    match job.output {
        Some(output) => Ok(raw_bytes(output)),
        None => Err(ApiError::new(
            StatusCode::CONFLICT,
            "no_output",
            format!("job {} is {}: only a succeeded job has output", job.id, job.status),
        )),
    }
}

/// A job's input bytes, as submitted.
#[utoipa::path(get, path = "/v1/jobs/{id}/input", tag = "jobs",
    params(("id" = JobId, Path)),
    responses(
        (status = 200, content_type = "application/octet-stream", body = inline(crate::api::types::OctetStream)),
        (status = 400, description = "Refused: the message names the field or limit", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 404, description = "No such job", body = ErrorBody),
    ))]
pub(super) async fn job_input(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    ParsedPath(id): ParsedPath<JobId>,
) -> Result<Response, ApiError> {
    Ok(raw_bytes(read_job(&state, &principal, id).await?.input))
}

/// Bytes as they are, as `application/octet-stream`.
fn raw_bytes(bytes: Vec<u8>) -> Response {
    ([(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"))], bytes).into_response()
}

/// Cancel: a queued job at once, a running one by asking its worker.
#[utoipa::path(post, path = "/v1/jobs/{id}/cancel", tag = "jobs",
    params(("id" = JobId, Path)),
    responses(
        (status = 200, description = "It was queued: cancelled", body = CancelAnswer),
        (status = 202, description = "It runs: its worker was asked to stop it", body = CancelAnswer),
        (status = 400, description = "Refused: the message names the field or limit", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 404, description = "No such job", body = ErrorBody),
        (status = 409, description = "It already ended", body = ErrorBody),
    ))]
pub(super) async fn job_cancel(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    ParsedPath(id): ParsedPath<JobId>,
) -> Result<Response, ApiError> {
    let status = state.runtime.acting_as(&principal.name).cancel(id).await?;
    let code = match status {
        Cancelled::Cancelled => StatusCode::OK,
        Cancelled::Requested => StatusCode::ACCEPTED,
    };
    Ok((code, Json(CancelAnswer { job_id: id, status })).into_response())
}

/// Approve a job waiting for approval. It is queued (or, submitted with
/// `run_on_approve = false`, left `approved` for `/run`). A job stamped
/// `sync` has its run triggered by this request, which waits for the
/// outcome within the job's deadline, as the sync submit would have.
#[utoipa::path(post, path = "/v1/jobs/{id}/approve", tag = "jobs",
    params(("id" = JobId, Path),
        ("Idempotency-Key" = Option<String>, Header,
            description = "The same decision sent again with this key is answered as made, not refused")),
    request_body = DecisionRequest,
    responses(
        (status = 200, description = "Approved: the job (queued, approved, or — stamped sync — finished, \
            with its output)", body = Finished<JobView>),
        (status = 400, description = "Refused: the message names the field or limit", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 404, description = "No such job", body = ErrorBody),
        (status = 403, description = "`impersonation` (a `by` naming another principal), \
            `separation_of_duties` (its submitter may not approve it) or `distinct_approvers` (this principal \
            approved it already and its quorum needs another); or `forbidden` without the `approve` role",
            body = ErrorBody),
        (status = 409, description = "`already_terminal`, `already_decided` (approved before: of two \
            approvals racing, one wins), `not_gated`, or `expired` (its approval TTL ran out before the \
            approval came: it failed `expired` now)", body = ErrorBody),
        (status = 504, description = "Stamped sync: the job had not ended shortly after its deadline", body = ErrorBody),
    ))]
pub(super) async fn job_approve(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    ParsedPath(id): ParsedPath<JobId>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let job = state.runtime.approve(id, decision_by(&principal, decision_key(&headers)?, body)?).await?;
    triggered(&state.runtime, job).await
}

/// Reject a job waiting for approval: cancelled with kind `rejected`.
#[utoipa::path(post, path = "/v1/jobs/{id}/reject", tag = "jobs",
    params(("id" = JobId, Path),
        ("Idempotency-Key" = Option<String>, Header,
            description = "The same decision sent again with this key is answered as made, not refused")),
    request_body = DecisionRequest,
    responses(
        (status = 200, description = "Rejected: the job, cancelled", body = Finished<JobView>),
        (status = 400, description = "Refused: the message names the field or limit", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 404, description = "No such job", body = ErrorBody),
        (status = 403, description = "`impersonation` (a `by` naming another principal); or `forbidden` \
            without the `approve` role", body = ErrorBody),
        (status = 409, description = "`already_terminal`, `already_decided`, `not_gated` or `expired` (its \
            approval TTL ran out first: it failed `expired` now)", body = ErrorBody),
    ))]
pub(super) async fn job_reject(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    ParsedPath(id): ParsedPath<JobId>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let job = state.runtime.reject(id, decision_by(&principal, decision_key(&headers)?, body)?).await?;
    Ok(Json(Finished::new(JobView::from(job), None)).into_response())
}

/// Trigger the run of an approved job that waits for it (submitted with
/// `run_on_approve = false`): queued now. Stamped `sync`, this request
/// waits for the outcome.
#[utoipa::path(post, path = "/v1/jobs/{id}/run", tag = "jobs",
    params(("id" = JobId, Path)),
    responses(
        (status = 200, description = "Queued (or, stamped sync, finished with its output)", body = Finished<JobView>),
        (status = 400, description = "Refused: the message names the field or limit", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 404, description = "No such job", body = ErrorBody),
        (status = 409, description = "`not_approved` (still waiting for approval), `already_decided` \
            (its run was triggered before), `already_terminal`, `not_gated` or `expired` (approved, it \
            waited past its approval TTL for this trigger: it failed `expired` now)", body = ErrorBody),
        (status = 504, description = "Stamped sync: the job had not ended shortly after its deadline", body = ErrorBody),
    ))]
pub(super) async fn job_run(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    ParsedPath(id): ParsedPath<JobId>,
) -> Result<Response, ApiError> {
    let job = state.runtime.run_approved_as(id, &principal.name).await?;
    triggered(&state.runtime, job).await
}

/// The answer to a decision: the job as it is now, or — when the decision
/// triggered the run of a job stamped `sync` — its outcome.
async fn triggered(runtime: &Runtime, job: Job) -> Result<Response, ApiError> {
    let sync_deadline = job
        .approval
        .as_ref()
        .filter(|a| a.execution == ExecutionMode::Sync && job.status == JobStatus::Queued)
        .and_then(|a| a.deadline);
    match sync_deadline {
        Some(deadline) => Ok(finished(runtime.wait_sync(job.id, deadline).await.map_err(sync_error)?)),
        None => Ok(Json(Finished::new(JobView::from(job), None)).into_response()),
    }
}
