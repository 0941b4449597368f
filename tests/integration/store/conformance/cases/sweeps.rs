//! Conformance cases for [`Sweeps`](leash::store::Sweeps): reclaiming
//! expired leases and dead workers' jobs, expiring queued jobs, retention.

use std::sync::Arc;
use std::time::Duration;

use leash::job::{ErrorKind, JobStatus, NewJob};
use leash::store::{CancelResult, JobStore, JobsDeleteParams, JobsExpireParams, ReclaimReport};

use super::{
    KEEP_EVENTS, T0, TTL, at, claim, claim_one, died_params, get, insert, insert_one, new_job, reclaim, release_params,
    retry_params, succeed, worker_record,
};

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
    assert_eq!(store.job_cancel(lease.job.id, at(2), None).await.unwrap(), CancelResult::Requested);
    reclaim(&*store, at(1).plus(TTL)).await;
    let got = get(&*store, lease.job.id).await;
    assert_eq!((got.status, got.error_kind), (JobStatus::Cancelled, Some(ErrorKind::Cancelled)));
    assert_eq!(got.lost_leases, 1);
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
            .jobs_delete_expired(JobsDeleteParams {
                finished_before: at(50),
                events_before: KEEP_EVENTS,
                audit_before: None
            })
            .await
            .unwrap(),
        1
    );
    assert!(store.job_get(old.job.id).await.unwrap().is_none());
    for id in [recent.job.id, queued.id, running.job.id] {
        assert!(store.job_get(id).await.unwrap().is_some(), "kept {id}");
    }
}

pub(crate) async fn reclaim_requeues_after_the_backoff_and_shares_the_attempt_budget(store: Arc<dyn JobStore>) {
    let mut job = new_job("x");
    job.max_attempts = 3;
    job.backoff = leash::job::Backoff { base: Duration::from_millis(10_000), cap: Duration::from_millis(10_000) };
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
