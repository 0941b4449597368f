//! Waiting for a job to end (with a deadline, or as a sync call) and
//! cancelling it.

use std::time::Duration;

use serde::Serialize;

use crate::job::{Job, JobId, JobStatus};
use crate::store::{CancelResult, JobRedriveParams, JobsExpireParams, RedriveResult};

use super::{DEADLINE_SETTLE, Runtime, RuntimeError, Submit, Submitted};

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

    /// Run a job synchronously: the one meaning of *sync*, for an embedder
    /// and for `POST /v1/jobs` alike: an operation deadline.
    /// `deadline` counts from now and covers the queue wait and the run: a
    /// job not started by then never starts (it ends `expired`), and a job
    /// that started has its run cut to end by then (its timeout is at most
    /// the deadline), so the answer is the job's own outcome.
    /// [`RuntimeError::WaitTimeout`] only when the job had not ended
    /// shortly after the deadline (its worker stopped without a word); it
    /// never starts again.
    ///
    /// A job that must wait for approval is answered at once
    /// ([`Called::Waiting`]); its run, when triggered ([`Runtime::approve`],
    /// [`Runtime::run_approved`]), keeps the deadline, counted from the
    /// trigger, and [`Runtime::wait_sync`] waits for it. Dropping the
    /// future before it answers (an HTTP client that went away) leaves the
    /// job to run and counts an abandoned wait.
    pub async fn call(&self, mut job: Submit, deadline: Duration) -> Result<Called, RuntimeError> {
        job.timeout = Some(job.timeout.map_or(deadline, |own| own.min(deadline)));
        job.deadline = Some(deadline);
        let Submitted { id, status, replayed } = self.submit_once(job).await?;
        if status.is_gated() {
            return Ok(Called::Waiting { id, status, replayed });
        }
        Ok(Called::Finished { job: Box::new(self.wait_sync(id, deadline).await?), replayed })
    }

    /// Wait for a job run with a deadline (a sync call, or a gated one
    /// stamped sync whose run was triggered) to end, as [`Runtime::call`]
    /// does. Dropping the future before it answers counts an abandoned wait.
    pub async fn wait_sync(&self, id: JobId, deadline: Duration) -> Result<Job, RuntimeError> {
        let abandoned = AbandonedWait { runtime: self, armed: true };
        let waited = self.wait_past_deadline(id, deadline).await;
        abandoned.disarm();
        waited
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
        match self.inner.store.job_cancel(id, self.inner.settings.clock.now(), self.actor()).await? {
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

    /// Retry (redrive) an ended job: a failed or cancelled one is queued
    /// again with a fresh set of attempts, for the queue TTL this runtime
    /// gives a job; its earlier attempts stay in its history.
    pub async fn retry(&self, id: JobId) -> Result<(), RuntimeError> {
        let settings = &self.inner.settings;
        let params = JobRedriveParams {
            id,
            now: settings.clock.now(),
            queue_ttl: settings.worker.queue_ttl,
            actor: self.actor(),
        };
        match self.inner.store.job_redrive(params).await? {
            RedriveResult::Queued => {
                // Counted for admission and the pool woken, as a submit is.
                self.inner.queue.lock().unwrap_or_else(|e| e.into_inner()).queued += 1;
                self.nudge();
                Ok(())
            }
            RedriveResult::Refused(why) => Err(RuntimeError::NotRetryable(why)),
            RedriveResult::NotFound => Err(RuntimeError::NotFound(id)),
        }
    }
}

/// What [`Runtime::call`] answers. `replayed`: the idempotency key
/// already belonged to this same request, so nothing new was queued and
/// this is the first request's job.
#[derive(Debug, Clone)]
pub enum Called {
    /// The job ended: its outcome.
    Finished {
        /// The job as it ended, output included.
        job: Box<Job>,
        /// A replay of an earlier request.
        replayed: bool,
    },
    /// The job waits for a person; nothing was waited for.
    Waiting {
        /// The job.
        id: JobId,
        /// Its state when submitted (`pending_approval`, or `approved`
        /// for a replay whose job was approved since).
        status: JobStatus,
        /// A replay of an earlier request.
        replayed: bool,
    },
}

/// Counts a sync wait whose caller went away before the answer.
struct AbandonedWait<'a> {
    runtime: &'a Runtime,
    armed: bool,
}

impl AbandonedWait<'_> {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for AbandonedWait<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.runtime.count_abandoned_wait();
        }
    }
}
