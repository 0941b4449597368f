//! How a schedule is stored in columns and read back, and the audit notes
//! of its changes: the same for both backends.

use std::time::Duration;

use crate::clock::Timestamp;
use crate::job::{Cadence, Schedule, SchedulePause};
use crate::store::rules::codec::corrupt;
use crate::store::{AuditNote, StoreError};

/// The schedule columns, in [`ScheduleRow`]'s order.
pub(crate) const SCHEDULE_COLUMNS: &str = "schedule_id, name, cron, timezone, every_ms, overlap, catch_up, \
    template_json, paused_at, paused_by, pause_reason, next_fire_at, last_fired_at, last_outcome, fired, skipped, \
    created_by, created_at, revision";

/// The statuses of a job that has not ended (a schedule with `overlap:
/// skip` fires nothing while it has one), as an SQL list. Only the
/// firing's check reads it: a partial index on it would make SQLite build
/// a temporary table for the list at every status change of every job.
pub(crate) const ACTIVE_STATUSES: &str = "('pending_approval', 'approved', 'queued', 'running')";

/// The outcome a firing records when `overlap: skip` holds it back.
pub(crate) const SKIPPED_ACTIVE: &str = "skipped: the previous job has not ended (overlap: skip)";

/// A schedule as its columns hold it.
#[derive(Debug, Clone)]
pub(crate) struct ScheduleRow {
    pub(crate) id: String,
    pub(crate) name: String,
    pub(crate) cron: Option<String>,
    pub(crate) timezone: Option<String>,
    pub(crate) every_ms: Option<i64>,
    pub(crate) overlap: String,
    pub(crate) catch_up: String,
    pub(crate) template: String,
    pub(crate) paused_at: Option<i64>,
    pub(crate) paused_by: Option<String>,
    pub(crate) pause_reason: Option<String>,
    pub(crate) next_fire_at: Option<i64>,
    pub(crate) last_fired_at: Option<i64>,
    pub(crate) last_outcome: Option<String>,
    pub(crate) fired: i64,
    pub(crate) skipped: i64,
    pub(crate) created_by: Option<String>,
    pub(crate) created_at: i64,
    pub(crate) revision: i64,
}

impl ScheduleRow {
    /// The columns of `schedule`.
    pub(crate) fn of(schedule: &Schedule) -> Result<Self, StoreError> {
        let (cron, timezone, every_ms) = match &schedule.cadence {
            Cadence::Cron { expr, timezone } => (Some(expr.clone()), Some(timezone.clone()), None),
            Cadence::Every(every) => (None, None, Some(crate::job::millis::column(*every))),
        };
        let pause = schedule.paused.as_ref();
        Ok(ScheduleRow {
            id: schedule.id.to_string(),
            name: schedule.name.clone(),
            cron,
            timezone,
            every_ms,
            overlap: schedule.overlap.as_str().to_owned(),
            catch_up: schedule.catch_up.as_str().to_owned(),
            template: serde_json::to_string(&schedule.job).map_err(|e| StoreError::Invalid(e.to_string()))?,
            paused_at: pause.map(|p| p.at.unix_ms()),
            paused_by: pause.and_then(|p| p.by.clone()),
            pause_reason: pause.and_then(|p| p.reason.clone()),
            next_fire_at: schedule.next_fire_at.map(Timestamp::unix_ms),
            last_fired_at: schedule.last_fired_at.map(Timestamp::unix_ms),
            last_outcome: schedule.last_outcome.clone(),
            fired: i64::try_from(schedule.fired).unwrap_or(i64::MAX),
            skipped: i64::try_from(schedule.skipped).unwrap_or(i64::MAX),
            created_by: schedule.created_by.clone(),
            created_at: schedule.created_at.unix_ms(),
            revision: schedule.revision,
        })
    }

    /// The schedule these columns hold.
    pub(crate) fn into_schedule(self) -> Result<Schedule, StoreError> {
        let bad = |detail: String| corrupt(&format!("schedule {}", self.name), detail);
        let cadence = match (&self.cron, &self.timezone, self.every_ms) {
            (Some(expr), Some(timezone), None) => Cadence::Cron { expr: expr.clone(), timezone: timezone.clone() },
            (None, None, Some(ms)) => Cadence::Every(Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
            _ => return Err(bad("neither a cron expression with its zone nor an interval".into())),
        };
        let time = Timestamp::from_unix_ms;
        Ok(Schedule {
            id: self.id.parse().map_err(&bad)?,
            cadence,
            overlap: self.overlap.parse().map_err(&bad)?,
            catch_up: self.catch_up.parse().map_err(&bad)?,
            job: serde_json::from_str(&self.template).map_err(|e| bad(format!("template: {e}")))?,
            paused: self.paused_at.map(|at| SchedulePause {
                at: time(at),
                by: self.paused_by.clone(),
                reason: self.pause_reason.clone(),
            }),
            next_fire_at: self.next_fire_at.map(time),
            last_fired_at: self.last_fired_at.map(time),
            last_outcome: self.last_outcome.clone(),
            fired: u64::try_from(self.fired).unwrap_or(0),
            skipped: u64::try_from(self.skipped).unwrap_or(0),
            created_by: self.created_by.clone(),
            created_at: time(self.created_at),
            revision: self.revision,
            name: self.name,
        })
    }
}

/// The audit note of a schedule created.
pub(crate) fn add_note(schedule: &Schedule) -> AuditNote {
    let detail = serde_json::json!({
        "cadence": schedule.cadence.to_string(),
        "overlap": schedule.overlap,
        "catch_up": schedule.catch_up,
        "job": schedule.job,
    });
    super::audit::note(schedule.created_by.clone(), "schedule.add", schedule.name.clone(), detail)
}
