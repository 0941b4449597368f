//! The SQLite store's claim: which queued jobs a worker takes next, and
//! the schema the order needs.

use std::collections::HashMap;
use std::sync::LazyLock;

use rusqlite::{Connection, OptionalExtension, params};

use super::rows::{JOB_COLUMNS, db_err, query_jobs};
use crate::clock::Timestamp;
use crate::job::millis;
use crate::job::rate::Candidate;
use crate::job::{Job, JobId, JobStatus};
use crate::store::rules::codec::corrupt;
use crate::store::sql::{ClaimPool, SlotsGiven, UNCAPPED_SUBMITTER, claimable};
use crate::store::{JobClaimParams, Lease, StoreError};

/// Priorities and pauses: the columns, the paused names, and the indexes
/// the claim walks in order (the levels present, each in due order; a
/// capped submitter's the same way), which parked jobs are not in.
pub(super) const MIGRATION: &str = r#"
-- A job's priority: 0 (claimed first) to 9 (last).
ALTER TABLE jobs ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
-- Paused plugin names, and the queued jobs a pause parked (out of the
-- claim's indexes until their plugin is resumed).
CREATE TABLE plugin_pauses (
    name       TEXT PRIMARY KEY,
    paused_at  INTEGER NOT NULL,
    paused_by  TEXT,
    reason     TEXT
);
ALTER TABLE jobs ADD COLUMN paused INTEGER NOT NULL DEFAULT 0;
CREATE INDEX jobs_claim_order ON jobs (priority, run_after, job_id) WHERE status = 'queued' AND paused = 0;
DROP INDEX jobs_queued_by;
CREATE INDEX jobs_queued_by ON jobs (submitted_by, priority, run_after, job_id) WHERE status = 'queued' AND paused = 0 AND submitted_by IS NOT NULL;
CREATE INDEX jobs_parked ON jobs (plugin_name) WHERE paused = 1;
DROP INDEX jobs_claim_due;
CREATE INDEX jobs_claim_due ON jobs (run_after, job_id) WHERE status = 'queued' AND paused = 0;
"#;

/// Claim up to `params.limit` eligible jobs (a picked job naming a rate
/// limit with no slot is given one first, and waits if it is later):
/// queued, unexpired, due
/// (`run_after` at or before `now`, which is never before its creation: a
/// claim never starts a job younger than itself), either keyless or the
/// oldest queued job of a key that has no running job, and of a submitter
/// below its running cap. Jobs holding a live rate slot that has come are
/// taken first (earliest slot first), then capped submitters' (at most
/// each one's room under its cap), then the aged share, then the rest;
/// each by priority, then earliest due, then oldest (the aged share in
/// due order alone).
///
/// Reads of the candidates, then one single-row update each: cheaper for
/// SQLite than one `UPDATE … WHERE job_id IN (…) RETURNING …`, which builds
/// two temporary b-trees per call. Nothing can change between the two: the
/// writer holds the write transaction, so a cap is never overrun.
pub(super) fn claim(conn: &Connection, params: JobClaimParams) -> Result<Claimed, StoreError> {
    super::rate_limits::expire_slots(conn, params.now)?;
    let leases = take_due(conn, params.clone())?;
    Ok(Claimed { leases, next_slot: super::rate_limits::next_slot(conn, params.now)? })
}

/// What a claim took, and the earliest rate slot still to come (when to
/// look again).
#[derive(Debug, Default)]
pub(super) struct Claimed {
    pub(super) leases: Vec<Lease>,
    pub(super) next_slot: Option<Timestamp>,
}

/// The claim proper: a picked job naming a rate limit with no slot is
/// given one, and claimed if it is now or kept waiting for it; the claim's
/// last step picks again (a few times) for the room such jobs left.
fn take_due(conn: &Connection, params: JobClaimParams) -> Result<Vec<Lease>, StoreError> {
    let now = params.now.unix_ms();
    let mut leases = Vec::new();
    // A claimer that runs nothing takes a suspect first, and only it.
    if params.alone {
        let mut suspect = pick_capped(conn, ClaimPool::Suspect, now, 1)?;
        if suspect.is_empty() {
            suspect = pick_suspect(conn, now)?;
        }
        take(conn, &params, suspect, &mut leases)?;
        if !leases.is_empty() {
            return Ok(leases);
        }
    }
    // A job holding a live rate slot that has come goes first, whatever
    // its priority: the slot was promised to it, and a job not yet given
    // one (an older one, say) would only get a later one.
    take(conn, &params, pick_slotted(conn, now, params.limit)?, &mut leases)?;
    let room = params.limit - leases.len() as u32;
    take(conn, &params, pick_capped(conn, ClaimPool::Fresh, now, room)?, &mut leases)?;
    let aged = params.aged.min(params.limit - leases.len() as u32);
    if aged > 0 {
        take(conn, &params, pick_aged(conn, now, params.aged_before(), aged)?, &mut leases)?;
    }
    for _ in 0..PICKS_PAST_WAITING_JOBS {
        let rest = params.limit - leases.len() as u32;
        if rest == 0 || take(conn, &params, pick_by_priority(conn, now, rest)?, &mut leases)? == 0 {
            break;
        }
    }
    Ok(leases)
}

/// How many times a claim picks again for room left by picked jobs that
/// must wait for their rate slots (each time, those jobs are no longer
/// due).
const PICKS_PAST_WAITING_JOBS: usize = 4;

/// Lease each of `candidates` to the claimer, but for a job naming a rate
/// limit whose slot, given now, is later: it waits for it. Answers how
/// many waited.
fn take(
    conn: &Connection,
    params: &JobClaimParams,
    candidates: Vec<Job>,
    leases: &mut Vec<Lease>,
) -> Result<usize, StoreError> {
    let now = params.now.unix_ms();
    let expires = now + millis::column(params.lease_ttl);
    let unslotted: Vec<Candidate<JobId>> = candidates
        .iter()
        .filter(|j| j.rate_slot.is_none())
        .filter_map(|j| Some(Candidate { id: j.id, limit: j.rate_limit.clone()?, key: j.rate_key.clone() }))
        .collect();
    let later: HashMap<JobId, Timestamp> = if unslotted.is_empty() {
        HashMap::new()
    } else {
        let slots = super::rate_limits::slots_for(conn, &unslotted, params.now)?;
        slots.into_iter().filter(|(_, slot)| slot.unix_ms() > now).collect()
    };
    let mut update = conn.prepare_cached(CLAIM_ONE).map_err(db_err("claiming a job"))?;
    for mut job in candidates {
        if let Some(slot) = later.get(&job.id) {
            super::rate_limits::wait_for_slot(conn, job.id, *slot)?;
            continue;
        }
        let token = lease_token();
        let changed = update
            .execute(params![params.worker_id, token, expires, now, job.id.to_string()])
            .map_err(db_err("claiming a job"))?;
        if changed != 1 {
            return Err(corrupt(&job.id.to_string(), "a queued candidate could not be claimed"));
        }
        job.status = JobStatus::Running;
        job.worker_id = Some(params.worker_id.clone());
        job.lease_token = Some(token.clone());
        job.lease_expires_at = Some(Timestamp::from_unix_ms(expires));
        job.started_at = Some(params.now);
        job.last_heartbeat = Some(params.now);
        job.attempt += 1;
        job.cancel_requested = false;
        job.progress = None;
        job.rate_slot = None;
        leases.push(Lease { job, token });
    }
    Ok(later.len())
}

/// Up to `limit` jobs of uncapped submitters holding a live rate slot that
/// has come, earliest slot first: a range of `jobs_rate_slots`.
fn pick_slotted(conn: &Connection, now: i64, limit: u32) -> Result<Vec<Job>, StoreError> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT {JOB_COLUMNS} FROM jobs q INDEXED BY jobs_rate_slots WHERE {} \
             AND q.rate_slot IS NOT NULL AND q.rate_slot <= ?1 ORDER BY q.rate_slot, q.job_id LIMIT ?2",
            claimable(ClaimPool::Fresh, UNCAPPED_SUBMITTER, "?1", SlotsGiven::AsPicked)
        )
    });
    query_jobs(conn, &SQL, params![now, limit])
}

/// The suspect (a job a process died under) of an uncapped submitter due
/// longest, whatever its priority: a lone claimer runs it by itself.
fn pick_suspect(conn: &Connection, now: i64) -> Result<Vec<Job>, StoreError> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT {JOB_COLUMNS} FROM jobs q WHERE {} ORDER BY q.run_after, q.job_id LIMIT 1",
            claimable(ClaimPool::Suspect, UNCAPPED_SUBMITTER, "?1", SlotsGiven::AsPicked)
        )
    });
    query_jobs(conn, &SQL, params![now])
}

/// Up to `limit` jobs of `pool` of capped submitters, each within its
/// room.
fn pick_capped(conn: &Connection, pool: ClaimPool, now: i64, limit: u32) -> Result<Vec<Job>, StoreError> {
    static SQL: LazyLock<[String; 2]> = LazyLock::new(|| {
        ClaimPool::ALL.map(|pool| {
            format!(
                "SELECT {JOB_COLUMNS} FROM jobs q WHERE {} ORDER BY q.priority, q.run_after, q.job_id LIMIT ?2",
                claimable(pool, "q.submitted_by = ?3", "?1", SlotsGiven::AsPicked)
            )
        })
    });
    let err = db_err("claiming jobs");
    let rooms: Vec<(String, i64)> = conn
        .prepare_cached(
            "SELECT p.name, p.max_running - (SELECT COUNT(*) FROM jobs r WHERE r.status = 'running' \
             AND r.submitted_by = p.name) FROM principals p WHERE p.max_running IS NOT NULL \
             AND EXISTS (SELECT 1 FROM jobs q WHERE q.status = 'queued' AND q.paused = 0 AND q.submitted_by = p.name)",
        )
        .and_then(|mut s| s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
        .map_err(&err)?;
    let mut jobs = Vec::new();
    for (name, room) in rooms.into_iter().filter(|(_, room)| *room > 0) {
        jobs.extend(query_jobs(conn, &SQL[pool as usize], params![now, room.min(i64::from(limit)), name])?);
    }
    jobs.sort_by_key(|j| (j.priority, j.run_after, j.id));
    jobs.truncate(limit as usize);
    Ok(jobs)
}

/// Up to `limit` aged jobs (due at or before `aged_before`) of uncapped
/// submitters, due longest first, whatever their priority: a range of
/// `jobs_claim_due`, which parked jobs are not in.
fn pick_aged(conn: &Connection, now: i64, aged_before: Timestamp, limit: u32) -> Result<Vec<Job>, StoreError> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT {JOB_COLUMNS} FROM jobs q WHERE {} AND q.run_after <= ?3 ORDER BY q.run_after, q.job_id LIMIT ?2",
            claimable(ClaimPool::Fresh, UNCAPPED_SUBMITTER, "?1", SlotsGiven::AsPicked)
        )
    });
    query_jobs(conn, &SQL, params![now, limit, aged_before.unix_ms()])
}

/// Up to `limit` jobs of uncapped submitters by priority, then due order.
/// The priorities present are visited in turn, each read as a range of
/// `jobs_claim_order` bounded by `now`: jobs due later (a delayed job, a
/// retry's backoff) are never read past, whatever their priority, and
/// parked jobs are not in the index at all.
fn pick_by_priority(conn: &Connection, now: i64, limit: u32) -> Result<Vec<Job>, StoreError> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT {JOB_COLUMNS} FROM jobs q WHERE {} AND q.priority = ?3 \
             ORDER BY q.run_after, q.job_id LIMIT ?2",
            claimable(ClaimPool::Fresh, UNCAPPED_SUBMITTER, "?1", SlotsGiven::AsPicked)
        )
    });
    let mut jobs = Vec::new();
    let mut level = next_level(conn, -1)?;
    while let Some(priority) = level {
        let rest = limit as usize - jobs.len();
        jobs.extend(query_jobs(conn, &SQL, params![now, rest as i64, priority])?);
        if jobs.len() == limit as usize {
            break;
        }
        level = next_level(conn, priority)?;
    }
    Ok(jobs)
}

/// The next priority after `after` (-1: the first) that queued jobs not
/// parked have: one probe of `jobs_claim_order`.
fn next_level(conn: &Connection, after: i64) -> Result<Option<i64>, StoreError> {
    conn.prepare_cached(
        "SELECT priority FROM jobs WHERE status = 'queued' AND paused = 0 AND priority > ?1 ORDER BY priority LIMIT 1",
    )
    .and_then(|mut s| s.query_row(params![after], |r| r.get(0)).optional())
    .map_err(db_err("claiming jobs"))
}

/// The claim of one candidate. `OR FAIL` (and triggers that call no
/// function) spare it a statement journal: SQLite copies every page a
/// statement touches into one first when the statement writes more than one
/// row (the event triggers do) and may fail with `ABORT` halfway. This one
/// changes a single row after all of its checks, and its triggers' inserts
/// cannot fail a constraint, so there is nothing a journal would undo.
pub(super) const CLAIM_ONE: &str = "UPDATE OR FAIL jobs SET status = 'running', worker_id = ?1, lease_token = ?2, \
     lease_expires_at = ?3, started_at = ?4, last_heartbeat = ?4, attempt = attempt + 1, cancel_requested = 0, \
     progress_json = NULL, logs_json = NULL, rate_slot = NULL \
     WHERE job_id = ?5 AND status = 'queued'";

/// A fresh lease token: 128 random bits, lower-case hex.
pub(super) fn lease_token() -> String {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("the OS random source is available");
    hex::encode(bytes)
}
