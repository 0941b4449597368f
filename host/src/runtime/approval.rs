//! Approval gates through the embedding API: decide on a gated job,
//! trigger an approved one's run, and set a registration's policy.

use std::time::Duration;

use crate::job::{
    ApprovalPolicy, Decision, IdempotencyKey, Job, JobId, JobStatus, PluginInfo, PluginName, Remember, Verdict,
};
use crate::runtime::{Runtime, RuntimeError};
use crate::store::{DecideRefusal, JobDecideParams, JobDecision, PluginPolicyParams};

/// Who decides and why, for [`Runtime::approve`] and [`Runtime::reject`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecisionBy {
    /// Who decides, as they name themselves (1–128 printable characters).
    pub by: String,
    /// Why, if they say (at most 4 KiB).
    pub comment: Option<String>,
    /// The client's idempotency key (1–255 printable ASCII characters):
    /// the same decision sent again with it is answered with the job as it
    /// is now, not refused as already made.
    pub key: Option<String>,
    /// An approval that also stands for jobs exactly like this one ("Allow
    /// & Remember", see [`crate::job::rule`]).
    pub remember: Option<RememberFor>,
    /// For a plan's apply phase: the binding digest the approver was shown
    /// (`PlanView::binding`); the approval is refused
    /// ([`RuntimeError::PlanChanged`]) if the plan's differs.
    pub digest: Option<String>,
}

/// How long an approval that remembers stands, and for whose submits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RememberFor {
    /// How long the rule approves (1 minute to 90 days).
    pub ttl: Duration,
    /// Any principal's matching submits, not only this job's submitter's.
    pub any_submitter: bool,
}

impl DecisionBy {
    /// `by` deciding without a comment.
    pub fn new(by: impl Into<String>) -> Self {
        DecisionBy { by: by.into(), comment: None, key: None, remember: None, digest: None }
    }

    /// An approval that stands for `ttl` for jobs exactly like this one.
    /// The rule approves only while `by` is a stored principal holding
    /// `approve` (or the bootstrap `admin`): an approver's name no
    /// principal has makes a rule that approves nothing.
    pub fn remember(mut self, ttl: Duration, any_submitter: bool) -> Self {
        self.remember = Some(RememberFor { ttl, any_submitter });
        self
    }

    /// With a comment.
    pub fn comment(mut self, comment: impl Into<String>) -> Self {
        self.comment = Some(comment.into());
        self
    }

    /// Approving what the binding digest `digest` covers, as shown.
    pub fn digest(mut self, digest: impl Into<String>) -> Self {
        self.digest = Some(digest.into());
        self
    }

    /// With an idempotency key.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }
}

impl Runtime {
    /// Approve a job waiting for approval: it is queued at once, or (when
    /// it was submitted with `run_on_approve = false`) left `approved` until
    /// [`Runtime::run_approved`]. Of two decisions racing on one job, one
    /// wins; the other gets [`RuntimeError::Undecidable`].
    pub async fn approve(&self, id: JobId, who: DecisionBy) -> Result<Job, RuntimeError> {
        self.decide(id, JobDecision::Approve, who).await
    }

    /// Reject a job waiting for approval: it is cancelled with kind
    /// `rejected`, and never runs.
    pub async fn reject(&self, id: JobId, who: DecisionBy) -> Result<Job, RuntimeError> {
        self.decide(id, JobDecision::Reject, who).await
    }

    /// Trigger the run of an approved job that waits for it: queued now,
    /// its queue TTL and any sync deadline counted from now.
    pub async fn run_approved(&self, id: JobId) -> Result<Job, RuntimeError> {
        self.decide(id, JobDecision::Run, DecisionBy::new("")).await
    }

    /// [`Runtime::run_approved`], recorded in the audit trail as
    /// `principal`'s.
    pub async fn run_approved_as(&self, id: JobId, principal: &str) -> Result<Job, RuntimeError> {
        self.decide(id, JobDecision::Run, DecisionBy::new(principal)).await
    }

    async fn decide(&self, id: JobId, decision: JobDecision, who: DecisionBy) -> Result<Job, RuntimeError> {
        if decision != JobDecision::Run {
            crate::job::Decision::check(&who.by, who.comment.as_deref()).map_err(RuntimeError::InvalidJob)?;
        }
        if let Some(key) = &who.key {
            IdempotencyKey::new(key, String::new()).map_err(RuntimeError::InvalidJob)?;
        }
        let settings = &self.inner.settings;
        let now = settings.clock.now();
        let remember = match who.remember {
            None => None,
            Some(_) if decision != JobDecision::Approve => {
                return Err(RuntimeError::InvalidJob("only an approval can be remembered".into()));
            }
            Some(RememberFor { ttl, any_submitter }) => {
                let job = self.get(id).await?;
                if job.plan_id.is_some() {
                    return Err(RuntimeError::InvalidJob(
                        "a plan's phases are decided through their plan: only a standalone job's approval can be \
                         remembered"
                            .into(),
                    ));
                }
                Some(Remember::new(ttl, any_submitter, now).map_err(RuntimeError::InvalidJob)?)
            }
        };
        let remembered = remember.as_ref().map(|r| r.rule.clone());
        // An apply phase's approval binds what it approves.
        let binding = match decision {
            JobDecision::Approve => self.apply_binding(id).await?,
            _ => None,
        };
        match (&who.digest, &binding) {
            (Some(_), _) if decision == JobDecision::Run => {}
            (Some(shown), Some((plan, now))) if shown != now => {
                return Err(RuntimeError::PlanChanged { plan: plan.clone(), shown: shown.clone(), now: now.clone() });
            }
            (Some(_), None) if decision == JobDecision::Approve => {
                return Err(RuntimeError::InvalidJob(
                    "a binding digest is sent only with the approval of a plan's apply phase".into(),
                ));
            }
            _ => {}
        }
        let params = JobDecideParams {
            id,
            decision,
            by: who.by.clone(),
            comment: who.comment.clone(),
            key: who.key.clone(),
            queue_ttl: settings.worker.queue_ttl,
            approval_ttl: settings.approval_ttl,
            remember,
            rule: None,
            binding: binding.map(|(_, digest)| digest),
            now,
        };
        let job = match self.inner.store.job_decide(params).await? {
            Ok(job) => job,
            Err(
                refusal @ (DecideRefusal::AlreadyDecided(_)
                | DecideRefusal::Terminal(_)
                | DecideRefusal::ApprovedBefore),
            ) => {
                // The same decision sent again under its key: as made.
                let job = self.get(id).await?;
                return if made_before(&job, decision, &who) { Ok(job) } else { Err(refused(id, &who.by, refusal)) };
            }
            Err(refusal) => return Err(refused(id, &who.by, refusal)),
        };
        if job.status == JobStatus::Queued {
            self.inner.queue.lock().unwrap_or_else(|e| e.into_inner()).queued += 1;
            self.nudge();
        }
        // The new rule approves the jobs already waiting that match it.
        // The approval has landed whatever happens to that: a store
        // failing now leaves the rest waiting for a person.
        if let Some(rule) = remembered
            && let Err(e) = self.cascade(&rule).await
        {
            tracing::warn!(rule, error = %e, "a new standing rule could not approve the jobs waiting like its own");
        }
        Ok(job)
    }

    /// Replace which targets of a registered `name@version` wait for
    /// approval (jobs already submitted keep their state).
    pub async fn plugin_require_approval(
        &self,
        name: PluginName,
        policy: ApprovalPolicy,
    ) -> Result<PluginInfo, RuntimeError> {
        policy.check().map_err(RuntimeError::InvalidJob)?;
        let shown = name.to_string();
        let info = self
            .inner
            .store
            .plugin_policy_set(PluginPolicyParams { name, policy, actor: self.actor(), now: self.now() })
            .await?
            .ok_or(RuntimeError::UnknownPlugin(shown))?;
        Ok(info)
    }
}

/// Whether `job` holds this decision, made under the same key by the same
/// approver (a resend: the first one's answer stands).
fn made_before(job: &Job, decision: JobDecision, who: &DecisionBy) -> bool {
    let verdict = match decision {
        JobDecision::Approve => Verdict::Approved,
        JobDecision::Reject => Verdict::Rejected,
        JobDecision::Run => return false,
    };
    let Some(approval) = job.approval.as_ref() else { return false };
    let same = |d: &Decision| d.verdict == verdict && d.key == who.key && d.by == who.by;
    who.key.is_some() && (approval.decision.iter().any(same) || approval.approvals.iter().any(same))
}

/// The error a refused decision by `by` earns.
fn refused(id: JobId, by: &str, refusal: DecideRefusal) -> RuntimeError {
    match refusal {
        DecideRefusal::OwnSubmission => RuntimeError::DecisionForbidden {
            id,
            by: by.to_owned(),
            why: "it submitted the job, and the job's policy separates duties: another principal with the `approve` \
                  role must approve it",
            code: "separation_of_duties",
        },
        DecideRefusal::ApprovedBefore => RuntimeError::DecisionForbidden {
            id,
            by: by.to_owned(),
            why: "it approved the job already, and each approver counts once toward the job's quorum: another \
                  principal must approve it",
            code: "distinct_approvers",
        },
        DecideRefusal::RuleInactive => RuntimeError::Undecidable {
            id,
            status: JobStatus::PendingApproval,
            why: "the standing rule deciding it was revoked or expired, or its author may no longer approve",
            code: "rule_inactive",
        },
        DecideRefusal::NotFound => RuntimeError::NotFound(id),
        DecideRefusal::Terminal(status) => RuntimeError::AlreadyTerminal { id, status },
        DecideRefusal::NotGated(status) => {
            RuntimeError::Undecidable { id, status, why: "it was never waiting for approval", code: "not_gated" }
        }
        DecideRefusal::AlreadyDecided(status) => RuntimeError::Undecidable {
            id,
            status,
            why: "it was already approved (to stop it, cancel it)",
            code: "already_decided",
        },
        DecideRefusal::NotApproved(status) => RuntimeError::Undecidable {
            id,
            status,
            why: "it must be approved before its run is triggered",
            code: "not_approved",
        },
        DecideRefusal::Expired => RuntimeError::Undecidable {
            id,
            status: JobStatus::Failed,
            why: "its wait for a decision (or, approved, for its run's trigger) ran out first: it failed `expired`",
            code: "expired",
        },
    }
}
