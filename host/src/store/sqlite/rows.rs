//! Reading rows back into the job model, and the small conversions the
//! SQL needs.

use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::clock::Timestamp;
use crate::job::{Backoff, Counts, EventId, Job, JobId, JobStatus, PlanRecord, PluginInfo, PluginName, millis};
use crate::store::rules::codec::{
    corrupt, grants_of, json_column, labels_of_columns, policy_of, requests_of, target_of,
};
use crate::store::rules::events::EventRow;
use crate::store::rules::plan::PlanRow;
use crate::store::sql::EVENT_COLUMNS;
use crate::store::{EventPage, StoreError};

pub(super) const JOB_COLUMNS: &str = "job_id, plan_id, phase, action, plugin_digest, status, payload, limits_json, \
    schema_version, created_at, started_at, finished_at, last_heartbeat, expires_at, worker_id, lease_token, \
    lease_expires_at, attempt, lost_leases, max_attempts, cancel_requested, concurrency_key, error_kind, \
    error_message, backtrace, output, fuel_used, peak_memory_bytes, plugin_name, plugin_version, progress_json, \
    run_after, deadline_at, retries, backoff_base_ms, backoff_cap_ms, last_error, releases, grants_json, free_reruns, free_rerun_limit, approval_json, process_deaths, submitted_by, \
    priority, schedule_id, tags_json, metadata_json, rate_limit, rate_key, rate_slot";

pub(super) fn db_err(operation: &'static str) -> impl Fn(rusqlite::Error) -> StoreError {
    move |e| {
        let transient = matches!(
            e.sqlite_error_code(),
            Some(
                rusqlite::ErrorCode::DatabaseBusy
                    | rusqlite::ErrorCode::DatabaseLocked
                    // A WAL locking race (SQLITE_PROTOCOL): SQLite says to retry.
                    | rusqlite::ErrorCode::FileLockingProtocolFailed
            )
        );
        StoreError::Database { operation, source: Box::new(e), transient }
    }
}

fn ts(ms: Option<i64>) -> Option<Timestamp> {
    ms.map(Timestamp::from_unix_ms)
}

pub(super) fn row_to_job(row: &Row<'_>) -> Result<Job, StoreError> {
    let read = db_err("reading a job row");
    let id_text: String = row.get(0).map_err(&read)?;
    let phase: String = row.get(2).map_err(&read)?;
    let action: Option<String> = row.get(3).map_err(&read)?;
    let target = target_of(&id_text, &phase, action)?;
    let digest: String = row.get(4).map_err(&read)?;
    let status: String = row.get(5).map_err(&read)?;
    let limits: String = row.get(7).map_err(&read)?;
    let error_kind: Option<String> = row.get(22).map_err(&read)?;
    let (tags, metadata) = labels_of_columns(&id_text, row.get(46).map_err(&read)?, row.get(47).map_err(&read)?)?;
    Ok(Job {
        id: id_text.parse().map_err(|e: String| corrupt(&id_text, e))?,
        plan_id: row.get(1).map_err(&read)?,
        target,
        plugin: digest.parse().map_err(|e: String| corrupt(&id_text, e))?,
        status: status.parse().map_err(|e: String| corrupt(&id_text, e))?,
        input: row.get(6).map_err(&read)?,
        limits: serde_json::from_str(&limits).map_err(|e| corrupt(&id_text, format!("limits: {e}")))?,
        schema_version: row.get(8).map_err(&read)?,
        created_at: Timestamp::from_unix_ms(row.get(9).map_err(&read)?),
        started_at: ts(row.get(10).map_err(&read)?),
        finished_at: ts(row.get(11).map_err(&read)?),
        last_heartbeat: ts(row.get(12).map_err(&read)?),
        expires_at: Timestamp::from_unix_ms(row.get(13).map_err(&read)?),
        worker_id: row.get(14).map_err(&read)?,
        lease_token: row.get(15).map_err(&read)?,
        lease_expires_at: ts(row.get(16).map_err(&read)?),
        attempt: row.get(17).map_err(&read)?,
        lost_leases: row.get(18).map_err(&read)?,
        max_attempts: row.get(19).map_err(&read)?,
        cancel_requested: row.get(20).map_err(&read)?,
        concurrency_key: row.get(21).map_err(&read)?,
        error_kind: error_kind.map(|k| k.parse().map_err(|e: String| corrupt(&id_text, e))).transpose()?,
        error_message: row.get(23).map_err(&read)?,
        backtrace: row.get(24).map_err(&read)?,
        output: row.get(25).map_err(&read)?,
        fuel_used: row.get::<_, Option<i64>>(26).map_err(&read)?.map(|v| v as u64),
        peak_memory_bytes: row.get::<_, Option<i64>>(27).map_err(&read)?.map(|v| v as u64),
        plugin_name: match (row.get::<_, Option<String>>(28).map_err(&read)?, row.get(29).map_err(&read)?) {
            (Some(name), Some(version)) => Some(PluginName { name, version }),
            _ => None,
        },
        progress: json_column(&id_text, "progress", row.get(30).map_err(&read)?)?,
        run_after: Timestamp::from_unix_ms(row.get(31).map_err(&read)?),
        deadline_at: ts(row.get(32).map_err(&read)?),
        retries: row.get(33).map_err(&read)?,
        backoff: Backoff {
            base: millis::from_column(row.get(34).map_err(&read)?),
            cap: millis::from_column(row.get(35).map_err(&read)?),
        },
        last_error: row.get(36).map_err(&read)?,
        releases: row.get(37).map_err(&read)?,
        grants: grants_of(&id_text, row.get(38).map_err(&read)?)?,
        free_reruns: row.get(39).map_err(&read)?,
        free_rerun_limit: row.get(40).map_err(&read)?,
        approval: json_column(&id_text, "approval", row.get(41).map_err(&read)?)?,
        process_deaths: row.get(42).map_err(&read)?,
        submitted_by: row.get(43).map_err(&read)?,
        priority: row.get(44).map_err(&read)?,
        schedule_id: row
            .get::<_, Option<String>>(45)
            .map_err(&read)?
            .map(|s| s.parse().map_err(|e: String| corrupt(&id_text, e)))
            .transpose()?,
        tags,
        metadata,
        rate_limit: row.get(48).map_err(&read)?,
        rate_key: row.get(49).map_err(&read)?,
        rate_slot: row.get::<_, Option<i64>>(50).map_err(&read)?.map(Timestamp::from_unix_ms),
    })
}

/// A plugin row as read: name, version, digest, size, created, grants,
/// approval policy, declared requests.
type PluginRow = (Option<String>, Option<String>, String, i64, i64, Option<String>, Option<String>, Option<String>);

fn row_to_plugin(row: &Row<'_>) -> rusqlite::Result<PluginRow> {
    Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?, row.get(4)?, row.get(5)?, row.get(6)?, row.get(7)?))
}

fn plugin_info(row: PluginRow) -> Result<PluginInfo, StoreError> {
    let (name, version, digest, size, created, grants, policy, requests) = row;
    Ok(PluginInfo {
        name: match (name, version) {
            (Some(name), Some(version)) => Some(PluginName { name, version }),
            _ => None,
        },
        digest: digest.parse().map_err(|e: String| corrupt(&digest, e))?,
        size_bytes: size as u64,
        created_at: Timestamp::from_unix_ms(created),
        grants: grants_of(&digest, grants)?,
        approval: policy_of(&digest, policy)?,
        requests: requests_of(&digest, requests)?,
    })
}

pub(super) fn query_plugins(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<PluginInfo>, StoreError> {
    let err = db_err("querying plugins");
    let mut stmt = conn.prepare_cached(sql).map_err(&err)?;
    let rows: Vec<_> = stmt.query_map(params, row_to_plugin).and_then(|r| r.collect()).map_err(&err)?;
    rows.into_iter().map(plugin_info).collect()
}

pub(super) fn query_jobs(conn: &Connection, sql: &str, params: impl rusqlite::Params) -> Result<Vec<Job>, StoreError> {
    let err = db_err("querying jobs");
    let mut stmt = conn.prepare_cached(sql).map_err(&err)?;
    let mut rows = stmt.query(params).map_err(&err)?;
    let mut jobs = Vec::new();
    while let Some(row) = rows.next().map_err(&err)? {
        jobs.push(row_to_job(row)?);
    }
    Ok(jobs)
}

/// Job counts by state.
pub(super) fn count_jobs(conn: &Connection) -> Result<Counts, StoreError> {
    let err = db_err("counting jobs");
    let mut stmt = conn.prepare_cached("SELECT status, COUNT(*) FROM jobs GROUP BY status").map_err(&err)?;
    let rows: Vec<(String, i64)> =
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).and_then(|r| r.collect()).map_err(&err)?;
    let mut counts = Counts::default();
    for (status, n) in rows {
        let status: JobStatus = status.parse().map_err(|e: String| corrupt("(counts)", e))?;
        *counts.of_mut(status) = n.max(0) as u64;
    }
    Ok(counts)
}

/// A plan row, as [`PLAN_COLUMNS`](crate::store::sql::PLAN_COLUMNS) lists them.
pub(super) fn row_to_plan(row: &Row<'_>) -> Result<PlanRow, StoreError> {
    let read = db_err("reading a plan row");
    let id: String = row.get(0).map_err(&read)?;
    let mode: String = row.get(1).map_err(&read)?;
    let job_id = |text: String| -> Result<JobId, StoreError> { text.parse().map_err(|e: String| corrupt(&id, e)) };
    let ms = |n: i64| Duration::from_millis(n.max(0) as u64);
    Ok(PlanRow {
        record: PlanRecord {
            apply_mode: mode.parse().map_err(|e: String| corrupt(&id, e))?,
            input: row.get(2).map_err(&read)?,
            created_at: Timestamp::from_unix_ms(row.get(5).map_err(&read)?),
            execute_job: job_id(row.get(6).map_err(&read)?)?,
            apply_job: row.get::<_, Option<String>>(7).map_err(&read)?.map(job_id).transpose()?,
            cancelled_at: ts(row.get(8).map_err(&read)?),
            plan_id: id.clone(),
        },
        queue_ttl: ms(row.get(3).map_err(&read)?),
        approval_ttl: ms(row.get(4).map_err(&read)?),
    })
}

pub(super) fn query_plans(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<PlanRow>, StoreError> {
    let err = db_err("querying plans");
    let mut stmt = conn.prepare_cached(sql).map_err(&err)?;
    let mut rows = stmt.query(params).map_err(&err)?;
    let mut plans = Vec::new();
    while let Some(row) = rows.next().map_err(&err)? {
        plans.push(row_to_plan(row)?);
    }
    Ok(plans)
}

/// Events after `after` (all kept, with `None`), at most `limit`, and
/// whether retention deleted some after `after`: one read transaction.
pub(super) fn read_events(conn: &Connection, after: Option<EventId>, limit: u32) -> Result<EventPage, StoreError> {
    let err = db_err("reading events");
    let tx = conn.unchecked_transaction().map_err(&err)?;
    let horizon: Option<i64> =
        tx.query_row("SELECT seq FROM event_horizon", [], |r| r.get(0)).optional().map_err(&err)?;
    let after_seq = after.map_or(0, |id| id.seq as i64);
    let missed = horizon.is_some_and(|h| after.is_some() && after_seq < h);
    let mut stmt = tx
        .prepare_cached(&format!("SELECT seq, {EVENT_COLUMNS} FROM events WHERE seq > ?1 ORDER BY seq LIMIT ?2"))
        .map_err(&err)?;
    let rows = stmt
        .query_map(params![after_seq, limit.max(1)], |r| {
            Ok(EventRow {
                id: EventId { txn: 0, seq: r.get::<_, i64>(0)? as u64 },
                at_ms: r.get(1)?,
                what: r.get(2)?,
                job_id: r.get(3)?,
                plan_id: r.get(4)?,
                plugin_digest: r.get(5)?,
                plugin_name: r.get(6)?,
                plugin_version: r.get(7)?,
                phase: r.get(8)?,
                action: r.get(9)?,
                status: r.get(10)?,
                previous: r.get(11)?,
                attempt: r.get(12)?,
                worker_id: r.get(13)?,
                error_kind: r.get(14)?,
                progress_json: r.get(15)?,
            })
        })
        .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
        .map_err(&err)?;
    let events = rows.into_iter().map(EventRow::into_event).collect::<Result<_, _>>()?;
    Ok(EventPage { events, missed })
}
