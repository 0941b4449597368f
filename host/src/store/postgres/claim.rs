//! The PostgreSQL store's claim: which queued jobs a worker takes next,
//! and the schema the order needs.

use std::sync::LazyLock;

use deadpool_postgres::GenericClient;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use super::PostgresStore;
use super::rows::{db_err, job_columns, row_to_job};
use crate::job::millis;
use crate::store::rules::codec::corrupt;
use crate::store::sql::{ClaimPool, SlotsGiven, UNCAPPED_SUBMITTER, claimable};
use crate::store::{JobClaimParams, Lease, StoreError};

/// Priorities and pauses: the columns, the paused names, and the indexes
/// the claim walks in order (the levels present, each in due order; a
/// capped submitter's the same way), which parked jobs are not in.
pub(super) const MIGRATION: &str = r#"
-- A job's priority: 0 (claimed first) to 9 (last).
ALTER TABLE jobs ADD COLUMN priority SMALLINT NOT NULL DEFAULT 0;
-- Paused plugin names, and the queued jobs a pause parked (out of the
-- claim's indexes until their plugin is resumed).
CREATE TABLE plugin_pauses (
    name       TEXT COLLATE "C" PRIMARY KEY,
    paused_at  BIGINT NOT NULL,
    paused_by  TEXT,
    reason     TEXT
);
ALTER TABLE jobs ADD COLUMN paused SMALLINT NOT NULL DEFAULT 0;
CREATE INDEX jobs_claim_order ON jobs (priority, run_after, job_id) WHERE status = 'queued' AND paused = 0;
DROP INDEX jobs_queued_by;
CREATE INDEX jobs_queued_by ON jobs (submitted_by, priority, run_after, job_id) WHERE status = 'queued' AND paused = 0 AND submitted_by IS NOT NULL;
CREATE INDEX jobs_parked ON jobs (plugin_name) WHERE paused = 1;
DROP INDEX jobs_claim_due;
CREATE INDEX jobs_claim_due ON jobs (run_after, job_id) WHERE status = 'queued' AND paused = 0;
"#;

/// How long a read of whether any principal has a running cap is used. A
/// cap set through another replica is kept from the first claim on (the
/// uncapped claim passes its jobs over); its jobs start once this replica
/// reads it again.
const CAPS_FRESH_FOR: std::time::Duration = std::time::Duration::from_secs(1);

impl PostgresStore {
    /// Whether some principal has a running cap (read at most once per
    /// [`CAPS_FRESH_FOR`], and again after a principal changes here).
    pub(super) async fn any_capped(&self, client: &impl GenericClient) -> Result<bool, StoreError> {
        let seen = *self.inner.capped.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, capped)) = seen
            && at.elapsed() < CAPS_FRESH_FOR
        {
            return Ok(capped);
        }
        let capped: bool = client
            .query_one("SELECT EXISTS (SELECT 1 FROM principals WHERE max_running IS NOT NULL)", &[])
            .await
            .map_err(db_err("reading running caps"))?
            .get(0);
        *self.inner.capped.lock().unwrap_or_else(|e| e.into_inner()) = Some((std::time::Instant::now(), capped));
        Ok(capped)
    }

    /// Read the running caps afresh at the next claim.
    pub(super) fn caps_changed(&self) {
        *self.inner.capped.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// The claim's indexes without the limited jobs that hold no rate slot
/// (not claimable here, where slots are given before the claim): a claim
/// walking them in order no longer steps over thousands of such jobs
/// queued behind a limit. Their predicate is the one
/// [`claimable`]'s first conditions repeat.
pub(super) const SLOTTED_MIGRATION: &str = r#"
DROP INDEX jobs_claim_order;
CREATE INDEX jobs_claim_order ON jobs (priority, run_after, job_id)
    WHERE status = 'queued' AND paused = 0 AND (rate_limit IS NULL OR rate_slot IS NOT NULL);
DROP INDEX jobs_claim_due;
CREATE INDEX jobs_claim_due ON jobs (run_after, job_id)
    WHERE status = 'queued' AND paused = 0 AND (rate_limit IS NULL OR rate_slot IS NOT NULL);
DROP INDEX jobs_queued_by;
CREATE INDEX jobs_queued_by ON jobs (submitted_by, priority, run_after, job_id)
    WHERE status = 'queued' AND paused = 0 AND submitted_by IS NOT NULL AND (rate_limit IS NULL OR rate_slot IS NOT NULL);
"#;

/// Queued jobs not parked, as two disjoint parts, each read from its own
/// partial index: those the claim's indexes hold, and the limited ones
/// waiting for a slot (`jobs_rate_waiting`).
const NOT_PARKED_PARTS: [&str; 2] = [
    "status = 'queued' AND paused = 0 AND (rate_limit IS NULL OR rate_slot IS NOT NULL)",
    "status = 'queued' AND paused = 0 AND rate_limit IS NOT NULL AND rate_slot IS NULL",
];

/// How many jobs are queued, held by a pause or not.
pub(super) static QUEUED_COUNT_PARTS: LazyLock<String> = LazyLock::new(|| {
    let [slotted, waiting] = NOT_PARKED_PARTS;
    format!(
        "SELECT (SELECT COUNT(*) FROM jobs WHERE {slotted}) + (SELECT COUNT(*) FROM jobs WHERE {waiting}) \
         + (SELECT COUNT(*) FROM jobs WHERE paused = 1 AND status = 'queued')"
    )
});

/// When the longest-waiting queued job not parked became claimable.
pub(super) static OLDEST_QUEUED_DUE_PARTS: LazyLock<String> = LazyLock::new(|| {
    let [slotted, waiting] = NOT_PARKED_PARTS;
    format!(
        "SELECT LEAST((SELECT MIN(run_after) FROM jobs WHERE {slotted}), \
         (SELECT MIN(run_after) FROM jobs WHERE {waiting}))"
    )
});

/// Claim up to `params.limit` eligible jobs: queued, unexpired, due,
/// either keyless or the oldest queued job of a key with no running job,
/// and of a submitter below its running cap. Capped submitters' first,
/// then the aged share, then the rest; each by priority, then earliest
/// due, then oldest (the aged share in due order alone). Rows another
/// claimer has locked are skipped, not waited for.
///
/// The claim of uncapped jobs runs its generic plan ([`GENERIC_PLANS`]).
/// With `capped` (some principal has a running cap), `client` must be in a
/// transaction: capped submitters' jobs are claimed first, at most each
/// one's room, under a lock every replica's capped claims take in turn (a
/// count of running jobs read before another replica's claim commits would
/// overrun the cap). The rest are claimed without the lock.
pub(super) async fn claim(
    client: &impl GenericClient,
    params: &JobClaimParams,
    capped: bool,
) -> Result<Vec<Lease>, StoreError> {
    // A claimer that runs nothing takes a suspect first, and only it.
    if params.alone {
        let suspect =
            claim_from(client, ClaimPool::Suspect, &JobClaimParams { limit: 1, ..params.clone() }, capped).await?;
        if !suspect.is_empty() {
            return Ok(suspect);
        }
    }
    claim_from(client, ClaimPool::Fresh, params, capped).await
}

/// The claim's statements are prepared (cached per connection), but the
/// server plans a prepared statement afresh on each run (a custom plan for
/// its parameters) unless it judges the generic plan no costlier, and it
/// does not for the claim: measured, planning took 1.1 ms a run, more
/// than the claim's run itself (0.7 ms for 16 jobs). The generic plan is
/// the same plan (the claim indexes, walked in order: `docs/postgres.md`
/// shows it), so the claim asks for it. It is made at a connection's
/// first claim and made again when the table's statistics change (an
/// `ANALYZE`, the store's own or the server's, invalidates it), so a plan
/// made on a small table does not outlive the table's growth.
///
/// And no JIT: the generic plan, not knowing the claim's limit, is costed
/// at the whole queue's rows and passes `jit_above_cost` on a queue of
/// tens of thousands of jobs; compiling took 57 ms of a 58 ms claim
/// (measured on 20,000 queued jobs).
///
/// Set just before the claim and reset just after ([`PLANS_AS_BEFORE`]),
/// the three sent together (no round trip of their own, no transaction
/// needed): no other statement on the pooled connection is planned this
/// way. A capped claim, whose plan depends on how many principals are
/// capped, is planned as the server chooses.
const GENERIC_PLANS: &str = "SET jit = off; SET plan_cache_mode = force_generic_plan";

/// The session's own settings again, after the claim. In a transaction
/// the claim made fail, this fails too, and the transaction's rollback
/// undoes [`GENERIC_PLANS`] instead.
const PLANS_AS_BEFORE: &str = "RESET jit; RESET plan_cache_mode";

/// Turn the jobs `picked` names (locked) into running ones; `picked` has
/// each job's `share` (0: the aged share's, taken first; 1: the others),
/// returned after the job's columns.
fn claim_update(picked: &str) -> String {
    format!(
        "WITH picked AS ({picked}) \
         UPDATE jobs j SET status = 'running', worker_id = $3, \
           lease_token = replace(gen_random_uuid()::text, '-', ''), lease_expires_at = $4, \
           started_at = $1, last_heartbeat = $1, attempt = j.attempt + 1, cancel_requested = FALSE, \
           progress_json = NULL, logs_json = NULL, rate_slot = NULL \
         FROM picked WHERE j.job_id = picked.job_id RETURNING {}, picked.share",
        job_columns("j")
    )
}

/// The priorities queued jobs not parked have, lowest number first, found
/// one index probe each (a recursive walk of `jobs_claim_order`), as many
/// as the query reads.
const LEVELS: &str = "levels(p) AS ( \
       (SELECT l.priority FROM jobs l WHERE l.status = 'queued' AND l.paused = 0 \
         AND (l.rate_limit IS NULL OR l.rate_slot IS NOT NULL) ORDER BY l.priority LIMIT 1) \
       UNION ALL \
       SELECT (SELECT l.priority FROM jobs l WHERE l.status = 'queued' AND l.paused = 0 \
         AND (l.rate_limit IS NULL OR l.rate_slot IS NOT NULL) AND l.priority > levels.p \
         ORDER BY l.priority LIMIT 1) FROM levels WHERE levels.p IS NOT NULL)";

/// The claim of uncapped submitters' jobs (and those of no submitter).
///
/// Fresh jobs: first the aged share, up to `$6` jobs due at or before
/// `$5` in due order whatever their priority (a range of
/// `jobs_claim_due`), then by priority: each level a range of
/// `jobs_claim_order` bounded by `now`, so jobs due later (a delayed job,
/// a retry's backoff) are never read past, whatever their priority, and
/// parked jobs are in neither index. One statement: the share costs no
/// round trip. (A level may lock a row more than it takes, until the
/// statement's transaction ends.) Suspects (one at a time, to a lone
/// claimer) in due order alone.
fn uncapped_sql(pool: ClaimPool) -> String {
    let claimable = claimable(pool, UNCAPPED_SUBMITTER, "$1", SlotsGiven::BeforeTheClaim);
    claim_update(&match pool {
        ClaimPool::Suspect => format!(
            "SELECT q.job_id, 1 AS share FROM jobs q WHERE {claimable} ORDER BY q.run_after, q.job_id LIMIT $2 \
             FOR UPDATE SKIP LOCKED"
        ),
        ClaimPool::Fresh => format!(
            "WITH RECURSIVE {LEVELS}, \
             aged AS ( \
               SELECT q.job_id FROM jobs q WHERE {claimable} AND q.run_after <= $5 \
               ORDER BY q.run_after, q.job_id LIMIT $6 FOR UPDATE SKIP LOCKED), \
             ranked AS ( \
               SELECT c.job_id FROM levels CROSS JOIN LATERAL ( \
                 SELECT q.job_id FROM jobs q WHERE {claimable} AND q.priority = levels.p \
                   AND q.job_id NOT IN (SELECT job_id FROM aged) \
                 ORDER BY q.run_after, q.job_id LIMIT $2 FOR UPDATE SKIP LOCKED) c \
               LIMIT $2) \
             (SELECT job_id, 0 AS share FROM aged) UNION ALL (SELECT job_id, 1 FROM ranked) LIMIT $2"
        ),
    })
}

/// The claim of capped submitters' jobs: each one's first by priority and
/// due order, at most its room (its cap less its running jobs), found by
/// its own index.
fn capped_sql(pool: ClaimPool) -> String {
    claim_update(&format!(
        "SELECT l.job_id, 1 AS share FROM jobs l WHERE l.status = 'queued' AND l.job_id IN ( \
           SELECT c.job_id FROM ( \
             SELECT p.name, p.max_running - (SELECT COUNT(*) FROM jobs r WHERE r.status = 'running' \
               AND r.submitted_by = p.name) AS room FROM principals p WHERE p.max_running IS NOT NULL) s \
           CROSS JOIN LATERAL ( \
             SELECT q.job_id, q.priority, q.run_after FROM jobs q WHERE {} \
             ORDER BY q.priority, q.run_after, q.job_id LIMIT GREATEST(s.room, 0)) c \
           ORDER BY c.priority, c.run_after, c.job_id LIMIT $2) \
         FOR UPDATE SKIP LOCKED",
        claimable(pool, "q.submitted_by = s.name", "$1", SlotsGiven::BeforeTheClaim)
    ))
}

/// The lock capped claims take in turn, until their transaction ends; and
/// no JIT for the transaction: the planner cannot know that a capped
/// claim reads a few rows per capped principal, and its estimate passes
/// `jit_above_cost` (compiling took 0.9 s of a 1 s claim measured on a
/// 200,000-job queue; 0.5 ms without).
const CAPPED_CLAIMS_LOCK: &str =
    "SET LOCAL jit = off; SELECT pg_advisory_xact_lock(hashtext('leash capped claims ' || current_schema()))";

/// Claim up to `params.limit` of `pool`'s jobs: capped submitters' first
/// when `capped`, then the aged share (fresh jobs only) and the rest.
async fn claim_from(
    client: &impl GenericClient,
    pool: ClaimPool,
    params: &JobClaimParams,
    capped: bool,
) -> Result<Vec<Lease>, StoreError> {
    // Built once: these run for every claim.
    static UNCAPPED: LazyLock<[String; 2]> = LazyLock::new(|| ClaimPool::ALL.map(uncapped_sql));
    static CAPPED: LazyLock<[String; 2]> = LazyLock::new(|| ClaimPool::ALL.map(capped_sql));
    let mut leases = Vec::new();
    if capped {
        // Prepared before the lock is taken: planning is the slow part.
        let stmt = client.prepare_cached(&CAPPED[pool as usize]).await.map_err(claim_err)?;
        client.batch_execute(CAPPED_CLAIMS_LOCK).await.map_err(claim_err)?;
        leases = run_claim(client, &stmt, params, params.limit, None).await?;
    }
    let rest = params.limit.saturating_sub(leases.len() as u32);
    if rest > 0 {
        let stmt = client.prepare_cached(&UNCAPPED[pool as usize]).await.map_err(claim_err)?;
        let share =
            (pool == ClaimPool::Fresh).then(|| (params.aged_before().unix_ms(), i64::from(params.aged.min(rest))));
        // Sent together, in this order, as each is first polled: the
        // settings hold for the claim alone.
        let (generic, claimed, reset) = tokio::join!(
            client.batch_execute(GENERIC_PLANS),
            run_claim(client, &stmt, params, rest, share),
            client.batch_execute(PLANS_AS_BEFORE)
        );
        generic.map_err(claim_err)?;
        leases.extend(claimed?);
        // The jobs are claimed: a reset that fails after them (the
        // connection lost) must not lose them to an error.
        if let Err(e) = reset {
            tracing::debug!(error = %e, "could not reset the claim's plan settings");
        }
    }
    Ok(leases)
}

/// A claim statement's error: two claimers racing for one key's next job
/// is transient (the unique index refused the second; nothing changed, and
/// the next claim will do).
fn claim_err(e: tokio_postgres::Error) -> StoreError {
    let race = e.code() == Some(&SqlState::UNIQUE_VIOLATION);
    let mut error = db_err("claiming jobs")(e);
    if let StoreError::Database { transient, .. } = &mut error {
        *transient |= race;
    }
    error
}

/// Run one claim statement for up to `limit` jobs; `share` binds the
/// fresh claim's aged share (`$5`, jobs due at or before it; `$6`, how
/// many). The leases come back in claim order: the aged share's in due
/// order, then the others by priority and due order.
async fn run_claim(
    client: &impl GenericClient,
    stmt: &tokio_postgres::Statement,
    params: &JobClaimParams,
    limit: u32,
    share: Option<(i64, i64)>,
) -> Result<Vec<Lease>, StoreError> {
    let now = params.now.unix_ms();
    let expires = now.saturating_add(millis::column(params.lease_ttl));
    let limit = i64::from(limit);
    let mut binds: Vec<&(dyn ToSql + Sync)> = vec![&now, &limit, &params.worker_id, &expires];
    if let Some((before, aged)) = &share {
        binds.extend([before as &(dyn ToSql + Sync), aged]);
    }
    let rows = client.query(stmt, &binds).await.map_err(claim_err)?;
    let mut leases = rows
        .iter()
        .map(|row| {
            let job = row_to_job(row)?;
            let token =
                job.lease_token.clone().ok_or_else(|| corrupt(&job.id.to_string(), "claimed without a token"))?;
            let share: i32 = row.get(row.len() - 1);
            Ok((share, Lease { job, token }))
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    leases.sort_by_key(|(share, l)| {
        let order = if *share == 0 { 0 } else { l.job.priority };
        (*share, order, l.job.run_after, l.job.id)
    });
    Ok(leases.into_iter().map(|(_, lease)| lease).collect())
}
