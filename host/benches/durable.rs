//! Durable-path benchmark: trivial jobs through the SQLite store, the pool
//! and the sandbox, beside the raw sandbox rate measured in this process.
//!
//! Run with `cargo bench -p leash --bench durable` (`-- --quick` for a short
//! run without the 1M backlog; `LEASH_BENCH_DRAIN_ONLY=1` runs only the
//! durable drain, five times, for a profiler; `LEASH_BENCH_STORE_ONLY=1`
//! only the store-only pass, five times; `LEASH_BENCH_RESIDENT_AB=1` (or a
//! byte count) the raw rate and the drain with guest memory kept resident
//! and given back, alternately; `LEASH_BENCH_EVENTS_AB=1`
//! runs only the store-only pass, alternately with and without the event
//! triggers, three times each; `LEASH_BENCH_CAPS_AB=1` the store-only pass
//! with jobs of no principal, of an uncapped one and of one whose running
//! cap is never reached, in turn, three times each; `LEASH_BENCH_ISOLATE_AB=1` the drain with
//! guests on their own threads and on the pool's, alternately;
//! `LEASH_BENCH_IDLE_LATENCY=<rate>` only
//! enqueue→start at that low rate, split into the submit and what follows).
//!
//! 1. Raw sandbox: fresh store + instantiate + call of `echo`, same thread
//!    count and concurrency as the pool.
//! 2. End to end: enqueue 10k `echo` jobs in batches, run to completion.
//! 3. Enqueue→completion latency at about half of peak (an upper bound on
//!    enqueue→start: it includes the run and the recorded outcome).
//! 4. Throughput with 1k vs 1M other jobs queued behind the measured ones.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use leash::job::{NewJob, Target};
use leash::runtime::{PluginSource, Runtime, Submit};
use leash::sandbox::{NoObserver, RunLimits, RunRequest, Sandbox, SandboxConfig, StopHandle};
use leash::store::Durability;
use leash::store::JobInsertParams;
use tokio::sync::Notify;

const SLOTS: usize = 64;
const BATCH: usize = 1000;

#[path = "support/mod.rs"]
mod support;
use support::{median, ms, percentile, raw_job, succeeded};

fn sandbox_config() -> SandboxConfig {
    support::sandbox_config(SLOTS)
}

async fn raw_rate(n: usize) -> f64 {
    raw_rate_with(n, sandbox_config()).await
}

async fn raw_rate_with(n: usize, config: SandboxConfig) -> f64 {
    let sandbox = Arc::new(Sandbox::new(config).unwrap());
    let plugin = sandbox.load(&leash_tests::plugin_bytes("echo")).unwrap();
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..SLOTS {
        let (sandbox, plugin, next) = (sandbox.clone(), plugin.clone(), next.clone());
        tasks.spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < n {
                let request = RunRequest::new(Target::Execute, b"x".to_vec(), RunLimits::default());
                let outcome = sandbox.run(&plugin, request, &StopHandle::new(), Arc::new(NoObserver)).await;
                assert!(outcome.result.is_ok());
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    n as f64 / start.elapsed().as_secs_f64()
}

struct Done {
    count: AtomicUsize,
    target: AtomicUsize,
    all: Notify,
}

async fn start(dir: &tempfile::TempDir, durability: Durability) -> (Runtime, Arc<Done>) {
    start_with(dir, durability, sandbox_config(), true).await
}

/// A runtime on a fresh store; with `isolate_guests` false, guests run on
/// the pool's own threads.
async fn start_with(
    dir: &tempfile::TempDir,
    durability: Durability,
    sandbox: SandboxConfig,
    isolate_guests: bool,
) -> (Runtime, Arc<Done>) {
    let runtime = Runtime::builder(dir.path().join("jobs.db"))
        .isolate_guests(isolate_guests)
        .durability(durability)
        .sandbox(sandbox)
        .max_workers(SLOTS)
        .max_queued(u64::MAX)
        .build()
        .await
        .unwrap();
    let done = Arc::new(Done { count: AtomicUsize::new(0), target: AtomicUsize::new(usize::MAX), all: Notify::new() });
    let seen = done.clone();
    runtime.on_complete(move |c| {
        assert_eq!(c.status, leash::job::JobStatus::Succeeded, "{c:?}");
        if seen.count.fetch_add(1, Ordering::SeqCst) + 1 == seen.target.load(Ordering::SeqCst) {
            seen.all.notify_one();
        }
    });
    (runtime, done)
}

fn echo_jobs(digest: leash::job::Digest, n: usize) -> Vec<Submit> {
    (0..n).map(|_| Submit::new(PluginSource::Digest(digest), Target::Execute, b"x".to_vec())).collect()
}

/// Enqueue `n` jobs in batches and wait for all of them; jobs/s overall.
async fn drain(runtime: &Runtime, done: &Done, digest: leash::job::Digest, n: usize) -> (f64, f64) {
    done.count.store(0, Ordering::SeqCst);
    done.target.store(n, Ordering::SeqCst);
    let all = done.all.notified();
    tokio::pin!(all);
    let start = Instant::now();
    for chunk in echo_jobs(digest, n).chunks(BATCH) {
        runtime.submit_many(chunk.to_vec()).await.unwrap();
    }
    let enqueued = start.elapsed();
    all.await;
    (n as f64 / start.elapsed().as_secs_f64(), n as f64 / enqueued.as_secs_f64())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let n = 10_000;
    if let Ok(size) = std::env::var("LEASH_BENCH_BACKLOG_ONLY") {
        backlog_sizes(n, &[1_000, size.parse().unwrap()]).await;
        return;
    }
    if std::env::var_os("LEASH_BENCH_EVENTS_AB").is_some() {
        let (mut with, mut without) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            with.push(store_only(n, true).await);
            without.push(store_only(n, false).await);
        }
        let (with, without) = (median(with), median(without));
        println!(
            "\nevent triggers A/B, store only, median of 3: with {with:.0} jobs/s, without {without:.0} jobs/s: {:.2}x",
            with / without
        );
        return;
    }
    if let Ok(kept) = std::env::var("LEASH_BENCH_RESIDENT_AB") {
        resident_ab(n, kept.parse().unwrap_or(leash::sandbox::DEFAULT_KEEP_RESIDENT_BYTES)).await;
        return;
    }
    if std::env::var_os("LEASH_BENCH_CAPS_AB").is_some() {
        let mut rates = [Vec::new(), Vec::new(), Vec::new()];
        let whose = [Submitter::None, Submitter::Uncapped, Submitter::Capped];
        for _ in 0..3 {
            for (rates, submitter) in rates.iter_mut().zip(whose) {
                rates.push(store_only_by(n, true, submitter).await);
            }
        }
        let [none, uncapped, capped] = rates.map(median);
        println!(
            "\nrunning caps A/B, store only, median of 3: no submitter {none:.0} jobs/s, \
             uncapped principal's {uncapped:.0} ({:.2}x), capped principal's {capped:.0} ({:.2}x)",
            uncapped / none,
            capped / none
        );
        return;
    }
    if std::env::var_os("LEASH_BENCH_STORE_ONLY").is_some() {
        let mut rates = Vec::new();
        for _ in 0..5 {
            rates.push(store_only(n, true).await);
        }
        println!("\nstore only, median of 5: {:.0} jobs/s", median(rates));
        return;
    }
    if std::env::var_os("LEASH_BENCH_ISOLATE_AB").is_some() {
        isolate_ab(n).await;
        return;
    }
    if let Ok(rate) = std::env::var("LEASH_BENCH_IDLE_LATENCY") {
        idle_latency(rate.parse().unwrap()).await;
        return;
    }
    if std::env::var_os("LEASH_BENCH_DRAIN_ONLY").is_some() {
        // For profilers: only the durable drain, five times.
        let dir = tempfile::tempdir().unwrap();
        let (runtime, done) = start(&dir, Durability::Normal).await;
        let digest = runtime.plugin_add(leash_tests::plugin_bytes("echo")).await.unwrap();
        drain(&runtime, &done, digest, 1000).await;
        for _ in 0..5 {
            let (rate, _) = drain(&runtime, &done, digest, n).await;
            println!("durable drain: {rate:.0} jobs/s");
        }
        runtime.shutdown().await;
        return;
    }
    println!(
        "leash durable benchmark ({} mode), {SLOTS} slots, 2 runtime threads\n",
        if quick { "quick" } else { "full" }
    );

    for durability in [Durability::Normal, Durability::Full] {
        let raw = raw_rate(n).await;
        let dir = tempfile::tempdir().unwrap();
        let (runtime, done) = start(&dir, durability).await;
        let digest = runtime.plugin_add(leash_tests::plugin_bytes("echo")).await.unwrap();
        drain(&runtime, &done, digest, 1000).await; // warm: compile, caches
        let (rate, enqueue_rate) = drain(&runtime, &done, digest, n).await;
        println!("durability {durability:?}");
        println!("   raw sandbox (echo, {SLOTS} concurrent)       {raw:>9.0} calls/s");
        println!(
            "   durable, enqueue {n} + run to completion   {rate:>9.0} jobs/s   {:.0}% of raw",
            rate / raw * 100.0
        );
        println!("   (enqueue alone, batches of {BATCH})            {enqueue_rate:>9.0} jobs/s");
        runtime.shutdown().await;
        if durability == Durability::Normal {
            latency(rate).await;
        }
    }

    store_only(n, true).await;
    if !quick {
        backlog(n).await;
    }
}

/// Guest memory kept resident between instances (`keep` bytes; the
/// default unless the variable gives a number) against every page given
/// back (`keep_resident_bytes = 0`): the raw sandbox rate and the durable
/// drain, alternating, three rounds; medians and ratios.
async fn resident_ab(n: usize, keep: u64) {
    let given_back = SandboxConfig { keep_resident_bytes: 0, ..sandbox_config() };
    let kept_config = SandboxConfig { keep_resident_bytes: keep, ..sandbox_config() };
    let (mut raw, mut raw_back, mut durable, mut durable_back) = (vec![], vec![], vec![], vec![]);
    for round in 0..3 {
        for kept in ab_order(round) {
            let config = if kept { kept_config.clone() } else { given_back.clone() };
            let r = raw_rate_with(n, config.clone()).await;
            let d = fresh_drain(n, config, true).await;
            println!("round {round}, kept resident {kept}: raw {r:.0} calls/s, durable {d:.0} jobs/s");
            if kept {
                raw.push(r);
                durable.push(d);
            } else {
                raw_back.push(r);
                durable_back.push(d);
            }
        }
    }
    let (raw, raw_back, durable, durable_back) = (median(raw), median(raw_back), median(durable), median(durable_back));
    println!(
        "\nkept resident vs given back, medians of 3: raw {raw:.0} vs {raw_back:.0} calls/s ({:.2}x), \
         durable {durable:.0} vs {durable_back:.0} jobs/s ({:.2}x)",
        raw / raw_back,
        durable / durable_back
    );
}

/// The durable drain with guests on their own threads (the default)
/// against guests on the pool's runtime, alternating, three rounds.
async fn isolate_ab(n: usize) {
    let (mut own, mut shared) = (vec![], vec![]);
    for round in 0..3 {
        for isolate in ab_order(round) {
            let d = fresh_drain(n, sandbox_config(), isolate).await;
            println!("round {round}, guests on their own threads {isolate}: durable {d:.0} jobs/s");
            if isolate { own.push(d) } else { shared.push(d) }
        }
    }
    let (own, shared) = (median(own), median(shared));
    println!(
        "\nguests on their own threads vs on the pool's, medians of 3: {own:.0} vs {shared:.0} jobs/s ({:.2}x)",
        own / shared
    );
}

/// Which side of an A/B runs first in `round`: alternately, so neither
/// always meets the machine in the same state.
fn ab_order(round: usize) -> [bool; 2] {
    let first = round.is_multiple_of(2);
    [first, !first]
}

/// A durable drain of `n` jobs on a fresh store, after a warm-up of 1,000.
async fn fresh_drain(n: usize, sandbox: SandboxConfig, isolate_guests: bool) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let (runtime, done) = start_with(&dir, Durability::Normal, sandbox, isolate_guests).await;
    let digest = runtime.plugin_add(leash_tests::plugin_bytes("echo")).await.unwrap();
    drain(&runtime, &done, digest, 1000).await;
    let (rate, _) = drain(&runtime, &done, digest, n).await;
    runtime.shutdown().await;
    rate
}

/// The store's share: insert, claim and finish `n` jobs from 64 concurrent
/// tasks, with no sandbox at all; jobs/s of the claims and finishes.
/// Without `events`, the change feed's triggers are dropped first (an A/B
/// of what recording events costs).
/// Whose jobs the store-only pass claims.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Submitter {
    /// No principal (an embedder's jobs).
    None,
    /// A principal without a running cap.
    Uncapped,
    /// A principal with a running cap it never reaches.
    Capped,
}

async fn store_only(n: usize, events: bool) -> f64 {
    store_only_by(n, events, Submitter::None).await
}

async fn store_only_by(n: usize, events: bool, submitter: Submitter) -> f64 {
    const CLAIM: u32 = 8;
    use leash::access::{Principal, PrincipalCeilings, Role};
    use leash::store::sqlite::SqliteStore;
    use leash::store::{JobClaimParams, JobStore};
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("jobs.db");
    let store: Arc<dyn JobStore> = Arc::new(SqliteStore::open(&file, Durability::Normal).unwrap());
    if submitter != Submitter::None {
        let max_running = (submitter == Submitter::Capped).then_some(SLOTS as u32 * CLAIM * 2);
        let ceilings = PrincipalCeilings { max_running, ..Default::default() };
        let principal = Principal {
            name: "tenant".into(),
            roles: [Role::Submit].into(),
            created_at: leash::clock::Timestamp::now(),
            ceilings,
        };
        store.principal_put(principal, None).await.unwrap();
    }
    if !events {
        let conn = rusqlite::Connection::open(&file).unwrap();
        for trigger in ["jobs_event_insert", "jobs_event_status", "jobs_event_progress", "jobs_event_cancel"] {
            conn.execute_batch(&format!("DROP TRIGGER {trigger}")).unwrap();
        }
    }
    let start = Instant::now();
    for _ in 0..n / BATCH {
        let by = (submitter != Submitter::None).then(|| "tenant".to_owned());
        let jobs = (0..BATCH).map(|_| NewJob { submitted_by: by.clone(), ..raw_job(leash::job::Digest::of(b"p")) });
        store.job_insert(JobInsertParams { jobs: jobs.collect(), now: leash::clock::Timestamp::now() }).await.unwrap();
    }
    let inserted = start.elapsed();
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..SLOTS {
        let store = store.clone();
        tasks.spawn(async move {
            loop {
                let now = leash::clock::Timestamp::now();
                let claim = JobClaimParams {
                    worker_id: format!("w{t}"),
                    limit: CLAIM,
                    alone: false,
                    lease_ttl: Duration::from_secs(30),
                    now,
                    aged: 0,
                };
                let leases = store.job_claim(claim).await.unwrap();
                if leases.is_empty() {
                    return;
                }
                let finishes = leases.into_iter().map(|lease| {
                    let store = store.clone();
                    async move { assert!(store.job_finish(succeeded(lease, now)).await.unwrap()) }
                });
                for f in finishes.collect::<Vec<_>>() {
                    f.await;
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    let rate = n as f64 / start.elapsed().as_secs_f64();
    println!(
        "\nstore only ({SLOTS} tasks, claim {CLAIM} + finish each, no sandbox{}, submitter {submitter:?}): \
         {rate:.0} jobs/s; insert {:.0} jobs/s",
        if events { "" } else { ", no event triggers" },
        n as f64 / inserted.as_secs_f64()
    );
    rate
}

async fn latency(peak: f64) {
    let dir = tempfile::tempdir().unwrap();
    let (runtime, done) = start(&dir, Durability::Normal).await;
    let digest = runtime.plugin_add(leash_tests::plugin_bytes("echo")).await.unwrap();
    drain(&runtime, &done, digest, 1000).await;
    let rate = peak / 2.0;
    let total = (rate * 3.0) as usize; // about three seconds
    let interval = Duration::from_secs_f64(1.0 / rate);
    let samples = Arc::new(std::sync::Mutex::new(Vec::with_capacity(total)));
    let submitted = Arc::new(std::sync::Mutex::new(std::collections::HashMap::new()));
    {
        let (samples, submitted) = (samples.clone(), submitted.clone());
        runtime.on_complete(move |c| {
            let at = Instant::now();
            if let Some(start) = submitted.lock().unwrap().remove(&c.id) {
                samples.lock().unwrap().push(at - start);
            }
        });
    }
    done.count.store(0, Ordering::SeqCst);
    done.target.store(total, Ordering::SeqCst);
    let all = done.all.notified();
    tokio::pin!(all);
    let start = Instant::now();
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut sent = 0;
    while sent < total {
        ticker.tick().await;
        let at = Instant::now();
        let id = runtime.submit(echo_jobs(digest, 1).remove(0)).await.unwrap();
        submitted.lock().unwrap().insert(id, at);
        sent += 1;
    }
    all.await;
    let mut samples = samples.lock().unwrap().clone();
    samples.sort();
    println!(
        "   enqueue→completion at {rate:.0} jobs/s offered ({} jobs in {:.1} s): p50 {:.3} ms  p99 {:.3} ms  (n={})",
        total,
        start.elapsed().as_secs_f64(),
        ms(percentile(&samples, 0.5)),
        ms(percentile(&samples, 0.99)),
        samples.len()
    );
    runtime.shutdown().await;
}

/// Enqueue→start at a low fixed rate (the pool idle between jobs), as the
/// peer runner measures it, split in two: the submit call (the insert
/// committed) and from its return to the job's start (the claim loop's
/// wake-up, the claim's commit, the slot's task).
async fn idle_latency(rate: f64) {
    let dir = tempfile::tempdir().unwrap();
    let (runtime, done) = start(&dir, Durability::Normal).await;
    let digest = runtime.plugin_add(leash_tests::plugin_bytes("echo")).await.unwrap();
    drain(&runtime, &done, digest, 1000).await;
    let starts = Arc::new(std::sync::Mutex::new(std::collections::HashMap::new()));
    let seen = starts.clone();
    runtime.on_start(move |s| {
        seen.lock().unwrap().insert(s.id, Instant::now());
    });
    let total = (rate * 5.0) as usize;
    let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    let mut sent = Vec::with_capacity(total);
    for _ in 0..total {
        ticker.tick().await;
        let at = Instant::now();
        let id = runtime.submit(echo_jobs(digest, 1).remove(0)).await.unwrap();
        sent.push((id, at, Instant::now()));
    }
    for (id, _, _) in &sent {
        runtime.wait(*id, Duration::from_secs(60)).await.unwrap();
    }
    runtime.shutdown().await;
    let starts = starts.lock().unwrap();
    let split = |f: &dyn Fn(Instant, Instant, Instant) -> Duration| {
        let mut v: Vec<Duration> = sent.iter().map(|(id, at, back)| f(*at, *back, starts[id])).collect();
        v.sort();
        (ms(percentile(&v, 0.5)), ms(percentile(&v, 0.99)))
    };
    let whole = split(&|at, _, started| started.saturating_duration_since(at));
    let submit = split(&|at, back, _| back - at);
    let after = split(&|_, back, started| started.saturating_duration_since(back));
    println!(
        "enqueue→start at {rate:.0} jobs/s ({total} jobs), ms p50/p99: whole {:.3}/{:.3}; \
         submit {:.3}/{:.3}; submit's return→start {:.3}/{:.3}",
        whole.0, whole.1, submit.0, submit.1, after.0, after.1
    );
}

async fn backlog(n: usize) {
    backlog_sizes(n, &[1_000, 1_000_000]).await;
}

async fn backlog_sizes(n: usize, sizes: &[usize]) {
    println!("\nbacklog: {n} measured jobs ahead of B other queued jobs");
    let mut results = Vec::new();
    for &backlog in sizes {
        let dir = tempfile::tempdir().unwrap();
        let (runtime, done) = start(&dir, Durability::Normal).await;
        let digest = runtime.plugin_add(leash_tests::plugin_bytes("echo")).await.unwrap();
        runtime.shutdown().await; // build the backlog with no worker claiming
        let filler = Runtime::builder(dir.path().join("jobs.db")).without_workers().build().await.unwrap();
        let job = |_| raw_job(digest);
        let now = leash::clock::Timestamp::now();
        filler.store().job_insert(JobInsertParams { jobs: (0..n).map(job).collect(), now }).await.unwrap();
        let later = now.plus(Duration::from_secs(1));
        let started = Instant::now();
        for chunk in (0..backlog).collect::<Vec<_>>().chunks(50_000) {
            let jobs = chunk.iter().map(|&i| job(i)).collect();
            filler.store().job_insert(JobInsertParams { jobs, now: later }).await.unwrap();
        }
        let fill = started.elapsed();
        drop(runtime);
        drop(done);
        let (runtime, done) = start(&dir, Durability::Normal).await;
        done.target.store(n, Ordering::SeqCst);
        let all = done.all.notified();
        let start = Instant::now();
        all.await;
        let rate = n as f64 / start.elapsed().as_secs_f64();
        println!("   B = {backlog:>9}: {rate:>9.0} jobs/s   (backlog inserted in {:.1} s)", fill.as_secs_f64());
        results.push(rate);
        runtime.shutdown().await;
    }
    println!("   {} backlog keeps {:.0}% of the 1k-backlog throughput", sizes[1], results[1] / results[0] * 100.0);
}
