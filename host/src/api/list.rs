//! Listing jobs: `GET /v1/jobs`, filtered by state, plugin, plan,
//! schedule, submitter, key, error, time, tags and metadata, and paged.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Extension, Query, State};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use crate::access::Principal;
use crate::api::access::list_scope;
use crate::api::error::{ApiError, ErrorBody, query_error};
use crate::api::types::{JobPage, JobView};
use crate::api::{AppState, DEFAULT_PAGE, MAX_PAGE, parse_id};
use crate::clock::Timestamp;
use crate::job::labels::{MAX_TAGS, check_metadata_key, check_tag};
use crate::job::schedule::check_schedule_name;
use crate::job::{JobId, JobStatus};
use crate::runtime::RuntimeError;
use crate::store::JobListParams;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct ListQuery {
    /// Only jobs in one of these states (comma-separated).
    #[param(example = "failed,cancelled")]
    status: Option<String>,
    /// Only jobs of this plugin: a digest, a name or `name@version`.
    #[param(pattern = "^((sha256:)?[0-9a-f]{64}|[a-z0-9][a-z0-9_-]{0,63}(@[A-Za-z0-9._+-]{1,64})?)$")]
    plugin: Option<String>,
    /// Only jobs of this plan.
    plan: Option<String>,
    /// Only jobs this schedule submitted, by the schedule's name (a name
    /// no schedule has lists nothing).
    #[param(pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")]
    schedule: Option<String>,
    /// Only jobs with this concurrency key.
    concurrency_key: Option<String>,
    /// Only jobs with these tags (comma-separated): all of them, or any
    /// one with `tag_match=any`.
    #[param(example = "env:prod,team/payments")]
    tag: Option<String>,
    /// `all` (default) or `any`: how `tag` matches.
    #[param(pattern = "^(all|any)$")]
    tag_match: Option<String>,
    /// Only jobs whose metadata has each entry of this JSON object (a
    /// string value as itself; a number or boolean as its JSON text).
    #[param(example = r#"{"customer":"acme"}"#)]
    meta: Option<String>,
    /// Only jobs this principal submitted (a principal with only the
    /// `submit` role always sees only its own).
    submitted_by: Option<String>,
    /// Only jobs older than this one (the previous page's `next_before`).
    #[param(value_type = Option<JobId>)]
    before: Option<String>,
    /// Only jobs whose error, or last retried attempt's error, holds this
    /// text (any case). It reads each job's error from the newest on until
    /// a page is full: a search matching few jobs in a large store is slow.
    #[param(max_length = 200)]
    error: Option<String>,
    /// Only jobs that ended with this error kind (`timeout`, `guest_error`, …).
    #[param(value_type = Option<crate::job::ErrorKind>)]
    error_kind: Option<String>,
    /// Only jobs created at or after this time (RFC 3339).
    #[param(example = "2026-12-05T04:00:00Z")]
    created_after: Option<String>,
    /// Only jobs created before this time (RFC 3339).
    #[param(example = "2026-12-05T05:00:00Z")]
    created_before: Option<String>,
    /// Jobs per page (default 50).
    #[param(minimum = 1, maximum = 500)]
    limit: Option<u32>,
}

/// An RFC 3339 time in a query, by its parameter's name.
fn time_param(name: &str, value: Option<&str>) -> Result<Option<Timestamp>, ApiError> {
    value
        .map(|text| Timestamp::parse_rfc3339(text).map_err(|e| ApiError::bad_request(format!("`{name}`: {e}"))))
        .transpose()
}

/// An `error` filter's text: at most 200 characters; empty is none.
pub(super) fn error_text(text: Option<String>) -> Result<Option<String>, ApiError> {
    match text {
        Some(text) if text.chars().count() > 200 => Err(ApiError::bad_request("`error` is longer than 200 characters")),
        text => Ok(text.filter(|t| !t.is_empty())),
    }
}

/// A `status` query's states: comma-separated job states (none: any).
pub(super) fn states(list: Option<&str>) -> Result<Vec<JobStatus>, ApiError> {
    let Some(list) = list else { return Ok(Vec::new()) };
    let mut states: Vec<JobStatus> = list
        .split(',')
        .map(|s| s.trim().parse::<JobStatus>())
        .collect::<Result<_, _>>()
        .map_err(ApiError::bad_request)?;
    states.sort_by_key(|s| s.as_str());
    states.dedup();
    Ok(states)
}

/// Jobs, newest first, filtered and paged.
#[utoipa::path(get, path = "/v1/jobs", tag = "jobs",
    params(ListQuery),
    responses(
        (status = 200, body = JobPage),
        (status = 400, description = "Refused: the message names the field or limit", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
    ))]
pub(super) async fn job_list(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(query_error)?;
    let limit = query.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::bad_request(format!("`limit` must be between 1 and {MAX_PAGE}")));
    }
    let (tags, any_tag) = tag_filter(query.tag.as_deref(), query.tag_match.as_deref())?;
    let params = JobListParams {
        tags,
        any_tag,
        metadata: metadata_filter(query.meta.as_deref())?,
        status: states(query.status.as_deref())?,
        plugin: query.plugin.as_deref().map(str::parse).transpose().map_err(ApiError::bad_request)?,
        plan_id: query.plan,
        concurrency_key: query.concurrency_key,
        submitted_by: list_scope(&principal, query.submitted_by),
        schedule_id: match query.schedule {
            Some(name) => {
                check_schedule_name(&name).map_err(|e| ApiError::bad_request(format!("`schedule`: {e}")))?;
                match state.runtime.schedule(&name).await {
                    Ok(schedule) => Some(schedule.id),
                    // No schedule of this name: none of its jobs to list.
                    Err(RuntimeError::UnknownSchedule(_)) => {
                        return Ok(Json(JobPage { jobs: Vec::new(), next_before: None }).into_response());
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            None => None,
        },
        before: query.before.as_deref().map(parse_id).transpose()?,
        error_contains: error_text(query.error)?,
        error_kind: query.error_kind.as_deref().map(str::parse).transpose().map_err(ApiError::bad_request)?,
        created_after: time_param("created_after", query.created_after.as_deref())?,
        created_before: time_param("created_before", query.created_before.as_deref())?,
        limit,
    };
    let jobs = state.runtime.list(params).await?;
    let next = (jobs.len() == limit as usize).then(|| jobs.last().map(|j| j.id)).flatten();
    let jobs: Vec<JobView> = jobs.into_iter().map(JobView::from).collect();
    Ok(Json(JobPage { jobs, next_before: next }).into_response())
}

/// A `tag` filter's tags and whether any one matches (`tag_match=any`).
fn tag_filter(list: Option<&str>, matching: Option<&str>) -> Result<(Vec<String>, bool), ApiError> {
    let any = match matching {
        None | Some("all") => false,
        Some("any") => true,
        Some(other) => return Err(ApiError::bad_request(format!("`tag_match` is `all` or `any`, not {other:?}"))),
    };
    let tags: Vec<String> = list.map(|l| l.split(',').map(str::to_owned).collect()).unwrap_or_default();
    if tags.len() > MAX_TAGS {
        return Err(ApiError::bad_request(format!("`tag` names {} tags, over the ceiling of {MAX_TAGS}", tags.len())));
    }
    for tag in &tags {
        check_tag(tag).map_err(|e| ApiError::bad_request(format!("`tag`: {e}")))?;
    }
    Ok((tags, any))
}

/// A `meta` filter: a JSON object of strings, numbers and booleans.
fn metadata_filter(text: Option<&str>) -> Result<serde_json::Map<String, serde_json::Value>, ApiError> {
    let Some(text) = text else { return Ok(serde_json::Map::new()) };
    let bad = |why: String| {
        ApiError::bad_request(format!("`meta` must be a JSON object of strings, numbers and booleans: {why}"))
    };
    let serde_json::Value::Object(entries) = serde_json::from_str(text).map_err(|e| bad(e.to_string()))? else {
        return Err(bad("not an object".into()));
    };
    for (key, value) in &entries {
        check_metadata_key(key).map_err(&bad)?;
        if !(value.is_string() || value.is_number() || value.is_boolean()) {
            return Err(bad(format!("{key:?} is neither")));
        }
    }
    Ok(entries)
}
