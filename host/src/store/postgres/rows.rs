//! Reading rows back into the job model, and what makes an error worth
//! retrying.

use std::time::Duration;

use deadpool_postgres::GenericClient;
use tokio_postgres::Row;
use tokio_postgres::error::SqlState;

use crate::clock::Timestamp;
use crate::job::{Backoff, Counts, Job, JobId, JobStatus, PluginInfo, PluginName, millis};
use crate::store::StoreError;
use crate::store::rules::codec::{
    corrupt, grants_of, json_column, labels_of_columns, policy_of, requests_of, target_of,
};

/// Every job column, in the order [`row_to_job`] reads them.
pub(super) const JOB_COLUMNS: &[&str] = &[
    "job_id",
    "plan_id",
    "phase",
    "action",
    "plugin_digest",
    "status",
    "payload",
    "limits_json",
    "schema_version",
    "created_at",
    "started_at",
    "finished_at",
    "last_heartbeat",
    "expires_at",
    "worker_id",
    "lease_token",
    "lease_expires_at",
    "attempt",
    "lost_leases",
    "max_attempts",
    "cancel_requested",
    "concurrency_key",
    "error_kind",
    "error_message",
    "backtrace",
    "output",
    "fuel_used",
    "peak_memory_bytes",
    "plugin_name",
    "plugin_version",
    "progress_json",
    "run_after",
    "deadline_at",
    "retries",
    "backoff_base_ms",
    "backoff_cap_ms",
    "last_error",
    "releases",
    "grants_json",
    "free_reruns",
    "free_rerun_limit",
    "approval_json",
    "process_deaths",
    "submitted_by",
    "priority",
    "schedule_id",
    "tags_json",
    "metadata_json",
    "rate_limit",
    "rate_key",
    "rate_slot",
];

/// The job columns, each prefixed with `alias.` when one is given.
pub(super) fn job_columns(alias: &str) -> String {
    let prefix = if alias.is_empty() { String::new() } else { format!("{alias}.") };
    JOB_COLUMNS.iter().map(|c| format!("{prefix}{c}")).collect::<Vec<_>>().join(", ")
}

/// The job columns of a list row: no payload, no output.
pub(super) fn list_columns() -> String {
    JOB_COLUMNS
        .iter()
        .map(|&c| match c {
            "payload" => "''::bytea",
            "output" => "NULL::bytea",
            c => c,
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Worth retrying: the connection broke or the server is shutting down,
/// restarting or out of connections; a serialization failure or deadlock.
pub(super) fn is_transient(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    if let Some(code) = e.code() {
        let code = code.code();
        // 08: connection exception; 57P: operator intervention (shutdown,
        // restart, pg_terminate_backend); 53: insufficient resources.
        return code.starts_with("08")
            || code.starts_with("57P")
            || code.starts_with("53")
            || code == SqlState::T_R_SERIALIZATION_FAILURE.code()
            || code == SqlState::T_R_DEADLOCK_DETECTED.code()
            || code == SqlState::LOCK_NOT_AVAILABLE.code();
    }
    // No server code: an I/O error on the socket (refused, reset, timed out).
    std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>())
}

pub(super) fn db_err(operation: &'static str) -> impl Fn(tokio_postgres::Error) -> StoreError {
    move |e| StoreError::Database { operation, source: describe(&e).into(), transient: is_transient(&e) }
}

/// Text for a `TEXT` column, which cannot hold a NUL byte: a guest's error
/// message may carry one, and its finish must not fail for it. Each NUL
/// becomes U+FFFD.
pub(super) fn text(s: &str) -> std::borrow::Cow<'_, str> {
    if s.contains('\0') { s.replace('\0', "\u{FFFD}").into() } else { s.into() }
}

/// The same failure, for each caller of a failed batch.
pub(super) fn echo(operation: &'static str, e: &StoreError) -> StoreError {
    match e {
        StoreError::Closed => StoreError::Closed,
        e => StoreError::Database { operation, source: e.to_string().into(), transient: e.is_transient() },
    }
}

/// The driver's error with what it wraps: its own text is only "db error"
/// or "error connecting to server"; the server's message or the socket's
/// error is what an operator needs.
pub(super) fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let mut text = format!("{} {}: {}", db.severity(), db.code().code(), db.message());
        if let Some(detail) = db.detail() {
            text.push_str(&format!(" ({detail})"));
        }
        return text;
    }
    match std::error::Error::source(e) {
        Some(cause) => format!("{e}: {cause}"),
        None => e.to_string(),
    }
}

/// A pool that could not hand out a connection: the database is down or
/// every connection is busy past the wait; both pass.
pub(super) fn pool_err(operation: &'static str) -> impl Fn(deadpool_postgres::PoolError) -> StoreError {
    move |e| match e {
        deadpool_postgres::PoolError::Closed => StoreError::Closed,
        deadpool_postgres::PoolError::Backend(e) => db_err(operation)(e),
        e => StoreError::Database { operation, source: Box::new(e), transient: true },
    }
}

fn ts(ms: Option<i64>) -> Option<Timestamp> {
    ms.map(Timestamp::from_unix_ms)
}

pub(super) fn count(n: i32) -> u32 {
    n.max(0) as u32
}

pub(super) fn row_to_job(row: &Row) -> Result<Job, StoreError> {
    let read = db_err("reading a job row");
    let id_text: String = row.try_get(0).map_err(&read)?;
    let phase: String = row.try_get(2).map_err(&read)?;
    let action: Option<String> = row.try_get(3).map_err(&read)?;
    let target = target_of(&id_text, &phase, action)?;
    let digest: String = row.try_get(4).map_err(&read)?;
    let status: String = row.try_get(5).map_err(&read)?;
    let limits: String = row.try_get(7).map_err(&read)?;
    let error_kind: Option<String> = row.try_get(22).map_err(&read)?;
    let (tags, metadata) =
        labels_of_columns(&id_text, row.try_get(46).map_err(&read)?, row.try_get(47).map_err(&read)?)?;
    Ok(Job {
        id: id_text.parse().map_err(|e: String| corrupt(&id_text, e))?,
        plan_id: row.try_get(1).map_err(&read)?,
        target,
        plugin: digest.parse().map_err(|e: String| corrupt(&id_text, e))?,
        status: status.parse().map_err(|e: String| corrupt(&id_text, e))?,
        input: row.try_get(6).map_err(&read)?,
        limits: serde_json::from_str(&limits).map_err(|e| corrupt(&id_text, format!("limits: {e}")))?,
        schema_version: count(row.try_get(8).map_err(&read)?),
        created_at: Timestamp::from_unix_ms(row.try_get(9).map_err(&read)?),
        started_at: ts(row.try_get(10).map_err(&read)?),
        finished_at: ts(row.try_get(11).map_err(&read)?),
        last_heartbeat: ts(row.try_get(12).map_err(&read)?),
        expires_at: Timestamp::from_unix_ms(row.try_get(13).map_err(&read)?),
        worker_id: row.try_get(14).map_err(&read)?,
        lease_token: row.try_get(15).map_err(&read)?,
        lease_expires_at: ts(row.try_get(16).map_err(&read)?),
        attempt: count(row.try_get(17).map_err(&read)?),
        lost_leases: count(row.try_get(18).map_err(&read)?),
        max_attempts: count(row.try_get(19).map_err(&read)?),
        cancel_requested: row.try_get(20).map_err(&read)?,
        concurrency_key: row.try_get(21).map_err(&read)?,
        error_kind: error_kind.map(|k| k.parse().map_err(|e: String| corrupt(&id_text, e))).transpose()?,
        error_message: row.try_get(23).map_err(&read)?,
        backtrace: row.try_get(24).map_err(&read)?,
        output: row.try_get(25).map_err(&read)?,
        fuel_used: row.try_get::<_, Option<i64>>(26).map_err(&read)?.map(|v| v.max(0) as u64),
        peak_memory_bytes: row.try_get::<_, Option<i64>>(27).map_err(&read)?.map(|v| v.max(0) as u64),
        plugin_name: match (row.try_get::<_, Option<String>>(28).map_err(&read)?, row.try_get(29).map_err(&read)?) {
            (Some(name), Some(version)) => Some(PluginName { name, version }),
            _ => None,
        },
        progress: json_column(&id_text, "progress", row.try_get(30).map_err(&read)?)?,
        run_after: Timestamp::from_unix_ms(row.try_get(31).map_err(&read)?),
        deadline_at: ts(row.try_get(32).map_err(&read)?),
        retries: count(row.try_get(33).map_err(&read)?),
        backoff: Backoff {
            base: millis::from_column(row.try_get(34).map_err(&read)?),
            cap: millis::from_column(row.try_get(35).map_err(&read)?),
        },
        last_error: row.try_get(36).map_err(&read)?,
        releases: count(row.try_get(37).map_err(&read)?),
        grants: grants_of(&id_text, row.try_get(38).map_err(&read)?)?,
        free_reruns: count(row.try_get(39).map_err(&read)?),
        free_rerun_limit: count(row.try_get(40).map_err(&read)?),
        approval: json_column(&id_text, "approval", row.try_get(41).map_err(&read)?)?,
        process_deaths: count(row.try_get(42).map_err(&read)?),
        submitted_by: row.try_get(43).map_err(&read)?,
        priority: row.try_get::<_, i16>(44).map_err(&read)?.clamp(0, i16::from(u8::MAX)) as u8,
        schedule_id: row
            .try_get::<_, Option<String>>(45)
            .map_err(&read)?
            .map(|s| s.parse().map_err(|e: String| corrupt(&id_text, e)))
            .transpose()?,
        tags,
        metadata,
        rate_limit: row.try_get(48).map_err(&read)?,
        rate_key: row.try_get(49).map_err(&read)?,
        rate_slot: row.try_get::<_, Option<i64>>(50).map_err(&read)?.map(Timestamp::from_unix_ms),
    })
}

pub(super) fn rows_to_jobs(rows: &[Row]) -> Result<Vec<Job>, StoreError> {
    rows.iter().map(row_to_job).collect()
}

/// A plugin row: name, version, digest, size, created, grants, approval
/// policy.
pub(super) fn row_to_plugin(row: &Row) -> Result<PluginInfo, StoreError> {
    let read = db_err("reading a plugin row");
    let digest: String = row.try_get(2).map_err(&read)?;
    Ok(PluginInfo {
        name: match (row.try_get::<_, Option<String>>(0).map_err(&read)?, row.try_get(1).map_err(&read)?) {
            (Some(name), Some(version)) => Some(PluginName { name, version }),
            _ => None,
        },
        digest: digest.parse().map_err(|e: String| corrupt(&digest, e))?,
        size_bytes: row.try_get::<_, i64>(3).map_err(&read)?.max(0) as u64,
        created_at: Timestamp::from_unix_ms(row.try_get(4).map_err(&read)?),
        grants: grants_of(&digest, row.try_get(5).map_err(&read)?)?,
        approval: policy_of(&digest, row.try_get(6).map_err(&read)?)?,
        requests: requests_of(&digest, row.try_get(7).map_err(&read)?)?,
    })
}

/// Job counts by state.
pub(super) async fn count_jobs(client: &impl GenericClient) -> Result<Counts, StoreError> {
    let err = db_err("counting jobs");
    let stmt = client.prepare_cached("SELECT status, COUNT(*) FROM jobs GROUP BY status").await.map_err(&err)?;
    let mut counts = Counts::default();
    for row in client.query(&stmt, &[]).await.map_err(&err)? {
        let status: String = row.get(0);
        let n: i64 = row.get(1);
        let status: JobStatus = status.parse().map_err(|e: String| corrupt("(counts)", e))?;
        *counts.of_mut(status) = n.max(0) as u64;
    }
    Ok(counts)
}

/// A plan row, as [`PLAN_COLUMNS`](crate::store::sql::PLAN_COLUMNS) lists them.
pub(super) fn row_to_plan(row: &Row) -> Result<crate::store::rules::plan::PlanRow, StoreError> {
    let read = db_err("reading a plan row");
    let id: String = row.try_get(0).map_err(&read)?;
    let mode: String = row.try_get(1).map_err(&read)?;
    let job_id = |text: String| -> Result<JobId, StoreError> { text.parse().map_err(|e: String| corrupt(&id, e)) };
    let ms = |n: i64| Duration::from_millis(n.max(0) as u64);
    Ok(crate::store::rules::plan::PlanRow {
        record: crate::job::PlanRecord {
            apply_mode: mode.parse().map_err(|e: String| corrupt(&id, e))?,
            input: row.try_get(2).map_err(&read)?,
            created_at: Timestamp::from_unix_ms(row.try_get(5).map_err(&read)?),
            execute_job: job_id(row.try_get(6).map_err(&read)?)?,
            apply_job: row.try_get::<_, Option<String>>(7).map_err(&read)?.map(job_id).transpose()?,
            cancelled_at: ts(row.try_get(8).map_err(&read)?),
            plan_id: id.clone(),
        },
        queue_ttl: ms(row.try_get(3).map_err(&read)?),
        approval_ttl: ms(row.try_get(4).map_err(&read)?),
    })
}
