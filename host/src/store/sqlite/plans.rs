//! The SQLite store's [`Plans`]: a plan's record beside its
//! execute job.

use rusqlite::params;

use super::SqliteStore;
use super::jobs::insert_rows;
use super::rows::{db_err, query_plans};
use crate::clock::Timestamp;
use crate::job::millis;
use crate::job::{Job, JobId, PlanRecord, Proposal};

use crate::store::rules::audit::{note, submit_note};
use crate::store::sql::PLAN_COLUMNS;
use crate::store::{PlanInsertParams, PlanListParams, Plans, StoreError};

#[async_trait::async_trait]
impl Plans for SqliteStore {
    async fn plan_proposals(&self, execute_job: JobId) -> Result<Vec<Proposal>, StoreError> {
        self.read(move |conn| super::proposals::read(conn, execute_job)).await
    }

    async fn plan_insert(&self, params: PlanInsertParams) -> Result<(PlanRecord, Job), StoreError> {
        params.execute.check().map_err(StoreError::Invalid)?;
        self.write_all_or_nothing(move |conn| {
            let err = db_err("creating a plan");
            let (queue_ttl, approval_ttl) = (params.execute.queue_ttl, params.execute.approval_ttl);
            let execute = insert_rows(conn, vec![params.execute], params.now)?.remove(0);
            conn.prepare_cached(&format!(
                "INSERT INTO plans ({PLAN_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, NULL, NULL)"
            ))
            .and_then(|mut s| {
                s.execute(params![
                    params.plan_id,
                    params.apply_mode.as_str(),
                    params.input,
                    millis::column(queue_ttl),
                    millis::column(approval_ttl),
                    params.now.unix_ms(),
                    execute.id.to_string()
                ])
            })
            .map_err(&err)?;
            let record = PlanRecord {
                plan_id: params.plan_id,
                apply_mode: params.apply_mode,
                input: params.input,
                created_at: params.now,
                execute_job: execute.id,
                apply_job: None,
                cancelled_at: None,
            };
            if let Some(note) = submit_note(&execute) {
                super::audit::append(conn, &note, params.now)?;
            }
            Ok((record, execute))
        })
        .await
    }

    async fn plan_get(&self, plan_id: String) -> Result<Option<PlanRecord>, StoreError> {
        self.read(move |conn| {
            let sql = format!("SELECT {PLAN_COLUMNS} FROM plans WHERE plan_id = ?1");
            Ok(query_plans(conn, &sql, params![plan_id])?.pop().map(|p| p.record))
        })
        .await
    }

    async fn plan_list(&self, params: PlanListParams) -> Result<Vec<PlanRecord>, StoreError> {
        self.read(move |conn| {
            let sql = format!(
                "SELECT {PLAN_COLUMNS} FROM plans WHERE (?1 IS NULL OR plan_id < ?1) AND (?3 IS NULL OR \
                 execute_job_id IN (SELECT job_id FROM jobs WHERE submitted_by = ?3)) ORDER BY plan_id DESC LIMIT ?2"
            );
            Ok(query_plans(conn, &sql, params![params.before, params.limit.max(1), params.submitted_by])?
                .into_iter()
                .map(|p| p.record)
                .collect())
        })
        .await
    }

    async fn plan_cancel(
        &self,
        plan_id: String,
        now: Timestamp,
        actor: Option<String>,
    ) -> Result<Option<PlanRecord>, StoreError> {
        self.write_all_or_nothing(move |conn| {
            let cancelled = conn
                .prepare_cached("UPDATE plans SET cancelled_at = ?2 WHERE plan_id = ?1 AND cancelled_at IS NULL")
                .and_then(|mut s| s.execute(params![plan_id, now.unix_ms()]))
                .map_err(db_err("cancelling a plan"))?;
            if cancelled == 1 && actor.is_some() {
                super::audit::append(conn, &note(actor, "plan.cancel", plan_id.clone(), serde_json::json!({})), now)?;
            }
            let sql = format!("SELECT {PLAN_COLUMNS} FROM plans WHERE plan_id = ?1");
            Ok(query_plans(conn, &sql, params![plan_id])?.pop().map(|p| p.record))
        })
        .await
    }
}
