//! The PostgreSQL benchmarks: leash on PostgreSQL beside apalis-postgres,
//! graphile-worker and leash on SQLite (`pg-compare`), and leash on
//! PostgreSQL under the failure modes published PostgreSQL-queue benchmarks
//! test (`pg-stress`): a transaction left open, a sustained overload and a
//! million-job backlog with its retention.
//!
//! Every run gets a database of its own, created on the server
//! `LEASH_BENCH_POSTGRES` names (default
//! `postgres://postgres@127.0.0.1:5432/test`) and dropped after.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leash::job::{Digest, JobId, JobStatus, Target};
use leash::runtime::{PluginSource, Runtime, RuntimeError, Submit};
use leash::store::Database;
use serde_json::{Value, json};
use tokio_postgres::NoTls;

use crate::{APALIS_BATCH, WORKERS, percentile, queue_sandbox, run_json, spread};

fn admin_url() -> String {
    std::env::var("LEASH_BENCH_POSTGRES").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A database of its own on the benchmark server, dropped by
/// [`Fresh::remove`].
struct Fresh {
    admin: tokio_postgres::Client,
    name: String,
    url: String,
}

impl Fresh {
    async fn new(tag: &str) -> anyhow::Result<Fresh> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let admin_url = admin_url();
        let (admin, connection) = tokio_postgres::connect(&admin_url, NoTls).await?;
        tokio::spawn(connection);
        let name = format!("leash_bench_{}_{}_{tag}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        admin.batch_execute(&format!("CREATE DATABASE {name}")).await?;
        let base = admin_url.split('?').next().unwrap_or_default();
        let url = format!("{}/{name}", &base[..base.rfind('/').unwrap_or(base.len())]);
        Ok(Fresh { admin, name, url })
    }

    /// A connection to this database, for the probes.
    async fn connect(&self) -> anyhow::Result<tokio_postgres::Client> {
        let (client, connection) = tokio_postgres::connect(&self.url, NoTls).await?;
        tokio::spawn(connection);
        Ok(client)
    }

    async fn remove(self) -> anyhow::Result<()> {
        self.admin.batch_execute(&format!("DROP DATABASE {} WITH (FORCE)", self.name)).await?;
        Ok(())
    }
}

// ---- pg-compare ----

/// One queue under test, and how to run its drain and latency modes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Peer {
    LeashPostgres,
    ApalisPostgres,
    Graphile,
    LeashSqlite,
}

impl Peer {
    const ALL: [Peer; 4] = [Peer::LeashPostgres, Peer::ApalisPostgres, Peer::Graphile, Peer::LeashSqlite];

    fn key(self) -> &'static str {
        match self {
            Peer::LeashPostgres => "leash_postgres",
            Peer::ApalisPostgres => "apalis_postgres",
            Peer::Graphile => "graphile_worker",
            Peer::LeashSqlite => "leash_sqlite",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Peer::LeashPostgres => "leash (PostgreSQL)",
            Peer::ApalisPostgres => "apalis-postgres",
            Peer::Graphile => "graphile-worker",
            Peer::LeashSqlite => "leash (SQLite)",
        }
    }
}

struct Tools<'a> {
    me: std::path::PathBuf,
    wasm: &'a Path,
    apalis: &'a Path,
    graphile: &'a Path,
}

impl Tools<'_> {
    /// Run `mode` (`drain` or `latency`, with its numeric arguments) of
    /// `peer` on a database of its own; the JSON its last line printed.
    async fn run(&self, peer: Peer, mode: &str, numbers: &[String]) -> anyhow::Result<Value> {
        let workers = WORKERS.to_string();
        let sqlite = tempfile::tempdir()?;
        let fresh = if peer == Peer::LeashSqlite { None } else { Some(Fresh::new(peer.key()).await?) };
        let db = match &fresh {
            Some(fresh) => fresh.url.clone().into(),
            None => sqlite.path().join("leash.db").into_os_string(),
        };
        let mut command = match peer {
            Peer::LeashPostgres | Peer::LeashSqlite => {
                let mut c = Command::new(&self.me);
                c.args(["queue-leash", mode]).arg(&db).arg(self.wasm).args(numbers).arg(&workers);
                c
            }
            Peer::ApalisPostgres => {
                let mut c = Command::new(self.apalis);
                c.arg(mode).arg(&db).args(numbers).arg(&workers).arg(APALIS_BATCH.to_string());
                c
            }
            Peer::Graphile => {
                let mut c = Command::new("node");
                c.arg(self.graphile.join("peer.mjs")).arg(mode).arg(&db).args(numbers).arg(&workers);
                c
            }
        };
        let result = tokio::task::spawn_blocking(move || run_json(&mut command)).await?;
        if let Some(fresh) = fresh {
            fresh.remove().await?;
        }
        result
    }
}

/// `peer-bench pg-compare <leash-work.wasm> <apalis-peer> <graphile-peer-dir> <out-dir> [--quick]`
pub async fn compare(wasm: &Path, apalis: &Path, graphile: &Path, out_dir: &Path, quick: bool) -> anyhow::Result<()> {
    let tools = Tools { me: std::env::current_exe()?, wasm, apalis, graphile };
    let runs = if quick { 3 } else { 5 };
    let sizes: &[usize] = if quick { &[10_000] } else { &[10_000, 100_000] };
    let mut out = serde_json::Map::new();
    eprintln!("PostgreSQL queues ({runs} alternating runs, {WORKERS} workers)");
    for &jobs in sizes {
        let mut rates: HashMap<Peer, Vec<f64>> = HashMap::new();
        for run in 0..runs {
            let mut line = format!("  drain {jobs} run {run}:");
            for peer in Peer::ALL {
                let figures = tools.run(peer, "drain", &[jobs.to_string()]).await?;
                let rate = figures["jobs_per_s"].as_f64().unwrap_or(0.0);
                line += &format!(" {} {rate:.0}/s", peer.key());
                rates.entry(peer).or_default().push(rate);
            }
            eprintln!("{line}");
        }
        let mut entry = serde_json::Map::new();
        for peer in Peer::ALL {
            entry.insert(peer.key().into(), json!(spread(rates[&peer].clone())));
        }
        out.insert(format!("drain_{jobs}"), Value::Object(entry));
    }
    // Half load: half the slowest queue's 10k drain rate, the same for all.
    let slowest =
        Peer::ALL.iter().filter_map(|p| out["drain_10000"][p.key()]["median"].as_f64()).fold(f64::INFINITY, f64::min);
    let rate = (slowest / 2.0).floor();
    let seconds = if quick { 5.0 } else { 10.0 };
    eprintln!("  enqueue→start at {rate} jobs/s (half the slowest drain) for {seconds} s");
    let (mut p50, mut p99): (HashMap<Peer, Vec<f64>>, HashMap<Peer, Vec<f64>>) = Default::default();
    let mut reached: HashMap<Peer, Vec<f64>> = HashMap::new();
    for run in 0..runs {
        let mut line = format!("  latency run {run}:");
        for peer in Peer::ALL {
            let figures = tools.run(peer, "latency", &[rate.to_string(), seconds.to_string()]).await?;
            let mut xs: Vec<f64> =
                figures["latencies_us"].as_array().into_iter().flatten().filter_map(Value::as_f64).collect();
            anyhow::ensure!(!xs.is_empty(), "{} reported no latencies", peer.key());
            xs.sort_by(f64::total_cmp);
            let (a, b) = (percentile(&xs, 0.5), percentile(&xs, 0.99));
            // An open loop: below `rate` only if its submits could not
            // keep up at all.
            let submitted = figures["submitted_per_s"].as_f64().unwrap_or(0.0);
            line += &format!(" {} p50 {a:.0} µs p99 {b:.0} µs at {submitted:.0}/s;", peer.key());
            reached.entry(peer).or_default().push(submitted);
            p50.entry(peer).or_default().push(a);
            p99.entry(peer).or_default().push(b);
        }
        eprintln!("{line}");
    }
    let mut latency = serde_json::Map::new();
    latency.insert("rate_per_s".into(), json!(rate));
    latency.insert("seconds".into(), json!(seconds));
    for peer in Peer::ALL {
        latency.insert(
            peer.key().into(),
            json!({ "p50_us": spread(p50[&peer].clone()), "p99_us": spread(p99[&peer].clone()),
                    "submitted_per_s": spread(reached[&peer].clone()) }),
        );
    }
    out.insert("latency".into(), Value::Object(latency));
    let settings = json!({
        "workers": WORKERS,
        "leash": "submit_many in batches of 1,000; pool of 16 connections; NOTIFY wake-up + 50 ms poll; each job a sandboxed echo with its output stored",
        "apalis_postgres": { "version": "1.0.0", "batch_size": APALIS_BATCH, "fetch": "with_pubsub (LISTEN/NOTIFY) + 50 ms interval",
                             "pool": "workers + 2", "persist_results": true, "enqueue": "push_bulk, batches of 1,000" },
        "graphile_worker": { "version": "0.18.0", "concurrency": WORKERS, "maxPoolSize": "workers + 2", "pollInterval_ms": 50,
                             "completeJobBatchDelay": -1, "localQueue": "off", "enqueue": "addJobs, batches of 1,000" },
        "leash_sqlite": "WAL, synchronous = NORMAL, as in the SQLite comparison",
    });
    let results = json!({ "quick": quick, "runs": runs, "settings": settings, "queues": out });
    std::fs::create_dir_all(out_dir)?;
    std::fs::write(out_dir.join("pg-results.json"), serde_json::to_string_pretty(&results)?)?;
    print_compare(&results);
    Ok(())
}

fn cell(v: &Value) -> String {
    let f = |k: &str| v[k].as_f64().unwrap_or(0.0);
    format!("{:.0} ({:.0}–{:.0})", f("median"), f("min"), f("max"))
}

fn print_compare(r: &Value) {
    let q = &r["queues"];
    let lp = Peer::LeashPostgres.key();
    println!("| figure | {} | leash (PostgreSQL) / each |", Peer::ALL.map(Peer::label).join(" | "));
    println!("| --- |{}", " --- |".repeat(Peer::ALL.len() + 1));
    let row = |label: String, figures: &Value, lower_is_better: bool| {
        let ours = figures[lp]["median"].as_f64().unwrap_or(0.0);
        let cells: Vec<String> = Peer::ALL.iter().map(|p| cell(&figures[p.key()])).collect();
        let ratios: Vec<String> = Peer::ALL[1..]
            .iter()
            .map(|p| {
                let theirs = figures[p.key()]["median"].as_f64().unwrap_or(0.0);
                let ratio = if lower_is_better { theirs / ours } else { ours / theirs };
                format!("{} {ratio:.2}×", p.label())
            })
            .collect();
        println!("| {label} | {} | {} |", cells.join(" | "), ratios.join(", "));
    };
    for key in ["drain_10000", "drain_100000"] {
        if !q[key].is_null() {
            row(format!("drain {} queued jobs, jobs/s", key.trim_start_matches("drain_")), &q[key], false);
        }
    }
    let l = &q["latency"];
    let figures = |key: &str| -> Value {
        Value::Object(Peer::ALL.iter().map(|peer| (peer.key().to_string(), l[peer.key()][key].clone())).collect())
    };
    row(format!("jobs submitted per second, open loop, {} asked", l["rate_per_s"]), &figures("submitted_per_s"), false);
    for p in ["p50", "p99"] {
        row(format!("enqueue→start {p} at that load, µs (ratio: theirs / ours)"), &figures(&format!("{p}_us")), true);
    }
}

// ---- pg-stress ----

/// A leash runtime on a fresh database, with what the probes read: jobs
/// completed (and of those, not succeeded), and when each job started.
struct Rig {
    runtime: Runtime,
    digest: Digest,
    completed: Arc<AtomicU64>,
    unsuccessful: Arc<AtomicU64>,
    starts: Arc<Mutex<HashMap<JobId, Instant>>>,
    db: Fresh,
    probe: tokio_postgres::Client,
}

/// Settings shared by every stress run.
#[derive(Clone, Copy)]
struct RigConfig {
    max_queued: u64,
    job_ttl: Duration,
}

impl Rig {
    /// A runtime with workers on a fresh database.
    async fn new(wasm: &[u8], tag: &str, config: RigConfig) -> anyhow::Result<Rig> {
        Rig::on(Fresh::new(tag).await?, wasm, config, true).await
    }

    async fn on(db: Fresh, wasm: &[u8], config: RigConfig, workers: bool) -> anyhow::Result<Rig> {
        let mut builder = Runtime::builder(Database::parse(&db.url))
            .sandbox(queue_sandbox(WORKERS))
            .max_workers(WORKERS)
            .max_queued(config.max_queued)
            .poll_interval(Duration::from_millis(50))
            .job_ttl(config.job_ttl)
            .sweep_interval(Duration::from_secs(1));
        if !workers {
            builder = builder.without_workers();
        }
        // Subscribed before the workers start, so no start or completion is
        // missed.
        let (completed, unsuccessful) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (counter, bad) = (completed.clone(), unsuccessful.clone());
        let starts: Arc<Mutex<HashMap<JobId, Instant>>> = Arc::default();
        let seen = starts.clone();
        let runtime = builder
            .on_complete(move |c| {
                if c.status != JobStatus::Succeeded {
                    bad.fetch_add(1, Ordering::Relaxed);
                }
                counter.fetch_add(1, Ordering::Relaxed);
            })
            .on_start(move |s| {
                seen.lock().unwrap().insert(s.id, Instant::now());
            })
            .build()
            .await?;
        let digest = runtime.plugin_add(wasm.to_vec()).await?;
        let probe = db.connect().await?;
        Ok(Rig { runtime, digest, completed, unsuccessful, starts, db, probe })
    }

    /// Stop this runtime and start one with workers on the same database:
    /// a queue filled with no workers running is drained from full.
    async fn with_workers(self, wasm: &[u8], config: RigConfig) -> anyhow::Result<Rig> {
        self.runtime.shutdown().await;
        drop(self.runtime);
        drop(self.probe);
        Rig::on(self.db, wasm, config, true).await
    }

    fn job(&self) -> Submit {
        Submit::new(PluginSource::Digest(self.digest), Target::action("echo").unwrap(), b"x".to_vec())
    }

    /// Table and index sizes, dead tuples and queue depth, read from the
    /// server.
    async fn table(&self) -> anyhow::Result<Value> {
        let row = self
            .probe
            .query_one(
                "SELECT pg_total_relation_size('jobs'), pg_relation_size('jobs'), pg_indexes_size('jobs'), \
                   s.n_live_tup, s.n_dead_tup, s.autovacuum_count, \
                   (SELECT count(*) FROM jobs WHERE status = 'queued') \
                 FROM pg_stat_user_tables s WHERE s.relname = 'jobs'",
                &[],
            )
            .await?;
        let mb = |i: usize| row.get::<_, i64>(i) as f64 / 1e6;
        Ok(json!({ "total_mb": mb(0), "heap_mb": mb(1), "indexes_mb": mb(2), "live_tuples": row.get::<_, i64>(3),
                   "dead_tuples": row.get::<_, i64>(4), "autovacuums": row.get::<_, i64>(5), "queued": row.get::<_, i64>(6) }))
    }

    /// Enqueue `n` jobs in batches of 1,000.
    async fn fill(&self, n: usize) -> anyhow::Result<f64> {
        let start = Instant::now();
        let mut left = n;
        while left > 0 {
            let batch = left.min(1000);
            self.runtime.submit_many((0..batch).map(|_| self.job()).collect()).await?;
            left -= batch;
        }
        Ok(n as f64 / start.elapsed().as_secs_f64())
    }

    /// Wait until `target` jobs have completed; the seconds it took.
    async fn until_completed(&self, target: u64) -> f64 {
        let start = Instant::now();
        while self.completed.load(Ordering::Relaxed) < target {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        start.elapsed().as_secs_f64()
    }

    async fn finish(self) -> anyhow::Result<()> {
        self.runtime.shutdown().await;
        drop(self.runtime);
        drop(self.probe);
        self.db.remove().await
    }
}

/// Offered load: submits of `batch` jobs at `rate` jobs per second from
/// `tasks` submitters, for `seconds`. A batch is admitted or refused
/// whole, as `submit_many` is.
struct Load {
    admitted: Arc<Mutex<Vec<(JobId, Instant)>>>,
    refused: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl Load {
    fn start(rig: &Rig, rate: f64, seconds: f64, tasks: usize, batch: usize) -> Load {
        let admitted: Arc<Mutex<Vec<(JobId, Instant)>>> = Arc::default();
        let refused = Arc::new(AtomicU64::new(0));
        let per_task = rate / tasks as f64 / batch as f64;
        let rounds = (per_task * seconds) as usize;
        let handles = (0..tasks)
            .map(|i| {
                let (runtime, job, admitted, refused) =
                    (rig.runtime.clone(), rig.job(), admitted.clone(), refused.clone());
                tokio::spawn(async move {
                    let gap = Duration::from_secs_f64(1.0 / per_task);
                    let mut next = tokio::time::Instant::now() + gap.mul_f64(i as f64 / tasks as f64);
                    for _ in 0..rounds {
                        tokio::time::sleep_until(next).await;
                        next += gap;
                        let at = Instant::now();
                        match runtime.submit_many(vec![job.clone(); batch]).await {
                            Ok(ids) => admitted.lock().unwrap().extend(ids.into_iter().map(|id| (id, at))),
                            Err(RuntimeError::Backpressure { .. }) => {
                                refused.fetch_add(batch as u64, Ordering::Relaxed);
                            }
                            Err(e) => return Err(e.into()),
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        Load { admitted, refused, tasks: handles }
    }

    async fn join(self) -> anyhow::Result<(Vec<(JobId, Instant)>, u64)> {
        for task in self.tasks {
            task.await??;
        }
        let admitted = std::mem::take(&mut *self.admitted.lock().unwrap());
        Ok((admitted, self.refused.load(Ordering::Relaxed)))
    }
}

/// One row per call: completions per second since the last row, admitted
/// and refused submits, enqueue→start p50/p99 of the jobs that started in
/// that window, and the table's figures.
struct Sampler {
    last_completed: u64,
    last_admitted: usize,
    last_refused: u64,
    begin: Instant,
    last: Instant,
    rows: Vec<Value>,
}

impl Sampler {
    fn new() -> Sampler {
        Sampler {
            last_completed: 0,
            last_admitted: 0,
            last_refused: 0,
            begin: Instant::now(),
            last: Instant::now(),
            rows: Vec::new(),
        }
    }

    async fn sample(&mut self, rig: &Rig, load: &Load, phase: &str) -> anyhow::Result<()> {
        let now = Instant::now();
        let dt = now.duration_since(self.last).as_secs_f64();
        let completed = rig.completed.load(Ordering::Relaxed);
        let (admitted, mut latencies) = {
            let admitted = load.admitted.lock().unwrap();
            let starts = rig.starts.lock().unwrap();
            let latencies: Vec<f64> = admitted
                .iter()
                .filter_map(|(id, at)| starts.get(id).map(|s| (s, at)))
                .filter(|(s, _)| **s > self.last && **s <= now)
                .map(|(s, at)| s.duration_since(*at).as_secs_f64() * 1e3)
                .collect();
            (admitted.len(), latencies)
        };
        let refused = load.refused.load(Ordering::Relaxed);
        latencies.sort_by(f64::total_cmp);
        let (p50, p99) = if latencies.is_empty() {
            (None, None)
        } else {
            (Some(percentile(&latencies, 0.5)), Some(percentile(&latencies, 0.99)))
        };
        let table = rig.table().await?;
        let row = json!({
            "t_s": now.duration_since(self.begin).as_secs_f64().round(),
            "phase": phase,
            "completed_per_s": (completed - self.last_completed) as f64 / dt,
            "admitted_per_s": (admitted - self.last_admitted) as f64 / dt,
            "refused_per_s": (refused - self.last_refused) as f64 / dt,
            "start_p50_ms": p50, "start_p99_ms": p99,
            "table": table,
        });
        eprintln!(
            "    t={:>4}s {phase:<8} done {:>6.0}/s in {:>6.0}/s refused {:>6.0}/s p99 {:>8} ms queued {:>7} total {:>7.1} MB dead {:>7}",
            row["t_s"],
            row["completed_per_s"].as_f64().unwrap_or(0.0),
            row["admitted_per_s"].as_f64().unwrap_or(0.0),
            row["refused_per_s"].as_f64().unwrap_or(0.0),
            p99.map(|v| format!("{v:.1}")).unwrap_or_else(|| "-".into()),
            table["queued"],
            table["total_mb"].as_f64().unwrap_or(0.0),
            table["dead_tuples"],
        );
        self.rows.push(row);
        (self.last_completed, self.last_admitted, self.last_refused, self.last) = (completed, admitted, refused, now);
        Ok(())
    }

    /// Mean of `field` over the rows of `phase`.
    fn mean(&self, phase: &str, field: &str) -> f64 {
        let xs: Vec<f64> = self.rows.iter().filter(|r| r["phase"] == phase).filter_map(|r| r[field].as_f64()).collect();
        xs.iter().sum::<f64>() / xs.len().max(1) as f64
    }

    /// Largest `field` over the rows of `phase`.
    fn max(&self, phase: &str, field: &str) -> f64 {
        self.rows.iter().filter(|r| r["phase"] == phase).filter_map(|r| r[field].as_f64()).fold(0.0, f64::max)
    }
}

/// The drain rate of `jobs` jobs queued with no workers running, on a
/// fresh database, in this process.
async fn drain_rate(wasm: &[u8], jobs: usize, tag: &str) -> anyhow::Result<f64> {
    let config = RigConfig { max_queued: u64::MAX, job_ttl: Duration::from_secs(3600) };
    let filler = Rig::on(Fresh::new(tag).await?, wasm, config, false).await?;
    filler.fill(jobs).await?;
    let rig = filler.with_workers(wasm, config).await?;
    let seconds = rig.until_completed(jobs as u64).await;
    rig.finish().await?;
    Ok(jobs as f64 / seconds)
}

/// A transaction held open (idle in transaction, with a snapshot) by
/// another client for the middle third of a sustained load at half of
/// capacity, with retention deleting finished jobs as it goes.
async fn idle_in_transaction(wasm: &[u8], capacity: f64, phase_s: f64) -> anyhow::Result<Value> {
    let rig = Rig::new(wasm, "idle", RigConfig { max_queued: u64::MAX, job_ttl: Duration::from_secs(5) }).await?;
    let rate = (capacity * 0.5).floor();
    eprintln!("  idle in transaction: {rate} jobs/s for 3 × {phase_s} s, a snapshot held open in the middle third");
    let load = Load::start(&rig, rate, phase_s * 3.0, 8, 1);
    let mut sampler = Sampler::new();
    let every = Duration::from_secs(5);
    let begin = Instant::now();
    let holder = rig.db.connect().await?;
    let mut held = false;
    let mut released = false;
    while begin.elapsed().as_secs_f64() < phase_s * 3.0 {
        tokio::time::sleep(every).await;
        let t = begin.elapsed().as_secs_f64();
        let phase = if t <= phase_s + 0.5 {
            "before"
        } else if t <= 2.0 * phase_s + 0.5 {
            "during"
        } else {
            "after"
        };
        sampler.sample(&rig, &load, phase).await?;
        if !held && t >= phase_s - 0.5 {
            // REPEATABLE READ takes its snapshot at the first query and keeps
            // it: vacuum cannot remove any row version deleted after it.
            holder.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM jobs;").await?;
            held = true;
        }
        if held && !released && t >= 2.0 * phase_s - 0.5 {
            holder.batch_execute("COMMIT").await?;
            released = true;
        }
    }
    let (admitted, _) = load.join().await?;
    let drained = rig.until_completed(admitted.len() as u64).await;
    let unsuccessful = rig.unsuccessful.load(Ordering::Relaxed);
    anyhow::ensure!(unsuccessful == 0, "{unsuccessful} jobs did not succeed under the idle-in-transaction load");
    let summary = json!({
        "rate_per_s": rate,
        "phase_s": phase_s,
        "completed_per_s": { "before": sampler.mean("before", "completed_per_s"), "during": sampler.mean("during", "completed_per_s"), "after": sampler.mean("after", "completed_per_s") },
        "start_p99_ms_worst_window": { "before": sampler.max("before", "start_p99_ms"), "during": sampler.max("during", "start_p99_ms"), "after": sampler.max("after", "start_p99_ms") },
        "admitted": admitted.len(),
        "drained_after_s": drained,
        "final_table": rig.table().await?,
        "samples": sampler.rows,
    });
    rig.finish().await?;
    Ok(summary)
}

/// A sustained 1.5× overload, with the default admission ceiling or one
/// of `ceiling` queued jobs.
async fn overload(wasm: &[u8], capacity: f64, seconds: f64, ceiling: Option<u64>) -> anyhow::Result<Value> {
    let max_queued = ceiling.unwrap_or(leash::runtime::DEFAULT_MAX_QUEUED);
    let rig = Rig::new(wasm, "overload", RigConfig { max_queued, job_ttl: Duration::from_secs(3600) }).await?;
    let rate = (capacity * 1.5).floor();
    eprintln!("  overload: {rate} jobs/s for {seconds} s, max_queued {max_queued}");
    // Batches of 20: single-job submits from this process cannot offer
    // more than the workers beside them leave of the CPU.
    let load = Load::start(&rig, rate, seconds, 4, 20);
    let mut sampler = Sampler::new();
    let begin = Instant::now();
    while begin.elapsed().as_secs_f64() < seconds {
        tokio::time::sleep(Duration::from_secs(5)).await;
        sampler.sample(&rig, &load, "overload").await?;
    }
    let (admitted, refused) = load.join().await?;
    let stopped = Instant::now();
    while rig.completed.load(Ordering::Relaxed) < admitted.len() as u64 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if sampler.last.elapsed() >= Duration::from_secs(5) {
            sampler.rows.push(json!({ "phase": "drain", "t_s": sampler.begin.elapsed().as_secs_f64().round(),
                                      "table": rig.table().await? }));
            sampler.last = Instant::now();
        }
    }
    let drain_s = stopped.elapsed().as_secs_f64();
    let counts = rig.runtime.health().await?.counts;
    anyhow::ensure!(
        counts.succeeded == admitted.len() as u64 && counts.failed == 0 && counts.queued == 0,
        "admitted {} but the store counts {counts:?}",
        admitted.len()
    );
    let starts = rig.starts.lock().unwrap().clone();
    let mut latencies: Vec<f64> =
        admitted.iter().map(|(id, at)| starts[id].duration_since(*at).as_secs_f64() * 1e3).collect();
    latencies.sort_by(f64::total_cmp);
    let summary = json!({
        "offered_per_s": rate,
        "seconds": seconds,
        "max_queued": max_queued,
        "admitted": admitted.len(),
        "refused": refused,
        "all_admitted_succeeded": true,
        "completed_per_s_mean": sampler.mean("overload", "completed_per_s"),
        "start_p50_ms": percentile(&latencies, 0.5),
        "start_p99_ms": percentile(&latencies, 0.99),
        "start_max_ms": latencies.last(),
        "queued_max": sampler.rows.iter().filter_map(|r| r["table"]["queued"].as_i64()).max(),
        "drained_after_s": drain_s,
        "samples": sampler.rows,
    });
    rig.finish().await?;
    Ok(summary)
}

/// Drain `jobs` queued jobs, reporting the rate per `segment` jobs.
async fn drain_segments(rig: &Rig, jobs: u64, segment: u64) -> Vec<f64> {
    let mut rates = Vec::new();
    let mut done = 0;
    while done < jobs {
        let next = (done + segment).min(jobs);
        let seconds = rig.until_completed(next).await;
        rates.push((next - done) as f64 / seconds);
        eprintln!(
            "    {next} of {jobs} drained: {:.0} jobs/s over the last {}",
            (next - done) as f64 / seconds,
            next - done
        );
        done = next;
    }
    rates
}

/// Wait until the sweeps have deleted every finished job.
async fn until_retained(rig: &Rig) -> anyhow::Result<f64> {
    let start = Instant::now();
    loop {
        let left: i64 = rig.probe.query_one("SELECT count(*) FROM jobs", &[]).await?.get(0);
        if left == 0 {
            return Ok(start.elapsed().as_secs_f64());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The drain rate with a deep backlog against a shallow one, and the
/// table after retention has deleted the whole backlog and after one more
/// round on the emptied table.
async fn backlog(wasm: &[u8], shallow: usize, deep: usize) -> anyhow::Result<Value> {
    let config = RigConfig { max_queued: u64::MAX, job_ttl: Duration::from_secs(5) };
    let shallow_rate = drain_rate(wasm, shallow, "shallow").await?;
    eprintln!("  backlog: {shallow} queued jobs drain at {shallow_rate:.0}/s; filling {deep}");
    let filler = Rig::on(Fresh::new("deep").await?, wasm, config, false).await?;
    let enqueue_per_s = filler.fill(deep).await?;
    let full = filler.table().await?;
    eprintln!("  backlog: {deep} queued at {enqueue_per_s:.0}/s; table {full}");
    let rig = filler.with_workers(wasm, config).await?;
    let start = Instant::now();
    let segments = drain_segments(&rig, deep as u64, shallow as u64).await;
    let deep_s = start.elapsed().as_secs_f64();
    eprintln!("  backlog: drained in {deep_s:.0} s, per {shallow}: {segments:.0?}");
    let retained_after_s = until_retained(&rig).await?;
    let after_retention = rig.table().await?;
    eprintln!("  backlog: retention done {retained_after_s:.0} s later; table {after_retention}");
    // What autovacuum does when it is on (it is off on some servers, this
    // project's included): mark the deleted rows' space free for reuse.
    let vacuum = Instant::now();
    rig.probe.batch_execute("VACUUM jobs").await?;
    let vacuum_s = vacuum.elapsed().as_secs_f64();
    let after_vacuum = rig.table().await?;
    eprintln!("  backlog: VACUUM took {vacuum_s:.1} s; table {after_vacuum}");
    // One more round on the emptied table: the space vacuum freed is
    // reused, so the indexes do not grow past their peak.
    rig.fill(shallow).await?;
    rig.until_completed((deep + shallow) as u64).await;
    until_retained(&rig).await?;
    let after_second_round = rig.table().await?;
    eprintln!("  backlog: after another {shallow}: table {after_second_round}");
    let summary = json!({
        "shallow_jobs": shallow,
        "deep_jobs": deep,
        "shallow_drain_per_s": shallow_rate,
        "deep_first_segment_per_s": segments[0],
        "deep_mean_per_s": deep as f64 / deep_s,
        "deep_segments_per_s": segments,
        "ratio_first_segment": segments[0] / shallow_rate,
        "ratio_mean": deep as f64 / deep_s / shallow_rate,
        "enqueue_per_s": enqueue_per_s,
        "table_full": full,
        "retention_after_drain_s": retained_after_s,
        "table_after_retention": after_retention,
        "vacuum_s": vacuum_s,
        "table_after_vacuum": after_vacuum,
        "table_after_second_round": after_second_round,
    });
    rig.finish().await?;
    Ok(summary)
}

/// `peer-bench pg-stress <leash-work.wasm> <out-dir> [--quick] [idle] [overload] [backlog]`
/// (all three when none is named). Each writes `pg-stress-<name>.json`.
pub async fn stress(wasm: &Path, out_dir: &Path, quick: bool, only: &[String]) -> anyhow::Result<()> {
    let wasm = std::fs::read(wasm)?;
    let wanted = |name: &str| only.is_empty() || only.iter().any(|o| o == name);
    std::fs::create_dir_all(out_dir)?;
    let write = |name: &str, value: &Value| {
        std::fs::write(out_dir.join(format!("pg-stress-{name}.json")), serde_json::to_string_pretty(value)?)
    };
    let capacity = drain_rate(&wasm, if quick { 5_000 } else { 20_000 }, "capacity").await?;
    let server = Fresh::new("settings").await?;
    let autovacuum: String = server.admin.query_one("SHOW autovacuum", &[]).await?.get(0);
    server.remove().await?;
    eprintln!("server: autovacuum {autovacuum}");
    eprintln!("leash on PostgreSQL drains {capacity:.0} jobs/s here ({WORKERS} workers)");
    let seconds = if quick { 20.0 } else { 60.0 };
    if wanted("idle") {
        let idle = idle_in_transaction(&wasm, capacity, seconds).await?;
        println!(
            "idle in transaction: completed/s before {:.0}, during {:.0}, after {:.0}; worst-window p99 start (ms) {}; table at end {}",
            idle["completed_per_s"]["before"].as_f64().unwrap_or(0.0),
            idle["completed_per_s"]["during"].as_f64().unwrap_or(0.0),
            idle["completed_per_s"]["after"].as_f64().unwrap_or(0.0),
            idle["start_p99_ms_worst_window"],
            idle["final_table"],
        );
        write("idle", &json!({ "capacity_per_s": capacity, "autovacuum": autovacuum, "idle": idle }))?;
    }
    if wanted("overload") {
        let default = overload(&wasm, capacity, seconds, None).await?;
        let ceiling = overload(&wasm, capacity, seconds, Some((capacity * 2.0) as u64)).await?;
        for (name, o) in [("default ceiling", &default), ("ceiling of 2 s of work", &ceiling)] {
            println!(
                "overload, {name}: offered {} /s, admitted {}, refused {}, start p50 {:.0} ms p99 {:.0} ms, queued max {}, drained {:.1} s after",
                o["offered_per_s"],
                o["admitted"],
                o["refused"],
                o["start_p50_ms"].as_f64().unwrap_or(0.0),
                o["start_p99_ms"].as_f64().unwrap_or(0.0),
                o["queued_max"],
                o["drained_after_s"].as_f64().unwrap_or(0.0)
            );
        }
        write(
            "overload",
            &json!({ "capacity_per_s": capacity, "autovacuum": autovacuum, "default": default, "ceiling": ceiling }),
        )?;
    }
    if wanted("backlog") {
        let (shallow, deep) = if quick { (20_000, 200_000) } else { (100_000, 1_000_000) };
        let b = backlog(&wasm, shallow, deep).await?;
        println!(
            "backlog: {shallow} drain at {:.0}/s; the first {shallow} of {deep} at {:.0}/s ({:.2}×), all {deep} at {:.0}/s ({:.2}×); table MB full {}, after retention {}, after VACUUM {}, after another round {}",
            b["shallow_drain_per_s"].as_f64().unwrap_or(0.0),
            b["deep_first_segment_per_s"].as_f64().unwrap_or(0.0),
            b["ratio_first_segment"].as_f64().unwrap_or(0.0),
            b["deep_mean_per_s"].as_f64().unwrap_or(0.0),
            b["ratio_mean"].as_f64().unwrap_or(0.0),
            b["table_full"]["total_mb"],
            b["table_after_retention"]["total_mb"],
            b["table_after_vacuum"]["total_mb"],
            b["table_after_second_round"]["total_mb"],
        );
        write("backlog", &json!({ "capacity_per_s": capacity, "autovacuum": autovacuum, "backlog": b }))?;
    }
    Ok(())
}
