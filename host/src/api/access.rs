//! Who may call which route, and the admin routes for principals and
//! tokens: `/v1/principals`, `/v1/tokens`, and `/v1/whoami`.

use std::collections::BTreeSet;
use std::str::FromStr;
use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Extension, Query, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use crate::access::{Principal, PrincipalCeilings, Role, TokenRecord};
use crate::api::error::{ApiError, ErrorBody, body_error, parse_body, query_error};
use crate::api::{AppState, ParsedPath};
use crate::job::{Job, JobId, millis};

/// The role a route needs (`None`: any principal may call it). `route` is
/// the route as the router names it (`/v1/jobs/{id}/approve`).
pub(super) fn required_role(method: &Method, route: &str) -> Option<Role> {
    let write = *method != Method::GET && *method != Method::HEAD;
    match route {
        r if r.starts_with("/v1/principals") || r.starts_with("/v1/tokens") => Some(Role::Admin),
        "/v1/plugins" | "/v1/plugins/{reference}/grants" | "/v1/plugins/{reference}/approval" if write => {
            Some(Role::Admin)
        }
        "/v1/jobs" | "/v1/jobs:batch" | "/v1/plans" | "/v1/schedules" if write => Some(Role::Submit),
        "/v1/jobs/{id}/approve"
        | "/v1/jobs/{id}/reject"
        | "/v1/jobs/{id}/run"
        | "/v1/plans/{id}/approve"
        | "/v1/plans/{id}/reject" => Some(Role::Approve),
        "/v1/schedules/{name}" | "/v1/rate-limits/{name}" if write => Some(Role::Operate),
        "/v1/jobs/{id}/cancel"
        | "/v1/jobs/{id}/retry"
        | "/v1/jobs:retry"
        | "/v1/plugins/{reference}/pause"
        | "/v1/plugins/{reference}/resume"
        | "/v1/schedules/{name}/pause"
        | "/v1/schedules/{name}/resume"
        | "/v1/schedules/{name}/trigger"
        | "/v1/plans/{id}/cancel"
        | "/v1/workers"
        | "/metrics" => Some(Role::Operate),
        r if r.starts_with("/v1/audit") => Some(Role::Operate),
        r if r.starts_with("/v1/rules") => Some(Role::Approve),
        _ => None,
    }
}

/// `403 forbidden` unless `principal` may call `route`.
pub(super) fn allow(principal: &Principal, method: &Method, route: &str) -> Result<(), ApiError> {
    match required_role(method, route) {
        Some(role) if !principal.may(role) => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("{method} {route} needs the `{role}` role; principal {:?} does not hold it", principal.name),
        )),
        _ => Ok(()),
    }
}

/// Whether `principal` reads every job and plan (`approve` and `operate`
/// do; `admin` holds both), or only those it submitted (`submit` alone).
pub(super) fn reads_all(principal: &Principal) -> bool {
    principal.may(Role::Approve) || principal.may(Role::Operate)
}

/// The submitter a list is narrowed to for `principal`: its own name for a
/// principal that reads only its own, else what the query asked for.
pub(super) fn list_scope(principal: &Principal, asked: Option<String>) -> Option<String> {
    if reads_all(principal) { asked } else { Some(principal.name.clone()) }
}

/// `404` for a job `principal` may not read (one it did not submit, when
/// it reads only its own): as for a job that does not exist, whose
/// existence is not its to learn either.
pub(super) fn may_read(principal: &Principal, job: &Job) -> Result<(), ApiError> {
    if reads_all(principal) || job.submitted_by.as_deref() == Some(principal.name.as_str()) {
        Ok(())
    } else {
        Err(crate::runtime::RuntimeError::NotFound(job.id).into())
    }
}

/// [`may_read`] for a job the handler does not read itself: read only
/// for a principal that reads only its own.
pub(super) async fn readable(state: &AppState, principal: &Principal, id: JobId) -> Result<(), ApiError> {
    if reads_all(principal) {
        return Ok(());
    }
    may_read(principal, &state.runtime.get(id).await?)
}

/// The job, if `principal` may read it (else `404`, see [`may_read`]).
pub(super) async fn read_job(state: &AppState, principal: &Principal, id: JobId) -> Result<Job, ApiError> {
    let job = state.runtime.get(id).await?;
    may_read(principal, &job)?;
    Ok(job)
}

/// A principal's name from a path, checked (a bad one is `400`).
pub(super) struct NameInPath(String);

impl FromStr for NameInPath {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Principal::check_name(s).map(|()| NameInPath(s.to_owned()))
    }
}

/// A token's id from a path: 16 hex digits (else `400`).
pub(super) struct TokenIdInPath(String);

impl FromStr for TokenIdInPath {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s.len() == 16 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
            Ok(TokenIdInPath(s.to_owned()))
        } else {
            Err(format!("token id {s:?}: 16 hex digits, as `GET /v1/tokens` lists them"))
        }
    }
}

/// The body of `PUT /v1/principals/{name}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PrincipalRequest {
    /// Its roles: `submit`, `approve`, `operate`, `admin` (at least one).
    pub roles: BTreeSet<Role>,
    /// Its own ceilings on the jobs it submits (replacing what it had;
    /// absent: none).
    #[serde(default, skip_serializing_if = "PrincipalCeilings::is_none")]
    pub ceilings: PrincipalCeilings,
}

/// The body of `POST /v1/tokens`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenRequest {
    /// Whose token it is: a stored principal.
    pub principal: String,
    /// What it is for (at most 256 printable characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// How long it works (default: until revoked).
    #[schema(value_type = Option<u64>, minimum = 1)]
    #[serde(rename = "ttl_ms", default, with = "millis::option", skip_serializing_if = "Option::is_none")]
    pub ttl: Option<std::time::Duration>,
}

/// A token just created: the token itself, shown this once, and its record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TokenCreated {
    /// `leash_<id>_<secret>`: send it as `Authorization: Bearer`. It is not
    /// stored and cannot be shown again.
    pub token: String,
    /// Its record.
    pub record: TokenRecord,
}

/// Every stored principal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PrincipalList {
    /// By name.
    pub principals: Vec<Principal>,
}

/// Tokens, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TokenList {
    /// Never their secrets.
    pub tokens: Vec<TokenRecord>,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct TokenListQuery {
    /// Only this principal's tokens.
    principal: Option<String>,
}

/// Who the caller is: its principal and roles (`admin`, every role, for
/// the server's own token and a dashboard session).
#[utoipa::path(get, path = "/v1/whoami", tag = "access",
    responses(
        (status = 200, body = Principal),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
    ))]
pub(super) async fn whoami(Extension(principal): Extension<Principal>) -> Json<Principal> {
    Json(principal)
}

/// Stored principals (admin).
#[utoipa::path(get, path = "/v1/principals", tag = "access",
    responses(
        (status = 200, body = PrincipalList),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 403, description = "`forbidden`: not an admin", body = ErrorBody),
    ))]
pub(super) async fn principal_list(State(state): State<Arc<AppState>>) -> Result<Json<PrincipalList>, ApiError> {
    Ok(Json(PrincipalList { principals: state.runtime.principals().await? }))
}

/// Add a principal, or give an existing one these roles (admin).
#[utoipa::path(put, path = "/v1/principals/{name}", tag = "access",
    params(("name" = String, Path)),
    request_body = PrincipalRequest,
    responses(
        (status = 200, body = Principal),
        (status = 400, description = "A bad name, no role, or `admin` (the server token's)", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 403, description = "`forbidden`: not an admin", body = ErrorBody),
    ))]
pub(super) async fn principal_put(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    ParsedPath(NameInPath(name)): ParsedPath<NameInPath>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Principal>, ApiError> {
    let body: PrincipalRequest = parse_body(&body.map_err(body_error)?, "principal")?;
    Ok(Json(state.runtime.acting_as(&principal.name).principal_put(name, body.roles, body.ceilings).await?))
}

/// Remove a principal: its tokens stop working at once, on every replica
/// (admin).
#[utoipa::path(delete, path = "/v1/principals/{name}", tag = "access",
    params(("name" = String, Path)),
    responses(
        (status = 204, description = "Removed"),
        (status = 400, description = "Not a principal's name", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 403, description = "`forbidden`: not an admin", body = ErrorBody),
        (status = 404, description = "No such principal", body = ErrorBody),
    ))]
pub(super) async fn principal_remove(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    ParsedPath(NameInPath(name)): ParsedPath<NameInPath>,
) -> Result<StatusCode, ApiError> {
    match state.runtime.acting_as(&principal.name).principal_remove(&name).await? {
        true => Ok(StatusCode::NO_CONTENT),
        false => Err(ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("no principal {name:?}"))),
    }
}

/// Create a token for a principal: the answer holds the token, shown this
/// once (admin).
#[utoipa::path(post, path = "/v1/tokens", tag = "access",
    request_body = TokenRequest,
    responses(
        (status = 201, body = TokenCreated),
        (status = 400, description = "A bad label or TTL", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 403, description = "`forbidden`: not an admin", body = ErrorBody),
        (status = 404, description = "No such principal", body = ErrorBody),
    ))]
pub(super) async fn token_create(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body: TokenRequest = parse_body(&body.map_err(body_error)?, "token request")?;
    let (record, token) =
        state.runtime.acting_as(&principal.name).token_create(&body.principal, body.label, body.ttl).await?;
    Ok((StatusCode::CREATED, Json(TokenCreated { token, record })).into_response())
}

/// Tokens, newest first, never their secrets (admin).
#[utoipa::path(get, path = "/v1/tokens", tag = "access",
    params(TokenListQuery),
    responses(
        (status = 200, body = TokenList),
        (status = 400, description = "A query parameter this route does not take", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 403, description = "`forbidden`: not an admin", body = ErrorBody),
    ))]
pub(super) async fn token_list(
    State(state): State<Arc<AppState>>,
    query: Result<Query<TokenListQuery>, QueryRejection>,
) -> Result<Json<TokenList>, ApiError> {
    let Query(query) = query.map_err(query_error)?;
    Ok(Json(TokenList { tokens: state.runtime.tokens(query.principal).await? }))
}

/// Revoke a token: refused from now on, on every replica (admin).
#[utoipa::path(post, path = "/v1/tokens/{id}/revoke", tag = "access",
    params(("id" = String, Path)),
    responses(
        (status = 204, description = "Revoked"),
        (status = 400, description = "Not a token id", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 403, description = "`forbidden`: not an admin", body = ErrorBody),
        (status = 404, description = "No such live token", body = ErrorBody),
    ))]
pub(super) async fn token_revoke(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    ParsedPath(TokenIdInPath(id)): ParsedPath<TokenIdInPath>,
) -> Result<StatusCode, ApiError> {
    match state.runtime.acting_as(&principal.name).token_revoke(&id).await? {
        true => Ok(StatusCode::NO_CONTENT),
        false => Err(ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("no live token {id:?}"))),
    }
}
