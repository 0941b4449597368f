//! The triggers that feed the change feed, as the migrations create them
//! (and create again whenever a table they touch is rebuilt).

/// The triggers that append jobs' changes to the change feed, as first
/// created and as created again whenever a table they touch is rebuilt;
/// `$at` is the SQL for the event's time.
macro_rules! job_event_triggers {
    ($at:literal) => {
        concat!(
            r#"
CREATE TRIGGER jobs_event_insert AFTER INSERT ON jobs BEGIN
    INSERT INTO events (at, what, job_id, plan_id, plugin_digest, plugin_name, plugin_version, phase, action,
                        status, attempt, progress_json)
    VALUES ("#,
            $at,
            r#", 'insert', NEW.job_id, NEW.plan_id, NEW.plugin_digest,
            NEW.plugin_name, NEW.plugin_version, NEW.phase, NEW.action, NEW.status, NEW.attempt, NEW.progress_json);
END;
CREATE TRIGGER jobs_event_status AFTER UPDATE OF status ON jobs WHEN NEW.status IS NOT OLD.status BEGIN
    INSERT INTO events (at, what, job_id, plan_id, plugin_digest, plugin_name, plugin_version, phase, action,
                        status, previous, attempt, worker_id, error_kind, progress_json)
    VALUES ("#,
            $at,
            r#", 'status', NEW.job_id, NEW.plan_id, NEW.plugin_digest,
            NEW.plugin_name, NEW.plugin_version, NEW.phase, NEW.action, NEW.status, OLD.status, NEW.attempt,
            NEW.worker_id, NEW.error_kind, NEW.progress_json);
END;
-- A claim clears the progress and a finish keeps the last: only a report
-- from a running guest is an event of its own.
CREATE TRIGGER jobs_event_progress AFTER UPDATE OF progress_json ON jobs
WHEN NEW.status = 'running' AND OLD.status = 'running' AND NEW.progress_json IS NOT NULL
     AND NEW.progress_json IS NOT OLD.progress_json BEGIN
    INSERT INTO events (at, what, job_id, plan_id, plugin_digest, plugin_name, plugin_version, phase, action,
                        status, attempt, worker_id, progress_json)
    VALUES ("#,
            $at,
            r#", 'progress', NEW.job_id, NEW.plan_id, NEW.plugin_digest,
            NEW.plugin_name, NEW.plugin_version, NEW.phase, NEW.action, NEW.status, NEW.attempt, NEW.worker_id,
            NEW.progress_json);
END;
CREATE TRIGGER jobs_event_cancel AFTER UPDATE OF cancel_requested ON jobs
WHEN NEW.status = 'running' AND NEW.cancel_requested AND NOT OLD.cancel_requested BEGIN
    INSERT INTO events (at, what, job_id, plan_id, plugin_digest, plugin_name, plugin_version, phase, action,
                        status, attempt, worker_id, progress_json)
    VALUES ("#,
            $at,
            r#", 'cancel', NEW.job_id, NEW.plan_id, NEW.plugin_digest,
            NEW.plugin_name, NEW.plugin_version, NEW.phase, NEW.action, NEW.status, NEW.attempt, NEW.worker_id,
            NEW.progress_json);
END;
"#
        )
    };
}

/// The triggers that append workers' changes to the change feed.
macro_rules! worker_event_triggers {
    () => {
        r#"
CREATE TRIGGER workers_event_insert AFTER INSERT ON workers BEGIN
    INSERT INTO events (at, what, worker_id, status)
    VALUES (CAST(unixepoch('subsec') * 1000 AS INTEGER), 'worker_insert', NEW.worker_id, NEW.state);
END;
CREATE TRIGGER workers_event_state AFTER UPDATE OF state ON workers WHEN NEW.state IS NOT OLD.state BEGIN
    INSERT INTO events (at, what, worker_id, status, previous)
    VALUES (CAST(unixepoch('subsec') * 1000 AS INTEGER), 'worker_state', NEW.worker_id, NEW.state, OLD.state);
END;
CREATE TRIGGER workers_event_delete AFTER DELETE ON workers BEGIN
    INSERT INTO events (at, what, worker_id, status)
    VALUES (CAST(unixepoch('subsec') * 1000 AS INTEGER), 'worker_delete', OLD.worker_id, OLD.state);
END;
"#
    };
}

pub(super) use {job_event_triggers, worker_event_triggers};

/// Earlier attempts: a job's row holds its last attempt (worker, start,
/// end, error, logs), and these triggers keep each attempt the row is
/// about to forget, in the write that makes it forget: a running job
/// queued again (retried, released, its lease lost) and a finished one
/// queued again. How it ended is read off the counters the write raised;
/// a release after an effect raises `retries` too, and is told apart by
/// its `last_error` (`interrupted: …`). A claim clears `logs_json`, so
/// the logs a requeue leaves are the attempt's own (a retry writes them;
/// a release or a lost lease has none). It watches `run_after`, which
/// every requeue sets and the claim and the finish never do: SQLite
/// compiles a trigger into each statement that sets a column it watches,
/// and the hot statements stay as lean as before. The bulk (the logs) of all but the five latest is
/// dropped and marked. Created again whenever the jobs table is rebuilt.
macro_rules! job_attempt_triggers {
    () => {
        r#"
CREATE TRIGGER jobs_attempt_requeued AFTER UPDATE OF run_after ON jobs
WHEN NEW.status = 'queued' AND OLD.status IN ('running', 'succeeded', 'failed', 'cancelled') BEGIN
    INSERT INTO job_attempts (job_id, run, worker_id, started_at, ended_at, outcome, error_kind, error,
                              fuel_used, peak_memory_bytes, logs_json)
    VALUES (NEW.job_id, OLD.attempt, OLD.worker_id, OLD.started_at,
            CASE WHEN OLD.status <> 'running' THEN OLD.finished_at
                 WHEN NEW.retries > OLD.retries AND NEW.last_error NOT LIKE 'interrupted: %' THEN NEW.last_heartbeat
                 ELSE (SELECT at FROM event_clock WHERE id = 1) END,
            CASE WHEN OLD.status <> 'running' THEN OLD.status
                 WHEN NEW.process_deaths > OLD.process_deaths THEN 'process_died'
                 WHEN NEW.lost_leases > OLD.lost_leases OR NEW.free_reruns > OLD.free_reruns THEN 'lease_lost'
                 WHEN NEW.retries > OLD.retries AND NEW.last_error NOT LIKE 'interrupted: %' THEN 'retried'
                 ELSE 'released' END,
            CASE WHEN OLD.status <> 'running' THEN OLD.error_kind END,
            CASE WHEN OLD.status <> 'running' THEN OLD.error_message
                 WHEN NEW.releases = OLD.releases THEN NEW.last_error END,
            CASE WHEN OLD.status <> 'running' THEN OLD.fuel_used WHEN NEW.retries > OLD.retries AND NEW.last_error NOT LIKE 'interrupted: %' THEN NEW.fuel_used END,
            CASE WHEN OLD.status <> 'running' THEN OLD.peak_memory_bytes WHEN NEW.retries > OLD.retries AND NEW.last_error NOT LIKE 'interrupted: %' THEN NEW.peak_memory_bytes END,
            CASE WHEN OLD.status <> 'running' THEN OLD.logs_json ELSE NEW.logs_json END);
    UPDATE job_attempts SET logs_json = NULL, logs_cut = 1
    WHERE job_id = NEW.job_id AND logs_json IS NOT NULL
      AND id <= (SELECT id FROM job_attempts WHERE job_id = NEW.job_id ORDER BY id DESC LIMIT 1 OFFSET 5);
END;
CREATE TRIGGER jobs_attempts_delete AFTER DELETE ON jobs BEGIN
    DELETE FROM job_attempts WHERE job_id = OLD.job_id;
END;
"#
    };
}

pub(super) use job_attempt_triggers;
