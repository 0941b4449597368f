//! The SQLite store's [`StandingRules`], and the writes a decision makes
//! on rules (see `jobs.rs`'s `job_decide`).

use rusqlite::{Connection, OptionalExtension, params};

use super::SqliteStore;
use super::rows::db_err;
use crate::job::ApprovalRule;
use crate::store::rules::approval::{RULE_COLUMNS, RuleRow, rule_of, rule_revoked};
use crate::store::rules::codec::{i64_of, to_json};
use crate::store::{RuleListParams, RuleRevokeParams, StandingRules, StoreError};

type StoredRule = (String, Option<i64>, Option<String>, i64);

fn stored(r: &rusqlite::Row<'_>) -> rusqlite::Result<StoredRule> {
    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
}

fn rule((json, revoked_at, revoked_by, uses): StoredRule) -> Result<ApprovalRule, StoreError> {
    rule_of(&json, revoked_at, revoked_by, uses)
}

/// The rule `id` as a decision it makes reads it, in that decision's write.
pub(super) fn rule_row(conn: &Connection, id: &str) -> Result<Option<RuleRow>, StoreError> {
    conn.prepare_cached(
        "SELECT r.author, r.expires_at, r.revoked_at, p.roles FROM approval_rules r \
         LEFT JOIN principals p ON p.name = r.author WHERE r.rule_id = ?1",
    )
    .and_then(|mut s| {
        s.query_row(params![id], |r| {
            Ok(RuleRow { author: r.get(0)?, expires_at: r.get(1)?, revoked_at: r.get(2)?, author_roles: r.get(3)? })
        })
        .optional()
    })
    .map_err(db_err("reading an approval rule"))
}

/// Count one more job approved by rule `id`.
pub(super) fn rule_used(conn: &Connection, id: &str) -> Result<(), StoreError> {
    conn.execute("UPDATE approval_rules SET uses = uses + 1 WHERE rule_id = ?1", params![id])
        .map(|_| ())
        .map_err(db_err("counting a rule's use"))
}

/// Store a rule just made. Its audit row is the caller's to append.
pub(super) fn rule_insert(conn: &Connection, made: &ApprovalRule) -> Result<(), StoreError> {
    conn.execute(
        "INSERT INTO approval_rules (rule_id, author, plugin_digest, target, created_at, expires_at, uses, rule_json) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![
            made.id,
            made.author,
            made.plugin.to_string(),
            made.target.to_string(),
            made.created_at.unix_ms(),
            made.expires_at.unix_ms(),
            i64_of(made.uses),
            to_json(made)?
        ],
    )
    .map(|_| ())
    .map_err(db_err("storing an approval rule"))
}

/// One rule by id.
fn get(conn: &Connection, id: &str) -> Result<Option<ApprovalRule>, StoreError> {
    let row = conn
        .prepare_cached(&format!("SELECT {RULE_COLUMNS} FROM approval_rules WHERE rule_id = ?1"))
        .and_then(|mut s| s.query_row(params![id], stored).optional())
        .map_err(db_err("reading an approval rule"))?;
    row.map(rule).transpose()
}

#[async_trait::async_trait]
impl StandingRules for SqliteStore {
    async fn rule_get(&self, id: String) -> Result<Option<ApprovalRule>, StoreError> {
        self.read(move |conn| get(conn, &id)).await
    }

    async fn rule_list(&self, params: RuleListParams) -> Result<Vec<ApprovalRule>, StoreError> {
        self.read(move |conn| {
            let mut sql = format!("SELECT {RULE_COLUMNS} FROM approval_rules WHERE 1 = 1");
            let mut args: Vec<rusqlite::types::Value> = Vec::new();
            let mut filter = |condition: &str, value: rusqlite::types::Value| {
                args.push(value);
                sql.push_str(&format!(" AND {condition} ?{}", args.len()));
            };
            if let Some(plugin) = params.plugin {
                filter("plugin_digest =", plugin.to_string().into());
            }
            if let Some(target) = &params.target {
                filter("target =", target.to_string().into());
            }
            if let Some(author) = params.author {
                filter("author =", author.into());
            }
            if let Some(at) = params.active_at {
                filter("revoked_at IS NULL AND expires_at >", at.unix_ms().into());
            }
            sql.push_str(&format!(" ORDER BY created_at DESC, rule_id DESC LIMIT {}", params.limit.max(1)));
            let rows: Vec<StoredRule> = conn
                .prepare(&sql)
                .and_then(|mut s| s.query_map(rusqlite::params_from_iter(args), stored)?.collect())
                .map_err(db_err("listing approval rules"))?;
            rows.into_iter().map(rule).collect()
        })
        .await
    }

    async fn rule_revoke(&self, params: RuleRevokeParams) -> Result<Option<ApprovalRule>, StoreError> {
        self.write_all_or_nothing(move |conn| {
            let err = db_err("revoking an approval rule");
            let n = conn
                .execute(
                    "UPDATE approval_rules SET revoked_at = ?2, revoked_by = ?3 WHERE rule_id = ?1 AND revoked_at IS NULL",
                    params![params.id, params.now.unix_ms(), params.actor],
                )
                .map_err(&err)?;
            if n == 1 {
                super::audit::append(conn, &rule_revoked(&params.id, params.actor.clone()), params.now)?;
            }
            get(conn, &params.id)
        })
        .await
    }
}
