//! The worker vocabulary: a registered pool and where it is in its life.

use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;

/// Where a registered worker pool is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum WorkerState {
    /// Claiming and running jobs.
    Running,
    /// Shutting down: claims no more, stops and releases its jobs.
    Draining,
    /// Stopped cleanly.
    Stopped,
}

impl WorkerState {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerState::Running => "running",
            WorkerState::Draining => "draining",
            WorkerState::Stopped => "stopped",
        }
    }
}

impl FromStr for WorkerState {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [WorkerState::Running, WorkerState::Draining, WorkerState::Stopped]
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| format!("unknown worker state {s:?}"))
    }
}

/// A worker pool (a `leash worker`, a `leash serve`, an embedder's runtime)
/// as it registers itself in the store, refreshed every poll interval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WorkerRecord {
    /// `worker-<8 hex>`.
    pub worker_id: String,
    /// The machine's host name.
    pub host: String,
    /// The process id.
    pub pid: u32,
    /// The leash version it runs.
    pub version: String,
    /// Job slots (`max_workers`).
    pub slots: u32,
    /// Jobs running in it now.
    pub running: u32,
    /// Its state as it last reported it.
    pub state: WorkerState,
    /// Its fallback poll interval, milliseconds.
    #[serde(rename = "poll_interval_ms", with = "crate::job::millis")]
    #[schema(value_type = u64)]
    pub poll_interval: Duration,
    /// Jobs that succeeded in it.
    pub processed: u64,
    /// Jobs that failed in it.
    pub failed: u64,
    /// Jobs cancelled in it.
    pub cancelled: u64,
    /// When it started.
    pub started_at: Timestamp,
    /// Its last report.
    pub last_heartbeat: Timestamp,
}
