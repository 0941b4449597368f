//! The cases every `JobStore` backend must pass, unchanged: each gets a
//! fresh, empty store and drives time by passing `now` explicitly. The
//! list in `mod.rs` runs each one as its own test on every backend.
//!
//! A behaviour change to the store is a new case here.

use std::sync::Arc;
use std::time::Duration;

use leash::clock::Timestamp;
use leash::job::{
    ApplyInput, ApplyMode, ApprovalPolicy, Digest, EffectOutcome, ErrorKind, Event, EventId, EventKind, ExecutionMode,
    Gate, GateSource, Grants, Job, JobId, JobLimits, JobLogs, JobProgress, JobStatus, LogLine, NewJob, PluginName,
    Target, Verdict,
};
use leash::store::{
    CancelResult, DecideRefusal, EffectBeginParams, EffectEndParams, EventsAfterParams, Finish, JobClaimParams,
    JobDecideParams, JobDecision, JobFinishParams, JobInsertParams, JobListParams, JobProgressParams, JobReleaseParams,
    JobRetryParams, JobStore, JobsDeleteParams, JobsExpireParams, Lease, LeaseExtendParams, LeaseReclaimParams,
    LeaseState, PlanInsertParams, PlanListParams, PlansAdvanceParams, PluginGrantsParams, PluginNameParams,
    PluginPolicyParams, PluginPutParams, ReclaimReport, StoreError, WorkerDiedParams,
};

const T0: Timestamp = Timestamp::from_unix_ms(1_800_000_000_000);
const TTL: Duration = Duration::from_secs(30);
const QUEUE_TTL: Duration = Duration::from_secs(3600);
const APPROVAL_TTL: Duration = Duration::from_secs(7200);
/// An event cutoff that deletes no event (the store stamps events with
/// its own clock, not the cases' `now`).
const KEEP_EVENTS: Timestamp = Timestamp::from_unix_ms(0);

fn at(seconds: u64) -> Timestamp {
    T0.plus(Duration::from_secs(seconds))
}

/// A queued job of a made-up plugin with small limits, one attempt and no
/// free re-runs, for store tests.
pub(crate) fn new_job(input: &str) -> NewJob {
    NewJob {
        plugin: Digest::of(b"plugin"),
        plugin_name: None,
        target: Target::Execute,
        input: input.as_bytes().to_vec(),
        limits: JobLimits { timeout_ms: 1000, fuel: Some(5), memory_bytes: 1 << 20, output_bytes: 1 << 10 },
        grants: Default::default(),
        max_attempts: 1,
        free_rerun_limit: 0,
        concurrency_key: None,
        plan_id: None,
        queue_ttl: QUEUE_TTL,
        idempotency: None,
        run_at: None,
        deadline: None,
        backoff: leash::job::Backoff::default(),
        approval: None,
        approval_ttl: APPROVAL_TTL,
    }
}

async fn insert(store: &dyn JobStore, jobs: Vec<NewJob>, now: Timestamp) -> Vec<Job> {
    store.job_insert(JobInsertParams { jobs, now }).await.expect("insert")
}

async fn insert_one(store: &dyn JobStore, job: NewJob, now: Timestamp) -> Job {
    insert(store, vec![job], now).await.pop().unwrap()
}

async fn claim(store: &dyn JobStore, worker: &str, limit: u32, now: Timestamp) -> Vec<Lease> {
    let leases = store
        .job_claim(JobClaimParams { worker_id: worker.into(), limit, alone: true, lease_ttl: TTL, now })
        .await
        .expect("claim");
    for lease in &leases {
        assert_eq!(lease.job, get(store, lease.job.id).await, "a claim returns the row as stored");
    }
    leases
}

async fn claim_one(store: &dyn JobStore, now: Timestamp) -> Lease {
    let mut leases = claim(store, "worker-aaaaaaaa", 1, now).await;
    assert_eq!(leases.len(), 1, "expected one job to claim");
    leases.pop().unwrap()
}

async fn get(store: &dyn JobStore, id: JobId) -> Job {
    store.job_get(id).await.expect("get").expect("job exists")
}

fn finish_params(lease: &Lease, finish: Finish, now: Timestamp) -> JobFinishParams {
    JobFinishParams {
        id: lease.job.id,
        token: lease.token.clone(),
        finish,
        fuel_used: 7,
        peak_memory_bytes: 65536,
        progress: None,
        logs: None,
        now,
    }
}

fn succeed(lease: &Lease, now: Timestamp) -> JobFinishParams {
    finish_params(lease, Finish::Succeeded { output: b"out".to_vec() }, now)
}

async fn reclaim(store: &dyn JobStore, now: Timestamp) -> ReclaimReport {
    store.lease_reclaim_expired(LeaseReclaimParams { now, queue_ttl: QUEUE_TTL }).await.expect("reclaim")
}

pub(crate) async fn insert_then_get_round_trips_every_field(store: Arc<dyn JobStore>) {
    let mut job = new_job("in");
    job.target = Target::action("export").unwrap();
    job.max_attempts = 3;
    job.concurrency_key = Some("plan-7".into());
    job.plan_id = Some("01PLAN".into());
    let inserted = insert_one(&*store, job.clone(), T0).await;
    let got = get(&*store, inserted.id).await;
    assert_eq!(got, inserted);
    assert_eq!(got.status, JobStatus::Queued);
    assert_eq!(got.target, job.target);
    assert_eq!(got.input, b"in");
    assert_eq!(got.limits, job.limits);
    assert_eq!((got.max_attempts, got.attempt, got.lost_leases), (3, 0, 0));
    assert_eq!(got.concurrency_key.as_deref(), Some("plan-7"));
    assert_eq!(got.plan_id.as_deref(), Some("01PLAN"));
    assert_eq!(got.created_at, T0);
    assert_eq!(got.expires_at, T0.plus(QUEUE_TTL));
    assert_eq!(got.schema_version, leash::job::SCHEMA_VERSION);
    assert!(got.started_at.is_none() && got.finished_at.is_none() && got.lease_token.is_none());
    assert!(got.error_kind.is_none() && got.output.is_none());
}

/// What an insert answers is what a read of the stored row returns, for a
/// job with every optional field set, a gated one and a delayed one (a
/// store may build the answer rather than read it back).
pub(crate) async fn an_insert_answers_the_rows_as_stored(store: Arc<dyn JobStore>) {
    let mut grants = Grants::default();
    grants.http.hosts = vec!["GET https://api.example.com".parse().unwrap()];
    grants.http.limits.requests = 3;
    let full = NewJob {
        plugin_name: Some(PluginName::new("tool", "2.0.0").unwrap()),
        grants,
        max_attempts: 4,
        free_rerun_limit: 2,
        concurrency_key: Some("k".into()),
        idempotency: Some(leash::job::IdempotencyKey::new("full-1", "digest-1".to_owned()).unwrap()),
        deadline: Some(Duration::from_secs(20)),
        backoff: leash::job::Backoff { base_ms: 250, cap_ms: 9_000 },
        ..new_job("full")
    };
    let gate = Gate {
        source: GateSource::Policy,
        run_on_approve: false,
        execution: ExecutionMode::Sync,
        deadline_ms: Some(15_000),
    };
    let gated = NewJob { approval: Some(gate), ..new_job("gated") };
    let delayed = NewJob { run_at: Some(at(90)), ..new_job("delayed") };
    let answered = insert(&*store, vec![full, gated, delayed], T0).await;
    assert_eq!(
        answered.iter().map(|j| j.status).collect::<Vec<_>>(),
        [JobStatus::Queued, JobStatus::PendingApproval, JobStatus::Queued]
    );
    for job in &answered {
        assert_eq!(*job, get(&*store, job.id).await, "answered as stored");
    }
    assert!(answered[1].approval.is_some() && !answered[0].grants.is_none());
    assert_eq!(answered[2].run_after, at(90));
    assert_eq!(answered[0].deadline_at, Some(T0.plus(Duration::from_secs(20))));
}

pub(crate) async fn insert_refuses_zero_attempts_and_writes_nothing(store: Arc<dyn JobStore>) {
    let mut bad = new_job("bad");
    bad.max_attempts = 0;
    let err = store.job_insert(JobInsertParams { jobs: vec![new_job("ok"), bad], now: T0 }).await.unwrap_err();
    assert!(matches!(err, StoreError::Invalid(_)), "{err}");
    assert_eq!(store.counts_snapshot().await.unwrap().total(), 0, "all or nothing");
}

pub(crate) async fn claim_takes_the_oldest_jobs_first_up_to_the_limit(store: Arc<dyn JobStore>) {
    let first = insert_one(&*store, new_job("1"), at(0)).await;
    let second = insert_one(&*store, new_job("2"), at(1)).await;
    let third = insert_one(&*store, new_job("3"), at(2)).await;
    let leases = claim(&*store, "worker-aaaaaaaa", 2, at(5)).await;
    let ids: Vec<JobId> = leases.iter().map(|l| l.job.id).collect();
    assert_eq!(ids, vec![first.id, second.id]);
    let rest = claim(&*store, "worker-bbbbbbbb", 10, at(5)).await;
    assert_eq!(rest.iter().map(|l| l.job.id).collect::<Vec<_>>(), vec![third.id]);
    assert!(claim(&*store, "worker-bbbbbbbb", 10, at(5)).await.is_empty());
}

pub(crate) async fn a_large_insert_returns_every_job_in_order(store: Arc<dyn JobStore>) {
    // Large enough for a store to split it (SQLite: statements of 256 rows, the rest one by one).
    let jobs: Vec<NewJob> = (0..600).map(|i| new_job(&i.to_string())).collect();
    let inserted = insert(&*store, jobs, T0).await;
    assert_eq!(inserted.len(), 600);
    for (i, job) in inserted.iter().enumerate() {
        assert_eq!(job.input, i.to_string().into_bytes(), "returned in the order given");
        assert_eq!(*job, get(&*store, job.id).await, "returned as stored");
    }
    let ids: std::collections::HashSet<JobId> = inserted.iter().map(|j| j.id).collect();
    assert_eq!(ids.len(), 600, "600 distinct jobs");
}

pub(crate) async fn claim_sets_owner_token_and_lease(store: Arc<dyn JobStore>) {
    let job = insert_one(&*store, new_job("x"), T0).await;
    let lease = claim_one(&*store, at(1)).await;
    assert_eq!(lease.job.id, job.id);
    let got = get(&*store, job.id).await;
    assert_eq!(got.status, JobStatus::Running);
    assert_eq!(got.worker_id.as_deref(), Some("worker-aaaaaaaa"));
    assert_eq!(got.lease_token.as_deref(), Some(lease.token.as_str()));
    assert!(lease.token.len() >= 16, "a token with real entropy: {}", lease.token);
    assert_eq!(got.lease_expires_at, Some(at(1).plus(TTL)));
    assert_eq!(got.started_at, Some(at(1)));
    assert_eq!(got.last_heartbeat, Some(at(1)));
    assert_eq!((got.attempt, got.lost_leases), (1, 0), "a claim is not a lost lease");
}

pub(crate) async fn claim_skips_running_and_expired_jobs(store: Arc<dyn JobStore>) {
    let mut short = new_job("short-lived");
    short.queue_ttl = Duration::from_secs(10);
    insert_one(&*store, short, T0).await;
    let live = insert_one(&*store, new_job("live"), T0).await;
    let lease = claim_one(&*store, at(20)).await;
    assert_eq!(lease.job.id, live.id, "the expired job is not handed out");
    assert!(claim(&*store, "worker-bbbbbbbb", 10, at(20)).await.is_empty(), "a running job is not claimed twice");
}

/// A claim's `now` can be read before its write waits behind a submit: the
/// job submitted meanwhile is left for the next claim, so every job's
/// timestamps stay ordered (created ≤ started ≤ finished).
pub(crate) async fn a_claim_never_starts_a_job_younger_than_itself(store: Arc<dyn JobStore>) {
    let older = insert_one(&*store, new_job("older"), at(1)).await;
    let younger = insert_one(&*store, new_job("younger"), at(3)).await;
    let leases = claim(&*store, "worker-aaaaaaaa", 10, at(2)).await;
    assert_eq!(leases.iter().map(|l| l.job.id).collect::<Vec<_>>(), [older.id]);
    let lease = claim_one(&*store, at(3)).await;
    assert_eq!(lease.job.id, younger.id);
    assert!(store.job_finish(succeed(&lease, at(4))).await.unwrap());
    for id in [older.id, younger.id] {
        let job = get(&*store, id).await;
        let started = job.started_at.expect("started");
        assert!(job.created_at <= started, "{job:?}");
        assert!(job.finished_at.is_none_or(|f| started <= f), "{job:?}");
    }
}

pub(crate) async fn an_idempotency_key_belongs_to_one_job_while_it_is_kept(store: Arc<dyn JobStore>) {
    let keyed = |digest: &str| NewJob {
        idempotency: Some(leash::job::IdempotencyKey::new("order-42", digest.to_owned()).unwrap()),
        ..new_job("keyed")
    };
    let first = insert_one(&*store, keyed("d1"), at(1)).await;
    for (digest, same) in [("d1", true), ("d2", false)] {
        let err = store.job_insert(JobInsertParams { jobs: vec![new_job("other"), keyed(digest)], now: at(2) }).await;
        match err {
            Err(StoreError::IdempotencyKeyTaken { key, job, same_request }) => {
                assert_eq!((key.as_str(), job, same_request), ("order-42", first.id, same));
            }
            other => panic!("expected the key to be taken, got {other:?}"),
        }
    }
    let counts = store.counts_snapshot().await.unwrap();
    assert_eq!(counts.total(), 1, "a refused insert wrote nothing");
    // A batch's replay finds its jobs by their keys; unknown keys are left out.
    let found = store.jobs_by_idempotency_key(vec!["order-42".into(), "order-43".into()]).await.unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found["order-42"], (first.id, JobStatus::Queued));
    // Retention deletes the job and, with it, the key.
    let lease = claim_one(&*store, at(3)).await;
    assert!(store.job_finish(succeed(&lease, at(4))).await.unwrap());
    store.jobs_delete_expired(JobsDeleteParams { finished_before: at(5), events_before: KEEP_EVENTS }).await.unwrap();
    let again = insert_one(&*store, keyed("d2"), at(6)).await;
    assert_ne!(again.id, first.id);
}

pub(crate) async fn every_claim_gets_a_fresh_token(store: Arc<dyn JobStore>) {
    let mut job = new_job("x");
    job.max_attempts = 3;
    insert_one(&*store, job, T0).await;
    let first = claim_one(&*store, at(1)).await;
    reclaim(&*store, at(100)).await;
    let second = claim_one(&*store, at(101)).await;
    assert_eq!(first.job.id, second.job.id);
    assert_ne!(first.token, second.token);
    assert_eq!(second.job.attempt, 2);
}

pub(crate) async fn finish_records_success_output_and_usage(store: Arc<dyn JobStore>) {
    insert_one(&*store, new_job("x"), T0).await;
    let lease = claim_one(&*store, at(1)).await;
    assert!(store.job_finish(succeed(&lease, at(2))).await.unwrap());
    let got = get(&*store, lease.job.id).await;
    assert_eq!(got.status, JobStatus::Succeeded);
    assert_eq!(got.output.as_deref(), Some(&b"out"[..]));
    assert_eq!((got.fuel_used, got.peak_memory_bytes), (Some(7), Some(65536)));
    assert_eq!(got.finished_at, Some(at(2)));
    assert!(got.lease_token.is_none() && got.lease_expires_at.is_none());
    assert!(got.error_kind.is_none() && got.error_message.is_none());
}

pub(crate) async fn finish_records_failure_kind_message_and_backtrace(store: Arc<dyn JobStore>) {
    insert_one(&*store, new_job("fails"), at(3)).await;
    let lease = claim_one(&*store, at(4)).await;
    let finish = Finish::Failed { kind: ErrorKind::Trap, message: "Trap: boom".into(), backtrace: Some("0: f".into()) };
    assert!(store.job_finish(finish_params(&lease, finish, at(5))).await.unwrap());
    let got = get(&*store, lease.job.id).await;
    assert_eq!(got.status, JobStatus::Failed);
    assert_eq!(got.error_kind, Some(ErrorKind::Trap));
    assert_eq!(got.error_message.as_deref(), Some("Trap: boom"));
    assert_eq!(got.backtrace.as_deref(), Some("0: f"));
    assert!(got.output.is_none());

    insert_one(&*store, new_job("cancelled"), at(6)).await;
    let lease = claim_one(&*store, at(7)).await;
    let finish = Finish::Cancelled { message: "Cancelled: asked".into() };
    assert!(store.job_finish(finish_params(&lease, finish, at(8))).await.unwrap());
    let got = get(&*store, lease.job.id).await;
    assert_eq!((got.status, got.error_kind), (JobStatus::Cancelled, Some(ErrorKind::Cancelled)));
}

pub(crate) async fn a_stale_token_changes_nothing(store: Arc<dyn JobStore>) {
    let mut job = new_job("x");
    job.max_attempts = 2;
    insert_one(&*store, job, T0).await;
    let old = claim_one(&*store, at(1)).await;
    reclaim(&*store, at(100)).await;
    let new = claim_one(&*store, at(101)).await;
    let before = get(&*store, new.job.id).await;

    assert!(!store.job_finish(succeed(&old, at(102))).await.unwrap(), "stale finish");
    let extend = LeaseExtendParams { id: old.job.id, token: old.token.clone(), lease_ttl: TTL, now: at(102) };
    assert_eq!(store.lease_extend(extend).await.unwrap(), LeaseState::Lost, "stale renewal");
    let release = release_params(&old, at(102), at(102));
    assert!(!store.job_release(release).await.unwrap(), "stale release");
    let forged = Lease { job: old.job.clone(), token: "not-a-token".into() };
    assert!(!store.job_finish(succeed(&forged, at(102))).await.unwrap(), "forged token");

    assert_eq!(get(&*store, new.job.id).await, before, "the row is exactly as the new owner left it");
    assert!(store.job_finish(succeed(&new, at(103))).await.unwrap(), "the new owner still owns it");
}

pub(crate) async fn finish_and_claim_ends_one_job_and_claims_the_next(store: Arc<dyn JobStore>) {
    let first = insert_one(&*store, new_job("1"), T0).await;
    let second = insert_one(&*store, new_job("2"), at(1)).await;
    let lease = claim_one(&*store, at(2)).await;
    assert_eq!(lease.job.id, first.id);
    let next =
        JobClaimParams { worker_id: "worker-bbbbbbbb".into(), limit: 1, alone: false, lease_ttl: TTL, now: at(3) };

    // A stale token: nothing finished, nothing claimed.
    let forged = Lease { job: lease.job.clone(), token: "not-a-token".into() };
    let (done, leases) = store.job_finish_and_claim(succeed(&forged, at(3)), next.clone()).await.unwrap();
    assert!(!done && leases.is_empty(), "a stale finish claims nothing");
    assert_eq!(get(&*store, second.id).await.status, JobStatus::Queued);

    let (done, leases) = store.job_finish_and_claim(succeed(&lease, at(3)), next.clone()).await.unwrap();
    assert!(done);
    assert_eq!(get(&*store, first.id).await.status, JobStatus::Succeeded);
    assert_eq!(leases.len(), 1);
    let claimed = &leases[0];
    assert_eq!((claimed.job.id, claimed.job.attempt), (second.id, 1));
    assert_eq!(claimed.job.worker_id.as_deref(), Some("worker-bbbbbbbb"));
    assert_eq!(claimed.job.lease_expires_at, Some(at(3).plus(TTL)));
    assert_eq!(claimed.job, get(&*store, second.id).await, "the claim returns the row as stored");
    assert_eq!(claimed.job.lease_token.as_deref(), Some(claimed.token.as_str()));

    // Nothing left to claim: the finish still lands.
    let (done, leases) = store.job_finish_and_claim(succeed(claimed, at(4)), next).await.unwrap();
    assert!(done && leases.is_empty());
    assert_eq!(get(&*store, second.id).await.status, JobStatus::Succeeded);
}

pub(crate) async fn terminal_jobs_have_no_way_out(store: Arc<dyn JobStore>) {
    insert_one(&*store, new_job("x"), T0).await;
    let lease = claim_one(&*store, at(1)).await;
    assert!(store.job_finish(succeed(&lease, at(2))).await.unwrap());
    let done = get(&*store, lease.job.id).await;

    let again =
        finish_params(&lease, Finish::Failed { kind: ErrorKind::Trap, message: "late".into(), backtrace: None }, at(3));
    assert!(!store.job_finish(again).await.unwrap(), "finish twice");
    let release = release_params(&lease, at(3), at(3));
    assert!(!store.job_release(release).await.unwrap(), "release a finished job");
    assert_eq!(
        store.job_cancel(lease.job.id, at(3)).await.unwrap(),
        CancelResult::AlreadyTerminal(JobStatus::Succeeded)
    );
    assert!(claim(&*store, "w", 10, at(3)).await.is_empty(), "claim a finished job");
    assert_eq!(reclaim(&*store, at(1000)).await, ReclaimReport::default());
    assert_eq!(store.jobs_expire_queued(JobsExpireParams { now: at(100_000) }).await.unwrap(), 0);
    assert_eq!(get(&*store, lease.job.id).await, done);

    // A queued job cannot be finished or released: nobody owns it.
    let queued = insert_one(&*store, new_job("q"), at(4)).await;
    let unowned = Lease { job: queued.clone(), token: lease.token.clone() };
    assert!(!store.job_finish(succeed(&unowned, at(5))).await.unwrap());
    assert_eq!(get(&*store, queued.id).await.status, JobStatus::Queued);
}

pub(crate) async fn extend_renews_the_lease_and_reads_cancel_requested(store: Arc<dyn JobStore>) {
    insert_one(&*store, new_job("x"), T0).await;
    let lease = claim_one(&*store, at(1)).await;
    let extend = |now| LeaseExtendParams { id: lease.job.id, token: lease.token.clone(), lease_ttl: TTL, now };
    assert_eq!(store.lease_extend(extend(at(10))).await.unwrap(), LeaseState::Held { cancel_requested: false });
    let got = get(&*store, lease.job.id).await;
    assert_eq!((got.lease_expires_at, got.last_heartbeat), (Some(at(10).plus(TTL)), Some(at(10))));
    // The renewed lease is not reclaimed at the old expiry.
    assert_eq!(reclaim(&*store, at(1).plus(TTL)).await, ReclaimReport::default());

    assert_eq!(store.job_cancel(lease.job.id, at(11)).await.unwrap(), CancelResult::Requested);
    assert_eq!(store.lease_extend(extend(at(12))).await.unwrap(), LeaseState::Held { cancel_requested: true });
}

pub(crate) async fn cancel_has_three_windows(store: Arc<dyn JobStore>) {
    let queued = insert_one(&*store, new_job("q"), T0).await;
    assert_eq!(store.job_cancel(queued.id, at(1)).await.unwrap(), CancelResult::Cancelled);
    let got = get(&*store, queued.id).await;
    assert_eq!((got.status, got.error_kind), (JobStatus::Cancelled, Some(ErrorKind::Cancelled)));
    assert_eq!(got.finished_at, Some(at(1)));

    insert_one(&*store, new_job("r"), at(2)).await;
    let lease = claim_one(&*store, at(3)).await;
    assert_eq!(store.job_cancel(lease.job.id, at(4)).await.unwrap(), CancelResult::Requested);
    let got = get(&*store, lease.job.id).await;
    assert_eq!(got.status, JobStatus::Running, "only the owner moves a running job");
    assert!(got.cancel_requested);
    assert_eq!(store.job_cancel(lease.job.id, at(5)).await.unwrap(), CancelResult::Requested, "idempotent");
    let finish = Finish::Cancelled { message: "Cancelled: the plugin stopped when asked".into() };
    assert!(store.job_finish(finish_params(&lease, finish, at(6))).await.unwrap());

    assert_eq!(
        store.job_cancel(lease.job.id, at(7)).await.unwrap(),
        CancelResult::AlreadyTerminal(JobStatus::Cancelled)
    );
    assert_eq!(store.job_cancel(queued.id, at(7)).await.unwrap(), CancelResult::AlreadyTerminal(JobStatus::Cancelled));
}

pub(crate) async fn cancel_of_an_unknown_job_is_not_found(store: Arc<dyn JobStore>) {
    assert_eq!(store.job_cancel(JobId::new(T0), at(1)).await.unwrap(), CancelResult::NotFound);
    assert!(store.job_get(JobId::new(T0)).await.unwrap().is_none());
}

pub(crate) async fn reclaim_requeues_while_attempts_remain(store: Arc<dyn JobStore>) {
    let mut job = new_job("x");
    job.max_attempts = 2;
    insert_one(&*store, job, T0).await;
    let lease = claim_one(&*store, at(1)).await;
    assert_eq!(reclaim(&*store, at(1).plus(TTL)).await, ReclaimReport { requeued: 1, failed: 0, quarantined: 0 });
    let got = get(&*store, lease.job.id).await;
    assert_eq!(got.status, JobStatus::Queued);
    assert_eq!((got.attempt, got.lost_leases), (1, 1));
    assert!(got.lease_token.is_none() && got.lease_expires_at.is_none() && got.finished_at.is_none());
    assert!(got.error_kind.is_none());
}

pub(crate) async fn reclaim_fails_with_lease_lost_when_no_attempts_remain(store: Arc<dyn JobStore>) {
    insert_one(&*store, new_job("x"), T0).await;
    let lease = claim_one(&*store, at(1)).await;
    assert_eq!(reclaim(&*store, at(1).plus(TTL)).await, ReclaimReport { requeued: 0, failed: 1, quarantined: 0 });
    let got = get(&*store, lease.job.id).await;
    assert_eq!(got.status, JobStatus::Failed);
    assert_eq!(got.error_kind, Some(ErrorKind::LeaseLost));
    assert!(got.error_message.as_deref().unwrap().contains("Heartbeat timeout"));
    assert_eq!((got.attempt, got.lost_leases), (1, 1));
    assert_eq!(got.finished_at, Some(at(1).plus(TTL)));
    assert!(claim(&*store, "w", 10, at(100)).await.is_empty(), "never silently re-run");
}

pub(crate) async fn reclaim_leaves_live_leases_alone(store: Arc<dyn JobStore>) {
    insert_one(&*store, new_job("x"), T0).await;
    let lease = claim_one(&*store, at(1)).await;
    let just_before = at(1).plus(TTL).minus(Duration::from_millis(1));
    assert_eq!(reclaim(&*store, just_before).await, ReclaimReport::default());
    assert_eq!(get(&*store, lease.job.id).await.status, JobStatus::Running);
}

pub(crate) async fn reclaim_of_a_job_being_cancelled_cancels_it(store: Arc<dyn JobStore>) {
    let mut job = new_job("x");
    job.max_attempts = 5;
    insert_one(&*store, job, T0).await;
    let lease = claim_one(&*store, at(1)).await;
    assert_eq!(store.job_cancel(lease.job.id, at(2)).await.unwrap(), CancelResult::Requested);
    reclaim(&*store, at(1).plus(TTL)).await;
    let got = get(&*store, lease.job.id).await;
    assert_eq!((got.status, got.error_kind), (JobStatus::Cancelled, Some(ErrorKind::Cancelled)));
    assert_eq!(got.lost_leases, 1);
}

pub(crate) async fn release_requeues_without_spending_an_attempt(store: Arc<dyn JobStore>) {
    insert_one(&*store, new_job("x"), T0).await;
    let lease = claim_one(&*store, at(1)).await;
    let release = release_params(&lease, at(2), at(2));
    assert!(store.job_release(release).await.unwrap());
    let got = get(&*store, lease.job.id).await;
    assert_eq!(got.status, JobStatus::Queued);
    assert_eq!(got.lost_leases, 0, "a clean release costs no attempt");
    assert_eq!(got.releases, 1, "but it is counted: the job will run again");
    assert!(got.lease_token.is_none());
    assert_eq!(got.expires_at, at(2).plus(QUEUE_TTL));
    assert!(!store.job_finish(succeed(&lease, at(3))).await.unwrap(), "the releaser no longer owns it");
}

pub(crate) async fn a_released_job_is_claimable_again(store: Arc<dyn JobStore>) {
    insert_one(&*store, new_job("x"), T0).await;
    let lease = claim_one(&*store, at(1)).await;
    let release = release_params(&lease, at(5), at(2));
    assert!(store.job_release(release).await.unwrap());
    let got = get(&*store, lease.job.id).await;
    assert_eq!((got.run_after, got.expires_at), (at(5), at(5).plus(QUEUE_TTL)), "due after its pause");
    assert!(claim(&*store, "w", 1, at(4)).await.is_empty(), "not before its pause ends");
    let again = claim_one(&*store, at(5)).await;
    assert_eq!(again.job.id, lease.job.id);
    assert!(store.job_finish(succeed(&again, at(6))).await.unwrap());
}

pub(crate) async fn queued_jobs_expire_as_expired(store: Arc<dyn JobStore>) {
    let mut short = new_job("short");
    short.queue_ttl = Duration::from_secs(10);
    let short = insert_one(&*store, short, T0).await;
    let long = insert_one(&*store, new_job("long"), T0).await;
    assert_eq!(store.jobs_expire_queued(JobsExpireParams { now: at(9) }).await.unwrap(), 0);
    assert_eq!(store.jobs_expire_queued(JobsExpireParams { now: at(10) }).await.unwrap(), 1);
    let got = get(&*store, short.id).await;
    assert_eq!((got.status, got.error_kind), (JobStatus::Failed, Some(ErrorKind::Expired)));
    assert!(got.error_message.as_deref().unwrap().starts_with("Expired: "));
    assert_eq!(get(&*store, long.id).await.status, JobStatus::Queued);
}

pub(crate) async fn a_requeued_job_gets_a_fresh_expiry(store: Arc<dyn JobStore>) {
    let mut job = new_job("x");
    job.queue_ttl = Duration::from_secs(60);
    job.max_attempts = 2;
    let job = insert_one(&*store, job, T0).await;
    // Claimed just before its queue expiry, then its worker dies.
    claim_one(&*store, at(59)).await;
    reclaim(&*store, at(59).plus(TTL)).await;
    let now = at(59).plus(TTL).plus(Duration::from_secs(1));
    assert_eq!(store.jobs_expire_queued(JobsExpireParams { now }).await.unwrap(), 0, "the retry is not killed");
    assert_eq!(get(&*store, job.id).await.status, JobStatus::Queued);
    assert_eq!(claim_one(&*store, now).await.job.id, job.id);
}

pub(crate) async fn retention_deletes_only_old_terminal_jobs(store: Arc<dyn JobStore>) {
    insert(&*store, vec![new_job("a"), new_job("b")], T0).await;
    let old = claim_one(&*store, at(1)).await;
    assert!(store.job_finish(succeed(&old, at(2))).await.unwrap());
    let recent = claim_one(&*store, at(3)).await;
    assert!(store.job_finish(succeed(&recent, at(100))).await.unwrap());
    let queued = insert_one(&*store, new_job("q"), at(0)).await;
    insert_one(&*store, new_job("r"), at(0)).await;
    let running = claim(&*store, "w", 1, at(4)).await.pop().unwrap();

    assert_eq!(
        store
            .jobs_delete_expired(JobsDeleteParams { finished_before: at(50), events_before: KEEP_EVENTS })
            .await
            .unwrap(),
        1
    );
    assert!(store.job_get(old.job.id).await.unwrap().is_none());
    for id in [recent.job.id, queued.id, running.job.id] {
        assert!(store.job_get(id).await.unwrap().is_some(), "kept {id}");
    }
}

pub(crate) async fn concurrency_key_allows_one_running_job_per_key(store: Arc<dyn JobStore>) {
    let keyed = |input: &str, key: &str| NewJob { concurrency_key: Some(key.into()), ..new_job(input) };
    let a1 = insert_one(&*store, keyed("a1", "plan-a"), at(0)).await;
    let a2 = insert_one(&*store, keyed("a2", "plan-a"), at(1)).await;
    let b1 = insert_one(&*store, keyed("b1", "plan-b"), at(2)).await;
    let free = insert_one(&*store, new_job("free"), at(3)).await;

    let first: Vec<JobId> = claim(&*store, "w1", 10, at(4)).await.iter().map(|l| l.job.id).collect();
    assert_eq!(first, vec![a1.id, b1.id, free.id], "one per key, oldest first; keyless jobs unaffected");
    assert!(claim(&*store, "w2", 10, at(4)).await.is_empty(), "a2 waits while a1 runs, across workers");

    let lease = Lease { token: get(&*store, a1.id).await.lease_token.unwrap(), job: a1 };
    assert!(store.job_finish(succeed(&lease, at(5))).await.unwrap());
    let next: Vec<JobId> = claim(&*store, "w2", 10, at(6)).await.iter().map(|l| l.job.id).collect();
    assert_eq!(next, vec![a2.id]);
}

pub(crate) async fn counts_snapshot_matches_the_states(store: Arc<dyn JobStore>) {
    insert(&*store, (0..6).map(|i| new_job(&i.to_string())).collect(), T0).await;
    let leases = claim(&*store, "w", 4, at(1)).await;
    assert!(store.job_finish(succeed(&leases[0], at(2))).await.unwrap());
    let failed = Finish::Failed { kind: ErrorKind::GuestError, message: "Failed: x".into(), backtrace: None };
    assert!(store.job_finish(finish_params(&leases[1], failed, at(2))).await.unwrap());
    let counts = store.counts_snapshot().await.unwrap();
    assert_eq!((counts.queued, counts.running, counts.succeeded, counts.failed, counts.cancelled), (2, 2, 1, 1, 0));
    assert_eq!(counts.total(), 6);
}

pub(crate) async fn plugins_are_stored_by_digest_once(store: Arc<dyn JobStore>) {
    let bytes = b"\0asm component bytes".to_vec();
    let digest = store.plugin_put(PluginPutParams { bytes: bytes.clone(), now: T0 }).await.unwrap();
    assert_eq!(digest, Digest::of(&bytes));
    let again = store.plugin_put(PluginPutParams { bytes: bytes.clone(), now: at(1) }).await.unwrap();
    assert_eq!(again, digest, "idempotent");
    assert_eq!(store.plugin_get(digest).await.unwrap(), Some(bytes));
    assert_eq!(store.plugin_get(Digest::of(b"other")).await.unwrap(), None);
}

async fn put_named(store: &dyn JobStore, bytes: &[u8], name: &str, version: &str, now: Timestamp) -> Digest {
    let digest = store.plugin_put(PluginPutParams { bytes: bytes.to_vec(), now }).await.unwrap();
    let name = PluginName::new(name, version).unwrap();
    let info = store.plugin_name_set(PluginNameParams { name: name.clone(), digest, policy: None, now }).await.unwrap();
    assert_eq!((info.name, info.digest, info.size_bytes), (Some(name), digest, bytes.len() as u64));
    digest
}

async fn resolve(store: &dyn JobStore, reference: &str) -> Option<leash::job::PluginInfo> {
    store.plugin_resolve(reference.parse().unwrap()).await.unwrap()
}

pub(crate) async fn plugin_names_resolve_to_the_newest_registration(store: Arc<dyn JobStore>) {
    let v1 = put_named(&*store, b"one", "hello", "1.0.0", T0).await;
    let v2 = put_named(&*store, b"two", "hello", "2.0.0", at(1)).await;
    let unnamed = store.plugin_put(PluginPutParams { bytes: b"three".to_vec(), now: at(2) }).await.unwrap();
    assert_eq!(resolve(&*store, "hello").await.unwrap().digest, v2, "a name alone is its newest version");
    let exact = resolve(&*store, "hello@1.0.0").await.unwrap();
    assert_eq!((exact.digest, exact.created_at), (v1, T0));
    let by_digest = resolve(&*store, &v1.to_string()).await.unwrap();
    assert_eq!(by_digest.name, Some(PluginName::new("hello", "1.0.0").unwrap()));
    assert_eq!(resolve(&*store, &unnamed.hex()).await.unwrap().name, None, "a bare hex digest resolves too");
    assert!(resolve(&*store, "hello@3.0.0").await.is_none());
    assert!(resolve(&*store, "nobody").await.is_none());
    let listed: Vec<_> = store.plugin_list().await.unwrap().into_iter().map(|p| (p.name, p.digest)).collect();
    assert_eq!(listed.len(), 3);
    assert_eq!(listed[2], (None, unnamed), "unnamed digests come last");
    let missing = PluginNameParams {
        name: PluginName::new("ghost", "1").unwrap(),
        digest: Digest::of(b"never stored"),
        policy: None,
        now: at(3),
    };
    assert!(matches!(store.plugin_name_set(missing).await, Err(StoreError::Invalid(_))));
    assert!(resolve(&*store, "ghost").await.is_none(), "a refused name leaves nothing behind");
}

pub(crate) async fn replacing_a_plugin_name_does_not_change_queued_jobs(store: Arc<dyn JobStore>) {
    let old = put_named(&*store, b"old", "tool", "1", T0).await;
    let job = NewJob { plugin: old, plugin_name: Some(PluginName::new("tool", "1").unwrap()), ..new_job("x") };
    let queued = insert_one(&*store, job, T0).await;
    let new = put_named(&*store, b"new", "tool", "1", at(1)).await;
    assert_ne!(old, new);
    assert_eq!(resolve(&*store, "tool@1").await.unwrap().digest, new, "the name now points at the new bytes");
    let still = get(&*store, queued.id).await;
    assert_eq!(still.plugin, old, "the queued job keeps the digest it was pinned to");
    assert_eq!(still.plugin_name, Some(PluginName::new("tool", "1").unwrap()));
    assert_eq!(claim_one(&*store, at(2)).await.job.plugin, old);
}

pub(crate) async fn grants_belong_to_a_registration_and_are_pinned_on_jobs(store: Arc<dyn JobStore>) {
    let name = PluginName::new("fetcher", "1").unwrap();
    let grant = |rules: &[&str]| {
        let mut grants = Grants::default();
        grants.http.hosts = rules.iter().map(|r| r.parse().unwrap()).collect();
        grants.http.private_ranges = vec!["10.0.0.0/8".parse().unwrap()];
        grants.http.limits.requests = 7;
        grants
    };
    let set = |grants: Grants, name: PluginName| {
        let store = store.clone();
        async move { store.plugin_grants_set(PluginGrantsParams { name, grants }).await.unwrap() }
    };
    assert!(set(grant(&["https://a.example"]), name.clone()).await.is_none(), "an unregistered pair is refused");

    let v1 = put_named(&*store, b"v1", "fetcher", "1", T0).await;
    assert!(resolve(&*store, "fetcher@1").await.unwrap().grants.is_none(), "a new registration grants nothing");
    let first = grant(&["GET https://api.example.com", "http://127.0.0.1:8080"]);
    let info = set(first.clone(), name.clone()).await.expect("registered");
    assert_eq!((info.digest, &info.grants), (v1, &first));
    assert_eq!(resolve(&*store, "fetcher").await.unwrap().grants, first);
    let listed = store.plugin_list().await.unwrap();
    assert_eq!(listed.iter().find(|p| p.name.as_ref() == Some(&name)).unwrap().grants, first);

    // A job carries the grants it was inserted with, through claim and reads.
    let job = NewJob { plugin: v1, plugin_name: Some(name.clone()), grants: first.clone(), ..new_job("g") };
    let queued = insert_one(&*store, job, at(1)).await;
    assert_eq!(queued.grants, first);
    assert_eq!(get(&*store, queued.id).await.grants, first);
    let listed = store.job_list(JobListParams { limit: 10, ..Default::default() }).await.unwrap();
    assert_eq!(listed[0].grants, first);

    // New bytes under the same pair keep its grants; new grants do not
    // reach the job already queued.
    let v2 = put_named(&*store, b"v2", "fetcher", "1", at(2)).await;
    let info = resolve(&*store, "fetcher@1").await.unwrap();
    assert_eq!((info.digest, &info.grants), (v2, &first), "a replaced registration keeps its grants");
    let second = grant(&["https://other.example"]);
    set(second.clone(), name.clone()).await.unwrap();
    assert_eq!(claim_one(&*store, at(3)).await.job.grants, first, "the job keeps what it was pinned to");
    assert_eq!(resolve(&*store, "fetcher@1").await.unwrap().grants, second);

    // Revoking stores nothing; other versions are untouched.
    put_named(&*store, b"v3", "fetcher", "2", at(4)).await;
    set(Grants::default(), name.clone()).await.unwrap();
    assert!(resolve(&*store, "fetcher@1").await.unwrap().grants.is_none());
    assert!(resolve(&*store, "fetcher@2").await.unwrap().grants.is_none());
}

pub(crate) async fn list_filters_pages_newest_first_without_payloads(store: Arc<dyn JobStore>) {
    let named = |input: &str, name: &str, version: &str| NewJob {
        plugin_name: Some(PluginName::new(name, version).unwrap()),
        plan_id: Some(format!("plan-{name}")),
        ..new_job(input)
    };
    let mut ids = Vec::new();
    for (i, job) in [
        named("a", "alpha", "1"),
        named("b", "alpha", "2"),
        named("c", "beta", "1"),
        NewJob { concurrency_key: Some("k".into()), ..new_job("d") },
        new_job("e"),
    ]
    .into_iter()
    .enumerate()
    {
        ids.push(insert_one(&*store, job, at(i as u64)).await.id);
    }
    store.job_finish(succeed(&claim_one(&*store, at(10)).await, at(11))).await.unwrap();
    let list = |params: JobListParams| {
        let store = store.clone();
        async move { store.job_list(params).await.unwrap().into_iter().map(|j| j.id).collect::<Vec<_>>() }
    };
    let all = list(JobListParams { limit: 100, ..Default::default() }).await;
    assert_eq!(all, ids.iter().rev().copied().collect::<Vec<_>>(), "newest first");
    let rows = store.job_list(JobListParams { limit: 100, ..Default::default() }).await.unwrap();
    assert!(rows.iter().all(|j| j.input.is_empty() && j.output.is_none()), "no payload bytes in lists");
    let page1 = list(JobListParams { limit: 2, ..Default::default() }).await;
    let page2 = list(JobListParams { limit: 2, before: page1.last().copied(), ..Default::default() }).await;
    assert_eq!([page1, page2].concat(), all[..4].to_vec(), "keyset pages join up");
    let by = |plugin: &str| JobListParams { plugin: Some(plugin.parse().unwrap()), limit: 100, ..Default::default() };
    assert_eq!(list(by("alpha")).await, vec![ids[1], ids[0]], "a name matches every version");
    assert_eq!(list(by("alpha@2")).await, vec![ids[1]]);
    assert_eq!(list(by(&Digest::of(b"plugin").to_string())).await.len(), 5);
    let status = JobListParams { status: Some(JobStatus::Succeeded), limit: 100, ..Default::default() };
    assert_eq!(list(status).await, vec![ids[0]], "the oldest job was claimed and finished");
    let plan = JobListParams { plan_id: Some("plan-beta".into()), limit: 100, ..Default::default() };
    assert_eq!(list(plan).await, vec![ids[2]]);
    let key = JobListParams { concurrency_key: Some("k".into()), limit: 100, ..Default::default() };
    assert_eq!(list(key).await, vec![ids[3]]);
}

fn progress_at(done: u64) -> JobProgress {
    JobProgress { done, total: 10, note: format!("step {done}") }
}

pub(crate) async fn progress_is_fenced_by_the_token_and_reset_by_a_claim(store: Arc<dyn JobStore>) {
    let job = insert_one(&*store, NewJob { max_attempts: 2, ..new_job("p") }, T0).await;
    let lease = claim_one(&*store, at(1)).await;
    let report = |token: &str, done: u64| JobProgressParams {
        id: job.id,
        token: token.into(),
        progress: progress_at(done),
        now: at(2),
    };
    assert!(store.job_progress_set(report(&lease.token, 3)).await.unwrap());
    assert_eq!(get(&*store, job.id).await.progress, Some(progress_at(3)));
    assert!(!store.job_progress_set(report("stale", 9)).await.unwrap(), "a stale token writes nothing");
    assert_eq!(get(&*store, job.id).await.progress, Some(progress_at(3)));
    reclaim(&*store, at(1).plus(TTL)).await;
    assert!(!store.job_progress_set(report(&lease.token, 5)).await.unwrap(), "a lost lease writes nothing");
    let again = claim_one(&*store, at(40)).await;
    assert_eq!(again.job.progress, None, "a new attempt starts without the old progress");
}

pub(crate) async fn finish_keeps_logs_and_last_progress(store: Arc<dyn JobStore>) {
    let job = insert_one(&*store, new_job("l"), T0).await;
    assert_eq!(store.job_logs(job.id).await.unwrap(), None);
    let lease = claim_one(&*store, at(1)).await;
    let logs = JobLogs {
        records: vec![LogLine {
            level: "info".into(),
            message: "hi".into(),
            fields: vec![("k".into(), "v".into())],
            elapsed_ms: 3,
        }],
        records_dropped: 2,
        stdout: "out".into(),
        stdout_dropped: 0,
        stderr: "err".into(),
        stderr_dropped: 1,
    };
    let mut params = succeed(&lease, at(2));
    params.logs = Some(logs.clone());
    params.progress = Some(progress_at(10));
    assert!(store.job_finish(params).await.unwrap());
    assert_eq!(store.job_logs(job.id).await.unwrap(), Some(logs));
    assert_eq!(get(&*store, job.id).await.progress, Some(progress_at(10)));
    let unknown = JobId::new(T0);
    assert_eq!(store.job_logs(unknown).await.unwrap(), None);
}

pub(crate) async fn queued_count_matches_the_snapshot(store: Arc<dyn JobStore>) {
    assert_eq!(store.queued_count().await.unwrap(), 0);
    insert(&*store, vec![new_job("a"), new_job("b"), new_job("c")], T0).await;
    let lease = claim_one(&*store, at(1)).await;
    store.job_finish(succeed(&lease, at(2))).await.unwrap();
    claim_one(&*store, at(3)).await;
    assert_eq!(store.queued_count().await.unwrap(), 1);
    assert_eq!(store.counts_snapshot().await.unwrap().queued, 1);
}

pub(crate) async fn a_delayed_job_is_not_claimed_before_its_time(store: Arc<dyn JobStore>) {
    let mut delayed = new_job("later");
    delayed.run_at = Some(at(60));
    let delayed = insert_one(&*store, delayed, T0).await;
    assert_eq!(delayed.run_after, at(60));
    assert_eq!(delayed.expires_at, at(60).plus(QUEUE_TTL), "the queue TTL counts from when it is due");
    assert_eq!(store.queued_count().await.unwrap(), 1, "a delayed job holds its place in the queue");
    let now_job = insert_one(&*store, new_job("now"), at(1)).await;
    assert_eq!(now_job.run_after, at(1));
    let mut overdue = new_job("overdue");
    overdue.run_at = Some(T0);
    let overdue = insert_one(&*store, overdue, at(1)).await;
    assert_eq!(overdue.run_after, at(1), "a time already past means now");
    let mut due: Vec<JobId> = claim(&*store, "w", 10, at(59)).await.iter().map(|l| l.job.id).collect();
    due.sort();
    let mut expected = [now_job.id, overdue.id];
    expected.sort();
    assert_eq!(due, expected);
    assert!(claim(&*store, "w", 10, at(59)).await.is_empty(), "not before its time");
    assert_eq!(claim_one(&*store, at(60)).await.job.id, delayed.id);
}

pub(crate) async fn claims_take_the_earliest_due_first(store: Arc<dyn JobStore>) {
    let mut older = new_job("older, due later");
    older.run_at = Some(at(10));
    let older = insert_one(&*store, older, T0).await;
    let newer = insert_one(&*store, new_job("newer, due sooner"), at(5)).await;
    let order: Vec<JobId> = claim(&*store, "w", 2, at(20)).await.iter().map(|l| l.job.id).collect();
    assert_eq!(order, [newer.id, older.id]);
}

/// Record an effect's intent under `lease` (its URL names `what`).
async fn intent(store: &dyn JobStore, lease: &Lease, what: &str, now: Timestamp) -> leash::job::Effect {
    let params = EffectBeginParams {
        id: lease.job.id,
        token: lease.token.clone(),
        method: "POST".into(),
        url: format!("https://api.example.com/{what}"),
        now,
    };
    store.effect_begin(params).await.unwrap().expect("recorded under the lease")
}

/// Record that `effect` was answered with `status`.
async fn answered(store: &dyn JobStore, id: JobId, effect: &leash::job::Effect, status: u16, now: Timestamp) {
    let outcome = EffectOutcome::Status(status);
    let params = EffectEndParams { id, attempt: effect.attempt, seq: effect.seq, outcome, now };
    store.effect_end(params).await.unwrap();
}

pub(crate) async fn a_lost_lease_without_effects_reruns_free_until_its_limit(store: Arc<dyn JobStore>) {
    let job = insert_one(&*store, NewJob { free_rerun_limit: 2, ..new_job("free") }, T0).await;
    let mut now = at(1);
    for n in 1..=2 {
        claim_one(&*store, now).await;
        now = now.plus(TTL);
        assert_eq!(
            reclaim(&*store, now).await,
            ReclaimReport { requeued: 1, failed: 0, quarantined: 0 },
            "free re-run {n}"
        );
        let got = get(&*store, job.id).await;
        assert_eq!((got.status, got.attempt, got.lost_leases, got.free_reruns), (JobStatus::Queued, n, 0, n));
        let last_error = got.last_error.unwrap();
        assert!(
            last_error.contains("no effect was recorded") && last_error.contains(&format!("{n} of 2")),
            "{last_error}"
        );
        now = now.plus(Duration::from_secs(301)); // past any backoff
    }
    claim_one(&*store, now).await;
    now = now.plus(TTL);
    assert_eq!(
        reclaim(&*store, now).await,
        ReclaimReport { requeued: 0, failed: 1, quarantined: 0 },
        "the limit is reached"
    );
    let got = get(&*store, job.id).await;
    assert_eq!(
        (got.status, got.error_kind, got.attempt, got.lost_leases),
        (JobStatus::Failed, Some(ErrorKind::LeaseLost), 3, 1)
    );
    let message = got.error_message.unwrap();
    assert!(message.contains("Heartbeat timeout") && message.contains("re-run 2 times"), "{message}");
}

pub(crate) async fn a_lost_lease_after_an_effect_spends_the_attempt_and_names_the_effect(store: Arc<dyn JobStore>) {
    let job = insert_one(&*store, NewJob { free_rerun_limit: 3, ..new_job("fx") }, T0).await;
    let lease = claim_one(&*store, at(1)).await;
    let sent = intent(&*store, &lease, "sent", at(2)).await;
    answered(&*store, job.id, &sent, 202, at(3)).await;
    intent(&*store, &lease, "in-flight", at(4)).await;
    intent(&*store, &lease, "also-in-flight", at(5)).await;
    assert_eq!(reclaim(&*store, at(5).plus(TTL)).await, ReclaimReport { requeued: 0, failed: 1, quarantined: 0 });
    let got = get(&*store, job.id).await;
    assert_eq!(
        (got.status, got.error_kind, got.free_reruns, got.lost_leases),
        (JobStatus::Failed, Some(ErrorKind::LeaseLost), 0, 1)
    );
    let message = got.error_message.unwrap();
    assert!(
        message.contains(
            "effect #2 (POST https://api.example.com/in-flight) (and 1 more) was in flight: its outcome is unknown"
        ),
        "{message}"
    );
    assert!(claim(&*store, "w", 10, at(1000)).await.is_empty(), "never run again");

    // With attempts left it runs again, the attempt spent, and an effect
    // whose outcome is known is named as the last one.
    let job = insert_one(&*store, NewJob { max_attempts: 2, free_rerun_limit: 3, ..new_job("fx2") }, at(1000)).await;
    let lease = claim_one(&*store, at(1001)).await;
    let sent = intent(&*store, &lease, "done", at(1002)).await;
    answered(&*store, job.id, &sent, 200, at(1003)).await;
    assert_eq!(reclaim(&*store, at(1003).plus(TTL)).await, ReclaimReport { requeued: 1, failed: 0, quarantined: 0 });
    let got = get(&*store, job.id).await;
    assert_eq!((got.status, got.lost_leases, got.free_reruns), (JobStatus::Queued, 1, 0));
    let last_error = got.last_error.unwrap();
    assert!(
        last_error.contains("its last effect, #1 (POST https://api.example.com/done), answered 200"),
        "{last_error}"
    );
}

pub(crate) async fn a_release_after_an_effect_spends_an_attempt(store: Arc<dyn JobStore>) {
    // No effect: a release costs nothing, as ever.
    let quiet = insert_one(&*store, new_job("quiet"), T0).await;
    let lease = claim_one(&*store, at(1)).await;
    assert!(store.job_release(release_params(&lease, at(1), at(1))).await.unwrap());
    let got = get(&*store, quiet.id).await;
    assert_eq!((got.status, got.releases, got.retries), (JobStatus::Queued, 1, 0));
    store.job_cancel(quiet.id, at(2)).await.unwrap();

    // An effect with attempts left: queued again, an attempt spent.
    let job = insert_one(&*store, NewJob { max_attempts: 2, ..new_job("loud") }, at(3)).await;
    let lease = claim_one(&*store, at(4)).await;
    intent(&*store, &lease, "charge", at(5)).await;
    assert!(store.job_release(release_params(&lease, at(6), at(6))).await.unwrap());
    let got = get(&*store, job.id).await;
    assert_eq!((got.status, got.releases, got.retries), (JobStatus::Queued, 0, 1));
    assert!(got.last_error.unwrap().starts_with("interrupted: "));

    // And with none left: it ends as interrupted, naming the effect.
    let lease = claim_one(&*store, at(400)).await;
    assert_eq!(lease.job.id, job.id);
    intent(&*store, &lease, "refund", at(401)).await;
    assert!(store.job_release(release_params(&lease, at(402), at(402))).await.unwrap());
    let got = get(&*store, job.id).await;
    assert_eq!((got.status, got.error_kind), (JobStatus::Failed, Some(ErrorKind::Interrupted)));
    let message = got.error_message.unwrap();
    assert!(message.contains("#1 (POST https://api.example.com/refund) was in flight"), "{message}");
    assert_eq!(got.finished_at, Some(at(402)));
    assert!(
        !store.job_release(release_params(&lease, at(403), at(403))).await.unwrap(),
        "a stale token changes nothing"
    );
}

fn release_params(lease: &Lease, run_after: Timestamp, now: Timestamp) -> JobReleaseParams {
    JobReleaseParams { id: lease.job.id, token: lease.token.clone(), queue_ttl: QUEUE_TTL, run_after, now }
}

pub(crate) async fn effects_are_recorded_only_under_the_lease_and_numbered_per_attempt(store: Arc<dyn JobStore>) {
    let job = insert_one(&*store, NewJob { max_attempts: 2, ..new_job("fx") }, T0).await;
    let begin = |token: &str, method: &str, now: Timestamp| {
        let store = store.clone();
        let params = EffectBeginParams {
            id: job.id,
            token: token.to_owned(),
            method: method.to_owned(),
            url: "https://api.example.com/charge".into(),
            now,
        };
        async move { store.effect_begin(params).await.unwrap() }
    };
    assert_eq!(begin("no-such-token", "POST", at(1)).await, None, "a queued job records nothing");
    let first = claim_one(&*store, at(1)).await;
    assert_eq!(begin("wrong", "POST", at(2)).await, None, "another token records nothing");
    let one = begin(&first.token, "POST", at(2)).await.expect("recorded under the lease");
    let two = begin(&first.token, "DELETE", at(3)).await.expect("recorded");
    assert_eq!((one.attempt, one.seq, two.seq), (1, 1, 2));
    assert_eq!(one.idempotency_key, format!("{}/1", job.id));
    assert_eq!((one.finished_at, one.status), (None, None), "an intent has no outcome yet");
    let end = |attempt: u32, seq: u32, outcome: EffectOutcome, now: Timestamp| {
        let store = store.clone();
        let params = EffectEndParams { id: job.id, attempt, seq, outcome, now };
        async move { store.effect_end(params).await.unwrap() }
    };
    end(1, 1, EffectOutcome::Status(201), at(4)).await;
    end(1, 2, EffectOutcome::Error("connection reset".into()), at(5)).await;
    end(1, 2, EffectOutcome::Status(200), at(6)).await;

    // The next attempt numbers its effects from 1 again, so a replay
    // carries the same idempotency keys; the old token is fenced out.
    store.job_retry(retry_params(&first, at(6), at(6))).await.unwrap();
    let second = claim_one(&*store, at(7)).await;
    assert_eq!(begin(&first.token, "POST", at(8)).await, None, "the old attempt can record nothing");
    let again = begin(&second.token, "POST", at(8)).await.expect("recorded");
    assert_eq!((again.attempt, again.seq, &again.idempotency_key), (2, 1, &one.idempotency_key));

    let effects = store.effects(job.id).await.unwrap();
    let summary: Vec<_> = effects
        .iter()
        .map(|e| (e.attempt, e.seq, e.method.as_str(), e.status, e.error.as_deref(), e.finished_at))
        .collect();
    assert_eq!(
        summary,
        vec![
            (1, 1, "POST", Some(201), None, Some(at(4))),
            (1, 2, "DELETE", None, Some("connection reset"), Some(at(5))),
            (2, 1, "POST", None, None, None),
        ],
        "an outcome is recorded once"
    );
    assert_eq!(effects[0].started_at, at(2));

    // Retention takes a job's effects with it.
    store.job_finish(succeed(&second, at(9))).await.unwrap();
    let deleted = store
        .jobs_delete_expired(JobsDeleteParams { finished_before: at(100), events_before: KEEP_EVENTS })
        .await
        .unwrap();
    assert_eq!(deleted, 1);
    assert_eq!(store.effects(job.id).await.unwrap(), vec![]);
}

fn retry_params(lease: &Lease, run_after: Timestamp, now: Timestamp) -> JobRetryParams {
    JobRetryParams {
        id: lease.job.id,
        token: lease.token.clone(),
        kind: ErrorKind::GuestError,
        message: "Retryable: the upstream is down".into(),
        run_after,
        queue_ttl: QUEUE_TTL,
        fuel_used: 3,
        peak_memory_bytes: 4096,
        logs: None,
        now,
    }
}

pub(crate) async fn a_retry_queues_the_job_after_its_backoff_and_spends_an_attempt(store: Arc<dyn JobStore>) {
    let mut job = new_job("x");
    job.max_attempts = 2;
    insert_one(&*store, job, T0).await;
    let lease = claim_one(&*store, at(1)).await;
    assert!(store.job_retry(retry_params(&lease, at(6), at(1))).await.unwrap());
    let got = get(&*store, lease.job.id).await;
    assert_eq!((got.status, got.attempt, got.retries, got.lost_leases), (JobStatus::Queued, 1, 1, 0));
    assert_eq!(got.run_after, at(6));
    assert_eq!(got.last_error.as_deref(), Some("guest_error: Retryable: the upstream is down"));
    assert!(got.lease_token.is_none() && got.error_kind.is_none() && got.finished_at.is_none());
    assert!(got.expires_at >= at(6).plus(QUEUE_TTL), "the queue TTL counts from the retry's time");
    assert!(claim(&*store, "w", 1, at(5)).await.is_empty(), "not claimed during the backoff");
    let second = claim_one(&*store, at(6)).await;
    assert_eq!(second.job.attempt, 2);
    // The last attempt: no retry left, the caller records the failure.
    assert!(!store.job_retry(retry_params(&second, at(9), at(7))).await.unwrap(), "no attempts left");
    assert_eq!(get(&*store, lease.job.id).await.status, JobStatus::Running, "a refused retry changes nothing");
}

pub(crate) async fn a_retry_with_a_stale_token_changes_nothing(store: Arc<dyn JobStore>) {
    let mut job = new_job("x");
    job.max_attempts = 5;
    insert_one(&*store, job, T0).await;
    let lease = claim_one(&*store, at(1)).await;
    let mut stale = retry_params(&lease, at(2), at(1));
    stale.token = "not-the-token".into();
    assert!(!store.job_retry(stale).await.unwrap());
    let got = get(&*store, lease.job.id).await;
    assert_eq!((got.status, got.retries), (JobStatus::Running, 0));
}

pub(crate) async fn reclaim_requeues_after_the_backoff_and_shares_the_attempt_budget(store: Arc<dyn JobStore>) {
    let mut job = new_job("x");
    job.max_attempts = 3;
    job.backoff = leash::job::Backoff { base_ms: 10_000, cap_ms: 10_000 };
    insert_one(&*store, job, T0).await;
    // Attempt 1 fails retryably; attempt 2's worker dies.
    let lease = claim_one(&*store, at(1)).await;
    assert!(store.job_retry(retry_params(&lease, at(2), at(1))).await.unwrap());
    let lease = claim_one(&*store, at(2)).await;
    let lost_at = at(2).plus(TTL);
    assert_eq!(reclaim(&*store, lost_at).await, ReclaimReport { requeued: 1, failed: 0, quarantined: 0 });
    let got = get(&*store, lease.job.id).await;
    assert_eq!((got.status, got.retries, got.lost_leases), (JobStatus::Queued, 1, 1));
    assert!(
        (lost_at.plus(Duration::from_secs(5))..=lost_at.plus(Duration::from_secs(10))).contains(&got.run_after),
        "the backoff is half to all of the 10 s step: {:?} after {lost_at:?}",
        got.run_after
    );
    assert!(got.last_error.as_deref().unwrap().starts_with("lease_lost: "), "{:?}", got.last_error);
    // Attempt 3 also loses its lease: the budget of three is spent.
    claim_one(&*store, got.run_after).await;
    assert_eq!(
        reclaim(&*store, got.run_after.plus(TTL)).await,
        ReclaimReport { requeued: 0, failed: 1, quarantined: 0 }
    );
    let got = get(&*store, lease.job.id).await;
    assert_eq!((got.status, got.error_kind), (JobStatus::Failed, Some(ErrorKind::LeaseLost)));
}

pub(crate) async fn a_deadline_caps_the_queue_expiry_through_every_requeue(store: Arc<dyn JobStore>) {
    let mut job = new_job("sync");
    job.deadline = Some(Duration::from_secs(5));
    job.max_attempts = 3;
    let job = insert_one(&*store, job, T0).await;
    assert_eq!((job.deadline_at, job.expires_at), (Some(at(5)), at(5)), "still queued at its deadline, it expires");
    // A release, a retry and a reclaim never push its expiry past the deadline.
    let lease = claim_one(&*store, at(1)).await;
    assert!(store.job_release(release_params(&lease, at(1), at(1))).await.unwrap());
    assert_eq!(get(&*store, job.id).await.expires_at, at(5));
    let lease = claim_one(&*store, at(2)).await;
    assert!(store.job_retry(retry_params(&lease, at(3), at(2))).await.unwrap());
    assert_eq!(get(&*store, job.id).await.expires_at, at(5));
    assert_eq!(store.jobs_expire_queued(JobsExpireParams { now: at(5) }).await.unwrap(), 1);
    let got = get(&*store, job.id).await;
    assert_eq!((got.status, got.error_kind), (JobStatus::Failed, Some(ErrorKind::Expired)));
    assert!(got.error_message.as_deref().unwrap().contains("deadline"), "{:?}", got.error_message);
}

fn worker_record(id: &str, now: Timestamp) -> leash::job::WorkerRecord {
    leash::job::WorkerRecord {
        worker_id: id.into(),
        host: "host-a".into(),
        pid: 42,
        version: "0.1.0".into(),
        slots: 4,
        running: 0,
        state: leash::job::WorkerState::Running,
        poll_interval_ms: 1000,
        processed: 0,
        failed: 0,
        cancelled: 0,
        started_at: now,
        last_heartbeat: now,
    }
}

pub(crate) async fn workers_register_refresh_and_are_deleted_at_retention(store: Arc<dyn JobStore>) {
    store.worker_beat(worker_record("worker-0000000a", at(0))).await.unwrap();
    store.worker_beat(worker_record("worker-0000000b", at(1))).await.unwrap();
    insert_one(&*store, new_job("x"), at(1)).await;
    let lease = claim(&*store, "worker-0000000a", 1, at(2)).await.pop().unwrap();
    // A refresh keeps `started_at` and takes everything else.
    let mut beat = worker_record("worker-0000000a", at(9));
    beat.running = 1;
    beat.processed = 5;
    beat.state = leash::job::WorkerState::Draining;
    store.worker_beat(beat).await.unwrap();
    let snapshot = store.workers_snapshot().await.unwrap();
    let ids: Vec<&str> = snapshot.workers.iter().map(|w| w.worker_id.as_str()).collect();
    assert_eq!(ids, ["worker-0000000a", "worker-0000000b"], "oldest first");
    let a = &snapshot.workers[0];
    assert_eq!((a.started_at, a.last_heartbeat, a.running, a.processed), (at(0), at(9), 1, 5));
    assert_eq!(a.state, leash::job::WorkerState::Draining);
    assert_eq!(snapshot.running_jobs, [(lease.job.id, "worker-0000000a".to_owned())]);
    assert_eq!((snapshot.counts.running, snapshot.counts.total()), (1, 1));
    // Retention deletes the rows not refreshed since the cutoff.
    assert_eq!(store.workers_delete_stale(at(5)).await.unwrap(), 1);
    let left = store.workers_snapshot().await.unwrap().workers;
    assert_eq!(left.iter().map(|w| w.worker_id.as_str()).collect::<Vec<_>>(), ["worker-0000000a"]);
}

fn died_params(worker: &str, now: Timestamp) -> WorkerDiedParams {
    WorkerDiedParams {
        worker_id: worker.into(),
        how: "killed by signal 6 (SIGABRT)".into(),
        stderr: "thread 'main' panicked\nfatal runtime error".into(),
        now,
        queue_ttl: QUEUE_TTL,
    }
}

pub(crate) async fn a_dead_workers_jobs_are_reclaimed_at_once_and_the_second_death_quarantines(
    store: Arc<dyn JobStore>,
) {
    let job = insert_one(&*store, NewJob { max_attempts: 5, free_rerun_limit: 5, ..new_job("poison") }, T0).await;
    let other = insert_one(&*store, new_job("bystander"), at(1)).await;
    store.worker_beat(worker_record("worker-0000000a", at(1))).await.unwrap();
    let first = claim(&*store, "worker-0000000a", 1, at(2)).await.pop().unwrap();
    assert_eq!(first.job.id, job.id);
    store.worker_beat(worker_record("worker-0000000b", at(2))).await.unwrap();
    let bystander = claim(&*store, "worker-0000000b", 1, at(2)).await.pop().unwrap();
    // Long before the lease runs out, the death frees the job.
    let report = store.worker_died(died_params("worker-0000000a", at(3))).await.unwrap();
    assert_eq!(report, ReclaimReport { requeued: 1, failed: 0, quarantined: 0 });
    let got = get(&*store, job.id).await;
    assert_eq!((got.status, got.process_deaths, got.free_reruns, got.lost_leases), (JobStatus::Queued, 1, 1, 0));
    assert!(!store.job_finish(succeed(&first, at(3))).await.unwrap(), "the dead process's token is void");
    assert_eq!(get(&*store, bystander.job.id).await.status, JobStatus::Running, "another worker's job stays");
    let snapshot = store.workers_snapshot().await.unwrap();
    let a = snapshot.workers.iter().find(|w| w.worker_id == "worker-0000000a").unwrap();
    assert_eq!(a.state, leash::job::WorkerState::Stopped);

    // The second process to die under it quarantines it, attempts or not.
    store.worker_beat(worker_record("worker-0000000c", at(400))).await.unwrap();
    let second = claim(&*store, "worker-0000000c", 1, at(400)).await.pop().unwrap();
    assert_eq!(second.job.id, job.id);
    assert_eq!(
        store.worker_died(died_params("worker-0000000c", at(401))).await.unwrap(),
        ReclaimReport { requeued: 0, failed: 1, quarantined: 1 }
    );
    let got = get(&*store, job.id).await;
    assert_eq!((got.status, got.error_kind, got.process_deaths), (JobStatus::Failed, Some(ErrorKind::HostCrash), 2));
    assert_eq!(got.finished_at, Some(at(401)));
    let message = got.error_message.unwrap();
    assert!(message.starts_with("HostCrash: 2 processes died while running it"), "{message}");
    assert!(message.contains("killed by signal 6 (SIGABRT)"), "{message}");
    assert!(message.ends_with("thread 'main' panicked\nfatal runtime error"), "{message}");
    assert!(claim(&*store, "worker-0000000d", 10, at(10_000)).await.is_empty(), "never claimed again");
    assert_eq!(get(&*store, other.id).await.process_deaths, 0);
    // A worker with nothing running dies quietly.
    assert_eq!(store.worker_died(died_params("worker-0000000e", at(402))).await.unwrap(), ReclaimReport::default());
}

pub(crate) async fn a_suspect_is_claimed_only_by_a_claimer_that_runs_nothing_and_alone(store: Arc<dyn JobStore>) {
    let suspect = insert_one(&*store, NewJob { max_attempts: 3, ..new_job("suspect") }, T0).await;
    claim(&*store, "worker-0000000a", 1, at(1)).await;
    store.worker_died(died_params("worker-0000000a", at(2))).await.unwrap();
    let others = insert(&*store, vec![new_job("a"), new_job("b"), new_job("c")], at(3)).await;
    let claim_as = |alone: bool| JobClaimParams {
        worker_id: "worker-0000000b".into(),
        limit: 10,
        alone,
        lease_ttl: TTL,
        now: at(400),
    };
    // A claimer with jobs running leaves the suspect, though it is due first.
    let busy = store.job_claim(claim_as(false)).await.unwrap();
    let mut got: Vec<JobId> = busy.iter().map(|l| l.job.id).collect();
    got.sort();
    let mut want: Vec<JobId> = others.iter().map(|j| j.id).collect();
    want.sort();
    assert_eq!(got, want);
    assert_eq!(get(&*store, suspect.id).await.status, JobStatus::Queued);
    for lease in &busy {
        assert!(store.job_finish(succeed(lease, at(401))).await.unwrap());
    }
    insert(&*store, vec![new_job("d"), new_job("e")], at(402)).await;
    // An empty claimer takes it, and only it, however many it asks for.
    let alone = store.job_claim(JobClaimParams { now: at(403), ..claim_as(true) }).await.unwrap();
    assert_eq!(alone.iter().map(|l| l.job.id).collect::<Vec<_>>(), [suspect.id]);
    assert_eq!(alone[0].job.process_deaths, 1);
    // With no suspect due, an empty claimer claims as any other.
    let next = store.job_claim(JobClaimParams { now: at(404), ..claim_as(true) }).await.unwrap();
    assert_eq!(next.len(), 2);
}

pub(crate) async fn an_expired_lease_whose_worker_fell_silent_counts_a_process_death(store: Arc<dyn JobStore>) {
    let job = insert_one(&*store, NewJob { max_attempts: 5, free_rerun_limit: 5, ..new_job("silent") }, T0).await;
    // Silent: the worker's last report came at the claim.
    store.worker_beat(worker_record("worker-0000000a", at(1))).await.unwrap();
    claim(&*store, "worker-0000000a", 1, at(1)).await;
    assert_eq!(reclaim(&*store, at(1).plus(TTL)).await, ReclaimReport { requeued: 1, failed: 0, quarantined: 0 });
    let got = get(&*store, job.id).await;
    assert_eq!((got.process_deaths, got.free_reruns), (1, 1));
    // Alive: its worker still reports, so only the lease was lost.
    store.worker_beat(worker_record("worker-0000000b", at(400))).await.unwrap();
    claim(&*store, "worker-0000000b", 1, at(400)).await;
    store.worker_beat(worker_record("worker-0000000b", at(430))).await.unwrap();
    assert_eq!(reclaim(&*store, at(431)).await, ReclaimReport { requeued: 1, failed: 0, quarantined: 0 });
    let got = get(&*store, job.id).await;
    assert_eq!((got.status, got.process_deaths, got.free_reruns), (JobStatus::Queued, 1, 2));
    // No row: nothing is known, nothing counted.
    claim(&*store, "worker-0000000z", 1, at(800)).await;
    assert_eq!(reclaim(&*store, at(800).plus(TTL)).await, ReclaimReport { requeued: 1, failed: 0, quarantined: 0 });
    assert_eq!(get(&*store, job.id).await.process_deaths, 1);
    // Stopped and still holding it: the second death.
    let mut stopped = worker_record("worker-0000000c", at(1200));
    stopped.state = leash::job::WorkerState::Stopped;
    store.worker_beat(worker_record("worker-0000000c", at(1200))).await.unwrap();
    claim(&*store, "worker-0000000c", 1, at(1200)).await;
    store.worker_beat(stopped).await.unwrap();
    assert_eq!(reclaim(&*store, at(1200).plus(TTL)).await, ReclaimReport { requeued: 0, failed: 1, quarantined: 1 });
    let got = get(&*store, job.id).await;
    assert_eq!((got.status, got.error_kind, got.process_deaths), (JobStatus::Failed, Some(ErrorKind::HostCrash), 2));
    assert!(got.error_message.unwrap().contains("stopped reporting to the store"));
}

// ---- approval gates ----

/// A job that waits for approval; `run_on_approve = false` holds it
/// `approved` until its run is triggered.
fn gated_job(input: &str, run_on_approve: bool) -> NewJob {
    let gate = Gate { source: GateSource::Request, run_on_approve, execution: ExecutionMode::Async, deadline_ms: None };
    NewJob { approval: Some(gate), ..new_job(input) }
}

fn decide_params(id: JobId, decision: JobDecision, by: &str, now: Timestamp) -> JobDecideParams {
    JobDecideParams {
        id,
        decision,
        by: by.into(),
        comment: Some(format!("{by} says so")),
        queue_ttl: QUEUE_TTL,
        approval_ttl: APPROVAL_TTL,
        now,
    }
}

async fn decide(
    store: &dyn JobStore,
    id: JobId,
    decision: JobDecision,
    by: &str,
    now: Timestamp,
) -> Result<Job, DecideRefusal> {
    store.job_decide(decide_params(id, decision, by, now)).await.expect("decide")
}

pub(crate) async fn a_gated_job_waits_unclaimed_and_uncounted_as_queued(store: Arc<dyn JobStore>) {
    let gated = insert_one(&*store, gated_job("g", true), T0).await;
    assert_eq!(gated.status, JobStatus::PendingApproval);
    assert_eq!(gated.expires_at, T0.plus(APPROVAL_TTL), "it waits for its approval TTL");
    assert_eq!(gated.approval.as_ref().unwrap().required_by, GateSource::Request);
    assert!(claim(&*store, "w", 10, at(1)).await.is_empty(), "a job waiting for approval is never claimed");
    let counts = store.counts_snapshot().await.unwrap();
    assert_eq!((counts.pending_approval, counts.queued), (1, 0));
    assert_eq!(store.queued_count().await.unwrap(), 0);
    let listed = store
        .job_list(JobListParams { status: Some(JobStatus::PendingApproval), limit: 10, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(listed.iter().map(|j| j.id).collect::<Vec<_>>(), vec![gated.id], "listed by its state");
}

pub(crate) async fn approval_queues_the_job_and_records_the_decision(store: Arc<dyn JobStore>) {
    let gated = insert_one(&*store, gated_job("g", true), T0).await;
    let approved = decide(&*store, gated.id, JobDecision::Approve, "alice", at(10)).await.unwrap();
    assert_eq!(approved.status, JobStatus::Queued);
    assert_eq!(approved.expires_at, at(10).plus(QUEUE_TTL), "its queue TTL counts from the approval");
    let record = approved.approval.clone().unwrap();
    let decision = record.decision.unwrap();
    assert_eq!(
        (decision.verdict, decision.by.as_str(), decision.comment.as_deref(), decision.at),
        (Verdict::Approved, "alice", Some("alice says so"), at(10))
    );
    assert_eq!(record.triggered_at, Some(at(10)));
    assert_eq!(get(&*store, gated.id).await, approved, "the answer is the row as stored");
    let lease = claim_one(&*store, at(11)).await;
    assert_eq!(lease.job.id, gated.id);
    assert!(store.job_finish(succeed(&lease, at(12))).await.unwrap());
    assert_eq!(get(&*store, gated.id).await.approval.unwrap().decision.unwrap().by, "alice", "kept to the end");
}

pub(crate) async fn a_held_approval_waits_for_its_run_trigger(store: Arc<dyn JobStore>) {
    let gated = insert_one(&*store, gated_job("g", false), T0).await;
    let approved = decide(&*store, gated.id, JobDecision::Approve, "alice", at(10)).await.unwrap();
    assert_eq!(approved.status, JobStatus::Approved);
    assert_eq!(approved.expires_at, at(10).plus(APPROVAL_TTL), "it waits for its trigger up to the approval TTL");
    assert!(claim(&*store, "w", 10, at(11)).await.is_empty(), "approved but not triggered: never claimed");
    assert_eq!(store.counts_snapshot().await.unwrap().approved, 1);
    let run = decide(&*store, gated.id, JobDecision::Run, "-", at(20)).await.unwrap();
    assert_eq!(run.status, JobStatus::Queued);
    assert_eq!(run.approval.as_ref().unwrap().triggered_at, Some(at(20)), "queued at trigger time");
    assert_eq!(run.approval.unwrap().decision.unwrap().at, at(10), "the decision keeps its own time");
    assert_eq!(claim_one(&*store, at(21)).await.job.id, gated.id);
}

pub(crate) async fn a_rejection_cancels_with_kind_rejected(store: Arc<dyn JobStore>) {
    let gated = insert_one(&*store, gated_job("g", true), T0).await;
    let rejected = decide(&*store, gated.id, JobDecision::Reject, "bob", at(5)).await.unwrap();
    assert_eq!(rejected.status, JobStatus::Cancelled);
    assert_eq!(rejected.error_kind, Some(ErrorKind::Rejected));
    assert_eq!(rejected.error_message.as_deref(), Some("Rejected: by bob: bob says so"));
    assert_eq!(rejected.finished_at, Some(at(5)));
    assert_eq!(rejected.approval.unwrap().decision.unwrap().verdict, Verdict::Rejected);
    assert_eq!(rejected.attempt, 0, "it never ran");
    assert!(claim(&*store, "w", 10, at(6)).await.is_empty());
}

pub(crate) async fn decisions_the_state_does_not_allow_are_refused_and_change_nothing(store: Arc<dyn JobStore>) {
    // Approve twice: the second is refused.
    let gated = insert_one(&*store, gated_job("a", true), T0).await;
    decide(&*store, gated.id, JobDecision::Approve, "alice", at(1)).await.unwrap();
    let before = get(&*store, gated.id).await;
    for (decision, by) in [(JobDecision::Approve, "bob"), (JobDecision::Reject, "bob"), (JobDecision::Run, "-")] {
        let refused = decide(&*store, gated.id, decision, by, at(2)).await.unwrap_err();
        assert_eq!(refused, DecideRefusal::AlreadyDecided(JobStatus::Queued), "{decision:?}");
    }
    assert_eq!(get(&*store, gated.id).await, before, "a refused decision changes nothing");
    // A run before the approval.
    let waiting = insert_one(&*store, gated_job("b", false), T0).await;
    assert_eq!(
        decide(&*store, waiting.id, JobDecision::Run, "-", at(2)).await.unwrap_err(),
        DecideRefusal::NotApproved(JobStatus::PendingApproval)
    );
    // A rejection of an approved job that waits for its trigger.
    decide(&*store, waiting.id, JobDecision::Approve, "alice", at(3)).await.unwrap();
    assert_eq!(
        decide(&*store, waiting.id, JobDecision::Reject, "bob", at(4)).await.unwrap_err(),
        DecideRefusal::AlreadyDecided(JobStatus::Approved)
    );
    // A cancelled job, a job never gated, a job that does not exist.
    let cancelled = insert_one(&*store, gated_job("c", true), T0).await;
    assert_eq!(store.job_cancel(cancelled.id, at(1)).await.unwrap(), CancelResult::Cancelled);
    assert_eq!(
        decide(&*store, cancelled.id, JobDecision::Approve, "alice", at(2)).await.unwrap_err(),
        DecideRefusal::Terminal(JobStatus::Cancelled)
    );
    let plain = insert_one(&*store, new_job("d"), T0).await;
    assert_eq!(
        decide(&*store, plain.id, JobDecision::Approve, "alice", at(2)).await.unwrap_err(),
        DecideRefusal::NotGated(JobStatus::Queued)
    );
    assert_eq!(
        decide(&*store, JobId::new(T0), JobDecision::Approve, "alice", at(2)).await.unwrap_err(),
        DecideRefusal::NotFound
    );
}

pub(crate) async fn two_approvals_racing_one_wins(store: Arc<dyn JobStore>) {
    for round in 0..5 {
        let gated = insert_one(&*store, gated_job(&format!("race {round}"), true), T0).await;
        let (a, b) = tokio::join!(
            store.job_decide(decide_params(gated.id, JobDecision::Approve, "alice", at(1))),
            store.job_decide(decide_params(gated.id, JobDecision::Reject, "bob", at(1)))
        );
        let (a, b) = (a.unwrap(), b.unwrap());
        assert!(a.is_ok() != b.is_ok(), "exactly one decision wins: {a:?} / {b:?}");
        let winner = a.or(b).unwrap();
        assert_eq!(get(&*store, gated.id).await, winner, "the row is the winner's");
    }
}

pub(crate) async fn cancel_of_a_gated_job_is_immediate(store: Arc<dyn JobStore>) {
    let pending = insert_one(&*store, gated_job("p", true), T0).await;
    let held = insert_one(&*store, gated_job("h", false), T0).await;
    decide(&*store, held.id, JobDecision::Approve, "alice", at(1)).await.unwrap();
    for id in [pending.id, held.id] {
        assert_eq!(store.job_cancel(id, at(2)).await.unwrap(), CancelResult::Cancelled);
        let job = get(&*store, id).await;
        assert_eq!((job.status, job.error_kind), (JobStatus::Cancelled, Some(ErrorKind::Cancelled)));
        assert_eq!(job.error_message.as_deref(), Some("Cancelled: cancelled while waiting for approval"));
    }
}

pub(crate) async fn a_pending_approval_expires_after_its_ttl(store: Arc<dyn JobStore>) {
    let pending = insert_one(&*store, gated_job("p", true), T0).await;
    let held = insert_one(&*store, gated_job("h", false), T0).await;
    decide(&*store, held.id, JobDecision::Approve, "alice", at(100)).await.unwrap();
    let before_ttl = T0.plus(APPROVAL_TTL).minus(Duration::from_millis(1));
    assert_eq!(store.jobs_expire_queued(JobsExpireParams { now: before_ttl }).await.unwrap(), 0);
    assert_eq!(store.jobs_expire_queued(JobsExpireParams { now: T0.plus(APPROVAL_TTL) }).await.unwrap(), 1);
    let expired = get(&*store, pending.id).await;
    assert_eq!((expired.status, expired.error_kind), (JobStatus::Failed, Some(ErrorKind::Expired)));
    assert_eq!(expired.error_message.as_deref(), Some("Expired: no decision came within its approval TTL"));
    assert_eq!(get(&*store, held.id).await.status, JobStatus::Approved, "its TTL counts from its approval");
    let later = at(100).plus(APPROVAL_TTL);
    assert_eq!(store.jobs_expire_queued(JobsExpireParams { now: later }).await.unwrap(), 1);
    let expired = get(&*store, held.id).await;
    assert_eq!(expired.error_message.as_deref(), Some("Expired: approved, but its run was never triggered"));
}

pub(crate) async fn a_sync_gate_counts_its_deadline_from_the_trigger(store: Arc<dyn JobStore>) {
    let gate = Gate {
        source: GateSource::Policy,
        run_on_approve: true,
        execution: ExecutionMode::Sync,
        deadline_ms: Some(30_000),
    };
    let job = NewJob { approval: Some(gate), deadline: Some(Duration::from_secs(30)), ..new_job("s") };
    let gated = insert_one(&*store, job, T0).await;
    assert_eq!(gated.deadline_at, None, "no deadline runs while it waits for a person");
    let queued = decide(&*store, gated.id, JobDecision::Approve, "alice", at(600)).await.unwrap();
    assert_eq!(queued.deadline_at, Some(at(630)));
    assert_eq!(queued.expires_at, at(630), "the deadline caps the queue TTL");
    assert_eq!(queued.approval.unwrap().execution, ExecutionMode::Sync);
}

pub(crate) async fn approval_policy_belongs_to_a_registration(store: Arc<dyn JobStore>) {
    let name = PluginName::new("deployer", "1").unwrap();
    let digest = put_named(&*store, b"deployer", "deployer", "1", T0).await;
    let policy = ApprovalPolicy { require: vec!["apply".parse().unwrap(), "action:deploy".parse().unwrap()] };
    let set = PluginPolicyParams { name: name.clone(), policy: policy.clone() };
    let info = store.plugin_policy_set(set).await.unwrap().expect("registered");
    assert_eq!(info.approval, policy);
    assert_eq!(resolve(&*store, "deployer").await.unwrap().approval, policy, "resolved with its policy");
    assert_eq!(store.plugin_list().await.unwrap()[0].approval, policy, "listed with its policy");
    // Replacing the bytes keeps the policy; naming a new policy sets it.
    let again = PluginNameParams { name: name.clone(), digest, policy: None, now: at(1) };
    assert_eq!(store.plugin_name_set(again).await.unwrap().approval, policy);
    let cleared = PluginNameParams { name: name.clone(), digest, policy: Some(ApprovalPolicy::default()), now: at(2) };
    assert!(store.plugin_name_set(cleared).await.unwrap().approval.is_none());
    let unknown = PluginPolicyParams { name: PluginName::new("ghost", "1").unwrap(), policy };
    assert!(store.plugin_policy_set(unknown).await.unwrap().is_none());
}

// ---- plans ----

async fn new_plan(store: &dyn JobStore, id: &str, apply_mode: ApplyMode, now: Timestamp) -> Job {
    let execute =
        NewJob { plan_id: Some(id.into()), concurrency_key: Some(id.into()), max_attempts: 2, ..new_job("want") };
    let params = PlanInsertParams { plan_id: id.into(), apply_mode, input: b"want".to_vec(), execute, now };
    let (plan, execute) = store.plan_insert(params).await.expect("plan insert");
    assert_eq!((plan.execute_job, plan.apply_job, plan.cancelled_at), (execute.id, None, None));
    execute
}

async fn advance(store: &dyn JobStore, plan: Option<&str>, now: Timestamp) -> Vec<Job> {
    store.plans_advance(PlansAdvanceParams { plan_id: plan.map(str::to_owned), now }).await.expect("advance")
}

async fn run_to(store: &dyn JobStore, finish: Finish, now: Timestamp) -> Lease {
    let lease = claim_one(store, now).await;
    assert!(store.job_finish(finish_params(&lease, finish, now)).await.unwrap());
    lease
}

pub(crate) async fn a_plan_is_stored_with_its_execute_job(store: Arc<dyn JobStore>) {
    let execute = new_plan(&*store, "01PLANA0000000000000000000", ApplyMode::Approval, T0).await;
    assert_eq!((execute.target.clone(), execute.status), (Target::Execute, JobStatus::Queued));
    assert_eq!(execute.plan_id.as_deref(), Some("01PLANA0000000000000000000"));
    let plan = store.plan_get("01PLANA0000000000000000000".into()).await.unwrap().unwrap();
    assert_eq!((plan.apply_mode, plan.input.as_slice(), plan.created_at), (ApplyMode::Approval, &b"want"[..], T0));
    new_plan(&*store, "01PLANB0000000000000000000", ApplyMode::Auto, at(1)).await;
    let listed = store.plan_list(PlanListParams { before: None, limit: 10 }).await.unwrap();
    let ids: Vec<&str> = listed.iter().map(|p| p.plan_id.as_str()).collect();
    assert_eq!(ids, ["01PLANB0000000000000000000", "01PLANA0000000000000000000"], "newest first");
    let page = store.plan_list(PlanListParams { before: Some(ids[0].into()), limit: 10 }).await.unwrap();
    assert_eq!(page.len(), 1);
    assert!(store.plan_get("01NOPE00000000000000000000".into()).await.unwrap().is_none());
    assert!(advance(&*store, None, at(2)).await.is_empty(), "nothing to advance before execute succeeds");
}

pub(crate) async fn a_succeeded_execute_leads_to_one_apply_job_with_its_output(store: Arc<dyn JobStore>) {
    let plan_id = "01PLANC0000000000000000000";
    let execute = new_plan(&*store, plan_id, ApplyMode::Approval, T0).await;
    run_to(&*store, Finish::Succeeded { output: br#"{"diff":["+a"]}"#.to_vec() }, at(1)).await;
    let created = advance(&*store, Some(plan_id), at(2)).await;
    assert_eq!(created.len(), 1);
    let apply = &created[0];
    assert_eq!((apply.target.clone(), apply.status), (Target::Apply, JobStatus::PendingApproval));
    assert_eq!(apply.approval.as_ref().unwrap().required_by, GateSource::Plan);
    assert_eq!((apply.plan_id.as_deref(), apply.concurrency_key.as_deref()), (Some(plan_id), Some(plan_id)));
    assert_eq!((apply.plugin, apply.max_attempts, &apply.limits), (execute.plugin, 2, &execute.limits));
    let input: ApplyInput = serde_json::from_slice(&get(&*store, apply.id).await.input).unwrap();
    assert_eq!(input.execute_job_id, execute.id);
    assert_eq!(input.execute_output, Some(serde_json::json!({"diff": ["+a"]})));
    assert_eq!(input.input_base64, "d2FudA==", "the plan's own input rides along");
    assert_eq!(store.plan_get(plan_id.into()).await.unwrap().unwrap().apply_job, Some(apply.id));
    assert!(advance(&*store, None, at(3)).await.is_empty(), "at most one apply job per plan");
    let (a, b) = tokio::join!(advance(&*store, None, at(4)), advance(&*store, Some(plan_id), at(4)));
    assert!(a.is_empty() && b.is_empty());

    // `auto`: queued at once, claimable only once execute has ended.
    let auto = "01PLAND0000000000000000000";
    new_plan(&*store, auto, ApplyMode::Auto, at(5)).await;
    run_to(&*store, Finish::Succeeded { output: b"plan".to_vec() }, at(6)).await;
    let created = advance(&*store, None, at(7)).await;
    assert_eq!(created.len(), 1);
    assert_eq!((created[0].status, created[0].approval.is_none()), (JobStatus::Queued, true));
    assert_eq!(claim_one(&*store, at(8)).await.job.id, created[0].id);
}

pub(crate) async fn a_failed_or_cancelled_plan_never_gets_an_apply_job(store: Arc<dyn JobStore>) {
    new_plan(&*store, "01PLANE0000000000000000000", ApplyMode::Auto, T0).await;
    let failure = Finish::Failed { kind: ErrorKind::GuestError, message: "GuestError: no".into(), backtrace: None };
    run_to(&*store, failure, at(1)).await;
    assert!(advance(&*store, None, at(2)).await.is_empty(), "a failed execute ends the plan");

    let plan_id = "01PLANF0000000000000000000";
    new_plan(&*store, plan_id, ApplyMode::Auto, at(3)).await;
    let lease = claim_one(&*store, at(4)).await;
    let cancelled = store.plan_cancel(plan_id.into(), at(5)).await.unwrap().unwrap();
    assert_eq!(cancelled.cancelled_at, Some(at(5)));
    let again = store.plan_cancel(plan_id.into(), at(6)).await.unwrap().unwrap();
    assert_eq!(again.cancelled_at, Some(at(5)), "the first cancel's time is kept");
    // Its execute finished anyway (the guest returned first): still no apply.
    assert!(store.job_finish(succeed(&lease, at(7))).await.unwrap());
    assert!(advance(&*store, None, at(8)).await.is_empty(), "a cancelled plan is not advanced");
    assert!(store.plan_cancel("01NOPE00000000000000000000".into(), at(9)).await.unwrap().is_none());
}

pub(crate) async fn retention_keeps_a_plans_phases_until_the_last_ends(store: Arc<dyn JobStore>) {
    let plan_id = "01PLANG0000000000000000000";
    let execute = new_plan(&*store, plan_id, ApplyMode::Approval, T0).await;
    run_to(&*store, Finish::Succeeded { output: b"diff".to_vec() }, at(1)).await;
    let delete =
        |cutoff| store.jobs_delete_expired(JobsDeleteParams { finished_before: cutoff, events_before: KEEP_EVENTS });
    assert_eq!(delete(at(100)).await.unwrap(), 0, "an execute job whose apply is still to be created is kept");
    let apply = advance(&*store, None, at(2)).await.remove(0);
    assert_eq!(delete(at(100)).await.unwrap(), 0, "an execute job whose apply waits is kept");
    decide(&*store, apply.id, JobDecision::Approve, "alice", at(3)).await.unwrap();
    run_to(&*store, Finish::Succeeded { output: b"done".to_vec() }, at(4)).await;
    assert_eq!(delete(at(100)).await.unwrap(), 2, "both phases go once the last has ended");
    assert!(store.job_get(execute.id).await.unwrap().is_none());
    assert!(store.plan_get(plan_id.into()).await.unwrap().is_none(), "and the plan with them");
}

/// The `n` events after `after`, read a few at a time. On PostgreSQL an
/// event becomes readable once every older transaction on the server has
/// ended (tests running beside this one hold some open for a moment), so
/// the read goes on until `n` have come, and then checks no more follow.
async fn events_since(store: &dyn JobStore, mut after: Option<EventId>, n: usize) -> Vec<Event> {
    let start = std::time::Instant::now();
    let mut events = Vec::new();
    loop {
        let page = store.events_after(EventsAfterParams { after, limit: 3 }).await.expect("events");
        assert!(!page.missed, "nothing was deleted");
        match page.events.last() {
            Some(last) => {
                after = Some(last.id);
                events.extend(page.events);
                assert!(events.len() <= n, "more events than the {n} expected: {events:#?}");
            }
            None if events.len() == n => return events,
            None => {
                assert!(start.elapsed() < Duration::from_secs(60), "{} of {n} events came: {events:#?}", events.len());
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// What happened to `id`, in order: each event's kind and the job's state.
fn story(events: &[Event], id: JobId) -> Vec<(EventKind, JobStatus)> {
    events.iter().filter_map(|e| e.job.as_ref().filter(|j| j.id == id).map(|j| (e.kind, j.status))).collect()
}

pub(crate) async fn every_change_appends_one_event_in_commit_order(store: Arc<dyn JobStore>) {
    let start = store.events_head().await.unwrap();
    let job = insert_one(&*store, NewJob { plan_id: Some("p-1".into()), ..new_job("e") }, T0).await;
    let lease = claim_one(&*store, at(1)).await;
    let report = JobProgressParams { id: job.id, token: lease.token.clone(), progress: progress_at(1), now: at(2) };
    assert!(store.job_progress_set(report.clone()).await.unwrap());
    assert!(store.job_progress_set(report).await.unwrap(), "the same report again is no new event");
    assert_eq!(store.job_cancel(job.id, at(3)).await.unwrap(), CancelResult::Requested);
    assert_eq!(store.job_cancel(job.id, at(3)).await.unwrap(), CancelResult::Requested, "nor a second ask");
    assert!(store.job_finish(succeed(&lease, at(4))).await.unwrap());
    let requeued = insert_one(&*store, NewJob { max_attempts: 2, ..new_job("r") }, at(5)).await;
    let second = claim_one(&*store, at(6)).await;
    assert!(store.job_release(release_params(&second, at(6), at(6))).await.unwrap());
    let stale = JobProgressParams { id: job.id, token: "stale".into(), progress: progress_at(2), now: at(7) };
    assert!(!store.job_progress_set(stale).await.unwrap(), "a refused write is no event");

    let events = events_since(&*store, start, 8).await;
    use EventKind::*;
    use JobStatus::*;
    assert_eq!(
        story(&events, job.id),
        [
            (JobSubmitted, Queued),
            (JobStarted, Running),
            (JobProgress, Running),
            (JobCancelRequested, Running),
            (JobFinished, Succeeded)
        ]
    );
    assert_eq!(story(&events, requeued.id), [(JobSubmitted, Queued), (JobStarted, Running), (JobRequeued, Queued)]);
    assert!(events.windows(2).all(|w| w[0].id < w[1].id), "ids rise in commit order");
    assert_eq!(store.events_head().await.unwrap(), Some(events[7].id));
    let about = |i: usize| events[i].job.clone().unwrap();
    assert_eq!(
        (about(0).plan_id.as_deref(), about(0).digest, about(0).target),
        (Some("p-1"), job.plugin, Target::Execute)
    );
    assert_eq!((about(1).worker_id.as_deref(), about(1).attempt), (Some("worker-aaaaaaaa"), 1));
    assert_eq!(about(2).progress, Some(progress_at(1)));
    assert_eq!((about(4).previous_status, about(4).error_kind), (Some(Running), None));
    assert_eq!(about(7).previous_status, Some(Running));
}

pub(crate) async fn a_decision_and_a_worker_change_are_events(store: Arc<dyn JobStore>) {
    let start = store.events_head().await.unwrap();
    let gated = insert_one(&*store, gated_job("g", true), T0).await;
    decide(&*store, gated.id, JobDecision::Approve, "alice", at(1)).await.unwrap();
    let rejected = insert_one(&*store, gated_job("h", true), at(2)).await;
    decide(&*store, rejected.id, JobDecision::Reject, "bob", at(3)).await.unwrap();
    store.worker_beat(worker_record("worker-0000000a", at(4))).await.unwrap();
    store.worker_beat(worker_record("worker-0000000a", at(5))).await.unwrap();
    let mut draining = worker_record("worker-0000000a", at(6));
    draining.state = leash::job::WorkerState::Draining;
    store.worker_beat(draining).await.unwrap();
    assert_eq!(store.workers_delete_stale(at(7)).await.unwrap(), 1);

    let events = events_since(&*store, start, 7).await;
    use EventKind::*;
    use JobStatus::*;
    assert_eq!(story(&events, gated.id), [(JobApprovalNeeded, PendingApproval), (JobApproved, Queued)]);
    let finished = events.iter().find(|e| e.job.as_ref().is_some_and(|j| j.id == rejected.id && e.kind == JobFinished));
    assert_eq!(finished.unwrap().job.as_ref().unwrap().error_kind, Some(ErrorKind::Rejected));
    let workers: Vec<_> = events
        .iter()
        .filter_map(|e| e.worker.as_ref().map(|w| (e.kind, w.id.as_str(), w.state, w.previous_state)))
        .collect();
    use leash::job::WorkerState as W;
    assert_eq!(
        workers,
        [
            (WorkerJoined, "worker-0000000a", W::Running, None),
            (WorkerChanged, "worker-0000000a", W::Draining, Some(W::Running)),
            (WorkerLeft, "worker-0000000a", W::Draining, None),
        ],
        "a refresh that changes no state is no event"
    );
}

pub(crate) async fn events_resume_after_any_id_and_page_in_order(store: Arc<dyn JobStore>) {
    let start = store.events_head().await.unwrap();
    let jobs = insert(&*store, (0..5).map(|i| new_job(&format!("j{i}"))).collect(), T0).await;
    events_since(&*store, start, 5).await;
    let first = store.events_after(EventsAfterParams { after: start, limit: 2 }).await.unwrap();
    assert_eq!(first.events.len(), 2, "a page holds at most its limit");
    let rest = events_since(&*store, Some(first.events[1].id), 3).await;
    let all: Vec<JobId> = first.events.iter().chain(&rest).map(|e| e.job.as_ref().unwrap().id).collect();
    assert_eq!(all, jobs.iter().map(|j| j.id).collect::<Vec<_>>(), "inserted together, in order");
    let tail = store.events_after(EventsAfterParams { after: Some(rest[2].id), limit: 10 }).await.unwrap();
    assert_eq!(tail.events, [], "nothing after the newest");
}

pub(crate) async fn retention_deletes_old_events_and_a_reader_behind_hears_it_missed_some(store: Arc<dyn JobStore>) {
    let start = store.events_head().await.unwrap();
    insert(&*store, vec![new_job("a"), new_job("b"), new_job("c")], T0).await;
    let old = events_since(&*store, start, 3).await;
    let everything = Timestamp::now().plus(Duration::from_secs(3600));
    store.jobs_delete_expired(JobsDeleteParams { finished_before: T0, events_before: everything }).await.unwrap();
    // Every event older than the cutoff goes but the newest, which is kept.
    let behind = store.events_after(EventsAfterParams { after: Some(old[0].id), limit: 10 }).await.unwrap();
    assert!(behind.missed, "{behind:?}");
    assert_eq!(behind.events, old[2..], "the newest event is kept");
    let from_oldest = store.events_after(EventsAfterParams { after: None, limit: 10 }).await.unwrap();
    assert!(!from_oldest.missed, "{from_oldest:?}");
    assert_eq!(from_oldest.events, old[2..]);
    let at_the_cut = store.events_after(EventsAfterParams { after: Some(old[1].id), limit: 10 }).await.unwrap();
    assert!(!at_the_cut.missed, "a reader at the cut missed nothing: {at_the_cut:?}");
    let newer = insert_one(&*store, new_job("d"), at(1)).await;
    let caught_up = events_since(&*store, Some(old[2].id), 1).await;
    assert_eq!(story(&caught_up, newer.id), [(EventKind::JobSubmitted, JobStatus::Queued)]);
    assert!(caught_up[0].id > old[2].id, "a new event's id is past every earlier one");
    let behind = store.events_after(EventsAfterParams { after: Some(old[0].id), limit: 10 }).await.unwrap();
    assert!(behind.missed && behind.events.len() == 2, "it missed one, then reads on: {behind:?}");
    assert_eq!(store.events_head().await.unwrap(), Some(caught_up[0].id));
}
