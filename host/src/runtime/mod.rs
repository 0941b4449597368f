//! The embedding API: open a store, start a pool, submit jobs, await
//! results, cancel, read health, shut down.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use leash::job::Target;
//! use leash::runtime::{PluginSource, Runtime, Submit};
//!
//! let runtime = Runtime::builder("jobs.db").max_workers(4).build().await?;
//! let bytes = std::fs::read("plugins/target/wasm32-wasip2/release/hello.wasm")?;
//! let id = runtime.submit(Submit::new(PluginSource::Bytes(bytes), Target::Execute, br#"{"name":"Ada"}"#.to_vec())).await?;
//! let job = runtime.wait(id, std::time::Duration::from_secs(30)).await?;
//! println!("{} {:?}", job.status, job.output.map(String::from_utf8));
//! runtime.shutdown().await;
//! # Ok(()) }
//! ```

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::watch;

use crate::clock::{Clock, SystemClock, Timestamp};
use crate::job::grant::Requests;
use crate::job::{
    ApprovalPolicy, Backoff, Counts, DEFAULT_APPROVAL_TTL, Digest, Effect, ExecutionMode, Gate, GateSource, Grants,
    IdempotencyKey, Job, JobId, JobLimits, JobLogs, JobStatus, MAX_ATTEMPTS_CEILING, NewJob, PluginInfo, PluginName,
    PluginRef, Target,
};
use crate::metrics::Metrics;
use crate::sandbox::{self, Sandbox, SandboxConfig, SandboxError};
use crate::store::{
    CancelResult, Database, Durability, EventFilter, EventId, JobInsertParams, JobListParams, JobStore,
    JobsExpireParams, PluginGrantsParams, PluginNameParams, PluginPutParams, StoreError, WorkerRecord, WorkerState,
};
use crate::sweep::{SweepConfig, Sweeper};
use crate::worker::{Completion, JobStarted, Pool, PoolState, Subscriber, WorkerConfig};

mod approval;
mod events;
mod plan;
mod remote;
pub use approval::DecisionBy;
pub use events::{DEFAULT_EVENT_POLL, DEFAULT_EVENT_TTL, EventStream, StreamItem};
pub use plan::{PlanSubmit, PlanView};
pub use remote::{PoolReport, RemotePool, Supervision};

/// Default job slots per process.
pub const DEFAULT_MAX_WORKERS: usize = 4;
/// Default fallback poll for jobs from other processes.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Default lease length.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);
/// Default retention of terminal jobs.
pub const DEFAULT_JOB_TTL: Duration = Duration::from_secs(86_400);
/// Default time a job may wait in the queue.
pub const DEFAULT_QUEUE_TTL: Duration = Duration::from_secs(86_400);
/// Default shutdown budget.
pub const DEFAULT_SHUTDOWN_BUDGET: Duration = Duration::from_secs(3);
/// Default number of times a job runs again without spending an attempt
/// when it lost its lease before recording any effect.
pub const DEFAULT_FREE_RERUNS: u32 = 3;
/// Default bound on queued jobs before submit refuses.
pub const DEFAULT_MAX_QUEUED: u64 = 100_000;
/// Default ceiling on a job's wall-clock limit.
pub const DEFAULT_MAX_TIMEOUT: Duration = Duration::from_secs(86_400);
/// Default ceiling on a job's output limit.
pub const DEFAULT_MAX_OUTPUT_BYTES: u64 = 64 << 20;
/// Default ceiling on how long a job may wait in the queue.
pub const DEFAULT_MAX_QUEUE_TTL: Duration = Duration::from_secs(30 * 86_400);
/// Longest shutdown waits for the registry's last report.
const REGISTRY_FAREWELL: Duration = Duration::from_secs(1);
/// How long past a job's deadline (and its cancel grace) a sync waiter
/// waits for the worker to record the ending.
const DEADLINE_SETTLE: Duration = Duration::from_secs(5);
/// Longest pause a job's retry backoff may ask for.
pub const MAX_BACKOFF: Duration = Duration::from_secs(86_400);

/// Where a job's plugin comes from.
#[derive(Debug, Clone)]
pub enum PluginSource {
    /// Component bytes: validated, stored by digest.
    Bytes(Vec<u8>),
    /// A plugin already in the store.
    Digest(Digest),
    /// A registered plugin by name, `name@version` or digest: pinned to its
    /// digest at submit time.
    Ref(PluginRef),
}

/// A job to submit. Unset fields take the runtime's defaults.
#[derive(Debug, Clone)]
pub struct Submit {
    /// The plugin.
    pub plugin: PluginSource,
    /// Phase or action.
    pub target: Target,
    /// Input bytes.
    pub input: Vec<u8>,
    /// Wall-clock limit per attempt.
    pub timeout: Option<Duration>,
    /// Fuel budget per attempt.
    pub fuel: Option<u64>,
    /// Memory limit, bytes.
    pub memory_bytes: Option<u64>,
    /// Output limit, bytes.
    pub output_bytes: Option<u64>,
    /// Attempt limit (default 1: actions are not idempotent).
    pub max_attempts: Option<u32>,
    /// At most one running job per key.
    pub concurrency_key: Option<String>,
    /// A logical plan id.
    pub plan_id: Option<String>,
    /// How long it may wait in the queue (default: the runtime's queue TTL).
    pub queue_ttl: Option<Duration>,
    /// The client's idempotency key for this request: submitting the same
    /// key again returns this job instead of queueing another.
    pub idempotency: Option<IdempotencyKey>,
    /// Not before this instant (a delayed job); its queue TTL counts from
    /// then. A past instant means now.
    pub run_at: Option<Timestamp>,
    /// A deadline for the whole job, from now: it expires if still queued
    /// then, and its run is cut to end by then (sync HTTP calls use this).
    pub deadline: Option<Duration>,
    /// The pause before each retry (default: the runtime's).
    pub backoff: Option<Backoff>,
    /// Approval: `None` leaves it to the plugin's policy; `Some(true)`
    /// gates the job whatever the policy says; `Some(false)` asks for no
    /// gate, and is refused ([`RuntimeError::ApprovalRequired`]) where the
    /// policy requires one: a submitter can add a gate, never remove one.
    pub approval: Option<bool>,
    /// A gated job's approval queues it (`true`, the default), or leaves
    /// it `approved` until [`Runtime::run_approved`] triggers its run.
    pub run_on_approve: bool,
}

impl Submit {
    /// A job with every limit at its default.
    pub fn new(plugin: PluginSource, target: Target, input: Vec<u8>) -> Self {
        Submit {
            plugin,
            target,
            input,
            timeout: None,
            fuel: None,
            memory_bytes: None,
            output_bytes: None,
            max_attempts: None,
            concurrency_key: None,
            plan_id: None,
            queue_ttl: None,
            idempotency: None,
            run_at: None,
            deadline: None,
            backoff: None,
            approval: None,
            run_on_approve: true,
        }
    }
}

/// What [`Runtime::submit_once`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Submitted {
    /// The job.
    pub id: JobId,
    /// Its state now: `queued`, or `pending_approval` when it waits for a
    /// person (a replay answers the first job's state now).
    pub status: JobStatus,
    /// The idempotency key already belonged to this same request: nothing
    /// new was queued.
    pub replayed: bool,
}

/// Why a runtime call failed.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The queue is full: try again later.
    #[error("backpressure: {queued} jobs are queued (limit {limit}); retry later")]
    Backpressure {
        /// Queued jobs seen.
        queued: u64,
        /// The limit.
        limit: u64,
    },
    /// The plugin bytes are not a usable component.
    #[error("invalid plugin: {0}")]
    InvalidPlugin(#[source] SandboxError),
    /// No plugin with this digest or name is stored.
    #[error("unknown plugin {0}")]
    UnknownPlugin(String),
    /// A limit or field is out of bounds.
    #[error("invalid job: {0}")]
    InvalidJob(String),
    /// A grant is out of bounds.
    #[error("invalid grant: {0}")]
    InvalidGrant(String),
    /// No job with this id.
    #[error("no job {0}")]
    NotFound(JobId),
    /// No plan with this id.
    #[error("no plan {0}")]
    UnknownPlan(String),
    /// The job already ended; it cannot be cancelled.
    #[error("job {id} already ended ({status})")]
    AlreadyTerminal {
        /// The job.
        id: JobId,
        /// Its terminal status.
        status: JobStatus,
    },
    /// The idempotency key already belongs to a job created by a different
    /// request.
    #[error("idempotency key {key:?} was used for another request (job {job})")]
    IdempotencyConflict {
        /// The key.
        key: String,
        /// The job it belongs to.
        job: JobId,
    },
    /// The plugin's approval policy gates this target, and the submit
    /// asked for no gate.
    #[error(
        "{plugin}'s approval policy requires approval for {target} jobs: a submit cannot lower it \
         (leave the gate out, or ask for approval)"
    )]
    ApprovalRequired {
        /// The plugin, as named.
        plugin: String,
        /// The gated target.
        target: Target,
    },
    /// A decision the job's state does not allow.
    #[error("job {id} is {status}: {why}")]
    Undecidable {
        /// The job.
        id: JobId,
        /// Its state.
        status: JobStatus,
        /// Why nothing changed.
        why: &'static str,
        /// The reason as a machine-readable code: `not_gated`,
        /// `already_decided` or `not_approved`.
        code: &'static str,
    },
    /// One job of a batch was refused, so none was queued.
    #[error("jobs[{index}]: {error}")]
    InBatch {
        /// Its place in the batch, from 0.
        index: usize,
        /// Why it was refused.
        error: Box<RuntimeError>,
    },
    /// A batch's idempotency key names a batch queued earlier, some of
    /// whose jobs have since been deleted by retention: its answer cannot
    /// be given again, and nothing new was queued.
    #[error(
        "the batch with idempotency key {key:?} was queued earlier, and {missing} of its jobs have since been \
         deleted (retention): nothing new was queued"
    )]
    ReplayIncomplete {
        /// The batch's key.
        key: String,
        /// Its jobs no longer stored.
        missing: usize,
    },
    /// The job did not end within the wait (it keeps running).
    #[error("job {0} did not finish within the wait; it is still running")]
    WaitTimeout(JobId),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The sandbox could not be built.
    #[error(transparent)]
    Sandbox(SandboxError),
}

/// What `cancel` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, utoipa::ToSchema)]
pub enum Cancelled {
    /// It was queued and is now cancelled.
    #[serde(rename = "cancelled")]
    Cancelled,
    /// It is running; its owner was asked to stop it.
    #[serde(rename = "cancel_requested")]
    Requested,
}

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
    /// Seed 000's summary of the workers sharing the store:
    /// `Async workers: enabled, max_workers=4, poll_interval=1.0s`.
    pub summary: String,
    /// Every worker registered in the store (this process's too, unless it
    /// runs none), read with `counts`.
    pub workers: Vec<WorkerView>,
    /// With the pool in a supervised process (`leash serve`'s default):
    /// that process, its restarts and how the last one ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supervision: Option<Supervision>,
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
    pub max_timeout_ms: u64,
    /// Largest memory limit, bytes.
    pub max_memory_bytes: u64,
    /// Largest output limit, bytes.
    pub max_output_bytes: u64,
    /// The wall-clock limit of a job that sets none, milliseconds.
    pub default_timeout_ms: u64,
    /// Longest queue wait a job may ask for, milliseconds.
    pub max_queue_ttl_ms: u64,
    /// Most attempts a job may ask for.
    pub max_attempts: u32,
    /// The retry backoff of a job that sets none.
    pub backoff: Backoff,
}

/// What a component declares it asks for; a declaration that does not
/// parse makes the plugin invalid.
fn declaration(bytes: &[u8]) -> Result<Option<Arc<Requests>>, RuntimeError> {
    let declared = sandbox::declared_requests(bytes)
        .map_err(|e| RuntimeError::InvalidPlugin(SandboxError::InvalidComponent(e)))?;
    Ok(declared.map(Arc::new))
}

/// Builds a [`Runtime`].
pub struct RuntimeBuilder {
    database: Database,
    store: Option<Arc<dyn JobStore>>,
    durability: Durability,
    sandbox: SandboxConfig,
    worker: WorkerConfig,
    job_ttl: Duration,
    event_ttl: Duration,
    event_poll: Duration,
    sweep_interval: Option<Duration>,
    max_queued: u64,
    max_queue_ttl: Duration,
    default_timeout: Duration,
    default_memory_bytes: u64,
    default_output_bytes: u64,
    default_max_attempts: u32,
    free_rerun_limit: u32,
    approval_ttl: Duration,
    default_backoff: Backoff,
    clock: Arc<dyn Clock>,
    workers: bool,
    remote: Option<Arc<dyn RemotePool>>,
    worker_id: Option<String>,
    start_subscribers: Vec<crate::worker::StartSubscriber>,
    subscribers: Vec<Subscriber>,
}

impl std::fmt::Debug for RuntimeBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeBuilder")
            .field("database", &self.database)
            .field("worker", &self.worker)
            .field("sandbox", &self.sandbox)
            .finish_non_exhaustive()
    }
}

impl RuntimeBuilder {
    /// Call `subscriber` when a job this process claimed starts running its
    /// guest. Registered here, it hears every start from the first claim on
    /// (one registered on the built runtime can miss the first claims).
    pub fn on_start(mut self, subscriber: impl Fn(&JobStarted) + Send + Sync + 'static) -> Self {
        self.start_subscribers.push(Box::new(subscriber));
        self
    }

    /// Call `subscriber` for every job this process finishes, from the
    /// first claim on.
    pub fn on_complete(mut self, subscriber: impl Fn(&Completion) + Send + Sync + 'static) -> Self {
        self.subscribers.push(Box::new(subscriber));
        self
    }

    /// Use this store instead of opening the database (a store built by hand,
    /// or a wrapper such as [`crate::store::faults::FaultyStore`]).
    pub fn store(mut self, store: Arc<dyn JobStore>) -> Self {
        self.store = Some(store);
        self
    }

    /// What each commit survives (default `normal`).
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// Sandbox settings.
    pub fn sandbox(mut self, config: SandboxConfig) -> Self {
        self.sandbox = config;
        self
    }

    /// Job slots in this process.
    pub fn max_workers(mut self, n: usize) -> Self {
        self.worker.max_workers = n.max(1);
        self
    }

    /// Fallback poll interval.
    pub fn poll_interval(mut self, d: Duration) -> Self {
        self.worker.poll_interval = d;
        self
    }

    /// Lease length.
    pub fn lease_ttl(mut self, d: Duration) -> Self {
        self.worker.lease_ttl = d;
        self
    }

    /// Grace between a cancel request and a forced stop.
    pub fn cancel_grace(mut self, d: Duration) -> Self {
        self.worker.cancel_grace = d;
        self
    }

    /// Shutdown budget.
    pub fn shutdown_budget(mut self, d: Duration) -> Self {
        self.worker.shutdown_budget = d;
        self
    }

    /// How long a job may wait in the queue.
    pub fn queue_ttl(mut self, d: Duration) -> Self {
        self.worker.queue_ttl = d;
        self
    }

    /// Retention of terminal jobs.
    pub fn job_ttl(mut self, d: Duration) -> Self {
        self.job_ttl = d;
        self
    }

    /// Retention of events (default 1 h): how far back a client of the
    /// event stream can resume.
    pub fn event_ttl(mut self, d: Duration) -> Self {
        self.event_ttl = d;
        self
    }

    /// Time between reads of the store's change feed while an event
    /// stream client listens (default 250 ms).
    pub fn event_poll(mut self, d: Duration) -> Self {
        self.event_poll = d.max(Duration::from_millis(1));
        self
    }

    /// Time between sweeps (default: a third of the lease TTL, at most 5 s).
    pub fn sweep_interval(mut self, d: Duration) -> Self {
        self.sweep_interval = Some(d);
        self
    }

    /// Queued jobs beyond which submit refuses with backpressure. The store
    /// is counted at most once per poll interval; jobs this process submits
    /// in between are added to that count.
    pub fn max_queued(mut self, n: u64) -> Self {
        self.max_queued = n;
        self
    }

    /// Ceiling on a job's wall-clock limit (default 24 h): submits above it
    /// are refused, and a stored job's limit is cut to it when this
    /// process's workers claim the job.
    pub fn max_timeout(mut self, d: Duration) -> Self {
        self.worker.max_timeout = d;
        self
    }

    /// Ceiling on a job's output limit (default 64 MiB), applied at submit
    /// and again at claim like [`Self::max_timeout`].
    pub fn max_output_bytes(mut self, n: u64) -> Self {
        self.worker.max_output_bytes = n;
        self
    }

    /// How long a job a process died under runs alone in the pool before
    /// the pool takes other jobs beside it (default 60 s).
    pub fn suspect_alone_for(mut self, d: Duration) -> Self {
        self.worker.suspect_alone_for = d;
        self
    }

    /// Run guests on threads of their own (the default), or beside the
    /// caller's tasks (`false`: one runtime for everything, as a benchmark
    /// baseline).
    pub fn isolate_guests(mut self, isolate: bool) -> Self {
        self.worker.isolate_guests = isolate;
        self
    }

    /// Lower the guest threads' CPU priority by this `nice` increment
    /// (0–19, default 0). It favours the control plane over guests, and
    /// every other process on the machine over guests too.
    pub fn guest_nice(mut self, nice: i32) -> Self {
        self.worker.guest_nice = nice.clamp(0, 19);
        self
    }

    /// Forward guest log records at or above `level` to the host's
    /// `tracing` log (target `leash::guest`, in the job's span) when each
    /// attempt ends; `None` (the default) forwards none. They are kept with
    /// the job either way.
    pub fn guest_log_level(mut self, level: Option<tracing::Level>) -> Self {
        self.worker.guest_log_level = level;
        self
    }

    /// The retry backoff of a job that sets none (default 1 s doubling to
    /// 300 s).
    pub fn default_backoff(mut self, backoff: Backoff) -> Self {
        self.default_backoff = backoff;
        self
    }

    /// Ceiling on how long a job may wait in the queue (default 30 days):
    /// submits above it are refused.
    pub fn max_queue_ttl(mut self, d: Duration) -> Self {
        self.max_queue_ttl = d;
        self
    }

    /// Default wall-clock limit of a job (default 3600 s).
    pub fn default_timeout(mut self, d: Duration) -> Self {
        self.default_timeout = d;
        self
    }

    /// Default attempt limit (default 1).
    pub fn default_max_attempts(mut self, n: u32) -> Self {
        self.default_max_attempts = n.max(1);
        self
    }

    /// Times a job may run again without spending an attempt after losing
    /// its lease before its attempt recorded any effect (default
    /// [`DEFAULT_FREE_RERUNS`]; 0: a lost lease always spends an attempt).
    /// Pinned on each job at submit; at most [`MAX_ATTEMPTS_CEILING`].
    pub fn free_rerun_limit(mut self, n: u32) -> Self {
        self.free_rerun_limit = n.min(MAX_ATTEMPTS_CEILING);
        self
    }

    /// How long a gated job waits for a decision before it fails as
    /// `expired` (default 7 days); also how long an approved job waits for
    /// its run trigger. Pinned on each job when it starts waiting; at most
    /// the queue TTL ceiling.
    pub fn approval_ttl(mut self, d: Duration) -> Self {
        self.approval_ttl = d;
        self
    }

    /// The time source (tests inject a manual clock).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Run no workers or sweeps: submit, inspect and cancel only.
    pub fn without_workers(mut self) -> Self {
        self.workers = false;
        self
    }

    /// The pool's worker id (default: a fresh `worker-<8 hex>`): a
    /// supervisor names its pool process's, so it can reclaim that
    /// worker's jobs when the process dies, whenever it dies.
    pub fn worker_id(mut self, id: impl Into<String>) -> Self {
        self.worker_id = Some(id.into());
        self
    }

    /// Run no workers or sweeps here: jobs run in the pool `remote` stands
    /// for, in another process, which this runtime wakes when jobs become
    /// claimable and tells of cancels, and whose report its health and
    /// metrics show (`leash serve`'s supervised pool).
    pub fn remote_pool(mut self, remote: Arc<dyn RemotePool>) -> Self {
        self.workers = false;
        self.remote = Some(remote);
        self
    }

    /// Open the store, build the sandbox, start the pool and sweeps.
    pub async fn build(mut self) -> Result<Runtime, RuntimeError> {
        check_backoff(self.default_backoff).map_err(|e| RuntimeError::InvalidJob(format!("default {e}")))?;
        if self.approval_ttl.is_zero() || self.approval_ttl > self.max_queue_ttl {
            return Err(RuntimeError::InvalidJob(format!(
                "approval TTL {} is out of range: use 1ms to {}",
                humantime::format_duration(self.approval_ttl),
                humantime::format_duration(self.max_queue_ttl)
            )));
        }
        let store: Arc<dyn JobStore> = match &self.store {
            Some(store) => store.clone(),
            None => crate::store::open(&self.database, self.durability).await?,
        };
        let sandbox = Arc::new(Sandbox::new(self.sandbox.clone()).map_err(RuntimeError::Sandbox)?);
        let metrics = Arc::new(Metrics::new());
        let worker_id = self.worker_id.clone().unwrap_or_else(crate::worker::new_worker_id);
        let pool = Pool::new(
            store.clone(),
            sandbox.clone(),
            self.clock.clone(),
            self.worker.clone(),
            metrics.clone(),
            worker_id,
        );
        for subscriber in self.start_subscribers.drain(..) {
            pool.subscribe_starts(subscriber);
        }
        for subscriber in self.subscribers.drain(..) {
            pool.subscribe(subscriber);
        }
        if self.workers {
            plan::spawn_advancer(&pool, store.clone(), self.clock.clone());
        }
        let lag_watch = tokio::spawn(metrics.clone().watch_event_loop());
        let (stop_sweeps, stop_rx) = watch::channel(false);
        let registration = if self.workers {
            // Registered before `build` returns: a built runtime is listed.
            // A store that refuses the first report gets it again at the
            // next poll.
            let _ = store.worker_beat(pool.record()).await;
            Some(tokio::spawn(pool.clone().register_loop()))
        } else {
            None
        };
        if self.workers {
            tokio::spawn(pool.clone().claim_loop());
            let interval = self.sweep_interval.unwrap_or((self.worker.lease_ttl / 3).min(Duration::from_secs(5)));
            let sweeper = Sweeper::new(
                store.clone(),
                self.clock.clone(),
                SweepConfig {
                    interval,
                    queue_ttl: self.worker.queue_ttl,
                    job_ttl: self.job_ttl,
                    event_ttl: self.event_ttl,
                },
            )
            .with_metrics(metrics.clone());
            tokio::spawn(sweeper.run(stop_rx));
        } else {
            pool.state.send_replace(PoolState::Stopped);
        }
        let events = events::EventHub::new(store.clone(), self.event_poll);
        Ok(Runtime {
            inner: Arc::new(Inner {
                events,
                queue: Default::default(),
                known_plugins: Default::default(),
                declared: Default::default(),
                store,
                sandbox,
                pool,
                stop_sweeps,
                lag_watch,
                registration: std::sync::Mutex::new(registration),
                metrics,
                remote: self.remote.clone(),
                settings: self,
            }),
        })
    }
}

/// A backoff a job may use: a base of at least 1 ms, no more than its cap,
/// and a cap of at most [`MAX_BACKOFF`].
fn check_backoff(backoff: Backoff) -> Result<(), String> {
    let max_backoff = MAX_BACKOFF.as_millis() as u64;
    if backoff.base_ms == 0 || backoff.base_ms > backoff.cap_ms || backoff.cap_ms > max_backoff {
        return Err(format!(
            "backoff {} ms doubling to {} ms is out of range: use a base of at least 1 ms, no more than the cap, \
             and a cap of at most {max_backoff} ms",
            backoff.base_ms, backoff.cap_ms
        ));
    }
    Ok(())
}

/// The admission estimate of queued jobs.
#[derive(Debug, Default)]
struct QueueDepth {
    queued: u64,
    counted_at: Option<std::time::Instant>,
    /// This process's claim count when the store was counted.
    claimed_then: u64,
}

#[derive(Debug)]
struct Inner {
    events: Arc<events::EventHub>,
    queue: std::sync::Mutex<QueueDepth>,
    known_plugins: std::sync::Mutex<std::collections::HashSet<Digest>>,
    /// Each digest's declared requests, read once per process.
    declared: std::sync::Mutex<std::collections::HashMap<Digest, Option<Arc<Requests>>>>,
    store: Arc<dyn JobStore>,
    sandbox: Arc<Sandbox>,
    pool: Arc<Pool>,
    stop_sweeps: watch::Sender<bool>,
    lag_watch: tokio::task::JoinHandle<()>,
    /// The worker-registry reports; its last one says `stopped`.
    registration: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    metrics: Arc<Metrics>,
    /// The pool in another process, when this runtime runs none.
    remote: Option<Arc<dyn RemotePool>>,
    settings: RuntimeBuilder,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.lag_watch.abort();
    }
}

/// A running leash: store, sandbox, worker pool and sweeps. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Runtime {
    inner: Arc<Inner>,
}

impl Runtime {
    /// A builder for a runtime on the store `database` names: a path or
    /// `sqlite:PATH` (SQLite), or `postgres://…` (see [`Database::parse`]).
    pub fn builder(database: impl Into<Database>) -> RuntimeBuilder {
        RuntimeBuilder {
            database: database.into(),
            store: None,
            durability: Durability::Normal,
            sandbox: SandboxConfig::default(),
            worker: WorkerConfig {
                max_workers: DEFAULT_MAX_WORKERS,
                poll_interval: DEFAULT_POLL_INTERVAL,
                lease_ttl: DEFAULT_LEASE_TTL,
                cancel_grace: sandbox::DEFAULT_CANCEL_GRACE,
                shutdown_budget: DEFAULT_SHUTDOWN_BUDGET,
                queue_ttl: DEFAULT_QUEUE_TTL,
                max_timeout: DEFAULT_MAX_TIMEOUT,
                max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
                guest_log_level: None,
                isolate_guests: true,
                guest_nice: 0,
                suspect_alone_for: crate::worker::DEFAULT_SUSPECT_ALONE_FOR,
            },
            job_ttl: DEFAULT_JOB_TTL,
            event_ttl: DEFAULT_EVENT_TTL,
            event_poll: DEFAULT_EVENT_POLL,
            sweep_interval: None,
            max_queued: DEFAULT_MAX_QUEUED,
            max_queue_ttl: DEFAULT_MAX_QUEUE_TTL,
            default_timeout: sandbox::DEFAULT_TIMEOUT,
            default_memory_bytes: sandbox::DEFAULT_MEMORY_BYTES,
            default_output_bytes: sandbox::DEFAULT_OUTPUT_BYTES,
            default_max_attempts: 1,
            free_rerun_limit: DEFAULT_FREE_RERUNS,
            approval_ttl: DEFAULT_APPROVAL_TTL,
            default_backoff: Backoff::default(),
            clock: Arc::new(SystemClock),
            workers: true,
            remote: None,
            worker_id: None,
            start_subscribers: Vec::new(),
            subscribers: Vec::new(),
        }
    }

    /// The store this runtime uses.
    pub fn store(&self) -> &Arc<dyn JobStore> {
        &self.inner.store
    }

    /// This process's metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// Job and worker events after `after` (`None`: from now on) that pass
    /// `filter`, from every process sharing the store, in the store's
    /// order (see [`crate::store::EventId`]).
    pub async fn events(&self, after: Option<EventId>, filter: EventFilter) -> Result<EventStream, RuntimeError> {
        self.inner.events.subscribe(after, filter).await
    }

    /// This process's worker id.
    pub fn worker_id(&self) -> &str {
        &self.inner.pool.worker_id
    }

    /// Validate, precompile and store a plugin, and register it under
    /// `name@version` (replacing what that pair pointed at: jobs already
    /// queued keep their digest).
    pub async fn plugin_register(&self, bytes: Vec<u8>, name: PluginName) -> Result<PluginInfo, RuntimeError> {
        self.plugin_register_with(bytes, name, None).await
    }

    /// [`Runtime::plugin_register`] with an approval policy set in the same
    /// step, so no job is submitted under the name ungated in between
    /// (`None` keeps a replaced pair's policy).
    pub async fn plugin_register_with(
        &self,
        bytes: Vec<u8>,
        name: PluginName,
        policy: Option<ApprovalPolicy>,
    ) -> Result<PluginInfo, RuntimeError> {
        if let Some(policy) = &policy {
            policy.check().map_err(RuntimeError::InvalidJob)?;
        }
        let digest = self.plugin_add(bytes).await?;
        let now = self.inner.settings.clock.now();
        let info = self.inner.store.plugin_name_set(PluginNameParams { name, digest, policy, now }).await?;
        self.with_requests(info).await
    }

    /// `info` with what its component declares.
    async fn with_requests(&self, mut info: PluginInfo) -> Result<PluginInfo, RuntimeError> {
        info.requests = self.declared(info.digest).await?.map(|r| r.as_ref().clone());
        Ok(info)
    }

    /// What the component `digest` declares it asks for, read from its
    /// bytes once per process.
    async fn declared(&self, digest: Digest) -> Result<Option<Arc<Requests>>, RuntimeError> {
        if let Some(known) = self.inner.declared.lock().unwrap_or_else(|e| e.into_inner()).get(&digest) {
            return Ok(known.clone());
        }
        let bytes = self
            .inner
            .store
            .plugin_get(digest)
            .await?
            .ok_or_else(|| RuntimeError::UnknownPlugin(digest.to_string()))?;
        let requests = declaration(&bytes)?;
        self.inner.declared.lock().unwrap_or_else(|e| e.into_inner()).insert(digest, requests.clone());
        Ok(requests)
    }

    /// Replace what jobs of a registered `name@version` may use outside
    /// their sandbox (jobs already submitted keep what they were granted).
    pub async fn plugin_grant(&self, name: PluginName, grants: Grants) -> Result<PluginInfo, RuntimeError> {
        grants.check().map_err(RuntimeError::InvalidGrant)?;
        let shown = name.to_string();
        let info = self
            .inner
            .store
            .plugin_grants_set(PluginGrantsParams { name, grants })
            .await?
            .ok_or(RuntimeError::UnknownPlugin(shown))?;
        self.with_requests(info).await
    }

    /// Registered plugins: names in order (newest version first), then
    /// unnamed digests.
    pub async fn plugins(&self) -> Result<Vec<PluginInfo>, RuntimeError> {
        let mut listed = Vec::new();
        for info in self.inner.store.plugin_list().await? {
            listed.push(self.with_requests(info).await?);
        }
        Ok(listed)
    }

    /// Resolve a plugin reference.
    pub async fn plugin(&self, plugin: PluginRef) -> Result<PluginInfo, RuntimeError> {
        let shown = plugin.to_string();
        let info = self.inner.store.plugin_resolve(plugin).await?.ok_or(RuntimeError::UnknownPlugin(shown))?;
        self.with_requests(info).await
    }

    /// Validate, precompile and store a plugin; returns its digest.
    pub async fn plugin_add(&self, bytes: Vec<u8>) -> Result<Digest, RuntimeError> {
        let bytes = Arc::new(bytes);
        self.inner.sandbox.compile(bytes.clone()).await.map_err(RuntimeError::InvalidPlugin)?;
        // A declaration that does not parse is refused with the plugin; one
        // that does is kept, so the first job by name need not read it back.
        let declared = declaration(&bytes)?;
        // The compile's share is dropped once it returns: no copy is made.
        let bytes = Arc::try_unwrap(bytes).unwrap_or_else(|shared| shared.as_ref().clone());
        let now = self.inner.settings.clock.now();
        let digest = self.inner.store.plugin_put(PluginPutParams { bytes, now }).await?;
        self.inner.known_plugins.lock().unwrap_or_else(|e| e.into_inner()).insert(digest);
        self.inner.declared.lock().unwrap_or_else(|e| e.into_inner()).insert(digest, declared);
        Ok(digest)
    }

    /// Validate and queue jobs in one transaction. All validation happens
    /// here: a bad job is refused, never queued to fail later.
    pub async fn submit_many(&self, jobs: Vec<Submit>) -> Result<Vec<JobId>, RuntimeError> {
        Ok(self.insert(jobs, false).await?.into_iter().map(|j| j.id).collect())
    }

    /// Validate and queue a batch of jobs in one transaction, all or
    /// nothing, as `POST /v1/jobs:batch` does: a refused job fails the
    /// batch with [`RuntimeError::InBatch`], naming its place.
    ///
    /// Idempotency keys are each job's own. When a job's key already
    /// belongs to the same request, the batch was queued before (it went
    /// in whole or not at all): the answer is that batch's jobs, each
    /// marked replayed, and nothing new is queued.
    pub async fn submit_batch(&self, jobs: Vec<Submit>) -> Result<Vec<Submitted>, RuntimeError> {
        let keys: Vec<Option<String>> = jobs.iter().map(|j| j.idempotency.as_ref().map(|i| i.key.clone())).collect();
        let replayed_key = match self.insert(jobs, true).await {
            Ok(jobs) => {
                return Ok(jobs
                    .into_iter()
                    .map(|j| Submitted { id: j.id, status: j.status, replayed: false })
                    .collect());
            }
            Err(RuntimeError::Store(StoreError::IdempotencyKeyTaken { key, same_request: true, .. })) => key,
            Err(e) => return Err(e),
        };
        let wanted: Vec<String> = keys.iter().flatten().cloned().collect();
        let found = self.inner.store.jobs_by_idempotency_key(wanted.clone()).await?;
        let missing =
            wanted.iter().filter(|k| !found.contains_key(*k)).count() + keys.iter().filter(|k| k.is_none()).count();
        if missing > 0 {
            return Err(RuntimeError::ReplayIncomplete { key: replayed_key, missing });
        }
        Ok(wanted.iter().map(|k| found[k]).map(|(id, status)| Submitted { id, status, replayed: true }).collect())
    }

    /// [`Runtime::submit_many`], answering the jobs as stored; `batch`
    /// names a refused job's place in its error.
    async fn insert(&self, jobs: Vec<Submit>, batch: bool) -> Result<Vec<Job>, RuntimeError> {
        let new_jobs = self.prepare(jobs, batch).await?;
        let now = self.inner.settings.clock.now();
        let inserted = match self.inner.store.job_insert(JobInsertParams { jobs: new_jobs, now }).await {
            Err(StoreError::IdempotencyKeyTaken { key, job, same_request: false }) => {
                return Err(RuntimeError::IdempotencyConflict { key, job });
            }
            other => other?,
        };
        self.count_queued(&inserted);
        Ok(inserted)
    }

    /// Count the queued ones of jobs this process just stored, and wake
    /// the pool for them. Gated jobs wait for a person, not for a worker.
    fn count_queued(&self, jobs: &[Job]) {
        let queued = jobs.iter().filter(|j| j.status == JobStatus::Queued).count() as u64;
        if queued > 0 {
            self.inner.queue.lock().unwrap_or_else(|e| e.into_inner()).queued += queued;
            self.nudge();
        }
    }

    /// Admission, then every check a job must pass, and the jobs as the
    /// store takes them. With `batch`, a refusal names the job's place.
    async fn prepare(&self, jobs: Vec<Submit>, batch: bool) -> Result<Vec<NewJob>, RuntimeError> {
        let at = |index: usize| {
            move |error: RuntimeError| {
                if batch { RuntimeError::InBatch { index, error: Box::new(error) } } else { error }
            }
        };
        let settings = &self.inner.settings;
        let mut queued = self.queue_depth(false).await?;
        if queued + jobs.len() as u64 > settings.max_queued {
            // Refused only on a fresh count: the estimate cannot see claims
            // made by other processes (a supervised pool's included).
            queued = self.queue_depth(true).await?;
            if queued + jobs.len() as u64 > settings.max_queued {
                return Err(RuntimeError::Backpressure { queued, limit: settings.max_queued });
            }
        }
        let mut checked: Vec<(Digest, Option<PluginName>, Grants, bool, Submit)> = Vec::with_capacity(jobs.len());
        // A batch names few plugins: each is read once per call.
        let mut registered: Vec<(PluginRef, PluginInfo)> = Vec::new();
        for (index, job) in jobs.into_iter().enumerate() {
            let at = at(index);
            // A job is granted what its plugin's registration grants now,
            // narrowed to what its component declares (if it declares
            // anything), pinned; bytes and bare digests are granted nothing
            // and have no approval policy (there is nothing granted to
            // guard).
            let (digest, name, grants, gated_by_policy) = match &job.plugin {
                PluginSource::Bytes(bytes) => {
                    (self.plugin_add(bytes.clone()).await.map_err(at)?, None, Grants::default(), false)
                }
                PluginSource::Digest(digest) | PluginSource::Ref(PluginRef::Digest(digest)) => {
                    self.check_plugin_known(*digest).await.map_err(at)?;
                    (*digest, None, Grants::default(), false)
                }
                PluginSource::Ref(named) => {
                    let info = match registered.iter().find(|(known, _)| known == named) {
                        Some((_, info)) => info.clone(),
                        None => {
                            let info = self.plugin(named.clone()).await.map_err(at)?;
                            registered.push((named.clone(), info.clone()));
                            info
                        }
                    };
                    let gated = info.approval.gates(&job.target);
                    if gated && job.approval == Some(false) {
                        return Err(at(RuntimeError::ApprovalRequired {
                            plugin: named.to_string(),
                            target: job.target.clone(),
                        }));
                    }
                    let grants = match &info.requests {
                        Some(requests) => info.grants.within(requests),
                        None => info.grants,
                    };
                    (info.digest, info.name, grants, gated)
                }
            };
            checked.push((digest, name, grants, gated_by_policy, job));
        }
        let mut new_jobs = Vec::with_capacity(checked.len());
        for (index, (digest, name, grants, gated_by_policy, job)) in checked.into_iter().enumerate() {
            new_jobs.push(self.new_job(digest, name, grants, gated_by_policy, job).map_err(at(index))?);
        }
        Ok(new_jobs)
    }

    /// Queued jobs, for admission: counted in the store at most once per
    /// poll interval (or now, with `recount`), plus what this process
    /// submitted since, less what it claimed since. Counting on every
    /// submit would cost a scan per job.
    async fn queue_depth(&self, recount: bool) -> Result<u64, RuntimeError> {
        let fresh_for = self.inner.settings.worker.poll_interval;
        let stale = recount || {
            let queue = self.inner.queue.lock().unwrap_or_else(|e| e.into_inner());
            queue.counted_at.is_none_or(|at| at.elapsed() >= fresh_for)
        };
        let claimed = || self.inner.pool.stats.claimed.load(Ordering::Relaxed);
        if stale {
            let claimed_then = claimed();
            let queued = self.inner.store.queued_count().await?;
            let mut queue = self.inner.queue.lock().unwrap_or_else(|e| e.into_inner());
            *queue = QueueDepth { queued, counted_at: Some(std::time::Instant::now()), claimed_then };
        }
        let queue = self.inner.queue.lock().unwrap_or_else(|e| e.into_inner());
        Ok(queue.queued.saturating_sub(claimed().saturating_sub(queue.claimed_then)))
    }

    /// Plugins are immutable by digest, so one successful look-up is
    /// remembered instead of reading the bytes on every submit.
    async fn check_plugin_known(&self, digest: Digest) -> Result<(), RuntimeError> {
        if self.inner.known_plugins.lock().unwrap_or_else(|e| e.into_inner()).contains(&digest) {
            return Ok(());
        }
        if self.inner.store.plugin_get(digest).await?.is_none() {
            return Err(RuntimeError::UnknownPlugin(digest.to_string()));
        }
        self.inner.known_plugins.lock().unwrap_or_else(|e| e.into_inner()).insert(digest);
        Ok(())
    }

    /// Validate and queue one job.
    pub async fn submit(&self, job: Submit) -> Result<JobId, RuntimeError> {
        Ok(self.submit_once(job).await?.id)
    }

    /// Validate and queue one job, honouring its idempotency key: a replay
    /// (the key already belonged to this same request) queues nothing new
    /// and answers the first request's job.
    pub async fn submit_once(&self, job: Submit) -> Result<Submitted, RuntimeError> {
        match self.insert(vec![job], false).await {
            Ok(mut jobs) => {
                let job = jobs.remove(0);
                Ok(Submitted { id: job.id, status: job.status, replayed: false })
            }
            Err(RuntimeError::Store(StoreError::IdempotencyKeyTaken { job, same_request: true, .. })) => {
                Ok(Submitted { id: job, status: self.get(job).await?.status, replayed: true })
            }
            Err(e) => Err(e),
        }
    }

    fn new_job(
        &self,
        plugin: Digest,
        plugin_name: Option<PluginName>,
        grants: Grants,
        gated_by_policy: bool,
        job: Submit,
    ) -> Result<NewJob, RuntimeError> {
        let settings = &self.inner.settings;
        let ceiling = settings.sandbox.memory_ceiling_bytes;
        let memory_bytes = job.memory_bytes.unwrap_or(settings.default_memory_bytes);
        if memory_bytes > ceiling {
            return Err(RuntimeError::InvalidJob(format!(
                "memory_bytes {memory_bytes} is over the ceiling of {ceiling}"
            )));
        }
        let timeout = job.timeout.unwrap_or(settings.default_timeout);
        if timeout > settings.worker.max_timeout {
            return Err(RuntimeError::InvalidJob(format!(
                "timeout {} is over the ceiling of {}",
                humantime::format_duration(timeout),
                humantime::format_duration(settings.worker.max_timeout)
            )));
        }
        let output_bytes = job.output_bytes.unwrap_or(settings.default_output_bytes);
        if output_bytes > settings.worker.max_output_bytes {
            return Err(RuntimeError::InvalidJob(format!(
                "output_bytes {output_bytes} is over the ceiling of {}",
                settings.worker.max_output_bytes
            )));
        }
        let queue_ttl = job.queue_ttl.unwrap_or(settings.worker.queue_ttl);
        if queue_ttl.is_zero() || queue_ttl > settings.max_queue_ttl {
            return Err(RuntimeError::InvalidJob(format!(
                "queue_ttl {} is out of range: use 1ms to {}",
                humantime::format_duration(queue_ttl),
                humantime::format_duration(settings.max_queue_ttl)
            )));
        }
        let now = settings.clock.now();
        let delay = job.run_at.map_or(Duration::ZERO, |at| {
            Duration::from_millis(u64::try_from(at.unix_ms().saturating_sub(now.unix_ms())).unwrap_or(0))
        });
        if delay > settings.max_queue_ttl {
            return Err(RuntimeError::InvalidJob(format!(
                "run_at (or its delay) is {} away, past the ceiling of {}",
                humantime::format_duration(delay),
                humantime::format_duration(settings.max_queue_ttl)
            )));
        }
        if let Some(deadline) = job.deadline
            && (deadline.is_zero() || deadline > settings.worker.max_timeout)
        {
            return Err(RuntimeError::InvalidJob(format!(
                "deadline {} is out of range: use 1ms to {}",
                humantime::format_duration(deadline),
                humantime::format_duration(settings.worker.max_timeout)
            )));
        }
        let backoff = job.backoff.unwrap_or(settings.default_backoff);
        check_backoff(backoff).map_err(RuntimeError::InvalidJob)?;
        // The execution mode is stamped on the gate: a sync submit's
        // deadline counts from the run's trigger, not from the submit.
        let source = if gated_by_policy {
            Some(GateSource::Policy)
        } else {
            (job.approval == Some(true)).then_some(GateSource::Request)
        };
        let approval = source.map(|source| Gate {
            source,
            run_on_approve: job.run_on_approve,
            execution: if job.deadline.is_some() { ExecutionMode::Sync } else { ExecutionMode::Async },
            deadline_ms: job.deadline.map(|d| d.as_millis() as u64),
        });
        if approval.is_none() && !job.run_on_approve {
            return Err(RuntimeError::InvalidJob(
                "run_on_approve = false only applies to a job that waits for approval".into(),
            ));
        }
        let new = NewJob {
            plugin,
            plugin_name,
            target: job.target,
            input: job.input,
            limits: JobLimits { timeout_ms: timeout.as_millis() as u64, fuel: job.fuel, memory_bytes, output_bytes },
            grants,
            max_attempts: job.max_attempts.unwrap_or(settings.default_max_attempts),
            free_rerun_limit: settings.free_rerun_limit,
            concurrency_key: job.concurrency_key,
            plan_id: job.plan_id,
            queue_ttl,
            idempotency: job.idempotency,
            run_at: job.run_at,
            deadline: job.deadline,
            backoff,
            approval,
            approval_ttl: settings.approval_ttl,
        };
        new.check().map_err(RuntimeError::InvalidJob)?;
        Ok(new)
    }

    /// One job.
    pub async fn get(&self, id: JobId) -> Result<Job, RuntimeError> {
        self.inner.store.job_get(id).await?.ok_or(RuntimeError::NotFound(id))
    }

    /// Jobs matching the filters, newest first, without input or output
    /// bytes.
    pub async fn list(&self, params: JobListParams) -> Result<Vec<Job>, RuntimeError> {
        Ok(self.inner.store.job_list(params).await?)
    }

    /// A job's effect ledger: every effectful request its attempts made,
    /// by attempt then place.
    pub async fn effects(&self, id: JobId) -> Result<Vec<Effect>, RuntimeError> {
        let effects = self.inner.store.effects(id).await?;
        if effects.is_empty() {
            self.get(id).await?;
        }
        Ok(effects)
    }

    /// What a job's last attempt logged (empty while it runs or if it
    /// logged nothing).
    pub async fn logs(&self, id: JobId) -> Result<JobLogs, RuntimeError> {
        if let Some(logs) = self.inner.store.job_logs(id).await? {
            return Ok(logs);
        }
        self.get(id).await?;
        Ok(JobLogs::default())
    }

    /// The settings limits are checked against.
    pub fn ceilings(&self) -> Ceilings {
        let s = &self.inner.settings;
        Ceilings {
            max_timeout_ms: s.worker.max_timeout.as_millis() as u64,
            max_memory_bytes: s.sandbox.memory_ceiling_bytes,
            max_output_bytes: s.worker.max_output_bytes,
            default_timeout_ms: s.default_timeout.as_millis() as u64,
            max_queue_ttl_ms: s.max_queue_ttl.as_millis() as u64,
            max_attempts: MAX_ATTEMPTS_CEILING,
            backoff: s.default_backoff,
        }
    }

    /// The runtime's clock, read now.
    pub fn now(&self) -> Timestamp {
        self.inner.settings.clock.now()
    }

    /// Wait for a job with a deadline `deadline` from its submission (see
    /// [`Submit::deadline`]) to end. At the deadline a job still queued is
    /// expired at once (not at the next sweep); a running one has its
    /// worker's cancel grace and a few seconds more to record the timeout
    /// its worker gave it. [`RuntimeError::WaitTimeout`] only when even
    /// that passes: its worker stopped without a word.
    pub async fn wait_past_deadline(&self, id: JobId, deadline: Duration) -> Result<Job, RuntimeError> {
        match self.wait_then_expire(id, deadline).await? {
            Some(job) => Ok(job),
            None => self.wait(id, self.inner.settings.worker.cancel_grace + DEADLINE_SETTLE).await,
        }
    }

    /// Wait up to `deadline` (not counted as abandoned); at the deadline,
    /// expire what is still queued past its expiry at once rather than at
    /// the next sweep, and answer `None`.
    async fn wait_then_expire(&self, id: JobId, deadline: Duration) -> Result<Option<Job>, RuntimeError> {
        match self.wait_uncounted(id, deadline).await {
            Err(RuntimeError::WaitTimeout(_)) => {}
            other => return other.map(Some),
        }
        self.inner.store.jobs_expire_queued(JobsExpireParams { now: self.now() }).await?;
        Ok(None)
    }

    /// Wait until the job ends, up to `timeout`. Timing out does not cancel
    /// the job; it is counted as an abandoned wait
    /// (`leash_waits_abandoned_total`, `waits_abandoned` in health). Woken
    /// at once by completions in this process; jobs run by other processes
    /// are polled every `poll_interval`.
    pub async fn wait(&self, id: JobId, timeout: Duration) -> Result<Job, RuntimeError> {
        let waited = self.wait_uncounted(id, timeout).await;
        if matches!(waited, Err(RuntimeError::WaitTimeout(_))) {
            self.count_abandoned_wait();
        }
        waited
    }

    /// Submit a job with an operation deadline and wait for it (seed 003's
    /// waiter): the job must start within `deadline` — its queue TTL is cut
    /// to it, so if the deadline passes first it never starts and ends
    /// `expired` — and the wait ends at the deadline too. A job that
    /// started in time runs on to its own limits when the wait ends: the
    /// caller gets [`RuntimeError::WaitTimeout`], counted as an abandoned
    /// wait, and reads the outcome later.
    ///
    /// A job that must wait for approval is answered at once, in
    /// `pending_approval`; whoever triggers its run ([`Runtime::approve`],
    /// [`Runtime::run_approved`]) can wait for the outcome.
    pub async fn call(&self, mut job: Submit, deadline: Duration) -> Result<Job, RuntimeError> {
        job.queue_ttl = Some(job.queue_ttl.map_or(deadline, |ttl| ttl.min(deadline)));
        let id = self.submit(job).await?;
        let submitted = self.get(id).await?;
        if submitted.status.is_gated() {
            return Ok(submitted);
        }
        if let Some(job) = self.wait_then_expire(id, deadline).await? {
            return Ok(job);
        }
        let job = self.get(id).await?;
        if job.status.is_terminal() {
            return Ok(job);
        }
        self.count_abandoned_wait();
        Err(RuntimeError::WaitTimeout(id))
    }

    /// A waiter gave up on a job that goes on.
    pub(crate) fn count_abandoned_wait(&self) {
        self.inner.metrics.waits_abandoned.inc();
    }

    async fn wait_uncounted(&self, id: JobId, timeout: Duration) -> Result<Job, RuntimeError> {
        let mut completions = self.inner.pool.completions.subscribe();
        let poll = self.inner.settings.worker.poll_interval;
        let waiting = async {
            loop {
                match self.get(id).await {
                    Ok(job) if job.status.is_terminal() => return Ok(job),
                    Ok(_) => {}
                    // A store that is briefly unreachable: ask again at the
                    // next poll, within the caller's timeout.
                    Err(RuntimeError::Store(e)) if e.is_transient() => {}
                    Err(e) => return Err(e),
                }
                let sleep = tokio::time::sleep(poll);
                tokio::pin!(sleep);
                loop {
                    tokio::select! {
                        _ = &mut sleep => break,
                        event = completions.recv() => match event {
                            Ok(c) if c.id == id => break,
                            Ok(_) => {}
                            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => break,
                            Err(tokio::sync::broadcast::error::RecvError::Closed) => {}
                        },
                    }
                }
            }
        };
        tokio::time::timeout(timeout, waiting).await.map_err(|_| RuntimeError::WaitTimeout(id))?
    }

    /// Cancel: a queued job at once, a running job by asking its owner.
    pub async fn cancel(&self, id: JobId) -> Result<Cancelled, RuntimeError> {
        match self.inner.store.job_cancel(id, self.inner.settings.clock.now()).await? {
            CancelResult::Cancelled => Ok(Cancelled::Cancelled),
            CancelResult::Requested => {
                // If this process (or its pool's) runs it, stop it now
                // rather than at the next lease renewal.
                self.inner.pool.cancel_local(id);
                if let Some(remote) = &self.inner.remote {
                    remote.cancel(id);
                }
                Ok(Cancelled::Requested)
            }
            CancelResult::AlreadyTerminal(status) => Err(RuntimeError::AlreadyTerminal { id, status }),
            CancelResult::NotFound => Err(RuntimeError::NotFound(id)),
        }
    }

    /// Call `subscriber` for every job this process finishes from now on
    /// ([`RuntimeBuilder::on_complete`] hears them from the first claim).
    pub fn on_complete(&self, subscriber: impl Fn(&Completion) + Send + Sync + 'static) {
        let subscriber: Subscriber = Box::new(subscriber);
        self.inner.pool.subscribe(subscriber);
    }

    /// Call `subscriber` when a job this process claimed starts running its
    /// guest (after the claim, the plugin load and, if the claim has grown
    /// old, a lease renewal). A panicking subscriber is isolated like a
    /// completion subscriber. The pool is already claiming: starts before
    /// this call are not heard; [`RuntimeBuilder::on_start`] hears them all.
    pub fn on_start(&self, subscriber: impl Fn(&JobStarted) + Send + Sync + 'static) {
        self.inner.pool.subscribe_starts(Box::new(subscriber));
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
        let summary = match live.iter().map(|w| w.poll_interval_ms).min() {
            None => "Async workers: disabled (no live worker)".to_owned(),
            Some(poll_ms) => format!(
                "Async workers: enabled, max_workers={}, poll_interval={:.1}s",
                live.iter().map(|w| u64::from(w.slots)).sum::<u64>(),
                poll_ms as f64 / 1000.0
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
        })
    }

    /// The Prometheus text exposition, with the queue depth and pool gauges
    /// read now (from the pool's process, when it runs in another).
    pub async fn metrics_text(&self) -> Result<String, RuntimeError> {
        let counts = self.inner.store.counts_snapshot().await?;
        let metrics = &self.inner.metrics;
        metrics.set_counts(&counts);
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
    fn set_pool_gauges(&self) {
        let pool = &self.inner.pool;
        let metrics = &self.inner.metrics;
        let running = pool.running_count();
        metrics.running.set(running as i64);
        metrics.pool_size.set(pool.config.max_workers as i64);
        metrics.free_slots.set(pool.config.max_workers.saturating_sub(running) as i64);
    }

    /// Stop claiming, stop running guests (cooperatively, then by force)
    /// and release their leases, within the shutdown budget. Idempotent.
    pub async fn shutdown(&self) {
        self.inner.stop_sweeps.send_replace(true);
        if *self.inner.pool.state.borrow() == PoolState::Stopped {
            return;
        }
        self.inner.pool.shutdown().await;
        // The registry's last report (`stopped`), briefly: a store that
        // does not answer must not hold the process.
        let registration = self.inner.registration.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(registration) = registration {
            let _ = tokio::time::timeout(REGISTRY_FAREWELL, registration).await;
        }
    }
}
