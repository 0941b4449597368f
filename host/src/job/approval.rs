//! Approval gates: which jobs wait for a person before they run, what a
//! gated job remembers of how it was asked for, and the decision made on
//! it.
//!
//! A job is gated by its submit (`gate: approval`) or by the operator's
//! policy on its plugin's registration ([`ApprovalPolicy`]); a submit can
//! add a gate but never remove one the policy sets. A gated job starts in
//! `pending_approval`; an approval queues it (or, when it was submitted
//! with `run_on_approve = false`, leaves it `approved` until a run is
//! triggered), a rejection cancels it with kind `rejected`, and an
//! approval that does not come within the approval TTL expires it.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::Target;
use crate::clock::Timestamp;

/// Longest approver name, in bytes.
pub const MAX_APPROVER_BYTES: usize = 128;
/// Longest decision comment, in bytes.
pub const MAX_COMMENT_BYTES: usize = 4096;
/// Most targets one policy names.
pub const MAX_POLICY_RULES: usize = 64;
/// Most distinct approvers a policy may require.
pub const MAX_QUORUM: u32 = 10;

/// Which of a plugin's targets need approval (`*` for every one,
/// `execute`, `apply`, `action:*` for every action, or `action:<name>`),
/// and who may give it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalPolicy {
    /// The gated targets, as written.
    #[serde(default)]
    pub require: Vec<TargetPattern>,
    /// The principal that submitted a gated job may not approve it
    /// (default `true`).
    #[serde(default = "yes")]
    pub separate_approver: bool,
    /// Distinct principals whose approvals a gated job takes (1 to 10,
    /// default 1).
    #[serde(default = "one")]
    #[schema(minimum = 1, maximum = 10)]
    pub quorum: u32,
}

impl Default for ApprovalPolicy {
    fn default() -> Self {
        let Duties { separate_approver, quorum } = Duties::default();
        ApprovalPolicy { require: Vec::new(), separate_approver, quorum }
    }
}

/// Who may approve a gated job: the rules of its plugin's policy when it
/// was gated (the defaults where no policy names them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Duties {
    /// The principal that submitted a job may not approve it (default
    /// `true`; a rejection is anyone's with the `approve` role).
    #[serde(default = "yes")]
    pub separate_approver: bool,
    /// Distinct principals whose approvals it takes (1 to 10, default 1):
    /// the job runs on the last of them; one rejection ends it.
    #[serde(default = "one")]
    #[schema(minimum = 1, maximum = 10)]
    pub quorum: u32,
}

fn yes() -> bool {
    true
}

fn one() -> u32 {
    1
}

impl Default for Duties {
    fn default() -> Self {
        Duties { separate_approver: true, quorum: 1 }
    }
}

impl Duties {
    /// A quorum of 1 to [`MAX_QUORUM`].
    pub fn check(&self) -> Result<(), String> {
        if !(1..=MAX_QUORUM).contains(&self.quorum) {
            return Err(format!("quorum {} is out of range: use 1 to {MAX_QUORUM}", self.quorum));
        }
        Ok(())
    }
}

impl ApprovalPolicy {
    /// Nothing is gated.
    pub fn is_none(&self) -> bool {
        self.require.is_empty()
    }

    /// Whether jobs of `target` need approval.
    pub fn gates(&self, target: &Target) -> bool {
        self.require.iter().any(|p| p.matches(target))
    }

    /// At most [`MAX_POLICY_RULES`] rules, and a quorum in range.
    pub fn check(&self) -> Result<(), String> {
        if self.require.len() > MAX_POLICY_RULES {
            return Err(format!(
                "an approval policy names {} targets, over the ceiling of {MAX_POLICY_RULES}",
                self.require.len()
            ));
        }
        self.duties().check()
    }

    /// Who may approve the jobs it gates.
    pub fn duties(&self) -> Duties {
        Duties { separate_approver: self.separate_approver, quorum: self.quorum }
    }
}

/// One rule of an [`ApprovalPolicy`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TargetPattern {
    /// `*`: every target.
    All,
    /// `action:*`: every action.
    AnyAction,
    /// One phase or action.
    Exactly(Target),
}

impl TargetPattern {
    /// Whether `target` is gated by this rule.
    pub fn matches(&self, target: &Target) -> bool {
        match self {
            TargetPattern::All => true,
            TargetPattern::AnyAction => matches!(target, Target::Action(_)),
            TargetPattern::Exactly(t) => t == target,
        }
    }
}

impl fmt::Display for TargetPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TargetPattern::All => f.write_str("*"),
            TargetPattern::AnyAction => f.write_str("action:*"),
            TargetPattern::Exactly(t) => write!(f, "{t}"),
        }
    }
}

impl FromStr for TargetPattern {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "*" | "all" => Ok(TargetPattern::All),
            "action:*" => Ok(TargetPattern::AnyAction),
            _ => s.parse().map(TargetPattern::Exactly).map_err(|e: super::ParseTargetError| {
                format!("{e} (or \"*\" for every target, \"action:*\" for every action)")
            }),
        }
    }
}

super::serde_as_text!(TargetPattern);

/// Who asked for a job's gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum GateSource {
    /// The submit asked for approval.
    Request,
    /// The plugin's approval policy requires it.
    Policy,
    /// Its plan's apply phase waits for approval (`apply: approval`).
    Plan,
}

/// How the submitter asked to hear of the outcome, stamped on a gated job
/// and used when it is triggered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ExecutionMode {
    /// Whoever triggers the run (the approval, or the run request) waits
    /// for the outcome, within its deadline from the trigger.
    Sync,
    /// The trigger answers at once; poll for the outcome.
    #[default]
    Async,
}

/// A gate as submitted: what [`super::NewJob::approval`] carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gate {
    /// Who asked for it.
    pub source: GateSource,
    /// Approval queues the job at once (`true`), or leaves it `approved`
    /// until a run is triggered (`false`: "trigger time rather than
    /// approve time").
    pub run_on_approve: bool,
    /// How the submitter asked to hear of the outcome.
    pub execution: ExecutionMode,
    /// A sync job's deadline, counted from the trigger rather than from
    /// the submit: its queue wait and its run both end by then.
    pub deadline: Option<Duration>,
    /// Who may approve it.
    pub duties: Duties,
}

/// The verdict of a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Approved: it may run.
    Approved,
    /// Rejected: it never runs.
    Rejected,
}

/// A decision on a gated job, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Decision {
    /// Approved or rejected.
    pub verdict: Verdict,
    /// Who decided, as they named themselves.
    pub by: String,
    /// Why, if they said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
    /// When.
    pub at: Timestamp,
    /// The idempotency key it was sent with, if any: the same decision
    /// sent again with it is answered as made, not refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Made by this standing rule (in its author's name, `by`), not by a
    /// person deciding now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// The standing rule this approval made ("Allow & Remember").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remembered: Option<String>,
    /// For the approval of a plan's apply phase: the binding digest of
    /// what it approved (plugin, grants, execute output, proposed
    /// effects); the apply phase runs only while the plan still has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binding: Option<String>,
}

impl Decision {
    /// The rules a decision keeps: an approver of 1 to
    /// [`MAX_APPROVER_BYTES`] printable characters and a comment of at most
    /// [`MAX_COMMENT_BYTES`].
    pub fn check(by: &str, comment: Option<&str>) -> Result<(), String> {
        if by.trim().is_empty() || by.len() > MAX_APPROVER_BYTES || by.chars().any(char::is_control) {
            return Err(format!("`by` must name who decides: 1 to {MAX_APPROVER_BYTES} printable characters"));
        }
        if let Some(comment) = comment
            && comment.len() > MAX_COMMENT_BYTES
        {
            return Err(format!("the comment is {} bytes, over the ceiling of {MAX_COMMENT_BYTES}", comment.len()));
        }
        Ok(())
    }
}

/// A gated job's approval record, stored with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Approval {
    /// Who asked for the gate.
    pub required_by: GateSource,
    /// Approval queues it at once, or waits for a run trigger.
    pub run_on_approve: bool,
    /// How the submitter asked to hear of the outcome.
    pub execution: ExecutionMode,
    /// A sync job's deadline from its trigger, milliseconds.
    #[serde(
        rename = "deadline_ms",
        default,
        with = "crate::job::millis::option",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<u64>)]
    pub deadline: Option<Duration>,
    /// Who may approve it (absent from records stored before duties
    /// were: the defaults).
    #[serde(flatten)]
    pub duties: Duties,
    /// Every approval given so far, oldest first: one per principal,
    /// until the quorum is reached.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approvals: Vec<Decision>,
    /// The decision, once made: a rejection, or the approval that reached
    /// the quorum.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decision>,
    /// When its run was triggered (by the approval, or by a run request).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub triggered_at: Option<Timestamp>,
}

impl From<Gate> for Approval {
    fn from(gate: Gate) -> Self {
        Approval {
            required_by: gate.source,
            run_on_approve: gate.run_on_approve,
            execution: gate.execution,
            deadline: gate.deadline,
            duties: gate.duties,
            approvals: Vec::new(),
            decision: None,
            triggered_at: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_what_they_name() {
        let deploy = Target::action("deploy").unwrap();
        let policy = |rules: &[&str]| ApprovalPolicy {
            require: rules.iter().map(|r| r.parse().unwrap()).collect(),
            ..ApprovalPolicy::default()
        };
        assert!(policy(&["*"]).gates(&Target::Execute));
        assert!(policy(&["apply"]).gates(&Target::Apply));
        assert!(!policy(&["apply"]).gates(&Target::Execute));
        assert!(policy(&["action:*"]).gates(&deploy));
        assert!(!policy(&["action:*"]).gates(&Target::Apply));
        assert!(policy(&["action:deploy"]).gates(&deploy));
        assert!(!policy(&["action:deploy"]).gates(&Target::action("read").unwrap()));
        assert!(!ApprovalPolicy::default().gates(&deploy));
        for text in ["*", "execute", "apply", "action:*", "action:deploy"] {
            assert_eq!(text.parse::<TargetPattern>().unwrap().to_string(), text);
        }
        assert!("plan".parse::<TargetPattern>().unwrap_err().contains("action:*"));
    }

    #[test]
    fn a_decision_names_who_made_it() {
        assert!(Decision::check("alice", Some("ok")).is_ok());
        assert!(Decision::check(" ", None).is_err());
        assert!(Decision::check("a\nb", None).is_err());
        assert!(Decision::check(&"a".repeat(MAX_APPROVER_BYTES + 1), None).is_err());
        assert!(Decision::check("a", Some(&"c".repeat(MAX_COMMENT_BYTES + 1))).is_err());
    }
}

/// Whether a job waits for a person before it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum GateChoice {
    /// It waits in `pending_approval` for `POST /v1/jobs/{id}/approve`.
    Approval,
    /// No gate: refused (403 `approval_required`) if the plugin's policy
    /// gates this target.
    None,
}
