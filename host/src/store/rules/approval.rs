//! The one decision on a gated job, shared by every backend: each reads
//! the job's row under its write lock, asks [`decide`] what changes, and
//! writes that (or reports the refusal). The SQL differs; the rules do not.

use std::time::Duration;

use crate::clock::Timestamp;
use crate::job::{Approval, ApprovalRule, Decision, ErrorKind, JobStatus, Verdict};
use crate::store::{AuditNote, DecideRefusal, JobDecideParams, JobDecision, StoreError};

/// The columns of a gated job that a decision reads.
pub(crate) struct GatedRow {
    /// Its state now.
    pub(crate) status: JobStatus,
    /// Its approval record (`None`: it was never gated).
    pub(crate) approval: Option<Approval>,
    /// Not claimed before this.
    pub(crate) run_after: Timestamp,
    /// When it expires if still waiting (for a decision or a trigger).
    pub(crate) expires_at: Option<Timestamp>,
    /// The principal that submitted it, if one did.
    pub(crate) submitted_by: Option<String>,
    /// Whether the standing rule deciding (`params.rule`), read in the same
    /// write, may still approve (see [`rule_in_force`]); `false` when none
    /// decides.
    pub(crate) rule_in_force: bool,
}

/// A standing rule's row, as read in the write of a decision it makes:
/// its author, expiry, revocation, and its author's roles (`None`: no
/// such principal stored).
pub(crate) struct RuleRow {
    pub(crate) author: String,
    pub(crate) expires_at: i64,
    pub(crate) revoked_at: Option<i64>,
    pub(crate) author_roles: Option<String>,
}

/// Whether a rule (`None`: not found) may approve at `now`: neither revoked
/// nor expired, and its author still holds `approve` (the bootstrap admin,
/// never stored, always does).
pub(crate) fn rule_in_force(row: Option<RuleRow>, now: Timestamp) -> Result<bool, StoreError> {
    let Some(row) = row else { return Ok(false) };
    if row.revoked_at.is_some() || now.unix_ms() >= row.expires_at {
        return Ok(false);
    }
    if row.author == crate::access::BOOTSTRAP {
        return Ok(true);
    }
    let Some(roles) = row.author_roles else { return Ok(false) };
    let roles = crate::store::rules::codec::roles_of(&row.author, &roles)?;
    Ok(roles.contains(&crate::access::Role::Approve) || roles.contains(&crate::access::Role::Admin))
}

/// The columns of a [`Change`], as every backend binds them.
#[derive(Debug, Default)]
pub(crate) struct ChangeColumns {
    pub(crate) run_after: Option<i64>,
    pub(crate) expires_at: Option<i64>,
    pub(crate) deadline_at: Option<i64>,
    pub(crate) finished_at: Option<i64>,
    pub(crate) error_kind: Option<&'static str>,
    pub(crate) error_message: Option<String>,
}

/// What a decision writes.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Change {
    /// Queue it: the run is triggered now.
    Queue {
        /// The record with the decision (if one was made now) and the
        /// trigger.
        approval: Approval,
        /// Not claimed before this: its `run_at`, if still ahead.
        run_after: Timestamp,
        /// When it expires if still queued.
        expires_at: Timestamp,
        /// A sync job's deadline, counted from now.
        deadline_at: Option<Timestamp>,
    },
    /// An approval short of the quorum: recorded; it still waits.
    Count {
        /// The record with the approval added.
        approval: Approval,
    },
    /// Approved; it waits for its run to be triggered until `expires_at`.
    Approve {
        /// The record with the decision.
        approval: Approval,
        /// When it expires if no run is triggered.
        expires_at: Timestamp,
    },
    /// Rejected: cancelled with kind `rejected` and this message.
    Reject {
        /// The record with the decision.
        approval: Approval,
        /// `"Rejected: …"`.
        message: String,
        /// When it ended.
        at: Timestamp,
    },
    /// Too late: its approval TTL (or, approved, the wait for its trigger)
    /// ran out before this decision. It fails `expired` now, as the sweep
    /// would have failed it, and the decision is refused.
    Expire {
        /// The record, unchanged.
        approval: Approval,
        /// `"Expired: …"`, the sweep's words.
        message: &'static str,
        /// When it ended.
        at: Timestamp,
    },
}

impl Change {
    /// The state it leaves the job in.
    pub(crate) fn status(&self) -> JobStatus {
        match self {
            Change::Queue { .. } => JobStatus::Queued,
            Change::Count { .. } => JobStatus::PendingApproval,
            Change::Approve { .. } => JobStatus::Approved,
            Change::Reject { .. } => JobStatus::Cancelled,
            Change::Expire { .. } => JobStatus::Failed,
        }
    }

    /// Why the decision is refused although this change is written.
    pub(crate) fn refusal(&self) -> Option<DecideRefusal> {
        match self {
            Change::Expire { .. } => Some(DecideRefusal::Expired),
            _ => None,
        }
    }

    /// The columns it writes besides status and record, as milliseconds
    /// and text: `run_after` and `expires_at` (`None`: unchanged),
    /// `deadline_at`, `finished_at`, `error_kind`, `error_message`.
    pub(crate) fn columns(&self) -> ChangeColumns {
        let ms = |t: &Timestamp| t.unix_ms();
        match self {
            Change::Queue { run_after, expires_at, deadline_at, .. } => ChangeColumns {
                run_after: Some(ms(run_after)),
                expires_at: Some(ms(expires_at)),
                deadline_at: deadline_at.as_ref().map(ms),
                ..ChangeColumns::default()
            },
            Change::Count { .. } => ChangeColumns::default(),
            Change::Approve { expires_at, .. } => {
                ChangeColumns { expires_at: Some(ms(expires_at)), ..ChangeColumns::default() }
            }
            Change::Reject { message, at, .. } => ChangeColumns {
                finished_at: Some(at.unix_ms()),
                error_kind: Some(ErrorKind::Rejected.as_str()),
                error_message: Some(message.clone()),
                ..ChangeColumns::default()
            },
            Change::Expire { message, at, .. } => ChangeColumns {
                finished_at: Some(at.unix_ms()),
                error_kind: Some(ErrorKind::Expired.as_str()),
                error_message: Some((*message).to_owned()),
                ..ChangeColumns::default()
            },
        }
    }

    /// The audit trail's row for it: who did what to job `params.id`,
    /// and the state it left.
    pub(crate) fn audit_note(&self, params: &JobDecideParams) -> AuditNote {
        let action = match (self, params.decision) {
            (Change::Expire { .. }, _) => "job.expire",
            (_, JobDecision::Approve) => "job.approve",
            (_, JobDecision::Reject) => "job.reject",
            (_, JobDecision::Run) => "job.run",
        };
        let approval = self.approval();
        let mut detail = serde_json::json!({
            "status": self.status(),
            "comment": params.comment,
            "approvals": approval.approvals.len(),
            "quorum": approval.duties.quorum,
        });
        if let Some(rule) = &params.rule {
            detail["rule"] = rule.as_str().into();
        }
        if let Some(remember) = params.remember.as_ref().filter(|_| self.approves(params)) {
            detail["remembered"] = remember.rule.as_str().into();
        }
        let principal = (!params.by.is_empty()).then(|| params.by.clone());
        AuditNote { principal, action, target: params.id.to_string(), detail }
    }

    /// Whether it records an approval (counted, queued, or approved to
    /// wait for its trigger): what a rule is used for, or made of.
    pub(crate) fn approves(&self, params: &JobDecideParams) -> bool {
        params.decision == JobDecision::Approve
            && matches!(self, Change::Queue { .. } | Change::Count { .. } | Change::Approve { .. })
    }

    /// The approval record it stores.
    pub(crate) fn approval(&self) -> &Approval {
        match self {
            Change::Queue { approval, .. }
            | Change::Count { approval }
            | Change::Approve { approval, .. }
            | Change::Reject { approval, .. }
            | Change::Expire { approval, .. } => approval,
        }
    }
}

/// The columns a stored rule is read from: the rule as made (JSON), and
/// what changes after: its revocation and its use count.
pub(crate) const RULE_COLUMNS: &str = "rule_json, revoked_at, revoked_by, uses";

/// A rule from its [`RULE_COLUMNS`].
pub(crate) fn rule_of(
    json: &str,
    revoked_at: Option<i64>,
    revoked_by: Option<String>,
    uses: i64,
) -> Result<ApprovalRule, StoreError> {
    let mut rule: ApprovalRule = serde_json::from_str(json)
        .map_err(|e| crate::store::rules::codec::corrupt("an approval rule", e.to_string()))?;
    rule.revoked_at = revoked_at.map(Timestamp::from_unix_ms);
    rule.revoked_by = revoked_by;
    rule.uses = u64::try_from(uses).unwrap_or(0);
    Ok(rule)
}

/// The audit trail's row for a rule made by an approval that remembers.
pub(crate) fn rule_created(rule: &ApprovalRule) -> AuditNote {
    let detail = serde_json::json!({
        "from_job": rule.from_job,
        "plugin": rule.plugin,
        "target": rule.target,
        "submitter": rule.submitter,
        "input_sha256": rule.input_sha256,
        "expires_at": rule.expires_at,
    });
    AuditNote { principal: Some(rule.author.clone()), action: "rule.create", target: rule.id.clone(), detail }
}

/// The audit trail's row for a revocation.
pub(crate) fn rule_revoked(id: &str, actor: Option<String>) -> AuditNote {
    AuditNote { principal: actor, action: "rule.revoke", target: id.to_owned(), detail: serde_json::json!({}) }
}

/// What `params` does to a job in `row`, or why it may not.
pub(crate) fn decide(row: GatedRow, params: &JobDecideParams) -> Result<Change, DecideRefusal> {
    let Some(mut approval) = row.approval else {
        return Err(if row.status.is_terminal() {
            DecideRefusal::Terminal(row.status)
        } else {
            DecideRefusal::NotGated(row.status)
        });
    };
    // Never stamped before the decision it follows (see `cancel_waiting`).
    let now = latest_stamp(&approval, params.now);
    let decision = |verdict| Decision {
        verdict,
        by: params.by.clone(),
        comment: params.comment.clone(),
        at: now,
        key: params.key.clone(),
        rule: params.rule.clone(),
        remembered: params.remember.as_ref().filter(|_| verdict == Verdict::Approved).map(|r| r.rule.clone()),
        binding: params.binding.clone().filter(|_| verdict == Verdict::Approved),
    };
    match (&params.decision, row.status) {
        (_, status) if status.is_terminal() => Err(DecideRefusal::Terminal(status)),
        // Read in the same write as the decision: no sweep need have run.
        (_, status @ (JobStatus::PendingApproval | JobStatus::Approved))
            if row.expires_at.is_some_and(|at| at <= now) =>
        {
            Ok(Change::Expire { approval, message: expiry_message(status), at: now })
        }
        (JobDecision::Approve, JobStatus::PendingApproval) => {
            if params.rule.is_some() && !row.rule_in_force {
                return Err(DecideRefusal::RuleInactive);
            }
            if approval.duties.separate_approver && row.submitted_by.as_deref() == Some(params.by.as_str()) {
                return Err(DecideRefusal::OwnSubmission);
            }
            if approval.approvals.iter().any(|given| given.by == params.by) {
                return Err(DecideRefusal::ApprovedBefore);
            }
            approval.approvals.push(decision(Verdict::Approved));
            if approval.approvals.len() < approval.duties.quorum as usize {
                return Ok(Change::Count { approval });
            }
            approval.decision = Some(decision(Verdict::Approved));
            if approval.run_on_approve {
                Ok(queue(approval, row.run_after, params.queue_ttl, now))
            } else {
                Ok(Change::Approve { approval, expires_at: now.plus(params.approval_ttl) })
            }
        }
        (JobDecision::Reject, JobStatus::PendingApproval) => {
            approval.decision = Some(decision(Verdict::Rejected));
            let message = match &params.comment {
                Some(comment) => format!("Rejected: by {}: {comment}", params.by),
                None => format!("Rejected: by {}", params.by),
            };
            Ok(Change::Reject { approval, message, at: now })
        }
        (JobDecision::Run, JobStatus::Approved) => Ok(queue(approval, row.run_after, params.queue_ttl, now)),
        (JobDecision::Run, JobStatus::PendingApproval) => Err(DecideRefusal::NotApproved(row.status)),
        (_, status) => Err(DecideRefusal::AlreadyDecided(status)),
    }
}

/// What a cancel of a job still waiting (queued, for a decision, or
/// approved, for its trigger) writes: its stamp and its message. The
/// stamp is never before the decision or trigger the row already holds,
/// though the caller read its clock before it waited for the row's lock
/// (a busy replica, a clock behind another's): a cancel that followed an
/// approval is recorded after it.
pub(crate) fn cancel_waiting(
    status: JobStatus,
    approval: Option<&Approval>,
    now: Timestamp,
) -> (Timestamp, &'static str) {
    let at = approval.map_or(now, |a| latest_stamp(a, now));
    let message = match status {
        JobStatus::PendingApproval => "Cancelled: cancelled while waiting for approval",
        JobStatus::Approved => "Cancelled: cancelled after its approval, before its run was triggered",
        _ => "Cancelled: cancelled while queued",
    };
    (at, message)
}

/// `now`, or the latest decision or trigger on `approval` if later.
fn latest_stamp(approval: &Approval, now: Timestamp) -> Timestamp {
    [approval.decision.as_ref().map(|d| d.at), approval.triggered_at].into_iter().flatten().fold(now, Timestamp::max)
}

/// Why a job that waited for a decision or a trigger expired (the sweep
/// says the same).
pub(crate) fn expiry_message(status: JobStatus) -> &'static str {
    if status == JobStatus::Approved {
        "Expired: approved, but its run was never triggered"
    } else {
        "Expired: no decision came within its approval TTL"
    }
}

/// The run is triggered now: queued, due at its `run_at` if that is still
/// ahead, its queue TTL and any sync deadline counted from now.
fn queue(mut approval: Approval, run_after: Timestamp, queue_ttl: Duration, now: Timestamp) -> Change {
    approval.triggered_at = Some(now);
    let run_after = run_after.max(now);
    let deadline_at = approval.deadline.map(|deadline| now.plus(deadline));
    let expires_at = deadline_at.map_or(run_after.plus(queue_ttl), |d| run_after.plus(queue_ttl).min(d));
    Change::Queue { approval, run_after, expires_at, deadline_at }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{Duties, ExecutionMode, GateSource, JobId};

    fn gated(run_on_approve: bool) -> Approval {
        Approval {
            required_by: GateSource::Request,
            run_on_approve,
            execution: ExecutionMode::Sync,
            deadline: Some(Duration::from_secs(5)),
            duties: Duties::default(),
            approvals: Vec::new(),
            decision: None,
            triggered_at: None,
        }
    }

    fn params(decision: JobDecision, now: Timestamp) -> JobDecideParams {
        JobDecideParams {
            id: JobId::new(now),
            decision,
            by: "alice".into(),
            comment: Some("looks right".into()),
            key: None,
            queue_ttl: Duration::from_secs(60),
            approval_ttl: Duration::from_secs(600),
            remember: None,
            rule: None,
            binding: None,
            now,
        }
    }

    fn row(status: JobStatus, approval: Option<Approval>) -> GatedRow {
        GatedRow {
            status,
            approval,
            run_after: Timestamp::from_unix_ms(0),
            expires_at: None,
            submitted_by: Some("sam".into()),
            rule_in_force: false,
        }
    }

    #[test]
    fn approval_queues_with_the_sync_deadline_counted_from_the_trigger() {
        let now = Timestamp::from_unix_ms(1_000_000);
        let change = decide(row(JobStatus::PendingApproval, Some(gated(true))), &params(JobDecision::Approve, now));
        let Ok(Change::Queue { approval, run_after, expires_at, deadline_at }) = change else { panic!("{change:?}") };
        assert_eq!(run_after, now);
        assert_eq!(deadline_at, Some(now.plus(Duration::from_secs(5))));
        assert_eq!(expires_at, now.plus(Duration::from_secs(5)), "the deadline caps the queue TTL");
        assert_eq!(approval.triggered_at, Some(now));
        assert_eq!(approval.decision.unwrap().by, "alice");
    }

    #[test]
    fn without_run_on_approve_the_run_waits_for_its_trigger() {
        let now = Timestamp::from_unix_ms(1_000_000);
        let approved =
            decide(row(JobStatus::PendingApproval, Some(gated(false))), &params(JobDecision::Approve, now)).unwrap();
        assert_eq!(approved.status(), JobStatus::Approved);
        assert_eq!(approved.approval().triggered_at, None);
        let later = now.plus(Duration::from_secs(30));
        let run = decide(row(JobStatus::Approved, Some(approved.approval().clone())), &params(JobDecision::Run, later))
            .unwrap();
        assert_eq!(run.status(), JobStatus::Queued);
        assert_eq!(run.approval().triggered_at, Some(later));
        assert_eq!(run.approval().decision.as_ref().unwrap().at, now, "the decision keeps its own time");
    }

    #[test]
    fn refusals_name_the_state() {
        let now = Timestamp::from_unix_ms(1);
        let refuse = |status, approval, decision| decide(row(status, approval), &params(decision, now)).unwrap_err();
        assert_eq!(refuse(JobStatus::Queued, None, JobDecision::Approve), DecideRefusal::NotGated(JobStatus::Queued));
        assert_eq!(
            refuse(JobStatus::Cancelled, Some(gated(true)), JobDecision::Approve),
            DecideRefusal::Terminal(JobStatus::Cancelled)
        );
        assert_eq!(
            refuse(JobStatus::Queued, Some(gated(true)), JobDecision::Approve),
            DecideRefusal::AlreadyDecided(JobStatus::Queued)
        );
        assert_eq!(
            refuse(JobStatus::Approved, Some(gated(false)), JobDecision::Reject),
            DecideRefusal::AlreadyDecided(JobStatus::Approved)
        );
        assert_eq!(
            refuse(JobStatus::PendingApproval, Some(gated(false)), JobDecision::Run),
            DecideRefusal::NotApproved(JobStatus::PendingApproval)
        );
        assert_eq!(
            refuse(JobStatus::Running, Some(gated(true)), JobDecision::Run),
            DecideRefusal::AlreadyDecided(JobStatus::Running)
        );
    }

    #[test]
    fn a_rejection_names_who_and_why() {
        let now = Timestamp::from_unix_ms(1);
        let change =
            decide(row(JobStatus::PendingApproval, Some(gated(true))), &params(JobDecision::Reject, now)).unwrap();
        let Change::Reject { message, approval, .. } = change else { panic!() };
        assert_eq!(message, "Rejected: by alice: looks right");
        assert_eq!(approval.decision.unwrap().verdict, Verdict::Rejected);
    }

    #[test]
    fn a_decision_at_or_past_the_expiry_expires_the_job_instead() {
        let now = Timestamp::from_unix_ms(1_000_000);
        let mut waiting = row(JobStatus::PendingApproval, Some(gated(true)));
        waiting.expires_at = Some(now);
        let change = decide(waiting, &params(JobDecision::Approve, now)).unwrap();
        assert_eq!(change.status(), JobStatus::Failed);
        assert_eq!(change.refusal(), Some(DecideRefusal::Expired));
        assert_eq!(change.columns().error_kind, Some("expired"));
        assert!(change.approval().decision.is_none());
        let mut early = row(JobStatus::PendingApproval, Some(gated(true)));
        early.expires_at = Some(now.plus(Duration::from_millis(1)));
        assert_eq!(decide(early, &params(JobDecision::Approve, now)).unwrap().status(), JobStatus::Queued);
    }

    #[test]
    fn a_trigger_or_cancel_read_before_the_approval_is_stamped_after_it() {
        let approved_at = Timestamp::from_unix_ms(2_000_000);
        let mut approval = gated(false);
        approval.decision = Some(Decision {
            verdict: Verdict::Approved,
            by: "a".into(),
            comment: None,
            at: approved_at,
            key: None,
            rule: None,
            remembered: None,
            binding: None,
        });
        let early = Timestamp::from_unix_ms(1_000_000);
        let trigger = decide(row(JobStatus::Approved, Some(approval.clone())), &params(JobDecision::Run, early));
        assert_eq!(trigger.unwrap().approval().triggered_at, Some(approved_at));
        let (at, message) = cancel_waiting(JobStatus::Approved, Some(&approval), early);
        assert_eq!(at, approved_at);
        assert!(message.contains("after its approval"), "{message}");
    }

    fn by(who: &str, decision: JobDecision, now: Timestamp) -> JobDecideParams {
        JobDecideParams { by: who.into(), ..params(decision, now) }
    }

    #[test]
    fn the_submitter_may_not_approve_where_duties_are_separated_but_may_reject() {
        let now = Timestamp::from_unix_ms(1);
        let own = decide(row(JobStatus::PendingApproval, Some(gated(true))), &by("sam", JobDecision::Approve, now));
        assert_eq!(own.unwrap_err(), DecideRefusal::OwnSubmission);
        let reject = decide(row(JobStatus::PendingApproval, Some(gated(true))), &by("sam", JobDecision::Reject, now));
        assert_eq!(reject.unwrap().status(), JobStatus::Cancelled);
        let mut relaxed = gated(true);
        relaxed.duties.separate_approver = false;
        let own = decide(row(JobStatus::PendingApproval, Some(relaxed)), &by("sam", JobDecision::Approve, now));
        assert_eq!(own.unwrap().status(), JobStatus::Queued);
        // A job no principal submitted has no submitter to keep out.
        let mut embedded = row(JobStatus::PendingApproval, Some(gated(true)));
        embedded.submitted_by = None;
        assert_eq!(decide(embedded, &by("sam", JobDecision::Approve, now)).unwrap().status(), JobStatus::Queued);
    }

    #[test]
    fn a_quorum_takes_that_many_distinct_approvers_and_runs_on_the_last() {
        let now = Timestamp::from_unix_ms(1);
        let mut two = gated(true);
        two.duties.quorum = 2;
        let first =
            decide(row(JobStatus::PendingApproval, Some(two)), &by("alice", JobDecision::Approve, now)).unwrap();
        assert_eq!(first.status(), JobStatus::PendingApproval);
        assert_eq!(first.columns().expires_at, None, "its approval TTL still counts from the submit");
        let counted = first.approval().clone();
        assert_eq!((counted.approvals.len(), counted.decision.is_none()), (1, true));
        let again =
            decide(row(JobStatus::PendingApproval, Some(counted.clone())), &by("alice", JobDecision::Approve, now));
        assert_eq!(again.unwrap_err(), DecideRefusal::ApprovedBefore);
        let later = now.plus(Duration::from_secs(1));
        let second =
            decide(row(JobStatus::PendingApproval, Some(counted.clone())), &by("bob", JobDecision::Approve, later))
                .unwrap();
        assert_eq!(second.status(), JobStatus::Queued);
        let approved = second.approval();
        let approvers: Vec<&str> = approved.approvals.iter().map(|d| d.by.as_str()).collect();
        assert_eq!(approvers, ["alice", "bob"]);
        assert_eq!(approved.decision.as_ref().map(|d| (d.by.as_str(), d.at)), Some(("bob", later)));
        // One rejection ends it, whatever approvals it has.
        let rejected =
            decide(row(JobStatus::PendingApproval, Some(counted)), &by("carol", JobDecision::Reject, later)).unwrap();
        assert_eq!(rejected.status(), JobStatus::Cancelled);
    }
}
