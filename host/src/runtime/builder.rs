//! Building a [`Runtime`]: its settings and what `build` starts.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::sweep::{SweepConfig, Sweeper};
use crate::clock::{Clock, SystemClock};
use crate::job::{Backoff, DEFAULT_APPROVAL_TTL, MAX_ATTEMPTS_CEILING};
use crate::metrics::Metrics;
use crate::sandbox::{self, Sandbox, SandboxConfig};
use crate::store::{Database, Durability, JobStore};
use crate::worker::{Completion, JobStarted, Pool, PoolState, Subscriber, WorkerConfig};

use super::plugins::declare_stored_plugins;
use super::submit::check_backoff;
use super::{
    DEFAULT_EVENT_POLL, DEFAULT_EVENT_TTL, DEFAULT_FREE_RERUNS, DEFAULT_JOB_TTL, DEFAULT_LEASE_TTL,
    DEFAULT_MAX_OUTPUT_BYTES, DEFAULT_MAX_QUEUE_TTL, DEFAULT_MAX_QUEUED, DEFAULT_MAX_TIMEOUT, DEFAULT_MAX_WORKERS,
    DEFAULT_POLL_INTERVAL, DEFAULT_QUEUE_TTL, DEFAULT_SHUTDOWN_BUDGET, Inner, RemotePool, Runtime, RuntimeError,
    events, plan,
};

/// Builds a [`Runtime`].
pub struct RuntimeBuilder {
    pub(super) database: Database,
    pub(super) store: Option<Arc<dyn JobStore>>,
    pub(super) durability: Durability,
    pub(super) sandbox: SandboxConfig,
    pub(super) shared_code_bytes: Option<u64>,
    pub(super) worker: WorkerConfig,
    pub(super) job_ttl: Duration,
    pub(super) event_ttl: Duration,
    pub(super) audit_ttl: Option<Duration>,
    pub(super) event_poll: Duration,
    pub(super) sweep_interval: Option<Duration>,
    pub(super) max_queued: u64,
    pub(super) max_queue_ttl: Duration,
    pub(super) default_timeout: Duration,
    pub(super) default_memory_bytes: u64,
    pub(super) default_output_bytes: u64,
    pub(super) default_max_attempts: u32,
    pub(super) free_rerun_limit: u32,
    pub(super) approval_ttl: Duration,
    pub(super) default_backoff: Backoff,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) workers: bool,
    pub(super) remote: Option<Arc<dyn RemotePool>>,
    pub(super) worker_id: Option<String>,
    pub(super) start_subscribers: Vec<crate::worker::StartSubscriber>,
    pub(super) subscribers: Vec<Subscriber>,
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

    /// Most bytes of compiled code the store keeps for every process
    /// (least recently used dropped first): a worker that never compiled a
    /// plugin reads its code from there. 0 keeps none. Default: 2 GiB on
    /// PostgreSQL; none on SQLite, whose processes share one machine and
    /// so its compile cache folder.
    pub fn shared_code_bytes(mut self, bytes: u64) -> Self {
        self.shared_code_bytes = Some(bytes);
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

    /// Retention of audit rows (default: kept for ever). The sweep deletes
    /// rows older than this as one prefix of the chain, and the head keeps
    /// where the rows kept start, so `audit verify` still checks every row
    /// kept.
    pub fn audit_ttl(mut self, d: Duration) -> Self {
        self.audit_ttl = Some(d);
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

    /// Time between sweeps: the one set, else a third of the lease TTL,
    /// at most 5 s.
    pub(super) fn sweep_every(&self) -> Duration {
        self.sweep_interval.unwrap_or((self.worker.lease_ttl / 3).min(Duration::from_secs(5)))
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

    /// A slot claims jobs ahead (run as soon as the slot is free, while
    /// the finishes before them commit) only after an attempt shorter than
    /// this (default 100 ms; zero claims none ahead); a job ahead waits at
    /// most this long for its slot. See `docs/ARCHITECTURE.md`, "Claim".
    pub fn claim_ahead_below(mut self, d: Duration) -> Self {
        self.worker.claim_ahead_below = d;
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
        declare_stored_plugins(store.as_ref(), self.clock.as_ref()).await?;
        let mut sandbox_config = self.sandbox.clone();
        let shared_code_bytes = self.shared_code_bytes.unwrap_or(match self.database {
            Database::Postgres(_) => super::code::DEFAULT_SHARED_CODE_BYTES,
            Database::Sqlite(_) => 0,
        });
        if shared_code_bytes > 0 {
            sandbox_config.shared_code = Some(Arc::new(super::code::StoreCode {
                store: store.clone(),
                clock: self.clock.clone(),
                handle: tokio::runtime::Handle::current(),
                bound: shared_code_bytes,
            }));
        }
        let sandbox = Arc::new(Sandbox::new(sandbox_config).map_err(RuntimeError::Sandbox)?);
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
            let interval = self.sweep_every();
            let sweeper = Sweeper::new(
                store.clone(),
                self.clock.clone(),
                SweepConfig {
                    interval,
                    queue_ttl: self.worker.queue_ttl,
                    job_ttl: self.job_ttl,
                    event_ttl: self.event_ttl,
                    audit_ttl: self.audit_ttl,
                },
            )
            .with_metrics(metrics.clone());
            tokio::spawn(sweeper.run(stop_rx.clone()));
        } else {
            pool.state.send_replace(PoolState::Stopped);
        }
        let events = events::EventHub::new(store.clone(), self.event_poll);
        let scheduling = self.workers.then(|| stop_rx.clone());
        let runtime = Runtime {
            actor: None,
            inner: Arc::new(Inner {
                events,
                queue: Default::default(),
                known_plugins: Default::default(),
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
        };
        if let Some(stop) = scheduling {
            tokio::spawn(super::schedules::schedule_loop(Arc::downgrade(&runtime.inner), stop));
        }
        Ok(runtime)
    }
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
            shared_code_bytes: None,
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
                claim_ahead_below: crate::worker::DEFAULT_CLAIM_AHEAD_BELOW,
            },
            job_ttl: DEFAULT_JOB_TTL,
            event_ttl: DEFAULT_EVENT_TTL,
            audit_ttl: None,
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
}
