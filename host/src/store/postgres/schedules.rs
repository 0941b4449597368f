//! The PostgreSQL store's [`Schedules`]. A firing's conditional update
//! locks the schedule's row: a second replica preparing the same firing
//! waits for the first to commit, then finds the next firing moved and
//! writes nothing (read committed re-checks the condition on the new row).

use deadpool_postgres::GenericClient;
use tokio_postgres::Row;

use super::PostgresStore;
use super::rows::db_err;
use crate::clock::Timestamp;
use crate::job::{Job, JobId, NewJob, Schedule};
use crate::store::rules::audit::note;
use crate::store::rules::schedule::{ACTIVE_STATUSES, SCHEDULE_COLUMNS, SKIPPED_ACTIVE, ScheduleRow, add_note};
use crate::store::{ScheduleFireParams, ScheduleFired, SchedulePauseParams, Schedules, StoreError};

/// The migration that adds schedules (listed in
/// [`MIGRATIONS`](super::schema::MIGRATIONS)).
pub(super) const MIGRATION: &str = r#"
CREATE TABLE schedules (
    schedule_id   TEXT PRIMARY KEY,
    name          TEXT NOT NULL UNIQUE,
    cron          TEXT,
    timezone      TEXT,
    every_ms      BIGINT,
    overlap       TEXT NOT NULL,
    catch_up      TEXT NOT NULL,
    template_json TEXT NOT NULL,
    paused_at     BIGINT,
    paused_by     TEXT,
    pause_reason  TEXT,
    next_fire_at  BIGINT,
    last_fired_at BIGINT,
    last_outcome  TEXT,
    fired         BIGINT NOT NULL DEFAULT 0,
    skipped       BIGINT NOT NULL DEFAULT 0,
    created_by    TEXT,
    created_at    BIGINT NOT NULL,
    revision      BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX schedules_due ON schedules (next_fire_at) WHERE paused_at IS NULL AND next_fire_at IS NOT NULL;
ALTER TABLE jobs ADD COLUMN schedule_id TEXT;
CREATE INDEX jobs_by_schedule ON jobs (schedule_id, job_id) WHERE schedule_id IS NOT NULL;
CREATE INDEX jobs_schedule_status ON jobs (schedule_id, status) WHERE schedule_id IS NOT NULL;
"#;

fn row_of(r: &Row) -> ScheduleRow {
    ScheduleRow {
        id: r.get(0),
        name: r.get(1),
        cron: r.get(2),
        timezone: r.get(3),
        every_ms: r.get(4),
        overlap: r.get(5),
        catch_up: r.get(6),
        template: r.get(7),
        paused_at: r.get(8),
        paused_by: r.get(9),
        pause_reason: r.get(10),
        next_fire_at: r.get(11),
        last_fired_at: r.get(12),
        last_outcome: r.get(13),
        fired: r.get(14),
        skipped: r.get(15),
        created_by: r.get(16),
        created_at: r.get(17),
        revision: r.get(18),
    }
}

fn schedules_of(rows: &[Row]) -> Result<Vec<Schedule>, StoreError> {
    rows.iter().map(|r| row_of(r).into_schedule()).collect()
}

async fn read_where(
    client: &impl GenericClient,
    condition: &str,
    value: &str,
    lock: bool,
) -> Result<Option<Schedule>, StoreError> {
    let sql = format!(
        "SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE {condition} = $1{}",
        if lock { " FOR UPDATE" } else { "" }
    );
    let row = client.query_opt(&sql, &[&value]).await.map_err(db_err("reading a schedule"))?;
    row.map(|r| row_of(&r).into_schedule()).transpose()
}

async fn insert_jobs(
    tx: &deadpool_postgres::Transaction<'_>,
    jobs: Vec<NewJob>,
    now: Timestamp,
) -> Result<Vec<Job>, StoreError> {
    for job in &jobs {
        job.check().map_err(StoreError::Invalid)?;
    }
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    super::inserts::insert_audited(tx, jobs, now).await
}

#[async_trait::async_trait]
impl Schedules for PostgresStore {
    async fn schedule_create(&self, schedule: Schedule, now: Timestamp) -> Result<Schedule, StoreError> {
        let err = db_err("creating a schedule");
        let row = ScheduleRow::of(&schedule)?;
        let mut client = self.client("creating a schedule").await?;
        let tx = client.transaction().await.map_err(&err)?;
        let inserted = tx
            .execute(
                &format!(
                    "INSERT INTO schedules ({SCHEDULE_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, \
                     $12, $13, $14, $15, $16, $17, $18, $19) ON CONFLICT (name) DO NOTHING"
                ),
                &[
                    &row.id,
                    &row.name,
                    &row.cron,
                    &row.timezone,
                    &row.every_ms,
                    &row.overlap,
                    &row.catch_up,
                    &row.template,
                    &row.paused_at,
                    &row.paused_by,
                    &row.pause_reason,
                    &row.next_fire_at,
                    &row.last_fired_at,
                    &row.last_outcome,
                    &row.fired,
                    &row.skipped,
                    &row.created_by,
                    &row.created_at,
                    &row.revision,
                ],
            )
            .await
            .map_err(&err)?;
        if inserted == 0 {
            return Err(StoreError::NameTaken(format!("schedule {:?}", row.name)));
        }
        super::audit::append(&tx, &add_note(&schedule), now).await?;
        tx.commit().await.map_err(&err)?;
        Ok(schedule)
    }

    async fn schedule_get(&self, name: String) -> Result<Option<Schedule>, StoreError> {
        let client = self.client("reading a schedule").await?;
        read_where(&client, "name", &name, false).await
    }

    async fn schedule_list(&self) -> Result<Vec<Schedule>, StoreError> {
        let sql = format!("SELECT {SCHEDULE_COLUMNS} FROM schedules ORDER BY name");
        schedules_of(&self.read("reading schedules", &sql, &[]).await?)
    }

    async fn schedule_remove(&self, name: String, actor: Option<String>, now: Timestamp) -> Result<bool, StoreError> {
        let err = db_err("removing a schedule");
        let mut client = self.client("removing a schedule").await?;
        let tx = client.transaction().await.map_err(&err)?;
        let removed = tx.execute("DELETE FROM schedules WHERE name = $1", &[&name]).await.map_err(&err)?;
        if removed > 0 {
            super::audit::append(&tx, &note(actor, "schedule.remove", &name, serde_json::json!({})), now).await?;
        }
        tx.commit().await.map_err(&err)?;
        Ok(removed > 0)
    }

    async fn schedule_pause(&self, params: SchedulePauseParams) -> Result<Option<Schedule>, StoreError> {
        let err = db_err("pausing a schedule");
        let mut client = self.client("pausing a schedule").await?;
        let tx = client.transaction().await.map_err(&err)?;
        let Some(schedule) = read_where(&tx, "name", &params.name, true).await? else { return Ok(None) };
        let id = schedule.id.to_string();
        let (action, detail) = match (&params.pause, &schedule.paused) {
            (Some(reason), None) => {
                tx.execute(
                    "UPDATE schedules SET paused_at = $1, paused_by = $2, pause_reason = $3, \
                     revision = revision + 1 WHERE schedule_id = $4",
                    &[&params.now.unix_ms(), &params.actor, reason, &id],
                )
                .await
                .map_err(&err)?;
                ("schedule.pause", serde_json::json!({ "reason": reason }))
            }
            (None, Some(_)) => {
                tx.execute(
                    "UPDATE schedules SET paused_at = NULL, paused_by = NULL, pause_reason = NULL, \
                     next_fire_at = $1, revision = revision + 1 WHERE schedule_id = $2",
                    &[&params.next_fire_at.map(Timestamp::unix_ms), &id],
                )
                .await
                .map_err(&err)?;
                ("schedule.resume", serde_json::json!({ "next_fire_at": params.next_fire_at }))
            }
            _ => return Ok(Some(schedule)),
        };
        super::audit::append(&tx, &note(params.actor, action, &params.name, detail), params.now).await?;
        let changed = read_where(&tx, "schedule_id", &id, false).await?;
        tx.commit().await.map_err(&err)?;
        Ok(changed)
    }

    async fn schedules_due(&self, now: Timestamp, limit: u32) -> Result<Vec<Schedule>, StoreError> {
        let sql = format!(
            "SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE paused_at IS NULL AND next_fire_at IS NOT NULL \
             AND next_fire_at <= $1 ORDER BY next_fire_at LIMIT $2"
        );
        schedules_of(&self.read("reading due schedules", &sql, &[&now.unix_ms(), &i64::from(limit)]).await?)
    }

    async fn schedule_fire(&self, params: ScheduleFireParams) -> Result<ScheduleFired, StoreError> {
        let err = db_err("firing a schedule");
        let mut client = self.client("firing a schedule").await?;
        let tx = client.transaction().await.map_err(&err)?;
        let id = params.id.to_string();
        // Take the firing first: the row lock orders concurrent firings, so
        // the active-job check below sees every job an earlier one made.
        let taken = tx
            .execute(
                "UPDATE schedules SET next_fire_at = $1, last_fired_at = $5 WHERE schedule_id = $3 \
                 AND revision = $4 AND next_fire_at = $2 AND paused_at IS NULL",
                &[
                    &params.next.map(Timestamp::unix_ms),
                    &params.due.unix_ms(),
                    &id,
                    &params.revision,
                    &params.latest.unix_ms(),
                ],
            )
            .await
            .map_err(&err)?;
        if taken == 0 {
            return Ok(ScheduleFired::Lost);
        }
        let active = params.skip_if_active
            && tx
                .query_opt(
                    &format!("SELECT 1 FROM jobs WHERE schedule_id = $1 AND status IN {ACTIVE_STATUSES} LIMIT 1"),
                    &[&id],
                )
                .await
                .map_err(&err)?
                .is_some();
        let jobs = if active { Vec::new() } else { params.jobs };
        let (fired, skipped) = (jobs.len() as i64, params.skipped as i64 + i64::from(active));
        let outcome = if active { SKIPPED_ACTIVE.to_owned() } else { params.outcome };
        tx.execute(
            "UPDATE schedules SET last_outcome = $1, fired = fired + $2, skipped = skipped + $3 WHERE schedule_id = $4",
            &[&outcome, &fired, &skipped, &id],
        )
        .await
        .map_err(&err)?;
        let inserted = insert_jobs(&tx, jobs, params.now).await?;
        tx.commit().await.map_err(&err)?;
        if active {
            return Ok(ScheduleFired::SkippedActive);
        }
        self.inserted(&inserted);
        Ok(ScheduleFired::Fired(inserted))
    }

    async fn schedule_trigger(
        &self,
        id: JobId,
        job: NewJob,
        actor: Option<String>,
        now: Timestamp,
    ) -> Result<Option<Job>, StoreError> {
        let err = db_err("triggering a schedule");
        let mut client = self.client("triggering a schedule").await?;
        let tx = client.transaction().await.map_err(&err)?;
        let Some(schedule) = read_where(&tx, "schedule_id", &id.to_string(), true).await? else { return Ok(None) };
        let mut jobs = insert_jobs(&tx, vec![job], now).await?;
        let detail = serde_json::json!({ "job": jobs[0].id });
        super::audit::append(&tx, &note(actor, "schedule.trigger", &schedule.name, detail), now).await?;
        tx.commit().await.map_err(&err)?;
        self.inserted(&jobs);
        Ok(jobs.pop())
    }
}
