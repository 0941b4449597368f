//! The PostgreSQL store's [`Workers`]: heartbeat rows and the
//! health snapshot.

use deadpool_postgres::GenericClient;

use super::PostgresStore;
use super::events::snapshot;
use super::rows::{count_jobs, db_err};
use crate::clock::Timestamp;
use crate::job::{WorkerRecord, WorkerState, millis};
use crate::store::rules::codec::{corrupt, i64_of};
use crate::store::{StoreError, Workers, WorkersSnapshot};

#[async_trait::async_trait]
impl Workers for PostgresStore {
    async fn worker_beat(&self, worker: WorkerRecord) -> Result<(), StoreError> {
        self.execute(
            "registering a worker",
            "INSERT INTO workers (worker_id, host, pid, version, slots, running, state, poll_interval_ms, \
             processed, failed, cancelled, started_at, last_heartbeat) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) \
             ON CONFLICT (worker_id) DO UPDATE SET host = excluded.host, pid = excluded.pid, \
             version = excluded.version, slots = excluded.slots, running = excluded.running, \
             state = excluded.state, poll_interval_ms = excluded.poll_interval_ms, \
             processed = excluded.processed, failed = excluded.failed, cancelled = excluded.cancelled, \
             last_heartbeat = excluded.last_heartbeat",
            &[
                &worker.worker_id,
                &worker.host,
                &i64::from(worker.pid),
                &worker.version,
                &i64::from(worker.slots),
                &i64::from(worker.running),
                &worker.state.as_str(),
                &millis::column(worker.poll_interval),
                &i64_of(worker.processed),
                &i64_of(worker.failed),
                &i64_of(worker.cancelled),
                &worker.started_at.unix_ms(),
                &worker.last_heartbeat.unix_ms(),
            ],
        )
        .await?;
        Ok(())
    }

    async fn workers_snapshot(&self) -> Result<WorkersSnapshot, StoreError> {
        let err = db_err("reading the workers");
        let mut client = self.client("reading the workers").await?;
        // One snapshot for the three reads.
        let tx = snapshot(&mut client).await.map_err(&err)?;
        let workers = tx
            .query(
                "SELECT worker_id, host, pid, version, slots, running, state, poll_interval_ms, processed, \
                 failed, cancelled, started_at, last_heartbeat FROM workers ORDER BY started_at, worker_id",
                &[],
            )
            .await
            .map_err(&err)?
            .iter()
            .map(|r| {
                let worker_id: String = r.get(0);
                let state: String = r.get(6);
                Ok(WorkerRecord {
                    state: state.parse::<WorkerState>().map_err(|e| corrupt(&worker_id, e))?,
                    worker_id,
                    host: r.get(1),
                    pid: r.get::<_, i64>(2).clamp(0, i64::from(u32::MAX)) as u32,
                    version: r.get(3),
                    slots: r.get::<_, i64>(4).clamp(0, i64::from(u32::MAX)) as u32,
                    running: r.get::<_, i64>(5).clamp(0, i64::from(u32::MAX)) as u32,
                    poll_interval: millis::from_column(r.get(7)),
                    processed: r.get::<_, i64>(8).max(0) as u64,
                    failed: r.get::<_, i64>(9).max(0) as u64,
                    cancelled: r.get::<_, i64>(10).max(0) as u64,
                    started_at: Timestamp::from_unix_ms(r.get(11)),
                    last_heartbeat: Timestamp::from_unix_ms(r.get(12)),
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        let running_jobs = tx
            .query("SELECT job_id, worker_id FROM jobs WHERE status = 'running' ORDER BY worker_id, job_id", &[])
            .await
            .map_err(&err)?
            .iter()
            .map(|r| {
                let id: String = r.get(0);
                Ok((id.parse().map_err(|e: String| corrupt(&id, e))?, r.get(1)))
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        let counts = count_jobs(&tx).await?;
        tx.commit().await.map_err(&err)?;
        Ok(WorkersSnapshot { workers, running_jobs, counts })
    }
}
