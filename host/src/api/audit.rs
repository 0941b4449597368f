//! `GET /v1/audit` and `GET /v1/audit/head`: the audit trail, for
//! operators (and for `leash audit verify`, which checks the chain on the
//! client's side rather than trusting a server's word for it).

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use serde::{Deserialize, Serialize};

use crate::api::error::{ApiError, ErrorBody, query_error};
use crate::api::{AppState, DEFAULT_PAGE, MAX_PAGE};
use crate::store::{AuditHead, AuditListParams, AuditRecord};

/// Filters and paging of `GET /v1/audit`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct AuditQuery {
    /// Only rows after this sequence number (the previous page's `next_after`).
    after: Option<i64>,
    /// Only rows by this principal.
    principal: Option<String>,
    /// Only rows of this action (`job.approve`, `plugin.policy`, …).
    action: Option<String>,
    /// Only rows about this target (a job id, `name@version`, a plugin name, a principal).
    target: Option<String>,
    /// Rows per page (default 50, at most 500).
    limit: Option<u32>,
}

/// A page of the audit trail, oldest first.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AuditPage {
    /// The rows.
    pub rows: Vec<AuditRecord>,
    /// Send as `after` for the next page (absent: this was the last).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_after: Option<i64>,
}

/// The audit trail: who changed what (plugins, grants, policies,
/// principals, tokens), submitted, decided or cancelled, oldest first.
#[utoipa::path(get, path = "/v1/audit", tag = "access",
    params(AuditQuery),
    responses(
        (status = 200, body = AuditPage),
        (status = 400, description = "A bad filter", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 403, description = "`forbidden`: needs `operate`", body = ErrorBody),
    ))]
pub(super) async fn audit_list(
    State(state): State<Arc<AppState>>,
    query: Result<Query<AuditQuery>, QueryRejection>,
) -> Result<Json<AuditPage>, ApiError> {
    let Query(query) = query.map_err(query_error)?;
    let limit = query.limit.unwrap_or(DEFAULT_PAGE).clamp(1, MAX_PAGE);
    let params = AuditListParams {
        after: query.after,
        principal: query.principal,
        action: query.action,
        target: query.target,
        limit,
    };
    let rows = state.runtime.audit(params).await?;
    let next_after = (rows.len() == limit as usize).then(|| rows.last().map(|r| r.seq)).flatten();
    Ok(Json(AuditPage { rows, next_after }))
}

/// The audit trail's head: its last row's sequence number and hash.
#[utoipa::path(get, path = "/v1/audit/head", tag = "access",
    responses(
        (status = 200, body = AuditHead),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 403, description = "`forbidden`: needs `operate`", body = ErrorBody),
    ))]
pub(super) async fn audit_head(State(state): State<Arc<AppState>>) -> Result<Json<AuditHead>, ApiError> {
    Ok(Json(state.runtime.audit_head().await?))
}
