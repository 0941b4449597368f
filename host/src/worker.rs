//! The worker pool: one per process, `max_workers` job slots.
//!
//! The claim loop waits for a free slot, claims as many queued jobs as
//! there are free slots in one store call, and runs each on its own task:
//! load the plugin (compiled once per process), run it in the sandbox while
//! a [`LeaseKeeper`] renews the lease, then record the outcome — fenced by
//! the lease token, so a worker that lost its lease records nothing.
//!
//! An enqueue in this process wakes the claim loop at once; `poll_interval`
//! is the fallback for jobs submitted by other processes.
//!
//! Shutdown: stop claiming, ask every guest to stop, stop by force what
//! remains after the shutdown grace, and release the leases (running →
//! queued, no attempt spent), all within the shutdown budget.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{Notify, Semaphore, broadcast, watch};
use tracing::Instrument as _;

use crate::clock::{Clock, Timestamp};
use crate::job::{Digest, ErrorKind, JobId, JobLogs, JobProgress, JobStatus, LogLine};
use crate::lease::{LeaseKeeper, LeaseWatch};
use crate::metrics::Metrics;
use crate::sandbox::{LogLevel, Outcome, Plugin, Progress, RunLimits, RunObserver, RunRequest, Sandbox, StopHandle};
use crate::store::{
    Finish, JobClaimParams, JobFinishParams, JobProgressParams, JobReleaseParams, JobRetryParams, JobStore, Lease,
    WorkerRecord, WorkerState,
};

/// Longest a busy pool waits to gather free slots into one claim.
const CLAIM_COALESCE_WINDOW: Duration = Duration::from_millis(1);
/// Progress reports are written to the store at most this often per job.
const PROGRESS_WRITE_INTERVAL: Duration = Duration::from_millis(250);

/// Pool settings.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Job slots.
    pub max_workers: usize,
    /// How often to look for jobs from other processes.
    pub poll_interval: Duration,
    /// Lease length; renewed every third of it.
    pub lease_ttl: Duration,
    /// Time a cancelled guest has to stop before it is stopped by force.
    pub cancel_grace: Duration,
    /// Everything shutdown does must fit in this.
    pub shutdown_budget: Duration,
    /// How long a released job may wait in the queue again.
    pub queue_ttl: Duration,
    /// Ceiling on a job's wall-clock limit: a stored job asking for more
    /// runs with this (the ceiling in force at claim, not at submit).
    pub max_timeout: Duration,
    /// Ceiling on a job's output limit, applied at claim the same way.
    pub max_output_bytes: u64,
    /// Run guests on their own threads (a tokio runtime of their own)
    /// rather than beside the HTTP server, lease renewals and sweeps: a
    /// busy pool cannot starve the control plane.
    pub isolate_guests: bool,
    /// With isolation, how much lower the guest threads' CPU priority is
    /// (a `nice` increment, 0–19; 0 keeps the process's own).
    pub guest_nice: i32,
    /// Forward guest log records at or above this level to the host log
    /// (target `leash::guest`, in the job's span) when each attempt ends;
    /// `None` forwards none.
    pub guest_log_level: Option<tracing::Level>,
}

/// A fresh random worker id, `worker-<8 hex>`: never a host name.
pub fn new_worker_id() -> String {
    let n = ulid::Ulid::generate().random() as u32;
    format!("worker-{n:08x}")
}

/// How a job this process ran ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Completion {
    /// The job.
    pub id: JobId,
    /// Its terminal status.
    pub status: JobStatus,
    /// Why it did not succeed.
    pub error_kind: Option<ErrorKind>,
    /// Fuel the attempt used.
    pub fuel_used: u64,
}

/// Receives every completion this process records. A subscriber that
/// panics is isolated: the others still run, and so does the pool.
pub type Subscriber = Box<dyn Fn(&Completion) + Send + Sync>;

/// A job this process claimed is about to run its guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobStarted {
    /// The job.
    pub id: JobId,
    /// Its attempt number, counting from 1.
    pub attempt: u32,
}

/// Called when a job this process claimed is about to run its guest.
pub type StartSubscriber = Box<dyn Fn(&JobStarted) + Send + Sync>;

/// Lifecycle of the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PoolState {
    /// Claiming and running jobs.
    Running,
    /// Shutting down.
    Stopping,
    /// Stopped.
    Stopped,
}

#[derive(Debug, Clone)]
struct RunningJob {
    stop: StopHandle,
    cancelled: Arc<AtomicBool>,
}

/// Counters for the health report.
#[derive(Debug, Default)]
pub struct PoolStats {
    /// Jobs that succeeded here.
    pub processed: AtomicU64,
    /// Jobs that failed here.
    pub failed: AtomicU64,
    /// Jobs cancelled here.
    pub cancelled: AtomicU64,
    /// Results dropped because the lease was lost.
    pub leases_lost: AtomicU64,
    /// Jobs claimed here.
    pub claimed: AtomicU64,
    /// Last lease renewal or claim, ms since the epoch (0: none yet).
    pub last_heartbeat_ms: AtomicU64,
}

/// The parts every job task shares.
pub(crate) struct Pool {
    pub(crate) store: Arc<dyn JobStore>,
    pub(crate) sandbox: Arc<Sandbox>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) config: WorkerConfig,
    pub(crate) worker_id: String,
    pub(crate) wake: Notify,
    pub(crate) stats: PoolStats,
    pub(crate) state: watch::Sender<PoolState>,
    pub(crate) completions: broadcast::Sender<Completion>,
    pub(crate) metrics: Arc<Metrics>,
    running: Mutex<HashMap<JobId, RunningJob>>,
    plugins: Mutex<HashMap<Digest, Plugin>>,
    subscribers: Mutex<Vec<Arc<Subscriber>>>,
    start_subscribers: Mutex<Vec<Arc<StartSubscriber>>>,
    shutting_down: AtomicBool,
    idle: Notify,
    started_at: Timestamp,
    guests: Option<GuestRuntime>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("worker_id", &self.worker_id).field("config", &self.config).finish_non_exhaustive()
    }
}

impl Pool {
    pub(crate) fn new(
        store: Arc<dyn JobStore>,
        sandbox: Arc<Sandbox>,
        clock: Arc<dyn Clock>,
        config: WorkerConfig,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        Arc::new(Pool {
            store,
            sandbox,
            clock: clock.clone(),
            worker_id: new_worker_id(),
            wake: Notify::new(),
            stats: PoolStats::default(),
            state: watch::Sender::new(PoolState::Running),
            completions: broadcast::channel(1024).0,
            metrics,
            running: Mutex::default(),
            plugins: Mutex::default(),
            subscribers: Mutex::default(),
            start_subscribers: Mutex::default(),
            shutting_down: AtomicBool::new(false),
            idle: Notify::new(),
            started_at: clock.now(),
            guests: if config.isolate_guests {
                GuestRuntime::start(config.max_workers, config.guest_nice)
            } else {
                None
            },
            config,
        })
    }

    pub(crate) fn subscribe(&self, subscriber: Subscriber) {
        self.subscribers.lock().unwrap_or_else(|e| e.into_inner()).push(Arc::new(subscriber));
    }

    pub(crate) fn subscribe_starts(&self, subscriber: StartSubscriber) {
        self.start_subscribers.lock().unwrap_or_else(|e| e.into_inner()).push(Arc::new(subscriber));
    }

    fn notify_start(&self, start: &JobStarted) {
        let subscribers: Vec<Arc<StartSubscriber>> =
            self.start_subscribers.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for subscriber in subscribers {
            if let Err(panic) = std::panic::catch_unwind(AssertUnwindSafe(|| subscriber(start))) {
                tracing::error!(panic = panic_text(&panic), "a start subscriber panicked; the job runs on");
            }
        }
    }

    /// This pool as the worker registry shows it, now.
    pub(crate) fn record(&self) -> WorkerRecord {
        WorkerRecord {
            worker_id: self.worker_id.clone(),
            host: host_name(),
            pid: std::process::id(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            slots: u32::try_from(self.config.max_workers).unwrap_or(u32::MAX),
            running: u32::try_from(self.running_count()).unwrap_or(u32::MAX),
            state: match *self.state.borrow() {
                PoolState::Running => WorkerState::Running,
                PoolState::Stopping => WorkerState::Draining,
                PoolState::Stopped => WorkerState::Stopped,
            },
            poll_interval_ms: self.config.poll_interval.as_millis() as u64,
            processed: self.stats.processed.load(Ordering::Relaxed),
            failed: self.stats.failed.load(Ordering::Relaxed),
            cancelled: self.stats.cancelled.load(Ordering::Relaxed),
            started_at: self.started_at,
            last_heartbeat: self.clock.now(),
        }
    }

    /// Report this pool to the registry every poll interval (and at every
    /// state change) until it has stopped; the last report says `stopped`.
    pub(crate) async fn register_loop(self: Arc<Self>) {
        let mut state = self.state.subscribe();
        loop {
            // A failed report is retried at the next interval; the row
            // only shows stale if several fail.
            state.borrow_and_update();
            let record = self.record();
            let stopped = record.state == WorkerState::Stopped;
            let _ = self.store.worker_beat(record).await;
            if stopped {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(self.config.poll_interval) => {}
                _ = state.changed() => {}
            }
        }
    }

    pub(crate) fn running_count(&self) -> usize {
        self.running.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Stop a job this process runs, if it does (a cancel observed locally
    /// does not wait for the next lease renewal).
    pub(crate) fn cancel_local(&self, id: JobId) -> bool {
        let running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        match running.get(&id) {
            Some(job) => {
                job.cancelled.store(true, Ordering::SeqCst);
                job.stop.request();
                true
            }
            None => false,
        }
    }

    /// Claim and run jobs until shutdown begins.
    pub(crate) async fn claim_loop(self: Arc<Self>) {
        let slots = Arc::new(Semaphore::new(self.config.max_workers));
        let mut state = self.state.subscribe();
        loop {
            let first = tokio::select! {
                permit = slots.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
                _ = state.wait_for(|s| *s != PoolState::Running) => return,
            };
            let mut permits = vec![first];
            while let Ok(permit) = slots.clone().try_acquire_owned() {
                permits.push(permit);
            }
            // A busy pool frees a slot at a time. Gather a few before claiming,
            // briefly, so one store round trip claims many jobs instead of one:
            // under load the claim loop, not the store, would set the pace.
            let enough = (self.config.max_workers / 4).max(1);
            if permits.len() < enough {
                let window = tokio::time::sleep(CLAIM_COALESCE_WINDOW);
                tokio::pin!(window);
                while permits.len() < enough {
                    tokio::select! {
                        permit = slots.clone().acquire_owned() => permits.push(permit.expect("never closed")),
                        _ = &mut window => break,
                    }
                }
            }
            let wanted = permits.len();
            let claim_started = std::time::Instant::now();
            let claimed = self.store.job_claim(self.claim_params(wanted as u32)).await.unwrap_or_default();
            self.metrics.claim_seconds.observe(claim_started.elapsed().as_secs_f64());
            let got = claimed.len();
            self.stats.claimed.fetch_add(got as u64, Ordering::Relaxed);
            if got > 0 {
                self.stats.last_heartbeat_ms.store(self.clock.now().unix_ms() as u64, Ordering::Relaxed);
            }
            for (lease, permit) in claimed.into_iter().zip(permits.drain(..)) {
                // Registered before the task starts, so shutdown sees it.
                let running = self.register(lease.job.id);
                let pool = self.clone();
                tokio::spawn(async move {
                    // A finish may claim the slot's next job in the same
                    // round trip; the slot runs it at once.
                    let mut next = Some((lease, running));
                    while let Some((lease, running)) = next {
                        let span = job_span(&pool.worker_id, &lease.job);
                        next = pool.clone().run_job(lease, running).instrument(span).await;
                    }
                    drop(permit);
                });
            }
            drop(permits);
            if got < wanted {
                tokio::select! {
                    _ = self.wake.notified() => {}
                    _ = tokio::time::sleep(self.config.poll_interval) => {}
                    _ = state.wait_for(|s| *s != PoolState::Running) => return,
                }
            }
        }
    }

    fn claim_params(&self, limit: u32) -> JobClaimParams {
        JobClaimParams {
            worker_id: self.worker_id.clone(),
            limit,
            lease_ttl: self.config.lease_ttl,
            now: self.clock.now(),
        }
    }

    async fn plugin(&self, digest: Digest) -> Result<Plugin, HostFailure> {
        if let Some(plugin) = self.plugins.lock().unwrap_or_else(|e| e.into_inner()).get(&digest) {
            return Ok(plugin.clone());
        }
        let bytes = self
            .store
            .plugin_get(digest)
            .await
            .map_err(|e| HostFailure {
                retryable: e.is_transient(),
                ..HostFailure::new(ErrorKind::HostError, format!("HostError: cannot read plugin {digest}: {e}"))
            })?
            .ok_or_else(|| {
                HostFailure::new(ErrorKind::HostError, format!("HostError: plugin {digest} is not in the store"))
            })?;
        let plugin = self
            .sandbox
            .compile(Arc::new(bytes))
            .await
            .map_err(|e| HostFailure::new(ErrorKind::HostError, format!("HostError: plugin {digest}: {e}")))?;
        self.plugins.lock().unwrap_or_else(|e| e.into_inner()).insert(digest, plugin.clone());
        Ok(plugin)
    }

    fn register(&self, id: JobId) -> RunningJob {
        let job = RunningJob { stop: StopHandle::new(), cancelled: Arc::new(AtomicBool::new(false)) };
        self.running.lock().unwrap_or_else(|e| e.into_inner()).insert(id, job.clone());
        if self.shutting_down.load(Ordering::SeqCst) {
            job.stop.request();
        }
        job
    }

    /// Run one claimed job to its recorded end. Returns the slot's next
    /// job when the finish claimed one (registered already).
    async fn run_job(self: Arc<Self>, lease: Lease, running: RunningJob) -> Option<(Lease, RunningJob)> {
        let Lease { job, token } = lease;
        let id = job.id;
        let RunningJob { stop, cancelled } = running;

        let keeper = LeaseKeeper {
            store: self.store.clone(),
            clock: self.clock.clone(),
            id,
            token: token.clone(),
            lease_ttl: self.config.lease_ttl,
            metrics: self.metrics.clone(),
        };
        let watch = LeaseWatch::default();
        let spent = job.lost_leases + job.retries + 1;
        let (may_retry, backoff, deadline) = (spent < job.max_attempts, job.backoff, job.deadline_at);
        let outcome = match self.plugin(job.plugin).await {
            Err(failure) => Err(failure),
            Ok(plugin) => {
                let mut request = RunRequest {
                    job_id: id.to_string(),
                    target: job.target.clone(),
                    attempt: job.attempt,
                    input: job.input,
                    // Clamped again: the ceilings in force now, not at submit.
                    limits: RunLimits {
                        timeout: Duration::from_millis(job.limits.timeout_ms).min(self.config.max_timeout),
                        fuel: job.limits.fuel,
                        memory_bytes: job.limits.memory_bytes,
                        output_bytes: job.limits.output_bytes.min(self.config.max_output_bytes),
                        cancel_grace: self.config.cancel_grace,
                        ..RunLimits::default()
                    },
                };
                if keeper.confirm_before_start(job.lease_expires_at, &stop, &watch).await {
                    // A sync job's run ends by its deadline; the time spent
                    // queued and loading the plugin counts.
                    let left = deadline.map(|at| {
                        Duration::from_millis(u64::try_from(at.unix_ms() - self.clock.now().unix_ms()).unwrap_or(0))
                    });
                    match left {
                        Some(left) if left.is_zero() => Err(HostFailure::new(
                            ErrorKind::Expired,
                            "Expired: the job's deadline passed before it could start",
                        )),
                        _ => {
                            if let Some(left) = left {
                                request.limits.timeout = request.limits.timeout.min(left);
                            }
                            tracing::debug!(timeout_ms = request.limits.timeout.as_millis() as u64, "started");
                            self.notify_start(&JobStarted { id, attempt: job.attempt });
                            let progress = Arc::new(ProgressWatch::default());
                            let run = self.run_guest(plugin, request, stop.clone(), progress.clone());
                            tokio::select! {
                                outcome = run => Ok(outcome),
                                _ = keeper.keep(&stop, &watch) => unreachable!("keep only returns by never returning"),
                                _ = self.write_progress(&progress, id, &token) => unreachable!("never returns"),
                            }
                        }
                    }
                } else {
                    // Never started: the sweeper ends or re-queues the job.
                    watch.lost.store(true, Ordering::SeqCst);
                    Err(HostFailure::new(ErrorKind::HostError, "the lease ran out before the guest started"))
                }
            }
        };
        self.stats.last_heartbeat_ms.store(self.clock.now().unix_ms() as u64, Ordering::Relaxed);

        let user_cancel = cancelled.load(Ordering::SeqCst) || watch.cancel_requested.load(Ordering::SeqCst);
        let mut next = None;
        if let Ok(o) = &outcome {
            self.forward_guest_logs(o);
        }
        if watch.lost.load(Ordering::SeqCst) {
            self.stats.leases_lost.fetch_add(1, Ordering::Relaxed);
            self.metrics.leases_lost.inc();
            tracing::warn!("lease lost: the attempt's result is dropped");
        } else if self.shutting_down.load(Ordering::SeqCst)
            && !user_cancel
            && outcome.as_ref().is_ok_and(|o| o.error_kind() == Some(ErrorKind::Cancelled))
        {
            let params = JobReleaseParams { id, token, queue_ttl: self.config.queue_ttl, now: self.clock.now() };
            match self.store.job_release(params).await {
                Ok(true) => tracing::info!("released to the queue at shutdown"),
                Ok(false) => tracing::warn!("not released at shutdown: the lease was lost"),
                Err(e) => tracing::warn!(error = %e, "not released at shutdown; the sweeper will reclaim it"),
            }
        } else if may_retry
            && !user_cancel
            && let Some(retry) = retry_for(&outcome)
        {
            // A retryable failure with attempts left: queued again after
            // the job's backoff.
            let (fuel_used, peak_memory_bytes, logs) = match outcome {
                Ok(mut o) => (o.usage.fuel_used, o.usage.peak_memory_bytes, logs_for(&mut o)),
                Err(_) => (0, 0, None),
            };
            let now = self.clock.now();
            let params = JobRetryParams {
                id,
                token,
                kind: retry.0,
                message: retry.1,
                run_after: now.plus(backoff.delay(spent)),
                queue_ttl: self.config.queue_ttl,
                fuel_used,
                peak_memory_bytes,
                logs,
                now,
            };
            let run_after = params.run_after;
            if self.store.job_retry(params).await.unwrap_or(false) {
                self.metrics.retries.inc();
                tracing::info!(%run_after, "failed retryably; queued again after its backoff");
            } else {
                // The lease was lost: the sweeper has the job.
                self.stats.leases_lost.fetch_add(1, Ordering::Relaxed);
                self.metrics.leases_lost.inc();
            }
        } else {
            let (finish, fuel_used, peak, progress, logs) = finish_for(outcome);
            let (status, error_kind) = (finish.status(), finish.error_kind());
            let params = JobFinishParams {
                id,
                token,
                finish,
                fuel_used,
                peak_memory_bytes: peak,
                progress,
                logs,
                now: self.clock.now(),
            };
            let finish_started = std::time::Instant::now();
            let claim_next = !self.shutting_down.load(Ordering::SeqCst);
            let recorded;
            (recorded, next) = self.finish_with_retry(params, claim_next).await;
            self.metrics.complete_seconds.observe(finish_started.elapsed().as_secs_f64());
            if recorded {
                match error_kind {
                    None => tracing::info!(status = %status, fuel_used, "finished"),
                    Some(kind) => tracing::info!(status = %status, error_kind = %kind, fuel_used, "finished"),
                }
                self.metrics.job_finished(status, error_kind, fuel_used);
                let counter = match status {
                    JobStatus::Succeeded => &self.stats.processed,
                    JobStatus::Cancelled => &self.stats.cancelled,
                    _ => &self.stats.failed,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                self.notify(Completion { id, status, error_kind, fuel_used });
            } else {
                self.stats.leases_lost.fetch_add(1, Ordering::Relaxed);
                self.metrics.leases_lost.inc();
                tracing::warn!("lease lost before the outcome was recorded: the result is dropped");
            }
        }

        // The next job is registered before this one leaves, so shutdown
        // never sees an idle pool in between.
        let next = next.map(|lease| {
            self.stats.claimed.fetch_add(1, Ordering::Relaxed);
            let running = self.register(lease.job.id);
            (lease, running)
        });
        let now_empty = {
            let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
            running.remove(&id);
            running.is_empty()
        };
        if now_empty {
            self.idle.notify_waiters();
        }
        next
    }

    /// Run the guest: on the guest runtime when there is one, else here.
    async fn run_guest(
        &self,
        plugin: Plugin,
        request: RunRequest,
        stop: StopHandle,
        observer: Arc<ProgressWatch>,
    ) -> Outcome {
        let Some(guests) = &self.guests else {
            return self.sandbox.run(&plugin, request, &stop, observer).await;
        };
        let sandbox = self.sandbox.clone();
        let task = guests.handle().spawn(async move { sandbox.run(&plugin, request, &stop, observer).await });
        match task.await {
            Ok(outcome) => outcome,
            // A panic in the sandbox stays a panic of this job's task, as
            // it was when the guest ran here.
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => panic!("the guest runtime stopped under a running job: {e}"),
        }
    }

    /// Forward the attempt's guest log records at or above the configured
    /// level to the host log, in the job's span (target `leash::guest`).
    fn forward_guest_logs(&self, outcome: &Outcome) {
        let Some(threshold) = self.config.guest_log_level else { return };
        for record in &outcome.logs {
            let level = match record.level {
                LogLevel::Trace => tracing::Level::TRACE,
                LogLevel::Debug => tracing::Level::DEBUG,
                LogLevel::Info => tracing::Level::INFO,
                LogLevel::Warn => tracing::Level::WARN,
                LogLevel::Error => tracing::Level::ERROR,
            };
            if level > threshold {
                continue;
            }
            let fields: String = record.fields.iter().map(|(k, v)| format!(" {k}={v:?}")).collect();
            let message = record.message.as_str();
            let elapsed_ms = record.elapsed_ms;
            match level {
                tracing::Level::ERROR => tracing::error!(target: "leash::guest", elapsed_ms, fields, "{message:?}"),
                tracing::Level::WARN => tracing::warn!(target: "leash::guest", elapsed_ms, fields, "{message:?}"),
                tracing::Level::INFO => tracing::info!(target: "leash::guest", elapsed_ms, fields, "{message:?}"),
                tracing::Level::DEBUG => tracing::debug!(target: "leash::guest", elapsed_ms, fields, "{message:?}"),
                _ => tracing::trace!(target: "leash::guest", elapsed_ms, fields, "{message:?}"),
            }
        }
    }

    /// Write a running guest's progress reports to the store, at most one per
    /// [`PROGRESS_WRITE_INTERVAL`]; the last one also lands with the finish.
    async fn write_progress(&self, progress: &ProgressWatch, id: JobId, token: &str) {
        loop {
            progress.changed.notified().await;
            let latest = progress.latest.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(p) = latest {
                let params = JobProgressParams {
                    id,
                    token: token.to_owned(),
                    progress: stored_progress(p),
                    now: self.clock.now(),
                };
                // A lost lease shows at the next renewal; a failed write is
                // superseded by the next report.
                let _ = self.store.job_progress_set(params).await;
            }
            tokio::time::sleep(PROGRESS_WRITE_INTERVAL).await;
        }
    }

    /// Record the outcome, retrying transient store errors while the lease
    /// could still be ours. `false`: the lease was lost.
    ///
    /// A failed call may still have committed (the reply was lost): then the
    /// retry matches no running row, and the row is checked for this very
    /// finish before the lease is called lost.
    ///
    /// With `claim_next`, the first try also claims the slot's next job
    /// (returned with the answer); retries only finish.
    async fn finish_with_retry(&self, mut params: JobFinishParams, claim_next: bool) -> (bool, Option<Lease>) {
        let mut delay = Duration::from_millis(5);
        let give_up = self.clock.now().plus(self.config.lease_ttl);
        let mut tried_at = Vec::new();
        loop {
            tried_at.push(params.now);
            let answer = if claim_next && tried_at.len() == 1 {
                let next = self.claim_params(1);
                self.store
                    .job_finish_and_claim(params.clone(), next)
                    .await
                    .map(|(done, leases)| (done, leases.into_iter().next()))
            } else {
                self.store.job_finish(params.clone()).await.map(|done| (done, None))
            };
            match answer {
                Ok((true, next)) => return (true, next),
                Ok((false, _)) if tried_at.len() > 1 => return (self.finish_landed(&params, &tried_at).await, None),
                Ok((false, _)) => return (false, None),
                Err(e) if e.is_transient() && self.clock.now() < give_up => {
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_millis(500));
                    params.now = self.clock.now();
                }
                Err(_) => return (self.finish_landed(&params, &tried_at).await, None),
            }
        }
    }

    /// Whether the row shows this finish: written by one of our attempts
    /// (its `finished_at`), with our ending and usage.
    async fn finish_landed(&self, params: &JobFinishParams, tried_at: &[Timestamp]) -> bool {
        let Ok(Some(job)) = self.store.job_get(params.id).await else { return false };
        job.status == params.finish.status()
            && job.error_kind == params.finish.error_kind()
            && job.worker_id.as_deref() == Some(self.worker_id.as_str())
            && job.fuel_used == Some(params.fuel_used)
            && job.finished_at.is_some_and(|at| tried_at.contains(&at))
    }

    fn notify(&self, completion: Completion) {
        let subscribers: Vec<Arc<Subscriber>> = self.subscribers.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for subscriber in subscribers {
            // A panicking subscriber must not stop the others or the pool.
            if let Err(panic) = std::panic::catch_unwind(AssertUnwindSafe(|| subscriber(&completion))) {
                tracing::error!(panic = panic_text(&panic), "a completion subscriber panicked; the others still ran");
            }
        }
        let _ = self.completions.send(completion);
    }

    /// Stop claiming, stop every guest (cooperatively, then by force), and
    /// release their leases, within the shutdown budget.
    pub(crate) async fn shutdown(&self) {
        if self.shutting_down.swap(true, Ordering::SeqCst) {
            let _ = self.state.subscribe().wait_for(|s| *s == PoolState::Stopped).await;
            return;
        }
        self.state.send_replace(PoolState::Stopping);
        tracing::info!(worker_id = %self.worker_id, running = self.running_count(), "draining");
        let budget = self.config.shutdown_budget;
        let grace = self.config.cancel_grace.min(budget / 2);
        let deadline = tokio::time::Instant::now() + budget;
        self.for_each_running(|job| job.stop.request());
        let idle = async {
            loop {
                let notified = self.idle.notified();
                if self.running_count() == 0 {
                    return;
                }
                notified.await;
            }
        };
        tokio::pin!(idle);
        tokio::select! {
            _ = &mut idle => {}
            _ = tokio::time::sleep(grace) => {
                tracing::warn!(running = self.running_count(), "stopping the guests still running by force");
                self.for_each_running(|job| job.stop.force());
                let _ = tokio::time::timeout_at(deadline, &mut idle).await;
            }
        }
        self.state.send_replace(PoolState::Stopped);
    }

    fn for_each_running(&self, f: impl Fn(&RunningJob)) {
        for job in self.running.lock().unwrap_or_else(|e| e.into_inner()).values() {
            f(job);
        }
    }
}

/// The latest progress report of a running guest, for the store.
#[derive(Debug, Default)]
struct ProgressWatch {
    latest: Mutex<Option<Progress>>,
    changed: Notify,
}

impl RunObserver for ProgressWatch {
    fn on_progress(&self, progress: &Progress) {
        *self.latest.lock().unwrap_or_else(|e| e.into_inner()) = Some(progress.clone());
        self.changed.notify_one();
    }
}

/// A guest's progress report as the store keeps it.
fn stored_progress(p: Progress) -> JobProgress {
    JobProgress { done: p.done, total: p.total, note: p.note }
}

/// A job that ended before its guest could run, or whose plugin could not
/// be loaded.
#[derive(Debug)]
struct HostFailure {
    kind: ErrorKind,
    message: String,
    /// Trying again later may work (a transient store error).
    retryable: bool,
}

impl HostFailure {
    fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        HostFailure { kind, message: message.into(), retryable: false }
    }
}

/// The kind and message of a failure that may be retried: the guest's own
/// `retryable` error, or a transient host error. `failed`, `invalid-input`,
/// traps and limits never are.
fn retry_for(outcome: &Result<Outcome, HostFailure>) -> Option<(ErrorKind, String)> {
    match outcome {
        Ok(o) => o.result.as_ref().err().filter(|f| f.retryable).map(|f| (f.kind, f.message.clone())),
        Err(h) => h.retryable.then(|| (h.kind, h.message.clone())),
    }
}

/// What an attempt logged, as the store keeps it (`None` when it was
/// quiet), taken out of the outcome.
fn logs_for(outcome: &mut Outcome) -> Option<JobLogs> {
    let quiet = outcome.logs.is_empty()
        && outcome.logs_dropped == 0
        && outcome.stdout.bytes.is_empty()
        && outcome.stderr.bytes.is_empty();
    (!quiet).then(|| JobLogs {
        records: std::mem::take(&mut outcome.logs)
            .into_iter()
            .map(|r| LogLine {
                level: r.level.as_str().to_owned(),
                message: r.message,
                fields: r.fields,
                elapsed_ms: r.elapsed_ms,
            })
            .collect(),
        records_dropped: outcome.logs_dropped,
        stdout: String::from_utf8_lossy(&outcome.stdout.bytes).into_owned(),
        stdout_dropped: outcome.stdout.dropped,
        stderr: String::from_utf8_lossy(&outcome.stderr.bytes).into_owned(),
        stderr_dropped: outcome.stderr.dropped,
    })
}

/// The store's record of a sandbox outcome: the ending, fuel, peak memory,
/// last progress and logs.
fn finish_for(outcome: Result<Outcome, HostFailure>) -> (Finish, u64, u64, Option<JobProgress>, Option<JobLogs>) {
    let mut outcome = match outcome {
        Ok(outcome) => outcome,
        Err(HostFailure { kind, message, .. }) => {
            return (Finish::Failed { kind, message, backtrace: None }, 0, 0, None, None);
        }
    };
    let (fuel, peak) = (outcome.usage.fuel_used, outcome.usage.peak_memory_bytes);
    let logs = logs_for(&mut outcome);
    let progress = outcome.last_progress.map(stored_progress);
    let finish = match outcome.result {
        Ok(output) => Finish::Succeeded { output },
        Err(failure) if failure.kind == ErrorKind::Cancelled => Finish::Cancelled { message: failure.message },
        Err(failure) => Finish::Failed { kind: failure.kind, message: failure.message, backtrace: failure.backtrace },
    };
    (finish, fuel, peak, progress, logs)
}

/// The threads guests run on: a multi-threaded tokio runtime of its own,
/// one thread per core (at most one per slot), optionally at a lower CPU
/// priority than the process's other threads. The HTTP server, lease
/// renewals, progress writes and sweeps stay on the caller's runtime, so a
/// pool full of computing guests delays them by an OS time slice at most,
/// not by a guest's turn on a shared worker thread.
#[derive(Debug)]
struct GuestRuntime(Option<tokio::runtime::Runtime>);

impl GuestRuntime {
    /// `None` when the threads cannot be started: guests then run on the
    /// caller's runtime, as without isolation.
    fn start(slots: usize, nice: i32) -> Option<GuestRuntime> {
        let nice = nice.clamp(0, 19);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(cores.min(slots).max(1))
            .thread_name("leash-guest")
            .enable_all()
            .on_thread_start(move || {
                if nice == 0 {
                    return;
                }
                // SAFETY: plain syscalls on this thread's own id; a failure
                // only leaves the thread at its inherited priority.
                unsafe {
                    let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
                    let now = libc::getpriority(libc::PRIO_PROCESS, tid);
                    libc::setpriority(libc::PRIO_PROCESS, tid, now.saturating_add(nice));
                }
            })
            .build();
        match runtime {
            Ok(runtime) => Some(GuestRuntime(Some(runtime))),
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the guest threads; guests share the control plane's");
                None
            }
        }
    }

    fn handle(&self) -> &tokio::runtime::Handle {
        self.0.as_ref().expect("present until dropped").handle()
    }
}

impl Drop for GuestRuntime {
    fn drop(&mut self) {
        // Dropped from async code: never block on the guest threads.
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// The span every event of one attempt carries.
fn job_span(worker_id: &str, job: &crate::job::Job) -> tracing::Span {
    tracing::info_span!("job", job_id = %job.id, attempt = job.attempt, worker_id = %worker_id, plugin = %job.plugin)
}

/// A caught panic's message.
fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(not a string)".to_owned())
}

/// This machine's host name (empty if it cannot be read).
fn host_name() -> String {
    static NAME: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        let mut buffer = [0u8; 256];
        // SAFETY: gethostname writes at most `buffer.len()` bytes into the
        // live local buffer it is given.
        let ok = unsafe { libc::gethostname(buffer.as_mut_ptr().cast(), buffer.len()) } == 0;
        let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
        if ok { String::from_utf8_lossy(&buffer[..end]).into_owned() } else { String::new() }
    });
    NAME.clone()
}

/// Last heartbeat as a timestamp.
pub(crate) fn last_heartbeat(stats: &PoolStats) -> Option<Timestamp> {
    match stats.last_heartbeat_ms.load(Ordering::Relaxed) {
        0 => None,
        ms => Some(Timestamp::from_unix_ms(ms as i64)),
    }
}
