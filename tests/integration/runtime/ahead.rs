//! Jobs a slot claims ahead: run when the slot is free, released to the
//! queue (no attempt spent, never started) when they wait past their hold
//! or when the pool stops, and never claimed when turned off.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leash::job::{JobId, JobStatus, Target};
use leash::runtime::{PluginSource, Runtime, Submit};
use leash::sandbox::SandboxConfig;

use crate::support::{GENEROUS, cache_dir, eventually, wait_for_status};

/// A lease whose hold for a job ahead is a second (a third of it, at most
/// a second), well before the lease itself runs out.
const LEASE: Duration = Duration::from_secs(6);

async fn runtime(dir: &tempfile::TempDir, ahead_below: Duration) -> Runtime {
    Runtime::builder(dir.path().join("jobs.db"))
        .sandbox(SandboxConfig { cache_dir: Some(cache_dir()), ..SandboxConfig::default() })
        .poll_interval(Duration::from_millis(20))
        .sweep_interval(Duration::from_millis(50))
        .max_workers(1)
        .lease_ttl(LEASE)
        .claim_ahead_below(ahead_below)
        .build()
        .await
        .unwrap()
}

fn job(name: &str, input: &str, priority: u8) -> Submit {
    let mut job =
        Submit::new(PluginSource::Bytes(leash_tests::plugin_bytes(name)), Target::Execute, input.as_bytes().to_vec());
    job.priority = Some(priority);
    job
}

/// The jobs whose guests started, in order.
fn starts(runtime: &Runtime) -> Arc<Mutex<Vec<JobId>>> {
    let seen: Arc<Mutex<Vec<JobId>>> = Arc::default();
    let sink = seen.clone();
    runtime.on_start(move |s| sink.lock().unwrap().push(s.id));
    seen
}

/// One slot: a short job, then a long one, then a short one. The first
/// one's finish claims the long one and, ahead of it, the last.
async fn short_long_short(runtime: &Runtime) -> [JobId; 3] {
    let ids = runtime
        .submit_many(vec![job("hello", "{}", 0), job("sleep", r#"{"ms": 600000}"#, 1), job("hello", "{}", 2)])
        .await
        .unwrap();
    let [first, long, last] = ids.try_into().unwrap();
    wait_for_status(runtime, first, JobStatus::Succeeded).await;
    wait_for_status(runtime, long, JobStatus::Running).await;
    [first, long, last]
}

/// A runtime that always claims ahead, whose last job is claimed ahead of
/// its long one; the guests started so far; the long job and the one
/// ahead.
async fn one_ahead(dir: &tempfile::TempDir) -> (Runtime, Arc<Mutex<Vec<JobId>>>, JobId, JobId) {
    let runtime = runtime(dir, Duration::from_secs(3600)).await;
    let started = starts(&runtime);
    let [_, long, ahead] = short_long_short(&runtime).await;
    // Claimed with the first one's finish, waiting behind the long one.
    wait_for_status(&runtime, ahead, JobStatus::Running).await;
    (runtime, started, long, ahead)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_ahead_of_a_long_one_goes_back_to_the_queue_unspent() {
    let dir = tempfile::tempdir().unwrap();
    let (runtime, started, long, ahead) = one_ahead(&dir).await;
    let due = runtime.get(ahead).await.unwrap().run_after;

    // Its hold (a second) runs out long before its lease (six): back to
    // the queue by a release, not by the sweeper (which would count a
    // lost lease, or a free re-run for an attempt that recorded no
    // effect).
    let back = eventually("the job ahead goes back to the queue", async || {
        let job = runtime.get(ahead).await.unwrap();
        (job.status == JobStatus::Queued && job.lease_token.is_none()).then_some(job)
    })
    .await;
    assert_eq!((back.lost_leases, back.retries, back.free_reruns), (0, 0, 0), "no attempt spent: {back:?}");
    assert_eq!(back.run_after, due, "in the place it had in the queue, not behind jobs submitted since");
    assert!(!started.lock().unwrap().contains(&ahead), "never started while it waited");

    // The slot frees: it runs, once, and succeeds.
    runtime.cancel(long).await.unwrap();
    let done = runtime.wait(ahead, GENEROUS).await.unwrap();
    assert_eq!(done.status, JobStatus::Succeeded, "{done:?}");
    assert_eq!((done.lost_leases, done.retries, done.free_reruns), (0, 0, 0));
    assert_eq!(started.lock().unwrap().iter().filter(|id| **id == ahead).count(), 1);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_a_job_ahead_without_running_it() {
    let dir = tempfile::tempdir().unwrap();
    let (runtime, started, long, ahead) = one_ahead(&dir).await;
    let due = runtime.get(ahead).await.unwrap().run_after;
    runtime.shutdown().await;

    for id in [long, ahead] {
        let job = runtime.get(id).await.unwrap();
        let counted = (job.status, job.lost_leases, job.retries, job.free_reruns);
        assert_eq!(counted, (JobStatus::Queued, 0, 0, 0), "{job:?}");
    }
    assert!(!started.lock().unwrap().contains(&ahead), "the job ahead never started");
    assert_eq!(runtime.get(ahead).await.unwrap().run_after, due, "in the place it had in the queue");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_told_to_claim_none_ahead_claims_none() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = runtime(&dir, Duration::ZERO).await;
    let [_, long, last] = short_long_short(&runtime).await;
    // The first finish claimed the long job only; the last stays queued,
    // never claimed, while the long one runs.
    let job = runtime.get(last).await.unwrap();
    assert_eq!((job.status, job.worker_id), (JobStatus::Queued, None), "claimed ahead though told not to");
    runtime.cancel(long).await.unwrap();
    assert_eq!(runtime.wait(last, GENEROUS).await.unwrap().status, JobStatus::Succeeded);
    runtime.shutdown().await;
}
