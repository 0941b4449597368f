//! Storage faults under a real runtime: writes that fail before they land,
//! writes that land but report failure, and stalls past the lease. Each
//! test names the rule it holds: nothing lost, nothing run twice under
//! `max_attempts = 1`, a stale owner never overwrites a newer attempt.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::time::Duration;

use leash::job::grant::HttpGrant;
use leash::job::{ErrorKind, Grants, JobStatus, PluginName, Target};
use leash::runtime::{PluginSource, Runtime, RuntimeError, Submit};
use leash::sandbox::SandboxConfig;
use leash::store::Durability;
use leash::store::JobStore;
use leash::store::faults::{Fault, FaultyStore, Op};
use leash::store::sqlite::SqliteStore;

use crate::support::{GENEROUS, cache_dir, eventually, wait_for_status};

/// The lease of the tests whose rule is the lease's own: short, so that
/// they run out of it soon.
const LEASE: Duration = Duration::from_millis(400);

/// The lease of the other tests: long enough that a loaded machine never
/// loses it (a lost lease there changes the outcome under test), short
/// enough that a cancel the worker hears of only at a renewal arrives soon.
const STEADY: Duration = Duration::from_secs(3);

/// A runtime whose jobs are meant to lose their leases.
async fn runtime(dir: &tempfile::TempDir) -> (Runtime, Arc<FaultyStore>) {
    runtime_with(dir, true, LEASE).await
}

/// A runtime whose jobs keep their leases.
async fn steady_runtime(dir: &tempfile::TempDir) -> (Runtime, Arc<FaultyStore>) {
    runtime_with(dir, true, STEADY).await
}

async fn runtime_with(dir: &tempfile::TempDir, workers: bool, lease: Duration) -> (Runtime, Arc<FaultyStore>) {
    let inner: Arc<dyn JobStore> = Arc::new(SqliteStore::open(dir.path().join("jobs.db"), Durability::Normal).unwrap());
    let faulty = Arc::new(FaultyStore::new(inner));
    // Free re-runs off: these jobs issue no effect, so a lost lease would
    // otherwise re-run them without spending an attempt, and the rule
    // under test here is the lease's own (conformance and crash test the
    // free re-runs).
    let mut builder = Runtime::builder(dir.path().join("unused.db"))
        .store(faulty.clone())
        .sandbox(SandboxConfig { cache_dir: Some(cache_dir()), ..SandboxConfig::default() })
        .poll_interval(Duration::from_millis(20))
        .lease_ttl(lease)
        .sweep_interval(Duration::from_millis(50))
        .cancel_grace(Duration::from_millis(200))
        .free_rerun_limit(0);
    if !workers {
        builder = builder.without_workers();
    }
    (builder.build().await.unwrap(), faulty)
}

fn job(name: &str, input: &str, max_attempts: u32) -> Submit {
    let mut job =
        Submit::new(PluginSource::Bytes(leash_tests::plugin_bytes(name)), Target::Execute, input.as_bytes().to_vec());
    job.max_attempts = Some(max_attempts);
    job
}

fn completions(runtime: &Runtime) -> Arc<std::sync::Mutex<Vec<leash::worker::Completion>>> {
    let seen: Arc<std::sync::Mutex<Vec<_>>> = Arc::default();
    let sink = seen.clone();
    runtime.on_complete(move |c| sink.lock().unwrap().push(c.clone()));
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finish_that_lands_but_reports_failure_is_still_recorded_once() {
    let dir = tempfile::tempdir().unwrap();
    let (runtime, faults) = steady_runtime(&dir).await;
    let seen = completions(&runtime);
    faults.inject(Op::Finish, Fault::FailAfter);
    let id = runtime.submit(job("hello", "{}", 1)).await.unwrap();
    let done = runtime.wait(id, GENEROUS).await.unwrap();
    assert_eq!((done.status, done.attempt, done.lost_leases), (JobStatus::Succeeded, 1, 0));
    assert_eq!(faults.injected(), 1);
    // The row is terminal as soon as the write lands; the worker reports
    // the completion after it has checked that the write was its own.
    eventually("the completion is reported", async || (!seen.lock().unwrap().is_empty()).then_some(())).await;
    assert_eq!(seen.lock().unwrap().len(), 1, "the completion is reported, once");
    let health = runtime.health().await.unwrap();
    assert_eq!((health.processed, health.leases_lost), (1, 0), "not mistaken for a lost lease");
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finish_that_fails_before_the_write_is_retried() {
    let dir = tempfile::tempdir().unwrap();
    let (runtime, faults) = steady_runtime(&dir).await;
    faults.inject(Op::Finish, Fault::FailBefore);
    faults.inject(Op::Finish, Fault::FailBefore);
    let id = runtime.submit(job("hello", "{}", 1)).await.unwrap();
    let done = runtime.wait(id, GENEROUS).await.unwrap();
    assert_eq!((done.status, done.attempt), (JobStatus::Succeeded, 1));
    assert_eq!(faults.injected(), 2);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_lands_but_reports_failure_is_reclaimed_never_run_twice() {
    for (max_attempts, status, attempt) in [(1, JobStatus::Failed, 1), (2, JobStatus::Succeeded, 2)] {
        let dir = tempfile::tempdir().unwrap();
        let (submitter, faults) = runtime_with(&dir, false, LEASE).await;
        // Queued before any worker exists, so the first claim takes it.
        let id = submitter.submit(job("hello", "{}", max_attempts)).await.unwrap();
        faults.inject(Op::Claim, Fault::FailAfter);
        let worker = Runtime::builder(dir.path().join("unused.db"))
            .store(faults.clone())
            .sandbox(SandboxConfig { cache_dir: Some(cache_dir()), ..SandboxConfig::default() })
            .poll_interval(Duration::from_millis(20))
            .lease_ttl(LEASE)
            .sweep_interval(Duration::from_millis(50))
            .build()
            .await
            .unwrap();
        let done = submitter.wait(id, GENEROUS).await.unwrap();
        assert_eq!(faults.injected(), 1);
        assert_eq!((done.status, done.attempt, done.lost_leases), (status, attempt, 1), "{:?}", done.error_message);
        if max_attempts == 1 {
            assert_eq!(done.error_kind, Some(ErrorKind::LeaseLost));
            assert!(done.output.is_none() && done.fuel_used.is_none(), "its guest never ran");
        }
        worker.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_renewals_do_not_lose_a_lease_that_later_renewals_hold() {
    let dir = tempfile::tempdir().unwrap();
    let (runtime, faults) = runtime(&dir).await;
    // Renewals every ~133 ms; every other one fails: before its write for the
    // first job, after it for the second. The lease (400 ms) outlives any one
    // failure.
    faults.inject_every(Op::Extend, Fault::FailBefore, 2);
    let id = runtime.submit(job("sleep", r#"{"ms":1200}"#, 1)).await.unwrap();
    let done = runtime.wait(id, GENEROUS).await.unwrap();
    assert_eq!((done.status, done.lost_leases), (JobStatus::Succeeded, 0), "{:?}", done.error_message);
    assert!(faults.injected() >= 2, "renewals were failed: {}", faults.injected());
    let before = faults.injected();
    faults.inject_every(Op::Extend, Fault::FailAfter, 2);
    let id = runtime.submit(job("sleep", r#"{"ms":1200}"#, 1)).await.unwrap();
    let done = runtime.wait(id, GENEROUS).await.unwrap();
    assert_eq!((done.status, done.lost_leases), (JobStatus::Succeeded, 0), "{:?}", done.error_message);
    assert!(faults.injected() >= before + 2, "renewals were failed after their write: {}", faults.injected() - before);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finish_stalled_past_the_lease_never_overwrites_the_next_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let (runtime, faults) = runtime(&dir).await;
    let seen = completions(&runtime);
    // Attempt 1's finish stalls for three leases: the sweeper reclaims the
    // job, attempt 2 runs it, and attempt 1's write then finds a stale token.
    faults.inject(Op::Finish, Fault::Stall(LEASE * 3));
    let id = runtime.submit(job("hello", "{}", 2)).await.unwrap();
    let done = runtime.wait(id, GENEROUS).await.unwrap();
    assert_eq!((done.status, done.attempt, done.lost_leases), (JobStatus::Succeeded, 2, 1));
    // Let the stalled write land, then check it changed nothing.
    eventually("the stalled finish returns", async || (runtime.health().await.unwrap().leases_lost != 0).then_some(()))
        .await;
    let after = runtime.get(id).await.unwrap();
    assert_eq!((after.status, after.attempt, after.finished_at), (JobStatus::Succeeded, 2, done.finished_at));
    // The pool calls subscribers after its write lands, so a waiter may
    // hear of the end first.
    eventually("attempt 2's completion is heard", async || (!seen.lock().unwrap().is_empty()).then_some(())).await;
    assert_eq!(seen.lock().unwrap().len(), 1, "one completion: attempt 2's");

    // With one attempt, the stalled job fails as lease_lost and stays so.
    faults.inject(Op::Finish, Fault::Stall(LEASE * 3));
    let id = runtime.submit(job("hello", "{}", 1)).await.unwrap();
    let done = runtime.wait(id, GENEROUS).await.unwrap();
    assert_eq!((done.status, done.error_kind), (JobStatus::Failed, Some(ErrorKind::LeaseLost)));
    eventually("the stalled finish returns", async || (runtime.health().await.unwrap().leases_lost >= 2).then_some(()))
        .await;
    let after = runtime.get(id).await.unwrap();
    assert_eq!((after.status, after.error_kind), (JobStatus::Failed, Some(ErrorKind::LeaseLost)), "never both");
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_or_cancel_that_lands_but_reports_failure_leaves_a_consistent_job() {
    let dir = tempfile::tempdir().unwrap();
    let (runtime, faults) = steady_runtime(&dir).await;
    let queued = runtime.submit(job("hello", "{}", 1)).await.unwrap();
    runtime.wait(queued, GENEROUS).await.unwrap();

    faults.inject(Op::Cancel, Fault::FailAfter);
    let running = runtime.submit(job("coop", "{}", 1)).await.unwrap();
    wait_for_status(&runtime, running, JobStatus::Running).await;
    assert!(matches!(runtime.cancel(running).await, Err(RuntimeError::Store(e)) if e.is_transient()));
    let done = runtime.wait(running, GENEROUS).await.unwrap();
    assert_eq!(done.status, JobStatus::Cancelled, "the request landed although the caller saw an error: {done:?}");
    assert!(matches!(runtime.cancel(running).await, Err(RuntimeError::AlreadyTerminal { .. })));

    let released = runtime.submit(job("coop", "{}", 1)).await.unwrap();
    wait_for_status(&runtime, released, JobStatus::Running).await;
    faults.inject(Op::Release, Fault::FailAfter);
    runtime.shutdown().await;
    let after = runtime.get(released).await.unwrap();
    assert_eq!(
        (after.status, after.attempt, after.lost_leases),
        (JobStatus::Queued, 1, 0),
        "back in the queue: {after:?}"
    );
    assert!(after.lease_token.is_none());
    assert_eq!(faults.injected(), 2, "both the cancel and the release fault were hit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_grew_old_before_its_guest_started_is_not_started() {
    for max_attempts in [2, 1] {
        let dir = tempfile::tempdir().unwrap();
        let (runtime, faults) = runtime(&dir).await;
        let starts: Arc<std::sync::Mutex<Vec<u32>>> = Arc::default();
        let sink = starts.clone();
        runtime.on_start(move |s| sink.lock().unwrap().push(s.attempt));
        // Attempt 1 waits three leases for its plugin and for its first
        // renewal (as a paused process would); meanwhile the sweeper takes
        // its lease back.
        faults.inject(Op::PluginGet, Fault::Stall(LEASE * 3));
        faults.inject(Op::Extend, Fault::Stall(LEASE * 3));
        let id = runtime.submit(job("hello", "{}", max_attempts)).await.unwrap();
        let done = runtime.wait(id, GENEROUS).await.unwrap();
        // Wait for attempt 1's worker to give up: it counts the lost lease.
        eventually("the stalled plugin load returns", async || {
            (runtime.health().await.unwrap().leases_lost != 0).then_some(())
        })
        .await;
        assert_eq!(faults.injected(), 2);
        if max_attempts == 2 {
            assert_eq!((done.status, done.attempt, done.lost_leases), (JobStatus::Succeeded, 2, 1));
            assert_eq!(*starts.lock().unwrap(), vec![2], "attempt 1 never started its guest");
        } else {
            assert_eq!((done.status, done.error_kind), (JobStatus::Failed, Some(ErrorKind::LeaseLost)));
            assert!(starts.lock().unwrap().is_empty(), "the guest never started");
        }
        runtime.shutdown().await;
    }
}

/// A plugin load that outlasts the lease (a first compile of a big guest
/// on a slow machine) keeps the lease: the job runs once and succeeds,
/// with no lease lost, even with `max_attempts = 1` and no free re-runs.
/// It used to lose the lease to the sweeper and run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_load_longer_than_the_lease_keeps_the_lease() {
    let dir = tempfile::tempdir().unwrap();
    let (runtime, faults) = runtime(&dir).await;
    faults.inject(Op::PluginGet, Fault::Stall(LEASE * 3));
    let id = runtime.submit(job("hello", "{}", 1)).await.unwrap();
    let done = runtime.wait(id, GENEROUS).await.unwrap();
    assert_eq!(faults.injected(), 1);
    assert_eq!((done.status, done.attempt, done.lost_leases), (JobStatus::Succeeded, 1, 0), "{done:?}");
    assert!(faults.calls(Op::Extend) >= 2, "renewed while the plugin loaded: {}", faults.calls(Op::Extend));
    assert_eq!(runtime.health().await.unwrap().leases_lost, 0);
    runtime.shutdown().await;
}

/// A transient host error before the guest starts (the plugin cannot be
/// read from a busy store) puts the job back after a backoff pause without
/// spending an attempt: even a `max_attempts = 1` job then runs and
/// succeeds, and the release is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transient_host_error_before_the_start_releases_the_job() {
    for max_attempts in [1, 2] {
        let dir = tempfile::tempdir().unwrap();
        let (runtime, faults) = steady_runtime(&dir).await;
        faults.inject(Op::PluginGet, Fault::FailBefore);
        let mut submit = job("hello", "{}", max_attempts);
        submit.backoff = Some(leash::job::Backoff { base: Duration::from_millis(10), cap: Duration::from_millis(10) });
        let id = runtime.submit(submit).await.unwrap();
        let done = runtime.wait(id, GENEROUS).await.unwrap();
        assert_eq!(faults.injected(), 1);
        assert_eq!(done.status, JobStatus::Succeeded, "{done:?}");
        assert_eq!((done.attempt, done.releases, done.retries, done.lost_leases), (2, 1, 0, 0), "{done:?}");
        assert!(done.run_after > done.created_at, "due again only after the pause: {done:?}");
        runtime.shutdown().await;
    }
}

/// A store that reports itself closed while a plugin is read (a process
/// stopping under a claim) is no fault of the job: it goes back to the
/// queue and runs later. It used to fail as `host_error`, which the chaos
/// run caught during a SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_closed_before_the_start_releases_the_job() {
    let dir = tempfile::tempdir().unwrap();
    let (runtime, faults) = steady_runtime(&dir).await;
    faults.inject(Op::PluginGet, Fault::Closed);
    let mut submit = job("hello", "{}", 1);
    submit.backoff = Some(leash::job::Backoff { base: Duration::from_millis(10), cap: Duration::from_millis(10) });
    let id = runtime.submit(submit).await.unwrap();
    let done = runtime.wait(id, GENEROUS).await.unwrap();
    assert_eq!(faults.injected(), 1);
    assert_eq!(done.status, JobStatus::Succeeded, "{done:?}");
    assert_eq!((done.attempt, done.releases, done.lost_leases), (2, 1, 0), "{done:?}");
    runtime.shutdown().await;
}

/// The first jobs of a digest new to a process share one read and one
/// compile of it, and the compile is not in the claim path: while it is
/// held up, a job of another plugin is claimed, runs and ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_jobs_of_a_new_digest_share_one_compile_and_other_jobs_run_meanwhile() {
    let dir = tempfile::tempdir().unwrap();
    let inner: Arc<dyn JobStore> = Arc::new(SqliteStore::open(dir.path().join("jobs.db"), Durability::Normal).unwrap());
    let store = Arc::new(FaultyStore::new(inner));
    // The default lease (30 s): the held-up read must not outlast it.
    let runtime = Runtime::builder(dir.path().join("unused.db"))
        .store(store.clone())
        .sandbox(SandboxConfig { cache_dir: Some(cache_dir()), ..SandboxConfig::default() })
        .poll_interval(Duration::from_millis(20))
        .build()
        .await
        .unwrap();
    let by_digest = |digest| Submit::new(PluginSource::Digest(digest), Target::Execute, b"{}".to_vec());
    let echo = runtime.plugin_add(leash_tests::plugin_bytes("echo")).await.unwrap();
    let warm = runtime.submit(by_digest(echo)).await.unwrap();
    assert_eq!(runtime.wait(warm, GENEROUS).await.unwrap().status, JobStatus::Succeeded);

    // Every plugin read from now on is held up for 3 s (and counted).
    let hello = runtime.plugin_add(leash_tests::plugin_bytes("hello")).await.unwrap();
    store.inject_every(Op::PluginGet, Fault::Stall(Duration::from_secs(3)), 1);
    let firsts = runtime.submit_many((0..3).map(|_| by_digest(hello)).collect()).await.unwrap();
    let other = runtime.submit(by_digest(echo)).await.unwrap();
    assert_eq!(runtime.wait(other, GENEROUS).await.unwrap().status, JobStatus::Succeeded);
    for id in &firsts {
        let job = runtime.get(*id).await.unwrap();
        assert!(!job.status.is_terminal(), "the echo job ended while the compile was held up: {job:?}");
    }
    for id in firsts {
        assert_eq!(runtime.wait(id, GENEROUS).await.unwrap().status, JobStatus::Succeeded);
    }
    assert_eq!(store.injected(), 1, "three first jobs, one read of the plugin (one compile)");
    runtime.shutdown().await;
}

/// Admission counts the queue once however many submits find the count
/// stale at once: the others use the estimate meanwhile (a deep queue at a
/// thousand submits a second had tens of counts running). A submit dropped
/// while it counts leaves the next one to count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submits_that_find_the_queue_count_stale_together_count_it_once() {
    let dir = tempfile::tempdir().unwrap();
    let (runtime, faults) = runtime_with(&dir, false, STEADY).await;
    // The count stays under way until the submit holding it is dropped.
    faults.inject(Op::QueuedCount, Fault::Stall(Duration::from_secs(600)));
    let holder = tokio::spawn({
        let runtime = runtime.clone();
        async move { runtime.submit(job("hello", "", 1)).await }
    });
    eventually("the first submit counting", async || (faults.calls(Op::QueuedCount) == 1).then_some(())).await;
    let mut others = tokio::task::JoinSet::new();
    for _ in 0..20 {
        let runtime = runtime.clone();
        others.spawn(async move { runtime.submit(job("hello", "", 1)).await });
    }
    while let Some(submitted) = others.join_next().await {
        submitted.unwrap().unwrap();
    }
    assert_eq!(faults.calls(Op::QueuedCount), 1, "twenty submits during one count counted again");
    holder.abort();
    assert!(holder.await.unwrap_err().is_cancelled());
    runtime.submit(job("hello", "", 1)).await.unwrap();
    assert_eq!(faults.calls(Op::QueuedCount), 2, "the count a dropped submit held was not given up");
    assert_eq!(runtime.health().await.unwrap().counts.queued, 21);
    runtime.shutdown().await;
}

/// A database that goes away just after the store opened (a restart as a
/// server comes up) is waited out, not a failed start: the chaos run found
/// a `leash serve` exiting on "the database system is shutting down".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_starting_waits_out_a_database_that_goes_away_after_the_store_opened() {
    let dir = tempfile::tempdir().unwrap();
    let inner: Arc<dyn JobStore> = Arc::new(SqliteStore::open(dir.path().join("jobs.db"), Durability::Normal).unwrap());
    let faulty = Arc::new(FaultyStore::new(inner));
    faulty.inject(Op::Undeclared, Fault::FailBefore);
    faulty.inject(Op::Undeclared, Fault::FailBefore);
    let runtime = Runtime::builder(dir.path().join("unused.db"))
        .store(faulty.clone())
        .without_workers()
        .build()
        .await
        .expect("a start that meets transient store errors waits them out");
    assert_eq!((faulty.injected(), faulty.pending()), (2, 0));
    runtime.shutdown().await;
}

/// An upstream of the test's own that answers every POST to `/hook` with
/// 200 and counts them, and a registered `webhook` plugin granted POST to
/// it; returns a job delivering `count` events there.
async fn webhook_job(runtime: &Runtime, count: u32, max_attempts: u32) -> (Submit, Arc<AtomicU64>) {
    let received = Arc::new(AtomicU64::new(0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let counter = received.clone();
    // It reads the whole body before it answers, as a receiver does: a
    // server that answers first and closes with the body unread resets the
    // connection, and the client may lose the answer (on a loaded machine
    // it did, as `HttpResponseIncomplete`).
    let hook = axum::routing::post(async move |_body: axum::body::Bytes| {
        counter.fetch_add(1, AtomicOrdering::SeqCst);
        axum::http::StatusCode::OK
    });
    tokio::spawn(async move { axum::serve(listener, axum::Router::new().route("/hook", hook)).await.unwrap() });
    let name = PluginName::new("webhook", "1").unwrap();
    runtime.plugin_register(leash_tests::plugin_bytes("webhook"), name.clone()).await.unwrap();
    let http = HttpGrant { hosts: vec![format!("POST {base}").parse().unwrap()], ..HttpGrant::default() };
    runtime.plugin_grant(name.clone(), Grants { http, ..Grants::default() }).await.unwrap();
    let input = serde_json::json!({ "url": format!("{base}/hook"), "count": count });
    let mut submit = Submit::new(
        PluginSource::Ref(name.to_string().parse().unwrap()),
        Target::Execute,
        input.to_string().into_bytes(),
    );
    submit.max_attempts = Some(max_attempts);
    submit.backoff = Some(leash::job::Backoff { base: Duration::from_millis(10), cap: Duration::from_millis(10) });
    (submit, received)
}

/// A store busy for a moment while an effect's intent is recorded costs
/// the effect nothing: the intent is written again after a pause, and the
/// request is sent once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_effect_whose_intent_met_a_busy_store_is_recorded_after_a_pause() {
    let dir = tempfile::tempdir().unwrap();
    let (runtime, faults) = steady_runtime(&dir).await;
    let (submit, received) = webhook_job(&runtime, 1, 1).await;
    faults.inject(Op::EffectBegin, Fault::FailBefore);
    faults.inject(Op::EffectBegin, Fault::FailBefore);
    let id = runtime.submit(submit).await.unwrap();
    let done = runtime.wait(id, GENEROUS).await.unwrap();
    assert_eq!(faults.injected(), 2);
    assert_eq!((done.status, done.attempt, done.releases), (JobStatus::Succeeded, 1, 0), "{done:?}");
    assert_eq!(received.load(AtomicOrdering::SeqCst), 1);
    assert_eq!(runtime.effects(id).await.unwrap().len(), 1);
    runtime.shutdown().await;
}

/// A store that stays busy through every try, or fails outright, refuses
/// the effect, and the guest fails on the refusal; that is the host's
/// fault, not the job's, so the attempt is released, not failed: free when
/// it had recorded no effect (even under `max_attempts = 1`), spending an
/// attempt when it had. The chaos run caught such a job failing as
/// `guest_error` ("HttpRequestDenied").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_refused_an_effect_because_the_store_failed_is_released_not_failed() {
    // (deliveries, max attempts, the fault before the failing ones, what
    // the upstream receives, the job's attempt, retries and releases)
    let cases = [(1, 1, None, 1, (2, 0, 1)), (2, 2, Some(Fault::Stall(Duration::ZERO)), 3, (2, 1, 0))];
    for (count, max_attempts, first, sent, counters) in cases {
        let dir = tempfile::tempdir().unwrap();
        let (runtime, faults) = steady_runtime(&dir).await;
        let (submit, received) = webhook_job(&runtime, count, max_attempts).await;
        // The first delivery's intent is recorded when `first` lets it.
        faults.inject(Op::EffectBegin, first.unwrap_or(Fault::FailBefore));
        for _ in 0..4 {
            faults.inject(Op::EffectBegin, Fault::FailBefore);
        }
        if first.is_some() {
            faults.inject(Op::EffectBegin, Fault::FailBefore);
        }
        let id = runtime.submit(submit).await.unwrap();
        let done = runtime.wait(id, GENEROUS).await.unwrap();
        assert_eq!(faults.pending(), 0);
        assert_eq!(done.status, JobStatus::Succeeded, "{done:?}");
        assert_eq!((done.attempt, done.retries, done.releases), counters, "{done:?}");
        assert_eq!(done.lost_leases, 0, "{done:?}");
        assert_eq!(received.load(AtomicOrdering::SeqCst), sent);
        runtime.shutdown().await;
    }
    // A store failing outright (not busy: asking again would not help)
    // is the host's fault too: released, not failed.
    let dir = tempfile::tempdir().unwrap();
    let (runtime, faults) = steady_runtime(&dir).await;
    let (submit, received) = webhook_job(&runtime, 1, 1).await;
    faults.inject(Op::EffectBegin, Fault::Broken);
    let id = runtime.submit(submit).await.unwrap();
    let done = runtime.wait(id, GENEROUS).await.unwrap();
    assert_eq!(faults.pending(), 0);
    assert_eq!(done.status, JobStatus::Succeeded, "{done:?}");
    assert_eq!((done.attempt, done.retries, done.releases), (2, 0, 1), "{done:?}");
    assert_eq!(received.load(AtomicOrdering::SeqCst), 1);
    runtime.shutdown().await;
}

/// A gated job arrives while the standing rules cannot be read: it is
/// stored all the same and waits for a person (the submit succeeds; a
/// failure there would invite a resend and a second job), and the next
/// twin is approved on arrival.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gated_job_arriving_while_the_rules_cannot_be_read_is_kept_and_waits() {
    use leash::access::{PrincipalCeilings, Role};
    use leash::job::ApprovalPolicy;
    use leash::runtime::DecisionBy;
    let dir = tempfile::tempdir().unwrap();
    let (runtime, faults) = steady_runtime(&dir).await;
    let name = PluginName::new("hello", "1").unwrap();
    runtime.plugin_register(leash_tests::plugin_bytes("hello"), name.clone()).await.unwrap();
    let policy: ApprovalPolicy = serde_json::from_value(serde_json::json!({ "require": ["execute"] })).unwrap();
    runtime.plugin_require_approval(name.clone(), policy).await.unwrap();
    let roles = [Role::Approve].into_iter().collect();
    runtime.principal_put("alice".into(), roles, PrincipalCeilings::default()).await.unwrap();
    let gated = || {
        let mut job =
            Submit::new(PluginSource::Ref(name.to_string().parse().unwrap()), Target::Execute, b"{}".to_vec());
        job.submitted_by = Some("sam".into());
        job
    };
    let first = runtime.submit_once(gated()).await.unwrap();
    assert_eq!(first.status, JobStatus::PendingApproval);
    runtime.approve(first.id, DecisionBy::new("alice").remember(Duration::from_secs(3600), false)).await.unwrap();

    faults.inject(Op::RuleList, Fault::FailBefore);
    let kept = runtime.submit_once(gated()).await.expect("the submit stands");
    assert_eq!(faults.injected(), 1);
    assert_eq!(kept.status, JobStatus::PendingApproval, "it waits for a person");
    assert_eq!(runtime.get(kept.id).await.unwrap().status, JobStatus::PendingApproval);
    let twin = runtime.submit_once(gated()).await.unwrap();
    assert_eq!(twin.status, JobStatus::Queued, "approved on arrival once the rules can be read");
    runtime.shutdown().await;
}
