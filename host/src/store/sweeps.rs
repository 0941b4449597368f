//! Sweeps: reclaiming expired leases and dead workers' jobs, expiring
//! stale jobs, deleting old ones.

use std::time::Duration;

use crate::clock::Timestamp;
use crate::store::unfinished;

/// Parameters of [`JobStore::lease_reclaim_expired`](super::JobStore::lease_reclaim_expired).
#[derive(Debug, Clone)]
pub struct LeaseReclaimParams {
    /// Now: leases that ran out before it are reclaimed.
    pub now: Timestamp,
    /// How long a requeued job may wait again.
    pub queue_ttl: Duration,
}

/// Parameters of [`JobStore::worker_died`](super::JobStore::worker_died).
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

/// Parameters of [`JobStore::jobs_expire_queued`](super::JobStore::jobs_expire_queued).
#[derive(Debug, Clone)]
pub struct JobsExpireParams {
    /// Now: queued jobs whose `expires_at` has passed fail as `expired`.
    pub now: Timestamp,
}

/// Parameters of [`JobStore::jobs_delete_expired`](super::JobStore::jobs_delete_expired).
#[derive(Debug, Clone)]
pub struct JobsDeleteParams {
    /// Terminal jobs finished before this are deleted.
    pub finished_before: Timestamp,
    /// Events recorded before this are deleted (as one prefix of the feed).
    pub events_before: Timestamp,
}
