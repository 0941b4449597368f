//! The audit trail through the embedding API: read it, and check its chain.

use crate::runtime::{Runtime, RuntimeError};
use crate::store::{AuditHead, AuditListParams, AuditRecord, ChainBreak, verify_chain};

/// Rows [`Runtime::audit_verify`] reads at a time.
const VERIFY_PAGE: u32 = 1_000;

impl Runtime {
    /// Rows of the audit trail, oldest first, filtered and paged by
    /// `after` (the last sequence number of the page before).
    pub async fn audit(&self, params: AuditListParams) -> Result<Vec<AuditRecord>, RuntimeError> {
        Ok(self.inner.store.audit_list(params).await?)
    }

    /// The trail's head: its last row's sequence number and hash. Record it
    /// somewhere the database's writers cannot reach, and a later
    /// [`Runtime::audit_verify`] shows whether the rows up to it were kept.
    pub async fn audit_head(&self) -> Result<AuditHead, RuntimeError> {
        Ok(self.inner.store.audit_head().await?)
    }

    /// Walk the whole chain: every row must follow the one before, name its
    /// hash and hash to what it says, and the last must be the head. The
    /// inner answer is the head verified, or where the chain breaks.
    pub async fn audit_verify(&self) -> Result<Result<AuditHead, ChainBreak>, RuntimeError> {
        let head = self.audit_head().await?;
        verify_chain(&head, |after| {
            self.audit(AuditListParams { after: Some(after), limit: VERIFY_PAGE, ..AuditListParams::default() })
        })
        .await
    }
}
