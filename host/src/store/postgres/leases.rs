//! The PostgreSQL store's [`Leases`]: the claim, renewals,
//! progress, and an attempt's three endings (finish, retry, release).

use std::sync::LazyLock;

use deadpool_postgres::GenericClient;
use tokio::sync::watch;
use tokio_postgres::error::SqlState;

use super::fate::{apply_fate, attempt_effects, counters_of};
use super::rows::{db_err, job_columns, row_to_job};
use super::{NOTIFY, PostgresStore};
use crate::job::millis;
use crate::job::{ErrorKind, JobStatus};
use crate::store::rules::codec::{corrupt, i64_of, to_json};
use crate::store::rules::unfinished::{self, Decision};
use crate::store::sql::{COUNTER_COLUMNS, ClaimPool, UNCAPPED_SUBMITTER, claimable};
use crate::store::{
    JobClaimParams, JobFinishParams, JobProgressParams, JobReleaseParams, JobRetryParams, Lease, LeaseExtendParams,
    LeaseState, Leases, StoreError,
};

#[async_trait::async_trait]
impl Leases for PostgresStore {
    async fn job_claim(&self, params: JobClaimParams) -> Result<Vec<Lease>, StoreError> {
        let mut client = self.client("claiming jobs").await?;
        if !self.any_capped(&client).await? {
            return claim(&client, &params, false).await;
        }
        let err = db_err("claiming jobs");
        let tx = client.transaction().await.map_err(&err)?;
        let leases = claim(&tx, &params, true).await?;
        tx.commit().await.map_err(&err)?;
        Ok(leases)
    }

    async fn lease_extend(&self, params: LeaseExtendParams) -> Result<LeaseState, StoreError> {
        self.inner.renewals.renew(params).await
    }

    async fn job_finish(&self, params: JobFinishParams) -> Result<bool, StoreError> {
        let mut client = self.client("finishing a job").await?;
        if params.proposals.is_empty() {
            return finish(&client, &params).await;
        }
        // Proposals land with the success or not at all.
        let err = db_err("finishing a job");
        let tx = client.transaction().await.map_err(&err)?;
        let finished = finish(&tx, &params).await?;
        tx.commit().await.map_err(&err)?;
        Ok(finished)
    }

    async fn job_finish_and_claim(
        &self,
        params: JobFinishParams,
        next: JobClaimParams,
    ) -> Result<(bool, Vec<Lease>), StoreError> {
        let err = db_err("finishing a job");
        let mut client = self.client("finishing a job").await?;
        let capped = self.any_capped(&client).await?;
        let tx = client.transaction().await.map_err(&err)?;
        // The finish and the claim go to the server together (one round
        // trip, not two) and run in order in one transaction: the claim
        // sees the finished job's concurrency key released. A finish that
        // changed nothing (the lease was lost) takes the claim back with it.
        // A capped claim's statements wait for a lock, so they could be
        // sent ahead of the finish's: its claim follows the finish instead.
        let (finished, claimed) = if capped {
            let finished = finish(&tx, &params).await;
            let claimed = if matches!(finished, Ok(true)) { claim(&tx, &next, true).await } else { Ok(Vec::new()) };
            (finished, claimed)
        } else {
            tokio::join!(finish(&tx, &params), claim(&tx, &next, false))
        };
        if !finished? {
            tx.rollback().await.map_err(&err)?;
            return Ok((false, Vec::new()));
        }
        match claimed {
            Ok(leases) => {
                tx.commit().await.map_err(&err)?;
                Ok((true, leases))
            }
            // A failed claim aborted the transaction: the finish stands on
            // its own, and the claim loop will claim later.
            Err(_) => {
                tx.rollback().await.map_err(&err)?;
                Ok((finish(&client, &params).await?, Vec::new()))
            }
        }
    }

    async fn job_release(&self, params: JobReleaseParams) -> Result<bool, StoreError> {
        let run_after = params.run_after.max(params.now).unix_ms();
        let requeue_until = run_after.saturating_add(millis::column(params.queue_ttl));
        let err = db_err("releasing a job");
        let mut client = self.client("releasing a job").await?;
        let tx = client.transaction().await.map_err(&err)?;
        let id = params.id.to_string();
        let sql = format!(
            "SELECT {COUNTER_COLUMNS} FROM jobs WHERE job_id = $1 AND status = 'running' AND lease_token = $2 \
             FOR UPDATE"
        );
        let Some(row) = tx.query_opt(&sql, &[&id, &params.token]).await.map_err(&err)? else { return Ok(false) };
        let (_, attempt, counters) = counters_of(&row);
        let effects = attempt_effects(&tx, &id, attempt).await.map_err(&err)?;
        match unfinished::released(&counters, effects.as_ref(), params.now) {
            Some(fate) => {
                let decision = Decision { fate, died: false };
                apply_fate(&tx, &id, &decision, params.queue_ttl, params.now).await.map_err(&err)?
            }
            None => {
                tx.execute(
                    "UPDATE jobs SET status = 'queued', lease_token = NULL, lease_expires_at = NULL, \
                     releases = releases + 1, run_after = GREATEST(run_after, $3), \
                     expires_at = LEAST(GREATEST(expires_at, $1), COALESCE(deadline_at, GREATEST(expires_at, $1))) \
                     WHERE job_id = $2",
                    &[&requeue_until, &id, &run_after],
                )
                .await
                .map_err(&err)?;
            }
        }
        tx.execute(NOTIFY, &[]).await.map_err(&err)?;
        tx.commit().await.map_err(&err)?;
        Ok(true)
    }

    async fn job_retry(&self, params: JobRetryParams) -> Result<bool, StoreError> {
        let logs = params.logs.as_ref().map(to_json).transpose()?;
        let run_after = params.run_after.unix_ms();
        let changed = self
            .execute(
                "queueing a job for retry",
                "UPDATE jobs SET status = 'queued', retries = retries + 1, lease_token = NULL, \
                 lease_expires_at = NULL, run_after = $1, \
                 expires_at = LEAST(GREATEST(expires_at, $2), COALESCE(deadline_at, GREATEST(expires_at, $2))), \
                 last_error = $3, fuel_used = $4, peak_memory_bytes = $5, logs_json = $6, last_heartbeat = $7 \
                 WHERE job_id = $8 AND status = 'running' AND lease_token = $9 \
                 AND lost_leases + retries + 1 < max_attempts",
                &[
                    &run_after,
                    &run_after.saturating_add(millis::column(params.queue_ttl)),
                    &format!("{}: {}", params.kind, params.message),
                    &i64_of(params.fuel_used),
                    &i64_of(params.peak_memory_bytes),
                    &logs,
                    &params.now.unix_ms(),
                    &params.id.to_string(),
                    &params.token,
                ],
            )
            .await?;
        Ok(changed == 1)
    }

    async fn job_progress_set(&self, params: JobProgressParams) -> Result<bool, StoreError> {
        let progress = to_json(&params.progress)?;
        let changed = self
            .execute(
                "recording progress",
                "UPDATE jobs SET progress_json = $1, last_heartbeat = $2 \
                 WHERE job_id = $3 AND status = 'running' AND lease_token = $4",
                &[&progress, &params.now.unix_ms(), &params.id.to_string(), &params.token],
            )
            .await?;
        Ok(changed == 1)
    }

    fn enqueued(&self) -> Option<watch::Receiver<u64>> {
        Some(self.inner.enqueued.clone())
    }
}

/// How long a read of whether any principal has a running cap is used. A
/// cap set through another replica is kept from the first claim on (the
/// uncapped claim passes its jobs over); its jobs start once this replica
/// reads it again.
const CAPS_FRESH_FOR: std::time::Duration = std::time::Duration::from_secs(1);

impl PostgresStore {
    /// Whether some principal has a running cap (read at most once per
    /// [`CAPS_FRESH_FOR`], and again after a principal changes here).
    async fn any_capped(&self, client: &impl GenericClient) -> Result<bool, StoreError> {
        let seen = *self.inner.capped.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, capped)) = seen
            && at.elapsed() < CAPS_FRESH_FOR
        {
            return Ok(capped);
        }
        let capped: bool = client
            .query_one("SELECT EXISTS (SELECT 1 FROM principals WHERE max_running IS NOT NULL)", &[])
            .await
            .map_err(db_err("reading running caps"))?
            .get(0);
        *self.inner.capped.lock().unwrap_or_else(|e| e.into_inner()) = Some((std::time::Instant::now(), capped));
        Ok(capped)
    }

    /// Read the running caps afresh at the next claim.
    pub(super) fn caps_changed(&self) {
        *self.inner.capped.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// Claim up to `params.limit` eligible jobs: queued, unexpired, due,
/// either keyless or the oldest queued job of a key with no running job,
/// and of a submitter below its running cap; earliest due first, then
/// oldest. Rows another claimer has locked are skipped, not waited for.
///
/// With `capped` (some principal has a running cap), `client` must be in a
/// transaction: capped submitters' jobs are claimed first, at most each
/// one's room, under a lock every replica's capped claims take in turn (a
/// count of running jobs read before another replica's claim commits would
/// overrun the cap). The rest are claimed in one statement, as before,
/// without the lock.
pub(super) async fn claim(
    client: &impl GenericClient,
    params: &JobClaimParams,
    capped: bool,
) -> Result<Vec<Lease>, StoreError> {
    // A claimer that runs nothing takes a suspect first, and only it.
    if params.alone {
        let suspect =
            claim_from(client, ClaimPool::Suspect, &JobClaimParams { limit: 1, ..params.clone() }, capped).await?;
        if !suspect.is_empty() {
            return Ok(suspect);
        }
    }
    claim_from(client, ClaimPool::Fresh, params, capped).await
}

/// Turn the jobs `picked` names (locked) into running ones.
fn claim_update(picked: &str) -> String {
    format!(
        "WITH picked AS ({picked}) \
         UPDATE jobs j SET status = 'running', worker_id = $3, \
           lease_token = replace(gen_random_uuid()::text, '-', ''), lease_expires_at = $4, \
           started_at = $1, last_heartbeat = $1, attempt = j.attempt + 1, cancel_requested = FALSE, \
           progress_json = NULL, logs_json = NULL \
         FROM picked WHERE j.job_id = picked.job_id RETURNING {}",
        job_columns("j")
    )
}

/// The claim of uncapped submitters' jobs (and those of no submitter).
fn uncapped_sql(pool: ClaimPool) -> String {
    claim_update(&format!(
        "SELECT q.job_id FROM jobs q WHERE {} ORDER BY q.run_after, q.job_id LIMIT $2 FOR UPDATE SKIP LOCKED",
        claimable(pool, UNCAPPED_SUBMITTER, "$1")
    ))
}

/// The claim of capped submitters' jobs: each one's earliest, at most its
/// room (its cap less its running jobs), found by its own index.
fn capped_sql(pool: ClaimPool) -> String {
    claim_update(&format!(
        "SELECT l.job_id FROM jobs l WHERE l.status = 'queued' AND l.job_id IN ( \
           SELECT c.job_id FROM ( \
             SELECT p.name, p.max_running - (SELECT COUNT(*) FROM jobs r WHERE r.status = 'running' \
               AND r.submitted_by = p.name) AS room FROM principals p WHERE p.max_running IS NOT NULL) s \
           CROSS JOIN LATERAL ( \
             SELECT q.job_id, q.run_after FROM jobs q WHERE {} \
             ORDER BY q.run_after, q.job_id LIMIT GREATEST(s.room, 0)) c \
           ORDER BY c.run_after, c.job_id LIMIT $2) \
         FOR UPDATE SKIP LOCKED",
        claimable(pool, "q.submitted_by = s.name", "$1")
    ))
}

/// The lock capped claims take in turn, until their transaction ends; and
/// no JIT for the transaction: the planner cannot know that a capped
/// claim reads a few rows per capped principal, and its estimate passes
/// `jit_above_cost` (compiling took 0.9 s of a 1 s claim measured on a
/// 200,000-job queue; 0.5 ms without).
const CAPPED_CLAIMS_LOCK: &str =
    "SET LOCAL jit = off; SELECT pg_advisory_xact_lock(hashtext('leash capped claims ' || current_schema()))";

/// Claim up to `params.limit` of `pool`'s jobs: capped submitters' first
/// when `capped`, then the rest.
async fn claim_from(
    client: &impl GenericClient,
    pool: ClaimPool,
    params: &JobClaimParams,
    capped: bool,
) -> Result<Vec<Lease>, StoreError> {
    // Built once: these run for every claim.
    static UNCAPPED: LazyLock<[String; 2]> = LazyLock::new(|| ClaimPool::ALL.map(uncapped_sql));
    static CAPPED: LazyLock<[String; 2]> = LazyLock::new(|| ClaimPool::ALL.map(capped_sql));
    let mut leases = Vec::new();
    if capped {
        // Prepared before the lock is taken: planning is the slow part.
        let stmt = client.prepare_cached(&CAPPED[pool as usize]).await.map_err(claim_err)?;
        client.batch_execute(CAPPED_CLAIMS_LOCK).await.map_err(claim_err)?;
        leases = run_claim(client, &stmt, params, params.limit).await?;
    }
    let rest = params.limit.saturating_sub(leases.len() as u32);
    if rest > 0 {
        let stmt = client.prepare_cached(&UNCAPPED[pool as usize]).await.map_err(claim_err)?;
        leases.extend(run_claim(client, &stmt, params, rest).await?);
    }
    leases.sort_by_key(|l| (l.job.run_after, l.job.id));
    Ok(leases)
}

/// A claim statement's error: two claimers racing for one key's next job
/// is transient (the unique index refused the second; nothing changed, and
/// the next claim will do).
fn claim_err(e: tokio_postgres::Error) -> StoreError {
    let race = e.code() == Some(&SqlState::UNIQUE_VIOLATION);
    let mut error = db_err("claiming jobs")(e);
    if let StoreError::Database { transient, .. } = &mut error {
        *transient |= race;
    }
    error
}

/// Run one claim statement for up to `limit` jobs.
async fn run_claim(
    client: &impl GenericClient,
    stmt: &tokio_postgres::Statement,
    params: &JobClaimParams,
    limit: u32,
) -> Result<Vec<Lease>, StoreError> {
    let now = params.now.unix_ms();
    let expires = now.saturating_add(millis::column(params.lease_ttl));
    let rows = client.query(stmt, &[&now, &i64::from(limit), &params.worker_id, &expires]).await.map_err(claim_err)?;
    rows.iter()
        .map(|row| {
            let job = row_to_job(row)?;
            let token =
                job.lease_token.clone().ok_or_else(|| corrupt(&job.id.to_string(), "claimed without a token"))?;
            Ok(Lease { job, token })
        })
        .collect()
}

/// Record a running job's ending, fenced by its lease token.
pub(super) async fn finish(client: &impl GenericClient, params: &JobFinishParams) -> Result<bool, StoreError> {
    let err = db_err("finishing a job");
    let (status, kind) = (params.finish.status(), params.finish.error_kind());
    let (output, message, backtrace) = params.finish.columns();
    let progress = params.progress.as_ref().map(to_json).transpose()?;
    let logs = params.logs.as_ref().map(to_json).transpose()?;
    let stmt = client
        .prepare_cached(
            "UPDATE jobs SET status = $1, output = $2, error_kind = $3, error_message = $4, backtrace = $5, \
             fuel_used = $6, peak_memory_bytes = $7, finished_at = $8, last_heartbeat = $8, \
             lease_token = NULL, lease_expires_at = NULL, \
             progress_json = COALESCE($11, progress_json), logs_json = $12 \
             WHERE job_id = $9 AND status = 'running' AND lease_token = $10",
        )
        .await
        .map_err(&err)?;
    let changed = client
        .execute(
            &stmt,
            &[
                &status.as_str(),
                &output,
                &kind.map(ErrorKind::as_str),
                &message,
                &backtrace,
                &i64_of(params.fuel_used),
                &i64_of(params.peak_memory_bytes),
                &params.now.unix_ms(),
                &params.id.to_string(),
                &params.token,
                &progress,
                &logs,
            ],
        )
        .await
        .map_err(&err)?;
    if changed == 1 && status == JobStatus::Succeeded && !params.proposals.is_empty() {
        super::proposals::insert(client, params.id, &params.proposals).await?;
    }
    Ok(changed == 1)
}
