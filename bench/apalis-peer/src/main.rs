//! The job-queue peer: apalis 1.0 + apalis-sqlite with a native no-op
//! handler, measured the way `peer-bench queue-leash` measures leash.
//!
//! `apalis-peer drain <db> <jobs> <workers> <batch>`: enqueue `jobs` no-op jobs, then
//! start a worker and time it running them all; prints `{"jobs_per_s": ...}`.
//! `apalis-peer latency <db> <rate> <seconds> <workers> <batch>`: enqueue one job at a
//! time at `rate` per second while a worker runs; prints the enqueue→start
//! latencies in microseconds.
//!
//! Settings, matched to leash's: WAL, `synchronous = NORMAL` on every
//! connection (apalis's `setup` would leave one connection at `OFF`), the
//! event-driven fetch the apalis-sqlite README gives for low latency (a
//! stream that wakes the fetcher on each insert, plus an interval), the
//! given `batch_size`, `concurrency(workers)`, results not persisted
//! (leash keeps a no-op's 1-byte output).

use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use apalis::prelude::*;
use apalis_sqlite::{Config, SqliteConnectOptions, SqlitePool, SqlitePoolOptions, SqliteStorage};
use futures::channel::mpsc::UnboundedSender;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Noop {
    /// Microseconds since the process's epoch when it was enqueued.
    sent_us: u64,
}

struct Tally {
    epoch: Instant,
    done: AtomicU64,
    target: u64,
    latencies: Mutex<Vec<u64>>,
    finished: tokio::sync::Notify,
}

async fn noop(job: Noop, tally: Data<Arc<Tally>>) -> Result<(), BoxDynError> {
    let now = tally.epoch.elapsed().as_micros() as u64;
    tally.latencies.lock().unwrap().push(now.saturating_sub(job.sent_us));
    if tally.done.fetch_add(1, Ordering::SeqCst) + 1 == tally.target {
        tally.finished.notify_one();
    }
    Ok(())
}

fn options(path: &str) -> SqliteConnectOptions {
    SqliteConnectOptions::from_str(&format!("sqlite://{path}"))
        .expect("sqlite url")
        .create_if_missing(true)
        .pragma("journal_mode", "WAL")
        .pragma("synchronous", "NORMAL")
}

/// A migrated database whose every connection runs WAL + NORMAL.
async fn open(path: &str, workers: usize) -> SqlitePool {
    let setup_pool = SqlitePoolOptions::new().max_connections(1).connect_with(options(path)).await.unwrap();
    SqliteStorage::setup(&setup_pool).await.unwrap();
    setup_pool.close().await;
    SqlitePoolOptions::new().max_connections(workers.clamp(2, 16) as u32).connect_with(options(path)).await.unwrap()
}

/// Storage for no-op jobs. The fetcher wakes on every in-process push (the
/// in-process equivalent of apalis-sqlite's update-hook listener) and polls
/// every 50 ms besides.
fn storage(pool: &SqlitePool, batch: usize) -> (SqliteStorage<Noop>, UnboundedSender<()>, Strategy) {
    let config = Config::default().queue("noop").batch_size(batch).persist_results(false);
    let (wake, woken) = futures::channel::mpsc::unbounded::<()>();
    let strategy = Strategy::new().stream(woken).interval(Duration::from_millis(50));
    (SqliteStorage::new(pool).with_config(config), wake, strategy)
}

/// Run a worker of `workers` concurrent no-op handlers on `backend`.
fn spawn_worker(
    backend: SqliteStorage<Noop>,
    strategy: Strategy,
    tally: Arc<Tally>,
    workers: usize,
) -> tokio::task::JoinHandle<Result<(), WorkerError>> {
    let worker = WorkerBuilder::new("peer")
        .backend(backend.poll_with_strategy(strategy))
        .data(tally)
        .concurrency(workers)
        .build(noop);
    tokio::spawn(worker.run())
}

fn tally(target: u64) -> Arc<Tally> {
    Arc::new(Tally {
        epoch: Instant::now(),
        done: AtomicU64::new(0),
        target,
        latencies: Mutex::new(Vec::new()),
        finished: tokio::sync::Notify::new(),
    })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize| args.get(i).unwrap_or_else(|| panic!("usage: apalis-peer drain|latency <db> ..."));
    match arg(1).as_str() {
        "drain" => {
            let (db, jobs, workers, batch) = (
                arg(2),
                arg(3).parse::<u64>().unwrap(),
                arg(4).parse::<usize>().unwrap(),
                arg(5).parse::<usize>().unwrap(),
            );
            let pool = open(db, workers).await;
            let (mut backend, wake, strategy) = storage(&pool, batch);
            let mut tasks = (0..jobs).map(|_| Noop { sent_us: 0 });
            let enqueue = Instant::now();
            for _ in 0..jobs.div_ceil(1000) {
                let chunk: Vec<Noop> = tasks.by_ref().take(1000).collect();
                backend.push_bulk(chunk).await.unwrap();
            }
            let enqueue_s = enqueue.elapsed().as_secs_f64();
            // The drain is timed from the worker's start: the jobs are all queued.
            let start = Instant::now();
            let tally = tally(jobs);
            let finished = tally.finished.notified();
            let run = spawn_worker(backend, strategy, tally.clone(), workers);
            let _ = wake.unbounded_send(());
            finished.await;
            let elapsed = start.elapsed();
            run.abort();
            println!(
                "{}",
                serde_json::json!({
                    "jobs": jobs,
                    "seconds": elapsed.as_secs_f64(),
                    "jobs_per_s": jobs as f64 / elapsed.as_secs_f64(),
                    "enqueue_per_s": jobs as f64 / enqueue_s,
                })
            );
        }
        "latency" => {
            let (db, rate, seconds, workers, batch) = (
                arg(2),
                arg(3).parse::<f64>().unwrap(),
                arg(4).parse::<f64>().unwrap(),
                arg(5).parse::<usize>().unwrap(),
                arg(6).parse::<usize>().unwrap(),
            );
            let jobs = (rate * seconds) as u64;
            let pool = open(db, workers).await;
            let (backend, wake, strategy) = storage(&pool, batch);
            let mut sink = backend.clone();
            let tally = tally(jobs);
            let finished = tally.finished.notified();
            let run = spawn_worker(backend, strategy, tally.clone(), workers);
            let gap = Duration::from_secs_f64(1.0 / rate);
            let mut next = tokio::time::Instant::now();
            for _ in 0..jobs {
                tokio::time::sleep_until(next).await;
                next += gap;
                let sent_us = tally.epoch.elapsed().as_micros() as u64;
                sink.push(Noop { sent_us }).await.unwrap();
                let _ = wake.unbounded_send(());
            }
            finished.await;
            run.abort();
            let latencies = tally.latencies.lock().unwrap().clone();
            println!("{}", serde_json::json!({ "latencies_us": latencies }));
        }
        other => panic!("unknown mode {other:?}"),
    }
}
