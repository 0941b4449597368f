//! What a submitter provides: a job before the store has queued it.

use std::time::Duration;

use super::approval::Gate;
use super::{Backoff, Digest, Grants, IdempotencyKey, JobId, JobLimits, PluginName, Target};
use crate::clock::Timestamp;

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
    /// What the job may use outside its sandbox (from its plugin's
    /// registration; nothing for a plugin given by bytes or digest).
    pub grants: Grants,
    /// Attempts the job may use: a lost lease or a retryable failure with
    /// attempts left queues it again. At least 1.
    pub max_attempts: u32,
    /// Times a lost lease whose attempt recorded no effect runs the job
    /// again without spending an attempt (0: a lost lease always spends
    /// one).
    pub free_rerun_limit: u32,
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
    /// A gate: the job waits in `pending_approval` for a decision (`None`:
    /// it is queued at once).
    pub approval: Option<Gate>,
    /// How long a gated job waits for its decision (and, approved with
    /// `run_on_approve = false`, for its run) before it expires.
    pub approval_ttl: Duration,
    /// The principal that submitted it (`None`: an embedder's own submit,
    /// with no principal behind it).
    pub submitted_by: Option<String>,
    /// Claim order: 0 (first, the default) to [`LOWEST_PRIORITY`].
    pub priority: u8,
    /// The schedule that submitted it, if one did.
    pub schedule_id: Option<JobId>,
    /// Tags to find it by (see [`check_labels`](super::labels::check_labels)).
    pub tags: Vec<String>,
    /// Metadata to find it by: strings, numbers and booleans by key.
    pub metadata: serde_json::Map<String, serde_json::Value>,
    /// The rate limit its starts count against (see [`crate::job::rate`]).
    pub rate_limit: Option<String>,
    /// Its bucket within that limit (rendered at submit; empty: the
    /// limit's one bucket).
    pub rate_key: String,
}

/// The lowest priority: a job's priority is 0 (claimed first, the
/// default) to this (claimed last), as in Oban.
pub const LOWEST_PRIORITY: u8 = 9;

/// Default time a job may wait in the queue: a day.
pub const DEFAULT_QUEUE_TTL: Duration = Duration::from_secs(86_400);

/// Default time a gated job waits for a decision: 7 days.
pub const DEFAULT_APPROVAL_TTL: Duration = Duration::from_secs(7 * 86_400);

/// Most attempts a job may ask for.
pub const MAX_ATTEMPTS_CEILING: u32 = 100;
/// Longest concurrency key or plan id, in bytes.
pub const MAX_KEY_BYTES: usize = 256;

impl NewJob {
    /// A job of `plugin` with `input`, run as `target` under `limits`;
    /// the rest: one attempt and no free re-run, a day in the queue
    /// ([`DEFAULT_QUEUE_TTL`]), due at once, priority 0, the default
    /// backoff, no gate, no grants, no key, label or rate limit. For
    /// filling a store directly (tests, benches, tools); a runtime's submit
    /// fills every field from its request and settings instead (its
    /// defaults differ: free re-runs among them).
    pub fn new(plugin: Digest, target: Target, input: Vec<u8>, limits: JobLimits) -> NewJob {
        NewJob {
            plugin,
            plugin_name: None,
            target,
            input,
            limits,
            grants: Grants::default(),
            max_attempts: 1,
            free_rerun_limit: 0,
            concurrency_key: None,
            plan_id: None,
            queue_ttl: DEFAULT_QUEUE_TTL,
            idempotency: None,
            run_at: None,
            deadline: None,
            backoff: Backoff::default(),
            approval: None,
            approval_ttl: DEFAULT_APPROVAL_TTL,
            submitted_by: None,
            priority: 0,
            schedule_id: None,
            tags: Vec::new(),
            metadata: serde_json::Map::new(),
            rate_limit: None,
            rate_key: String::new(),
        }
    }

    /// The rules a new job keeps whatever ceilings a runtime sets: attempts
    /// from 1 to [`MAX_ATTEMPTS_CEILING`] (free re-runs up to it), a positive timeout, and a
    /// concurrency key and plan id of at most [`MAX_KEY_BYTES`] (a key not
    /// empty). The runtime checks them before it queues; every store again
    /// before it inserts.
    pub fn check(&self) -> Result<(), String> {
        if !(1..=MAX_ATTEMPTS_CEILING).contains(&self.max_attempts) {
            return Err(format!("max_attempts {} is out of range: use 1 to {MAX_ATTEMPTS_CEILING}", self.max_attempts));
        }
        if self.free_rerun_limit > MAX_ATTEMPTS_CEILING {
            return Err(format!(
                "free_rerun_limit {} is out of range: use 0 to {MAX_ATTEMPTS_CEILING}",
                self.free_rerun_limit
            ));
        }
        if self.limits.timeout.is_zero() {
            return Err("timeout must be positive".into());
        }
        if self.priority > LOWEST_PRIORITY {
            return Err(format!(
                "priority {} is out of range: use 0 (first) to {LOWEST_PRIORITY} (last)",
                self.priority
            ));
        }
        if self.concurrency_key.as_deref().is_some_and(str::is_empty) {
            return Err("concurrency_key must not be empty".into());
        }
        super::labels::check_labels(&self.tags, &self.metadata)?;
        if let Some(limit) = &self.rate_limit {
            super::rate::check_limit_name(limit)?;
        } else if !self.rate_key.is_empty() {
            return Err("rate_key needs a rate_limit to count against".into());
        }
        if self.rate_key.len() > super::rate::MAX_RATE_KEY_BYTES {
            return Err(format!("rate_key is {} bytes, over {}", self.rate_key.len(), super::rate::MAX_RATE_KEY_BYTES));
        }
        for (field, value) in [("concurrency_key", &self.concurrency_key), ("plan_id", &self.plan_id)] {
            if let Some(value) = value
                && value.len() > MAX_KEY_BYTES
            {
                return Err(format!("{field} is {} bytes, over the ceiling of {MAX_KEY_BYTES}", value.len()));
            }
        }
        Ok(())
    }
}
