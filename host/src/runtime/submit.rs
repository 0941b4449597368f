//! Submitting: admission, validation against the ceilings and the
//! plugin's registration, and the insert.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::access::{Principal, PrincipalCeilings};
use crate::clock::Timestamp;
use crate::job::rate::{KeySource, check_limit_name, render_key};
use crate::job::{
    Backoff, Digest, Duties, ExecutionMode, Gate, GateSource, Grants, IdempotencyKey, Job, JobId, JobLimits, JobStatus,
    NewJob, PluginInfo, PluginName, PluginRef, Target, millis,
};
use crate::store::{JobInsertParams, StoreError};

use super::{MAX_BACKOFF, Runtime, RuntimeError};

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
    /// then, and its run is cut to end by then ([`Runtime::call`] sets it).
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
    /// The principal submitting it, recorded with the job (the HTTP API
    /// sets the caller's; `None`: the embedder's own submit). Where the
    /// job's policy separates duties, this principal may not approve it.
    pub submitted_by: Option<String>,
    /// Claim order: 0 (first, the default) to
    /// [`LOWEST_PRIORITY`](crate::job::LOWEST_PRIORITY) (last).
    pub priority: Option<u8>,
    /// The schedule submitting it (set by the scheduler alone).
    pub(crate) schedule_id: Option<JobId>,
    /// Tags to find it by (at most 16).
    pub tags: Vec<String>,
    /// Metadata to find it by: strings, numbers and booleans by key (at
    /// most 16 keys).
    pub metadata: serde_json::Map<String, serde_json::Value>,
    /// A rate limit its starts count against (one that exists).
    pub rate_limit: Option<String>,
    /// Its bucket within the limit: a template over `{principal}`,
    /// `{plugin}` and `{input.FIELD}`, rendered at submit (none: the
    /// limit's one bucket).
    pub rate_key: Option<String>,
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
            submitted_by: None,
            priority: None,
            schedule_id: None,
            tags: Vec::new(),
            metadata: serde_json::Map::new(),
            rate_limit: None,
            rate_key: None,
        }
    }
}

/// Whether a job's plugin's policy gates it, and who may approve it if
/// it is gated.
type GateRule = (bool, Duties);

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

/// A backoff a job may use: a base of at least 1 ms, no more than its cap,
/// and a cap of at most [`MAX_BACKOFF`].
pub(super) fn check_backoff(backoff: Backoff) -> Result<(), String> {
    let (base, cap, max_backoff) = (millis::of(backoff.base), millis::of(backoff.cap), millis::of(MAX_BACKOFF));
    if base == 0 || base > cap || cap > max_backoff {
        return Err(format!(
            "backoff {base} ms doubling to {cap} ms is out of range: use a base of at least 1 ms, no more than the \
             cap, and a cap of at most {max_backoff} ms"
        ));
    }
    Ok(())
}

/// The admission estimate of queued jobs.
#[derive(Debug, Default)]
pub(super) struct QueueDepth {
    pub(super) queued: u64,
    counted_at: Option<std::time::Instant>,
    /// This process's claim count when the store was counted.
    claimed_then: u64,
    /// A stale estimate's recount is under way: the submits that come
    /// meanwhile use the estimate rather than count again each.
    counting: bool,
}

/// Clears [`QueueDepth::counting`] however the count ends, a dropped
/// submit's included.
struct Counting<'a>(&'a std::sync::Mutex<QueueDepth>);

impl Drop for Counting<'_> {
    fn drop(&mut self) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).counting = false;
    }
}

impl Runtime {
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
            return Err(RuntimeError::ReplayIncomplete {
                key: IdempotencyKey::sent(&replayed_key).to_owned(),
                missing,
            });
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
                return Err(RuntimeError::IdempotencyConflict { key: IdempotencyKey::sent(&key).to_owned(), job });
            }
            other => other?,
        };
        self.count_queued(&inserted);
        // A standing rule approves a matching gated job as it arrives.
        Ok(self.approve_on_arrival(inserted).await)
    }

    /// Count the queued ones of jobs this process just stored, and wake
    /// the pool for them. Gated jobs wait for a person, not for a worker.
    pub(super) fn count_queued(&self, jobs: &[Job]) {
        let queued = jobs.iter().filter(|j| j.status == JobStatus::Queued).count() as u64;
        if queued > 0 {
            self.inner.queue.lock().unwrap_or_else(|e| e.into_inner()).queued += queued;
            self.nudge();
        }
    }

    /// Admission, then every check a job must pass, and the jobs as the
    /// store takes them. With `batch`, a refusal names the job's place.
    pub(super) async fn prepare(&self, jobs: Vec<Submit>, batch: bool) -> Result<Vec<NewJob>, RuntimeError> {
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
        self.checked(jobs, batch).await
    }

    /// Every check a job must pass (admission aside), and the jobs as the
    /// store takes them. With `batch`, a refusal names the job's place.
    pub(super) async fn checked(&self, jobs: Vec<Submit>, batch: bool) -> Result<Vec<NewJob>, RuntimeError> {
        let at = |index: usize| {
            move |error: RuntimeError| {
                if batch { RuntimeError::InBatch { index, error: Box::new(error) } } else { error }
            }
        };
        let mut checked: Vec<(Digest, Option<PluginName>, Grants, GateRule, Submit)> = Vec::with_capacity(jobs.len());
        // A batch names few plugins and limits: each is read once per call.
        let mut registered: Vec<(PluginRef, PluginInfo)> = Vec::new();
        let mut limits: Vec<String> = Vec::new();
        for (index, mut job) in jobs.into_iter().enumerate() {
            let at = at(index);
            if let Some(limit) = &job.rate_limit
                && !limits.contains(limit)
            {
                self.check_rate_limit(limit).await.map_err(at)?;
                limits.push(limit.clone());
            }
            if let Some(name) = job.submitted_by.clone() {
                let ceilings = self.inner.pool.ceilings.of(&name).await.map_err(|e| at(e.into()))?;
                self.within_principal_ceilings(&mut job, &name, &ceilings).map_err(at)?;
            }
            // A job is granted what its plugin's registration grants now,
            // narrowed to what its component declares (if it declares
            // anything), pinned; bytes and bare digests are granted nothing
            // and have no approval policy (there is nothing granted to
            // guard): a gate they ask for has the default duties.
            let (digest, name, grants, (gated_by_policy, duties)) = match &job.plugin {
                PluginSource::Bytes(bytes) => {
                    let digest = self.plugin_add(bytes.clone()).await.map_err(at)?;
                    (digest, None, Grants::default(), (false, Duties::default()))
                }
                PluginSource::Digest(digest) | PluginSource::Ref(PluginRef::Digest(digest)) => {
                    self.check_plugin_known(*digest).await.map_err(at)?;
                    (*digest, None, Grants::default(), (false, Duties::default()))
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
                    (info.digest, info.name, grants, (gated, info.approval.duties()))
                }
            };
            checked.push((digest, name, grants, (gated_by_policy, duties), job));
        }
        let mut new_jobs = Vec::with_capacity(checked.len());
        for (index, (digest, name, grants, gate_rule, job)) in checked.into_iter().enumerate() {
            new_jobs.push(self.new_job(digest, name, grants, gate_rule, job).map_err(at(index))?);
        }
        Ok(new_jobs)
    }

    /// Refuse a rate limit name no limit has (a typo would otherwise run
    /// the job unlimited).
    async fn check_rate_limit(&self, name: &str) -> Result<(), RuntimeError> {
        check_limit_name(name).map_err(RuntimeError::InvalidJob)?;
        match self.inner.store.rate_limit_get(name).await? {
            Some(_) => Ok(()),
            None => Err(RuntimeError::InvalidJob(format!(
                "rate_limit {name:?} does not exist: create it first (leash limits set {name} RATE)"
            ))),
        }
    }

    /// Queued jobs, for admission: counted in the store at most once per
    /// poll interval (or now, with `recount`), plus what this process
    /// submitted since, less what it claimed since. Counting on every
    /// submit would cost a scan per job; so would every submit that finds
    /// the estimate stale while one count is under way (on a deep queue
    /// at a thousand submits a second the count was among the server's
    /// busiest statements).
    async fn queue_depth(&self, recount: bool) -> Result<u64, RuntimeError> {
        let fresh_for = self.inner.settings.worker.poll_interval;
        let mut counting = None;
        let stale = recount || {
            let mut queue = self.inner.queue.lock().unwrap_or_else(|e| e.into_inner());
            let stale = queue.counted_at.is_none_or(|at| at.elapsed() >= fresh_for) && !queue.counting;
            if stale {
                queue.counting = true;
                counting = Some(Counting(&self.inner.queue));
            }
            stale
        };
        let claimed = || self.inner.pool.stats.claimed.load(Ordering::Relaxed);
        if stale {
            let claimed_then = claimed();
            let queued = self.inner.store.queued_count().await?;
            let mut queue = self.inner.queue.lock().unwrap_or_else(|e| e.into_inner());
            // `counting` is the guard's: a forced recount leaves another's be.
            (queue.queued, queue.counted_at, queue.claimed_then) =
                (queued, Some(std::time::Instant::now()), claimed_then);
        }
        drop(counting);
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

    /// Hold `job` to its submitter's own ceilings: asking for more is
    /// refused; a default above one is cut to it.
    fn within_principal_ceilings(
        &self,
        job: &mut Submit,
        name: &str,
        ceilings: &PrincipalCeilings,
    ) -> Result<(), RuntimeError> {
        let settings = &self.inner.settings;
        let over = |what: &str, asked: String, ceiling: String| {
            RuntimeError::InvalidJob(format!("{what} {asked} is over principal {name:?}'s ceiling of {ceiling}"))
        };
        let shown = |d: Duration| humantime::format_duration(d).to_string();
        let timeout = ceilings.max_timeout_ms.map(Duration::from_millis);
        within(&mut job.timeout, timeout, settings.default_timeout)
            .map_err(|(asked, max)| over("timeout", shown(asked), shown(max)))?;
        within(&mut job.max_attempts, ceilings.max_attempts, settings.default_max_attempts)
            .map_err(|(asked, max)| over("max_attempts", asked.to_string(), max.to_string()))?;
        let queue_ttl = ceilings.max_queue_ttl_ms.map(Duration::from_millis);
        within(&mut job.queue_ttl, queue_ttl, settings.worker.queue_ttl)
            .map_err(|(asked, max)| over("queue_ttl", shown(asked), shown(max)))
    }

    fn new_job(
        &self,
        plugin: Digest,
        plugin_name: Option<PluginName>,
        grants: Grants,
        (gated_by_policy, duties): GateRule,
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
        let rate_key = match (&job.rate_limit, &job.rate_key) {
            (None, Some(_)) => {
                return Err(RuntimeError::InvalidJob("rate_key needs a rate_limit to count against".into()));
            }
            (_, None) => String::new(),
            (Some(_), Some(template)) => {
                let from = KeySource {
                    principal: job.submitted_by.as_deref(),
                    plugin: plugin_name.as_ref().map(|n| n.name.as_str()),
                    input: &job.input,
                };
                render_key(template, from).map_err(RuntimeError::InvalidJob)?
            }
        };
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
            deadline: job.deadline,
            duties,
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
            limits: JobLimits { timeout, fuel: job.fuel, memory_bytes, output_bytes },
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
            submitted_by: job.submitted_by,
            priority: job.priority.unwrap_or(0),
            schedule_id: job.schedule_id,
            tags: job.tags,
            metadata: job.metadata,
            rate_limit: job.rate_limit,
            rate_key,
        };
        if let Some(name) = &new.submitted_by {
            Principal::check_name(name).map_err(|e| RuntimeError::InvalidJob(format!("submitted_by: {e}")))?;
        }
        new.check().map_err(RuntimeError::InvalidJob)?;
        Ok(new)
    }
}

/// Hold one of a job's settings to a ceiling (`None`: none): a value asked
/// for above it is refused with (asked, ceiling); none asked for becomes
/// the default, cut to the ceiling.
fn within<T: Copy + Ord>(asked: &mut Option<T>, ceiling: Option<T>, default: T) -> Result<(), (T, T)> {
    let Some(max) = ceiling else { return Ok(()) };
    match *asked {
        Some(value) if value > max => Err((value, max)),
        Some(_) => Ok(()),
        None => {
            *asked = Some(default.min(max));
            Ok(())
        }
    }
}
