//! Paused plugins: a plugin name whose queued jobs no claim takes until it
//! is resumed. Running jobs finish; new jobs queue; the pause is stored,
//! so it holds across restarts and on every process sharing the store.

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::store::StoreError;

/// A paused plugin name, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PluginPause {
    /// The plugin name (every version of it).
    pub name: String,
    /// When it was paused.
    pub paused_at: Timestamp,
    /// Who paused it (absent: an embedder's own call).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_by: Option<String>,
    /// Why, as the operator said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Parameters of [`Pauses::plugin_pause`].
#[derive(Debug, Clone)]
pub struct PauseParams {
    /// The plugin name.
    pub name: String,
    /// Who pauses it (audited).
    pub actor: Option<String>,
    /// Why.
    pub reason: Option<String>,
    /// Now.
    pub now: Timestamp,
}

/// Parameters of [`Pauses::plugin_resume`].
#[derive(Debug, Clone)]
pub struct ResumeParams {
    /// The plugin name.
    pub name: String,
    /// Who resumes it (audited).
    pub actor: Option<String>,
    /// Now.
    pub now: Timestamp,
}

/// Longest reason kept with a pause, in bytes.
pub const MAX_PAUSE_REASON_BYTES: usize = 1024;

/// Pausing and resuming plugins by name.
#[async_trait::async_trait]
pub trait Pauses: Send + Sync + std::fmt::Debug {
    /// Pause a plugin name: from this commit on no claim takes its queued
    /// jobs. Pausing a paused name keeps the first pause (its time, who
    /// and why) and answers it. Audited.
    async fn plugin_pause(&self, params: PauseParams) -> Result<PluginPause, StoreError>;

    /// Resume a plugin name: its queued jobs are claimable again, in their
    /// usual order. `false`: it was not paused. Audited.
    async fn plugin_resume(&self, params: ResumeParams) -> Result<bool, StoreError>;

    /// Every paused plugin name, by name.
    async fn plugin_pauses(&self) -> Result<Vec<PluginPause>, StoreError>;
}
