//! The SQLite store's [`Leases`]: the claim, renewals,
//! progress, and an attempt's three endings (finish, retry, release).

use rusqlite::{Connection, OptionalExtension, params};

use super::SqliteStore;
use super::claim::{Claimed, claim};
use super::fate::{apply_fate, attempt_effects, counters_of};
use super::rows::db_err;
use crate::job::millis;
use crate::job::{ErrorKind, JobStatus};
use crate::store::rules::codec::to_json;
use crate::store::rules::unfinished::{self, Decision};
use crate::store::sql::COUNTER_COLUMNS;
use crate::store::{
    JobClaimParams, JobFinishParams, JobProgressParams, JobReleaseParams, JobRetryParams, Lease, LeaseExtendParams,
    LeaseState, Leases, StoreError,
};

impl SqliteStore {
    /// A claim's leases, after setting the alarm for its next rate slot.
    fn slots_ahead(&self, claimed: Claimed, now: crate::clock::Timestamp) -> Vec<Lease> {
        if let Some(slot) = claimed.next_slot {
            self.inner.alarm.ring_at(slot, now);
        }
        claimed.leases
    }
}

#[async_trait::async_trait]
impl Leases for SqliteStore {
    async fn job_claim(&self, params: JobClaimParams) -> Result<Vec<Lease>, StoreError> {
        let now = params.now;
        let claimed = self.write(move |conn| claim(conn, params)).await?;
        Ok(self.slots_ahead(claimed, now))
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
                    s.query_row(
                        params![now + millis::column(params.lease_ttl), now, params.id.to_string(), params.token],
                        |r| r.get(0),
                    )
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
        if params.proposals.is_empty() {
            self.write(move |conn| finish(conn, &params)).await
        } else {
            self.write_all_or_nothing(move |conn| finish(conn, &params)).await
        }
    }

    async fn job_finish_and_claim(
        &self,
        params: JobFinishParams,
        next: JobClaimParams,
    ) -> Result<(bool, Vec<Lease>), StoreError> {
        let proposing = !params.proposals.is_empty();
        let now = next.now;
        let work = move |conn: &Connection| {
            if !finish(conn, &params)? {
                return Ok((false, Claimed::default()));
            }
            // The finish stands even if the claim fails: the claim loop
            // will claim later.
            Ok((true, claim(conn, next).unwrap_or_default()))
        };
        // Proposals are several statements besides the finish's.
        let (finished, claimed) =
            if proposing { self.write_all_or_nothing(work).await? } else { self.write(work).await? };
        Ok((finished, self.slots_ahead(claimed, now)))
    }

    async fn job_release(&self, params: JobReleaseParams) -> Result<bool, StoreError> {
        // Its place kept (an earlier `run_after` is not moved); its
        // queue time counted from now.
        let run_after = params.run_after.unix_ms();
        let requeue_until = params.run_after.max(params.now).unix_ms().saturating_add(millis::column(params.queue_ttl));
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
            .and_then(|mut s| s.execute(params![requeue_until, id, run_after]))
            .map_err(&err)?;
            Ok(true)
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
                        run_after.saturating_add(millis::column(params.queue_ttl)),
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

    fn enqueued(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.inner.enqueued.clone())
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
}

/// A running job's ending, fenced by its token; `OR FAIL` as in
/// [`CLAIM_ONE`](super::claim::CLAIM_ONE).
pub(super) const FINISH_ONE: &str = "UPDATE OR FAIL jobs SET status = ?1, output = ?2, error_kind = ?3, \
     error_message = ?4, backtrace = ?5, fuel_used = ?6, peak_memory_bytes = ?7, finished_at = ?8, \
     last_heartbeat = ?8, lease_token = NULL, lease_expires_at = NULL, \
     progress_json = COALESCE(?11, progress_json), logs_json = ?12 \
     WHERE job_id = ?9 AND status = 'running' AND lease_token = ?10";

/// Record a running job's ending, fenced by its lease token. `false`: the
/// token no longer owns the job.
pub(super) fn finish(conn: &Connection, params: &JobFinishParams) -> Result<bool, StoreError> {
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
    if changed == 1 && status == JobStatus::Succeeded && !params.proposals.is_empty() {
        super::proposals::insert(conn, params.id, &params.proposals)?;
    }
    Ok(changed == 1)
}
