//! The SQLite store's [`RateLimits`], and what its claim does for a picked
//! job naming a limit: give it its slot, and claim it if the slot is now
//! or keep it waiting for it (see [`crate::job::rate`]).

use std::collections::HashMap;
use std::sync::LazyLock;

use rusqlite::{Connection, OptionalExtension, params};

use super::SqliteStore;
use super::rows::db_err;
use crate::clock::Timestamp;
use crate::job::JobId;
use crate::job::rate::{Candidate, RateLimit, Reservation, admit, reserve_together};
use crate::store::rate_limits::audited;
use crate::store::rules::audit::note;
use crate::store::sql::{RATE_LIMIT_COLUMNS, next_rate_slot, rate_slots_expire};
use crate::store::{RateLimitRemoveParams, RateLimits, RateReserveParams, StoreError};

/// The migration that adds rate limits (listed in
/// [`MIGRATIONS`](super::migrations::MIGRATIONS)): the limits, each
/// bucket's TAT, a job's limit, key and slot, and the slots given, by
/// time.
pub(super) const MIGRATION: &str = r#"
CREATE TABLE rate_limits (
    name       TEXT PRIMARY KEY,
    count      INTEGER NOT NULL,
    per_ms     INTEGER NOT NULL,
    burst      INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    updated_by TEXT
);
CREATE TABLE rate_buckets (
    limit_name TEXT NOT NULL,
    bucket     TEXT NOT NULL,
    tat_us     INTEGER NOT NULL,
    PRIMARY KEY (limit_name, bucket)
) WITHOUT ROWID;
ALTER TABLE jobs ADD COLUMN rate_limit TEXT;
ALTER TABLE jobs ADD COLUMN rate_key TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN rate_slot INTEGER;
CREATE INDEX jobs_rate_slots ON jobs (rate_slot) WHERE status = 'queued' AND rate_slot IS NOT NULL;
"#;

/// The migration that lets a limit apply to outbound requests: its host
/// rules and secrets, as JSON (`NULL`: neither).
pub(super) const EGRESS_MIGRATION: &str = "ALTER TABLE rate_limits ADD COLUMN egress TEXT;";

fn limit_of(r: &rusqlite::Row<'_>) -> rusqlite::Result<RateLimit> {
    Ok(RateLimit::from_columns(
        r.get(0)?,
        r.get(1)?,
        r.get::<_, i64>(2)? as u64,
        r.get(3)?,
        Timestamp::from_unix_ms(r.get(4)?),
        r.get(5)?,
        r.get(6)?,
    ))
}

fn read_limit(conn: &Connection, name: &str) -> Result<Option<RateLimit>, StoreError> {
    static SQL: LazyLock<String> =
        LazyLock::new(|| format!("SELECT {RATE_LIMIT_COLUMNS} FROM rate_limits WHERE name = ?1"));
    conn.prepare_cached(&SQL)
        .and_then(|mut s| s.query_row(params![name], limit_of).optional())
        .map_err(db_err("reading a rate limit"))
}

#[async_trait::async_trait]
impl RateLimits for SqliteStore {
    async fn rate_limit_set(&self, limit: RateLimit) -> Result<RateLimit, StoreError> {
        self.write_all_or_nothing(move |conn| {
            let before = read_limit(conn, &limit.name)?;
            conn.execute(
                "INSERT INTO rate_limits (name, count, per_ms, burst, updated_at, updated_by, egress) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (name) DO UPDATE SET count = excluded.count, \
                 per_ms = excluded.per_ms, burst = excluded.burst, updated_at = excluded.updated_at, \
                 updated_by = excluded.updated_by, egress = excluded.egress",
                params![
                    limit.name,
                    limit.count,
                    limit.per_ms as i64,
                    limit.burst,
                    limit.updated_at.unix_ms(),
                    limit.updated_by,
                    limit.egress_column()
                ],
            )
            .map_err(db_err("setting a rate limit"))?;
            let detail = serde_json::json!({ "before": before.as_ref().map(audited), "after": audited(&limit) });
            let row = note(limit.updated_by.clone(), "rate_limit.set", &limit.name, detail);
            super::audit::append(conn, &row, limit.updated_at)?;
            Ok(limit)
        })
        .await
    }

    async fn rate_limit_get(&self, name: &str) -> Result<Option<RateLimit>, StoreError> {
        let name = name.to_owned();
        self.read(move |conn| read_limit(conn, &name)).await
    }

    async fn rate_limits(&self) -> Result<Vec<RateLimit>, StoreError> {
        self.read(|conn| {
            let sql = format!("SELECT {RATE_LIMIT_COLUMNS} FROM rate_limits ORDER BY name");
            conn.prepare_cached(&sql)
                .and_then(|mut s| s.query_map([], limit_of)?.collect())
                .map_err(db_err("reading rate limits"))
        })
        .await
    }

    async fn rate_limit_remove(&self, params: RateLimitRemoveParams) -> Result<bool, StoreError> {
        self.write_all_or_nothing(move |conn| {
            let err = db_err("removing a rate limit");
            if conn.execute("DELETE FROM rate_limits WHERE name = ?1", params![params.name]).map_err(&err)? == 0 {
                return Ok(false);
            }
            conn.execute("DELETE FROM rate_buckets WHERE limit_name = ?1", params![params.name]).map_err(&err)?;
            let row = note(params.actor, "rate_limit.remove", &params.name, serde_json::json!({}));
            super::audit::append(conn, &row, params.now)?;
            Ok(true)
        })
        .await
    }

    async fn rate_reserve(&self, params: RateReserveParams) -> Result<Reservation, StoreError> {
        if params.buckets.is_empty() {
            return Ok(Reservation::At(params.now));
        }
        self.write_all_or_nothing(move |conn| {
            let mut limits = HashMap::new();
            let mut tats = HashMap::new();
            for bucket in &params.buckets {
                if !limits.contains_key(&bucket.0)
                    && let Some(limit) = read_limit(conn, &bucket.0)?
                {
                    limits.insert(bucket.0.clone(), limit);
                }
                if let Some(tat) = read_tat(conn, bucket)? {
                    tats.insert(bucket.clone(), tat);
                }
            }
            let (reservation, taken) = reserve_together(&params.buckets, &limits, &tats, params.now, params.latest);
            put_tats(conn, &taken)?;
            Ok(reservation)
        })
        .await
    }
}

/// A bucket's TAT (`None`: never used).
fn read_tat(conn: &Connection, (limit, bucket): &(String, String)) -> Result<Option<i64>, StoreError> {
    conn.prepare_cached("SELECT tat_us FROM rate_buckets WHERE limit_name = ?1 AND bucket = ?2")
        .and_then(|mut s| s.query_row(params![limit, bucket], |r| r.get::<_, i64>(0)).optional())
        .map_err(db_err("reading a rate bucket"))
}

/// Store buckets' TATs.
fn put_tats(conn: &Connection, tats: &[((String, String), i64)]) -> Result<(), StoreError> {
    let err = db_err("moving a rate bucket");
    let mut put = conn
        .prepare_cached(
            "INSERT INTO rate_buckets (limit_name, bucket, tat_us) VALUES (?1, ?2, ?3) \
             ON CONFLICT (limit_name, bucket) DO UPDATE SET tat_us = excluded.tat_us",
        )
        .map_err(&err)?;
    for ((limit, key), tat) in tats {
        put.execute(params![limit, key, tat]).map_err(&err)?;
    }
    Ok(())
}

/// Drop the slots whose grace ran out (their jobs are given slots again
/// when a claim next picks them), in the claim's write.
pub(super) fn expire_slots(conn: &Connection, now: Timestamp) -> Result<(), StoreError> {
    static EXPIRE: LazyLock<String> = LazyLock::new(|| rate_slots_expire("?1", "jobs INDEXED BY jobs_rate_slots"));
    conn.prepare_cached(&EXPIRE)
        .and_then(|mut s| s.execute(params![now.unix_ms()]))
        .map_err(db_err("giving rate-limited jobs their slots"))?;
    Ok(())
}

/// The slots of `candidates` (picked by a claim, in its order, each naming
/// a limit and holding no slot), their buckets' TATs moved in the claim's
/// write: a slot of now is claimed at once, a later one waits.
pub(super) fn slots_for(
    conn: &Connection,
    candidates: &[Candidate<JobId>],
    now: Timestamp,
) -> Result<Vec<(JobId, Timestamp)>, StoreError> {
    let mut limits = HashMap::new();
    let mut tats = HashMap::new();
    for c in candidates {
        if !limits.contains_key(&c.limit)
            && let Some(limit) = read_limit(conn, &c.limit)?
        {
            limits.insert(c.limit.clone(), limit);
        }
        let bucket = (c.limit.clone(), c.key.clone());
        if !tats.contains_key(&bucket)
            && let Some(tat) = read_tat(conn, &bucket)?
        {
            tats.insert(bucket, tat);
        }
    }
    let admission = admit(candidates, &limits, tats, now);
    put_tats(conn, &admission.buckets)?;
    Ok(admission.slots)
}

/// Keep a picked job waiting for its slot: queued, due then.
pub(super) fn wait_for_slot(conn: &Connection, id: JobId, slot: Timestamp) -> Result<(), StoreError> {
    conn.prepare_cached("UPDATE jobs SET rate_slot = ?1, run_after = MAX(run_after, ?1) WHERE job_id = ?2")
        .and_then(|mut s| s.execute(params![slot.unix_ms(), id.to_string()]))
        .map_err(db_err("giving rate-limited jobs their slots"))?;
    Ok(())
}

/// The earliest slot a queued job holds after `now`.
pub(super) fn next_slot(conn: &Connection, now: Timestamp) -> Result<Option<Timestamp>, StoreError> {
    static NEXT: LazyLock<String> = LazyLock::new(|| next_rate_slot("?1", "jobs INDEXED BY jobs_rate_slots"));
    let next: Option<i64> = conn
        .prepare_cached(&NEXT)
        .and_then(|mut s| s.query_row(params![now.unix_ms()], |r| r.get(0)))
        .map_err(db_err("giving rate-limited jobs their slots"))?;
    Ok(next.map(Timestamp::from_unix_ms))
}
