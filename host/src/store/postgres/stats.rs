//! Planner statistics for the jobs table, kept fresh by the store itself.
//!
//! Autovacuum analyzes a table once a tenth of it has changed, and looks at
//! most once a minute (`autovacuum_naptime`). A queue filled in a burst (a
//! new table, a backlog submitted at once) is planned until then as if it
//! held what it held at its last analyze: the claim, expecting a handful of
//! queued rows, reads and sorts every queued row on each call instead of
//! taking the first ones from the claim index. Measured: 10,000 jobs
//! queued into a new table drained at ~500 jobs/s with 16 slots, every
//! claim busy on the CPU; analyzed, the same claim reads a few index
//! entries. So each store counts the rows it inserts and, once they match
//! the table at its last analyze (it has doubled; at least [`MIN_ROWS`]),
//! runs `ANALYZE jobs` in the background, one at a time per process.
//! Once a table has statistics, the planner scales its row estimate by
//! the table's pages as it grows, which keeps it near between doublings;
//! at a tenth, as before, a queue at a thousand submits a second on a young
//! table was analyzed every second, and each analyze (~25 ms of a core on
//! a table of 6,000 rows) showed as a 20-35 ms stall of the job starts
//! around it. `ANALYZE` samples a bounded number of rows, so it costs
//! about the same on a table of ten thousand rows or ten million.
//!
//! Vacuum, likewise, when the server does not run it (autovacuum off):
//! every claim and finish leaves a dead row version, and retention's
//! deletes leave more. Unvacuumed, they stay in the claim's index, where
//! every claim steps over them: measured, a million-job backlog drained
//! at a third of its first rate by its end, and one `VACUUM` restored it
//! within seconds. So such a store counts the rows it changes and, once
//! they exceed a tenth of the table (and at least [`MIN_CHANGED`]), runs
//! `VACUUM (SKIP_LOCKED) jobs` in the background, one at a time per
//! process (a replica's vacuum already running is skipped, not waited
//! for). With autovacuum on, the server's own is left to do it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Inserted rows below which no analyze is started.
const MIN_ROWS: u64 = 1000;

/// Changed rows below which no vacuum is started.
const MIN_CHANGED: u64 = 10_000;

/// Rows inserted since the last analyze this process ran, and rows
/// changed since its last vacuum.
#[derive(Debug, Default)]
pub(super) struct Freshness {
    inserted: AtomicU64,
    /// The table's row estimate as last read (after an analyze, or by a
    /// vacuum's check).
    rows_then: AtomicU64,
    running: AtomicBool,
    /// Whether this store vacuums the table (the server does not).
    vacuums: AtomicBool,
    /// Rows updated or deleted since this process's last vacuum began.
    changed: AtomicU64,
    vacuuming: AtomicBool,
}

impl Freshness {
    /// Count `n` inserted rows; analyze in the background if they make the
    /// statistics stale.
    pub(super) fn inserted(self: &Arc<Self>, n: u64, pool: &deadpool_postgres::Pool) {
        self.inserted.fetch_add(n, Ordering::Relaxed);
        self.start_if_stale(pool);
    }

    /// Vacuum the table from now on (the server does not).
    pub(super) fn vacuum_here(&self) {
        self.vacuums.store(true, Ordering::Relaxed);
    }

    /// Count `n` rows updated or deleted; vacuum in the background if the
    /// store vacuums and they pass a tenth of the table. (A process that
    /// inserts nothing never analyzes: the table's size is read before
    /// each vacuum, and a vacuum not due yet is not run.)
    pub(super) fn changed(self: &Arc<Self>, n: u64, pool: &deadpool_postgres::Pool) {
        if n == 0 || !self.vacuums.load(Ordering::Relaxed) {
            return;
        }
        let changed = self.changed.fetch_add(n, Ordering::Relaxed) + n;
        if !self.vacuum_due(changed) || self.vacuuming.swap(true, Ordering::AcqRel) {
            return;
        }
        // Rows changed while it runs are counted toward the next one.
        let counted = self.changed.swap(0, Ordering::Relaxed);
        let (this, pool) = (self.clone(), pool.clone());
        tokio::spawn(async move {
            if let Err(e) = this.vacuum_if_due(&pool, counted).await {
                tracing::debug!(error = %e, "could not vacuum the jobs table");
            }
            this.vacuuming.store(false, Ordering::Release);
        });
    }

    fn vacuum_due(&self, changed: u64) -> bool {
        changed >= MIN_CHANGED.max(self.rows_then.load(Ordering::Relaxed) / 10)
    }

    /// `VACUUM (SKIP_LOCKED) jobs` if `counted` changed rows pass a tenth of
    /// the table as it is now; else they stay counted.
    async fn vacuum_if_due(&self, pool: &deadpool_postgres::Pool, counted: u64) -> Result<(), BoxError> {
        let client = pool.get().await?;
        self.rows_then.store(row_estimate(&client).await?, Ordering::Relaxed);
        if !self.vacuum_due(counted) {
            self.changed.fetch_add(counted, Ordering::Relaxed);
            return Ok(());
        }
        client.batch_execute("VACUUM (SKIP_LOCKED) jobs").await?;
        self.rows_then.store(row_estimate(&client).await?, Ordering::Relaxed);
        Ok(())
    }

    fn stale(&self) -> bool {
        self.inserted.load(Ordering::Relaxed) >= MIN_ROWS.max(self.rows_then.load(Ordering::Relaxed))
    }

    fn start_if_stale(self: &Arc<Self>, pool: &deadpool_postgres::Pool) {
        if !self.stale() || self.running.swap(true, Ordering::AcqRel) {
            return;
        }
        let (this, pool) = (self.clone(), pool.clone());
        tokio::spawn(async move {
            // Rows inserted while an analyze runs may be missing from what
            // it sampled: analyze again while they would make it stale.
            let mut failed = false;
            loop {
                let counted = this.inserted.swap(0, Ordering::Relaxed);
                match analyze(&pool).await {
                    Ok(rows) => this.rows_then.store(rows, Ordering::Relaxed),
                    // The rows stay counted: a later insert tries again.
                    Err(e) => {
                        this.inserted.fetch_add(counted, Ordering::Relaxed);
                        tracing::debug!(error = %e, "could not analyze the jobs table");
                        failed = true;
                        break;
                    }
                }
                if !this.stale() {
                    break;
                }
            }
            this.running.store(false, Ordering::Release);
            // An insert that came between the last check and now saw the
            // analyze running and left its rows counted for us.
            if !failed && this.stale() {
                this.start_if_stale(&pool);
            }
        });
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// `ANALYZE jobs`; the row estimate it left.
async fn analyze(pool: &deadpool_postgres::Pool) -> Result<u64, BoxError> {
    let client = pool.get().await?;
    client.batch_execute("ANALYZE jobs").await?;
    row_estimate(&client).await
}

/// The jobs table's row estimate (the last analyze's or vacuum's).
async fn row_estimate(client: &deadpool_postgres::Client) -> Result<u64, BoxError> {
    let row = client.query_one("SELECT reltuples::bigint FROM pg_class WHERE oid = 'jobs'::regclass", &[]).await?;
    Ok(row.get::<_, i64>(0).max(0) as u64)
}

/// Whether the server vacuums by itself; said when it does not: the store
/// then vacuums the jobs table, but no other table (the events and the
/// attempts kept beside the jobs).
pub(super) async fn autovacuum_is_off(client: &tokio_postgres::Client, shown: &str) -> bool {
    let Ok(row) = client.query_one("SHOW autovacuum", &[]).await else { return false };
    let off = row.get::<_, String>(0) == "off";
    if off {
        tracing::warn!(
            database = %shown,
            "autovacuum is off on this server: leash vacuums its jobs table itself, but the space of other \
             deleted rows (events, attempts) is never reused; turn autovacuum on"
        );
    }
    off
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_is_analyzed_again_once_it_has_doubled() {
        let fresh = Freshness::default();
        fresh.inserted.store(MIN_ROWS - 1, Ordering::Relaxed);
        assert!(!fresh.stale(), "a new table waits for its first thousand rows");
        fresh.inserted.store(MIN_ROWS, Ordering::Relaxed);
        assert!(fresh.stale());
        fresh.rows_then.store(50_000, Ordering::Relaxed);
        fresh.inserted.store(49_999, Ordering::Relaxed);
        assert!(!fresh.stale(), "a tenth, or nine tenths, more is not yet a doubling");
        fresh.inserted.store(50_000, Ordering::Relaxed);
        assert!(fresh.stale());
    }
}
