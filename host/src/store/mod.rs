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
mod database;
mod effects;
mod error;
mod event;
pub mod faults;
mod jobs;
mod leases;
mod plan;
mod plans;
mod plugins;
pub mod postgres;
pub mod sqlite;
mod sweeps;
mod unfinished;
mod workers;

pub use unfinished::QUARANTINE_AFTER_DEATHS;

pub use database::{Database, Durability, open};
pub use effects::{EffectBeginParams, EffectEndParams};
pub use error::StoreError;
pub use event::{Event, EventFilter, EventId, EventKind, EventPage, EventsAfterParams, JobEvent, WorkerEvent};
pub use jobs::{
    CancelResult, DecideRefusal, JobDecideParams, JobDecision, JobInsertParams, JobListParams, JobProgressParams,
};
pub use leases::{
    Finish, JobClaimParams, JobFinishParams, JobReleaseParams, JobRetryParams, LEASE_LOST_MESSAGE, Lease,
    LeaseExtendParams, LeaseState,
};
pub use plans::{PlanInsertParams, PlanListParams, PlansAdvanceParams};
pub use plugins::{PluginGrantsParams, PluginNameParams, PluginPolicyParams, PluginPutParams};
pub use sweeps::{JobsDeleteParams, JobsExpireParams, LeaseReclaimParams, ReclaimReport, WorkerDiedParams};
pub use workers::{WorkerRecord, WorkerState, WorkersSnapshot};

use std::collections::HashMap;
use std::fmt;

use crate::clock::Timestamp;
use crate::job::{Counts, Digest, Effect, Job, JobId, JobLogs, JobStatus, PlanRecord, PluginInfo, PluginRef};

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
