//! An exhaustive check of the lease protocol: every interleaving, up to a
//! depth, of two workers (claim, renew, record an effect's intent, finish,
//! release on shutdown), the sweeper (reclaim, approval expiry), a
//! canceller, an approver (approve, reject, trigger the run) and the
//! passing of time, on one job, ungated or gated.
//!
//! The model is the protocol as DESIGN.md states it. Every reachable state
//! is checked against the invariants (never two live owners; a stale token
//! never changes the row; no run after `max_attempts` spent attempts;
//! effects issued in at most `max_attempts` attempts, however often the job
//! was re-run for free; running exactly when a lease exists; a released job
//! is claimable, since release leads to `queued`; a gated job never runs
//! unless approved, and a rejected one never runs), and the trace that first
//! reaches each state is replayed on the real stores, whose row must match
//! the model after every step (so the store implements the protocol the
//! model checks). Deliberately broken variants — finish without the token
//! fence, a release that ignores the attempt's effects — must be caught.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use leash::clock::Timestamp;
use leash::job::{Digest, Duties, ExecutionMode, Gate, GateSource, JobId, JobLimits, JobStatus, NewJob, Target};
use leash::store::{
    CancelResult, EffectBeginParams, Finish, JobClaimParams, JobDecideParams, JobDecision, JobFinishParams,
    JobInsertParams, JobReleaseParams, JobStore, JobsExpireParams, LeaseExtendParams, LeaseReclaimParams, LeaseState,
};

const WORKERS: usize = 2;
/// How many steps deep every interleaving is explored.
const DEPTH: usize = 12;
const TTL: Duration = Duration::from_secs(30);
/// How long a gated job waits for its decision in the replays.
const APPROVAL_TTL: Duration = Duration::from_secs(3600);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Status {
    PendingApproval,
    Approved,
    Queued,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

/// Whether the job waits for approval, and what approval does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Gating {
    /// Queued at once.
    None,
    /// Approval queues it.
    Run,
    /// Approval leaves it `approved` until its run is triggered.
    Hold,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Model {
    gating: Gating,
    /// Ghost: a person approved it.
    approved: bool,
    /// Ghost: a person rejected it.
    rejected: bool,
    status: Status,
    /// The current lease's token (a claim counter), while running.
    token: Option<u8>,
    attempt: u8,
    lost: u8,
    retries: u8,
    max_attempts: u8,
    /// Re-runs that spent no attempt (a lost lease with no effect).
    free: u8,
    /// The current attempt recorded an effect's intent.
    effect: bool,
    /// Ghost: attempts that recorded an effect.
    effectful_attempts: u8,
    cancel_requested: bool,
    /// The lease has run out (time passed without a renewal).
    expired: bool,
    /// What each worker believes it holds.
    held: [Option<u8>; WORKERS],
    /// Claims so far (tokens are 1, 2, …).
    claims: u8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Action {
    Claim(usize),
    Renew(usize),
    Effect(usize),
    Finish(usize),
    Release(usize),
    Expire,
    Reclaim,
    Cancel,
    Approve,
    Reject,
    Trigger,
    /// The approval TTL passes and the expiry sweep runs.
    GateExpire,
}

/// The free re-runs a job in the model may have.
const FREE_RERUNS: u8 = 1;

/// A deliberately broken protocol the checker must catch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Broken {
    No,
    /// Finish without the token fence.
    UnfencedFinish,
    /// A release at shutdown that costs nothing even after an effect.
    ReleaseIgnoresEffects,
    /// A claim that takes a job still waiting for approval.
    ClaimIgnoresGate,
}

/// The protocol's rules.
fn step(m: &Model, action: Action, broken: Broken) -> Option<Model> {
    let mut n = m.clone();
    let owns = |w: usize| m.status == Status::Running && m.held[w].is_some() && m.held[w] == m.token;
    match action {
        Action::Claim(w) => {
            let claimable = m.status == Status::Queued
                || (broken == Broken::ClaimIgnoresGate && m.status == Status::PendingApproval);
            if m.held[w].is_some() || !claimable {
                return None;
            }
            n.claims += 1;
            n.status = Status::Running;
            n.token = Some(n.claims);
            n.attempt += 1;
            n.effect = false;
            n.cancel_requested = false;
            n.expired = false;
            n.held[w] = n.token;
        }
        Action::Renew(w) => {
            m.held[w]?;
            if owns(w) && !m.expired {
                // Held: the lease is extended.
            } else if owns(w) {
                // Ran out but not yet reclaimed: the renewal still matches
                // the row and extends it (the store cannot tell).
                n.expired = false;
            } else {
                n.held[w] = None; // lost: the worker stops and drops its result
            }
        }
        Action::Effect(w) => {
            m.held[w]?;
            if owns(w) {
                // The intent is recorded under the token (an expired lease
                // not yet reclaimed still matches it).
                if !m.effect {
                    n.effectful_attempts += 1;
                }
                n.effect = true;
            } else {
                n.held[w] = None; // refused: the worker learns it lost the lease
            }
        }
        Action::Finish(w) => {
            m.held[w]?;
            if owns(w) || (broken == Broken::UnfencedFinish && m.status == Status::Running) {
                n.status = Status::Succeeded;
                n.token = None;
                n.expired = false;
            }
            n.held[w] = None;
        }
        Action::Release(w) => {
            m.held[w]?;
            if owns(w) {
                n.token = None;
                n.expired = false;
                n.status = Status::Queued;
                if m.effect && broken != Broken::ReleaseIgnoresEffects {
                    // Spends an attempt: max_attempts decides.
                    if m.lost + m.retries + 1 < m.max_attempts {
                        n.retries += 1;
                    } else {
                        n.status = Status::Failed;
                    }
                }
            }
            n.held[w] = None;
        }
        Action::Expire => {
            if m.status != Status::Running || m.expired {
                return None;
            }
            n.expired = true;
        }
        Action::Reclaim => {
            if m.status != Status::Running || !m.expired {
                return None;
            }
            n.token = None;
            n.expired = false;
            n.status = if m.cancel_requested {
                n.lost += 1;
                Status::Cancelled
            } else if !m.effect && m.free < FREE_RERUNS {
                n.free += 1;
                Status::Queued
            } else {
                n.lost += 1;
                if m.lost + m.retries + 1 < m.max_attempts { Status::Queued } else { Status::Failed }
            };
        }
        Action::Cancel => match m.status {
            Status::Queued | Status::PendingApproval | Status::Approved => n.status = Status::Cancelled,
            Status::Running if !m.cancel_requested => n.cancel_requested = true,
            _ => return None,
        },
        // Decisions on any other state are refused and change nothing
        // (the conformance suite checks each refusal).
        Action::Approve => {
            if m.status != Status::PendingApproval {
                return None;
            }
            n.approved = true;
            n.status = if m.gating == Gating::Hold { Status::Approved } else { Status::Queued };
        }
        Action::Reject => {
            if m.status != Status::PendingApproval {
                return None;
            }
            n.rejected = true;
            n.status = Status::Cancelled;
        }
        Action::Trigger => {
            if m.status != Status::Approved {
                return None;
            }
            n.status = Status::Queued;
        }
        Action::GateExpire => {
            if !matches!(m.status, Status::PendingApproval | Status::Approved) {
                return None;
            }
            n.status = Status::Failed;
        }
    }
    Some(n)
}

/// What must hold in every reachable state.
fn check(m: &Model) -> Result<(), String> {
    let live = (0..WORKERS).filter(|&w| m.status == Status::Running && m.held[w].is_some() && m.held[w] == m.token);
    if live.count() > 1 {
        return Err("two live owners".into());
    }
    let spent = m.lost + m.retries;
    if spent > m.max_attempts || (m.status == Status::Running && spent >= m.max_attempts) {
        return Err(format!("ran after {spent} spent attempts with max_attempts {}", m.max_attempts));
    }
    if m.effectful_attempts > m.max_attempts {
        return Err(format!("effects in {} attempts with max_attempts {}", m.effectful_attempts, m.max_attempts));
    }
    if m.free > FREE_RERUNS {
        return Err(format!("{} free re-runs, over the limit", m.free));
    }
    if (m.status == Status::Running) != m.token.is_some() {
        return Err("running ⇔ token broken".into());
    }
    if m.gating != Gating::None && m.attempt > 0 && !m.approved {
        return Err("a gated job ran without an approval".into());
    }
    if m.rejected && m.attempt > 0 {
        return Err("a rejected job ran".into());
    }
    Ok(())
}

/// What must hold of every step: a worker that does not own the job
/// changes nothing in its row.
fn check_step(before: &Model, action: Action, after: &Model) -> Result<(), String> {
    let worker = match action {
        Action::Renew(w) | Action::Effect(w) | Action::Finish(w) | Action::Release(w) => w,
        _ => return Ok(()),
    };
    let owned =
        before.status == Status::Running && before.held[worker].is_some() && before.held[worker] == before.token;
    let row = |m: &Model| (m.status, m.token, m.attempt, m.lost, m.retries, m.effect, m.cancel_requested);
    if !owned && row(before) != row(after) {
        return Err(format!("a stale token changed the row ({action:?})"));
    }
    Ok(())
}

const ACTIONS: [Action; 17] = [
    Action::Claim(0),
    Action::Claim(1),
    Action::Renew(0),
    Action::Renew(1),
    Action::Effect(0),
    Action::Effect(1),
    Action::Finish(0),
    Action::Finish(1),
    Action::Release(0),
    Action::Release(1),
    Action::Expire,
    Action::Reclaim,
    Action::Cancel,
    Action::Approve,
    Action::Reject,
    Action::Trigger,
    Action::GateExpire,
];

/// What is explored: each `max_attempts` ungated, and a gated job of each
/// kind (one attempt: the gate comes before the attempts).
const CONFIGS: [(u8, Gating); 4] = [(1, Gating::None), (2, Gating::None), (1, Gating::Run), (1, Gating::Hold)];

fn initial(max_attempts: u8, gating: Gating) -> Model {
    Model {
        gating,
        approved: false,
        rejected: false,
        status: if gating == Gating::None { Status::Queued } else { Status::PendingApproval },
        token: None,
        attempt: 0,
        lost: 0,
        retries: 0,
        max_attempts,
        free: 0,
        effect: false,
        effectful_attempts: 0,
        cancel_requested: false,
        expired: false,
        held: [None; WORKERS],
        claims: 0,
    }
}

/// Breadth-first over every state reachable within `depth` steps. Returns
/// the number of states and, for each state, the trace that first reached
/// it; or the first violation with its trace.
/// A violated rule and the trace that reaches it.
type Violation = (String, Vec<Action>);

fn explore(
    max_attempts: u8,
    gating: Gating,
    depth: usize,
    broken: Broken,
) -> Result<(usize, Vec<Vec<Action>>), Violation> {
    let start = initial(max_attempts, gating);
    let mut seen = HashSet::from([start.clone()]);
    let mut queue = VecDeque::from([(start, Vec::new())]);
    let mut traces = Vec::new();
    while let Some((model, trace)) = queue.pop_front() {
        for action in ACTIONS {
            let Some(next) = step(&model, action, broken) else { continue };
            let mut longer = trace.clone();
            longer.push(action);
            check(&next).and_then(|()| check_step(&model, action, &next)).map_err(|e| (e, longer.clone()))?;
            if seen.insert(next.clone()) {
                traces.push(longer.clone());
                if longer.len() < depth {
                    queue.push_back((next, longer));
                }
            }
        }
    }
    Ok((seen.len(), traces))
}

#[test]
fn the_lease_protocol_keeps_its_invariants_in_every_interleaving() {
    for (max_attempts, gating) in CONFIGS {
        let (states, _) =
            explore(max_attempts, gating, DEPTH, Broken::No).unwrap_or_else(|(e, trace)| panic!("{e}: {trace:?}"));
        assert!(states > 100, "explored {states} states");
        println!("max_attempts {max_attempts}, gate {gating:?}: {states} states explored");
    }
}

#[test]
fn the_checker_catches_a_finish_without_the_token_fence() {
    let (error, trace) =
        explore(2, Gating::None, DEPTH, Broken::UnfencedFinish).expect_err("the broken variant must be caught");
    assert!(error.contains("stale token") || error.contains("owners"), "{error}: {trace:?}");
}

#[test]
fn the_checker_catches_a_release_that_forgets_the_attempts_effects() {
    let (error, trace) =
        explore(1, Gating::None, DEPTH, Broken::ReleaseIgnoresEffects).expect_err("the broken variant must be caught");
    assert!(error.contains("effects in 2 attempts"), "{error}: {trace:?}");
}

#[test]
fn the_checker_catches_a_claim_of_a_job_waiting_for_approval() {
    let (error, trace) =
        explore(1, Gating::Run, DEPTH, Broken::ClaimIgnoresGate).expect_err("the broken variant must be caught");
    assert!(error.contains("without an approval"), "{error}: {trace:?}");
}

// ---- the real store against the model ----

fn status_of(s: JobStatus) -> Status {
    match s {
        JobStatus::PendingApproval => Status::PendingApproval,
        JobStatus::Approved => Status::Approved,
        JobStatus::Queued => Status::Queued,
        JobStatus::Running => Status::Running,
        JobStatus::Succeeded => Status::Succeeded,
        JobStatus::Failed => Status::Failed,
        JobStatus::Cancelled => Status::Cancelled,
    }
}

/// Replay `trace` on a fresh store, checking the row against the model after
/// every step. Time: each step is one second; "expire" jumps past the TTL.
async fn replay(store: Arc<dyn JobStore>, (max_attempts, gating): (u8, Gating), trace: &[Action]) {
    let t0 = Timestamp::from_unix_ms(1_800_000_000_000);
    let mut now = t0;
    let job = NewJob {
        max_attempts: max_attempts.into(),
        free_rerun_limit: FREE_RERUNS.into(),
        // Requeued jobs are due by the next step.
        backoff: leash::job::Backoff { base: Duration::from_millis(1), cap: Duration::from_millis(1) },
        approval: (gating != Gating::None).then_some(Gate {
            source: GateSource::Request,
            run_on_approve: gating == Gating::Run,
            execution: ExecutionMode::Async,
            deadline: None,
            duties: Duties::default(),
        }),
        approval_ttl: APPROVAL_TTL,
        ..NewJob::new(
            Digest::of(b"p"),
            Target::Execute,
            Vec::new(),
            JobLimits { timeout: Duration::from_secs(1), fuel: None, memory_bytes: 1 << 20, output_bytes: 1 << 10 },
        )
    };
    let id: JobId = store.job_insert(JobInsertParams { jobs: vec![job], now }).await.unwrap()[0].id;
    let mut model = initial(max_attempts, gating);
    let decide = |decision, now| JobDecideParams {
        id: JobId::new(now),
        decision,
        by: "model".into(),
        comment: None,
        key: None,
        queue_ttl: Duration::from_secs(86_400),
        approval_ttl: APPROVAL_TTL,
        remember: None,
        rule: None,
        binding: None,
        now,
    };
    let mut tokens: [Option<String>; WORKERS] = [None, None];
    for &action in trace {
        now = now.plus(Duration::from_secs(1));
        match action {
            Action::Claim(w) => {
                let params =
                    JobClaimParams { worker_id: format!("w{w}"), limit: 1, alone: true, lease_ttl: TTL, now, aged: 0 };
                let lease = store.job_claim(params).await.unwrap().pop().expect("the model says it is claimable");
                tokens[w] = Some(lease.token);
            }
            Action::Renew(w) => {
                let token = tokens[w].clone().unwrap();
                let params = LeaseExtendParams { id, token, lease_ttl: TTL, now };
                if store.lease_extend(params).await.unwrap() == LeaseState::Lost {
                    tokens[w] = None;
                }
            }
            Action::Effect(w) => {
                let token = tokens[w].clone().unwrap();
                let params = EffectBeginParams {
                    id,
                    token,
                    method: "POST".into(),
                    url: "https://upstream.test/hook".into(),
                    proposal: None,
                    now,
                };
                if store.effect_begin(params).await.unwrap().is_none() {
                    tokens[w] = None;
                }
            }
            Action::Finish(w) => {
                let token = tokens[w].take().unwrap();
                let finish = Finish::Succeeded { output: b"o".to_vec() };
                let params = JobFinishParams {
                    id,
                    token,
                    finish,
                    fuel_used: 1,
                    peak_memory_bytes: 1,
                    progress: None,
                    logs: None,
                    proposals: Vec::new(),
                    now,
                };
                store.job_finish(params).await.unwrap();
            }
            Action::Release(w) => {
                let token = tokens[w].take().unwrap();
                let params =
                    JobReleaseParams { id, token, queue_ttl: Duration::from_secs(86_400), run_after: now, now };
                store.job_release(params).await.unwrap();
            }
            Action::Expire => now = now.plus(TTL),
            Action::Reclaim => {
                let params = LeaseReclaimParams { now, queue_ttl: Duration::from_secs(86_400) };
                store.lease_reclaim_expired(params).await.unwrap();
            }
            Action::Cancel => {
                let result = store.job_cancel(id, now, None).await.unwrap();
                assert!(matches!(result, CancelResult::Cancelled | CancelResult::Requested), "{result:?}");
            }
            Action::Approve | Action::Reject | Action::Trigger => {
                let decision = match action {
                    Action::Approve => JobDecision::Approve,
                    Action::Reject => JobDecision::Reject,
                    _ => JobDecision::Run,
                };
                let params = JobDecideParams { id, ..decide(decision, now) };
                store.job_decide(params).await.unwrap().expect("the model says the decision applies");
            }
            Action::GateExpire => {
                now = now.plus(APPROVAL_TTL);
                let expired = store.jobs_expire_queued(JobsExpireParams { now }).await.unwrap();
                assert_eq!(expired, 1, "the gated job expires");
            }
        }
        model = step(&model, action, Broken::No).unwrap();
        let row = store.job_get(id).await.unwrap().unwrap();
        let counters = |lost, retries, free| (lost as u8, retries as u8, free as u8);
        let got = (
            status_of(row.status),
            row.attempt as u8,
            counters(row.lost_leases, row.retries, row.free_reruns),
            row.cancel_requested,
        );
        let want = (model.status, model.attempt, (model.lost, model.retries, model.free), model.cancel_requested);
        assert_eq!(got, want, "store and model disagree after {trace:?}");
        for (w, token) in tokens.iter().enumerate() {
            assert_eq!(token.is_some(), model.held[w].is_some(), "worker {w} after {trace:?}");
        }
    }
}

/// Every explored trace, with the configuration it was explored for.
fn every_trace() -> Vec<((u8, Gating), Vec<Action>)> {
    let mut all = Vec::new();
    for (max_attempts, gating) in CONFIGS {
        let (_, traces) =
            explore(max_attempts, gating, DEPTH, Broken::No).unwrap_or_else(|(e, t)| panic!("{e}: {t:?}"));
        all.extend(traces.into_iter().map(|t| ((max_attempts, gating), t)));
    }
    assert!(all.len() > 2000, "explored {} traces", all.len());
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sqlite_store_follows_the_model_on_every_explored_trace() {
    let traces = every_trace();
    // Four lanes, since a replay mostly waits on its store's writer thread;
    // each a store of its own emptied between its traces (opening a store
    // per trace spent most of the run preparing its statements), so the
    // sweeper and claims see only the trace's job.
    const LANES: usize = 4;
    let lanes = (0..LANES).map(|lane| {
        let mine: Vec<((u8, Gating), Vec<Action>)> = traces.iter().skip(lane).step_by(LANES).cloned().collect();
        async move {
            let dir = tempfile::tempdir().unwrap();
            let file = dir.path().join("jobs.db");
            let store: Arc<dyn JobStore> =
                Arc::new(leash::store::sqlite::SqliteStore::open(&file, leash::store::Durability::Normal).unwrap());
            let wipe = rusqlite::Connection::open(&file).unwrap();
            wipe.busy_timeout(Duration::from_secs(10)).unwrap();
            for (config, trace) in &mine {
                wipe.execute_batch("DELETE FROM effects; DELETE FROM jobs").unwrap();
                replay(store.clone(), *config, trace).await;
            }
            mine.len()
        }
    });
    let replayed: usize = futures_util::future::join_all(lanes).await.into_iter().sum();
    assert_eq!(replayed, traces.len());
    println!("{replayed} traces replayed on SQLite");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_postgres_store_follows_the_model_on_every_explored_trace() {
    let Some(url) = crate::support::pg::url() else { return };
    let traces = every_trace();
    // Eight lanes, each a schema of its own emptied between its traces (a
    // schema and a pool per trace would cost more than the traces): the
    // round trips of one lane overlap the others', which keeps the run
    // short on a loaded machine.
    const LANES: usize = 8;
    let mut lanes = Vec::new();
    for lane in 0..LANES {
        let schema = crate::support::pg::Schema::create(&url).await;
        let store: Arc<dyn JobStore> =
            Arc::new(leash::store::postgres::PostgresStore::open(&schema.url).await.unwrap());
        let mine: Vec<((u8, Gating), Vec<Action>)> = traces.iter().skip(lane).step_by(LANES).cloned().collect();
        lanes.push(async move {
            for (config, trace) in &mine {
                schema.execute("DELETE FROM jobs").await;
                replay(store.clone(), *config, trace).await;
            }
            mine.len()
        });
    }
    let replayed: usize = futures_util::future::join_all(lanes).await.into_iter().sum();
    assert_eq!(replayed, traces.len());
    println!("{replayed} traces replayed on PostgreSQL");
}
