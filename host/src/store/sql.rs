//! SQL both backends run alike: the column lists and conditions SQLite and
//! PostgreSQL both accept, written once. A statement whose spelling
//! differs between them lives in its backend; the decisions around them
//! live in [`rules`](super::rules), which has no SQL.

use crate::job::labels::{metadata_label, tag_label};
use crate::job::rate::RESERVATION_GRACE;
use crate::job::{JobId, JobStatus, PluginRef};
use crate::store::JobListParams;
use crate::store::rules::approval::expiry_message;

/// The message the expiry sweep writes, as a `CASE` over the job's row:
/// `j` is the jobs table's name in the statement, `now` the placeholder
/// for now. The waits for a person say what a late decision says
/// ([`expiry_message`]).
pub(crate) fn expiry_message_case(j: &str, now: &str) -> String {
    format!(
        "CASE WHEN {j}.status = 'pending_approval' THEN '{}' WHEN {j}.status = 'approved' THEN '{}' \
         WHEN {j}.deadline_at <= {now} THEN 'Expired: the job could not start before its deadline' \
         ELSE 'Expired: the job waited in the queue past its expiry' END",
        expiry_message(JobStatus::PendingApproval),
        expiry_message(JobStatus::Approved),
    )
}

/// The columns both stores read for [`Counters`](super::rules::unfinished::Counters), after the job id and
/// attempt.
pub(crate) const COUNTER_COLUMNS: &str = "job_id, attempt, lost_leases, retries, max_attempts, free_reruns, \
     free_rerun_limit, cancel_requested, backoff_base_ms, backoff_cap_ms, process_deaths";

/// [`Jobs::jobs_ahead`](crate::store::Jobs::jobs_ahead): ?1 now, ?2 the
/// job's priority, ?3 its due time, ?4 its id. A job whose concurrency key
/// has a running job is not ahead (no claim takes it now). Both stores
/// spell it alike (PostgreSQL with `$`).
pub(crate) const JOBS_AHEAD: &str = "SELECT COUNT(*) FROM jobs WHERE status = 'queued' AND paused = 0 \
     AND run_after <= ?1 AND (rate_slot IS NULL OR rate_slot <= ?1) \
     AND (priority < ?2 OR (priority = ?2 AND (run_after < ?3 OR (run_after = ?3 AND job_id < ?4)))) \
     AND (concurrency_key IS NULL OR NOT EXISTS (SELECT 1 FROM jobs r WHERE r.status = 'running' \
     AND r.concurrency_key = jobs.concurrency_key))";

/// True when the process holding an expired lease died, as the store can
/// tell: its worker row says it stopped, or fell silent before two thirds
/// of the lease had run (a live process reports every poll interval, so
/// its last report is recent; a dead one's is no later than the lease's
/// last renewal plus a third of the lease). A missing row tells nothing
/// (a first report can fail). Both stores spell it alike, over
/// `jobs j LEFT JOIN workers w`.
pub(crate) const SILENT_WORKER: &str = "COALESCE(w.state = 'stopped' OR w.last_heartbeat < \
     j.lease_expires_at - (j.lease_expires_at - COALESCE(j.last_heartbeat, j.started_at)) / 3, FALSE)";

/// Which queued jobs a claim picks from: those that never took a process
/// down, or the suspects that did (claimed alone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClaimPool {
    Fresh,
    Suspect,
}

impl ClaimPool {
    /// Both, in the order their statements are kept in.
    pub(crate) const ALL: [ClaimPool; 2] = [ClaimPool::Fresh, ClaimPool::Suspect];
}

/// The submitters whose jobs the uncapped claim takes: those with no
/// running cap, and none (`q` is the queued job).
pub(crate) const UNCAPPED_SUBMITTER: &str =
    "NOT EXISTS (SELECT 1 FROM principals p WHERE p.name = q.submitted_by AND p.max_running IS NOT NULL)";

/// The queued jobs `q` of `pool` a claim may take at `now` (a placeholder),
/// of the submitters `whose` admits: not held by a pause (neither parked
/// nor of a paused plugin: a job queued again after its plugin was paused
/// is not parked), unexpired, due, holding a live rate slot if it names a
/// rate limit, and keyless or the oldest queued job of a key with no
/// running job. (The pauses are read once per statement, as
/// a set: PostgreSQL plans a correlated `NOT EXISTS` on them as a join
/// that gives up the claim index's order.)
pub(crate) fn claimable(pool: ClaimPool, whose: &str, now: &str, slots: SlotsGiven) -> String {
    let which = match pool {
        ClaimPool::Fresh => "q.process_deaths = 0",
        ClaimPool::Suspect => "q.process_deaths > 0",
    };
    // PostgreSQL's claim indexes hold no limited job without a slot: the
    // first condition is their predicate, written as they are.
    let (slotted, unslotted) = match slots {
        SlotsGiven::BeforeTheClaim => (" AND (q.rate_limit IS NULL OR q.rate_slot IS NOT NULL)", ""),
        SlotsGiven::AsPicked => ("", "q.rate_slot IS NULL OR "),
    };
    format!(
        "q.status = 'queued' AND q.paused = 0{slotted} AND {which} AND {whose} AND q.run_after <= {now} \
         AND q.expires_at > {now} AND (q.rate_limit IS NULL OR {unslotted}q.rate_slot >= {now} - {grace}) \
         {PAUSES_AND_KEYS}",
        grace = RESERVATION_GRACE.as_millis(),
    )
}

/// When a backend gives a due job naming a rate limit its slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlotsGiven {
    /// Before the claim statement (PostgreSQL, whose claim is one
    /// statement): a claim takes only such a job holding a live slot.
    BeforeTheClaim,
    /// As the claim picks it (SQLite): a job with no slot is picked too,
    /// and given its slot then.
    AsPicked,
}

/// The rest of [`claimable`] and [`rate_admittable`]: not of a paused
/// plugin, and keyless or the oldest queued job of a key with no running
/// job.
const PAUSES_AND_KEYS: &str = "AND (q.plugin_name IS NULL OR q.plugin_name NOT IN (SELECT z.name FROM plugin_pauses z)) \
     AND (q.concurrency_key IS NULL OR ( \
       q.job_id = (SELECT MIN(o.job_id) FROM jobs o WHERE o.status = 'queued' AND o.concurrency_key = q.concurrency_key) \
       AND NOT EXISTS (SELECT 1 FROM jobs r WHERE r.status = 'running' AND r.concurrency_key = q.concurrency_key)))";

/// The columns of a rate limit, in
/// [`RateLimit::from_columns`](crate::job::rate::RateLimit::from_columns)'s order.
pub(crate) const RATE_LIMIT_COLUMNS: &str = "name, count, per_ms, burst, updated_at, updated_by, egress";

/// The due jobs `q` a claim at `now` gives a rate slot to before it
/// claims ([`SlotsGiven::BeforeTheClaim`], PostgreSQL's): queued, not held
/// by a pause, unexpired, due, keyless or next of their key, naming a
/// limit, and holding no slot; at most `limit`, in due order, read from
/// `jobs_rate_waiting`. `jobs` names the table. Columns: id, limit, key,
/// due. (Written here beside [`claimable`], whose pause and key conditions
/// it shares.)
pub(crate) fn rate_admittable(now: &str, limit: &str, jobs: &str) -> String {
    format!(
        "SELECT q.job_id, q.rate_limit, q.rate_key, q.run_after FROM {jobs} \
         WHERE q.status = 'queued' AND q.paused = 0 AND q.rate_limit IS NOT NULL AND q.rate_slot IS NULL \
         AND q.run_after <= {now} AND q.expires_at > {now} {PAUSES_AND_KEYS} \
         ORDER BY q.run_after, q.job_id LIMIT {limit}"
    )
}

/// Drop the slots whose grace ran out unused (their jobs were not claimed
/// within [`RESERVATION_GRACE`]): those jobs are given slots again. `jobs`
/// as in [`rate_admittable`] (`jobs_rate_slots` on SQLite).
pub(crate) fn rate_slots_expire(now: &str, jobs: &str) -> String {
    format!(
        "UPDATE {jobs} SET rate_slot = NULL WHERE status = 'queued' AND rate_slot IS NOT NULL \
         AND rate_slot < {now} - {grace}",
        grace = RESERVATION_GRACE.as_millis(),
    )
}

/// The earliest slot a queued job holds after `now`: when this process's
/// workers next have a reserved job to start. `jobs` as in
/// [`rate_slots_expire`].
pub(crate) fn next_rate_slot(now: &str, jobs: &str) -> String {
    format!("SELECT MIN(rate_slot) FROM {jobs} WHERE status = 'queued' AND rate_slot IS NOT NULL AND rate_slot > {now}")
}

/// The plan columns both backends read, in this order.
pub(crate) const PLAN_COLUMNS: &str =
    "plan_id, apply_mode, input, queue_ttl_ms, approval_ttl_ms, created_at, execute_job_id, apply_job_id, cancelled_at";

/// The condition retention adds for a finished job in `jobs`: it is not
/// the execute job of a plan that still needs it (its apply job is not
/// created yet, or has not ended), so a plan's phases are deleted
/// together, after the last one ends.
pub(crate) const NOT_HELD_BY_A_PLAN: &str = "NOT EXISTS (SELECT 1 FROM plans p WHERE p.execute_job_id = jobs.job_id \
     AND ((p.apply_job_id IS NULL AND p.cancelled_at IS NULL AND jobs.status = 'succeeded') \
       OR EXISTS (SELECT 1 FROM jobs a WHERE a.job_id = p.apply_job_id AND a.finished_at IS NULL)))";

/// Delete the plans none of whose jobs are left.
pub(crate) const DELETE_EMPTY_PLANS: &str = "DELETE FROM plans WHERE NOT EXISTS \
     (SELECT 1 FROM jobs WHERE jobs.job_id = plans.execute_job_id) \
     AND (apply_job_id IS NULL OR NOT EXISTS (SELECT 1 FROM jobs WHERE jobs.job_id = plans.apply_job_id))";

/// The columns of an effect row, in [`EffectRow`](super::rules::codec::EffectRow)'s order.
pub(crate) const EFFECT_COLUMNS: &str = "attempt, seq, method, url, started_at, finished_at, status, error, proposal";

/// A list's filters as `(condition, values)` pairs, each condition with a
/// `{}` where its backend puts each value's placeholder ([`filter_sql`]).
pub(crate) fn list_filters(params: &JobListParams) -> Vec<(String, Vec<String>)> {
    let mut filters: Vec<(String, Vec<String>)> = Vec::new();
    let mut one = |condition: &str, value: String| filters.push((condition.to_owned(), vec![value]));
    match &params.status[..] {
        [] => {}
        [status] => one("status = {}", status.as_str().to_owned()),
        several => {
            // `,queued,running,` holds `,status,` for the states asked.
            let listed: Vec<&str> = several.iter().map(|s| s.as_str()).collect();
            one("{} LIKE ('%,' || status || ',%')", format!(",{},", listed.join(",")));
        }
    }
    match &params.plugin {
        Some(PluginRef::Digest(digest)) => one("plugin_digest = {}", digest.to_string()),
        Some(PluginRef::Name(name)) => one("plugin_name = {}", name.clone()),
        Some(PluginRef::Version(v)) => {
            one("plugin_name = {}", v.name.clone());
            one("plugin_version = {}", v.version.clone());
        }
        None => {}
    }
    if let Some(plan) = &params.plan_id {
        one("plan_id = {}", plan.clone());
    }
    if let Some(key) = &params.concurrency_key {
        one("concurrency_key = {}", key.clone());
    }
    if let Some(submitter) = &params.submitted_by {
        one("submitted_by = {}", submitter.clone());
    }
    if let Some(schedule) = params.schedule_id {
        one("schedule_id = {}", schedule.to_string());
    }
    if let Some(before) = params.before {
        one("job_id < {}", before.to_string());
    }
    // Ids are ULIDs: a creation-time range is a range of the primary key.
    if let Some(after) = params.created_after {
        one("job_id >= {}", JobId::first_at(after).to_string());
    }
    if let Some(before) = params.created_before {
        one("job_id < {}", JobId::first_at(before).to_string());
    }
    if let Some(kind) = params.error_kind {
        one("error_kind = {}", kind.as_str().to_owned());
    }
    if let Some(text) = &params.error_contains {
        // LOWER on both sides: SQLite's LIKE ignores ASCII case and
        // PostgreSQL's does not, so neither is left to decide.
        let escaped = text.to_lowercase().replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_");
        one(
            "LOWER(COALESCE(error_message, '') || ' ' || COALESCE(last_error, '')) LIKE {} ESCAPE '\\'",
            format!("%{escaped}%"),
        );
    }
    // A job's tags and metadata are labels, each a row of `job_labels`
    // keyed by (label, job): each filter is a range of that key.
    let labelled = "job_id IN (SELECT l.job_id FROM job_labels l WHERE l.label = {})";
    if params.any_tag && params.tags.len() > 1 {
        let places = vec!["{}"; params.tags.len()].join(", ");
        let condition = format!("job_id IN (SELECT l.job_id FROM job_labels l WHERE l.label IN ({places}))");
        filters.push((condition, params.tags.iter().map(|t| tag_label(t)).collect()));
    } else {
        for tag in &params.tags {
            filters.push((labelled.to_owned(), vec![tag_label(tag)]));
        }
    }
    for (key, value) in &params.metadata {
        if let Some(label) = metadata_label(key, value) {
            filters.push((labelled.to_owned(), vec![label]));
        }
    }
    filters
}

/// The columns of an event row, in [`EventRow`](super::rules::events::EventRow)'s order after the id.
pub(crate) const EVENT_COLUMNS: &str = "at, what, job_id, plan_id, plugin_digest, plugin_name, plugin_version, \
     phase, action, status, previous, attempt, worker_id, error_kind, progress_json";

/// The statement that writes a [`Change`](super::rules::approval::Change), after the job id (1), status
/// (2), record (3) and the [`ChangeColumns`](super::rules::approval::ChangeColumns) in order (4–9); the caller
/// appends its backend's `RETURNING` list.
pub(crate) fn decision_update_sql(placeholder: char) -> String {
    let p = |n: u8| format!("{placeholder}{n}");
    format!(
        "UPDATE jobs SET status = {}, approval_json = {}, run_after = COALESCE({}, run_after), \
         expires_at = COALESCE({}, expires_at), deadline_at = {}, finished_at = {}, error_kind = {}, \
         error_message = {} WHERE job_id = {} RETURNING ",
        p(2),
        p(3),
        p(4),
        p(5),
        p(6),
        p(7),
        p(8),
        p(9),
        p(1)
    )
}

/// A list filter's SQL with the backend's placeholders in its `{}`s, in
/// order: `placeholder` gives the next one.
pub(crate) fn filter_sql(condition: &str, mut placeholder: impl FnMut() -> String) -> String {
    let mut sql = String::from(" AND ");
    let mut parts = condition.split("{}");
    sql.push_str(parts.next().unwrap_or_default());
    for part in parts {
        sql.push_str(&placeholder());
        sql.push_str(part);
    }
    sql
}

/// A job's earlier attempts, oldest first; `{}` is the job id's
/// placeholder. Columns in [`crate::store::rules::codec::AttemptRow`]'s
/// order.
pub(crate) const EARLIER_ATTEMPTS: &str = "SELECT run, worker_id, started_at, ended_at, outcome, error_kind, error, \
     fuel_used, peak_memory_bytes, logs_json, logs_cut FROM job_attempts WHERE job_id = {} ORDER BY id";

/// When the longest-waiting queued job became claimable: a walk of one
/// entry of the claim's `(run_after, job_id)` index on queued rows
/// (SQLite's; PostgreSQL's claim index leaves some queued jobs out, and
/// its store reads them in two parts).
pub(crate) const OLDEST_QUEUED_DUE: &str = "SELECT MIN(run_after) FROM jobs WHERE status = 'queued' AND paused = 0";

/// Queued jobs, held by a pause or not: each part read from its own
/// partial index (the claim's, and the parked jobs'), which `{claim}` and
/// `{parked}` name where a backend must be told (SQLite, with no table
/// statistics, would read the expiry index and the table instead).
pub(crate) const QUEUED_COUNT: &str = "SELECT (SELECT COUNT(*) FROM jobs {claim} WHERE status = 'queued' AND paused = 0) \
     + (SELECT COUNT(*) FROM jobs {parked} WHERE paused = 1 AND status = 'queued')";

/// A retry (redrive) of an ended job, with `{now}`, `{expires}` and `{id}`
/// where the backend puts their placeholders and `{false}` its false. The
/// row's attempt trigger keeps the ended attempt before this clears it.
pub(crate) const REDRIVE: &str = "UPDATE jobs SET status = 'queued', run_after = {now}, expires_at = {expires}, \
     finished_at = NULL, deadline_at = NULL, error_kind = NULL, error_message = NULL, backtrace = NULL, output = NULL, \
     last_error = NULL, progress_json = NULL, logs_json = NULL, fuel_used = NULL, peak_memory_bytes = NULL, \
     cancel_requested = {false}, retries = 0, lost_leases = 0, free_reruns = 0, process_deaths = 0 \
     WHERE job_id = {id}";
