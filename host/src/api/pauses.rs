//! Pausing a plugin by name: `POST /v1/plugins/{reference}/pause` and
//! `/resume`, and `GET /v1/pauses`.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, State};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use crate::access::Principal;
use crate::api::error::{ApiError, ErrorBody, body_error, parse_body};
use crate::api::{AppState, ParsedPath};
use crate::job::PluginRef;
use crate::store::PluginPause;

/// The body of `POST /v1/plugins/{reference}/pause` (optional).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PauseRequest {
    /// Why, kept with the pause and in the audit trail (at most 1,024
    /// bytes).
    #[schema(max_length = 1024)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The answer of `POST /v1/plugins/{reference}/resume`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ResumeAnswer {
    /// `false`: it was not paused (nothing changed).
    pub resumed: bool,
}

/// Every paused plugin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PauseList {
    /// By name.
    pub pauses: Vec<PluginPause>,
}

/// A plugin name from the path: a plain name, not a version or digest (a
/// pause holds every version).
fn plain_name(reference: PluginRef) -> Result<String, ApiError> {
    match reference {
        PluginRef::Name(name) => Ok(name),
        other => Err(ApiError::bad_request(format!(
            "a pause holds every version of a name: give the name alone, not {other}"
        ))),
    }
}

/// Pause a plugin: no process claims its queued jobs until it is resumed;
/// its running jobs finish and new jobs of it queue. Pausing a paused
/// plugin answers the first pause and changes nothing. Audited.
#[utoipa::path(post, path = "/v1/plugins/{reference}/pause", tag = "plugins",
    params(("reference" = String, Path, description = "A registered plugin's name (every version)",
        pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")),
    request_body(content = Option<PauseRequest>),
    responses(
        (status = 200, description = "The pause (the first one, if it was paused already)", body = PluginPause),
        (status = 400, description = "Refused: the message names the field or limit", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 403, description = "`forbidden` without the `operate` role", body = ErrorBody),
        (status = 404, description = "No plugin has this name", body = ErrorBody),
        (status = 413, description = "Body over the size cap", body = ErrorBody),
    ))]
pub(super) async fn plugin_pause(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    ParsedPath(reference): ParsedPath<PluginRef>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let name = plain_name(reference)?;
    let body = body.map_err(body_error)?;
    let request: PauseRequest = if body.is_empty() { PauseRequest::default() } else { parse_body(&body, "pause")? };
    let pause = state.runtime.acting_as(&principal.name).plugin_pause(&name, request.reason).await?;
    Ok(Json(pause).into_response())
}

/// Resume a paused plugin: its queued jobs are claimed again, in their
/// usual order. Audited.
#[utoipa::path(post, path = "/v1/plugins/{reference}/resume", tag = "plugins",
    params(("reference" = String, Path, description = "A registered plugin's name",
        pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")),
    responses(
        (status = 200, description = "Whether it was paused", body = ResumeAnswer),
        (status = 400, description = "Not a plain name", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 403, description = "`forbidden` without the `operate` role", body = ErrorBody),
        (status = 404, description = "No plugin has this name", body = ErrorBody),
    ))]
pub(super) async fn plugin_resume(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    ParsedPath(reference): ParsedPath<PluginRef>,
) -> Result<Response, ApiError> {
    let name = plain_name(reference)?;
    let resumed = state.runtime.acting_as(&principal.name).plugin_resume(&name).await?;
    Ok(Json(ResumeAnswer { resumed }).into_response())
}

/// Every paused plugin, by name.
#[utoipa::path(get, path = "/v1/pauses", tag = "plugins",
    responses(
        (status = 200, body = PauseList),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
    ))]
pub(super) async fn pause_list(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    Ok(Json(PauseList { pauses: state.runtime.plugin_pauses().await? }).into_response())
}
