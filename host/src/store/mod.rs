//! The store seam: where jobs live between submission and retention.
//!
//! [`JobStore`] is the one interface the rest of leash uses; each backend
//! owns its SQL and migrations ([`sqlite`], the embedded default, and
//! [`postgres`]). Methods are noun-first and take params structs with
//! `now` injected. Every write
//! that only a lease holder may make takes the lease token and reports
//! whether it took effect: `false` means the lease was lost (the job was
//! reclaimed, released or finished elsewhere) and the caller must drop its
//! result. The integration tests' conformance suite holds the cases every
//! backend must pass, each one a test per backend.
//!
//! This module knows nothing of wasm: it stores plugin digests and bytes.

mod approval;
mod codec;
mod event;
pub mod faults;
mod plan;
pub mod postgres;
pub mod sqlite;
mod unfinished;

pub use unfinished::QUARANTINE_AFTER_DEATHS;

pub use event::{Event, EventFilter, EventId, EventKind, EventPage, EventsAfterParams, JobEvent, WorkerEvent};

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::job::{
    ApplyMode, ApprovalPolicy, Counts, Digest, Effect, EffectOutcome, ErrorKind, Grants, Job, JobId, JobLogs,
    JobProgress, JobStatus, NewJob, PlanRecord, PluginInfo, PluginName, PluginRef,
};

/// Where the job store lives, as `--db` and `LEASH_DATABASE_URL` name it.
#[derive(Clone, PartialEq, Eq)]
pub enum Database {
    /// An SQLite file, created if missing: the embedded default.
    Sqlite(PathBuf),
    /// A PostgreSQL connection URL (`postgres://…` or `postgresql://…`).
    Postgres(String),
}

impl Database {
    /// `postgres://…` and `postgresql://…` name PostgreSQL; `sqlite:PATH`,
    /// `sqlite://PATH` and a bare path name an SQLite file.
    pub fn parse(text: &str) -> Database {
        if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            return Database::Postgres(text.to_owned());
        }
        let path = text.strip_prefix("sqlite://").or_else(|| text.strip_prefix("sqlite:")).unwrap_or(text);
        Database::Sqlite(PathBuf::from(path))
    }

    /// Where `leash serve` keeps its API token unless told: beside an
    /// SQLite file (`PATH.token`), else `leash.token` in the working folder.
    pub fn default_token_file(&self) -> PathBuf {
        match self {
            Database::Sqlite(path) => {
                let mut name = path.as_os_str().to_owned();
                name.push(".token");
                PathBuf::from(name)
            }
            Database::Postgres(_) => PathBuf::from("leash.token"),
        }
    }
}

impl From<&str> for Database {
    fn from(text: &str) -> Self {
        Database::parse(text)
    }
}

impl From<String> for Database {
    fn from(text: String) -> Self {
        Database::parse(&text)
    }
}

impl From<PathBuf> for Database {
    /// A path is always an SQLite file, whatever it looks like.
    fn from(path: PathBuf) -> Self {
        Database::Sqlite(path)
    }
}

impl From<&Path> for Database {
    fn from(path: &Path) -> Self {
        Database::Sqlite(path.to_owned())
    }
}

impl From<&PathBuf> for Database {
    fn from(path: &PathBuf) -> Self {
        Database::Sqlite(path.clone())
    }
}

impl fmt::Display for Database {
    /// The location with any password masked, fit for logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Database::Sqlite(path) => write!(f, "sqlite:{}", path.display()),
            Database::Postgres(url) => f.write_str(&mask_password(url)),
        }
    }
}

impl fmt::Debug for Database {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// `scheme://user:secret@host/…` → `scheme://user:***@host/…`.
fn mask_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_owned() };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// What a commit guarantees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// Survives a killed process; may lose the last commits on power loss.
    #[default]
    Normal,
    /// Survives power loss; one fsync per commit.
    Full,
}

impl FromStr for Durability {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "normal" => Ok(Durability::Normal),
            "full" => Ok(Durability::Full),
            _ => Err(format!("unknown durability {s:?}: expected \"normal\" or \"full\"")),
        }
    }
}

/// Open the store `db` names, creating and migrating its schema.
pub async fn open(db: &Database, durability: Durability) -> Result<Arc<dyn JobStore>, StoreError> {
    match db {
        Database::Sqlite(path) => {
            let path = path.clone();
            let store = tokio::task::spawn_blocking(move || sqlite::SqliteStore::open(path, durability))
                .await
                .map_err(|e| StoreError::Invalid(format!("opening the store panicked: {e}")))??;
            Ok(Arc::new(store))
        }
        Database::Postgres(url) => {
            if durability == Durability::Full {
                // Every commit on PostgreSQL is as durable as the server
                // makes it (`synchronous_commit`); leash has nothing to add.
                tracing::warn!("--durability full applies to SQLite only; PostgreSQL's own settings decide");
            }
            Ok(Arc::new(postgres::PostgresStore::open(url).await?))
        }
    }
}

/// Message recorded when a job's lease expired with no attempts left.
pub const LEASE_LOST_MESSAGE: &str = "LeaseLost: Heartbeat timeout — job stuck (its worker stopped renewing the lease)";

/// Parameters of [`JobStore::plugin_name_set`].
#[derive(Debug, Clone)]
pub struct PluginNameParams {
    /// The name and version; an existing pair is pointed at the new digest
    /// and keeps its grants.
    pub name: PluginName,
    /// A digest already stored with [`JobStore::plugin_put`].
    pub digest: Digest,
    /// Which targets wait for approval, set with the name in one step (no
    /// job can slip in between ungated); `None` keeps what a replaced pair
    /// had (nothing, for a new pair).
    pub policy: Option<ApprovalPolicy>,
    /// Now.
    pub now: Timestamp,
}

/// Parameters of [`JobStore::plugin_grants_set`].
#[derive(Debug, Clone)]
pub struct PluginGrantsParams {
    /// A registered name and version.
    pub name: PluginName,
    /// What jobs submitted under it from now on may use (replacing what
    /// it had; jobs already submitted keep theirs).
    pub grants: Grants,
}

/// Parameters of [`JobStore::plugin_policy_set`].
#[derive(Debug, Clone)]
pub struct PluginPolicyParams {
    /// A registered name and version.
    pub name: PluginName,
    /// Which targets of jobs submitted under it from now on wait for
    /// approval (replacing what it had; jobs already submitted keep their
    /// state).
    pub policy: ApprovalPolicy,
}

/// What [`JobStore::job_decide`] is asked to do.
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

/// Parameters of [`JobStore::job_decide`].
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

/// Why [`JobStore::job_decide`] changed nothing.
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

/// Parameters of [`JobStore::plan_insert`].
#[derive(Debug, Clone)]
pub struct PlanInsertParams {
    /// The new plan's id (a ULID).
    pub plan_id: String,
    /// How its apply phase starts.
    pub apply_mode: ApplyMode,
    /// The plan's input (its execute job's input too).
    pub input: Vec<u8>,
    /// The execute job: target `execute`, with the plan's id as its
    /// `plan_id` and concurrency key. Its queue and approval TTLs are the
    /// apply job's too.
    pub execute: NewJob,
    /// Now.
    pub now: Timestamp,
}

/// Parameters of [`JobStore::plan_list`]: newest first, keyset-paged.
#[derive(Debug, Clone, Default)]
pub struct PlanListParams {
    /// Only plans older than this one (the previous page's last id).
    pub before: Option<String>,
    /// Most plans to return (at least 1).
    pub limit: u32,
}

/// Parameters of [`JobStore::plans_advance`].
#[derive(Debug, Clone)]
pub struct PlansAdvanceParams {
    /// Only this plan (`None`: every plan whose execute job succeeded and
    /// whose apply job does not exist yet).
    pub plan_id: Option<String>,
    /// Now.
    pub now: Timestamp,
}

/// Parameters of [`JobStore::effect_begin`].
#[derive(Debug, Clone)]
pub struct EffectBeginParams {
    /// The job.
    pub id: JobId,
    /// The lease token of the attempt making the effect.
    pub token: String,
    /// The request method.
    pub method: String,
    /// `scheme://host[:port]/path`, without query or credentials.
    pub url: String,
    /// Now.
    pub now: Timestamp,
}

/// Parameters of [`JobStore::effect_end`].
#[derive(Debug, Clone)]
pub struct EffectEndParams {
    /// The job.
    pub id: JobId,
    /// The attempt, as [`JobStore::effect_begin`] returned it.
    pub attempt: u32,
    /// The effect's place in the attempt.
    pub seq: u32,
    /// How it ended.
    pub outcome: EffectOutcome,
    /// Now.
    pub now: Timestamp,
}

/// Parameters of [`JobStore::job_list`]: filters, newest first, keyset-paged.
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

/// Parameters of [`JobStore::job_progress_set`].
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

/// A job a worker now owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The job, as claimed (status running).
    pub job: Job,
    /// The token every later write must carry.
    pub token: String,
}

/// Parameters of [`JobStore::job_insert`].
#[derive(Debug, Clone)]
pub struct JobInsertParams {
    /// Jobs to insert, in one transaction.
    pub jobs: Vec<NewJob>,
    /// The time of submission.
    pub now: Timestamp,
}

/// Parameters of [`JobStore::job_claim`].
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

/// Parameters of [`JobStore::lease_extend`].
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

/// Parameters of [`JobStore::job_finish`].
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

/// Parameters of [`JobStore::job_retry`].
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

/// Parameters of [`JobStore::job_release`].
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

/// Parameters of [`JobStore::lease_reclaim_expired`].
#[derive(Debug, Clone)]
pub struct LeaseReclaimParams {
    /// Now: leases that ran out before it are reclaimed.
    pub now: Timestamp,
    /// How long a requeued job may wait again.
    pub queue_ttl: Duration,
}

/// Parameters of [`JobStore::worker_died`].
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
    fn count(&mut self, fate: &unfinished::Fate) {
        match fate {
            unfinished::Fate::Requeue { .. } => self.requeued += 1,
            unfinished::Fate::End { kind, .. } => {
                self.failed += 1;
                self.quarantined += u64::from(*kind == crate::job::ErrorKind::HostCrash);
            }
        }
    }
}

/// Parameters of [`JobStore::jobs_expire_queued`].
#[derive(Debug, Clone)]
pub struct JobsExpireParams {
    /// Now: queued jobs whose `expires_at` has passed fail as `expired`.
    pub now: Timestamp,
}

/// Parameters of [`JobStore::jobs_delete_expired`].
#[derive(Debug, Clone)]
pub struct JobsDeleteParams {
    /// Terminal jobs finished before this are deleted.
    pub finished_before: Timestamp,
    /// Events recorded before this are deleted (as one prefix of the feed).
    pub events_before: Timestamp,
}

/// Where a registered worker pool is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum WorkerState {
    /// Claiming and running jobs.
    Running,
    /// Shutting down: claims no more, stops and releases its jobs.
    Draining,
    /// Stopped cleanly.
    Stopped,
}

impl WorkerState {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerState::Running => "running",
            WorkerState::Draining => "draining",
            WorkerState::Stopped => "stopped",
        }
    }
}

impl FromStr for WorkerState {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [WorkerState::Running, WorkerState::Draining, WorkerState::Stopped]
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| format!("unknown worker state {s:?}"))
    }
}

/// A worker pool (a `leash worker`, a `leash serve`, an embedder's runtime)
/// as it registers itself in the store, refreshed every poll interval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WorkerRecord {
    /// `worker-<8 hex>`.
    pub worker_id: String,
    /// The machine's host name.
    pub host: String,
    /// The process id.
    pub pid: u32,
    /// The leash version it runs.
    pub version: String,
    /// Job slots (`max_workers`).
    pub slots: u32,
    /// Jobs running in it now.
    pub running: u32,
    /// Its state as it last reported it.
    pub state: WorkerState,
    /// Its fallback poll interval, milliseconds.
    pub poll_interval_ms: u64,
    /// Jobs that succeeded in it.
    pub processed: u64,
    /// Jobs that failed in it.
    pub failed: u64,
    /// Jobs cancelled in it.
    pub cancelled: u64,
    /// When it started.
    pub started_at: Timestamp,
    /// Its last report.
    pub last_heartbeat: Timestamp,
}

/// Every registered worker, the running jobs and the queue depth, read in
/// one transaction.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkersSnapshot {
    /// Every worker row, oldest first.
    pub workers: Vec<WorkerRecord>,
    /// Each running job and the worker that holds it.
    pub running_jobs: Vec<(JobId, String)>,
    /// Job counts by state.
    pub counts: Counts,
}

/// Parameters of [`JobStore::plugin_put`].
#[derive(Debug, Clone)]
pub struct PluginPutParams {
    /// The component bytes.
    pub bytes: Vec<u8>,
    /// Now.
    pub now: Timestamp,
}

/// Why a store call failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database refused or failed an operation.
    #[error("database error during {operation}: {source}")]
    Database {
        /// What was being done.
        operation: &'static str,
        /// The driver's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
        /// Worth retrying (busy, locked).
        transient: bool,
    },
    /// A stored row could not be read back.
    #[error("corrupt job row {id}: {detail}")]
    Corrupt {
        /// The row's id.
        id: String,
        /// What was wrong.
        detail: String,
    },
    /// The input was refused before touching the database.
    #[error("invalid job: {0}")]
    Invalid(String),
    /// The database's location or one of its settings is invalid.
    #[error("{0}")]
    Config(String),
    /// The store's writer has stopped.
    #[error("the job store is closed")]
    Closed,
    /// An insert carried an idempotency key a stored job already has.
    /// Nothing was inserted.
    #[error("idempotency key {key:?} already belongs to job {job}")]
    IdempotencyKeyTaken {
        /// The key.
        key: String,
        /// The job that has it.
        job: JobId,
        /// Whether that job was created by the same request (same digest).
        same_request: bool,
    },
}

impl StoreError {
    /// True when retrying the same call may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Database { transient: true, .. })
    }
}

/// The durable job store. See the module docs for the rules every
/// implementation keeps.
#[async_trait::async_trait]
pub trait JobStore: Send + Sync + fmt::Debug {
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

    /// Claim up to `limit` queued, unexpired jobs whose `run_after` has
    /// come, earliest due first (then oldest), skipping
    /// any whose concurrency key already has a running job (and all but the
    /// oldest queued job of each key). Each gets a fresh lease token.
    async fn job_claim(&self, params: JobClaimParams) -> Result<Vec<Lease>, StoreError>;

    /// Renew a lease and read `cancel_requested` in the same statement.
    async fn lease_extend(&self, params: LeaseExtendParams) -> Result<LeaseState, StoreError>;

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
    /// caller records the failure with [`JobStore::job_finish`]).
    async fn job_retry(&self, params: JobRetryParams) -> Result<bool, StoreError>;

    /// Give a running job back to the queue (shutdown, or a transient
    /// fault before its guest started): no attempt spent if the attempt
    /// recorded no effect; after an effect an attempt is spent, and with
    /// none left the job fails as `interrupted`. `false` if the token no
    /// longer owns it.
    async fn job_release(&self, params: JobReleaseParams) -> Result<bool, StoreError>;

    /// Decide on a gated job, atomically: of two decisions racing, one
    /// wins and the other is refused. Returns the job as changed.
    async fn job_decide(&self, params: JobDecideParams) -> Result<Result<Job, DecideRefusal>, StoreError>;

    /// Cancel: queued and gated (`pending_approval`, `approved`) jobs at
    /// once, running jobs by request.
    async fn job_cancel(&self, id: JobId, now: Timestamp) -> Result<CancelResult, StoreError>;

    /// Reclaim running jobs whose lease ran out. An attempt that recorded
    /// no effect is requeued without spending an attempt (`free_reruns +
    /// 1`) while the job's free re-runs last; otherwise `lost_leases + 1`,
    /// requeued after the job's backoff while attempts remain, else failed
    /// with `lease_lost`, the error naming the effect. A job whose cancel
    /// was requested is cancelled. When the lease's worker had stopped
    /// reporting too (its process is gone), the reclaim counts a process
    /// death, as [`JobStore::worker_died`] does.
    async fn lease_reclaim_expired(&self, params: LeaseReclaimParams) -> Result<ReclaimReport, StoreError>;

    /// The process of `params.worker_id` died (its supervisor saw it end):
    /// reclaim every job it held at once, by the rules of
    /// [`JobStore::lease_reclaim_expired`], each counting a process death;
    /// a job's [`QUARANTINE_AFTER_DEATHS`]th ends it `host_crash` with how
    /// the process died and its stderr's last lines. The worker's row is
    /// marked stopped.
    async fn worker_died(&self, params: WorkerDiedParams) -> Result<ReclaimReport, StoreError>;

    /// Fail queued and gated jobs past their `expires_at` (a gated job's
    /// is its approval TTL) with kind `expired`.
    async fn jobs_expire_queued(&self, params: JobsExpireParams) -> Result<u64, StoreError>;

    /// Delete terminal jobs finished before the cutoff, in one pass.
    async fn jobs_delete_expired(&self, params: JobsDeleteParams) -> Result<u64, StoreError>;

    /// Counts by state from one consistent read.
    async fn counts_snapshot(&self) -> Result<Counts, StoreError>;

    /// Events after `params.after`, in order, up to `params.limit`; and
    /// whether retention deleted some of them (see [`EventPage::missed`]).
    async fn events_after(&self, params: EventsAfterParams) -> Result<EventPage, StoreError>;

    /// The newest event a reader can see now (`None`: none kept yet): a
    /// reader that starts here sees what happens from now on.
    async fn events_head(&self) -> Result<Option<EventId>, StoreError>;

    /// Queued jobs, for admission control. Called often: it must cost in
    /// proportion to the queue, not to the jobs kept for retention.
    async fn queued_count(&self) -> Result<u64, StoreError> {
        Ok(self.counts_snapshot().await?.queued)
    }

    /// Store plugin bytes under their digest (idempotent); returns the digest.
    async fn plugin_put(&self, params: PluginPutParams) -> Result<Digest, StoreError>;

    /// The bytes of the plugin with `digest`.
    async fn plugin_get(&self, digest: Digest) -> Result<Option<Vec<u8>>, StoreError>;

    /// Point `name@version` at a stored digest (a new pair, or a
    /// replacement: jobs already queued keep the digest they were given).
    async fn plugin_name_set(&self, params: PluginNameParams) -> Result<PluginInfo, StoreError>;

    /// Record the intent of an effect, fenced by the lease: only while the
    /// job is running under `token`, in the attempt that token belongs to,
    /// numbered after that attempt's earlier effects. Committed before it
    /// returns. `None`: the lease is not held; nothing was recorded, and the
    /// effect must not be made.
    async fn effect_begin(&self, params: EffectBeginParams) -> Result<Option<Effect>, StoreError>;

    /// Record how an effect ended (not fenced: it happened either way).
    async fn effect_end(&self, params: EffectEndParams) -> Result<(), StoreError>;

    /// A job's effects, by attempt then place. Retention deletes them with
    /// the job.
    async fn effects(&self, id: JobId) -> Result<Vec<Effect>, StoreError>;

    /// Replace the grants of a registered `name@version`; `None` if that
    /// pair is not registered.
    async fn plugin_grants_set(&self, params: PluginGrantsParams) -> Result<Option<PluginInfo>, StoreError>;

    /// Create a plan and its execute job, in one transaction.
    async fn plan_insert(&self, params: PlanInsertParams) -> Result<(PlanRecord, Job), StoreError>;

    /// One plan by id.
    async fn plan_get(&self, plan_id: String) -> Result<Option<PlanRecord>, StoreError>;

    /// Plans, newest first.
    async fn plan_list(&self, params: PlanListParams) -> Result<Vec<PlanRecord>, StoreError>;

    /// Create the apply job of each plan whose execute job succeeded and
    /// that has none yet (and was not cancelled): at most once per plan,
    /// whoever calls it, however often. Returns the apply jobs created.
    async fn plans_advance(&self, params: PlansAdvanceParams) -> Result<Vec<Job>, StoreError>;

    /// Mark a plan cancelled (no apply job is created for it from now on)
    /// and return it; `None` if there is no such plan. Cancelling the
    /// phase that waits or runs is the caller's next step.
    async fn plan_cancel(&self, plan_id: String, now: Timestamp) -> Result<Option<PlanRecord>, StoreError>;

    /// Replace the approval policy of a registered `name@version`; `None`
    /// if that pair is not registered.
    async fn plugin_policy_set(&self, params: PluginPolicyParams) -> Result<Option<PluginInfo>, StoreError>;

    /// Every registered name in name order (each name's newest version
    /// first), then every stored digest that has no name.
    async fn plugin_list(&self) -> Result<Vec<PluginInfo>, StoreError>;

    /// Resolve a reference: a name to its most recently registered version,
    /// `name@version` exactly, a digest to itself (with its newest name).
    async fn plugin_resolve(&self, plugin: PluginRef) -> Result<Option<PluginInfo>, StoreError>;

    /// Jobs matching the filters, newest first. List rows carry no input or
    /// output bytes (`input` is empty, `output` is `None`): fetch a job by
    /// id for those.
    async fn job_list(&self, params: JobListParams) -> Result<Vec<Job>, StoreError>;

    /// Record a running job's progress. `false` if the token no longer owns it.
    async fn job_progress_set(&self, params: JobProgressParams) -> Result<bool, StoreError>;

    /// What a finished job's last attempt logged. `None` when the job does
    /// not exist or kept no logs.
    async fn job_logs(&self, id: JobId) -> Result<Option<JobLogs>, StoreError>;

    /// Register a worker or refresh its row (everything but `started_at`,
    /// which the first report sets).
    async fn worker_beat(&self, worker: WorkerRecord) -> Result<(), StoreError>;

    /// Every worker, the running jobs with their workers, and the job
    /// counts, from one consistent read.
    async fn workers_snapshot(&self) -> Result<WorkersSnapshot, StoreError>;

    /// Delete workers whose last report is older than the cutoff (stopped
    /// or silent ones, at retention).
    async fn workers_delete_stale(&self, last_heartbeat_before: Timestamp) -> Result<u64, StoreError>;

    /// A signal that changes when jobs may have become claimable through
    /// another process sharing the store (PostgreSQL's `NOTIFY`), so a
    /// pool wakes before its poll interval. `None`: the store cannot tell,
    /// and pools poll.
    fn enqueued(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_database_is_named_by_a_path_or_a_url() {
        assert_eq!(Database::parse("leash.db"), Database::Sqlite("leash.db".into()));
        assert_eq!(Database::parse("sqlite:/var/lib/leash.db"), Database::Sqlite("/var/lib/leash.db".into()));
        assert_eq!(Database::parse("sqlite://jobs.db"), Database::Sqlite("jobs.db".into()));
        let url = "postgresql://leash@db.internal:5432/jobs";
        assert_eq!(Database::parse(url), Database::Postgres(url.into()));
        assert_eq!(Database::from(PathBuf::from("postgres://x")), Database::Sqlite("postgres://x".into()));
        assert_eq!(Database::parse("jobs.db").default_token_file(), PathBuf::from("jobs.db.token"));
        assert_eq!(Database::parse(url).default_token_file(), PathBuf::from("leash.token"));
    }

    #[test]
    fn a_password_in_a_url_is_never_shown() {
        let db = Database::parse("postgres://leash:s3cret@db:5432/jobs?sslmode=require");
        assert_eq!(db.to_string(), "postgres://leash:***@db:5432/jobs?sslmode=require");
        assert_eq!(format!("{db:?}"), db.to_string());
        assert_eq!(Database::parse("postgres://leash@db/jobs").to_string(), "postgres://leash@db/jobs");
        assert_eq!(Database::parse("a.db").to_string(), "sqlite:a.db");
    }
}
