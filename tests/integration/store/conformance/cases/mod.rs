//! The cases every `JobStore` backend must pass, unchanged: each gets a
//! fresh, empty store and drives time by passing `now` explicitly. The
//! list in `../mod.rs` runs each one as its own test on every backend.
//!
//! Each role of the store has its cases in its own file; what they share
//! (a made-up job, fixed points in time, short calls) is here. A behaviour
//! change to the store is a new case in its role's file.

pub(crate) mod attempts;
pub(crate) mod effects;
pub(crate) mod events;
pub(crate) mod flow;
pub(crate) mod jobs;
pub(crate) mod labels;
pub(crate) mod leases;
pub(crate) mod plans;
pub(crate) mod plugins;
pub(crate) mod principals;
pub(crate) mod rates;
pub(crate) mod schedules;
pub(crate) mod sessions;
pub(crate) mod sweeps;
pub(crate) mod workers;

use std::time::Duration;

use leash::clock::Timestamp;
use leash::job::{
    ApplyMode, Digest, Duties, EffectOutcome, ErrorKind, Event, EventId, EventKind, ExecutionMode, Gate, GateSource,
    Job, JobId, JobLimits, JobProgress, JobStatus, NewJob, PluginName, Target,
};
use leash::store::{
    DecideRefusal, EffectBeginParams, EffectEndParams, EventsAfterParams, Finish, JobClaimParams, JobDecideParams,
    JobDecision, JobFinishParams, JobInsertParams, JobReleaseParams, JobRetryParams, JobStore, Lease,
    LeaseReclaimParams, PlanInsertParams, PlansAdvanceParams, PluginNameParams, PluginPutParams, ReclaimReport,
    WorkerDiedParams,
};

pub(crate) const T0: Timestamp = Timestamp::from_unix_ms(1_800_000_000_000);

pub(crate) const TTL: Duration = Duration::from_secs(30);

pub(crate) const QUEUE_TTL: Duration = Duration::from_secs(3600);

pub(crate) const APPROVAL_TTL: Duration = Duration::from_secs(7200);

/// An event cutoff that deletes no event (the store stamps events with
/// its own clock, not the cases' `now`).
pub(crate) const KEEP_EVENTS: Timestamp = Timestamp::from_unix_ms(0);

pub(crate) fn at(seconds: u64) -> Timestamp {
    T0.plus(Duration::from_secs(seconds))
}

/// A queued job of a made-up plugin with small limits, one attempt and no
/// free re-runs, for store tests.
pub(crate) fn new_job(input: &str) -> NewJob {
    let limits =
        JobLimits { timeout: Duration::from_secs(1), fuel: Some(5), memory_bytes: 1 << 20, output_bytes: 1 << 10 };
    NewJob {
        queue_ttl: QUEUE_TTL,
        approval_ttl: APPROVAL_TTL,
        ..NewJob::new(Digest::of(b"plugin"), Target::Execute, input.as_bytes().to_vec(), limits)
    }
}

pub(crate) async fn insert(store: &dyn JobStore, jobs: Vec<NewJob>, now: Timestamp) -> Vec<Job> {
    store.job_insert(JobInsertParams { jobs, now }).await.expect("insert")
}

pub(crate) async fn insert_one(store: &dyn JobStore, job: NewJob, now: Timestamp) -> Job {
    insert(store, vec![job], now).await.pop().unwrap()
}

pub(crate) async fn claim(store: &dyn JobStore, worker: &str, limit: u32, now: Timestamp) -> Vec<Lease> {
    let leases = store
        .job_claim(JobClaimParams { worker_id: worker.into(), limit, alone: true, lease_ttl: TTL, now, aged: 0 })
        .await
        .expect("claim");
    for lease in &leases {
        assert_eq!(lease.job, get(store, lease.job.id).await, "a claim returns the row as stored");
    }
    leases
}

/// A claim of up to `limit` jobs by `worker` at `now`, by a pool running
/// other jobs (no suspects), with no aged share.
pub(crate) fn claim_params(worker: &str, limit: u32, now: Timestamp) -> JobClaimParams {
    JobClaimParams { worker_id: worker.into(), limit, alone: false, lease_ttl: TTL, now, aged: 0 }
}

pub(crate) async fn claim_one(store: &dyn JobStore, now: Timestamp) -> Lease {
    let mut leases = claim(store, "worker-aaaaaaaa", 1, now).await;
    assert_eq!(leases.len(), 1, "expected one job to claim");
    leases.pop().unwrap()
}

pub(crate) async fn get(store: &dyn JobStore, id: JobId) -> Job {
    store.job_get(id).await.expect("get").expect("job exists")
}

pub(crate) fn finish_params(lease: &Lease, finish: Finish, now: Timestamp) -> JobFinishParams {
    JobFinishParams {
        id: lease.job.id,
        token: lease.token.clone(),
        finish,
        fuel_used: 7,
        peak_memory_bytes: 65536,
        progress: None,
        logs: None,
        proposals: Vec::new(),
        now,
    }
}

pub(crate) fn succeed(lease: &Lease, now: Timestamp) -> JobFinishParams {
    finish_params(lease, Finish::Succeeded { output: b"out".to_vec() }, now)
}

pub(crate) async fn reclaim(store: &dyn JobStore, now: Timestamp) -> ReclaimReport {
    store.lease_reclaim_expired(LeaseReclaimParams { now, queue_ttl: QUEUE_TTL }).await.expect("reclaim")
}

pub(crate) async fn put_named(store: &dyn JobStore, bytes: &[u8], name: &str, version: &str, now: Timestamp) -> Digest {
    let digest =
        store.plugin_put(PluginPutParams { bytes: bytes.to_vec(), requests: None, actor: None, now }).await.unwrap();
    let name = PluginName::new(name, version).unwrap();
    let info = store
        .plugin_name_set(PluginNameParams { name: name.clone(), digest, policy: None, actor: None, now })
        .await
        .unwrap();
    assert_eq!((info.name, info.digest, info.size_bytes), (Some(name), digest, bytes.len() as u64));
    digest
}

pub(crate) async fn resolve(store: &dyn JobStore, reference: &str) -> Option<leash::job::PluginInfo> {
    store.plugin_resolve(reference.parse().unwrap()).await.unwrap()
}

pub(crate) fn progress_at(done: u64) -> JobProgress {
    JobProgress { done, total: 10, note: format!("step {done}") }
}

/// Record an effect's intent under `lease` (its URL names `what`).
pub(crate) async fn intent(store: &dyn JobStore, lease: &Lease, what: &str, now: Timestamp) -> leash::job::Effect {
    let params = EffectBeginParams {
        id: lease.job.id,
        token: lease.token.clone(),
        method: "POST".into(),
        url: format!("https://api.example.com/{what}"),
        proposal: None,
        now,
    };
    store.effect_begin(params).await.unwrap().expect("recorded under the lease")
}

/// Record that `effect` was answered with `status`.
pub(crate) async fn answered(
    store: &dyn JobStore,
    id: JobId,
    effect: &leash::job::Effect,
    status: u16,
    now: Timestamp,
) {
    let outcome = EffectOutcome::Status(status);
    let params = EffectEndParams { id, attempt: effect.attempt, seq: effect.seq, outcome, now };
    store.effect_end(params).await.unwrap();
}

pub(crate) fn release_params(lease: &Lease, run_after: Timestamp, now: Timestamp) -> JobReleaseParams {
    JobReleaseParams { id: lease.job.id, token: lease.token.clone(), queue_ttl: QUEUE_TTL, run_after, now }
}

pub(crate) fn retry_params(lease: &Lease, run_after: Timestamp, now: Timestamp) -> JobRetryParams {
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

pub(crate) fn worker_record(id: &str, now: Timestamp) -> leash::job::WorkerRecord {
    leash::job::WorkerRecord {
        worker_id: id.into(),
        host: "host-a".into(),
        pid: 42,
        version: "0.1.0".into(),
        slots: 4,
        running: 0,
        state: leash::job::WorkerState::Running,
        poll_interval: Duration::from_secs(1),
        processed: 0,
        failed: 0,
        cancelled: 0,
        started_at: now,
        last_heartbeat: now,
    }
}

pub(crate) fn died_params(worker: &str, now: Timestamp) -> WorkerDiedParams {
    WorkerDiedParams {
        worker_id: worker.into(),
        how: "killed by signal 6 (SIGABRT)".into(),
        stderr: "thread 'main' panicked\nfatal runtime error".into(),
        now,
        queue_ttl: QUEUE_TTL,
    }
}

/// A job that waits for approval; `run_on_approve = false` holds it
/// `approved` until its run is triggered.
pub(crate) fn gated_job(input: &str, run_on_approve: bool) -> NewJob {
    let gate = Gate {
        source: GateSource::Request,
        run_on_approve,
        execution: ExecutionMode::Async,
        deadline: None,
        duties: Duties::default(),
    };
    NewJob { approval: Some(gate), ..new_job(input) }
}

pub(crate) fn decide_params(id: JobId, decision: JobDecision, by: &str, now: Timestamp) -> JobDecideParams {
    JobDecideParams {
        id,
        decision,
        by: by.into(),
        comment: Some(format!("{by} says so")),
        key: None,
        queue_ttl: QUEUE_TTL,
        approval_ttl: APPROVAL_TTL,
        remember: None,
        rule: None,
        binding: None,
        now,
    }
}

pub(crate) async fn decide(
    store: &dyn JobStore,
    id: JobId,
    decision: JobDecision,
    by: &str,
    now: Timestamp,
) -> Result<Job, DecideRefusal> {
    store.job_decide(decide_params(id, decision, by, now)).await.expect("decide")
}

pub(crate) async fn new_plan(store: &dyn JobStore, id: &str, apply_mode: ApplyMode, now: Timestamp) -> Job {
    let execute =
        NewJob { plan_id: Some(id.into()), concurrency_key: Some(id.into()), max_attempts: 2, ..new_job("want") };
    let params = PlanInsertParams { plan_id: id.into(), apply_mode, input: b"want".to_vec(), execute, now };
    let (plan, execute) = store.plan_insert(params).await.expect("plan insert");
    assert_eq!((plan.execute_job, plan.apply_job, plan.cancelled_at), (execute.id, None, None));
    execute
}

pub(crate) async fn advance(store: &dyn JobStore, plan: Option<&str>, now: Timestamp) -> Vec<Job> {
    store.plans_advance(PlansAdvanceParams { plan_id: plan.map(str::to_owned), now }).await.expect("advance")
}

pub(crate) async fn run_to(store: &dyn JobStore, finish: Finish, now: Timestamp) -> Lease {
    let lease = claim_one(store, now).await;
    assert!(store.job_finish(finish_params(&lease, finish, now)).await.unwrap());
    lease
}

/// The `n` events after `after`, read a few at a time. On PostgreSQL an
/// event becomes readable once every older transaction on the server has
/// ended (tests running beside this one hold some open for a moment), so
/// the read goes on until `n` have come, and then checks no more follow.
pub(crate) async fn events_since(store: &dyn JobStore, mut after: Option<EventId>, n: usize) -> Vec<Event> {
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
pub(crate) fn story(events: &[Event], id: JobId) -> Vec<(EventKind, JobStatus)> {
    events.iter().filter_map(|e| e.job.as_ref().filter(|j| j.id == id).map(|j| (e.kind, j.status))).collect()
}
