//! The embedding API end to end: durable jobs through the real store, pool
//! and sandbox.

use std::sync::Arc;
use std::time::{Duration, Instant};

use leash::clock::{Clock, ManualClock, Timestamp};
use leash::job::{ErrorKind, JobId, JobStatus, Target};
use leash::runtime::{Called, Cancelled, PluginSource, Runtime, RuntimeBuilder, RuntimeError, Submit};
use leash::sandbox::SandboxConfig;
use leash::store::LeaseReclaimParams;

use crate::support::{GENEROUS, cache_dir, eventually, wait_for_status};

fn builder(dir: &tempfile::TempDir) -> RuntimeBuilder {
    Runtime::builder(dir.path().join("jobs.db"))
        .sandbox(SandboxConfig { cache_dir: Some(cache_dir()), ..SandboxConfig::default() })
        .poll_interval(Duration::from_millis(50))
}

fn job(name: &str, input: &str) -> Submit {
    Submit::new(PluginSource::Bytes(leash_tests::plugin_bytes(name)), Target::Execute, input.as_bytes().to_vec())
}

/// Completions this runtime records, in order. The pool updates its
/// counters before it calls subscribers, so after a completion arrives the
/// health report includes it.
fn completions(runtime: &Runtime) -> tokio::sync::mpsc::UnboundedReceiver<leash::worker::Completion> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    runtime.on_complete(move |c| {
        let _ = tx.send(c.clone());
    });
    rx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_runs_as_a_durable_job() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = builder(&dir).build().await.unwrap();
    let mut completed = completions(&runtime);
    let id = runtime.submit(job("hello", r#"{"name":"Ada"}"#)).await.unwrap();
    let done = runtime.wait(id, GENEROUS).await.unwrap();
    assert_eq!(completed.recv().await.unwrap().id, id);
    assert_eq!(done.status, JobStatus::Succeeded, "{:?}", done.error_message);
    let output: serde_json::Value = serde_json::from_slice(done.output.as_deref().unwrap()).unwrap();
    assert_eq!(output["greeting"], "Hello, Ada!");
    assert_eq!(done.attempt, 1);
    assert_eq!(done.worker_id.as_deref(), Some(runtime.worker_id()));
    assert!(done.fuel_used.unwrap() > 0);
    let health = runtime.health().await.unwrap();
    assert_eq!((health.processed, health.failed, health.counts.succeeded), (1, 0, 1));
    assert!(health.worker_id.starts_with("worker-") && health.worker_id.len() == 15);
    assert!(health.last_heartbeat.is_some());
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_recorded_with_their_kind() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = builder(&dir).build().await.unwrap();
    let mut completed = completions(&runtime);
    let mut spin = job("spin", "");
    spin.fuel = Some(1_000_000);
    let cases =
        [(job("panic", ""), ErrorKind::Trap), (job("fail", ""), ErrorKind::GuestError), (spin, ErrorKind::OutOfFuel)];
    for (submit, kind) in cases {
        let id = runtime.submit(submit).await.unwrap();
        let done = runtime.wait(id, GENEROUS).await.unwrap();
        assert_eq!((done.status, done.error_kind), (JobStatus::Failed, Some(kind)));
        assert!(done.error_message.is_some());
        assert_eq!(completed.recv().await.unwrap().error_kind, Some(kind));
    }
    assert_eq!(runtime.health().await.unwrap().failed, 3);
    runtime.shutdown().await;
}

#[tokio::test]
async fn bad_submissions_are_refused_before_anything_is_queued() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = builder(&dir).without_workers().build().await.unwrap();
    let not_wasm = Submit::new(PluginSource::Bytes(b"text".to_vec()), Target::Execute, Vec::new());
    assert!(matches!(runtime.submit(not_wasm).await, Err(RuntimeError::InvalidPlugin(_))));
    let unknown = Submit::new(PluginSource::Digest(leash::job::Digest::of(b"nope")), Target::Execute, Vec::new());
    assert!(matches!(runtime.submit(unknown).await, Err(RuntimeError::UnknownPlugin(_))));
    let mut greedy = job("hello", "");
    greedy.memory_bytes = Some(64 << 30);
    assert!(matches!(runtime.submit(greedy).await, Err(RuntimeError::InvalidJob(m)) if m.contains("ceiling")));
    let mut never = job("hello", "");
    never.max_attempts = Some(0);
    assert!(matches!(runtime.submit(never).await, Err(RuntimeError::InvalidJob(_))));
    assert_eq!(runtime.health().await.unwrap().counts.total(), 0);
}

#[tokio::test]
async fn a_full_queue_refuses_at_once_with_backpressure() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = builder(&dir).without_workers().max_queued(2).build().await.unwrap();
    runtime.submit_many(vec![job("hello", ""), job("hello", "")]).await.unwrap();
    let refused = runtime.submit(job("hello", "")).await;
    assert!(matches!(refused, Err(RuntimeError::Backpressure { queued: 2, limit: 2 })), "{refused:?}");
    assert_eq!(runtime.health().await.unwrap().counts.queued, 2);
}

#[tokio::test]
async fn a_queued_job_is_cancelled_at_once_and_a_finished_one_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = builder(&dir).without_workers().build().await.unwrap();
    let id = runtime.submit(job("hello", "")).await.unwrap();
    assert_eq!(runtime.cancel(id).await.unwrap(), Cancelled::Cancelled);
    assert_eq!(runtime.get(id).await.unwrap().status, JobStatus::Cancelled);
    let again = runtime.cancel(id).await;
    assert!(matches!(again, Err(RuntimeError::AlreadyTerminal { status: JobStatus::Cancelled, .. })));
    let missing = JobId::new(Timestamp::now());
    assert!(matches!(runtime.cancel(missing).await, Err(RuntimeError::NotFound(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_job_is_cancelled_by_its_owner() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = builder(&dir).cancel_grace(Duration::from_secs(3600)).build().await.unwrap();
    let mut completed = completions(&runtime);
    let id = runtime.submit(job("coop", "")).await.unwrap();
    wait_for_status(&runtime, id, JobStatus::Running).await;
    assert_eq!(runtime.cancel(id).await.unwrap(), Cancelled::Requested);
    let done = runtime.wait(id, GENEROUS).await.unwrap();
    assert_eq!((done.status, done.error_kind), (JobStatus::Cancelled, Some(ErrorKind::Cancelled)));
    assert!(done.error_message.unwrap().contains("stopped when asked"), "cooperative, within an hour's grace");
    assert_eq!(completed.recv().await.unwrap().status, JobStatus::Cancelled);
    assert_eq!(runtime.health().await.unwrap().cancelled, 1);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_from_another_process_arrives_with_the_lease_renewal() {
    let dir = tempfile::tempdir().unwrap();
    let worker = builder(&dir).lease_ttl(Duration::from_millis(300)).build().await.unwrap();
    let other = builder(&dir).without_workers().build().await.unwrap();
    let id = worker.submit(job("coop", "")).await.unwrap();
    wait_for_status(&worker, id, JobStatus::Running).await;
    assert_eq!(other.cancel(id).await.unwrap(), Cancelled::Requested);
    let done = worker.wait(id, GENEROUS).await.unwrap();
    assert_eq!(done.status, JobStatus::Cancelled);
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_that_times_out_does_not_cancel_the_job() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = builder(&dir).build().await.unwrap();
    let id = runtime.submit(job("sleep", r#"{"ms": 600000}"#)).await.unwrap();
    wait_for_status(&runtime, id, JobStatus::Running).await;
    assert!(matches!(runtime.wait(id, Duration::from_millis(20)).await, Err(RuntimeError::WaitTimeout(_))));
    assert_eq!(runtime.get(id).await.unwrap().status, JobStatus::Running);
    runtime.cancel(id).await.unwrap();
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_subscriber_does_not_stop_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = builder(&dir).build().await.unwrap();
    let (seen, mut completions) = tokio::sync::mpsc::unbounded_channel();
    runtime.on_complete(|_| panic!("a broken subscriber"));
    runtime.on_complete(move |c| {
        let _ = seen.send((c.id, c.status));
    });
    for _ in 0..2 {
        let id = runtime.submit(job("hello", "")).await.unwrap();
        // Subscribers run after the outcome is stored, so wait on them, not on the job.
        let (seen_id, status) = tokio::time::timeout(GENEROUS, completions.recv()).await.unwrap().unwrap();
        assert_eq!((seen_id, status), (id, JobStatus::Succeeded), "the second subscriber still runs");
    }
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_running_jobs_without_spending_attempts() {
    let dir = tempfile::tempdir().unwrap();
    let budget = Duration::from_secs(3);
    let runtime = builder(&dir).shutdown_budget(budget).build().await.unwrap();
    let spin = runtime.submit(job("spin", "")).await.unwrap();
    let coop = runtime.submit(job("coop", "")).await.unwrap();
    wait_for_status(&runtime, spin, JobStatus::Running).await;
    wait_for_status(&runtime, coop, JobStatus::Running).await;
    let started = Instant::now();
    runtime.shutdown().await;
    assert!(started.elapsed() <= budget + Duration::from_secs(1), "took {:?}", started.elapsed());
    for id in [spin, coop] {
        let job = runtime.get(id).await.unwrap();
        assert_eq!(job.status, JobStatus::Queued, "{id} released");
        assert_eq!((job.attempt, job.lost_leases), (1, 0));
        assert!(job.lease_token.is_none());
    }
    assert_eq!(runtime.health().await.unwrap().running_here, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_lost_its_lease_stops_the_guest_and_drops_the_result() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Timestamp::now());
    let ttl = Duration::from_millis(300);
    let (started, mut starts) = tokio::sync::mpsc::unbounded_channel();
    let runtime = builder(&dir)
        .clock(Arc::new(clock.clone()))
        .lease_ttl(ttl)
        .free_rerun_limit(0)
        .sweep_interval(Duration::from_secs(3600))
        .on_start(move |s| {
            let _ = started.send(s.id);
        })
        .build()
        .await
        .unwrap();
    let id = runtime.submit(job("sleep", r#"{"ms": 600000}"#)).await.unwrap();
    // The guest runs (not merely claimed) before its lease is taken away.
    let heard = tokio::time::timeout(GENEROUS, starts.recv()).await.expect("the guest started");
    assert_eq!(heard, Some(id));
    // The lease runs out (as if this worker had stalled) and a sweeper reclaims it.
    clock.advance(ttl * 10);
    let store = runtime.store().clone();
    let report =
        store.lease_reclaim_expired(LeaseReclaimParams { now: clock.now(), queue_ttl: GENEROUS }).await.unwrap();
    assert_eq!(report.failed, 1);
    // The next renewal finds the lease gone and stops the guest.
    eventually("the worker notices its lost lease", async || {
        (runtime.health().await.unwrap().leases_lost != 0).then_some(())
    })
    .await;
    let job = runtime.get(id).await.unwrap();
    assert_eq!((job.status, job.error_kind), (JobStatus::Failed, Some(ErrorKind::LeaseLost)), "the reclaim stands");
    // The slot is freed just after the loss is counted.
    eventually("the guest is stopped", async || (runtime.health().await.unwrap().running_here == 0).then_some(()))
        .await;
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_subscribers_hear_each_job_before_it_completes() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = builder(&dir).build().await.unwrap();
    let events: Arc<std::sync::Mutex<Vec<(&str, JobId)>>> = Arc::default();
    let starts = events.clone();
    runtime.on_start(|_| panic!("a panicking start subscriber is isolated"));
    runtime.on_start(move |s| starts.lock().unwrap().push(("start", s.id)));
    let ends = events.clone();
    let (ended, mut completions) = tokio::sync::mpsc::unbounded_channel();
    runtime.on_complete(move |c| {
        ends.lock().unwrap().push(("end", c.id));
        let _ = ended.send(c.status);
    });
    let id = runtime.submit(job("hello", "{}")).await.unwrap();
    // Waited on the completion itself: the row turns terminal a moment
    // before subscribers hear it.
    let status = tokio::time::timeout(GENEROUS, completions.recv()).await.expect("the job completed");
    assert_eq!(status, Some(JobStatus::Succeeded));
    assert_eq!(*events.lock().unwrap(), vec![("start", id), ("end", id)]);
    runtime.shutdown().await;
}

/// Subscribers given to the builder hear the very first claims: jobs queued
/// before the runtime starts are claimed as soon as the pool runs, before
/// any call on the built runtime could register anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_on_the_builder_hear_the_first_claims() {
    let dir = tempfile::tempdir().unwrap();
    let queued: Vec<JobId> = {
        let submitter = builder(&dir).without_workers().build().await.unwrap();
        let jobs = (0..8).map(|i| job("hello", &format!(r#"{{"name":"n{i}"}}"#))).collect();
        submitter.submit_many(jobs).await.unwrap()
    };
    let starts = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (ended, mut ends) = tokio::sync::mpsc::unbounded_channel();
    let runtime = builder(&dir)
        .on_start({
            let starts = starts.clone();
            move |s| starts.lock().unwrap().push(s.id)
        })
        .on_complete(move |c| {
            let _ = ended.send(c.id);
        })
        .build()
        .await
        .unwrap();
    let mut finished = Vec::new();
    while finished.len() < queued.len() {
        finished.push(tokio::time::timeout(GENEROUS, ends.recv()).await.expect("every completion is heard").unwrap());
    }
    let mut heard = starts.lock().unwrap().clone();
    let mut queued = queued;
    for ids in [&mut heard, &mut finished, &mut queued] {
        ids.sort();
    }
    assert_eq!(heard, queued, "every start was heard");
    assert_eq!(finished, queued, "every completion was heard");
    runtime.shutdown().await;
}

/// A submit wakes an idle pool at once: with a one-minute poll interval,
/// a job submitted while the pool waits starts long before the next poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submit_wakes_an_idle_worker_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let poll = Duration::from_secs(60);
    let runtime = builder(&dir).poll_interval(poll).build().await.unwrap();
    // A first job, so the claim loop has gone round and now waits, idle.
    let first = runtime.submit(job("hello", "")).await.unwrap();
    assert_eq!(runtime.wait(first, GENEROUS).await.unwrap().status, JobStatus::Succeeded);
    let started = Instant::now();
    let second = runtime.submit(job("hello", "")).await.unwrap();
    let done = tokio::time::timeout(poll / 2, runtime.wait(second, poll))
        .await
        .expect("the submit woke the pool: the job did not wait for the next poll")
        .unwrap();
    assert_eq!(done.status, JobStatus::Succeeded);
    assert!(started.elapsed() < poll / 2);
    runtime.shutdown().await;
}

/// A `retryable` guest error runs again after the job's backoff while
/// attempts remain, then fails with its last error, saying that its
/// attempts are spent (or that it had one); `failed` and `invalid-input`
/// never run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retryable_failures_run_again_after_the_backoff_and_others_never_do() {
    let dir = tempfile::tempdir().unwrap();
    let starts = Arc::new(std::sync::Mutex::new(Vec::<(JobId, u32, Instant)>::new()));
    let seen = starts.clone();
    let runtime = builder(&dir)
        .on_start(move |s| seen.lock().unwrap().push((s.id, s.attempt, Instant::now())))
        .build()
        .await
        .unwrap();
    let submit = |kind: &str| {
        let mut j = job("fail", &format!(r#"{{"kind":"{kind}","message":"try {kind}"}}"#));
        j.max_attempts = Some(3);
        j.backoff = Some(leash::job::Backoff { base: Duration::from_millis(200), cap: Duration::from_millis(300) });
        runtime.submit(j)
    };
    let retried = submit("retryable").await.unwrap();
    let failed = submit("failed").await.unwrap();
    let invalid = submit("invalid-input").await.unwrap();
    let done = runtime.wait(retried, GENEROUS).await.unwrap();
    assert_eq!((done.status, done.error_kind), (JobStatus::Failed, Some(ErrorKind::GuestError)));
    assert_eq!((done.attempt, done.retries, done.lost_leases), (3, 2, 0), "three attempts, two retries");
    let said = done.error_message.as_deref().unwrap();
    assert_eq!(said, "Retryable: try retryable (retryable, but all 3 attempts are spent)");
    assert!(done.last_error.as_deref().unwrap().starts_with("guest_error: "), "{:?}", done.last_error);
    let mut once = job("fail", r#"{"kind":"retryable","message":"busy"}"#);
    once.max_attempts = Some(1);
    let once = runtime.wait(runtime.submit(once).await.unwrap(), GENEROUS).await.unwrap();
    let said = once.error_message.as_deref().unwrap();
    assert!(said.starts_with("Retryable: busy (retryable, but max_attempts is 1"), "{said}");
    for id in [failed, invalid] {
        let done = runtime.wait(id, GENEROUS).await.unwrap();
        assert_eq!((done.status, done.attempt, done.retries), (JobStatus::Failed, 1, 0), "{:?}", done.error_message);
    }
    let starts = starts.lock().unwrap().clone();
    let of = |id: JobId| starts.iter().filter(|s| s.0 == id).map(|s| (s.1, s.2)).collect::<Vec<_>>();
    let retried_starts = of(retried);
    assert_eq!(retried_starts.iter().map(|s| s.0).collect::<Vec<_>>(), [1, 2, 3]);
    // Half the step at least: 200 ms doubling to the 300 ms cap.
    assert!(retried_starts[1].1 - retried_starts[0].1 >= Duration::from_millis(100), "{retried_starts:?}");
    assert!(retried_starts[2].1 - retried_starts[1].1 >= Duration::from_millis(150), "{retried_starts:?}");
    assert_eq!((of(failed).len(), of(invalid).len()), (1, 1), "never retried");
    let metrics = runtime.metrics_text().await.unwrap();
    assert!(metrics.contains("leash_job_retries_total 2"), "{metrics}");
    runtime.shutdown().await;
}

/// A delayed job waits for its time; the queue TTL counts from then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_job_starts_at_its_time() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = builder(&dir).build().await.unwrap();
    let mut later = job("hello", "{}");
    let due = runtime.now().plus(Duration::from_millis(600));
    later.run_at = Some(due);
    let id = runtime.submit(later).await.unwrap();
    let now_id = runtime.submit(job("hello", "{}")).await.unwrap();
    let first = runtime.wait(now_id, GENEROUS).await.unwrap();
    assert_eq!(first.status, JobStatus::Succeeded);
    let done = runtime.wait(id, GENEROUS).await.unwrap();
    assert_eq!(done.status, JobStatus::Succeeded);
    assert_eq!(done.run_after, due, "{done:?}");
    assert!(done.started_at.unwrap() >= due, "started {:?}, due {due:?}", done.started_at);
    runtime.shutdown().await;
}

/// Every pool registers in the store; a clean shutdown marks it stopped; a
/// silent one shows stale after three lease TTLs; the summary counts only
/// the live ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_register_and_silent_ones_show_stale() {
    let dir = tempfile::tempdir().unwrap();
    let pool = builder(&dir).max_workers(3).lease_ttl(Duration::from_secs(10)).build().await.unwrap();
    let observer = builder(&dir).without_workers().lease_ttl(Duration::from_secs(10)).build().await.unwrap();
    let listed = observer.workers().await.unwrap();
    let me = listed.workers.iter().find(|w| w.worker.worker_id == pool.worker_id()).expect("registered at start");
    assert_eq!((me.worker.slots, me.worker.pid, me.stale), (3, std::process::id(), false));
    assert_eq!(me.worker.state, leash::job::WorkerState::Running);
    assert_eq!(listed.workers.len(), 1, "a runtime without workers does not register");
    assert_eq!(listed.summary, "Async workers: enabled, max_workers=3, poll_interval=0.1s");
    // A worker that stopped reporting 31 s ago (three TTLs are 30 s).
    let mut silent = me.worker.clone();
    silent.worker_id = "worker-5111e777".into();
    silent.last_heartbeat = observer.now().minus(Duration::from_secs(31));
    observer.store().worker_beat(silent).await.unwrap();
    let listed = observer.workers().await.unwrap();
    let silent = listed.workers.iter().find(|w| w.worker.worker_id == "worker-5111e777").unwrap();
    assert!(silent.stale, "{silent:?}");
    assert_eq!(listed.summary, "Async workers: enabled, max_workers=3, poll_interval=0.1s", "stale ones do not count");
    pool.shutdown().await;
    let listed = observer.workers().await.unwrap();
    let me = listed.workers.iter().find(|w| w.worker.worker_id == pool.worker_id()).unwrap();
    assert_eq!((me.worker.state, me.stale), (leash::job::WorkerState::Stopped, false));
    assert_eq!(listed.summary, "Async workers: disabled (no live worker)");
}

/// A `wait` that times out never cancels the job and is counted as an
/// abandoned wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_that_times_out_leaves_the_job_running_and_is_counted() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = builder(&dir).build().await.unwrap();
    let id = runtime.submit(job("coop", "{}")).await.unwrap();
    wait_for_status(&runtime, id, JobStatus::Running).await;
    assert!(matches!(runtime.wait(id, Duration::from_millis(50)).await, Err(RuntimeError::WaitTimeout(_))));
    let health = runtime.health().await.unwrap();
    assert_eq!((health.waits_abandoned, health.counts.running), (1, 1));
    assert_eq!(runtime.get(id).await.unwrap().status, JobStatus::Running, "the job goes on");
    runtime.cancel(id).await.unwrap();
    runtime.shutdown().await;
}

/// An operation deadline, as `Runtime::call` keeps it (the same
/// *sync* as `POST /v1/jobs`): a job that cannot start before it never
/// starts (`expired`, not an abandoned wait); one that started has its run
/// cut to the deadline, so the caller gets the job's own outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_deadline_expires_unstarted_jobs_and_cuts_started_ones_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let starts = Arc::new(std::sync::Mutex::new(Vec::<JobId>::new()));
    let seen = starts.clone();
    let runtime = Arc::new(
        builder(&dir).max_workers(1).on_start(move |s| seen.lock().unwrap().push(s.id)).build().await.unwrap(),
    );
    // The one slot runs a job that would outlive the deadline.
    let calling = runtime.clone();
    let blocker = tokio::spawn(async move { calling.call(job("coop", "{}"), Duration::from_secs(3)).await });
    eventually("the blocker starts", async || (!starts.lock().unwrap().is_empty()).then_some(())).await;
    // Behind it, a job whose deadline passes before it can start.
    let Called::Finished { job: late, .. } =
        runtime.call(job("hello", "{}"), Duration::from_millis(300)).await.unwrap()
    else {
        panic!("an ungated call answers its outcome")
    };
    assert_eq!((late.status, late.error_kind, late.attempt), (JobStatus::Failed, Some(ErrorKind::Expired), 0));
    let Ok(Called::Finished { job: blocker, .. }) = blocker.await.unwrap() else {
        panic!("the caller gets the outcome, not a timeout")
    };
    assert_eq!((blocker.status, blocker.error_kind), (JobStatus::Failed, Some(ErrorKind::Timeout)), "cut to it");
    assert_eq!(runtime.health().await.unwrap().waits_abandoned, 0, "neither wait was abandoned");
    // The slot is free: the expired job never starts.
    let next = runtime.submit(job("hello", "{}")).await.unwrap();
    runtime.wait(next, GENEROUS).await.unwrap();
    assert!(!starts.lock().unwrap().contains(&late.id), "the expired job started");
    runtime.shutdown().await;
}

/// `bytes` with a custom section `name` holding `data` appended (a
/// component's sections may end with custom ones).
fn with_custom_section(mut bytes: Vec<u8>, name: &str, data: &[u8]) -> Vec<u8> {
    fn leb128(mut n: usize, out: &mut Vec<u8>) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }
    let mut body = Vec::new();
    leb128(name.len(), &mut body);
    body.extend_from_slice(name.as_bytes());
    body.extend_from_slice(data);
    bytes.push(0);
    leb128(body.len(), &mut bytes);
    bytes.extend(body);
    bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_gets_only_what_its_plugin_declares_and_the_operator_grants() {
    use leash::job::grant::HttpGrant;
    use leash::job::{Grants, PluginName, PluginRef};
    let dir = tempfile::tempdir().unwrap();
    let runtime = builder(&dir).build().await.unwrap();
    let name = PluginName::new("declared", "1").unwrap();
    // config-declared embeds (through leash_sdk::requests!) the keys
    // greeting and region, POST to hooks.example.com and HOOK_TOKEN.
    let info = runtime.plugin_register(leash_tests::plugin_bytes("config-declared"), name.clone()).await.unwrap();
    let requests = info.requests.expect("the declaration is read from the component");
    assert_eq!(requests.config, ["greeting", "region"]);
    let mut grants = Grants {
        http: HttpGrant { hosts: vec!["https://*.example.com".parse().unwrap()], ..HttpGrant::default() },
        config: [("greeting", "hello"), ("password", "hunter2")].map(|(k, v)| (k.to_owned(), v.to_owned())).into(),
    };
    grants.http.bind_secret("HOOK_TOKEN".parse().unwrap(), "https://*.example.com".parse().unwrap());
    grants.http.bind_secret("DB_PASSWORD".parse().unwrap(), "https://*.example.com".parse().unwrap());
    let shown = runtime.plugin_grant(name.clone(), grants.clone()).await.unwrap();
    assert_eq!(shown.grants, grants, "the registration keeps what was granted");

    let input = br#"{"keys": ["greeting", "password", "region"]}"#.to_vec();
    let id =
        runtime.submit(Submit::new(PluginSource::Ref(PluginRef::Version(name)), Target::Execute, input)).await.unwrap();
    let done = runtime.wait(id, GENEROUS).await.unwrap();
    assert_eq!(done.status, JobStatus::Succeeded, "{:?}", done.error_message);
    let pinned = &done.grants;
    assert_eq!(pinned.http.hosts.iter().map(|h| h.to_string()).collect::<Vec<_>>(), ["POST https://hooks.example.com"]);
    assert_eq!(pinned.http.secrets.iter().map(|b| b.name.to_string()).collect::<Vec<_>>(), ["HOOK_TOKEN"]);
    let output: serde_json::Value = serde_json::from_slice(&done.output.unwrap()).unwrap();
    assert_eq!(output["all"], serde_json::json!({ "greeting": "hello" }), "declared and granted only");
    assert_eq!(output["get"]["password"], serde_json::Value::Null, "granted but not declared: invisible");
    assert_eq!(output["get"]["region"], serde_json::Value::Null, "declared but not granted: invisible");
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declaration_is_read_at_any_depth_and_a_bad_one_refuses_the_plugin() {
    use leash::job::PluginName;
    let dir = tempfile::tempdir().unwrap();
    let runtime = builder(&dir).without_workers().build().await.unwrap();
    let hello = leash_tests::plugin_bytes("hello");
    let plain = runtime.plugin_register(hello.clone(), PluginName::new("hello", "1").unwrap()).await.unwrap();
    assert_eq!(plain.requests, None, "declaring nothing: jobs get what is granted");

    let declared = with_custom_section(hello.clone(), "leash:requests", br#"{"config": ["name"]}"#);
    let info = runtime.plugin_register(declared, PluginName::new("hello", "2").unwrap()).await.unwrap();
    assert_eq!(info.requests.unwrap().config, ["name"]);

    for bad in [&br#"{"config": "name"}"#[..], br#"{"hosts": ["gopher://x"]}"#] {
        let broken = with_custom_section(hello.clone(), "leash:requests", bad);
        let err = runtime.plugin_register(broken, PluginName::new("hello", "3").unwrap()).await.unwrap_err();
        assert!(matches!(err, RuntimeError::InvalidPlugin(_)), "{err:?}");
        assert!(err.to_string().contains("leash:requests"), "{err}");
    }
    let twice = with_custom_section(with_custom_section(hello, "leash:requests", b"{}"), "leash:requests", b"{}");
    let err = runtime.plugin_register(twice, PluginName::new("hello", "4").unwrap()).await.unwrap_err();
    assert!(err.to_string().contains("more than one"), "{err}");
    runtime.shutdown().await;
}

/// A plugin stored by a leash that did not keep declarations with the
/// bytes gets its declaration the next time a runtime opens the store, so
/// every read of it is whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_keeps_the_declarations_of_plugins_stored_before_they_were_kept() {
    use leash::job::{PluginName, PluginRef};
    let dir = tempfile::tempdir().unwrap();
    let declared =
        with_custom_section(leash_tests::plugin_bytes("hello"), "leash:requests", br#"{"config": ["name"]}"#);
    let runtime = builder(&dir).without_workers().build().await.unwrap();
    let info = runtime.plugin_register(declared, PluginName::new("hello", "1").unwrap()).await.unwrap();
    runtime.shutdown().await;
    drop(runtime);
    // As an older leash left the row: no declaration, not yet read.
    let conn = rusqlite::Connection::open(dir.path().join("jobs.db")).unwrap();
    conn.execute("UPDATE plugins SET requests_json = NULL, requests_read = 0", []).unwrap();
    drop(conn);

    let runtime = builder(&dir).without_workers().build().await.unwrap();
    let read = runtime.plugin(PluginRef::Digest(info.digest)).await.unwrap();
    assert_eq!(read.requests.map(|r| r.config), Some(vec!["name".to_owned()]), "read from the bytes once, then kept");
    assert!(runtime.store().plugins_undeclared().await.unwrap().is_empty());
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_a_process_died_under_runs_alone_for_a_while_then_beside_others() {
    use leash::store::{JobClaimParams, WorkerDiedParams};
    let dir = tempfile::tempdir().unwrap();
    // The suspect: claimed by a worker whose process then died.
    let setup = builder(&dir).without_workers().build().await.unwrap();
    let suspect = setup.submit(job("sleep", r#"{"ms": 600000}"#)).await.unwrap();
    let dead = "worker-dead0000".to_owned();
    let claim = JobClaimParams {
        worker_id: dead.clone(),
        limit: 1,
        alone: true,
        lease_ttl: Duration::from_secs(30),
        now: setup.now(),
        aged: 0,
    };
    assert_eq!(setup.store().job_claim(claim).await.unwrap().len(), 1);
    let died = WorkerDiedParams {
        worker_id: dead,
        how: "killed by signal 9 (SIGKILL)".into(),
        stderr: String::new(),
        now: setup.now(),
        queue_ttl: Duration::from_secs(3600),
    };
    assert_eq!(setup.store().worker_died(died).await.unwrap().requeued, 1);

    let alone_for = Duration::from_millis(800);
    // Starts by the wall clock, to compare with the claim the store
    // records: the pool's time alone counts from the claim, which comes
    // before the guest starts.
    let starts: Arc<std::sync::Mutex<Vec<(JobId, leash::clock::Timestamp)>>> = Arc::default();
    let seen = starts.clone();
    let runtime = builder(&dir)
        .max_workers(2)
        .suspect_alone_for(alone_for)
        .on_start(move |s| seen.lock().unwrap().push((s.id, leash::clock::Timestamp::now())))
        .build()
        .await
        .unwrap();
    eventually("the suspect starts", async || {
        starts.lock().unwrap().iter().any(|(id, _)| *id == suspect).then_some(())
    })
    .await;
    let hello = runtime.submit(job("hello", r#"{"name":"Ada"}"#)).await.unwrap();
    let done = runtime.wait(hello, GENEROUS).await.unwrap();
    assert_eq!(done.status, JobStatus::Succeeded, "{:?}", done.error_message);
    let started = starts.lock().unwrap().iter().find(|(id, _)| *id == hello).map(|(_, at)| *at).unwrap();
    let still = runtime.get(suspect).await.unwrap();
    // A free slot, yet the other job waited for the suspect's time alone,
    // then ran beside it.
    let claimed = still.started_at.expect("the suspect's claim");
    let after = started.unix_ms() - claimed.unix_ms();
    assert!(after >= alone_for.as_millis() as i64, "started {after} ms after the suspect's claim");
    assert_eq!((still.status, still.process_deaths), (JobStatus::Running, 1));
    runtime.cancel(suspect).await.unwrap();
    runtime.shutdown().await;
}

/// With an audit retention set, the sweep deletes rows older than it as a
/// prefix of the chain, and the chain kept still verifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_rows_past_their_retention_are_swept_and_the_rest_still_verifies() {
    use leash::access::{PrincipalCeilings, Role};
    let dir = tempfile::tempdir().unwrap();
    let runtime = builder(&dir)
        .audit_ttl(Duration::from_millis(300))
        .sweep_interval(Duration::from_millis(20))
        .build()
        .await
        .unwrap();
    let roles = [Role::Submit].into_iter().collect();
    runtime.principal_put("sam".into(), roles, PrincipalCeilings::default()).await.unwrap();
    let head = eventually("the row past its retention is swept", async || {
        let head = runtime.audit_head().await.unwrap();
        (head.pruned_seq == 1).then_some(head)
    })
    .await;
    assert_eq!(head.seq, 1);
    assert_eq!(runtime.audit_verify().await.unwrap(), Ok(head));
    runtime.shutdown().await;
}
