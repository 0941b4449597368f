//! Error answers: a status and `{"error": {"kind", "message"}}`, and how
//! each refusal of a body, query or path becomes one.

use axum::Json;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use crate::runtime::RuntimeError;

/// An error answer: a status and `{"error": {"kind", "message"}}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
    retry_after: Option<u64>,
}

impl ApiError {
    pub(super) fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, kind, message: message.into(), retry_after: None }
    }

    /// The same refusal, its message prefixed with where it happened
    /// (`jobs[3]: …`).
    pub(super) fn within(self, place: &str) -> Self {
        ApiError { message: format!("{place}: {}", self.message), ..self }
    }

    pub(super) fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }
}

/// Every error answer: `{"error": {"kind", "message"}}`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// What went wrong.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    /// Machine-readable: `invalid_request`, `invalid_job`, `not_found`, …
    pub kind: String,
    /// For people; names the field or limit at fault.
    pub message: String,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Json(ErrorBody { error: ErrorDetail { kind: self.kind.to_owned(), message: self.message } });
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
            RuntimeError::InvalidSchedule(_) => ApiError::new(StatusCode::BAD_REQUEST, "invalid_schedule", message),
            RuntimeError::UnknownSchedule(_) => ApiError::new(StatusCode::NOT_FOUND, "not_found", message),
            RuntimeError::InvalidRateLimit(_) => ApiError::new(StatusCode::BAD_REQUEST, "invalid_rate_limit", message),
            RuntimeError::UnknownRateLimit(_) => ApiError::new(StatusCode::NOT_FOUND, "not_found", message),
            RuntimeError::Store(crate::store::StoreError::NameTaken(_)) => {
                ApiError::new(StatusCode::CONFLICT, "name_taken", message)
            }
            RuntimeError::InvalidGrant(_) => ApiError::new(StatusCode::BAD_REQUEST, "invalid_grant", message),
            RuntimeError::InvalidAccess(_) => ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", message),
            RuntimeError::UnknownPrincipal(_) => ApiError::new(StatusCode::NOT_FOUND, "not_found", message),
            RuntimeError::NotFound(_) | RuntimeError::UnknownPlan(_) | RuntimeError::UnknownRule(_) => {
                ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
            }
            RuntimeError::AlreadyTerminal { .. } => ApiError::new(StatusCode::CONFLICT, "already_terminal", message),
            RuntimeError::NotRetryable(_) => ApiError::new(StatusCode::CONFLICT, "not_retryable", message),
            RuntimeError::PlanChanged { .. } => ApiError::new(StatusCode::CONFLICT, "plan_changed", message),
            RuntimeError::Undecidable { code, .. } => ApiError::new(StatusCode::CONFLICT, code, message),
            RuntimeError::DecisionForbidden { code, .. } => ApiError::new(StatusCode::FORBIDDEN, code, message),
            RuntimeError::ApprovalRequired { .. } => ApiError::new(StatusCode::FORBIDDEN, "approval_required", message),
            RuntimeError::IdempotencyConflict { .. } => {
                ApiError::new(StatusCode::CONFLICT, "idempotency_conflict", message)
            }
            // The job's own status and code, its place in the message.
            RuntimeError::InBatch { error, .. } => ApiError { message, ..ApiError::from(*error) },
            RuntimeError::ReplayIncomplete { .. } => ApiError::new(StatusCode::CONFLICT, "replay_incomplete", message),
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

pub(super) fn body_error(e: BytesRejection) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", "the request body is over the size cap")
    } else {
        ApiError::new(e.status(), "invalid_request", e.body_text())
    }
}

pub(super) fn query_error(e: QueryRejection) -> ApiError {
    ApiError::bad_request(e.body_text())
}

/// A path segment that is not valid percent-encoded UTF-8 (`/v1/jobs/%FF`).
pub(super) fn path_error(e: PathRejection) -> ApiError {
    ApiError::bad_request(format!("the path is not valid: {}", e.body_text()))
}

/// Parse a JSON body, naming the field a wrong value sits in:
/// `plugin: invalid type: integer 123, expected a string`.
pub(super) fn parse_body<T: serde::de::DeserializeOwned>(body: &[u8], what: &str) -> Result<T, ApiError> {
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
