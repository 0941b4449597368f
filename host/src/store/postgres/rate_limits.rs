//! The PostgreSQL store's [`RateLimits`], and the step before its claim
//! that gives due jobs naming a limit their slots (see
//! [`crate::job::rate`]).

use std::collections::HashMap;
use std::sync::LazyLock;

use deadpool_postgres::GenericClient;
use tokio_postgres::Row;

use super::PostgresStore;
use super::rows::db_err;
use crate::clock::Timestamp;
use crate::job::rate::{ADMIT_PER_CLAIM, Candidate, RateLimit, admit};
use crate::store::rules::audit::note;
use crate::store::sql::{RATE_LIMIT_COLUMNS, next_rate_slot, rate_admittable};
use crate::store::{RateLimitRemoveParams, RateLimits, StoreError};

/// The migration that adds rate limits (listed in
/// [`MIGRATIONS`](super::schema::MIGRATIONS)): the limits, each bucket's
/// TAT (`NULL`: never used), a job's limit, key and slot, and the index
/// admission reads due limited jobs by.
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
CREATE INDEX jobs_rate_due ON jobs (run_after, job_id) WHERE status = 'queued' AND paused = 0 AND rate_limit IS NOT NULL;
"#;

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
            "INSERT INTO rate_limits (name, count, per_ms, burst, updated_at, updated_by) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (name) DO UPDATE SET count = excluded.count, \
             per_ms = excluded.per_ms, burst = excluded.burst, updated_at = excluded.updated_at, \
             updated_by = excluded.updated_by",
            &[
                &limit.name,
                &(limit.count as i32),
                &(limit.per_ms as i64),
                &(limit.burst as i32),
                &limit.updated_at.unix_ms(),
                &limit.updated_by,
            ],
        )
        .await
        .map_err(&err)?;
        let detail = serde_json::json!({
            "before": before.map(|b| serde_json::json!({ "rate": b.rate, "burst": b.burst })),
            "after": { "rate": limit.rate, "burst": limit.burst },
        });
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
                 WHERE status = 'queued' AND paused = 0 AND rate_limit IS NOT NULL)",
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

    /// Before a claim: give the due jobs that name a limit and hold no live
    /// reservation their slots (at most [`ADMIT_PER_CLAIM`], in claim
    /// order), in a transaction of its own, and set the alarm for the
    /// earliest slot to come. The jobs are locked (another replica's
    /// admission skips them) and each bucket is locked in key order (two
    /// replicas' admissions of one bucket take turns).
    pub(super) async fn admit_due(
        &self,
        client: &mut deadpool_postgres::Object,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        static CANDIDATES: LazyLock<String> =
            LazyLock::new(|| format!("{} FOR UPDATE OF q SKIP LOCKED", rate_admittable("$1", "$2")));
        static NEXT: LazyLock<String> = LazyLock::new(|| next_rate_slot("$1"));
        if !self.any_limited(&*client).await? {
            return Ok(());
        }
        let err = db_err("giving rate-limited jobs their slots");
        let tx = client.transaction().await.map_err(&err)?;
        let rows = tx.query(&*CANDIDATES, &[&now.unix_ms(), &i64::from(ADMIT_PER_CLAIM)]).await.map_err(&err)?;
        let candidates: Vec<Candidate<String>> =
            rows.iter().map(|r| Candidate { id: r.get(0), limit: r.get(1), key: r.get(2) }).collect();
        if !candidates.is_empty() {
            let mut names: Vec<&str> = candidates.iter().map(|c| c.limit.as_str()).collect();
            names.sort_unstable();
            names.dedup();
            let sql = format!("SELECT {RATE_LIMIT_COLUMNS} FROM rate_limits WHERE name = ANY($1)");
            let limits: HashMap<String, RateLimit> =
                tx.query(&sql, &[&names]).await.map_err(&err)?.iter().map(|r| (r.get(0), limit_of(r))).collect();
            let mut buckets: Vec<(&str, &str)> = candidates
                .iter()
                .filter(|c| limits.contains_key(&c.limit))
                .map(|c| (c.limit.as_str(), c.key.as_str()))
                .collect();
            buckets.sort_unstable();
            buckets.dedup();
            // One statement creates the missing buckets and locks them all,
            // in key order, returning each one's TAT.
            let (bucket_limits, bucket_keys): (Vec<&str>, Vec<&str>) = buckets.into_iter().unzip();
            let tats: HashMap<(String, String), i64> = tx
                .query(
                    "INSERT INTO rate_buckets (limit_name, bucket) \
                     SELECT n.l, n.k FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS n(l, k, o) ORDER BY n.o \
                     ON CONFLICT (limit_name, bucket) DO UPDATE SET tat_us = rate_buckets.tat_us \
                     RETURNING limit_name, bucket, tat_us",
                    &[&bucket_limits, &bucket_keys],
                )
                .await
                .map_err(&err)?
                .iter()
                .filter_map(|r| Some(((r.get(0), r.get(1)), r.get::<_, Option<i64>>(2)?)))
                .collect();
            let admission = admit(&candidates, &limits, tats, now);
            let mut l = Vec::new();
            let mut k = Vec::new();
            let mut t = Vec::new();
            for ((limit, key), tat) in &admission.buckets {
                l.push(limit.as_str());
                k.push(key.as_str());
                t.push(*tat);
            }
            tx.execute(
                "UPDATE rate_buckets b SET tat_us = n.t FROM unnest($1::text[], $2::text[], $3::int8[]) AS n(l, k, t) \
                 WHERE b.limit_name = n.l AND b.bucket = n.k",
                &[&l, &k, &t],
            )
            .await
            .map_err(&err)?;
            let (ids, slots): (Vec<&str>, Vec<i64>) =
                admission.slots.iter().map(|(id, at)| (id.as_str(), at.unix_ms())).unzip();
            tx.execute(
                "UPDATE jobs j SET rate_slot = n.s, run_after = GREATEST(j.run_after, n.s) \
                 FROM unnest($1::text[], $2::int8[]) AS n(id, s) WHERE j.job_id = n.id",
                &[&ids, &slots],
            )
            .await
            .map_err(&err)?;
        }
        let next: Option<i64> = tx.query_one(&*NEXT, &[&now.unix_ms()]).await.map_err(&err)?.get(0);
        tx.commit().await.map_err(&err)?;
        if let Some(slot) = next {
            self.inner.alarm.ring_at(Timestamp::from_unix_ms(slot), now);
        }
        Ok(())
    }
}
