//! The PostgreSQL backend: several `leash serve` and `leash worker`
//! processes, on several hosts, sharing one database.
//!
//! Every call takes a connection from a pool ([`deadpool_postgres`]) and
//! runs as one statement or one transaction at `READ COMMITTED`. Claims
//! pick rows with `FOR UPDATE SKIP LOCKED`, so replicas claiming at once
//! never wait on or take each other's jobs; the unique index on running
//! concurrency keys is the backstop for keys. Sweeps lock the rows they
//! change the same way, so replicas sweeping at once never count a lost
//! lease twice; queue expiry and retention work in bounded batches, so a
//! large sweep never holds many locks or one long transaction.
//!
//! The store analyzes the jobs table itself after a burst of inserts (see
//! `stats.rs`): autovacuum would wait up to a minute, and a claim planned
//! on stale statistics reads every queued row. On a server with autovacuum
//! off it vacuums the jobs table itself too.
//!
//! Lease renewals from all of a process's running jobs are gathered into
//! one statement per round trip, and so are their finishes, each with the
//! next job its slot claims, in one transaction (`finishes.rs`). Every
//! write that makes jobs claimable (an insert, a release, a requeue by the
//! reclaim sweep, a resume, an approval) wakes the local pool once it
//! commits and, through one extra connection each store keeps, the other
//! stores' (`wake.rs`), so a job submitted through one replica starts on
//! another at once. That connection reconnects when lost; the poll
//! interval stays the fallback.
//!
//! A statement fenced by a lease (a finish, a renewal, a release, a
//! retry, progress, an effect's intent) finds its row by id and matches
//! the token alone, without `status = 'running'`: only a running row has a
//! token (the table's CHECK), so the match says it runs, and the planner,
//! told the row runs, read it from `jobs_running_worker`, every running
//! row and every dead entry since the last vacuum, instead of by its id
//! (`finishes.rs`).
//!
//! Timestamps are the caller's clock (`now` in every params struct), as
//! milliseconds, never the server's `now()`. A dropped connection, a
//! terminated backend or a restarting server surfaces as a transient
//! [`StoreError`]: callers retry.
//!
//! The URL is a libpq-style `postgres://` URL; two query parameters are
//! leash's own: `pool_size` (connections per process, default
//! [`DEFAULT_POOL_SIZE`]) and `connect_patience_ms` (how long opening
//! waits for a server that is not up, default 30 s).

mod audit;
mod claim;
mod effects;
mod events;
mod fate;
mod finishes;
mod inserts;
mod jobs;
mod labels;
mod leases;
mod pauses;
mod plans;
mod plugins;
mod principals;
mod proposals;
mod rate_limits;
mod renew;
mod rows;
mod schedules;
mod schema;
mod sessions;
mod standing;
mod stats;
mod sweeps;
#[cfg(test)]
mod tests;
mod wake;
mod workers;

use events::VISIBLE_TXN;
use rows::{db_err, pool_err};
use schema::{connect_when_up, migrate};

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use deadpool_postgres::GenericClient;
use tokio::sync::watch;
use tokio_postgres::types::ToSql;
use tokio_postgres::{NoTls, Row};

use super::StoreError;
use crate::clock::Timestamp;

/// Connections per process unless the URL's `pool_size` says otherwise.
pub const DEFAULT_POOL_SIZE: usize = 16;
/// How long opening waits for a server that is not accepting connections.
const DEFAULT_CONNECT_PATIENCE: Duration = Duration::from_secs(30);
/// How long a call waits for a free pooled connection, or for a new one.
const POOL_WAIT: Duration = Duration::from_secs(10);
/// Rows per statement of a sweep or a large insert.
const BATCH: i64 = 1000;

/// The PostgreSQL [`JobStore`](super::JobStore).
#[derive(Debug, Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    pool: deadpool_postgres::Pool,
    /// Bumped by every wake-up, this process's or another store's.
    enqueued: watch::Receiver<u64>,
    wakeups: wake::Wakeups,
    listener: tokio::task::JoinHandle<()>,
    renewals: renew::Renewals,
    finishes: finishes::Finishes,
    freshness: Arc<stats::Freshness>,
    /// Whether some principal has a running cap, and when that was read.
    capped: std::sync::Mutex<Option<(std::time::Instant, bool)>>,
    /// Whether some rate limit or limited job exists, and when that was read.
    limited: std::sync::Mutex<Option<(std::time::Instant, bool)>>,
    /// Bumps `enqueued` when a rate slot a claim here gave comes.
    alarm: crate::store::rate_limits::SlotAlarm,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.listener.abort();
        self.pool.close();
    }
}

/// The URL split into the driver's config and leash's own parameters.
struct Settings {
    config: tokio_postgres::Config,
    pool_size: usize,
    connect_patience: Duration,
}

fn settings(url: &str) -> Result<Settings, StoreError> {
    let invalid =
        |detail: String| StoreError::Config(format!("database URL {}: {detail}", super::Database::parse(url)));
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut kept = Vec::new();
    let (mut pool_size, mut connect_patience) = (DEFAULT_POOL_SIZE, DEFAULT_CONNECT_PATIENCE);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "pool_size" => {
                pool_size = value
                    .parse()
                    .ok()
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| invalid(format!("pool_size must be a whole number ≥ 1, not {value:?}")))?;
            }
            "connect_patience_ms" => {
                connect_patience = Duration::from_millis(
                    value
                        .parse()
                        .map_err(|_| invalid(format!("connect_patience_ms must be a number, not {value:?}")))?,
                );
            }
            _ => kept.push(pair),
        }
    }
    let driver_url = if kept.is_empty() { base.to_owned() } else { format!("{base}?{}", kept.join("&")) };
    let mut config: tokio_postgres::Config = driver_url.parse().map_err(|e| invalid(format!("{e}")))?;
    if config.get_application_name().is_none() {
        config.application_name("leash");
    }
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(5));
    }
    Ok(Settings { config, pool_size, connect_patience })
}

impl PostgresStore {
    /// Connect to the database `url` names (waiting, bounded, for a server
    /// that is not up yet), migrate its schema, and start listening for
    /// enqueues.
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        let shown = super::Database::parse(url).to_string();
        let Settings { config, pool_size, connect_patience } = settings(url)?;
        // A connection cut while migrating (a restart, a terminated
        // backend) is waited out like a server that is not up yet.
        let started = std::time::Instant::now();
        let vacuum_here;
        loop {
            let patience = connect_patience.saturating_sub(started.elapsed());
            let mut first = connect_when_up(&config, &shown, patience).await?;
            match migrate(&mut first).await {
                Err(e) if e.is_transient() && started.elapsed() < connect_patience => {
                    tracing::warn!(database = %shown, error = %e, "migrating was cut off; trying again");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                migrated => {
                    migrated?;
                    vacuum_here = stats::autovacuum_is_off(&first, &shown).await;
                    break;
                }
            }
        }
        let manager = deadpool_postgres::Manager::from_config(
            config.clone(),
            NoTls,
            deadpool_postgres::ManagerConfig { recycling_method: deadpool_postgres::RecyclingMethod::Fast },
        );
        let pool = deadpool_postgres::Pool::builder(manager)
            .max_size(pool_size)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(POOL_WAIT))
            .create_timeout(Some(POOL_WAIT))
            .recycle_timeout(Some(POOL_WAIT))
            .build()
            .map_err(|e| StoreError::Config(format!("building the connection pool: {e}")))?;
        let (notify, enqueued) = watch::channel(0u64);
        let alarm = crate::store::rate_limits::SlotAlarm::new(notify.clone());
        let wakeups = wake::Wakeups::new(notify);
        let listener = tokio::spawn(wakeups.clone().run(config, shown));
        let renewals = renew::Renewals::start(pool.clone());
        let freshness = Arc::new(stats::Freshness::default());
        if vacuum_here {
            freshness.vacuum_here();
        }
        Ok(PostgresStore {
            inner: Arc::new_cyclic(|inner| Inner {
                pool,
                enqueued,
                wakeups,
                listener,
                renewals,
                finishes: finishes::Finishes::start(inner.clone()),
                freshness,
                capped: Default::default(),
                limited: Default::default(),
                alarm,
            }),
        })
    }

    /// Jobs became claimable in a transaction that has committed: wake
    /// every store's claim loop (see `wake.rs`).
    fn wake(&self) {
        self.inner.wakeups.wake();
    }

    /// `jobs` were inserted in a transaction that has committed: wake the
    /// claim loops for the queued ones, and count them towards the table's
    /// next `ANALYZE`.
    fn inserted(&self, jobs: &[crate::job::Job]) {
        if jobs.iter().any(|j| j.status == crate::job::JobStatus::Queued) {
            self.wake();
        }
        self.inner.freshness.inserted(jobs.len() as u64, &self.inner.pool);
    }

    async fn client(&self, operation: &'static str) -> Result<deadpool_postgres::Object, StoreError> {
        self.inner.pool.get().await.map_err(pool_err(operation))
    }

    /// Run one read-only statement and return its rows. A pooled
    /// connection the server closed since its last use (a restart, a
    /// terminated backend) fails the first try; a read is safe to repeat,
    /// so it is tried once more on a fresh connection.
    async fn read(
        &self,
        operation: &'static str,
        sql: &str,
        args: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, StoreError> {
        match self.query(operation, sql, args).await {
            Err(e) if e.is_transient() => self.query(operation, sql, args).await,
            answer => answer,
        }
    }

    /// Run one statement and return its rows.
    async fn query(
        &self,
        operation: &'static str,
        sql: &str,
        args: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, StoreError> {
        let client = self.client(operation).await?;
        let err = db_err(operation);
        let stmt = client.prepare_cached(sql).await.map_err(&err)?;
        client.query(&stmt, args).await.map_err(&err)
    }

    /// Run one statement and return how many rows it changed.
    async fn execute(
        &self,
        operation: &'static str,
        sql: &str,
        args: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, StoreError> {
        let client = self.client(operation).await?;
        let err = db_err(operation);
        let stmt = client.prepare_cached(sql).await.map_err(&err)?;
        client.execute(&stmt, args).await.map_err(&err)
    }

    /// Delete the events recorded before `before`, as one prefix of the
    /// feed that never holds the newest event (as on SQLite, where that
    /// keeps numbers from being given out again), and move the horizon up
    /// to where it ends.
    async fn events_delete_before(&self, before: Timestamp) -> Result<(), StoreError> {
        static LAST_OLD: LazyLock<String> = LazyLock::new(|| {
            format!(
                "SELECT txn, seq FROM events WHERE at < $1 AND txn < {VISIBLE_TXN} \
                 AND (txn, seq) < (SELECT txn, seq FROM events ORDER BY txn DESC, seq DESC LIMIT 1) \
                 ORDER BY txn DESC, seq DESC LIMIT 1"
            )
        });
        let err = db_err("deleting old events");
        let mut client = self.client("deleting old events").await?;
        let tx = client.transaction().await.map_err(&err)?;
        let Some(last) = tx.query_opt(LAST_OLD.as_str(), &[&before.unix_ms()]).await.map_err(&err)? else {
            return Ok(());
        };
        let (txn, seq): (i64, i64) = (last.get(0), last.get(1));
        tx.execute("DELETE FROM events WHERE (txn, seq) <= ($1, $2)", &[&txn, &seq]).await.map_err(&err)?;
        tx.execute(
            "INSERT INTO event_horizon (id, txn, seq) VALUES (1, $1, $2) ON CONFLICT (id) DO UPDATE \
             SET txn = EXCLUDED.txn, seq = EXCLUDED.seq \
             WHERE (event_horizon.txn, event_horizon.seq) < (EXCLUDED.txn, EXCLUDED.seq)",
            &[&txn, &seq],
        )
        .await
        .map_err(&err)?;
        tx.commit().await.map_err(&err)
    }

    /// Run a bounded-batch statement (`$1` the cutoff, `$2` the batch
    /// size) until a batch comes back short; the total changed.
    async fn in_batches(&self, operation: &'static str, sql: &str, cutoff: i64) -> Result<u64, StoreError> {
        let mut total = 0;
        loop {
            let n = self.execute(operation, sql, &[&cutoff, &BATCH]).await?;
            total += n;
            if n < BATCH as u64 {
                return Ok(total);
            }
        }
    }
}
