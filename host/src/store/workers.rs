//! The worker registry: each pool's record and the snapshot health
//! reads.

use crate::job::{Counts, JobId, WorkerRecord};
use crate::store::StoreError;

/// Every registered worker, the running jobs and the queue depth, read in
/// one transaction.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkersSnapshot {
    /// Every worker row, oldest first.
    pub workers: Vec<WorkerRecord>,
    /// Each running job and the worker that holds it.
    pub running_jobs: Vec<(JobId, String)>,
    /// Job counts by state.
    pub counts: Counts,
}

/// The worker registry: each pool's heartbeat row and the snapshot that
/// health reads.
#[async_trait::async_trait]
pub trait Workers: Send + Sync + std::fmt::Debug {
    /// Register a worker or refresh its row (everything but `started_at`,
    /// which the first report sets).
    async fn worker_beat(&self, worker: WorkerRecord) -> Result<(), StoreError>;

    /// Every worker, the running jobs with their workers, and the job
    /// counts, from one consistent read.
    async fn workers_snapshot(&self) -> Result<WorkersSnapshot, StoreError>;
}
