//! One attempt of a claimed job: load its plugin, confirm the lease, run the
//! guest while the lease is renewed and progress is written, and record the
//! outcome (a finish, a retry or a release), fenced by the lease token.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tracing::Instrument as _;

use super::failure::HostFailure;
use super::finish::Ending;
use super::lease::{LeaseKeeper, LeaseLedger, LeaseWatch};
use super::slot::Slot;
use crate::job::{Digest, ErrorKind, JobId, JobLogs, JobProgress, LogLine, Proposal, millis};
use crate::metrics::AttemptEnd;
use crate::sandbox::http::EffectFence;
use crate::sandbox::{
    LogLevel, LogRecord, Outcome, Plugin, Progress, RunLimits, RunObserver, RunRequest, StopHandle, Tier,
};
use crate::store::{Finish, JobFinishParams, JobProgressParams, JobReleaseParams, JobRetryParams, Lease};
use crate::worker::{JobStarted, PROGRESS_WRITE_INTERVAL, Pool, RunningJob};

impl Pool {
    /// The job's plugin, and when this job had to wait for it (the first
    /// jobs of a digest in this process), how long and what it waited for.
    async fn plugin(&self, digest: Digest) -> Result<(Plugin, Option<LogRecord>), HostFailure> {
        let cell = self.plugins.lock().unwrap_or_else(|e| e.into_inner()).entry(digest).or_default().clone();
        if let Some(plugin) = cell.get() {
            return Ok((plugin.clone(), None));
        }
        let started = Instant::now();
        // Concurrent first jobs share one compile; a failed one leaves the
        // cell empty, so the next job tries again.
        let plugin = cell.get_or_try_init(|| self.compile(digest)).await?.clone();
        let record = compile_wait_record(&plugin, started.elapsed());
        Ok((plugin, Some(record)))
    }

    async fn compile(&self, digest: Digest) -> Result<Plugin, HostFailure> {
        let bytes = self
            .store
            .plugin_get(digest)
            .await
            .map_err(|e| HostFailure {
                // A store closing under the read (the process is stopping)
                // says nothing about the job: nothing ran, so it goes back.
                retryable: e.is_transient() || matches!(e, crate::store::StoreError::Closed),
                ..HostFailure::new(ErrorKind::HostError, format!("HostError: cannot read plugin {digest}: {e}"))
            })?
            .ok_or_else(|| {
                HostFailure::new(ErrorKind::HostError, format!("HostError: plugin {digest} is not in the store"))
            })?;
        self.sandbox.compile(Arc::new(bytes)).await.map_err(|e| HostFailure {
            // A compile cut short because this process is stopping (its
            // blocking task cancelled with the guest runtime) says nothing
            // about the job: nothing ran, so it goes back.
            retryable: self.shutting_down.load(Ordering::SeqCst),
            ..HostFailure::new(ErrorKind::HostError, format!("HostError: plugin {digest}: {e}"))
        })
    }

    /// Run one claimed job's guest and record its outcome. A finish is
    /// recorded on a task of its own, which gives the jobs it claims to
    /// `slot` (registered already); a release or a retry here.
    pub(super) async fn run_job(self: Arc<Self>, lease: Lease, running: RunningJob, slot: Arc<Slot>) {
        let Lease { job, token } = lease;
        let id = job.id;
        let claimed = Instant::now();
        // By name, every version alike; a job submitted by digest alone
        // by its digest.
        let plugin_label = self.metrics.plugin_label(&match &job.plugin_name {
            Some(name) => name.name.clone(),
            None => job.plugin.to_string(),
        });
        let waited = self.clock.now().unix_ms().saturating_sub(job.run_after.unix_ms());
        self.metrics.queue_waited(&plugin_label, Duration::from_millis(u64::try_from(waited).unwrap_or(0)));
        let plan_id = job.plan_id.clone();
        // A job a process died under runs alone, and its slot claims
        // nothing with its finish: the pool is empty again after it.
        let suspect = job.process_deaths > 0;
        let RunningJob { stop, cancelled } = running;

        let keeper = LeaseKeeper {
            store: self.store.clone(),
            clock: self.clock.clone(),
            id,
            token: token.clone(),
            lease_ttl: self.config.lease_ttl,
            metrics: self.metrics.clone(),
        };
        let watch = Arc::new(LeaseWatch::default());
        // The store last confirmed the lease when it set its expiry.
        let ttl_ms = i64::try_from(self.config.lease_ttl.as_millis()).unwrap_or(i64::MAX);
        let claimed_ms = job.lease_expires_at.map_or(0, |at| at.unix_ms().saturating_sub(ttl_ms));
        watch.confirmed_at_ms.store(claimed_ms, Ordering::SeqCst);
        // The submitter's own ceiling as it stands now, not at submit.
        let submitter_max = match &job.submitted_by {
            Some(name) => self.ceilings.max_timeout(name).await,
            None => None,
        };
        let spent = job.lost_leases + job.retries + 1;
        let (may_retry, backoff, deadline) = (spent < job.max_attempts, job.backoff, job.deadline_at);
        let max_attempts = job.max_attempts;
        let mut compile_wait = None;
        // A plan's phases are fenced: execute proposes, apply sends only
        // what was approved (checked here, before anything runs).
        // An apply's checks run before anything renews the lease: bounded
        // well inside it.
        let fence =
            super::plan::fence_for(&*self.store, &self.sandbox.config().secrets, &job, self.config.lease_ttl / 3).await;
        let approved = match &fence {
            Ok(EffectFence::Approved(effects)) => Some(effects.clone()),
            _ => None,
        };
        let mut outcome = match fence {
            Err(failure) => Err(failure),
            // The lease is kept while the plugin loads: a first compile
            // of a big guest (a Python one) can outlast a lease.
            Ok(fence) => match tokio::select! {
                loaded = self.plugin(job.plugin) => loaded,
                _ = keeper.keep(&stop, &watch) => unreachable!("keep only returns by never returning"),
            } {
                Err(failure) => Err(failure),
                Ok((plugin, waited)) => {
                    compile_wait = waited;
                    let mut request = RunRequest {
                        job_id: id.to_string(),
                        target: job.target.clone(),
                        attempt: job.attempt,
                        input: job.input,
                        // Clamped again: the ceilings in force now, not at submit.
                        limits: RunLimits {
                            timeout: job
                                .limits
                                .timeout
                                .min(self.config.max_timeout)
                                .min(submitter_max.unwrap_or(Duration::MAX)),
                            fuel: job.limits.fuel,
                            memory_bytes: job.limits.memory_bytes,
                            output_bytes: job.limits.output_bytes.min(self.config.max_output_bytes),
                            cancel_grace: self.config.cancel_grace,
                            ..RunLimits::default()
                        },
                        // What the job was granted at submit, pinned.
                        grants: Arc::new(job.grants),
                        effects: Some(Arc::new(LeaseLedger {
                            keeper: keeper.clone(),
                            effects: self.store.clone(),
                            stop: stop.clone(),
                            watch: watch.clone(),
                        })),
                        egress: Some(Arc::new(super::egress::AttemptEgress {
                            limits: self.egress.clone(),
                            watch: watch.clone(),
                        })),
                        fence,
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
                                tracing::debug!(timeout_ms = millis::of(request.limits.timeout), "started");
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
            },
        };
        if let (Ok(o), Some(effects)) = (&mut outcome, &approved) {
            super::plan::settle_apply(o, effects);
        }
        self.stats.last_heartbeat_ms.store(self.clock.now().unix_ms() as u64, Ordering::Relaxed);

        let user_cancel = cancelled.load(Ordering::SeqCst) || watch.cancel_requested.load(Ordering::SeqCst);
        let end;
        if let Ok(o) = &mut outcome {
            self.forward_guest_logs(o);
            self.metrics.http(o.usage.http_requests, o.usage.http_denied);
            // leash's own words, kept with the job but not forwarded as the
            // guest's.
            if let Some(record) = compile_wait {
                o.logs.insert(0, record);
            }
        }
        // Released: a guest stopped for shutdown, at once; or, after a
        // backoff pause, a job whose guest never started because of a
        // transient host fault (its plugin could not be read), or failed
        // after the host refused it an effect for a fault of the host's
        // (the store could not confirm its lease or record the intent). No
        // attempt is spent unless the attempt recorded an effect (the store
        // decides: see store/rules/unfinished.rs).
        let release_pause = match &outcome {
            _ if user_cancel => None,
            // Stopped for shutdown: cancelled, or failed after the stop
            // (a guest refused an effect because its attempt was stopping
            // may turn that into its own failure before it is stopped).
            Ok(o)
                if self.shutting_down.load(Ordering::SeqCst)
                    && (o.error_kind() == Some(ErrorKind::Cancelled) || (o.result.is_err() && stop.is_requested())) =>
            {
                Some(Duration::ZERO)
            }
            Ok(o) if o.result.is_err() && watch.host_refused.load(Ordering::SeqCst) => {
                tracing::warn!("the guest failed after the store could not let it act; released to run again");
                Some(backoff.delay(1))
            }
            Err(failure) if failure.retryable => {
                tracing::warn!(error = %failure.message, "the guest could not start");
                Some(backoff.delay(1))
            }
            _ => None,
        };
        if watch.lost.load(Ordering::SeqCst) {
            self.stats.leases_lost.fetch_add(1, Ordering::Relaxed);
            self.metrics.leases_lost.inc();
            end = AttemptEnd::LeaseLost;
            tracing::warn!("lease lost: the attempt's result is dropped");
        } else if let Some(pause) = release_pause {
            end = AttemptEnd::Released;
            let now = self.clock.now();
            let run_after = now.plus(pause);
            let params = JobReleaseParams { id, token, queue_ttl: self.config.queue_ttl, run_after, now };
            match self.store.job_release(params).await {
                Ok(true) => match watch.effects_recorded.load(Ordering::SeqCst) {
                    0 => tracing::info!(%run_after, "released: it recorded no effect, so no attempt is spent"),
                    n => {
                        tracing::info!(%run_after, effects = n, "released after recording effects: an attempt is spent")
                    }
                },
                Ok(false) => tracing::warn!("not released: the lease was lost"),
                Err(e) => tracing::warn!(error = %e, "not released; the sweeper will reclaim it"),
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
                // Never before an outbound request's rate slot.
                run_after: now.plus(backoff.delay(spent).max(retry.2.unwrap_or_default())),
                queue_ttl: self.config.queue_ttl,
                fuel_used,
                peak_memory_bytes,
                logs,
                now,
            };
            let run_after = params.run_after;
            if self.store.job_retry(params).await.unwrap_or(false) {
                self.metrics.retries.inc();
                end = AttemptEnd::Retried;
                tracing::info!(%run_after, "failed retryably; queued again after its backoff");
            } else {
                // The lease was lost: the sweeper has the job.
                self.stats.leases_lost.fetch_add(1, Ordering::Relaxed);
                self.metrics.leases_lost.inc();
                end = AttemptEnd::LeaseLost;
            }
        } else {
            // A retryable error that runs no more says why.
            let spent_all = !user_cancel && retry_for(&outcome).is_some();
            let (mut finish, fuel_used, peak, progress, logs, proposals) = finish_for(outcome);
            if let (true, Finish::Failed { message, .. }) = (spent_all, &mut finish) {
                message.push_str(&attempts_spent(max_attempts));
            }
            let (status, error_kind) = (finish.status(), finish.error_kind());
            let params = JobFinishParams {
                id,
                token,
                finish,
                fuel_used,
                peak_memory_bytes: peak,
                progress,
                logs,
                proposals,
                now: self.clock.now(),
            };
            // The finish goes out on a task of its own: a slot with a job
            // ready runs it while the finish commits (see `slot`).
            let attempt = claimed.elapsed();
            let depth = if self.shutting_down.load(Ordering::SeqCst) || suspect {
                0
            } else if attempt < self.config.claim_ahead_below && self.slots.available_permits() == 0 {
                // Every slot busy: jobs ahead wait for this one, not for
                // a free slot's claim.
                self.ahead_depth(attempt)
            } else {
                1
            };
            let sent = slot.sending(depth);
            let ending = Ending { id, claimed, plugin_label, status, error_kind, fuel_used, plan_id };
            let task = self.clone().record_finish(params, sent, ending);
            tokio::spawn(task.instrument(tracing::Span::current()));
            return;
        }
        self.leave(id, end, claimed, &plugin_label, None);
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
            let elapsed_ms = millis::of(record.elapsed);
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

/// The kind and message of a guest failure that may be retried: its own
/// `retryable` error. `failed`, `invalid-input`, traps and limits never
/// are; a transient host error before the start is released instead.
/// A retryable failure's kind, message, and the least pause before it runs
/// again.
fn retry_for(outcome: &Result<Outcome, HostFailure>) -> Option<(ErrorKind, String, Option<Duration>)> {
    match outcome {
        Ok(o) => o.result.as_ref().err().filter(|f| f.retryable).map(|f| (f.kind, f.message.clone(), f.retry_after)),
        Err(_) => None,
    }
}

/// What a retryable error that ran out of attempts adds to its message.
fn attempts_spent(max_attempts: u32) -> String {
    if max_attempts <= 1 {
        " (retryable, but max_attempts is 1: submit with max_attempts above 1 to run it again)".to_owned()
    } else {
        format!(" (retryable, but all {max_attempts} attempts are spent)")
    }
}

/// What a job that waited for its plugin (one of the first of a digest in
/// this process) finds first in its log: leash's own words, with the wait
/// in `leash.compile_ms` and whether the compile cache had it in
/// `leash.compile_cached`. Later jobs of the digest start at once.
fn compile_wait_record(plugin: &Plugin, waited: Duration) -> LogRecord {
    let loaded = plugin.loaded();
    let from_cache = loaded.from_cache;
    let ms = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX);
    let tier = match loaded.tier {
        Tier::Baseline => "baseline",
        Tier::Optimized => "optimized",
    };
    tracing::info!(wait_ms = ms, from_cache, tier, "plugin ready");
    let mut fields = vec![
        ("leash.compile_ms".into(), ms.to_string()),
        ("leash.compile_cached".into(), from_cache.to_string()),
        ("leash.compile_tier".into(), tier.to_owned()),
    ];
    if let Some(functions) = loaded.functions {
        fields.push(("leash.functions_reused".into(), functions.reused.to_string()));
        fields.push(("leash.functions_compiled".into(), functions.compiled.to_string()));
    }
    LogRecord {
        level: LogLevel::Info,
        message: format!(
            "leash: this job waited {ms} ms while its plugin was {}{} (the first jobs of a plugin in a process do)",
            loaded.how(),
            loaded.reuse_note()
        ),
        fields,
        elapsed: Duration::ZERO,
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
                elapsed: r.elapsed,
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
fn finish_for(outcome: Result<Outcome, HostFailure>) -> FinishRecord {
    let mut outcome = match outcome {
        Ok(outcome) => outcome,
        Err(HostFailure { kind, message, .. }) => {
            return (Finish::Failed { kind, message, backtrace: None }, 0, 0, None, None, Vec::new());
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
    (finish, fuel, peak, progress, logs, std::mem::take(&mut outcome.proposals))
}

/// What [`finish_for`] makes of an outcome: the ending, fuel, peak memory,
/// last progress, logs and proposed effects.
type FinishRecord = (Finish, u64, u64, Option<JobProgress>, Option<JobLogs>, Vec<Proposal>);

/// The span every event of one attempt carries.
pub(super) fn job_span(worker_id: &str, job: &crate::job::Job) -> tracing::Span {
    tracing::info_span!("job", job_id = %job.id, attempt = job.attempt, worker_id = %worker_id, plugin = %job.plugin)
}
