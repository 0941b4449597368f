//! The PostgreSQL store's [`Plans`]: a plan's record beside its
//! execute job.

use deadpool_postgres::GenericClient;

use super::PostgresStore;
use super::inserts::{InsertColumns, idempotency_conflict, insert_rows};
use super::rows::{db_err, row_to_plan};
use crate::clock::Timestamp;
use crate::job::millis;
use crate::job::{Job, JobId, NewJob, PlanRecord, Proposal};

use crate::store::rules::audit::{note, submit_note};
use crate::store::sql::PLAN_COLUMNS;
use crate::store::{PlanInsertParams, PlanListParams, Plans, StoreError};

#[async_trait::async_trait]
impl Plans for PostgresStore {
    async fn plan_proposals(&self, execute_job: JobId) -> Result<Vec<Proposal>, StoreError> {
        self.proposals_of(execute_job).await
    }

    async fn plan_insert(&self, params: PlanInsertParams) -> Result<(PlanRecord, Job), StoreError> {
        params.execute.check().map_err(StoreError::Invalid)?;
        let err = db_err("creating a plan");
        let mut client = self.client("creating a plan").await?;
        // Checked before and, if the insert fails, after: a concurrent
        // request may take the key in between (the job's input is copied
        // only when there is a key to check).
        let keyed: Vec<NewJob> =
            params.execute.idempotency.is_some().then(|| params.execute.clone()).into_iter().collect();
        if let Some(taken) = idempotency_conflict(&client, &keyed).await? {
            return Err(taken);
        }
        let tx = client.transaction().await.map_err(&err)?;
        let (queue_ttl, approval_ttl) = (params.execute.queue_ttl, params.execute.approval_ttl);
        let mut columns = InsertColumns::default();
        columns.push(params.execute, JobId::new(params.now), params.now)?;
        let execute = match insert_rows(&tx, &columns, params.now).await {
            Ok(mut rows) => rows.remove(0),
            Err(e) => {
                drop(tx);
                return Err(idempotency_conflict(&client, &keyed).await?.unwrap_or(e));
            }
        };
        tx.execute(
            &format!("INSERT INTO plans ({PLAN_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, NULL, NULL)"),
            &[
                &params.plan_id,
                &params.apply_mode.as_str(),
                &params.input,
                &millis::column(queue_ttl),
                &millis::column(approval_ttl),
                &params.now.unix_ms(),
                &execute.id.to_string(),
            ],
        )
        .await
        .map_err(&err)?;
        if let Some(note) = submit_note(&execute) {
            super::audit::append(&tx, &note, params.now).await?;
        }
        tx.commit().await.map_err(&err)?;
        self.inserted(std::slice::from_ref(&execute));
        let record = PlanRecord {
            plan_id: params.plan_id,
            apply_mode: params.apply_mode,
            input: params.input,
            created_at: params.now,
            execute_job: execute.id,
            apply_job: None,
            cancelled_at: None,
        };
        Ok((record, execute))
    }

    async fn plan_get(&self, plan_id: String) -> Result<Option<PlanRecord>, StoreError> {
        let sql = format!("SELECT {PLAN_COLUMNS} FROM plans WHERE plan_id = $1");
        let rows = self.read("reading a plan", &sql, &[&plan_id]).await?;
        rows.first().map(|r| row_to_plan(r).map(|p| p.record)).transpose()
    }

    async fn plan_list(&self, params: PlanListParams) -> Result<Vec<PlanRecord>, StoreError> {
        let sql = format!(
            "SELECT {PLAN_COLUMNS} FROM plans WHERE ($1::text IS NULL OR plan_id < $1) AND ($3::text IS NULL OR \
             execute_job_id IN (SELECT job_id FROM jobs WHERE submitted_by = $3)) ORDER BY plan_id DESC LIMIT $2"
        );
        let limit = i64::from(params.limit.max(1));
        let rows = self.read("listing plans", &sql, &[&params.before, &limit, &params.submitted_by]).await?;
        rows.iter().map(|r| row_to_plan(r).map(|p| p.record)).collect()
    }

    async fn plan_cancel(
        &self,
        plan_id: String,
        now: Timestamp,
        actor: Option<String>,
    ) -> Result<Option<PlanRecord>, StoreError> {
        let err = db_err("cancelling a plan");
        let mut client = self.client("cancelling a plan").await?;
        let tx = client.transaction().await.map_err(&err)?;
        let cancelled = tx
            .execute(
                "UPDATE plans SET cancelled_at = $2 WHERE plan_id = $1 AND cancelled_at IS NULL",
                &[&plan_id, &now.unix_ms()],
            )
            .await
            .map_err(&err)?;
        if cancelled == 1 && actor.is_some() {
            super::audit::append(&tx, &note(actor, "plan.cancel", plan_id.clone(), serde_json::json!({})), now).await?;
        }
        let rows = tx
            .query(&format!("SELECT {PLAN_COLUMNS} FROM plans WHERE plan_id = $1"), &[&plan_id])
            .await
            .map_err(&err)?;
        tx.commit().await.map_err(&err)?;
        rows.first().map(|r| row_to_plan(r).map(|p| p.record)).transpose()
    }
}
