//! What the runtime reports: health, the workers sharing the store, the
//! ceilings, the metrics text.

use std::time::Duration;

use serde::Serialize;

use super::{PoolReport, Runtime, RuntimeError, Supervision};
use crate::clock::Timestamp;
use crate::job::{Backoff, Counts, JobId, MAX_ATTEMPTS_CEILING, WorkerRecord, WorkerState};
use crate::worker::PoolState;

/// The health report: this process's worker and the store's queue depth.
#[derive(Debug, Clone, Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct Health {
    /// This process's worker id.
    pub worker_id: String,
    /// Pool state.
    pub state: PoolState,
    /// Job slots.
    pub max_workers: usize,
    /// Jobs running in this process now.
    pub running_here: usize,
    /// Jobs that succeeded here.
    pub processed: u64,
    /// Jobs that failed here.
    pub failed: u64,
    /// Jobs cancelled here.
    pub cancelled: u64,
    /// Results dropped here because a lease was lost.
    pub leases_lost: u64,
    /// Waiters here that gave up before their job ended (a sync HTTP client
    /// that disconnected, a wait that timed out); the jobs went on.
    pub waits_abandoned: u64,
    /// Last claim, renewal or completion here (UTC).
    pub last_heartbeat: Option<Timestamp>,
    /// Queue depth by state, read with `workers`.
    pub counts: Counts,
    /// A summary of the workers sharing the store:
    /// `Async workers: enabled, max_workers=4, poll_interval=1.0s`.
    pub summary: String,
    /// Every worker registered in the store (this process's too, unless it
    /// runs none), read with `counts`.
    pub workers: Vec<WorkerView>,
    /// With the pool in a supervised process (`leash serve`'s default):
    /// that process, its restarts and how the last one ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supervision: Option<Supervision>,
    /// Paused plugins, by name: their queued jobs wait unclaimed.
    #[serde(default)]
    pub paused_plugins: Vec<crate::store::PluginPause>,
}

/// A registered worker as health and `GET /v1/workers` show it.
#[derive(Debug, Clone, Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct WorkerView {
    /// The worker as it last reported itself.
    #[serde(flatten)]
    pub worker: WorkerRecord,
    /// It has not reported for three lease TTLs without saying it stopped:
    /// its process died or hangs.
    pub stale: bool,
    /// The jobs it holds now.
    pub running_jobs: Vec<JobId>,
}

/// Every worker sharing the store, with the queue depth, from one read.
#[derive(Debug, Clone, Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct Workers {
    /// `Async workers: enabled, max_workers=N, poll_interval=Xs` over the
    /// live workers (their slots summed, the shortest poll), or
    /// `Async workers: disabled (no live worker)`.
    pub summary: String,
    /// Oldest first.
    pub workers: Vec<WorkerView>,
    /// Queue depth by state.
    pub counts: Counts,
}

/// The limits a submit may ask for.
#[derive(Debug, Clone, Copy, Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct Ceilings {
    /// Longest wall-clock limit, milliseconds.
    #[serde(rename = "max_timeout_ms", with = "crate::job::millis")]
    #[schema(value_type = u64)]
    pub max_timeout: Duration,
    /// Largest memory limit, bytes.
    pub max_memory_bytes: u64,
    /// Largest output limit, bytes.
    pub max_output_bytes: u64,
    /// The wall-clock limit of a job that sets none, milliseconds.
    #[serde(rename = "default_timeout_ms", with = "crate::job::millis")]
    #[schema(value_type = u64)]
    pub default_timeout: Duration,
    /// Longest queue wait a job may ask for, milliseconds.
    #[serde(rename = "max_queue_ttl_ms", with = "crate::job::millis")]
    #[schema(value_type = u64)]
    pub max_queue_ttl: Duration,
    /// Most attempts a job may ask for.
    pub max_attempts: u32,
    /// The retry backoff of a job that sets none.
    pub backoff: Backoff,
}

impl Runtime {
    /// The settings limits are checked against.
    pub fn ceilings(&self) -> Ceilings {
        let s = &self.inner.settings;
        Ceilings {
            max_timeout: s.worker.max_timeout,
            max_memory_bytes: s.sandbox.memory_ceiling_bytes,
            max_output_bytes: s.worker.max_output_bytes,
            default_timeout: s.default_timeout,
            max_queue_ttl: s.max_queue_ttl,
            max_attempts: MAX_ATTEMPTS_CEILING,
            backoff: s.default_backoff,
        }
    }

    /// Every worker sharing the store and the queue depth, from one read.
    /// A worker that has not reported for three lease TTLs (this runtime's)
    /// without stopping is shown `stale`.
    pub async fn workers(&self) -> Result<Workers, RuntimeError> {
        let snapshot = self.inner.store.workers_snapshot().await?;
        let stale_before = self.now().minus(self.inner.settings.worker.lease_ttl * 3);
        let workers: Vec<WorkerView> = snapshot
            .workers
            .into_iter()
            .map(|worker| WorkerView {
                stale: worker.state != WorkerState::Stopped && worker.last_heartbeat < stale_before,
                running_jobs: snapshot
                    .running_jobs
                    .iter()
                    .filter(|(_, holder)| *holder == worker.worker_id)
                    .map(|(id, _)| *id)
                    .collect(),
                worker,
            })
            .collect();
        let live: Vec<&WorkerRecord> =
            workers.iter().filter(|w| !w.stale && w.worker.state != WorkerState::Stopped).map(|w| &w.worker).collect();
        let summary = match live.iter().map(|w| w.poll_interval).min() {
            None => "Async workers: disabled (no live worker)".to_owned(),
            Some(poll) => format!(
                "Async workers: enabled, max_workers={}, poll_interval={:.1}s",
                live.iter().map(|w| u64::from(w.slots)).sum::<u64>(),
                poll.as_secs_f64()
            ),
        };
        Ok(Workers { summary, workers, counts: snapshot.counts })
    }

    /// The health report. With the pool in another process, its figures
    /// are those it reports (a pool that does not answer in time shows
    /// `stopped` with no slots) and `supervision` says how it is kept.
    pub async fn health(&self) -> Result<Health, RuntimeError> {
        let pool = &self.inner.pool;
        let Workers { summary, workers, counts } = self.workers().await?;
        let (report, supervision) = match &self.inner.remote {
            Some(remote) => {
                let report = remote.report().await.unwrap_or_else(|| PoolReport {
                    worker_id: String::new(),
                    state: PoolState::Stopped,
                    max_workers: 0,
                    running: 0,
                    processed: 0,
                    failed: 0,
                    cancelled: 0,
                    leases_lost: 0,
                    last_heartbeat: None,
                    metrics: String::new(),
                });
                (report, Some(remote.supervision()))
            }
            None => (self.pool_report(), None),
        };
        Ok(Health {
            worker_id: report.worker_id,
            state: report.state,
            max_workers: report.max_workers,
            running_here: report.running,
            processed: report.processed,
            failed: report.failed,
            cancelled: report.cancelled,
            leases_lost: report.leases_lost,
            waits_abandoned: self.inner.metrics.waits_abandoned.get(),
            last_heartbeat: report.last_heartbeat.or_else(|| crate::worker::last_heartbeat(&pool.stats)),
            counts,
            summary,
            workers,
            supervision,
            paused_plugins: self.inner.store.plugin_pauses().await?,
        })
    }

    /// The Prometheus text exposition, with the queue depth and pool gauges
    /// read now (from the pool's process, when it runs in another).
    pub async fn metrics_text(&self) -> Result<String, RuntimeError> {
        let counts = self.inner.store.counts_snapshot().await?;
        let oldest = self.inner.store.oldest_queued_due().await?;
        let metrics = &self.inner.metrics;
        metrics.set_counts(&counts);
        let now = self.now().unix_ms();
        metrics.set_oldest_queued(
            oldest.map(|due| Duration::from_millis(u64::try_from(now - due.unix_ms()).unwrap_or(0))),
        );
        let pool = match &self.inner.remote {
            Some(remote) => remote.report().await.map(|r| r.metrics).unwrap_or_default(),
            None => {
                self.set_pool_gauges();
                metrics.encode_pool()
            }
        };
        Ok(metrics.encode_with_pool(&pool))
    }

    /// Refresh the gauges of this process's pool.
    pub(super) fn set_pool_gauges(&self) {
        let pool = &self.inner.pool;
        let metrics = &self.inner.metrics;
        let running = pool.running_count();
        metrics.running.set(running as i64);
        metrics.pool_size.set(pool.config.max_workers as i64);
        metrics.free_slots.set(pool.config.max_workers.saturating_sub(running) as i64);
    }
}
