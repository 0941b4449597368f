//! Conformance cases for [`Leases`](leash::store::Leases): claims,
//! renewals, progress, and how an attempt ends (finish, retry, release).

use std::sync::Arc;
use std::time::Duration;

use leash::job::{ErrorKind, Job, JobId, JobLogs, JobStatus, LogLine, NewJob};
use leash::store::{
    CancelResult, Finish, JobClaimParams, JobProgressParams, JobStore, JobsExpireParams, Lease, LeaseExtendParams,
    LeaseState, ReclaimReport,
};

use super::{
    QUEUE_TTL, T0, TTL, at, claim, claim_one, claim_params, died_params, finish_params, get, insert, insert_one,
    new_job, progress_at, reclaim, release_params, retry_params, succeed,
};

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

/// A job of two attempts whose first lease (`old`) expired and was
/// reclaimed, claimed again (`new`) at 101 s; its row as `new` took it.
async fn lost_and_claimed_again(store: &dyn JobStore) -> (Lease, Lease, Job) {
    insert_one(store, NewJob { max_attempts: 2, ..new_job("lost") }, T0).await;
    let old = claim_one(store, at(1)).await;
    reclaim(store, at(100)).await;
    let new = claim_one(store, at(101)).await;
    let before = get(store, new.job.id).await;
    (old, new, before)
}

pub(crate) async fn a_stale_token_changes_nothing(store: Arc<dyn JobStore>) {
    let (old, new, before) = lost_and_claimed_again(&*store).await;

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
    let next = JobClaimParams {
        worker_id: "worker-bbbbbbbb".into(),
        limit: 1,
        alone: false,
        lease_ttl: TTL,
        now: at(3),
        aged: 0,
    };

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

/// Finishes sent at once (which a store may land together) are fenced one
/// by one: the one whose lease was lost changes nothing and claims
/// nothing; the others land and each claims as many next jobs as it asked
/// for (a slot claiming one ahead asks for two).
pub(crate) async fn finishes_at_once_are_fenced_one_by_one(store: Arc<dyn JobStore>) {
    let (old, new, before) = lost_and_claimed_again(&*store).await;
    insert(&*store, (0..3).map(|i| new_job(&format!("mine-{i}"))).collect(), at(102)).await;
    let mine = claim(&*store, "worker-aaaaaaaa", 3, at(103)).await;
    assert_eq!(mine.len(), 3);
    let queued = insert(&*store, (0..5).map(|i| new_job(&format!("next-{i}"))).collect(), at(104)).await;
    // The lost one and the first of mine ask for two each; the others one.
    let asks = [2, 2, 1, 1];

    let endings = std::iter::once(&old).chain(&mine).zip(asks).map(|(lease, ask)| {
        let store = store.clone();
        let finish = succeed(lease, at(105));
        let next = claim_params("worker-bbbbbbbb", ask, at(105));
        async move { store.job_finish_and_claim(finish, next).await.unwrap() }
    });
    let answers = futures_util::future::join_all(endings).await;

    assert!(!answers[0].0 && answers[0].1.is_empty(), "the lost lease's finish lands nothing and claims nothing");
    assert_eq!(get(&*store, new.job.id).await, before, "the row is exactly as the new owner left it");
    let mut claimed = Vec::new();
    for (((done, leases), lease), ask) in answers[1..].iter().zip(&mine).zip(&asks[1..]) {
        assert!(*done, "a held lease's finish lands");
        assert_eq!(get(&*store, lease.job.id).await.status, JobStatus::Succeeded);
        assert_eq!(leases.len(), *ask as usize, "each landed finish claims what its slot asked for");
        for next in leases {
            let row = get(&*store, next.job.id).await;
            assert_eq!(row.lease_token.as_deref(), Some(next.token.as_str()), "claimed as returned");
            assert_eq!(row.worker_id.as_deref(), Some("worker-bbbbbbbb"));
            claimed.push(next.job.id);
        }
    }
    claimed.sort();
    // Due at once: claimed in id order.
    let mut queued: Vec<JobId> = queued.iter().map(|j| j.id).collect();
    queued.sort();
    assert_eq!(claimed, queued[..4], "four distinct jobs, first in claim order");
    assert_eq!(get(&*store, queued[4]).await.status, JobStatus::Queued, "the lost finish took no job");
    assert!(store.job_finish(succeed(&new, at(106))).await.unwrap(), "the new owner still owns it");
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
        store.job_cancel(lease.job.id, at(3), None).await.unwrap(),
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

    assert_eq!(store.job_cancel(lease.job.id, at(11), None).await.unwrap(), CancelResult::Requested);
    assert_eq!(store.lease_extend(extend(at(12))).await.unwrap(), LeaseState::Held { cancel_requested: true });
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

/// A job released before it started (claimed ahead, or for a caller
/// gone) passes its own `run_after`: it keeps its place ahead of jobs due
/// after it, and its queue time still counts from the release.
pub(crate) async fn a_job_released_unstarted_keeps_its_place(store: Arc<dyn JobStore>) {
    let first = insert_one(&*store, new_job("first"), T0).await;
    let second = insert_one(&*store, new_job("second"), at(1)).await;
    let lease = claim_one(&*store, at(2)).await;
    assert_eq!(lease.job.id, first.id);
    let release = release_params(&lease, lease.job.run_after, at(3));
    assert!(store.job_release(release).await.unwrap());
    let got = get(&*store, first.id).await;
    assert_eq!((got.run_after, got.expires_at), (T0, at(3).plus(QUEUE_TTL)), "its place, and a fresh queue time");
    let next = claim(&*store, "w", 1, at(4)).await;
    assert_eq!(next.iter().map(|l| l.job.id).collect::<Vec<_>>(), [first.id], "ahead of {}", second.id);
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
            elapsed: Duration::from_millis(3),
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
        aged: 0,
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

pub(crate) async fn a_submitter_s_running_cap_holds_its_claims(store: Arc<dyn JobStore>) {
    use leash::access::{Principal, PrincipalCeilings, Role};
    let tenant = |max_running: Option<u32>| Principal {
        name: "tenant".into(),
        roles: [Role::Submit].into(),
        created_at: T0,
        ceilings: PrincipalCeilings { max_running, ..Default::default() },
    };
    store.principal_put(tenant(Some(2)), None).await.unwrap();
    let by = |input: &str, who: Option<&str>| NewJob { submitted_by: who.map(Into::into), ..new_job(input) };
    let mut theirs = Vec::new();
    for i in 0..5 {
        theirs.push(insert_one(&*store, by(&format!("t{i}"), Some("tenant")), at(i)).await.id);
    }
    let other = insert_one(&*store, by("o", Some("other")), at(5)).await.id;
    let embedded = insert_one(&*store, by("e", None), at(6)).await.id;

    let first: Vec<JobId> = claim(&*store, "w1", 10, at(10)).await.iter().map(|l| l.job.id).collect();
    assert_eq!(first, vec![theirs[0], theirs[1], other, embedded], "two of the tenant's, earliest first; others free");
    assert!(claim(&*store, "w2", 10, at(10)).await.is_empty(), "at its cap, across workers");

    // One ends: one more starts, by a finish-and-claim as by a claim.
    let running = async |id: JobId| {
        let job = get(&*store, id).await;
        Lease { token: job.lease_token.clone().unwrap(), job }
    };
    let next = JobClaimParams { worker_id: "w3".into(), limit: 10, alone: false, lease_ttl: TTL, now: at(11), aged: 0 };
    let (done, leases) = store.job_finish_and_claim(succeed(&running(theirs[0]).await, at(11)), next).await.unwrap();
    assert!(done);
    assert_eq!(leases.iter().map(|l| l.job.id).collect::<Vec<_>>(), vec![theirs[2]]);

    // Lowered below what runs: both keep running, none starts until fewer
    // than the new cap run.
    store.principal_put(tenant(Some(1)), None).await.unwrap();
    assert!(store.job_finish(succeed(&running(theirs[1]).await, at(12))).await.unwrap());
    assert!(claim(&*store, "w1", 10, at(12)).await.is_empty(), "one runs: the cap of one is reached");
    assert!(store.job_finish(succeed(&running(theirs[2]).await, at(13))).await.unwrap());
    let one: Vec<JobId> = claim(&*store, "w1", 10, at(13)).await.iter().map(|l| l.job.id).collect();
    assert_eq!(one, vec![theirs[3]]);

    // No cap: the rest start.
    store.principal_put(tenant(None), None).await.unwrap();
    let rest: Vec<JobId> = claim(&*store, "w1", 10, at(14)).await.iter().map(|l| l.job.id).collect();
    assert_eq!(rest, vec![theirs[4]]);
}
