//! Schedules in the store: stored and read back whole, paused and resumed
//! with their revision moved, and each firing taken once with its jobs,
//! however many schedulers race for it.

use std::sync::Arc;
use std::time::Duration;

use leash::job::{Cadence, CatchUp, JobId, JobTemplate, NewJob, Overlap, Schedule};
use leash::store::{AuditListParams, JobStore, ScheduleFireParams, ScheduleFired, SchedulePauseParams, StoreError};

use super::{T0, at, claim, new_job, succeed};

fn schedule(name: &str) -> Schedule {
    Schedule {
        id: JobId::new(T0),
        name: name.into(),
        cadence: Cadence::cron("*/10 * * * * *", "Europe/Berlin").unwrap(),
        overlap: Overlap::Skip,
        catch_up: CatchUp::All,
        job: JobTemplate {
            plugin: "hello@1".into(),
            input: Some(serde_json::json!({"n": 1})),
            timeout: Some(Duration::from_secs(5)),
            priority: Some(3),
            ..Default::default()
        },
        paused: None,
        next_fire_at: Some(at(10)),
        last_fired_at: None,
        last_outcome: None,
        fired: 0,
        skipped: 0,
        created_by: Some("sam".into()),
        created_at: T0,
        revision: 0,
    }
}

fn scheduled_job(s: &Schedule, input: &str) -> NewJob {
    NewJob { schedule_id: Some(s.id), ..new_job(input) }
}

fn fire(s: &Schedule, due: u64, next: u64, jobs: Vec<NewJob>) -> ScheduleFireParams {
    ScheduleFireParams {
        id: s.id,
        revision: s.revision,
        due: at(due),
        latest: at(due),
        next: Some(at(next)),
        jobs,
        skip_if_active: s.overlap == Overlap::Skip,
        skipped: 0,
        outcome: "submitted 1 job".into(),
        now: at(due),
    }
}

pub(crate) async fn a_schedule_round_trips_pauses_resumes_and_is_removed_audited(store: Arc<dyn JobStore>) {
    let added = store.schedule_create(schedule("nightly"), T0).await.unwrap();
    assert_eq!(store.schedule_get("nightly".into()).await.unwrap().as_ref(), Some(&added), "read back whole");
    let taken = store.schedule_create(Schedule { id: JobId::new(T0), ..schedule("nightly") }, T0).await;
    assert!(matches!(taken, Err(StoreError::NameTaken(_))), "{taken:?}");
    store.schedule_create(Schedule { id: JobId::new(T0), ..schedule("another") }, T0).await.unwrap();
    let names: Vec<String> = store.schedule_list().await.unwrap().into_iter().map(|s| s.name).collect();
    assert_eq!(names, ["another", "nightly"], "by name");

    let pause = |pause: Option<Option<String>>, next: Option<u64>, now: u64| SchedulePauseParams {
        name: "nightly".into(),
        pause,
        next_fire_at: next.map(at),
        actor: Some("ops".into()),
        now: at(now),
    };
    let paused = store.schedule_pause(pause(Some(Some("upstream down".into())), None, 1)).await.unwrap().unwrap();
    let held = paused.paused.clone().unwrap();
    assert_eq!((held.at, held.by.as_deref(), held.reason.as_deref()), (at(1), Some("ops"), Some("upstream down")));
    assert_eq!(paused.revision, 1, "a pause moves the revision");
    let again = store.schedule_pause(pause(Some(None), None, 2)).await.unwrap().unwrap();
    assert_eq!(again.paused, paused.paused, "pausing a paused schedule keeps the first pause");
    assert!(store.schedules_due(at(100), 10).await.unwrap().iter().all(|s| s.name != "nightly"), "paused: never due");
    let resumed = store.schedule_pause(pause(None, Some(130), 125)).await.unwrap().unwrap();
    assert_eq!((resumed.paused, resumed.next_fire_at, resumed.revision), (None, Some(at(130)), 2));
    let missing = SchedulePauseParams { name: "nobody".into(), ..pause(None, None, 1) };
    assert_eq!(store.schedule_pause(missing).await.unwrap(), None);

    assert!(store.schedule_remove("nightly".into(), Some("ops".into()), at(200)).await.unwrap());
    assert!(!store.schedule_remove("nightly".into(), Some("ops".into()), at(200)).await.unwrap());
    assert_eq!(store.schedule_get("nightly".into()).await.unwrap(), None);
    let audit = store.audit_list(AuditListParams { target: Some("nightly".into()), limit: 10, ..Default::default() });
    let actions: Vec<String> = audit.await.unwrap().into_iter().map(|r| r.action).collect();
    assert_eq!(actions, ["schedule.add", "schedule.pause", "schedule.resume", "schedule.remove"]);
}

pub(crate) async fn a_firing_is_taken_once_and_a_stale_one_writes_nothing(store: Arc<dyn JobStore>) {
    let s = store.schedule_create(Schedule { overlap: Overlap::Allow, ..schedule("s") }, T0).await.unwrap();
    assert!(store.schedules_due(at(9), 10).await.unwrap().is_empty(), "not due before its time");
    assert_eq!(store.schedules_due(at(10), 10).await.unwrap(), std::slice::from_ref(&s));
    let ScheduleFired::Fired(jobs) = store.schedule_fire(fire(&s, 10, 20, vec![scheduled_job(&s, "a")])).await.unwrap()
    else {
        panic!("the first firing is taken")
    };
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].schedule_id, Some(s.id), "the job carries its schedule");
    assert_eq!(store.job_get(jobs[0].id).await.unwrap().unwrap().schedule_id, Some(s.id));
    // The same firing again (a second scheduler that read it before): lost.
    let again = store.schedule_fire(fire(&s, 10, 20, vec![scheduled_job(&s, "b")])).await.unwrap();
    assert_eq!(again, ScheduleFired::Lost);
    let read = store.schedule_get("s".into()).await.unwrap().unwrap();
    assert_eq!((read.next_fire_at, read.last_fired_at, read.fired), (Some(at(20)), Some(at(10)), 1));
    assert_eq!(read.last_outcome.as_deref(), Some("submitted 1 job"));
    // A firing prepared before a pause (an older revision): lost.
    let paused =
        SchedulePauseParams { name: "s".into(), pause: Some(None), next_fire_at: None, actor: None, now: at(15) };
    store.schedule_pause(paused).await.unwrap();
    let stale = store.schedule_fire(fire(&read, 20, 30, vec![scheduled_job(&s, "c")])).await.unwrap();
    assert_eq!(stale, ScheduleFired::Lost);
    let jobs = store.job_list(leash::store::JobListParams { schedule_id: Some(s.id), limit: 10, ..Default::default() });
    assert_eq!(jobs.await.unwrap().len(), 1, "nothing a lost firing carried was stored");
}

pub(crate) async fn many_schedulers_racing_for_one_firing_submit_its_jobs_once(store: Arc<dyn JobStore>) {
    let s = store.schedule_create(Schedule { overlap: Overlap::Allow, ..schedule("race") }, T0).await.unwrap();
    let racers = (0..8).map(|i| {
        let (store, s) = (store.clone(), s.clone());
        tokio::spawn(
            async move { store.schedule_fire(fire(&s, 10, 20, vec![scheduled_job(&s, &format!("{i}"))])).await },
        )
    });
    let mut fired = 0;
    for racer in racers {
        match racer.await.unwrap().unwrap() {
            ScheduleFired::Fired(jobs) => fired += jobs.len(),
            ScheduleFired::Lost => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(fired, 1, "one of eight took the firing");
    let jobs = store.job_list(leash::store::JobListParams { schedule_id: Some(s.id), limit: 10, ..Default::default() });
    assert_eq!(jobs.await.unwrap().len(), 1);
}

pub(crate) async fn skip_submits_nothing_while_the_schedule_s_job_has_not_ended(store: Arc<dyn JobStore>) {
    let s = store.schedule_create(schedule("skip"), T0).await.unwrap();
    let ScheduleFired::Fired(first) =
        store.schedule_fire(fire(&s, 10, 20, vec![scheduled_job(&s, "a")])).await.unwrap()
    else {
        panic!("fired")
    };
    let skipped = store.schedule_fire(fire(&s, 20, 30, vec![scheduled_job(&s, "b")])).await.unwrap();
    assert_eq!(skipped, ScheduleFired::SkippedActive, "the first job is queued");
    let read = store.schedule_get("skip".into()).await.unwrap().unwrap();
    assert_eq!((read.fired, read.skipped, read.next_fire_at), (1, 1, Some(at(30))), "the skipped firing is taken");
    assert!(read.last_outcome.unwrap().contains("has not ended"));
    // Running still counts; ended does not.
    let lease = claim(&*store, "worker-aaaaaaaa", 1, at(21)).await.pop().unwrap();
    assert_eq!(lease.job.id, first[0].id);
    let skipped = store.schedule_fire(fire(&s, 30, 40, vec![scheduled_job(&s, "c")])).await.unwrap();
    assert_eq!(skipped, ScheduleFired::SkippedActive, "the first job is running");
    assert!(store.job_finish(succeed(&lease, at(35))).await.unwrap());
    let ScheduleFired::Fired(next) = store.schedule_fire(fire(&s, 40, 50, vec![scheduled_job(&s, "d")])).await.unwrap()
    else {
        panic!("the first job ended: the firing submits")
    };
    assert_eq!(next.len(), 1);
    // A trigger submits whatever the overlap; a trigger of a removed
    // schedule submits nothing.
    let triggered = store.schedule_trigger(s.id, scheduled_job(&s, "t"), Some("ops".into()), at(41)).await.unwrap();
    assert_eq!(triggered.unwrap().schedule_id, Some(s.id));
    store.schedule_remove("skip".into(), None, at(42)).await.unwrap();
    assert_eq!(store.schedule_trigger(s.id, scheduled_job(&s, "u"), None, at(43)).await.unwrap(), None);
}
