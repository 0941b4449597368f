//! What becomes of an attempt that ended unfinished (its lease expired,
//! its process died, or it was released): the counters and effects it is
//! judged by, and the fate applied to its row. Shared by the release
//! (leases) and the reclaims (sweeps).

use std::time::Duration;

use deadpool_postgres::GenericClient;
use tokio_postgres::Row;

use crate::clock::Timestamp;
use crate::job::Backoff;
use crate::job::millis;

use crate::store::rules::unfinished::{AttemptEffects, Counters, Decision, Fate};

/// A job's counters (see [`COUNTER_COLUMNS`](crate::store::sql::COUNTER_COLUMNS)): its id, attempt and the rest.
pub(super) fn counters_of(r: &Row) -> (String, u32, Counters) {
    (
        r.get(0),
        super::rows::count(r.get(1)),
        Counters {
            lost_leases: super::rows::count(r.get(2)),
            retries: super::rows::count(r.get(3)),
            max_attempts: super::rows::count(r.get(4)),
            free_reruns: super::rows::count(r.get(5)),
            free_rerun_limit: super::rows::count(r.get(6)),
            cancel_requested: r.get(7),
            backoff: Backoff { base: millis::from_column(r.get(8)), cap: millis::from_column(r.get(9)) },
            process_deaths: super::rows::count(r.get(10)),
        },
    )
}

/// What the attempt's effects were (`None`: it recorded none).
pub(super) async fn attempt_effects(
    client: &impl GenericClient,
    id: &str,
    attempt: u32,
) -> Result<Option<AttemptEffects>, tokio_postgres::Error> {
    let attempt = i32::try_from(attempt).unwrap_or(i32::MAX);
    let row = client.query_opt(ATTEMPT_EFFECTS, &[&id, &attempt]).await?;
    Ok(row.map(|r| AttemptEffects {
        seq: r.get(0),
        method: r.get(1),
        url: r.get(2),
        status: r.get(3),
        error: r.get(4),
        in_flight: u32::try_from(r.get::<_, i64>(5)).unwrap_or(u32::MAX),
    }))
}

/// Apply `fate` to the job `id`, whose row the caller holds locked.
pub(super) async fn apply_fate(
    client: &impl GenericClient,
    id: &str,
    decision: &Decision,
    queue_ttl: Duration,
    now: Timestamp,
) -> Result<(), tokio_postgres::Error> {
    match &decision.fate {
        Fate::Requeue { run_after, last_error, .. } => {
            let run_after = run_after.unix_ms();
            let sql = format!(
                "UPDATE jobs SET status = 'queued', lease_token = NULL, lease_expires_at = NULL{}, run_after = $1, \
                 last_error = $2, \
                 expires_at = LEAST(GREATEST(expires_at, $3), COALESCE(deadline_at, GREATEST(expires_at, $3))) \
                 WHERE job_id = $4",
                decision.bumps()
            );
            client
                .execute(&sql, &[&run_after, last_error, &run_after.saturating_add(millis::column(queue_ttl)), &id])
                .await?;
        }
        Fate::End { cancelled, kind, message, .. } => {
            let sql = format!(
                "UPDATE jobs SET status = $1, error_kind = $2, error_message = $3, finished_at = $4, \
                 lease_token = NULL, lease_expires_at = NULL{} WHERE job_id = $5",
                decision.bumps()
            );
            let status = if *cancelled { "cancelled" } else { "failed" };
            client.execute(&sql, &[&status, &kind.as_str(), message, &now.unix_ms(), &id]).await?;
        }
    }
    Ok(())
}

/// The query PostgreSQL runs for [`AttemptEffects`]; parameters: job id,
/// attempt.
const ATTEMPT_EFFECTS: &str = "SELECT seq::BIGINT, method, url, status::BIGINT, error, \
     COUNT(*) FILTER (WHERE finished_at IS NULL) OVER () FROM effects \
     WHERE job_id = $1 AND attempt = $2 \
     ORDER BY finished_at IS NULL DESC, CASE WHEN finished_at IS NULL THEN -seq ELSE seq END DESC LIMIT 1";
