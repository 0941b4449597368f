//! The audit trail: an append-only record of who changed what, written in
//! the same transaction as the change, each row chained to the one before
//! by a hash (see `rules/audit.rs`), so a row edited, removed or inserted
//! by hand breaks the chain where it was touched.

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::store::StoreError;

/// What a write records in the trail: the store adds the time, the
/// sequence number and the hashes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditNote {
    /// Who made the change (`None`: the embedding code, with no principal
    /// behind it).
    pub principal: Option<String>,
    /// What was done, `noun.verb`: `job.submit`, `job.approve`,
    /// `plugin.policy`, `token.revoke`, …
    pub action: &'static str,
    /// What it was done to: a job id, `name@version`, a principal, a token id.
    pub target: String,
    /// The change itself, as JSON: what it set, and where it replaced
    /// something, what was there before (`before`, `after`).
    pub detail: serde_json::Value,
}

/// One row of the trail, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AuditRecord {
    /// Its place in the chain, from 1, without gaps.
    pub seq: i64,
    /// When the change was written.
    #[schema(value_type = String)]
    pub at: Timestamp,
    /// Who made it (absent: the embedding code).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
    /// What was done.
    pub action: String,
    /// What it was done to.
    pub target: String,
    /// The change, as the JSON text that was hashed.
    pub detail: String,
    /// The hash of the row before (64 zeros for the first).
    pub prev_hash: String,
    /// SHA-256 of this row's fields and `prev_hash`, hex.
    pub hash: String,
}

/// Parameters of [`Audit::audit_list`]: oldest first, keyset-paged.
#[derive(Debug, Clone, Default)]
pub struct AuditListParams {
    /// Only rows after this sequence number.
    pub after: Option<i64>,
    /// Only rows by this principal.
    pub principal: Option<String>,
    /// Only rows of this action.
    pub action: Option<String>,
    /// Only rows about this target.
    pub target: Option<String>,
    /// Most rows to return (at least 1).
    pub limit: u32,
}

/// The trail's head: the last row's sequence number and hash, kept apart
/// from the rows so that rows cut from the end are seen too.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AuditHead {
    /// The last row's sequence number (0: no row yet).
    pub seq: i64,
    /// Its hash.
    pub hash: String,
    /// Rows up to this one were deleted by audit retention (0: none was);
    /// the first row kept follows it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pruned_seq: i64,
    /// The hash of the last row deleted by retention, which the first row
    /// kept names as its `prev_hash`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pruned_hash: Option<String>,
}

impl AuditHead {
    /// A head at row `seq` with `hash`, nothing pruned.
    pub fn new(seq: i64, hash: String) -> AuditHead {
        AuditHead { seq, hash, pruned_seq: 0, pruned_hash: None }
    }
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// Reading the audit trail (rows are written by the changes they record).
#[async_trait::async_trait]
pub trait Audit: Send + Sync + std::fmt::Debug {
    /// Rows in sequence order, filtered.
    async fn audit_list(&self, params: AuditListParams) -> Result<Vec<AuditRecord>, StoreError>;

    /// The head the last append wrote.
    async fn audit_head(&self) -> Result<AuditHead, StoreError>;
}
