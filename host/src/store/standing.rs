//! Standing approval rules ("Allow & Remember", see [`crate::job::rule`]):
//! made inside the approval that remembers (see
//! [`crate::store::JobDecideParams::remember`]), used inside the decisions
//! they make (see [`crate::store::JobDecideParams::rule`]), listed, read
//! and revoked here.

use crate::clock::Timestamp;
use crate::job::{ApprovalRule, Digest, Target};
use crate::store::StoreError;

/// Parameters of [`StandingRules::rule_list`].
#[derive(Debug, Clone, Default)]
pub struct RuleListParams {
    /// Only rules approving this plugin's bytes.
    pub plugin: Option<Digest>,
    /// Only rules approving this target.
    pub target: Option<Target>,
    /// Only rules this principal made.
    pub author: Option<String>,
    /// Only rules that still approve at this time (not revoked, not
    /// expired).
    pub active_at: Option<Timestamp>,
    /// Most rules to return (at least 1), newest first.
    pub limit: u32,
}

/// Parameters of [`StandingRules::rule_revoke`].
#[derive(Debug, Clone)]
pub struct RuleRevokeParams {
    /// The rule.
    pub id: String,
    /// Who revokes it (audited).
    pub actor: Option<String>,
    /// Now.
    pub now: Timestamp,
}

/// Standing approval rules as stored.
#[async_trait::async_trait]
pub trait StandingRules: Send + Sync + std::fmt::Debug {
    /// One rule by id.
    async fn rule_get(&self, id: String) -> Result<Option<ApprovalRule>, StoreError>;

    /// Rules matching the filters, newest first.
    async fn rule_list(&self, params: RuleListParams) -> Result<Vec<ApprovalRule>, StoreError>;

    /// Revoke a rule: from now on it approves nothing (a decision it is
    /// making at the same moment either committed before or is refused).
    /// Revoking a revoked rule changes nothing. Returns the rule as it is
    /// now; `None`: no such rule.
    async fn rule_revoke(&self, params: RuleRevokeParams) -> Result<Option<ApprovalRule>, StoreError>;
}
