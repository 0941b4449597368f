//! The PostgreSQL store's [`Jobs`]: submitting (the inserts are in
//! [`inserts`](super::inserts)), reading, listing, cancels and decisions on gates.

use std::collections::HashMap;
use std::sync::LazyLock;

use deadpool_postgres::GenericClient;
use tokio_postgres::types::ToSql;

use super::PostgresStore;
use super::claim::{OLDEST_QUEUED_DUE_PARTS, QUEUED_COUNT_PARTS};
use super::inserts::{idempotency_conflict, insert_audited, insert_unsigned};
use super::rows::{count_jobs, db_err, job_columns, list_columns, row_to_job, rows_to_jobs};
use crate::clock::Timestamp;
use crate::job::{Approval, ApprovalRule, Attempt, Counts, Job, JobId, JobLogs, JobStatus, NewJob};
use crate::store::rules::approval::{self as gate, GatedRow};
use crate::store::rules::audit::{cancel_note, redrive_note};
use crate::store::rules::codec::{AttemptRow, corrupt, json_column, to_json};
use crate::store::sql::{EARLIER_ATTEMPTS, JOBS_AHEAD, REDRIVE, decision_update_sql, filter_sql, list_filters};
use crate::store::{
    CancelResult, DecideRefusal, JobDecideParams, JobInsertParams, JobListParams, JobRedriveParams, Jobs,
    RedriveResult, StoreError,
};

#[async_trait::async_trait]
impl Jobs for PostgresStore {
    async fn job_insert(&self, params: JobInsertParams) -> Result<Vec<Job>, StoreError> {
        for job in &params.jobs {
            job.check().map_err(StoreError::Invalid)?;
        }
        let mut client = self.client("inserting jobs").await?;
        if let Some(taken) = idempotency_conflict(&client, &params.jobs).await? {
            return Err(taken);
        }
        let keyed: Vec<NewJob> = params.jobs.iter().filter(|j| j.idempotency.is_some()).cloned().collect();
        let outcome = if params.jobs.iter().all(|j| j.submitted_by.is_none()) {
            insert_unsigned(&client, params.jobs, params.now).await
        } else {
            insert_signed(&mut client, params.jobs, params.now).await
        };
        let inserted = match outcome {
            Ok(inserted) => inserted,
            Err(e) => {
                // A concurrent insert took a key between the check and
                // this insert: report it as the check would have.
                if let Some(taken) = idempotency_conflict(&client, &keyed).await? {
                    return Err(taken);
                }
                return Err(e);
            }
        };
        self.inserted(&inserted);
        Ok(inserted)
    }

    async fn job_get(&self, id: JobId) -> Result<Option<Job>, StoreError> {
        static SQL: LazyLock<String> =
            LazyLock::new(|| format!("SELECT {} FROM jobs WHERE job_id = $1", job_columns("")));
        let rows = self.read("reading a job", &SQL, &[&id.to_string()]).await?;
        rows.first().map(row_to_job).transpose()
    }

    async fn jobs_by_idempotency_key(
        &self,
        keys: Vec<String>,
    ) -> Result<HashMap<String, (JobId, JobStatus)>, StoreError> {
        let rows = self
            .read(
                "reading jobs by idempotency key",
                "SELECT idempotency_key, job_id, status FROM jobs WHERE idempotency_key = ANY($1)",
                &[&keys],
            )
            .await?;
        let mut found = HashMap::with_capacity(rows.len());
        for row in rows {
            let (key, id, status): (String, String, String) = (row.get(0), row.get(1), row.get(2));
            let job: JobId = id.parse().map_err(|e: String| corrupt(&id, e))?;
            found.insert(key, (job, status.parse().map_err(|e: String| corrupt(&id, e))?));
        }
        Ok(found)
    }

    async fn job_cancel(&self, id: JobId, now: Timestamp, actor: Option<String>) -> Result<CancelResult, StoreError> {
        let err = db_err("cancelling a job");
        let mut client = self.client("cancelling a job").await?;
        let tx = client.transaction().await.map_err(&err)?;
        let id = id.to_string();
        let row = tx
            .query_opt("SELECT status, approval_json FROM jobs WHERE job_id = $1 FOR UPDATE", &[&id])
            .await
            .map_err(&err)?;
        let Some(row) = row else { return Ok(CancelResult::NotFound) };
        let status: String = row.get(0);
        let was: JobStatus = status.parse().map_err(|e: String| corrupt(&id, e))?;
        let result = match was {
            status @ (JobStatus::Queued | JobStatus::PendingApproval | JobStatus::Approved) => {
                let approval: Option<Approval> = json_column(&id, "approval", row.get(1))?;
                let (at, message) = gate::cancel_waiting(status, approval.as_ref(), now);
                tx.execute(
                    "UPDATE jobs SET status = 'cancelled', finished_at = $1, error_kind = 'cancelled', \
                     error_message = $3 WHERE job_id = $2",
                    &[&at.unix_ms(), &id, &message],
                )
                .await
                .map_err(&err)?;
                CancelResult::Cancelled
            }
            JobStatus::Running => {
                tx.execute("UPDATE jobs SET cancel_requested = TRUE WHERE job_id = $1", &[&id]).await.map_err(&err)?;
                CancelResult::Requested
            }
            terminal => CancelResult::AlreadyTerminal(terminal),
        };
        if let Some(note) = cancel_note(actor, &id, was, &result) {
            super::audit::append(&tx, &note, now).await?;
        }
        tx.commit().await.map_err(&err)?;
        Ok(result)
    }

    async fn job_redrive(&self, params: JobRedriveParams) -> Result<RedriveResult, StoreError> {
        let err = db_err("retrying a job");
        let mut client = self.client("retrying a job").await?;
        let tx = client.transaction().await.map_err(&err)?;
        let id = params.id.to_string();
        let row = tx
            .query_opt(
                "SELECT status, plan_id, approval_json IS NOT NULL FROM jobs WHERE job_id = $1 FOR UPDATE",
                &[&id],
            )
            .await
            .map_err(&err)?;
        let Some(row) = row else { return Ok(RedriveResult::NotFound) };
        let status: String = row.get(0);
        let was: JobStatus = status.parse().map_err(|e: String| corrupt(&id, e))?;
        let plan_id: Option<String> = row.get(1);
        if let Some(why) = crate::job::redrive_refusal(&id, was, plan_id.as_deref(), row.get(2)) {
            return Ok(RedriveResult::Refused(why));
        }
        let sql =
            REDRIVE.replace("{now}", "$1").replace("{expires}", "$2").replace("{id}", "$3").replace("{false}", "FALSE");
        let expires = params.now.plus(params.queue_ttl);
        tx.execute(&sql, &[&params.now.unix_ms(), &expires.unix_ms(), &id]).await.map_err(&err)?;
        if let Some(note) = redrive_note(params.actor, &id, was) {
            super::audit::append(&tx, &note, params.now).await?;
        }
        tx.commit().await.map_err(&err)?;
        Ok(RedriveResult::Queued)
    }

    async fn job_decide(&self, params: JobDecideParams) -> Result<Result<Job, DecideRefusal>, StoreError> {
        let err = db_err("deciding on a job");
        let mut client = self.client("deciding on a job").await?;
        let tx = client.transaction().await.map_err(&err)?;
        let id = params.id.to_string();
        // The row lock makes two decisions racing take turns: the second
        // reads what the first wrote and is refused.
        let row = tx
            .query_opt(
                "SELECT status, approval_json, run_after, expires_at, submitted_by FROM jobs WHERE job_id = $1 \
                 FOR UPDATE",
                &[&id],
            )
            .await
            .map_err(&err)?;
        let Some(row) = row else { return Ok(Err(DecideRefusal::NotFound)) };
        let status: String = row.get(0);
        let gated = GatedRow {
            status: status.parse().map_err(|e: String| corrupt(&id, e))?,
            approval: json_column(&id, "approval", row.get(1))?,
            run_after: Timestamp::from_unix_ms(row.get(2)),
            expires_at: row.get::<_, Option<i64>>(3).map(Timestamp::from_unix_ms),
            submitted_by: row.get(4),
            rule_in_force: match &params.rule {
                Some(rule) => gate::rule_in_force(super::standing::rule_row(&tx, rule).await?, params.now)?,
                None => false,
            },
        };
        let change = match gate::decide(gated, &params) {
            Ok(change) => change,
            Err(refusal) => return Ok(Err(refusal)),
        };
        let approval = to_json(change.approval())?;
        let c = change.columns();
        let sql = decision_update_sql('$') + &job_columns("");
        let rows = tx
            .query(
                &sql,
                &[
                    &id,
                    &change.status().as_str(),
                    &approval,
                    &c.run_after,
                    &c.expires_at,
                    &c.deadline_at,
                    &c.finished_at,
                    &c.error_kind,
                    &c.error_message,
                ],
            )
            .await
            .map_err(&err)?;
        let job = rows.first().map(row_to_job).transpose()?.ok_or_else(|| corrupt(&id, "decided but not returned"))?;
        let mut made = None;
        if change.approves(&params) {
            if let Some(rule) = &params.rule {
                super::standing::rule_used(&tx, rule).await?;
            }
            if let Some(remember) = &params.remember {
                let rule = ApprovalRule::of_job(&job, &params.by, remember, params.now);
                super::standing::rule_insert(&tx, &rule).await?;
                made = Some(rule);
            }
        }
        // The head's lock is taken last, after the job's row (and the
        // rule's), as every audited write does: no two appends wait on
        // each other's rows.
        let mut notes = vec![change.audit_note(&params)];
        notes.extend(made.as_ref().map(gate::rule_created));
        super::audit::append_all(&tx, &notes, params.now).await?;
        tx.commit().await.map_err(&err)?;
        if change.status() == JobStatus::Queued {
            self.wake();
        }
        Ok(change.refusal().map_or(Ok(job), Err))
    }

    async fn counts_snapshot(&self) -> Result<Counts, StoreError> {
        let client = self.client("counting jobs").await?;
        count_jobs(&client).await
    }

    async fn queued_count(&self) -> Result<u64, StoreError> {
        let rows = self.read("counting queued jobs", &QUEUED_COUNT_PARTS, &[]).await?;
        Ok(rows.first().map_or(0, |r| r.get::<_, i64>(0).max(0) as u64))
    }

    async fn oldest_queued_due(&self) -> Result<Option<Timestamp>, StoreError> {
        let rows = self.read("reading the oldest queued job", &OLDEST_QUEUED_DUE_PARTS, &[]).await?;
        Ok(rows.first().and_then(|r| r.get::<_, Option<i64>>(0)).map(Timestamp::from_unix_ms))
    }

    async fn jobs_ahead(&self, job: &Job, now: Timestamp) -> Result<u64, StoreError> {
        static SQL: LazyLock<String> = LazyLock::new(|| JOBS_AHEAD.replace('?', "$"));
        let priority = i16::from(job.priority);
        let (now, due, id) = (now.unix_ms(), job.run_after.unix_ms(), job.id.to_string());
        let rows = self.read("counting the jobs ahead", &SQL, &[&now, &priority, &due, &id]).await?;
        Ok(rows.first().map_or(0, |r| r.get::<_, i64>(0) as u64))
    }

    async fn job_list(&self, params: JobListParams) -> Result<Vec<Job>, StoreError> {
        let mut sql = format!("SELECT {} FROM jobs WHERE TRUE", list_columns());
        let mut args: Vec<String> = Vec::new();
        for (condition, values) in list_filters(&params) {
            let mut next = args.len();
            args.extend(values);
            sql.push_str(&filter_sql(&condition, || {
                next += 1;
                format!("${next}")
            }));
        }
        sql.push_str(&format!(" ORDER BY job_id DESC LIMIT {}", params.limit.max(1)));
        let args: Vec<&(dyn ToSql + Sync)> = args.iter().map(|a| a as &(dyn ToSql + Sync)).collect();
        let rows = self.read("listing jobs", &sql, &args).await?;
        rows_to_jobs(&rows)
    }

    async fn job_logs(&self, id: JobId) -> Result<Option<JobLogs>, StoreError> {
        let rows =
            self.read("reading logs", "SELECT logs_json FROM jobs WHERE job_id = $1", &[&id.to_string()]).await?;
        json_column(&id.to_string(), "logs", rows.first().and_then(|r| r.get(0)))
    }

    async fn job_earlier_attempts(&self, id: JobId) -> Result<Vec<Attempt>, StoreError> {
        let id = id.to_string();
        let sql = EARLIER_ATTEMPTS.replace("{}", "$1");
        let rows = self.read("reading attempts", &sql, &[&id]).await?;
        rows.iter()
            .map(|r| {
                AttemptRow {
                    run: i64::from(r.get::<_, i32>(0)),
                    worker_id: r.get(1),
                    started_at: r.get(2),
                    ended_at: r.get(3),
                    outcome: r.get(4),
                    error_kind: r.get(5),
                    error: r.get(6),
                    fuel_used: r.get(7),
                    peak_memory_bytes: r.get(8),
                    logs_json: r.get(9),
                    logs_cut: r.get(10),
                }
                .into_attempt(&id)
            })
            .collect()
    }
}

/// A submit with audit notes to chain (some job has a principal): in a
/// transaction of its own, committed.
async fn insert_signed(
    client: &mut deadpool_postgres::Object,
    jobs: Vec<NewJob>,
    now: Timestamp,
) -> Result<Vec<Job>, StoreError> {
    let err = db_err("inserting jobs");
    let tx = client.transaction().await.map_err(&err)?;
    let inserted = insert_audited(&tx, jobs, now).await?;
    tx.commit().await.map_err(&err)?;
    Ok(inserted)
}
