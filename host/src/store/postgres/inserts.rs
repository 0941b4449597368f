//! Inserting jobs: the submit's own path (its statements sent together,
//! one round trip), and the chunked multi-row insert the audited submits,
//! plans, schedules and sweeps run in their own transactions.

use std::collections::HashMap;
use std::sync::LazyLock;

use deadpool_postgres::GenericClient;
use tokio_postgres::types::ToSql;

use super::BATCH;
use super::rows::{db_err, job_columns, rows_to_jobs};
use crate::clock::Timestamp;
use crate::job::{Job, JobId, NewJob, SCHEMA_VERSION, millis};
use crate::store::StoreError;
use crate::store::rules::audit::submit_note;
use crate::store::rules::codec::{
    InsertTimes, approval_to_column, corrupt, grants_to_column, labels_to_columns, target_columns, to_json,
};

/// The columns of a large insert, one array each (`unnest` turns them
/// back into rows: one statement shape whatever the count).
#[derive(Default)]
pub(super) struct InsertColumns {
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
    submitted_by: Vec<Option<String>>,
    priority: Vec<i16>,
    schedule: Vec<Option<String>>,
    tags: Vec<Option<String>>,
    metadata: Vec<Option<String>>,
    rate_limit: Vec<Option<String>>,
    rate_key: Vec<String>,
}

impl InsertColumns {
    pub(super) fn push(&mut self, job: NewJob, id: JobId, now: Timestamp) -> Result<(), StoreError> {
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
        self.backoff_base.push(millis::column(job.backoff.base));
        self.backoff_cap.push(millis::column(job.backoff.cap));
        self.grants.push(grants_to_column(&job.grants)?);
        self.free_rerun_limit.push(i32::try_from(job.free_rerun_limit).unwrap_or(i32::MAX));
        self.submitted_by.push(job.submitted_by);
        self.priority.push(i16::from(job.priority));
        self.schedule.push(job.schedule_id.map(|s| s.to_string()));
        let (tags, metadata) = labels_to_columns(&job.tags, &job.metadata)?;
        self.tags.push(tags);
        self.metadata.push(metadata);
        self.rate_limit.push(job.rate_limit);
        self.rate_key.push(job.rate_key);
        Ok(())
    }
    /// The insert's parameters, in [`INSERT`]'s order.
    fn binds<'a>(&'a self, fixed: &'a Fixed) -> [&'a (dyn ToSql + Sync); 31] {
        let c = self;
        [
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
            &fixed.schema_version,
            &fixed.now_ms,
            &c.grants,
            &c.free_rerun_limit,
            &c.status,
            &c.approval,
            &c.submitted_by,
            &c.priority,
            &c.schedule,
            &c.tags,
            &c.metadata,
            &c.rate_limit,
            &c.rate_key,
        ]
    }

    /// `jobs`, with their `ids`, in chunks of at most [`BATCH`].
    fn chunks(jobs: Vec<NewJob>, ids: &[JobId], now: Timestamp) -> Result<Vec<InsertColumns>, StoreError> {
        let mut chunks = Vec::new();
        let mut jobs = jobs.into_iter().zip(ids.iter().copied()).peekable();
        while jobs.peek().is_some() {
            let mut columns = InsertColumns::default();
            for (job, id) in jobs.by_ref().take(BATCH as usize) {
                columns.push(job, id, now)?;
            }
            chunks.push(columns);
        }
        Ok(chunks)
    }
}

/// The insert's parameters that are the same for every row.
struct Fixed {
    schema_version: i32,
    now_ms: i64,
}

impl Fixed {
    fn of(now: Timestamp) -> Self {
        Fixed { schema_version: i32::try_from(SCHEMA_VERSION).unwrap_or(i32::MAX), now_ms: now.unix_ms() }
    }
}

/// The insert's plan is one shape whatever it inserts (the arrays
/// unnested, each row written), but the server judged its generic plan,
/// costed at ten rows, dearer than a plan for the actual arrays, and
/// planned each run afresh: measured at single submits, 188 µs of planning
/// a run against 385 µs of running it. So the insert asks for its generic
/// plan, set just before it and reset just after, the three sent together
/// (no round trip of their own): the statements after it in the caller's
/// transaction are planned as before. (Were the insert refused, the reset
/// fails with it, and the rollback undoes the setting.)
const GENERIC_INSERT: &str = "SET LOCAL plan_cache_mode = force_generic_plan";

/// The caller's setting again, after the insert.
const INSERT_PLANS_AS_BEFORE: &str = "RESET plan_cache_mode";

/// The insert of the rows an [`InsertColumns`] holds. A job of a paused
/// plugin is queued parked; the pause is read `FOR SHARE`, so a resume
/// racing the insert waits for it and then clears it too (read without
/// the lock, the insert could commit parked after the resume cleared the
/// plugin's parked jobs, and hold it with no pause).
static INSERT: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT INTO jobs (job_id, plan_id, phase, action, plugin_digest, status, payload, limits_json, \
         schema_version, created_at, expires_at, max_attempts, concurrency_key, plugin_name, plugin_version, \
         idempotency_key, request_digest, run_after, deadline_at, backoff_base_ms, backoff_cap_ms, grants_json, \
         free_rerun_limit, approval_json, submitted_by, priority, paused, schedule_id, tags_json, metadata_json, rate_limit, rate_key) SELECT n.id, n.plan, n.phase, n.action, n.digest, n.status, n.payload, \
         n.limits, $19, $20, n.expires, \
         n.max_attempts, n.key, n.pname, n.pversion, n.ikey, n.rdigest, n.run_after, n.deadline, n.bbase, n.bcap, \
         n.grants, n.free, n.approval, n.submitter, n.priority, \
         CASE WHEN EXISTS (SELECT 1 FROM plugin_pauses z WHERE z.name = n.pname FOR SHARE) THEN 1 ELSE 0 END, \
         n.schedule, n.tags, n.metadata, n.rlimit, n.rkey FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bytea[], $7::text[], \
           $8::int8[], $9::int4[], $10::text[], $11::text[], $12::text[], $13::text[], $14::text[], $15::int8[], \
           $16::int8[], $17::int8[], $18::int8[], $21::text[], $22::int4[], $23::text[], $24::text[], \
           $25::text[], $26::int2[], $27::text[], $28::text[], $29::text[], $30::text[], $31::text[]) \
         AS n(id, plan, phase, action, digest, payload, limits, expires, max_attempts, key, pname, pversion, \
           ikey, rdigest, run_after, deadline, bbase, bcap, grants, free, status, approval, submitter, priority, \
           schedule, tags, metadata, rlimit, rkey) \
         RETURNING {}",
        job_columns("")
    )
});

/// Insert the jobs `columns` holds in one statement ([`INSERT`]), with
/// their labels, in the caller's transaction.
pub(super) async fn insert_rows(
    client: &impl GenericClient,
    columns: &InsertColumns,
    now: Timestamp,
) -> Result<Vec<Job>, StoreError> {
    let err = db_err("inserting jobs");
    let stmt = client.prepare_cached(&INSERT).await.map_err(&err)?;
    let fixed = Fixed::of(now);
    let binds = columns.binds(&fixed);
    // Sent together, in this order, as each is first polled: see
    // [`GENERIC_INSERT`].
    let (generic, rows, reset) = tokio::join!(
        biased;
        client.batch_execute(GENERIC_INSERT),
        client.query(&stmt, &binds),
        client.batch_execute(INSERT_PLANS_AS_BEFORE)
    );
    generic.map_err(&err)?;
    let rows = rows.map_err(&err)?;
    reset.map_err(&err)?;
    let jobs = rows_to_jobs(&rows)?;
    super::labels::insert(client, &jobs).await?;
    Ok(jobs)
}

/// Insert `jobs` in the caller's transaction, in chunks, with their submit
/// notes; answered in the given order. The caller wakes the claim loops
/// once it commits.
pub(super) async fn insert_audited(
    tx: &deadpool_postgres::Transaction<'_>,
    jobs: Vec<NewJob>,
    now: Timestamp,
) -> Result<Vec<Job>, StoreError> {
    let ids: Vec<JobId> = jobs.iter().map(|_| JobId::new(now)).collect();
    let chunks = InsertColumns::chunks(jobs, &ids, now)?;
    let mut inserted = Vec::with_capacity(ids.len());
    for columns in &chunks {
        inserted.extend(insert_rows(tx, columns, now).await?);
    }
    let inserted = in_order(ids, inserted)?;
    let notes: Vec<_> = inserted.iter().filter_map(submit_note).collect();
    super::audit::append_all(tx, &notes, now).await?;
    Ok(inserted)
}

/// A submit no principal signs for (no audit note to chain, so no
/// statement waits on another's answer), in one round trip: `BEGIN`, the
/// inserts with their generic plan (see [`GENERIC_INSERT`]), the labels
/// and `COMMIT` are all sent on this future's first poll, and
/// then their answers read. A refused statement aborts the transaction and
/// the server answers the `COMMIT` sent after it with a rollback, so the
/// connection goes back to the pool idle whatever happened, even if this
/// future is dropped once sent. Answered in the given order.
pub(super) async fn insert_unsigned(
    client: &deadpool_postgres::Object,
    jobs: Vec<NewJob>,
    now: Timestamp,
) -> Result<Vec<Job>, StoreError> {
    let err = db_err("inserting jobs");
    let ids: Vec<JobId> = jobs.iter().map(|_| JobId::new(now)).collect();
    let labels = super::labels::Columns::of(ids.iter().zip(&jobs).map(|(id, j)| (*id, &j.tags, &j.metadata)));
    let chunks = InsertColumns::chunks(jobs, &ids, now)?;
    let stmt = client.prepare_cached(&INSERT).await.map_err(&err)?;
    let labels_stmt = if labels.labels.is_empty() {
        None
    } else {
        Some(client.prepare_cached(super::labels::INSERT).await.map_err(&err)?)
    };
    let fixed = Fixed::of(now);
    let binds: Vec<_> = chunks.iter().map(|c| c.binds(&fixed)).collect();
    let (begin, generic, rows, labelled, reset, commit) = tokio::join!(
        biased;
        client.batch_execute("BEGIN"),
        client.batch_execute(GENERIC_INSERT),
        futures_util::future::join_all(binds.iter().map(|b| client.query(&stmt, b))),
        async {
            match &labels_stmt {
                Some(s) => client.execute(s, &[&labels.labels, &labels.ids]).await.map(drop),
                None => Ok(()),
            }
        },
        client.batch_execute(INSERT_PLANS_AS_BEFORE),
        client.batch_execute("COMMIT")
    );
    // The first refusal is the cause; the ones after it only say the
    // transaction had already failed.
    begin.map_err(&err)?;
    generic.map_err(&err)?;
    let mut inserted = Vec::with_capacity(ids.len());
    for rows in rows {
        inserted.extend(rows_to_jobs(&rows.map_err(&err)?)?);
    }
    labelled.map_err(&err)?;
    reset.map_err(&err)?;
    commit.map_err(&err)?;
    in_order(ids, inserted)
}

/// `jobs`, as inserted, in the order of `ids`.
fn in_order(ids: Vec<JobId>, jobs: Vec<Job>) -> Result<Vec<Job>, StoreError> {
    let mut by_id: HashMap<JobId, Job> = jobs.into_iter().map(|j| (j.id, j)).collect();
    ids.into_iter()
        .map(|id| by_id.remove(&id).ok_or_else(|| corrupt(&id.to_string(), "inserted but not returned")))
        .collect()
}

/// The stored job, if any, that already has one of these idempotency
/// keys, as the error an insert reports (the first key in submit order).
pub(super) async fn idempotency_conflict(
    client: &impl GenericClient,
    jobs: &[NewJob],
) -> Result<Option<StoreError>, StoreError> {
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
