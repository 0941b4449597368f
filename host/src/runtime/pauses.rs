//! Pausing a plugin by name: its queued jobs wait, unclaimed, until it is
//! resumed; its running jobs finish. The pause is stored, so it holds
//! across restarts and on every process sharing the store.

use crate::job::PluginRef;
use crate::runtime::{Runtime, RuntimeError};
use crate::store::{MAX_PAUSE_REASON_BYTES, PauseParams, PluginPause, ResumeParams};

impl Runtime {
    /// Pause the registered plugin `name` (every version): no process
    /// claims its queued jobs until [`Runtime::plugin_resume`]; new jobs of
    /// it queue and wait. Pausing a paused plugin keeps the first pause and
    /// answers it. Audited as `plugin.pause`.
    pub async fn plugin_pause(&self, name: &str, reason: Option<String>) -> Result<PluginPause, RuntimeError> {
        // A name no registration has is refused: its pause would hold nothing.
        self.plugin(PluginRef::Name(name.to_owned())).await?;
        if let Some(reason) = &reason
            && reason.len() > MAX_PAUSE_REASON_BYTES
        {
            return Err(RuntimeError::InvalidJob(format!(
                "a pause's reason is {} bytes, over the ceiling of {MAX_PAUSE_REASON_BYTES}",
                reason.len()
            )));
        }
        let params = PauseParams { name: name.to_owned(), actor: self.actor(), reason, now: self.now() };
        Ok(self.inner.store.plugin_pause(params).await?)
    }

    /// Resume the paused plugin `name`: its queued jobs are claimed again,
    /// in their usual order. `false`: it was not paused. Audited as
    /// `plugin.resume`.
    pub async fn plugin_resume(&self, name: &str) -> Result<bool, RuntimeError> {
        self.plugin(PluginRef::Name(name.to_owned())).await?;
        let params = ResumeParams { name: name.to_owned(), actor: self.actor(), now: self.now() };
        let resumed = self.inner.store.plugin_resume(params).await?;
        if resumed {
            self.nudge();
        }
        Ok(resumed)
    }

    /// Every paused plugin, by name.
    pub async fn plugin_pauses(&self) -> Result<Vec<PluginPause>, RuntimeError> {
        Ok(self.inner.store.plugin_pauses().await?)
    }
}
