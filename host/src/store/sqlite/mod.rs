//! The embedded SQLite backend: one file, WAL, one writer thread.
//!
//! Every write goes to a single writer thread that drains whatever calls
//! are waiting and runs them in **one** transaction, then commits once and
//! answers every caller. A failing call undoes only its own changes (one
//! statement, or a savepoint for multi-statement writes), never the
//! others'. Under load this pays one fsync per batch
//! instead of one per state change; alone, a call commits at once. Reads
//! use a separate connection (WAL lets them run beside the writer).
//!
//! Durability ([`Durability`]): `normal` (WAL + `synchronous=NORMAL`, the
//! default) survives a killed process — a committed change is in the WAL —
//! but the transactions since the last checkpoint may be lost on power
//! failure; `full`
//! (`synchronous=FULL`) also survives power loss, at one fsync per commit.
//!
//! Several processes may share one file: `BEGIN IMMEDIATE` and a busy
//! timeout serialise their writers; a busy database surfaces as a
//! transient [`StoreError`].

mod migrations;
mod rows;
mod schema;
mod writer;

use rows::{JOB_COLUMNS, count_jobs, db_err, query_jobs, query_plans, query_plugins, read_events};
use schema::{create_private, open_when_free};
use writer::{WriteOp, write_op, writer_loop};

use super::unfinished::{self, AttemptEffects, COUNTER_COLUMNS, Counters, Death, Decision, Fate, SILENT_WORKER};

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex, mpsc};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, Row, params};

use super::approval::{self as gate, GatedRow};
use super::codec::{
    EFFECT_COLUMNS, EffectRow, InsertTimes, approval_to_column, corrupt, grants_of, grants_to_column, i64_of,
    inserted_job, json_column, list_filters, ms, outcome_columns, policy_of, policy_to_column, target_columns, to_json,
};
use super::plan::{DELETE_EMPTY_PLANS, NOT_HELD_BY_A_PLAN, PLAN_COLUMNS, apply_job};
use super::{
    CancelResult, DecideRefusal, EffectBeginParams, EffectEndParams, JobClaimParams, JobDecideParams, JobFinishParams,
    JobInsertParams, JobListParams, JobProgressParams, JobReleaseParams, JobRetryParams, JobStore, JobsDeleteParams,
    JobsExpireParams, Lease, LeaseExtendParams, LeaseReclaimParams, LeaseState, PlanInsertParams, PlanListParams,
    PlansAdvanceParams, PluginGrantsParams, PluginNameParams, PluginPolicyParams, PluginPutParams, ReclaimReport,
    StoreError, WorkerDiedParams,
};
use super::{Durability, WorkerRecord, WorkerState, WorkersSnapshot};
use super::{EventId, EventPage, EventsAfterParams};
use crate::clock::Timestamp;
use crate::job::{
    Backoff, Counts, Digest, Effect, ErrorKind, IdempotencyKey, Job, JobId, JobLogs, JobStatus, NewJob, PlanRecord,
    PluginInfo, PluginRef, SCHEMA_VERSION,
};

/// The SQLite [`JobStore`].
#[derive(Debug, Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    path: PathBuf,
    writer: Mutex<Option<mpsc::Sender<WriteOp>>>,
    reader: Arc<Mutex<Connection>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Closing the channel ends the writer thread after its last batch.
        self.writer.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(thread) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = thread.join();
        }
    }
}

/// Rows per statement of a large submit (24 parameters each), largest
/// first: whole chunks, then the rest one by one. Two statement shapes in
/// the cache, and few statements in the savepoint (each statement's end
/// costs SQLite a walk over the in-memory journal, so one per row is
/// quadratic). A 16-row shape between them changed nothing measurable.
const INSERT_CHUNKS: [usize; 2] = [256, 1];

/// The insert of `rows` jobs. One row is `OR FAIL`, which spares it a
/// statement journal as [`CLAIM_ONE`] explains: its constraints are all
/// checked before it writes, and its trigger's insert cannot fail, so it
/// lands whole or not at all. A statement of many rows could fail after
/// writing some, so it keeps the default (`ABORT`) and its journal.
fn insert_sql(rows: usize) -> String {
    let row = "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";
    format!(
        "INSERT {}INTO jobs (job_id, plan_id, phase, action, plugin_digest, status, payload, limits_json, \
         schema_version, created_at, expires_at, max_attempts, concurrency_key, plugin_name, plugin_version, \
         idempotency_key, request_digest, run_after, deadline_at, backoff_base_ms, backoff_cap_ms, grants_json, \
         free_rerun_limit, approval_json) VALUES {}",
        if rows == 1 { "OR FAIL " } else { "" },
        vec![row; rows].join(", ")
    )
}

/// Insert `jobs` in one statement, queued or (gated) pending approval;
/// returned in the given order, as [`inserted_job`] builds them.
fn insert_rows(conn: &Connection, jobs: Vec<NewJob>, now: Timestamp) -> Result<Vec<Job>, StoreError> {
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
    for mut job in jobs {
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
            Value::Integer(i64_of(job.backoff.base_ms)),
            Value::Integer(i64_of(job.backoff.cap_ms)),
            grants_to_column(&job.grants)?.map_or(Value::Null, Value::Text),
            Value::Integer(i64::from(job.free_rerun_limit)),
            approval.map_or(Value::Null, Value::Text),
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
    Ok(inserted)
}

/// Refuse a key a stored job already has (the insert's transaction keeps
/// this check and the insert together: no other writer runs in between).
fn check_idempotency_key(conn: &Connection, idempotency: &IdempotencyKey) -> Result<(), StoreError> {
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

/// Claim up to `params.limit` eligible jobs: queued, unexpired, due
/// (`run_after` at or before `now`, which is never before its creation: a
/// claim never starts a job younger than itself), and either keyless or the
/// oldest queued job of a key that has no running job. Earliest due first,
/// then oldest.
///
/// A read of the candidates, then one single-row update each: cheaper for
/// SQLite than one `UPDATE … WHERE job_id IN (…) RETURNING …`, which builds
/// two temporary b-trees per call. Nothing can change between the two: the
/// writer holds the write transaction.
fn claim(conn: &Connection, params: JobClaimParams) -> Result<Vec<Lease>, StoreError> {
    // Built once: this runs for every claim.
    static CANDIDATES: LazyLock<String> = LazyLock::new(|| candidates("q.process_deaths = 0"));
    static SUSPECT: LazyLock<String> = LazyLock::new(|| candidates("q.process_deaths > 0"));
    fn candidates(which: &str) -> String {
        format!(
            "SELECT {JOB_COLUMNS} FROM jobs q WHERE q.status = 'queued' AND {which} \
             AND q.run_after <= ?1 AND q.expires_at > ?1 \
             AND (q.concurrency_key IS NULL OR ( \
               q.job_id = (SELECT MIN(o.job_id) FROM jobs o WHERE o.status = 'queued' AND o.concurrency_key = q.concurrency_key) \
               AND NOT EXISTS (SELECT 1 FROM jobs r WHERE r.status = 'running' AND r.concurrency_key = q.concurrency_key))) \
             ORDER BY q.run_after, q.job_id LIMIT ?2"
        )
    }
    let now = params.now.unix_ms();
    let expires = now + ms(params.lease_ttl);
    // A claimer that runs nothing takes a suspect first, and only it.
    let mut candidates = Vec::new();
    if params.alone {
        candidates = query_jobs(conn, &SUSPECT, params![now, 1])?;
    }
    if candidates.is_empty() {
        candidates = query_jobs(conn, &CANDIDATES, params![now, params.limit])?;
    }
    let mut take = conn.prepare_cached(CLAIM_ONE).map_err(db_err("claiming a job"))?;
    let mut leases = Vec::with_capacity(candidates.len());
    for mut job in candidates {
        let token = lease_token();
        let changed = take
            .execute(params![params.worker_id, token, expires, now, job.id.to_string()])
            .map_err(db_err("claiming a job"))?;
        if changed != 1 {
            return Err(corrupt(&job.id.to_string(), "a queued candidate could not be claimed"));
        }
        job.status = JobStatus::Running;
        job.worker_id = Some(params.worker_id.clone());
        job.lease_token = Some(token.clone());
        job.lease_expires_at = Some(Timestamp::from_unix_ms(expires));
        job.started_at = Some(params.now);
        job.last_heartbeat = Some(params.now);
        job.attempt += 1;
        job.cancel_requested = false;
        job.progress = None;
        leases.push(Lease { job, token });
    }
    Ok(leases)
}

/// The claim of one candidate. `OR FAIL` (and triggers that call no
/// function) spare it a statement journal: SQLite copies every page a
/// statement touches into one first when the statement writes more than one
/// row (the event triggers do) and may fail with `ABORT` halfway. This one
/// changes a single row after all of its checks, and its triggers' inserts
/// cannot fail a constraint, so there is nothing a journal would undo.
pub(super) const CLAIM_ONE: &str = "UPDATE OR FAIL jobs SET status = 'running', worker_id = ?1, lease_token = ?2, \
     lease_expires_at = ?3, started_at = ?4, last_heartbeat = ?4, attempt = attempt + 1, cancel_requested = 0, \
     progress_json = NULL, logs_json = NULL \
     WHERE job_id = ?5 AND status = 'queued'";

/// A running job's ending, fenced by its token; `OR FAIL` as in
/// [`CLAIM_ONE`].
pub(super) const FINISH_ONE: &str = "UPDATE OR FAIL jobs SET status = ?1, output = ?2, error_kind = ?3, \
     error_message = ?4, backtrace = ?5, fuel_used = ?6, peak_memory_bytes = ?7, finished_at = ?8, \
     last_heartbeat = ?8, lease_token = NULL, lease_expires_at = NULL, \
     progress_json = COALESCE(?11, progress_json), logs_json = ?12 \
     WHERE job_id = ?9 AND status = 'running' AND lease_token = ?10";

/// A fresh lease token: 128 random bits, lower-case hex.
fn lease_token() -> String {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("the OS random source is available");
    hex::encode(bytes)
}

/// Record a running job's ending, fenced by its lease token. `false`: the
/// token no longer owns the job.
fn finish(conn: &Connection, params: &JobFinishParams) -> Result<bool, StoreError> {
    let now = params.now.unix_ms();
    let (status, kind) = (params.finish.status(), params.finish.error_kind());
    let (output, message, backtrace) = params.finish.columns();
    let progress = params.progress.as_ref().map(to_json).transpose()?;
    let logs = params.logs.as_ref().map(to_json).transpose()?;
    let changed = conn
        .prepare_cached(FINISH_ONE)
        .and_then(|mut s| {
            s.execute(params![
                status.as_str(),
                output,
                kind.map(ErrorKind::as_str),
                message,
                backtrace,
                params.fuel_used as i64,
                params.peak_memory_bytes as i64,
                now,
                params.id.to_string(),
                params.token,
                progress,
                logs,
            ])
        })
        .map_err(db_err("finishing a job"))?;
    Ok(changed == 1)
}

impl SqliteStore {
    /// Open (creating if needed) the database at `path` and migrate it.
    pub fn open(path: impl AsRef<Path>, durability: Durability) -> Result<Self, StoreError> {
        let path = path.as_ref().to_owned();
        create_private(&path)?;
        let (writer, reader) = open_when_free(&path, durability)?;
        let (tx, rx) = mpsc::channel::<WriteOp>();
        let thread = std::thread::Builder::new()
            .name("leash-sqlite-writer".into())
            .spawn(move || writer_loop(writer, rx))
            .map_err(|e| StoreError::Invalid(format!("cannot start the writer thread: {e}")))?;
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                path,
                writer: Mutex::new(Some(tx)),
                reader: Arc::new(Mutex::new(reader)),
                thread: Mutex::new(Some(thread)),
            }),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Run one statement's worth of work on the writer thread, in the next
    /// batch. A failing statement undoes only itself (SQLite's statement
    /// atomicity), so single-statement writes need no savepoint.
    async fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.enqueue_write(false, f).await
    }

    /// Like [`Self::write`], for work of several statements that must land
    /// together: it runs in its own savepoint, rolled back if it fails.
    /// Savepoints cost a sub-journal write per touched page, so only
    /// multi-statement writes use one.
    async fn write_all_or_nothing<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.enqueue_write(true, f).await
    }

    async fn enqueue_write<T: Send + 'static>(
        &self,
        savepoint: bool,
        f: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (op, answer) = write_op(savepoint, f);
        let sender = self.inner.writer.lock().unwrap_or_else(|e| e.into_inner()).clone().ok_or(StoreError::Closed)?;
        sender.send(op).map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// Run `f` on the read connection, off the async runtime.
    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let reader = self.inner.reader.clone();
        tokio::task::spawn_blocking(move || f(&reader.lock().unwrap_or_else(|e| e.into_inner())))
            .await
            .map_err(|_| StoreError::Closed)?
    }
}

#[async_trait::async_trait]
impl JobStore for SqliteStore {
    async fn job_insert(&self, params: JobInsertParams) -> Result<Vec<Job>, StoreError> {
        for job in &params.jobs {
            job.check().map_err(StoreError::Invalid)?;
        }
        let now = params.now;
        // One job is one statement, whole or nothing by itself: no savepoint.
        if let [_] = params.jobs[..] {
            return self.write(move |conn| insert_rows(conn, params.jobs, now)).await;
        }
        self.write_all_or_nothing(move |conn| {
            let mut inserted = Vec::with_capacity(params.jobs.len());
            let mut jobs = params.jobs.into_iter().peekable();
            while jobs.peek().is_some() {
                let rows = INSERT_CHUNKS.into_iter().find(|&rows| jobs.len() >= rows).unwrap_or(1);
                let chunk: Vec<NewJob> = jobs.by_ref().take(rows).collect();
                inserted.extend(insert_rows(conn, chunk, now)?);
            }
            Ok(inserted)
        })
        .await
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

    async fn job_claim(&self, params: JobClaimParams) -> Result<Vec<Lease>, StoreError> {
        self.write(move |conn| claim(conn, params)).await
    }

    async fn lease_extend(&self, params: LeaseExtendParams) -> Result<LeaseState, StoreError> {
        let now = params.now.unix_ms();
        self.write(move |conn| {
            let cancel: Option<bool> = conn
                .prepare_cached(
                    "UPDATE jobs SET lease_expires_at = ?1, last_heartbeat = ?2 \
                     WHERE job_id = ?3 AND status = 'running' AND lease_token = ?4 RETURNING cancel_requested",
                )
                .and_then(|mut s| {
                    s.query_row(params![now + ms(params.lease_ttl), now, params.id.to_string(), params.token], |r| {
                        r.get(0)
                    })
                    .optional()
                })
                .map_err(db_err("extending a lease"))?;
            Ok(match cancel {
                Some(cancel_requested) => LeaseState::Held { cancel_requested },
                None => LeaseState::Lost,
            })
        })
        .await
    }

    async fn job_finish(&self, params: JobFinishParams) -> Result<bool, StoreError> {
        self.write(move |conn| finish(conn, &params)).await
    }

    async fn job_finish_and_claim(
        &self,
        params: JobFinishParams,
        next: JobClaimParams,
    ) -> Result<(bool, Vec<Lease>), StoreError> {
        self.write(move |conn| {
            if !finish(conn, &params)? {
                return Ok((false, Vec::new()));
            }
            // The finish stands even if the claim fails: the claim loop
            // will claim later.
            Ok((true, claim(conn, next).unwrap_or_default()))
        })
        .await
    }

    async fn job_release(&self, params: JobReleaseParams) -> Result<bool, StoreError> {
        let run_after = params.run_after.max(params.now).unix_ms();
        self.write(move |conn| {
            let err = db_err("releasing a job");
            let id = params.id.to_string();
            let sql = format!(
                "SELECT {COUNTER_COLUMNS} FROM jobs WHERE job_id = ?1 AND status = 'running' AND lease_token = ?2"
            );
            let held = conn
                .prepare_cached(&sql)
                .and_then(|mut s| s.query_row(params![id, params.token], counters_of).optional())
                .map_err(&err)?;
            let Some((_, attempt, counters)) = held else { return Ok(false) };
            let effects = attempt_effects(conn, &id, attempt).map_err(&err)?;
            if let Some(fate) = unfinished::released(&counters, effects.as_ref(), params.now) {
                let decision = Decision { fate, died: false };
                apply_fate(conn, &id, &decision, params.queue_ttl, params.now).map_err(&err)?;
                return Ok(true);
            }
            conn.prepare_cached(
                "UPDATE jobs SET status = 'queued', lease_token = NULL, lease_expires_at = NULL, \
                 releases = releases + 1, run_after = MAX(run_after, ?3), \
                 expires_at = MIN(MAX(expires_at, ?1), COALESCE(deadline_at, MAX(expires_at, ?1))) \
                 WHERE job_id = ?2",
            )
            .and_then(|mut s| s.execute(params![run_after + ms(params.queue_ttl), id, run_after]))
            .map_err(&err)?;
            Ok(true)
        })
        .await
    }

    async fn job_cancel(&self, id: JobId, now: Timestamp) -> Result<CancelResult, StoreError> {
        self.write(move |conn| {
            let err = db_err("cancelling a job");
            let id = id.to_string();
            let cancelled = conn
                .execute(
                    "UPDATE jobs SET status = 'cancelled', finished_at = ?1, error_kind = 'cancelled', \
                     error_message = CASE status WHEN 'queued' THEN 'Cancelled: cancelled while queued' \
                       ELSE 'Cancelled: cancelled while waiting for approval' END \
                     WHERE job_id = ?2 AND status IN ('queued', 'pending_approval', 'approved')",
                    params![now.unix_ms(), id],
                )
                .map_err(&err)?;
            if cancelled == 1 {
                return Ok(CancelResult::Cancelled);
            }
            let requested = conn
                .execute("UPDATE jobs SET cancel_requested = 1 WHERE job_id = ?1 AND status = 'running'", params![id])
                .map_err(&err)?;
            if requested == 1 {
                return Ok(CancelResult::Requested);
            }
            let status: Option<String> = conn
                .query_row("SELECT status FROM jobs WHERE job_id = ?1", params![id], |r| r.get(0))
                .optional()
                .map_err(&err)?;
            match status {
                None => Ok(CancelResult::NotFound),
                Some(s) => Ok(CancelResult::AlreadyTerminal(s.parse().map_err(|e: String| corrupt(&id, e))?)),
            }
        })
        .await
    }

    async fn job_decide(&self, params: JobDecideParams) -> Result<Result<Job, DecideRefusal>, StoreError> {
        self.write(move |conn| {
            let err = db_err("deciding on a job");
            let id = params.id.to_string();
            let row: Option<(String, Option<String>, i64)> = conn
                .prepare_cached("SELECT status, approval_json, run_after FROM jobs WHERE job_id = ?1")
                .and_then(|mut s| s.query_row(params![id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).optional())
                .map_err(&err)?;
            let Some((status, approval, run_after)) = row else { return Ok(Err(DecideRefusal::NotFound)) };
            let row = GatedRow {
                status: status.parse().map_err(|e: String| corrupt(&id, e))?,
                approval: json_column(&id, "approval", approval)?,
                run_after: Timestamp::from_unix_ms(run_after),
            };
            let change = match gate::decide(row, &params) {
                Ok(change) => change,
                Err(refusal) => return Ok(Err(refusal)),
            };
            let approval = to_json(change.approval())?;
            let c = change.columns(params.now);
            let sql = gate::update_sql('?') + JOB_COLUMNS;
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
            jobs.pop().map(Ok).ok_or_else(|| corrupt(&id, "decided but not returned"))
        })
        .await
    }

    async fn job_retry(&self, params: JobRetryParams) -> Result<bool, StoreError> {
        let logs = params.logs.as_ref().map(to_json).transpose()?;
        self.write(move |conn| {
            let run_after = params.run_after.unix_ms();
            let changed = conn
                .prepare_cached(
                    "UPDATE jobs SET status = 'queued', retries = retries + 1, lease_token = NULL, \
                     lease_expires_at = NULL, run_after = ?1, \
                     expires_at = MIN(MAX(expires_at, ?2), COALESCE(deadline_at, MAX(expires_at, ?2))), \
                     last_error = ?3, fuel_used = ?4, peak_memory_bytes = ?5, logs_json = ?6, last_heartbeat = ?7 \
                     WHERE job_id = ?8 AND status = 'running' AND lease_token = ?9 \
                     AND lost_leases + retries + 1 < max_attempts",
                )
                .and_then(|mut s| {
                    s.execute(params![
                        run_after,
                        run_after.saturating_add(ms(params.queue_ttl)),
                        format!("{}: {}", params.kind, params.message),
                        params.fuel_used as i64,
                        params.peak_memory_bytes as i64,
                        logs,
                        params.now.unix_ms(),
                        params.id.to_string(),
                        params.token,
                    ])
                })
                .map_err(db_err("queueing a job for retry"))?;
            Ok(changed == 1)
        })
        .await
    }

    async fn lease_reclaim_expired(&self, params: LeaseReclaimParams) -> Result<ReclaimReport, StoreError> {
        let now = params.now.unix_ms();
        self.write_all_or_nothing(move |conn| {
            let err = db_err("reclaiming leases");
            let sql = format!(
                "SELECT {COUNTER_COLUMNS}, {SILENT_WORKER} FROM jobs j LEFT JOIN workers w ON w.worker_id = j.worker_id \
                 WHERE j.status = 'running' AND j.lease_expires_at <= ?1"
            );
            let expired: Vec<((String, u32, Counters), bool)> = conn
                .prepare_cached(&sql)
                .and_then(|mut s| s.query_map(params![now], |r| Ok((counters_of(r)?, r.get(11)?)))?.collect())
                .map_err(&err)?;
            let mut report = ReclaimReport::default();
            for ((id, attempt, counters), silent) in expired {
                let effects = attempt_effects(conn, &id, attempt).map_err(&err)?;
                let decision = if silent {
                    unfinished::died(&counters, effects.as_ref(), &Death::Silent, params.now)
                } else {
                    Decision { fate: unfinished::lost_lease(&counters, effects.as_ref(), params.now), died: false }
                };
                report.count(&decision.fate);
                apply_fate(conn, &id, &decision, params.queue_ttl, params.now).map_err(&err)?;
            }
            Ok(report)
        })
        .await
    }

    async fn worker_died(&self, params: WorkerDiedParams) -> Result<ReclaimReport, StoreError> {
        self.write_all_or_nothing(move |conn| {
            let err = db_err("reclaiming a dead worker's jobs");
            let sql = format!("SELECT {COUNTER_COLUMNS} FROM jobs WHERE status = 'running' AND worker_id = ?1");
            let held: Vec<(String, u32, Counters)> = conn
                .prepare_cached(&sql)
                .and_then(|mut s| s.query_map(params![params.worker_id], counters_of)?.collect())
                .map_err(&err)?;
            let death = Death::Seen { how: &params.how, stderr: &params.stderr };
            let mut report = ReclaimReport::default();
            for (id, attempt, counters) in held {
                let effects = attempt_effects(conn, &id, attempt).map_err(&err)?;
                let decision = unfinished::died(&counters, effects.as_ref(), &death, params.now);
                report.count(&decision.fate);
                apply_fate(conn, &id, &decision, params.queue_ttl, params.now).map_err(&err)?;
            }
            conn.execute(
                "UPDATE workers SET state = 'stopped', running = 0, last_heartbeat = MAX(last_heartbeat, ?2) \
                 WHERE worker_id = ?1",
                params![params.worker_id, params.now.unix_ms()],
            )
            .map_err(&err)?;
            Ok(report)
        })
        .await
    }

    async fn jobs_expire_queued(&self, params: JobsExpireParams) -> Result<u64, StoreError> {
        let now = params.now.unix_ms();
        self.write(move |conn| {
            let n = conn
                .execute(
                    "UPDATE jobs SET status = 'failed', finished_at = ?1, error_kind = 'expired', \
                     error_message = CASE \
                       WHEN status = 'pending_approval' THEN 'Expired: no decision came within its approval TTL' \
                       WHEN status = 'approved' THEN 'Expired: approved, but its run was never triggered' \
                       WHEN deadline_at <= ?1 THEN 'Expired: the job could not start before its deadline' \
                       ELSE 'Expired: the job waited in the queue past its expiry' END \
                     WHERE (status = 'queued' OR status = 'pending_approval' OR status = 'approved') AND expires_at <= ?1",
                    params![now],
                )
                .map_err(db_err("expiring queued jobs"))?;
            Ok(n as u64)
        })
        .await
    }

    async fn jobs_delete_expired(&self, params: JobsDeleteParams) -> Result<u64, StoreError> {
        let cutoff = params.finished_before.unix_ms();
        let events_cutoff = params.events_before.unix_ms();
        self.write_all_or_nothing(move |conn| {
            let err = db_err("deleting old jobs");
            let old = format!("finished_at IS NOT NULL AND finished_at < ?1 AND {NOT_HELD_BY_A_PLAN}");
            conn.execute(
                &format!("DELETE FROM effects WHERE job_id IN (SELECT job_id FROM jobs WHERE {old})"),
                params![cutoff],
            )
            .map_err(&err)?;
            let n = conn.execute(&format!("DELETE FROM jobs WHERE {old}"), params![cutoff]).map_err(&err)?;
            conn.execute(DELETE_EMPTY_PLANS, []).map_err(&err)?;
            // Events go as one prefix of the feed, up to the first event at
            // or after the cutoff (found by reading from the oldest: the
            // rows read are the rows deleted), and never the newest, so a
            // number is never given out again; the horizon remembers how far.
            let (first_kept, newest): (Option<i64>, Option<i64>) = conn
                .query_row(
                    "SELECT (SELECT seq FROM events WHERE at >= ?1 ORDER BY seq LIMIT 1), (SELECT MAX(seq) FROM events)",
                    params![events_cutoff],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .map_err(&err)?;
            let horizon = first_kept.or(newest).map(|seq| seq - 1);
            if let Some(horizon) = horizon.filter(|&h| h > 0) {
                conn.execute("DELETE FROM events WHERE seq <= ?1", params![horizon]).map_err(&err)?;
                conn.execute(
                    "INSERT INTO event_horizon (id, txn, seq) VALUES (1, 0, ?1) \
                     ON CONFLICT (id) DO UPDATE SET seq = MAX(seq, excluded.seq)",
                    params![horizon],
                )
                .map_err(&err)?;
            }
            Ok(n as u64)
        })
        .await
    }

    async fn effect_begin(&self, params: EffectBeginParams) -> Result<Option<Effect>, StoreError> {
        let id = params.id;
        self.write(move |conn| {
            let row = conn
                .prepare_cached(
                    "INSERT INTO effects (job_id, attempt, seq, method, url, started_at) \
                     SELECT j.job_id, j.attempt, 1 + COALESCE((SELECT MAX(e.seq) FROM effects e \
                       WHERE e.job_id = j.job_id AND e.attempt = j.attempt), 0), ?3, ?4, ?5 \
                     FROM jobs j WHERE j.job_id = ?1 AND j.status = 'running' AND j.lease_token = ?2 \
                     RETURNING attempt, seq",
                )
                .and_then(|mut s| {
                    s.query_row(
                        params![id.to_string(), params.token, params.method, params.url, params.now.unix_ms()],
                        |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)),
                    )
                    .optional()
                })
                .map_err(db_err("recording an effect"))?;
            Ok(row.map(|(attempt, seq)| EffectRow::intent(params, attempt, seq)))
        })
        .await
    }

    async fn effect_end(&self, params: EffectEndParams) -> Result<(), StoreError> {
        self.write(move |conn| {
            let (status, error) = outcome_columns(&params.outcome);
            conn.prepare_cached(
                "UPDATE effects SET finished_at = ?4, status = ?5, error = ?6 \
                 WHERE job_id = ?1 AND attempt = ?2 AND seq = ?3 AND finished_at IS NULL",
            )
            .and_then(|mut s| {
                s.execute(params![
                    params.id.to_string(),
                    params.attempt,
                    params.seq,
                    params.now.unix_ms(),
                    status,
                    error
                ])
            })
            .map_err(db_err("recording an effect's outcome"))?;
            Ok(())
        })
        .await
    }

    async fn effects(&self, id: JobId) -> Result<Vec<Effect>, StoreError> {
        self.read(move |conn| {
            let err = db_err("reading effects");
            let mut stmt = conn
                .prepare_cached(&format!(
                    "SELECT {EFFECT_COLUMNS} FROM effects WHERE job_id = ?1 ORDER BY attempt, seq"
                ))
                .map_err(&err)?;
            let rows = stmt
                .query_map(params![id.to_string()], |r| {
                    Ok(EffectRow {
                        attempt: r.get(0)?,
                        seq: r.get(1)?,
                        method: r.get(2)?,
                        url: r.get(3)?,
                        started_at: r.get(4)?,
                        finished_at: r.get(5)?,
                        status: r.get(6)?,
                        error: r.get(7)?,
                    })
                })
                .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
                .map_err(&err)?;
            Ok(rows.into_iter().map(|r| r.into_effect(id)).collect())
        })
        .await
    }

    async fn plugin_put(&self, params: PluginPutParams) -> Result<Digest, StoreError> {
        let digest = Digest::of(&params.bytes);
        self.write(move |conn| {
            conn.prepare_cached(
                "INSERT INTO plugins (digest, bytes, size_bytes, created_at) VALUES (?1, ?2, ?3, ?4) \
                 ON CONFLICT (digest) DO NOTHING",
            )
            .and_then(|mut s| {
                s.execute(params![digest.to_string(), params.bytes, params.bytes.len() as i64, params.now.unix_ms()])
            })
            .map_err(db_err("storing a plugin"))?;
            Ok(digest)
        })
        .await
    }

    async fn plugin_get(&self, digest: Digest) -> Result<Option<Vec<u8>>, StoreError> {
        self.read(move |conn| {
            conn.query_row("SELECT bytes FROM plugins WHERE digest = ?1", params![digest.to_string()], |r| r.get(0))
                .optional()
                .map_err(db_err("reading a plugin"))
        })
        .await
    }

    async fn plugin_name_set(&self, params: PluginNameParams) -> Result<PluginInfo, StoreError> {
        self.write_all_or_nothing(move |conn| {
            let err = db_err("naming a plugin");
            let (name, version) = (&params.name.name, &params.name.version);
            // A replaced pair keeps its grants and its approval policy.
            let kept: Option<(Option<String>, Option<String>)> = conn
                .query_row(
                    "SELECT grants_json, approval_json FROM plugin_names WHERE name = ?1 AND version = ?2",
                    params![name, version],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()
                .map_err(&err)?;
            let (grants, kept_policy) = kept.unwrap_or_default();
            let policy = match &params.policy {
                Some(policy) => policy_to_column(policy)?,
                None => kept_policy,
            };
            conn.prepare_cached("DELETE FROM plugin_names WHERE name = ?1 AND version = ?2")
                .and_then(|mut s| s.execute(params![name, version]))
                .map_err(&err)?;
            let inserted = conn
                .prepare_cached(
                    "INSERT INTO plugin_names (name, version, digest, created_at, grants_json, approval_json) \
                     SELECT ?1, ?2, digest, ?4, ?5, ?6 FROM plugins WHERE digest = ?3",
                )
                .and_then(|mut s| {
                    s.execute(params![name, version, params.digest.to_string(), params.now.unix_ms(), grants, policy])
                })
                .map_err(&err)?;
            if inserted == 0 {
                return Err(StoreError::Invalid(format!("plugin {} is not stored", params.digest)));
            }
            let size: i64 = conn
                .query_row(
                    "SELECT size_bytes FROM plugins WHERE digest = ?1",
                    params![params.digest.to_string()],
                    |r| r.get(0),
                )
                .map_err(&err)?;
            Ok(PluginInfo {
                grants: grants_of(&params.digest.to_string(), grants)?,
                approval: policy_of(&params.digest.to_string(), policy)?,
                name: Some(params.name),
                digest: params.digest,
                size_bytes: size as u64,
                created_at: params.now,
                requests: None,
            })
        })
        .await
    }

    async fn plugin_grants_set(&self, params: PluginGrantsParams) -> Result<Option<PluginInfo>, StoreError> {
        let grants = grants_to_column(&params.grants)?;
        let name = params.name.clone();
        let changed = self
            .write(move |conn| {
                conn.prepare_cached("UPDATE plugin_names SET grants_json = ?3 WHERE name = ?1 AND version = ?2")
                    .and_then(|mut s| s.execute(params![name.name, name.version, grants]))
                    .map_err(db_err("granting a plugin"))
            })
            .await?;
        if changed == 0 {
            return Ok(None);
        }
        self.plugin_resolve(PluginRef::Version(params.name)).await
    }

    async fn plugin_policy_set(&self, params: PluginPolicyParams) -> Result<Option<PluginInfo>, StoreError> {
        let policy = policy_to_column(&params.policy)?;
        let name = params.name.clone();
        let changed = self
            .write(move |conn| {
                conn.prepare_cached("UPDATE plugin_names SET approval_json = ?3 WHERE name = ?1 AND version = ?2")
                    .and_then(|mut s| s.execute(params![name.name, name.version, policy]))
                    .map_err(db_err("setting a plugin's approval policy"))
            })
            .await?;
        if changed == 0 {
            return Ok(None);
        }
        self.plugin_resolve(PluginRef::Version(params.name)).await
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
                    ms(queue_ttl),
                    ms(approval_ttl),
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
                "SELECT {PLAN_COLUMNS} FROM plans WHERE ?1 IS NULL OR plan_id < ?1 ORDER BY plan_id DESC LIMIT ?2"
            );
            Ok(query_plans(conn, &sql, params![params.before, params.limit.max(1)])?
                .into_iter()
                .map(|p| p.record)
                .collect())
        })
        .await
    }

    async fn plans_advance(&self, params: PlansAdvanceParams) -> Result<Vec<Job>, StoreError> {
        self.write_all_or_nothing(move |conn| {
            let err = db_err("advancing plans");
            let sql = format!(
                "SELECT {PLAN_COLUMNS} FROM plans p WHERE apply_job_id IS NULL AND cancelled_at IS NULL \
                 AND (?1 IS NULL OR plan_id = ?1) \
                 AND EXISTS (SELECT 1 FROM jobs j WHERE j.job_id = p.execute_job_id AND j.status = 'succeeded') \
                 ORDER BY plan_id LIMIT 100"
            );
            let due = query_plans(conn, &sql, params![params.plan_id])?;
            let one = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE job_id = ?1");
            let mut created = Vec::with_capacity(due.len());
            for plan in due {
                let execute = query_jobs(conn, &one, params![plan.record.execute_job.to_string()])?
                    .pop()
                    .ok_or_else(|| corrupt(&plan.record.plan_id, "its execute job is missing"))?;
                let apply = insert_rows(conn, vec![apply_job(&plan, &execute)], params.now)?.remove(0);
                conn.prepare_cached("UPDATE plans SET apply_job_id = ?2 WHERE plan_id = ?1 AND apply_job_id IS NULL")
                    .and_then(|mut s| s.execute(params![plan.record.plan_id, apply.id.to_string()]))
                    .map_err(&err)?;
                created.push(apply);
            }
            Ok(created)
        })
        .await
    }

    async fn plan_cancel(&self, plan_id: String, now: Timestamp) -> Result<Option<PlanRecord>, StoreError> {
        self.write(move |conn| {
            conn.prepare_cached("UPDATE plans SET cancelled_at = COALESCE(cancelled_at, ?2) WHERE plan_id = ?1")
                .and_then(|mut s| s.execute(params![plan_id, now.unix_ms()]))
                .map_err(db_err("cancelling a plan"))?;
            let sql = format!("SELECT {PLAN_COLUMNS} FROM plans WHERE plan_id = ?1");
            Ok(query_plans(conn, &sql, params![plan_id])?.pop().map(|p| p.record))
        })
        .await
    }

    async fn plugin_list(&self) -> Result<Vec<PluginInfo>, StoreError> {
        self.read(|conn| {
            query_plugins(
                conn,
                "SELECT name, version, digest, size_bytes, created_at, grants_json, approval_json FROM ( \
                   SELECT n.name, n.version, n.digest, p.size_bytes, n.created_at, n.grants_json, n.approval_json, \
                   n.rowid AS seq FROM plugin_names n JOIN plugins p ON p.digest = n.digest \
                   UNION ALL \
                   SELECT NULL, NULL, p.digest, p.size_bytes, p.created_at, NULL, NULL, 0 FROM plugins p \
                   WHERE NOT EXISTS (SELECT 1 FROM plugin_names n WHERE n.digest = p.digest)) \
                 ORDER BY name IS NULL, name, seq DESC, created_at DESC",
                [],
            )
        })
        .await
    }

    async fn plugin_resolve(&self, plugin: PluginRef) -> Result<Option<PluginInfo>, StoreError> {
        self.read(move |conn| {
            let found = match plugin {
                PluginRef::Digest(digest) => query_plugins(
                    conn,
                    "SELECT n.name, n.version, p.digest, p.size_bytes, COALESCE(n.created_at, p.created_at), \
                     n.grants_json, n.approval_json FROM plugins p LEFT JOIN plugin_names n ON n.digest = p.digest \
                     WHERE p.digest = ?1 ORDER BY n.rowid DESC LIMIT 1",
                    params![digest.to_string()],
                )?,
                PluginRef::Name(name) => query_plugins(
                    conn,
                    "SELECT n.name, n.version, n.digest, p.size_bytes, n.created_at, n.grants_json, n.approval_json \
                     FROM plugin_names n JOIN plugins p ON p.digest = n.digest WHERE n.name = ?1 \
                     ORDER BY n.rowid DESC LIMIT 1",
                    params![name],
                )?,
                PluginRef::Version(v) => query_plugins(
                    conn,
                    "SELECT n.name, n.version, n.digest, p.size_bytes, n.created_at, n.grants_json, n.approval_json \
                     FROM plugin_names n JOIN plugins p ON p.digest = n.digest WHERE n.name = ?1 AND n.version = ?2",
                    params![v.name, v.version],
                )?,
            };
            Ok(found.into_iter().next())
        })
        .await
    }

    async fn job_list(&self, params: JobListParams) -> Result<Vec<Job>, StoreError> {
        self.read(move |conn| {
            // List rows leave the payload and output behind.
            let columns = JOB_COLUMNS.replacen("payload", "X''", 1).replacen(" output,", " NULL,", 1);
            let mut sql = format!("SELECT {columns} FROM jobs WHERE 1 = 1");
            let mut args: Vec<String> = Vec::new();
            for (condition, value) in list_filters(&params) {
                args.push(value);
                sql.push_str(&format!(" AND {condition} ?{}", args.len()));
            }
            sql.push_str(&format!(" ORDER BY job_id DESC LIMIT {}", params.limit.max(1)));
            query_jobs(conn, &sql, rusqlite::params_from_iter(args.iter()))
        })
        .await
    }

    async fn job_progress_set(&self, params: JobProgressParams) -> Result<bool, StoreError> {
        let progress = to_json(&params.progress)?;
        self.write(move |conn| {
            let changed = conn
                .prepare_cached(
                    "UPDATE jobs SET progress_json = ?1, last_heartbeat = ?2 \
                     WHERE job_id = ?3 AND status = 'running' AND lease_token = ?4",
                )
                .and_then(|mut s| {
                    s.execute(params![progress, params.now.unix_ms(), params.id.to_string(), params.token])
                })
                .map_err(db_err("recording progress"))?;
            Ok(changed == 1)
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

    async fn queued_count(&self) -> Result<u64, StoreError> {
        self.read(|conn| {
            // Answered from a partial index on queued rows: only they are read.
            conn.prepare_cached("SELECT COUNT(*) FROM jobs WHERE status = 'queued'")
                .and_then(|mut s| s.query_row([], |r| r.get::<_, i64>(0)))
                .map(|n| n as u64)
                .map_err(db_err("counting queued jobs"))
        })
        .await
    }

    async fn counts_snapshot(&self) -> Result<Counts, StoreError> {
        self.read(count_jobs).await
    }

    async fn events_after(&self, params: EventsAfterParams) -> Result<EventPage, StoreError> {
        self.read(move |conn| read_events(conn, params.after, params.limit)).await
    }

    async fn events_head(&self) -> Result<Option<EventId>, StoreError> {
        self.read(|conn| {
            let seq: Option<i64> =
                conn.query_row("SELECT MAX(seq) FROM events", [], |r| r.get(0)).map_err(db_err("reading events"))?;
            Ok(seq.map(|seq| EventId { txn: 0, seq: seq as u64 }))
        })
        .await
    }

    async fn worker_beat(&self, worker: WorkerRecord) -> Result<(), StoreError> {
        self.write(move |conn| {
            conn.prepare_cached(
                "INSERT INTO workers (worker_id, host, pid, version, slots, running, state, poll_interval_ms, \
                 processed, failed, cancelled, started_at, last_heartbeat) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13) \
                 ON CONFLICT (worker_id) DO UPDATE SET host = excluded.host, pid = excluded.pid, \
                 version = excluded.version, slots = excluded.slots, running = excluded.running, \
                 state = excluded.state, poll_interval_ms = excluded.poll_interval_ms, \
                 processed = excluded.processed, failed = excluded.failed, cancelled = excluded.cancelled, \
                 last_heartbeat = excluded.last_heartbeat",
            )
            .and_then(|mut s| {
                s.execute(params![
                    worker.worker_id,
                    worker.host,
                    worker.pid,
                    worker.version,
                    worker.slots,
                    worker.running,
                    worker.state.as_str(),
                    i64_of(worker.poll_interval_ms),
                    worker.processed as i64,
                    worker.failed as i64,
                    worker.cancelled as i64,
                    worker.started_at.unix_ms(),
                    worker.last_heartbeat.unix_ms(),
                ])
            })
            .map_err(db_err("registering a worker"))?;
            Ok(())
        })
        .await
    }

    async fn workers_snapshot(&self) -> Result<WorkersSnapshot, StoreError> {
        self.read(|conn| {
            let err = db_err("reading the workers");
            // One read transaction: the three reads see the same state.
            conn.execute_batch("BEGIN").map_err(&err)?;
            let read = (|| {
                let workers = conn
                    .prepare_cached(
                        "SELECT worker_id, host, pid, version, slots, running, state, poll_interval_ms, processed, \
                         failed, cancelled, started_at, last_heartbeat FROM workers ORDER BY started_at, worker_id",
                    )
                    .and_then(|mut s| {
                        s.query_map([], |r| {
                            Ok((
                                WorkerRecord {
                                    worker_id: r.get(0)?,
                                    host: r.get(1)?,
                                    pid: r.get(2)?,
                                    version: r.get(3)?,
                                    slots: r.get(4)?,
                                    running: r.get(5)?,
                                    state: WorkerState::Stopped,
                                    poll_interval_ms: r.get::<_, i64>(7)?.max(0) as u64,
                                    processed: r.get::<_, i64>(8)?.max(0) as u64,
                                    failed: r.get::<_, i64>(9)?.max(0) as u64,
                                    cancelled: r.get::<_, i64>(10)?.max(0) as u64,
                                    started_at: Timestamp::from_unix_ms(r.get(11)?),
                                    last_heartbeat: Timestamp::from_unix_ms(r.get(12)?),
                                },
                                r.get::<_, String>(6)?,
                            ))
                        })?
                        .collect::<Result<Vec<_>, _>>()
                    })
                    .map_err(&err)?
                    .into_iter()
                    .map(|(mut worker, state)| {
                        worker.state = state.parse().map_err(|e: String| corrupt(&worker.worker_id, e))?;
                        Ok(worker)
                    })
                    .collect::<Result<Vec<_>, StoreError>>()?;
                let running_jobs = conn
                    .prepare_cached(
                        "SELECT job_id, worker_id FROM jobs WHERE status = 'running' ORDER BY worker_id, job_id",
                    )
                    .and_then(|mut s| {
                        s.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?
                            .collect::<Result<Vec<_>, _>>()
                    })
                    .map_err(&err)?
                    .into_iter()
                    .map(|(id, worker)| Ok((id.parse().map_err(|e: String| corrupt(&id, e))?, worker)))
                    .collect::<Result<Vec<_>, StoreError>>()?;
                Ok(WorkersSnapshot { workers, running_jobs, counts: count_jobs(conn)? })
            })();
            let _ = conn.execute_batch("COMMIT");
            read
        })
        .await
    }

    async fn workers_delete_stale(&self, last_heartbeat_before: Timestamp) -> Result<u64, StoreError> {
        self.write(move |conn| {
            let n = conn
                .execute("DELETE FROM workers WHERE last_heartbeat < ?1", params![last_heartbeat_before.unix_ms()])
                .map_err(db_err("deleting old workers"))?;
            Ok(n as u64)
        })
        .await
    }
}

/// A job's counters (see [`COUNTER_COLUMNS`]): its id, attempt and the rest.
fn counters_of(r: &Row<'_>) -> rusqlite::Result<(String, u32, Counters)> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        Counters {
            lost_leases: r.get(2)?,
            retries: r.get(3)?,
            max_attempts: r.get(4)?,
            free_reruns: r.get(5)?,
            free_rerun_limit: r.get(6)?,
            cancel_requested: r.get(7)?,
            backoff: Backoff { base_ms: r.get::<_, i64>(8)?.max(0) as u64, cap_ms: r.get::<_, i64>(9)?.max(0) as u64 },
            process_deaths: r.get(10)?,
        },
    ))
}

/// What the attempt's effects were (`None`: it recorded none).
fn attempt_effects(conn: &Connection, id: &str, attempt: u32) -> rusqlite::Result<Option<AttemptEffects>> {
    conn.prepare_cached(unfinished::ATTEMPT_EFFECTS_SQLITE)?
        .query_row(params![id, attempt], |r| {
            Ok(AttemptEffects {
                seq: r.get(0)?,
                method: r.get(1)?,
                url: r.get(2)?,
                status: r.get(3)?,
                error: r.get(4)?,
                in_flight: r.get(5)?,
            })
        })
        .optional()
}

/// Apply `decision` to the job `id`, whose owner the caller checked (or
/// whose lease ran out, or whose process died).
fn apply_fate(
    conn: &Connection,
    id: &str,
    decision: &Decision,
    queue_ttl: Duration,
    now: Timestamp,
) -> rusqlite::Result<()> {
    match &decision.fate {
        Fate::Requeue { run_after, last_error, .. } => {
            let run_after = run_after.unix_ms();
            let sql = format!(
                "UPDATE jobs SET status = 'queued', lease_token = NULL, lease_expires_at = NULL{}, run_after = ?1, \
                 last_error = ?2, expires_at = MIN(MAX(expires_at, ?3), COALESCE(deadline_at, MAX(expires_at, ?3))) \
                 WHERE job_id = ?4",
                decision.bumps()
            );
            conn.prepare_cached(&sql)?.execute(params![
                run_after,
                last_error,
                run_after.saturating_add(ms(queue_ttl)),
                id
            ])?;
        }
        Fate::End { cancelled, kind, message, .. } => {
            let sql = format!(
                "UPDATE jobs SET status = ?1, error_kind = ?2, error_message = ?3, finished_at = ?4, \
                 lease_token = NULL, lease_expires_at = NULL{} WHERE job_id = ?5",
                decision.bumps()
            );
            let status = if *cancelled { "cancelled" } else { "failed" };
            conn.prepare_cached(&sql)?.execute(params![status, kind.as_str(), message, now.unix_ms(), id])?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::migrations::MIGRATIONS;
    use super::*;

    fn raw(dir: &tempfile::TempDir) -> (SqliteStore, Connection) {
        let path = dir.path().join("jobs.db");
        let store = SqliteStore::open(&path, Durability::Normal).unwrap();
        (store, Connection::open(&path).unwrap())
    }

    fn insert_raw(conn: &Connection, id: &str, status: &str, extra: &str) -> rusqlite::Result<usize> {
        conn.execute(
            &format!(
                "INSERT INTO jobs (job_id, phase, plugin_digest, status, payload, limits_json, schema_version, \
                 created_at, expires_at, max_attempts{}) VALUES ('{id}', 'execute', 'sha256:00', '{status}', x'', '{{}}', 1, 0, 0, 1{})",
                if extra.is_empty() { "" } else { ", " },
                extra
            ),
            [],
        )
    }

    #[test]
    fn the_queued_count_reads_only_a_queued_only_index() {
        let dir = tempfile::tempdir().unwrap();
        let (_store, conn) = raw(&dir);
        let plan: String = conn
            .query_row("EXPLAIN QUERY PLAN SELECT COUNT(*) FROM jobs WHERE status = 'queued'", [], |r| r.get(3))
            .unwrap();
        // The claim index holds queued rows only (the expiry index holds
        // gated ones too, so it would need the table).
        assert!(plan.contains("COVERING INDEX jobs_claim_due"), "{plan}");
    }

    #[test]
    fn the_schema_refuses_states_the_lifecycle_forbids() {
        let dir = tempfile::tempdir().unwrap();
        let (_store, conn) = raw(&dir);
        assert!(insert_raw(&conn, "a", "queued", "").is_ok());
        assert!(insert_raw(&conn, "b", "bogus", "").is_err(), "unknown status");
        assert!(insert_raw(&conn, "c", "running", "").is_err(), "running without a lease");
        assert!(insert_raw(&conn, "d", "succeeded", "").is_err(), "terminal without finished_at");
        assert!(conn.execute("UPDATE jobs SET phase = 'plan' WHERE job_id = 'a'", []).is_err(), "unknown phase");
        assert!(conn.execute("UPDATE jobs SET max_attempts = 0 WHERE job_id = 'a'", []).is_err());
        assert!(
            conn.execute("UPDATE jobs SET status = 'failed', finished_at = 1 WHERE job_id = 'a'", []).is_err(),
            "failed without an error kind"
        );
    }

    #[test]
    fn two_running_jobs_cannot_share_a_concurrency_key() {
        let dir = tempfile::tempdir().unwrap();
        let (_store, conn) = raw(&dir);
        conn.execute_batch(
            "INSERT INTO jobs (job_id, phase, plugin_digest, status, payload, limits_json, schema_version, created_at, \
             expires_at, max_attempts, worker_id, lease_token, lease_expires_at, started_at, concurrency_key) VALUES \
             ('a', 'execute', 'd', 'running', x'', '{}', 1, 0, 0, 1, 'w', 't1', 1, 0, 'plan-1')",
        )
        .unwrap();
        let second = conn.execute_batch(
            "INSERT INTO jobs (job_id, phase, plugin_digest, status, payload, limits_json, schema_version, created_at, \
             expires_at, max_attempts, worker_id, lease_token, lease_expires_at, started_at, concurrency_key) VALUES \
             ('b', 'execute', 'd', 'running', x'', '{}', 1, 0, 0, 1, 'w', 't2', 1, 0, 'plan-1')",
        );
        assert!(second.is_err());
    }

    /// A database at `path` with every migration before the first whose
    /// text contains `marker`, as an older leash left it.
    fn migrated_up_to(path: &Path, marker: &str) -> Connection {
        let first_not_applied = MIGRATIONS.iter().position(|m| m.contains(marker)).unwrap();
        let conn = Connection::open(path).unwrap();
        conn.execute_batch("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)")
            .unwrap();
        for (i, sql) in MIGRATIONS[..first_not_applied].iter().enumerate() {
            conn.execute_batch(sql).unwrap();
            conn.execute("INSERT INTO schema_migrations VALUES (?1, 0)", params![i as i64 + 1]).unwrap();
        }
        conn
    }

    /// A database made before approval gates (the table rebuild) keeps its
    /// rows, gains the new states and still refuses the old bad ones.
    #[test]
    fn the_approval_migration_keeps_every_row_and_widens_the_states() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.db");
        {
            let conn = migrated_up_to(&path, "CREATE TABLE jobs_next");
            conn.execute_batch(
                "INSERT INTO jobs (job_id, phase, plugin_digest, status, payload, limits_json, schema_version, \
                 created_at, expires_at, max_attempts, concurrency_key, idempotency_key, free_rerun_limit, releases) \
                 VALUES ('q', 'execute', 'sha256:00', 'queued', x'', '{}', 1, 0, 0, 1, 'k', 'idem', 3, 2); \
                 INSERT INTO jobs (job_id, phase, plugin_digest, status, payload, limits_json, schema_version, \
                 created_at, expires_at, max_attempts, finished_at, error_kind, error_message) VALUES \
                 ('f', 'execute', 'sha256:00', 'failed', x'', '{}', 1, 0, 0, 1, 5, 'trap', 'Trap: x');",
            )
            .unwrap();
        }
        drop(SqliteStore::open(&path, Durability::Normal).unwrap());
        let conn = Connection::open(&path).unwrap();
        let kept: (String, String, i64, i64) = conn
            .query_row(
                "SELECT concurrency_key, idempotency_key, free_rerun_limit, releases FROM jobs WHERE job_id = 'q'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .unwrap();
        assert_eq!(kept, ("k".to_owned(), "idem".to_owned(), 3, 2), "every column survives the rebuild");
        let n: i64 = conn.query_row("SELECT COUNT(*) FROM jobs", [], |r| r.get(0)).unwrap();
        assert_eq!(n, 2);
        assert!(insert_raw(&conn, "p", "pending_approval", "").is_err(), "a gated state needs its record");
        conn.execute(
            "INSERT INTO jobs (job_id, phase, plugin_digest, status, payload, limits_json, schema_version, created_at,              expires_at, max_attempts, approval_json) VALUES ('p', 'execute', 'sha256:00', 'pending_approval', x'',              '{}', 1, 0, 0, 1, '{}')",
            [],
        )
        .unwrap();
        assert!(insert_raw(&conn, "b", "bogus", "").is_err(), "unknown states are still refused");
        let indexes: i64 = conn
            .query_row(
                "SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND tbl_name = 'jobs' AND sql IS NOT NULL",
                [],
                |r| r.get(0),
            )
            .unwrap();
        // Ten, less the two a later migration merged into `jobs_running`,
        // and the suspects' index a later migration added.
        assert_eq!(indexes, 10, "every index is rebuilt");
    }

    /// A plugin stored before the plugins table put its bytes last keeps
    /// them, its size and its age; afterwards reading its size touches one
    /// page, not the component's overflow chain.
    #[test]
    fn the_plugin_table_rebuild_keeps_plugins_and_reads_sizes_without_the_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.db");
        let bytes = vec![9u8; 200_000];
        let digest = Digest::of(&bytes).to_string();
        {
            let conn = migrated_up_to(&path, "CREATE TABLE plugins_next");
            conn.execute(
                "INSERT INTO plugins (digest, bytes, size_bytes, created_at) VALUES (?1, ?2, ?3, 7)",
                params![digest, bytes, bytes.len() as i64],
            )
            .unwrap();
            conn.execute(
                "INSERT INTO plugin_names (name, version, digest, created_at) VALUES ('p', '1', ?1, 8)",
                [&digest],
            )
            .unwrap();
        }
        let store = SqliteStore::open(&path, Durability::Normal).unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let kept: (Vec<u8>, i64, i64) = Connection::open(&path)
            .unwrap()
            .query_row("SELECT bytes, size_bytes, created_at FROM plugins WHERE digest = ?1", [&digest], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .unwrap();
        assert_eq!(kept, (bytes.clone(), bytes.len() as i64, 7), "the plugin survives the rebuild");
        let named = runtime.block_on(store.plugin_resolve("p@1".parse().unwrap())).unwrap().unwrap();
        assert_eq!((named.size_bytes, named.created_at.unix_ms()), (bytes.len() as u64, 8), "the name still resolves");
        // A fresh connection with no cache: the pages the size read loads.
        let conn = Connection::open(&path).unwrap();
        conn.pragma_update(None, "cache_size", 0).unwrap();
        let size = "SELECT size_bytes FROM plugins WHERE digest = ?1";
        let cache_misses = |reset: i32| {
            let (mut pages, mut highest) = (0, 0);
            // SAFETY: the handle is this live connection's, used on this
            // thread only, and the two outputs are live locals.
            let status = unsafe {
                rusqlite::ffi::sqlite3_db_status(
                    conn.handle(),
                    rusqlite::ffi::SQLITE_DBSTATUS_CACHE_MISS,
                    &mut pages,
                    &mut highest,
                    reset,
                )
            };
            assert_eq!(status, rusqlite::ffi::SQLITE_OK);
            pages
        };
        // The schema loads with the first statement: not counted.
        conn.prepare(size).unwrap();
        cache_misses(1);
        conn.query_row(size, [&digest], |r| r.get::<_, i64>(0)).unwrap();
        let pages = cache_misses(0);
        assert!(pages < 8, "reading a size loaded {pages} pages: the component's overflow chain");
    }

    /// A database whose change feed was made with AUTOINCREMENT keeps its
    /// events through the rebuild, the triggers still write them, and new
    /// numbers go on past the old ones.
    #[test]
    fn the_event_table_rebuild_keeps_the_feed_and_its_numbering() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.db");
        {
            let conn = migrated_up_to(&path, "CREATE TABLE events_next");
            insert_raw(&conn, "a", "queued", "").unwrap();
            insert_raw(&conn, "b", "queued", "").unwrap();
            // Retention had deleted the first: AUTOINCREMENT remembered it.
            conn.execute_batch("DELETE FROM events WHERE job_id = 'a'").unwrap();
        }
        drop(SqliteStore::open(&path, Durability::Normal).unwrap());
        let conn = Connection::open(&path).unwrap();
        let seqs = |conn: &Connection| -> Vec<(i64, String)> {
            let mut stmt = conn.prepare("SELECT seq, job_id FROM events ORDER BY seq").unwrap();
            stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap().map(Result::unwrap).collect()
        };
        assert_eq!(seqs(&conn), [(2, "b".to_owned())], "the old events survive, numbers and all");
        insert_raw(&conn, "c", "queued", "").unwrap();
        assert_eq!(seqs(&conn), [(2, "b".to_owned()), (3, "c".to_owned())], "the triggers write on, past the old");
        let sql: String = conn
            .query_row("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'events'", [], |r| r.get(0))
            .unwrap();
        assert!(!sql.contains("AUTOINCREMENT"), "{sql}");
    }

    /// The opcodes (name, P2) of `sql`, its triggers' programs included.
    fn opcodes(conn: &Connection, sql: &str) -> Vec<(String, i64)> {
        let mut stmt = conn.prepare(&format!("EXPLAIN {sql}")).unwrap();
        stmt.query_map(rusqlite::params_from_iter((0..stmt.parameter_count()).map(|_| 1)), |r| {
            Ok((r.get(1)?, r.get(3)?))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect()
    }

    /// The claim's update, the finish and an event's insert build no
    /// temporary b-tree: SQLite makes one for every `IN (…)` list a
    /// statement checks, each time it runs.
    #[test]
    fn the_hot_statements_build_no_temporary_tables() {
        let dir = tempfile::tempdir().unwrap();
        let (_store, conn) = raw(&dir);
        for sql in [CLAIM_ONE, FINISH_ONE, "INSERT INTO events (at, what, status) VALUES (?1, 'insert', 'queued')"] {
            assert!(!opcodes(&conn, sql).iter().any(|(op, _)| op == "OpenEphemeral"), "{sql}");
        }
        assert!(insert_raw(&conn, "b", "bogus", "").is_err(), "the CHECKs still refuse unknown states");
    }

    /// The claim's update, the finish and a one-job insert, triggers included, need no
    /// statement journal: SQLite keeps one (a copy of every page the
    /// statement touches) for a statement that writes several rows and may
    /// stop halfway, which a constraint failing with `ABORT` or any function
    /// call can.
    #[test]
    fn the_hot_statements_need_no_statement_journal() {
        let dir = tempfile::tempdir().unwrap();
        let (store, conn) = raw(&dir);
        const ABORT: i64 = 2;
        for sql in [CLAIM_ONE, FINISH_ONE, &insert_sql(1)] {
            let ops = opcodes(&conn, sql);
            assert!(ops.iter().any(|(op, _)| op == "Program"), "the event triggers are part of {sql}");
            for (op, p2) in ops {
                assert!(op != "Function" && op != "PureFunc", "{sql} calls a function");
                assert!(!(op.starts_with("Halt") && p2 == ABORT), "{sql} may abort halfway ({op})");
            }
        }
        // What the triggers stamp events with: the writer's clock, set as
        // each of its transactions begins (from 0 here, so a clock the
        // writer did not set shows).
        conn.execute("UPDATE event_clock SET at = 0", []).unwrap();
        let before = Timestamp::now().unix_ms();
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(store.workers_delete_stale(Timestamp::from_unix_ms(0))).unwrap();
        let after = Timestamp::now().unix_ms();
        let clock: i64 = conn.query_row("SELECT at FROM event_clock", [], |r| r.get(0)).unwrap();
        assert!((before..=after).contains(&clock), "{before} <= {clock} <= {after}");
        insert_raw(&conn, "c", "queued", "").unwrap();
        let at: i64 = conn.query_row("SELECT at FROM events WHERE job_id = 'c'", [], |r| r.get(0)).unwrap();
        assert_eq!(at, clock);
    }

    /// A write without a statement journal that fails on a full disk makes
    /// SQLite roll back the whole transaction. The writes queued after it
    /// in the same batch must not then commit one by one while every
    /// caller hears an error: nothing of the batch is stored, the write
    /// that failed says why, and the others hear a transient error.
    #[test]
    fn a_batch_whose_transaction_is_rolled_back_stores_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jobs.db");
        let (writer, _reader) = open_when_free(&path, Durability::Normal).unwrap();
        let (first, first_answer) = write_op(false, |conn| insert_raw(conn, "a", "queued", "").map_err(db_err("a")));
        let (full, full_answer) = write_op(false, |conn| {
            let pages: i64 = conn.query_row("PRAGMA page_count", [], |r| r.get(0)).map_err(db_err("count"))?;
            conn.pragma_update(None, "max_page_count", pages).map_err(db_err("cap"))?;
            conn.execute("UPDATE OR FAIL jobs SET payload = ?1 WHERE job_id = 'a'", [vec![7u8; 1 << 20]])
                .map_err(db_err("growing a"))
        });
        let (last, last_answer) = write_op(false, |conn| {
            conn.pragma_update(None, "max_page_count", 1_000_000).map_err(db_err("uncap"))?;
            insert_raw(conn, "c", "queued", "").map_err(db_err("c"))
        });
        // Queued before the loop starts: one batch.
        let (tx, rx) = mpsc::channel();
        for op in [first, full, last] {
            tx.send(op).unwrap();
        }
        drop(tx);
        writer_loop(writer, rx);

        let answer =
            |rx: tokio::sync::oneshot::Receiver<Result<usize, StoreError>>| rx.blocking_recv().unwrap().unwrap_err();
        let (first, full, last) = (answer(first_answer), answer(full_answer), answer(last_answer));
        assert!(full.to_string().contains("growing a"), "the failed write says why: {full}");
        for other in [&first, &last] {
            assert!(other.is_transient(), "{other}");
            assert!(other.to_string().contains("nothing in the batch was stored"), "{other}");
        }
        let conn = Connection::open(&path).unwrap();
        let stored: i64 = conn.query_row("SELECT COUNT(*) FROM jobs", [], |r| r.get(0)).unwrap();
        assert_eq!(stored, 0, "a write after the rollback committed on its own");
    }

    #[test]
    fn reopening_does_not_reapply_migrations() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jobs.db");
        drop(SqliteStore::open(&path, Durability::Full).unwrap());
        drop(SqliteStore::open(&path, Durability::Normal).unwrap());
        let conn = Connection::open(&path).unwrap();
        let n: i64 = conn.query_row("SELECT COUNT(*) FROM schema_migrations", [], |r| r.get(0)).unwrap();
        assert_eq!(n as usize, MIGRATIONS.len());
    }
}
