//! The SQLite store's [`Sweeps`]: reclaiming expired leases
//! and dead workers' jobs, expiring queued jobs, advancing plans, retention.

use std::sync::LazyLock;

use rusqlite::{OptionalExtension, params};

use super::SqliteStore;
use super::fate::{apply_fate, attempt_effects, counters_of};
use super::jobs::insert_rows;
use super::rows::{JOB_COLUMNS, db_err, query_jobs, query_plans};
use crate::clock::Timestamp;
use crate::job::{ApprovalPolicy, Job};
use crate::store::rules::codec::{corrupt, policy_of};
use crate::store::rules::plan::apply_job;
use crate::store::rules::unfinished::{self, Counters, Death, Decision};
use crate::store::sql::{
    COUNTER_COLUMNS, DELETE_EMPTY_PLANS, NOT_HELD_BY_A_PLAN, PLAN_COLUMNS, SILENT_WORKER, expiry_message_case,
};
use crate::store::{
    JobsDeleteParams, JobsExpireParams, LeaseReclaimParams, PlansAdvanceParams, ReclaimReport, StoreError, Sweeps,
    WorkerDiedParams,
};

#[async_trait::async_trait]
impl Sweeps for SqliteStore {
    async fn lease_reclaim_expired(&self, params: LeaseReclaimParams) -> Result<ReclaimReport, StoreError> {
        let now = params.now.unix_ms();
        self.write_all_or_nothing(move |conn| {
            let err = db_err("reclaiming leases");
            let sql = format!(
                "SELECT {COUNTER_COLUMNS}, {SILENT_WORKER} FROM jobs j LEFT JOIN workers w ON w.worker_id = j.worker_id \
                 WHERE j.status = 'running' AND j.lease_expires_at <= ?1"
            );
            let expired: Vec<((String, u32, Counters), bool)> = conn
                .prepare_cached(&sql)
                .and_then(|mut s| s.query_map(params![now], |r| Ok((counters_of(r)?, r.get(11)?)))?.collect())
                .map_err(&err)?;
            let mut report = ReclaimReport::default();
            for ((id, attempt, counters), silent) in expired {
                let effects = attempt_effects(conn, &id, attempt).map_err(&err)?;
                let decision = if silent {
                    unfinished::died(&counters, effects.as_ref(), &Death::Silent, params.now)
                } else {
                    Decision { fate: unfinished::lost_lease(&counters, effects.as_ref(), params.now), died: false }
                };
                report.count(&decision.fate);
                apply_fate(conn, &id, &decision, params.queue_ttl, params.now).map_err(&err)?;
            }
            Ok(report)
        })
        .await
    }

    async fn worker_died(&self, params: WorkerDiedParams) -> Result<ReclaimReport, StoreError> {
        self.write_all_or_nothing(move |conn| {
            let err = db_err("reclaiming a dead worker's jobs");
            let sql = format!("SELECT {COUNTER_COLUMNS} FROM jobs WHERE status = 'running' AND worker_id = ?1");
            let held: Vec<(String, u32, Counters)> = conn
                .prepare_cached(&sql)
                .and_then(|mut s| s.query_map(params![params.worker_id], counters_of)?.collect())
                .map_err(&err)?;
            let death = Death::Seen { how: &params.how, stderr: &params.stderr };
            let mut report = ReclaimReport::default();
            for (id, attempt, counters) in held {
                let effects = attempt_effects(conn, &id, attempt).map_err(&err)?;
                let decision = unfinished::died(&counters, effects.as_ref(), &death, params.now);
                report.count(&decision.fate);
                apply_fate(conn, &id, &decision, params.queue_ttl, params.now).map_err(&err)?;
            }
            conn.execute(
                "UPDATE workers SET state = 'stopped', running = 0, last_heartbeat = MAX(last_heartbeat, ?2) \
                 WHERE worker_id = ?1",
                params![params.worker_id, params.now.unix_ms()],
            )
            .map_err(&err)?;
            Ok(report)
        })
        .await
    }

    async fn jobs_expire_queued(&self, params: JobsExpireParams) -> Result<u64, StoreError> {
        let now = params.now.unix_ms();
        static SQL: LazyLock<String> = LazyLock::new(|| {
            format!(
                "UPDATE jobs SET status = 'failed', finished_at = ?1, error_kind = 'expired', error_message = {} \
                 WHERE (status = 'queued' OR status = 'pending_approval' OR status = 'approved') AND expires_at <= ?1",
                expiry_message_case("jobs", "?1")
            )
        });
        self.write(move |conn| {
            let n = conn.execute(&SQL, params![now]).map_err(db_err("expiring queued jobs"))?;
            Ok(n as u64)
        })
        .await
    }

    async fn jobs_delete_expired(&self, params: JobsDeleteParams) -> Result<u64, StoreError> {
        let cutoff = params.finished_before.unix_ms();
        let events_cutoff = params.events_before.unix_ms();
        let audit_before = params.audit_before;
        self.write_all_or_nothing(move |conn| {
            let err = db_err("deleting old jobs");
            let old = format!("finished_at IS NOT NULL AND finished_at < ?1 AND {NOT_HELD_BY_A_PLAN}");
            for table in ["effects", "proposals"] {
                conn.execute(
                    &format!("DELETE FROM {table} WHERE job_id IN (SELECT job_id FROM jobs WHERE {old})"),
                    params![cutoff],
                )
                .map_err(&err)?;
            }
            let n = conn.execute(&format!("DELETE FROM jobs WHERE {old}"), params![cutoff]).map_err(&err)?;
            conn.execute(DELETE_EMPTY_PLANS, []).map_err(&err)?;
            // Events go as one prefix of the feed, up to the first event at
            // or after the cutoff (found by reading from the oldest: the
            // rows read are the rows deleted), and never the newest, so a
            // number is never given out again; the horizon remembers how far.
            let (first_kept, newest): (Option<i64>, Option<i64>) = conn
                .query_row(
                    "SELECT (SELECT seq FROM events WHERE at >= ?1 ORDER BY seq LIMIT 1), (SELECT MAX(seq) FROM events)",
                    params![events_cutoff],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .map_err(&err)?;
            let horizon = first_kept.or(newest).map(|seq| seq - 1);
            if let Some(horizon) = horizon.filter(|&h| h > 0) {
                conn.execute("DELETE FROM events WHERE seq <= ?1", params![horizon]).map_err(&err)?;
                conn.execute(
                    "INSERT INTO event_horizon (id, txn, seq) VALUES (1, 0, ?1) \
                     ON CONFLICT (id) DO UPDATE SET seq = MAX(seq, excluded.seq)",
                    params![horizon],
                )
                .map_err(&err)?;
            }
            if let Some(before) = audit_before {
                super::audit::prune(conn, before)?;
            }
            Ok(n as u64)
        })
        .await
    }

    async fn plans_advance(&self, params: PlansAdvanceParams) -> Result<Vec<Job>, StoreError> {
        self.write_all_or_nothing(move |conn| {
            let err = db_err("advancing plans");
            let sql = format!(
                "SELECT {PLAN_COLUMNS} FROM plans p WHERE apply_job_id IS NULL AND cancelled_at IS NULL \
                 AND (?1 IS NULL OR plan_id = ?1) \
                 AND EXISTS (SELECT 1 FROM jobs j WHERE j.job_id = p.execute_job_id AND j.status = 'succeeded') \
                 ORDER BY plan_id LIMIT 100"
            );
            let due = query_plans(conn, &sql, params![params.plan_id])?;
            let one = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE job_id = ?1");
            let mut created = Vec::with_capacity(due.len());
            for plan in due {
                let execute = query_jobs(conn, &one, params![plan.record.execute_job.to_string()])?
                    .pop()
                    .ok_or_else(|| corrupt(&plan.record.plan_id, "its execute job is missing"))?;
                let policy = match &execute.plugin_name {
                    Some(name) => {
                        let text: Option<Option<String>> = conn
                            .prepare_cached("SELECT approval_json FROM plugin_names WHERE name = ?1 AND version = ?2")
                            .and_then(|mut s| s.query_row(params![name.name, name.version], |r| r.get(0)).optional())
                            .map_err(&err)?;
                        policy_of(&plan.record.plan_id, text.flatten())?
                    }
                    None => ApprovalPolicy::default(),
                };
                let apply = insert_rows(conn, vec![apply_job(&plan, &execute, &policy)], params.now)?.remove(0);
                conn.prepare_cached("UPDATE plans SET apply_job_id = ?2 WHERE plan_id = ?1 AND apply_job_id IS NULL")
                    .and_then(|mut s| s.execute(params![plan.record.plan_id, apply.id.to_string()]))
                    .map_err(&err)?;
                created.push(apply);
            }
            Ok(created)
        })
        .await
    }

    async fn workers_delete_stale(&self, last_heartbeat_before: Timestamp) -> Result<u64, StoreError> {
        self.write(move |conn| {
            let n = conn
                .execute("DELETE FROM workers WHERE last_heartbeat < ?1", params![last_heartbeat_before.unix_ms()])
                .map_err(db_err("deleting old workers"))?;
            Ok(n as u64)
        })
        .await
    }
}
