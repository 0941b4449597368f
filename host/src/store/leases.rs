//! Leases: claiming jobs, renewing, and how a lease holder ends or gives
//! back a job.

use std::time::Duration;

use crate::clock::Timestamp;
use crate::job::{ErrorKind, Job, JobId, JobLogs, JobProgress, JobStatus};

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

/// Parameters of [`JobStore::job_claim`](super::JobStore::job_claim).
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
}

/// Parameters of [`JobStore::lease_extend`](super::JobStore::lease_extend).
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

/// Parameters of [`JobStore::job_finish`](super::JobStore::job_finish).
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
    /// Now.
    pub now: Timestamp,
}

/// Parameters of [`JobStore::job_retry`](super::JobStore::job_retry).
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

/// Parameters of [`JobStore::job_release`](super::JobStore::job_release).
#[derive(Debug, Clone)]
pub struct JobReleaseParams {
    /// The job.
    pub id: JobId,
    /// The lease token from the claim.
    pub token: String,
    /// How long the requeued job may wait again (from `run_after`).
    pub queue_ttl: Duration,
    /// Not claimed again before this: `now`, or later for a pause before
    /// the next try.
    pub run_after: Timestamp,
    /// Now.
    pub now: Timestamp,
}
