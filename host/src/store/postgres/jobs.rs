//! The PostgreSQL store's [`Jobs`]: inserting jobs (in chunked
//! multi-row statements), reading, listing, cancels and decisions on gates.

use std::collections::HashMap;
use std::sync::LazyLock;

use deadpool_postgres::GenericClient;
use tokio_postgres::types::ToSql;

use super::claim::{OLDEST_QUEUED_DUE_PARTS, QUEUED_COUNT_PARTS};
use super::rows::{count_jobs, db_err, job_columns, list_columns, row_to_job, rows_to_jobs};
use super::{BATCH, NOTIFY, PostgresStore};
use crate::clock::Timestamp;
use crate::job::{
    Approval, ApprovalRule, Attempt, Counts, Job, JobId, JobLogs, JobStatus, NewJob, SCHEMA_VERSION, millis,
};
use crate::store::rules::approval::{self as gate, GatedRow};
use crate::store::rules::audit::{cancel_note, redrive_note, submit_note};
use crate::store::rules::codec::{
    AttemptRow, InsertTimes, approval_to_column, corrupt, grants_to_column, json_column, labels_to_columns,
    target_columns, to_json,
};
use crate::store::sql::{EARLIER_ATTEMPTS, REDRIVE, decision_update_sql, filter_sql, list_filters};
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
        let err = db_err("inserting jobs");
        let mut client = self.client("inserting jobs").await?;
        if let Some(taken) = idempotency_conflict(&client, &params.jobs).await? {
            return Err(taken);
        }
        let keyed: Vec<NewJob> = params.jobs.iter().filter(|j| j.idempotency.is_some()).cloned().collect();
        let tx = client.transaction().await.map_err(&err)?;
        let inserted = match insert_audited(&tx, params.jobs, params.now).await {
            Ok(inserted) => inserted,
            Err(e) => {
                drop(tx);
                // A concurrent insert took a key between the check and
                // this insert: report it as the check would have.
                if let Some(taken) = idempotency_conflict(&client, &keyed).await? {
                    return Err(taken);
                }
                return Err(e);
            }
        };
        tx.commit().await.map_err(&err)?;
        self.inner.freshness.inserted(inserted.len() as u64, &self.inner.pool);
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
        if change.status() == JobStatus::Queued {
            tx.execute(NOTIFY, &[]).await.map_err(&err)?;
        }
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

/// The columns of a large insert, one array each (`unnest` turns them
/// back into rows: one statement shape whatever the count).
#[derive(Default)]
pub(super) struct InsertColumns {
    id: Vec<String>,
    plan: Vec<Option<String>>,
    phase: Vec<&'static str>,
    action: Vec<Option<String>>,
    digest: Vec<String>,
    payload: Vec<Vec<u8>>,
    limits: Vec<String>,
    expires: Vec<i64>,
    max_attempts: Vec<i32>,
    key: Vec<Option<String>>,
    plugin_name: Vec<Option<String>>,
    plugin_version: Vec<Option<String>>,
    idempotency_key: Vec<Option<String>>,
    request_digest: Vec<Option<String>>,
    run_after: Vec<i64>,
    deadline: Vec<Option<i64>>,
    backoff_base: Vec<i64>,
    backoff_cap: Vec<i64>,
    grants: Vec<Option<String>>,
    free_rerun_limit: Vec<i32>,
    status: Vec<&'static str>,
    approval: Vec<Option<String>>,
    submitted_by: Vec<Option<String>>,
    priority: Vec<i16>,
    schedule: Vec<Option<String>>,
    tags: Vec<Option<String>>,
    metadata: Vec<Option<String>>,
    rate_limit: Vec<Option<String>>,
    rate_key: Vec<String>,
}

impl InsertColumns {
    pub(super) fn push(&mut self, job: NewJob, id: JobId, now: Timestamp) -> Result<(), StoreError> {
        let (phase, action) = target_columns(&job.target);
        let action = action.map(str::to_owned);
        let times = InsertTimes::of(&job, now);
        self.status.push(times.status);
        self.approval.push(approval_to_column(job.approval.map(Into::into).as_ref())?);
        self.id.push(id.to_string());
        self.plan.push(job.plan_id);
        self.phase.push(phase);
        self.action.push(action);
        self.digest.push(job.plugin.to_string());
        self.payload.push(job.input);
        self.limits.push(to_json(&job.limits)?);
        self.expires.push(times.expires_at.unix_ms());
        self.max_attempts.push(i32::try_from(job.max_attempts).unwrap_or(i32::MAX));
        self.key.push(job.concurrency_key);
        self.plugin_name.push(job.plugin_name.as_ref().map(|n| n.name.clone()));
        self.plugin_version.push(job.plugin_name.map(|n| n.version));
        self.idempotency_key.push(job.idempotency.as_ref().map(|i| i.key.clone()));
        self.request_digest.push(job.idempotency.map(|i| i.request_digest));
        self.run_after.push(times.run_after.unix_ms());
        self.deadline.push(times.deadline_at.map(Timestamp::unix_ms));
        self.backoff_base.push(millis::column(job.backoff.base));
        self.backoff_cap.push(millis::column(job.backoff.cap));
        self.grants.push(grants_to_column(&job.grants)?);
        self.free_rerun_limit.push(i32::try_from(job.free_rerun_limit).unwrap_or(i32::MAX));
        self.submitted_by.push(job.submitted_by);
        self.priority.push(i16::from(job.priority));
        self.schedule.push(job.schedule_id.map(|s| s.to_string()));
        let (tags, metadata) = labels_to_columns(&job.tags, &job.metadata)?;
        self.tags.push(tags);
        self.metadata.push(metadata);
        self.rate_limit.push(job.rate_limit);
        self.rate_key.push(job.rate_key);
        Ok(())
    }
}

/// The insert's plan is one shape whatever it inserts (the arrays
/// unnested, each row written), but the server judged its generic plan,
/// costed at ten rows, dearer than a plan for the actual arrays, and
/// planned each run afresh: measured at single submits, 188 µs of planning
/// a run against 385 µs of running it. So the insert asks for its generic
/// plan, set just before it and reset just after, the three sent together
/// (no round trip of their own): the statements after it in the caller's
/// transaction are planned as before. (Were the insert refused, the reset
/// fails with it, and the rollback undoes the setting.)
const GENERIC_INSERT: &str = "SET LOCAL plan_cache_mode = force_generic_plan";

/// The caller's setting again, after the insert.
const INSERT_PLANS_AS_BEFORE: &str = "RESET plan_cache_mode";

/// Insert the jobs `columns` holds in one statement, in the caller's
/// transaction. A job of a paused
/// plugin is queued parked; the pause is read `FOR SHARE`, so a resume
/// racing the insert waits for it and then clears it too (read without
/// the lock, the insert could commit parked after the resume cleared the
/// plugin's parked jobs, and hold it with no pause).
pub(super) async fn insert_rows(
    client: &impl GenericClient,
    columns: &InsertColumns,
    now: Timestamp,
) -> Result<Vec<Job>, StoreError> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "INSERT INTO jobs (job_id, plan_id, phase, action, plugin_digest, status, payload, limits_json, \
             schema_version, created_at, expires_at, max_attempts, concurrency_key, plugin_name, plugin_version, \
             idempotency_key, request_digest, run_after, deadline_at, backoff_base_ms, backoff_cap_ms, grants_json, \
             free_rerun_limit, approval_json, submitted_by, priority, paused, schedule_id, tags_json, metadata_json, rate_limit, rate_key) SELECT n.id, n.plan, n.phase, n.action, n.digest, n.status, n.payload, \
             n.limits, $19, $20, n.expires, \
             n.max_attempts, n.key, n.pname, n.pversion, n.ikey, n.rdigest, n.run_after, n.deadline, n.bbase, n.bcap, \
             n.grants, n.free, n.approval, n.submitter, n.priority, \
             CASE WHEN EXISTS (SELECT 1 FROM plugin_pauses z WHERE z.name = n.pname FOR SHARE) THEN 1 ELSE 0 END, \
             n.schedule, n.tags, n.metadata, n.rlimit, n.rkey FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bytea[], $7::text[], \
               $8::int8[], $9::int4[], $10::text[], $11::text[], $12::text[], $13::text[], $14::text[], $15::int8[], \
               $16::int8[], $17::int8[], $18::int8[], $21::text[], $22::int4[], $23::text[], $24::text[], \
               $25::text[], $26::int2[], $27::text[], $28::text[], $29::text[], $30::text[], $31::text[]) \
             AS n(id, plan, phase, action, digest, payload, limits, expires, max_attempts, key, pname, pversion, \
               ikey, rdigest, run_after, deadline, bbase, bcap, grants, free, status, approval, submitter, priority, \
               schedule, tags, metadata, rlimit, rkey) \
             RETURNING {}",
            job_columns("")
        )
    });
    let err = db_err("inserting jobs");
    let stmt = client.prepare_cached(&SQL).await.map_err(&err)?;
    let c = columns;
    let (schema_version, now_ms) = (i32::try_from(SCHEMA_VERSION).unwrap_or(i32::MAX), now.unix_ms());
    let binds: [&(dyn tokio_postgres::types::ToSql + Sync); 31] = [
        &c.id,
        &c.plan,
        &c.phase,
        &c.action,
        &c.digest,
        &c.payload,
        &c.limits,
        &c.expires,
        &c.max_attempts,
        &c.key,
        &c.plugin_name,
        &c.plugin_version,
        &c.idempotency_key,
        &c.request_digest,
        &c.run_after,
        &c.deadline,
        &c.backoff_base,
        &c.backoff_cap,
        &schema_version,
        &now_ms,
        &c.grants,
        &c.free_rerun_limit,
        &c.status,
        &c.approval,
        &c.submitted_by,
        &c.priority,
        &c.schedule,
        &c.tags,
        &c.metadata,
        &c.rate_limit,
        &c.rate_key,
    ];
    // Sent together, in this order, as each is first polled: see
    // [`GENERIC_INSERT`].
    let (generic, rows, reset) = tokio::join!(
        client.batch_execute(GENERIC_INSERT),
        client.query(&stmt, &binds),
        client.batch_execute(INSERT_PLANS_AS_BEFORE)
    );
    generic.map_err(&err)?;
    let rows = rows.map_err(&err)?;
    reset.map_err(&err)?;
    let jobs = rows_to_jobs(&rows)?;
    super::labels::insert(client, &jobs).await?;
    Ok(jobs)
}

/// Insert `jobs` in the caller's transaction, in chunks, with their submit
/// notes and a wake-up for every replica's claim loop; answered in the
/// given order.
pub(super) async fn insert_audited(
    tx: &deadpool_postgres::Transaction<'_>,
    jobs: Vec<NewJob>,
    now: Timestamp,
) -> Result<Vec<Job>, StoreError> {
    let err = db_err("inserting jobs");
    let ids: Vec<JobId> = jobs.iter().map(|_| JobId::new(now)).collect();
    let mut chunks = Vec::new();
    let mut jobs = jobs.into_iter().zip(ids.iter().copied()).peekable();
    while jobs.peek().is_some() {
        let mut columns = InsertColumns::default();
        for (job, id) in jobs.by_ref().take(BATCH as usize) {
            columns.push(job, id, now)?;
        }
        chunks.push(columns);
    }
    let mut by_id = std::collections::HashMap::with_capacity(ids.len());
    for columns in &chunks {
        by_id.extend(insert_rows(tx, columns, now).await?.into_iter().map(|j| (j.id, j)));
    }
    let notes: Vec<_> = ids.iter().filter_map(|id| by_id.get(id)).filter_map(submit_note).collect();
    super::audit::append_all(tx, &notes, now).await?;
    tx.execute(NOTIFY, &[]).await.map_err(&err)?;
    ids.into_iter()
        .map(|id| by_id.remove(&id).ok_or_else(|| corrupt(&id.to_string(), "inserted but not returned")))
        .collect()
}

/// The stored job, if any, that already has one of these idempotency
/// keys, as the error an insert reports (the first key in submit order).
pub(super) async fn idempotency_conflict(
    client: &impl GenericClient,
    jobs: &[NewJob],
) -> Result<Option<StoreError>, StoreError> {
    let keys: Vec<&str> = jobs.iter().filter_map(|j| j.idempotency.as_ref().map(|i| i.key.as_str())).collect();
    if keys.is_empty() {
        return Ok(None);
    }
    let err = db_err("checking idempotency keys");
    let stmt = client
        .prepare_cached("SELECT idempotency_key, job_id, request_digest FROM jobs WHERE idempotency_key = ANY($1)")
        .await
        .map_err(&err)?;
    let taken = client.query(&stmt, &[&keys]).await.map_err(&err)?;
    for job in jobs {
        let Some(idempotency) = &job.idempotency else { continue };
        let Some(row) = taken.iter().find(|r| r.get::<_, &str>(0) == idempotency.key) else { continue };
        let holder: String = row.get(1);
        let digest: Option<String> = row.get(2);
        return Ok(Some(StoreError::IdempotencyKeyTaken {
            key: idempotency.key.clone(),
            job: holder.parse().map_err(|e: String| corrupt(&holder, e))?,
            same_request: digest.as_deref() == Some(idempotency.request_digest.as_str()),
        }));
    }
    Ok(None)
}
