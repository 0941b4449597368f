//! Plans through the embedding API: create one (its execute job), see it
//! with its phases, decide on and cancel it. The apply job is created by
//! the store when the execute job has succeeded: at once by the process
//! that ran it ([`spawn_advancer`]), and by every sweep for a process that
//! died in between.

use std::sync::{Arc, Weak};

use serde::Serialize;
use tokio::sync::broadcast::error::RecvError;

use crate::clock::Clock;
use crate::job::proposal::{PlanEffects, binding_digest};
use crate::job::{
    ApplyMode, IdempotencyKey, Job, JobId, JobStatus, PlanPhase, PlanRecord, PlanStatus, PluginRef, Target,
};
use crate::runtime::approval::DecisionBy;
use crate::runtime::{PluginSource, Runtime, RuntimeError, Submit};
use crate::store::{JobStore, PlanInsertParams, PlanListParams, PlansAdvanceParams, StoreError};
use crate::worker::Pool;

/// A plan to create: its plugin and input, and how its apply phase starts.
#[derive(Debug, Clone)]
pub struct PlanSubmit {
    /// The execute job: plugin, input and limits (its target is `execute`;
    /// its plan id and concurrency key are the plan's, and may not be set;
    /// its idempotency key is the plan's).
    /// The apply job gets the same plugin, limits, grants and attempts.
    pub job: Submit,
    /// `approval` (default): apply waits for a person; `auto`: it is queued
    /// at once. `auto` is refused where the plugin's policy gates `apply`.
    pub apply: ApplyMode,
}

/// What [`Runtime::plan_submit`] answers: the plan, and whether an
/// earlier request with the same idempotency key created it.
#[derive(Debug, Clone)]
pub struct PlanCreated {
    /// The plan as it is now.
    pub view: PlanView,
    /// The same request came before: nothing new was created.
    pub replayed: bool,
}

/// A plan with its phases as they are now, and its derived status.
#[derive(Debug, Clone, Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct PlanView {
    /// The plan.
    #[serde(flatten)]
    pub plan: PlanRecord,
    /// Derived from its phases.
    pub status: PlanStatus,
    /// The execute job (with its output).
    pub execute: Job,
    /// The apply job, once created (with its output).
    pub apply: Option<Job>,
    /// The effects its execute phase proposed, with the binding digest an
    /// approval holds: shown for one plan, once execute has succeeded
    /// (`None` in lists).
    pub effects: Option<PlanEffects>,
}

/// The phase a plan decision is about: by name, or by its job's id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanPhaseRef {
    /// `execute` or `apply`.
    Phase(PlanPhase),
    /// The phase whose job this is.
    Job(JobId),
}

impl PlanView {
    /// The phase a cancel is about: apply once it exists, else execute (a
    /// decision names its phase instead).
    pub fn current(&self) -> &Job {
        self.apply.as_ref().unwrap_or(&self.execute)
    }
}

impl Runtime {
    /// Create a plan: validate its execute job as any submit, then store
    /// the plan and the job in one transaction. With an idempotency key
    /// (on its job), the same request again answers the plan it created,
    /// replayed, and another request under the key is
    /// [`RuntimeError::IdempotencyConflict`].
    pub async fn plan_submit(&self, plan: PlanSubmit) -> Result<PlanCreated, RuntimeError> {
        let PlanSubmit { mut job, apply } = plan;
        if job.concurrency_key.is_some() || job.plan_id.is_some() {
            return Err(RuntimeError::InvalidJob(
                "a plan sets its jobs' plan id and concurrency key itself: leave them out".into(),
            ));
        }
        if job.run_at.is_some() || job.deadline.is_some() {
            return Err(RuntimeError::InvalidJob("a plan takes no run_at or deadline".into()));
        }
        // The plan's key is kept by its execute job, apart from job keys.
        job.idempotency = job.idempotency.as_ref().map(IdempotencyKey::for_plan);
        if apply == ApplyMode::Auto
            && let PluginSource::Ref(named @ (PluginRef::Name(_) | PluginRef::Version(_))) = &job.plugin
            && self.plugin(named.clone()).await?.approval.gates(&Target::Apply)
        {
            return Err(RuntimeError::ApprovalRequired { plugin: named.to_string(), target: Target::Apply });
        }
        let now = self.now();
        let plan_id = JobId::new(now).to_string();
        let input = job.input.clone();
        job.target = Target::Execute;
        job.plan_id = Some(plan_id.clone());
        job.concurrency_key = Some(plan_id.clone());
        let execute = self.prepare(vec![job], false).await?.remove(0);
        let params = PlanInsertParams { plan_id, apply_mode: apply, input, execute, now };
        let (plan, execute) = match self.inner.store.plan_insert(params).await {
            Ok(created) => created,
            // The same request again: the plan it made, as it is now.
            Err(StoreError::IdempotencyKeyTaken { job, same_request: true, .. }) => {
                let execute = self.get(job).await?;
                let plan_id = execute.plan_id.ok_or_else(|| RuntimeError::UnknownPlan(job.to_string()))?;
                return Ok(PlanCreated { view: self.plan(&plan_id).await?, replayed: true });
            }
            Err(StoreError::IdempotencyKeyTaken { key, job, same_request: false }) => {
                return Err(RuntimeError::IdempotencyConflict { key: IdempotencyKey::sent(&key).to_owned(), job });
            }
            Err(e) => return Err(e.into()),
        };
        self.count_queued(std::slice::from_ref(&execute));
        let view =
            PlanView { status: PlanStatus::of(&execute, None, false), plan, execute, apply: None, effects: None };
        Ok(PlanCreated { view, replayed: false })
    }

    /// One plan with its phases and, once execute has succeeded, the
    /// effects it proposed.
    pub async fn plan(&self, plan_id: &str) -> Result<PlanView, RuntimeError> {
        let plan = self.inner.store.plan_get(plan_id.to_owned()).await?;
        let plan = plan.ok_or_else(|| RuntimeError::UnknownPlan(plan_id.to_owned()))?;
        let mut view = self.plan_view(plan).await?;
        if view.execute.status == JobStatus::Succeeded {
            view.effects = Some(self.plan_effects(&view).await?);
        }
        Ok(view)
    }

    /// `view`'s proposed effects, where each stands, and the binding
    /// digest (over the apply job's plugin and grants: the execute job's).
    async fn plan_effects(&self, view: &PlanView) -> Result<PlanEffects, RuntimeError> {
        let store = &self.inner.store;
        let proposals = store.plan_proposals(view.execute.id).await?;
        let output = view.execute.output.as_deref().unwrap_or_default();
        let binding = binding_digest(&view.execute.plugin, &view.execute.grants, output, &proposals);
        let (apply, effects, refused) = match &view.apply {
            None => (None, Vec::new(), 0),
            Some(apply) => {
                let logs = store.job_logs(apply.id).await?;
                (Some(apply.id), store.effects(apply.id).await?, last_refused_count(logs.as_ref()))
            }
        };
        Ok(PlanEffects::new(binding, &proposals, apply, &effects, refused))
    }

    /// Plans, newest first, with their phases.
    pub async fn plans(&self, params: PlanListParams) -> Result<Vec<PlanView>, RuntimeError> {
        let mut views = Vec::new();
        for plan in self.inner.store.plan_list(params).await? {
            views.push(self.plan_view(plan).await?);
        }
        Ok(views)
    }

    async fn plan_view(&self, plan: PlanRecord) -> Result<PlanView, RuntimeError> {
        let execute = self.get(plan.execute_job).await?;
        let apply = match plan.apply_job {
            Some(id) => Some(self.get(id).await?),
            None => None,
        };
        let status = PlanStatus::of(&execute, apply.as_ref(), plan.cancelled_at.is_some());
        Ok(PlanView { plan, status, execute, apply, effects: None })
    }

    /// The binding digest of apply job `id` (with its plan's id), as its
    /// plan shows it (`PlanView::effects`). `None` for any job that is not
    /// a plan's apply phase.
    pub(crate) async fn apply_binding(&self, id: JobId) -> Result<Option<(String, String)>, RuntimeError> {
        let job = self.get(id).await?;
        let (Target::Apply, Some(plan_id)) = (&job.target, job.plan_id) else { return Ok(None) };
        let effects = self.plan(&plan_id).await?.effects;
        Ok(effects.map(|e| (plan_id, e.binding_digest)))
    }

    /// Approve `phase` of a plan, where it waits for approval (apply; or
    /// execute, where a policy gates it). The decision names its phase, so
    /// a resent approval of execute never approves the apply phase that
    /// followed it.
    pub async fn plan_approve(
        &self,
        plan_id: &str,
        phase: PlanPhaseRef,
        who: DecisionBy,
    ) -> Result<PlanView, RuntimeError> {
        let id = self.plan_phase(plan_id, phase).await?;
        self.approve(id, who).await?;
        self.plan(plan_id).await
    }

    /// Reject `phase` of a plan, where it waits for approval: the plan ends
    /// `rejected`.
    pub async fn plan_reject(
        &self,
        plan_id: &str,
        phase: PlanPhaseRef,
        who: DecisionBy,
    ) -> Result<PlanView, RuntimeError> {
        let id = self.plan_phase(plan_id, phase).await?;
        self.reject(id, who).await?;
        self.plan(plan_id).await
    }

    /// The job of `phase`; an apply phase not created yet is
    /// [`RuntimeError::Undecidable`] (`not_gated`) on the execute job.
    async fn plan_phase(&self, plan_id: &str, phase: PlanPhaseRef) -> Result<JobId, RuntimeError> {
        let view = self.plan(plan_id).await?;
        let phase = match phase {
            PlanPhaseRef::Phase(phase) => phase,
            PlanPhaseRef::Job(id) if id == view.execute.id => PlanPhase::Execute,
            PlanPhaseRef::Job(id) if view.apply.as_ref().is_some_and(|a| a.id == id) => PlanPhase::Apply,
            PlanPhaseRef::Job(id) => {
                return Err(RuntimeError::InvalidJob(format!("job {id} is not a phase of plan {plan_id}")));
            }
        };
        match (phase, &view.apply) {
            (PlanPhase::Execute, _) => Ok(view.execute.id),
            (PlanPhase::Apply, Some(apply)) => Ok(apply.id),
            (PlanPhase::Apply, None) => Err(RuntimeError::Undecidable {
                id: view.execute.id,
                status: view.execute.status,
                why: "the plan has no apply phase yet (its execute phase has not succeeded)",
                code: "not_gated",
            }),
        }
    }

    /// Cancel a plan: no apply job is created from now on, and the phase
    /// that waits or runs is cancelled (a running one by asking its
    /// worker). A plan that already ended is [`RuntimeError::AlreadyTerminal`].
    pub async fn plan_cancel(&self, plan_id: &str) -> Result<PlanView, RuntimeError> {
        let before = self.plan(plan_id).await?;
        if before.status.is_terminal() {
            let current = before.current();
            return Err(RuntimeError::AlreadyTerminal { id: current.id, status: current.status });
        }
        let plan = self.inner.store.plan_cancel(plan_id.to_owned(), self.now(), self.actor()).await?;
        let plan = plan.ok_or_else(|| RuntimeError::UnknownPlan(plan_id.to_owned()))?;
        // Read after the mark: an apply job created before it is seen here.
        let view = self.plan_view(plan).await?;
        match self.cancel(view.current().id).await {
            Ok(_) | Err(RuntimeError::AlreadyTerminal { .. }) => {}
            Err(e) => return Err(e),
        }
        self.plan(plan_id).await
    }
}

/// The requests an apply job's last run refused as not proposed, from
/// the report it logged.
fn last_refused_count(logs: Option<&crate::job::JobLogs>) -> u32 {
    let records = logs.map(|l| l.records.as_slice()).unwrap_or_default();
    records
        .iter()
        .rev()
        .find_map(|r| r.fields.iter().find(|(k, _)| k == crate::worker::REPORT_FIELDS[2]).map(|(_, v)| v))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Create the apply job of each plan whose execute job this process just
/// finished with success, at once (the sweep would, within its interval).
/// The task ends with the pool.
pub(super) fn spawn_advancer(pool: &Arc<Pool>, store: Arc<dyn JobStore>, clock: Arc<dyn Clock>) {
    let mut completions = pool.completions.subscribe();
    let pool: Weak<Pool> = Arc::downgrade(pool);
    tokio::spawn(async move {
        loop {
            let plan_id = match completions.recv().await {
                Ok(done) if done.status == JobStatus::Succeeded && done.plan_id.is_some() => done.plan_id,
                Ok(_) => continue,
                // Missed some: advance every plan that is due.
                Err(RecvError::Lagged(_)) => None,
                Err(RecvError::Closed) => return,
            };
            match store.plans_advance(PlansAdvanceParams { plan_id, now: clock.now() }).await {
                Ok(created) if created.iter().any(|j| j.status == JobStatus::Queued) => {
                    if let Some(pool) = pool.upgrade() {
                        pool.wake.notify_one();
                    }
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "a plan's apply job could not be created; the sweep will"),
            }
        }
    });
}
