//! Crash behaviour with real processes: `leash worker` killed with SIGKILL
//! mid-job, and stopped with SIGTERM while guests run.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use leash::job::{ErrorKind, JobId, JobStatus, Target};
use leash::runtime::{PluginSource, Runtime, Submit};

use crate::support::{GENEROUS, cache_dir, eventually, wait_for_status};

const LEASE_TTL: &str = "600ms";

fn start_worker(db: &Path, max_workers: u32) -> Child {
    start_worker_with(db, max_workers, &[])
}

/// `leash worker --db DB` (a path or a URL) once it reports it is running.
pub(crate) fn start_worker_with(db: impl AsRef<std::ffi::OsStr>, max_workers: u32, extra: &[&str]) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_leash"))
        .args(["worker", "--db"])
        .arg(db)
        .args(["--max-workers", &max_workers.to_string()])
        .args(with_worker_defaults(extra))
        .env("LEASH_CACHE_DIR", cache_dir())
        .stderr(Stdio::piped())
        .spawn()
        .expect("leash worker starts");
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains(" running ") {
        line.clear();
        assert!(err.read_line(&mut line).unwrap() > 0, "leash worker exited before it was ready");
    }
    // Keep draining stderr so the worker never blocks on a full pipe.
    std::thread::spawn(move || for _ in err.lines() {});
    child
}

/// Fast timings for tests, unless `extra` sets the flag itself.
fn with_worker_defaults(extra: &[&str]) -> Vec<String> {
    crate::support::server::flags_with_defaults(
        extra,
        &[("--lease-ttl", LEASE_TTL), ("--poll-interval", "50ms"), ("--shutdown-budget", "3s")],
    )
}

pub(crate) fn sigterm(child: &Child) {
    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
}

async fn submitter(db: &Path) -> Runtime {
    Runtime::builder(db).poll_interval(Duration::from_millis(50)).without_workers().build().await.unwrap()
}

fn job(name: &str, input: &str, max_attempts: u32) -> Submit {
    let mut job =
        Submit::new(PluginSource::Bytes(leash_tests::plugin_bytes(name)), Target::Execute, input.as_bytes().to_vec());
    job.max_attempts = Some(max_attempts);
    job
}

/// Start a worker, SIGKILL it once it runs `id`, and start another.
/// Returns the killed worker's id and the new worker.
async fn kill_owner_and_start_another(db: &Path, runtime: &Runtime, id: JobId) -> (String, Child) {
    let mut first = start_worker(db, 2);
    wait_for_status(runtime, id, JobStatus::Running).await;
    let owner = runtime.get(id).await.unwrap().worker_id.unwrap();
    first.kill().unwrap();
    first.wait().unwrap();
    (owner, start_worker(db, 2))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_workers_job_with_one_attempt_fails_as_lease_lost_when_free_reruns_are_off() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("jobs.db");
    // The limit is pinned on the job by the runtime that submits it.
    let runtime = Runtime::builder(&db).free_rerun_limit(0).without_workers().build().await.unwrap();
    let id = runtime.submit(job("sleep", r#"{"ms": 600000}"#, 1)).await.unwrap();

    let (owner, mut second) = kill_owner_and_start_another(&db, &runtime, id).await;
    let done = runtime.wait(id, GENEROUS).await.unwrap();
    assert_eq!((done.status, done.error_kind), (JobStatus::Failed, Some(ErrorKind::LeaseLost)));
    assert!(done.error_message.unwrap().contains("Heartbeat timeout"));
    assert_eq!((done.attempt, done.lost_leases, done.free_reruns), (1, 1, 0), "started once, never silently re-run");
    assert_eq!(done.worker_id.as_deref(), Some(owner.as_str()));
    assert_eq!(runtime.health().await.unwrap().counts.total(), 1, "nothing disappeared");
    second.kill().unwrap();
    second.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_two_killed_workers_were_running_is_quarantined_through_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("jobs.db");
    let runtime = submitter(&db).await;
    // Attempts to spare: only the quarantine ends it.
    let id = runtime.submit(job("sleep", r#"{"ms": 600000}"#, 5)).await.unwrap();
    let (_, mut second) = kill_owner_and_start_another(&db, &runtime, id).await;
    // The second worker's sweep sees the first one silent, counts the
    // death, and runs the job again.
    let job = eventually("the job runs again", async || {
        let job = runtime.get(id).await.unwrap();
        (job.status == JobStatus::Running && job.attempt == 2).then_some(job)
    })
    .await;
    assert_eq!(job.process_deaths, 1);
    second.kill().unwrap();
    second.wait().unwrap();
    let mut third = start_worker(&db, 2);
    let done = runtime.wait(id, GENEROUS).await.unwrap();
    assert_eq!((done.status, done.error_kind), (JobStatus::Failed, Some(ErrorKind::HostCrash)));
    assert_eq!((done.attempt, done.process_deaths), (2, 2), "two starts, two deaths, and no third claim");
    let message = done.error_message.unwrap();
    assert!(message.contains("the last stopped reporting to the store"), "{message}");
    third.kill().unwrap();
    third.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_workers_job_without_effects_is_rerun_by_another_worker_even_with_one_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("jobs.db");
    let runtime = submitter(&db).await;
    let mut ids = Vec::new();
    for max_attempts in [1, 2] {
        ids.push(runtime.submit(job("sleep", r#"{"ms": 1500}"#, max_attempts)).await.unwrap());
    }
    let mut first = start_worker(&db, 2);
    for &id in &ids {
        wait_for_status(&runtime, id, JobStatus::Running).await;
    }
    let owner = runtime.get(ids[0]).await.unwrap().worker_id.unwrap();
    first.kill().unwrap();
    first.wait().unwrap();
    let mut second = start_worker(&db, 2);
    for id in ids {
        let done = runtime.wait(id, GENEROUS).await.unwrap();
        assert_eq!(done.status, JobStatus::Succeeded, "{:?}", done.error_message);
        assert_eq!((done.attempt, done.lost_leases, done.free_reruns), (2, 0, 1), "the re-run is accounted for");
        assert!(done.last_error.unwrap().contains("no effect was recorded"));
        assert_ne!(done.worker_id.as_deref(), Some(owner.as_str()), "another worker ran it");
    }
    assert_eq!(runtime.health().await.unwrap().counts.total(), 2);
    second.kill().unwrap();
    second.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_workers_job_after_an_effect_fails_as_lease_lost_naming_the_effect() {
    use leash::job::grant::HttpGrant;
    use leash::job::{Grants, PluginName};
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("jobs.db");
    let runtime = submitter(&db).await;
    let upstream = crate::support::Upstream::start().await;
    let name = PluginName::new("webhook", "1").unwrap();
    runtime.plugin_register(leash_tests::plugin_bytes("webhook"), name.clone()).await.unwrap();
    let http = HttpGrant { hosts: vec![upstream.url("").parse().unwrap()], ..HttpGrant::default() };
    runtime.plugin_grant(name.clone(), Grants { http, ..Grants::default() }).await.unwrap();
    let input = serde_json::json!({ "url": upstream.url("/slow") }).to_string();
    let submit = Submit::new(PluginSource::Ref(name.to_string().parse().unwrap()), Target::Execute, input.into_bytes());
    let id = runtime.submit(submit).await.unwrap();

    // Killed while the upstream holds the request: its intent is recorded,
    // its outcome is not.
    let mut first = start_worker(&db, 2);
    upstream.wait_for(&format!("POST /slow idempotency-key={id}/1")).await;
    first.kill().unwrap();
    first.wait().unwrap();
    let mut second = start_worker(&db, 2);
    let done = runtime.wait(id, GENEROUS).await.unwrap();
    assert_eq!((done.status, done.error_kind), (JobStatus::Failed, Some(ErrorKind::LeaseLost)));
    // (On a loaded machine an earlier attempt may have lost its lease
    // before its effect: that one was re-run free.)
    assert_eq!(done.lost_leases, 1, "the attempt with the effect spent the only attempt");
    let message = done.error_message.unwrap();
    let named = format!("effect #1 (POST {}) was in flight: its outcome is unknown", upstream.url("/slow"));
    assert!(message.contains(&named), "{message}");
    let effects = runtime.effects(id).await.unwrap();
    assert_eq!(effects.len(), 1);
    assert_eq!((effects[0].attempt, effects[0].finished_at), (done.attempt, None), "never re-run after it");
    assert_eq!(upstream.received().iter().filter(|e| e.starts_with("POST")).count(), 1, "sent once");
    second.kill().unwrap();
    second.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_releases_running_guests_within_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("jobs.db");
    let runtime = submitter(&db).await;
    let spin = runtime.submit(job("spin", "", 1)).await.unwrap();
    let coop = runtime.submit(job("coop", "", 1)).await.unwrap();

    let mut worker = start_worker(&db, 2);
    wait_for_status(&runtime, spin, JobStatus::Running).await;
    wait_for_status(&runtime, coop, JobStatus::Running).await;
    let started = Instant::now();
    sigterm(&worker);
    let status = worker.wait().unwrap();
    let took = started.elapsed();
    assert!(status.success(), "{status:?}");
    assert!(took <= Duration::from_secs(4), "exited in {took:?}, budget 3s");
    for id in [spin, coop] {
        let job = runtime.get(id).await.unwrap();
        assert_eq!(job.status, JobStatus::Queued, "{id} is back in the queue");
        assert_eq!((job.attempt, job.lost_leases), (1, 0), "no attempt spent");
        assert!(job.lease_token.is_none() && job.lease_expires_at.is_none(), "no live owner");
    }
    assert_eq!(runtime.health().await.unwrap().counts.total(), 2);
}

/// SIGTERM while a guest is about to return: it returns inside the
/// shutdown grace, so its job is recorded `succeeded` with its output on
/// attempt 1 (not released to run again), and it started once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_keeps_a_guest_that_returns_inside_the_grace() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("jobs.db");
    let start_log = dir.path().join("starts.log");
    let runtime = submitter(&db).await;
    let id = runtime.submit(job("sleep", r#"{"ms": 700}"#, 1)).await.unwrap();
    let mut worker = start_worker_with(&db, 1, &["--cancel-grace", "2s", "--start-log", start_log.to_str().unwrap()]);
    // The start log's line is written just before the guest runs.
    eventually("the job starts", async || {
        std::fs::read_to_string(&start_log).unwrap_or_default().contains(&id.to_string()).then_some(())
    })
    .await;
    let signalled = leash::clock::Timestamp::now();
    sigterm(&worker);
    assert!(worker.wait().unwrap().success());
    let job = runtime.get(id).await.unwrap();
    assert_eq!(job.status, JobStatus::Succeeded, "{:?}", job.error_message);
    assert_eq!((job.attempt, job.lost_leases), (1, 0));
    assert!(job.finished_at.unwrap() >= signalled, "it returned inside the shutdown window");
    let output: serde_json::Value = serde_json::from_slice(job.output.as_deref().unwrap()).unwrap();
    assert_eq!(output["slept_ms"], 700);
    let starts = std::fs::read_to_string(&start_log).unwrap();
    assert_eq!(starts.lines().filter(|l| l.starts_with(&id.to_string())).count(), 1, "{starts}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_past_its_queue_ttl_expires_instead_of_running() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("jobs.db");
    let output = Command::new(env!("CARGO_BIN_EXE_leash"))
        .args(["submit", "--db"])
        .arg(&db)
        .args(["--queue-ttl", "1ms"])
        .arg(leash_tests::plugin_path("hello"))
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let id: JobId = String::from_utf8(output.stdout).unwrap().trim().parse().unwrap();

    let runtime = submitter(&db).await;
    let mut worker = start_worker(&db, 2);
    let done = runtime.wait(id, GENEROUS).await.unwrap();
    assert_eq!((done.status, done.error_kind), (JobStatus::Failed, Some(ErrorKind::Expired)));
    assert_eq!(done.attempt, 0, "it never started");
    worker.kill().unwrap();
    worker.wait().unwrap();
}

/// `leash diagnostics --db` beside two `leash worker` processes lists both,
/// with their slots and what each runs; stopped cleanly, both say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diagnostics_lists_every_worker_sharing_the_database() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("jobs.db");
    let first = start_worker(&db, 2);
    let second = start_worker(&db, 3);
    let submitter = Runtime::builder(&db).without_workers().build().await.unwrap();
    let coop = leash_tests::plugin_bytes("coop");
    let mut ids = Vec::new();
    for _ in 0..2 {
        ids.push(
            submitter
                .submit(Submit::new(PluginSource::Bytes(coop.clone()), Target::Execute, Vec::new()))
                .await
                .unwrap(),
        );
    }
    let diagnostics = || {
        let output = Command::new(env!("CARGO_BIN_EXE_leash"))
            .args(["diagnostics", "--json", "--db"])
            .arg(&db)
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
        serde_json::from_slice::<serde_json::Value>(&output.stdout).unwrap()
    };
    // Poll until both jobs run and the registry reports them.
    let report = eventually("the workers report both jobs", async || {
        let report = diagnostics();
        let workers = report["health"]["workers"].as_array().unwrap().clone();
        let running: u64 = workers.iter().map(|w| w["running"].as_u64().unwrap()).sum();
        (running == 2).then_some(report)
    })
    .await;
    let health = &report["health"];
    let workers = health["workers"].as_array().unwrap();
    let mut pids: Vec<u64> = workers.iter().map(|w| w["pid"].as_u64().unwrap()).collect();
    pids.sort();
    let mut want = vec![u64::from(first.id()), u64::from(second.id())];
    want.sort();
    assert_eq!(pids, want, "both workers, and not the CLI's own process: {report}");
    let mut slots: Vec<u64> = workers.iter().map(|w| w["slots"].as_u64().unwrap()).collect();
    slots.sort();
    assert_eq!(slots, [2, 3]);
    assert_eq!(health["summary"], "Async workers: enabled, max_workers=5, poll_interval=0.1s", "{report}");
    let mut held: Vec<String> = workers
        .iter()
        .flat_map(|w| w["running_jobs"].as_array().unwrap().iter().map(|j| j.as_str().unwrap().to_owned()))
        .collect();
    held.sort();
    let mut want: Vec<String> = ids.iter().map(ToString::to_string).collect();
    want.sort();
    assert_eq!(held, want, "each running job shows its worker");
    assert_eq!(health["counts"]["running"], 2);
    let text = Command::new(env!("CARGO_BIN_EXE_leash")).args(["diagnostics", "--db"]).arg(&db).output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    assert!(text.starts_with("Async workers: enabled, max_workers=5, poll_interval=0.1s\n"), "{text}");
    for worker in workers {
        assert!(text.contains(worker["worker_id"].as_str().unwrap()), "{text}");
    }
    for mut child in [first, second] {
        sigterm(&child);
        assert!(child.wait().unwrap().success());
    }
    let report = diagnostics();
    let states: Vec<&str> =
        report["health"]["workers"].as_array().unwrap().iter().map(|w| w["state"].as_str().unwrap()).collect();
    assert_eq!(states, ["stopped", "stopped"], "{report}");
    assert_eq!(report["health"]["summary"], "Async workers: disabled (no live worker)");
}
