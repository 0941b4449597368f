//! Schedules: `POST /v1/schedules`, `GET /v1/schedules`, `GET` and
//! `DELETE /v1/schedules/{name}`, and `POST /v1/schedules/{name}/pause`,
//! `/resume` and `/trigger`.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use crate::access::Principal;
use crate::api::AppState;
use crate::api::error::{ApiError, ErrorBody, body_error, parse_body};
use crate::api::pauses::PauseRequest;
use crate::clock::Timestamp;
use crate::job::{
    Cadence, CatchUp, ErrorKind, Job, JobId, JobStatus, JobTemplate, Overlap, Schedule, SchedulePause, millis,
};
use crate::runtime::{RuntimeError, ScheduleSpec};

/// Next firings `GET /v1/schedules/{name}` shows.
const UPCOMING: usize = 5;
/// Latest jobs `GET /v1/schedules/{name}` shows.
const RECENT: u32 = 10;

/// The body of `POST /v1/schedules`: a cron expression (with its zone) or
/// an interval, not both.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScheduleRequest {
    /// Its unique name.
    #[schema(pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")]
    pub name: String,
    /// A cron expression: 5 fields (minute hour day-of-month month
    /// day-of-week), 6 (a seconds field first), or `@hourly`, `@daily`,
    /// `@weekly`, `@monthly`, `@yearly`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// The IANA time zone the expression is read in (default `UTC`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// Fire every this many milliseconds (1 s to 366 days), at whole
    /// multiples of it since the Unix epoch.
    #[schema(value_type = Option<u64>, minimum = 1000, maximum = 31_622_400_000u64)]
    #[serde(rename = "every_ms", default, with = "millis::option", skip_serializing_if = "Option::is_none")]
    pub every: Option<Duration>,
    /// While its previous job has not ended: `skip` (default), `queue` or
    /// `allow`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap: Option<Overlap>,
    /// After missed firings: `none`, `last` (default) or `all` (up to 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catch_up: Option<CatchUp>,
    /// Add it paused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    /// The job each firing submits.
    pub job: JobTemplate,
}

impl ScheduleRequest {
    /// The schedule this request asks for.
    pub fn into_spec(self) -> Result<ScheduleSpec, RuntimeError> {
        let cadence = match (self.cron, self.every) {
            (Some(expr), None) => Cadence::cron(&expr, self.timezone.as_deref().unwrap_or("UTC")),
            (None, Some(every)) if self.timezone.is_none() => Cadence::every(every),
            (None, Some(_)) => Err("`timezone` goes with `cron`; an interval counts in UTC".into()),
            (Some(_), Some(_)) => Err("give `cron` or `every_ms`, not both".into()),
            (None, None) => Err("give `cron` (with `timezone`) or `every_ms`".into()),
        }
        .map_err(RuntimeError::InvalidSchedule)?;
        Ok(ScheduleSpec {
            name: self.name,
            cadence,
            overlap: self.overlap.unwrap_or_default(),
            catch_up: self.catch_up.unwrap_or_default(),
            job: self.job,
            paused: self.paused.unwrap_or(false),
        })
    }
}

/// One of a schedule's jobs, in brief.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ScheduleRun {
    /// The job.
    #[schema(value_type = String)]
    pub id: JobId,
    /// Its state.
    pub status: JobStatus,
    /// When it was submitted.
    pub created_at: Timestamp,
    /// When it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Timestamp>,
    /// How it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_kind: Option<ErrorKind>,
}

impl From<&Job> for ScheduleRun {
    fn from(job: &Job) -> Self {
        ScheduleRun {
            id: job.id,
            status: job.status,
            created_at: job.created_at,
            finished_at: job.finished_at,
            error_kind: job.error_kind,
        }
    }
}

/// A schedule as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ScheduleBody {
    /// Its id: the jobs it submits carry it as `schedule_id`.
    #[schema(value_type = String)]
    pub id: JobId,
    /// Its name.
    pub name: String,
    /// Its cron expression.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// The zone the expression is read in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// Its interval, milliseconds.
    #[schema(value_type = Option<u64>)]
    #[serde(rename = "every_ms", default, with = "millis::option", skip_serializing_if = "Option::is_none")]
    pub every: Option<Duration>,
    /// While its previous job has not ended.
    pub overlap: Overlap,
    /// After missed firings.
    pub catch_up: CatchUp,
    /// The job each firing submits.
    pub job: JobTemplate,
    /// Set while paused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<SchedulePause>,
    /// Its next firing (absent while paused, or when its expression names
    /// no time to come).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_fire_at: Option<Timestamp>,
    /// Its last firing taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_fired_at: Option<Timestamp>,
    /// What that firing did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_outcome: Option<String>,
    /// Jobs its firings submitted.
    pub fired: u64,
    /// Firings that submitted nothing (skipped, missed or refused).
    pub skipped: u64,
    /// Who added it: its jobs are submitted as this principal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_by: Option<String>,
    /// When.
    pub created_at: Timestamp,
    /// `GET /v1/schedules/{name}` only: its next firings.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub upcoming: Vec<Timestamp>,
    /// `GET /v1/schedules/{name}` only: its latest jobs, newest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recent: Vec<ScheduleRun>,
}

impl From<Schedule> for ScheduleBody {
    fn from(s: Schedule) -> Self {
        let (cron, timezone, every) = match s.cadence {
            Cadence::Cron { expr, timezone } => (Some(expr), Some(timezone), None),
            Cadence::Every(every) => (None, None, Some(every)),
        };
        ScheduleBody {
            id: s.id,
            name: s.name,
            cron,
            timezone,
            every,
            overlap: s.overlap,
            catch_up: s.catch_up,
            job: s.job,
            next_fire_at: if s.paused.is_some() { None } else { s.next_fire_at },
            paused: s.paused,
            last_fired_at: s.last_fired_at,
            last_outcome: s.last_outcome,
            fired: s.fired,
            skipped: s.skipped,
            created_by: s.created_by,
            created_at: s.created_at,
            upcoming: Vec::new(),
            recent: Vec::new(),
        }
    }
}

/// Every schedule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ScheduleList {
    /// By name.
    pub schedules: Vec<ScheduleBody>,
}

/// The answer of `POST /v1/schedules/{name}/trigger`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TriggerAnswer {
    /// The job submitted.
    pub job: ScheduleRun,
}

fn checked_name(name: String) -> Result<String, ApiError> {
    crate::job::schedule::check_schedule_name(&name).map_err(ApiError::bad_request)?;
    Ok(name)
}

/// Add a schedule. Its job is checked now as `POST /v1/jobs` would check
/// it, and each firing submits it as the caller. Audited.
#[utoipa::path(post, path = "/v1/schedules", tag = "schedules",
    request_body = ScheduleRequest,
    responses(
        (status = 201, description = "Added", body = ScheduleBody),
        (status = 400, description = "Refused: the message names the field or limit", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 403, description = "`forbidden` without the `submit` role, or `approval_required`", body = ErrorBody),
        (status = 404, description = "`unknown_plugin`: the job's plugin is not registered", body = ErrorBody),
        (status = 409, description = "`name_taken`: a schedule has this name", body = ErrorBody),
        (status = 413, description = "Body over the size cap", body = ErrorBody),
    ))]
pub(super) async fn schedule_add(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let request: ScheduleRequest = parse_body(&body.map_err(body_error)?, "schedule")?;
    let spec = request.into_spec()?;
    let schedule = state.runtime.acting_as(&principal.name).schedule_add(spec).await?;
    Ok((StatusCode::CREATED, Json(ScheduleBody::from(schedule))).into_response())
}

/// Every schedule, by name.
#[utoipa::path(get, path = "/v1/schedules", tag = "schedules",
    responses(
        (status = 200, body = ScheduleList),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
    ))]
pub(super) async fn schedule_list(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let schedules = state.runtime.schedules().await?.into_iter().map(ScheduleBody::from).collect();
    Ok(Json(ScheduleList { schedules }).into_response())
}

/// A schedule with its next 5 firings and its latest 10 jobs.
#[utoipa::path(get, path = "/v1/schedules/{name}", tag = "schedules",
    params(("name" = String, Path, description = "The schedule's name", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")),
    responses(
        (status = 200, body = ScheduleBody),
        (status = 400, description = "Not a schedule name", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 404, description = "No schedule has this name", body = ErrorBody),
    ))]
pub(super) async fn schedule_show(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let view = state.runtime.schedule_view(&checked_name(name)?, UPCOMING, RECENT).await?;
    let mut body = ScheduleBody::from(view.schedule);
    body.upcoming = view.upcoming;
    body.recent = view.recent.iter().map(ScheduleRun::from).collect();
    Ok(Json(body).into_response())
}

/// Remove a schedule; the jobs it submitted stay. Audited.
#[utoipa::path(delete, path = "/v1/schedules/{name}", tag = "schedules",
    params(("name" = String, Path, description = "The schedule's name", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")),
    responses(
        (status = 204, description = "Removed"),
        (status = 400, description = "Not a schedule name", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 403, description = "`forbidden` without the `operate` role", body = ErrorBody),
        (status = 404, description = "No schedule has this name", body = ErrorBody),
    ))]
pub(super) async fn schedule_remove(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    state.runtime.acting_as(&principal.name).schedule_remove(&checked_name(name)?).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Pause a schedule: no firing submits anything until it is resumed.
/// Pausing a paused schedule keeps the first pause. Audited.
#[utoipa::path(post, path = "/v1/schedules/{name}/pause", tag = "schedules",
    params(("name" = String, Path, description = "The schedule's name", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")),
    request_body(content = Option<PauseRequest>),
    responses(
        (status = 200, description = "The schedule, paused", body = ScheduleBody),
        (status = 400, description = "Refused: the message names the field or limit", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 403, description = "`forbidden` without the `operate` role", body = ErrorBody),
        (status = 404, description = "No schedule has this name", body = ErrorBody),
        (status = 413, description = "Body over the size cap", body = ErrorBody),
    ))]
pub(super) async fn schedule_pause(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let name = checked_name(name)?;
    let body = body.map_err(body_error)?;
    let request: PauseRequest = if body.is_empty() { PauseRequest::default() } else { parse_body(&body, "pause")? };
    let schedule = state.runtime.acting_as(&principal.name).schedule_pause(&name, request.reason).await?;
    Ok(Json(ScheduleBody::from(schedule)).into_response())
}

/// Resume a schedule: it fires next at its first firing after now (what
/// the pause covered is not caught up). Audited.
#[utoipa::path(post, path = "/v1/schedules/{name}/resume", tag = "schedules",
    params(("name" = String, Path, description = "The schedule's name", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")),
    responses(
        (status = 200, description = "The schedule, running", body = ScheduleBody),
        (status = 400, description = "Not a schedule name", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 403, description = "`forbidden` without the `operate` role", body = ErrorBody),
        (status = 404, description = "No schedule has this name", body = ErrorBody),
    ))]
pub(super) async fn schedule_resume(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let schedule = state.runtime.acting_as(&principal.name).schedule_resume(&checked_name(name)?).await?;
    Ok(Json(ScheduleBody::from(schedule)).into_response())
}

/// Submit the schedule's job now, outside its cadence (paused or not,
/// whatever its overlap policy); its next firing stays. The job is
/// submitted as the schedule's creator; the trigger is audited as the
/// caller's.
#[utoipa::path(post, path = "/v1/schedules/{name}/trigger", tag = "schedules",
    params(("name" = String, Path, description = "The schedule's name", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")),
    responses(
        (status = 202, description = "Submitted", body = TriggerAnswer),
        (status = 400, description = "Refused: the message names the field or limit", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 403, description = "`forbidden` without the `operate` role", body = ErrorBody),
        (status = 404, description = "No schedule has this name, or its plugin is gone", body = ErrorBody),
        (status = 429, description = "`backpressure`: the queue is full", body = ErrorBody),
    ))]
pub(super) async fn schedule_trigger(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let job = state.runtime.acting_as(&principal.name).schedule_trigger(&checked_name(name)?).await?;
    Ok((StatusCode::ACCEPTED, Json(TriggerAnswer { job: ScheduleRun::from(&job) })).into_response())
}
