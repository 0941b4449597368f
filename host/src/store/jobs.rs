//! Jobs: inserting, listing, progress, cancels and approval decisions.

use std::time::Duration;

use crate::clock::Timestamp;
use crate::job::{JobId, JobProgress, JobStatus, NewJob, PluginRef};

/// What [`JobStore::job_decide`](super::JobStore::job_decide) is asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobDecision {
    /// Approve a job pending approval: queued, or `approved` to wait for a
    /// run trigger when it was submitted with `run_on_approve = false`.
    Approve,
    /// Reject a job pending approval: cancelled with kind `rejected`.
    Reject,
    /// Trigger the run of an `approved` job: queued.
    Run,
}

/// Parameters of [`JobStore::job_decide`](super::JobStore::job_decide).
#[derive(Debug, Clone)]
pub struct JobDecideParams {
    /// The job.
    pub id: JobId,
    /// Approve, reject or run.
    pub decision: JobDecision,
    /// Who decides (recorded with an approval or a rejection).
    pub by: String,
    /// Why, if they said.
    pub comment: Option<String>,
    /// How long it may wait in the queue once queued.
    pub queue_ttl: Duration,
    /// How long an approved job waits for its run trigger.
    pub approval_ttl: Duration,
    /// Now.
    pub now: Timestamp,
}

/// Why [`JobStore::job_decide`](super::JobStore::job_decide) changed nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecideRefusal {
    /// No such job.
    NotFound,
    /// It already ended.
    Terminal(JobStatus),
    /// It was never gated.
    NotGated(JobStatus),
    /// It was already approved (or its run triggered); a rejection of an
    /// approved job is refused too: cancel it instead.
    AlreadyDecided(JobStatus),
    /// A run was asked for before the job was approved.
    NotApproved(JobStatus),
}

/// Parameters of [`JobStore::job_list`](super::JobStore::job_list): filters, newest first, keyset-paged.
#[derive(Debug, Clone, Default)]
pub struct JobListParams {
    /// Only jobs in this state.
    pub status: Option<JobStatus>,
    /// Only jobs of this plugin: a digest, a name (any version) or `name@version`.
    pub plugin: Option<PluginRef>,
    /// Only jobs of this plan.
    pub plan_id: Option<String>,
    /// Only jobs with this concurrency key.
    pub concurrency_key: Option<String>,
    /// Only jobs older than this one (the previous page's last id).
    pub before: Option<JobId>,
    /// Most jobs to return (at least 1).
    pub limit: u32,
}

/// Parameters of [`JobStore::job_progress_set`](super::JobStore::job_progress_set).
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

/// Parameters of [`JobStore::job_insert`](super::JobStore::job_insert).
#[derive(Debug, Clone)]
pub struct JobInsertParams {
    /// Jobs to insert, in one transaction.
    pub jobs: Vec<NewJob>,
    /// The time of submission.
    pub now: Timestamp,
}

/// What a cancel did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelResult {
    /// It was queued or waiting for approval and is now cancelled.
    Cancelled,
    /// It is running; the owner was asked to stop it.
    Requested,
    /// It had already ended; nothing changed.
    AlreadyTerminal(JobStatus),
    /// No such job.
    NotFound,
}
