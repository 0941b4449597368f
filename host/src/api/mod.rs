//! The HTTP API that `leash serve` answers: plugins, jobs, health and
//! metrics under bearer-token auth. Every route but `GET /healthz` needs
//! `Authorization: Bearer <token>`. Bodies are JSON; errors are
//! `{"error": {"kind", "message"}}`. `docs/http-api.md` lists every route.
//! [`listen`] serves the router with bounded connections.

pub mod listen;
pub mod openapi;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, FromRequestParts, Path, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use subtle::ConstantTimeEq;

use crate::clock::Timestamp;
use crate::job::{Backoff, Digest, IdempotencyKey, Job, JobId, JobStatus, PluginName, PluginRef, Target};
use crate::runtime::{Cancelled, Ceilings, PluginSource, Runtime, RuntimeError, Submit};
use crate::store::JobListParams;

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
        .route("/v1/jobs", post(job_submit).get(job_list))
        .route("/v1/jobs/{id}", get(job_show))
        .route("/v1/jobs/{id}/logs", get(job_logs))
        .route("/v1/jobs/{id}/output", get(job_output))
        .route("/v1/jobs/{id}/cancel", post(job_cancel))
        .route("/v1/health", get(health))
        .route("/v1/workers", get(workers))
        .route("/v1/openapi.json", get(openapi_json))
        .route("/metrics", get(metrics))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token));
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .merge(authed)
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "this route does not take that method")
        })
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(state)
}

/// An error answer: a status and `{"error": {"kind", "message"}}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
    retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, kind, message: message.into(), retry_after: None }
    }

    fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }
}

/// Every error answer: `{"error": {"kind", "message"}}`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct ErrorBody {
    error: ErrorDetail,
}

/// What went wrong.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct ErrorDetail {
    /// Machine-readable: `invalid_request`, `invalid_job`, `not_found`, …
    kind: &'static str,
    /// For people; names the field or limit at fault.
    message: String,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Json(ErrorBody { error: ErrorDetail { kind: self.kind, message: self.message } });
        let mut response = (self.status, body).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let Some(seconds) = self.retry_after {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

impl From<RuntimeError> for ApiError {
    fn from(e: RuntimeError) -> Self {
        let message = e.to_string();
        match e {
            RuntimeError::Backpressure { .. } => ApiError {
                retry_after: Some(1),
                ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, "backpressure", message)
            },
            RuntimeError::InvalidPlugin(ref e) => ApiError::new(StatusCode::BAD_REQUEST, e.kind(), message),
            RuntimeError::UnknownPlugin(_) => ApiError::new(StatusCode::NOT_FOUND, "unknown_plugin", message),
            RuntimeError::InvalidJob(_) => ApiError::new(StatusCode::BAD_REQUEST, "invalid_job", message),
            RuntimeError::NotFound(_) => ApiError::new(StatusCode::NOT_FOUND, "not_found", message),
            RuntimeError::AlreadyTerminal { .. } => ApiError::new(StatusCode::CONFLICT, "already_terminal", message),
            RuntimeError::IdempotencyConflict { .. } => {
                ApiError::new(StatusCode::CONFLICT, "idempotency_conflict", message)
            }
            // The process is stopping (its store closed under a request
            // still open): nothing was done; another server or a restart
            // answers the retry.
            RuntimeError::Store(crate::store::StoreError::Closed) => ApiError {
                retry_after: Some(1),
                ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "shutting_down", message)
            },
            RuntimeError::Store(ref s) if s.is_transient() => {
                ApiError { retry_after: Some(1), ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "busy", message) }
            }
            RuntimeError::WaitTimeout(_) | RuntimeError::Store(_) | RuntimeError::Sandbox(_) => {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
            }
        }
    }
}

fn body_error(e: BytesRejection) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", "the request body is over the size cap")
    } else {
        ApiError::new(e.status(), "invalid_request", e.body_text())
    }
}

fn query_error(e: QueryRejection) -> ApiError {
    ApiError::bad_request(e.body_text())
}

/// A path segment that is not valid percent-encoded UTF-8 (`/v1/jobs/%FF`).
fn path_error(e: PathRejection) -> ApiError {
    ApiError::bad_request(format!("the path is not valid: {}", e.body_text()))
}

/// Parse a JSON body, naming the field a wrong value sits in:
/// `plugin: invalid type: integer 123, expected a string`.
fn parse_body<T: serde::de::DeserializeOwned>(body: &[u8], what: &str) -> Result<T, ApiError> {
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut deserializer).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." || path.is_empty() {
            ApiError::bad_request(format!("the body is not a valid {what}: {inner}"))
        } else {
            ApiError::bad_request(format!("the body is not a valid {what}: `{path}`: {inner}"))
        }
    })?;
    deserializer.end().map_err(|e| ApiError::bad_request(format!("the body is not a valid {what}: {e}")))?;
    Ok(value)
}

async fn require_token(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    match given {
        Some(token) if bool::from(token.as_bytes().ct_eq(state.config.token.as_bytes())) => next.run(request).await,
        Some(_) => ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", "wrong bearer token").into_response(),
        None => ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", "missing `Authorization: Bearer <token>`")
            .into_response(),
    }
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

// ---- plugins ----

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct UploadQuery {
    /// Registry name (1–64 lowercase letters, digits, `-`, `_`).
    #[param(pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")]
    name: Option<String>,
    /// Version (default `0.0.0`); needs `name`.
    #[param(pattern = "^[A-Za-z0-9._+-]{1,64}$")]
    version: Option<String>,
}

/// Validate, compile, store and (with `name`) register a component.
#[utoipa::path(post, path = "/v1/plugins", tag = "plugins",
    params(UploadQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "The component's bytes"),
    responses(
        (status = 201, description = "Stored (and registered)", body = crate::job::PluginInfo),
        (status = 400, description = "Refused: the message names the field or limit", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 413, description = "Body over the size cap", body = ErrorBody),
        (status = 503, description = "The database is busy", body = ErrorBody),
    ))]
async fn plugin_upload(
    State(state): State<Arc<AppState>>,
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
    let info = match (query.name, query.version) {
        (Some(name), version) => {
            let version = version.as_deref().unwrap_or(crate::job::DEFAULT_PLUGIN_VERSION);
            let name = PluginName::new(&name, version).map_err(ApiError::bad_request)?;
            state.runtime.plugin_register(bytes, name).await?
        }
        (None, Some(_)) => return Err(ApiError::bad_request("`version` needs a `name`")),
        (None, None) => {
            let digest = state.runtime.plugin_add(bytes).await?;
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
async fn plugin_list(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
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
async fn plugin_show(
    State(state): State<Arc<AppState>>,
    ParsedPath(reference): ParsedPath<PluginRef>,
) -> Result<Response, ApiError> {
    Ok(Json(state.runtime.plugin(reference).await?).into_response())
}

// ---- jobs ----

/// How `POST /v1/jobs` answers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
enum Execution {
    /// Answer with the outcome: the job's timeout, at most the sync
    /// ceiling, covers its queue wait and its run.
    #[default]
    Sync,
    /// Answer 202 at once; poll or wait for the outcome.
    Async,
}

/// The body of `POST /v1/jobs`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct SubmitBody {
    /// `name`, `name@version` or a digest; pinned to the digest now.
    #[schema(pattern = "^((sha256:)?[0-9a-f]{64}|[a-z0-9][a-z0-9_-]{0,63}(@[A-Za-z0-9._+-]{1,64})?)$")]
    plugin: String,
    /// `execute` (default) or `apply`; not with `action`.
    #[schema(pattern = "^(execute|apply)$")]
    phase: Option<String>,
    /// Run this named action instead of a phase.
    #[schema(pattern = "^[a-z0-9_.-]{1,64}$")]
    action: Option<String>,
    /// The input as JSON (not with `input_base64`).
    input: Option<Value>,
    /// The input as raw bytes, base64.
    #[schema(content_encoding = "base64")]
    input_base64: Option<String>,
    /// Wall-clock limit per attempt (ceiling: `GET /v1/health`, default 24 h).
    #[schema(minimum = 1, maximum = 86_400_000)]
    timeout_ms: Option<u64>,
    /// Fuel budget per attempt; unlimited when absent.
    fuel: Option<u64>,
    /// Memory limit (ceiling: 1 GiB by default).
    #[schema(maximum = 1_073_741_824)]
    memory_bytes: Option<u64>,
    /// Output limit (ceiling: 64 MiB by default).
    #[schema(maximum = 67_108_864)]
    output_bytes: Option<u64>,
    /// Runs the job may use when workers die under it.
    #[schema(minimum = 1, maximum = 100)]
    max_attempts: Option<u32>,
    /// At most one running job per key.
    #[schema(min_length = 1, max_length = 256)]
    concurrency_key: Option<String>,
    /// A plan to group jobs by.
    #[schema(max_length = 256)]
    plan_id: Option<String>,
    /// How long it may wait in the queue (ceiling: 30 days by default).
    #[schema(minimum = 1, maximum = 2_592_000_000u64)]
    queue_ttl_ms: Option<u64>,
    /// Async only: not before this instant (RFC 3339, e.g.
    /// `2026-12-01T09:00:00Z`); the queue TTL counts from then. A past
    /// instant means now. Not with `delay_ms`.
    #[schema(format = DateTime)]
    run_at: Option<String>,
    /// Async only: not before this many milliseconds from now.
    #[schema(maximum = 2_592_000_000u64)]
    delay_ms: Option<u64>,
    /// The pause before the first retry (doubling after each failure, with
    /// jitter), milliseconds; default 1000.
    #[schema(minimum = 1, maximum = 86_400_000)]
    backoff_ms: Option<u64>,
    /// The longest pause before a retry, milliseconds; default 300000.
    #[schema(minimum = 1, maximum = 86_400_000)]
    backoff_cap_ms: Option<u64>,
    /// `sync` (default): answer with the outcome, within the sync ceiling;
    /// `async`: answer 202 at once.
    #[serde(default)]
    execution: Execution,
}

impl SubmitBody {
    fn into_submit(self, now: Timestamp, defaults: &Ceilings) -> Result<(Submit, Execution), ApiError> {
        let plugin: PluginRef = self.plugin.parse().map_err(|e| ApiError::bad_request(format!("`plugin`: {e}")))?;
        let target = match (self.phase.as_deref(), self.action) {
            (None | Some("action"), Some(name)) => {
                Target::action(&name).map_err(|e| ApiError::bad_request(e.to_string()))?
            }
            (Some(_), Some(_)) => return Err(ApiError::bad_request("give `phase` or `action`, not both")),
            (Some(phase), None) => {
                phase.parse().map_err(|e: crate::job::ParseTargetError| ApiError::bad_request(e.to_string()))?
            }
            (None, None) => Target::Execute,
        };
        let input = match (self.input, self.input_base64) {
            (Some(_), Some(_)) => return Err(ApiError::bad_request("give `input` or `input_base64`, not both")),
            (Some(value), None) => serde_json::to_vec(&value).map_err(|e| ApiError::bad_request(e.to_string()))?,
            (None, Some(text)) => base64::engine::general_purpose::STANDARD
                .decode(text.as_bytes())
                .map_err(|e| ApiError::bad_request(format!("`input_base64` is not base64: {e}")))?,
            (None, None) => Vec::new(),
        };
        let mut job = Submit::new(PluginSource::Ref(plugin), target, input);
        job.timeout = self.timeout_ms.map(Duration::from_millis);
        job.fuel = self.fuel;
        job.memory_bytes = self.memory_bytes;
        job.output_bytes = self.output_bytes;
        job.max_attempts = self.max_attempts;
        job.concurrency_key = self.concurrency_key;
        job.plan_id = self.plan_id;
        job.queue_ttl = self.queue_ttl_ms.map(Duration::from_millis);
        job.run_at = match (self.run_at, self.delay_ms) {
            (Some(_), Some(_)) => return Err(ApiError::bad_request("give `run_at` or `delay_ms`, not both")),
            (Some(text), None) => {
                Some(Timestamp::parse_rfc3339(&text).map_err(|e| ApiError::bad_request(format!("`run_at`: {e}")))?)
            }
            (None, Some(ms)) => Some(now.plus(Duration::from_millis(ms))),
            (None, None) => None,
        };
        if job.run_at.is_some() && self.execution == Execution::Sync {
            return Err(ApiError::bad_request(
                "`run_at` and `delay_ms` make a delayed job: send \"execution\": \"async\" with them",
            ));
        }
        if self.backoff_ms.is_some() || self.backoff_cap_ms.is_some() {
            let default = defaults.backoff;
            job.backoff = Some(Backoff {
                base_ms: self.backoff_ms.unwrap_or(default.base_ms),
                cap_ms: self.backoff_cap_ms.unwrap_or(default.cap_ms.max(self.backoff_ms.unwrap_or(0))),
            });
        }
        Ok((job, self.execution))
    }
}

/// A job as the API shows it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct JobView {
    #[serde(flatten)]
    job: Job,
    /// Output size of a succeeded job (fetch it from `/output`).
    #[serde(skip_serializing_if = "Option::is_none")]
    output_bytes: Option<usize>,
}

impl From<Job> for JobView {
    fn from(mut job: Job) -> Self {
        let output_bytes = job.output.take().map(|o| o.len());
        JobView { job, output_bytes }
    }
}

/// A finished job with its output: parsed JSON when it is JSON (else
/// `null`), and always base64, so binary outputs round-trip intact. The
/// sync answer of `POST /v1/jobs`, and what `leash … --wait --json` prints.
pub fn finished_json(job: impl Serialize, output: Option<&[u8]>) -> Value {
    serde_json::to_value(Finished::new(job, output)).unwrap_or(Value::Null)
}

/// A finished job and its output (see [`finished_json`]).
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct Finished<J> {
    /// The job.
    job: J,
    /// The output parsed as JSON, or `null` when it is not JSON.
    output: Option<Value>,
    /// The output bytes, base64 (`null` unless the job succeeded).
    output_base64: Option<String>,
}

impl<J> Finished<J> {
    fn new(job: J, output: Option<&[u8]>) -> Self {
        Finished {
            job,
            output: output.and_then(|o| serde_json::from_slice::<Value>(o).ok()),
            output_base64: output.map(|o| base64::engine::general_purpose::STANDARD.encode(o)),
        }
    }
}

/// `202` to an async submit: the job is queued.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct Accepted {
    /// Always `accepted`.
    #[schema(example = "accepted")]
    status: &'static str,
    job_id: JobId,
}

/// `GET /v1/plugins`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct PluginList {
    plugins: Vec<crate::job::PluginInfo>,
}

/// `GET /v1/jobs`: a page, newest first.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct JobPage {
    jobs: Vec<JobView>,
    /// Pass as `before` for the next page; `null` when the page is not full.
    next_before: Option<JobId>,
}

/// What a cancel did.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct CancelAnswer {
    job_id: JobId,
    /// `cancelled` (it was queued) or `cancel_requested` (it runs).
    status: Cancelled,
}

/// `GET /v1/health`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct HealthReport {
    health: crate::runtime::Health,
    ceilings: crate::runtime::Ceilings,
}

/// The header a client names its create request with, so a retry after a
/// lost answer returns the first request's job instead of queueing another.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// The header marking an answer as a replay of an earlier request's.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// The request's idempotency key, bound to a digest of its JSON body as
/// parsed (so whitespace and key order do not make two bodies differ).
fn idempotency_key(headers: &HeaderMap, body: &[u8]) -> Result<Option<IdempotencyKey>, ApiError> {
    let Some(key) = headers.get(IDEMPOTENCY_KEY) else { return Ok(None) };
    let key = key.to_str().map_err(|_| ApiError::bad_request("`Idempotency-Key`: use printable ASCII"))?;
    let body: Value = parse_body(body, "job request")?;
    let digest = Digest::of(body.to_string().as_bytes()).to_string();
    IdempotencyKey::new(key, digest).map(Some).map_err(|e| ApiError::bad_request(format!("`Idempotency-Key`: {e}")))
}

/// Validate and queue a job; `sync` waits for its outcome.
#[utoipa::path(post, path = "/v1/jobs", tag = "jobs",
    params(("Idempotency-Key" = Option<String>, Header, description = "Makes a retry of this request safe")),
    request_body = SubmitBody,
    responses(
        (status = 200, description = "Sync: the finished job and its output", body = Finished<JobView>),
        (status = 202, description = "Async: queued", body = Accepted),
        (status = 400, description = "Refused: the message names the field or limit; \
            `sync_ceiling` for a sync timeout over the ceiling", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 404, description = "No such plugin", body = ErrorBody),
        (status = 409, description = "The idempotency key was used for another request", body = ErrorBody),
        (status = 413, description = "Body over the size cap", body = ErrorBody),
        (status = 429, description = "The queue is full; retry after a second", body = ErrorBody),
        (status = 503, description = "The database is busy", body = ErrorBody),
        (status = 504, description = "Sync: the job had not ended shortly after its deadline \
            (its worker stopped); it never starts again", body = ErrorBody),
    ))]
async fn job_submit(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body.map_err(body_error)?;
    let idempotency = idempotency_key(&headers, &body)?;
    let body: SubmitBody = parse_body(&body, "job request")?;
    let ceilings = state.runtime.ceilings();
    let (mut job, execution) = body.into_submit(state.runtime.now(), &ceilings)?;
    job.idempotency = idempotency;
    let sync_timeout = if execution == Execution::Sync {
        let ceiling = state.config.sync_ceiling;
        let timeout = match job.timeout {
            Some(asked) if asked > ceiling => {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "sync_ceiling",
                    format!(
                        "timeout_ms {} is over the sync ceiling of {} ms: a sync call must end within it. \
                         Send \"execution\": \"async\" to queue a longer job and poll GET /v1/jobs/{{id}}",
                        asked.as_millis(),
                        ceiling.as_millis()
                    ),
                ));
            }
            Some(asked) => asked,
            None => Duration::from_millis(ceilings.default_timeout_ms).min(ceiling),
        };
        // The deadline covers the queue wait and the run: the answer is
        // always the job's own outcome.
        job.timeout = Some(timeout);
        job.deadline = Some(timeout);
        Some(timeout)
    } else {
        None
    };
    let (id, replayed) = state.runtime.submit_once(job).await?;
    let mark = |mut response: Response| {
        if replayed {
            response.headers_mut().insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
        }
        response
    };
    let Some(timeout) = sync_timeout else {
        return Ok(mark((StatusCode::ACCEPTED, Json(Accepted { status: "accepted", job_id: id })).into_response()));
    };
    // A client that disconnects drops this future: the job goes on, and the
    // wait is counted as abandoned.
    let abandoned = AbandonedWait { runtime: &state.runtime, armed: true };
    let waited = state.runtime.wait_past_deadline(id, timeout).await;
    abandoned.disarm();
    let mut job = waited.map_err(|e| match e {
        RuntimeError::WaitTimeout(_) => ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            "sync_deadline",
            format!(
                "job {id} had not ended shortly after its deadline (its worker may have stopped); \
                 it cannot start again: GET /v1/jobs/{id} shows how it ends"
            ),
        ),
        other => other.into(),
    })?;
    let output = job.output.take();
    Ok(mark(Json(Finished::new(JobView::from(job), output.as_deref())).into_response()))
}

/// Counts a sync wait whose client went away before the answer.
struct AbandonedWait<'a> {
    runtime: &'a Runtime,
    armed: bool,
}

impl AbandonedWait<'_> {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for AbandonedWait<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.runtime.count_abandoned_wait();
        }
    }
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
async fn job_show(State(state): State<Arc<AppState>>, ParsedPath(id): ParsedPath<JobId>) -> Result<Response, ApiError> {
    let job = state.runtime.get(id).await?;
    Ok(Json(JobView::from(job)).into_response())
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    /// Only jobs in this state.
    #[param(value_type = Option<JobStatus>)]
    status: Option<String>,
    /// Only jobs of this plugin: a digest, a name or `name@version`.
    #[param(pattern = "^((sha256:)?[0-9a-f]{64}|[a-z0-9][a-z0-9_-]{0,63}(@[A-Za-z0-9._+-]{1,64})?)$")]
    plugin: Option<String>,
    /// Only jobs of this plan.
    plan: Option<String>,
    /// Only jobs with this concurrency key.
    concurrency_key: Option<String>,
    /// Only jobs older than this one (the previous page's `next_before`).
    #[param(value_type = Option<JobId>)]
    before: Option<String>,
    /// Jobs per page (default 50).
    #[param(minimum = 1, maximum = 500)]
    limit: Option<u32>,
}

/// Jobs, newest first, filtered and paged.
#[utoipa::path(get, path = "/v1/jobs", tag = "jobs",
    params(ListQuery),
    responses(
        (status = 200, body = JobPage),
        (status = 400, description = "Refused: the message names the field or limit", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
    ))]
async fn job_list(
    State(state): State<Arc<AppState>>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(query_error)?;
    let limit = query.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::bad_request(format!("`limit` must be between 1 and {MAX_PAGE}")));
    }
    let params = JobListParams {
        status: query.status.as_deref().map(str::parse::<JobStatus>).transpose().map_err(ApiError::bad_request)?,
        plugin: query.plugin.as_deref().map(str::parse).transpose().map_err(ApiError::bad_request)?,
        plan_id: query.plan,
        concurrency_key: query.concurrency_key,
        before: query.before.as_deref().map(parse_id).transpose()?,
        limit,
    };
    let jobs = state.runtime.list(params).await?;
    let next = (jobs.len() == limit as usize).then(|| jobs.last().map(|j| j.id)).flatten();
    let jobs: Vec<JobView> = jobs.into_iter().map(JobView::from).collect();
    Ok(Json(JobPage { jobs, next_before: next }).into_response())
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
async fn job_logs(State(state): State<Arc<AppState>>, ParsedPath(id): ParsedPath<JobId>) -> Result<Response, ApiError> {
    Ok(Json(state.runtime.logs(id).await?).into_response())
}

/// A succeeded job's output bytes.
#[utoipa::path(get, path = "/v1/jobs/{id}/output", tag = "jobs",
    params(("id" = JobId, Path)),
    responses(
        (status = 200, content_type = "application/octet-stream", body = Vec<u8>),
        (status = 400, description = "Refused: the message names the field or limit", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 404, description = "No such job", body = ErrorBody),
        (status = 409, description = "The job did not succeed", body = ErrorBody),
    ))]
async fn job_output(
    State(state): State<Arc<AppState>>,
    ParsedPath(id): ParsedPath<JobId>,
) -> Result<Response, ApiError> {
    let job = state.runtime.get(id).await?;
    match job.output {
        Some(output) => {
            let mut headers = HeaderMap::new();
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
            Ok((headers, output).into_response())
        }
        None => Err(ApiError::new(
            StatusCode::CONFLICT,
            "no_output",
            format!("job {} is {}: only a succeeded job has output", job.id, job.status),
        )),
    }
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
async fn job_cancel(
    State(state): State<Arc<AppState>>,
    ParsedPath(id): ParsedPath<JobId>,
) -> Result<Response, ApiError> {
    let status = state.runtime.cancel(id).await?;
    let code = match status {
        Cancelled::Cancelled => StatusCode::OK,
        Cancelled::Requested => StatusCode::ACCEPTED,
    };
    Ok((code, Json(CancelAnswer { job_id: id, status })).into_response())
}

/// This process's worker, the queue by state, and the ceilings.
#[utoipa::path(get, path = "/v1/health", tag = "health",
    responses(
        (status = 200, body = HealthReport),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
    ))]
async fn health(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let health = state.runtime.health().await?;
    Ok(Json(HealthReport { health, ceilings: state.runtime.ceilings() }).into_response())
}

/// Every worker sharing the database (with seed 000's summary line), the
/// jobs each holds, and the queue depth, from one read.
#[utoipa::path(get, path = "/v1/workers", tag = "health",
    responses(
        (status = 200, body = crate::runtime::Workers),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
    ))]
async fn workers(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    Ok(Json(state.runtime.workers().await?).into_response())
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A store closed under a request (the server is stopping) is a 503 the
    /// client retries, not a 500: nothing was stored.
    #[test]
    fn a_closed_store_answers_503_shutting_down_with_retry_after() {
        let response = ApiError::from(RuntimeError::Store(crate::store::StoreError::Closed)).into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers().get(header::RETRY_AFTER).unwrap(), "1");
        let error = ApiError::from(RuntimeError::Store(crate::store::StoreError::Closed));
        assert_eq!(error.kind, "shutting_down");
    }
}
