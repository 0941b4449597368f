//! The metrics an operator alerts on, read through `Runtime::metrics_text`
//! with an injected clock: per-plugin labels, queue waits, attempt
//! durations, attempts by outcome, and the oldest queued job's age.

use std::sync::Arc;
use std::time::Duration;

use leash::clock::{ManualClock, Timestamp};
use leash::job::{Backoff, JobStatus, PluginName, PluginRef, Target};
use leash::runtime::{PluginSource, Runtime, RuntimeBuilder, Submit};
use leash::sandbox::SandboxConfig;

use crate::support::{GENEROUS, cache_dir, eventually};

/// A runtime on a file in `dir` on `clock`'s time, polling often and
/// sweeping never (within a test).
pub(super) fn builder(dir: &tempfile::TempDir, clock: &ManualClock) -> RuntimeBuilder {
    Runtime::builder(dir.path().join("jobs.db"))
        .sandbox(SandboxConfig { cache_dir: Some(cache_dir()), ..SandboxConfig::default() })
        .poll_interval(Duration::from_millis(20))
        .clock(Arc::new(clock.clone()))
        .sweep_interval(Duration::from_secs(3600))
}

fn named(name: &str, input: &str) -> Submit {
    let plugin = PluginRef::Version(PluginName::new(name, "1").unwrap());
    Submit::new(PluginSource::Ref(plugin), Target::Execute, input.as_bytes().to_vec())
}

/// The value of the sample line that starts with `series` (name and
/// labels), or `None` when there is none.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_label_plugins_and_time_queue_waits_attempts_and_the_oldest_queued_job() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Timestamp::now());
    // Submitted where nothing claims: the job waits as long as the clock says.
    let submitter = builder(&dir, &clock).without_workers().build().await.unwrap();
    for name in ["hello", "fail"] {
        let bytes = leash_tests::plugin_bytes(name);
        submitter.plugin_register(bytes, PluginName::new(name, "1").unwrap()).await.unwrap();
    }
    let text = submitter.metrics_text().await.unwrap();
    assert_eq!(sample(&text, "leash_oldest_queued_seconds"), Some(0.0), "nothing queued: {text}");
    let hello = submitter.submit(named("hello", "{}")).await.unwrap();
    clock.advance(Duration::from_secs(90));
    let text = submitter.metrics_text().await.unwrap();
    assert_eq!(sample(&text, "leash_oldest_queued_seconds"), Some(90.0), "{text}");

    // A pool claims it 90 s after it could run, and runs a job that fails
    // retryably once, then for good.
    let pool = builder(&dir, &clock).build().await.unwrap();
    assert_eq!(pool.wait(hello, GENEROUS).await.unwrap().status, JobStatus::Succeeded);
    let mut fail = named("fail", r#"{"kind": "retryable", "message": "503"}"#);
    fail.max_attempts = Some(2);
    fail.backoff = Some(Backoff { base: Duration::from_secs(60), cap: Duration::from_secs(60) });
    let failing = pool.submit(fail).await.unwrap();
    eventually("the first attempt is retried", async || {
        let text = pool.metrics_text().await.unwrap();
        sample(&text, "leash_attempts_total{plugin=\"fail\",outcome=\"retried\"}")
    })
    .await;
    // Waiting out its backoff is not waiting in the queue: it can run only
    // once the clock passes run_after.
    let text = pool.metrics_text().await.unwrap();
    assert_eq!(sample(&text, "leash_oldest_queued_seconds"), Some(0.0), "delayed, not claimable yet: {text}");
    clock.advance(Duration::from_secs(61));
    let done = pool.wait(failing, GENEROUS).await.unwrap();
    assert_eq!(done.status, JobStatus::Failed);

    // The pool counts an attempt once its end is in the store, so a wait
    // that polled the store can answer a moment before the count.
    let text = eventually("the last attempt is counted", async || {
        let text = pool.metrics_text().await.unwrap();
        sample(&text, "leash_attempts_total{plugin=\"fail\",outcome=\"failed\"}").map(|_| text)
    })
    .await;
    for (series, value) in [
        ("leash_attempts_total{plugin=\"hello\",outcome=\"succeeded\"}", 1.0),
        ("leash_attempts_total{plugin=\"fail\",outcome=\"retried\"}", 1.0),
        ("leash_attempts_total{plugin=\"fail\",outcome=\"failed\"}", 1.0),
        ("leash_jobs_finished_total{status=\"succeeded\",error_kind=\"\",plugin=\"hello\"}", 1.0),
        ("leash_jobs_finished_total{status=\"failed\",error_kind=\"guest_error\",plugin=\"fail\"}", 1.0),
        ("leash_queue_wait_seconds_count{plugin=\"hello\"}", 1.0),
        // The wait is read from the injected clock: the 90 s it was made
        // to wait, not the moments it took to claim.
        ("leash_queue_wait_seconds_sum{plugin=\"hello\"}", 90.0),
        ("leash_queue_wait_seconds_bucket{le=\"65.536\",plugin=\"hello\"}", 0.0),
        ("leash_queue_wait_seconds_bucket{le=\"262.144\",plugin=\"hello\"}", 1.0),
        ("leash_job_duration_seconds_count{plugin=\"fail\"}", 2.0),
        ("leash_job_duration_seconds_count{plugin=\"hello\"}", 1.0),
        ("leash_oldest_queued_seconds", 0.0),
    ] {
        assert_eq!(sample(&text, series), Some(value), "{series} in\n{text}");
    }
    pool.shutdown().await;
    submitter.shutdown().await;
}
