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
use std::time::Duration;

use tokio::sync::watch;

use crate::clock::Timestamp;
use crate::job::{Attempt, Digest, Effect, EventId, Job, JobId, JobLogs, JobStatus};
use crate::metrics::Metrics;
use crate::sandbox::Sandbox;
use crate::store::{EventFilter, JobListParams, JobStore};
use crate::worker::{Completion, JobStarted, Pool, PoolState, Subscriber};

mod access;
mod approval;
mod audit;
mod builder;
mod code;
mod error;
mod events;
mod health;
mod pauses;
mod plan;
mod plugins;
mod rate_limits;
mod redrive;
mod remote;
mod schedules;
mod sessions;
mod standing;
mod submit;
pub mod sweep;
mod wait;
mod why;
pub use access::MAX_TOKEN_TTL;
pub use approval::{DecisionBy, RememberFor};
pub use builder::RuntimeBuilder;
pub use code::DEFAULT_SHARED_CODE_BYTES;
pub use error::RuntimeError;
pub use events::{DEFAULT_EVENT_POLL, DEFAULT_EVENT_TTL, EventStream, StreamItem};
pub use health::{Ceilings, Health, WorkerView, Workers};
pub use plan::{PlanCreated, PlanPhaseRef, PlanSubmit, PlanView};
pub use rate_limits::EgressRules;
pub use redrive::{MAX_REDRIVE_PAGE, RedriveRefused, RedriveReport};
pub use remote::{PoolReport, RemotePool, Supervision};
pub use schedules::{FireReport, SCHEDULE_TICK, ScheduleSpec, ScheduleView};
use submit::QueueDepth;
pub use submit::{PluginSource, Submit, Submitted};
pub use wait::{Called, Cancelled};
pub use why::{Around, PoolFacts, Why, explain};

/// Default job slots per process.
pub const DEFAULT_MAX_WORKERS: usize = 4;
/// Default fallback poll for jobs from other processes.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Default lease length.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);
/// Default retention of terminal jobs.
pub const DEFAULT_JOB_TTL: Duration = Duration::from_secs(86_400);
pub use crate::job::DEFAULT_QUEUE_TTL;
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
/// Longest shutdown waits for compiled code being written to the cache.
const CACHE_WRITE_WAIT: Duration = Duration::from_secs(5);
/// How long past a job's deadline (and its cancel grace) a sync waiter
/// waits for the worker to record the ending.
const DEADLINE_SETTLE: Duration = Duration::from_secs(5);
/// Longest pause a job's retry backoff may ask for.
pub const MAX_BACKOFF: Duration = Duration::from_secs(86_400);

#[derive(Debug)]
struct Inner {
    events: Arc<events::EventHub>,
    queue: std::sync::Mutex<QueueDepth>,
    known_plugins: std::sync::Mutex<std::collections::HashSet<Digest>>,
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
    /// The principal this handle acts for ([`Runtime::acting_as`]): its
    /// changes are recorded in the audit trail as that principal's.
    actor: Option<Arc<str>>,
}

impl Runtime {
    /// A handle on the same runtime acting for `principal`: the changes it
    /// makes (plugins, grants, policies, principals, tokens, cancels) are
    /// audited as that principal's, and the jobs it submits name it as
    /// their submitter unless they name one. The HTTP API serves each
    /// request through one; an embedder's own handle acts for no one.
    pub fn acting_as(&self, principal: &str) -> Runtime {
        Runtime { inner: self.inner.clone(), actor: Some(principal.into()) }
    }

    /// The principal this handle acts for, if any.
    pub fn actor(&self) -> Option<String> {
        self.actor.as_deref().map(str::to_owned)
    }

    /// The store this runtime uses.
    pub fn store(&self) -> &Arc<dyn JobStore> {
        &self.inner.store
    }

    /// This process's sandbox (its engine and compile caches).
    pub fn sandbox(&self) -> &Arc<Sandbox> {
        &self.inner.sandbox
    }

    /// This process's metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// Job and worker events after `after` (`None`: from now on) that pass
    /// `filter`, from every process sharing the store, in the store's
    /// order (see [`crate::job::EventId`]).
    pub async fn events(&self, after: Option<EventId>, filter: EventFilter) -> Result<EventStream, RuntimeError> {
        self.inner.events.subscribe(after, filter).await
    }

    /// This process's worker id.
    pub fn worker_id(&self) -> &str {
        &self.inner.pool.worker_id
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

    /// A job's attempts, oldest first: each run's worker, start, end,
    /// outcome, error and logs (the latest attempts' logs; older ones are
    /// marked `logs_cut`). `job` is the job as just read.
    pub async fn attempts(&self, job: &Job) -> Result<Vec<Attempt>, RuntimeError> {
        let earlier = self.inner.store.job_earlier_attempts(job.id).await?;
        let logs = match job.status {
            JobStatus::Succeeded | JobStatus::Failed | JobStatus::Cancelled => {
                self.inner.store.job_logs(job.id).await?
            }
            _ => None,
        };
        Ok(crate::job::timeline(job, logs, earlier))
    }

    /// The runtime's clock, read now.
    pub fn now(&self) -> Timestamp {
        self.inner.settings.clock.now()
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

    /// Stop claiming, stop running guests (cooperatively, then by force)
    /// and release their leases, within the shutdown budget; then wait (at
    /// most 5 s) for compiled code still being written to the compile
    /// cache. Idempotent.
    pub async fn shutdown(&self) {
        self.inner.stop_sweeps.send_replace(true);
        if *self.inner.pool.state.borrow() != PoolState::Stopped {
            self.inner.pool.shutdown().await;
            // The registry's last report (`stopped`), briefly: a store that
            // does not answer must not hold the process.
            let registration = self.inner.registration.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(registration) = registration {
                let _ = tokio::time::timeout(REGISTRY_FAREWELL, registration).await;
            }
        }
        // Once the jobs are put back: baseline code compiled here and still
        // being written (`plugins add` of a large plugin just now), so the
        // next process finds it.
        let _ = tokio::time::timeout(CACHE_WRITE_WAIT, self.inner.sandbox.cached()).await;
    }
}
