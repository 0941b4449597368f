//! `/v1/health` and `/v1/workers`.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};

use crate::api::AppState;
use crate::api::error::{ApiError, ErrorBody};
use crate::api::types::HealthReport;

/// This process's worker, the queue by state, and the ceilings.
#[utoipa::path(get, path = "/v1/health", tag = "health",
    responses(
        (status = 200, body = HealthReport),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
    ))]
pub(super) async fn health(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let health = state.runtime.health().await?;
    Ok(Json(HealthReport { health, ceilings: state.runtime.ceilings() }).into_response())
}

/// Every worker sharing the database (with a summary line), the
/// jobs each holds, and the queue depth, from one read.
#[utoipa::path(get, path = "/v1/workers", tag = "health",
    responses(
        (status = 200, body = crate::runtime::Workers),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
    ))]
pub(super) async fn workers(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    Ok(Json(state.runtime.workers().await?).into_response())
}
