//! The SQLite store's [`Leases`]: the claim, renewals,
//! progress, and an attempt's three endings (finish, retry, release).

use std::sync::LazyLock;

use rusqlite::{Connection, OptionalExtension, params};

use super::SqliteStore;
use super::fate::{apply_fate, attempt_effects, counters_of};
use super::rows::{JOB_COLUMNS, db_err, query_jobs};
use crate::clock::Timestamp;
use crate::job::millis;
use crate::job::{ErrorKind, Job, JobStatus};
use crate::store::rules::codec::{corrupt, to_json};
use crate::store::rules::unfinished::{self, Decision};
use crate::store::sql::{COUNTER_COLUMNS, ClaimPool, UNCAPPED_SUBMITTER, claimable};
use crate::store::{
    JobClaimParams, JobFinishParams, JobProgressParams, JobReleaseParams, JobRetryParams, Lease, LeaseExtendParams,
    LeaseState, Leases, StoreError,
};

#[async_trait::async_trait]
impl Leases for SqliteStore {
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
        let work = move |conn: &Connection| {
            if !finish(conn, &params)? {
                return Ok((false, Vec::new()));
            }
            // The finish stands even if the claim fails: the claim loop
            // will claim later.
            Ok((true, claim(conn, next).unwrap_or_default()))
        };
        // Proposals are several statements besides the finish's.
        if proposing { self.write_all_or_nothing(work).await } else { self.write(work).await }
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
            .and_then(|mut s| s.execute(params![run_after + millis::column(params.queue_ttl), id, run_after]))
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

/// Claim up to `params.limit` eligible jobs: queued, unexpired, due
/// (`run_after` at or before `now`, which is never before its creation: a
/// claim never starts a job younger than itself), either keyless or the
/// oldest queued job of a key that has no running job, and of a submitter
/// below its running cap. Jobs of capped submitters are picked first (at
/// most each one's room under its cap), then the rest; each earliest due
/// first, then oldest.
///
/// Reads of the candidates, then one single-row update each: cheaper for
/// SQLite than one `UPDATE … WHERE job_id IN (…) RETURNING …`, which builds
/// two temporary b-trees per call. Nothing can change between the two: the
/// writer holds the write transaction, so a cap is never overrun.
pub(super) fn claim(conn: &Connection, params: JobClaimParams) -> Result<Vec<Lease>, StoreError> {
    let now = params.now.unix_ms();
    let expires = now + millis::column(params.lease_ttl);
    // A claimer that runs nothing takes a suspect first, and only it.
    let mut candidates = Vec::new();
    if params.alone {
        candidates = pick(conn, ClaimPool::Suspect, now, 1)?;
    }
    if candidates.is_empty() {
        candidates = pick(conn, ClaimPool::Fresh, now, params.limit)?;
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

/// Up to `limit` claimable jobs of `pool`: capped submitters' first, each
/// within its room, then the uncapped.
fn pick(conn: &Connection, pool: ClaimPool, now: i64, limit: u32) -> Result<Vec<Job>, StoreError> {
    // Built once: this runs for every claim.
    static UNCAPPED: LazyLock<[String; 2]> =
        LazyLock::new(|| ClaimPool::ALL.map(|p| candidates(p, UNCAPPED_SUBMITTER)));
    static CAPPED: LazyLock<[String; 2]> =
        LazyLock::new(|| ClaimPool::ALL.map(|p| candidates(p, "q.submitted_by = ?3")));
    fn candidates(pool: ClaimPool, whose: &str) -> String {
        format!(
            "SELECT {JOB_COLUMNS} FROM jobs q WHERE {} ORDER BY q.run_after, q.job_id LIMIT ?2",
            claimable(pool, whose, "?1")
        )
    }
    let err = db_err("claiming jobs");
    let rooms: Vec<(String, i64)> = conn
        .prepare_cached(
            "SELECT p.name, p.max_running - (SELECT COUNT(*) FROM jobs r WHERE r.status = 'running' \
             AND r.submitted_by = p.name) FROM principals p WHERE p.max_running IS NOT NULL \
             AND EXISTS (SELECT 1 FROM jobs q WHERE q.status = 'queued' AND q.submitted_by = p.name)",
        )
        .and_then(|mut s| s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
        .map_err(&err)?;
    let mut jobs = Vec::new();
    for (name, room) in rooms.into_iter().filter(|(_, room)| *room > 0) {
        jobs.extend(query_jobs(conn, &CAPPED[pool as usize], params![now, room.min(i64::from(limit)), name])?);
    }
    jobs.sort_by_key(|j| (j.run_after, j.id));
    jobs.truncate(limit as usize);
    let rest = limit as usize - jobs.len();
    if rest > 0 {
        jobs.extend(query_jobs(conn, &UNCAPPED[pool as usize], params![now, rest as i64])?);
    }
    Ok(jobs)
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
pub(super) fn lease_token() -> String {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("the OS random source is available");
    hex::encode(bytes)
}

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
