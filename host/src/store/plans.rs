//! Plans: a plan's record, its listing and the sweep that advances it.

use crate::clock::Timestamp;
use crate::job::{ApplyMode, Job, JobId, NewJob, PlanRecord, Proposal};
use crate::store::StoreError;

/// Parameters of [`Plans::plan_insert`].
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

/// Parameters of [`Plans::plan_list`]: newest first, keyset-paged.
#[derive(Debug, Clone, Default)]
pub struct PlanListParams {
    /// Only plans older than this one (the previous page's last id).
    pub before: Option<String>,
    /// Only plans this principal submitted.
    pub submitted_by: Option<String>,
    /// Most plans to return (at least 1).
    pub limit: u32,
}

/// Plans: a plan's record beside its execute job, read, listed and
/// cancelled (the sweep advances them: [`Sweeps::plans_advance`](super::Sweeps::plans_advance)).
#[async_trait::async_trait]
pub trait Plans: Send + Sync + std::fmt::Debug {
    /// Create a plan and its execute job, in one transaction.
    async fn plan_insert(&self, params: PlanInsertParams) -> Result<(PlanRecord, Job), StoreError>;

    /// The effects a plan's execute job proposed, by number (none until
    /// it has succeeded).
    async fn plan_proposals(&self, execute_job: JobId) -> Result<Vec<Proposal>, StoreError>;

    /// One plan by id.
    async fn plan_get(&self, plan_id: String) -> Result<Option<PlanRecord>, StoreError>;

    /// Plans, newest first.
    async fn plan_list(&self, params: PlanListParams) -> Result<Vec<PlanRecord>, StoreError>;

    /// Mark a plan cancelled (no apply job is created for it from now on)
    /// and return it; `None` if there is no such plan. Cancelling the
    /// phase that waits or runs is the caller's next step. Audited as
    /// `actor`'s when one is named.
    async fn plan_cancel(
        &self,
        plan_id: String,
        now: Timestamp,
        actor: Option<String>,
    ) -> Result<Option<PlanRecord>, StoreError>;
}
