//! The PostgreSQL store's [`StandingRules`], and the writes a decision
//! makes on rules (see `jobs.rs`'s `job_decide`).

use deadpool_postgres::GenericClient;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use super::PostgresStore;
use super::rows::db_err;
use crate::job::ApprovalRule;
use crate::store::rules::approval::{RULE_COLUMNS, RuleRow, rule_of, rule_revoked};
use crate::store::rules::codec::{i64_of, to_json};
use crate::store::{RuleListParams, RuleRevokeParams, StandingRules, StoreError};

fn rule(r: &Row) -> Result<ApprovalRule, StoreError> {
    rule_of(r.get::<_, &str>(0), r.get(1), r.get(2), r.get(3))
}

/// One rule by id (`$1`).
fn by_id() -> String {
    format!("SELECT {RULE_COLUMNS} FROM approval_rules WHERE rule_id = $1")
}

/// The rule `id` as a decision it makes reads it, in that decision's
/// transaction: its row locked, so a revocation waits for the decision or
/// the decision reads the revocation; its author's row shared, so a change
/// of roles does the same.
pub(super) async fn rule_row(client: &impl GenericClient, id: &str) -> Result<Option<RuleRow>, StoreError> {
    let err = db_err("reading an approval rule");
    let Some(row) = client
        .query_opt("SELECT author, expires_at, revoked_at FROM approval_rules WHERE rule_id = $1 FOR UPDATE", &[&id])
        .await
        .map_err(&err)?
    else {
        return Ok(None);
    };
    let author: String = row.get(0);
    let roles = client
        .query_opt("SELECT roles FROM principals WHERE name = $1 FOR SHARE", &[&author])
        .await
        .map_err(&err)?
        .map(|r| r.get::<_, String>(0));
    Ok(Some(RuleRow { author, expires_at: row.get(1), revoked_at: row.get(2), author_roles: roles }))
}

/// Count one more job approved by rule `id` (its row is locked already).
pub(super) async fn rule_used(client: &impl GenericClient, id: &str) -> Result<(), StoreError> {
    client
        .execute("UPDATE approval_rules SET uses = uses + 1 WHERE rule_id = $1", &[&id])
        .await
        .map(|_| ())
        .map_err(db_err("counting a rule's use"))
}

/// Store a rule just made. Its audit row is the caller's to append.
pub(super) async fn rule_insert(client: &impl GenericClient, made: &ApprovalRule) -> Result<(), StoreError> {
    client
        .execute(
            "INSERT INTO approval_rules (rule_id, author, plugin_digest, target, created_at, expires_at, uses, \
             rule_json) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            &[
                &made.id,
                &made.author,
                &made.plugin.to_string(),
                &made.target.to_string(),
                &made.created_at.unix_ms(),
                &made.expires_at.unix_ms(),
                &i64_of(made.uses),
                &to_json(made)?,
            ],
        )
        .await
        .map(|_| ())
        .map_err(db_err("storing an approval rule"))
}

#[async_trait::async_trait]
impl StandingRules for PostgresStore {
    async fn rule_get(&self, id: String) -> Result<Option<ApprovalRule>, StoreError> {
        let rows = self.read("reading an approval rule", &by_id(), &[&id]).await?;
        rows.first().map(rule).transpose()
    }

    async fn rule_list(&self, params: RuleListParams) -> Result<Vec<ApprovalRule>, StoreError> {
        let mut sql = format!("SELECT {RULE_COLUMNS} FROM approval_rules WHERE TRUE");
        let plugin = params.plugin.map(|p| p.to_string());
        let target = params.target.as_ref().map(|t| t.to_string());
        let active_at = params.active_at.map(|t| t.unix_ms());
        let filters: [(&str, Option<&(dyn ToSql + Sync)>); 4] = [
            ("plugin_digest =", plugin.as_ref().map(|v| v as _)),
            ("target =", target.as_ref().map(|v| v as _)),
            ("author =", params.author.as_ref().map(|v| v as _)),
            ("revoked_at IS NULL AND expires_at >", active_at.as_ref().map(|v| v as _)),
        ];
        let mut args: Vec<&(dyn ToSql + Sync)> = Vec::new();
        for (condition, value) in filters {
            if let Some(value) = value {
                args.push(value);
                sql.push_str(&format!(" AND {condition} ${}", args.len()));
            }
        }
        sql.push_str(&format!(" ORDER BY created_at DESC, rule_id DESC LIMIT {}", params.limit.max(1)));
        let rows = self.read("listing approval rules", &sql, &args).await?;
        rows.iter().map(rule).collect()
    }

    async fn rule_revoke(&self, params: RuleRevokeParams) -> Result<Option<ApprovalRule>, StoreError> {
        let err = db_err("revoking an approval rule");
        let mut client = self.client("revoking an approval rule").await?;
        let tx = client.transaction().await.map_err(&err)?;
        let n = tx
            .execute(
                "UPDATE approval_rules SET revoked_at = $2, revoked_by = $3 WHERE rule_id = $1 AND revoked_at IS NULL",
                &[&params.id, &params.now.unix_ms(), &params.actor],
            )
            .await
            .map_err(&err)?;
        if n == 1 {
            super::audit::append(&tx, &rule_revoked(&params.id, params.actor.clone()), params.now).await?;
        }
        let row = tx.query_opt(&by_id(), &[&params.id]).await.map_err(&err)?;
        tx.commit().await.map_err(&err)?;
        row.as_ref().map(rule).transpose()
    }
}
