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
