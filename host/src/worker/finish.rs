//! Recording a finished attempt (on a task of its own, so its slot may
//! run a job claimed ahead meanwhile), and leaving the pool: the jobs the
//! finish claimed go to the slot before the finished job leaves, so
//! shutdown never sees an idle pool in between.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::slot::{Claimed, Sent, Slot};
use crate::clock::Timestamp;
use crate::job::{ErrorKind, JobId, JobStatus};
use crate::metrics::AttemptEnd;
use crate::store::{JobFinishParams, JobReleaseParams, Lease};
use crate::worker::{Completion, Pool};

/// A finished attempt, as the pool counts it once its finish is recorded.
pub(super) struct Ending {
    pub(super) id: JobId,
    /// When the attempt began in its slot.
    pub(super) claimed: Instant,
    pub(super) plugin_label: String,
    pub(super) status: JobStatus,
    pub(super) error_kind: Option<ErrorKind>,
    pub(super) fuel_used: u64,
    pub(super) plan_id: Option<String>,
}

impl Pool {
    /// Record a finish, claiming what `sent` asks for its slot; then count
    /// the attempt and leave.
    pub(super) async fn record_finish(self: Arc<Self>, params: JobFinishParams, sent: Sent, ending: Ending) {
        let Ending { id, claimed, plugin_label, status, error_kind, fuel_used, plan_id } = ending;
        let finish_started = Instant::now();
        let hold = self.ahead_hold();
        if sent.asked() > 0 {
            // A job of this slot's going back to the queue first: this
            // claim is to find it in its place, not take those behind it.
            // Not for longer than a hold: a release stuck on the store
            // does not hold the finish up (the order is then the store's).
            let _ = tokio::time::timeout(hold, sent.slot().releases_done()).await;
        }
        // The round counts the store's answer alone: a wait for a release
        // above must not make the slots claim further ahead.
        let sent_at = Instant::now();
        let (recorded, next) = self.finish_with_retry(params, sent.asked()).await;
        self.finish_answered_in(sent_at.elapsed());
        self.metrics.complete_seconds.observe(finish_started.elapsed().as_secs_f64());
        let (end, completion) = if recorded {
            match error_kind {
                None => tracing::info!(status = %status, fuel_used, "finished"),
                Some(kind) => tracing::info!(status = %status, error_kind = %kind, fuel_used, "finished"),
            }
            self.metrics.job_finished(&plugin_label, status, error_kind, fuel_used);
            let counter = match status {
                JobStatus::Succeeded => &self.stats.processed,
                JobStatus::Cancelled => &self.stats.cancelled,
                _ => &self.stats.failed,
            };
            counter.fetch_add(1, Ordering::Relaxed);
            (AttemptEnd::Finished(status), Some(Completion { id, status, error_kind, fuel_used, plan_id }))
        } else {
            self.stats.leases_lost.fetch_add(1, Ordering::Relaxed);
            self.metrics.leases_lost.inc();
            tracing::warn!("lease lost before the outcome was recorded: the result is dropped");
            (AttemptEnd::LeaseLost, None)
        };
        // The next jobs are registered before this one leaves, so shutdown
        // never sees an idle pool in between.
        self.stats.claimed.fetch_add(next.len() as u64, Ordering::Relaxed);
        let next: Vec<Claimed> = next
            .into_iter()
            .map(|lease| {
                let running = self.register(lease.job.id);
                (lease, running)
            })
            .collect();
        let waiting: Vec<JobId> = next.iter().map(|(lease, _)| lease.job.id).collect();
        let slot = sent.slot().clone();
        sent.answer(next);
        // Jobs still waiting for the slot when their hold runs out (its
        // guest runs long) go back to the queue. One timer per answer,
        // holding the pool and slot weakly: a pool dropped meanwhile has
        // nothing to release.
        if !waiting.is_empty() {
            let (pool, slot) = (Arc::downgrade(&self), Arc::downgrade(&slot));
            tokio::spawn(async move {
                tokio::time::sleep(hold).await;
                let (Some(pool), Some(slot)) = (pool.upgrade(), slot.upgrade()) else { return };
                for job in waiting {
                    if let Some(((lease, _), releasing)) = slot.take(job) {
                        pool.release_unstarted(lease, "it waited too long for its slot").await;
                        drop(releasing);
                    }
                }
            });
        }
        self.leave(id, end, claimed, &plugin_label, completion);
    }

    /// Count a finish answered after `round` into the moving average
    /// [`Self::ahead_depth`] reads (each new one weighs an eighth).
    fn finish_answered_in(&self, round: Duration) {
        let us = u64::try_from(round.as_micros()).unwrap_or(u64::MAX);
        let _ = self.finish_round_us.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
            Some(if old == 0 { us } else { old - old / 8 + us / 8 })
        });
    }

    /// How long a job ahead may wait for its slot here.
    fn ahead_hold(&self) -> Duration {
        Slot::hold_for(self.config.lease_ttl, self.config.claim_ahead_below)
    }

    /// How many jobs a busy slot should have ready or asked for after an
    /// attempt that took `attempt` ([`Slot::depth`]), given how long
    /// finishes have lately taken to be answered.
    pub(super) fn ahead_depth(&self, attempt: Duration) -> u32 {
        let round = Duration::from_micros(self.finish_round_us.load(Ordering::Relaxed));
        Slot::depth(attempt, round, self.ahead_hold())
    }

    /// A job claimed ahead that will not run here: back to the queue in
    /// the place it had (its own `run_after`), no attempt spent (it
    /// recorded no effect), and out of the pool.
    pub(super) async fn release_unstarted(&self, lease: Lease, why: &str) {
        let id = lease.job.id;
        let now = self.clock.now();
        let run_after = lease.job.run_after;
        let params = JobReleaseParams { id, token: lease.token, queue_ttl: self.config.queue_ttl, run_after, now };
        match self.store.job_release(params).await {
            Ok(true) => tracing::debug!(job_id = %id, why, "a job claimed ahead went back to the queue"),
            Ok(false) => tracing::debug!(job_id = %id, why, "a job claimed ahead was lost before its release"),
            Err(e) => {
                tracing::warn!(job_id = %id, error = %e, why, "a job claimed ahead could not be released; the sweeper will reclaim it")
            }
        }
        self.forget(id);
    }

    /// Count an ended attempt and take its job out of the pool; then tell
    /// the subscribers.
    pub(super) fn leave(
        &self,
        id: JobId,
        end: AttemptEnd,
        claimed: Instant,
        plugin_label: &str,
        completion: Option<Completion>,
    ) {
        self.metrics.attempt_ended(plugin_label, end, claimed.elapsed());
        self.forget(id);
        // Last: a waiter woken by the completion reads metrics that count
        // the attempt and a pool that no longer runs the job.
        if let Some(completion) = completion {
            self.notify(completion);
        }
    }

    /// Take a job out of the pool's running set.
    fn forget(&self, id: JobId) {
        let now_empty = {
            let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
            running.remove(&id);
            running.is_empty()
        };
        if now_empty {
            self.idle.notify_waiters();
        }
    }

    /// Record the outcome, retrying transient store errors while the lease
    /// could still be ours. `false`: the lease was lost.
    ///
    /// A failed call may still have committed (the reply was lost): then the
    /// retry matches no running row, and the row is checked for this very
    /// finish before the lease is called lost.
    ///
    /// With `claim` above 0, the first try also claims up to that many of
    /// the slot's next jobs (returned with the answer); retries only
    /// finish.
    async fn finish_with_retry(&self, mut params: JobFinishParams, claim: u32) -> (bool, Vec<Lease>) {
        let mut delay = Duration::from_millis(5);
        let give_up = self.clock.now().plus(self.config.lease_ttl);
        let mut tried_at = Vec::new();
        loop {
            tried_at.push(params.now);
            let answer = if claim > 0 && tried_at.len() == 1 {
                self.store.job_finish_and_claim(params.clone(), self.claim_params(claim, false)).await
            } else {
                self.store.job_finish(params.clone()).await.map(|done| (done, Vec::new()))
            };
            match answer {
                Ok((true, next)) => return (true, next),
                Ok((false, _)) if tried_at.len() > 1 => {
                    return (self.finish_landed(&params, &tried_at).await, Vec::new());
                }
                Ok((false, _)) => return (false, Vec::new()),
                Err(e) if e.is_transient() && self.clock.now() < give_up => {
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_millis(500));
                    params.now = self.clock.now();
                }
                Err(_) => return (self.finish_landed(&params, &tried_at).await, Vec::new()),
            }
        }
    }

    /// Whether the row shows this finish: written by one of our attempts
    /// (its `finished_at`), with our ending and usage.
    async fn finish_landed(&self, params: &JobFinishParams, tried_at: &[Timestamp]) -> bool {
        let Ok(Some(job)) = self.store.job_get(params.id).await else { return false };
        job.status == params.finish.status()
            && job.error_kind == params.finish.error_kind()
            && job.worker_id.as_deref() == Some(self.worker_id.as_str())
            && job.fuel_used == Some(params.fuel_used)
            && job.finished_at.is_some_and(|at| tried_at.contains(&at))
    }
}
