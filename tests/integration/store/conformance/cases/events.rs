//! Conformance cases for [`Events`](leash::store::Events): the change feed.

use std::sync::Arc;
use std::time::Duration;

use leash::clock::Timestamp;
use leash::job::{ErrorKind, EventKind, JobId, JobStatus, NewJob, Target};
use leash::store::{
    CancelResult, EventsAfterParams, JobDecision, JobProgressParams, JobStore, JobsDeleteParams, LeaseExtendParams,
    LeaseState,
};

use super::{
    T0, TTL, at, claim, claim_one, decide, events_since, gated_job, insert, insert_one, new_job, progress_at,
    release_params, story, succeed, worker_record,
};

pub(crate) async fn every_change_appends_one_event_in_commit_order(store: Arc<dyn JobStore>) {
    let start = store.events_head().await.unwrap();
    let job = insert_one(&*store, NewJob { plan_id: Some("p-1".into()), ..new_job("e") }, T0).await;
    let lease = claim_one(&*store, at(1)).await;
    let report = JobProgressParams { id: job.id, token: lease.token.clone(), progress: progress_at(1), now: at(2) };
    assert!(store.job_progress_set(report.clone()).await.unwrap());
    assert!(store.job_progress_set(report).await.unwrap(), "the same report again is no new event");
    assert_eq!(store.job_cancel(job.id, at(3), None).await.unwrap(), CancelResult::Requested);
    assert_eq!(store.job_cancel(job.id, at(3), None).await.unwrap(), CancelResult::Requested, "nor a second ask");
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

/// A claim of several jobs (one statement; PostgreSQL writes the feed once
/// per statement) and their finishes sent at once (which may share one)
/// append one event per job, each with its own previous status, worker and
/// attempt; a renewal, which changes no status, appends none.
pub(crate) async fn changes_to_many_jobs_at_once_append_one_event_each(store: Arc<dyn JobStore>) {
    let start = store.events_head().await.unwrap();
    let jobs = insert(&*store, (0..3).map(|i| new_job(&format!("m{i}"))).collect(), T0).await;
    let leases = claim(&*store, "worker-bbbbbbbb", 3, at(1)).await;
    assert_eq!(leases.len(), 3, "one claim takes all three");
    for lease in &leases {
        let extend = LeaseExtendParams { id: lease.job.id, token: lease.token.clone(), lease_ttl: TTL, now: at(2) };
        assert_eq!(store.lease_extend(extend).await.unwrap(), LeaseState::Held { cancel_requested: false });
    }
    let finishes = leases.iter().map(|lease| store.job_finish(succeed(lease, at(3))));
    assert!(futures_util::future::join_all(finishes).await.into_iter().all(|landed| landed.unwrap()));

    let events = events_since(&*store, start, 9).await;
    use EventKind::*;
    use JobStatus::*;
    for job in &jobs {
        assert_eq!(story(&events, job.id), [(JobSubmitted, Queued), (JobStarted, Running), (JobFinished, Succeeded)]);
        let about: Vec<_> = events.iter().filter_map(|e| e.job.clone()).filter(|j| j.id == job.id).collect();
        assert_eq!(about[1].previous_status, Some(Queued));
        assert_eq!((about[1].worker_id.as_deref(), about[1].attempt), (Some("worker-bbbbbbbb"), 1));
        assert_eq!((about[2].previous_status, about[2].error_kind), (Some(Running), None));
    }
    assert!(events.windows(2).all(|w| w[0].id < w[1].id), "ids rise in commit order");
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
    store
        .jobs_delete_expired(JobsDeleteParams { finished_before: T0, events_before: everything, audit_before: None })
        .await
        .unwrap();
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
