//! Conformance cases for a job's attempts: each run the job's row moves
//! on from is kept, with its worker, times, ending, error and logs.

use std::sync::Arc;
use std::time::Duration;

use leash::job::{Attempt, EARLIER_ATTEMPTS_WITH_LOGS, JobLogs, LogLine, NewJob, timeline};
use leash::store::{JobFinishParams, JobRetryParams, JobStore, JobsDeleteParams};

use super::{
    KEEP_EVENTS, T0, TTL, at, claim, get, insert_one, new_job, reclaim, release_params, retry_params, succeed,
};

fn logs(n: u32) -> JobLogs {
    JobLogs {
        records: vec![LogLine {
            level: "info".into(),
            message: format!("try {n}"),
            fields: vec![],
            elapsed: Duration::from_millis(1),
        }],
        stdout: format!("out {n}"),
        ..JobLogs::default()
    }
}

async fn attempts_of(store: &dyn JobStore, id: leash::job::JobId) -> Vec<Attempt> {
    let job = get(store, id).await;
    timeline(&job, store.job_logs(id).await.unwrap(), store.job_earlier_attempts(id).await.unwrap())
}

pub(crate) async fn each_attempt_keeps_its_worker_times_ending_error_and_logs(store: Arc<dyn JobStore>) {
    let id = insert_one(&*store, NewJob { max_attempts: 5, ..new_job("x") }, T0).await.id;
    assert!(attempts_of(&*store, id).await.is_empty(), "a job that never ran has no attempts");

    // Run 1 fails retryably; run 2 is given back (a shutdown); run 3's
    // worker stops renewing its lease; run 4 succeeds.
    let lease = claim(&*store, "w1", 1, at(1)).await.remove(0);
    let retry = JobRetryParams { logs: Some(logs(1)), ..retry_params(&lease, at(2), at(2)) };
    assert!(store.job_retry(retry).await.unwrap());
    let running = attempts_of(&*store, id).await;
    assert_eq!(running.len(), 1, "queued again: only the kept attempt");
    let lease = claim(&*store, "w2", 1, at(3)).await.remove(0);
    let now = attempts_of(&*store, id).await;
    assert_eq!(
        (now[1].run, now[1].outcome.as_str(), now[1].ended_at, now[1].worker_id.as_deref()),
        (2, "running", None, Some("w2"))
    );
    assert!(store.job_release(release_params(&lease, at(4), at(4))).await.unwrap());
    let lease = claim(&*store, "w3", 1, at(5)).await.remove(0);
    reclaim(&*store, at(5).plus(TTL).plus(Duration::from_secs(1))).await;
    let lease_4 = claim(&*store, "w4", 1, at(100)).await.remove(0);
    assert_ne!(lease.token, lease_4.token);
    let finish = JobFinishParams { logs: Some(logs(4)), ..succeed(&lease_4, at(101)) };
    assert!(store.job_finish(finish).await.unwrap());

    let attempts = attempts_of(&*store, id).await;
    let seen: Vec<(u32, &str, Option<&str>)> =
        attempts.iter().map(|a| (a.run, a.outcome.as_str(), a.worker_id.as_deref())).collect();
    assert_eq!(
        seen,
        [
            (1, "retried", Some("w1")),
            (2, "released", Some("w2")),
            (3, "lease_lost", Some("w3")),
            (4, "succeeded", Some("w4"))
        ]
    );
    let first = &attempts[0];
    assert_eq!((first.started_at, first.ended_at), (Some(at(1)), Some(at(2))));
    assert_eq!(first.error.as_deref(), Some("guest_error: Retryable: the upstream is down"));
    assert_eq!((first.fuel_used, first.peak_memory_bytes), (Some(3), Some(4096)));
    assert_eq!(first.logs, Some(logs(1)));
    assert_eq!((attempts[1].logs.as_ref(), attempts[2].logs.as_ref()), (None, None), "no logs to keep");
    assert!(attempts[2].error.as_deref().is_some_and(|e| e.contains("LeaseLost")), "{:?}", attempts[2].error);
    let last = &attempts[3];
    assert_eq!((last.started_at, last.ended_at, last.logs.clone()), (Some(at(100)), Some(at(101)), Some(logs(4))));
    assert_eq!(attempts[0].duration(), Some(Duration::from_secs(1)));

    // Retention deletes a job's attempts with it.
    let deleted = store
        .jobs_delete_expired(JobsDeleteParams {
            finished_before: at(200),
            events_before: KEEP_EVENTS,
            audit_before: None,
        })
        .await
        .unwrap();
    assert_eq!(deleted, 1);
    assert!(store.job_earlier_attempts(id).await.unwrap().is_empty());
}

pub(crate) async fn only_the_latest_earlier_attempts_keep_their_logs(store: Arc<dyn JobStore>) {
    let id = insert_one(&*store, NewJob { max_attempts: 20, ..new_job("x") }, T0).await.id;
    for n in 1..=8 {
        let lease = claim(&*store, "w", 1, at(u64::from(n) * 10)).await.remove(0);
        let now = at(u64::from(n) * 10 + 1);
        assert!(
            store.job_retry(JobRetryParams { logs: Some(logs(n)), ..retry_params(&lease, now, now) }).await.unwrap()
        );
    }
    let earlier = store.job_earlier_attempts(id).await.unwrap();
    assert_eq!(earlier.iter().map(|a| a.run).collect::<Vec<_>>(), (1..=8).collect::<Vec<_>>());
    let kept: Vec<(u32, bool, bool)> = earlier.iter().map(|a| (a.run, a.logs.is_some(), a.logs_cut)).collect();
    let cut = 8 - EARLIER_ATTEMPTS_WITH_LOGS as u32;
    let want: Vec<(u32, bool, bool)> = (1..=8).map(|n| (n, n > cut, n <= cut)).collect();
    assert_eq!(kept, want, "the latest keep their logs; older ones are cut and say so");
    assert!(earlier.iter().all(|a| a.error.is_some()), "errors are kept whatever is cut");
}

/// A retry (redrive) queues an ended job again in place, with a fresh set
/// of attempts; the attempt that ended it stays in its history.
pub(crate) async fn a_retried_job_runs_again_with_fresh_attempts_and_keeps_its_history(store: Arc<dyn JobStore>) {
    use leash::job::{ErrorKind, JobStatus};
    use leash::store::{Finish, JobRedriveParams, RedriveResult};
    let redrive =
        |id, now| JobRedriveParams { id, now, queue_ttl: Duration::from_secs(60), actor: Some("olive".into()) };
    let id = insert_one(&*store, NewJob { max_attempts: 2, ..new_job("x") }, T0).await.id;
    let lease = claim(&*store, "w1", 1, at(1)).await.remove(0);
    assert!(store.job_retry(retry_params(&lease, at(2), at(2))).await.unwrap());
    let lease = claim(&*store, "w1", 1, at(3)).await.remove(0);
    let failure = Finish::Failed { kind: ErrorKind::GuestError, message: "Failed: still down".into(), backtrace: None };
    assert!(store.job_finish(super::finish_params(&lease, failure, at(4))).await.unwrap());

    assert_eq!(store.job_redrive(redrive(id, at(10))).await.unwrap(), RedriveResult::Queued);
    let job = get(&*store, id).await;
    assert_eq!((job.status, job.run_after, job.expires_at), (JobStatus::Queued, at(10), at(70)));
    assert_eq!((job.error_kind, job.error_message, job.last_error, job.finished_at), (None, None, None, None));
    assert_eq!((job.attempt, job.retries, job.lost_leases, job.max_attempts), (2, 0, 0, 2), "counters start again");
    let earlier: Vec<String> = attempts_of(&*store, id).await.into_iter().map(|a| a.outcome).collect();
    assert_eq!(earlier, ["retried", "failed"], "the attempt that ended it is kept");

    // It runs again as run 3, its own attempt 1 of 2.
    let lease = claim(&*store, "w2", 1, at(11)).await.remove(0);
    assert_eq!((lease.job.id, lease.job.attempt), (id, 3));
    assert!(store.job_finish(succeed(&lease, at(12))).await.unwrap());
    let runs: Vec<(u32, String)> = attempts_of(&*store, id).await.into_iter().map(|a| (a.run, a.outcome)).collect();
    assert_eq!(runs, [(1, "retried".into()), (2, "failed".into()), (3, "succeeded".into())]);

    // What may not run again says why; nothing changes.
    let refused = |r: RedriveResult, why: &str| match r {
        RedriveResult::Refused(said) => assert!(said.contains(why), "{said}"),
        other => panic!("{other:?}"),
    };
    refused(store.job_redrive(redrive(id, at(13))).await.unwrap(), "is succeeded: only a failed or cancelled job");
    let running = insert_one(&*store, new_job("r"), at(14)).await.id;
    claim(&*store, "w1", 1, at(15)).await;
    refused(store.job_redrive(redrive(running, at(16))).await.unwrap(), "is running");
    let gated = insert_one(&*store, super::gated_job("g", true), at(17)).await.id;
    store.job_cancel(gated, at(18), None).await.unwrap();
    refused(store.job_redrive(redrive(gated, at(19))).await.unwrap(), "waited for approval");
    assert_eq!(get(&*store, gated).await.status, JobStatus::Cancelled);
    let unknown = leash::job::JobId::new(at(20));
    assert_eq!(store.job_redrive(redrive(unknown, at(20))).await.unwrap(), RedriveResult::NotFound);
}
