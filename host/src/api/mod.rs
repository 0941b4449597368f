//! The HTTP API that `leash serve` answers: plugins, jobs, events, health
//! and metrics under bearer-token auth, and the dashboard (`/ui`, in
//! `ui.rs`). Every route but `GET /healthz` and the dashboard's own needs
//! `Authorization: Bearer <token>` or a dashboard session. Bodies are JSON; errors are
//! `{"error": {"kind", "message"}}`. `docs/http-api.md` lists every route.
//! [`listen`] serves the router with bounded connections.

pub mod access;
pub mod audit;
mod error;
mod events;
mod health;
mod jobs;
mod list;
pub mod listen;
pub mod openapi;
pub mod pauses;
mod plans;
mod plugins;
pub mod rate_limits;
pub(crate) mod redrive;
pub mod requests;
pub mod rules;
pub mod schedules;
pub mod types;
mod ui;

use error::{ApiError, ErrorBody, path_error};
use health::{health, workers};
pub use jobs::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, MAX_BATCH_JOBS};
use jobs::{
    job_approve, job_attempts, job_batch, job_cancel, job_effects, job_input, job_logs, job_output, job_reject,
    job_run, job_show, job_submit,
};
use plans::{plan_approve, plan_cancel, plan_list, plan_reject, plan_show, plan_submit};
use plugins::{plugin_approval, plugin_grants, plugin_list, plugin_show, plugin_upload};
pub use types::finished_json;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, FromRequestParts, MatchedPath, Path, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};

use crate::job::JobId;
use crate::runtime::Runtime;

/// Most jobs one list page returns.
pub const MAX_PAGE: u32 = 500;
/// Jobs per list page when the request does not say.
pub const DEFAULT_PAGE: u32 = 50;

/// Server settings.
#[derive(Debug, Clone)]
pub struct ApiConfig {
    /// The bearer token every request but the liveness probe must carry.
    pub token: String,
    /// The sync ceiling: the longest timeout an `"execution": "sync"`
    /// request may ask for (400 `sync_ceiling` above it), and the timeout
    /// of a sync request that sets none (if below the default).
    pub sync_ceiling: Duration,
    /// Largest request body accepted, bytes (413 above it).
    pub max_body_bytes: usize,
}

struct AppState {
    runtime: Runtime,
    config: ApiConfig,
}

/// The router, ready to serve.
pub fn router(runtime: Runtime, config: ApiConfig) -> Router {
    let max_body = config.max_body_bytes;
    let state = Arc::new(AppState { runtime, config });
    let authed = Router::new()
        .route("/v1/plugins", post(plugin_upload).get(plugin_list))
        .route("/v1/plugins/{reference}", get(plugin_show))
        .route("/v1/plugins/{reference}/grants", put(plugin_grants))
        .route("/v1/plugins/{reference}/approval", put(plugin_approval))
        .route("/v1/plugins/{reference}/pause", post(pauses::plugin_pause))
        .route("/v1/plugins/{reference}/resume", post(pauses::plugin_resume))
        .route("/v1/pauses", get(pauses::pause_list))
        .route("/v1/rate-limits", get(rate_limits::rate_limit_list))
        .route(
            "/v1/rate-limits/{name}",
            get(rate_limits::rate_limit_show).put(rate_limits::rate_limit_set).delete(rate_limits::rate_limit_remove),
        )
        .route("/v1/schedules", post(schedules::schedule_add).get(schedules::schedule_list))
        .route("/v1/schedules/{name}", get(schedules::schedule_show).delete(schedules::schedule_remove))
        .route("/v1/schedules/{name}/pause", post(schedules::schedule_pause))
        .route("/v1/schedules/{name}/resume", post(schedules::schedule_resume))
        .route("/v1/schedules/{name}/trigger", post(schedules::schedule_trigger))
        .route("/v1/jobs", post(job_submit).get(list::job_list))
        .route("/v1/jobs:batch", post(job_batch))
        .route("/v1/jobs:retry", post(redrive::jobs_retry))
        .route("/v1/jobs/{id}", get(job_show))
        .route("/v1/jobs/{id}/logs", get(job_logs))
        .route("/v1/jobs/{id}/why", get(jobs::job_why))
        .route("/v1/jobs/{id}/attempts", get(job_attempts))
        .route("/v1/jobs/{id}/effects", get(job_effects))
        .route("/v1/jobs/{id}/input", get(job_input))
        .route("/v1/jobs/{id}/output", get(job_output))
        .route("/v1/jobs/{id}/cancel", post(job_cancel))
        .route("/v1/jobs/{id}/retry", post(redrive::job_retry))
        .route("/v1/jobs/{id}/approve", post(job_approve))
        .route("/v1/jobs/{id}/reject", post(job_reject))
        .route("/v1/jobs/{id}/run", post(job_run))
        .route("/v1/plans", post(plan_submit).get(plan_list))
        .route("/v1/plans/{id}", get(plan_show))
        .route("/v1/plans/{id}/approve", post(plan_approve))
        .route("/v1/plans/{id}/reject", post(plan_reject))
        .route("/v1/plans/{id}/cancel", post(plan_cancel))
        .route("/v1/events", get(events::events))
        .route("/v1/health", get(health))
        .route("/v1/workers", get(workers))
        .route("/v1/openapi.json", get(openapi_json))
        .route("/v1/whoami", get(access::whoami))
        .route("/v1/principals", get(access::principal_list))
        .route("/v1/principals/{name}", put(access::principal_put).delete(access::principal_remove))
        .route("/v1/tokens", post(access::token_create).get(access::token_list))
        .route("/v1/tokens/{id}/revoke", post(access::token_revoke))
        .route("/v1/audit", get(audit::audit_list))
        .route("/v1/audit/head", get(audit::audit_head))
        .route("/v1/rules", get(rules::rule_list))
        .route("/v1/rules/{id}", get(rules::rule_show))
        .route("/v1/rules/{id}/revoke", post(rules::rule_revoke))
        .route("/metrics", get(metrics))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_auth));
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .merge(authed)
        .merge(ui::routes())
        .fallback(no_such_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(state)
}

/// Every route but `/healthz` and `/ui`: a bearer token (the server's, or
/// a principal's whose roles allow the route), or a dashboard session
/// (whose changes must come from this server's pages). The handler sees
/// the caller's [`Principal`](crate::access::Principal) as an extension.
async fn require_auth(State(state): State<Arc<AppState>>, mut request: Request, next: Next) -> Response {
    let caller = match ui::caller(&state, request.headers()).await {
        Ok(caller) => caller,
        Err(e) => return e.into_response(),
    };
    if caller.by_session
        && let Err(e) = ui::check_origin(request.method(), request.headers())
    {
        return e.into_response();
    }
    let route = request.extensions().get::<MatchedPath>().map(|p| p.as_str().to_owned()).unwrap_or_default();
    if let Err(e) = access::allow(&caller.principal, request.method(), &route) {
        return e.into_response();
    }
    request.extensions_mut().insert(caller.principal);
    next.run(request).await
}

/// Under `/v1` (and `/metrics`) an unauthenticated request hears `401`
/// before anything about the route: which paths and methods exist is for
/// callers who may use them.
async fn authenticated_first(state: &AppState, uri: &Uri, headers: &HeaderMap) -> Result<(), ApiError> {
    let path = uri.path();
    if path == "/v1" || path.starts_with("/v1/") || path == "/metrics" {
        ui::caller(state, headers).await?;
    }
    Ok(())
}

async fn no_such_route(State(state): State<Arc<AppState>>, uri: Uri, headers: HeaderMap) -> ApiError {
    authenticated_first(&state, &uri, &headers)
        .await
        .err()
        .unwrap_or_else(|| ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route"))
}

async fn wrong_method(State(state): State<Arc<AppState>>, uri: Uri, headers: HeaderMap) -> ApiError {
    authenticated_first(&state, &uri, &headers).await.err().unwrap_or_else(|| {
        ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "this route does not take that method")
    })
}

fn parse_id(id: &str) -> Result<JobId, ApiError> {
    id.parse().map_err(ApiError::bad_request)
}

/// The one path parameter of a route, parsed: a segment that is not valid
/// percent-encoded UTF-8, or that `T` refuses (a job id that is not a
/// canonical ULID, a malformed plugin reference), is a `400` in the API's
/// JSON.
struct ParsedPath<T>(T);

impl<S: Send + Sync, T: std::str::FromStr<Err = String>> FromRequestParts<S> for ParsedPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(text) = Path::<String>::from_request_parts(parts, state).await.map_err(path_error)?;
        text.parse().map(ParsedPath).map_err(ApiError::bad_request)
    }
}

/// This document.
#[utoipa::path(get, path = "/v1/openapi.json", tag = "health",
    responses(
        (status = 200, description = "The OpenAPI document", content_type = "application/json", body = Object),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
    ))]
async fn openapi_json() -> Response {
    // The document never changes while the process runs: build it once.
    static DOCUMENT: std::sync::LazyLock<String> = std::sync::LazyLock::new(openapi::document_json);
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    (headers, DOCUMENT.as_str()).into_response()
}

async fn metrics(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let text = state.runtime.metrics_text().await?;
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    Ok((headers, text).into_response())
}
