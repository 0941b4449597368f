//! Schedules through the embedding API, on both backends: two schedulers
//! sharing one store fire each firing once; a restart across missed
//! firings honours the catch-up policy; overlap policies; a paused
//! schedule holds across a restart. The tests drive the clock and call the
//! scheduler's tick themselves (their runtimes run no workers, so no
//! scheduler of their own).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use leash::clock::{Clock, ManualClock, Timestamp};
use leash::job::{Cadence, CatchUp, JobTemplate, Overlap, PluginName};
use leash::runtime::{Runtime, RuntimeError, ScheduleSpec};
use leash::sandbox::SandboxConfig;
use leash::store::JobListParams;

use crate::support::cache_dir;

/// A runtime with no workers on `db`, on `clock`.
async fn scheduler(db: &str, clock: &ManualClock) -> Runtime {
    Runtime::builder(db.to_owned())
        .sandbox(SandboxConfig { cache_dir: Some(cache_dir()), ..SandboxConfig::default() })
        .clock(Arc::new(clock.clone()))
        .without_workers()
        .build()
        .await
        .unwrap()
}

fn every(name: &str, seconds: u64, overlap: Overlap, catch_up: CatchUp) -> ScheduleSpec {
    ScheduleSpec {
        name: name.into(),
        cadence: Cadence::every(Duration::from_secs(seconds)).unwrap(),
        overlap,
        catch_up,
        job: JobTemplate {
            plugin: "hello".into(),
            input: Some(serde_json::json!({"name": name})),
            ..Default::default()
        },
        paused: false,
    }
}

/// A clock at a whole minute (so interval firings fall on known instants).
fn minute_clock() -> ManualClock {
    let now = Timestamp::now().unix_ms();
    ManualClock::new(Timestamp::from_unix_ms(now - now % 60_000 + 60_000 * 60))
}

async fn jobs_of(runtime: &Runtime, name: &str) -> Vec<leash::job::Job> {
    let id = runtime.schedule(name).await.unwrap().id;
    runtime.list(JobListParams { schedule_id: Some(id), limit: 500, ..JobListParams::default() }).await.unwrap()
}

async fn register_hello(runtime: &Runtime) {
    runtime.plugin_register(leash_tests::plugin_bytes("hello"), PluginName::new("hello", "1").unwrap()).await.unwrap();
}

/// Two schedulers (separate store handles: on SQLite two writers on one
/// file, as two processes are; on PostgreSQL two pools, as two replicas
/// are) tick together at each of 60 firings of a one-second schedule:
/// each firing submits exactly one job.
async fn two_schedulers_fire_each_of_sixty_firings_once_on(db: String) {
    let clock = minute_clock();
    let (a, b) = (scheduler(&db, &clock).await, scheduler(&db, &clock).await);
    register_hello(&a).await;
    a.schedule_add(every("tick", 1, Overlap::Allow, CatchUp::All)).await.unwrap();
    for _ in 0..60 {
        clock.advance(Duration::from_secs(1));
        let (ra, rb) = tokio::join!(a.schedules_fire_due(), b.schedules_fire_due());
        let (ra, rb) = (ra.unwrap(), rb.unwrap());
        // Both ticked; the store turned the later one away, or it read the
        // schedule after the winner's commit and found it not due.
        assert_eq!(ra.submitted + rb.submitted, 1, "one job per firing: {ra:?} {rb:?}");
    }
    let jobs = jobs_of(&a, "tick").await;
    assert_eq!(jobs.len(), 60);
    let created: BTreeSet<i64> = jobs.iter().map(|j| j.created_at.unix_ms()).collect();
    assert_eq!(created.len(), 60, "one job at each of the 60 instants");
    let schedule = b.schedule("tick").await.unwrap();
    assert_eq!((schedule.fired, schedule.skipped), (60, 0));
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_schedulers_fire_each_of_sixty_firings_once_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    two_schedulers_fire_each_of_sixty_firings_once_on(dir.path().join("jobs.db").to_string_lossy().into_owned()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_schedulers_fire_each_of_sixty_firings_once_on_postgres() {
    let Some(url) = crate::support::pg::url() else { return };
    let schema = crate::support::pg::Schema::create(&url).await;
    two_schedulers_fire_each_of_sixty_firings_once_on(schema.url.clone()).await;
}

/// Down across three missed firings (the last 35 s late): `none` submits
/// nothing, `last` the latest, `all` the three, oldest first.
async fn a_restart_across_three_missed_firings_honours_catch_up_on(db: String) {
    let clock = minute_clock();
    let first = scheduler(&db, &clock).await;
    register_hello(&first).await;
    for (name, catch_up) in [("none", CatchUp::None), ("last", CatchUp::Last), ("all", CatchUp::All)] {
        first.schedule_add(every(name, 60, Overlap::Allow, catch_up)).await.unwrap();
    }
    clock.advance(Duration::from_secs(60));
    assert_eq!(first.schedules_fire_due().await.unwrap().submitted, 3, "one firing each, on time");
    first.shutdown().await;

    // Down for 215 s: the firings at +120, +180 and +240 s were missed.
    clock.advance(Duration::from_secs(215));
    let second = scheduler(&db, &clock).await;
    assert_eq!(second.schedules_fire_due().await.unwrap().submitted, 4);
    let base = clock.now().unix_ms() - 275_000;
    assert_eq!(jobs_of(&second, "none").await.len(), 1, "none: only the on-time firing before the restart");
    assert_eq!(jobs_of(&second, "last").await.len(), 2);
    assert_eq!(jobs_of(&second, "all").await.len(), 4);
    let none = second.schedule("none").await.unwrap();
    assert_eq!(none.skipped, 3);
    assert!(none.last_outcome.as_deref().unwrap().contains("3 missed firings dropped (catch_up: none)"), "{none:?}");
    let last = second.schedule("last").await.unwrap();
    assert_eq!((last.fired, last.skipped), (2, 2));
    let all = second.schedule("all").await.unwrap();
    assert_eq!((all.fired, all.skipped), (4, 0));
    // Each schedule's next firing is the first after now.
    for s in [none, last, all] {
        assert_eq!(s.next_fire_at.unwrap().unix_ms(), base + 300_000, "{}", s.name);
        assert_eq!(s.last_fired_at.unwrap().unix_ms(), base + 240_000, "the latest due firing, fired or dropped");
    }
    second.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_across_three_missed_firings_honours_catch_up_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    a_restart_across_three_missed_firings_honours_catch_up_on(
        dir.path().join("jobs.db").to_string_lossy().into_owned(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_across_three_missed_firings_honours_catch_up_on_postgres() {
    let Some(url) = crate::support::pg::url() else { return };
    let schema = crate::support::pg::Schema::create(&url).await;
    a_restart_across_three_missed_firings_honours_catch_up_on(schema.url.clone()).await;
}

/// `skip` submits nothing while the previous job has not ended; `queue`
/// submits behind it under one concurrency key; a paused schedule fires
/// nothing, across a restart, and resumed fires from its next time after
/// now (no catch-up of the pause).
async fn overlap_and_pause_on(db: String) {
    let clock = minute_clock();
    let runtime = scheduler(&db, &clock).await;
    register_hello(&runtime).await;
    runtime.schedule_add(every("skip", 10, Overlap::Skip, CatchUp::Last)).await.unwrap();
    runtime.schedule_add(every("queue", 10, Overlap::Queue, CatchUp::Last)).await.unwrap();
    runtime.schedule_add(every("held", 10, Overlap::Allow, CatchUp::All)).await.unwrap();
    let paused = runtime.schedule_pause("held", Some("upstream down".into())).await.unwrap();
    assert_eq!(paused.paused.as_ref().and_then(|p| p.reason.as_deref()), Some("upstream down"));
    for _ in 0..2 {
        clock.advance(Duration::from_secs(10));
        runtime.schedules_fire_due().await.unwrap();
    }
    // Nothing ran the first jobs (no workers): skip's second firing was skipped.
    assert_eq!(jobs_of(&runtime, "skip").await.len(), 1);
    let skip = runtime.schedule("skip").await.unwrap();
    assert_eq!((skip.fired, skip.skipped), (1, 1));
    assert!(skip.last_outcome.unwrap().contains("previous job has not ended"));
    let queued = jobs_of(&runtime, "queue").await;
    assert_eq!(queued.len(), 2);
    assert!(queued.iter().all(|j| j.concurrency_key.as_deref() == Some("schedule:queue")), "one key: one at a time");
    assert!(jobs_of(&runtime, "held").await.is_empty());
    let metrics = runtime.metrics().encode();
    for (outcome, n) in [("submitted", 3), ("skipped", 1)] {
        let line = format!("leash_schedule_firings_total{{outcome=\"{outcome}\"}} {n}");
        assert!(metrics.lines().any(|l| l == line), "{line} in {metrics}");
    }
    // The trigger submits even while paused, as the schedule's creator.
    let triggered = runtime.schedule_trigger("held").await.unwrap();
    assert_eq!(triggered.schedule_id, Some(paused.id));
    runtime.shutdown().await;

    let restarted = scheduler(&db, &clock).await;
    clock.advance(Duration::from_secs(60));
    restarted.schedules_fire_due().await.unwrap();
    assert_eq!(jobs_of(&restarted, "held").await.len(), 1, "still paused: only the trigger's job");
    let resumed = restarted.schedule_resume("held").await.unwrap();
    assert!(resumed.paused.is_none());
    assert!(resumed.next_fire_at.unwrap() > clock.now(), "the paused stretch is not caught up");
    assert_eq!(restarted.schedules_fire_due().await.unwrap().submitted, 0);
    clock.advance(Duration::from_secs(10));
    restarted.schedules_fire_due().await.unwrap();
    assert_eq!(jobs_of(&restarted, "held").await.len(), 2);
    assert!(matches!(restarted.schedule_resume("nobody").await, Err(RuntimeError::UnknownSchedule(_))));
    restarted.schedule_remove("held").await.unwrap();
    assert!(matches!(restarted.schedule("held").await, Err(RuntimeError::UnknownSchedule(_))));
    restarted.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlap_and_pause_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    overlap_and_pause_on(dir.path().join("jobs.db").to_string_lossy().into_owned()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlap_and_pause_on_postgres() {
    let Some(url) = crate::support::pg::url() else { return };
    let schema = crate::support::pg::Schema::create(&url).await;
    overlap_and_pause_on(schema.url.clone()).await;
}

/// A schedule's job is checked when it is added: an unknown plugin, a bad
/// expression, a taken name and a limit over the ceiling are refused and
/// nothing is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_schedule_is_refused_when_added() {
    let dir = tempfile::tempdir().unwrap();
    let clock = minute_clock();
    let runtime = scheduler(&dir.path().join("jobs.db").to_string_lossy(), &clock).await;
    register_hello(&runtime).await;
    let unknown = ScheduleSpec {
        job: JobTemplate { plugin: "nobody".into(), ..Default::default() },
        ..every("x", 60, Overlap::Skip, CatchUp::Last)
    };
    assert!(matches!(runtime.schedule_add(unknown).await, Err(RuntimeError::UnknownPlugin(_))));
    let huge = ScheduleSpec {
        job: JobTemplate { plugin: "hello".into(), memory_bytes: Some(1 << 40), ..Default::default() },
        ..every("x", 60, Overlap::Skip, CatchUp::Last)
    };
    assert!(matches!(runtime.schedule_add(huge).await, Err(RuntimeError::InvalidJob(_))));
    let bad_name = ScheduleSpec { name: "Bad Name".into(), ..every("x", 60, Overlap::Skip, CatchUp::Last) };
    assert!(matches!(runtime.schedule_add(bad_name).await, Err(RuntimeError::InvalidSchedule(_))));
    assert!(runtime.schedules().await.unwrap().is_empty());
    runtime.schedule_add(every("x", 60, Overlap::Skip, CatchUp::Last)).await.unwrap();
    let again = runtime.schedule_add(every("x", 60, Overlap::Skip, CatchUp::Last)).await;
    assert!(matches!(again, Err(RuntimeError::Store(leash::store::StoreError::NameTaken(_)))), "{again:?}");
    assert_eq!(runtime.schedules().await.unwrap().len(), 1);
    runtime.shutdown().await;
}
