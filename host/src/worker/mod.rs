//! The worker pool: one per process, `max_workers` job slots.
//!
//! The claim loop waits for a free slot, claims as many queued jobs as
//! there are free slots in one store call, and runs each on its own task:
//! load the plugin (compiled once per process), run it in the sandbox while
//! a [`LeaseKeeper`](lease::LeaseKeeper) renews the lease, then record the outcome — fenced by
//! the lease token, so a worker that lost its lease records nothing.
//!
//! An enqueue in this process wakes the claim loop at once; `poll_interval`
//! is the fallback for jobs submitted by other processes.
//!
//! Shutdown: stop claiming, ask every guest to stop, stop by force what
//! remains after the shutdown grace, and release the leases (running →
//! queued, no attempt spent unless the attempt recorded an effect), all
//! within the shutdown budget.

mod attempt;
pub(crate) mod ceilings;
pub mod egress;
mod failure;
mod finish;
mod guests;
pub mod lease;
mod plan;
mod slot;
pub use plan::REPORT_FIELDS;
pub(crate) use plan::settle_apply;

use attempt::job_span;
use guests::GuestRuntime;

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt as _;
use serde::Serialize;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, broadcast, watch};
use tracing::Instrument as _;

use crate::clock::{Clock, Timestamp};
use crate::job::{Digest, ErrorKind, JobId, JobStatus, WorkerRecord, WorkerState};
use crate::metrics::Metrics;
use crate::sandbox::{Plugin, Sandbox, StopHandle};
use crate::store::{AGED_SHARE, JobClaimParams, JobStore, Lease};

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
    /// How long a suspect (a job a process died under) runs alone in this
    /// pool before the pool takes other jobs beside it: a crash it causes
    /// in that time costs no other job.
    pub suspect_alone_for: Duration,
    /// A slot claims jobs ahead only after an attempt (from its start in
    /// the slot, the plugin's load included, to its guest's end) shorter
    /// than this; zero claims none ahead.
    pub claim_ahead_below: Duration,
}

/// Default of [`WorkerConfig::suspect_alone_for`]: a job that crashes its
/// process through an engine bug does so as its code runs, mostly at once;
/// a minute spares other jobs that, and spares the pool a long suspect's
/// whole run.
pub const DEFAULT_SUSPECT_ALONE_FOR: Duration = Duration::from_secs(60);

/// Default of [`WorkerConfig::claim_ahead_below`]: where a commit is a
/// large part of a job's time.
pub const DEFAULT_CLAIM_AHEAD_BELOW: Duration = Duration::from_millis(100);

/// A fresh random worker id, `worker-<8 hex>`: never a host name.
pub fn new_worker_id() -> String {
    let n = ulid::Ulid::generate().random() as u32;
    format!("worker-{n:08x}")
}

/// How a job this process ran ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Completion {
    /// The job.
    pub id: JobId,
    /// Its terminal status.
    pub status: JobStatus,
    /// Why it did not succeed.
    pub error_kind: Option<ErrorKind>,
    /// Fuel the attempt used.
    pub fuel_used: u64,
    /// The plan it belongs to, if any.
    pub plan_id: Option<String>,
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, utoipa::ToSchema)]
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
    /// Submitters' ceilings: read at submit, and the timeout again at claim.
    pub(crate) ceilings: ceilings::SubmitterCeilings,
    /// Outbound requests' slots under the rate limits that apply to them.
    egress: Arc<egress::StoreEgress>,
    running: Mutex<HashMap<JobId, RunningJob>>,
    /// Each digest's plugin, compiled once per process: a job that finds
    /// its plugin being compiled waits for that compile, not a second one.
    plugins: Mutex<HashMap<Digest, Arc<tokio::sync::OnceCell<Plugin>>>>,
    subscribers: Mutex<Vec<Arc<Subscriber>>>,
    start_subscribers: Mutex<Vec<Arc<StartSubscriber>>>,
    shutting_down: AtomicBool,
    /// Job slots asked for by claims so far (the aged share's count).
    claim_slots: AtomicU64,
    /// How long a finish takes to be answered, a moving average in µs: how
    /// far ahead a busy slot claims ([`slot::Slot::depth`]).
    finish_round_us: AtomicU64,
    /// The free job slots: a permit each.
    slots: Arc<Semaphore>,
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
        worker_id: String,
    ) -> Arc<Self> {
        Arc::new(Pool {
            ceilings: ceilings::SubmitterCeilings::new(store.clone()),
            egress: Arc::new(egress::StoreEgress::new(store.clone(), clock.clone(), metrics.clone())),
            store,
            sandbox,
            clock: clock.clone(),
            worker_id,
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
            claim_slots: AtomicU64::new(0),
            finish_round_us: AtomicU64::new(0),
            slots: Arc::new(Semaphore::new(config.max_workers)),
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
            poll_interval: self.config.poll_interval,
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
        let slots = self.slots.clone();
        let mut state = self.state.subscribe();
        // Jobs enqueued through another process sharing the store.
        let mut elsewhere = self.store.enqueued();
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
            // Every slot free: nothing runs here, so a job a process died
            // under may be claimed, to run alone.
            let alone = wanted == self.config.max_workers;
            // Every wake-up heard so far is for a job committed before this
            // claim runs, so the claim sees it: spent here, not on a claim
            // after this one that would find nothing new.
            self.wake.notified().now_or_never();
            if let Some(rx) = &mut elsewhere {
                rx.borrow_and_update();
            }
            let claim_started = std::time::Instant::now();
            let claimed = self.store.job_claim(self.claim_params(wanted as u32, alone)).await.unwrap_or_default();
            self.metrics.claim_seconds.observe(claim_started.elapsed().as_secs_f64());
            let got = claimed.len();
            self.stats.claimed.fetch_add(got as u64, Ordering::Relaxed);
            if got > 0 {
                self.stats.last_heartbeat_ms.store(self.clock.now().unix_ms() as u64, Ordering::Relaxed);
            }
            // A suspect (the store gives one, alone) holds every slot: if
            // it crashes the process again, nothing else dies with it, and
            // the next death is its own.
            let suspect = claimed.first().is_some_and(|lease| lease.job.process_deaths > 0);
            if suspect {
                let held = permits.split_off(1);
                let alone_for = self.config.suspect_alone_for;
                let held = Arc::new(Mutex::new(held));
                let (timer, job) = (held.clone(), held);
                tokio::spawn(async move {
                    tokio::time::sleep(alone_for).await;
                    timer.lock().unwrap_or_else(|e| e.into_inner()).clear();
                });
                // Emptied by the job too, if it ends first.
                if let Some(lease) = claimed.into_iter().next() {
                    self.spawn_slot(lease, permits.remove(0), Some(job));
                }
                continue;
            }
            for (lease, permit) in claimed.into_iter().zip(permits.drain(..)) {
                self.spawn_slot(lease, permit, None);
            }
            drop(permits);
            if got < wanted {
                tokio::select! {
                    _ = self.wake.notified() => {}
                    _ = enqueued_elsewhere(&mut elsewhere) => {}
                    _ = tokio::time::sleep(self.config.poll_interval) => {}
                    _ = state.wait_for(|s| *s != PoolState::Running) => return,
                }
            }
        }
    }

    /// Run a claimed job on a slot of its own (a suspect also holds the
    /// pool's other slots in `alone` until its job ends or the timer that
    /// shares them empties them).
    fn spawn_slot(
        self: &Arc<Self>,
        lease: Lease,
        permit: OwnedSemaphorePermit,
        alone: Option<Arc<Mutex<Vec<OwnedSemaphorePermit>>>>,
    ) {
        // Registered before the task starts, so shutdown sees it.
        let running = self.register(lease.job.id);
        let pool = self.clone();
        tokio::spawn(async move {
            // A finish may claim the slot's next jobs in the same round
            // trip; the slot runs them in turn, and ends when none is
            // ready and no finish of its own is still out.
            let slot = Arc::new(slot::Slot::default());
            let mut next = Some((lease, running));
            while let Some((lease, running)) = next {
                if pool.shutting_down.load(Ordering::SeqCst) {
                    // Not started, so nothing to stop: back to the queue.
                    pool.release_unstarted(lease, "the pool is stopping").await;
                } else {
                    let span = job_span(&pool.worker_id, &lease.job);
                    pool.clone().run_job(lease, running, slot.clone()).instrument(span).await;
                }
                next = slot.next().await;
            }
            if let Some(alone) = alone {
                alone.lock().unwrap_or_else(|e| e.into_inner()).clear();
            }
            drop(permit);
        });
    }

    /// A claim of up to `limit` jobs. One slot in every [`AGED_SHARE`]
    /// this pool asks for goes to an aged job (the bound on starvation).
    fn claim_params(&self, limit: u32, alone: bool) -> JobClaimParams {
        let asked = self.claim_slots.fetch_add(u64::from(limit), Ordering::Relaxed);
        let aged = (asked + u64::from(limit)) / AGED_SHARE - asked / AGED_SHARE;
        JobClaimParams {
            worker_id: self.worker_id.clone(),
            limit,
            alone,
            lease_ttl: self.config.lease_ttl,
            now: self.clock.now(),
            aged: aged as u32,
        }
    }

    fn register(&self, id: JobId) -> RunningJob {
        let job = RunningJob { stop: StopHandle::new(), cancelled: Arc::new(AtomicBool::new(false)) };
        self.running.lock().unwrap_or_else(|e| e.into_inner()).insert(id, job.clone());
        if self.shutting_down.load(Ordering::SeqCst) {
            job.stop.request();
        }
        job
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

/// Wait for the store's signal that jobs were enqueued elsewhere; never,
/// for a store that gives none (or has stopped giving it).
async fn enqueued_elsewhere(signal: &mut Option<watch::Receiver<u64>>) {
    if let Some(rx) = signal {
        if rx.changed().await.is_ok() {
            return;
        }
        *signal = None;
    }
    std::future::pending::<()>().await
}
