//! The SQLite store's [`Workers`]: heartbeat rows and the
//! health snapshot.

use rusqlite::params;

use super::SqliteStore;
use super::rows::{count_jobs, db_err};
use crate::clock::Timestamp;
use crate::job::{WorkerRecord, WorkerState, millis};
use crate::store::rules::codec::corrupt;
use crate::store::{StoreError, Workers, WorkersSnapshot};

#[async_trait::async_trait]
impl Workers for SqliteStore {
    async fn worker_beat(&self, worker: WorkerRecord) -> Result<(), StoreError> {
        self.write(move |conn| {
            conn.prepare_cached(
                "INSERT INTO workers (worker_id, host, pid, version, slots, running, state, poll_interval_ms, \
                 processed, failed, cancelled, started_at, last_heartbeat) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13) \
                 ON CONFLICT (worker_id) DO UPDATE SET host = excluded.host, pid = excluded.pid, \
                 version = excluded.version, slots = excluded.slots, running = excluded.running, \
                 state = excluded.state, poll_interval_ms = excluded.poll_interval_ms, \
                 processed = excluded.processed, failed = excluded.failed, cancelled = excluded.cancelled, \
                 last_heartbeat = excluded.last_heartbeat",
            )
            .and_then(|mut s| {
                s.execute(params![
                    worker.worker_id,
                    worker.host,
                    worker.pid,
                    worker.version,
                    worker.slots,
                    worker.running,
                    worker.state.as_str(),
                    millis::column(worker.poll_interval),
                    worker.processed as i64,
                    worker.failed as i64,
                    worker.cancelled as i64,
                    worker.started_at.unix_ms(),
                    worker.last_heartbeat.unix_ms(),
                ])
            })
            .map_err(db_err("registering a worker"))?;
            Ok(())
        })
        .await
    }

    async fn workers_snapshot(&self) -> Result<WorkersSnapshot, StoreError> {
        self.read(|conn| {
            let err = db_err("reading the workers");
            // One read transaction: the three reads see the same state.
            conn.execute_batch("BEGIN").map_err(&err)?;
            let read = (|| {
                let workers = conn
                    .prepare_cached(
                        "SELECT worker_id, host, pid, version, slots, running, state, poll_interval_ms, processed, \
                         failed, cancelled, started_at, last_heartbeat FROM workers ORDER BY started_at, worker_id",
                    )
                    .and_then(|mut s| {
                        s.query_map([], |r| {
                            Ok((
                                WorkerRecord {
                                    worker_id: r.get(0)?,
                                    host: r.get(1)?,
                                    pid: r.get(2)?,
                                    version: r.get(3)?,
                                    slots: r.get(4)?,
                                    running: r.get(5)?,
                                    state: WorkerState::Stopped,
                                    poll_interval: millis::from_column(r.get(7)?),
                                    processed: r.get::<_, i64>(8)?.max(0) as u64,
                                    failed: r.get::<_, i64>(9)?.max(0) as u64,
                                    cancelled: r.get::<_, i64>(10)?.max(0) as u64,
                                    started_at: Timestamp::from_unix_ms(r.get(11)?),
                                    last_heartbeat: Timestamp::from_unix_ms(r.get(12)?),
                                },
                                r.get::<_, String>(6)?,
                            ))
                        })?
                        .collect::<Result<Vec<_>, _>>()
                    })
                    .map_err(&err)?
                    .into_iter()
                    .map(|(mut worker, state)| {
                        worker.state = state.parse().map_err(|e: String| corrupt(&worker.worker_id, e))?;
                        Ok(worker)
                    })
                    .collect::<Result<Vec<_>, StoreError>>()?;
                let running_jobs = conn
                    .prepare_cached(
                        "SELECT job_id, worker_id FROM jobs WHERE status = 'running' ORDER BY worker_id, job_id",
                    )
                    .and_then(|mut s| {
                        s.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?
                            .collect::<Result<Vec<_>, _>>()
                    })
                    .map_err(&err)?
                    .into_iter()
                    .map(|(id, worker)| Ok((id.parse().map_err(|e: String| corrupt(&id, e))?, worker)))
                    .collect::<Result<Vec<_>, StoreError>>()?;
                Ok(WorkersSnapshot { workers, running_jobs, counts: count_jobs(conn)? })
            })();
            let _ = conn.execute_batch("COMMIT");
            read
        })
        .await
    }
}
