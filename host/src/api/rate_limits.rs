//! Named rate limits: `GET /v1/rate-limits`, and `GET`, `PUT` and
//! `DELETE /v1/rate-limits/{name}`.

use std::sync::Arc;

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
use crate::job::rate::{Rate, RateLimit, check_limit_name};
use crate::runtime::EgressRules;

/// The body of `PUT /v1/rate-limits/{name}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RateLimitRequest {
    /// `COUNT/INTERVAL`: `50/s`, `1000/h`, `30/10s`, `5/min` (units `ms`,
    /// `s`, `min`, `h`, `d`; 1 to 1,000,000 per 1 ms to 1 d).
    #[schema(example = "50/s")]
    pub rate: String,
    /// Starts that may come back to back (1 to 100,000; default 1: evenly
    /// spaced).
    #[schema(minimum = 1, maximum = 100_000)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
    /// Host rules (`[METHODS ]SCHEME://HOST[:PORT]`, as grants write
    /// them): every granted request of any job that one matches takes a
    /// slot, all of them from one bucket, and waits for it (at most 64).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(example = json!(["https://api.github.com"]))]
    pub hosts: Vec<String>,
    /// Secret names: every request carrying one takes a slot from that
    /// secret's own bucket (an upstream's quota per credential; at most
    /// 64).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(example = json!(["GITHUB_TOKEN"]))]
    pub secrets: Vec<String>,
}

/// Every rate limit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RateLimitList {
    /// By name.
    pub limits: Vec<RateLimit>,
}

fn checked_name(name: String) -> Result<String, ApiError> {
    check_limit_name(&name).map_err(ApiError::bad_request)?;
    Ok(name)
}

/// Create a rate limit or change one. Jobs that name it (`rate_limit`)
/// start no faster than it allows, and outbound requests that match its
/// `hosts` or carry one of its `secrets` leave no faster, across every
/// process on the store. Audited.
#[utoipa::path(put, path = "/v1/rate-limits/{name}", tag = "rate-limits",
    params(("name" = String, Path, description = "The limit's name", pattern = "^[a-z0-9_.-]{1,64}$")),
    request_body = RateLimitRequest,
    responses(
        (status = 200, description = "The limit as set", body = RateLimit),
        (status = 400, description = "Refused: the message names the field", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 403, description = "`forbidden` without the `operate` role", body = ErrorBody),
        (status = 413, description = "Body over the size cap", body = ErrorBody),
    ))]
pub(super) async fn rate_limit_set(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let name = checked_name(name)?;
    let request: RateLimitRequest = parse_body(&body.map_err(body_error)?, "rate limit")?;
    let rate: Rate = request.rate.parse().map_err(ApiError::bad_request)?;
    let refused = |e: crate::job::grant::GrantSyntaxError| ApiError::bad_request(e.to_string());
    let egress = EgressRules {
        hosts: request.hosts.iter().map(|h| h.parse()).collect::<Result<_, _>>().map_err(refused)?,
        secrets: request.secrets.iter().map(|s| s.parse()).collect::<Result<_, _>>().map_err(refused)?,
    };
    let limit = state.runtime.acting_as(&principal.name).rate_limit_set(&name, rate, request.burst, egress).await?;
    Ok(Json(limit).into_response())
}

/// Every rate limit, by name.
#[utoipa::path(get, path = "/v1/rate-limits", tag = "rate-limits",
    responses(
        (status = 200, body = RateLimitList),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
    ))]
pub(super) async fn rate_limit_list(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    Ok(Json(RateLimitList { limits: state.runtime.rate_limits().await? }).into_response())
}

/// A rate limit.
#[utoipa::path(get, path = "/v1/rate-limits/{name}", tag = "rate-limits",
    params(("name" = String, Path, description = "The limit's name", pattern = "^[a-z0-9_.-]{1,64}$")),
    responses(
        (status = 200, body = RateLimit),
        (status = 400, description = "Not a limit name", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 404, description = "No limit has this name", body = ErrorBody),
    ))]
pub(super) async fn rate_limit_show(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    Ok(Json(state.runtime.rate_limit(&checked_name(name)?).await?).into_response())
}

/// Remove a rate limit: jobs that name it start unlimited from now on,
/// and new ones naming it are refused. Audited.
#[utoipa::path(delete, path = "/v1/rate-limits/{name}", tag = "rate-limits",
    params(("name" = String, Path, description = "The limit's name", pattern = "^[a-z0-9_.-]{1,64}$")),
    responses(
        (status = 204, description = "Removed"),
        (status = 400, description = "Not a limit name", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 403, description = "`forbidden` without the `operate` role", body = ErrorBody),
        (status = 404, description = "No limit has this name", body = ErrorBody),
    ))]
pub(super) async fn rate_limit_remove(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    state.runtime.acting_as(&principal.name).rate_limit_remove(&checked_name(name)?).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
