//! `/v1/plugins`: upload, list, show, grant, approval policy.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Extension, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use crate::access::Principal;
use crate::api::error::{ApiError, ErrorBody, body_error, parse_body, query_error};
use crate::api::types::PluginList;
use crate::api::{AppState, ParsedPath};
use crate::job::{ApprovalPolicy, PluginName, PluginRef};

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct UploadQuery {
    /// Registry name (1–64 lowercase letters, digits, `-`, `_`).
    #[param(pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")]
    name: Option<String>,
    /// Version (default `0.0.0`); needs `name`.
    #[param(pattern = "^[A-Za-z0-9._+-]{1,64}$")]
    version: Option<String>,
    /// Targets whose jobs wait for approval, comma-separated (`*`,
    /// `execute`, `apply`, `action:*`, `action:<name>`), set with the name
    /// in one step; needs `name`. Absent: a replaced name keeps its policy.
    require_approval: Option<String>,
}

/// Validate, compile, store and (with `name`) register a component.
#[utoipa::path(post, path = "/v1/plugins", tag = "plugins",
    params(UploadQuery),
    request_body(content = inline(crate::api::types::OctetStream), content_type = "application/octet-stream", description = "The component's bytes"),
    responses(
        (status = 201, description = "Stored (and registered)", body = crate::job::PluginInfo),
        (status = 400, description = "Refused: the message names the field or limit", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 413, description = "Body over the size cap", body = ErrorBody),
        (status = 503, description = "The database is busy", body = ErrorBody),
    ))]
pub(super) async fn plugin_upload(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    query: Result<Query<UploadQuery>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(query_error)?;
    let bytes = body.map_err(body_error)?.to_vec();
    if bytes.is_empty() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_plugin",
            "the body is empty: send the component's bytes",
        ));
    }
    let policy = query.require_approval.as_deref().map(parse_policy).transpose()?;
    let info = match (query.name, query.version) {
        (Some(name), version) => {
            let version = version.as_deref().unwrap_or(crate::job::DEFAULT_PLUGIN_VERSION);
            let name = PluginName::new(&name, version).map_err(ApiError::bad_request)?;
            state.runtime.acting_as(&principal.name).plugin_register_with(bytes, name, policy).await?
        }
        (None, Some(_)) => return Err(ApiError::bad_request("`version` needs a `name`")),
        (None, None) if policy.is_some() => {
            return Err(ApiError::bad_request("`require_approval` belongs to a registration: give a `name`"));
        }
        (None, None) => {
            let digest = state.runtime.acting_as(&principal.name).plugin_add(bytes).await?;
            state.runtime.plugin(PluginRef::Digest(digest)).await?
        }
    };
    Ok((StatusCode::CREATED, Json(info)).into_response())
}

/// Every registered plugin.
#[utoipa::path(get, path = "/v1/plugins", tag = "plugins",
    responses(
        (status = 200, body = PluginList),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
    ))]
pub(super) async fn plugin_list(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let plugins = state.runtime.plugins().await?;
    Ok(Json(PluginList { plugins }).into_response())
}

/// One plugin by `name`, `name@version` or digest.
#[utoipa::path(get, path = "/v1/plugins/{reference}", tag = "plugins",
    params(("reference" = String, Path, description = "`name`, `name@version` or a digest",
        pattern = "^((sha256:)?[0-9a-f]{64}|[a-z0-9][a-z0-9_-]{0,63}(@[A-Za-z0-9._+-]{1,64})?)$")),
    responses(
        (status = 200, body = crate::job::PluginInfo),
        (status = 400, description = "Refused: the message names the field or limit", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 404, description = "No such plugin", body = ErrorBody),
    ))]
pub(super) async fn plugin_show(
    State(state): State<Arc<AppState>>,
    ParsedPath(reference): ParsedPath<PluginRef>,
) -> Result<Response, ApiError> {
    Ok(Json(state.runtime.plugin(reference).await?).into_response())
}

/// Replace what jobs of a registered `name@version` may use outside their
/// sandbox. Jobs submitted afterwards get the new grants; jobs already
/// submitted keep theirs. `{}` grants nothing.
#[utoipa::path(put, path = "/v1/plugins/{reference}/grants", tag = "plugins",
    params(("reference" = String, Path, description = "`name@version` of a registered plugin",
        pattern = "^[a-z0-9][a-z0-9_-]{0,63}@[A-Za-z0-9._+-]{1,64}$")),
    request_body = crate::job::Grants,
    responses(
        (status = 200, description = "The registration with its new grants", body = crate::job::PluginInfo),
        (status = 400, description = "Refused: the message names the field or limit", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 404, description = "No such name and version", body = ErrorBody),
        (status = 413, description = "Body over the size cap", body = ErrorBody),
        (status = 503, description = "The database is busy", body = ErrorBody),
    ))]
pub(super) async fn plugin_grants(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    ParsedPath(reference): ParsedPath<PluginRef>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let PluginRef::Version(name) = reference else {
        return Err(ApiError::bad_request("grants belong to a `name@version`: name the version"));
    };
    let grants: crate::job::Grants = parse_body(&body.map_err(body_error)?, "grant")?;
    Ok(Json(state.runtime.acting_as(&principal.name).plugin_grant(name, grants).await?).into_response())
}

/// A comma-separated list of gated targets.
fn parse_policy(text: &str) -> Result<ApprovalPolicy, ApiError> {
    let require = text
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| t.parse().map_err(|e: String| ApiError::bad_request(format!("`require_approval`: {e}"))))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ApprovalPolicy { require, ..ApprovalPolicy::default() })
}

/// Replace which targets of a registered `name@version` wait for a
/// person's approval. Jobs submitted afterwards follow it; jobs already
/// submitted keep their state. `{"require": []}` gates nothing.
#[utoipa::path(put, path = "/v1/plugins/{reference}/approval", tag = "plugins",
    params(("reference" = String, Path, description = "`name@version` of a registered plugin",
        pattern = "^[a-z0-9][a-z0-9_-]{0,63}@[A-Za-z0-9._+-]{1,64}$")),
    request_body = crate::job::ApprovalPolicy,
    responses(
        (status = 200, description = "The registration with its new policy", body = crate::job::PluginInfo),
        (status = 400, description = "Refused: the message names the field or limit", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 404, description = "No such name and version", body = ErrorBody),
        (status = 413, description = "Body over the size cap", body = ErrorBody),
        (status = 503, description = "The database is busy", body = ErrorBody),
    ))]
pub(super) async fn plugin_approval(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    ParsedPath(reference): ParsedPath<PluginRef>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let PluginRef::Version(name) = reference else {
        return Err(ApiError::bad_request("an approval policy belongs to a `name@version`: name the version"));
    };
    let policy: ApprovalPolicy = parse_body(&body.map_err(body_error)?, "approval policy")?;
    Ok(Json(state.runtime.acting_as(&principal.name).plugin_require_approval(name, policy).await?).into_response())
}
