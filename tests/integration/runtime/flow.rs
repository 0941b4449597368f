//! Flow control through a real pool: the order a backlog runs in, and a
//! pause that holds across a restart.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leash::clock::{ManualClock, Timestamp};
use leash::job::{JobId, PluginName, PluginRef, Target};
use leash::runtime::{PluginSource, Runtime, Submit};
use leash::sandbox::SandboxConfig;
use leash::store::{AGED_AFTER, AGED_SHARE};

use super::metrics::builder;
use crate::support::{GENEROUS, cache_dir};

fn hello(priority: u8) -> Submit {
    let plugin = PluginRef::Version(PluginName::new("hello", "1").unwrap());
    let mut job = Submit::new(PluginSource::Ref(plugin), Target::Execute, b"{}".to_vec());
    job.priority = Some(priority);
    job
}

/// One slot, a backlog queued before the pool starts: it runs by
/// priority, in submission order within one; a priority-9 job due for
/// over a minute is not left to the end but started by the pool's aged
/// share, within its first ten claims. The pool claims none ahead: with
/// a job ahead, two of the slot's finishes may be out at once, and their
/// claims may land in either order (`docs/flow-control.md`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_runs_a_backlog_by_priority_and_an_aged_job_within_its_share() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Timestamp::now());
    let submitter = builder(&dir, &clock).without_workers().build().await.unwrap();
    submitter
        .plugin_register(leash_tests::plugin_bytes("hello"), PluginName::new("hello", "1").unwrap())
        .await
        .unwrap();
    let aged = submitter.submit(hello(9)).await.unwrap();
    clock.advance(AGED_AFTER + Duration::from_secs(1));
    let mut by_priority: Vec<(u8, JobId)> = Vec::new();
    for i in 0..30 {
        // A millisecond apart: submission order is due order.
        clock.advance(Duration::from_millis(1));
        let priority = if i % 3 == 0 { 5 } else { 0 };
        by_priority.push((priority, submitter.submit(hello(priority)).await.unwrap()));
    }
    let starts = Arc::new(Mutex::new(Vec::<JobId>::new()));
    let seen = starts.clone();
    let pool = builder(&dir, &clock)
        .max_workers(1)
        .claim_ahead_below(Duration::ZERO)
        .on_start(move |s| seen.lock().unwrap().push(s.id))
        .build()
        .await
        .unwrap();
    for (_, id) in &by_priority {
        pool.wait(*id, GENEROUS).await.unwrap();
    }
    pool.wait(aged, GENEROUS).await.unwrap();
    let starts = starts.lock().unwrap().clone();
    let at = starts.iter().position(|id| *id == aged).unwrap();
    assert!(at < AGED_SHARE as usize, "the aged job started {}th of {}", at + 1, starts.len());
    let rest: Vec<JobId> = starts.iter().copied().filter(|id| *id != aged).collect();
    by_priority.sort_by_key(|(priority, _)| *priority);
    let expected: Vec<JobId> = by_priority.into_iter().map(|(_, id)| id).collect();
    assert_eq!(rest, expected, "priority 0 first, then 5, each in submission order");
    pool.shutdown().await;
    submitter.shutdown().await;
}

/// A paused plugin's jobs wait, through a restart of the only process,
/// while other plugins' jobs run; resumed, they run. On `db`.
async fn a_pause_holds_across_a_restart_on(db: String) {
    let build = || {
        Runtime::builder(db.clone())
            .sandbox(SandboxConfig { cache_dir: Some(cache_dir()), ..SandboxConfig::default() })
            .poll_interval(Duration::from_millis(20))
            .max_workers(1)
            .build()
    };
    let runtime = build().await.unwrap();
    for name in ["hello", "echo"] {
        runtime.plugin_register(leash_tests::plugin_bytes(name), PluginName::new(name, "1").unwrap()).await.unwrap();
    }
    let by_name = |name: &str| {
        let plugin = PluginRef::Version(PluginName::new(name, "1").unwrap());
        Submit::new(PluginSource::Ref(plugin), Target::Execute, b"{}".to_vec())
    };
    let pause = runtime.plugin_pause("hello", Some("upstream down".into())).await.unwrap();
    assert_eq!(pause.reason.as_deref(), Some("upstream down"));
    assert!(matches!(runtime.plugin_pause("nobody", None).await, Err(leash::runtime::RuntimeError::UnknownPlugin(_))));
    // One slot, and the held job is due first: had the pause not held, it
    // would have run before the other.
    let held = runtime.submit(by_name("hello")).await.unwrap();
    let other = runtime.submit(by_name("echo")).await.unwrap();
    assert_eq!(runtime.wait(other, GENEROUS).await.unwrap().status, leash::job::JobStatus::Succeeded);
    assert_eq!(runtime.get(held).await.unwrap().status, leash::job::JobStatus::Queued);
    runtime.shutdown().await;

    let restarted = build().await.unwrap();
    let health = restarted.health().await.unwrap();
    assert_eq!(health.paused_plugins.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["hello"]);
    let after = restarted.submit(by_name("echo")).await.unwrap();
    assert_eq!(restarted.wait(after, GENEROUS).await.unwrap().status, leash::job::JobStatus::Succeeded);
    assert_eq!(restarted.get(held).await.unwrap().status, leash::job::JobStatus::Queued, "still held");
    assert!(restarted.plugin_resume("hello").await.unwrap());
    assert_eq!(restarted.wait(held, GENEROUS).await.unwrap().status, leash::job::JobStatus::Succeeded);
    restarted.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_holds_across_a_restart_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    a_pause_holds_across_a_restart_on(dir.path().join("jobs.db").to_string_lossy().into_owned()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_holds_across_a_restart_on_postgres() {
    let Some(url) = crate::support::pg::url() else { return };
    let schema = crate::support::pg::Schema::create(&url).await;
    a_pause_holds_across_a_restart_on(schema.url.clone()).await;
}
