//! Flow-control benchmark: what priorities and the aged share cost a
//! claim. A store-only drain (64 tasks, each claiming 8 and finishing
//! each; no sandbox) of the same backlog, alternately:
//!
//! - off: every job at priority 0, no aged share;
//! - on: priorities spread over 0–9, every job aged (the claims' `now` is
//!   past `AGED_AFTER`) and one claimed slot in ten asked for the aged
//!   share, as a pool asks.
//!
//! - paused: as off, behind a backlog as large again of a paused plugin's
//!   jobs, due before them and queued the whole time;
//! - limited: as off, every job naming one rate limit (1,000,000/s, burst
//!   100,000: it never holds one back), so each claim first gives the due
//!   jobs their slots.
//!
//! All have a tenth as many jobs again delayed by a day at priority 0,
//! queued the whole time. SQLite always; PostgreSQL with
//! `LEASH_BENCH_POSTGRES` (or `LEASH_TEST_POSTGRES`) set to a server URL,
//! each pass in a schema of its own. Median of the rounds; prints on/off,
//! paused/off and limited/off.
//!
//! Run with `cargo bench -p leash --bench flow` (`-- --quick`: smaller
//! backlogs; `LEASH_BENCH_ROUNDS=N`: N rounds instead of 3;
//! `LEASH_BENCH_POSTGRES_ONLY=1`: PostgreSQL alone).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use leash::clock::Timestamp;
use leash::job::rate::RateLimit;
use leash::job::{NewJob, PluginName};
use leash::store::postgres::PostgresStore;
use leash::store::sqlite::SqliteStore;
use leash::store::{AGED_AFTER, AGED_SHARE, Durability, JobClaimParams, JobInsertParams, JobStore, PauseParams};

#[path = "support/mod.rs"]
mod support;
use support::{median, raw_job, succeeded};

const TASKS: usize = 64;
const CLAIM: u32 = 8;
const BATCH: usize = 1000;

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Off,
    On,
    Paused,
    Limited,
}

fn job(priority: u8, run_at: Option<Timestamp>) -> NewJob {
    let week = Duration::from_secs(7 * 86_400);
    NewJob { priority, run_at, queue_ttl: week, ..raw_job(leash::job::Digest::of(b"p")) }
}

/// Queue `n` due jobs (and `n / 10` delayed ones), then drain the due
/// ones; answers jobs per second of the drain.
async fn drain(store: Arc<dyn JobStore>, n: usize, mode: Mode) -> f64 {
    let now = Timestamp::now();
    if mode == Mode::Limited {
        let limit = RateLimit::new("bench", "1000000/s".parse().unwrap(), 100_000, None, now).unwrap();
        store.rate_limit_set(limit).await.unwrap();
    }
    if mode == Mode::Paused {
        let name = "held".to_owned();
        let pause = PauseParams { name: name.clone(), actor: None, reason: None, now };
        store.plugin_pause(pause).await.unwrap();
        let held = NewJob { plugin_name: Some(PluginName::new(&name, "1").unwrap()), ..job(0, None) };
        for _ in 0..n / BATCH {
            let jobs = vec![held.clone(); BATCH];
            store.job_insert(JobInsertParams { jobs, now: now.minus(Duration::from_secs(1)) }).await.unwrap();
        }
    }
    let mut i = 0usize;
    while i < n {
        let jobs: Vec<NewJob> = (i..(i + BATCH).min(n))
            .map(|k| {
                let job = job(if mode == Mode::On { (k * 7 % 10) as u8 } else { 0 }, None);
                if mode == Mode::Limited { NewJob { rate_limit: Some("bench".into()), ..job } } else { job }
            })
            .collect();
        i += jobs.len();
        store.job_insert(JobInsertParams { jobs, now }).await.unwrap();
    }
    let later = now.plus(Duration::from_secs(86_400));
    let delayed: Vec<NewJob> = (0..n / 10).map(|_| job(0, Some(later))).collect();
    for chunk in delayed.chunks(BATCH) {
        store.job_insert(JobInsertParams { jobs: chunk.to_vec(), now }).await.unwrap();
    }
    // Every due job is aged from the first claim on.
    let claim_at = now.plus(AGED_AFTER + Duration::from_secs(1));
    let asked = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..TASKS {
        let (store, asked) = (store.clone(), asked.clone());
        tasks.spawn(async move {
            let mut drained = 0usize;
            loop {
                let before = asked.fetch_add(u64::from(CLAIM), Ordering::Relaxed);
                let aged = match mode {
                    Mode::Off | Mode::Paused | Mode::Limited => 0,
                    Mode::On => ((before + u64::from(CLAIM)) / AGED_SHARE - before / AGED_SHARE) as u32,
                };
                let claim = JobClaimParams {
                    worker_id: format!("worker-{t:08}"),
                    limit: CLAIM,
                    alone: false,
                    lease_ttl: Duration::from_secs(300),
                    now: claim_at,
                    aged,
                };
                let leases = store.job_claim(claim).await.unwrap();
                if leases.is_empty() {
                    return drained;
                }
                for lease in leases {
                    assert!(store.job_finish(succeeded(lease, claim_at)).await.unwrap());
                    drained += 1;
                }
            }
        });
    }
    let mut drained = 0;
    while let Some(done) = tasks.join_next().await {
        drained += done.unwrap();
    }
    assert_eq!(drained, n, "every due job drained, no delayed one");
    n as f64 / start.elapsed().as_secs_f64()
}

async fn sqlite_pass(n: usize, mode: Mode) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(dir.path().join("jobs.db"), Durability::Normal).unwrap());
    drain(store, n, mode).await
}

async fn postgres_pass(base: &str, n: usize, mode: Mode, pass: usize) -> f64 {
    let name = format!("leash_bench_flow_{}_{pass}", std::process::id());
    let (admin, connection) = tokio_postgres::connect(base, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    admin.batch_execute(&format!("CREATE SCHEMA {name}")).await.unwrap();
    let separator = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{separator}options=-csearch_path%3D{name}");
    let store = Arc::new(PostgresStore::open(&url).await.unwrap());
    let rate = drain(store.clone(), n, mode).await;
    drop(store);
    admin.batch_execute(&format!("DROP SCHEMA {name} CASCADE")).await.unwrap();
    rate
}

fn report(backend: &str, n: usize, [off, on, paused, limited]: [Vec<f64>; 4]) {
    let rounds = off.len();
    let (off, on, paused, limited) = (median(off), median(on), median(paused), median(limited));
    println!(
        "{backend}: drain of {n} jobs, median of {rounds}: off {off:.0} jobs/s, on {on:.0} jobs/s (on/off {:.3}), \
         behind a paused backlog {paused:.0} jobs/s (paused/off {:.3}), rate-limited {limited:.0} jobs/s \
         (limited/off {:.3})",
        on / off,
        paused / off,
        limited / off
    );
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::On => "on",
            Mode::Paused => "paused",
            Mode::Limited => "limited",
        }
    }
}

const MODES: [Mode; 4] = [Mode::Off, Mode::On, Mode::Paused, Mode::Limited];

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let n = if quick { 5_000 } else { 20_000 };
    let rounds: usize = std::env::var("LEASH_BENCH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(3);
    if std::env::var_os("LEASH_BENCH_POSTGRES_ONLY").is_none() {
        let mut rates: [Vec<f64>; 4] = Default::default();
        for _ in 0..rounds {
            for (rates, mode) in rates.iter_mut().zip(MODES) {
                rates.push(sqlite_pass(n, mode).await);
            }
        }
        report("SQLite", n, rates);
    }
    let Some(base) = std::env::var("LEASH_BENCH_POSTGRES").ok().or_else(|| std::env::var("LEASH_TEST_POSTGRES").ok())
    else {
        println!("PostgreSQL: skipped (set LEASH_BENCH_POSTGRES to a server URL)");
        return;
    };
    let mut rates: [Vec<f64>; 4] = Default::default();
    let mut pass = 0;
    for _ in 0..rounds {
        for (rates, mode) in rates.iter_mut().zip(MODES) {
            let rate = postgres_pass(&base, n, mode, pass).await;
            eprintln!("PostgreSQL pass {pass} ({}): {rate:.0} jobs/s", mode.name());
            rates.push(rate);
            pass += 1;
        }
    }
    report("PostgreSQL", n, rates);
}
