//! Waiting for a job to end (with a deadline, or as a sync call) and
//! cancelling it.

use std::time::Duration;

use serde::Serialize;

use crate::job::{Job, JobId};
use crate::store::{CancelResult, JobsExpireParams};

use super::{DEADLINE_SETTLE, Runtime, RuntimeError, Submit};

/// What `cancel` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, utoipa::ToSchema)]
pub enum Cancelled {
    /// It was queued and is now cancelled.
    #[serde(rename = "cancelled")]
    Cancelled,
    /// It is running; its owner was asked to stop it.
    #[serde(rename = "cancel_requested")]
    Requested,
}

impl Runtime {
    /// Wait for a job with a deadline `deadline` from its submission (see
    /// [`Submit::deadline`]) to end. At the deadline a job still queued is
    /// expired at once (not at the next sweep); a running one has its
    /// worker's cancel grace and a few seconds more to record the timeout
    /// its worker gave it. [`RuntimeError::WaitTimeout`] only when even
    /// that passes: its worker stopped without a word.
    pub async fn wait_past_deadline(&self, id: JobId, deadline: Duration) -> Result<Job, RuntimeError> {
        match self.wait_then_expire(id, deadline).await? {
            Some(job) => Ok(job),
            None => self.wait(id, self.inner.settings.worker.cancel_grace + DEADLINE_SETTLE).await,
        }
    }

    /// Wait up to `deadline` (not counted as abandoned); at the deadline,
    /// expire what is still queued past its expiry at once rather than at
    /// the next sweep, and answer `None`.
    async fn wait_then_expire(&self, id: JobId, deadline: Duration) -> Result<Option<Job>, RuntimeError> {
        match self.wait_uncounted(id, deadline).await {
            Err(RuntimeError::WaitTimeout(_)) => {}
            other => return other.map(Some),
        }
        self.inner.store.jobs_expire_queued(JobsExpireParams { now: self.now() }).await?;
        Ok(None)
    }

    /// Wait until the job ends, up to `timeout`. Timing out does not cancel
    /// the job; it is counted as an abandoned wait
    /// (`leash_waits_abandoned_total`, `waits_abandoned` in health). Woken
    /// at once by completions in this process; jobs run by other processes
    /// are polled every `poll_interval`.
    pub async fn wait(&self, id: JobId, timeout: Duration) -> Result<Job, RuntimeError> {
        let waited = self.wait_uncounted(id, timeout).await;
        if matches!(waited, Err(RuntimeError::WaitTimeout(_))) {
            self.count_abandoned_wait();
        }
        waited
    }

    /// Submit a job with an operation deadline and wait for it (seed 003's
    /// waiter): the job must start within `deadline` — its queue TTL is cut
    /// to it, so if the deadline passes first it never starts and ends
    /// `expired` — and the wait ends at the deadline too. A job that
    /// started in time runs on to its own limits when the wait ends: the
    /// caller gets [`RuntimeError::WaitTimeout`], counted as an abandoned
    /// wait, and reads the outcome later.
    ///
    /// A job that must wait for approval is answered at once, in
    /// `pending_approval`; whoever triggers its run ([`Runtime::approve`],
    /// [`Runtime::run_approved`]) can wait for the outcome.
    pub async fn call(&self, mut job: Submit, deadline: Duration) -> Result<Job, RuntimeError> {
        job.queue_ttl = Some(job.queue_ttl.map_or(deadline, |ttl| ttl.min(deadline)));
        let id = self.submit(job).await?;
        let submitted = self.get(id).await?;
        if submitted.status.is_gated() {
            return Ok(submitted);
        }
        if let Some(job) = self.wait_then_expire(id, deadline).await? {
            return Ok(job);
        }
        let job = self.get(id).await?;
        if job.status.is_terminal() {
            return Ok(job);
        }
        self.count_abandoned_wait();
        Err(RuntimeError::WaitTimeout(id))
    }

    /// A waiter gave up on a job that goes on.
    pub(crate) fn count_abandoned_wait(&self) {
        self.inner.metrics.waits_abandoned.inc();
    }

    async fn wait_uncounted(&self, id: JobId, timeout: Duration) -> Result<Job, RuntimeError> {
        let mut completions = self.inner.pool.completions.subscribe();
        let poll = self.inner.settings.worker.poll_interval;
        let waiting = async {
            loop {
                match self.get(id).await {
                    Ok(job) if job.status.is_terminal() => return Ok(job),
                    Ok(_) => {}
                    // A store that is briefly unreachable: ask again at the
                    // next poll, within the caller's timeout.
                    Err(RuntimeError::Store(e)) if e.is_transient() => {}
                    Err(e) => return Err(e),
                }
                let sleep = tokio::time::sleep(poll);
                tokio::pin!(sleep);
                loop {
                    tokio::select! {
                        _ = &mut sleep => break,
                        event = completions.recv() => match event {
                            Ok(c) if c.id == id => break,
                            Ok(_) => {}
                            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => break,
                            Err(tokio::sync::broadcast::error::RecvError::Closed) => {}
                        },
                    }
                }
            }
        };
        tokio::time::timeout(timeout, waiting).await.map_err(|_| RuntimeError::WaitTimeout(id))?
    }

    /// Cancel: a queued job at once, a running job by asking its owner.
    pub async fn cancel(&self, id: JobId) -> Result<Cancelled, RuntimeError> {
        match self.inner.store.job_cancel(id, self.inner.settings.clock.now()).await? {
            CancelResult::Cancelled => Ok(Cancelled::Cancelled),
            CancelResult::Requested => {
                // If this process (or its pool's) runs it, stop it now
                // rather than at the next lease renewal.
                self.inner.pool.cancel_local(id);
                if let Some(remote) = &self.inner.remote {
                    remote.cancel(id);
                }
                Ok(Cancelled::Requested)
            }
            CancelResult::AlreadyTerminal(status) => Err(RuntimeError::AlreadyTerminal { id, status }),
            CancelResult::NotFound => Err(RuntimeError::NotFound(id)),
        }
    }
}
