//! Background sweeps over the store: reclaim expired leases, expire queued
//! and gated jobs that waited too long, create the apply jobs of plans
//! whose execute job succeeded (the process that ran it does so at once;
//! this catches a process that died in between), delete terminal jobs and
//! silent or stopped workers past retention, and events past theirs.
//!
//! [`Sweeper::run_once`] takes `now` so tests drive time; [`Sweeper::run`]
//! calls it every interval until told to stop.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::clock::{Clock, Timestamp};
use crate::store::{
    JobsDeleteParams, JobsExpireParams, LeaseReclaimParams, PlansAdvanceParams, ReclaimReport, StoreError, Sweeps,
};

/// Sweep settings.
#[derive(Debug, Clone)]
pub struct SweepConfig {
    /// Time between sweeps.
    pub interval: Duration,
    /// How long a requeued job may wait again.
    pub queue_ttl: Duration,
    /// How long terminal jobs are kept.
    pub job_ttl: Duration,
    /// How long events are kept (a client can resume this far back).
    pub event_ttl: Duration,
    /// How long audit rows are kept (`None`: for ever).
    pub audit_ttl: Option<Duration>,
}

/// What one sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Expired leases handled.
    pub reclaimed: ReclaimReport,
    /// Queued jobs failed as `expired`.
    pub expired: u64,
    /// Apply jobs created for plans whose execute job succeeded.
    pub plans_advanced: u64,
    /// Terminal jobs deleted.
    pub deleted: u64,
    /// Stopped or silent workers deleted from the registry.
    pub workers_deleted: u64,
}

/// Runs the three sweeps.
#[derive(Debug, Clone)]
pub struct Sweeper {
    store: Arc<dyn Sweeps>,
    clock: Arc<dyn Clock>,
    config: SweepConfig,
    metrics: Option<Arc<crate::metrics::Metrics>>,
}

impl Sweeper {
    /// A sweeper over `store`.
    pub fn new(store: Arc<dyn Sweeps>, clock: Arc<dyn Clock>, config: SweepConfig) -> Self {
        Sweeper { store, clock, config, metrics: None }
    }

    /// Count the jobs its reclaims quarantine in `metrics`
    /// (`leash_jobs_finished_total{status="failed",error_kind="host_crash"}`).
    pub fn with_metrics(mut self, metrics: Arc<crate::metrics::Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// One pass of every sweep at `now`.
    pub async fn run_once(&self, now: Timestamp) -> Result<SweepReport, StoreError> {
        let reclaimed =
            self.store.lease_reclaim_expired(LeaseReclaimParams { now, queue_ttl: self.config.queue_ttl }).await?;
        let expired = self.store.jobs_expire_queued(JobsExpireParams { now }).await?;
        let plans_advanced = self.store.plans_advance(PlansAdvanceParams { plan_id: None, now }).await?.len() as u64;
        let cutoff = now.minus(self.config.job_ttl);
        let events_before = now.minus(self.config.event_ttl);
        let audit_before = self.config.audit_ttl.map(|ttl| now.minus(ttl));
        let deleted = self
            .store
            .jobs_delete_expired(JobsDeleteParams { finished_before: cutoff, events_before, audit_before })
            .await?;
        let workers_deleted = self.store.workers_delete_stale(cutoff).await?;
        if reclaimed.requeued + reclaimed.failed > 0 {
            tracing::warn!(
                requeued = reclaimed.requeued,
                failed = reclaimed.failed,
                quarantined = reclaimed.quarantined,
                "reclaimed jobs whose lease ran out (their workers died or stalled)"
            );
        }
        if let Some(metrics) = &self.metrics {
            metrics.jobs_quarantined(reclaimed.quarantined);
        }
        if expired > 0 {
            tracing::info!(expired, "queued jobs expired");
        }
        Ok(SweepReport { reclaimed, expired, plans_advanced, deleted, workers_deleted })
    }

    /// Sweep every interval until `stop` turns true. A failed sweep is
    /// retried at the next interval.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        loop {
            if let Err(e) = self.run_once(self.clock.now()).await {
                tracing::warn!(error = %e, "a sweep failed; it runs again at the next interval");
            }
            tokio::select! {
                _ = tokio::time::sleep(self.config.interval) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }
}
