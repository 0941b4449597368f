//! `/v1/rules`: standing approval rules ("Allow & Remember"), made by an
//! approval that remembers (`POST /v1/jobs/{id}/approve` with `remember`),
//! listed, shown and revoked here by approvers.

use std::str::FromStr;
use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Extension, Query, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};

use crate::access::{Principal, Role};
use crate::api::error::{ApiError, ErrorBody, query_error};
use crate::api::{AppState, DEFAULT_PAGE, MAX_PAGE, ParsedPath};
use crate::job::{ApprovalRule, Digest};
use crate::store::RuleListParams;

/// Filters of `GET /v1/rules`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct RuleQuery {
    /// Only rules this principal made.
    author: Option<String>,
    /// Only rules approving these plugin bytes (`sha256:…`).
    plugin: Option<String>,
    /// Only rules that still approve (not revoked, not expired).
    active: Option<bool>,
    /// Most rules (default 50, at most 500), newest first.
    limit: Option<u32>,
}

/// Standing rules, newest first.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RuleList {
    /// The rules.
    pub rules: Vec<ApprovalRule>,
}

/// A rule's id from a path: `rule_` and 26 lowercase letters and digits.
pub(super) struct RuleIdInPath(String);

impl FromStr for RuleIdInPath {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.strip_prefix("rule_") {
            Some(rest) if rest.len() == 26 && rest.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()) => {
                Ok(RuleIdInPath(s.to_owned()))
            }
            _ => Err(format!("rule id {s:?}: `rule_` and 26 letters and digits, as `GET /v1/rules` lists them")),
        }
    }
}

/// Standing approval rules, newest first.
#[utoipa::path(get, path = "/v1/rules", tag = "jobs",
    params(RuleQuery),
    responses(
        (status = 200, body = RuleList),
        (status = 400, description = "A bad filter", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 403, description = "`forbidden`: needs `approve`", body = ErrorBody),
    ))]
pub(super) async fn rule_list(
    State(state): State<Arc<AppState>>,
    query: Result<Query<RuleQuery>, QueryRejection>,
) -> Result<Json<RuleList>, ApiError> {
    let Query(query) = query.map_err(query_error)?;
    let plugin = query.plugin.as_deref().map(str::parse::<Digest>).transpose();
    let plugin = plugin.map_err(|e| ApiError::bad_request(format!("plugin: {e}")))?;
    let params = RuleListParams {
        plugin,
        author: query.author,
        active_at: query.active.unwrap_or(false).then(|| state.runtime.now()),
        limit: query.limit.unwrap_or(DEFAULT_PAGE).clamp(1, MAX_PAGE),
        ..RuleListParams::default()
    };
    Ok(Json(RuleList { rules: state.runtime.rules(params).await? }))
}

/// One standing rule.
#[utoipa::path(get, path = "/v1/rules/{id}", tag = "jobs",
    params(("id" = String, Path)),
    responses(
        (status = 200, body = ApprovalRule),
        (status = 400, description = "A malformed id", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 403, description = "`forbidden`: needs `approve`", body = ErrorBody),
        (status = 404, description = "No such rule", body = ErrorBody),
    ))]
pub(super) async fn rule_show(
    State(state): State<Arc<AppState>>,
    ParsedPath(RuleIdInPath(id)): ParsedPath<RuleIdInPath>,
) -> Result<Json<ApprovalRule>, ApiError> {
    Ok(Json(state.runtime.rule(&id).await?))
}

/// Revoke a standing rule: it approves nothing from now on (the jobs it
/// approved stay approved). Its author or an admin may; revoking a
/// revoked rule changes nothing.
#[utoipa::path(post, path = "/v1/rules/{id}/revoke", tag = "jobs",
    params(("id" = String, Path)),
    responses(
        (status = 200, description = "The rule, revoked", body = ApprovalRule),
        (status = 400, description = "A malformed id", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 403, description = "`forbidden`: needs `approve`, and to be the rule's author or an admin",
            body = ErrorBody),
        (status = 404, description = "No such rule", body = ErrorBody),
    ))]
pub(super) async fn rule_revoke(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    ParsedPath(RuleIdInPath(id)): ParsedPath<RuleIdInPath>,
) -> Result<Json<ApprovalRule>, ApiError> {
    let rule = state.runtime.rule(&id).await?;
    if rule.author != principal.name && !principal.may(Role::Admin) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("rule {id} is {:?}'s: only its author or an admin may revoke it", rule.author),
        ));
    }
    Ok(Json(state.runtime.acting_as(&principal.name).rule_revoke(&id).await?))
}
