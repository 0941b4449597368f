//! Jobs: inserting, listing, progress, cancels and approval decisions.

use std::time::Duration;

use crate::clock::Timestamp;
use crate::job::{Attempt, Counts, ErrorKind, Job, JobId, JobLogs, JobStatus, NewJob, PluginRef, Remember};
use std::collections::HashMap;

use crate::store::StoreError;

/// What [`Jobs::job_decide`] is asked to do.
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

/// Parameters of [`Jobs::job_decide`].
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
    /// The client's idempotency key, recorded with the decision.
    pub key: Option<String>,
    /// How long it may wait in the queue once queued.
    pub queue_ttl: Duration,
    /// How long an approved job waits for its run trigger.
    pub approval_ttl: Duration,
    /// An approval that makes a standing rule of itself, in the same
    /// write: the rule approves jobs exactly like this one (see
    /// [`crate::job::rule`]). Approvals only.
    pub remember: Option<Remember>,
    /// An approval made by this standing rule, in its author's name (`by`):
    /// refused ([`DecideRefusal::RuleInactive`]) unless, read in the same
    /// write, the rule is neither revoked nor expired and its author still
    /// holds `approve`. Approvals only.
    pub rule: Option<String>,
    /// For a plan's apply phase: the binding digest of what is approved,
    /// recorded with the approval (see [`crate::job::proposal`]).
    pub binding: Option<String>,
    /// Now.
    pub now: Timestamp,
}

/// Why [`Jobs::job_decide`] changed nothing.
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
    /// Its approval TTL (or, approved, the wait for its run's trigger)
    /// ran out first: the store failed it `expired` in the same write.
    Expired,
    /// The approver submitted it, and its duties are separated.
    OwnSubmission,
    /// The approver already approved it, and its quorum needs another.
    ApprovedBefore,
    /// The standing rule deciding was revoked or expired, or its author
    /// may no longer approve.
    RuleInactive,
}

/// Parameters of [`Jobs::job_list`]: filters, newest first, keyset-paged.
#[derive(Debug, Clone, Default)]
pub struct JobListParams {
    /// Only jobs in one of these states (none: every state).
    pub status: Vec<JobStatus>,
    /// Only jobs of this plugin: a digest, a name (any version) or `name@version`.
    pub plugin: Option<PluginRef>,
    /// Only jobs of this plan.
    pub plan_id: Option<String>,
    /// Only jobs with this concurrency key.
    pub concurrency_key: Option<String>,
    /// Only jobs this principal submitted.
    pub submitted_by: Option<String>,
    /// Only jobs this schedule submitted.
    pub schedule_id: Option<JobId>,
    /// Only jobs with every one of these tags (with `any_tag`, any one).
    pub tags: Vec<String>,
    /// `tags` matches a job with any one of them, not all.
    pub any_tag: bool,
    /// Only jobs whose metadata has each of these entries (a string value
    /// as itself, a number or boolean as its JSON text).
    pub metadata: serde_json::Map<String, serde_json::Value>,
    /// Only jobs older than this one (the previous page's last id).
    pub before: Option<JobId>,
    /// Only jobs whose error (or last retried attempt's error) holds this
    /// text, in any case.
    pub error_contains: Option<String>,
    /// Only jobs that ended with this error kind.
    pub error_kind: Option<ErrorKind>,
    /// Only jobs created at or after this time.
    pub created_after: Option<Timestamp>,
    /// Only jobs created before this time.
    pub created_before: Option<Timestamp>,
    /// Most jobs to return (at least 1).
    pub limit: u32,
}

/// Parameters of [`Jobs::job_insert`].
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

/// What a retry (redrive) of an ended job did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedriveResult {
    /// It is queued again, with a fresh set of attempts; the attempt that
    /// ended it stays in its attempt history.
    Queued,
    /// It may not be run again; why.
    Refused(String),
    /// No such job.
    NotFound,
}

/// Parameters of [`Jobs::job_redrive`].
#[derive(Debug, Clone)]
pub struct JobRedriveParams {
    /// The job.
    pub id: JobId,
    /// The time of the retry.
    pub now: Timestamp,
    /// How long it may wait in the queue again.
    pub queue_ttl: Duration,
    /// Who asked, for the audit trail.
    pub actor: Option<String>,
}

/// Jobs as submitters and operators see them: insert, read, list,
/// cancel, decide on a gate, retry, count.
#[async_trait::async_trait]
pub trait Jobs: Send + Sync + std::fmt::Debug {
    /// Insert jobs as `queued`. All or nothing. A job whose idempotency key
    /// a stored job already has fails the insert with
    /// [`StoreError::IdempotencyKeyTaken`]; keys live as long as their job.
    async fn job_insert(&self, params: JobInsertParams) -> Result<Vec<Job>, StoreError>;

    /// One job by id.
    async fn job_get(&self, id: JobId) -> Result<Option<Job>, StoreError>;

    /// The stored jobs that hold any of these idempotency keys: for each
    /// such key, its job's id and status. Keys no job holds are left out.
    async fn jobs_by_idempotency_key(
        &self,
        keys: Vec<String>,
    ) -> Result<HashMap<String, (JobId, JobStatus)>, StoreError>;

    /// Jobs matching the filters, newest first. List rows carry no input or
    /// output bytes (`input` is empty, `output` is `None`): fetch a job by
    /// id for those.
    async fn job_list(&self, params: JobListParams) -> Result<Vec<Job>, StoreError>;

    /// What a finished job's last attempt logged. `None` when the job does
    /// not exist or kept no logs.
    async fn job_logs(&self, id: JobId) -> Result<Option<JobLogs>, StoreError>;

    /// A job's attempts before the one its row holds, oldest first (the
    /// whole timeline is [`crate::job::timeline`]). Empty for an unknown
    /// job or one that never ran again.
    async fn job_earlier_attempts(&self, id: JobId) -> Result<Vec<Attempt>, StoreError>;

    /// Cancel: queued and gated (`pending_approval`, `approved`) jobs at
    /// once, running jobs by request. Audited as `actor`'s when one is
    /// named.
    async fn job_cancel(&self, id: JobId, now: Timestamp, actor: Option<String>) -> Result<CancelResult, StoreError>;

    /// Queue an ended job again (a failed or cancelled one, never a gated
    /// job or a plan's phase): its error and output are cleared, its
    /// attempt counters start again (its run numbers go on), and the
    /// attempt that ended it is kept in its attempt history. Audited as
    /// `actor`'s `job.retry`.
    async fn job_redrive(&self, params: JobRedriveParams) -> Result<RedriveResult, StoreError>;

    /// Decide on a gated job, atomically: of two decisions racing, one
    /// wins and the other is refused. Returns the job as changed.
    async fn job_decide(&self, params: JobDecideParams) -> Result<Result<Job, DecideRefusal>, StoreError>;

    /// Counts by state from one consistent read.
    async fn counts_snapshot(&self) -> Result<Counts, StoreError>;

    /// Queued jobs, for admission control. Called often: it must cost in
    /// proportion to the queue, not to the jobs kept for retention.
    async fn queued_count(&self) -> Result<u64, StoreError> {
        Ok(self.counts_snapshot().await?.queued)
    }

    /// The earliest `run_after` of the queued jobs: when the job waiting
    /// longest became claimable (in the future when every queued job is
    /// delayed). `None` when nothing is queued. Read from the claim's
    /// partial index, so it costs the same however many jobs are kept.
    async fn oldest_queued_due(&self) -> Result<Option<Timestamp>, StoreError>;

    /// How many queued jobs come before `job` in claim order at `now`: not
    /// paused, due, not waiting for a rate slot or a running job of their
    /// concurrency key, and of an earlier
    /// priority, or the same one and due earlier (then older). For `jobs
    /// why`; the claim's capped-submitter and aged-share turns are not
    /// counted.
    async fn jobs_ahead(&self, job: &Job, now: Timestamp) -> Result<u64, StoreError>;
}
