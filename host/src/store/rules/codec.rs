//! Small conversions every backend's SQL needs: JSON columns, durations
//! as milliseconds, and the error for a row that cannot be read back.

use crate::clock::Timestamp;
use crate::job::grant::Requests;
use crate::job::{Approval, ApprovalPolicy, Effect, EffectOutcome, Grants, Job, JobId, NewJob, Target};
use crate::store::{EffectBeginParams, StoreError};

/// A row that could not be read back into the job model.
pub(crate) fn corrupt(id: &str, detail: impl Into<String>) -> StoreError {
    StoreError::Corrupt { id: id.to_owned(), detail: detail.into() }
}

/// A nullable JSON text column, parsed.
pub(crate) fn json_column<T: serde::de::DeserializeOwned>(
    id: &str,
    what: &str,
    text: Option<String>,
) -> Result<Option<T>, StoreError> {
    text.map(|t| serde_json::from_str(&t).map_err(|e| corrupt(id, format!("{what}: {e}")))).transpose()
}

/// An effect's outcome as its two columns: status, error.
pub(crate) fn outcome_columns(outcome: &EffectOutcome) -> (Option<i32>, Option<&str>) {
    match outcome {
        EffectOutcome::Status(code) => (Some(i32::from(*code)), None),
        EffectOutcome::Error(e) => (None, Some(e.as_str())),
    }
}

/// An effect row as both backends read it.
pub(crate) struct EffectRow {
    pub(crate) attempt: i64,
    pub(crate) seq: i64,
    pub(crate) method: String,
    pub(crate) url: String,
    pub(crate) started_at: i64,
    pub(crate) finished_at: Option<i64>,
    pub(crate) status: Option<i64>,
    pub(crate) error: Option<String>,
    pub(crate) proposal: Option<i64>,
}

impl EffectRow {
    /// The intent just recorded at `(attempt, seq)`: no outcome yet.
    pub(crate) fn intent(params: EffectBeginParams, attempt: i64, seq: i64) -> Effect {
        let row = EffectRow {
            attempt,
            seq,
            method: params.method,
            url: params.url,
            started_at: params.now.unix_ms(),
            finished_at: None,
            status: None,
            error: None,
            proposal: params.proposal.map(i64::from),
        };
        row.into_effect(params.id)
    }

    pub(crate) fn into_effect(self, job: JobId) -> Effect {
        let seq = u32::try_from(self.seq).unwrap_or(0);
        let proposal = self.proposal.and_then(|n| u32::try_from(n).ok());
        Effect {
            attempt: u32::try_from(self.attempt).unwrap_or(0),
            seq,
            method: self.method,
            url: self.url,
            idempotency_key: match proposal {
                Some(n) => Effect::proposal_key(job, n),
                None => Effect::idempotency_key(job, seq),
            },
            proposal,
            started_at: Timestamp::from_unix_ms(self.started_at),
            finished_at: self.finished_at.map(Timestamp::from_unix_ms),
            status: self.status.and_then(|s| u16::try_from(s).ok()),
            error: self.error,
        }
    }
}

/// A grants column: `NULL` when nothing is granted.
pub(crate) fn grants_to_column(grants: &Grants) -> Result<Option<String>, StoreError> {
    if grants.is_none() { Ok(None) } else { to_json(grants).map(Some) }
}

/// Grants read back from their column (`NULL`: none).
pub(crate) fn grants_of(id: &str, text: Option<String>) -> Result<Grants, StoreError> {
    Ok(json_column(id, "grants", text)?.unwrap_or_default())
}

/// An approval policy column: `NULL` when nothing is gated.
pub(crate) fn policy_to_column(policy: &ApprovalPolicy) -> Result<Option<String>, StoreError> {
    if policy.is_none() { Ok(None) } else { to_json(policy).map(Some) }
}

/// A policy read back from its column (`NULL`: none).
pub(crate) fn policy_of(id: &str, text: Option<String>) -> Result<ApprovalPolicy, StoreError> {
    Ok(json_column(id, "approval policy", text)?.unwrap_or_default())
}

/// A component's declared requests as their column (`NULL`: none).
pub(crate) fn requests_to_column(requests: Option<&Requests>) -> Result<Option<String>, StoreError> {
    requests.map(to_json).transpose()
}

/// Declared requests read back from their column (`NULL`: none).
pub(crate) fn requests_of(id: &str, text: Option<String>) -> Result<Option<Requests>, StoreError> {
    json_column(id, "declared requests", text)
}

/// A gated job's approval record as its column (`NULL`: never gated).
pub(crate) fn approval_to_column(approval: Option<&Approval>) -> Result<Option<String>, StoreError> {
    approval.map(to_json).transpose()
}

/// Where a new job starts, when it may be claimed, when it expires and
/// its deadline: a gated job waits in `pending_approval` until its approval
/// TTL, its queue TTL and any sync deadline counted from its trigger
/// instead.
pub(crate) struct InsertTimes {
    pub(crate) status: &'static str,
    pub(crate) run_after: Timestamp,
    pub(crate) expires_at: Timestamp,
    pub(crate) deadline_at: Option<Timestamp>,
}

impl InsertTimes {
    pub(crate) fn of(job: &NewJob, now: Timestamp) -> InsertTimes {
        let run_after = job.run_at.map_or(now, |at| at.max(now));
        if job.approval.is_some() {
            return InsertTimes {
                status: "pending_approval",
                run_after,
                expires_at: now.plus(job.approval_ttl),
                deadline_at: None,
            };
        }
        let deadline_at = job.deadline.map(|d| now.plus(d));
        let expires_at = run_after.plus(job.queue_ttl).min(deadline_at.unwrap_or(Timestamp::from_unix_ms(i64::MAX)));
        InsertTimes { status: "queued", run_after, expires_at, deadline_at }
    }
}

/// The job a row just inserted from `job` holds, built here rather than
/// read back: every other column starts at its schema default. (SQLite's
/// `RETURNING` copies each row through a temporary table and the read
/// parses it again; the insert showed as the writer's largest part.)
pub(crate) fn inserted_job(id: JobId, job: &NewJob, times: &InsertTimes, now: Timestamp) -> Result<Job, StoreError> {
    Ok(Job {
        id,
        status: times.status.parse().map_err(|e: String| corrupt(&id.to_string(), e))?,
        plugin: job.plugin,
        plugin_name: job.plugin_name.clone(),
        target: job.target.clone(),
        plan_id: job.plan_id.clone(),
        concurrency_key: job.concurrency_key.clone(),
        input: job.input.clone(),
        limits: job.limits.clone(),
        grants: job.grants.clone(),
        schema_version: crate::job::SCHEMA_VERSION,
        created_at: now,
        started_at: None,
        finished_at: None,
        last_heartbeat: None,
        expires_at: times.expires_at,
        worker_id: None,
        lease_token: None,
        lease_expires_at: None,
        run_after: times.run_after,
        deadline_at: times.deadline_at,
        attempt: 0,
        lost_leases: 0,
        retries: 0,
        backoff: job.backoff,
        last_error: None,
        releases: 0,
        free_reruns: 0,
        free_rerun_limit: job.free_rerun_limit,
        process_deaths: 0,
        max_attempts: job.max_attempts,
        cancel_requested: false,
        error_kind: None,
        error_message: None,
        backtrace: None,
        output: None,
        fuel_used: None,
        peak_memory_bytes: None,
        progress: None,
        approval: job.approval.map(Into::into),
        submitted_by: job.submitted_by.clone(),
        priority: job.priority,
        schedule_id: job.schedule_id,
        tags: job.tags.clone(),
        metadata: job.metadata.clone(),
        rate_limit: job.rate_limit.clone(),
        rate_key: job.rate_key.clone(),
        rate_slot: None,
    })
}

/// A job's tags and metadata as their two text columns (`NULL` when
/// empty).
pub(crate) fn labels_to_columns(
    tags: &[String],
    metadata: &serde_json::Map<String, serde_json::Value>,
) -> Result<(Option<String>, Option<String>), StoreError> {
    let tags = (!tags.is_empty()).then(|| to_json(&tags)).transpose()?;
    let metadata = (!metadata.is_empty()).then(|| to_json(metadata)).transpose()?;
    Ok((tags, metadata))
}

/// A job's tags and metadata read back from their columns.
pub(crate) fn labels_of_columns(
    id: &str,
    tags: Option<String>,
    metadata: Option<String>,
) -> Result<(Vec<String>, serde_json::Map<String, serde_json::Value>), StoreError> {
    let tags = tags.map(|t| serde_json::from_str(&t).map_err(|e| corrupt(id, format!("tags: {e}")))).transpose()?;
    let metadata =
        metadata.map(|m| serde_json::from_str(&m).map_err(|e| corrupt(id, format!("metadata: {e}")))).transpose()?;
    Ok((tags.unwrap_or_default(), metadata.unwrap_or_default()))
}

/// A value as a JSON text column.
pub(crate) fn to_json(value: &impl serde::Serialize) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|e| StoreError::Invalid(e.to_string()))
}

/// A `u64` counter or limit as a signed 64-bit column, saturating.
pub(crate) fn i64_of(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The stored `phase` and `action` columns of a target.
pub(crate) fn target_columns(target: &Target) -> (&'static str, Option<&str>) {
    match target {
        Target::Execute => ("execute", None),
        Target::Apply => ("apply", None),
        Target::Action(name) => ("action", Some(name.as_str())),
    }
}

/// A target from its stored `phase` and `action` columns.
pub(crate) fn target_of(id: &str, phase: &str, action: Option<String>) -> Result<Target, StoreError> {
    match (phase, action) {
        ("execute", None) => Ok(Target::Execute),
        ("apply", None) => Ok(Target::Apply),
        ("action", Some(name)) => Ok(Target::Action(name)),
        (phase, _) => Err(corrupt(id, format!("bad phase {phase:?}"))),
    }
}

/// A principal's roles as their column: names joined by `,`.
pub(crate) fn roles_to_column(roles: &std::collections::BTreeSet<crate::access::Role>) -> String {
    roles.iter().map(|r| r.as_str()).collect::<Vec<_>>().join(",")
}

/// A principal's ceilings as their column holds them (`NULL`: none).
pub(crate) fn ceilings_to_column(ceilings: &crate::access::PrincipalCeilings) -> Result<Option<String>, StoreError> {
    (!ceilings.is_none()).then(|| to_json(ceilings)).transpose()
}

/// A principal's ceilings read back from their column.
pub(crate) fn ceilings_of(name: &str, text: Option<String>) -> Result<crate::access::PrincipalCeilings, StoreError> {
    Ok(json_column(name, "ceilings", text)?.unwrap_or_default())
}

/// A principal's roles read back from their column.
pub(crate) fn roles_of(name: &str, text: &str) -> Result<std::collections::BTreeSet<crate::access::Role>, StoreError> {
    text.split(',').filter(|r| !r.is_empty()).map(|r| r.parse().map_err(|e: String| corrupt(name, e))).collect()
}

/// An earlier attempt's columns, as either backend reads them
/// ([`crate::store::sql::EARLIER_ATTEMPTS`]).
pub(crate) struct AttemptRow {
    pub run: i64,
    pub worker_id: Option<String>,
    pub started_at: Option<i64>,
    pub ended_at: Option<i64>,
    pub outcome: String,
    pub error_kind: Option<String>,
    pub error: Option<String>,
    pub fuel_used: Option<i64>,
    pub peak_memory_bytes: Option<i64>,
    pub logs_json: Option<String>,
    pub logs_cut: bool,
}

impl AttemptRow {
    /// The attempt, its logs decoded.
    pub(crate) fn into_attempt(self, id: &str) -> Result<crate::job::Attempt, StoreError> {
        let count = |n: Option<i64>| n.map(|n| u64::try_from(n).unwrap_or(0));
        Ok(crate::job::Attempt {
            run: u32::try_from(self.run).unwrap_or(0),
            worker_id: self.worker_id,
            started_at: self.started_at.map(Timestamp::from_unix_ms),
            ended_at: self.ended_at.map(Timestamp::from_unix_ms),
            outcome: self.outcome,
            error_kind: self.error_kind,
            error: self.error,
            fuel_used: count(self.fuel_used),
            peak_memory_bytes: count(self.peak_memory_bytes),
            logs: json_column(id, "attempt logs", self.logs_json)?,
            logs_cut: self.logs_cut,
        })
    }
}
