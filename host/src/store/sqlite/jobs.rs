//! The SQLite store's [`Jobs`]: inserting jobs (in chunked
//! multi-row statements), reading, listing, cancels and decisions on gates.

use std::collections::HashMap;
use std::sync::LazyLock;

use rusqlite::{Connection, OptionalExtension, params};

use super::SqliteStore;
use super::rows::{JOB_COLUMNS, count_jobs, db_err, query_jobs};
use crate::clock::Timestamp;
use crate::job::{
    Approval, ApprovalRule, Attempt, Counts, IdempotencyKey, Job, JobId, JobLogs, JobStatus, NewJob, SCHEMA_VERSION,
    millis,
};
use crate::store::rules::approval::{self as gate, GatedRow};
use crate::store::rules::audit::{cancel_note, redrive_note, submit_note};
use crate::store::rules::codec::{
    AttemptRow, InsertTimes, approval_to_column, corrupt, grants_to_column, inserted_job, json_column,
    labels_to_columns, target_columns, to_json,
};
use crate::store::sql::{
    EARLIER_ATTEMPTS, JOBS_AHEAD, OLDEST_QUEUED_DUE, QUEUED_COUNT, REDRIVE, decision_update_sql, filter_sql,
    list_filters,
};
use crate::store::{
    CancelResult, DecideRefusal, JobDecideParams, JobInsertParams, JobListParams, JobRedriveParams, Jobs,
    RedriveResult, StoreError,
};

#[async_trait::async_trait]
impl Jobs for SqliteStore {
    async fn job_insert(&self, params: JobInsertParams) -> Result<Vec<Job>, StoreError> {
        for job in &params.jobs {
            job.check().map_err(StoreError::Invalid)?;
        }
        let now = params.now;
        // One job is one statement, whole or nothing by itself: no
        // savepoint, unless a principal's submit adds its audit row or its
        // labels add theirs.
        let audited = params.jobs.iter().any(|job| job.submitted_by.is_some());
        let labelled = params.jobs.iter().any(|job| !job.tags.is_empty() || !job.metadata.is_empty());
        if let ([_], false, false) = (&params.jobs[..], audited, labelled) {
            return self.write(move |conn| insert_rows(conn, params.jobs, now)).await;
        }
        self.write_all_or_nothing(move |conn| insert_audited(conn, params.jobs, now)).await
    }

    async fn job_get(&self, id: JobId) -> Result<Option<Job>, StoreError> {
        self.read(move |conn| {
            let sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE job_id = ?1");
            Ok(query_jobs(conn, &sql, params![id.to_string()])?.pop())
        })
        .await
    }

    async fn jobs_by_idempotency_key(
        &self,
        keys: Vec<String>,
    ) -> Result<HashMap<String, (JobId, JobStatus)>, StoreError> {
        let keys = to_json(&keys)?;
        self.read(move |conn| {
            let err = db_err("reading jobs by idempotency key");
            let mut stmt = conn
                .prepare_cached(
                    "SELECT idempotency_key, job_id, status FROM jobs \
                     WHERE idempotency_key IN (SELECT value FROM json_each(?1))",
                )
                .map_err(&err)?;
            let mut rows = stmt.query(params![keys]).map_err(&err)?;
            let mut found = HashMap::new();
            while let Some(row) = rows.next().map_err(&err)? {
                let (key, id, status): (String, String, String) =
                    (row.get(0).map_err(&err)?, row.get(1).map_err(&err)?, row.get(2).map_err(&err)?);
                let job: JobId = id.parse().map_err(|e: String| corrupt(&id, e))?;
                found.insert(key, (job, status.parse().map_err(|e: String| corrupt(&id, e))?));
            }
            Ok(found)
        })
        .await
    }

    async fn job_cancel(&self, id: JobId, now: Timestamp, actor: Option<String>) -> Result<CancelResult, StoreError> {
        self.write_all_or_nothing(move |conn| {
            let err = db_err("cancelling a job");
            let id = id.to_string();
            let row: Option<(String, Option<String>)> = conn
                .prepare_cached("SELECT status, approval_json FROM jobs WHERE job_id = ?1")
                .and_then(|mut s| s.query_row(params![id], |r| Ok((r.get(0)?, r.get(1)?))).optional())
                .map_err(&err)?;
            let Some((status, approval)) = row else { return Ok(CancelResult::NotFound) };
            let was: JobStatus = status.parse().map_err(|e: String| corrupt(&id, e))?;
            let result = match was {
                status @ (JobStatus::Queued | JobStatus::PendingApproval | JobStatus::Approved) => {
                    let approval: Option<Approval> = json_column(&id, "approval", approval)?;
                    let (at, message) = gate::cancel_waiting(status, approval.as_ref(), now);
                    conn.execute(
                        "UPDATE jobs SET status = 'cancelled', finished_at = ?1, error_kind = 'cancelled', \
                         error_message = ?3 WHERE job_id = ?2",
                        params![at.unix_ms(), id, message],
                    )
                    .map_err(&err)?;
                    CancelResult::Cancelled
                }
                JobStatus::Running => {
                    conn.execute("UPDATE jobs SET cancel_requested = 1 WHERE job_id = ?1", params![id])
                        .map_err(&err)?;
                    CancelResult::Requested
                }
                terminal => CancelResult::AlreadyTerminal(terminal),
            };
            if let Some(note) = cancel_note(actor, &id, was, &result) {
                super::audit::append(conn, &note, now)?;
            }
            Ok(result)
        })
        .await
    }

    async fn job_redrive(&self, params: JobRedriveParams) -> Result<RedriveResult, StoreError> {
        self.write_all_or_nothing(move |conn| {
            let err = db_err("retrying a job");
            let id = params.id.to_string();
            let row: Option<(String, Option<String>, bool)> = conn
                .prepare_cached("SELECT status, plan_id, approval_json IS NOT NULL FROM jobs WHERE job_id = ?1")
                .and_then(|mut s| s.query_row(params![id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).optional())
                .map_err(&err)?;
            let Some((status, plan_id, gated)) = row else { return Ok(RedriveResult::NotFound) };
            let was: JobStatus = status.parse().map_err(|e: String| corrupt(&id, e))?;
            if let Some(why) = crate::job::redrive_refusal(&id, was, plan_id.as_deref(), gated) {
                return Ok(RedriveResult::Refused(why));
            }
            let sql =
                REDRIVE.replace("{now}", "?1").replace("{expires}", "?2").replace("{id}", "?3").replace("{false}", "0");
            let expires = params.now.plus(params.queue_ttl);
            conn.execute(&sql, params![params.now.unix_ms(), expires.unix_ms(), id]).map_err(&err)?;
            if let Some(note) = redrive_note(params.actor, &id, was) {
                super::audit::append(conn, &note, params.now)?;
            }
            Ok(RedriveResult::Queued)
        })
        .await
    }

    async fn job_decide(&self, params: JobDecideParams) -> Result<Result<Job, DecideRefusal>, StoreError> {
        self.write_all_or_nothing(move |conn| {
            let err = db_err("deciding on a job");
            let id = params.id.to_string();
            type Row = (String, Option<String>, i64, Option<i64>, Option<String>);
            let row: Option<Row> = conn
                .prepare_cached(
                    "SELECT status, approval_json, run_after, expires_at, submitted_by FROM jobs WHERE job_id = ?1",
                )
                .and_then(|mut s| {
                    s.query_row(params![id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))).optional()
                })
                .map_err(&err)?;
            let Some((status, approval, run_after, expires_at, submitted_by)) = row else {
                return Ok(Err(DecideRefusal::NotFound));
            };
            let row = GatedRow {
                status: status.parse().map_err(|e: String| corrupt(&id, e))?,
                approval: json_column(&id, "approval", approval)?,
                run_after: Timestamp::from_unix_ms(run_after),
                expires_at: expires_at.map(Timestamp::from_unix_ms),
                submitted_by,
                rule_in_force: match &params.rule {
                    Some(rule) => gate::rule_in_force(super::standing::rule_row(conn, rule)?, params.now)?,
                    None => false,
                },
            };
            let change = match gate::decide(row, &params) {
                Ok(change) => change,
                Err(refusal) => return Ok(Err(refusal)),
            };
            let approval = to_json(change.approval())?;
            let c = change.columns();
            let sql = decision_update_sql('?') + JOB_COLUMNS;
            let status = change.status().as_str();
            let mut jobs = query_jobs(
                conn,
                &sql,
                params![
                    id,
                    status,
                    approval,
                    c.run_after,
                    c.expires_at,
                    c.deadline_at,
                    c.finished_at,
                    c.error_kind,
                    c.error_message
                ],
            )?;
            let job = jobs.pop().ok_or_else(|| corrupt(&id, "decided but not returned"))?;
            let mut notes = vec![change.audit_note(&params)];
            if change.approves(&params) {
                if let Some(rule) = &params.rule {
                    super::standing::rule_used(conn, rule)?;
                }
                if let Some(remember) = &params.remember {
                    let made = ApprovalRule::of_job(&job, &params.by, remember, params.now);
                    super::standing::rule_insert(conn, &made)?;
                    notes.push(gate::rule_created(&made));
                }
            }
            super::audit::append_all(conn, &notes, params.now)?;
            Ok(change.refusal().map_or(Ok(job), Err))
        })
        .await
    }

    async fn job_list(&self, params: JobListParams) -> Result<Vec<Job>, StoreError> {
        self.read(move |conn| {
            // List rows leave the payload and output behind.
            let columns = JOB_COLUMNS.replacen("payload", "X''", 1).replacen(" output,", " NULL,", 1);
            let mut sql = format!("SELECT {columns} FROM jobs WHERE 1 = 1");
            let mut args: Vec<String> = Vec::new();
            for (condition, values) in list_filters(&params) {
                let mut next = args.len();
                args.extend(values);
                sql.push_str(&filter_sql(&condition, || {
                    next += 1;
                    format!("?{next}")
                }));
            }
            sql.push_str(&format!(" ORDER BY job_id DESC LIMIT {}", params.limit.max(1)));
            query_jobs(conn, &sql, rusqlite::params_from_iter(args.iter()))
        })
        .await
    }

    async fn job_logs(&self, id: JobId) -> Result<Option<JobLogs>, StoreError> {
        self.read(move |conn| {
            let text: Option<Option<String>> = conn
                .query_row("SELECT logs_json FROM jobs WHERE job_id = ?1", params![id.to_string()], |r| r.get(0))
                .optional()
                .map_err(db_err("reading logs"))?;
            json_column(&id.to_string(), "logs", text.flatten())
        })
        .await
    }

    async fn job_earlier_attempts(&self, id: JobId) -> Result<Vec<Attempt>, StoreError> {
        self.read(move |conn| {
            let id = id.to_string();
            let mut statement =
                conn.prepare_cached(&EARLIER_ATTEMPTS.replace("{}", "?1")).map_err(db_err("reading attempts"))?;
            let rows = statement
                .query_map(params![id], |r| {
                    Ok(AttemptRow {
                        run: r.get(0)?,
                        worker_id: r.get(1)?,
                        started_at: r.get(2)?,
                        ended_at: r.get(3)?,
                        outcome: r.get(4)?,
                        error_kind: r.get(5)?,
                        error: r.get(6)?,
                        fuel_used: r.get(7)?,
                        peak_memory_bytes: r.get(8)?,
                        logs_json: r.get(9)?,
                        logs_cut: r.get(10)?,
                    })
                })
                .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
                .map_err(db_err("reading attempts"))?;
            rows.into_iter().map(|row| row.into_attempt(&id)).collect()
        })
        .await
    }

    async fn queued_count(&self) -> Result<u64, StoreError> {
        self.read(|conn| {
            // Answered from partial indexes on queued rows: only they are read.
            static SQL: LazyLock<String> = LazyLock::new(|| {
                QUEUED_COUNT
                    .replace("{claim}", "INDEXED BY jobs_claim_due")
                    .replace("{parked}", "INDEXED BY jobs_parked")
            });
            conn.prepare_cached(&SQL)
                .and_then(|mut s| s.query_row([], |r| r.get::<_, i64>(0)))
                .map(|n| n as u64)
                .map_err(db_err("counting queued jobs"))
        })
        .await
    }

    async fn counts_snapshot(&self) -> Result<Counts, StoreError> {
        self.read(count_jobs).await
    }

    async fn oldest_queued_due(&self) -> Result<Option<Timestamp>, StoreError> {
        self.read(|conn| {
            conn.prepare_cached(OLDEST_QUEUED_DUE)
                .and_then(|mut s| s.query_row([], |r| r.get::<_, Option<i64>>(0)))
                .map(|at| at.map(Timestamp::from_unix_ms))
                .map_err(db_err("reading the oldest queued job"))
        })
        .await
    }

    async fn jobs_ahead(&self, job: &Job, now: Timestamp) -> Result<u64, StoreError> {
        let args = (now.unix_ms(), i64::from(job.priority), job.run_after.unix_ms(), job.id.to_string());
        self.read(move |conn| {
            conn.prepare_cached(JOBS_AHEAD)
                .and_then(|mut s| s.query_row(params![args.0, args.1, args.2, args.3], |r| r.get::<_, i64>(0)))
                .map(|n| n as u64)
                .map_err(db_err("counting the jobs ahead"))
        })
        .await
    }
}

/// Rows per statement of a large submit (27 parameters each), largest
/// first: whole chunks, then the rest one by one. Two statement shapes in
/// the cache, and few statements in the savepoint (each statement's end
/// costs SQLite a walk over the in-memory journal, so one per row is
/// quadratic). A 16-row shape between them changed nothing measurable.
pub(super) const INSERT_CHUNKS: [usize; 2] = [256, 1];

/// The insert of `rows` jobs. One row is `OR FAIL`, which spares it a
/// statement journal as [`CLAIM_ONE`](super::claim::CLAIM_ONE) explains: its constraints are all
/// checked before it writes, and its trigger's insert cannot fail, so it
/// lands whole or not at all. A statement of many rows could fail after
/// writing some, so it keeps the default (`ABORT`) and its journal.
pub(super) fn insert_sql(rows: usize) -> String {
    let row = "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";
    format!(
        "INSERT {}INTO jobs (job_id, plan_id, phase, action, plugin_digest, status, payload, limits_json, \
         schema_version, created_at, expires_at, max_attempts, concurrency_key, plugin_name, plugin_version, \
         idempotency_key, request_digest, run_after, deadline_at, backoff_base_ms, backoff_cap_ms, grants_json, \
         free_rerun_limit, approval_json, submitted_by, priority, paused, schedule_id, tags_json, metadata_json, rate_limit, rate_key) VALUES {}",
        if rows == 1 { "OR FAIL " } else { "" },
        vec![row; rows].join(", ")
    )
}

/// Insert `jobs` in one statement, queued or (gated) pending approval;
/// returned in the given order, as [`inserted_job`] builds them. A job of
/// a paused plugin is queued parked.
pub(super) fn insert_rows(conn: &Connection, jobs: Vec<NewJob>, now: Timestamp) -> Result<Vec<Job>, StoreError> {
    use rusqlite::types::{ToSqlOutput, Value, ValueRef};
    let err = db_err("inserting jobs");
    // Built once: the statement cache finds a statement by its text.
    static STATEMENTS: LazyLock<[String; 2]> = LazyLock::new(|| INSERT_CHUNKS.map(insert_sql));
    let built;
    let sql = match INSERT_CHUNKS.iter().position(|&rows| rows == jobs.len()) {
        Some(shape) => &STATEMENTS[shape],
        None => {
            built = insert_sql(jobs.len());
            &built
        }
    };
    let text = |s: Option<&str>| s.map_or(Value::Null, |s| Value::Text(s.to_owned()));
    // The jobs answered first, each owning its input; the statement then
    // borrows the inputs from them, so a payload is held once, not twice.
    let mut inserted = Vec::with_capacity(jobs.len());
    let mut columns = Vec::with_capacity(jobs.len());
    let mut paused = std::collections::HashMap::new();
    for mut job in jobs {
        let parked = match &job.plugin_name {
            Some(name) => match paused.get(&name.name) {
                Some(&known) => known,
                None => *paused.entry(name.name.clone()).or_insert(super::pauses::is_paused(conn, &name.name)?),
            },
            None => false,
        };
        if let Some(idempotency) = &job.idempotency {
            check_idempotency_key(conn, idempotency)?;
        }
        let id = JobId::new(now);
        let (phase, action) = target_columns(&job.target);
        let limits = serde_json::to_string(&job.limits).map_err(|e| StoreError::Invalid(e.to_string()))?;
        let times = InsertTimes::of(&job, now);
        let input = std::mem::take(&mut job.input);
        let mut row = inserted_job(id, &job, &times, now)?;
        row.input = input;
        let approval = approval_to_column(row.approval.as_ref())?;
        let (tags, metadata) = labels_to_columns(&job.tags, &job.metadata)?;
        // Every column but the payload (bound from the answered job below).
        let before = [
            Value::Text(id.to_string()),
            text(job.plan_id.as_deref()),
            Value::Text(phase.to_owned()),
            text(action),
            Value::Text(job.plugin.to_string()),
            Value::Text(times.status.to_owned()),
        ];
        let after = [
            Value::Text(limits),
            Value::Integer(i64::from(SCHEMA_VERSION)),
            Value::Integer(now.unix_ms()),
            Value::Integer(times.expires_at.unix_ms()),
            Value::Integer(i64::from(job.max_attempts)),
            text(job.concurrency_key.as_deref()),
            text(job.plugin_name.as_ref().map(|n| n.name.as_str())),
            text(job.plugin_name.as_ref().map(|n| n.version.as_str())),
            text(job.idempotency.as_ref().map(|i| i.key.as_str())),
            text(job.idempotency.as_ref().map(|i| i.request_digest.as_str())),
            Value::Integer(times.run_after.unix_ms()),
            times.deadline_at.map_or(Value::Null, |d| Value::Integer(d.unix_ms())),
            Value::Integer(millis::column(job.backoff.base)),
            Value::Integer(millis::column(job.backoff.cap)),
            grants_to_column(&job.grants)?.map_or(Value::Null, Value::Text),
            Value::Integer(i64::from(job.free_rerun_limit)),
            approval.map_or(Value::Null, Value::Text),
            text(job.submitted_by.as_deref()),
            Value::Integer(i64::from(job.priority)),
            Value::Integer(i64::from(parked)),
            job.schedule_id.map_or(Value::Null, |s| Value::Text(s.to_string())),
            tags.map_or(Value::Null, Value::Text),
            metadata.map_or(Value::Null, Value::Text),
            text(job.rate_limit.as_deref()),
            Value::Text(job.rate_key.clone()),
        ];
        columns.push((before, after));
        inserted.push(row);
    }
    let values = columns.into_iter().zip(&inserted).flat_map(|((before, after), row)| {
        let payload = ToSqlOutput::Borrowed(ValueRef::Blob(&row.input));
        before.into_iter().map(ToSqlOutput::Owned).chain([payload]).chain(after.into_iter().map(ToSqlOutput::Owned))
    });
    let stored =
        conn.prepare_cached(sql).and_then(|mut s| s.execute(rusqlite::params_from_iter(values))).map_err(&err)?;
    if stored != inserted.len() {
        return Err(StoreError::Invalid(format!("{} jobs to insert, {stored} stored", inserted.len())));
    }
    super::labels::insert(conn, &inserted)?;
    Ok(inserted)
}

/// Insert `jobs` in chunks and append their submit notes to the audit
/// trail, in the caller's all-or-nothing write.
pub(super) fn insert_audited(conn: &Connection, jobs: Vec<NewJob>, now: Timestamp) -> Result<Vec<Job>, StoreError> {
    let mut inserted = Vec::with_capacity(jobs.len());
    let mut jobs = jobs.into_iter().peekable();
    while jobs.peek().is_some() {
        let rows = INSERT_CHUNKS.into_iter().find(|&rows| jobs.len() >= rows).unwrap_or(1);
        let chunk: Vec<NewJob> = jobs.by_ref().take(rows).collect();
        inserted.extend(insert_rows(conn, chunk, now)?);
    }
    let notes: Vec<_> = inserted.iter().filter_map(submit_note).collect();
    super::audit::append_all(conn, &notes, now)?;
    Ok(inserted)
}

/// Refuse a key a stored job already has (the insert's transaction keeps
/// this check and the insert together: no other writer runs in between).
pub(super) fn check_idempotency_key(conn: &Connection, idempotency: &IdempotencyKey) -> Result<(), StoreError> {
    let taken: Option<(String, Option<String>)> = conn
        .prepare_cached("SELECT job_id, request_digest FROM jobs WHERE idempotency_key = ?1")
        .and_then(|mut s| s.query_row(params![idempotency.key], |r| Ok((r.get(0)?, r.get(1)?))).optional())
        .map_err(db_err("checking an idempotency key"))?;
    match taken {
        None => Ok(()),
        Some((job, digest)) => Err(StoreError::IdempotencyKeyTaken {
            key: idempotency.key.clone(),
            job: job.parse().map_err(|e: String| corrupt(&job, e))?,
            same_request: digest.as_deref() == Some(idempotency.request_digest.as_str()),
        }),
    }
}
