//! The PostgreSQL store's [`Sweeps`]: reclaiming expired leases
//! and dead workers' jobs, expiring queued jobs, advancing plans, retention.

use std::sync::LazyLock;

use deadpool_postgres::GenericClient;

use super::fate::{apply_fate, attempt_effects, counters_of};
use super::inserts::{InsertColumns, insert_rows};
use super::rows::{db_err, job_columns, row_to_plan, rows_to_jobs};
use super::{BATCH, PostgresStore};
use crate::clock::Timestamp;
use crate::job::{ApprovalPolicy, Job, JobId};
use crate::store::rules::codec::{corrupt, policy_of};
use crate::store::rules::plan::apply_job;
use crate::store::rules::unfinished::{self, Death, Decision, Fate};
use crate::store::sql::{
    COUNTER_COLUMNS, DELETE_EMPTY_PLANS, NOT_HELD_BY_A_PLAN, PLAN_COLUMNS, SILENT_WORKER, expiry_message_case,
};
use crate::store::{
    JobsDeleteParams, JobsExpireParams, LeaseReclaimParams, PlansAdvanceParams, ReclaimReport, StoreError, Sweeps,
    WorkerDiedParams,
};

#[async_trait::async_trait]
impl Sweeps for PostgresStore {
    async fn lease_reclaim_expired(&self, params: LeaseReclaimParams) -> Result<ReclaimReport, StoreError> {
        let now = params.now.unix_ms();
        let err = db_err("reclaiming leases");
        let mut report = ReclaimReport::default();
        let sql = format!(
            "SELECT {COUNTER_COLUMNS}, {SILENT_WORKER} FROM jobs j LEFT JOIN workers w ON w.worker_id = j.worker_id \
             WHERE j.status = 'running' AND j.lease_expires_at <= $1 \
             ORDER BY j.job_id LIMIT $2 FOR UPDATE OF j SKIP LOCKED"
        );
        loop {
            let mut client = self.client("reclaiming leases").await?;
            let tx = client.transaction().await.map_err(&err)?;
            // Rows another replica's sweep holds are its to reclaim: a
            // lost lease is counted once. A row an effect's intent is
            // being recorded against is locked too (see `effect_begin`):
            // it is reclaimed at the next sweep, with that intent counted.
            let expired = tx.query(&sql, &[&now, &BATCH]).await.map_err(&err)?;
            let mut requeued = false;
            for row in &expired {
                let (id, attempt, counters) = counters_of(row);
                // Read after the lock, in a statement of its own: it sees
                // every intent committed before the row was locked.
                let effects = attempt_effects(&tx, &id, attempt).await.map_err(&err)?;
                let decision = if row.get::<_, bool>(11) {
                    unfinished::died(&counters, effects.as_ref(), &Death::Silent, params.now)
                } else {
                    Decision { fate: unfinished::lost_lease(&counters, effects.as_ref(), params.now), died: false }
                };
                report.count(&decision.fate);
                requeued |= matches!(decision.fate, Fate::Requeue { .. });
                apply_fate(&tx, &id, &decision, params.queue_ttl, params.now).await.map_err(&err)?;
            }
            tx.commit().await.map_err(&err)?;
            if requeued {
                self.wake();
            }
            if (expired.len() as i64) < BATCH {
                return Ok(report);
            }
        }
    }

    async fn worker_died(&self, params: WorkerDiedParams) -> Result<ReclaimReport, StoreError> {
        let err = db_err("reclaiming a dead worker's jobs");
        let sql = format!("SELECT {COUNTER_COLUMNS} FROM jobs WHERE status = 'running' AND worker_id = $1 FOR UPDATE");
        let mut client = self.client("reclaiming a dead worker's jobs").await?;
        let tx = client.transaction().await.map_err(&err)?;
        let held = tx.query(&sql, &[&params.worker_id]).await.map_err(&err)?;
        let death = Death::Seen { how: &params.how, stderr: &params.stderr };
        let mut report = ReclaimReport::default();
        for row in &held {
            let (id, attempt, counters) = counters_of(row);
            let effects = attempt_effects(&tx, &id, attempt).await.map_err(&err)?;
            let decision = unfinished::died(&counters, effects.as_ref(), &death, params.now);
            report.count(&decision.fate);
            apply_fate(&tx, &id, &decision, params.queue_ttl, params.now).await.map_err(&err)?;
        }
        tx.execute(
            "UPDATE workers SET state = 'stopped', running = 0, last_heartbeat = GREATEST(last_heartbeat, $2) \
             WHERE worker_id = $1",
            &[&params.worker_id, &params.now.unix_ms()],
        )
        .await
        .map_err(&err)?;
        tx.commit().await.map_err(&err)?;
        if report.requeued > 0 {
            self.wake();
        }
        Ok(report)
    }

    async fn jobs_expire_queued(&self, params: JobsExpireParams) -> Result<u64, StoreError> {
        static SQL: LazyLock<String> = LazyLock::new(|| {
            format!(
                "WITH due AS (SELECT job_id FROM jobs WHERE status IN ('queued', 'pending_approval', 'approved') \
                   AND expires_at <= $1 ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED) \
                 UPDATE jobs j SET status = 'failed', finished_at = $1, error_kind = 'expired', \
                   error_message = {} FROM due WHERE j.job_id = due.job_id",
                expiry_message_case("j", "$1")
            )
        });
        self.in_batches("expiring queued jobs", &SQL, params.now.unix_ms()).await
    }

    async fn jobs_delete_expired(&self, params: JobsDeleteParams) -> Result<u64, StoreError> {
        static SQL: LazyLock<String> = LazyLock::new(|| {
            format!(
                "DELETE FROM jobs WHERE job_id IN (SELECT job_id FROM jobs WHERE finished_at IS NOT NULL \
                   AND finished_at < $1 AND {NOT_HELD_BY_A_PLAN} ORDER BY finished_at LIMIT $2 FOR UPDATE SKIP LOCKED)"
            )
        });
        let n = self.in_batches("deleting old jobs", &SQL, params.finished_before.unix_ms()).await?;
        self.inner.freshness.changed(n, &self.inner.pool);
        self.execute("deleting old plans", DELETE_EMPTY_PLANS, &[]).await?;
        self.events_delete_before(params.events_before).await?;
        if let Some(before) = params.audit_before {
            self.audit_prune(before).await?;
        }
        Ok(n)
    }

    async fn plans_advance(&self, params: PlansAdvanceParams) -> Result<Vec<Job>, StoreError> {
        let err = db_err("advancing plans");
        let mut client = self.client("advancing plans").await?;
        let tx = client.transaction().await.map_err(&err)?;
        // Plans another replica is advancing are its to advance: each apply
        // job is created once.
        let sql = format!(
            "SELECT {PLAN_COLUMNS} FROM plans p WHERE apply_job_id IS NULL AND cancelled_at IS NULL \
             AND ($1::text IS NULL OR plan_id = $1) \
             AND EXISTS (SELECT 1 FROM jobs j WHERE j.job_id = p.execute_job_id AND j.status = 'succeeded') \
             ORDER BY plan_id LIMIT 100 FOR UPDATE SKIP LOCKED"
        );
        let due = tx.query(&sql, &[&params.plan_id]).await.map_err(&err)?;
        let one = format!("SELECT {} FROM jobs WHERE job_id = $1", job_columns(""));
        let mut created = Vec::with_capacity(due.len());
        for row in &due {
            let plan = row_to_plan(row)?;
            let execute = tx.query(&one, &[&plan.record.execute_job.to_string()]).await.map_err(&err)?;
            let execute = rows_to_jobs(&execute)?
                .pop()
                .ok_or_else(|| corrupt(&plan.record.plan_id, "its execute job is missing"))?;
            let policy = match &execute.plugin_name {
                Some(name) => {
                    let row = tx
                        .query_opt(
                            "SELECT approval_json FROM plugin_names WHERE name = $1 AND version = $2",
                            &[&name.name, &name.version],
                        )
                        .await
                        .map_err(&err)?;
                    policy_of(&plan.record.plan_id, row.and_then(|r| r.get(0)))?
                }
                None => ApprovalPolicy::default(),
            };
            let mut columns = InsertColumns::default();
            columns.push(apply_job(&plan, &execute, &policy), JobId::new(params.now), params.now)?;
            let apply = insert_rows(&tx, &columns, params.now).await?.remove(0);
            tx.execute(
                "UPDATE plans SET apply_job_id = $2 WHERE plan_id = $1 AND apply_job_id IS NULL",
                &[&plan.record.plan_id, &apply.id.to_string()],
            )
            .await
            .map_err(&err)?;
            created.push(apply);
        }
        tx.commit().await.map_err(&err)?;
        self.inserted(&created);
        Ok(created)
    }

    async fn workers_delete_stale(&self, last_heartbeat_before: Timestamp) -> Result<u64, StoreError> {
        self.execute(
            "deleting old workers",
            "DELETE FROM workers WHERE last_heartbeat < $1",
            &[&last_heartbeat_before.unix_ms()],
        )
        .await
    }
}
