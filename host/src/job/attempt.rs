//! A job's attempts, one by one: the job's row holds its latest, and the
//! store keeps each earlier one as the row moves on (see the
//! `job_attempts` triggers of each backend).

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::job::{Job, JobLogs, JobStatus};

/// How many earlier attempts keep their logs: older ones drop them, marked
/// `logs_cut`, so a job that retries many times stays bounded.
pub const EARLIER_ATTEMPTS_WITH_LOGS: usize = 5;

/// One run of a job by a worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Attempt {
    /// Which run of the job this was, from 1. A run given back without
    /// spending an attempt (a shutdown before any effect) is a run too, so
    /// a job may have more runs than attempts.
    pub run: u32,
    /// The worker that ran it.
    pub worker_id: Option<String>,
    /// When it started.
    pub started_at: Option<Timestamp>,
    /// When it ended; absent while it runs.
    pub ended_at: Option<Timestamp>,
    /// How it ended: `running` (it has not), `succeeded`, `failed`,
    /// `cancelled`, `retried` (a retryable failure with attempts left),
    /// `released` (given back to the queue: a shutdown, a transient
    /// fault), `lease_lost` (its worker stopped renewing the lease) or
    /// `process_died` (its process died while running it).
    pub outcome: String,
    /// Why a final attempt failed or was cancelled.
    pub error_kind: Option<String>,
    /// Its error, `"kind: Type: message"` for a retried one, `"Type:
    /// message"` for a final one.
    pub error: Option<String>,
    /// Fuel it used, where recorded.
    pub fuel_used: Option<u64>,
    /// Its peak memory, where recorded.
    pub peak_memory_bytes: Option<u64>,
    /// What it logged (logs, stdout, stderr), where kept.
    pub logs: Option<JobLogs>,
    /// Its logs were dropped: only the latest attempts keep theirs.
    pub logs_cut: bool,
}

impl Attempt {
    /// Its duration, once it has ended.
    pub fn duration(&self) -> Option<std::time::Duration> {
        let ms = self.ended_at?.unix_ms().saturating_sub(self.started_at?.unix_ms());
        Some(std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0)))
    }
}

/// A job's attempts, oldest first: the earlier ones the store kept, then
/// the one the job's row holds (running or final) unless it is among them
/// (a job queued again, or cancelled before its next run).
pub fn timeline(job: &Job, logs: Option<JobLogs>, mut earlier: Vec<Attempt>) -> Vec<Attempt> {
    let recorded = earlier.last().is_some_and(|last| last.run == job.attempt);
    let ran = job.attempt > 0 && job.started_at.is_some();
    let current = match job.status {
        JobStatus::Running => Some("running"),
        JobStatus::Succeeded => Some("succeeded"),
        JobStatus::Failed => Some("failed"),
        JobStatus::Cancelled => Some("cancelled"),
        _ => None,
    };
    if let Some(outcome) = current.filter(|_| ran && !recorded) {
        let running = job.status == JobStatus::Running;
        earlier.push(Attempt {
            run: job.attempt,
            worker_id: job.worker_id.clone(),
            started_at: job.started_at,
            ended_at: if running { None } else { job.finished_at },
            outcome: outcome.to_owned(),
            error_kind: job.error_kind.map(|k| k.to_string()),
            error: job.error_message.clone(),
            fuel_used: job.fuel_used,
            peak_memory_bytes: job.peak_memory_bytes,
            logs,
            logs_cut: false,
        });
    }
    earlier
}
