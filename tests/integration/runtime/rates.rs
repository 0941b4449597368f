//! Rate limits across processes and through a real pool: two store
//! handles on one store (two replicas on PostgreSQL, two processes on one
//! SQLite file) claiming together hold a limit of 50/s over 30 s; a pool
//! starts limited jobs no faster than their limit; submits render the key
//! and refuse a limit that does not exist.

use std::sync::Arc;
use std::time::Duration;

use leash::clock::Timestamp;
use leash::job::rate::RateLimit;
use leash::job::{NewJob, PluginName, PluginRef, Target};
use leash::runtime::{PluginSource, RuntimeError, Submit};
use leash::store::{Database, Durability, JobClaimParams, JobInsertParams, JobListParams, JobStore};

use super::metrics::builder;
use crate::support::GENEROUS;

const T0: Timestamp = Timestamp::from_unix_ms(1_800_000_000_000);

fn limited(i: usize) -> NewJob {
    NewJob { rate_limit: Some("upstream".into()), ..crate::store::conformance::cases::new_job(&i.to_string()) }
}

/// Two handles on `db` claim together every 10 ms of a driven 30 s, from
/// a backlog of 2,000 jobs limited to 50/s: 1,500 ± 5% start in the 30 s,
/// and no second holds more than its 50 (the limit holds across them,
/// with the state in the store).
async fn two_claimers_hold_fifty_per_second_for_thirty_seconds_on(db: String) {
    let open = || async { leash::store::open(&Database::parse(&db), Durability::Normal).await.unwrap() };
    let (a, b): (Arc<dyn JobStore>, Arc<dyn JobStore>) = (open().await, open().await);
    let limit = RateLimit::new("upstream", "50/s".parse().unwrap(), 1, None, T0).unwrap();
    a.rate_limit_set(limit).await.unwrap();
    for chunk in (0..2000).collect::<Vec<_>>().chunks(500) {
        let jobs = chunk.iter().map(|&i| limited(i)).collect();
        a.job_insert(JobInsertParams { jobs, now: T0.minus(Duration::from_secs(1)) }).await.unwrap();
    }
    let claim = |store: Arc<dyn JobStore>, worker: &'static str, now: Timestamp| async move {
        let params =
            JobClaimParams { worker_id: worker.into(), limit: 10, alone: false, lease_ttl: GENEROUS, now, aged: 0 };
        store.job_claim(params).await.unwrap().len()
    };
    let mut per_second = [0usize; 30];
    for step in 0..3000u64 {
        let now = T0.plus(Duration::from_millis(step * 10));
        let (x, y) = tokio::join!(claim(a.clone(), "worker-aaaaaaaa", now), claim(b.clone(), "worker-bbbbbbbb", now));
        per_second[(step / 100) as usize] += x + y;
    }
    let total: usize = per_second.iter().sum();
    assert!((1425..=1575).contains(&total), "{total} starts in 30 s at 50/s: {per_second:?}");
    assert!(per_second.iter().all(|&n| n <= 51), "no second over its 50 (the first may hold one more): {per_second:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_claimers_hold_fifty_per_second_for_thirty_seconds_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    two_claimers_hold_fifty_per_second_for_thirty_seconds_on(dir.path().join("jobs.db").to_string_lossy().into_owned())
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_claimers_hold_fifty_per_second_for_thirty_seconds_on_postgres() {
    let Some(url) = crate::support::pg::url() else { return };
    let schema = crate::support::pg::Schema::create(&url).await;
    two_claimers_hold_fifty_per_second_for_thirty_seconds_on(schema.url.clone()).await;
}

fn hello(input: &str) -> Submit {
    let plugin = PluginRef::Version(PluginName::new("hello", "1").unwrap());
    Submit::new(PluginSource::Ref(plugin), Target::Execute, input.as_bytes().to_vec())
}

/// A real pool (real time) runs six jobs limited to 5/s: the limit gives
/// them slots 200 ms apart (each job's `run_after` is its slot), none
/// starts before its slot, and they all succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_starts_limited_jobs_no_faster_than_their_limit() {
    let dir = tempfile::tempdir().unwrap();
    let clock = leash::clock::ManualClock::new(Timestamp::now());
    let submitter = builder(&dir, &clock).without_workers().build().await.unwrap();
    submitter
        .plugin_register(leash_tests::plugin_bytes("hello"), PluginName::new("hello", "1").unwrap())
        .await
        .unwrap();
    submitter.rate_limit_set("five", "5/s".parse().unwrap(), None, Default::default()).await.unwrap();
    let mut ids = Vec::new();
    for i in 0..6 {
        let mut job = hello(&format!(r#"{{"name":"n{i}"}}"#));
        job.rate_limit = Some("five".into());
        ids.push(submitter.submit(job).await.unwrap());
    }
    submitter.shutdown().await;
    let pool = leash::runtime::Runtime::builder(dir.path().join("jobs.db").to_string_lossy().into_owned())
        .sandbox(leash::sandbox::SandboxConfig { cache_dir: Some(crate::support::cache_dir()), ..Default::default() })
        .max_workers(4)
        .build()
        .await
        .unwrap();
    let mut slots = Vec::new();
    for id in &ids {
        let job = pool.wait(*id, GENEROUS).await.unwrap();
        assert_eq!(job.status, leash::job::JobStatus::Succeeded, "{job:?}");
        assert!(job.started_at.unwrap() >= job.run_after, "not started before its slot: {job:?}");
        slots.push(job.run_after.unix_ms());
    }
    slots.sort_unstable();
    for pair in slots.windows(2) {
        assert!(pair[1] - pair[0] >= 200, "slots 200 ms apart at 5/s: {slots:?}");
    }
    pool.shutdown().await;
}

/// The key renders from the principal, the plugin and input fields; a
/// limit that does not exist, a key without a limit and a key naming a
/// field the input lacks are refused, and nothing is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submit_renders_its_rate_key_and_refuses_an_unknown_limit() {
    let dir = tempfile::tempdir().unwrap();
    let clock = leash::clock::ManualClock::new(Timestamp::now());
    let runtime = builder(&dir, &clock).without_workers().build().await.unwrap();
    runtime.plugin_register(leash_tests::plugin_bytes("hello"), PluginName::new("hello", "1").unwrap()).await.unwrap();
    runtime.rate_limit_set("per-org", "10/min".parse().unwrap(), Some(2), Default::default()).await.unwrap();
    let mut job = hello(r#"{"org":"acme"}"#);
    job.rate_limit = Some("per-org".into());
    job.rate_key = Some("{plugin}/{input.org}".into());
    job.submitted_by = Some("ci".into());
    let id = runtime.submit(job).await.unwrap();
    let stored = runtime.get(id).await.unwrap();
    assert_eq!((stored.rate_limit.as_deref(), stored.rate_key.as_str()), (Some("per-org"), "hello/acme"));

    let before = runtime.list(JobListParams { limit: 100, ..Default::default() }).await.unwrap().len();
    let refused = |set: fn(&mut Submit)| {
        let mut job = hello(r#"{"org":"acme"}"#);
        set(&mut job);
        let runtime = runtime.clone();
        async move { runtime.submit(job).await.unwrap_err() }
    };
    let unknown = refused(|j| j.rate_limit = Some("nope".into())).await;
    assert!(matches!(&unknown, RuntimeError::InvalidJob(m) if m.contains("does not exist")), "{unknown}");
    let keyless = refused(|j| j.rate_key = Some("x".into())).await;
    assert!(matches!(&keyless, RuntimeError::InvalidJob(m) if m.contains("needs a rate_limit")), "{keyless}");
    let missing = refused(|j| {
        j.rate_limit = Some("per-org".into());
        j.rate_key = Some("{input.team}".into());
    })
    .await;
    assert!(matches!(&missing, RuntimeError::InvalidJob(m) if m.contains("\"team\"")), "{missing}");
    assert_eq!(
        runtime.list(JobListParams { limit: 100, ..Default::default() }).await.unwrap().len(),
        before,
        "nothing stored"
    );
    runtime.shutdown().await;
}
