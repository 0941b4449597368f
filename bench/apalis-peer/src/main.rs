//! The job-queue peer: apalis 1.0 + apalis-sqlite (or apalis-postgres when
//! `<db>` is a `postgres://` URL) with a native no-op handler, measured the
//! way `peer-bench queue-leash` measures leash.
//!
//! `apalis-peer drain <db> <jobs> <workers> <batch>`: enqueue `jobs` no-op jobs, then
//! start a worker and time it running them all; prints `{"jobs_per_s": ...}`.
//! `apalis-peer latency <db> <rate> <seconds> <workers> <batch>`: enqueue jobs
//! at `rate` per second, each at its own time whether or not the ones
//! before it have answered (an open loop), while a worker runs; prints the
//! enqueue→start latencies in microseconds.
//!
//! Settings, matched to leash's: WAL, `synchronous = NORMAL` on every
//! connection (apalis's `setup` would leave one connection at `OFF`), the
//! event-driven fetch the apalis-sqlite README gives for low latency (a
//! stream that wakes the fetcher on each insert, plus an interval), the
//! given `batch_size`, `concurrency(workers)`, and `persist_results(true)`
//! (its default): each finished job is acknowledged, marked `Done` with its
//! result in the store, as leash marks its jobs `succeeded` with their
//! output. (`persist_results(false)` skips that write altogether: the job
//! stays `Running` in the table, so it is not a finished job.) On PostgreSQL: the storage's
//! own LISTEN/NOTIFY wake-up (`with_pubsub`) plus the same 50 ms interval,
//! a pool of `workers + 2` connections.

use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use apalis::prelude::*;
use apalis_postgres::{Config as PgConfig, PostgresStorage};
use apalis_sqlite::{Config, SqliteConnectOptions, SqlitePool, SqlitePoolOptions, SqliteStorage};
use futures::channel::mpsc::UnboundedSender;
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgPoolOptions;

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

/// Storage for no-op jobs on either database.
enum Queue {
    /// The fetcher wakes on every in-process push (the in-process
    /// equivalent of apalis-sqlite's update-hook listener) and polls every
    /// 50 ms besides.
    /// The strategy goes to the worker; a [`Queue::sink`] has none.
    Sqlite(SqliteStorage<Noop>, UnboundedSender<()>, Option<Strategy>),
    /// The storage's LISTEN/NOTIFY stream plus a 50 ms interval.
    Postgres(PostgresStorage<Noop>),
}

impl Queue {
    async fn open(db: &str, workers: usize, batch: usize) -> Queue {
        if db.starts_with("postgres://") || db.starts_with("postgresql://") {
            let pool = PgPoolOptions::new().max_connections(workers as u32 + 2).connect(db).await.unwrap();
            PostgresStorage::<()>::setup(&pool).await.unwrap();
            let config = PgConfig::default().queue("noop").batch_size(batch).persist_results(true);
            return Queue::Postgres(PostgresStorage::new(&pool).with_config(config));
        }
        let pool = open(db, workers).await;
        let config = Config::default().queue("noop").batch_size(batch).persist_results(true);
        let (wake, woken) = futures::channel::mpsc::unbounded::<()>();
        let strategy = Strategy::new().stream(woken).interval(Duration::from_millis(50));
        Queue::Sqlite(SqliteStorage::new(&pool).with_config(config), wake, Some(strategy))
    }

    /// A second handle that enqueues into the same queue.
    fn sink(&self) -> Queue {
        match self {
            Queue::Sqlite(storage, wake, _) => Queue::Sqlite(storage.clone(), wake.clone(), None),
            Queue::Postgres(storage) => Queue::Postgres(storage.clone()),
        }
    }

    async fn push_bulk(&mut self, jobs: Vec<Noop>) {
        match self {
            Queue::Sqlite(storage, ..) => storage.push_bulk(jobs).await.unwrap(),
            Queue::Postgres(storage) => storage.push_bulk(jobs).await.unwrap(),
        }
    }

    async fn push(&mut self, job: Noop) {
        match self {
            Queue::Sqlite(storage, wake, _) => {
                storage.push(job).await.unwrap();
                let _ = wake.unbounded_send(());
            }
            Queue::Postgres(storage) => storage.push(job).await.unwrap(),
        }
    }

    /// Run a worker of `workers` concurrent no-op handlers on this queue.
    fn spawn_worker(self, tally: Arc<Tally>, workers: usize) -> tokio::task::JoinHandle<Result<(), WorkerError>> {
        match self {
            Queue::Sqlite(storage, wake, strategy) => {
                let strategy = strategy.expect("a worker runs on the queue, not on a sink");
                let worker = WorkerBuilder::new("peer")
                    .backend(storage.poll_with_strategy(strategy))
                    .data(tally)
                    .concurrency(workers)
                    .build(noop);
                let run = tokio::spawn(worker.run());
                let _ = wake.unbounded_send(());
                run
            }
            Queue::Postgres(storage) => {
                let worker = WorkerBuilder::new("peer")
                    .backend(storage.with_pubsub().poll_with_interval(Duration::from_millis(50)))
                    .data(tally)
                    .concurrency(workers)
                    .build(noop);
                tokio::spawn(worker.run())
            }
        }
    }
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
            let mut queue = Queue::open(db, workers, batch).await;
            let mut tasks = (0..jobs).map(|_| Noop { sent_us: 0 });
            let enqueue = Instant::now();
            for _ in 0..jobs.div_ceil(1000) {
                let chunk: Vec<Noop> = tasks.by_ref().take(1000).collect();
                queue.push_bulk(chunk).await;
            }
            let enqueue_s = enqueue.elapsed().as_secs_f64();
            // The drain is timed from the worker's start: the jobs are all queued.
            let start = Instant::now();
            let tally = tally(jobs);
            let finished = tally.finished.notified();
            let run = queue.spawn_worker(tally.clone(), workers);
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
            let queue = Queue::open(db, workers, batch).await;
            let sink = queue.sink();
            let tally = tally(jobs);
            let finished = tally.finished.notified();
            let run = queue.spawn_worker(tally.clone(), workers);
            let gap = Duration::from_secs_f64(1.0 / rate);
            let mut next = tokio::time::Instant::now();
            let began = std::time::Instant::now();
            // Open loop, as leash's runner: each push starts at its own
            // time, whether or not the ones before it have answered.
            let mut pushes = tokio::task::JoinSet::new();
            for _ in 0..jobs {
                tokio::time::sleep_until(next).await;
                next += gap;
                let sent_us = tally.epoch.elapsed().as_micros() as u64;
                let mut sink = sink.sink();
                pushes.spawn(async move { sink.push(Noop { sent_us }).await });
            }
            pushes.join_all().await;
            let submitted_per_s = jobs as f64 / began.elapsed().as_secs_f64();
            finished.await;
            run.abort();
            let latencies = tally.latencies.lock().unwrap().clone();
            println!("{}", serde_json::json!({ "latencies_us": latencies, "submitted_per_s": submitted_per_s }));
        }
        other => panic!("unknown mode {other:?}"),
    }
}
