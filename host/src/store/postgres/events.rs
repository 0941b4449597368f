//! The PostgreSQL store's [`Events`]: reading the change feed.

use std::sync::LazyLock;

use deadpool_postgres::GenericClient;
use tokio_postgres::Row;

use super::PostgresStore;
use super::rows::db_err;
use crate::job::{Event, EventId};
use crate::store::rules::events::EventRow;
use crate::store::sql::EVENT_COLUMNS;
use crate::store::{EventPage, Events, EventsAfterParams, StoreError};

/// A job's changes are written to the feed once per statement, not once
/// per row (listed in [`MIGRATIONS`](super::schema::MIGRATIONS)): a claim
/// or a finish of many jobs appends all their events in one insert from
/// the statement's transition tables. Row by row, a trigger call and an
/// insert for each job were a third of the server's time in a drain
/// (`pg_stat_statements`: ~30 µs a row, 20,000 rows for 10,000 jobs).
/// The events are the same as the row trigger's (which stays for
/// inserts): a status change; a cancel asked of a running job; a running
/// job's new progress. Within one statement they are in job id order.
pub(super) const STATEMENT_MIGRATION: &str = r#"
DROP TRIGGER jobs_events_update ON jobs;
CREATE FUNCTION leash_job_events_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO events (what, job_id, plan_id, plugin_digest, plugin_name, plugin_version, phase, action, status,
                        previous, attempt, worker_id, error_kind, progress_json)
    SELECT c.what, n.job_id, n.plan_id, n.plugin_digest, n.plugin_name, n.plugin_version, n.phase, n.action,
           n.status, CASE WHEN c.what = 'status' THEN o.status END, n.attempt, n.worker_id, n.error_kind,
           n.progress_json
    FROM leash_new n JOIN leash_old o ON o.job_id = n.job_id
    CROSS JOIN LATERAL (SELECT CASE
        WHEN n.status IS DISTINCT FROM o.status THEN 'status'
        WHEN n.status = 'running' AND n.cancel_requested AND NOT o.cancel_requested THEN 'cancel'
        -- A claim clears the progress and a finish keeps the last: only a
        -- report from a running guest is an event of its own.
        WHEN n.status = 'running' AND o.status = 'running' AND n.progress_json IS NOT NULL
             AND n.progress_json IS DISTINCT FROM o.progress_json THEN 'progress'
    END AS what) c
    WHERE c.what IS NOT NULL
    ORDER BY n.job_id;
    RETURN NULL;
END
$$;
CREATE TRIGGER jobs_events_updated AFTER UPDATE ON jobs
    REFERENCING OLD TABLE AS leash_old NEW TABLE AS leash_new
    FOR EACH STATEMENT EXECUTE FUNCTION leash_job_events_updated();
"#;

#[async_trait::async_trait]
impl Events for PostgresStore {
    async fn events_after(&self, params: EventsAfterParams) -> Result<EventPage, StoreError> {
        static SQL: LazyLock<String> = LazyLock::new(|| {
            format!(
                "SELECT txn, seq, {EVENT_COLUMNS} FROM events WHERE (txn, seq) > ($1, $2) AND txn < {VISIBLE_TXN} \
                 ORDER BY txn, seq LIMIT $3"
            )
        });
        let err = db_err("reading events");
        let mut client = self.client("reading events").await?;
        // One snapshot for the horizon and the events.
        let tx = snapshot(&mut client).await.map_err(&err)?;
        let horizon = tx.query_opt("SELECT txn, seq FROM event_horizon", &[]).await.map_err(&err)?;
        let after = params.after.unwrap_or_default();
        let missed = params.after.is_some()
            && horizon
                .is_some_and(|h| after < EventId { txn: h.get::<_, i64>(0) as u64, seq: h.get::<_, i64>(1) as u64 });
        let stmt = tx.prepare_cached(&SQL).await.map_err(&err)?;
        let (txn, seq, limit) = (after.txn as i64, after.seq as i64, i64::from(params.limit.max(1)));
        let rows = tx.query(&stmt, &[&txn, &seq, &limit]).await.map_err(&err)?;
        tx.commit().await.map_err(&err)?;
        let events = rows.iter().map(row_to_event).collect::<Result<_, _>>()?;
        Ok(EventPage { events, missed })
    }

    async fn events_head(&self) -> Result<Option<EventId>, StoreError> {
        static SQL: LazyLock<String> = LazyLock::new(|| {
            format!("SELECT txn, seq FROM events WHERE txn < {VISIBLE_TXN} ORDER BY txn DESC, seq DESC LIMIT 1")
        });
        let rows = self.read("reading events", &SQL, &[]).await?;
        Ok(rows.first().map(|r| EventId { txn: r.get::<_, i64>(0) as u64, seq: r.get::<_, i64>(1) as u64 }))
    }
}

/// The first transaction id still running when the statement began: every
/// event of an older transaction is committed (or never will be), so a
/// reader that stops below it never sees an older event appear later.
pub(super) const VISIBLE_TXN: &str = "pg_snapshot_xmin(pg_current_snapshot())::text::bigint";

/// A read-only transaction whose reads all see one snapshot.
pub(super) async fn snapshot(
    client: &mut deadpool_postgres::Object,
) -> Result<deadpool_postgres::Transaction<'_>, tokio_postgres::Error> {
    client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
}

/// An event row: `txn, seq`, then [`EVENT_COLUMNS`].
pub(super) fn row_to_event(r: &Row) -> Result<Event, StoreError> {
    EventRow {
        id: EventId { txn: r.get::<_, i64>(0) as u64, seq: r.get::<_, i64>(1) as u64 },
        at_ms: r.get(2),
        what: r.get(3),
        job_id: r.get(4),
        plan_id: r.get(5),
        plugin_digest: r.get(6),
        plugin_name: r.get(7),
        plugin_version: r.get(8),
        phase: r.get(9),
        action: r.get(10),
        status: r.get(11),
        previous: r.get(12),
        attempt: r.get(13),
        worker_id: r.get(14),
        error_kind: r.get(15),
        progress_json: r.get(16),
    }
    .into_event()
}
