//! A worker pool in another process: `leash serve`'s default, which keeps
//! its API in one process and runs guests in a supervised child, so a
//! crash in a guest's run costs the child, never the server.
//!
//! The API's runtime runs no pool of its own; it hands the pool what an
//! in-process pool would hear directly (a job became claimable, a job is
//! being cancelled) through [`RemotePool`], and hears back each job the
//! pool finished ([`Runtime::completed_elsewhere`]), so waiters wake at
//! once rather than at their next poll. The store stays the one source of
//! truth: a message lost with a dying child costs only latency.

use std::fmt;
use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};

use super::Runtime;
use crate::clock::Timestamp;
use crate::job::JobId;
use crate::worker::{Completion, PoolState};

/// The pool process as the API's runtime sees it.
#[async_trait::async_trait]
pub trait RemotePool: Send + Sync + fmt::Debug {
    /// Jobs may have become claimable: claim now, not at the next poll.
    fn wake(&self);
    /// A cancel was requested: stop the job now if the pool runs it (it
    /// would see the request at its next lease renewal anyway).
    fn cancel(&self, id: JobId);
    /// The pool's report, or `None` when it does not answer in time (its
    /// process is down or starting).
    async fn report(&self) -> Option<PoolReport>;
    /// The supervisor's account of the pool process.
    fn supervision(&self) -> Supervision;
}

/// A pool's state and counters, and its metrics, as it reports them to
/// the process that supervises it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PoolReport {
    /// The pool's worker id.
    pub worker_id: String,
    /// Its state.
    pub state: PoolState,
    /// Its job slots.
    pub max_workers: usize,
    /// Jobs running in it now.
    pub running: usize,
    /// Jobs that succeeded in it.
    pub processed: u64,
    /// Jobs that failed in it.
    pub failed: u64,
    /// Jobs cancelled in it.
    pub cancelled: u64,
    /// Results it dropped because a lease was lost.
    pub leases_lost: u64,
    /// Its last claim, renewal or completion.
    pub last_heartbeat: Option<Timestamp>,
    /// Its pool metrics in the Prometheus text format, without the
    /// closing `# EOF`.
    pub metrics: String,
}

/// How `leash serve`'s supervisor has kept its pool process.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Supervision {
    /// The pool process now (`None` while it is being started again).
    pub pid: Option<u32>,
    /// Times the pool process died and was started again.
    pub restarts: u64,
    /// How the last pool process that died ended, e.g. `killed by signal
    /// 9 (SIGKILL)`.
    pub last_exit: Option<String>,
}

impl Runtime {
    /// Hear a job that a pool in another process finished: waiters on it
    /// wake at once. (The job is read from the store; only its id counts.)
    pub fn completed_elsewhere(&self, completion: Completion) {
        let _ = self.inner.pool.completions.send(completion);
    }

    /// Claim now rather than at the next poll: jobs may have become
    /// claimable through another process.
    pub fn wake_pool(&self) {
        self.inner.pool.wake.notify_one();
    }

    /// Stop a job if this process runs it (a cancel was requested
    /// elsewhere). `false` if it does not run here.
    pub fn stop_here(&self, id: JobId) -> bool {
        self.inner.pool.cancel_local(id)
    }

    /// This process's pool as it reports itself to a supervisor.
    pub fn pool_report(&self) -> PoolReport {
        let pool = &self.inner.pool;
        self.set_pool_gauges();
        PoolReport {
            worker_id: pool.worker_id.clone(),
            state: *pool.state.borrow(),
            max_workers: pool.config.max_workers,
            running: pool.running_count(),
            processed: pool.stats.processed.load(Ordering::Relaxed),
            failed: pool.stats.failed.load(Ordering::Relaxed),
            cancelled: pool.stats.cancelled.load(Ordering::Relaxed),
            leases_lost: pool.stats.leases_lost.load(Ordering::Relaxed),
            last_heartbeat: crate::worker::last_heartbeat(&pool.stats),
            metrics: self.inner.metrics.encode_pool(),
        }
    }

    /// Wake the pool, here or in the process that runs it.
    pub(super) fn nudge(&self) {
        self.inner.pool.wake.notify_one();
        if let Some(remote) = &self.inner.remote {
            remote.wake();
        }
    }
}
