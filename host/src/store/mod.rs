//! The store seam: where jobs live between submission and retention.
//!
//! [`JobStore`] is the one interface the rest of leash uses; each backend
//! owns its SQL and migrations ([`sqlite`] now, PostgreSQL next). Methods
//! are noun-first and take params structs with `now` injected. Every write
//! that only a lease holder may make takes the lease token and reports
//! whether it took effect: `false` means the lease was lost (the job was
//! reclaimed, released or finished elsewhere) and the caller must drop its
//! result. [`conformance`] holds the cases every backend must pass.
//!
//! This module knows nothing of wasm: it stores plugin digests and bytes.

pub mod conformance;
pub mod faults;
pub mod sqlite;

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::job::{Digest, ErrorKind, Target};

/// Version of the stored job payload format.
pub const SCHEMA_VERSION: u32 = 1;
/// Message recorded when a job's lease expired with no attempts left.
pub const LEASE_LOST_MESSAGE: &str = "LeaseLost: Heartbeat timeout — job stuck (its worker stopped renewing the lease)";

/// A job's id: a ULID, so ids sort by creation time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JobId(ulid::Ulid);

impl JobId {
    /// A fresh id for a job created at `now`.
    pub fn new(now: Timestamp) -> Self {
        JobId(ulid::Ulid::from_parts(now.unix_ms().max(0) as u64, rand_u128()))
    }
}

fn rand_u128() -> u128 {
    ulid::Ulid::generate().random()
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl FromStr for JobId {
    type Err = String;

    /// Only the canonical form: 26 upper-case Crockford base32 characters
    /// whose value fits 128 bits. Anything else (a first character above
    /// `7`, lower case, the look-alike letters decoders map to digits)
    /// would alias another id.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let refused = || format!("invalid job id {s:?}: expected a 26-character ULID (0-9, A-Z, first character 0-7)");
        let id = ulid::Ulid::from_string(s).map_err(|_| refused())?;
        if s.len() != ulid::ULID_LEN || !s.starts_with(|c: char| ('0'..='7').contains(&c)) || id.to_string() != s {
            return Err(refused());
        }
        Ok(JobId(id))
    }
}

crate::job::serde_as_text!(JobId);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_with_jitter_up_to_its_cap() {
        let backoff = Backoff { base_ms: 1000, cap_ms: 10_000 };
        for (failures, step) in [(1, 1000), (2, 2000), (3, 4000), (4, 8000), (5, 10_000), (60, 10_000)] {
            let seen: Vec<u64> = (0..200).map(|_| backoff.delay(failures).as_millis() as u64).collect();
            assert!(seen.iter().all(|&d| (step / 2..=step).contains(&d)), "failure {failures}: {seen:?}");
            let distinct: std::collections::HashSet<_> = seen.iter().collect();
            assert!(distinct.len() > 10, "failure {failures}: jittered, not one value: {distinct:?}");
        }
        assert!(Backoff { base_ms: 1, cap_ms: 1 }.delay(3) <= Duration::from_millis(1));
    }

    #[test]
    fn only_canonical_job_ids_parse() {
        let id = JobId::new(Timestamp::from_unix_ms(1_764_484_424_123));
        let text = id.to_string();
        assert_eq!(text.parse::<JobId>().unwrap(), id);
        let aliases = [
            format!("8{}", &text[1..]),
            "ZZZZZZZZZZZZZZZZZZZZZZZZZZ".to_owned(),
            text.to_lowercase(),
            text.replace('1', "I"),
            format!("{text}0"),
            text[1..].to_owned(),
        ];
        for alias in aliases {
            assert!(alias.parse::<JobId>().is_err(), "{alias} must be refused");
        }
        assert!("7ZZZZZZZZZZZZZZZZZZZZZZZZZ".parse::<JobId>().is_ok(), "the largest ULID");
    }
}

/// Where a job is in its life. Terminal states have no way out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    /// Waiting for a worker.
    Queued,
    /// Owned by a worker under a lease.
    Running,
    /// Finished with output.
    Succeeded,
    /// Finished with an error kind and message.
    Failed,
    /// Cancelled before or while running.
    Cancelled,
}

impl JobStatus {
    /// Every status, in lifecycle order.
    pub const ALL: [JobStatus; 5] =
        [JobStatus::Queued, JobStatus::Running, JobStatus::Succeeded, JobStatus::Failed, JobStatus::Cancelled];

    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Queued => "queued",
            JobStatus::Running => "running",
            JobStatus::Succeeded => "succeeded",
            JobStatus::Failed => "failed",
            JobStatus::Cancelled => "cancelled",
        }
    }

    /// True for succeeded, failed and cancelled.
    pub fn is_terminal(self) -> bool {
        matches!(self, JobStatus::Succeeded | JobStatus::Failed | JobStatus::Cancelled)
    }
}

impl fmt::Display for JobStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for JobStatus {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        JobStatus::ALL.into_iter().find(|k| k.as_str() == s).ok_or_else(|| format!("unknown job status {s:?}"))
    }
}

/// Resource limits stored with a job (the sandbox's run limits, by value).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JobLimits {
    /// Wall-clock limit, milliseconds.
    pub timeout_ms: u64,
    /// Fuel budget; `None` for unlimited.
    pub fuel: Option<u64>,
    /// Memory limit, bytes.
    pub memory_bytes: u64,
    /// Output limit, bytes.
    pub output_bytes: u64,
}

/// What a submitter provides.
#[derive(Debug, Clone)]
pub struct NewJob {
    /// The plugin, by content digest.
    pub plugin: Digest,
    /// The registry name (and version) the plugin was submitted under, if
    /// any: kept for listing; the digest alone decides what runs.
    pub plugin_name: Option<PluginName>,
    /// Phase or action.
    pub target: Target,
    /// Input bytes.
    pub input: Vec<u8>,
    /// Limits for each attempt.
    pub limits: JobLimits,
    /// Attempts the job may use: a lost lease or a retryable failure with
    /// attempts left queues it again. At least 1.
    pub max_attempts: u32,
    /// At most one running job per key, across every process on the store.
    pub concurrency_key: Option<String>,
    /// A logical plan this job belongs to (no foreign key).
    pub plan_id: Option<String>,
    /// How long the job may wait in the queue before it expires.
    pub queue_ttl: Duration,
    /// The client's idempotency key for the request that created it, if any.
    pub idempotency: Option<IdempotencyKey>,
    /// Not claimed before this instant (none, or one already past: at
    /// once). Its queue TTL counts from then.
    pub run_at: Option<Timestamp>,
    /// A sync job's deadline, from submission: its queue wait and its run
    /// must both fit (it expires if still queued then, and a worker cuts
    /// its timeout to what is left).
    pub deadline: Option<Duration>,
    /// The pause before each retry.
    pub backoff: Backoff,
}

/// The pause before a failed attempt runs again: exponential from `base_ms`
/// (doubling with each failure so far), capped at `cap_ms`, with jitter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Backoff {
    /// The first retry's pause, milliseconds.
    pub base_ms: u64,
    /// The longest pause, milliseconds.
    pub cap_ms: u64,
}

/// Default first pause before a retry.
pub const DEFAULT_BACKOFF_BASE: Duration = Duration::from_secs(1);
/// Default longest pause before a retry.
pub const DEFAULT_BACKOFF_CAP: Duration = Duration::from_secs(300);

impl Default for Backoff {
    fn default() -> Self {
        Backoff { base_ms: DEFAULT_BACKOFF_BASE.as_millis() as u64, cap_ms: DEFAULT_BACKOFF_CAP.as_millis() as u64 }
    }
}

impl Backoff {
    /// The pause before the retry that follows the `failures`-th failed
    /// attempt (1 for the first): `min(cap, base × 2^(failures-1))`, of
    /// which the second half is random ("equal jitter": never less than
    /// half the exponential step, so retries of many jobs that failed
    /// together spread out without ever firing at once).
    pub fn delay(&self, failures: u32) -> Duration {
        let step = self.base_ms.saturating_mul(1u64 << failures.saturating_sub(1).min(40)).min(self.cap_ms);
        let half = step / 2;
        let mut bytes = [0u8; 8];
        getrandom::fill(&mut bytes).expect("the OS random source is available");
        let jitter = u64::from_le_bytes(bytes) % (step - half + 1);
        Duration::from_millis(half + jitter)
    }
}

/// A client's key for one create request, and a digest of the request: the
/// same key may only ever stand for the same request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey {
    /// The key (1–255 printable ASCII characters).
    pub key: String,
    /// A digest of the request it came with.
    pub request_digest: String,
}

/// Longest idempotency key, in bytes.
pub const MAX_IDEMPOTENCY_KEY_BYTES: usize = 255;

impl IdempotencyKey {
    /// A checked key for a request with `request_digest`.
    pub fn new(key: &str, request_digest: String) -> Result<Self, String> {
        let printable = key.bytes().all(|b| b.is_ascii_graphic() || b == b' ');
        if key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY_BYTES || !printable {
            return Err(format!(
                "invalid idempotency key: use 1 to {MAX_IDEMPOTENCY_KEY_BYTES} printable ASCII characters"
            ));
        }
        Ok(IdempotencyKey { key: key.to_owned(), request_digest })
    }
}

/// A stored job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Job {
    /// Id.
    pub id: JobId,
    /// Status.
    pub status: JobStatus,
    /// The plugin's digest.
    pub plugin: Digest,
    /// The registry name it was submitted under.
    pub plugin_name: Option<PluginName>,
    /// Phase or action.
    pub target: Target,
    /// Logical plan.
    pub plan_id: Option<String>,
    /// Concurrency key.
    pub concurrency_key: Option<String>,
    /// Input bytes.
    #[serde(skip)]
    pub input: Vec<u8>,
    /// Limits.
    pub limits: JobLimits,
    /// Payload format version.
    pub schema_version: u32,
    /// When it was submitted.
    pub created_at: Timestamp,
    /// When the current or last attempt started.
    pub started_at: Option<Timestamp>,
    /// When it reached a terminal state.
    pub finished_at: Option<Timestamp>,
    /// The last lease renewal.
    pub last_heartbeat: Option<Timestamp>,
    /// When it expires if still queued.
    pub expires_at: Timestamp,
    /// The owning (or last owning) worker.
    pub worker_id: Option<String>,
    /// The current lease's token (running jobs only).
    #[serde(skip)]
    pub lease_token: Option<String>,
    /// When the current lease runs out (running jobs only).
    pub lease_expires_at: Option<Timestamp>,
    /// Not claimed before this: its submit's `run_at`, or a retry's backoff.
    pub run_after: Timestamp,
    /// A sync job's deadline: it expires if still queued then, and its run
    /// is cut to end by then.
    pub deadline_at: Option<Timestamp>,
    /// Claims so far: 1 during the first attempt.
    pub attempt: u32,
    /// Attempts that lost their lease.
    pub lost_leases: u32,
    /// Attempts that failed retryably and were queued again.
    pub retries: u32,
    /// The pause before each retry.
    pub backoff: Backoff,
    /// The last retried attempt's error, `kind: message`.
    pub last_error: Option<String>,
    /// Times it was released to the queue at a worker's shutdown (its
    /// guest was stopped before it returned, so it runs again; no attempt
    /// is spent).
    pub releases: u32,
    /// The attempt limit.
    pub max_attempts: u32,
    /// A cancel was asked for while it ran.
    pub cancel_requested: bool,
    /// Why it failed or was cancelled.
    pub error_kind: Option<ErrorKind>,
    /// `"Type: message"`.
    pub error_message: Option<String>,
    /// The guest backtrace of a trap.
    pub backtrace: Option<String>,
    /// Output bytes of a succeeded job.
    #[serde(skip)]
    pub output: Option<Vec<u8>>,
    /// Fuel the last attempt used.
    pub fuel_used: Option<u64>,
    /// Peak memory of the last attempt.
    pub peak_memory_bytes: Option<u64>,
    /// The guest's latest progress report.
    pub progress: Option<JobProgress>,
}

/// A guest's latest progress report, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JobProgress {
    /// Units done.
    pub done: u64,
    /// Units in all (0 when unknown).
    pub total: u64,
    /// A short note from the guest.
    pub note: String,
}

/// What a job's last attempt logged, kept when it ends.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JobLogs {
    /// Structured records, in order.
    pub records: Vec<LogLine>,
    /// Records dropped past the caps.
    pub records_dropped: u64,
    /// Guest stdout, lossily decoded.
    pub stdout: String,
    /// Stdout bytes dropped past the cap.
    pub stdout_dropped: u64,
    /// Guest stderr, lossily decoded.
    pub stderr: String,
    /// Stderr bytes dropped past the cap.
    pub stderr_dropped: u64,
}

/// One structured log record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LogLine {
    /// `trace`, `debug`, `info`, `warn` or `error`.
    pub level: String,
    /// The message.
    pub message: String,
    /// Key/value fields.
    pub fields: Vec<(String, String)>,
    /// Milliseconds since the attempt started.
    pub elapsed_ms: u64,
}

/// A plugin's registry name and version.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PluginName {
    /// Name: lowercase letters, digits, `-` and `_`, 1–64 characters.
    pub name: String,
    /// Version: letters, digits, `.`, `-`, `_` and `+`, 1–64 characters.
    pub version: String,
}

impl PluginName {
    /// A checked name and version.
    pub fn new(name: &str, version: &str) -> Result<Self, String> {
        check_plugin_name(name)?;
        check_plugin_version(version)?;
        Ok(PluginName { name: name.to_owned(), version: version.to_owned() })
    }
}

impl fmt::Display for PluginName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.name, self.version)
    }
}

/// Default version of a plugin added without one.
pub const DEFAULT_PLUGIN_VERSION: &str = "0.0.0";

fn check_plugin_name(name: &str) -> Result<(), String> {
    let ok = (1..=64).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid plugin name {name:?}: use 1-64 lowercase letters, digits, '-' or '_', starting with a letter or digit"
        ))
    }
}

fn check_plugin_version(version: &str) -> Result<(), String> {
    let ok = (1..=64).contains(&version.len())
        && version.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '+'));
    if ok {
        Ok(())
    } else {
        Err(format!("invalid plugin version {version:?}: use 1-64 letters, digits, '.', '-', '_' or '+'"))
    }
}

/// How a job or a request names a plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PluginRef {
    /// By content digest (64 hex digits, optionally `sha256:`-prefixed).
    Digest(Digest),
    /// By name: the most recently registered version.
    Name(String),
    /// By `name@version`.
    Version(PluginName),
}

impl FromStr for PluginRef {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let hex = s.strip_prefix("sha256:").unwrap_or(s);
        if hex.len() == 64 && hex.chars().all(|c| c.is_ascii_hexdigit()) {
            return hex.parse().map(PluginRef::Digest);
        }
        match s.split_once('@') {
            Some((name, version)) => PluginName::new(name, version).map(PluginRef::Version),
            None => check_plugin_name(s).map(|()| PluginRef::Name(s.to_owned())),
        }
    }
}

impl fmt::Display for PluginRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PluginRef::Digest(d) => write!(f, "{d}"),
            PluginRef::Name(n) => f.write_str(n),
            PluginRef::Version(v) => write!(f, "{v}"),
        }
    }
}

/// A registered plugin: its digest and, if it has one, its name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PluginInfo {
    /// Name and version; `None` for bytes submitted without a name.
    #[serde(flatten)]
    pub name: Option<PluginName>,
    /// Content digest (sha256).
    pub digest: Digest,
    /// Size of the component, bytes.
    pub size_bytes: u64,
    /// When the name (or, unnamed, the bytes) was registered.
    pub created_at: Timestamp,
}

/// Parameters of [`JobStore::plugin_name_set`].
#[derive(Debug, Clone)]
pub struct PluginNameParams {
    /// The name and version; an existing pair is pointed at the new digest.
    pub name: PluginName,
    /// A digest already stored with [`JobStore::plugin_put`].
    pub digest: Digest,
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
    /// How long the requeued job may wait again.
    pub queue_ttl: Duration,
    /// Now.
    pub now: Timestamp,
}

/// What a cancel did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelResult {
    /// It was queued and is now cancelled.
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

/// What a reclaim sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReclaimReport {
    /// Jobs put back in the queue (attempts left).
    pub requeued: u64,
    /// Jobs failed with `lease_lost` (no attempts left).
    pub failed: u64,
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
}

/// Job counts by state, from one consistent snapshot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Counts {
    /// Queued.
    pub queued: u64,
    /// Running.
    pub running: u64,
    /// Succeeded.
    pub succeeded: u64,
    /// Failed.
    pub failed: u64,
    /// Cancelled.
    pub cancelled: u64,
}

impl Counts {
    /// All jobs in the store.
    pub fn total(&self) -> u64 {
        self.queued + self.running + self.succeeded + self.failed + self.cancelled
    }
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
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

    /// Give a running job back to the queue (shutdown): no attempt spent.
    /// `false` if the token no longer owns it.
    async fn job_release(&self, params: JobReleaseParams) -> Result<bool, StoreError>;

    /// Cancel: queued jobs at once, running jobs by request.
    async fn job_cancel(&self, id: JobId, now: Timestamp) -> Result<CancelResult, StoreError>;

    /// Reclaim running jobs whose lease ran out: `lost_leases + 1`, then
    /// requeue after the job's backoff while attempts remain, else fail
    /// with `lease_lost`.
    async fn lease_reclaim_expired(&self, params: LeaseReclaimParams) -> Result<ReclaimReport, StoreError>;

    /// Fail queued jobs past their `expires_at` with kind `expired`.
    async fn jobs_expire_queued(&self, params: JobsExpireParams) -> Result<u64, StoreError>;

    /// Delete terminal jobs finished before the cutoff, in one pass.
    async fn jobs_delete_expired(&self, params: JobsDeleteParams) -> Result<u64, StoreError>;

    /// Counts by state from one consistent read.
    async fn counts_snapshot(&self) -> Result<Counts, StoreError>;

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
}
