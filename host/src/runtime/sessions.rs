//! Dashboard sessions ended before their expiry.

use crate::clock::Timestamp;
use crate::runtime::{Runtime, RuntimeError};

impl Runtime {
    /// End the dashboard session `id` (signed out) before `expires_at`:
    /// every process sharing the store refuses it from now on.
    pub async fn session_end(&self, id: String, expires_at: Timestamp) -> Result<(), RuntimeError> {
        Ok(self.inner.store.session_end(id, expires_at, self.now()).await?)
    }

    /// Whether the dashboard session `id` was ended.
    pub async fn session_ended(&self, id: String) -> Result<bool, RuntimeError> {
        Ok(self.inner.store.session_ended(id).await?)
    }
}
