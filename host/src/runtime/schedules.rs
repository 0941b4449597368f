//! Schedules through the embedding API (add, read, pause, resume, remove,
//! trigger) and the scheduler that fires them: every process that runs
//! workers ticks once a second, reads the due schedules and takes each
//! firing in the store with its jobs (see [`Schedules`](crate::store::Schedules)),
//! so any number of processes fire each firing once, with no leader.

use std::sync::Weak;
use std::time::Duration;

use tokio::sync::watch;

use super::submit::{PluginSource, Submit};
use super::{Inner, Runtime, RuntimeError};
use crate::job::schedule::check_schedule_name;
use crate::job::{
    Backoff, Cadence, CatchUp, GateChoice, Job, JobId, JobTemplate, Overlap, PluginRef, Schedule, SchedulePause, Target,
};
use crate::store::{
    JobListParams, MAX_PAUSE_REASON_BYTES, ScheduleFireParams, ScheduleFired, SchedulePauseParams, StoreError,
};

/// How often the scheduler looks for due schedules.
pub const SCHEDULE_TICK: Duration = Duration::from_secs(1);
/// Most schedules one tick fires (the rest wait for the next tick).
const DUE_PER_TICK: u32 = 64;

/// A schedule to add.
#[derive(Debug, Clone)]
pub struct ScheduleSpec {
    /// Its unique name.
    pub name: String,
    /// When it fires.
    pub cadence: Cadence,
    /// While its previous job runs.
    pub overlap: Overlap,
    /// After missed firings.
    pub catch_up: CatchUp,
    /// The job it submits.
    pub job: JobTemplate,
    /// Added paused: it fires nothing until resumed.
    pub paused: bool,
}

/// A schedule with what an operator looks at beside it.
#[derive(Debug, Clone)]
pub struct ScheduleView {
    /// The schedule.
    pub schedule: Schedule,
    /// Its next firings (none while paused).
    pub upcoming: Vec<crate::clock::Timestamp>,
    /// Its latest jobs, newest first.
    pub recent: Vec<Job>,
}

/// What one scheduler tick did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FireReport {
    /// Jobs submitted.
    pub submitted: u64,
    /// Firings taken that submitted nothing (skipped, missed or refused).
    pub skipped: u64,
    /// Firings another scheduler took first.
    pub lost: u64,
}

impl JobTemplate {
    /// The job this template describes, as a submit takes it (errors
    /// name the field). `default_backoff` fills a backoff given in part.
    pub fn to_submit(&self, default_backoff: Backoff) -> Result<Submit, String> {
        let plugin: PluginRef = self.plugin.parse().map_err(|e| format!("`plugin`: {e}"))?;
        let target = match (self.phase.as_deref(), &self.action) {
            (None | Some("action"), Some(name)) => Target::action(name).map_err(|e| e.to_string())?,
            (Some(_), Some(_)) => return Err("give `phase` or `action`, not both".into()),
            (Some(phase), None) => phase.parse().map_err(|e: crate::job::ParseTargetError| e.to_string())?,
            (None, None) => Target::Execute,
        };
        let input = match &self.input {
            Some(value) => serde_json::to_vec(value).map_err(|e| e.to_string())?,
            None => Vec::new(),
        };
        let mut job = Submit::new(PluginSource::Ref(plugin), target, input);
        job.timeout = self.timeout;
        job.fuel = self.fuel;
        job.memory_bytes = self.memory_bytes;
        job.output_bytes = self.output_bytes;
        job.max_attempts = self.max_attempts;
        job.concurrency_key = self.concurrency_key.clone();
        job.priority = self.priority;
        job.queue_ttl = self.queue_ttl;
        job.approval = self.gate.map(|g| g == GateChoice::Approval);
        job.tags = self.tags.clone();
        job.metadata = self.metadata.clone();
        job.rate_limit = self.rate_limit.clone();
        job.rate_key = self.rate_key.clone();
        if self.backoff.is_some() || self.backoff_cap.is_some() {
            let base = self.backoff.unwrap_or(default_backoff.base);
            let cap = self.backoff_cap.unwrap_or(default_backoff.cap.max(self.backoff.unwrap_or_default()));
            job.backoff = Some(Backoff { base, cap });
        }
        Ok(job)
    }
}

impl Runtime {
    /// Add a schedule. Its job is checked now as a submit would check it
    /// (the plugin, its policy, the limits, this principal's ceilings), and
    /// each firing submits it as this handle's principal. A taken name is
    /// refused. Audited as `schedule.add`.
    pub async fn schedule_add(&self, spec: ScheduleSpec) -> Result<Schedule, RuntimeError> {
        check_schedule_name(&spec.name).map_err(RuntimeError::InvalidSchedule)?;
        let now = self.now();
        let actor = self.actor();
        let schedule = Schedule {
            id: JobId::new(now),
            next_fire_at: spec.cadence.next_after(now).map_err(RuntimeError::InvalidSchedule)?,
            name: spec.name,
            cadence: spec.cadence,
            overlap: spec.overlap,
            catch_up: spec.catch_up,
            job: spec.job,
            paused: spec.paused.then(|| SchedulePause { at: now, by: actor.clone(), reason: None }),
            last_fired_at: None,
            last_outcome: None,
            fired: 0,
            skipped: 0,
            created_by: actor,
            created_at: now,
            revision: 0,
        };
        // Checked as a submit would check it (admission aside), not stored.
        let submit = self.scheduled_submit(&schedule).map_err(RuntimeError::InvalidSchedule)?;
        self.checked(vec![submit], false).await?;
        Ok(self.inner.store.schedule_create(schedule, now).await?)
    }

    /// The schedule `name`.
    pub async fn schedule(&self, name: &str) -> Result<Schedule, RuntimeError> {
        self.inner.store.schedule_get(name.to_owned()).await?.ok_or_else(|| RuntimeError::UnknownSchedule(name.into()))
    }

    /// The schedule `name`, its next `upcoming` firings and its latest
    /// `recent` jobs.
    pub async fn schedule_view(&self, name: &str, upcoming: usize, recent: u32) -> Result<ScheduleView, RuntimeError> {
        let schedule = self.schedule(name).await?;
        let upcoming = match (&schedule.paused, schedule.next_fire_at) {
            (None, Some(next)) => {
                let mut times = vec![next];
                times.extend(schedule.cadence.upcoming(next, upcoming.saturating_sub(1)));
                times.truncate(upcoming);
                times
            }
            _ => Vec::new(),
        };
        let recent = self
            .list(JobListParams { schedule_id: Some(schedule.id), limit: recent.max(1), ..JobListParams::default() })
            .await?;
        Ok(ScheduleView { schedule, upcoming, recent })
    }

    /// Every schedule, by name.
    pub async fn schedules(&self) -> Result<Vec<Schedule>, RuntimeError> {
        Ok(self.inner.store.schedule_list().await?)
    }

    /// Pause the schedule `name`: no firing submits anything until it is
    /// resumed. Pausing a paused one keeps the first pause. Audited as
    /// `schedule.pause`.
    pub async fn schedule_pause(&self, name: &str, reason: Option<String>) -> Result<Schedule, RuntimeError> {
        if let Some(reason) = &reason
            && reason.len() > MAX_PAUSE_REASON_BYTES
        {
            return Err(RuntimeError::InvalidSchedule(format!(
                "a pause's reason is {} bytes, over the ceiling of {MAX_PAUSE_REASON_BYTES}",
                reason.len()
            )));
        }
        self.pause_params(name, Some(reason), None).await
    }

    /// Resume the schedule `name`: it fires next at its first firing after
    /// now (what the pause covered is not caught up). Audited as
    /// `schedule.resume` when it was paused.
    pub async fn schedule_resume(&self, name: &str) -> Result<Schedule, RuntimeError> {
        let cadence = self.schedule(name).await?.cadence;
        let next = cadence.next_after(self.now()).map_err(RuntimeError::InvalidSchedule)?;
        self.pause_params(name, None, next).await
    }

    async fn pause_params(
        &self,
        name: &str,
        pause: Option<Option<String>>,
        next_fire_at: Option<crate::clock::Timestamp>,
    ) -> Result<Schedule, RuntimeError> {
        let params =
            SchedulePauseParams { name: name.to_owned(), pause, next_fire_at, actor: self.actor(), now: self.now() };
        self.inner.store.schedule_pause(params).await?.ok_or_else(|| RuntimeError::UnknownSchedule(name.into()))
    }

    /// Remove the schedule `name`; the jobs it submitted stay. Audited as
    /// `schedule.remove`.
    pub async fn schedule_remove(&self, name: &str) -> Result<(), RuntimeError> {
        if self.inner.store.schedule_remove(name.to_owned(), self.actor(), self.now()).await? {
            Ok(())
        } else {
            Err(RuntimeError::UnknownSchedule(name.into()))
        }
    }

    /// Submit the schedule's job now, outside its cadence, paused or not
    /// and whatever its overlap policy (a person asked for it); its next
    /// firing stays. The job is submitted as the schedule's creator;
    /// audited as `schedule.trigger` by this handle's principal.
    pub async fn schedule_trigger(&self, name: &str) -> Result<Job, RuntimeError> {
        let schedule = self.schedule(name).await?;
        let submit = self.scheduled_submit(&schedule).map_err(RuntimeError::InvalidSchedule)?;
        let job = self.prepare(vec![submit], false).await?.remove(0);
        let now = self.now();
        let stored = self.inner.store.schedule_trigger(schedule.id, job, self.actor(), now).await?;
        let job = stored.ok_or_else(|| RuntimeError::UnknownSchedule(name.into()))?;
        self.count_queued(std::slice::from_ref(&job));
        Ok(self.approve_on_arrival(vec![job]).await.remove(0))
    }

    /// One scheduler tick at the clock's now: fire every due schedule (up
    /// to 64; the rest at the next tick). The scheduler of every process
    /// that runs workers calls this each second; tests that drive the
    /// clock call it themselves.
    pub async fn schedules_fire_due(&self) -> Result<FireReport, RuntimeError> {
        let now = self.now();
        let mut report = FireReport::default();
        for schedule in self.inner.store.schedules_due(now, DUE_PER_TICK).await? {
            let metrics = &self.inner.metrics;
            match self.fire(&schedule, now).await {
                Ok(ScheduleFired::Fired(jobs)) if jobs.is_empty() => {
                    report.skipped += 1;
                    metrics.firing("skipped");
                }
                Ok(ScheduleFired::Fired(jobs)) => {
                    report.submitted += jobs.len() as u64;
                    metrics.firing("submitted");
                    self.count_queued(&jobs);
                    self.approve_on_arrival(jobs).await;
                }
                Ok(ScheduleFired::SkippedActive) => {
                    report.skipped += 1;
                    metrics.firing("skipped");
                }
                Ok(ScheduleFired::Lost) => {
                    report.lost += 1;
                    metrics.firing("lost");
                }
                // The store failed: the firing stays due for the next tick.
                Err(e) => tracing::warn!(schedule = %schedule.name, error = %e, "a schedule's firing failed"),
            }
        }
        Ok(report)
    }

    /// Take one due schedule's firing at `now`.
    async fn fire(&self, schedule: &Schedule, now: crate::clock::Timestamp) -> Result<ScheduleFired, StoreError> {
        let Some(due) = schedule.next_fire_at else { return Ok(ScheduleFired::Lost) };
        let mut params = ScheduleFireParams {
            id: schedule.id,
            revision: schedule.revision,
            due,
            latest: due,
            next: None,
            jobs: Vec::new(),
            skip_if_active: schedule.overlap == Overlap::Skip,
            skipped: 0,
            outcome: String::new(),
            now,
        };
        let firings = match schedule.cadence.firings(due, now, schedule.catch_up) {
            Ok(firings) => firings,
            Err(e) => {
                params.outcome = format!("stopped: {e}");
                params.skipped = 1;
                return self.inner.store.schedule_fire(params).await;
            }
        };
        params.next = firings.next;
        params.latest = firings.latest.unwrap_or(due);
        let mut fire = firings.fire.len();
        let mut missed = firings.missed;
        // Skipping overlaps, a catch-up submits one job: more would overlap
        // each other.
        if schedule.overlap == Overlap::Skip && fire > 1 {
            missed += fire as u64 - 1;
            fire = 1;
        }
        let missed_note = if missed > 0 {
            format!("; {missed} missed firing{} dropped (catch_up: {})", plural(missed), schedule.catch_up.as_str())
        } else {
            String::new()
        };
        params.skipped = missed;
        if fire == 0 {
            params.outcome = format!("submitted nothing{missed_note}");
            return self.inner.store.schedule_fire(params).await;
        }
        let submits: Result<Vec<Submit>, String> = (0..fire).map(|_| self.scheduled_submit(schedule)).collect();
        let prepared = match submits {
            Ok(submits) => self.prepare(submits, false).await,
            Err(e) => Err(RuntimeError::InvalidSchedule(e)),
        };
        match prepared {
            Ok(jobs) => {
                params.outcome = format!("submitted {fire} job{}{missed_note}", plural(fire as u64));
                params.jobs = jobs;
            }
            // A store that failed leaves the firing due.
            Err(RuntimeError::Store(e)) => return Err(e),
            Err(refused) => {
                params.outcome = format!("refused: {refused}{missed_note}");
                params.skipped += fire as u64;
            }
        }
        self.inner.store.schedule_fire(params).await
    }

    /// The submit of one of `schedule`'s jobs: its template, as its
    /// creator, carrying its id; with `overlap: queue`, under the
    /// schedule's concurrency key unless the template names one.
    fn scheduled_submit(&self, schedule: &Schedule) -> Result<Submit, String> {
        let mut submit = schedule.job.to_submit(self.inner.settings.default_backoff)?;
        submit.submitted_by = schedule.created_by.clone();
        submit.schedule_id = Some(schedule.id);
        if schedule.overlap == Overlap::Queue && submit.concurrency_key.is_none() {
            submit.concurrency_key = Some(format!("schedule:{}", schedule.name));
        }
        Ok(submit)
    }
}

fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// The scheduler: a tick each [`SCHEDULE_TICK`] until `stop` says so or
/// the runtime is dropped.
pub(super) async fn schedule_loop(inner: Weak<Inner>, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(SCHEDULE_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        if *stop.borrow() {
            return;
        }
        let Some(inner) = inner.upgrade() else { return };
        // Held for the tick only: a dropped runtime ends the loop.
        let runtime = Runtime { inner, actor: None };
        if let Err(e) = runtime.schedules_fire_due().await {
            tracing::warn!(error = %e, "the scheduler could not read due schedules");
        }
    }
}
