//! Schedules as stored, and their firings. A firing is taken by a
//! conditional update of the schedule's next firing in the same
//! transaction as the jobs it submits: of any number of schedulers (on
//! replicas or processes sharing the store) preparing the same firing,
//! one commits its jobs and the rest are told they lost, with nothing
//! written. No leader is elected.

use crate::clock::Timestamp;
use crate::job::{Job, JobId, NewJob, Schedule};
use crate::store::StoreError;

/// Parameters of [`Schedules::schedule_pause`].
#[derive(Debug, Clone)]
pub struct SchedulePauseParams {
    /// The schedule's name.
    pub name: String,
    /// `Some(reason)`: pause it; `None`: resume it.
    pub pause: Option<Option<String>>,
    /// On resume: its next firing (the first after now; the paused
    /// stretch is not caught up).
    pub next_fire_at: Option<Timestamp>,
    /// Who (audited).
    pub actor: Option<String>,
    /// Now.
    pub now: Timestamp,
}

/// Parameters of [`Schedules::schedule_fire`].
#[derive(Debug, Clone)]
pub struct ScheduleFireParams {
    /// The schedule.
    pub id: JobId,
    /// The revision the firing was prepared against.
    pub revision: i64,
    /// The next firing as read: the firing is taken only if it still is.
    pub due: Timestamp,
    /// The latest due firing this takes (kept as the schedule's last
    /// firing; `due` itself when only one was due).
    pub latest: Timestamp,
    /// Its next firing after this one (`None`: no more).
    pub next: Option<Timestamp>,
    /// The jobs to submit (empty: the firing submits nothing).
    pub jobs: Vec<NewJob>,
    /// Submit nothing if a job of this schedule has not ended (`overlap:
    /// skip`).
    pub skip_if_active: bool,
    /// Firings counted as skipped beside the jobs (dropped by the
    /// catch-up policy, or refused by a check).
    pub skipped: u64,
    /// What the firing did, in words (kept as the schedule's last outcome;
    /// a skip for an active job says so itself).
    pub outcome: String,
    /// Now.
    pub now: Timestamp,
}

/// What [`Schedules::schedule_fire`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum ScheduleFired {
    /// The firing was taken: these jobs were submitted.
    Fired(Vec<Job>),
    /// The firing was taken, and submitted nothing: the schedule's previous
    /// job has not ended.
    SkippedActive,
    /// Another scheduler took it first, or the schedule changed (paused,
    /// edited, removed) since it was read: nothing was written.
    Lost,
}

/// Storing schedules and taking their firings.
#[async_trait::async_trait]
pub trait Schedules: Send + Sync + std::fmt::Debug {
    /// Store a new schedule. A name already taken is refused
    /// ([`StoreError::NameTaken`]). Audited (`schedule.add`).
    async fn schedule_create(&self, schedule: Schedule, now: Timestamp) -> Result<Schedule, StoreError>;

    /// The schedule of this name.
    async fn schedule_get(&self, name: String) -> Result<Option<Schedule>, StoreError>;

    /// Every schedule, by name.
    async fn schedule_list(&self) -> Result<Vec<Schedule>, StoreError>;

    /// Remove a schedule; its jobs stay. `false`: there was none. Audited
    /// (`schedule.remove`).
    async fn schedule_remove(&self, name: String, actor: Option<String>, now: Timestamp) -> Result<bool, StoreError>;

    /// Pause or resume a schedule. Pausing a paused one keeps the first
    /// pause; resuming a running one changes nothing. Audited
    /// (`schedule.pause`, `schedule.resume`) when it changed. `None`: no
    /// such schedule.
    async fn schedule_pause(&self, params: SchedulePauseParams) -> Result<Option<Schedule>, StoreError>;

    /// Running schedules whose next firing is at or before `now`, earliest
    /// first, at most `limit`.
    async fn schedules_due(&self, now: Timestamp, limit: u32) -> Result<Vec<Schedule>, StoreError>;

    /// Take one firing and submit its jobs, all in one transaction (see
    /// the module docs).
    async fn schedule_fire(&self, params: ScheduleFireParams) -> Result<ScheduleFired, StoreError>;

    /// Submit one job for the schedule `id` now, outside its cadence (its
    /// next firing stays where it is). Audited (`schedule.trigger`, as
    /// `actor`). `None`: the schedule is gone; nothing was submitted.
    async fn schedule_trigger(
        &self,
        id: JobId,
        job: NewJob,
        actor: Option<String>,
        now: Timestamp,
    ) -> Result<Option<Job>, StoreError>;
}
