//! Connecting (waiting, bounded, for a PostgreSQL that is not up yet) and
//! bringing the schema up to date, once, whichever replica starts first.

use std::time::Duration;

use tokio_postgres::NoTls;

use crate::clock::Timestamp;
use crate::store::StoreError;
use crate::store::postgres::rows::{db_err, describe, is_transient};

/// The schema, one migration per entry; applied in order, each once. The
/// same columns, CHECK constraints and partial indexes as the SQLite
/// schema, in one step: text that is ordered or compared (ids, keys,
/// names) uses the `C` collation, so the order is the bytes' order as
/// SQLite's is, and ULID job ids sort by creation.
pub(super) const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE jobs (
    job_id            TEXT COLLATE "C" PRIMARY KEY,
    plan_id           TEXT COLLATE "C",
    phase             TEXT NOT NULL CHECK (phase IN ('execute', 'apply', 'action')),
    action            TEXT,
    plugin_digest     TEXT NOT NULL,
    plugin_name       TEXT COLLATE "C",
    plugin_version    TEXT COLLATE "C",
    status            TEXT NOT NULL CHECK (status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')),
    payload           BYTEA NOT NULL,
    limits_json       TEXT NOT NULL,
    schema_version    INTEGER NOT NULL,
    created_at        BIGINT NOT NULL,
    started_at        BIGINT,
    finished_at       BIGINT,
    last_heartbeat    BIGINT,
    expires_at        BIGINT NOT NULL,
    run_after         BIGINT NOT NULL,
    deadline_at       BIGINT,
    worker_id         TEXT COLLATE "C",
    lease_token       TEXT,
    lease_expires_at  BIGINT,
    attempt           INTEGER NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    lost_leases       INTEGER NOT NULL DEFAULT 0 CHECK (lost_leases >= 0),
    retries           INTEGER NOT NULL DEFAULT 0 CHECK (retries >= 0),
    releases          INTEGER NOT NULL DEFAULT 0 CHECK (releases >= 0),
    max_attempts      INTEGER NOT NULL CHECK (max_attempts >= 1),
    backoff_base_ms   BIGINT NOT NULL,
    backoff_cap_ms    BIGINT NOT NULL,
    cancel_requested  BOOLEAN NOT NULL DEFAULT FALSE,
    concurrency_key   TEXT COLLATE "C",
    idempotency_key   TEXT COLLATE "C",
    request_digest    TEXT,
    error_kind        TEXT,
    error_message     TEXT,
    backtrace         TEXT,
    last_error        TEXT,
    output            BYTEA,
    fuel_used         BIGINT,
    peak_memory_bytes BIGINT,
    progress_json     TEXT,
    logs_json         TEXT,
    CHECK ((phase = 'action') = (action IS NOT NULL)),
    CHECK ((status = 'running') = (lease_token IS NOT NULL)),
    CHECK (status <> 'running' OR (worker_id IS NOT NULL AND lease_expires_at IS NOT NULL AND started_at IS NOT NULL)),
    CHECK ((status IN ('succeeded', 'failed', 'cancelled')) = (finished_at IS NOT NULL)),
    CHECK ((status IN ('failed', 'cancelled')) = (error_kind IS NOT NULL)),
    CHECK (status = 'succeeded' OR output IS NULL)
);
-- Claiming: queued jobs, earliest due first, then oldest.
CREATE INDEX jobs_claim_due ON jobs (run_after, job_id) WHERE status = 'queued';
-- Claiming with keys: the oldest queued job of each key, and whether one runs.
CREATE INDEX jobs_queued_key ON jobs (concurrency_key, job_id) WHERE status = 'queued' AND concurrency_key IS NOT NULL;
-- At most one running job per concurrency key, whoever claims it.
CREATE UNIQUE INDEX jobs_running_key ON jobs (concurrency_key) WHERE status = 'running' AND concurrency_key IS NOT NULL;
-- Reclaim sweep, and the running jobs of each worker.
CREATE INDEX jobs_lease_expiry ON jobs (lease_expires_at) WHERE status = 'running';
CREATE INDEX jobs_running_worker ON jobs (worker_id) WHERE status = 'running';
-- Queue-expiry sweep.
CREATE INDEX jobs_queue_expiry ON jobs (expires_at) WHERE status = 'queued';
-- Retention sweep.
CREATE INDEX jobs_finished ON jobs (finished_at) WHERE finished_at IS NOT NULL;
-- Lookups and list filters.
CREATE INDEX jobs_plan ON jobs (plan_id) WHERE plan_id IS NOT NULL;
CREATE INDEX jobs_plugin_name ON jobs (plugin_name, job_id) WHERE plugin_name IS NOT NULL;
CREATE UNIQUE INDEX jobs_idempotency_key ON jobs (idempotency_key) WHERE idempotency_key IS NOT NULL;

CREATE TABLE plugins (
    digest      TEXT COLLATE "C" PRIMARY KEY,
    bytes       BYTEA NOT NULL,
    size_bytes  BIGINT NOT NULL CHECK (size_bytes = octet_length(bytes)),
    created_at  BIGINT NOT NULL
);

-- The registry: names and versions pointing at stored digests. The newest
-- registration of a name has the highest seq (a replacement is a delete
-- and an insert).
CREATE TABLE plugin_names (
    name        TEXT COLLATE "C" NOT NULL,
    version     TEXT COLLATE "C" NOT NULL,
    digest      TEXT COLLATE "C" NOT NULL REFERENCES plugins (digest),
    created_at  BIGINT NOT NULL,
    seq         BIGINT GENERATED ALWAYS AS IDENTITY,
    PRIMARY KEY (name, version)
);
CREATE INDEX plugin_names_digest ON plugin_names (digest);

-- The worker registry: every pool sharing the database.
CREATE TABLE workers (
    worker_id         TEXT COLLATE "C" PRIMARY KEY,
    host              TEXT NOT NULL,
    pid               BIGINT NOT NULL,
    version           TEXT NOT NULL,
    slots             BIGINT NOT NULL CHECK (slots >= 0),
    running           BIGINT NOT NULL CHECK (running >= 0),
    state             TEXT NOT NULL CHECK (state IN ('running', 'draining', 'stopped')),
    poll_interval_ms  BIGINT NOT NULL,
    processed         BIGINT NOT NULL,
    failed            BIGINT NOT NULL,
    cancelled         BIGINT NOT NULL,
    started_at        BIGINT NOT NULL,
    last_heartbeat    BIGINT NOT NULL
);
"#,
    r#"
-- What the operator grants a registered plugin (JSON; NULL: nothing), and
-- what a job was granted at submit, pinned like its digest.
ALTER TABLE plugin_names ADD COLUMN grants_json TEXT;
ALTER TABLE jobs ADD COLUMN grants_json TEXT;
"#,
    r#"
-- The effect ledger: each effectful request, recorded before it is sent
-- (the intent) and completed after (the outcome). Deleted with its job.
CREATE TABLE effects (
    job_id       TEXT COLLATE "C" NOT NULL REFERENCES jobs (job_id) ON DELETE CASCADE,
    attempt      INTEGER NOT NULL CHECK (attempt >= 1),
    seq          INTEGER NOT NULL CHECK (seq >= 1),
    method       TEXT NOT NULL,
    url          TEXT NOT NULL,
    started_at   BIGINT NOT NULL,
    finished_at  BIGINT,
    status       INTEGER CHECK (status BETWEEN 100 AND 999),
    error        TEXT,
    CHECK (finished_at IS NOT NULL OR (status IS NULL AND error IS NULL)),
    CHECK (status IS NULL OR error IS NULL),
    PRIMARY KEY (job_id, attempt, seq)
);
"#,
    r#"
-- Leases lost before the attempt recorded any effect: the job ran again
-- without spending an attempt, up to its limit (pinned at submit).
ALTER TABLE jobs ADD COLUMN free_reruns INTEGER NOT NULL DEFAULT 0 CHECK (free_reruns >= 0);
ALTER TABLE jobs ADD COLUMN free_rerun_limit INTEGER NOT NULL DEFAULT 0 CHECK (free_rerun_limit >= 0);
"#,
    r#"
-- Approval gates: two states before `queued` (pending_approval, approved)
-- and the gate's record; the queue-expiry sweep covers gated jobs too.
ALTER TABLE jobs ADD COLUMN approval_json TEXT;
ALTER TABLE jobs DROP CONSTRAINT jobs_status_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_status_check CHECK (status IN ('pending_approval', 'approved', 'queued',
    'running', 'succeeded', 'failed', 'cancelled'));
ALTER TABLE jobs ADD CONSTRAINT jobs_gate_check
    CHECK (status NOT IN ('pending_approval', 'approved') OR approval_json IS NOT NULL);
DROP INDEX jobs_queue_expiry;
CREATE INDEX jobs_queue_expiry ON jobs (expires_at) WHERE status IN ('queued', 'pending_approval', 'approved');
-- Which targets of a registration wait for approval (JSON; NULL: none).
ALTER TABLE plugin_names ADD COLUMN approval_json TEXT;
"#,
    r#"
-- Plans: an execute job and the apply job created from its output. The
-- status is derived from the jobs; the row keeps what the apply job needs.
CREATE TABLE plans (
    plan_id          TEXT COLLATE "C" PRIMARY KEY,
    apply_mode       TEXT NOT NULL CHECK (apply_mode IN ('approval', 'auto')),
    input            BYTEA NOT NULL,
    queue_ttl_ms     BIGINT NOT NULL CHECK (queue_ttl_ms > 0),
    approval_ttl_ms  BIGINT NOT NULL CHECK (approval_ttl_ms > 0),
    created_at       BIGINT NOT NULL,
    execute_job_id   TEXT COLLATE "C" NOT NULL UNIQUE,
    apply_job_id     TEXT COLLATE "C" UNIQUE,
    cancelled_at     BIGINT
);
-- Plans still to advance: their apply job is not created yet.
CREATE INDEX plans_unapplied ON plans (execute_job_id) WHERE apply_job_id IS NULL AND cancelled_at IS NULL;
"#,
    r#"
-- The change feed (`GET /v1/events`): one row per job or worker change,
-- appended by the triggers below in the transaction that makes the change,
-- whichever replica makes it. Transactions commit out of the order of their
-- numbers, so an event is ordered by its transaction's id, then `seq`, and
-- read only once every older transaction has ended (the snapshot's xmin).
CREATE TABLE events (
    txn            BIGINT NOT NULL DEFAULT (pg_current_xact_id()::text::bigint),
    seq            BIGINT GENERATED ALWAYS AS IDENTITY,
    at             BIGINT NOT NULL DEFAULT ((extract(epoch FROM clock_timestamp()) * 1000)::bigint),
    what           TEXT NOT NULL CHECK (what IN ('insert', 'status', 'progress', 'cancel',
                                                 'worker_insert', 'worker_state', 'worker_delete')),
    job_id         TEXT COLLATE "C",
    plan_id        TEXT COLLATE "C",
    plugin_digest  TEXT,
    plugin_name    TEXT COLLATE "C",
    plugin_version TEXT COLLATE "C",
    phase          TEXT,
    action         TEXT,
    status         TEXT NOT NULL,
    previous       TEXT,
    attempt        BIGINT,
    worker_id      TEXT COLLATE "C",
    error_kind     TEXT,
    progress_json  TEXT,
    PRIMARY KEY (txn, seq)
);
CREATE INDEX events_at ON events (at);
-- How far retention has deleted: a reader resuming before it missed events.
CREATE TABLE event_horizon (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    txn  BIGINT NOT NULL,
    seq  BIGINT NOT NULL
);
CREATE FUNCTION leash_job_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    what TEXT;
BEGIN
    IF TG_OP = 'INSERT' THEN
        what := 'insert';
    ELSIF NEW.status IS DISTINCT FROM OLD.status THEN
        what := 'status';
    ELSIF NEW.status = 'running' AND NEW.cancel_requested AND NOT OLD.cancel_requested THEN
        what := 'cancel';
    ELSIF NEW.status = 'running' AND OLD.status = 'running' AND NEW.progress_json IS NOT NULL
          AND NEW.progress_json IS DISTINCT FROM OLD.progress_json THEN
        -- A claim clears the progress and a finish keeps the last: only a
        -- report from a running guest is an event of its own.
        what := 'progress';
    ELSE
        RETURN NULL;
    END IF;
    INSERT INTO events (what, job_id, plan_id, plugin_digest, plugin_name, plugin_version, phase, action, status,
                        previous, attempt, worker_id, error_kind, progress_json)
    VALUES (what, NEW.job_id, NEW.plan_id, NEW.plugin_digest, NEW.plugin_name, NEW.plugin_version, NEW.phase,
            NEW.action, NEW.status, CASE WHEN what = 'status' THEN OLD.status END, NEW.attempt,
            CASE WHEN what <> 'insert' THEN NEW.worker_id END, NEW.error_kind, NEW.progress_json);
    RETURN NULL;
END
$$;
CREATE TRIGGER jobs_events AFTER INSERT ON jobs FOR EACH ROW EXECUTE FUNCTION leash_job_event();
CREATE TRIGGER jobs_events_update AFTER UPDATE ON jobs FOR EACH ROW
    WHEN (NEW.status IS DISTINCT FROM OLD.status OR NEW.cancel_requested IS DISTINCT FROM OLD.cancel_requested
          OR NEW.progress_json IS DISTINCT FROM OLD.progress_json)
    EXECUTE FUNCTION leash_job_event();
CREATE FUNCTION leash_worker_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO events (what, worker_id, status) VALUES ('worker_insert', NEW.worker_id, NEW.state);
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO events (what, worker_id, status) VALUES ('worker_delete', OLD.worker_id, OLD.state);
    ELSE
        INSERT INTO events (what, worker_id, status, previous)
        VALUES ('worker_state', NEW.worker_id, NEW.state, OLD.state);
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER workers_events AFTER INSERT OR DELETE ON workers FOR EACH ROW EXECUTE FUNCTION leash_worker_event();
CREATE TRIGGER workers_events_update AFTER UPDATE ON workers FOR EACH ROW
    WHEN (NEW.state IS DISTINCT FROM OLD.state) EXECUTE FUNCTION leash_worker_event();
"#,
    r#"
-- Worker processes that died while running the job: at two it is
-- quarantined (failed, `host_crash`) and never claimed again. Until then
-- it is a suspect, claimed only by an empty pool, to run alone.
ALTER TABLE jobs ADD COLUMN process_deaths INTEGER NOT NULL DEFAULT 0 CHECK (process_deaths >= 0);
CREATE INDEX jobs_suspects ON jobs (run_after, job_id) WHERE status = 'queued' AND process_deaths > 0;
"#,
    r#"
-- What a component declares it asks for (its `leash:requests` section as
-- JSON; NULL: nothing), kept with its bytes so a plugin is read whole.
-- Rows stored before this have `requests_read = FALSE` until the runtime
-- reads their bytes once and puts them again.
ALTER TABLE plugins ADD COLUMN requests_json TEXT;
ALTER TABLE plugins ADD COLUMN requests_read BOOLEAN NOT NULL DEFAULT FALSE;
CREATE INDEX plugins_undeclared ON plugins (digest) WHERE NOT requests_read;
"#,
    r#"
-- Dashboard sessions signed out before their expiry: refused until then
-- (a session cookie proves itself; only an early end needs the store).
CREATE TABLE ended_sessions (
    session_id  TEXT COLLATE "C" PRIMARY KEY,
    expires_at  BIGINT NOT NULL
);
"#,
    r#"
-- Principals (who may call the API, with their roles) and their tokens,
-- each stored as its secret's SHA-256; a revoked token keeps its row.
CREATE TABLE principals (
    name        TEXT COLLATE "C" PRIMARY KEY,
    roles       TEXT NOT NULL,
    created_at  BIGINT NOT NULL
);
CREATE TABLE tokens (
    token_id     TEXT COLLATE "C" PRIMARY KEY,
    principal    TEXT COLLATE "C" NOT NULL,
    secret_hash  TEXT NOT NULL,
    label        TEXT,
    created_at   BIGINT NOT NULL,
    expires_at   BIGINT,
    revoked_at   BIGINT
);
CREATE INDEX tokens_principal ON tokens (principal);
"#,
    r#"
-- The principal that submitted each job (NULL: an embedder's own submit,
-- or a job stored before submitters were recorded).
ALTER TABLE jobs ADD COLUMN submitted_by TEXT COLLATE "C";
CREATE INDEX jobs_submitted_by ON jobs (submitted_by, job_id) WHERE submitted_by IS NOT NULL;
"#,
    r#"
-- The audit trail: one row per change, appended in the change's own
-- transaction, each row's hash covering its fields and the row before's
-- hash. The head (one row, locked by each append, so appends take turns)
-- names the last row, so rows cut from the end show.
CREATE TABLE audit (
    seq        BIGINT PRIMARY KEY,
    at         BIGINT NOT NULL,
    principal  TEXT COLLATE "C",
    action     TEXT COLLATE "C" NOT NULL,
    target     TEXT COLLATE "C" NOT NULL,
    detail     TEXT NOT NULL,
    prev_hash  TEXT NOT NULL,
    hash       TEXT NOT NULL
);
CREATE INDEX audit_principal ON audit (principal, seq);
CREATE INDEX audit_target ON audit (target, seq);
CREATE TABLE audit_head (
    id    INTEGER PRIMARY KEY CHECK (id = 1),
    seq   BIGINT NOT NULL,
    hash  TEXT NOT NULL
);
INSERT INTO audit_head (id, seq, hash) VALUES (1, 0, '0000000000000000000000000000000000000000000000000000000000000000');
"#,
    r#"
-- A principal's own ceilings on the jobs it submits (JSON; NULL: none).
ALTER TABLE principals ADD COLUMN ceilings_json TEXT;
"#,
    r#"
-- Standing approval rules ("Allow & Remember"): the rule as made (JSON),
-- and the columns it is found and changed by.
CREATE TABLE approval_rules (
    rule_id        TEXT COLLATE "C" PRIMARY KEY,
    author         TEXT COLLATE "C" NOT NULL,
    plugin_digest  TEXT COLLATE "C" NOT NULL,
    target         TEXT COLLATE "C" NOT NULL,
    created_at     BIGINT NOT NULL,
    expires_at     BIGINT NOT NULL,
    revoked_at     BIGINT,
    revoked_by     TEXT,
    uses           BIGINT NOT NULL DEFAULT 0,
    rule_json      TEXT NOT NULL
);
CREATE INDEX approval_rules_plugin ON approval_rules (plugin_digest, target);
"#,
    r#"
-- Audit retention: the last row deleted (0: none), whose hash the first
-- row kept names.
ALTER TABLE audit_head ADD COLUMN pruned_seq BIGINT NOT NULL DEFAULT 0;
ALTER TABLE audit_head ADD COLUMN pruned_hash TEXT;
"#,
    r#"
-- A principal's running cap as a column the claim reads (NULL: none), and
-- the indexes that find a submitter's queued and running jobs.
ALTER TABLE principals ADD COLUMN max_running BIGINT;
CREATE INDEX jobs_queued_by ON jobs (submitted_by, run_after, job_id) WHERE status = 'queued' AND submitted_by IS NOT NULL;
CREATE INDEX jobs_running_by ON jobs (submitted_by) WHERE status = 'running' AND submitted_by IS NOT NULL;
"#,
    r#"
-- Earlier attempts: a job's row holds its last attempt, and this trigger
-- keeps each attempt the row is about to forget, in the write that makes
-- it forget: a running job queued again (retried, released, its lease
-- lost) and a finished one queued again, how it ended read off the
-- counters the write raised. A claim clears `logs_json`, so the logs a
-- requeue leaves are the attempt's own. It watches `run_after`, which
-- every requeue sets and the claim and the finish never do, as SQLite's
-- does. The logs of all but the five latest are dropped and marked; a
-- deleted job's attempts go with it.
CREATE TABLE job_attempts (
    id                BIGSERIAL PRIMARY KEY,
    job_id            TEXT COLLATE "C" NOT NULL,
    run               INTEGER NOT NULL,
    worker_id         TEXT,
    started_at        BIGINT,
    ended_at          BIGINT,
    outcome           TEXT NOT NULL,
    error_kind        TEXT,
    error             TEXT,
    fuel_used         BIGINT,
    peak_memory_bytes BIGINT,
    logs_json         TEXT,
    logs_cut          BOOLEAN NOT NULL DEFAULT FALSE
);
CREATE INDEX job_attempts_job ON job_attempts (job_id, id);
CREATE FUNCTION leash_job_attempt() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    finished BOOLEAN;
    retried BOOLEAN;
BEGIN
    IF TG_OP = 'DELETE' THEN
        DELETE FROM job_attempts WHERE job_id = OLD.job_id;
        RETURN NULL;
    END IF;
    finished := OLD.status <> 'running';
    -- A release after an effect raises `retries` too; its `last_error`
    -- says `interrupted: …`.
    retried := NEW.retries > OLD.retries AND NEW.last_error NOT LIKE 'interrupted: %'
               AND NEW.lost_leases = OLD.lost_leases AND NEW.free_reruns = OLD.free_reruns
               AND NEW.process_deaths = OLD.process_deaths;
    INSERT INTO job_attempts (job_id, run, worker_id, started_at, ended_at, outcome, error_kind, error,
                              fuel_used, peak_memory_bytes, logs_json)
    VALUES (NEW.job_id, OLD.attempt, OLD.worker_id, OLD.started_at,
            CASE WHEN finished THEN OLD.finished_at WHEN retried THEN NEW.last_heartbeat
                 ELSE (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT END,
            CASE WHEN finished THEN OLD.status
                 WHEN NEW.process_deaths > OLD.process_deaths THEN 'process_died'
                 WHEN NEW.lost_leases > OLD.lost_leases OR NEW.free_reruns > OLD.free_reruns THEN 'lease_lost'
                 WHEN retried THEN 'retried'
                 ELSE 'released' END,
            CASE WHEN finished THEN OLD.error_kind END,
            CASE WHEN finished THEN OLD.error_message WHEN NEW.releases = OLD.releases THEN NEW.last_error END,
            CASE WHEN finished THEN OLD.fuel_used WHEN retried THEN NEW.fuel_used END,
            CASE WHEN finished THEN OLD.peak_memory_bytes WHEN retried THEN NEW.peak_memory_bytes END,
            CASE WHEN finished THEN OLD.logs_json ELSE NEW.logs_json END);
    UPDATE job_attempts SET logs_json = NULL, logs_cut = TRUE
    WHERE job_id = NEW.job_id AND logs_json IS NOT NULL
      AND id <= (SELECT id FROM job_attempts WHERE job_id = NEW.job_id ORDER BY id DESC LIMIT 1 OFFSET 5);
    RETURN NULL;
END
$$;
CREATE TRIGGER jobs_attempt_requeued AFTER UPDATE OF run_after ON jobs FOR EACH ROW
    WHEN (NEW.status = 'queued' AND OLD.status IN ('running', 'succeeded', 'failed', 'cancelled'))
    EXECUTE FUNCTION leash_job_attempt();
CREATE TRIGGER jobs_attempts_delete AFTER DELETE ON jobs FOR EACH ROW EXECUTE FUNCTION leash_job_attempt();
"#,
    super::proposals::MIGRATION,
    super::claim::MIGRATION,
    super::schedules::MIGRATION,
    super::labels::MIGRATION,
    super::rate_limits::MIGRATION,
    super::rate_limits::EGRESS_MIGRATION,
    super::claim::SLOTTED_MIGRATION,
    super::events::STATEMENT_MIGRATION,
    super::plugins::CODE_MIGRATION,
];

/// Connect, waiting up to `patience` for a server that refuses
/// connections (still starting, restarting, or not up yet), and saying so
/// once in the log.
pub(super) async fn connect_when_up(
    config: &tokio_postgres::Config,
    shown: &str,
    patience: Duration,
) -> Result<tokio_postgres::Client, StoreError> {
    let started = std::time::Instant::now();
    let mut said = false;
    loop {
        match config.connect(NoTls).await {
            Ok((client, connection)) => {
                tokio::spawn(connection);
                return Ok(client);
            }
            Err(e) if is_transient(&e) && started.elapsed() < patience => {
                if !said {
                    tracing::warn!(database = %shown, error = %describe(&e), "waiting for PostgreSQL (up to {patience:?})");
                    said = true;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => {
                let waited = if said { format!(" (waited {:.0?})", started.elapsed()) } else { String::new() };
                return Err(StoreError::Database {
                    operation: "connecting to PostgreSQL",
                    source: format!("{shown}{waited}: {}", describe(&e)).into(),
                    transient: is_transient(&e),
                });
            }
        }
    }
}

/// Apply the migrations this database lacks, in one transaction, holding
/// an advisory lock so replicas starting together migrate once.
pub(super) async fn migrate(client: &mut tokio_postgres::Client) -> Result<(), StoreError> {
    let err = db_err("migrating the schema");
    // `IF NOT EXISTS` on a migrated database is not news for the log.
    client.batch_execute("SET client_min_messages TO warning").await.map_err(&err)?;
    // One replica at a time migrates a schema, from creating the version
    // table on: two creating it at once would race on the catalog
    // (`type "schema_migrations" already exists`, 42710, or a unique
    // violation), and the loser would fail to start.
    let tx = client.transaction().await.map_err(&err)?;
    tx.execute("SELECT pg_advisory_xact_lock(hashtext('leash schema ' || current_schema()))", &[])
        .await
        .map_err(&err)?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at BIGINT NOT NULL)",
    )
    .await
    .map_err(&err)?;
    let applied: i64 = tx.query_one("SELECT COUNT(*) FROM schema_migrations", &[]).await.map_err(&err)?.get(0);
    if applied as usize > MIGRATIONS.len() {
        return Err(StoreError::Invalid(format!(
            "the database has schema version {applied}, newer than this leash understands ({})",
            MIGRATIONS.len()
        )));
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(applied as usize) {
        tx.batch_execute(sql).await.map_err(&err)?;
        tx.execute(
            "INSERT INTO schema_migrations (version, applied_at) VALUES ($1, $2)",
            &[&(i as i32 + 1), &Timestamp::now().unix_ms()],
        )
        .await
        .map_err(&err)?;
    }
    tx.commit().await.map_err(&err)
}
