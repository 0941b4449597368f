//! The SQLite store's [`Schedules`]. Its one writer serializes every
//! firing: of two processes preparing the same one, the second's
//! conditional update finds the next firing moved and writes nothing.

use rusqlite::{Connection, OptionalExtension, Row, params};

use super::SqliteStore;
use super::rows::db_err;
use crate::clock::Timestamp;
use crate::job::{Job, JobId, NewJob, Schedule};
use crate::store::rules::audit::note;
use crate::store::rules::schedule::{ACTIVE_STATUSES, SCHEDULE_COLUMNS, SKIPPED_ACTIVE, ScheduleRow, add_note};
use crate::store::{ScheduleFireParams, ScheduleFired, SchedulePauseParams, Schedules, StoreError};

/// The migration that adds schedules (listed in
/// [`MIGRATIONS`](super::migrations::MIGRATIONS)).
pub(super) const MIGRATION: &str = r#"
CREATE TABLE schedules (
    schedule_id   TEXT PRIMARY KEY,
    name          TEXT NOT NULL UNIQUE,
    cron          TEXT,
    timezone      TEXT,
    every_ms      INTEGER,
    overlap       TEXT NOT NULL,
    catch_up      TEXT NOT NULL,
    template_json TEXT NOT NULL,
    paused_at     INTEGER,
    paused_by     TEXT,
    pause_reason  TEXT,
    next_fire_at  INTEGER,
    last_fired_at INTEGER,
    last_outcome  TEXT,
    fired         INTEGER NOT NULL DEFAULT 0,
    skipped       INTEGER NOT NULL DEFAULT 0,
    created_by    TEXT,
    created_at    INTEGER NOT NULL,
    revision      INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX schedules_due ON schedules (next_fire_at) WHERE paused_at IS NULL AND next_fire_at IS NOT NULL;
ALTER TABLE jobs ADD COLUMN schedule_id TEXT;
CREATE INDEX jobs_by_schedule ON jobs (schedule_id, job_id) WHERE schedule_id IS NOT NULL;
CREATE INDEX jobs_schedule_status ON jobs (schedule_id, status) WHERE schedule_id IS NOT NULL;
"#;

fn row_of(r: &Row<'_>) -> rusqlite::Result<ScheduleRow> {
    Ok(ScheduleRow {
        id: r.get(0)?,
        name: r.get(1)?,
        cron: r.get(2)?,
        timezone: r.get(3)?,
        every_ms: r.get(4)?,
        overlap: r.get(5)?,
        catch_up: r.get(6)?,
        template: r.get(7)?,
        paused_at: r.get(8)?,
        paused_by: r.get(9)?,
        pause_reason: r.get(10)?,
        next_fire_at: r.get(11)?,
        last_fired_at: r.get(12)?,
        last_outcome: r.get(13)?,
        fired: r.get(14)?,
        skipped: r.get(15)?,
        created_by: r.get(16)?,
        created_at: r.get(17)?,
        revision: r.get(18)?,
    })
}

fn read_where(conn: &Connection, condition: &str, value: &str) -> Result<Option<Schedule>, StoreError> {
    let sql = format!("SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE {condition} = ?1");
    conn.prepare_cached(&sql)
        .and_then(|mut s| s.query_row(params![value], row_of).optional())
        .map_err(db_err("reading a schedule"))?
        .map(ScheduleRow::into_schedule)
        .transpose()
}

fn read_many(conn: &Connection, sql: &str, args: impl rusqlite::Params) -> Result<Vec<Schedule>, StoreError> {
    let rows: Vec<ScheduleRow> = conn
        .prepare_cached(sql)
        .and_then(|mut s| s.query_map(args, row_of)?.collect())
        .map_err(db_err("reading schedules"))?;
    rows.into_iter().map(ScheduleRow::into_schedule).collect()
}

fn insert_jobs(conn: &Connection, jobs: Vec<NewJob>, now: Timestamp) -> Result<Vec<Job>, StoreError> {
    for job in &jobs {
        job.check().map_err(StoreError::Invalid)?;
    }
    super::jobs::insert_audited(conn, jobs, now)
}

#[async_trait::async_trait]
impl Schedules for SqliteStore {
    async fn schedule_create(&self, schedule: Schedule, now: Timestamp) -> Result<Schedule, StoreError> {
        let row = ScheduleRow::of(&schedule)?;
        self.write_all_or_nothing(move |conn| {
            let err = db_err("creating a schedule");
            if read_where(conn, "name", &row.name)?.is_some() {
                return Err(StoreError::NameTaken(format!("schedule {:?}", row.name)));
            }
            conn.execute(
                &format!(
                    "INSERT INTO schedules ({SCHEDULE_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, \
                     ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19)"
                ),
                params![
                    row.id,
                    row.name,
                    row.cron,
                    row.timezone,
                    row.every_ms,
                    row.overlap,
                    row.catch_up,
                    row.template,
                    row.paused_at,
                    row.paused_by,
                    row.pause_reason,
                    row.next_fire_at,
                    row.last_fired_at,
                    row.last_outcome,
                    row.fired,
                    row.skipped,
                    row.created_by,
                    row.created_at,
                    row.revision
                ],
            )
            .map_err(&err)?;
            super::audit::append(conn, &add_note(&schedule), now)?;
            Ok(schedule)
        })
        .await
    }

    async fn schedule_get(&self, name: String) -> Result<Option<Schedule>, StoreError> {
        self.read(move |conn| read_where(conn, "name", &name)).await
    }

    async fn schedule_list(&self) -> Result<Vec<Schedule>, StoreError> {
        self.read(|conn| read_many(conn, &format!("SELECT {SCHEDULE_COLUMNS} FROM schedules ORDER BY name"), [])).await
    }

    async fn schedule_remove(&self, name: String, actor: Option<String>, now: Timestamp) -> Result<bool, StoreError> {
        self.write_all_or_nothing(move |conn| {
            let removed = conn
                .execute("DELETE FROM schedules WHERE name = ?1", params![name])
                .map_err(db_err("removing a schedule"))?;
            if removed > 0 {
                super::audit::append(conn, &note(actor, "schedule.remove", &name, serde_json::json!({})), now)?;
            }
            Ok(removed > 0)
        })
        .await
    }

    async fn schedule_pause(&self, params: SchedulePauseParams) -> Result<Option<Schedule>, StoreError> {
        self.write_all_or_nothing(move |conn| {
            let err = db_err("pausing a schedule");
            let Some(schedule) = read_where(conn, "name", &params.name)? else { return Ok(None) };
            let (action, detail) = match (&params.pause, &schedule.paused) {
                (Some(reason), None) => {
                    conn.execute(
                        "UPDATE schedules SET paused_at = ?1, paused_by = ?2, pause_reason = ?3, \
                         revision = revision + 1 WHERE schedule_id = ?4",
                        params![params.now.unix_ms(), params.actor, reason, schedule.id.to_string()],
                    )
                    .map_err(&err)?;
                    ("schedule.pause", serde_json::json!({ "reason": reason }))
                }
                (None, Some(_)) => {
                    conn.execute(
                        "UPDATE schedules SET paused_at = NULL, paused_by = NULL, pause_reason = NULL, \
                         next_fire_at = ?1, revision = revision + 1 WHERE schedule_id = ?2",
                        params![params.next_fire_at.map(Timestamp::unix_ms), schedule.id.to_string()],
                    )
                    .map_err(&err)?;
                    ("schedule.resume", serde_json::json!({ "next_fire_at": params.next_fire_at }))
                }
                // Paused already, or running already: nothing changes.
                _ => return Ok(Some(schedule)),
            };
            super::audit::append(conn, &note(params.actor, action, &params.name, detail), params.now)?;
            read_where(conn, "schedule_id", &schedule.id.to_string())
        })
        .await
    }

    async fn schedules_due(&self, now: Timestamp, limit: u32) -> Result<Vec<Schedule>, StoreError> {
        self.read(move |conn| {
            let sql = format!(
                "SELECT {SCHEDULE_COLUMNS} FROM schedules INDEXED BY schedules_due WHERE paused_at IS NULL \
                 AND next_fire_at IS NOT NULL AND next_fire_at <= ?1 ORDER BY next_fire_at LIMIT ?2"
            );
            read_many(conn, &sql, params![now.unix_ms(), limit])
        })
        .await
    }

    async fn schedule_fire(&self, params: ScheduleFireParams) -> Result<ScheduleFired, StoreError> {
        self.write_all_or_nothing(move |conn| {
            let err = db_err("firing a schedule");
            let id = params.id.to_string();
            let active = params.skip_if_active
                && conn
                    .prepare_cached(&format!(
                        "SELECT 1 FROM jobs INDEXED BY jobs_schedule_status WHERE schedule_id = ?1 \
                         AND status IN {ACTIVE_STATUSES}"
                    ))
                    .and_then(|mut s| s.exists(params![id]))
                    .map_err(&err)?;
            let jobs = if active { Vec::new() } else { params.jobs };
            let (fired, skipped) = (jobs.len() as i64, params.skipped as i64 + i64::from(active));
            let outcome = if active { SKIPPED_ACTIVE.to_owned() } else { params.outcome };
            let taken = conn
                .prepare_cached(
                    "UPDATE schedules SET next_fire_at = ?1, last_fired_at = ?2, last_outcome = ?3, \
                     fired = fired + ?4, skipped = skipped + ?5 WHERE schedule_id = ?6 AND revision = ?7 \
                     AND next_fire_at = ?8 AND paused_at IS NULL",
                )
                .and_then(|mut s| {
                    s.execute(params![
                        params.next.map(Timestamp::unix_ms),
                        params.latest.unix_ms(),
                        outcome,
                        fired,
                        skipped,
                        id,
                        params.revision,
                        params.due.unix_ms()
                    ])
                })
                .map_err(&err)?;
            if taken == 0 {
                return Ok(ScheduleFired::Lost);
            }
            if active {
                return Ok(ScheduleFired::SkippedActive);
            }
            Ok(ScheduleFired::Fired(insert_jobs(conn, jobs, params.now)?))
        })
        .await
    }

    async fn schedule_trigger(
        &self,
        id: JobId,
        job: NewJob,
        actor: Option<String>,
        now: Timestamp,
    ) -> Result<Option<Job>, StoreError> {
        self.write_all_or_nothing(move |conn| {
            let Some(schedule) = read_where(conn, "schedule_id", &id.to_string())? else { return Ok(None) };
            let mut jobs = insert_jobs(conn, vec![job], now)?;
            let detail = serde_json::json!({ "job": jobs[0].id });
            super::audit::append(conn, &note(actor, "schedule.trigger", &schedule.name, detail), now)?;
            Ok(jobs.pop())
        })
        .await
    }
}
