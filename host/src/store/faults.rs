//! A store wrapper that injects faults, for testing what leash does when
//! its database misbehaves.
//!
//! Each fault applies to the next call of one operation (or to every call
//! with a probability): fail *before* the write (nothing lands), fail
//! *after* it (the write lands but the caller sees an error — the case a
//! lost reply or a timeout after commit produces), or stall first. Injected
//! errors are transient database errors, as a busy or briefly unreachable
//! database gives.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::{
    CancelResult, DecideRefusal, EffectBeginParams, EffectEndParams, Effects, EventPage, Events, EventsAfterParams,
    FoundToken, JobClaimParams, JobDecideParams, JobFinishParams, JobInsertParams, JobListParams, JobProgressParams,
    JobRedriveParams, JobReleaseParams, JobRetryParams, JobStore, Jobs, JobsDeleteParams, JobsExpireParams, Lease,
    LeaseExtendParams, LeaseReclaimParams, LeaseState, Leases, PlanInsertParams, PlanListParams, Plans,
    PlansAdvanceParams, PluginCodePutParams, PluginGrantsParams, PluginNameParams, PluginPolicyParams, PluginPutParams,
    Plugins, Principals, ReclaimReport, RedriveResult, Sessions, StoreError, Sweeps, WorkerDiedParams, Workers,
    WorkersSnapshot,
};
use crate::access::{Principal, TokenRecord};
use crate::clock::Timestamp;
use crate::job::{
    Counts, Digest, Effect, EventId, Job, JobId, JobLogs, JobStatus, PlanRecord, PluginInfo, PluginRef, WorkerRecord,
};

/// Operations a fault can target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// `job_insert`.
    Insert,
    /// `job_claim`.
    Claim,
    /// `lease_extend`.
    Extend,
    /// `job_finish`.
    Finish,
    /// `job_release`.
    Release,
    /// `job_retry`.
    Retry,
    /// `job_cancel`.
    Cancel,
    /// `lease_reclaim_expired`.
    Reclaim,
    /// `job_progress_set`.
    Progress,
    /// `plugin_get` (a read: only stalls mean anything here).
    PluginGet,
    /// `plugins_undeclared` (a read the runtime makes as it starts).
    Undeclared,
    /// `effect_begin` (an effect's intent).
    EffectBegin,
    /// `rule_list` (the standing rules read as gated jobs arrive).
    RuleList,
    /// `queued_count` (the admission count a submit reads when its
    /// estimate is stale).
    QueuedCount,
}

/// What goes wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Fail without touching the database.
    FailBefore,
    /// Do the write, then report failure.
    FailAfter,
    /// Wait, then do the call normally.
    Stall(Duration),
    /// Answer [`StoreError::Closed`] without touching the database, as a
    /// store (or the runtime serving its reads) closing under a call does.
    Closed,
    /// Fail without touching the database with an error that is not
    /// transient (a disk error, say): asking again would not help.
    Broken,
}

#[derive(Debug, Default)]
struct Plan {
    /// One-shot faults, taken in order per operation.
    once: HashMap<Op, Vec<Fault>>,
    /// Faults applied to a share of calls: (fault, one call in `every`).
    every: HashMap<Op, (Fault, u64)>,
    calls: HashMap<Op, u64>,
}

/// A [`JobStore`] that injects faults into an inner store.
#[derive(Debug)]
pub struct FaultyStore {
    inner: std::sync::Arc<dyn JobStore>,
    plan: Mutex<Plan>,
    injected: AtomicU64,
}

impl FaultyStore {
    /// Wrap `inner`; no faults until some are planned.
    pub fn new(inner: std::sync::Arc<dyn JobStore>) -> Self {
        FaultyStore { inner, plan: Mutex::default(), injected: AtomicU64::new(0) }
    }

    /// Apply `fault` to the next call of `op` (queued after earlier ones).
    pub fn inject(&self, op: Op, fault: Fault) {
        self.plan.lock().unwrap_or_else(|e| e.into_inner()).once.entry(op).or_default().push(fault);
    }

    /// Apply `fault` to one call of `op` in every `every` (deterministic:
    /// calls number `every`, `2 * every`, …). `every == 0` clears it.
    pub fn inject_every(&self, op: Op, fault: Fault, every: u64) {
        let mut plan = self.plan.lock().unwrap_or_else(|e| e.into_inner());
        if every == 0 {
            plan.every.remove(&op);
        } else {
            plan.every.insert(op, (fault, every));
        }
    }

    /// Faults injected so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::Relaxed)
    }

    /// Calls of `op` made so far (counted for the operations faults can
    /// target).
    pub fn calls(&self, op: Op) -> u64 {
        self.plan.lock().unwrap_or_else(|e| e.into_inner()).calls.get(&op).copied().unwrap_or(0)
    }

    /// Faults planned but not yet applied (one-shot ones).
    pub fn pending(&self) -> usize {
        self.plan.lock().unwrap_or_else(|e| e.into_inner()).once.values().map(Vec::len).sum()
    }

    fn take(&self, op: Op) -> Option<Fault> {
        let mut plan = self.plan.lock().unwrap_or_else(|e| e.into_inner());
        let n = {
            let calls = plan.calls.entry(op).or_default();
            *calls += 1;
            *calls
        };
        let fault = match plan.once.get_mut(&op) {
            Some(queue) if !queue.is_empty() => Some(queue.remove(0)),
            _ => plan.every.get(&op).filter(|(_, every)| n % every == 0).map(|(fault, _)| *fault),
        };
        if fault.is_some() {
            self.injected.fetch_add(1, Ordering::Relaxed);
        }
        fault
    }

    async fn around<T>(
        &self,
        op: Op,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match self.take(op) {
            None => call.await,
            Some(Fault::FailBefore) => Err(injected(op, "before the write")),
            Some(Fault::Closed) => Err(StoreError::Closed),
            Some(Fault::Broken) => Err(StoreError::Database {
                operation: "an injected fault",
                source: format!("injected lasting failure of {op:?}").into(),
                transient: false,
            }),
            Some(Fault::FailAfter) => {
                let _ = call.await;
                Err(injected(op, "after the write landed"))
            }
            Some(Fault::Stall(d)) => {
                tokio::time::sleep(d).await;
                call.await
            }
        }
    }
}

fn injected(op: Op, when: &str) -> StoreError {
    StoreError::Database {
        operation: "an injected fault",
        source: format!("injected failure of {op:?} {when}").into(),
        transient: true,
    }
}

#[async_trait::async_trait]
impl Jobs for FaultyStore {
    async fn job_insert(&self, params: JobInsertParams) -> Result<Vec<Job>, StoreError> {
        self.around(Op::Insert, self.inner.job_insert(params)).await
    }

    async fn job_get(&self, id: JobId) -> Result<Option<Job>, StoreError> {
        self.inner.job_get(id).await
    }

    async fn jobs_by_idempotency_key(
        &self,
        keys: Vec<String>,
    ) -> Result<HashMap<String, (JobId, JobStatus)>, StoreError> {
        self.inner.jobs_by_idempotency_key(keys).await
    }

    async fn job_decide(&self, params: JobDecideParams) -> Result<Result<Job, DecideRefusal>, StoreError> {
        self.inner.job_decide(params).await
    }

    async fn job_cancel(&self, id: JobId, now: Timestamp, actor: Option<String>) -> Result<CancelResult, StoreError> {
        self.around(Op::Cancel, self.inner.job_cancel(id, now, actor)).await
    }

    async fn job_redrive(&self, params: JobRedriveParams) -> Result<RedriveResult, StoreError> {
        self.inner.job_redrive(params).await
    }

    async fn counts_snapshot(&self) -> Result<Counts, StoreError> {
        self.inner.counts_snapshot().await
    }

    async fn queued_count(&self) -> Result<u64, StoreError> {
        self.around(Op::QueuedCount, self.inner.queued_count()).await
    }

    async fn oldest_queued_due(&self) -> Result<Option<Timestamp>, StoreError> {
        self.inner.oldest_queued_due().await
    }

    async fn jobs_ahead(&self, job: &Job, now: Timestamp) -> Result<u64, StoreError> {
        self.inner.jobs_ahead(job, now).await
    }

    async fn job_list(&self, params: JobListParams) -> Result<Vec<Job>, StoreError> {
        self.inner.job_list(params).await
    }

    async fn job_logs(&self, id: JobId) -> Result<Option<JobLogs>, StoreError> {
        self.inner.job_logs(id).await
    }

    async fn job_earlier_attempts(&self, id: JobId) -> Result<Vec<crate::job::Attempt>, StoreError> {
        self.inner.job_earlier_attempts(id).await
    }
}

#[async_trait::async_trait]
impl Leases for FaultyStore {
    async fn job_claim(&self, params: JobClaimParams) -> Result<Vec<Lease>, StoreError> {
        self.around(Op::Claim, self.inner.job_claim(params)).await
    }

    async fn lease_extend(&self, params: LeaseExtendParams) -> Result<LeaseState, StoreError> {
        self.around(Op::Extend, self.inner.lease_extend(params)).await
    }

    async fn job_finish(&self, params: JobFinishParams) -> Result<bool, StoreError> {
        self.around(Op::Finish, self.inner.job_finish(params)).await
    }

    async fn job_release(&self, params: JobReleaseParams) -> Result<bool, StoreError> {
        self.around(Op::Release, self.inner.job_release(params)).await
    }

    async fn job_retry(&self, params: JobRetryParams) -> Result<bool, StoreError> {
        self.around(Op::Retry, self.inner.job_retry(params)).await
    }

    async fn job_progress_set(&self, params: JobProgressParams) -> Result<bool, StoreError> {
        self.around(Op::Progress, self.inner.job_progress_set(params)).await
    }

    fn enqueued(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.inner.enqueued()
    }
}

#[async_trait::async_trait]
impl Effects for FaultyStore {
    async fn effect_begin(&self, params: EffectBeginParams) -> Result<Option<Effect>, StoreError> {
        self.around(Op::EffectBegin, self.inner.effect_begin(params)).await
    }

    async fn effect_end(&self, params: EffectEndParams) -> Result<(), StoreError> {
        self.inner.effect_end(params).await
    }

    async fn effects(&self, id: JobId) -> Result<Vec<Effect>, StoreError> {
        self.inner.effects(id).await
    }
}

#[async_trait::async_trait]
impl Sweeps for FaultyStore {
    async fn lease_reclaim_expired(&self, params: LeaseReclaimParams) -> Result<ReclaimReport, StoreError> {
        self.around(Op::Reclaim, self.inner.lease_reclaim_expired(params)).await
    }

    async fn worker_died(&self, params: WorkerDiedParams) -> Result<ReclaimReport, StoreError> {
        self.inner.worker_died(params).await
    }

    async fn jobs_expire_queued(&self, params: JobsExpireParams) -> Result<u64, StoreError> {
        self.inner.jobs_expire_queued(params).await
    }

    async fn jobs_delete_expired(&self, params: JobsDeleteParams) -> Result<u64, StoreError> {
        self.inner.jobs_delete_expired(params).await
    }

    async fn plans_advance(&self, params: PlansAdvanceParams) -> Result<Vec<Job>, StoreError> {
        self.inner.plans_advance(params).await
    }

    async fn workers_delete_stale(&self, last_heartbeat_before: Timestamp) -> Result<u64, StoreError> {
        self.inner.workers_delete_stale(last_heartbeat_before).await
    }
}

#[async_trait::async_trait]
impl Plugins for FaultyStore {
    async fn plugin_put(&self, params: PluginPutParams) -> Result<Digest, StoreError> {
        self.inner.plugin_put(params).await
    }

    async fn plugin_policy_set(&self, params: PluginPolicyParams) -> Result<Option<PluginInfo>, StoreError> {
        self.inner.plugin_policy_set(params).await
    }

    async fn plugins_undeclared(&self) -> Result<Vec<Digest>, StoreError> {
        self.around(Op::Undeclared, self.inner.plugins_undeclared()).await
    }

    async fn plugin_code_get(
        &self,
        digest: Digest,
        engine: String,
        now: Timestamp,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.plugin_code_get(digest, engine, now).await
    }

    async fn plugin_code_put(&self, params: PluginCodePutParams) -> Result<bool, StoreError> {
        self.inner.plugin_code_put(params).await
    }

    async fn plugin_get(&self, digest: Digest) -> Result<Option<Vec<u8>>, StoreError> {
        self.around(Op::PluginGet, self.inner.plugin_get(digest)).await
    }

    async fn plugin_name_set(&self, params: PluginNameParams) -> Result<PluginInfo, StoreError> {
        self.inner.plugin_name_set(params).await
    }

    async fn plugin_grants_set(&self, params: PluginGrantsParams) -> Result<Option<PluginInfo>, StoreError> {
        self.inner.plugin_grants_set(params).await
    }

    async fn plugin_list(&self) -> Result<Vec<PluginInfo>, StoreError> {
        self.inner.plugin_list().await
    }

    async fn plugin_resolve(&self, plugin: PluginRef) -> Result<Option<PluginInfo>, StoreError> {
        self.inner.plugin_resolve(plugin).await
    }
}

#[async_trait::async_trait]
impl Plans for FaultyStore {
    async fn plan_insert(&self, params: PlanInsertParams) -> Result<(PlanRecord, Job), StoreError> {
        self.around(Op::Insert, self.inner.plan_insert(params)).await
    }

    async fn plan_get(&self, plan_id: String) -> Result<Option<PlanRecord>, StoreError> {
        self.inner.plan_get(plan_id).await
    }

    async fn plan_proposals(&self, execute_job: JobId) -> Result<Vec<crate::job::Proposal>, StoreError> {
        self.inner.plan_proposals(execute_job).await
    }

    async fn plan_list(&self, params: PlanListParams) -> Result<Vec<PlanRecord>, StoreError> {
        self.inner.plan_list(params).await
    }

    async fn plan_cancel(
        &self,
        plan_id: String,
        now: Timestamp,
        actor: Option<String>,
    ) -> Result<Option<PlanRecord>, StoreError> {
        self.inner.plan_cancel(plan_id, now, actor).await
    }
}

#[async_trait::async_trait]
impl Workers for FaultyStore {
    async fn worker_beat(&self, worker: WorkerRecord) -> Result<(), StoreError> {
        self.inner.worker_beat(worker).await
    }

    async fn workers_snapshot(&self) -> Result<WorkersSnapshot, StoreError> {
        self.inner.workers_snapshot().await
    }
}

#[async_trait::async_trait]
impl Principals for FaultyStore {
    async fn principal_get(&self, name: String) -> Result<Option<Principal>, StoreError> {
        self.inner.principal_get(name).await
    }

    async fn principal_put(&self, principal: Principal, actor: Option<String>) -> Result<Principal, StoreError> {
        self.inner.principal_put(principal, actor).await
    }

    async fn principal_list(&self) -> Result<Vec<Principal>, StoreError> {
        self.inner.principal_list().await
    }

    async fn principal_remove(&self, name: String, now: Timestamp, actor: Option<String>) -> Result<bool, StoreError> {
        self.inner.principal_remove(name, now, actor).await
    }

    async fn token_insert(&self, record: TokenRecord, hash: String, actor: Option<String>) -> Result<(), StoreError> {
        self.inner.token_insert(record, hash, actor).await
    }

    async fn token_list(&self, principal: Option<String>) -> Result<Vec<TokenRecord>, StoreError> {
        self.inner.token_list(principal).await
    }

    async fn token_revoke(&self, id: String, now: Timestamp, actor: Option<String>) -> Result<bool, StoreError> {
        self.inner.token_revoke(id, now, actor).await
    }

    async fn token_find(&self, id: String) -> Result<Option<FoundToken>, StoreError> {
        self.inner.token_find(id).await
    }
}

#[async_trait::async_trait]
impl Sessions for FaultyStore {
    async fn session_end(&self, id: String, expires_at: Timestamp, now: Timestamp) -> Result<(), StoreError> {
        self.inner.session_end(id, expires_at, now).await
    }

    async fn session_ended(&self, id: String) -> Result<bool, StoreError> {
        self.inner.session_ended(id).await
    }
}

#[async_trait::async_trait]
impl Events for FaultyStore {
    async fn events_after(&self, params: EventsAfterParams) -> Result<EventPage, StoreError> {
        self.inner.events_after(params).await
    }

    async fn events_head(&self) -> Result<Option<EventId>, StoreError> {
        self.inner.events_head().await
    }
}

#[async_trait::async_trait]
impl crate::store::Audit for FaultyStore {
    async fn audit_list(
        &self,
        params: crate::store::AuditListParams,
    ) -> Result<Vec<crate::store::AuditRecord>, StoreError> {
        self.inner.audit_list(params).await
    }

    async fn audit_head(&self) -> Result<crate::store::AuditHead, StoreError> {
        self.inner.audit_head().await
    }
}

#[async_trait::async_trait]
impl crate::store::StandingRules for FaultyStore {
    async fn rule_get(&self, id: String) -> Result<Option<crate::job::ApprovalRule>, StoreError> {
        self.inner.rule_get(id).await
    }

    async fn rule_list(
        &self,
        params: crate::store::RuleListParams,
    ) -> Result<Vec<crate::job::ApprovalRule>, StoreError> {
        self.around(Op::RuleList, self.inner.rule_list(params)).await
    }

    async fn rule_revoke(
        &self,
        params: crate::store::RuleRevokeParams,
    ) -> Result<Option<crate::job::ApprovalRule>, StoreError> {
        self.inner.rule_revoke(params).await
    }
}

#[async_trait::async_trait]
impl crate::store::Pauses for FaultyStore {
    async fn plugin_pause(&self, params: crate::store::PauseParams) -> Result<crate::store::PluginPause, StoreError> {
        self.inner.plugin_pause(params).await
    }

    async fn plugin_resume(&self, params: crate::store::ResumeParams) -> Result<bool, StoreError> {
        self.inner.plugin_resume(params).await
    }

    async fn plugin_pauses(&self) -> Result<Vec<crate::store::PluginPause>, StoreError> {
        self.inner.plugin_pauses().await
    }
}

#[async_trait::async_trait]
impl crate::store::Schedules for FaultyStore {
    async fn schedule_create(
        &self,
        schedule: crate::job::Schedule,
        now: Timestamp,
    ) -> Result<crate::job::Schedule, StoreError> {
        self.inner.schedule_create(schedule, now).await
    }

    async fn schedule_get(&self, name: String) -> Result<Option<crate::job::Schedule>, StoreError> {
        self.inner.schedule_get(name).await
    }

    async fn schedule_list(&self) -> Result<Vec<crate::job::Schedule>, StoreError> {
        self.inner.schedule_list().await
    }

    async fn schedule_remove(&self, name: String, actor: Option<String>, now: Timestamp) -> Result<bool, StoreError> {
        self.inner.schedule_remove(name, actor, now).await
    }

    async fn schedule_pause(
        &self,
        params: crate::store::SchedulePauseParams,
    ) -> Result<Option<crate::job::Schedule>, StoreError> {
        self.inner.schedule_pause(params).await
    }

    async fn schedules_due(&self, now: Timestamp, limit: u32) -> Result<Vec<crate::job::Schedule>, StoreError> {
        self.inner.schedules_due(now, limit).await
    }

    async fn schedule_fire(
        &self,
        params: crate::store::ScheduleFireParams,
    ) -> Result<crate::store::ScheduleFired, StoreError> {
        self.inner.schedule_fire(params).await
    }

    async fn schedule_trigger(
        &self,
        id: JobId,
        job: crate::job::NewJob,
        actor: Option<String>,
        now: Timestamp,
    ) -> Result<Option<Job>, StoreError> {
        self.inner.schedule_trigger(id, job, actor, now).await
    }
}

#[async_trait::async_trait]
impl crate::store::RateLimits for FaultyStore {
    async fn rate_limit_set(
        &self,
        limit: crate::job::rate::RateLimit,
    ) -> Result<crate::job::rate::RateLimit, StoreError> {
        self.inner.rate_limit_set(limit).await
    }

    async fn rate_limit_get(&self, name: &str) -> Result<Option<crate::job::rate::RateLimit>, StoreError> {
        self.inner.rate_limit_get(name).await
    }

    async fn rate_limits(&self) -> Result<Vec<crate::job::rate::RateLimit>, StoreError> {
        self.inner.rate_limits().await
    }

    async fn rate_limit_remove(&self, params: crate::store::RateLimitRemoveParams) -> Result<bool, StoreError> {
        self.inner.rate_limit_remove(params).await
    }

    async fn rate_reserve(
        &self,
        params: crate::store::RateReserveParams,
    ) -> Result<crate::job::rate::Reservation, StoreError> {
        self.inner.rate_reserve(params).await
    }
}
