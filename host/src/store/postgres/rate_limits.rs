//! The PostgreSQL store's [`RateLimits`], and the step before its claim
//! that gives due jobs naming a limit their slots (see
//! [`crate::job::rate`]).

use std::sync::LazyLock;

use deadpool_postgres::GenericClient;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use super::PostgresStore;
use super::rows::db_err;
use crate::clock::Timestamp;
use crate::job::rate::{ADMIT_PER_CLAIM, RateLimit, Reservation, reserve_together};
use crate::store::rate_limits::audited;
use crate::store::rules::audit::note;
use crate::store::sql::{RATE_LIMIT_COLUMNS, next_rate_slot, rate_admittable, rate_slots_expire};
use crate::store::{RateLimitRemoveParams, RateLimits, RateReserveParams, StoreError};

/// The migration that adds rate limits (listed in
/// [`MIGRATIONS`](super::schema::MIGRATIONS)): the limits, each bucket's
/// TAT (`NULL`: never used), a job's limit, key and slot, and the indexes
/// admission reads: the limited jobs waiting for a slot, and the slots
/// given.
pub(super) const MIGRATION: &str = r#"
CREATE TABLE rate_limits (
    name       TEXT COLLATE "C" PRIMARY KEY,
    count      INTEGER NOT NULL,
    per_ms     BIGINT NOT NULL,
    burst      INTEGER NOT NULL,
    updated_at BIGINT NOT NULL,
    updated_by TEXT
);
CREATE TABLE rate_buckets (
    limit_name TEXT COLLATE "C" NOT NULL,
    bucket     TEXT COLLATE "C" NOT NULL,
    tat_us     BIGINT,
    PRIMARY KEY (limit_name, bucket)
);
ALTER TABLE jobs ADD COLUMN rate_limit TEXT;
ALTER TABLE jobs ADD COLUMN rate_key TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN rate_slot BIGINT;
CREATE INDEX jobs_rate_waiting ON jobs (run_after, job_id) WHERE status = 'queued' AND paused = 0 AND rate_limit IS NOT NULL AND rate_slot IS NULL;
CREATE INDEX jobs_rate_slots ON jobs (rate_slot) WHERE status = 'queued' AND rate_slot IS NOT NULL;
"#;

/// The migration that lets a limit apply to outbound requests: its host
/// rules and secrets, as JSON (`NULL`: neither).
pub(super) const EGRESS_MIGRATION: &str = "ALTER TABLE rate_limits ADD COLUMN egress TEXT;";

/// How long a read of whether any limit or limited job exists is used:
/// a claim skips admission while neither does.
const LIMITED_FRESH_FOR: std::time::Duration = std::time::Duration::from_secs(1);

fn limit_of(r: &Row) -> RateLimit {
    RateLimit::from_columns(
        r.get(0),
        r.get::<_, i32>(1).max(0) as u32,
        r.get::<_, i64>(2).max(0) as u64,
        r.get::<_, i32>(3).max(0) as u32,
        Timestamp::from_unix_ms(r.get(4)),
        r.get(5),
        r.get(6),
    )
}

#[async_trait::async_trait]
impl RateLimits for PostgresStore {
    async fn rate_limit_set(&self, limit: RateLimit) -> Result<RateLimit, StoreError> {
        let err = db_err("setting a rate limit");
        let mut client = self.client("setting a rate limit").await?;
        let tx = client.transaction().await.map_err(&err)?;
        let sql = format!("SELECT {RATE_LIMIT_COLUMNS} FROM rate_limits WHERE name = $1 FOR UPDATE");
        let before = tx.query_opt(&sql, &[&limit.name]).await.map_err(&err)?.map(|r| limit_of(&r));
        tx.execute(
            "INSERT INTO rate_limits (name, count, per_ms, burst, updated_at, updated_by, egress) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (name) DO UPDATE SET count = excluded.count, \
             per_ms = excluded.per_ms, burst = excluded.burst, updated_at = excluded.updated_at, \
             updated_by = excluded.updated_by, egress = excluded.egress",
            &[
                &limit.name,
                &(limit.count as i32),
                &(limit.per_ms as i64),
                &(limit.burst as i32),
                &limit.updated_at.unix_ms(),
                &limit.updated_by,
                &limit.egress_column(),
            ],
        )
        .await
        .map_err(&err)?;
        let detail = serde_json::json!({ "before": before.as_ref().map(audited), "after": audited(&limit) });
        let row = note(limit.updated_by.clone(), "rate_limit.set", &limit.name, detail);
        super::audit::append(&tx, &row, limit.updated_at).await?;
        tx.commit().await.map_err(&err)?;
        self.limits_changed();
        Ok(limit)
    }

    async fn rate_limit_get(&self, name: &str) -> Result<Option<RateLimit>, StoreError> {
        let sql = format!("SELECT {RATE_LIMIT_COLUMNS} FROM rate_limits WHERE name = $1");
        Ok(self.read("reading a rate limit", &sql, &[&name]).await?.first().map(limit_of))
    }

    async fn rate_limits(&self) -> Result<Vec<RateLimit>, StoreError> {
        let sql = format!("SELECT {RATE_LIMIT_COLUMNS} FROM rate_limits ORDER BY name");
        Ok(self.read("reading rate limits", &sql, &[]).await?.iter().map(limit_of).collect())
    }

    async fn rate_limit_remove(&self, params: RateLimitRemoveParams) -> Result<bool, StoreError> {
        let err = db_err("removing a rate limit");
        let mut client = self.client("removing a rate limit").await?;
        let tx = client.transaction().await.map_err(&err)?;
        if tx.execute("DELETE FROM rate_limits WHERE name = $1", &[&params.name]).await.map_err(&err)? == 0 {
            return Ok(false);
        }
        tx.execute("DELETE FROM rate_buckets WHERE limit_name = $1", &[&params.name]).await.map_err(&err)?;
        let row = note(params.actor, "rate_limit.remove", &params.name, serde_json::json!({}));
        super::audit::append(&tx, &row, params.now).await?;
        tx.commit().await.map_err(&err)?;
        Ok(true)
    }

    async fn rate_reserve(&self, params: RateReserveParams) -> Result<Reservation, StoreError> {
        if params.buckets.is_empty() {
            return Ok(Reservation::At(params.now));
        }
        let err = db_err("reserving a request's rate slot");
        let (names, keys): (Vec<&str>, Vec<&str>) =
            params.buckets.iter().map(|(limit, bucket)| (limit.as_str(), bucket.as_str())).unzip();
        let mut client = self.client("reserving a request's rate slot").await?;
        let tx = client.transaction().await.map_err(&err)?;
        // The buckets of limits that exist, created unused, then locked in
        // key order (the order every other writer of buckets takes).
        let create = "INSERT INTO rate_buckets (limit_name, bucket, tat_us) \
                      SELECT b.l, b.k, NULL FROM UNNEST($1::text[], $2::text[]) AS b (l, k) \
                      WHERE EXISTS (SELECT 1 FROM rate_limits WHERE name = b.l) ORDER BY b.l, b.k \
                      ON CONFLICT (limit_name, bucket) DO NOTHING";
        let lock = "SELECT limit_name, bucket, tat_us FROM rate_buckets \
                    WHERE (limit_name, bucket) IN (SELECT * FROM UNNEST($1::text[], $2::text[])) \
                    ORDER BY limit_name, bucket FOR UPDATE";
        let read_limits = format!("SELECT {RATE_LIMIT_COLUMNS} FROM rate_limits WHERE name = ANY($1)");
        tx.execute(create, &[&names, &keys]).await.map_err(&err)?;
        let (bucket_args, limit_args): ([&(dyn ToSql + Sync); 2], [&(dyn ToSql + Sync); 1]) =
            ([&names, &keys], [&names]);
        let (locked, limits) =
            tokio::try_join!(tx.query(lock, &bucket_args), tx.query(&read_limits, &limit_args)).map_err(&err)?;
        let tats = locked.iter().filter_map(|r| Some(((r.get(0), r.get(1)), r.get::<_, Option<i64>>(2)?))).collect();
        let limits = limits.iter().map(|r| (r.get(0), limit_of(r))).collect();
        let (reservation, taken) = reserve_together(&params.buckets, &limits, &tats, params.now, params.latest);
        if !taken.is_empty() {
            let names: Vec<&str> = taken.iter().map(|((l, _), _)| l.as_str()).collect();
            let keys: Vec<&str> = taken.iter().map(|((_, k), _)| k.as_str()).collect();
            let values: Vec<i64> = taken.iter().map(|(_, tat)| *tat).collect();
            tx.execute(
                "UPDATE rate_buckets b SET tat_us = t.tat FROM UNNEST($1::text[], $2::text[], $3::int8[]) AS t (l, k, tat) \
                 WHERE b.limit_name = t.l AND b.bucket = t.k",
                &[&names, &keys, &values],
            )
            .await
            .map_err(&err)?;
        }
        tx.commit().await.map_err(&err)?;
        Ok(reservation)
    }
}

/// The statements of an admission, prepared.
pub(super) struct Admission {
    expire: tokio_postgres::Statement,
    admit: tokio_postgres::Statement,
}

impl PostgresStore {
    /// Whether a claim should give slots first: some limit exists, or some
    /// queued job names one (read at most once per
    /// [`LIMITED_FRESH_FOR`], and again after a limit is set here).
    async fn any_limited(&self, client: &impl GenericClient) -> Result<bool, StoreError> {
        let seen = *self.inner.limited.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, limited)) = seen
            && at.elapsed() < LIMITED_FRESH_FOR
        {
            return Ok(limited);
        }
        let limited: bool = client
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM rate_limits) OR EXISTS (SELECT 1 FROM jobs \
                 WHERE status = 'queued' AND paused = 0 AND rate_limit IS NOT NULL AND rate_slot IS NULL) \
                 OR EXISTS (SELECT 1 FROM jobs WHERE status = 'queued' AND rate_slot IS NOT NULL)",
                &[],
            )
            .await
            .map_err(db_err("reading rate limits"))?
            .get(0);
        *self.inner.limited.lock().unwrap_or_else(|e| e.into_inner()) = Some((std::time::Instant::now(), limited));
        Ok(limited)
    }

    /// Read whether any limit exists afresh at the next claim.
    fn limits_changed(&self) {
        *self.inner.limited.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Before a claim: drop the slots whose grace ran out, give the due
    /// jobs that name a limit and hold no slot theirs (at most
    /// [`ADMIT_PER_CLAIM`], in due order; [`ADMIT`]), and set the alarm
    /// for the earliest slot to come.
    pub(super) async fn admit_due(&self, client: &impl GenericClient, now: Timestamp) -> Result<(), StoreError> {
        match self.admission(client).await? {
            Some(admission) => self.admit_with(client, &admission, now).await,
            None => Ok(()),
        }
    }

    /// The admission's statements ([`EXPIRE`], [`ADMIT`]), prepared, or
    /// `None` while nothing is limited: with them in hand,
    /// [`Self::admit_with`] sends both at once, so a claim sent after them
    /// on the same connection runs after them.
    pub(super) async fn admission(&self, client: &impl GenericClient) -> Result<Option<Admission>, StoreError> {
        if !self.any_limited(client).await? {
            return Ok(None);
        }
        let err = db_err("giving rate-limited jobs their slots");
        let expire = client.prepare_cached(&EXPIRE).await.map_err(&err)?;
        let admit = client.prepare_cached(&ADMIT).await.map_err(&err)?;
        Ok(Some(Admission { expire, admit }))
    }

    /// Drop the slots whose grace ran out, then give slots, at `now`.
    pub(super) async fn admit_with(
        &self,
        client: &impl GenericClient,
        admission: &Admission,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let err = db_err("giving rate-limited jobs their slots");
        let (now_ms, most, now_us) = (now.unix_ms(), i64::from(ADMIT_PER_CLAIM), now.unix_ms().saturating_mul(1000));
        let expire_args: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&now_ms];
        let admit_args: [&(dyn tokio_postgres::types::ToSql + Sync); 3] = [&now_ms, &most, &now_us];
        let (expired, admitted) = tokio::join!(
            client.execute(&admission.expire, &expire_args),
            client.query_one(&admission.admit, &admit_args)
        );
        expired.map_err(&err)?;
        let row = admitted.map_err(&err)?;
        if let Some(slot) = row.get::<_, Option<i64>>(0) {
            self.inner.alarm.ring_at(Timestamp::from_unix_ms(slot), now);
        }
        Ok(())
    }
}

/// Drop the slots whose grace ran out (`$1` now in ms): their jobs are
/// given slots again by the admission sent after it.
static EXPIRE: LazyLock<String> = LazyLock::new(|| rate_slots_expire("$1::int8", "jobs"));

/// Admission as one statement (`$1` now in ms, `$2` the most jobs, `$3`
/// now in µs), sent after [`EXPIRE`]: the rule of
/// [`admit`](crate::job::rate::admit), which SQLite runs as written, in
/// closed form. A bucket's `n` candidates, in due order, start from
/// `base = max(TAT, now)`: the `i`th gets `max(now, base + i·T − (burst − 1)·T)`, rounded up to the millisecond,
/// and the TAT becomes `base + n·T`. The candidates are locked (another
/// replica's admission skips them); each bucket row is created or locked,
/// in key order, by the upsert that moves its TAT, which answers the new
/// TAT (`base` is it less `n·T`). A limit that is gone gives a slot of now.
/// Answers the earliest slot after now, given here or before.
static ADMIT: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH cand AS ({candidates} FOR UPDATE OF q SKIP LOCKED), \
         ranked AS ( \
           SELECT c.job_id, c.rate_limit, c.rate_key, c.run_after, l.burst, \
             CASE WHEN l.name IS NULL THEN NULL ELSE GREATEST(l.per_ms * 1000 / GREATEST(l.count, 1), 1) END AS t, \
             row_number() OVER (PARTITION BY c.rate_limit, c.rate_key ORDER BY c.run_after, c.job_id) - 1 AS i, \
             count(*) OVER (PARTITION BY c.rate_limit, c.rate_key) AS n \
           FROM cand c LEFT JOIN rate_limits l ON l.name = c.rate_limit), \
         buckets AS ( \
           INSERT INTO rate_buckets AS b (limit_name, bucket, tat_us) \
           SELECT DISTINCT ON (r.rate_limit, r.rate_key) r.rate_limit, r.rate_key, $3::int8 + r.n * r.t \
           FROM ranked r WHERE r.t IS NOT NULL ORDER BY r.rate_limit, r.rate_key \
           ON CONFLICT (limit_name, bucket) DO UPDATE \
             SET tat_us = GREATEST(COALESCE(b.tat_us, $3::int8), $3::int8) + (excluded.tat_us - $3::int8) \
           RETURNING b.limit_name, b.bucket, b.tat_us), \
         slots AS ( \
           SELECT r.job_id, CASE WHEN r.t IS NULL THEN $1::int8 ELSE GREATEST($1::int8, \
             (GREATEST($3::int8, k.tat_us - r.n * r.t + r.i * r.t - (r.burst - 1) * r.t) + 999) / 1000) END AS slot \
           FROM ranked r LEFT JOIN buckets k ON k.limit_name = r.rate_limit AND k.bucket = r.rate_key), \
         given AS ( \
           UPDATE jobs j SET rate_slot = s.slot, run_after = GREATEST(j.run_after, s.slot) \
           FROM slots s WHERE j.job_id = s.job_id RETURNING s.slot) \
         SELECT LEAST((SELECT MIN(slot) FROM given WHERE slot > $1::int8), ({next}))",
        candidates = rate_admittable("$1::int8", "$2::int8", "jobs q"),
        next = next_rate_slot("$1::int8", "jobs"),
    )
});
