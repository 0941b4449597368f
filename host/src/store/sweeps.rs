//! Sweeps: reclaiming expired leases and dead workers' jobs, expiring
//! stale jobs, deleting old ones.

use std::time::Duration;

use crate::clock::Timestamp;
use crate::job::Job;
use crate::store::StoreError;
use crate::store::rules::unfinished;

/// Parameters of [`Sweeps::lease_reclaim_expired`].
#[derive(Debug, Clone)]
pub struct LeaseReclaimParams {
    /// Now: leases that ran out before it are reclaimed.
    pub now: Timestamp,
    /// How long a requeued job may wait again.
    pub queue_ttl: Duration,
}

/// Parameters of [`Sweeps::worker_died`].
#[derive(Debug, Clone)]
pub struct WorkerDiedParams {
    /// The worker whose process died.
    pub worker_id: String,
    /// How it died, e.g. `killed by signal 9 (SIGKILL)`.
    pub how: String,
    /// The last lines it wrote to stderr (may be empty).
    pub stderr: String,
    /// Now.
    pub now: Timestamp,
    /// How long a requeued job may wait again.
    pub queue_ttl: Duration,
}

/// What a reclaim sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReclaimReport {
    /// Jobs put back in the queue (attempts or free re-runs left).
    pub requeued: u64,
    /// Jobs ended: failed with `lease_lost` (nothing left) or
    /// `host_crash`, or cancelled.
    pub failed: u64,
    /// Of those, the jobs quarantined (`host_crash`).
    pub quarantined: u64,
}

impl ReclaimReport {
    pub(crate) fn count(&mut self, fate: &unfinished::Fate) {
        match fate {
            unfinished::Fate::Requeue { .. } => self.requeued += 1,
            unfinished::Fate::End { kind, .. } => {
                self.failed += 1;
                self.quarantined += u64::from(*kind == crate::job::ErrorKind::HostCrash);
            }
        }
    }
}

/// Parameters of [`Sweeps::jobs_expire_queued`].
#[derive(Debug, Clone)]
pub struct JobsExpireParams {
    /// Now: queued jobs whose `expires_at` has passed fail as `expired`.
    pub now: Timestamp,
}

/// Parameters of [`Sweeps::jobs_delete_expired`].
#[derive(Debug, Clone)]
pub struct JobsDeleteParams {
    /// Terminal jobs finished before this are deleted.
    pub finished_before: Timestamp,
    /// Events recorded before this are deleted (as one prefix of the feed).
    pub events_before: Timestamp,
    /// Audit rows written before this are deleted, as one prefix of the
    /// chain, which the head then starts from (`None`: every row is kept).
    pub audit_before: Option<Timestamp>,
}

/// Parameters of [`Sweeps::plans_advance`].
#[derive(Debug, Clone)]
pub struct PlansAdvanceParams {
    /// Only this plan (`None`: every plan whose execute job succeeded and
    /// whose apply job does not exist yet).
    pub plan_id: Option<String>,
    /// Now.
    pub now: Timestamp,
}

/// The background passes: reclaim expired leases and dead workers' jobs,
/// expire queued jobs, advance plans, and delete what retention no longer
/// keeps. Each is safe to run from any number of processes at once.
#[async_trait::async_trait]
pub trait Sweeps: Send + Sync + std::fmt::Debug {
    /// Reclaim running jobs whose lease ran out. An attempt that recorded
    /// no effect is requeued without spending an attempt (`free_reruns +
    /// 1`) while the job's free re-runs last; otherwise `lost_leases + 1`,
    /// requeued after the job's backoff while attempts remain, else failed
    /// with `lease_lost`, the error naming the effect. A job whose cancel
    /// was requested is cancelled. When the lease's worker had stopped
    /// reporting too (its process is gone), the reclaim counts a process
    /// death, as [`Sweeps::worker_died`] does.
    async fn lease_reclaim_expired(&self, params: LeaseReclaimParams) -> Result<ReclaimReport, StoreError>;

    /// The process of `params.worker_id` died (its supervisor saw it end):
    /// reclaim every job it held at once, by the rules of
    /// [`Sweeps::lease_reclaim_expired`], each counting a process death;
    /// a job's [`QUARANTINE_AFTER_DEATHS`](super::QUARANTINE_AFTER_DEATHS)th ends it `host_crash` with how
    /// the process died and its stderr's last lines. The worker's row is
    /// marked stopped.
    async fn worker_died(&self, params: WorkerDiedParams) -> Result<ReclaimReport, StoreError>;

    /// Fail queued and gated jobs past their `expires_at` (a gated job's
    /// is its approval TTL) with kind `expired`.
    async fn jobs_expire_queued(&self, params: JobsExpireParams) -> Result<u64, StoreError>;

    /// Delete terminal jobs finished before the cutoff, in one pass.
    async fn jobs_delete_expired(&self, params: JobsDeleteParams) -> Result<u64, StoreError>;

    /// Delete workers whose last report is older than the cutoff (stopped
    /// or silent ones, at retention).
    async fn workers_delete_stale(&self, last_heartbeat_before: Timestamp) -> Result<u64, StoreError>;

    /// Create the apply job of each plan whose execute job succeeded and
    /// that has none yet (and was not cancelled): at most once per plan,
    /// whoever calls it, however often. Returns the apply jobs created.
    async fn plans_advance(&self, params: PlansAdvanceParams) -> Result<Vec<Job>, StoreError>;
}
