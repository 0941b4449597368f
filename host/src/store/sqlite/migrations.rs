//! The SQLite schema, one migration per entry.

use super::triggers::{job_attempt_triggers, job_event_triggers, worker_event_triggers};

/// The schema, one migration per entry; applied in order, each once.
pub(super) const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE jobs (
    job_id            TEXT PRIMARY KEY,
    plan_id           TEXT,
    phase             TEXT NOT NULL CHECK (phase IN ('execute', 'apply', 'action')),
    action            TEXT,
    plugin_digest     TEXT NOT NULL,
    status            TEXT NOT NULL CHECK (status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')),
    payload           BLOB NOT NULL,
    limits_json       TEXT NOT NULL,
    schema_version    INTEGER NOT NULL,
    created_at        INTEGER NOT NULL,
    started_at        INTEGER,
    finished_at       INTEGER,
    last_heartbeat    INTEGER,
    expires_at        INTEGER NOT NULL,
    worker_id         TEXT,
    lease_token       TEXT,
    lease_expires_at  INTEGER,
    attempt           INTEGER NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    lost_leases       INTEGER NOT NULL DEFAULT 0 CHECK (lost_leases >= 0),
    max_attempts      INTEGER NOT NULL CHECK (max_attempts >= 1),
    cancel_requested  INTEGER NOT NULL DEFAULT 0 CHECK (cancel_requested IN (0, 1)),
    concurrency_key   TEXT,
    error_kind        TEXT,
    error_message     TEXT,
    backtrace         TEXT,
    output            BLOB,
    fuel_used         INTEGER,
    peak_memory_bytes INTEGER,
    CHECK ((phase = 'action') = (action IS NOT NULL)),
    CHECK ((status = 'running') = (lease_token IS NOT NULL)),
    CHECK (status <> 'running' OR (worker_id IS NOT NULL AND lease_expires_at IS NOT NULL AND started_at IS NOT NULL)),
    CHECK ((status IN ('succeeded', 'failed', 'cancelled')) = (finished_at IS NOT NULL)),
    CHECK ((status IN ('failed', 'cancelled')) = (error_kind IS NOT NULL)),
    CHECK (status = 'succeeded' OR output IS NULL)
);
-- Claiming: queued jobs in id (= creation) order.
CREATE INDEX jobs_claim ON jobs (job_id) WHERE status = 'queued';
-- Claiming with keys: the oldest queued job of each key, and whether one runs.
CREATE INDEX jobs_queued_key ON jobs (concurrency_key, job_id) WHERE status = 'queued' AND concurrency_key IS NOT NULL;
-- At most one running job per concurrency key, whoever claims it.
CREATE UNIQUE INDEX jobs_running_key ON jobs (concurrency_key) WHERE status = 'running' AND concurrency_key IS NOT NULL;
-- Reclaim sweep.
CREATE INDEX jobs_lease_expiry ON jobs (lease_expires_at) WHERE status = 'running';
-- Queue-expiry sweep.
CREATE INDEX jobs_queue_expiry ON jobs (expires_at) WHERE status = 'queued';
-- Retention sweep.
CREATE INDEX jobs_finished ON jobs (finished_at) WHERE finished_at IS NOT NULL;
-- Plan lookups and worker queries. Age ordering needs no index of its own:
-- job ids are ULIDs, so the primary key is in creation order.
CREATE INDEX jobs_plan ON jobs (plan_id) WHERE plan_id IS NOT NULL;
CREATE INDEX jobs_worker ON jobs (worker_id) WHERE worker_id IS NOT NULL;
"#,
    r#"
CREATE TABLE plugins (
    digest      TEXT PRIMARY KEY,
    bytes       BLOB NOT NULL,
    size_bytes  INTEGER NOT NULL CHECK (size_bytes = length(bytes)),
    created_at  INTEGER NOT NULL
);
"#,
    r#"
-- The registry: names and versions pointing at stored digests. The newest
-- registration of a name has the highest rowid (a replacement is a delete
-- and an insert).
CREATE TABLE plugin_names (
    name        TEXT NOT NULL,
    version     TEXT NOT NULL,
    digest      TEXT NOT NULL REFERENCES plugins (digest),
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (name, version)
);
CREATE INDEX plugin_names_digest ON plugin_names (digest);
-- The name a job was submitted under (the digest alone decides what runs),
-- the guest's last progress report, and the last attempt's logs.
ALTER TABLE jobs ADD COLUMN plugin_name TEXT;
ALTER TABLE jobs ADD COLUMN plugin_version TEXT;
ALTER TABLE jobs ADD COLUMN progress_json TEXT;
ALTER TABLE jobs ADD COLUMN logs_json TEXT;
CREATE INDEX jobs_plugin_name ON jobs (plugin_name, job_id) WHERE plugin_name IS NOT NULL;
"#,
    r#"
-- No query reads jobs by worker, and every claim paid for this index.
DROP INDEX IF EXISTS jobs_worker;
"#,
    r#"
-- A client's idempotency key for the request that created the job, kept
-- with the job (and deleted with it), and a digest of that request.
ALTER TABLE jobs ADD COLUMN idempotency_key TEXT;
ALTER TABLE jobs ADD COLUMN request_digest TEXT;
CREATE UNIQUE INDEX jobs_idempotency_key ON jobs (idempotency_key) WHERE idempotency_key IS NOT NULL;
"#,
    r#"
-- Delayed jobs and retries: a queued job is not claimed before run_after
-- (its submit's run_at, or a retry's backoff); claims take the earliest due.
ALTER TABLE jobs ADD COLUMN run_after INTEGER NOT NULL DEFAULT 0;
UPDATE jobs SET run_after = created_at;
DROP INDEX IF EXISTS jobs_claim;
CREATE INDEX jobs_claim_due ON jobs (run_after, job_id) WHERE status = 'queued';
-- A sync job's deadline: its queue wait and its run both end by then.
ALTER TABLE jobs ADD COLUMN deadline_at INTEGER;
-- Retryable failures queued again, the backoff between them, and the last
-- retried error.
ALTER TABLE jobs ADD COLUMN retries INTEGER NOT NULL DEFAULT 0 CHECK (retries >= 0);
ALTER TABLE jobs ADD COLUMN backoff_base_ms INTEGER NOT NULL DEFAULT 1000;
ALTER TABLE jobs ADD COLUMN backoff_cap_ms INTEGER NOT NULL DEFAULT 300000;
ALTER TABLE jobs ADD COLUMN last_error TEXT;
"#,
    r#"
-- The worker registry: every pool sharing the database, refreshed every
-- poll interval; stopped and silent ones are deleted at retention.
CREATE TABLE workers (
    worker_id         TEXT PRIMARY KEY,
    host              TEXT NOT NULL,
    pid               INTEGER NOT NULL,
    version           TEXT NOT NULL,
    slots             INTEGER NOT NULL CHECK (slots >= 0),
    running           INTEGER NOT NULL CHECK (running >= 0),
    state             TEXT NOT NULL CHECK (state IN ('running', 'draining', 'stopped')),
    poll_interval_ms  INTEGER NOT NULL,
    processed         INTEGER NOT NULL,
    failed            INTEGER NOT NULL,
    cancelled         INTEGER NOT NULL,
    started_at        INTEGER NOT NULL,
    last_heartbeat    INTEGER NOT NULL
);
CREATE INDEX jobs_running_worker ON jobs (worker_id) WHERE status = 'running';
"#,
    r#"
-- Times a job was given back to the queue at a shutdown: each is a run
-- that may have had effects and will start again.
ALTER TABLE jobs ADD COLUMN releases INTEGER NOT NULL DEFAULT 0 CHECK (releases >= 0);
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
    job_id       TEXT NOT NULL,
    attempt      INTEGER NOT NULL CHECK (attempt >= 1),
    seq          INTEGER NOT NULL CHECK (seq >= 1),
    method       TEXT NOT NULL,
    url          TEXT NOT NULL,
    started_at   INTEGER NOT NULL,
    finished_at  INTEGER,
    status       INTEGER CHECK (status BETWEEN 100 AND 999),
    error        TEXT,
    CHECK (finished_at IS NOT NULL OR (status IS NULL AND error IS NULL)),
    CHECK (status IS NULL OR error IS NULL),
    PRIMARY KEY (job_id, attempt, seq)
) WITHOUT ROWID;
"#,
    r#"
-- Leases lost before the attempt recorded any effect: the job ran again
-- without spending an attempt, up to its limit (pinned at submit).
ALTER TABLE jobs ADD COLUMN free_reruns INTEGER NOT NULL DEFAULT 0 CHECK (free_reruns >= 0);
ALTER TABLE jobs ADD COLUMN free_rerun_limit INTEGER NOT NULL DEFAULT 0 CHECK (free_rerun_limit >= 0);
"#,
    r#"
-- Approval gates: two states before `queued` (pending_approval, approved)
-- and the gate's record. SQLite cannot change a CHECK in place, so the
-- table is rebuilt (https://sqlite.org/lang_altertable.html#otheralter):
-- the same columns and rows, the wider status CHECK, then every index.
CREATE TABLE jobs_next (
    job_id            TEXT PRIMARY KEY,
    plan_id           TEXT,
    phase             TEXT NOT NULL CHECK (phase IN ('execute', 'apply', 'action')),
    action            TEXT,
    plugin_digest     TEXT NOT NULL,
    status            TEXT NOT NULL CHECK (status IN ('pending_approval', 'approved', 'queued', 'running',
                                                      'succeeded', 'failed', 'cancelled')),
    payload           BLOB NOT NULL,
    limits_json       TEXT NOT NULL,
    schema_version    INTEGER NOT NULL,
    created_at        INTEGER NOT NULL,
    started_at        INTEGER,
    finished_at       INTEGER,
    last_heartbeat    INTEGER,
    expires_at        INTEGER NOT NULL,
    worker_id         TEXT,
    lease_token       TEXT,
    lease_expires_at  INTEGER,
    attempt           INTEGER NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    lost_leases       INTEGER NOT NULL DEFAULT 0 CHECK (lost_leases >= 0),
    max_attempts      INTEGER NOT NULL CHECK (max_attempts >= 1),
    cancel_requested  INTEGER NOT NULL DEFAULT 0 CHECK (cancel_requested IN (0, 1)),
    concurrency_key   TEXT,
    error_kind        TEXT,
    error_message     TEXT,
    backtrace         TEXT,
    output            BLOB,
    fuel_used         INTEGER,
    peak_memory_bytes INTEGER,
    plugin_name       TEXT,
    plugin_version    TEXT,
    progress_json     TEXT,
    logs_json         TEXT,
    idempotency_key   TEXT,
    request_digest    TEXT,
    run_after         INTEGER NOT NULL DEFAULT 0,
    deadline_at       INTEGER,
    retries           INTEGER NOT NULL DEFAULT 0 CHECK (retries >= 0),
    backoff_base_ms   INTEGER NOT NULL DEFAULT 1000,
    backoff_cap_ms    INTEGER NOT NULL DEFAULT 300000,
    last_error        TEXT,
    releases          INTEGER NOT NULL DEFAULT 0 CHECK (releases >= 0),
    grants_json       TEXT,
    free_reruns       INTEGER NOT NULL DEFAULT 0 CHECK (free_reruns >= 0),
    free_rerun_limit  INTEGER NOT NULL DEFAULT 0 CHECK (free_rerun_limit >= 0),
    approval_json     TEXT,
    CHECK ((phase = 'action') = (action IS NOT NULL)),
    CHECK ((status = 'running') = (lease_token IS NOT NULL)),
    CHECK (status <> 'running' OR (worker_id IS NOT NULL AND lease_expires_at IS NOT NULL AND started_at IS NOT NULL)),
    CHECK ((status IN ('succeeded', 'failed', 'cancelled')) = (finished_at IS NOT NULL)),
    CHECK ((status IN ('failed', 'cancelled')) = (error_kind IS NOT NULL)),
    CHECK (status = 'succeeded' OR output IS NULL),
    CHECK (status NOT IN ('pending_approval', 'approved') OR approval_json IS NOT NULL)
);
INSERT INTO jobs_next (job_id, plan_id, phase, action, plugin_digest, status, payload, limits_json, schema_version, created_at, started_at, finished_at, last_heartbeat, expires_at, worker_id, lease_token, lease_expires_at, attempt, lost_leases, max_attempts, cancel_requested, concurrency_key, error_kind, error_message, backtrace, output, fuel_used, peak_memory_bytes, plugin_name, plugin_version, progress_json, logs_json, idempotency_key, request_digest, run_after, deadline_at, retries, backoff_base_ms, backoff_cap_ms, last_error, releases, grants_json, free_reruns, free_rerun_limit) SELECT job_id, plan_id, phase, action, plugin_digest, status, payload, limits_json, schema_version, created_at, started_at, finished_at, last_heartbeat, expires_at, worker_id, lease_token, lease_expires_at, attempt, lost_leases, max_attempts, cancel_requested, concurrency_key, error_kind, error_message, backtrace, output, fuel_used, peak_memory_bytes, plugin_name, plugin_version, progress_json, logs_json, idempotency_key, request_digest, run_after, deadline_at, retries, backoff_base_ms, backoff_cap_ms, last_error, releases, grants_json, free_reruns, free_rerun_limit FROM jobs;
DROP TABLE jobs;
ALTER TABLE jobs_next RENAME TO jobs;
CREATE INDEX jobs_claim_due ON jobs (run_after, job_id) WHERE status = 'queued';
CREATE INDEX jobs_queued_key ON jobs (concurrency_key, job_id) WHERE status = 'queued' AND concurrency_key IS NOT NULL;
CREATE UNIQUE INDEX jobs_running_key ON jobs (concurrency_key) WHERE status = 'running' AND concurrency_key IS NOT NULL;
CREATE INDEX jobs_lease_expiry ON jobs (lease_expires_at) WHERE status = 'running';
CREATE INDEX jobs_running_worker ON jobs (worker_id) WHERE status = 'running';
-- Queue-expiry sweep: queued jobs, and gated ones past their approval TTL.
CREATE INDEX jobs_queue_expiry ON jobs (expires_at) WHERE status IN ('queued', 'pending_approval', 'approved');
CREATE INDEX jobs_finished ON jobs (finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX jobs_plan ON jobs (plan_id) WHERE plan_id IS NOT NULL;
CREATE INDEX jobs_plugin_name ON jobs (plugin_name, job_id) WHERE plugin_name IS NOT NULL;
CREATE UNIQUE INDEX jobs_idempotency_key ON jobs (idempotency_key) WHERE idempotency_key IS NOT NULL;
-- Which targets of a registration wait for approval (JSON; NULL: none).
ALTER TABLE plugin_names ADD COLUMN approval_json TEXT;
"#,
    r#"
-- Plans: an execute job and the apply job created from its output. The
-- status is derived from the jobs; the row keeps what the apply job needs.
CREATE TABLE plans (
    plan_id          TEXT PRIMARY KEY,
    apply_mode       TEXT NOT NULL CHECK (apply_mode IN ('approval', 'auto')),
    input            BLOB NOT NULL,
    queue_ttl_ms     INTEGER NOT NULL CHECK (queue_ttl_ms > 0),
    approval_ttl_ms  INTEGER NOT NULL CHECK (approval_ttl_ms > 0),
    created_at       INTEGER NOT NULL,
    execute_job_id   TEXT NOT NULL UNIQUE,
    apply_job_id     TEXT UNIQUE,
    cancelled_at     INTEGER
);
-- Plans still to advance: their apply job is not created yet.
CREATE INDEX plans_unapplied ON plans (execute_job_id) WHERE apply_job_id IS NULL AND cancelled_at IS NULL;
"#,
    concat!(
        r#"
-- The change feed (`GET /v1/events`): one row per job or worker change,
-- appended by the triggers below in the transaction that makes the change,
-- whichever process makes it. Writers are serialised, so `seq` is commit
-- order; AUTOINCREMENT never reuses a number, even after retention.
CREATE TABLE events (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    at             INTEGER NOT NULL,
    what           TEXT NOT NULL CHECK (what IN ('insert', 'status', 'progress', 'cancel',
                                                 'worker_insert', 'worker_state', 'worker_delete')),
    job_id         TEXT,
    plan_id        TEXT,
    plugin_digest  TEXT,
    plugin_name    TEXT,
    plugin_version TEXT,
    phase          TEXT,
    action         TEXT,
    status         TEXT NOT NULL,
    previous       TEXT,
    attempt        INTEGER,
    worker_id      TEXT,
    error_kind     TEXT,
    progress_json  TEXT
);
CREATE INDEX events_at ON events (at);
-- How far retention has deleted: a reader resuming before it missed events.
CREATE TABLE event_horizon (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    txn  INTEGER NOT NULL,
    seq  INTEGER NOT NULL
);
"#,
        job_event_triggers!("CAST(unixepoch('subsec') * 1000 AS INTEGER)"),
        worker_event_triggers!()
    ),
    concat!(
        r#"
-- The change feed without AUTOINCREMENT (a write to sqlite_sequence for
-- every event), the index on `at` (retention finds where to cut by
-- reading from the oldest event, which it deletes anyway) or an `IN` list
-- in its CHECK (see the next migration): with them the event triggers
-- cost 30% of the store's own rate. Numbers are still never
-- reused: retention always keeps the newest event, and SQLite numbers a
-- new row one past the largest.
DROP TRIGGER jobs_event_insert;
DROP TRIGGER jobs_event_status;
DROP TRIGGER jobs_event_progress;
DROP TRIGGER jobs_event_cancel;
DROP TRIGGER workers_event_insert;
DROP TRIGGER workers_event_state;
DROP TRIGGER workers_event_delete;
CREATE TABLE events_next (
    seq            INTEGER PRIMARY KEY,
    at             INTEGER NOT NULL,
    what           TEXT NOT NULL CHECK (what = 'insert' OR what = 'status' OR what = 'progress' OR what = 'cancel'
                                        OR what = 'worker_insert' OR what = 'worker_state' OR what = 'worker_delete'),
    job_id         TEXT,
    plan_id        TEXT,
    plugin_digest  TEXT,
    plugin_name    TEXT,
    plugin_version TEXT,
    phase          TEXT,
    action         TEXT,
    status         TEXT NOT NULL,
    previous       TEXT,
    attempt        INTEGER,
    worker_id      TEXT,
    error_kind     TEXT,
    progress_json  TEXT
);
INSERT INTO events_next SELECT * FROM events;
DROP TABLE events;
ALTER TABLE events_next RENAME TO events;
DELETE FROM sqlite_sequence WHERE name = 'events';
"#,
        job_event_triggers!("CAST(unixepoch('subsec') * 1000 AS INTEGER)"),
        worker_event_triggers!()
    ),
    concat!(
        r#"
-- The jobs table again, its CHECKs and partial-index conditions written
-- with `=` and `OR` instead of `IN (…)`: SQLite builds a temporary b-tree
-- for every `IN` list each time a statement that checks it runs, seven
-- for each claim and finish (a bare update ran 2.3x faster without them).
-- The same columns, rows, indexes and triggers otherwise.
CREATE TABLE jobs_next (
    job_id            TEXT PRIMARY KEY,
    plan_id           TEXT,
    phase             TEXT NOT NULL CHECK ((phase = 'execute' OR phase = 'apply' OR phase = 'action')),
    action            TEXT,
    plugin_digest     TEXT NOT NULL,
    status            TEXT NOT NULL CHECK ((status = 'pending_approval' OR status = 'approved' OR status = 'queued' OR status = 'running' OR status = 'succeeded' OR status = 'failed' OR status = 'cancelled')),
    payload           BLOB NOT NULL,
    limits_json       TEXT NOT NULL,
    schema_version    INTEGER NOT NULL,
    created_at        INTEGER NOT NULL,
    started_at        INTEGER,
    finished_at       INTEGER,
    last_heartbeat    INTEGER,
    expires_at        INTEGER NOT NULL,
    worker_id         TEXT,
    lease_token       TEXT,
    lease_expires_at  INTEGER,
    attempt           INTEGER NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    lost_leases       INTEGER NOT NULL DEFAULT 0 CHECK (lost_leases >= 0),
    max_attempts      INTEGER NOT NULL CHECK (max_attempts >= 1),
    cancel_requested  INTEGER NOT NULL DEFAULT 0 CHECK ((cancel_requested = 0 OR cancel_requested = 1)),
    concurrency_key   TEXT,
    error_kind        TEXT,
    error_message     TEXT,
    backtrace         TEXT,
    output            BLOB,
    fuel_used         INTEGER,
    peak_memory_bytes INTEGER,
    plugin_name       TEXT,
    plugin_version    TEXT,
    progress_json     TEXT,
    logs_json         TEXT,
    idempotency_key   TEXT,
    request_digest    TEXT,
    run_after         INTEGER NOT NULL DEFAULT 0,
    deadline_at       INTEGER,
    retries           INTEGER NOT NULL DEFAULT 0 CHECK (retries >= 0),
    backoff_base_ms   INTEGER NOT NULL DEFAULT 1000,
    backoff_cap_ms    INTEGER NOT NULL DEFAULT 300000,
    last_error        TEXT,
    releases          INTEGER NOT NULL DEFAULT 0 CHECK (releases >= 0),
    grants_json       TEXT,
    free_reruns       INTEGER NOT NULL DEFAULT 0 CHECK (free_reruns >= 0),
    free_rerun_limit  INTEGER NOT NULL DEFAULT 0 CHECK (free_rerun_limit >= 0),
    approval_json     TEXT,
    CHECK ((phase = 'action') = (action IS NOT NULL)),
    CHECK ((status = 'running') = (lease_token IS NOT NULL)),
    CHECK (status <> 'running' OR (worker_id IS NOT NULL AND lease_expires_at IS NOT NULL AND started_at IS NOT NULL)),
    CHECK (((status = 'succeeded' OR status = 'failed' OR status = 'cancelled')) = (finished_at IS NOT NULL)),
    CHECK (((status = 'failed' OR status = 'cancelled')) = (error_kind IS NOT NULL)),
    CHECK (status = 'succeeded' OR output IS NULL),
    CHECK ((status <> 'pending_approval' AND status <> 'approved') OR approval_json IS NOT NULL)
);
INSERT INTO jobs_next SELECT * FROM jobs;
DROP TABLE jobs;
ALTER TABLE jobs_next RENAME TO jobs;
CREATE INDEX jobs_claim_due ON jobs (run_after, job_id) WHERE status = 'queued';
CREATE INDEX jobs_queued_key ON jobs (concurrency_key, job_id) WHERE status = 'queued' AND concurrency_key IS NOT NULL;
CREATE UNIQUE INDEX jobs_running_key ON jobs (concurrency_key) WHERE status = 'running' AND concurrency_key IS NOT NULL;
CREATE INDEX jobs_lease_expiry ON jobs (lease_expires_at) WHERE status = 'running';
CREATE INDEX jobs_running_worker ON jobs (worker_id) WHERE status = 'running';
CREATE INDEX jobs_queue_expiry ON jobs (expires_at) WHERE (status = 'queued' OR status = 'pending_approval' OR status = 'approved');
CREATE INDEX jobs_finished ON jobs (finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX jobs_plan ON jobs (plan_id) WHERE plan_id IS NOT NULL;
CREATE INDEX jobs_plugin_name ON jobs (plugin_name, job_id) WHERE plugin_name IS NOT NULL;
CREATE UNIQUE INDEX jobs_idempotency_key ON jobs (idempotency_key) WHERE idempotency_key IS NOT NULL;
"#,
        job_event_triggers!("CAST(unixepoch('subsec') * 1000 AS INTEGER)")
    ),
    concat!(
        r#"
-- The claim and the finish again, measured on the store alone
-- (BENCHMARKS.md). First, the job event triggers take an event's time from
-- `event_clock`, which each writer sets as its transaction begins, instead
-- of calling unixepoch(): a statement that may fail halfway (any function
-- call may) and writes more than one row (any trigger does) makes SQLite
-- copy every page it touches into a statement journal first, about a
-- quarter of the claim's and the finish's cost; with the hot statements
-- written `UPDATE OR FAIL` (they change one row, after their checks, so
-- there is nothing to undo) they need none. Second, one index on running
-- jobs instead of two: the reclaim sweep's range over lease expiries, and
-- the workers' view reads every running job anyway.
CREATE TABLE event_clock (
    id  INTEGER PRIMARY KEY CHECK (id = 1),
    at  INTEGER NOT NULL
);
INSERT INTO event_clock (id, at) VALUES (1, CAST(unixepoch('subsec') * 1000 AS INTEGER));
DROP TRIGGER jobs_event_insert;
DROP TRIGGER jobs_event_status;
DROP TRIGGER jobs_event_progress;
DROP TRIGGER jobs_event_cancel;
DROP INDEX jobs_lease_expiry;
DROP INDEX jobs_running_worker;
CREATE INDEX jobs_running ON jobs (lease_expires_at, worker_id) WHERE status = 'running';
"#,
        job_event_triggers!("(SELECT at FROM event_clock WHERE id = 1)")
    ),
    r#"
-- The plugins table again, a component's bytes last. SQLite stores a
-- row's columns in order and reaches a column stored after a large blob
-- by walking the blob's overflow pages, one read each: every lookup of a
-- plugin's size or age (each submit by name) read its whole component.
CREATE TABLE plugins_next (
    digest      TEXT PRIMARY KEY,
    size_bytes  INTEGER NOT NULL CHECK (size_bytes = length(bytes)),
    created_at  INTEGER NOT NULL,
    bytes       BLOB NOT NULL
);
INSERT INTO plugins_next (digest, size_bytes, created_at, bytes) SELECT digest, size_bytes, created_at, bytes FROM plugins;
DROP TABLE plugins;
ALTER TABLE plugins_next RENAME TO plugins;
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
-- Rows stored before this have `requests_read = 0` until the runtime
-- reads their bytes once and puts them again.
ALTER TABLE plugins ADD COLUMN requests_json TEXT;
ALTER TABLE plugins ADD COLUMN requests_read INTEGER NOT NULL DEFAULT 0 CHECK (requests_read IN (0, 1));
CREATE INDEX plugins_undeclared ON plugins (digest) WHERE requests_read = 0;
"#,
    r#"
-- Dashboard sessions signed out before their expiry: refused until then
-- (a session cookie proves itself; only an early end needs the store).
CREATE TABLE ended_sessions (
    session_id  TEXT PRIMARY KEY,
    expires_at  INTEGER NOT NULL
);
"#,
    r#"
-- Principals (who may call the API, with their roles) and their tokens,
-- each stored as its secret's SHA-256; a revoked token keeps its row.
CREATE TABLE principals (
    name        TEXT PRIMARY KEY,
    roles       TEXT NOT NULL,
    created_at  INTEGER NOT NULL
);
CREATE TABLE tokens (
    token_id     TEXT PRIMARY KEY,
    principal    TEXT NOT NULL,
    secret_hash  TEXT NOT NULL,
    label        TEXT,
    created_at   INTEGER NOT NULL,
    expires_at   INTEGER,
    revoked_at   INTEGER
);
CREATE INDEX tokens_principal ON tokens (principal);
"#,
    r#"
-- The principal that submitted each job (NULL: an embedder's own submit,
-- or a job stored before submitters were recorded).
ALTER TABLE jobs ADD COLUMN submitted_by TEXT;
CREATE INDEX jobs_submitted_by ON jobs (submitted_by, job_id) WHERE submitted_by IS NOT NULL;
"#,
    r#"
-- The audit trail: one row per change, appended in the change's own
-- write, each row's hash covering its fields and the row before's hash.
-- The head (one row) names the last row, so rows cut from the end show.
CREATE TABLE audit (
    seq        INTEGER PRIMARY KEY,
    at         INTEGER NOT NULL,
    principal  TEXT,
    action     TEXT NOT NULL,
    target     TEXT NOT NULL,
    detail     TEXT NOT NULL,
    prev_hash  TEXT NOT NULL,
    hash       TEXT NOT NULL
);
CREATE INDEX audit_principal ON audit (principal, seq);
CREATE INDEX audit_target ON audit (target, seq);
CREATE TABLE audit_head (
    id    INTEGER PRIMARY KEY CHECK (id = 1),
    seq   INTEGER NOT NULL,
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
    rule_id        TEXT PRIMARY KEY,
    author         TEXT NOT NULL,
    plugin_digest  TEXT NOT NULL,
    target         TEXT NOT NULL,
    created_at     INTEGER NOT NULL,
    expires_at     INTEGER NOT NULL,
    revoked_at     INTEGER,
    revoked_by     TEXT,
    uses           INTEGER NOT NULL DEFAULT 0,
    rule_json      TEXT NOT NULL
);
CREATE INDEX approval_rules_plugin ON approval_rules (plugin_digest, target);
"#,
    r#"
-- Audit retention: the last row deleted (0: none), whose hash the first
-- row kept names.
ALTER TABLE audit_head ADD COLUMN pruned_seq INTEGER NOT NULL DEFAULT 0;
ALTER TABLE audit_head ADD COLUMN pruned_hash TEXT;
"#,
    r#"
-- A principal's running cap as a column the claim reads (NULL: none), and
-- the indexes that find a submitter's queued and running jobs.
ALTER TABLE principals ADD COLUMN max_running INTEGER;
CREATE INDEX jobs_queued_by ON jobs (submitted_by, run_after, job_id) WHERE status = 'queued' AND submitted_by IS NOT NULL;
CREATE INDEX jobs_running_by ON jobs (submitted_by) WHERE status = 'running' AND submitted_by IS NOT NULL;
"#,
    concat!(
        r#"
-- Earlier attempts, kept by triggers (see triggers.rs).
CREATE TABLE job_attempts (
    id                INTEGER PRIMARY KEY,
    job_id            TEXT NOT NULL,
    run               INTEGER NOT NULL,
    worker_id         TEXT,
    started_at        INTEGER,
    ended_at          INTEGER,
    outcome           TEXT NOT NULL,
    error_kind        TEXT,
    error             TEXT,
    fuel_used         INTEGER,
    peak_memory_bytes INTEGER,
    logs_json         TEXT,
    logs_cut          INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX job_attempts_job ON job_attempts (job_id, id);
"#,
        job_attempt_triggers!()
    ),
    super::proposals::MIGRATION,
    super::claim::MIGRATION,
    super::schedules::MIGRATION,
    super::labels::MIGRATION,
    super::rate_limits::MIGRATION,
    super::rate_limits::EGRESS_MIGRATION,
    super::plugins::CODE_MIGRATION,
];
