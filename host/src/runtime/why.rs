//! "Why is this job where it is": one sentence and its evidence, read
//! from the store (`leash jobs why`, `GET /v1/jobs/{id}/why`).
//!
//! [`explain`] is a pure function of the job and the few facts around it
//! ([`Around`]); [`Runtime::why`] reads them. What it says of a queued job
//! is the first of these that holds, the order the claim checks them in:
//! its plugin is paused; it waits for its rate limit's slot; it is not due
//! yet (a delayed submit, a retry's backoff); a job of its concurrency key
//! is running; else it waits its turn: how many due jobs a claim takes
//! before it, and how busy the workers are.

use std::time::Duration;

use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::clock::{Timestamp, human_duration};
use crate::job::{Approval, GateSource, Job, JobId, JobStatus, WorkerState};
use crate::runtime::{Runtime, RuntimeError, WorkerView};
use crate::store::{JobListParams, PluginPause};

/// Why a job is where it is.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Why {
    /// The job.
    #[schema(value_type = String)]
    pub job_id: JobId,
    /// Its status.
    pub status: JobStatus,
    /// One word for what holds it (or how it ended): `paused`,
    /// `not_due`, `backoff`, `rate_limited`, `concurrency_key`,
    /// `waiting_turn`, `no_workers`, `pending_approval`, `approved`,
    /// `running`, `lease_expired`, `succeeded`, `failed`, `cancelled`.
    pub reason: &'static str,
    /// The answer in one sentence.
    pub sentence: String,
    /// The facts the sentence is made of, by name.
    #[schema(value_type = Object)]
    pub evidence: Map<String, Value>,
}

/// What the store knows around a job, for [`explain`].
#[derive(Debug, Clone, Default)]
pub struct Around {
    /// The pause on its plugin name, if there is one.
    pub pause: Option<PluginPause>,
    /// A running job of its concurrency key, other than itself.
    pub key_holder: Option<JobId>,
    /// The pool's figures; `None` when the reader may not see them (the
    /// HTTP API shows them to the `operate` role, as `GET /v1/workers`).
    pub pool: Option<PoolFacts>,
    /// How often this runtime's sweep reclaims expired leases.
    pub sweep_every: Duration,
}

/// The pool's figures around a job.
#[derive(Debug, Clone, Default)]
pub struct PoolFacts {
    /// Due jobs a claim takes before it (queued jobs only).
    pub ahead: u64,
    /// Every registered worker (stale ones marked).
    pub workers: Vec<WorkerView>,
}

impl Runtime {
    /// Why job `id` is where it is, read from the store now. Without
    /// `with_pool`, the pool's figures (the jobs ahead, the workers) are
    /// left out.
    pub async fn why(&self, id: JobId, with_pool: bool) -> Result<Why, RuntimeError> {
        let job = self.get(id).await?;
        let now = self.now();
        let store = &self.inner.store;
        let mut around = Around { sweep_every: self.inner.settings.sweep_every(), ..Around::default() };
        // Only a queued job is held by a pause.
        if job.status == JobStatus::Queued
            && let Some(name) = &job.plugin_name
        {
            around.pause = store.plugin_pauses().await?.into_iter().find(|p| p.name == name.name);
        }
        if job.status == JobStatus::Queued
            && let Some(key) = &job.concurrency_key
        {
            let holders = store
                .job_list(JobListParams {
                    status: vec![JobStatus::Running],
                    concurrency_key: Some(key.clone()),
                    limit: 2,
                    ..JobListParams::default()
                })
                .await?;
            around.key_holder = holders.into_iter().map(|j| j.id).find(|holder| *holder != id);
        }
        if with_pool && matches!(job.status, JobStatus::Queued | JobStatus::Running) {
            let ahead = if job.status == JobStatus::Queued { store.jobs_ahead(&job, now).await? } else { 0 };
            around.pool = Some(PoolFacts { ahead, workers: self.workers().await?.workers });
        }
        Ok(explain(&job, &around, now))
    }
}

/// The answer for `job` at `now`, given what is `around` it.
pub fn explain(job: &Job, around: &Around, now: Timestamp) -> Why {
    let mut evidence = Map::new();
    let mut put = |key: &str, value: Value| {
        evidence.insert(key.to_owned(), value);
    };
    let ago = |t: Timestamp| human_duration(since(t, now));
    let (reason, sentence) = match job.status {
        JobStatus::Succeeded => {
            put("finished_at", json!(job.finished_at));
            put("attempt", json!(job.attempt));
            let at = job.finished_at.map_or_else(String::new, |t| format!(" {} ago", ago(t)));
            ("succeeded", format!("succeeded{at}, on attempt {} of {}", job.attempt, job.max_attempts))
        }
        JobStatus::Failed | JobStatus::Cancelled => {
            let (reason, verb) =
                if job.status == JobStatus::Failed { ("failed", "failed") } else { ("cancelled", "was cancelled") };
            put("finished_at", json!(job.finished_at));
            put("error_kind", json!(job.error_kind));
            put("error", json!(job.error_message));
            let at = job.finished_at.map_or_else(String::new, |t| format!(" {} ago", ago(t)));
            let why = job.error_message.as_deref().map_or_else(String::new, |m| format!(": {m}"));
            let attempts = match job.attempt {
                0 => "before it ran".to_owned(),
                n => format!("after {n} of {} attempts", job.max_attempts),
            };
            (reason, format!("{verb}{at} {attempts}{why}"))
        }
        JobStatus::PendingApproval => {
            let approval = job.approval.as_ref();
            put("since", json!(job.created_at));
            put("gated_by", json!(approval.map(|a| a.required_by)));
            let (given, quorum) = approval.map_or((0, 1), |a| (a.approvals.len(), a.duties.quorum));
            put("approvals", json!(given));
            put("quorum", json!(quorum));
            (
                "pending_approval",
                format!("waiting {} for approval ({given} of {quorum}) by {}", ago(job.created_at), gate(job)),
            )
        }
        JobStatus::Approved => {
            let decision = job.approval.as_ref().and_then(|a| a.decision.as_ref());
            put("approved_by", json!(decision.map(|d| &d.by)));
            put("approved_at", json!(decision.map(|d| d.at)));
            let by = decision.map_or_else(String::new, |d| format!(" by {} {} ago", d.by, ago(d.at)));
            (
                "approved",
                format!(
                    "approved{by}; its run waits to be triggered (`leash jobs run`, `POST /v1/jobs/{}/run`)",
                    job.id
                ),
            )
        }
        JobStatus::Running => running(job, around, now, &mut put),
        JobStatus::Queued => queued(job, around, now, &mut put),
    };
    Why { job_id: job.id, status: job.status, reason, sentence, evidence }
}

/// Who a gated job waits for.
fn gate(job: &Job) -> String {
    let Some(Approval { required_by, duties, approvals, .. }) = &job.approval else {
        return "a principal with the `approve` role".to_owned();
    };
    let who = match duties.quorum - approvals.len().min(duties.quorum as usize) as u32 {
        1 => "a principal with the `approve` role".to_owned(),
        n => format!("{n} more principals with the `approve` role"),
    };
    let not_submitter = match (&job.submitted_by, duties.separate_approver) {
        (Some(submitter), true) => format!(", not its submitter {submitter}"),
        _ => String::new(),
    };
    let source = match required_by {
        GateSource::Request => "its submit asked for approval".to_owned(),
        GateSource::Policy => format!("its plugin's approval policy gates `{}`", job.target),
        GateSource::Plan => "its plan's apply phase waits for approval".to_owned(),
    };
    format!("{who}{not_submitter} ({source})")
}

fn running(job: &Job, around: &Around, now: Timestamp, put: &mut impl FnMut(&str, Value)) -> (&'static str, String) {
    let worker = job.worker_id.as_deref().unwrap_or("an unknown worker");
    put("worker_id", json!(job.worker_id));
    put("started_at", json!(job.started_at));
    put("last_heartbeat", json!(job.last_heartbeat));
    put("lease_expires_at", json!(job.lease_expires_at));
    put("attempt", json!(job.attempt));
    let heartbeat = job
        .last_heartbeat
        .or(job.started_at)
        .map_or_else(|| "never".into(), |t| format!("{} ago", human_duration(since(t, now))));
    if let Some(expired) = job.lease_expires_at.filter(|at| *at <= now) {
        let holder = around
            .pool
            .as_ref()
            .map(|p| p.workers.iter().find(|w| Some(&w.worker.worker_id) == job.worker_id.as_ref()));
        let state = match holder {
            None => String::new(),
            Some(Some(w)) if w.worker.state == WorkerState::Stopped => ", which has stopped".to_owned(),
            Some(Some(w)) if w.stale => {
                format!(", which stopped reporting {} ago", human_duration(since(w.worker.last_heartbeat, now)))
            }
            Some(Some(_)) => ", which still reports but stopped renewing it".to_owned(),
            Some(None) => ", which is not registered".to_owned(),
        };
        put("sweep_every_ms", json!(around.sweep_every.as_millis() as u64));
        return (
            "lease_expired",
            format!(
                "its lease expired {} ago on {worker}{state} (last heartbeat {heartbeat}); the sweep that puts it \
                 back runs every {}",
                human_duration(since(expired, now)),
                human_duration(around.sweep_every)
            ),
        );
    }
    let started = job.started_at.map_or_else(String::new, |t| format!(" for {}", human_duration(since(t, now))));
    let cancel = if job.cancel_requested { "; a cancel was asked for and waits for the guest to stop" } else { "" };
    (
        "running",
        format!(
            "running on {worker}{started} (attempt {} of {}), last heartbeat {heartbeat}{cancel}",
            job.attempt, job.max_attempts
        ),
    )
}

fn queued(job: &Job, around: &Around, now: Timestamp, put: &mut impl FnMut(&str, Value)) -> (&'static str, String) {
    if let Some(pause) = &around.pause {
        put("paused_at", json!(pause.paused_at));
        put("paused_by", json!(pause.paused_by));
        put("pause_reason", json!(pause.reason));
        let by = pause.paused_by.as_deref().map_or_else(String::new, |b| format!(" by {b}"));
        let why = pause.reason.as_deref().map_or_else(String::new, |r| format!(": {r}"));
        return (
            "paused",
            format!(
                "its plugin `{}` was paused{by} {} ago{why}; no worker claims its jobs until it is resumed",
                pause.name,
                human_duration(since(pause.paused_at, now))
            ),
        );
    }
    // A rate slot moves the job's due time to it (a later backoff keeps
    // its own).
    if let Some(slot) = job.rate_slot.filter(|slot| *slot > now && *slot >= job.run_after) {
        put("rate_limit", json!(job.rate_limit));
        put("rate_slot", json!(slot));
        let limit = job.rate_limit.as_deref().unwrap_or("?");
        return (
            "rate_limited",
            format!("over its rate limit `{limit}` until {slot} (in {})", human_duration(since(now, slot))),
        );
    }
    if job.run_after > now {
        put("run_after", json!(job.run_after));
        let when = format!("{} (in {})", job.run_after, human_duration(since(now, job.run_after)));
        if let Some(error) = job.last_error.as_deref().filter(|_| job.attempt > 0) {
            put("last_error", json!(error));
            return (
                "backoff",
                format!("not before {when}: the backoff after attempt {} failed ({error})", job.attempt),
            );
        }
        return ("not_due", format!("not before {when}, as it was submitted"));
    }
    if let Some(holder) = around.key_holder {
        put("concurrency_key", json!(job.concurrency_key));
        put("running_job", json!(holder.to_string()));
        return (
            "concurrency_key",
            format!(
                "job {holder} of its concurrency key `{}` is running; one job of a key runs at a time",
                job.concurrency_key.as_deref().unwrap_or_default()
            ),
        );
    }
    put("due_since", json!(job.run_after));
    let waited = human_duration(since(job.run_after, now));
    let Some(pool) = &around.pool else {
        return (
            "waiting_turn",
            format!(
                "due {waited} ago, waiting for a free slot (the jobs ahead and the workers are shown to the \
                 `operate` role)"
            ),
        );
    };
    let live: Vec<_> = pool.workers.iter().filter(|w| !w.stale && w.worker.state == WorkerState::Running).collect();
    let slots: u64 = live.iter().map(|w| u64::from(w.worker.slots)).sum();
    let busy: u64 = live.iter().map(|w| u64::from(w.worker.running)).sum();
    put("ahead", json!(pool.ahead));
    put("workers", json!(live.len()));
    put("slots", json!(slots));
    put("slots_busy", json!(busy));
    if live.is_empty() {
        return (
            "no_workers",
            format!(
                "due {waited} ago, behind {} in claim order, and no worker is running to claim it",
                jobs(pool.ahead)
            ),
        );
    }
    (
        "waiting_turn",
        format!(
            "due {waited} ago, behind {} a claim takes first (by priority, then due time); {busy} of {slots} slots \
             busy on {} worker{}",
            jobs(pool.ahead),
            live.len(),
            if live.len() == 1 { "" } else { "s" }
        ),
    )
}

fn jobs(n: u64) -> String {
    if n == 1 { "1 job".to_owned() } else { format!("{n} jobs") }
}

/// Time from `from` to `to`, none if `to` is earlier.
fn since(from: Timestamp, to: Timestamp) -> Duration {
    Duration::from_millis(u64::try_from(to.unix_ms() - from.unix_ms()).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{WorkerRecord, WorkerState};

    const NOW: &str = "2026-12-05T12:00:00.000Z";

    fn at(text: &str) -> Timestamp {
        Timestamp::parse_rfc3339(text).unwrap()
    }

    fn why(edit: Value, around: &Around) -> Why {
        explain(&Job::for_tests(edit), around, at(NOW))
    }

    fn worker(id: &str, slots: u32, running: u32, state: WorkerState, stale: bool) -> WorkerView {
        let record = WorkerRecord {
            worker_id: id.into(),
            host: "h".into(),
            pid: 1,
            version: "0".into(),
            slots,
            running,
            state,
            poll_interval: Duration::from_secs(1),
            processed: 0,
            failed: 0,
            cancelled: 0,
            started_at: at("2026-12-05T11:00:00.000Z"),
            last_heartbeat: at("2026-12-05T11:59:59.000Z"),
        };
        WorkerView { worker: record, stale, running_jobs: Vec::new() }
    }

    #[test]
    fn a_queued_job_waits_its_turn_behind_the_jobs_a_claim_takes_first() {
        let pool = PoolFacts {
            ahead: 312,
            workers: vec![
                worker("w-1", 2, 2, WorkerState::Running, false),
                worker("w-2", 2, 2, WorkerState::Running, false),
                worker("w-3", 8, 0, WorkerState::Running, true),
            ],
        };
        let around = Around { pool: Some(pool), ..Around::default() };
        let why = why(json!({"run_after": "2026-12-05T11:59:50.000Z"}), &around);
        assert_eq!(why.reason, "waiting_turn");
        assert!(why.sentence.starts_with("due 10 s ago, behind 312 jobs"), "{}", why.sentence);
        assert!(
            why.sentence.ends_with("4 of 4 slots busy on 2 workers"),
            "a stale worker is not counted: {}",
            why.sentence
        );
        assert_eq!(why.evidence["ahead"], 312);

        let hidden = super::explain(&Job::for_tests(json!({})), &Around::default(), at(NOW));
        assert_eq!(hidden.reason, "waiting_turn");
        assert!(hidden.sentence.contains("shown to the `operate` role"), "{}", hidden.sentence);
        assert!(!hidden.evidence.contains_key("ahead"));
    }

    #[test]
    fn with_no_live_worker_a_queued_job_says_nothing_will_claim_it() {
        let pool = PoolFacts { ahead: 0, workers: vec![worker("w-1", 4, 0, WorkerState::Stopped, false)] };
        let around = Around { pool: Some(pool), ..Around::default() };
        let why = why(json!({"run_after": "2026-12-05T11:00:00.000Z"}), &around);
        assert_eq!(why.reason, "no_workers");
        assert!(why.sentence.contains("no worker is running"), "{}", why.sentence);
    }

    #[test]
    fn what_holds_a_queued_job_is_said_in_the_order_the_claim_checks_it() {
        let pause = PluginPause {
            name: "hello".into(),
            paused_at: at("2026-12-05T10:00:00.000Z"),
            paused_by: Some("ops".into()),
            reason: Some("upstream down".into()),
        };
        let later = json!({"run_after": "2026-12-05T12:00:30.000Z"});
        let paused = why(later.clone(), &Around { pause: Some(pause), ..Around::default() });
        assert_eq!(paused.reason, "paused");
        assert!(paused.sentence.contains("`hello` was paused by ops 2 h ago: upstream down"), "{}", paused.sentence);

        let not_due = why(later, &Around::default());
        assert_eq!(not_due.reason, "not_due");
        assert!(not_due.sentence.contains("(in 30 s)"), "{}", not_due.sentence);

        let backoff = why(
            json!({"run_after": "2026-12-05T12:00:05.000Z", "attempt": 2, "last_error": "GuestError: Retryable: 503"}),
            &Around::default(),
        );
        assert_eq!(backoff.reason, "backoff");
        assert!(
            backoff.sentence.contains("after attempt 2 failed (GuestError: Retryable: 503)"),
            "{}",
            backoff.sentence
        );

        let limited = why(
            json!({"rate_limit": "github", "rate_slot": "2026-12-05T12:00:03.000Z", "run_after": "2026-12-05T11:00:00.000Z"}),
            &Around::default(),
        );
        assert_eq!(limited.reason, "rate_limited");
        assert!(limited.sentence.starts_with("over its rate limit `github` until"), "{}", limited.sentence);

        let holder = JobId::new(at(NOW));
        let keyed =
            why(json!({"concurrency_key": "repo-1"}), &Around { key_holder: Some(holder), ..Around::default() });
        assert_eq!(keyed.reason, "concurrency_key");
        assert!(keyed.sentence.contains(&holder.to_string()), "{}", keyed.sentence);
    }

    #[test]
    fn a_running_job_says_where_and_a_lost_lease_says_what_puts_it_back() {
        let running = json!({
            "status": "running", "worker_id": "w-3", "started_at": "2026-12-05T11:59:19.000Z",
            "last_heartbeat": "2026-12-05T11:59:59.200Z", "lease_expires_at": "2026-12-05T12:00:29.000Z",
        });
        let why_running = why(running.clone(), &Around::default());
        assert_eq!(why_running.reason, "running");
        assert!(
            why_running.sentence.starts_with("running on w-3 for 41 s (attempt 1 of 3)"),
            "{}",
            why_running.sentence
        );
        assert!(why_running.sentence.contains("last heartbeat 800 ms ago"), "{}", why_running.sentence);

        let mut lost = running;
        lost["lease_expires_at"] = json!("2026-12-05T11:59:48.000Z");
        let silent = Around {
            pool: Some(PoolFacts { ahead: 0, workers: vec![worker("w-3", 4, 1, WorkerState::Running, true)] }),
            sweep_every: Duration::from_secs(5),
            ..Around::default()
        };
        let why_lost = why(lost, &silent);
        assert_eq!(why_lost.reason, "lease_expired");
        assert!(
            why_lost.sentence.starts_with("its lease expired 12 s ago on w-3, which stopped reporting"),
            "{}",
            why_lost.sentence
        );
        assert!(why_lost.sentence.ends_with("runs every 5.0 s"), "{}", why_lost.sentence);
    }

    #[test]
    fn gated_and_ended_jobs_say_whom_they_wait_for_and_how_they_ended() {
        let gated = why(
            json!({
                "status": "pending_approval", "created_at": "2026-12-05T10:00:00.000Z", "submitted_by": "ci",
                "approval": {"required_by": "policy", "run_on_approve": true, "execution": "async", "quorum": 2,
                             "separate_approver": true,
                             "approvals": [{"verdict": "approved", "by": "ada", "at": "2026-12-05T11:00:00.000Z"}]},
            }),
            &Around::default(),
        );
        assert_eq!(gated.reason, "pending_approval");
        assert!(
            gated.sentence.contains(
                "waiting 2 h for approval (1 of 2) by a principal with the `approve` role, not its submitter ci (its \
                 plugin's approval policy gates `execute`)"
            ),
            "{}",
            gated.sentence
        );

        let failed = why(
            json!({"status": "failed", "attempt": 3, "finished_at": "2026-12-05T11:59:00.000Z",
                   "error_kind": "trap", "error_message": "Trap: boom"}),
            &Around::default(),
        );
        assert_eq!(failed.reason, "failed");
        assert_eq!(failed.sentence, "failed 1 min ago after 3 of 3 attempts: Trap: boom");
    }
}
