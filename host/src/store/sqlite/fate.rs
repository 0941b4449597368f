//! What becomes of an attempt that ended unfinished (its lease expired,
//! its process died, or it was released): the counters and effects it is
//! judged by, and the fate applied to its row. Shared by the release
//! (leases) and the reclaims (sweeps).

use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::clock::Timestamp;
use crate::job::Backoff;
use crate::job::millis;

use crate::store::rules::unfinished::{AttemptEffects, Counters, Decision, Fate};

/// A job's counters (see [`COUNTER_COLUMNS`](crate::store::sql::COUNTER_COLUMNS)): its id, attempt and the rest.
pub(super) fn counters_of(r: &Row<'_>) -> rusqlite::Result<(String, u32, Counters)> {
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
            backoff: Backoff { base: millis::from_column(r.get(8)?), cap: millis::from_column(r.get(9)?) },
            process_deaths: r.get(10)?,
        },
    ))
}

/// What the attempt's effects were (`None`: it recorded none).
pub(super) fn attempt_effects(conn: &Connection, id: &str, attempt: u32) -> rusqlite::Result<Option<AttemptEffects>> {
    conn.prepare_cached(ATTEMPT_EFFECTS)?
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
pub(super) fn apply_fate(
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
                run_after.saturating_add(millis::column(queue_ttl)),
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

/// The query SQLite runs for [`AttemptEffects`]; parameters: job id,
/// attempt.
const ATTEMPT_EFFECTS: &str = "SELECT seq, method, url, status, error, \
     SUM(finished_at IS NULL) OVER () FROM effects WHERE job_id = ?1 AND attempt = ?2 \
     ORDER BY finished_at IS NULL DESC, CASE WHEN finished_at IS NULL THEN -seq ELSE seq END DESC LIMIT 1";
