//! Leases: claiming jobs, renewing, and how a lease holder ends or gives
//! back a job.

use std::time::Duration;

use crate::clock::Timestamp;
use crate::job::{ErrorKind, Job, JobId, JobLogs, JobProgress, JobStatus, Proposal};
use crate::store::StoreError;

/// Message recorded when a job's lease expired with no attempts left.
pub const LEASE_LOST_MESSAGE: &str = "LeaseLost: Heartbeat timeout — job stuck (its worker stopped renewing the lease)";

/// A job a worker now owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The job, as claimed (status running).
    pub job: Job,
    /// The token every later write must carry.
    pub token: String,
}

/// How long a job is due before it is *aged*: a claim's aged share
/// ([`JobClaimParams::aged`]) may take it whatever its priority.
pub const AGED_AFTER: Duration = Duration::from_secs(60);

/// A pool gives one claimed job in this many to aged jobs, so a job of
/// any priority waits a bounded time under a backlog of higher ones.
pub const AGED_SHARE: u64 = 10;

/// Parameters of [`Leases::job_claim`].
///
/// A claim takes due jobs by priority (0 first), then earliest due, then
/// oldest. Its first `aged` jobs are the ones due longest among those due
/// for [`AGED_AFTER`] or longer, whatever their priority (the bound on
/// starvation; a pool asks for one in every [`AGED_SHARE`]).
#[derive(Debug, Clone)]
pub struct JobClaimParams {
    /// The claiming worker.
    pub worker_id: String,
    /// Most jobs to claim.
    pub limit: u32,
    /// The claimer runs nothing now: it may take a *suspect* (a queued job
    /// a process died under, `process_deaths > 0`), which it then runs
    /// alone. Without it, suspects are left to such a claimer.
    pub alone: bool,
    /// Lease length.
    pub lease_ttl: Duration,
    /// Now.
    pub now: Timestamp,
    /// Of `limit`, how many go first to aged jobs, in due order.
    pub aged: u32,
}

impl JobClaimParams {
    /// Jobs due at or before this are aged.
    pub fn aged_before(&self) -> Timestamp {
        self.now.minus(AGED_AFTER)
    }
}

/// Parameters of [`Leases::lease_extend`].
#[derive(Debug, Clone)]
pub struct LeaseExtendParams {
    /// The job.
    pub id: JobId,
    /// The lease token from the claim.
    pub token: String,
    /// New lease length from `now`.
    pub lease_ttl: Duration,
    /// Now.
    pub now: Timestamp,
}

/// What a renewal learned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseState {
    /// Still ours; `cancel_requested` read in the same statement.
    Held {
        /// Someone asked to cancel the job.
        cancel_requested: bool,
    },
    /// Not ours any more: stop the guest and drop its result.
    Lost,
}

/// How a lease holder ends a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finish {
    /// Succeeded with output.
    Succeeded {
        /// Output bytes.
        output: Vec<u8>,
    },
    /// Failed.
    Failed {
        /// Why.
        kind: ErrorKind,
        /// `"Type: message"`.
        message: String,
        /// Guest backtrace of a trap.
        backtrace: Option<String>,
    },
    /// Cancelled after the worker observed the request.
    Cancelled {
        /// `"Cancelled: ..."`.
        message: String,
    },
}

impl Finish {
    /// The terminal status this ending records.
    pub fn status(&self) -> JobStatus {
        match self {
            Finish::Succeeded { .. } => JobStatus::Succeeded,
            Finish::Failed { .. } => JobStatus::Failed,
            Finish::Cancelled { .. } => JobStatus::Cancelled,
        }
    }

    /// What it stores: the output, the error message and the backtrace.
    pub fn columns(&self) -> (Option<&[u8]>, Option<&str>, Option<&str>) {
        match self {
            Finish::Succeeded { output } => (Some(output), None, None),
            Finish::Failed { message, backtrace, .. } => (None, Some(message), backtrace.as_deref()),
            Finish::Cancelled { message } => (None, Some(message), None),
        }
    }

    /// The error kind it records (`None` for success).
    pub fn error_kind(&self) -> Option<ErrorKind> {
        match self {
            Finish::Succeeded { .. } => None,
            Finish::Failed { kind, .. } => Some(*kind),
            Finish::Cancelled { .. } => Some(ErrorKind::Cancelled),
        }
    }
}

/// Parameters of [`Leases::job_finish`].
#[derive(Debug, Clone)]
pub struct JobFinishParams {
    /// The job.
    pub id: JobId,
    /// The lease token from the claim.
    pub token: String,
    /// The ending.
    pub finish: Finish,
    /// Fuel used by the attempt.
    pub fuel_used: u64,
    /// Peak memory of the attempt.
    pub peak_memory_bytes: u64,
    /// The guest's last progress report, if it made one.
    pub progress: Option<JobProgress>,
    /// What the attempt logged.
    pub logs: Option<JobLogs>,
    /// The effects a plan's execute phase proposed, recorded with its
    /// success in the same transaction (dropped with any other ending).
    pub proposals: Vec<Proposal>,
    /// Now.
    pub now: Timestamp,
}

/// Parameters of [`Leases::job_retry`].
#[derive(Debug, Clone)]
pub struct JobRetryParams {
    /// The job.
    pub id: JobId,
    /// The lease token from the claim.
    pub token: String,
    /// The attempt's error, kept as `last_error`.
    pub kind: ErrorKind,
    /// `"Type: message"`.
    pub message: String,
    /// The backoff: not claimed again before this.
    pub run_after: Timestamp,
    /// How long it may wait in the queue once due.
    pub queue_ttl: Duration,
    /// Fuel used by the attempt.
    pub fuel_used: u64,
    /// Peak memory of the attempt.
    pub peak_memory_bytes: u64,
    /// What the attempt logged.
    pub logs: Option<JobLogs>,
    /// Now.
    pub now: Timestamp,
}

/// Parameters of [`Leases::job_release`].
#[derive(Debug, Clone)]
pub struct JobReleaseParams {
    /// The job.
    pub id: JobId,
    /// The lease token from the claim.
    pub token: String,
    /// How long the requeued job may wait again (from `run_after` or
    /// `now`, whichever is later).
    pub queue_ttl: Duration,
    /// Not claimed again before this: `now`, or later for a pause before
    /// the next try; or the job's own `run_after` for a job released
    /// before it started, which keeps its place in the queue (and its age
    /// for the aged share). Never moves the job's `run_after` earlier.
    pub run_after: Timestamp,
    /// Now.
    pub now: Timestamp,
}

/// Parameters of [`Leases::job_progress_set`].
#[derive(Debug, Clone)]
pub struct JobProgressParams {
    /// The job.
    pub id: JobId,
    /// The lease token from the claim.
    pub token: String,
    /// The report.
    pub progress: JobProgress,
    /// Now (recorded as a heartbeat).
    pub now: Timestamp,
}

/// The running side of a job, fenced by its lease: claim, renew, report
/// progress, and the three ways an attempt ends (finish, retry, release).
/// Every write takes the lease token and answers `false` when the lease
/// was lost: the caller drops its result.
#[async_trait::async_trait]
pub trait Leases: Send + Sync + std::fmt::Debug {
    /// Claim up to `limit` queued, unexpired jobs whose `run_after` has
    /// come, earliest due first (then oldest), skipping
    /// any whose concurrency key already has a running job (and all but the
    /// oldest queued job of each key) and any of a submitter running its
    /// cap (`max_running`, kept exactly across every claimer sharing the
    /// store; capped submitters' jobs are taken first, within their room).
    /// Each gets a fresh lease token.
    async fn job_claim(&self, params: JobClaimParams) -> Result<Vec<Lease>, StoreError>;

    /// Renew a lease and read `cancel_requested` in the same statement.
    async fn lease_extend(&self, params: LeaseExtendParams) -> Result<LeaseState, StoreError>;

    /// Record a running job's progress. `false` if the token no longer owns it.
    async fn job_progress_set(&self, params: JobProgressParams) -> Result<bool, StoreError>;

    /// End a running job. `false` if the token no longer owns it.
    async fn job_finish(&self, params: JobFinishParams) -> Result<bool, StoreError>;

    /// End a running job and, if that worked, claim up to `next.limit`
    /// more for the slot it frees: a busy worker's one round trip per job
    /// instead of two. A claim that fails leaves the finish standing and
    /// claims nothing. The default runs the two calls one after the other;
    /// a store that can should do both in one transaction.
    async fn job_finish_and_claim(
        &self,
        params: JobFinishParams,
        next: JobClaimParams,
    ) -> Result<(bool, Vec<Lease>), StoreError> {
        if !self.job_finish(params).await? {
            return Ok((false, Vec::new()));
        }
        Ok((true, self.job_claim(next).await.unwrap_or_default()))
    }

    /// Queue a running job again after a retryable failure, due at
    /// `run_after`, spending one of its attempts (`retries + 1`). `false`
    /// if the token no longer owns it or it has no attempt left (then the
    /// caller records the failure with [`Leases::job_finish`]).
    async fn job_retry(&self, params: JobRetryParams) -> Result<bool, StoreError>;

    /// Give a running job back to the queue (shutdown, or a transient
    /// fault before its guest started): no attempt spent if the attempt
    /// recorded no effect; after an effect an attempt is spent, and with
    /// none left the job fails as `interrupted`. `false` if the token no
    /// longer owns it.
    async fn job_release(&self, params: JobReleaseParams) -> Result<bool, StoreError>;

    /// A signal that changes when jobs may have become claimable (through
    /// another process sharing the store, PostgreSQL's `NOTIFY`; a write of
    /// this process's own; a rate slot coming), so a pool wakes before its
    /// poll interval. `None`: the store cannot tell, and pools poll.
    fn enqueued(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }
}

/// Change an [`enqueued`](Leases::enqueued) signal: its pools look for
/// jobs now.
pub(crate) fn ring(signal: &tokio::sync::watch::Sender<u64>) {
    signal.send_modify(|n| *n = n.wrapping_add(1));
}
