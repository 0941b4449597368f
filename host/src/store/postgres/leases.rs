//! The PostgreSQL store's [`Leases`]: the claim, renewals,
//! progress, and an attempt's three endings (finish, retry, release).

use deadpool_postgres::GenericClient;
use tokio::sync::watch;

use super::PostgresStore;
use super::claim::claim;
use super::fate::{apply_fate, attempt_effects, counters_of};
use super::rows::{db_err, text};
use crate::job::millis;
use crate::store::rules::codec::{i64_of, to_json};
use crate::store::rules::unfinished::{self, Decision};
use crate::store::sql::COUNTER_COLUMNS;
use crate::store::{
    JobClaimParams, JobFinishParams, JobProgressParams, JobReleaseParams, JobRetryParams, Lease, LeaseExtendParams,
    LeaseState, Leases, StoreError,
};

#[async_trait::async_trait]
impl Leases for PostgresStore {
    async fn job_claim(&self, params: JobClaimParams) -> Result<Vec<Lease>, StoreError> {
        let leases = self.claim_jobs(params).await?;
        self.inner.freshness.changed(leases.len() as u64, &self.inner.pool);
        Ok(leases)
    }

    async fn lease_extend(&self, params: LeaseExtendParams) -> Result<LeaseState, StoreError> {
        self.inner.renewals.renew(params).await
    }

    async fn job_finish(&self, params: JobFinishParams) -> Result<bool, StoreError> {
        Ok(self.inner.finishes.finish(params, None).await?.0)
    }

    async fn job_finish_and_claim(
        &self,
        params: JobFinishParams,
        next: JobClaimParams,
    ) -> Result<(bool, Vec<Lease>), StoreError> {
        // Gathered with other slots' finishes and claims: the claims run
        // after the finishes, in their transaction, so they see the
        // finished jobs' concurrency keys released; a finish that changed
        // nothing (the lease was lost) claims nothing.
        self.inner.finishes.finish(params, Some(next)).await
    }

    async fn job_release(&self, params: JobReleaseParams) -> Result<bool, StoreError> {
        // Its place kept (an earlier `run_after` is not moved); its
        // queue time counted from now.
        let run_after = params.run_after.unix_ms();
        let requeue_until = params.run_after.max(params.now).unix_ms().saturating_add(millis::column(params.queue_ttl));
        let err = db_err("releasing a job");
        let mut client = self.client("releasing a job").await?;
        let tx = client.transaction().await.map_err(&err)?;
        let id = params.id.to_string();
        let sql = format!(
            "SELECT {COUNTER_COLUMNS} FROM jobs WHERE job_id = $1 AND lease_token = $2 \
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
        tx.commit().await.map_err(&err)?;
        self.wake();
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
                 WHERE job_id = $8 AND lease_token = $9 \
                 AND lost_leases + retries + 1 < max_attempts",
                &[
                    &run_after,
                    &run_after.saturating_add(millis::column(params.queue_ttl)),
                    &text(&format!("{}: {}", params.kind, params.message)),
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
                 WHERE job_id = $3 AND lease_token = $4",
                &[&progress, &params.now.unix_ms(), &params.id.to_string(), &params.token],
            )
            .await?;
        Ok(changed == 1)
    }

    fn enqueued(&self) -> Option<watch::Receiver<u64>> {
        Some(self.inner.enqueued.clone())
    }
}

impl PostgresStore {
    /// [`Leases::job_claim`], but for counting the rows it changed.
    async fn claim_jobs(&self, params: JobClaimParams) -> Result<Vec<Lease>, StoreError> {
        let mut client = self.client("claiming jobs").await?;
        if !self.any_capped(&client).await? {
            let Some(admission) = self.admission(&client).await? else {
                return claim(&client, &params, false).await;
            };
            // Sent together, the admission first (its statement is in
            // hand, so it goes out as soon as it is polled): the claim
            // runs after it and sees the slots it gave.
            let (admitted, claimed) =
                tokio::join!(self.admit_with(&client, &admission, params.now), claim(&client, &params, false));
            admitted?;
            return claimed;
        }
        self.admit_due(&client, params.now).await?;
        let err = db_err("claiming jobs");
        let tx = client.transaction().await.map_err(&err)?;
        let leases = claim(&tx, &params, true).await?;
        tx.commit().await.map_err(&err)?;
        Ok(leases)
    }
}
