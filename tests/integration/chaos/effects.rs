//! The effect chaos run: `webhook` jobs, each POSTing one or two deliveries
//! to an upstream of the test's own, through two `leash worker` processes
//! sharing one SQLite file, while the workers are SIGKILLed mid-request,
//! paused (SIGSTOP) past their lease and stopped with SIGTERM. The upstream
//! logs every request it receives and, as each arrives, reads the job's row
//! to see whether the attempt that sent it still held the lease.
//!
//! The checker then proves the upstream and the effect ledger agree: every
//! request received has an intent recorded for its job, attempt and
//! sequence number (the idempotency key and the body say which); no request
//! arrived from an attempt whose lease was already lost; every intent with
//! a recorded answer was received; effects were issued in at most
//! `max_attempts` attempts of a job; jobs whose lease was lost before any
//! effect were re-run (free) and succeeded, `max_attempts = 1` included;
//! jobs whose lease was lost after an intent ended as `max_attempts` says,
//! their error naming the effect.
//!
//! ```sh
//! cargo test -p leash --test integration effect_chaos -- --nocapture
//! ```
//! prints the figures RELIABILITY.md records (`LEASH_CHAOS_SEED` replays
//! the same random choices).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use leash::job::grant::HttpGrant;
use leash::job::{ErrorKind, Grants, Job, JobId, JobStatus, PluginName, Target};
use leash::runtime::{PluginSource, Runtime, Submit};
use leash::store::{Database, Durability};
use serde_json::{Value, json};

use crate::chaos::{Proc, Rng, all_jobs, chaos_args, read_start_log, seed, stop_all};

const LEASE_TTL: Duration = Duration::from_secs(1);
const JOBS: u64 = 240;
const KILLS: u32 = 16;
const PAUSES: u32 = 3;
const TERMS: u32 = 2;

/// One request the upstream received.
#[derive(Debug, Clone)]
struct Delivery {
    key: Option<String>,
    job: String,
    attempt: u32,
    /// Whether, as it arrived, the job was running as that attempt.
    held: Result<bool, String>,
}

struct Hook {
    db: Mutex<rusqlite::Connection>,
    received: Mutex<Vec<Delivery>>,
    next: AtomicU64,
}

impl Hook {
    /// Whether `job` is running as `attempt` now.
    fn holds(&self, job: &str, attempt: u32) -> Result<bool, String> {
        let db = self.db.lock().unwrap();
        let row: (u32, String) = db
            .query_row("SELECT attempt, status FROM jobs WHERE job_id = ?1", [job], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(|e| format!("reading {job}: {e}"))?;
        Ok(row == (attempt, "running".to_owned()))
    }
}

/// The upstream's one route: record the request and whether its attempt
/// held the lease, then answer after 100–600 ms (so that kills and pauses
/// land while requests are in flight).
async fn deliver(State(hook): State<Arc<Hook>>, headers: HeaderMap, body: axum::body::Bytes) -> StatusCode {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let job = body["job"].as_str().unwrap_or_default().to_owned();
    let attempt = body["attempt"].as_u64().unwrap_or(0) as u32;
    let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let held = {
        let (hook, job) = (hook.clone(), job.clone());
        tokio::task::spawn_blocking(move || hook.holds(&job, attempt)).await.unwrap()
    };
    hook.received.lock().unwrap().push(Delivery { key, job, attempt, held });
    let n = hook.next.fetch_add(1, Ordering::Relaxed);
    let mut rng = Rng(n.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 7);
    tokio::time::sleep(rng.millis(100, 600)).await;
    StatusCode::OK
}

fn worker(dir: &Path, db: &Path, name: &str, start_log: &Path) -> Proc {
    let args = chaos_args("worker", &db.display().to_string(), LEASE_TTL, start_log);
    let stderr = dir.join(format!("{name}.stderr"));
    Proc { name: name.into(), args, stderr, child: None, ready_line: " running ", ready_before: 0 }
}

#[test]
#[ignore = "long: CI's long step runs it; see tests/README.md"]
fn webhook_jobs_agree_with_the_ledger_through_kills_pauses_and_shutdowns() {
    let seed = seed();
    eprintln!("effect chaos: seed {seed} (LEASH_CHAOS_SEED replays it)");
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let db: PathBuf = dir.path().join("effects.db");
    let start_log = dir.path().join("starts.log");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut rng = Rng(seed);

    // Submit every job first, through the embedding API (no workers): a
    // registration granted POST to the upstream only.
    let (hook, url) = rt.block_on(async {
        let runtime = Runtime::builder(db.as_path()).without_workers().build().await.unwrap();
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.busy_timeout(Duration::from_secs(30)).unwrap();
        let hook = Arc::new(Hook { db: Mutex::new(conn), received: Mutex::default(), next: AtomicU64::new(seed) });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let app = axum::Router::new().route("/hook", axum::routing::post(deliver)).with_state(hook.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

        let name = PluginName::new("webhook", "1").unwrap();
        let bytes = std::fs::read(leash_tests::plugin_path("webhook")).unwrap();
        runtime.plugin_register(bytes, name.clone()).await.unwrap();
        let http = HttpGrant { hosts: vec![format!("POST {base}").parse().unwrap()], ..HttpGrant::default() };
        runtime.plugin_grant(name.clone(), Grants { http, ..Grants::default() }).await.unwrap();
        let url = format!("{base}/hook");
        let mut jobs = Vec::new();
        for n in 0..JOBS {
            let input = json!({
                "url": url,
                "event": { "n": n },
                "count": 1 + rng.below(2),
                "prepare_ms": rng.below(700),
            });
            let mut job = Submit::new(
                PluginSource::Ref(name.to_string().parse().unwrap()),
                Target::Execute,
                input.to_string().into_bytes(),
            );
            job.max_attempts = Some(if rng.below(2) == 0 { 1 } else { 2 });
            job.timeout = Some(Duration::from_secs(30));
            jobs.push(job);
        }
        runtime.submit_many(jobs).await.unwrap();
        runtime.shutdown().await;
        (hook, url)
    });
    eprintln!("effect chaos: {JOBS} jobs submitted, upstream at {url}");

    let mut procs: Vec<Proc> =
        ["worker-a", "worker-b"].iter().map(|name| worker(dir.path(), &db, name, &start_log)).collect();
    for p in &mut procs {
        p.spawn();
    }

    // SIGKILL a random worker every 0.3–1.2 s and restart it; now and then
    // pause one past its lease, or stop one with SIGTERM.
    let (mut kills, mut pauses, mut terms) = (0, 0, 0);
    let mut crashes = Vec::new();
    while kills < KILLS {
        assert!(started.elapsed() < Duration::from_secs(300), "the chaos did not finish");
        std::thread::sleep(rng.millis(300, 1200));
        let victim = rng.below(2) as usize;
        procs[victim].kill_and_reap();
        std::thread::sleep(rng.millis(0, 300));
        procs[victim].spawn();
        kills += 1;
        if kills % (KILLS / PAUSES) == 0 && pauses < PAUSES {
            let paused = rng.below(2) as usize;
            procs[paused].wait_ready(Instant::now() + Duration::from_secs(60));
            std::thread::sleep(rng.millis(200, 800));
            procs[paused].signal("-STOP");
            std::thread::sleep(LEASE_TTL * 5 / 2);
            procs[paused].signal("-CONT");
            pauses += 1;
        }
        if kills % (KILLS / TERMS) == KILLS / TERMS / 2 && terms < TERMS {
            let stopped = rng.below(2) as usize;
            procs[stopped].wait_ready(Instant::now() + Duration::from_secs(60));
            std::thread::sleep(rng.millis(200, 800));
            procs[stopped].signal("-TERM");
            let status = procs[stopped].child.take().expect("running").wait().expect("wait");
            if !status.success() {
                crashes.push(format!("{} exited {status} after a SIGTERM", procs[stopped].name));
            }
            procs[stopped].spawn();
            terms += 1;
        }
        for p in &mut procs {
            if let Some(status) = p.exited_on_its_own() {
                crashes.push(format!("{} exited on its own: {status}", p.name));
                p.spawn();
            }
        }
    }

    // Drain: every job must end.
    let store = rt.block_on(async {
        leash::store::open(&Database::parse(&db.display().to_string()), Durability::Normal)
            .await
            .expect("open the store")
    });
    rt.block_on(async {
        loop {
            let counts = store.counts_snapshot().await.expect("counts");
            if counts.queued + counts.running == 0 {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(420), "jobs did not drain: {counts:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    crashes.extend(stop_all(&mut procs));

    let (jobs, effects) = rt.block_on(async {
        let mut jobs = Vec::new();
        let mut effects = HashMap::new();
        for id in all_jobs(&*store).await.into_keys() {
            jobs.push(store.job_get(id).await.expect("get").expect("listed"));
            effects.insert(id, store.effects(id).await.expect("effects"));
        }
        (jobs, effects)
    });
    assert_eq!(jobs.len() as u64, JOBS);
    let received = hook.received.lock().unwrap().clone();
    let starts = read_start_log(&start_log);
    let report = check(&jobs, &effects, &received, &starts);

    let summary = json!({
        "seed": seed,
        "jobs": JOBS,
        "kills": kills,
        "pauses_past_the_lease": pauses,
        "sigterms": terms,
        "requests_received": received.len(),
        "intents_recorded": report.intents,
        "intents_without_an_outcome": report.unknown,
        "requests_without_an_intent": report.unrecorded,
        "requests_after_the_lease_was_lost": report.late,
        "answered_intents_never_received": report.answered_unreceived,
        "jobs_with_effects_in_more_attempts_than_max_attempts": report.over_attempts,
        "jobs_rerun_free_after_a_loss_before_any_effect": report.rerun_free,
        "of_which_max_attempts_1_and_succeeded": report.free_max1_succeeded,
        "jobs_whose_lease_was_lost_after_an_intent": report.lost_after_intent,
        "of_which_failed_naming_the_effect": report.failed_naming_effect,
        "of_which_re_run_with_attempts_left": report.rerun_spent,
        "shutdowns_after_an_intent_ending_interrupted": report.interrupted,
        "endings": report.endings,
        "seconds": started.elapsed().as_secs_f64(),
    });
    let mut problems = report.violations;
    problems.extend(crashes);
    for problem in problems.iter().take(20) {
        eprintln!("effect chaos problem: {problem}");
    }
    eprintln!("effect chaos: {}", serde_json::to_string_pretty(&summary).unwrap());
    assert!(
        problems.is_empty(),
        "{} problems (seed {seed}), first: {:?}",
        problems.len(),
        &problems[..problems.len().min(5)]
    );
    assert!(report.free_max1_succeeded > 0, "no max_attempts = 1 job was killed before its effect and re-run");
    assert!(report.lost_after_intent > 0, "no kill landed after an intent: the run proved nothing about them");
}

#[derive(Debug, Default)]
struct Report {
    intents: u64,
    unknown: u64,
    unrecorded: u64,
    late: u64,
    answered_unreceived: u64,
    over_attempts: u64,
    rerun_free: u64,
    free_max1_succeeded: u64,
    lost_after_intent: u64,
    failed_naming_effect: u64,
    rerun_spent: u64,
    interrupted: u64,
    endings: BTreeMap<String, u64>,
    violations: Vec<String>,
}

fn check(
    jobs: &[Job],
    effects: &HashMap<JobId, Vec<leash::job::Effect>>,
    received: &[Delivery],
    starts: &Result<Vec<(JobId, u32)>, String>,
) -> Report {
    let mut report = Report::default();
    let by_id: HashMap<String, &Job> = jobs.iter().map(|j| (j.id.to_string(), j)).collect();
    // (job, attempt, seq) of every request the upstream received.
    let mut seen: HashSet<(String, u32, u32)> = HashSet::new();
    for d in received {
        let Some(key) = &d.key else {
            report.violations.push(format!("{}: a request without an idempotency key", d.job));
            continue;
        };
        let seq: u32 = key.rsplit('/').next().and_then(|s| s.parse().ok()).unwrap_or(0);
        if !key.starts_with(&format!("{}/", d.job)) {
            report.violations.push(format!("{}: idempotency key {key} names another job", d.job));
        }
        if !seen.insert((d.job.clone(), d.attempt, seq)) {
            report.violations.push(format!("{} attempt {} effect {seq}: received twice", d.job, d.attempt));
        }
        let recorded = by_id
            .get(&d.job)
            .and_then(|job| effects.get(&job.id))
            .is_some_and(|list| list.iter().any(|e| e.attempt == d.attempt && e.seq == seq));
        if !recorded {
            report.unrecorded += 1;
            report.violations.push(format!("{} attempt {} effect {seq}: received with no intent", d.job, d.attempt));
        }
        match &d.held {
            Ok(true) => {}
            Ok(false) => {
                report.late += 1;
                report.violations.push(format!("{} attempt {}: arrived after its lease was lost", d.job, d.attempt));
            }
            Err(e) => report.violations.push(format!("{}: the upstream could not read the job: {e}", d.job)),
        }
    }
    let mut started: HashMap<JobId, Vec<u32>> = HashMap::new();
    match starts {
        Ok(starts) => starts.iter().for_each(|(id, attempt)| started.entry(*id).or_default().push(*attempt)),
        Err(e) => report.violations.push(e.clone()),
    }

    for job in jobs {
        let ending = match job.error_kind {
            Some(kind) => format!("{}/{kind}", job.status),
            None => job.status.to_string(),
        };
        *report.endings.entry(ending.clone()).or_default() += 1;
        let mut bad = |why: String| report.violations.push(format!("{} ({ending}): {why}", job.id));
        if !job.status.is_terminal() {
            bad("not terminal".into());
        }
        let list = &effects[&job.id];
        report.intents += list.len() as u64;
        report.unknown += list.iter().filter(|e| e.finished_at.is_none()).count() as u64;
        for e in list.iter().filter(|e| e.status.is_some()) {
            if !seen.contains(&(job.id.to_string(), e.attempt, e.seq)) {
                report.answered_unreceived += 1;
                bad(format!("effect {}/{} has an answer but the upstream never received it", e.attempt, e.seq));
            }
        }
        let effectful: HashSet<u32> = list.iter().map(|e| e.attempt).collect();
        if effectful.len() as u32 > job.max_attempts {
            report.over_attempts += 1;
            bad(format!("effects in attempts {effectful:?} with max_attempts {}", job.max_attempts));
        }
        let job_starts = started.get(&job.id).map(Vec::as_slice).unwrap_or_default();
        if job_starts.iter().collect::<HashSet<_>>().len() != job_starts.len() {
            bad(format!("an attempt started twice: {job_starts:?}"));
        }
        if job.free_reruns > job.free_rerun_limit {
            bad(format!("{} free re-runs over the limit {}", job.free_reruns, job.free_rerun_limit));
        }
        // A free re-run follows an attempt that recorded nothing.
        if job.free_reruns > 0 {
            report.rerun_free += 1;
            if job.max_attempts == 1 && job.status == JobStatus::Succeeded {
                report.free_max1_succeeded += 1;
            }
        }
        if job.lost_leases > 0 && !effectful.is_empty() {
            report.lost_after_intent += 1;
        }
        match (job.status, job.error_kind) {
            (JobStatus::Succeeded, None) => {
                if job.lost_leases > 0 {
                    report.rerun_spent += 1;
                }
            }
            (JobStatus::Failed, Some(ErrorKind::LeaseLost)) => {
                let message = job.error_message.as_deref().unwrap_or_default();
                let last = list.iter().filter(|e| e.attempt == job.attempt).count();
                if last > 0 {
                    if message.contains("effect #") || message.contains("last effect, #") {
                        report.failed_naming_effect += 1;
                    } else {
                        bad(format!("lost after an effect, but the error does not name it: {message}"));
                    }
                } else if job.free_reruns < job.free_rerun_limit {
                    bad("lost before any effect, with free re-runs left, yet failed".into());
                }
            }
            (JobStatus::Failed, Some(ErrorKind::HostCrash))
                if job.process_deaths >= leash::store::QUARANTINE_AFTER_DEATHS => {}
            (JobStatus::Failed, Some(ErrorKind::Interrupted)) => {
                report.interrupted += 1;
                if !list.iter().any(|e| e.attempt == job.attempt) {
                    bad("interrupted without an effect in its last attempt".into());
                }
            }
            _ => bad(format!("an ending a webhook job cannot have here: {:?}", job.error_message)),
        }
    }
    report
}
