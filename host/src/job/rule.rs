//! Standing approvals ("Allow & Remember"): an approver who approves a
//! gated job may let the same approval stand for jobs exactly like it, for
//! a while. A rule names what it approves as narrowly as the approver saw
//! it: the plugin's bytes (by digest), the target, the grants the job was
//! pinned to, the input's SHA-256, and the submitter (or any submitter).
//! A job that matches is approved on arrival, and jobs already waiting
//! that match are approved when the rule is made; each such decision is
//! recorded as the rule's, made in its author's name.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::clock::Timestamp;
use crate::job::{Digest, Grants, Job, JobId, PluginName, Target};

/// The shortest time a rule may stand.
pub const MIN_RULE_TTL: Duration = Duration::from_secs(60);
/// The longest time a rule may stand: 90 days.
pub const MAX_RULE_TTL: Duration = Duration::from_secs(90 * 24 * 3600);

/// A standing approval, as stored and shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ApprovalRule {
    /// Its id.
    pub id: String,
    /// The principal whose approval made it; its decisions are recorded in
    /// this name, and it decides nothing once this principal may no longer
    /// approve (removed, or its `approve` role taken away).
    pub author: String,
    /// When it was made.
    pub created_at: Timestamp,
    /// When it stops approving.
    pub expires_at: Timestamp,
    /// When it was revoked, if it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<Timestamp>,
    /// Who revoked it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_by: Option<String>,
    /// The job whose approval made it.
    #[schema(value_type = String)]
    pub from_job: JobId,
    /// The plugin's bytes it approves, by digest.
    #[schema(value_type = String)]
    pub plugin: Digest,
    /// The name the first job was submitted under (shown only: the digest
    /// is what matches).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub plugin_name: Option<PluginName>,
    /// The target it approves.
    #[schema(value_type = String)]
    pub target: Target,
    /// The grants a matching job must be pinned to, exactly.
    pub grants: Grants,
    /// The principal whose submits it approves; `None`: any principal's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitter: Option<String>,
    /// The SHA-256 (hex) a matching job's input must have.
    pub input_sha256: String,
    /// Jobs it has approved.
    pub uses: u64,
}

/// What an approval that remembers asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remember {
    /// The new rule's id.
    pub rule: String,
    /// When it stops approving.
    pub expires_at: Timestamp,
    /// Approve any principal's matching submits, not only this job's
    /// submitter's.
    pub any_submitter: bool,
}

impl Remember {
    /// A new rule standing for `ttl` from `now`, checked against
    /// [`MIN_RULE_TTL`] and [`MAX_RULE_TTL`].
    pub fn new(ttl: Duration, any_submitter: bool, now: Timestamp) -> Result<Remember, String> {
        if !(MIN_RULE_TTL..=MAX_RULE_TTL).contains(&ttl) {
            return Err(format!(
                "a remembered approval stands from {} s to {} days; asked for {} s",
                MIN_RULE_TTL.as_secs(),
                MAX_RULE_TTL.as_secs() / 86_400,
                ttl.as_secs()
            ));
        }
        let rule = format!("rule_{}", JobId::new(now).to_string().to_lowercase());
        Ok(Remember { rule, expires_at: now.plus(ttl), any_submitter })
    }
}

impl ApprovalRule {
    /// The rule `remember` makes of `job`'s approval by `author` at `now`.
    pub fn of_job(job: &Job, author: &str, remember: &Remember, now: Timestamp) -> ApprovalRule {
        ApprovalRule {
            id: remember.rule.clone(),
            author: author.to_owned(),
            created_at: now,
            expires_at: remember.expires_at,
            revoked_at: None,
            revoked_by: None,
            from_job: job.id,
            plugin: job.plugin,
            plugin_name: job.plugin_name.clone(),
            target: job.target.clone(),
            grants: job.grants.clone(),
            submitter: if remember.any_submitter { None } else { job.submitted_by.clone() },
            input_sha256: input_sha256(&job.input),
            uses: 0,
        }
    }

    /// Whether it still approves at `now` (its author's role aside, which
    /// the store checks when it decides).
    pub fn active(&self, now: Timestamp) -> bool {
        self.revoked_at.is_none() && now < self.expires_at
    }

    /// Whether it approves `job`: a standalone job (plan phases are decided
    /// through their plan) waiting for approval, of the same bytes, target,
    /// grants, input and (unless any) submitter.
    pub fn matches(&self, job: &Job) -> bool {
        job.plan_id.is_none()
            && job.status == crate::job::JobStatus::PendingApproval
            && job.plugin == self.plugin
            && job.target == self.target
            && job.grants == self.grants
            && self.submitter.as_ref().is_none_or(|s| job.submitted_by.as_ref() == Some(s))
            && input_sha256(&job.input) == self.input_sha256
    }
}

/// The SHA-256 of a job's input, hex.
pub fn input_sha256(input: &[u8]) -> String {
    hex::encode(Sha256::digest(input))
}
