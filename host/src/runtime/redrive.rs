//! Running ended jobs again (redrive), by the many: every failed or
//! cancelled job a filter matches, a page at a time, with a dry run that
//! says what a real one would do. Each is the one-job retry
//! ([`Runtime::retry`]): queued again in place with a fresh set of
//! attempts, its history kept, audited as `job.retry`.

use serde::{Deserialize, Serialize};

use crate::job::{Job, JobId, JobStatus, redrive_refusal};
use crate::runtime::{Runtime, RuntimeError};
use crate::store::JobListParams;

/// Most jobs one bulk retry takes.
pub const MAX_REDRIVE_PAGE: u32 = 1000;

/// A job a bulk retry matched and left alone, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RedriveRefused {
    /// The job.
    pub id: JobId,
    /// Why it may not run again.
    pub why: String,
}

/// What a bulk retry did — or, dry, would do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RedriveReport {
    /// Nothing was changed: `retried` says what would be.
    pub dry_run: bool,
    /// Jobs the filter matched on this page.
    pub matched: u32,
    /// Queued again (or, dry, that would be), newest first.
    pub retried: Vec<JobId>,
    /// Matched but not run again.
    pub refused: Vec<RedriveRefused>,
    /// The page was full: pass this as `before` for the next one.
    pub next_before: Option<JobId>,
}

impl Runtime {
    /// Retry every ended job `params` matches (at most `params.limit`,
    /// newest first; `failed` when no state is named), each as
    /// [`Runtime::retry`] does; with `dry_run`, change nothing and say
    /// what would be retried. A job that may not run again (a plan's
    /// phase, one that waited for approval) is listed as refused.
    pub async fn retry_matching(
        &self,
        mut params: JobListParams,
        dry_run: bool,
    ) -> Result<RedriveReport, RuntimeError> {
        if params.status.is_empty() {
            params.status = vec![JobStatus::Failed];
        }
        if let Some(other) = params.status.iter().find(|s| !matches!(s, JobStatus::Failed | JobStatus::Cancelled)) {
            return Err(RuntimeError::InvalidJob(format!(
                "only failed or cancelled jobs can be retried, not {other} ones"
            )));
        }
        if !(1..=MAX_REDRIVE_PAGE).contains(&params.limit) {
            return Err(RuntimeError::InvalidJob(format!("`limit` must be between 1 and {MAX_REDRIVE_PAGE}")));
        }
        let limit = params.limit as usize;
        let jobs = self.list(params).await?;
        let next_before = (jobs.len() == limit).then(|| jobs.last().map(|j| j.id)).flatten();
        let mut report = RedriveReport {
            dry_run,
            matched: jobs.len() as u32,
            retried: Vec::new(),
            refused: Vec::new(),
            next_before,
        };
        for job in jobs {
            match (refusal(&job), dry_run) {
                (Some(why), _) => report.refused.push(RedriveRefused { id: job.id, why }),
                (None, true) => report.retried.push(job.id),
                (None, false) => match self.retry(job.id).await {
                    Ok(()) => report.retried.push(job.id),
                    // Changed since it was listed (retried, or gone).
                    Err(RuntimeError::NotRetryable(why)) => report.refused.push(RedriveRefused { id: job.id, why }),
                    Err(RuntimeError::NotFound(_)) => {
                        report.refused.push(RedriveRefused { id: job.id, why: "it is gone".into() })
                    }
                    Err(e) => return Err(e),
                },
            }
        }
        Ok(report)
    }
}

fn refusal(job: &Job) -> Option<String> {
    redrive_refusal(&job.id.to_string(), job.status, job.plan_id.as_deref(), job.approval.is_some())
}
