//! The approval chaos run: gated jobs and plans through two `leash worker`
//! processes sharing one SQLite file, while the workers are SIGKILLed and
//! restarted and this process approves, rejects, triggers and cancels at
//! random moments. Then the checker reads the store and the workers'
//! shared start log (`--start-log`) and proves: every job and every plan
//! ended; no gated job and no apply phase started without an approval, and
//! none's last attempt started before its run was triggered; a rejected one
//! never started; every plan has at most one
//! apply job, and none unless its execute phase succeeded; no attempt
//! started twice.
//!
//! ```sh
//! cargo test -p leash --test integration approval_chaos -- --nocapture
//! ```
//! prints the figures RELIABILITY.md records (`LEASH_CHAOS_SEED` replays
//! the same random choices).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use leash::job::{ApplyMode, Job, JobId, JobStatus, PlanStatus, PluginName, PluginRef, Target, Verdict};
use leash::runtime::{DecisionBy, PlanSubmit, PluginSource, Runtime, Submit};
use leash::store::PlanListParams;
use serde_json::json;

use crate::chaos::{Proc, Rng, all_jobs, chaos_args, read_start_log, seed, stop_all};

const LEASE_TTL: Duration = Duration::from_secs(1);
const GATED: u64 = 120;
const PLANS: u64 = 120;
const KILLS: u32 = 12;

fn worker(dir: &Path, db: &Path, name: &str, start_log: &Path) -> Proc {
    let args = chaos_args("worker", &db.display().to_string(), LEASE_TTL, start_log);
    let stderr = dir.join(format!("{name}.stderr"));
    Proc { name: name.into(), args, stderr, child: None, ready_line: " running ", ready_before: 0 }
}

/// Make a few random decisions on what waits now: approve or reject gated
/// jobs and plans, trigger held runs, cancel a plan now and then. Refusals
/// (another decision won, the job ended) are expected and counted.
async fn decide_some(runtime: &Runtime, rng: &mut Rng, tally: &mut BTreeMap<&'static str, u64>, all: bool) {
    let who = || DecisionBy::new("chaos").comment("random");
    let waiting = |status| leash::store::JobListParams { status: vec![status], limit: 500, ..Default::default() };
    for job in runtime.list(waiting(JobStatus::PendingApproval)).await.unwrap() {
        if !all && rng.below(3) != 0 {
            continue;
        }
        let rejected = rng.below(5) == 0;
        let decided = if rejected { runtime.reject(job.id, who()).await } else { runtime.approve(job.id, who()).await };
        *tally
            .entry(if decided.is_err() {
                "refused"
            } else if rejected {
                "rejected"
            } else {
                "approved"
            })
            .or_default() += 1;
    }
    for job in runtime.list(waiting(JobStatus::Approved)).await.unwrap() {
        if all || rng.below(2) == 0 {
            let run = runtime.run_approved(job.id).await;
            *tally.entry(if run.is_err() { "refused" } else { "triggered" }).or_default() += 1;
        }
    }
    if !all && rng.below(4) == 0 {
        let plans = runtime.plans(PlanListParams { before: None, submitted_by: None, limit: 500 }).await.unwrap();
        if let Some(plan) = plans.iter().filter(|p| !p.status.is_terminal()).nth(rng.below(8) as usize) {
            let cancelled = runtime.plan_cancel(&plan.plan.plan_id).await;
            *tally.entry(if cancelled.is_err() { "refused" } else { "plans_cancelled" }).or_default() += 1;
        }
    }
}

#[test]
fn gated_jobs_and_plans_run_only_once_approved_through_kills() {
    let seed = seed();
    eprintln!("approval chaos: seed {seed} (LEASH_CHAOS_SEED replays it)");
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let db: PathBuf = dir.path().join("approvals.db");
    let start_log = dir.path().join("starts.log");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut rng = Rng(seed);

    // This process submits and decides; it runs no workers.
    let runtime = rt.block_on(async {
        let runtime = Runtime::builder(db.as_path()).without_workers().build().await.unwrap();
        let name = PluginName::new("echo", "1").unwrap();
        runtime.plugin_register(std::fs::read(leash_tests::plugin_path("echo")).unwrap(), name).await.unwrap();
        let echo = || PluginSource::Ref("echo@1".parse::<PluginRef>().unwrap());
        let mut jobs = Vec::new();
        for n in 0..GATED {
            let mut job = Submit::new(echo(), Target::action("deploy").unwrap(), json!({ "n": n }).to_string().into());
            job.approval = Some(true);
            job.run_on_approve = rng.below(3) != 0;
            jobs.push(job);
        }
        runtime.submit_many(jobs).await.unwrap();
        for n in 0..PLANS {
            let job = Submit::new(echo(), Target::Execute, json!({ "plan": n }).to_string().into());
            let apply = if rng.below(4) == 0 { ApplyMode::Auto } else { ApplyMode::Approval };
            runtime.plan_submit(PlanSubmit { job, apply }).await.unwrap();
        }
        runtime
    });
    eprintln!("approval chaos: {GATED} gated jobs and {PLANS} plans submitted");

    let mut procs: Vec<Proc> =
        ["worker-a", "worker-b"].iter().map(|name| worker(dir.path(), &db, name, &start_log)).collect();
    for p in &mut procs {
        p.spawn();
    }
    let mut tally: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut crashes = Vec::new();
    for _ in 0..KILLS {
        assert!(started.elapsed() < Duration::from_secs(300), "the chaos did not finish");
        // Decisions land while the workers run, and right around the kill.
        rt.block_on(decide_some(&runtime, &mut rng, &mut tally, false));
        std::thread::sleep(rng.millis(100, 600));
        let victim = rng.below(2) as usize;
        procs[victim].kill_and_reap();
        rt.block_on(decide_some(&runtime, &mut rng, &mut tally, false));
        std::thread::sleep(rng.millis(0, 300));
        procs[victim].spawn();
        for p in &mut procs {
            if let Some(status) = p.exited_on_its_own() {
                crashes.push(format!("{} exited on its own: {status}", p.name));
                p.spawn();
            }
        }
    }

    // Decide everything left, until every job and every plan has ended.
    rt.block_on(async {
        loop {
            decide_some(&runtime, &mut rng, &mut tally, true).await;
            let counts = runtime.health().await.unwrap().counts;
            let plans = runtime.plans(PlanListParams { before: None, submitted_by: None, limit: 500 }).await.unwrap();
            let open = plans.iter().filter(|p| !p.status.is_terminal()).count();
            if counts.queued + counts.running + counts.pending_approval + counts.approved == 0 && open == 0 {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(420), "jobs did not end: {counts:?}, {open} plans open");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    crashes.extend(stop_all(&mut procs));

    let (jobs, plans) = rt.block_on(async {
        let jobs: Vec<Job> = {
            let mut full = Vec::new();
            for id in all_jobs(&**runtime.store()).await.into_keys() {
                full.push(runtime.get(id).await.unwrap());
            }
            full
        };
        (jobs, runtime.plans(PlanListParams { before: None, submitted_by: None, limit: 500 }).await.unwrap())
    });
    let starts = read_start_log(&start_log);
    let mut problems = crashes;
    let mut started_at: HashMap<JobId, Vec<u32>> = HashMap::new();
    match &starts {
        Ok(starts) => starts.iter().for_each(|(id, attempt)| started_at.entry(*id).or_default().push(*attempt)),
        Err(e) => problems.push(e.clone()),
    }
    let mut endings: BTreeMap<String, u64> = BTreeMap::new();
    let mut gated_started = 0;
    for job in &jobs {
        let ending = job.error_kind.map_or_else(|| job.status.to_string(), |k| format!("{}/{k}", job.status));
        *endings.entry(format!("{}:{ending}", job.target)).or_default() += 1;
        let mut bad = |why: String| problems.push(format!("{} {} ({ending}): {why}", job.target, job.id));
        if !job.status.is_terminal() {
            bad("not terminal".into());
        }
        let job_starts = started_at.get(&job.id).cloned().unwrap_or_default();
        let mut distinct = job_starts.clone();
        distinct.sort_unstable();
        distinct.dedup();
        if distinct.len() != job_starts.len() {
            bad(format!("an attempt started twice: {job_starts:?}"));
        }
        let Some(approval) = &job.approval else { continue };
        let verdict = approval.decision.as_ref().map(|d| d.verdict);
        if job_starts.is_empty() {
            continue;
        }
        gated_started += 1;
        if verdict != Some(Verdict::Approved) {
            bad(format!("started {} times without an approval ({verdict:?})", job_starts.len()));
        }
        match (approval.triggered_at, job.started_at) {
            (Some(triggered), Some(ran)) if ran >= triggered => {}
            other => bad(format!("started before its run was triggered: {other:?}")),
        }
    }
    let by_id: HashMap<JobId, &Job> = jobs.iter().map(|j| (j.id, j)).collect();
    let mut plan_endings: BTreeMap<String, u64> = BTreeMap::new();
    for plan in &plans {
        *plan_endings.entry(plan.status.to_string()).or_default() += 1;
        let mut bad = |why: String| problems.push(format!("plan {} ({}): {why}", plan.plan.plan_id, plan.status));
        if !plan.status.is_terminal() {
            bad("not terminal".into());
        }
        let applies: Vec<&&Job> = by_id
            .values()
            .filter(|j| j.target == Target::Apply && j.plan_id.as_deref() == Some(plan.plan.plan_id.as_str()))
            .collect();
        if applies.len() > 1 {
            bad(format!("{} apply jobs", applies.len()));
        }
        if !applies.is_empty() && plan.execute.status != JobStatus::Succeeded {
            bad(format!("an apply job after an execute that {}", plan.execute.status));
        }
        if applies.first().map(|j| j.id) != plan.plan.apply_job {
            bad("its apply job is not the one the plan names".into());
        }
        if plan.status == PlanStatus::Applied && plan.plan.apply_mode == ApplyMode::Approval {
            let decided = plan.apply.as_ref().and_then(|a| a.approval.as_ref()).and_then(|a| a.decision.as_ref());
            if decided.map(|d| d.verdict) != Some(Verdict::Approved) {
                bad("applied without an approval".into());
            }
        }
    }
    assert_eq!(plans.len() as u64, PLANS);
    let summary = json!({
        "seed": seed,
        "gated_jobs": GATED,
        "plans": PLANS,
        "kills": KILLS,
        "decisions": tally,
        "gated_jobs_and_applies_that_started": gated_started,
        "job_endings": endings,
        "plan_endings": plan_endings,
        "seconds": started.elapsed().as_secs_f64(),
    });
    for problem in problems.iter().take(20) {
        eprintln!("approval chaos problem: {problem}");
    }
    eprintln!("approval chaos: {}", serde_json::to_string_pretty(&summary).unwrap());
    rt.block_on(runtime.shutdown());
    assert!(
        problems.is_empty(),
        "{} problems (seed {seed}), first: {:?}",
        problems.len(),
        &problems[..problems.len().min(5)]
    );
    for ending in ["applied", "rejected"] {
        assert!(plan_endings.contains_key(ending), "no plan ended {ending}: {plan_endings:?}");
    }
}
