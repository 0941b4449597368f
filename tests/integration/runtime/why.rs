//! `Runtime::why` (`leash jobs why`, `GET /v1/jobs/{id}/why`) on both
//! backends, for every reason it gives: the jobs a claim takes first are
//! counted from the store (by priority, then due time; paused, not-yet-due
//! and running-key jobs left out), and a pause, a delay, a gate, an
//! approval, a lost lease, a running job, its concurrency key, a busy
//! slot, a backoff, a rate limit and each ending are named.

use std::sync::Arc;
use std::time::Duration;

use leash::clock::{ManualClock, Timestamp};
use leash::job::{JobId, PluginName, PluginRef, Target};
use leash::runtime::{PluginSource, Runtime, Submit};
use leash::sandbox::SandboxConfig;
use leash::store::JobClaimParams;

use crate::support::{cache_dir, eventually};

fn job(name: &str, priority: u8) -> Submit {
    let plugin = PluginRef::Version(PluginName::new(name, "1").unwrap());
    let mut job = Submit::new(PluginSource::Ref(plugin), Target::Execute, b"{}".to_vec());
    job.priority = Some(priority);
    job
}

async fn why_names_what_holds_each_job_on(db: String) {
    let clock = ManualClock::new(Timestamp::now());
    let runtime = Runtime::builder(db)
        .sandbox(SandboxConfig { cache_dir: Some(cache_dir()), ..SandboxConfig::default() })
        .clock(Arc::new(clock.clone()))
        .without_workers()
        .build()
        .await
        .unwrap();
    for name in ["hello", "echo"] {
        runtime.plugin_register(leash_tests::plugin_bytes(name), PluginName::new(name, "1").unwrap()).await.unwrap();
    }
    // A millisecond apart: submission order is due order.
    let submit = async |s: Submit| {
        clock.advance(Duration::from_millis(1));
        runtime.submit(s).await.unwrap()
    };
    let late = submit(job("hello", 5)).await;
    let held = submit(job("echo", 0)).await;
    let first = submit(job("hello", 0)).await;
    let second = submit(job("hello", 0)).await;
    let mut delayed = job("hello", 0);
    delayed.run_at = Some(runtime.now().plus(Duration::from_secs(60)));
    let delayed = submit(delayed).await;
    let mut gated = job("hello", 0);
    gated.approval = Some(true);
    let gated = submit(gated).await;
    runtime.plugin_pause("echo", Some("upstream down".into())).await.unwrap();

    let why = async |id: JobId| runtime.why(id, true).await.unwrap();
    // No worker runs beside this runtime: each due job says so, with what
    // is ahead of it (the paused and the delayed jobs are not).
    for (id, ahead) in [(first, 0), (second, 1), (late, 2)] {
        let why = why(id).await;
        assert_eq!(why.reason, "no_workers", "{why:?}");
        assert_eq!(why.evidence["ahead"], ahead, "{id}: {why:?}");
    }
    let paused = why(held).await;
    assert_eq!(paused.reason, "paused");
    assert!(paused.sentence.contains("`echo` was paused") && paused.sentence.contains("upstream down"), "{paused:?}");
    let not_due = why(delayed).await;
    assert_eq!(not_due.reason, "not_due");
    // Due 60 s after its submit; the clock moved 1 ms since (the next submit).
    assert!(not_due.sentence.contains("(in 59 s)"), "{not_due:?}");
    let waiting = why(gated).await;
    assert_eq!(waiting.reason, "pending_approval");
    assert!(waiting.sentence.contains("a principal with the `approve` role"), "{waiting:?}");

    // A lease that ran out on a worker that never registered (a process
    // gone before its first report); the sweep that puts it back is this
    // runtime's.
    let claimed = runtime
        .store()
        .job_claim(JobClaimParams {
            worker_id: "worker-0000dead".into(),
            limit: 1,
            alone: false,
            lease_ttl: Duration::from_secs(10),
            now: runtime.now(),
            aged: 0,
        })
        .await
        .unwrap();
    assert_eq!(claimed.iter().map(|l| l.job.id).collect::<Vec<_>>(), [first]);
    assert_eq!(why(first).await.reason, "running");
    clock.advance(Duration::from_secs(30));
    let lost = why(first).await;
    assert_eq!(lost.reason, "lease_expired", "{lost:?}");
    assert!(
        lost.sentence.starts_with("its lease expired 20 s ago on worker-0000dead, which is not registered"),
        "{lost:?}"
    );

    let mut held = job("hello", 0);
    held.approval = Some(true);
    held.run_on_approve = false;
    let held = submit(held).await;
    let by = leash::runtime::DecisionBy::new("ada");
    runtime.approve(held, by).await.unwrap();
    let approved = why(held).await;
    assert_eq!(approved.reason, "approved");
    assert!(approved.sentence.starts_with("approved by ada"), "{approved:?}");

    runtime.cancel(second).await.unwrap();
    let cancelled = why(second).await;
    assert_eq!(cancelled.reason, "cancelled");
    assert_eq!(why(late).await.evidence["ahead"], 0, "neither a running nor a cancelled job is ahead");
    assert!(matches!(
        runtime.why(JobId::new(runtime.now()), true).await,
        Err(leash::runtime::RuntimeError::NotFound(_))
    ));
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn why_names_what_holds_each_job_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    why_names_what_holds_each_job_on(dir.path().join("jobs.db").to_string_lossy().into_owned()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn why_names_what_holds_each_job_on_postgres() {
    let Some(url) = crate::support::pg::url() else { return };
    let schema = crate::support::pg::Schema::create(&url).await;
    why_names_what_holds_each_job_on(schema.url.clone()).await;
}

/// Through a running pool of one slot: a running job names its worker; a
/// job of its concurrency key names it; another waits its turn with the
/// slot busy; a retryable failure waits out its backoff; a job over its
/// rate limit waits for its slot.
async fn why_follows_jobs_through_a_pool_on(db: String) {
    let clock = ManualClock::new(Timestamp::now());
    let runtime = Runtime::builder(db)
        .sandbox(SandboxConfig { cache_dir: Some(cache_dir()), ..SandboxConfig::default() })
        .clock(Arc::new(clock.clone()))
        .poll_interval(Duration::from_millis(20))
        .sweep_interval(Duration::from_secs(3600))
        .max_workers(1)
        .build()
        .await
        .unwrap();
    for name in ["sleep", "hello", "fail"] {
        runtime.plugin_register(leash_tests::plugin_bytes(name), PluginName::new(name, "1").unwrap()).await.unwrap();
    }
    let why = async |id: JobId| runtime.why(id, true).await.unwrap();
    let mut sleeper = job("sleep", 0);
    sleeper.concurrency_key = Some("repo-1".into());
    let sleeper = runtime.submit(sleeper).await.unwrap();
    let running =
        eventually("the sleeper runs", async || Some(why(sleeper).await).filter(|w| w.reason == "running")).await;
    let worker = running.evidence["worker_id"].as_str().unwrap().to_owned();
    assert!(running.sentence.starts_with(&format!("running on {worker} for ")), "{running:?}");

    let mut keyed = job("hello", 0);
    keyed.concurrency_key = Some("repo-1".into());
    let keyed = runtime.submit(keyed).await.unwrap();
    let by_key = why(keyed).await;
    assert_eq!(by_key.reason, "concurrency_key");
    assert!(by_key.sentence.contains(&sleeper.to_string()), "{by_key:?}");

    let other = runtime.submit(job("hello", 0)).await.unwrap();
    let turn = eventually("the worker reports its busy slot", async || {
        Some(why(other).await).filter(|w| w.reason == "waiting_turn" && w.evidence["slots_busy"] == 1)
    })
    .await;
    assert!(turn.sentence.ends_with("1 of 1 slots busy on 1 worker"), "{turn:?}");
    assert_eq!(turn.evidence["ahead"], 0, "the keyed job is due first but is not counted: {turn:?}");

    runtime.cancel(sleeper).await.unwrap();
    for id in [keyed, other] {
        runtime.wait(id, crate::support::GENEROUS).await.unwrap();
    }
    assert_eq!(why(other).await.reason, "succeeded");
    let failing = runtime.submit(job("fail", 0)).await.unwrap();
    runtime.wait(failing, crate::support::GENEROUS).await.unwrap();
    let failed = why(failing).await;
    assert_eq!(failed.reason, "failed");
    assert!(failed.sentence.contains("the fail plugin always fails"), "{failed:?}");

    let mut retried = job("fail", 0);
    retried.input = br#"{"kind": "retryable", "message": "503 from upstream"}"#.to_vec();
    retried.max_attempts = Some(2);
    retried.backoff = Some(leash::job::Backoff { base: Duration::from_secs(3600), cap: Duration::from_secs(3600) });
    let retried = runtime.submit(retried).await.unwrap();
    let backoff =
        eventually("the first attempt fails", async || Some(why(retried).await).filter(|w| w.reason == "backoff"))
            .await;
    assert!(
        backoff.sentence.contains("after attempt 1 failed") && backoff.sentence.contains("503 from upstream"),
        "{backoff:?}"
    );

    runtime.rate_limit_set("slow", "1/h".parse().unwrap(), None, Default::default()).await.unwrap();
    let limited = |_| {
        let mut j = job("hello", 0);
        j.rate_limit = Some("slow".into());
        j
    };
    let a = runtime.submit(limited(0)).await.unwrap();
    // A millisecond later, so `a` is due first and takes the one start.
    clock.advance(Duration::from_millis(1));
    let b = runtime.submit(limited(1)).await.unwrap();
    runtime.wait(a, crate::support::GENEROUS).await.unwrap();
    let waiting = eventually("the second start is given a later slot", async || {
        Some(why(b).await).filter(|w| w.reason == "rate_limited")
    })
    .await;
    assert!(waiting.sentence.starts_with("over its rate limit `slow` until"), "{waiting:?}");
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn why_follows_jobs_through_a_pool_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    why_follows_jobs_through_a_pool_on(dir.path().join("jobs.db").to_string_lossy().into_owned()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn why_follows_jobs_through_a_pool_on_postgres() {
    let Some(url) = crate::support::pg::url() else { return };
    let schema = crate::support::pg::Schema::create(&url).await;
    why_follows_jobs_through_a_pool_on(schema.url.clone()).await;
}
