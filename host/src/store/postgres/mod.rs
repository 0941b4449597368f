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
//! on stale statistics reads every queued row.
//!
//! Lease renewals from all of a process's running jobs are gathered into
//! one statement per round trip. Every insert, release and requeue by the
//! reclaim sweep sends `NOTIFY leash_jobs` in its transaction; each store
//! keeps one extra connection that `LISTEN`s and wakes the local pool, so
//! a job submitted through one replica starts on another at once. That
//! connection reconnects when lost; the poll interval stays the fallback.
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

mod renew;
mod rows;
mod schema;
mod stats;

use rows::{
    count_jobs, db_err, describe, job_columns, list_columns, pool_err, row_to_job, row_to_plan, row_to_plugin,
    rows_to_jobs,
};
use schema::{connect_when_up, migrate};

use super::unfinished::{self, AttemptEffects, COUNTER_COLUMNS, Counters, Death, Decision, Fate, SILENT_WORKER};

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use deadpool_postgres::GenericClient;
use tokio::sync::watch;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{NoTls, Row};

use super::approval::{self as gate, GatedRow};
use super::codec::{
    EFFECT_COLUMNS, EffectRow, InsertTimes, approval_to_column, corrupt, grants_of, grants_to_column, i64_of,
    json_column, list_filters, ms, outcome_columns, policy_of, policy_to_column, target_columns, to_json,
};
use super::event::{EVENT_COLUMNS, EventRow};
use super::plan::{DELETE_EMPTY_PLANS, NOT_HELD_BY_A_PLAN, PLAN_COLUMNS, apply_job};
use super::{
    CancelResult, DecideRefusal, EffectBeginParams, EffectEndParams, JobClaimParams, JobDecideParams, JobFinishParams,
    JobInsertParams, JobListParams, JobProgressParams, JobReleaseParams, JobRetryParams, JobStore, JobsDeleteParams,
    JobsExpireParams, Lease, LeaseExtendParams, LeaseReclaimParams, LeaseState, PlanInsertParams, PlanListParams,
    PlansAdvanceParams, PluginGrantsParams, PluginNameParams, PluginPolicyParams, PluginPutParams, ReclaimReport,
    StoreError, WorkerDiedParams,
};
use super::{EventId, EventPage, EventsAfterParams};
use super::{WorkerRecord, WorkerState, WorkersSnapshot};
use crate::clock::Timestamp;
use crate::job::{
    Backoff, Counts, Digest, Effect, ErrorKind, Job, JobId, JobLogs, JobStatus, NewJob, PlanRecord, PluginInfo,
    PluginRef, SCHEMA_VERSION,
};

/// The first transaction id still running when the statement began: every
/// event of an older transaction is committed (or never will be), so a
/// reader that stops below it never sees an older event appear later.
const VISIBLE_TXN: &str = "pg_snapshot_xmin(pg_current_snapshot())::text::bigint";

/// A read-only transaction whose reads all see one snapshot.
async fn snapshot(
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
fn row_to_event(r: &Row) -> Result<super::Event, StoreError> {
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

/// Connections per process unless the URL's `pool_size` says otherwise.
pub const DEFAULT_POOL_SIZE: usize = 16;
/// How long opening waits for a server that is not accepting connections.
const DEFAULT_CONNECT_PATIENCE: Duration = Duration::from_secs(30);
/// How long a call waits for a free pooled connection, or for a new one.
const POOL_WAIT: Duration = Duration::from_secs(10);
/// The channel inserts and releases notify.
const CHANNEL: &str = "leash_jobs";
/// Rows per statement of a sweep or a large insert.
const BATCH: i64 = 1000;

/// The PostgreSQL [`JobStore`].
#[derive(Debug, Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    pool: deadpool_postgres::Pool,
    /// Bumped by every notification the listener receives.
    enqueued: watch::Receiver<u64>,
    listener: tokio::task::JoinHandle<()>,
    renewals: renew::Renewals,
    freshness: Arc<stats::Freshness>,
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
                    stats::warn_if_autovacuum_is_off(&first, &shown).await;
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
        let listener = tokio::spawn(listen(config, shown, notify));
        let renewals = renew::Renewals::start(pool.clone());
        Ok(PostgresStore { inner: Arc::new(Inner { pool, enqueued, listener, renewals, freshness: Arc::default() }) })
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

/// Keep one connection listening on [`CHANNEL`], reconnecting with backoff
/// when it is lost; every notification (and every reconnect, which may
/// have missed some) bumps `notify`.
async fn listen(config: tokio_postgres::Config, shown: String, notify: watch::Sender<u64>) {
    let mut pause = Duration::from_millis(100);
    loop {
        match config.connect(NoTls).await {
            Ok((client, mut connection)) => {
                let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
                let driver = tokio::spawn(async move {
                    while let Some(message) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                        match message {
                            Ok(tokio_postgres::AsyncMessage::Notification(_)) => {
                                if tx.send(()).is_err() {
                                    return;
                                }
                            }
                            Ok(_) => {}
                            Err(_) => return,
                        }
                    }
                });
                if client.batch_execute(&format!("LISTEN {CHANNEL}")).await.is_ok() {
                    pause = Duration::from_millis(100);
                    notify.send_modify(|n| *n = n.wrapping_add(1));
                    while rx.recv().await.is_some() {
                        notify.send_modify(|n| *n = n.wrapping_add(1));
                    }
                    tracing::warn!(database = %shown, "the LISTEN connection was lost; reconnecting");
                }
                driver.abort();
            }
            Err(e) => {
                tracing::debug!(database = %shown, error = %describe(&e), "the LISTEN connection could not connect")
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(5));
    }
}

/// Claim up to `params.limit` eligible jobs in one statement: queued,
/// unexpired, due, and either keyless or the oldest queued job of a key
/// with no running job; earliest due first, then oldest. Rows another
/// claimer has locked are skipped, not waited for.
async fn claim(client: &impl GenericClient, params: &JobClaimParams) -> Result<Vec<Lease>, StoreError> {
    // Built once: this runs for every claim.
    static SQL: LazyLock<String> = LazyLock::new(|| claim_sql("q.process_deaths = 0"));
    static SUSPECT: LazyLock<String> = LazyLock::new(|| claim_sql("q.process_deaths > 0"));
    // A claimer that runs nothing takes a suspect first, and only it.
    if params.alone {
        let suspect = claim_from(client, &SUSPECT, &JobClaimParams { limit: 1, ..params.clone() }).await?;
        if !suspect.is_empty() {
            return Ok(suspect);
        }
    }
    claim_from(client, &SQL, params).await
}

/// The claim statement for the queued jobs `which` picks.
fn claim_sql(which: &str) -> String {
    format!(
        "WITH picked AS ( \
               SELECT q.job_id FROM jobs q WHERE q.status = 'queued' AND {which} \
               AND q.run_after <= $1 AND q.expires_at > $1 \
               AND (q.concurrency_key IS NULL OR ( \
                 q.job_id = (SELECT MIN(o.job_id) FROM jobs o WHERE o.status = 'queued' AND o.concurrency_key = q.concurrency_key) \
                 AND NOT EXISTS (SELECT 1 FROM jobs r WHERE r.status = 'running' AND r.concurrency_key = q.concurrency_key))) \
               ORDER BY q.run_after, q.job_id LIMIT $2 FOR UPDATE SKIP LOCKED) \
             UPDATE jobs j SET status = 'running', worker_id = $3, \
               lease_token = replace(gen_random_uuid()::text, '-', ''), lease_expires_at = $4, \
               started_at = $1, last_heartbeat = $1, attempt = j.attempt + 1, cancel_requested = FALSE, \
               progress_json = NULL, logs_json = NULL \
             FROM picked WHERE j.job_id = picked.job_id RETURNING {}",
        job_columns("j")
    )
}

async fn claim_from(client: &impl GenericClient, sql: &str, params: &JobClaimParams) -> Result<Vec<Lease>, StoreError> {
    let err = |e: tokio_postgres::Error| {
        // Two claimers racing for one key's next job: the unique index
        // refused the second. Nothing changed; the next claim will do.
        let race = e.code() == Some(&SqlState::UNIQUE_VIOLATION);
        let mut error = db_err("claiming jobs")(e);
        if let StoreError::Database { transient, .. } = &mut error {
            *transient |= race;
        }
        error
    };
    let now = params.now.unix_ms();
    let expires = now.saturating_add(ms(params.lease_ttl));
    let stmt = client.prepare_cached(sql).await.map_err(err)?;
    let rows =
        client.query(&stmt, &[&now, &i64::from(params.limit), &params.worker_id, &expires]).await.map_err(err)?;
    let mut leases = rows
        .iter()
        .map(|row| {
            let job = row_to_job(row)?;
            let token =
                job.lease_token.clone().ok_or_else(|| corrupt(&job.id.to_string(), "claimed without a token"))?;
            Ok(Lease { job, token })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    leases.sort_by_key(|l| (l.job.run_after, l.job.id));
    Ok(leases)
}

/// Record a running job's ending, fenced by its lease token.
async fn finish(client: &impl GenericClient, params: &JobFinishParams) -> Result<bool, StoreError> {
    let err = db_err("finishing a job");
    let (status, kind) = (params.finish.status(), params.finish.error_kind());
    let (output, message, backtrace) = params.finish.columns();
    let progress = params.progress.as_ref().map(to_json).transpose()?;
    let logs = params.logs.as_ref().map(to_json).transpose()?;
    let stmt = client
        .prepare_cached(
            "UPDATE jobs SET status = $1, output = $2, error_kind = $3, error_message = $4, backtrace = $5, \
             fuel_used = $6, peak_memory_bytes = $7, finished_at = $8, last_heartbeat = $8, \
             lease_token = NULL, lease_expires_at = NULL, \
             progress_json = COALESCE($11, progress_json), logs_json = $12 \
             WHERE job_id = $9 AND status = 'running' AND lease_token = $10",
        )
        .await
        .map_err(&err)?;
    let changed = client
        .execute(
            &stmt,
            &[
                &status.as_str(),
                &output,
                &kind.map(ErrorKind::as_str),
                &message,
                &backtrace,
                &i64_of(params.fuel_used),
                &i64_of(params.peak_memory_bytes),
                &params.now.unix_ms(),
                &params.id.to_string(),
                &params.token,
                &progress,
                &logs,
            ],
        )
        .await
        .map_err(&err)?;
    Ok(changed == 1)
}

/// The columns of a large insert, one array each (`unnest` turns them
/// back into rows: one statement shape whatever the count).
#[derive(Default)]
struct InsertColumns {
    id: Vec<String>,
    plan: Vec<Option<String>>,
    phase: Vec<&'static str>,
    action: Vec<Option<String>>,
    digest: Vec<String>,
    payload: Vec<Vec<u8>>,
    limits: Vec<String>,
    expires: Vec<i64>,
    max_attempts: Vec<i32>,
    key: Vec<Option<String>>,
    plugin_name: Vec<Option<String>>,
    plugin_version: Vec<Option<String>>,
    idempotency_key: Vec<Option<String>>,
    request_digest: Vec<Option<String>>,
    run_after: Vec<i64>,
    deadline: Vec<Option<i64>>,
    backoff_base: Vec<i64>,
    backoff_cap: Vec<i64>,
    grants: Vec<Option<String>>,
    free_rerun_limit: Vec<i32>,
    status: Vec<&'static str>,
    approval: Vec<Option<String>>,
}

impl InsertColumns {
    fn push(&mut self, job: NewJob, id: JobId, now: Timestamp) -> Result<(), StoreError> {
        let (phase, action) = target_columns(&job.target);
        let action = action.map(str::to_owned);
        let times = InsertTimes::of(&job, now);
        self.status.push(times.status);
        self.approval.push(approval_to_column(job.approval.map(Into::into).as_ref())?);
        self.id.push(id.to_string());
        self.plan.push(job.plan_id);
        self.phase.push(phase);
        self.action.push(action);
        self.digest.push(job.plugin.to_string());
        self.payload.push(job.input);
        self.limits.push(to_json(&job.limits)?);
        self.expires.push(times.expires_at.unix_ms());
        self.max_attempts.push(i32::try_from(job.max_attempts).unwrap_or(i32::MAX));
        self.key.push(job.concurrency_key);
        self.plugin_name.push(job.plugin_name.as_ref().map(|n| n.name.clone()));
        self.plugin_version.push(job.plugin_name.map(|n| n.version));
        self.idempotency_key.push(job.idempotency.as_ref().map(|i| i.key.clone()));
        self.request_digest.push(job.idempotency.map(|i| i.request_digest));
        self.run_after.push(times.run_after.unix_ms());
        self.deadline.push(times.deadline_at.map(Timestamp::unix_ms));
        self.backoff_base.push(i64_of(job.backoff.base_ms));
        self.backoff_cap.push(i64_of(job.backoff.cap_ms));
        self.grants.push(grants_to_column(&job.grants)?);
        self.free_rerun_limit.push(i32::try_from(job.free_rerun_limit).unwrap_or(i32::MAX));
        Ok(())
    }
}

async fn insert_rows(
    client: &impl GenericClient,
    columns: &InsertColumns,
    now: Timestamp,
) -> Result<Vec<Job>, StoreError> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "INSERT INTO jobs (job_id, plan_id, phase, action, plugin_digest, status, payload, limits_json, \
             schema_version, created_at, expires_at, max_attempts, concurrency_key, plugin_name, plugin_version, \
             idempotency_key, request_digest, run_after, deadline_at, backoff_base_ms, backoff_cap_ms, grants_json, \
             free_rerun_limit, approval_json) SELECT n.id, n.plan, n.phase, n.action, n.digest, n.status, n.payload, \
             n.limits, $19, $20, n.expires, \
             n.max_attempts, n.key, n.pname, n.pversion, n.ikey, n.rdigest, n.run_after, n.deadline, n.bbase, n.bcap, \
             n.grants, n.free, n.approval \
             FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bytea[], $7::text[], \
               $8::int8[], $9::int4[], $10::text[], $11::text[], $12::text[], $13::text[], $14::text[], $15::int8[], \
               $16::int8[], $17::int8[], $18::int8[], $21::text[], $22::int4[], $23::text[], $24::text[]) \
             AS n(id, plan, phase, action, digest, payload, limits, expires, max_attempts, key, pname, pversion, \
               ikey, rdigest, run_after, deadline, bbase, bcap, grants, free, status, approval) \
             RETURNING {}",
            job_columns("")
        )
    });
    let err = db_err("inserting jobs");
    let stmt = client.prepare_cached(&SQL).await.map_err(&err)?;
    let c = columns;
    let rows = client
        .query(
            &stmt,
            &[
                &c.id,
                &c.plan,
                &c.phase,
                &c.action,
                &c.digest,
                &c.payload,
                &c.limits,
                &c.expires,
                &c.max_attempts,
                &c.key,
                &c.plugin_name,
                &c.plugin_version,
                &c.idempotency_key,
                &c.request_digest,
                &c.run_after,
                &c.deadline,
                &c.backoff_base,
                &c.backoff_cap,
                &i32::try_from(SCHEMA_VERSION).unwrap_or(i32::MAX),
                &now.unix_ms(),
                &c.grants,
                &c.free_rerun_limit,
                &c.status,
                &c.approval,
            ],
        )
        .await
        .map_err(&err)?;
    rows_to_jobs(&rows)
}

/// The stored job, if any, that already has one of these idempotency
/// keys, as the error an insert reports (the first key in submit order).
async fn idempotency_conflict(client: &impl GenericClient, jobs: &[NewJob]) -> Result<Option<StoreError>, StoreError> {
    let keys: Vec<&str> = jobs.iter().filter_map(|j| j.idempotency.as_ref().map(|i| i.key.as_str())).collect();
    if keys.is_empty() {
        return Ok(None);
    }
    let err = db_err("checking idempotency keys");
    let stmt = client
        .prepare_cached("SELECT idempotency_key, job_id, request_digest FROM jobs WHERE idempotency_key = ANY($1)")
        .await
        .map_err(&err)?;
    let taken = client.query(&stmt, &[&keys]).await.map_err(&err)?;
    for job in jobs {
        let Some(idempotency) = &job.idempotency else { continue };
        let Some(row) = taken.iter().find(|r| r.get::<_, &str>(0) == idempotency.key) else { continue };
        let holder: String = row.get(1);
        let digest: Option<String> = row.get(2);
        return Ok(Some(StoreError::IdempotencyKeyTaken {
            key: idempotency.key.clone(),
            job: holder.parse().map_err(|e: String| corrupt(&holder, e))?,
            same_request: digest.as_deref() == Some(idempotency.request_digest.as_str()),
        }));
    }
    Ok(None)
}

/// A notification for every listening store, sent when the transaction
/// that runs it commits.
const NOTIFY: &str = "SELECT pg_notify('leash_jobs', '')";

#[async_trait::async_trait]
impl JobStore for PostgresStore {
    async fn job_insert(&self, params: JobInsertParams) -> Result<Vec<Job>, StoreError> {
        for job in &params.jobs {
            job.check().map_err(StoreError::Invalid)?;
        }
        let err = db_err("inserting jobs");
        let mut client = self.client("inserting jobs").await?;
        if let Some(taken) = idempotency_conflict(&client, &params.jobs).await? {
            return Err(taken);
        }
        let keyed: Vec<NewJob> = params.jobs.iter().filter(|j| j.idempotency.is_some()).cloned().collect();
        let ids: Vec<JobId> = params.jobs.iter().map(|_| JobId::new(params.now)).collect();
        let mut chunks = Vec::new();
        let mut jobs = params.jobs.into_iter().zip(ids.iter().copied()).peekable();
        while jobs.peek().is_some() {
            let mut columns = InsertColumns::default();
            for (job, id) in jobs.by_ref().take(BATCH as usize) {
                columns.push(job, id, params.now)?;
            }
            chunks.push(columns);
        }
        let tx = client.transaction().await.map_err(&err)?;
        let mut by_id = std::collections::HashMap::with_capacity(ids.len());
        for columns in &chunks {
            match insert_rows(&tx, columns, params.now).await {
                Ok(jobs) => by_id.extend(jobs.into_iter().map(|j| (j.id, j))),
                Err(e) => {
                    drop(tx);
                    // A concurrent insert took a key between the check and
                    // this insert: report it as the check would have.
                    if let Some(taken) = idempotency_conflict(&client, &keyed).await? {
                        return Err(taken);
                    }
                    return Err(e);
                }
            }
        }
        tx.execute(NOTIFY, &[]).await.map_err(&err)?;
        tx.commit().await.map_err(&err)?;
        self.inner.freshness.inserted(ids.len() as u64, &self.inner.pool);
        ids.into_iter()
            .map(|id| by_id.remove(&id).ok_or_else(|| corrupt(&id.to_string(), "inserted but not returned")))
            .collect()
    }

    async fn job_get(&self, id: JobId) -> Result<Option<Job>, StoreError> {
        static SQL: LazyLock<String> =
            LazyLock::new(|| format!("SELECT {} FROM jobs WHERE job_id = $1", job_columns("")));
        let rows = self.read("reading a job", &SQL, &[&id.to_string()]).await?;
        rows.first().map(row_to_job).transpose()
    }

    async fn jobs_by_idempotency_key(
        &self,
        keys: Vec<String>,
    ) -> Result<HashMap<String, (JobId, JobStatus)>, StoreError> {
        let rows = self
            .read(
                "reading jobs by idempotency key",
                "SELECT idempotency_key, job_id, status FROM jobs WHERE idempotency_key = ANY($1)",
                &[&keys],
            )
            .await?;
        let mut found = HashMap::with_capacity(rows.len());
        for row in rows {
            let (key, id, status): (String, String, String) = (row.get(0), row.get(1), row.get(2));
            let job: JobId = id.parse().map_err(|e: String| corrupt(&id, e))?;
            found.insert(key, (job, status.parse().map_err(|e: String| corrupt(&id, e))?));
        }
        Ok(found)
    }

    async fn job_claim(&self, params: JobClaimParams) -> Result<Vec<Lease>, StoreError> {
        let client = self.client("claiming jobs").await?;
        claim(&client, &params).await
    }

    async fn lease_extend(&self, params: LeaseExtendParams) -> Result<LeaseState, StoreError> {
        self.inner.renewals.renew(params).await
    }

    async fn job_finish(&self, params: JobFinishParams) -> Result<bool, StoreError> {
        let client = self.client("finishing a job").await?;
        finish(&client, &params).await
    }

    async fn job_finish_and_claim(
        &self,
        params: JobFinishParams,
        next: JobClaimParams,
    ) -> Result<(bool, Vec<Lease>), StoreError> {
        let err = db_err("finishing a job");
        let mut client = self.client("finishing a job").await?;
        let tx = client.transaction().await.map_err(&err)?;
        // The finish and the claim go to the server together (one round
        // trip, not two) and run in order in one transaction: the claim
        // sees the finished job's concurrency key released. A finish that
        // changed nothing (the lease was lost) takes the claim back with it.
        let (finished, claimed) = tokio::join!(finish(&tx, &params), claim(&tx, &next));
        if !finished? {
            tx.rollback().await.map_err(&err)?;
            return Ok((false, Vec::new()));
        }
        match claimed {
            Ok(leases) => {
                tx.commit().await.map_err(&err)?;
                Ok((true, leases))
            }
            // A failed claim aborted the transaction: the finish stands on
            // its own, and the claim loop will claim later.
            Err(_) => {
                tx.rollback().await.map_err(&err)?;
                Ok((finish(&client, &params).await?, Vec::new()))
            }
        }
    }

    async fn job_release(&self, params: JobReleaseParams) -> Result<bool, StoreError> {
        let run_after = params.run_after.max(params.now).unix_ms();
        let requeue_until = run_after.saturating_add(ms(params.queue_ttl));
        let err = db_err("releasing a job");
        let mut client = self.client("releasing a job").await?;
        let tx = client.transaction().await.map_err(&err)?;
        let id = params.id.to_string();
        let sql = format!(
            "SELECT {COUNTER_COLUMNS} FROM jobs WHERE job_id = $1 AND status = 'running' AND lease_token = $2 \
             FOR UPDATE"
        );
        let Some(row) = tx.query_opt(&sql, &[&id, &params.token]).await.map_err(&err)? else { return Ok(false) };
        let (_, attempt, counters) = counters_of(&row);
        let effects = attempt_effects(&tx, &id, attempt).await.map_err(&err)?;
        match unfinished::released(&counters, effects.as_ref(), params.now) {
            Some(fate) => {
                let decision = Decision { fate, died: false };
                apply_fate(&tx, &id, &decision, params.queue_ttl, params.now).await.map_err(&err)?
            }
            None => {
                tx.execute(
                    "UPDATE jobs SET status = 'queued', lease_token = NULL, lease_expires_at = NULL, \
                     releases = releases + 1, run_after = GREATEST(run_after, $3), \
                     expires_at = LEAST(GREATEST(expires_at, $1), COALESCE(deadline_at, GREATEST(expires_at, $1))) \
                     WHERE job_id = $2",
                    &[&requeue_until, &id, &run_after],
                )
                .await
                .map_err(&err)?;
            }
        }
        tx.execute(NOTIFY, &[]).await.map_err(&err)?;
        tx.commit().await.map_err(&err)?;
        Ok(true)
    }

    async fn job_cancel(&self, id: JobId, now: Timestamp) -> Result<CancelResult, StoreError> {
        let err = db_err("cancelling a job");
        let mut client = self.client("cancelling a job").await?;
        let tx = client.transaction().await.map_err(&err)?;
        let id = id.to_string();
        let status: Option<String> = tx
            .query_opt("SELECT status FROM jobs WHERE job_id = $1 FOR UPDATE", &[&id])
            .await
            .map_err(&err)?
            .map(|r| r.get(0));
        let Some(status) = status else { return Ok(CancelResult::NotFound) };
        let result = match status.parse().map_err(|e: String| corrupt(&id, e))? {
            status @ (JobStatus::Queued | JobStatus::PendingApproval | JobStatus::Approved) => {
                let message = if status == JobStatus::Queued {
                    "Cancelled: cancelled while queued"
                } else {
                    "Cancelled: cancelled while waiting for approval"
                };
                tx.execute(
                    "UPDATE jobs SET status = 'cancelled', finished_at = $1, error_kind = 'cancelled', \
                     error_message = $3 WHERE job_id = $2",
                    &[&now.unix_ms(), &id, &message],
                )
                .await
                .map_err(&err)?;
                CancelResult::Cancelled
            }
            JobStatus::Running => {
                tx.execute("UPDATE jobs SET cancel_requested = TRUE WHERE job_id = $1", &[&id]).await.map_err(&err)?;
                CancelResult::Requested
            }
            terminal => CancelResult::AlreadyTerminal(terminal),
        };
        tx.commit().await.map_err(&err)?;
        Ok(result)
    }

    async fn job_decide(&self, params: JobDecideParams) -> Result<Result<Job, DecideRefusal>, StoreError> {
        let err = db_err("deciding on a job");
        let mut client = self.client("deciding on a job").await?;
        let tx = client.transaction().await.map_err(&err)?;
        let id = params.id.to_string();
        // The row lock makes two decisions racing take turns: the second
        // reads what the first wrote and is refused.
        let row = tx
            .query_opt("SELECT status, approval_json, run_after FROM jobs WHERE job_id = $1 FOR UPDATE", &[&id])
            .await
            .map_err(&err)?;
        let Some(row) = row else { return Ok(Err(DecideRefusal::NotFound)) };
        let status: String = row.get(0);
        let gated = GatedRow {
            status: status.parse().map_err(|e: String| corrupt(&id, e))?,
            approval: json_column(&id, "approval", row.get(1))?,
            run_after: Timestamp::from_unix_ms(row.get(2)),
        };
        let change = match gate::decide(gated, &params) {
            Ok(change) => change,
            Err(refusal) => return Ok(Err(refusal)),
        };
        let approval = to_json(change.approval())?;
        let c = change.columns(params.now);
        let sql = gate::update_sql('$') + &job_columns("");
        let rows = tx
            .query(
                &sql,
                &[
                    &id,
                    &change.status().as_str(),
                    &approval,
                    &c.run_after,
                    &c.expires_at,
                    &c.deadline_at,
                    &c.finished_at,
                    &c.error_kind,
                    &c.error_message,
                ],
            )
            .await
            .map_err(&err)?;
        if change.status() == JobStatus::Queued {
            tx.execute(NOTIFY, &[]).await.map_err(&err)?;
        }
        tx.commit().await.map_err(&err)?;
        let job = rows.first().map(row_to_job).transpose()?;
        job.map(Ok).ok_or_else(|| corrupt(&id, "decided but not returned"))
    }

    async fn job_retry(&self, params: JobRetryParams) -> Result<bool, StoreError> {
        let logs = params.logs.as_ref().map(to_json).transpose()?;
        let run_after = params.run_after.unix_ms();
        let changed = self
            .execute(
                "queueing a job for retry",
                "UPDATE jobs SET status = 'queued', retries = retries + 1, lease_token = NULL, \
                 lease_expires_at = NULL, run_after = $1, \
                 expires_at = LEAST(GREATEST(expires_at, $2), COALESCE(deadline_at, GREATEST(expires_at, $2))), \
                 last_error = $3, fuel_used = $4, peak_memory_bytes = $5, logs_json = $6, last_heartbeat = $7 \
                 WHERE job_id = $8 AND status = 'running' AND lease_token = $9 \
                 AND lost_leases + retries + 1 < max_attempts",
                &[
                    &run_after,
                    &run_after.saturating_add(ms(params.queue_ttl)),
                    &format!("{}: {}", params.kind, params.message),
                    &i64_of(params.fuel_used),
                    &i64_of(params.peak_memory_bytes),
                    &logs,
                    &params.now.unix_ms(),
                    &params.id.to_string(),
                    &params.token,
                ],
            )
            .await?;
        Ok(changed == 1)
    }

    async fn lease_reclaim_expired(&self, params: LeaseReclaimParams) -> Result<ReclaimReport, StoreError> {
        let now = params.now.unix_ms();
        let err = db_err("reclaiming leases");
        let mut report = ReclaimReport::default();
        let sql = format!(
            "SELECT {COUNTER_COLUMNS}, {SILENT_WORKER} FROM jobs j LEFT JOIN workers w ON w.worker_id = j.worker_id \
             WHERE j.status = 'running' AND j.lease_expires_at <= $1 \
             ORDER BY j.job_id LIMIT $2 FOR UPDATE OF j SKIP LOCKED"
        );
        loop {
            let mut client = self.client("reclaiming leases").await?;
            let tx = client.transaction().await.map_err(&err)?;
            // Rows another replica's sweep holds are its to reclaim: a
            // lost lease is counted once. A row an effect's intent is
            // being recorded against is locked too (see `effect_begin`):
            // it is reclaimed at the next sweep, with that intent counted.
            let expired = tx.query(&sql, &[&now, &BATCH]).await.map_err(&err)?;
            let mut requeued = false;
            for row in &expired {
                let (id, attempt, counters) = counters_of(row);
                // Read after the lock, in a statement of its own: it sees
                // every intent committed before the row was locked.
                let effects = attempt_effects(&tx, &id, attempt).await.map_err(&err)?;
                let decision = if row.get::<_, bool>(11) {
                    unfinished::died(&counters, effects.as_ref(), &Death::Silent, params.now)
                } else {
                    Decision { fate: unfinished::lost_lease(&counters, effects.as_ref(), params.now), died: false }
                };
                report.count(&decision.fate);
                requeued |= matches!(decision.fate, Fate::Requeue { .. });
                apply_fate(&tx, &id, &decision, params.queue_ttl, params.now).await.map_err(&err)?;
            }
            if requeued {
                tx.execute(NOTIFY, &[]).await.map_err(&err)?;
            }
            tx.commit().await.map_err(&err)?;
            if (expired.len() as i64) < BATCH {
                return Ok(report);
            }
        }
    }

    async fn worker_died(&self, params: WorkerDiedParams) -> Result<ReclaimReport, StoreError> {
        let err = db_err("reclaiming a dead worker's jobs");
        let sql = format!("SELECT {COUNTER_COLUMNS} FROM jobs WHERE status = 'running' AND worker_id = $1 FOR UPDATE");
        let mut client = self.client("reclaiming a dead worker's jobs").await?;
        let tx = client.transaction().await.map_err(&err)?;
        let held = tx.query(&sql, &[&params.worker_id]).await.map_err(&err)?;
        let death = Death::Seen { how: &params.how, stderr: &params.stderr };
        let mut report = ReclaimReport::default();
        for row in &held {
            let (id, attempt, counters) = counters_of(row);
            let effects = attempt_effects(&tx, &id, attempt).await.map_err(&err)?;
            let decision = unfinished::died(&counters, effects.as_ref(), &death, params.now);
            report.count(&decision.fate);
            apply_fate(&tx, &id, &decision, params.queue_ttl, params.now).await.map_err(&err)?;
        }
        if report.requeued > 0 {
            tx.execute(NOTIFY, &[]).await.map_err(&err)?;
        }
        tx.execute(
            "UPDATE workers SET state = 'stopped', running = 0, last_heartbeat = GREATEST(last_heartbeat, $2) \
             WHERE worker_id = $1",
            &[&params.worker_id, &params.now.unix_ms()],
        )
        .await
        .map_err(&err)?;
        tx.commit().await.map_err(&err)?;
        Ok(report)
    }

    async fn jobs_expire_queued(&self, params: JobsExpireParams) -> Result<u64, StoreError> {
        self.in_batches(
            "expiring queued jobs",
            "WITH due AS (SELECT job_id FROM jobs WHERE status IN ('queued', 'pending_approval', 'approved') \
               AND expires_at <= $1 ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED) \
             UPDATE jobs j SET status = 'failed', finished_at = $1, error_kind = 'expired', \
               error_message = CASE \
                 WHEN j.status = 'pending_approval' THEN 'Expired: no decision came within its approval TTL' \
                 WHEN j.status = 'approved' THEN 'Expired: approved, but its run was never triggered' \
                 WHEN j.deadline_at <= $1 THEN 'Expired: the job could not start before its deadline' \
                 ELSE 'Expired: the job waited in the queue past its expiry' END \
             FROM due WHERE j.job_id = due.job_id",
            params.now.unix_ms(),
        )
        .await
    }

    async fn jobs_delete_expired(&self, params: JobsDeleteParams) -> Result<u64, StoreError> {
        static SQL: LazyLock<String> = LazyLock::new(|| {
            format!(
                "DELETE FROM jobs WHERE job_id IN (SELECT job_id FROM jobs WHERE finished_at IS NOT NULL \
                   AND finished_at < $1 AND {NOT_HELD_BY_A_PLAN} ORDER BY finished_at LIMIT $2 FOR UPDATE SKIP LOCKED)"
            )
        });
        let n = self.in_batches("deleting old jobs", &SQL, params.finished_before.unix_ms()).await?;
        self.execute("deleting old plans", DELETE_EMPTY_PLANS, &[]).await?;
        self.events_delete_before(params.events_before).await?;
        Ok(n)
    }

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

    async fn counts_snapshot(&self) -> Result<Counts, StoreError> {
        let client = self.client("counting jobs").await?;
        count_jobs(&client).await
    }

    async fn queued_count(&self) -> Result<u64, StoreError> {
        let rows = self.read("counting queued jobs", "SELECT COUNT(*) FROM jobs WHERE status = 'queued'", &[]).await?;
        Ok(rows.first().map_or(0, |r| r.get::<_, i64>(0).max(0) as u64))
    }

    async fn plugin_put(&self, params: PluginPutParams) -> Result<Digest, StoreError> {
        let digest = Digest::of(&params.bytes);
        self.execute(
            "storing a plugin",
            "INSERT INTO plugins (digest, bytes, size_bytes, created_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (digest) DO NOTHING",
            &[&digest.to_string(), &params.bytes, &(params.bytes.len() as i64), &params.now.unix_ms()],
        )
        .await?;
        Ok(digest)
    }

    async fn plugin_get(&self, digest: Digest) -> Result<Option<Vec<u8>>, StoreError> {
        let rows = self
            .read("reading a plugin", "SELECT bytes FROM plugins WHERE digest = $1", &[&digest.to_string()])
            .await?;
        Ok(rows.first().map(|r| r.get(0)))
    }

    async fn plugin_name_set(&self, params: PluginNameParams) -> Result<PluginInfo, StoreError> {
        let err = db_err("naming a plugin");
        let mut client = self.client("naming a plugin").await?;
        let tx = client.transaction().await.map_err(&err)?;
        let (name, version, digest) = (&params.name.name, &params.name.version, params.digest.to_string());
        // A replaced pair keeps its grants and its approval policy.
        let (grants, policy): (Option<String>, Option<String>) = tx
            .query_opt(
                "DELETE FROM plugin_names WHERE name = $1 AND version = $2 RETURNING grants_json, approval_json",
                &[name, version],
            )
            .await
            .map_err(&err)?
            .map_or((None, None), |r| (r.get(0), r.get(1)));
        let policy = match &params.policy {
            Some(policy) => policy_to_column(policy)?,
            None => policy,
        };
        let size: Option<i64> = tx
            .query_opt(
                "INSERT INTO plugin_names (name, version, digest, created_at, grants_json, approval_json) \
                 SELECT $1, $2, digest, $4, $5, $6 FROM plugins WHERE digest = $3 \
                 RETURNING (SELECT size_bytes FROM plugins WHERE digest = $3)",
                &[name, version, &digest, &params.now.unix_ms(), &grants, &policy],
            )
            .await
            .map_err(&err)?
            .map(|r| r.get(0));
        let Some(size) = size else {
            return Err(StoreError::Invalid(format!("plugin {} is not stored", params.digest)));
        };
        tx.commit().await.map_err(&err)?;
        Ok(PluginInfo {
            grants: grants_of(&digest, grants)?,
            approval: policy_of(&digest, policy)?,
            name: Some(params.name),
            digest: params.digest,
            size_bytes: size as u64,
            created_at: params.now,
            requests: None,
        })
    }

    async fn effect_begin(&self, params: EffectBeginParams) -> Result<Option<Effect>, StoreError> {
        let operation = "recording an effect";
        let err = db_err(operation);
        let id = params.id.to_string();
        let client = self.client(operation).await?;
        let stmt = client
            .prepare_cached(
                "INSERT INTO effects (job_id, attempt, seq, method, url, started_at) \
                 SELECT j.job_id, j.attempt, 1 + COALESCE((SELECT MAX(e.seq) FROM effects e \
                   WHERE e.job_id = j.job_id AND e.attempt = j.attempt), 0), $3, $4, $5 \
                 FROM jobs j WHERE j.job_id = $1 AND j.status = 'running' AND j.lease_token = $2 \
                 FOR SHARE OF j RETURNING attempt, seq",
            )
            .await
            .map_err(&err)?;
        let mut tries = 0;
        let rows = loop {
            let args: [&(dyn ToSql + Sync); 5] =
                [&id, &params.token, &params.method, &params.url, &params.now.unix_ms()];
            match client.query(&stmt, &args).await {
                // Two effects of one attempt begun at once picked the same
                // place; the primary key refused this one: number it again.
                Err(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) && tries < 10 => tries += 1,
                other => break other.map_err(&err)?,
            }
        };
        let row = rows.first().map(|r| (i64::from(r.get::<_, i32>(0)), i64::from(r.get::<_, i32>(1))));
        Ok(row.map(|(attempt, seq)| EffectRow::intent(params, attempt, seq)))
    }

    async fn effect_end(&self, params: EffectEndParams) -> Result<(), StoreError> {
        let (status, error) = outcome_columns(&params.outcome);
        self.execute(
            "recording an effect's outcome",
            "UPDATE effects SET finished_at = $4, status = $5, error = $6 \
             WHERE job_id = $1 AND attempt = $2 AND seq = $3 AND finished_at IS NULL",
            &[
                &params.id.to_string(),
                &i32::try_from(params.attempt).unwrap_or(i32::MAX),
                &i32::try_from(params.seq).unwrap_or(i32::MAX),
                &params.now.unix_ms(),
                &status,
                &error,
            ],
        )
        .await?;
        Ok(())
    }

    async fn effects(&self, id: JobId) -> Result<Vec<Effect>, StoreError> {
        let rows = self
            .read(
                "reading effects",
                &format!("SELECT {EFFECT_COLUMNS} FROM effects WHERE job_id = $1 ORDER BY attempt, seq"),
                &[&id.to_string()],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| {
                EffectRow {
                    attempt: i64::from(r.get::<_, i32>(0)),
                    seq: i64::from(r.get::<_, i32>(1)),
                    method: r.get(2),
                    url: r.get(3),
                    started_at: r.get(4),
                    finished_at: r.get(5),
                    status: r.get::<_, Option<i32>>(6).map(i64::from),
                    error: r.get(7),
                }
                .into_effect(id)
            })
            .collect())
    }

    async fn plugin_grants_set(&self, params: PluginGrantsParams) -> Result<Option<PluginInfo>, StoreError> {
        let grants = grants_to_column(&params.grants)?;
        let changed = self
            .execute(
                "granting a plugin",
                "UPDATE plugin_names SET grants_json = $3 WHERE name = $1 AND version = $2",
                &[&params.name.name, &params.name.version, &grants],
            )
            .await?;
        if changed == 0 {
            return Ok(None);
        }
        self.plugin_resolve(PluginRef::Version(params.name)).await
    }

    async fn plugin_policy_set(&self, params: PluginPolicyParams) -> Result<Option<PluginInfo>, StoreError> {
        let policy = policy_to_column(&params.policy)?;
        let changed = self
            .execute(
                "setting a plugin's approval policy",
                "UPDATE plugin_names SET approval_json = $3 WHERE name = $1 AND version = $2",
                &[&params.name.name, &params.name.version, &policy],
            )
            .await?;
        if changed == 0 {
            return Ok(None);
        }
        self.plugin_resolve(PluginRef::Version(params.name)).await
    }

    async fn plan_insert(&self, params: PlanInsertParams) -> Result<(PlanRecord, Job), StoreError> {
        params.execute.check().map_err(StoreError::Invalid)?;
        let err = db_err("creating a plan");
        let mut client = self.client("creating a plan").await?;
        let tx = client.transaction().await.map_err(&err)?;
        let (queue_ttl, approval_ttl) = (params.execute.queue_ttl, params.execute.approval_ttl);
        let mut columns = InsertColumns::default();
        columns.push(params.execute, JobId::new(params.now), params.now)?;
        let execute = insert_rows(&tx, &columns, params.now).await?.remove(0);
        tx.execute(
            &format!("INSERT INTO plans ({PLAN_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, NULL, NULL)"),
            &[
                &params.plan_id,
                &params.apply_mode.as_str(),
                &params.input,
                &ms(queue_ttl),
                &ms(approval_ttl),
                &params.now.unix_ms(),
                &execute.id.to_string(),
            ],
        )
        .await
        .map_err(&err)?;
        if execute.status == JobStatus::Queued {
            tx.execute(NOTIFY, &[]).await.map_err(&err)?;
        }
        tx.commit().await.map_err(&err)?;
        let record = PlanRecord {
            plan_id: params.plan_id,
            apply_mode: params.apply_mode,
            input: params.input,
            created_at: params.now,
            execute_job: execute.id,
            apply_job: None,
            cancelled_at: None,
        };
        Ok((record, execute))
    }

    async fn plan_get(&self, plan_id: String) -> Result<Option<PlanRecord>, StoreError> {
        let sql = format!("SELECT {PLAN_COLUMNS} FROM plans WHERE plan_id = $1");
        let rows = self.read("reading a plan", &sql, &[&plan_id]).await?;
        rows.first().map(|r| row_to_plan(r).map(|p| p.record)).transpose()
    }

    async fn plan_list(&self, params: PlanListParams) -> Result<Vec<PlanRecord>, StoreError> {
        let sql = format!(
            "SELECT {PLAN_COLUMNS} FROM plans WHERE $1::text IS NULL OR plan_id < $1 ORDER BY plan_id DESC LIMIT $2"
        );
        let rows = self.read("listing plans", &sql, &[&params.before, &i64::from(params.limit.max(1))]).await?;
        rows.iter().map(|r| row_to_plan(r).map(|p| p.record)).collect()
    }

    async fn plans_advance(&self, params: PlansAdvanceParams) -> Result<Vec<Job>, StoreError> {
        let err = db_err("advancing plans");
        let mut client = self.client("advancing plans").await?;
        let tx = client.transaction().await.map_err(&err)?;
        // Plans another replica is advancing are its to advance: each apply
        // job is created once.
        let sql = format!(
            "SELECT {PLAN_COLUMNS} FROM plans p WHERE apply_job_id IS NULL AND cancelled_at IS NULL \
             AND ($1::text IS NULL OR plan_id = $1) \
             AND EXISTS (SELECT 1 FROM jobs j WHERE j.job_id = p.execute_job_id AND j.status = 'succeeded') \
             ORDER BY plan_id LIMIT 100 FOR UPDATE SKIP LOCKED"
        );
        let due = tx.query(&sql, &[&params.plan_id]).await.map_err(&err)?;
        let one = format!("SELECT {} FROM jobs WHERE job_id = $1", job_columns(""));
        let mut created = Vec::with_capacity(due.len());
        for row in &due {
            let plan = row_to_plan(row)?;
            let execute = tx.query(&one, &[&plan.record.execute_job.to_string()]).await.map_err(&err)?;
            let execute = rows_to_jobs(&execute)?
                .pop()
                .ok_or_else(|| corrupt(&plan.record.plan_id, "its execute job is missing"))?;
            let mut columns = InsertColumns::default();
            columns.push(apply_job(&plan, &execute), JobId::new(params.now), params.now)?;
            let apply = insert_rows(&tx, &columns, params.now).await?.remove(0);
            tx.execute(
                "UPDATE plans SET apply_job_id = $2 WHERE plan_id = $1 AND apply_job_id IS NULL",
                &[&plan.record.plan_id, &apply.id.to_string()],
            )
            .await
            .map_err(&err)?;
            created.push(apply);
        }
        if created.iter().any(|j| j.status == JobStatus::Queued) {
            tx.execute(NOTIFY, &[]).await.map_err(&err)?;
        }
        tx.commit().await.map_err(&err)?;
        Ok(created)
    }

    async fn plan_cancel(&self, plan_id: String, now: Timestamp) -> Result<Option<PlanRecord>, StoreError> {
        let sql = format!(
            "UPDATE plans SET cancelled_at = COALESCE(cancelled_at, $2) WHERE plan_id = $1 RETURNING {PLAN_COLUMNS}"
        );
        let client = self.client("cancelling a plan").await?;
        let rows = client.query(&sql, &[&plan_id, &now.unix_ms()]).await.map_err(db_err("cancelling a plan"))?;
        rows.first().map(|r| row_to_plan(r).map(|p| p.record)).transpose()
    }

    async fn plugin_list(&self) -> Result<Vec<PluginInfo>, StoreError> {
        let rows = self
            .read(
                "listing plugins",
                "SELECT name, version, digest, size_bytes, created_at, grants_json, approval_json FROM ( \
                   SELECT n.name, n.version, n.digest, p.size_bytes, n.created_at, n.grants_json, n.approval_json, \
                   n.seq FROM plugin_names n JOIN plugins p ON p.digest = n.digest \
                   UNION ALL \
                   SELECT NULL, NULL, p.digest, p.size_bytes, p.created_at, NULL, NULL, 0 FROM plugins p \
                   WHERE NOT EXISTS (SELECT 1 FROM plugin_names n WHERE n.digest = p.digest)) listed \
                 ORDER BY name IS NULL, name, seq DESC, created_at DESC",
                &[],
            )
            .await?;
        rows.iter().map(row_to_plugin).collect()
    }

    async fn plugin_resolve(&self, plugin: PluginRef) -> Result<Option<PluginInfo>, StoreError> {
        let operation = "resolving a plugin";
        let rows = match plugin {
            PluginRef::Digest(digest) => {
                self.read(
                    operation,
                    "SELECT n.name, n.version, p.digest, p.size_bytes, COALESCE(n.created_at, p.created_at), \
                     n.grants_json, n.approval_json FROM plugins p LEFT JOIN plugin_names n ON n.digest = p.digest \
                     WHERE p.digest = $1 ORDER BY n.seq DESC NULLS LAST LIMIT 1",
                    &[&digest.to_string()],
                )
                .await?
            }
            PluginRef::Name(name) => {
                self.read(
                    operation,
                    "SELECT n.name, n.version, n.digest, p.size_bytes, n.created_at, n.grants_json, n.approval_json \
                     FROM plugin_names n JOIN plugins p ON p.digest = n.digest WHERE n.name = $1 \
                     ORDER BY n.seq DESC LIMIT 1",
                    &[&name],
                )
                .await?
            }
            PluginRef::Version(v) => {
                self.read(
                    operation,
                    "SELECT n.name, n.version, n.digest, p.size_bytes, n.created_at, n.grants_json, n.approval_json \
                     FROM plugin_names n JOIN plugins p ON p.digest = n.digest WHERE n.name = $1 AND n.version = $2",
                    &[&v.name, &v.version],
                )
                .await?
            }
        };
        rows.first().map(row_to_plugin).transpose()
    }

    async fn job_list(&self, params: JobListParams) -> Result<Vec<Job>, StoreError> {
        let mut sql = format!("SELECT {} FROM jobs WHERE TRUE", list_columns());
        let mut args: Vec<String> = Vec::new();
        for (condition, value) in list_filters(&params) {
            args.push(value);
            sql.push_str(&format!(" AND {condition} ${}", args.len()));
        }
        sql.push_str(&format!(" ORDER BY job_id DESC LIMIT {}", params.limit.max(1)));
        let args: Vec<&(dyn ToSql + Sync)> = args.iter().map(|a| a as &(dyn ToSql + Sync)).collect();
        let rows = self.read("listing jobs", &sql, &args).await?;
        rows_to_jobs(&rows)
    }

    async fn job_progress_set(&self, params: JobProgressParams) -> Result<bool, StoreError> {
        let progress = to_json(&params.progress)?;
        let changed = self
            .execute(
                "recording progress",
                "UPDATE jobs SET progress_json = $1, last_heartbeat = $2 \
                 WHERE job_id = $3 AND status = 'running' AND lease_token = $4",
                &[&progress, &params.now.unix_ms(), &params.id.to_string(), &params.token],
            )
            .await?;
        Ok(changed == 1)
    }

    async fn job_logs(&self, id: JobId) -> Result<Option<JobLogs>, StoreError> {
        let rows =
            self.read("reading logs", "SELECT logs_json FROM jobs WHERE job_id = $1", &[&id.to_string()]).await?;
        json_column(&id.to_string(), "logs", rows.first().and_then(|r| r.get(0)))
    }

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
                &i64_of(worker.poll_interval_ms),
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
                    poll_interval_ms: r.get::<_, i64>(7).max(0) as u64,
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

    async fn workers_delete_stale(&self, last_heartbeat_before: Timestamp) -> Result<u64, StoreError> {
        self.execute(
            "deleting old workers",
            "DELETE FROM workers WHERE last_heartbeat < $1",
            &[&last_heartbeat_before.unix_ms()],
        )
        .await
    }

    fn enqueued(&self) -> Option<watch::Receiver<u64>> {
        Some(self.inner.enqueued.clone())
    }
}

/// A job's counters (see [`COUNTER_COLUMNS`]): its id, attempt and the rest.
fn counters_of(r: &Row) -> (String, u32, Counters) {
    (
        r.get(0),
        rows::count(r.get(1)),
        Counters {
            lost_leases: rows::count(r.get(2)),
            retries: rows::count(r.get(3)),
            max_attempts: rows::count(r.get(4)),
            free_reruns: rows::count(r.get(5)),
            free_rerun_limit: rows::count(r.get(6)),
            cancel_requested: r.get(7),
            backoff: Backoff { base_ms: r.get::<_, i64>(8).max(0) as u64, cap_ms: r.get::<_, i64>(9).max(0) as u64 },
            process_deaths: rows::count(r.get(10)),
        },
    )
}

/// What the attempt's effects were (`None`: it recorded none).
async fn attempt_effects(
    client: &impl GenericClient,
    id: &str,
    attempt: u32,
) -> Result<Option<AttemptEffects>, tokio_postgres::Error> {
    let attempt = i32::try_from(attempt).unwrap_or(i32::MAX);
    let row = client.query_opt(unfinished::ATTEMPT_EFFECTS_POSTGRES, &[&id, &attempt]).await?;
    Ok(row.map(|r| AttemptEffects {
        seq: r.get(0),
        method: r.get(1),
        url: r.get(2),
        status: r.get(3),
        error: r.get(4),
        in_flight: u32::try_from(r.get::<_, i64>(5)).unwrap_or(u32::MAX),
    }))
}

/// Apply `fate` to the job `id`, whose row the caller holds locked.
async fn apply_fate(
    client: &impl GenericClient,
    id: &str,
    decision: &Decision,
    queue_ttl: Duration,
    now: Timestamp,
) -> Result<(), tokio_postgres::Error> {
    match &decision.fate {
        Fate::Requeue { run_after, last_error, .. } => {
            let run_after = run_after.unix_ms();
            let sql = format!(
                "UPDATE jobs SET status = 'queued', lease_token = NULL, lease_expires_at = NULL{}, run_after = $1, \
                 last_error = $2, \
                 expires_at = LEAST(GREATEST(expires_at, $3), COALESCE(deadline_at, GREATEST(expires_at, $3))) \
                 WHERE job_id = $4",
                decision.bumps()
            );
            client.execute(&sql, &[&run_after, last_error, &run_after.saturating_add(ms(queue_ttl)), &id]).await?;
        }
        Fate::End { cancelled, kind, message, .. } => {
            let sql = format!(
                "UPDATE jobs SET status = $1, error_kind = $2, error_message = $3, finished_at = $4, \
                 lease_token = NULL, lease_expires_at = NULL{} WHERE job_id = $5",
                decision.bumps()
            );
            let status = if *cancelled { "cancelled" } else { "failed" };
            client.execute(&sql, &[&status, &kind.as_str(), message, &now.unix_ms(), &id]).await?;
        }
    }
    Ok(())
}
