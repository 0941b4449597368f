//! A job as submitted and as stored: its status, limits, retry pause,
//! idempotency key, progress and logs, and the counts by status.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::approval::Approval;
use super::{Digest, ErrorKind, Grants, JobId, PluginName, Target};
use crate::clock::Timestamp;
use crate::job::millis;

/// Version of the stored job payload format.
pub const SCHEMA_VERSION: u32 = 1;

/// Where a job is in its life. Terminal states have no way out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    /// Gated: waiting for a person to approve or reject it; never claimed.
    PendingApproval,
    /// Approved, waiting for its run to be triggered (it was submitted with
    /// `run_on_approve = false`); never claimed.
    Approved,
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
    pub const ALL: [JobStatus; 7] = [
        JobStatus::PendingApproval,
        JobStatus::Approved,
        JobStatus::Queued,
        JobStatus::Running,
        JobStatus::Succeeded,
        JobStatus::Failed,
        JobStatus::Cancelled,
    ];

    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::PendingApproval => "pending_approval",
            JobStatus::Approved => "approved",
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

    /// True for the two states of a gated job before its run is triggered.
    pub fn is_gated(self) -> bool {
        matches!(self, JobStatus::PendingApproval | JobStatus::Approved)
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
    #[serde(rename = "timeout_ms", with = "crate::job::millis")]
    #[schema(value_type = u64)]
    pub timeout: Duration,
    /// Fuel budget; `None` for unlimited.
    pub fuel: Option<u64>,
    /// Memory limit, bytes.
    pub memory_bytes: u64,
    /// Output limit, bytes.
    pub output_bytes: u64,
}

/// The pause before a failed attempt runs again: exponential from `base_ms`
/// (doubling with each failure so far), capped at `cap_ms`, with jitter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Backoff {
    /// The first retry's pause, milliseconds.
    #[serde(rename = "base_ms", with = "crate::job::millis")]
    #[schema(value_type = u64)]
    pub base: Duration,
    /// The longest pause, milliseconds.
    #[serde(rename = "cap_ms", with = "crate::job::millis")]
    #[schema(value_type = u64)]
    pub cap: Duration,
}

/// Default first pause before a retry.
pub const DEFAULT_BACKOFF_BASE: Duration = Duration::from_secs(1);
/// Default longest pause before a retry.
pub const DEFAULT_BACKOFF_CAP: Duration = Duration::from_secs(300);

impl Default for Backoff {
    fn default() -> Self {
        Backoff { base: DEFAULT_BACKOFF_BASE, cap: DEFAULT_BACKOFF_CAP }
    }
}

impl Backoff {
    /// The pause before the retry that follows the `failures`-th failed
    /// attempt (1 for the first): `min(cap, base × 2^(failures-1))`, of
    /// which the second half is random ("equal jitter": never less than
    /// half the exponential step, so retries of many jobs that failed
    /// together spread out without ever firing at once).
    pub fn delay(&self, failures: u32) -> Duration {
        let (base, cap) = (millis::of(self.base), millis::of(self.cap));
        let step = base.saturating_mul(1u64 << failures.saturating_sub(1).min(40)).min(cap);
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

    /// The key of the job at `index` of a batch sent with `batch`: the
    /// client's key, [`KEY_SEPARATOR`] and the index. The separator
    /// is a control character no client key may hold, so no key a client
    /// sends alone (`order-7#0`, say) is ever taken by a batch's job, or
    /// the other way round.
    pub fn in_batch(batch: &IdempotencyKey, index: usize) -> IdempotencyKey {
        IdempotencyKey {
            key: format!("{}{KEY_SEPARATOR}{index}", batch.key),
            request_digest: batch.request_digest.clone(),
        }
    }

    /// The key of a plan's execute job, for a plan created with `plan`:
    /// the client's key, [`KEY_SEPARATOR`] and `plan`, so a plan's
    /// key and a job's never collide.
    pub fn for_plan(plan: &IdempotencyKey) -> IdempotencyKey {
        IdempotencyKey { key: format!("{}{KEY_SEPARATOR}plan", plan.key), request_digest: plan.request_digest.clone() }
    }

    /// The key the client sent for a stored key: a batch job's or a plan's
    /// key without the separator and what follows it.
    pub fn sent(stored: &str) -> &str {
        stored.split(KEY_SEPARATOR).next().unwrap_or(stored)
    }
}

/// In a stored key, between the client's key and what makes it the key
/// of a batch's job (its index, [`IdempotencyKey::in_batch`]) or of a
/// plan (`plan`, [`IdempotencyKey::for_plan`]). Batch keys stored before
/// it was used hold `#` there instead, and keep it.
pub const KEY_SEPARATOR: char = '\u{1f}';

/// A stored job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
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
    /// What the job may use outside its sandbox, pinned at submit from its
    /// plugin's registration; absent when nothing is granted.
    #[serde(default, skip_serializing_if = "Grants::is_none")]
    pub grants: Grants,
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
    /// Attempts that lost their lease and spent an attempt (after an
    /// effect, or past the free re-runs).
    pub lost_leases: u32,
    /// Attempts that ended early and were queued again, spending an
    /// attempt: a retryable failure, or a shutdown after an effect.
    pub retries: u32,
    /// The pause before each retry.
    pub backoff: Backoff,
    /// The last retried attempt's error, `kind: message`.
    pub last_error: Option<String>,
    /// Times it was released to the queue without spending an attempt: at
    /// a worker's shutdown (its guest was stopped before it returned, so it
    /// runs again), or after a transient host error before its guest
    /// started.
    pub releases: u32,
    /// Times it lost its lease before its attempt recorded any effect and
    /// was queued again without spending an attempt.
    pub free_reruns: u32,
    /// The most such re-runs it may have.
    pub free_rerun_limit: u32,
    /// Worker processes that died while running it; at
    /// [`QUARANTINE_AFTER_DEATHS`](crate::store::QUARANTINE_AFTER_DEATHS) it
    /// ends `host_crash`.
    pub process_deaths: u32,
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
    /// A gated job's approval record: who gated it, how it was asked for,
    /// and the decision once made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<Approval>,
    /// The principal that submitted it (absent: an embedder's own submit,
    /// or a job stored before submitters were recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitted_by: Option<String>,
    /// Claim order: 0 (first) to 9 (last); due jobs are claimed by
    /// priority, then earliest due, then oldest.
    #[serde(default)]
    pub priority: u8,
    /// The schedule that submitted it, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub schedule_id: Option<JobId>,
    /// Its tags.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// Its metadata.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    #[schema(value_type = Object)]
    pub metadata: serde_json::Map<String, serde_json::Value>,
    /// The rate limit its starts count against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<String>,
    /// Its bucket within that limit.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub rate_key: String,
    /// The start its rate limit reserved for it: a queued job whose slot
    /// is later than now is waiting for its rate (`waiting_rate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_slot: Option<Timestamp>,
}

impl Job {
    /// Queued and waiting for the slot its rate limit gave it: it is not
    /// claimed before [`Job::rate_slot`].
    pub fn waiting_rate(&self, now: Timestamp) -> bool {
        self.status == JobStatus::Queued && self.rate_slot.is_some_and(|slot| slot > now)
    }

    /// A queued job as `GET /v1/jobs/{id}` gives it, its fields changed
    /// by `edit` (an object of the same keys).
    #[cfg(test)]
    pub(crate) fn for_tests(edit: serde_json::Value) -> Job {
        let mut job = serde_json::json!({
            "attempt": 1, "backoff": {"base_ms": 1000, "cap_ms": 300000}, "cancel_requested": false,
            "created_at": "2026-12-05T04:20:00.000Z", "expires_at": "2026-12-06T04:20:00.000Z",
            "free_rerun_limit": 3, "free_reruns": 0, "id": "01M926XFVQHZM05AGHKSGVVEM1", "lost_leases": 0,
            "limits": {"fuel": null, "memory_bytes": 67108864, "output_bytes": 1048576, "timeout_ms": 3600000},
            "max_attempts": 3, "plugin": format!("sha256:{}", "ab".repeat(32)), "process_deaths": 0,
            "releases": 0, "retries": 0, "run_after": "2026-12-05T04:20:00.000Z", "schema_version": 1,
            "status": "queued", "target": "execute",
        });
        for (key, value) in edit.as_object().expect("an object of the job's keys") {
            job[key] = value.clone();
        }
        serde_json::from_value(job).expect("a job")
    }
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
    /// Key/value fields, each a `[key, value]` pair.
    #[schema(value_type = Vec<Vec<String>>)]
    pub fields: Vec<(String, String)>,
    /// Milliseconds since the attempt started.
    #[serde(rename = "elapsed_ms", with = "crate::job::millis")]
    #[schema(value_type = u64)]
    pub elapsed: Duration,
}

/// Job counts by state, from one consistent snapshot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Counts {
    /// Waiting for approval.
    #[serde(default)]
    pub pending_approval: u64,
    /// Approved, waiting for a run trigger.
    #[serde(default)]
    pub approved: u64,
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
        self.pending_approval
            + self.approved
            + self.queued
            + self.running
            + self.succeeded
            + self.failed
            + self.cancelled
    }

    /// The count of one state.
    pub fn of(&self, status: JobStatus) -> u64 {
        let mut copy = *self;
        *copy.of_mut(status)
    }

    /// The count of one state, to set or add to.
    pub fn of_mut(&mut self, status: JobStatus) -> &mut u64 {
        match status {
            JobStatus::PendingApproval => &mut self.pending_approval,
            JobStatus::Approved => &mut self.approved,
            JobStatus::Queued => &mut self.queued,
            JobStatus::Running => &mut self.running,
            JobStatus::Succeeded => &mut self.succeeded,
            JobStatus::Failed => &mut self.failed,
            JobStatus::Cancelled => &mut self.cancelled,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_with_jitter_up_to_its_cap() {
        let backoff = Backoff { base: Duration::from_secs(1), cap: Duration::from_secs(10) };
        for (failures, step) in [(1, 1000), (2, 2000), (3, 4000), (4, 8000), (5, 10_000), (60, 10_000)] {
            let seen: Vec<u64> = (0..200).map(|_| backoff.delay(failures).as_millis() as u64).collect();
            assert!(seen.iter().all(|&d| (step / 2..=step).contains(&d)), "failure {failures}: {seen:?}");
            let distinct: std::collections::HashSet<_> = seen.iter().collect();
            assert!(distinct.len() > 10, "failure {failures}: jittered, not one value: {distinct:?}");
        }
        let tiny = Duration::from_millis(1);
        assert!(Backoff { base: tiny, cap: tiny }.delay(3) <= tiny);
    }
}
