//! Standing approval rules through the embedding API ("Allow & Remember",
//! see [`crate::job::rule`]): an approval that remembers makes a rule,
//! which then approves the jobs already waiting that match it and each
//! matching job that arrives while it stands. Every decision a rule makes
//! goes through the store's one decision write, so it keeps the job's
//! duties (a rule never approves its author's own submission where duties
//! are separated), counts once toward a quorum, and is refused once the
//! rule is revoked, expired, or its author may no longer approve.

use std::collections::HashMap;

use crate::job::{ApprovalRule, Digest, Job, JobId, JobStatus, PluginRef, Target};
use crate::runtime::{Runtime, RuntimeError};
use crate::store::{DecideRefusal, JobDecideParams, JobDecision, JobListParams, RuleListParams, RuleRevokeParams};

/// Waiting jobs read per page while a new rule looks for its matches.
const CASCADE_PAGE: u32 = 200;
/// Rules read per (plugin, target) when jobs arrive: more than any
/// approver makes for one action in practice; past it, the newest count.
const RULES_PER_TARGET: u32 = 100;

impl Runtime {
    /// Standing rules, newest first.
    pub async fn rules(&self, params: RuleListParams) -> Result<Vec<ApprovalRule>, RuntimeError> {
        Ok(self.inner.store.rule_list(params).await?)
    }

    /// One standing rule.
    pub async fn rule(&self, id: &str) -> Result<ApprovalRule, RuntimeError> {
        self.inner.store.rule_get(id.to_owned()).await?.ok_or_else(|| RuntimeError::UnknownRule(id.to_owned()))
    }

    /// Revoke a standing rule: it approves nothing from now on. The jobs it
    /// approved stay approved (cancel them to stop them).
    pub async fn rule_revoke(&self, id: &str) -> Result<ApprovalRule, RuntimeError> {
        let params = RuleRevokeParams { id: id.to_owned(), actor: self.actor(), now: self.now() };
        self.inner.store.rule_revoke(params).await?.ok_or_else(|| RuntimeError::UnknownRule(id.to_owned()))
    }

    /// Let rule `id` approve the jobs already waiting that match it; the
    /// ids it approved.
    pub(super) async fn cascade(&self, id: &str) -> Result<Vec<JobId>, RuntimeError> {
        let rule = self.rule(id).await?;
        let mut approved = Vec::new();
        let mut before = None;
        loop {
            let params = JobListParams {
                status: vec![JobStatus::PendingApproval],
                plugin: Some(PluginRef::Digest(rule.plugin)),
                before,
                limit: CASCADE_PAGE,
                ..JobListParams::default()
            };
            let page = self.inner.store.job_list(params).await?;
            before = page.last().map(|j| j.id);
            for listed in &page {
                // List rows carry no input: read the job whole.
                let Some(job) = self.inner.store.job_get(listed.id).await? else { continue };
                if !rule.matches(&job) {
                    continue;
                }
                match self.decide_by_rule(job.id, &rule).await? {
                    Ok(decided) => approved.push(decided.id),
                    Err(DecideRefusal::RuleInactive) => return Ok(approved),
                    Err(_) => {}
                }
            }
            if page.len() < CASCADE_PAGE as usize {
                return Ok(approved);
            }
        }
    }

    /// Jobs just stored, each approved on arrival by the newest standing
    /// rule that matches it (if any), as stored after. The jobs are stored
    /// whatever happens here: a store failing now leaves a job waiting for
    /// a person, as if no rule matched.
    pub(super) async fn approve_on_arrival(&self, jobs: Vec<Job>) -> Vec<Job> {
        let waiting = |j: &Job| j.status == JobStatus::PendingApproval && j.plan_id.is_none();
        if !jobs.iter().any(waiting) {
            return jobs;
        }
        let now = self.now();
        let mut standing: HashMap<(Digest, Target), Vec<ApprovalRule>> = HashMap::new();
        let mut out = Vec::with_capacity(jobs.len());
        for job in jobs {
            if !waiting(&job) {
                out.push(job);
                continue;
            }
            let key = (job.plugin, job.target.clone());
            if !standing.contains_key(&key) {
                let params = RuleListParams {
                    plugin: Some(job.plugin),
                    target: Some(job.target.clone()),
                    active_at: Some(now),
                    limit: RULES_PER_TARGET,
                    ..RuleListParams::default()
                };
                let rules = self.inner.store.rule_list(params).await.unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "standing rules could not be read: arriving jobs wait for a person");
                    Vec::new()
                });
                standing.insert(key.clone(), rules);
            }
            let mut decided = None;
            for rule in standing[&key].iter().filter(|r| r.matches(&job)) {
                match self.decide_by_rule(job.id, rule).await {
                    Ok(Ok(job)) => {
                        decided = Some(job);
                        break;
                    }
                    Ok(Err(_refused)) => {}
                    Err(e) => {
                        tracing::warn!(rule = rule.id, error = %e, "a standing rule could not approve an arriving job");
                        break;
                    }
                }
            }
            out.push(decided.unwrap_or(job));
        }
        out
    }

    /// Approve job `id` by `rule`, in its author's name.
    async fn decide_by_rule(&self, id: JobId, rule: &ApprovalRule) -> Result<Result<Job, DecideRefusal>, RuntimeError> {
        let settings = &self.inner.settings;
        let params = JobDecideParams {
            id,
            decision: JobDecision::Approve,
            by: rule.author.clone(),
            comment: Some(format!("approved by standing rule {}", rule.id)),
            key: None,
            queue_ttl: settings.worker.queue_ttl,
            approval_ttl: settings.approval_ttl,
            remember: None,
            rule: Some(rule.id.clone()),
            binding: None,
            now: settings.clock.now(),
        };
        let decided = self.inner.store.job_decide(params).await?;
        if let Ok(job) = &decided {
            self.count_queued(std::slice::from_ref(job));
        }
        Ok(decided)
    }
}
